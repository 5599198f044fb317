"""Continuous batching: a scheduler that admits and retires requests at every step.

A static batch starts its requests together and runs until the longest has finished; the rows of the finished ones
idle meanwhile. A continuous batch is rebuilt at every step from whatever is running:

* every request that is *decoding* contributes one token (the last one it generated);
* requests still *prefilling* contribute chunks of their prompt (at most ``chunk`` tokens each, and at most
  ``max_batch_tokens`` tokens in the whole step), beside the decode tokens, in the same forward pass;
* a request whose last known token (of its prompt, or the one it generated last) went through gets its next token
  from the logits of that row; a request with ``max_new_tokens`` tokens leaves at once and its blocks return to the
  pool;
* waiting requests are admitted (in arrival order) while the pool has blocks for them (as the policy below says)
  and, with ``max_running``, while fewer than that many are running.

How blocks are given out is a policy of the scheduler, not of continuous batching; two are here:

* ``policy="reserve"``: a request is admitted only when the pool can promise the blocks of its whole length
  (``prompt + max_new_tokens - 1`` tokens); a running request can then never run out of blocks, but the promised
  blocks sit idle until its tokens arrive, and the lengths must be known in advance.
* ``policy="on_demand"`` (vLLM's): blocks are taken as the tokens arrive. A waiting request is admitted when the pool
  has the blocks of its first chunk (what is scheduled for it now); when a running request's next tokens need blocks
  the pool lacks, running requests are **preempted**, the most recently admitted first (:func:`choose_victims`). A
  preempted request frees every block, keeps the tokens it generated, goes back to the front of the waiting queue and,
  readmitted, **recomputes**: it feeds its prompt and generated tokens again (in chunks, as a prompt) and samples only
  after the last of them. Its cache then holds again the keys and values of the same tokens at the same positions,
  and its next logits depend on those alone: greedy decoding gives it the tokens it would have generated unpreempted.
  That holds in exact arithmetic; in floating point the recomputation groups the tokens into other passes, so it
  holds up to rounding (a near tie could flip; tests/test_serving_preempt.py asserts the tokens equal in float64 and
  float32).

The running requests are planned before the waiting ones are admitted, and no request is admitted in a step in which
one was preempted (vLLM V1's order): a request admitted in a step is never preempted in that step. The oldest running
request is never preempted (the others go first, and alone it fits the pool: ``submit`` refuses a request that could
not), so no run deadlocks. Continuous batching itself is Orca's iteration-level scheduling (Yu et al.,
OSDI 2022); prefill chunks beside decode tokens within a token budget are Sarathi's and Sarathi-Serve's chunked
prefill (Agrawal et al., 2023 and OSDI 2024); on-demand blocks with preemption by recompute are vLLM's (Kwon et al.,
SOSP 2023).

The tokens of a step are packed (chapter 12, "Packing without padding"): one row of N tokens, their positions and
the request each belongs to; :class:`StepBatch` holds that plan. ``forward(batch, cache) -> logits (N, V)`` is the
model's step: any model whose attention reads the paged cache (``attention_course.serving.attention``).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..checks import check_positive_int
from .packing import cu_seqlens
from .paged import PagedKVCache


@dataclass
class Request:
    """A prompt (token ids), how many tokens to generate, and the step at which it arrives."""
    rid: object
    prompt: list
    max_new_tokens: int
    arrival: int = 0
    generated: list = field(default_factory=list)
    fed: int = 0  # tokens (prompt, then generated) already written to the cache
    preemptions: int = 0  # times it was preempted
    dropped: int = 0  # the most tokens it ever had in the cache before a preemption dropped them

    def __post_init__(self):
        if not isinstance(self.prompt, (list, tuple)) or not self.prompt or not all(
                isinstance(t, int) and not isinstance(t, bool) for t in self.prompt):
            raise ValueError(f"request {self.rid!r}: prompt must be a non-empty list of token ids (ints), got "
                             f"{self.prompt!r}.")
        self.prompt = list(self.prompt)
        check_positive_int(self.max_new_tokens, "max_new_tokens")

    @property
    def total(self) -> int:
        """Tokens it will ever write to the cache: the prompt and every generated token but the last."""
        return len(self.prompt) + self.max_new_tokens - 1

    @property
    def pending(self) -> int:
        """Tokens known but not yet in the cache: the prompt's rest, or the last generated token (or, recomputing
        after a preemption, the prompt and every generated token not fed again yet)."""
        return len(self.prompt) + len(self.generated) - self.fed

    @property
    def prefilling(self) -> bool:
        """It feeds more than its last generated token: a prompt's chunks, or a recomputation's."""
        return self.fed < len(self.prompt) + max(len(self.generated) - 1, 0)


def choose_victims(running, asking, available: int, need: int) -> list:
    """The requests to preempt so that ``asking`` gets ``need`` blocks: the most recently admitted first.

    ``running``: [(rid, blocks it would free), ...] in admission order, oldest first; ``available``: the blocks the
    pool can give now. Returns the rids in the order they are preempted, ``[]`` when ``available >= need``. Going from
    the latest admitted backwards, each is preempted and its blocks counted as freed until ``need`` is met; when
    ``asking`` is the latest one left, it preempts itself (it goes back to wait, nothing scheduled for it this step)
    and no earlier one is touched. First come, first served (vLLM V1's order): a request is never preempted for a
    later one, and the oldest is never preempted by anyone but itself.
    """
    running = list(running)
    if asking not in [rid for rid, _ in running]:
        raise ValueError(f"the asking request {asking!r} is not among the running ones "
                         f"{[rid for rid, _ in running]}: only a running request asks for blocks.")
    numbers = [("available", available), ("need", need)] + [(f"blocks of {rid!r}", n) for rid, n in running]
    bad = [(name, n) for name, n in numbers if isinstance(n, bool) or not isinstance(n, int) or n < 0]
    if bad:
        raise ValueError(f"block counts are non-negative ints, got {', '.join(f'{k} = {v!r}' for k, v in bad)}.")
    victims = []
    for rid, blocks in reversed(running):
        if available >= need:
            break
        victims.append(rid)
        if rid == asking:  # the latest one left: it waits instead
            break
        available += blocks
    return victims


@dataclass
class StepBatch:
    """One step's packed tokens: ``tokens``, ``positions``, ``slots`` (N,); ``requests`` (n,) and ``cu`` (n + 1,),
    request i owning rows cu[i] .. cu[i+1] - 1; ``sample`` maps a request to the row whose logits give its next
    token."""
    requests: list
    tokens: torch.Tensor
    positions: torch.Tensor
    slots: torch.Tensor
    cu: torch.Tensor
    sample: dict
    key_index: tuple | None = None  # filled by the first attention layer: the slots, positions, owners of the keys
    scores: list = field(default_factory=lambda: [0, 0])  # (computed, needed) scores, summed over the layers

    decodes: int | None = None  # rows that feed a request's last generated token (set by the scheduler)

    @property
    def decode_tokens(self) -> int:
        """Decode rows: as the scheduler counted them, else every request with one row (a one-token chunk too)."""
        if self.decodes is not None:
            return self.decodes
        return sum(int(self.cu[i + 1] - self.cu[i]) == 1 for i in range(len(self.requests)))


POLICIES = ("reserve", "on_demand")


class Scheduler:
    """Runs requests through ``forward(batch, cache) -> logits (N, V)``, greedily, with continuous batching; at most
    ``max_batch_tokens`` tokens a step, chunks of at most ``chunk`` tokens, at most ``max_running`` requests running
    at once (None: as many as the pool takes), blocks given out by ``policy`` ("reserve" or "on_demand", see the
    module's docstring).

    Per step, ``log`` holds (admitted, retired, rows, decode rows) and ``stats`` a dict, counted when the step's pass
    runs (its tokens' slots taken): ``running`` and ``waiting`` (arrived, not running) requests; ``rows``;
    ``blocks_in_use``, the blocks the pool cannot give (``num_blocks - cache.available``); ``blocks_idle``, the blocks
    that hold no token of a running request and that no waiting request can have: blocks held that hold no token
    yet, plus, under "reserve", the blocks promised to running requests and not yet taken; ``blocks_free``, the
    others that hold no token (``cache.available`` less the promise not yet taken); ``preempted``, the requests
    preempted in the step; ``recomputed``, the step's tokens that a preemption had dropped from the cache. A block
    counts once whoever holds it. Totals: ``preemptions`` and ``recomputed``.
    """

    def __init__(self, cache: PagedKVCache, max_batch_tokens: int = 16, chunk: int | None = None,
                 max_running: int | None = None, policy: str = "reserve"):
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}.")
        if policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {policy!r}.")
        self.cache = cache
        self.max_batch_tokens = check_positive_int(max_batch_tokens, "max_batch_tokens")
        self.chunk = max_batch_tokens if chunk is None else check_positive_int(chunk, "chunk")
        self.max_running = None if max_running is None else check_positive_int(max_running, "max_running")
        self.policy = policy
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: dict = {}  # rid -> generated tokens
        self.clock = 0
        self.promised = 0  # blocks promised to the running requests (their whole length), under "reserve"
        self.log: list = []  # per step: (admitted, retired, rows, decode rows)
        self.stats: list[dict] = []  # per step: see the class docstring
        self.preemptions = 0
        self.recomputed = 0  # tokens fed again after a preemption

    def submit(self, request: Request) -> None:
        if not isinstance(request, Request):
            raise TypeError(f"submit takes a Request, got {type(request).__name__}.")
        need = self.cache.blocks_for(request.total)
        if need > self.cache.num_blocks:
            raise ValueError(
                f"request {request.rid!r} needs {need} blocks ({request.total} tokens of {self.cache.block_size} "
                f"slots) but the whole pool has {self.cache.num_blocks}: it could never run. Build a larger cache, or "
                f"cut its prompt or max_new_tokens."
            )
        if request.rid in self.finished or any(r.rid == request.rid for r in self.waiting + self.running):
            raise ValueError(f"request id {request.rid!r} is already taken.")
        self.waiting.append(request)

    def _admit(self) -> list:
        """Under "reserve": admit, in arrival order, while the pool can promise each its whole length."""
        admitted = []
        for r in sorted(self.waiting, key=lambda r: r.arrival):
            need = self.cache.blocks_for(r.total)
            full = self.max_running is not None and len(self.running) >= self.max_running
            if full or r.arrival > self.clock or self.promised + need > self.cache.num_blocks:
                break  # first come, first served: no overtaking
            self.waiting.remove(r)
            self.running.append(r)
            self.cache.add(r.rid)
            self.promised += need
            admitted.append(r.rid)
        return admitted

    def _admit_on_demand(self, plan: list, budget: int) -> list:
        """Under "on_demand": admit, preempted requests first (the earliest admitted of them first), then in arrival
        order, while the budget lasts and the pool has the blocks of each one's first chunk; plan that chunk."""
        admitted = []
        for r in sorted(self.waiting, key=lambda r: (r.preemptions == 0, r.arrival if r.preemptions == 0 else 0)):
            full = self.max_running is not None and len(self.running) >= self.max_running
            if full or r.arrival > self.clock or budget == 0:
                break  # first come, first served: no overtaking
            self.cache.add(r.rid)
            self._attach(r)  # a prefix cache may hold its first blocks already
            n = min(r.pending, self.chunk, budget)
            if self._new_blocks(r, n) > self.cache.available:
                self._detach(r)
                break
            self.waiting.remove(r)
            self.running.append(r)
            admitted.append(r.rid)
            plan.append((r, n, self.cache.reserve(r.rid, n)))
            budget -= n
        return admitted

    def _attach(self, r: Request) -> None:
        """Called right after ``cache.add``: a cache that holds some of r's tokens already attaches them and sets
        ``r.fed`` after them (:class:`~attention_course.serving.prefix.PrefixScheduler`). Here: nothing."""

    def _detach(self, r: Request) -> None:
        """Undo an admission that did not fit (``cache.add`` and :meth:`_attach`)."""
        self.cache.free(r.rid)
        r.fed = 0

    def _new_blocks(self, r: Request, n: int) -> int:
        """Blocks the pool must give for ``r``'s next n tokens (as :meth:`PagedKVCache.reserve` takes them)."""
        table, length, size = self.cache.tables[r.rid], self.cache.lengths[r.rid], self.cache.block_size
        partial_shared = length % size and self.cache.refs[table[-1]] > 1  # copied on write
        return self.cache.blocks_for(length + n) - len(table) + bool(partial_shared)

    def _preempt(self, r: Request, plan: list) -> None:
        """Free all of ``r``'s blocks, drop what was planned for it, put it back at the front of the queue."""
        self.running.remove(r)
        self.cache.free(r.rid)
        plan[:] = [p for p in plan if p[0] is not r]
        r.dropped, r.fed = max(r.dropped, r.fed), 0
        r.preemptions += 1
        self.preemptions += 1
        self.waiting.insert(0, r)  # victims go latest first: the earlier ends up in front

    def _make_room(self, r: Request, n: int, plan: list, preempted: list) -> bool:
        """Preempt (:func:`choose_victims`) until the pool has the blocks of ``r``'s next n tokens. False: ``r``
        preempted itself."""
        need = self._new_blocks(r, n)
        while self.cache.available < need:  # one victim at a time, the pool looked at again after each (as vLLM V1):
            # a block two victims share is counted for neither, but comes free when both have left
            running = [(q.rid, sum(self.cache.refs[b] == 1 for b in self.cache.tables[q.rid])) for q in self.running]
            rid = choose_victims(running, r.rid, self.cache.available, need)[0]
            victim = next(q for q in self.running if q.rid == rid)
            self._preempt(victim, plan)
            preempted.append(rid)
            if victim is r:
                return False
        return True

    def schedule(self) -> StepBatch | None:
        """Plan this step's tokens: the running requests' (decode tokens first, then chunks), then, under
        "on_demand", the first chunks of the requests admitted (under "reserve", admitted first)."""
        admitted = self._admit() if self.policy == "reserve" else []
        plan, preempted = [], []  # (request, tokens, slots); rids preempted this step
        for r in sorted(self.running, key=lambda r: r.prefilling):  # decoding requests first
            budget = self.max_batch_tokens - sum(n for _, n, _ in plan)  # a victim's planned tokens come back
            if budget == 0:
                break
            if r.rid in preempted:
                continue
            n = min(r.pending, self.chunk, budget)
            if self.policy == "on_demand" and not self._make_room(r, n, plan, preempted):
                continue  # it preempted itself
            plan.append((r, n, self.cache.reserve(r.rid, n)))
        budget = self.max_batch_tokens - sum(n for _, n, _ in plan)
        if self.policy == "on_demand" and not preempted:
            admitted = self._admit_on_demand(plan, budget)
        self._admitted = admitted
        self._record(plan, preempted)
        if not plan:
            return None
        tokens, positions, slots, sample = [], [], [], {}
        decodes = sum(bool(r.generated) and r.pending == 1 for r, _, _ in plan)  # its last generated token alone
        for r, n, taken in plan:
            P = len(r.prompt)
            ids = r.prompt[r.fed:r.fed + n] + r.generated[max(r.fed - P, 0):max(r.fed + n - P, 0)]
            slots.append(taken)
            positions.append(torch.arange(r.fed, r.fed + n))
            tokens += ids
            r.fed += n
            if r.fed == len(r.prompt) + len(r.generated):  # its last known token: its logits give the next token
                sample[r.rid] = len(tokens) - 1
        return StepBatch([r.rid for r, _, _ in plan], torch.tensor(tokens), torch.cat(positions), torch.cat(slots),
                         cu_seqlens([n for _, n, _ in plan]), sample, decodes=decodes)

    def _record(self, plan: list, preempted: list) -> None:
        """The step's ``stats`` (see the class docstring), once its slots are taken (fed not yet advanced)."""
        cache = self.cache
        held, holding = set(), set()
        for r in self.running:
            table = cache.tables[r.rid]
            held.update(table)
            holding.update(table[:cache.blocks_for(cache.lengths[r.rid])])
        unallocated = 0
        if self.policy == "reserve":
            unallocated = self.promised - sum(len(cache.tables[r.rid]) for r in self.running)
        recomputed = sum(max(0, min(r.fed + n, r.dropped) - r.fed) for r, n, _ in plan)
        self.recomputed += recomputed
        self.stats.append({
            "step": self.clock, "running": len(self.running),
            "waiting": sum(r.arrival <= self.clock for r in self.waiting), "rows": sum(n for _, n, _ in plan),
            "blocks_in_use": cache.num_blocks - cache.available, "blocks_idle": len(held - holding) + unallocated,
            "blocks_free": cache.available - unallocated, "preempted": list(preempted), "recomputed": recomputed})

    def update(self, batch: StepBatch, logits: torch.Tensor) -> list:
        """Greedy next tokens from ``logits`` (N, V); retire the requests that are done. Returns their ids."""
        if logits.ndim != 2 or logits.shape[0] != len(batch.tokens):
            raise ValueError(f"forward must return logits (N, V) with N = {len(batch.tokens)} rows, one per packed "
                             f"token, got {tuple(logits.shape)}.")
        retired = []
        for r in list(self.running):
            if r.rid in batch.sample:
                r.generated.append(int(logits[batch.sample[r.rid]].argmax()))
            if len(r.generated) == r.max_new_tokens:
                self.running.remove(r)
                self.cache.free(r.rid)
                if self.policy == "reserve":
                    self.promised -= self.cache.blocks_for(r.total)
                self.finished[r.rid] = r.generated
                retired.append(r.rid)
        self.log.append((self._admitted, retired, len(batch.tokens), batch.decode_tokens))
        return retired

    def step(self, forward) -> StepBatch | None:
        batch = self.schedule()
        if batch is not None:
            self.update(batch, forward(batch, self.cache))
        else:
            self.log.append((self._admitted, [], 0, 0))
        self.clock += 1
        return batch

    def run(self, forward, on_step=None, max_steps: int = 100_000) -> dict:
        """Step until every request has finished; ``on_step(scheduler, batch)`` after each step. Returns rid ->
        generated tokens."""
        while self.waiting or self.running:
            if self.clock >= max_steps:
                raise RuntimeError(f"not done after {max_steps} steps: {len(self.waiting)} waiting, "
                                   f"{len(self.running)} running.")
            batch = self.step(forward)
            if on_step is not None:
                on_step(self, batch)
        return self.finished
