"""Checkers for chapter 2, from scores to a representation.

* :func:`check_softmax` -- a numerically stable softmax along a chosen dimension;
* :func:`check_attention` -- ``softmax(q k^T / sqrt(d)) v`` for a batch, returning the output and the weights.
"""
from __future__ import annotations

import math

import torch

from . import DTYPE, ExerciseError, call, close, device_hint, max_diff, passed, require_shape, require_tensor

# ----------------------------------------------------------------------------------------------------------
# Exercise: a stable softmax


def _run_softmax(fn, *args, what: str):
    """``call``, with the usual causes of an error in a hand-written softmax named."""
    try:
        return call(fn, *args, what=what)
    except ExerciseError as err:
        if "must match the size" in str(err):
            raise ExerciseError(
                f"{err} Did you forget keepdim=True? scores.max(-1).values has shape (3,) for scores (3, 5), which "
                f"does not line up with the rows; with keepdim=True it is (3, 1) and broadcasts along each row."
            ) from err
        if "return_types.max" in str(err):
            raise ExerciseError(
                f"{err} scores.max(dim, keepdim=True) returns a pair (values, indices): subtract its .values."
            ) from err
        raise


def _rows_sum_to_one(weights: torch.Tensor, dim: int) -> bool:
    sums = weights.sum(dim)
    return close(sums, torch.ones_like(sums), 1e-6)


def _softmax_value_mistake(got: torch.Tensor, scores: torch.Tensor) -> str:
    """What differs between ``got`` and ``softmax(scores, -1)``: the classic slips first, then the symptoms."""
    if close(got, torch.softmax(scores, 0)):
        return ("your weights sum to 1 down each COLUMN, not along each row: you normalised over dimension 0. "
                "Take exp, max and sum along `dim` (here -1), with keepdim=True.")
    if close(got, torch.log_softmax(scores, -1)):
        return ("your function returns log_softmax (the LOG of the weights, all <= 0), not the weights: exp(s_j) / "
                "sum_k exp(s_k).")
    if close(got, scores / scores.sum(-1, keepdim=True)):
        return ("you divided the scores by their sum without taking exp first: a negative score would get a "
                "negative share. Weights are exp(s_j) / sum_k exp(s_k).")
    if close(got, scores.exp()) or close(got, (scores - scores.max(-1, keepdim=True).values).exp()):
        return "you took exp but did not divide by the sum of each row: exp(s_j) / sum_k exp(s_k)."
    if close(got, torch.nn.functional.one_hot(scores.argmax(-1), scores.shape[-1]).to(got.dtype)):
        return ("your weights are one-hot: all the weight on the largest score, an argmax. Softmax gives every "
                "score a positive share, exp(s_j) / sum_k exp(s_k).")
    if bool((got < 0).any()):
        return "your function returns negative weights: every weight must be exp(...) > 0."
    if not _rows_sum_to_one(got, -1):
        return "the rows of your result do not sum to 1: divide each exp by its row's sum."
    return "your weights are not softmax(scores): compute exp(s_j) / sum_k exp(s_k) per row."


