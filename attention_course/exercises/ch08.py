"""Checkers for chapter 8, attention at speed.

* :func:`check_merge_partials` -- merge the online-softmax states (m, l, acc) of two blocks of keys into one.

A state of a block of keys, for each query: ``m`` (..., 1) the largest score, ``l`` (..., 1) the sum of
``exp(score - m)``, ``acc`` (..., dv) the sum of ``exp(score - m) * value``. A block whose keys are all masked has
``m = -inf``, ``l = 0``, ``acc = 0``.
"""
from __future__ import annotations

import torch

from . import DTYPE, ExerciseError, call, describe_diff, max_diff, passed

NEG_INF = float("-inf")


def partial_state(scores: torch.Tensor, values: torch.Tensor):
    """(m, l, acc) of one block: scores (..., n) of one query over n keys, values (n, dv)."""
    m = scores.amax(-1, keepdim=True)  # (..., 1)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    p = torch.exp(scores - shift)  # (..., n)
    return m, p.sum(-1, keepdim=True), p @ values


def _reference_merge(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    c1, c2 = torch.exp(m1 - shift), torch.exp(m2 - shift)
    return m, c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2


def _cases():
    gen = torch.Generator().manual_seed(8)
    scores = torch.randn(3, 10, generator=gen, dtype=DTYPE) * 3  # 3 queries, 10 keys
    scores[1, 6:] += 5.0  # query 1: its largest scores are in the second block
    values = torch.randn(10, 4, generator=gen, dtype=DTYPE)
    second_masked = scores.clone()
    second_masked[2, 6:] = NEG_INF  # query 2: every key of the second block masked
    first_masked = scores.clone()
    first_masked[0, :6] = NEG_INF  # query 0: every key of the first block masked
    nothing = scores.clone()
    nothing[1] = NEG_INF  # query 1: every key of both blocks masked
    return {
        "two ordinary blocks": (scores, values),
        "a second block with every key masked (m2 = -inf, l2 = 0) for query 2": (second_masked, values),
        "a first block with every key masked (m1 = -inf, l1 = 0) for query 0": (first_masked, values),
        "both blocks with every key masked for query 1 (its state stays m = -inf, l = 0, acc = 0)": (nothing, values),
    }


def check_merge_partials(fn) -> None:
    """Check ``fn(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``: the state of the two blocks together.

    The checker splits 10 keys into blocks of 6 and 4, computes each block's state, merges them with ``fn`` and
    compares ``acc / l`` with softmax(scores) @ values, and m and l with those of all 10 keys at once.
    """
    for case, (scores, values) in _cases().items():
        first = partial_state(scores[:, :6], values[:6])
        second = partial_state(scores[:, 6:], values[6:])
        got = call(fn, *first, *second, what="your merge_partials")
        if not isinstance(got, tuple) or len(got) != 3:
            raise ExerciseError(f"your merge_partials must return a tuple (m, l, acc), got {type(got).__name__}.")
        m, l, acc = (torch.as_tensor(t).cpu() for t in got)  # noqa: E741
        want_m, want_l, want_acc = partial_state(scores, values)
        if m.isnan().any() or l.isnan().any() or acc.isnan().any():
            raise ExerciseError(
                f"{case}: your result has NaN. A block with every key masked has m = -inf, and "
                f"exp(m_block - m) with m = -inf is exp(-inf - -inf) = exp(nan). Subtract a finite stand-in "
                f"(0 where m is -inf) inside the exponentials."
            )
        if m.shape != want_m.shape or max_diff(m, want_m) > 1e-10:
            raise ExerciseError(f"{case}: m must be the larger of m1 and m2 for each query (torch.maximum).")
        seen = want_l.squeeze(-1) > 0  # the queries with at least one key
        if acc.shape != want_acc.shape or max_diff(l[~seen], want_l[~seen]) + max_diff(acc[~seen], 0 * acc[~seen]):
            raise ExerciseError(f"{case}: a query without any key must keep l = 0 and acc = 0 (shape {tuple(want_acc.shape)}).")
        out, want = acc[seen] / l[seen], torch.softmax(scores[seen], -1) @ values
        if max_diff(out, want) > 1e-10:
            unscaled = ((first[2] + second[2]) / (first[1] + second[1]))[seen]
            if max_diff(out, unscaled) < 1e-10:
                raise ExerciseError(
                    f"{case}: acc / l is (acc1 + acc2) / (l1 + l2), which adds sums taken under two different "
                    f"maxima. Rescale each one to the common maximum first: multiply l1 and acc1 by "
                    f"exp(m1 - m), and l2 and acc2 by exp(m2 - m)."
                )
            raise ExerciseError(f"{case}: acc / l and softmax(scores) @ values {describe_diff(out, want, 'softmax')}.")
        if max_diff(l, want_l) > 1e-10 or max_diff(acc, want_acc) > 1e-10:
            raise ExerciseError(
                f"{case}: acc / l is right, but l and acc are not the sums under the common maximum m: "
                f"l should be the sum of exp(score - m) over all 10 keys."
            )
    passed("the merged state equals the state of all keys at once, and acc / l = softmax(scores) @ values, also "
           "when a whole block is masked.")
