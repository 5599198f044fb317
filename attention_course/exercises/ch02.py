"""Chapter 2's checkers: ``my_softmax(scores, dim=-1)`` (ex-ch2-softmax), torch.softmax without it; ``attention(q, k,
v)`` (ex-ch2-attention): q (B, L, d), k (B, S, d), v (B, S, dv) -> (weights @ v, softmax(q k^T / sqrt(d)))."""
from __future__ import annotations

import torch

from .diagnose import Case, Exercise, Mistake, check

def _softmax(s, dim=-1, shift="max", over=None, exp=True, divide=True, keep=(True, True), below=None):
    """The reference; the slips as options (``over``: the axis really used, ``below``: "raw" or "all" sums)."""
    dim = dim if over is None else over
    top = {"max": lambda: s.amax(dim, keepdim=keep[0]), "global": s.max, "min": lambda: s.amin(dim, keepdim=True),
           "mean": lambda: s.mean(dim, True), None: lambda: 0.0, "+": lambda: -s.amax(dim, keepdim=True),
           "last": lambda: s.amax(-1, keepdim=True), "/": lambda: s - s / s.abs().amax(dim, True),
           "index": lambda: s.argmax(dim, keepdim=True).to(s.dtype)}[shift]()
    e = (s - top).exp() if exp else s - top
    total = {"raw": lambda: s.exp().sum(dim, True), "all": e.sum, "0": lambda: e.sum(0, keepdim=True)}.get(below, lambda: e.sum(dim, keepdim=keep[1]))
    return e / total() if divide else e

def _ties(got, s, dim=-1):
    """The notes: two scores that differ given the same weight, where the right weights differ (a clamp)."""
    if not isinstance(got, torch.Tensor) or got.shape != s.shape or not s.ndim:
        return ""
    g, t, w = (x.movedim(dim, -1).unsqueeze(-1) for x in (got.to(s.dtype), s, torch.softmax(s, dim)))
    tie = (g == g.mT) & (t != t.mT) & ((w - w.mT).abs() > 1e-6 * (w + w.mT))
    a, b = (t.expand_as(tie)[tie][:1].sum(), t.mT.expand_as(tie)[tie][:1].sum())
    return (f"It gives the scores {a:.5g} and {b:.5g} one weight, where a higher score must weigh more: shift each "
            f"row by its own maximum, along dim.") * bool(tie.any())

_scores = lambda name, s, dim=-1: Case(f"{name}, shape {tuple(s.shape)}{f', dim={dim}' * (dim != -1)}",  # noqa: E731
                                       (s,) if dim == -1 else (s, dim))
