"""Checkers for chapter 12, attention that serves many: packed batches, a paged cache, continuous batching.

The exercises, as the learner writes them (masks are IGNORE masks, bool, True = may NOT attend):

1. ``block_mask(cu_seqlens)`` -- :func:`check_block_mask`, grade_id ``ex-ch12-block-mask``. ``cu_seqlens`` a
   LongTensor (n + 1,) = [0, L_0, L_0 + L_1, ..., N]. Returns the (N, N) bool ignore mask of packed causal attention:
   True where query row i and key row j belong to different sequences, or j > i. Without the package's
   ``block_diagonal_mask`` or ``sequence_ids``.
2. ``gather(pool, table, length)`` -- :func:`check_gather`, grade_id ``ex-ch12-gather``. ``pool`` (num_blocks, h_kv,
   block_size, d); ``table`` a list of block numbers (the request's blocks, in the order of its tokens); ``length``
   the request's token count. Returns (h_kv, length, d): token t is at ``pool[table[t // block_size], :,
   t % block_size]``. Without the package's ``gather_blocks``.
3. ``plan_step(running, budget)`` -- :func:`check_plan_step`, grade_id ``ex-ch12-plan-step``. ``running`` a list of
   (rid, prompt tokens not yet fed) pairs, 0 for a request that is decoding; ``budget`` the step's token budget.
   Returns a list of (rid, n): every decoding request first, one token each, in the order given, as long as the
   budget lasts; then the prefilling ones in the order given, each a chunk of min(its remaining prompt, budget
   left); requests that get no token are left out.

Each checker reruns a private reference with each classic mistake applied and names the one the answer matches.
"""
from __future__ import annotations

import torch

from . import ExerciseError, passed, raised


def _run(fn, *args, what):
    try:
        return fn(*args)
    except ExerciseError:
        raise
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything; it is named, not hidden
        raise raised(err, what) from err


def _mistake(got, variants, case) -> None:
    for variant, message in variants:
        if variant() is None:
            continue
        if got == variant() if not isinstance(got, torch.Tensor) else _equal(got, variant()):
            raise ExerciseError(f"{case}: {message}")


def _equal(a, b) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)


# ----------------------------------------------------------------------------------------------------------
# Exercise 1: the block-diagonal causal mask from cu_seqlens


def _block(cu, causal="below", blocks=True, shift=False):
    N = int(cu[-1])
    ids = torch.searchsorted(cu, torch.arange(N), right=True) - 1  # (N,): row i's sequence
    if shift:  # the first row of each sequence (a start) counted in the sequence before it
        ids = torch.searchsorted(cu, torch.arange(N), right=False) - 1
        ids = ids.clamp(min=0)
    rows = torch.arange(N)
    ignore = ids[:, None] != ids[None, :] if blocks else torch.zeros(N, N, dtype=torch.bool)
    if causal == "below":
        ignore = ignore | (rows[None, :] > rows[:, None])
    elif causal == "strict":
        ignore = ignore | (rows[None, :] >= rows[:, None])
    elif causal == "above":
        ignore = ignore | (rows[None, :] < rows[:, None])
    return ignore


_BLOCK_CASES = [("three sequences of lengths 3, 1, 4", torch.tensor([0, 3, 4, 8])),
                ("two sequences of lengths 2, 5", torch.tensor([0, 2, 7])),
                ("one sequence of length 4", torch.tensor([0, 4]))]


