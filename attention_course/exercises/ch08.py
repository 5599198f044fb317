"""Chapter 8's ``merge_partials(m1, l1, acc1, m2, l2, acc2)`` (``ex-ch8-merge``): the online-softmax states of two
blocks of keys, ``m`` (..., 1) the largest score, ``l`` (..., 1) the sum of ``exp(score - m)``, ``acc`` (..., dv) that
of ``exp(score - m) * value``, merged into one (m, l, acc). A block with every key masked: m = -inf, l = 0, acc = 0."""
from __future__ import annotations

import math
from functools import partial

import torch

from .diagnose import Case, Exercise, Mistake, check

NEG_INF = float("-inf")

def partial_state(scores: torch.Tensor, values: torch.Tensor):
    """(m, l, acc) of one block: scores (..., n) of the queries over n keys, values (n, dv)."""
    m = scores.amax(-1, keepdim=True)  # (..., 1)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    p = torch.exp(scores - shift)  # (..., n)
    return m, p.sum(-1, keepdim=True), p @ values

def _reference_merge(m1, l1, acc1, m2, l2, acc2, take=torch.maximum, stand_in=True, scale=(1, 1, 1, 1), swap=False,
                     factor=lambda m_block, m: torch.exp(m_block - m), fill=None):
    """The merge; each switch off it is a classic mistake. ``scale``: whether l1, l2, acc1, acc2 are rescaled."""
    if fill is not None:  # -inf replaced by a finite number
        m1, m2 = m1.clamp(min=fill), m2.clamp(min=fill)
    m = take(m1, m2)  # (..., 1)
    shift = m.masked_fill(m == NEG_INF, 0.0) if stand_in else m  # 0 where no key: exp(-inf - 0) = 0, not NaN
    c1, c2 = (factor(m2, shift), factor(m1, shift)) if swap else (factor(m1, shift), factor(m2, shift))
    f1, f2, g1, g2 = (c if on else 1.0 for c, on in zip((c1, c2, c1, c2), scale))
    return m, f1 * l1 + f2 * l2, g1 * acc1 + g2 * acc2

def _normalised(m1, l1, a1, m2, l2, a2):  # acc held divided by l, as FlashAttention-1 keeps it
    m, l, _ = _reference_merge(m1, l1, a1, m2, l2, a2)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    return m, l, ((torch.exp(m1 - shift) * l1 * a1 + torch.exp(m2 - shift) * l2 * a2) / l).nan_to_num(0.0)

def _case(lead, n1, n2, dv, empty=(), seed=8):
    """Blocks of n1, n2 keys, queries of shape ``lead`` (every other one's maximum in block 2), some blocks masked."""
    gen = torch.Generator().manual_seed(seed)
    scores = torch.randn(*lead, n1 + n2, generator=gen, dtype=torch.float64) * 3  # (..., n)
    flat = scores.view(-1, n1 + n2)
    flat[::2, n1:] += 4.0
    for q, e in enumerate(empty):
        flat[q, {1: slice(0, n1), 2: slice(n1, None), 3: slice(None)}.get(e, slice(0))] = NEG_INF
    values = torch.randn(n1 + n2, dv, generator=gen, dtype=torch.float64)
    masked = "".join(f", query {q} with {('', 'its first block', 'its second block', 'both blocks')[e]} masked"
                     for q, e in enumerate(empty) if e)
    name = f"m of shape {tuple(lead) + (1,)}, acc {tuple(lead) + (dv,)}, key blocks {n1} and {n2} long{masked}"
    marks = {f"at the queries with {w} masked{' (acc)' * (n > 1)}": where.view(*lead, 1).expand(*lead, n)
             for e, w in (((3,), "both blocks"), ((1,), "their first block"), ((2,), "their second block"),
                          ((1, 2), "one block")) for n in {1, dv}
             if (where := torch.tensor([q < len(empty) and empty[q] in e for q in range(flat.shape[0])])).any()}
    return Case(name, (*partial_state(scores[..., :n1], values[:n1]), *partial_state(scores[..., n1:], values[n1:])),
                marks)