def check_softmax(fn) -> None:
    """Check ``fn(scores, dim=-1) -> weights``: ``torch.softmax(scores, dim)`` without calling it.

    Tried on ordinary scores, on scores around 1000 (``exp(1000)`` overflows), on rows that sit at very
    different levels, on a row whose scores span 1600, and along ``dim=0``.
    """
    gen = torch.Generator().manual_seed(2)
    scores = torch.randn(3, 5, generator=gen, dtype=DTYPE)  # (rows, S)
    given = scores.clone()  # the learner's function may change its input in place
    got = require_tensor(_run_softmax(fn, given, what="your softmax"), "scores of shape (3, 5)", "your softmax")
    require_shape(got, scores.shape, "the result", "the shape of scores")
    if not torch.equal(given, scores):
        raise ExerciseError(
            "your function changed the scores it was given in place (scores -= ..., sub_, exp_): the caller's "
            "tensor is no longer its scores. Build new tensors: shifted = scores - scores.max(dim, keepdim=True)"
            ".values."
        )
    if got.dtype != scores.dtype:
        raise ExerciseError(
            f"your softmax returns dtype {got.dtype} for scores of dtype {scores.dtype}: keep the dtype of the "
            f"scores (no .float() or dtype= on the way)."
        )
    want = torch.softmax(scores, -1)
    if not close(got, want):
        raise ExerciseError(
            f"{_softmax_value_mistake(got, scores)} (largest difference from softmax: {max_diff(got, want):.2g})"
        )

    large = scores + 1000.0  # exp(1000) = inf in float64 (the largest is about exp(709))
    got_large = _run_softmax(fn, large, what="your softmax on scores around 1000")
    if not torch.isfinite(got_large).all():
        raise ExerciseError(
            "your softmax returns NaN or inf for scores around 1000, where exp overflows to inf and inf / inf = NaN. "
            "Softmax does not change when a constant is subtracted from a row: subtract each row's maximum first, "
            "scores - scores.max(dim, keepdim=True).values."
        )
    if not close(got_large, want):
        raise ExerciseError(
            f"for scores around 1000 your weights differ from softmax by {max_diff(got_large, want):.2g} "
            f"(they should equal the weights of the same scores shifted by -1000)."
        )

    levels = torch.stack([scores[0], scores[1] - 1000.0])  # row 1 sits 1000 below row 0
    got_levels = _run_softmax(fn, levels, what="your softmax on rows at different levels")
    if not (torch.isfinite(got_levels).all() and close(got_levels, torch.softmax(levels, -1))):
        raise ExerciseError(
            "your softmax fails when one row's scores sit 1000 below another's: you subtracted ONE maximum for the "
            "whole tensor, so every exp of the low row underflows to 0 and 0 / 0 = NaN. Subtract each row's own "
            "maximum: scores.max(dim, keepdim=True).values."
        )

    wide = torch.tensor([[-800.0, 0.0, 800.0]], dtype=DTYPE)  # one row spanning 1600
    got_wide = _run_softmax(fn, wide, what="your softmax on the row [-800, 0, 800]")
    if not (torch.isfinite(got_wide).all() and close(got_wide, torch.softmax(wide, -1))):
        raise ExerciseError(
            "your softmax fails on the row [-800, 0, 800]: after your shift some exponent is still far above 0 "
            "and exp overflows. Subtract the row's MAXIMUM, not its minimum or mean: then every exponent is <= 0."
        )

    got_dim0 = _run_softmax(fn, scores, 0, what="your softmax called with dim=0")
    if not (isinstance(got_dim0, torch.Tensor) and close(got_dim0, torch.softmax(scores, 0))):
        raise ExerciseError(
            "called as fn(scores, 0) your function does not normalise down the columns: it ignores its `dim` "
            "argument. Use dim in the max, the exp's sum and keepdim=True."
        )
    passed("stable for scores around 1000, per-row maximum, and `dim` respected.")


# ----------------------------------------------------------------------------------------------------------
# Exercise: attention of a batch


def _attention(q, k, v, *, scale="sqrt_d", softmax_dim=-1, swap=False, values="v", softmax=True):
    """The reference, and the typical mistakes as options. Returns (output, weights)."""
    d = q.shape[-1]
    divide = {"sqrt_d": math.sqrt(d), "none": 1.0, "d": float(d), "sqrt_dv": math.sqrt(v.shape[-1]),
              "sqrt_S": math.sqrt(k.shape[-2]), "sqrt_L": math.sqrt(q.shape[-2]), "times_sqrt_d": 1 / math.sqrt(d)}
    scores = (k @ q.transpose(-2, -1) if swap else q @ k.transpose(-2, -1)) / divide[scale]
    weights = torch.softmax(scores, softmax_dim) if softmax else scores
    return weights @ {"v": v, "k": k}[values], weights


def _why_it_raised(fn, q, k, v) -> str:
    """Rerun a function that raised on the checker's batch on simpler inputs, to name the likely cause."""
    try:
        fn(q[0], k[0], v[0])
        return (" It works on one sentence (2-D inputs) but not on a batch: k.T reverses ALL dimensions of a 3-D "
                "tensor; transpose the last two with k.transpose(-2, -1).")
    except Exception:  # noqa: S110 -- try the next guess
        pass
    try:
        answer = fn(q, k[:, : q.shape[1]], v[:, : q.shape[1]])  # as many keys as queries: a transpose fits
        weights = answer[1]
    except Exception:  # noqa: BLE001 -- no better guess: the original error stands
        return ""
    if close(weights, _attention(q, k[:, : q.shape[1]], v[:, : q.shape[1]], swap=True)[1]):
        return (" With as many keys as queries it runs, and its weights are those of k q^T: row i must be query i "
                "and column j key j, so the scores are q @ k.transpose(-2, -1), (B, L, S).")
    return " With as many keys as queries it runs: look for a transpose that swaps L and S."