def check_block_mask(fn) -> None:
    """Check ``fn(cu_seqlens)``: the (N, N) ignore mask, different sequence or later key."""
    what = "your block_mask"
    for case, cu in _BLOCK_CASES:
        got = _run(fn, cu.clone(), what=what)
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{case}: {what} must return a torch.Tensor, got {type(got).__name__}.")
        got = got.detach().cpu()
        N = int(cu[-1])
        if got.shape != (N, N):
            raise ExerciseError(f"{case}: the mask has shape {tuple(got.shape)}, expected (N, N) = {(N, N)}, one row per "
                                f"packed query and one column per packed key (N = cu_seqlens[-1]).")
        if got.dtype != torch.bool:
            raise ExerciseError(f"{case}: the mask is {got.dtype}, expected a bool ignore mask (True = hidden); compare "
                                f"with != and >, and combine with |.")
        want = _block(cu)
        if torch.equal(got, want):
            continue
        _mistake(got, [
            (lambda: ~want, "your mask is True where a key MAY be attended: an allow mask, the polarity SWAPPED. "
                            "The course's masks are ignore masks: True where the key is hidden."),
            (lambda: _block(cu, causal=None), "your mask keeps each sequence apart but is NOT CAUSAL: a query reads "
                                              "the later tokens of its own sequence. Also hide j > i."),
            (lambda: _block(cu, blocks=False), "your mask is causal over the whole packed row but has NO BLOCKS: a "
                                               "query reads the earlier sequences. Also hide keys of another "
                                               "sequence."),
            (lambda: _block(cu, causal="strict"), "your mask hides the DIAGONAL: a query must read its own key "
                                                  "(hide j > i, not j >= i)."),
            (lambda: _block(cu, causal="above"), "your causal part hides the PAST instead of the future: hide "
                                                 "j > i (a later key), keep j <= i."),
            (lambda: _block(cu, shift=True), "your sequences are shifted by one row at each BOUNDARY: row cu[i] "
                                             "starts sequence i (searchsorted(cu, rows, right=True) - 1, or "
                                             "repeat_interleave of the lengths)."),
        ], case)
        i, j = (got != want).nonzero()[0].tolist()
        raise ExerciseError(f"{case}: your mask differs at {int((got != want).sum())} of {N * N} entries, e.g. query "
                            f"{i}, key {j}: expected {bool(want[i, j])}. Hide a key of another sequence or after the "
                            f"query.")
    passed("block-diagonal and causal: three sequences, two, and one alone (plain causal).")


# ----------------------------------------------------------------------------------------------------------
# Exercise 2: one request's keys through its block table


def _gather(pool, table, length, order="table", cut=True, transpose=True):
    nb, h, b, d = pool.shape
    blocks = {"table": table, "sorted": sorted(table), "first": list(range(len(table)))}[order]
    x = pool[torch.tensor(blocks)]  # (n, h, b, d)
    x = x.transpose(0, 1).reshape(h, -1, d) if transpose else x.reshape(h, -1, d)
    return x[:, :length] if cut else x


def _gather_cases():
    gen = torch.Generator().manual_seed(12)
    pool = torch.randn(8, 2, 4, 3, generator=gen, dtype=torch.float64)
    return [("table [5, 2, 7], 10 tokens (the last block partly filled)", pool, [5, 2, 7], 10),
            ("table [3, 0], 8 tokens (both blocks full)", pool, [3, 0], 8),
            ("table [6], 1 token", pool, [6], 1)]


