"""Checkers for chapter 12, attention that serves many (masks are IGNORE masks: True = may NOT attend):
1. ``block_mask(cu_seqlens)`` (``ex-ch12-block-mask``): True where rows i and j are of different sequences or j > i.
2. ``gather(pool, table, length)`` (``ex-ch12-gather``): (h_kv, length, d), token t from pool[table[t // b], :, t % b].
3. ``plan_step(running, budget)`` (``ex-ch12-plan-step``): [(rid, n)], decodes first (one token each), then prompts.
4. ``choose_victims(running, asking, available, need)`` (``ex-ch12-victims``): the rids to preempt, latest admitted
   first, until available >= need; the asking request preempts itself when it is the latest left, and stops there.
5. ``block_keys(tokens, block_size)`` (``ex-ch12-block-keys``): each full block's key, block_hash(parent's key, its
   tokens), a chain; a partial last block has none."""
from __future__ import annotations

import hashlib
import operator

import torch

from .diagnose import Case, Exercise, Mistake, check, source

def _block(cu, causal=torch.gt, blocks=True, right=True, clamp=True, reach=False):
    rows = torch.arange(int(cu[-1]))
    ids = torch.searchsorted(cu, rows, right=right) - 1  # (N,): row i's sequence
    ids = ids.clamp(min=0) if clamp else ids
    ignore = ids[:, None] != ids[None, :] if blocks else torch.zeros(len(rows), len(rows), dtype=torch.bool)
    ignore &= ~(reach & torch.isin(rows, cu)[:, None] & (ids[None, :] == ids[:, None] - 1))  # a start sees the one before
    return ignore | causal(rows[None, :], rows[:, None]) if causal else ignore

def _block_case(*lengths):
    cu = torch.tensor([0, *lengths]).cumsum(0)
    ids = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    starts = torch.isin(torch.arange(len(ids)), cu[:-1])
    s = "s" * (len(lengths) > 1)
    return Case(f"{len(lengths)} sequence{s} of length{s} {', '.join(map(str, lengths))}", (cu,),
                {"between two sequences": ids[:, None] != ids[None, :],
                 "in the first row or column of a sequence": starts[:, None] | starts[None, :]})

_START = "Row cu[i] starts sequence i: searchsorted(cu, rows, right=True) - 1, or repeat_interleave of the lengths."
_b = lambda **switches: lambda cu: _block(cu, **switches)  # noqa: E731 - the reference with one switch
BLOCK_MASK = Exercise(
    what="your block_mask",
    reference=_block,
    cases=[_block_case(*n) for n in ((1,), (4,), (3, 1, 4), (2, 5), (1, 1, 1), (5, 2, 1, 3))],
    mistakes=[
        Mistake("allow", "is True where a key MAY be attended: an allow mask, the polarity SWAPPED. The course's masks "
                "are ignore masks: True where the key is hidden.", lambda cu: ~_block(cu)),
        Mistake("not causal", "keeps each sequence apart but is NOT CAUSAL: a query reads the later tokens of its own "
                "sequence. Also hide j > i.", _b(causal=None)),
        Mistake("no blocks", "is causal over the whole packed row but has NO BLOCKS: a query reads the earlier "
                "sequences. Also hide keys of another sequence.", _b(blocks=False)),
        Mistake("diagonal", "hides the DIAGONAL: a query reads its own key, hide j > i.", _b(causal=torch.ge)),
        Mistake("others open", "leaves the OTHER SEQUENCES visible (False off the blocks, as torch.block_diag fills "
                "them), hiding only later keys of a query's own: a key of another sequence is hidden, True.",
                lambda cu: _block(cu) & ~_block(cu, causal=None)),
        Mistake("past", "hides the PAST instead of the future: hide j > i, keep j <= i.", _b(causal=torch.lt)),
        Mistake("boundary", "puts the first row of each sequence in the sequence before it: the sequences are shifted "
                "by one row at each BOUNDARY. " + _START, _b(right=False)),
        Mistake("last left out", "leaves the LAST sequence all True: a loop over range(len(cu) - 2) stops one short.",
                lambda cu: _block(cu) | (last := torch.arange(int(cu[-1])) >= cu[-2])[:, None] | last[None, :]),
        Mistake("last row", "leaves the LAST ROW of each sequence all True (a slice cu[i]:cu[i+1] - 1, one short): "
                "sequence i is rows cu[i] .. cu[i+1] - 1, the slice cu[i]:cu[i+1].", lambda cu: _block(cu) | torch.isin(
                    torch.arange(int(cu[-1])), cu[1:] - 1)[:, None]),
        Mistake("cu as lengths", "reads cu_seqlens[1:] as the LENGTHS: they are where the sequences END; the lengths "
                "are cu.diff(), N = cu[-1].", lambda cu: _block(torch.cat([cu[:1], cu[1:].cumsum(0)]))),
        Mistake("and", "hides a key only where it is of another sequence AND later (&): hide it where either holds, "
                "|.", lambda cu: _block(cu, causal=None) & _block(cu, blocks=False)),
        Mistake("one row on", "lets each sequence's FIRST ROW see the sequence before it (a block written to row b = "
                "the next start, inclusive): sequence i is rows cu[i] .. cu[i+1] - 1.", _b(reach=True)),
        Mistake("boundary, unclamped", "puts the first row of each sequence in the sequence before it (row 0 in none): "
                "searchsorted without right=True. " + _START, _b(right=False, clamp=False)),
    ],
    passed="block-diagonal and causal: one sequence (plain causal), sequences of length 1, several of mixed lengths.",
    notes=lambda got, cu: _pair(got, cu),
)