def _terms(got, m1, l1, a1, m2, l2, a2):
    """A wrong acc said, in its first wrong query with keys in both blocks, as a acc1 + b acc2 (a, b named)."""
    acc = got[2] if isinstance(got, (tuple, list)) and len(got) == 3 else None
    if not (isinstance(acc, torch.Tensor) and acc.shape == a1.shape and acc.dtype == a1.dtype and a1.shape[-1] > 1):
        return ""
    wrong = ((acc - _reference_merge(m1, l1, a1, m2, l2, a2)[2]).abs().amax(-1) > 1e-9) & (m1 > NEG_INF)[..., 0] & \
        (m2 > NEG_INF)[..., 0]
    if not wrong.any():
        return ""
    q = tuple(wrong.nonzero()[0].tolist())
    pair = torch.stack([a1[q], a2[q]], -1)  # (dv, 2)
    a, b = torch.linalg.lstsq(pair, acc[q][:, None]).solution[:, 0].tolist()
    if not torch.allclose(pair @ torch.tensor([a, b], dtype=pair.dtype), acc[q], atol=1e-9):
        return ""  # not made of acc1 and acc2 alone
    M1, M2 = float(m1[q]), float(m2[q])
    M, e = max(M1, M2), lambda x: math.exp(x)  # noqa: E731
    names = {"0": 0.0, "1": 1.0, "exp(m1 - m)": e(M1 - M), "exp(m2 - m)": e(M2 - M), "exp(m - m1)": e(M - M1),
             "exp(m - m2)": e(M - M2), "exp(m2 - m1)": e(M2 - M1), "exp(m1 - m2)": e(M1 - M2), "exp(m1)": e(M1),
             "exp(m2)": e(M2), "1/2": 0.5}
    said = lambda c: [k for k, v in names.items() if abs(c - v) <= 1e-9 * max(1.0, abs(v))]  # noqa: E731
    say = lambda c: (said(c)[0] if said(c)[0][0] != "e" else " = ".join(said(c)) + f" = {c:.4g}") if said(c) \
        else f"{c:.4g}"  # noqa: E731
    return f"For query {list(q)}, its acc is ({say(a)}) acc1 + ({say(b)}) acc2, where the right one is (exp(m1 - m) = " \
        f"{e(M1 - M):.4g}) acc1 + (exp(m2 - m) = {e(M2 - M):.4g}) acc2, m = max(m1, m2) = {M:.4g}."