_sm = lambda **slip: lambda s, dim=-1: _softmax(s, dim, **slip)  # noqa: E731
_r = (lambda g: lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64))(torch.Generator().manual_seed(2))
SHARE = "Weights are exp(s_j) / sum_k exp(s_k)."
KEEPDIM = "without keepdim=True: it has one axis fewer and lines up with another axis. Use keepdim=True."
SOFTMAX = Exercise(
    what="your softmax",
    reference=_softmax,
    cases=[_scores("one score", _r(1)), _scores("ordinary scores", _r(3, 5)), _scores("a square matrix", _r(4, 4)),
           _scores("ordinary scores", _r(3, 5), 0), _scores("scores around 1000", _r(3, 5) + 1000),
           _scores("two rows 1000 apart", _r(5) - torch.tensor([[0.], [1e3]])), _scores("a batch", _r(2, 3, 4), 1),
           _scores("the rows [-1000, 0, 500] and [-800, 0, 800]", torch.tensor([[-1e3, 0, 500], [-800, 0, 800.]])),
           _scores("float32 scores", _r(3, 5).float()), _scores("a batch", _r(2, 3, 4), 0),
           _scores("a row just past exp's limit (709.8)",
                   torch.tensor([[709.0, 709.5, 710.5, 705.0, 700.0]] + [[0.0, 1.0, 2.0, 3.0, -1.0]] * 3,
                                dtype=torch.float64))],  # (the largest case: shown last)
    mistakes=[
        Mistake("no shift", "takes exp of the scores as they are: exp(1000) overflows to inf, inf / inf = NaN. A "
                "constant changes no weight: subtract each row's maximum first.", _sm(shift=None)),
        Mistake("global max", "subtracts ONE maximum for the whole tensor: a row far below it underflows to 0 / 0 = "
                "NaN. Subtract each row's own maximum, scores.max(dim, keepdim=True).values.", _sm(shift="global")),
        *[Mistake(stat, f"shifts each row by its {stat}: exp overflows on a wide row. Subtract the row's MAXIMUM, not "
                  f"its minimum or mean.", _sm(shift=stat)) for stat in ("min", "mean")],
        Mistake("argmax position", "subtracts the POSITION of each row's maximum (max(dim)[1], .indices, argmax), "
                "not its value: scores.max(dim, keepdim=True).values.", _sm(shift="index")),
        Mistake("/max", "DIVIDES the scores by the row's largest |score|: subtract the maximum.", _sm(shift="/")),
        Mistake("max last", "takes the max along the last axis, not `dim`: amax(dim, True).", _sm(shift="last")),
        Mistake("+max", "ADDS each row's maximum to the scores: exp overflows. Subtract it.", _sm(shift="+")),
        Mistake("raw sum", "shifts the numerator by the row's maximum but sums exp of the UNSHIFTED scores below it: "
                "shift both, e = (scores - max).exp(), then e / e.sum(dim, keepdim=True).", _sm(below="raw")),
        Mistake("sum dim 0", "divides by a sum down dim 0 whatever `dim` is: sum along `dim`, keepdim=True.",
                _sm(below="0")),
        Mistake("clamp 80", "clamps the scores at 80 before exp instead of subtracting the maximum: far below it exp "
                "underflows, 0 / 0 = NaN, and scores above 80 all get one weight. Subtract each row's maximum.",
                lambda s, dim=-1: (e := s.clamp(max=80.0).exp()) / e.sum(dim, keepdim=True)),
        Mistake("sum all", "divides by the sum of the WHOLE tensor: sum along `dim`, keepdim=True.", _sm(below="all")),
        Mistake("no exp", f"divides the scores by their sum without taking exp first. {SHARE}", _sm(shift=None, exp=0)),
        Mistake("shifted, no exp", f"subtracts the max, then divides by the sum WITHOUT exp: the weights are "
                f"e = exp(scores - max) over e's sum. {SHARE}", _sm(exp=0)),
        Mistake("no division", f"takes exp but does not divide by the sum along `dim`. {SHARE}", _sm(divide=False)),
        Mistake("log", f"returns log_softmax, the LOG of the weights. {SHARE}", lambda s, dim=-1: s.log_softmax(dim)),
        Mistake("argmax", f"is one-hot, an argmax. {SHARE}", lambda s, dim=-1: (s == s.amax(dim, True)).to(s.dtype)),
        Mistake("dim 0", "normalises down the COLUMNS (dim 0) whatever `dim` is: use `dim`.", _sm(over=0)),
        Mistake("dim ignored", "ignores its `dim` argument: normalises along the last axis.", _sm(over=-1)),
        Mistake("max keepdim", f"subtracts scores.max(dim).values taken {KEEPDIM}", _sm(keep=(False, True))),
        Mistake("sum keepdim", f"divides by a sum taken {KEEPDIM}", _sm(keep=(True, False))),
    ],
    passed="stable for scores around 1000 and rows 1000 apart, `dim` respected, any shape, the scores' dtype.",
    notes=_ties,
)

def check_softmax(fn) -> None:
    """Check ``fn(scores, dim=-1)``: ``torch.softmax(scores, dim)`` without calling it."""
    check(SOFTMAX, fn)

def _attention(q, k, v, by=lambda q, k, v: q.shape[-1] ** 0.5, dim=-1, kT=lambda k: k.mT, after=False,
               softmax=True, swap=False, out=lambda w, k, v: w @ v):
    """The reference, and the classic slips as options (``by``: the scores' divisor). Returns (output, weights)."""
    scores = (k @ q.mT if swap else q @ kT(k)) / (1 if after else by(q, k, v))  # (B, L, S)
    weights = torch.softmax(scores, dim) if softmax is True else scores.exp() / scores.exp().sum(dim, True) if \
        softmax == "naive" else scores
    weights = weights / by(q, k, v) if after else weights
    return out(weights, k, v), weights

def _qkv(B, L, S, d, dv, scale=1):
    g = torch.Generator().manual_seed(3)
    name = f"B={B}, L={L} quer{'ies' if L > 1 else 'y'}, S={S} key{'s' * (S > 1)}, d={d}, dv={dv}" + (
        f", q and k times {scale} (scores in the thousands)" if scale > 1 else "")
    q, k, v = (torch.randn(B, n, m, generator=g).double() for n, m in ((L, d), (S, d), (S, dv)))
    return Case(name, (q * scale, k * scale, v))

def scale_note(got, raw, d, name="d"):
    """The notes: weights softmax(raw / c), c a constant other than sqrt(d), say c (masked keys aside)."""
    w = got[1] if isinstance(got, tuple) and len(got) == 2 and isinstance(got[1], torch.Tensor) else raw[:0]
    if w.shape != raw.shape:
        return ""
    lw, top = w.to(raw.dtype).log(), w.argmax(-1, keepdim=True)
    dl, dr = (lw - lw.gather(-1, top))[w > 0], (raw - raw.gather(-1, top))[w > 0]
    c = float(dr @ dr / (dr @ dl)) if len(dr) > 1 else 0.0
    if not c or not torch.allclose(dl * c, dr, rtol=1e-6, atol=1e-6) or abs(c / d ** 0.5 - 1) < 1e-6:
        return ""
    root = f" = sqrt({round(c * c)})" * (abs(c * c - round(c * c)) < 1e-6)
    return f"Its weights are softmax(scores / {c:.4g}{root}): divide by sqrt({name}), sqrt({d}) here."