def check_attention(fn) -> None:
    """Check ``fn(q, k, v) -> (output, weights)`` on a batch.

    ``q`` (B, L, d), ``k`` (B, S, d), ``v`` (B, S, dv). Expected: ``weights = softmax(q k^T / sqrt(d))`` over
    the keys, (B, L, S), and ``output = weights @ v``, (B, L, dv). The checker uses L != S and d != dv, so a
    transpose or a wrong tensor shows in the shapes.
    """
    gen = torch.Generator().manual_seed(3)
    B, L, S, d, dv = 2, 3, 5, 4, 6
    q = torch.randn(B, L, d, generator=gen, dtype=DTYPE)
    k = torch.randn(B, S, d, generator=gen, dtype=DTYPE)
    v = torch.randn(B, S, dv, generator=gen, dtype=DTYPE)
    try:
        answer = fn(q, k, v)
    except Exception as err:  # the learner's code may raise anything; say what, and the usual cause
        raise ExerciseError(
            f"your function raised {type(err).__name__} on a batch with L={L} queries and S={S} keys: "
            f"{str(err).rstrip('.')}."
            f"{_why_it_raised(fn, q, k, v)}{device_hint(err)}"
        ) from err
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise ExerciseError(f"return a pair (output, weights); got {type(answer).__name__}.")
    out, weights = (require_tensor(a, n, "your function") for a, n in zip(answer, ("output", "weights")))
    if (tuple(out.shape), tuple(weights.shape)) == ((B, L, S), (B, L, dv)):
        raise ExerciseError(
            f"your pair holds the weights (B, L, S) = {(B, L, S)} first and the output (B, L, dv) = {(B, L, dv)} "
            f"second: return (output, weights), in that order."
        )
    if tuple(weights.shape) == (B, S, L):
        raise ExerciseError(
            f"weights has shape (B, S, L) = {(B, S, L)}, the transpose of (B, L, S): you computed k q^T. Row i "
            f"must be query i and column j key j: q @ k.transpose(-2, -1)."
        )
    require_shape(weights, (B, L, S), "weights", "(B, L, S)", "One row per query, one column per key.")
    if tuple(out.shape) == (B, L, d) and d != dv:
        raise ExerciseError(
            f"output has shape {(B, L, d)}: its last size is d (the keys'), not dv = {dv}: you averaged the keys. "
            f"The output is weights @ v."
        )
    require_shape(out, (B, L, dv), "output", "(B, L, dv)", "It is weights (B, L, S) @ v (B, S, dv).")
    for name, tensor in (("output", out), ("weights", weights)):
        if tensor.dtype != DTYPE:
            raise ExerciseError(
                f"your {name} has dtype {tensor.dtype}, but q, k and v are {DTYPE}: keep the inputs' dtype (no "
                f".float() or dtype= on the way)."
            )
    want_out, want_w = _attention(q, k, v)
    diff = f"(weights differ by up to {max_diff(weights, want_w):.2g}, outputs by {max_diff(out, want_out):.2g})"
    if not close(weights, want_w):
        mistakes = [
            (dict(scale="none"), "you did not scale the scores: divide q k^T by sqrt(d) before the softmax."),
            (dict(scale="d"), "you divided the scores by d; the scale is sqrt(d)."),
            (dict(scale="times_sqrt_d"), "you MULTIPLIED the scores by sqrt(d); divide q k^T by sqrt(d)."),
            (dict(scale="sqrt_dv"), "you divided by sqrt(dv), the size of the VALUES; the scale is sqrt(d), the size "
                                    "of the queries and keys that the dot product sums over."),
            (dict(scale="sqrt_S"), "you divided by sqrt(S), the number of keys; the scale is sqrt(d), the size of "
                                   "the vectors in each dot product."),
            (dict(scale="sqrt_L"), "you divided by sqrt(L), the number of queries; the scale is sqrt(d), the "
                                   "size of the vectors in each dot product."),
            (dict(softmax_dim=-2), "your weights' COLUMNS sum to 1: softmax ran over the queries. Each query's "
                                   "weights over the keys must sum to 1: softmax(..., dim=-1)."),
            (dict(softmax_dim=0), "your weights sum to 1 over the BATCH: softmax(..., dim=0) mixes the sentences. "
                                  "Each query's weights over the keys must sum to 1: softmax(..., dim=-1)."),
            (dict(softmax=False), "your weights are the scaled scores themselves: no softmax was applied. "
                                  "weights = softmax(q k^T / sqrt(d), dim=-1)."),
        ]
        for options, message in mistakes:
            if close(weights, _attention(q, k, v, **options)[1]):
                raise ExerciseError(f"{message} {diff}")
        if not _rows_sum_to_one(weights, -1):
            raise ExerciseError(f"the rows of your weights do not sum to 1 {diff}: softmax over the last dimension.")
        raise ExerciseError(
            f"your weights are not softmax(q k^T / sqrt(d)) {diff}: compute q @ k.transpose(-2, -1) / sqrt(d), "
            f"then softmax over the last dimension."
        )
    if not close(out, want_out):
        raise ExerciseError(f"the weights are right but the output is not {diff}: output = weights @ v.")
    passed("weights = softmax(q k^T / sqrt(d)) over the keys, output = weights @ v, on a batch with L != S.")
