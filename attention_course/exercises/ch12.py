"""Checkers for chapter 12, attention that serves many (masks are IGNORE masks: True = may NOT attend):
1. ``block_mask(cu_seqlens)`` (``ex-ch12-block-mask``): True where rows i and j are of different sequences or j > i.
2. ``gather(pool, table, length)`` (``ex-ch12-gather``): (h_kv, length, d), token t from pool[table[t // b], :, t % b].
3. ``plan_step(running, budget)`` (``ex-ch12-plan-step``): [(rid, n)], decodes first (one token each), then prompts."""
from __future__ import annotations

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

EXERCISES = [BLOCK_MASK, GATHER, PLAN_STEP]