_a = lambda **slip: lambda q, k, v: _attention(q, k, v, **slip)  # noqa: E731
SUM = "each query's weights over the keys must sum to 1, softmax(..., dim=-1)."
DIVIDE = "the scale is sqrt(d), the size of the vectors in each dot product: q k^T / sqrt(d)."
ATTENTION = Exercise(
    what="your attention",
    reference=_attention,
    cases=[_qkv(*s) for s in ((1, 1, 1, 6, 1), (1, 1, 3, 2, 3), (2, 3, 5, 4, 6), (3, 4, 4, 2, 2), (2, 5, 2, 9, 1),
                              (2, 4, 3, 6, 3), (3, 2, 5, 6, 2), (1, 2, 3, 64, 2), (2, 1, 2, 64, 3), (2, 3, 4, 16, 2, 30))],  # the book's d
    mistakes=[
        Mistake("no scale", "did not scale the scores: divide q k^T by sqrt(d).", _a(by=lambda *a: 1)),
        *[Mistake(name, f"divided the scores by {name}; {DIVIDE}", _a(by=by)) for name, by in (
            ("d", lambda q, k, v: q.shape[-1]), ("sqrt(S), the number of keys", lambda q, k, v: k.shape[-2] ** 0.5),
            ("sqrt(dv), the size of the VALUES", lambda q, k, v: v.shape[-1] ** 0.5),
            ("sqrt(L), the number of queries", lambda q, k, v: q.shape[-2] ** 0.5))],
        Mistake("times sqrt d", f"MULTIPLIED the scores by sqrt(d); {DIVIDE}", _a(by=lambda q, k, v: q.shape[-1]**-.5)),
        Mistake("after", "divided the WEIGHTS by sqrt(d), after the softmax: scale the scores.", _a(after=True)),
        Mistake("queries", f"normalised over the queries (softmax dim=-2): {SUM}", _a(dim=-2)),
        Mistake("batch", f"normalised over the BATCH (softmax dim=0), mixing the sentences: {SUM}", _a(dim=0)),
        Mistake("naive softmax", "takes exp of the scores without subtracting each row's maximum: large scores "
                "overflow, inf / inf = NaN. torch.softmax(scores, dim=-1), or subtract the max first.", _a(softmax="naive")),
        Mistake("no softmax", "returns the scaled scores as weights: no softmax was applied.", _a(softmax=False)),
        Mistake("k q^T", "computes k q^T: row i must be query i, q @ k.transpose(-2, -1).", _a(swap=True)),
        Mistake("k.T", "uses k.T: on a 3-D tensor it reverses ALL the axes, (B, S, d) -> (d, S, B). Transpose the "
                "last two: k.transpose(-2, -1).", _a(kT=lambda k: k.permute(2, 1, 0))),
        Mistake("k reshaped", "reshaped k to (B, d, S): a reshape keeps the entries' order, only a transpose turns "
                "them: k.transpose(-2, -1).", _a(kT=lambda k: k.reshape(k.shape[0], k.shape[2], -1))),
        Mistake("keys averaged", "averaged the keys: the output is weights @ v.", _a(out=lambda w, k, v: w @ k)),
        Mistake("weights^T", "multiplies the TRANSPOSED weights by v: weights @ v.", _a(out=lambda w, k, v: w.mT @ v)),
        Mistake("pair swapped", "returns (weights, output): return (output, weights), in that order.",
                lambda *a: _attention(*a)[::-1]),
        Mistake("output only", "returns the output alone: return the pair (output, weights).",
                lambda *a: _attention(*a)[0]),
        Mistake("scores returned", "returns the scaled SCORES where the weights belong (its output, from the weights, "
                "is right): return softmax(scores), the weights the output used.",
                lambda *a: (_attention(*a)[0], _attention(*a, softmax=False)[1])),
    ],
    passed="weights = softmax(q k^T / sqrt(d)) over the keys, output = weights @ v, for L != S and d != dv too.",
    parts=("output", "tensor of weights"),
    notes=lambda got, q, k, v: scale_note(got, q @ k.mT, q.shape[-1]),
)

def check_attention(fn) -> None:
    """Check ``fn(q, k, v) -> (output, weights)`` on batches of every size, one query and one key included."""
    check(ATTENTION, fn)

EXERCISES = [SOFTMAX, ATTENTION]
