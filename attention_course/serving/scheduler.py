"""Continuous batching: a scheduler that admits and retires requests at every step.

A static batch starts its requests together and runs until the longest has finished; the rows of the finished ones
idle meanwhile. A continuous batch is rebuilt at every step from whatever is running:

* every request that is *decoding* contributes one token (the last one it generated);
* requests still *prefilling* contribute chunks of their prompt (at most ``chunk`` tokens each, and at most
  ``max_batch_tokens`` tokens in the whole step), beside the decode tokens, in the same forward pass;
* a request whose last prompt token (or whose decode token) went through gets its next token from the logits of
  that row; a request with ``max_new_tokens`` tokens leaves at once and its blocks return to the pool;
* waiting requests are admitted (in arrival order) while the pool can promise them the blocks of their whole length
  and, with ``max_running``, while fewer than that many are running.

Reserving a request's whole length at admission is this scheduler's policy, not continuous batching's: a running
request can then never run out of blocks. vLLM instead takes blocks as the tokens arrive and, when the pool runs
out, preempts running requests (frees their blocks and recomputes or swaps them in later). Continuous batching itself
is Orca's iteration-level scheduling (Yu et al., OSDI 2022); prefill chunks beside decode tokens within a token
budget are Sarathi's and Sarathi-Serve's chunked prefill (Agrawal et al., 2023 and OSDI 2024).

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
    def prefilling(self) -> bool:
        return self.fed < len(self.prompt)


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

    @property
    def decode_tokens(self) -> int:
        return sum(int(self.cu[i + 1] - self.cu[i]) == 1 for i in range(len(self.requests)))


class Scheduler:
    """Runs requests through ``forward(batch, cache) -> logits (N, V)``, greedily, with continuous batching; at most
    ``max_batch_tokens`` tokens a step, prompt chunks of at most ``chunk``, at most ``max_running`` requests running
    at once (None: as many as the pool can promise their whole length)."""

    def __init__(self, cache: PagedKVCache, max_batch_tokens: int = 16, chunk: int | None = None,
                 max_running: int | None = None):
        if not isinstance(cache, PagedKVCache):
            raise TypeError(f"cache must be a PagedKVCache, got {type(cache).__name__}.")
        self.cache = cache
        self.max_batch_tokens = check_positive_int(max_batch_tokens, "max_batch_tokens")
        self.chunk = max_batch_tokens if chunk is None else check_positive_int(chunk, "chunk")
        self.max_running = None if max_running is None else check_positive_int(max_running, "max_running")
        self.waiting: list[Request] = []
        self.running: list[Request] = []
        self.finished: dict = {}  # rid -> generated tokens
        self.clock = 0
        self.promised = 0  # blocks promised to the running requests (their whole length)
        self.log: list = []  # per step: (admitted, retired, rows, decode rows)

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

    def schedule(self) -> StepBatch | None:
        """Admit what fits, then plan this step's tokens: decode tokens first, then prefill chunks."""
        admitted = self._admit()
        budget = self.max_batch_tokens
        plan = []  # (request, token ids)
        for r in sorted(self.running, key=lambda r: r.prefilling):  # decoding requests first
            if budget == 0:
                break
            if r.prefilling:
                ids = r.prompt[r.fed:r.fed + min(self.chunk, budget)]
            else:
                ids = [r.generated[-1]]
            plan.append((r, ids))
            budget -= len(ids)
        self._admitted = admitted
        if not plan:
            return None
        tokens, positions, slots, sample = [], [], [], {}
        for r, ids in plan:
            slots.append(self.cache.reserve(r.rid, len(ids)))
            positions.append(torch.arange(r.fed, r.fed + len(ids)))
            tokens += ids
            r.fed += len(ids)
            if not r.prefilling:  # its last prompt token, or a decode token: its logits give the next token
                sample[r.rid] = len(tokens) - 1
        return StepBatch([r.rid for r, _ in plan], torch.tensor(tokens), torch.cat(positions), torch.cat(slots),
                         cu_seqlens([len(ids) for _, ids in plan]), sample)

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