def _pair(got, cu):
    """A wrong mask's first wrong pair, said in sequences and their tokens; or how its size misses N."""
    N, n = int(cu[-1]), len(got) if isinstance(got, torch.Tensor) and got.dim() == 2 and got.shape[0] == got.shape[1] else 0
    if n and n != N:
        return f"It is {n} by {n}: " + ("N taken as len(cu_seqlens), n + 1; N = cu_seqlens[-1]." if n == len(cu) else
                                         f"{abs(N - n)} row{'s' * (abs(N - n) > 1)} {'short of' if n < N else 'over'} N = cu_seqlens[-1] = {N}.")
    if not n or got.dtype != torch.bool:
        return ""
    want, seq = _block(cu), torch.searchsorted(cu, torch.arange(N), right=True) - 1  # (N,): row i's sequence
    i, j = (got != want).nonzero()[0].tolist()
    at = lambda r: f"{r} (sequence {seq[r]}, its token {r - cu[seq[r]]})"  # noqa: E731
    return f"Its row {at(i)} " + (f"sees key {at(j)}, " + ("another sequence's" if seq[i] != seq[j] else "a later one")
                                  if want[i, j] else f"is kept from key {at(j)}, its own sequence's, j <= i") + "."
def check_block_mask(fn) -> None:
    """Check ``fn(cu_seqlens)``: the (N, N) ignore mask, different sequence or later key."""
    check(BLOCK_MASK, fn)

def _gather(pool, table, length, blocks=None, cut=True, heads_first=True):
    blocks = torch.tensor(table if blocks is None else blocks(table), dtype=torch.long)
    x = pool[blocks]  # (n, h, b, d)
    x = x.transpose(0, 1) if heads_first else x.reshape(x.shape[1], x.shape[0], *x.shape[2:])
    x = x.flatten(1, 2)  # (h, n b, d)
    return x[:, :length] if cut else x