RESCALE = "multiply l1 and acc1 by exp(m1 - m), and l2 and acc2 by exp(m2 - m)"
_m = lambda **switches: partial(_reference_merge, **switches)  # noqa: E731 - the reference with switches
_then = lambda f: lambda *s: f(*_reference_merge(*s))  # noqa: E731 - the reference's (m, l, acc) changed after
MERGE = Exercise(
    what="your merge_partials",
    reference=_reference_merge,
    cases=[_case((), 1, 1, 1), _case((1,), 2, 3, 1, [1]), _case((1,), 3, 1, 2, [3]), _case((4,), 6, 4, 3, [0, 1, 2, 3]),
           _case((2, 3), 3, 5, 2, [0, 2, 0, 1, 3, 0], seed=1), _case((5,), 1, 7, 4, seed=2)],
    mistakes=[
        Mistake("no rescaling", f"adds l1 + l2 and acc1 + acc2, sums taken under two DIFFERENT MAXIMA. Rescale each "
                f"one to the common maximum m first: {RESCALE}.", _m(scale=(0, 0, 0, 0))),
        *[Mistake(f"only {x}", f"rescales only {x} to the common maximum m, not {y}: {RESCALE}.", _m(scale=on))
          for x, y, on in (("acc", "l", (0, 0, 1, 1)), ("l", "acc", (1, 1, 0, 0)))],
        Mistake("only the first block", "rescales only the first block to the common maximum m: m2 may lie below m "
                "too, so multiply l2 and acc2 by exp(m2 - m) as well.", _m(scale=(1, 0, 1, 0))),
        Mistake("swapped", "has the two factors SWAPPED: exp(m1 - m) belongs to block 1 (l1, acc1), exp(m2 - m) to "
                "block 2.", _m(swap=True)),
        *[Mistake(f"wrong way round{g}", "takes the exponent the WRONG WAY ROUND: exp(m - m1) >= 1; the factor is "
                  "exp(m1 - m) <= 1, the old maximum minus the new one.", _m(factor=lambda mb, m, g=g: torch.exp(
                      m - mb).masked_fill((mb == NEG_INF) & bool(g), 0.0))) for g in ("", " (0 where no key)")],
        *[Mistake(f"no factor on {x}{i}", f"forgets block {i}'s factor on {x}: {x} = " + " + ".join(
            f"{x}{j}" if j == i else f"exp(m{j} - m) {x}{j}" for j in (1, 2)) + f"; {RESCALE}.",
            _m(scale=[k != n for k in range(4)])) for n, (x, i) in enumerate((("l", 1), ("l", 2), ("acc", 1), ("acc", 2)))],
        *[Mistake(f"{x} swapped", f"multiplies {x}2 by block 1's factor and {x}1 by block 2's: each block's sum "
                  f"takes its own factor, {x} = exp(m1 - m) {x}1 + exp(m2 - m) {x}2.", lambda *s, i=i: _reference_merge(
                      *[s[{i: i + 3, i + 3: i}.get(j, j)] for j in range(6)])) for x, i in (("l", 1), ("acc", 2))],
        Mistake("guard for all", "guards a query with no key only when EVERY query has none (a Python `if` on "
                ".all()): among others, it still gets exp(-inf - -inf) = NaN. Guard each query: 0 in place of m "
                "where m is -inf, m.masked_fill(m == float('-inf'), 0).", lambda *s: _reference_merge(
                    *s, stand_in=bool((s[0] == NEG_INF).all() and (s[3] == NEG_INF).all()))),
        Mistake("acc as normalised", "treats acc as already divided by l (each acc weighted by its l, the sum "
                "divided by the new l), FlashAttention-1's form: keep acc the unnormalised sum, "
                "exp(m1 - m) acc1 + exp(m2 - m) acc2.", lambda m1, l1, a1, m2, l2, a2: _normalised(m1, l1, a1, m2, l2, a2)),
        Mistake("averaged", "halves l and acc, the MEAN of the two states: acc / l is right, but l and acc are sums, "
                "exp(m1 - m) l1 + exp(m2 - m) l2.", _then(lambda m, l, acc: (m, l / 2, acc / 2))),
        Mistake("no exp", "takes m1 - m as the factor, WITHOUT THE EXPONENTIAL: it is exp(m1 - m), since l and acc "
                "hold exp(score - m).", _m(factor=lambda mb, m: mb - m)),
        Mistake("no common maximum", "scales the blocks by exp(m1) and exp(m2), not exp(m1 - m) and exp(m2 - m): acc / "
                "l is right, but l and acc are not the sums under m.", _m(factor=lambda mb, m: torch.exp(mb))),
        Mistake("m2 kept", "keeps m = m2 and rescales only the first block: m2 need not be the larger; m = "
                "torch.maximum(m1, m2), both blocks rescaled to it.", _m(take=lambda a, b: b, scale=(1, 0, 1, 0))),
        Mistake("m1", "returns m = m1, the first block's maximum; the second block may hold a larger score: "
                "m = torch.maximum(m1, m2).", _m(take=lambda a, b: a)),
        Mistake("minimum", "returns the smaller of m1 and m2 as m; it must be the larger, torch.maximum(m1, m2).",
                _m(take=torch.minimum)),
        Mistake("all queries", "returns one m for all queries, the largest of all: take the maximum per query, "
                "torch.maximum(m1, m2).", _m(take=lambda a, b: torch.cat([a, b]).amax().expand_as(a))),
        Mistake("stand-in returned", "returns m = 0 for a query with no key: m is -inf there; 0, the stand-in, belongs "
                "only inside the exponentials.", _then(lambda m, l, acc: (m.nan_to_num(0.0, 0.0, 0.0), l, acc))),
        Mistake("NaN", "gives NaN for a query with no key in either block (m1 = m2 = m = -inf): exp(-inf - -inf), or "
                "exp(inf) times 0, is NaN. Subtract one finite stand-in for the COMMON m (0 where m is -inf) inside both "
                "exponentials, exp(m1 - stand_in).", _m(stand_in=False)),
        *[Mistake(f"fill {text}", f"returns m = {text} for a query with no key: m must stay -inf there. A finite fill "
                  f"belongs only inside the exponentials, as the stand-in subtracted there.", _m(fill=value))
          for value, text in ((-1e4, "-1e4"), (-1e9, "-1e9"), (torch.finfo(torch.float64).min, "-1.8e308"))],
        *[Mistake(f"outputs {how}", f"{verb} the two blocks' outputs acc1 / l1 and acc2 / l2: merge the sums, not the "
                  f"outputs: {RESCALE}, and add.", lambda m1, l1, a1, m2, l2, a2, k=k: (
                      torch.maximum(m1, m2), torch.ones_like(l1), (a1 / l1 + a2 / l2) / k))
          for how, verb, k in (("averaged", "takes the mean of", 2), ("added", "adds", 1))],
        Mistake("acc divided", "returns acc already divided by l: keep acc the unnormalised sum of exp(score - m) * "
                "value, divided only at the very end.", _then(lambda m, l, acc: (m, l, acc / l))),
        Mistake("order", "returns (m, acc, l), the wrong order: (m, l, acc).", _then(lambda m, l, a: (m, a, l))),
    ],
    passed="the state of all the keys at once, for any number of queries and any dv, one block or both masked.",
    parts=("m", "l", "acc"), notes=_terms,
    hints=((r"must match the size of tensor b", "m, l and the factors exp(m1 - m) are (..., 1), acc (..., dv): keep "
            "the last axis of size 1 (keepdim=True, no squeeze), so that a factor scales every column of acc."),),
)
def check_merge_partials(fn) -> None:
    """Check ``fn(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``: the state of the two blocks together."""
    check(MERGE, fn)

EXERCISES = [MERGE]