def check_gather(fn) -> None:
    """Check ``fn(pool, table, length)``: (h_kv, length, d), token t from block table[t // b], offset t % b."""
    what = "your gather"
    for case, pool, table, length in _gather_cases():
        got = _run(fn, pool.clone(), list(table), length, what=what)
        if not isinstance(got, torch.Tensor):
            raise ExerciseError(f"{case}: {what} must return a torch.Tensor, got {type(got).__name__}.")
        got = got.detach().cpu()
        want = _gather(pool, table, length)
        if _equal(got, want):
            continue
        h, d = pool.shape[1], pool.shape[3]
        if got.shape == (h, len(table) * pool.shape[2], d) and got.shape != want.shape:
            raise ExerciseError(f"{case}: you return every slot of the blocks, {got.shape[1]} tokens: NOT CUT at the "
                                f"request's length {length}. The last block's slots after it are empty (or hold "
                                f"another request's old tokens).")
        if got.shape != want.shape:
            raise ExerciseError(f"{case}: shape {tuple(got.shape)}, expected (h_kv, length, d) = "
                                f"{tuple(want.shape)}.")
        _mistake(got, [
            (lambda: _gather(pool, table, length, order="sorted"), "you read the blocks in POOL ORDER (sorted): a "
             "request's tokens are in the order of its block table, whatever the block numbers."),
            (lambda: _gather(pool, table, length, order="first"), "you read blocks 0, 1, 2, ... of the pool: the "
             "block TABLE IS IGNORED. Index the pool with the table, pool[table]."),
            (lambda: _gather(pool, table, length, transpose=False), "your reshape MIXES HEADS and blocks: "
             "pool[table] is (n, h_kv, b, d); move the heads first, transpose(0, 1), then merge n and b."),
            (lambda: _gather(pool, table, length + 1)[:, 1:] if length < len(table) * pool.shape[2] else None,
             "your tokens are SHIFTED by one slot: token t sits at offset t % b of block table[t // b], counting "
             "from t = 0."),
        ], case)
        raise ExerciseError(f"{case}: your keys differ from the request's by up to "
                            f"{float((got - want).abs().max()):.2g}: token t is pool[table[t // b], :, t % b].")
    passed("tables out of order, full and partly filled blocks, one token.")


# ----------------------------------------------------------------------------------------------------------
# Exercise 3: one scheduler step


def _plan(running, budget, decode_first=True, chunks=True, zeros=False, limit=True):
    order = sorted(running, key=lambda r: r[1] > 0) if decode_first else sorted(running, key=lambda r: r[1] == 0)
    out, left = [], budget
    for rid, remaining in order:
        n = 1 if remaining == 0 else remaining
        if limit:
            n = min(n, left) if chunks else (n if n <= left else 0)
        if n or zeros:
            out.append((rid, n))
        left -= n
    return out


_PLAN_CASES = [("two decoding, two prefilling, budget 8", [("a", 5), ("b", 0), ("c", 4), ("d", 0)], 8),
               ("one long prompt, budget 6", [("p", 10), ("q", 0)], 6),
               ("more decodes than the budget", [("a", 0), ("b", 0), ("c", 0), ("d", 3)], 2)]


def check_plan_step(fn) -> None:
    """Check ``fn(running, budget)``: decodes first (1 token each), then prefill chunks, within the budget."""
    what = "your plan_step"
    for case, running, budget in _PLAN_CASES:
        got = _run(fn, list(running), budget, what=what)
        if not isinstance(got, (list, tuple)):
            raise ExerciseError(f"{case}: {what} must return a list of (rid, n) pairs, got {type(got).__name__}.")
        got = [tuple(pair) for pair in got]
        want = _plan(running, budget)
        if got == want:
            continue
        _mistake(got, [
            (lambda: _plan(running, budget, decode_first=False), "you plan the PREFILL chunks FIRST: a long prompt "
             "then takes the budget and the decoding requests wait. Decode tokens first, one each."),
            (lambda: _plan(running, budget, limit=False), "your plan IGNORES THE BUDGET: the step's tokens add up to "
             "more than budget. Cut each prompt to the budget left."),
            (lambda: _plan(running, budget, chunks=False), "you skip a prompt that does not fit whole: NO CHUNKS. A "
             "prompt longer than the budget left gets min(remaining, budget left) tokens now, the rest later."),
            (lambda: _plan(running, budget, zeros=True), "your plan lists requests with ZERO tokens: leave out the "
             "requests that get nothing this step."),
        ], case)
        raise ExerciseError(f"{case}: expected {want}, got {got}. Decoding requests first (1 token each), then "
                            f"prompts in chunks of min(remaining, budget left), within the budget.")
    passed("decode tokens first, prompts cut to the budget, nothing beyond it.")