def _per_token(pool, table, length, b=None, swap=False):
    b = b or pool.shape[2]
    at = (lambda t: (t % b, t // b)) if swap else (lambda t: (t // b, t % b))  # noqa: E731
    return torch.stack([pool[table[at(t)[0]], :, at(t)[1]] for t in range(length)], dim=1)

def _gather_case(num_blocks, h, b, d, table, length, dtype=torch.float64):
    pool = torch.randn(num_blocks, h, b, d, generator=torch.Generator().manual_seed(12), dtype=dtype)
    full = "the last block exactly full" if length == len(table) * b else "the last block partly filled"
    name = f"blocks of {b}, table {table}, {length} token{'s' * (length > 1)} ({full}), {h} head{'s' * (h > 1)} of size {d}"
    starts = (torch.arange(length) % b == 0)[None, :, None].expand(h, length, d)
    return Case(name, (pool, table, length), {"at the first token of each block": starts})

def _sources(got, pool, table, length):
    """Where a wrong gather read its first wrong tokens: the pool's (block, slot) each holds, against the table's."""
    if not (isinstance(got, torch.Tensor) and got.dim() == 3 and got.shape[0::2] == pool.shape[1::2]):
        return ""
    b, said = pool.shape[2], []
    slots = {(k, s): pool[k, :, s] for k in range(pool.shape[0]) for s in range(b)}  # each slot: (h_kv, d)
    for t in range(min(got.shape[1], length)):
        if len(said) < 3 and (said or not torch.equal(got[:, t], slots[table[t // b], t % b].to(got.dtype))):
            found = source(got[:, t], {f"the pool's block {k}, slot {s}": x for (k, s), x in slots.items()},
                           "no slot of the pool (its heads together)")
            said.append(f"token {t} is {found}, where the table says block table[{t} // {b}] = {table[t // b]}, slot "
                        f"{t} % {b} = {t % b}")
    return f"Its {'; '.join(said)}." if said else ""

GATHER = Exercise(
    what="your gather",
    reference=_gather,
    cases=[_gather_case(*c) for c in ((4, 1, 1, 2, [2], 1), (8, 2, 4, 3, [5, 2, 7], 10), (6, 2, 3, 2, [3, 0], 6),
                                      (9, 3, 5, 4, [8, 1, 4, 6], 17), (5, 1, 2, 3, [4, 3, 0, 1], 7),
                                      (6, 3, 4, 2, [1, 5], 2))]
    + [_gather_case(7, 2, 3, 2, [6, 1, 2], 8, dtype=torch.float32)],
    mistakes=[
        Mistake("pool order", "reads the blocks in POOL ORDER (sorted): a request's tokens are in the order of its "
                "block table, whatever the block numbers.", lambda p, t, n: _gather(p, t, n, blocks=sorted)),
        Mistake("table ignored", "reads blocks 0, 1, 2, ... of the pool: the block TABLE IS IGNORED. Index the pool "
                "with the table, pool[table].", lambda p, t, n: _gather(p, t, n, blocks=lambda t: range(len(t)))),
        Mistake("heads mixed", "MIXES HEADS and blocks in its reshape: pool[table] is (n, h_kv, b, d); move the heads "
                "first, transpose(0, 1), then merge n and b.", lambda p, t, n: _gather(p, t, n, heads_first=False)),
        Mistake("not cut", "returns every slot of the blocks: NOT CUT at the request's length. The slots beyond it in "
                "the last block are empty, or hold another request's old tokens.", lambda p, t, n: _gather(p, t, n, cut=False)),
        Mistake("shifted", "reads each token one slot late, SHIFTED by one: token t sits at offset t % b of block "
                "table[t // b], counting from t = 0.", lambda p, t, n: _gather(p, t, n + 1)[:, 1:]),
        Mistake("slot by slot", "orders the tokens SLOT BY SLOT across the blocks (permute(1, 2, 0, 3)): move only the "
                "heads first, transpose(0, 1).", lambda p, t, n: p[torch.tensor(t)].permute(1, 2, 0, 3).flatten(1, 2)[:, :n]),
        Mistake("cut one short", "cuts at length - 1: the request's last token is left out, [:, :length].",
                lambda p, t, n: _gather(p, t, n - 1)),
        Mistake("last slots", "keeps the LAST length slots, [:, -length:]: a request's tokens are the FIRST length "
                "slots of its blocks, [:, :length].", lambda p, t, n: _gather(p, t, n, cut=False)[:, -n:]),
        Mistake("div mod swapped", "swaps the quotient and the remainder: token t is at block table[t // b] (whole "
                "blocks before it), offset t % b.", lambda p, t, n: _per_token(p, t, n, swap=True)),
        Mistake("table reversed", "reads the block table from its END: token 0 is in the table's first block.",
                lambda p, t, n: _gather(p, t, n, blocks=lambda t: t[::-1])),
        Mistake("whole blocks only", "reads only the FULL blocks, length // b, and drops the last, partly filled one: "
                "read ceil(length / b).", lambda p, t, n: _gather(p, t, n, blocks=lambda t: t[:n // p.shape[2]])),
        Mistake("block too many", "reads length // b + 1 blocks, past the table when the last is exactly full: "
                "(length + b - 1) // b.", lambda p, t, n: _gather(p, [t[i] for i in range(n // p.shape[2] + 1)], n)),
        Mistake("heads cut", "cuts at length along the HEADS, [:length]: cut the tokens, axis 1, [:, :length].",
                lambda p, t, n: _gather(p, t, n, cut=False)[:n]),
        Mistake("b misread", "reads the block size b from another axis of the pool (h_kv's, d's): b is pool.shape[2].",
                lambda p, t, n: _per_token(p, t, n, b=p.shape[1])),
    ],
    passed="tables out of order, blocks of 1 to 5 slots full and partly filled, one token, float32 and float64.",
    notes=_sources,
    hints=((r"out of range|out of bounds", "an index into the wrong axis or past its end: the table indexes the pool's "
            "BLOCKS, axis 0; b is pool.shape[2]; t // b and t % b swapped; or a loop past `length`."),),
)
def check_gather(fn) -> None:
    """Check ``fn(pool, table, length)``: (h_kv, length, d), token t from block table[t // b], offset t % b."""
    check(GATHER, fn)

_ORDERS = {"first": lambda rs: sorted(rs, key=lambda r: r[1] > 0),  # stable: each group in the order given
           "last": lambda rs: sorted(rs, key=lambda r: r[1] == 0), "mixed": list,
           "dropped": lambda rs: [r for r in rs if r[1] > 0]}

def _plan(running, budget, decodes="first", chunks=True, zeros=False, limit=True, spend=0, free=False, stop=0,
          whole=False, prompts_spend=True):
    out, left = [], budget + spend
    for rid, remaining in _ORDERS[decodes](running):
        n = 1 if remaining == 0 else remaining
        if (limit is True or limit == "decodes" and not remaining) and (remaining or not free):
            n = 0 if left <= stop else min(n, budget if whole else left) if chunks else n * (n <= left)
        elif limit == "decodes":  # a prompt started while a token is left, but not cut
            n = n * (left > 0)
        if n > 0 or zeros:
            out.append((rid, max(n, 0)))
        left -= max(n, 0) if prompts_spend or not remaining else 0
    return out

def _plan_notes(got, running, budget) -> str:
    """What a wrong plan does in the step's own terms: its tokens against the budget, its order, its shares."""
    try:
        plan, need = [(rid, int(n)) for rid, n in got], dict(running)
    except (TypeError, ValueError):
        return ""
    spent, order = sum(n for _, n in plan), [rid for rid, _ in running].index
    kinds = [[rid for rid, _ in plan if rid in need and (need[rid] > 0) == k] for k in (False, True)]
    out = [rid for rid, n in running if n > 0 and rid not in dict(plan)]  # prompts given nothing
    return " ".join(said for said, true in (
        (f"It names a request {next((r for r, _ in plan if r not in need), '')!r}, which is no rid of `running`: "
         "each pair holds the request's rid.", any(r not in need for r, _ in plan)),
        (f"It lists {next((p for p in plan if p[1] == 0), '')}: a request that gets no token this step is left out.",
         any(n == 0 for _, n in plan)),
        (f"It gives prompt {out[0] if out else ''!r} nothing with {budget - spent} of the budget left: " + (
            "a prompt that does not fit whole gets a chunk, min(remaining, left)." if out and need[out[0]] > budget - spent
            else f"its {need.get(out[0] if out else '', 0)} tokens fit: every prompt is served in turn while the budget "
                 "lasts."), bool(out) and budget > spent),
        (f"Its plan spends {spent} token{'s' * (spent != 1)}, OVER the budget of {budget}.", spent > budget),
        (f"It spends {spent} of {budget} while requests WAIT.", spent < min(budget, sum(max(r, 1) for r in need.values()))),
        ("It puts a prompt BEFORE a decoding request.", any(r in kinds[1] for r, _ in plan[:len(kinds[0])])),
        ("It takes requests of one kind in ANOTHER ORDER than given.", any(k != sorted(k, key=order) for k in kinds)),
        ("It gives a request MORE tokens than it needs.", any(n > max(need.get(r, 1), 1) for r, n in plan)),
        (_first_share(plan, running, budget, out if budget > spent else ()), True)) if true)

def _first_share(plan, running, budget, told=()) -> str:
    """The first request the plan serves otherwise than the rule (in the rule's order), and what the rule gives it
    (nothing where that is a prompt ``told`` already: left out with budget left)."""
    want, got, need, left, before = _plan(running, budget), dict(plan), dict(running), budget, {}
    for rid, n in want:
        before[rid], left = left, left - n
    r = next((r for r in [*dict(want), *got] if r in need and got.get(r, 0) != dict(want).get(r, 0)), None)
    if r is None or r in told:
        return ""
    n, w, rem = got.get(r, 0), dict(want).get(r, 0), need[r]
    rule = ("nothing: the budget is spent before it" if not w else f"1: it is decoding (remaining 0), with {before[r]} "
            f"of the budget left" if rem == 0 else f"min(remaining {rem}, budget left {before[r]}) = {w}")
    whole = rem and n == min(rem, budget) and before.get(r, 0) < budget  # the budget before the decodes' tokens
    return (f"It {f'gives {r!r} {n} token' + 's' * (n != 1) if n else f'leaves out {r!r}'}, where the rule gives it "
            f"{rule}" + (f"; its {n} is min(remaining {rem}, the budget {budget}): the decodes' tokens not taken off "
                         f"first." if whole else "."))

_p = lambda **switches: lambda r, b: _plan(r, b, **switches)  # noqa: E731 - the reference with one switch
PLAN_STEP = Exercise(
    what="your plan_step",
    reference=_plan,
    cases=[Case(f"budget {b}, running {r}", (r, b)) for b, *r in (
        (1, ("a", 0)), (3, ("p", 3)), (6, ("p", 10), ("q", 0)), (8, ("a", 5), ("b", 0), ("c", 4), ("d", 0)),
        (2, ("a", 0), ("b", 0), ("c", 0), ("d", 3)), (7, ("x", 2), ("y", 0), ("z", 3), ("w", 6)),
        (20, ("a", 4), ("b", 0), ("c", 5)), (4, ("a", 2), ("b", 2), ("c", 0)), (3, ("e", 10), ("f", 0), ("g", 1)),
        (0, ("a", 0), ("b", 3)), (20, ("a", 12), ("b", 0), ("c", 30)), (64, ("p", 100), ("q", 0)))],
    mistakes=[
        Mistake("prefill first", "plans the PREFILL chunks FIRST: a long prompt then takes the budget and the decoding "
                "requests wait. Decode tokens first, one each.", _p(decodes="last")),
        Mistake("given order", "plans the requests in the order given, decoding or not: decode tokens go FIRST, one "
                "each, then the prompts.", _p(decodes="mixed")),
        Mistake("decodes dropped", "leaves out the DECODING requests (remaining 0): each gets one token, first.",
                _p(decodes="dropped")),
        Mistake("budget ignored", "IGNORES THE BUDGET: the step's tokens add up to more than budget. Cut each prompt "
                "to the budget left.", _p(limit=False)),
        Mistake("prompts not cut", "gives a prompt its WHOLE remaining once a token is left, past the budget: a chunk "
                "is min(remaining, budget left), the rest later.", _p(limit="decodes")),
        Mistake("no chunks", "skips a prompt that does not fit whole: NO CHUNKS. A prompt longer than the budget left "
                "gets min(remaining, budget left) tokens now, the rest later.", _p(chunks=False)),
        Mistake("zeros", "lists requests with ZERO tokens: leave out the requests that get nothing this step.",
                _p(zeros=True)),
        Mistake("budget minus one", "spends ONE TOKEN LESS than the budget: a budget exactly used is allowed "
                "(left >= n, not left > n).", _p(spend=-1)),
        Mistake("budget plus one", "spends ONE TOKEN MORE than the budget: stop when none is left.", _p(spend=1)),
        Mistake("decodes past budget", "gives decodes tokens PAST THE BUDGET: they count too.", _p(free=True)),
        Mistake("stops at 1", "stops with ONE TOKEN of the budget left (left > 1): spend it, left >= 1.", _p(stop=1)),
        Mistake("whole budget", "cuts a chunk to the WHOLE budget, not to the budget LEFT.", _p(whole=True)),
        Mistake("one left", "serves a prompt with ONE token left in the decode pass: it is still prefilling, after every "
                "decoding request.", lambda r, b: _plan([(i, n * (n != 1)) for i, n in r], b)),
        Mistake("chunks not spent", "never takes a prompt's chunk off the budget left: each prompt gets min(remaining, "
                "what the decodes left), and the plan goes over the budget. Subtract each chunk.", _p(prompts_spend=False)),
        Mistake("kinds swapped", "takes the requests with tokens still to prefill (remaining > 0) for the decoding "
                "ones: a decoding request has remaining 0 and gets 1 token; a prompt gets its chunk after them.",
                lambda r, b: [(i, 1) for i, n in r if n > 0][:max(b, 0)]),
        Mistake("dict", "returns a dict: return a LIST of (rid, n) pairs, in plan order.", lambda *a: dict(_plan(*a))),
        Mistake("sorted in place", "SORTS `running` IN PLACE (running.sort): the caller's list is the server's queue, "
                "its order is theirs. Use sorted(running) or two passes.",
                lambda r, b: (r.sort(key=lambda x: x[1] > 0), _plan(r, b))[1]),
    ],
    passed="decode tokens first, prompts cut to the budget, nothing beyond it, the caller's list left as it was.",
    notes=_plan_notes,
)
def check_plan_step(fn) -> None:
    """Check ``fn(running, budget)``: decodes first (1 token each), then prefill chunks, within the budget."""
    check(PLAN_STEP, fn)


def _victims(running, asking, available, need, order="latest", at_asking="stop", enough=operator.ge, freed=True,
             base=True, checks=("asking", "available", "need", "blocks"), error=ValueError, most=None, first=False,
             listed="rids"):
    """The rule (vLLM V1's first come, first served): preempt the most recently admitted first until ``available``
    reaches ``need``; the asking request, once it is the latest left, preempts itself and no earlier one is touched."""
    rids = [rid for rid, _ in running]
    if "asking" in checks and asking not in rids:
        raise error(f"the asking request {asking!r} is not running")
    if ("available" in checks and available < 0) or ("need" in checks and need < 0) or (
            "blocks" in checks and any(n < 0 for _, n in running)):
        raise error("available, need and each request's blocks must not be negative")
    queue = list(enumerate(running))[::-1] if order in ("latest", "largest") else list(enumerate(running))
    if order == "largest":  # stable: the latest first among equals
        queue.sort(key=lambda x: -x[1][1])
    elif isinstance(order, list):  # these rids alone
        queue = [x for x in queue if x[1][0] in order]
    if base == "first" and enough(available, need):  # looked at once, then forgotten
        return []
    out, free = [], available if base is True else 0
    for index, (rid, blocks) in queue[:most]:
        if enough(free, need) and not (first and not out):
            break
        if rid == asking and at_asking != "go":
            if at_asking == "skip":
                continue
            out += [] if at_asking == "omit" else [index if listed == "indices" else rid]
            break
        out.append(index if listed == "indices" else rid)
        free += blocks if freed else 0
    return out[::-1] if listed == "reversed" else out

def _victims_notes(got, running, asking, available, need) -> str:
    """What a wrong choice does in the rule's terms: the first victim it takes otherwise than the rule, or where it
    stops too early or goes on too long, with the blocks counted."""
    try:
        victims, blocks, rids = list(got), dict(running), [rid for rid, _ in running]
    except TypeError:
        return ""
    if any(v not in blocks for v in victims):
        v = next(v for v in victims if v not in blocks)
        positions = all(isinstance(x, int) and 0 <= x < len(running) for x in victims)
        return f"It names {v!r}, which is no rid of `running`" + (
            ": it returns positions in the list; return the rids, running[i][0]." if positions else ".")
    free = available
    for k, v in enumerate(victims):
        if free >= need:
            return (f"It preempts {v!r} with {free} block{'s' * (free != 1)} available for a need of {need}: enough "
                    f"already; stop as soon as available >= need.")
        right = rids[len(rids) - 1 - k] if k < len(rids) else None
        if v != right:
            return (f"It preempts {v!r} where the rule preempts {right!r}, the most recently admitted still running"
                    + (", the asking request itself" if right == asking else "") + ".")
        if v == asking and k < len(victims) - 1:
            return (f"It goes on after preempting the asking request {asking!r}: once the asking request preempts "
                    f"itself, no earlier one is touched.")
        free += blocks[v]
    if free < need and asking not in victims and victims != rids[::-1]:
        nxt = rids[len(rids) - 1 - len(victims)]
        return (f"It stops with {free} block{'s' * (free != 1)} available for a need of {need}: not enough; the next "
                f"to preempt is {nxt!r}" + (", the asking request itself." if nxt == asking else "."))
    return ""

def _victims_case(running, asking, available, need):
    return Case(f"running {running}, asking {asking!r}, available {available}, need {need}",
                (running, asking, available, need))

_v = lambda **switches: lambda r, a, f, n: _victims(r, a, f, n, **switches)  # noqa: E731 - one switch

def _popped(running, asking, available, need):
    victims = _victims(running, asking, available, need)
    del running[len(running) - len(victims):]  # (the victims are the list's tail)
    return victims

CHOOSE_VICTIMS = Exercise(
    what="your choose_victims",
    reference=_victims,
    cases=[_victims_case(*c) for c in (
        ([("a", 2), ("b", 1)], "a", 3, 2),                                   # enough: nobody
        ([("a", 2), ("b", 3)], "b", 2, 2),                                   # exactly enough
        ([("a", 3), ("b", 2), ("c", 2)], "a", 0, 2),                         # one victim
        ([("a", 1), ("b", 2), ("c", 1), ("d", 1)], "a", 1, 3),               # two
        ([("a", 2), ("b", 2), ("c", 1)], "c", 0, 1),                         # the asking one is the latest
        ([("a", 4), ("b", 1), ("c", 1)], "b", 0, 3),                         # reached after a later one
        ([(3, 1), (7, 1), (12, 1)], 3, 0, 5),                                # everyone, the asking one last
        ([(5, 2), (9, 2), (4, 3)], 5, 1, 4),                                 # exactly enough after one
        ([(8, 5)], 8, 0, 1),                                                 # alone
        ([("a", 2), ("b", 0), ("c", 1)], "a", 0, 2),                         # a victim that frees nothing
        ([(10, 3), (11, 1), (12, 4), (13, 2), (14, 1), (15, 2)], 12, 1, 4),  # enough before the asking one
        ([(10, 1), (11, 3), (12, 1), (13, 1)], 13, 1, 2),                    # the latest asks
        ([("a", 0)], "a", 0, 0),
        ([("a", 1), ("b", 1)], "z", 0, 1),                                   # not running
        ([("a", 1), ("b", 1)], "z", 5, 1),
        ([("a", 1)], "a", -1, 1),                                            # negative numbers
        ([("a", 1)], "a", 0, -1),
        ([("a", 1), ("b", -2)], "a", 0, 1))],
    mistakes=[
        Mistake("oldest first", "preempts the OLDEST first, from the front of `running`: preempt the most recently "
                "admitted first (walk the list from its end), so that no request is stopped for a later one.",
                _v(order="oldest")),
        Mistake("largest first", "preempts the requests that hold the MOST BLOCKS first: the rule takes them by "
                "admission, the most recently admitted first, whatever they hold.", _v(order="largest")),
        Mistake("asking passed over", "never preempts the ASKING request: it passes over it and preempts earlier ones. "
                "When the asking request is the latest left, it preempts itself and stops.", _v(at_asking="skip")),
        Mistake("past the asking one", "goes on PAST THE ASKING request once it has preempted it: a request that "
                "preempts itself waits, and no earlier one is touched. Stop there.", _v(at_asking="go")),
        Mistake("asking left out", "stops at the asking request WITHOUT LISTING IT: when it is the latest left it "
                "preempts itself, and its rid is the last of the list.", _v(at_asking="omit")),
        Mistake("asking alone", "preempts the ASKING REQUEST ALONE whenever blocks are short: preempt the later "
                "requests first, the most recently admitted first; the asking one only once it is the latest left.",
                lambda r, a, f, n: _victims(r, a, f, n, order=[a])),
        Mistake("strict", "preempts until available > need: equal is ENOUGH, stop as soon as available >= need.",
                _v(enough=operator.gt)),
        Mistake("one victim", "preempts ONE request at most: preempt as many as it takes, until available >= need.",
                _v(most=1)),
        Mistake("freed not counted", "never adds the blocks a victim FREES to those available: it preempts until it "
                "reaches the asking request. Add each victim's blocks, and stop when available >= need.",
                _v(freed=False)),
        Mistake("available ignored", "counts only the blocks its victims free and IGNORES `available`: those blocks "
                "are free already; stop when available plus the freed blocks reach need.", _v(base=False)),
        Mistake("available forgotten", "looks at `available` once, to return [] when it is enough, then counts only "
                "the blocks its victims free, from 0: they add to `available`; stop when available plus the freed "
                "blocks reach need.", _v(base="first")),
        Mistake("admission order", "lists its victims in ADMISSION ORDER: list them in the order they are "
                "preempted, the latest admitted first.", _v(listed="reversed")),
        Mistake("positions", "returns POSITIONS in `running`, not rids: return running[i][0].",
                _v(listed="indices")),
        Mistake("asking unchecked", "does not raise when the asking request is NOT RUNNING: raise ValueError.",
                _v(checks=("available", "need", "blocks"))),
        Mistake("negatives unchecked", "does not raise on NEGATIVE numbers: raise ValueError when available, need "
                "or a request's blocks is below 0.", _v(checks=("asking",))),
        Mistake("blocks unchecked", "checks `available` and `need` but not the BLOCKS of `running`: raise "
                "ValueError when a request's blocks is negative too.", _v(checks=("asking", "available", "need"))),
        Mistake("assert", "raises AssertionError (an assert) where the statement asks for VALUEERROR: raise "
                "ValueError(...), which python -O does not remove.", _v(error=AssertionError)),
        Mistake("none", "returns None when nobody is preempted: return an EMPTY LIST, [], so that the caller can "
                "loop over it.", lambda r, a, f, n: _victims(r, a, f, n) or None),
        Mistake("at least one", "preempts a request even when available >= need from the start: check that blocks "
                "are SHORT BEFORE the first victim.", _v(first=True)),
        Mistake("popped", "POPS its victims off `running` (running.pop()), the caller's list: choose them on a copy, "
                "or walk the list with reversed(running).", _popped),
    ],
    passed="the latest admitted first, as many as it takes, stopping at the asking request once it is the latest "
           "left, nothing when blocks suffice, ValueError on a request not running or a negative number.",
    notes=_victims_notes,
    hints=((r"^ValueError$", "a ValueError on a call the statement allows: a check that refuses it (`asking` compared "
            "with the pairs of `running`, not with their rids, [rid for rid, _ in running]? 0 blocks, 0 available or a "
            "need of 0 refused?), or a pair unpacked into the wrong number of names."),),
    forbidden=("attention_course.serving.scheduler.choose_victims",),
    instead="Walk `running` from its end.",
)
def check_choose_victims(fn) -> None:
    """Check ``fn(running, asking, available, need)``: the rids to preempt, the most recently admitted first."""
    check(CHOOSE_VICTIMS, fn)

def _hash(parent, tokens):
    """sha256 of the parent's digest (nothing for the first block, parent None) and the token ids, 8 little-endian
    signed bytes each; refused as the course's block_hash refuses them: a parent that is no 32-byte key, tokens that
    are not ints, no token at all."""
    if parent is not None and (not isinstance(parent, bytes) or len(parent) != 32):
        raise ValueError(f"parent must be None (the first block) or the 32-byte key of the block before, got "
                         f"{parent!r}.")
    tokens = tokens.tolist() if isinstance(tokens, torch.Tensor) else tokens
    if not isinstance(tokens, (list, tuple)) or not all(type(t) is int for t in tokens):
        raise TypeError(f"tokens must be a list of token ids (ints), got {tokens!r}.")
    if not tokens:
        raise ValueError("a block holds at least one token; got none.")
    digest = hashlib.sha256(parent or b"")
    for t in tokens:
        digest.update(t.to_bytes(8, "little", signed=True))
    return digest.digest()

def _keys(tokens, block_size, parent="chain", span="block", count="full", stride=None, start=None, last=False,
          hexed=False):
    """The chain: key i = _hash(key i - 1, tokens[i b:(i + 1) b]) for each full block; with switches, its mistakes."""
    b, n = block_size, len(tokens)
    starts = {"full": range(0, n - b + 1, stride or b), "partial": range(0, n, b), "one more": range(0, n + 1, b),
              "last dropped": range(0, n - b, b), "one fewer": range(0, max(n - 2 * b + 1, 0), b)}[count]
    keys, key = [], None
    for i, s in enumerate(starts):
        s = i if start == "index" else s
        piece = {"block": tokens[s:s + b], "short": tokens[s:s + b - 1], "long": tokens[s:s + b + 1],
                 "prefix": tokens[:s + b]}[span]
        up = key if parent == "chain" else _hash(None, tokens[s - b:s]) if parent == "previous" and s else None
        key = _hash(up, piece)
        keys.append(key)
    if last:
        return key
    return [k.hex() for k in keys] if hexed else keys

def _find_key(key, tokens, parents: dict) -> str:
    """"block_hash(key 0, tokens[4:8])": the call that gives ``key``, its parent among ``parents`` ({words: digest})
    and its tokens a slice of ``tokens``; "" where none does."""
    for words, parent in parents.items():
        for a in range(len(tokens) + 1):
            for c in range(a + 1, len(tokens) + 1):
                if _hash(parent, tokens[a:c]) == key:
                    return f"block_hash({words}, tokens[{a}:{c}])"
    return ""

def _keys_notes(got, tokens, block_size) -> str:
    """What a wrong chain holds: how many keys for how many full blocks, and its first wrong key found again as a
    block_hash of a parent and a slice of the tokens, beside the chain's."""
    if not isinstance(got, (list, tuple)):
        return ""
    want, b = _keys(tokens, block_size), block_size
    full, rest, said = len(tokens) // b, len(tokens) % b, []
    if len(got) != len(want):
        said.append(f"It returns {len(got)} key{'s' * (len(got) != 1)}, where {len(tokens)} tokens in blocks of {b} "
                    f"make {full} full block{'s' * (full != 1)}" + (
                        f" and a partial one of {rest} token{'s' * (rest != 1)}, which has no key." if rest else "."))
    i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), None)
    if i is not None:
        right = f"block_hash({'None' if i == 0 else f'key {i - 1}'}, tokens[{i * b}:{(i + 1) * b}])"
        if not isinstance(got[i], bytes):
            said.append(f"Its key {i} is a {type(got[i]).__name__}: keep the bytes block_hash returns, {right}.")
        else:
            parents = {"None": None, **{f"key {j}": k for j, k in enumerate(want)},
                       **{f"its own key {j}": k for j, k in enumerate(got) if isinstance(k, bytes) and k not in want}}
            found = _find_key(got[i], tokens, parents)
            said.append(f"Its key {i} is {found}, where the chain gives {right}." if found else
                        f"Its key {i} is no block_hash of None or a key of the chain and a run of the tokens; the "
                        f"chain gives {right}.")
    return " ".join(said)

class _Digest(bytes):
    """A key as the messages show it: its first 4 bytes in hex, not 32 bytes of escapes."""
    def __repr__(self):
        return f"<digest {self[:4].hex()}...>"

def _shown(value):
    """The answer's result with its digests shown short (equal as bytes: only their repr changes)."""
    if isinstance(value, bytes):
        return _Digest(value)
    if type(value) in (list, tuple):
        return type(value)(_Digest(v) if isinstance(v, bytes) else v for v in value)
    return value

def _keys_case(tokens, block_size):
    full, rest = len(tokens) // block_size, len(tokens) % block_size
    name = (f"{len(tokens)} tokens {tokens} in blocks of {block_size} ({full} full" +
            (f", {rest} left over)" if rest else ")"))
    return Case(name, (tokens, block_size))

_k = lambda **switches: lambda t, b: _keys(t, b, **switches)  # noqa: E731 - one switch
BLOCK_KEYS = Exercise(
    what="your block_keys",
    reference=_keys,
    cases=[_keys_case(*c) for c in (
        ([], 2), ([7, 3, 9], 4), ([5, 1, 7, 2], 4), ([5, 1, 7, 2, 9, 3, 8, 8, 6, 0], 4),
        ([3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8], 3), ([2, 7, 1, 8, 2, 8, 1, 8, 2, 8, 4], 2), ([9, 8, 7, 6, 5, 4, 3], 1),
        ([4, 4, 4, 4, 4, 4, 4], 2), ([11, 0, 50000, 2, 128000, 7, 1, 1, 3, 12, 13, 14, 15, 16], 5))],
    mistakes=[
        Mistake("unchained", "hashes each block ALONE, block_hash(None, block): a key must hold everything before the "
                "block too. Pass the previous block's key as the parent.", _k(parent="none")),
        Mistake("previous block only", "takes as parent the key of the PREVIOUS BLOCK ALONE, block_hash(None, previous "
                "block): that key forgets what came before it. The parent is the previous key of the chain, the one "
                "just computed.", _k(parent="previous")),
        Mistake("prefix whole", "hashes the WHOLE PREFIX at each block, block_hash(None, tokens[:end]): a chain "
                "hashes only the block's own tokens, with the previous key as the parent.", _k(span="prefix",
                                                                                             parent="none")),
        Mistake("prefix and parent", "hashes the WHOLE PREFIX after the parent, block_hash(parent, tokens[:end]): the "
                "parent holds what came before; hash only the block's own tokens.", _k(span="prefix")),
        Mistake("partial", "gives the PARTIAL last block a key too: only full blocks have keys (a partial block's "
                "tokens still change). Stop at len(tokens) // block_size blocks.", _k(count="partial")),
        Mistake("one more", "hashes len(tokens) // block_size + 1 blocks: ONE MORE than the full blocks (an empty or "
                "partial last one). Stop at len(tokens) // block_size.", _k(count="one more")),
        Mistake("last dropped", "leaves out the LAST FULL BLOCK when the tokens end on a block boundary: "
                "range(0, len(tokens) - block_size, block_size) stops one short; "
                "range(0, len(tokens) - block_size + 1, block_size) does not.", _k(count="last dropped")),
        Mistake("one fewer", "stops ONE BLOCK SHORT, len(tokens) // block_size - 1 keys: every full block has one.",
                _k(count="one fewer")),
        Mistake("windows", "takes a block at EVERY POSITION (a step of 1): blocks start at 0, block_size, "
                "2 block_size, ...: range(0, n, block_size).", _k(stride=1)),
        Mistake("start not scaled", "starts block i at token i, not at i * block_size: its BLOCKS OVERLAP. Block i is "
                "tokens[i * block_size:(i + 1) * block_size].", _k(start="index")),
        Mistake("block short", "hashes block_size - 1 tokens of each block, ONE TOKEN SHORT: a slice [s:s + "
                "block_size] holds block_size tokens.", _k(span="short")),
        Mistake("block long", "hashes block_size + 1 tokens of each block, ONE TOKEN TOO MANY: a slice [s:s + "
                "block_size] holds block_size tokens.", _k(span="long")),
        Mistake("last key", "returns ONLY THE LAST KEY, the chain's end: return the list of the keys of every full "
                "block, in order.", _k(last=True)),
        Mistake("hex", "returns HEX STRINGS: keep the bytes block_hash returns (a cache compares them as they are).",
                _k(hexed=True)),
    ],
    passed="a chain: each full block's key from its parent's key and its own tokens, no key for a partial block, no "
           "block, one block, blocks of 1 to 5.",
    run=lambda answer, *args: _shown(answer(*args)),
    notes=_keys_notes,
    hints=((r"parent must be None", "the parent is the previous block's KEY, the bytes block_hash returned for it "
            "(None for the first block), as it is: not its tokens, its .hex() or b\"\"."),
           (r"^TypeError$", "block_hash(parent, tokens) takes the block's token ids as a list of ints: is a key passed "
            "as the tokens, or a list of a tensor's items (take .tolist())?"),),
    forbidden=("attention_course.serving.prefix.block_keys",),
    instead="Call block_hash for each full block, with the previous block's key as its parent.",
)
def check_block_keys(fn) -> None:
    """Check ``fn(tokens, block_size)``: the keys of the full blocks, a chain of block_hash."""
    check(BLOCK_KEYS, fn)

EXERCISES = [BLOCK_MASK, GATHER, PLAN_STEP, CHOOSE_VICTIMS, BLOCK_KEYS]
