"""Checkers for chapter 8, attention at speed.

* :func:`check_merge_partials` -- merge the online-softmax states (m, l, acc) of two blocks of keys into one.

A state of a block of keys, for each query: ``m`` (..., 1) the largest score, ``l`` (..., 1) the sum of
``exp(score - m)``, ``acc`` (..., dv) the sum of ``exp(score - m) * value``. A block whose keys are all masked has
``m = -inf``, ``l = 0``, ``acc = 0``.
"""
from __future__ import annotations

import torch

from . import ATOL, DTYPE, ExerciseError, call, describe_diff, max_diff, passed

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


# Wrong merges a learner writes, each as the state (l, acc) it returns and what to say about it.
def _mistakes(m1, l1, acc1, m2, l2, acc2):
    m = torch.maximum(m1, m2)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    c1, c2 = torch.exp(m1 - shift), torch.exp(m2 - shift)
    e1, e2 = torch.exp(shift - m1), torch.exp(shift - m2)
    d1, d2 = m1 - shift, m2 - shift
    l, acc, one = c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2, torch.ones_like(l1)
    rescale = "multiply l1 and acc1 by exp(m1 - m), and l2 and acc2 by exp(m2 - m)"
    return [
        (l1 + l2, acc1 + acc2,
         "acc / l is (acc1 + acc2) / (l1 + l2), which adds sums taken under two different maxima. Rescale each "
         f"one to the common maximum m first: {rescale}."),
        (l1 + l2, acc,
         f"only acc was rescaled to the common maximum m, not l: {rescale}."),
        (l, acc1 + acc2,
         f"only l was rescaled to the common maximum m, not acc: {rescale}."),
        (c1 * l1 + l2, c1 * acc1 + acc2,
         "only the first block was rescaled to the common maximum m: the second block's maximum m2 may lie "
         "below m too, so multiply l2 and acc2 by exp(m2 - m) as well."),
        (c2 * l1 + c1 * l2, c2 * acc1 + c1 * acc2,
         "the two factors are swapped: exp(m1 - m) belongs to block 1 (l1, acc1), exp(m2 - m) to block 2."),
        (e1 * l1 + e2 * l2, e1 * acc1 + e2 * acc2,
         "the exponent is the wrong way round: exp(m - m1) >= 1 inflates the block of the lower maximum; the factor is "
         "exp(m1 - m) <= 1, the old maximum minus the new one."),
        (d1 * l1 + d2 * l2, d1 * acc1 + d2 * acc2,
         "the factor is m1 - m without the exponential: it is exp(m1 - m), since l and acc hold exp(score - m)."),
        (one, (acc1 / l1 + acc2 / l2) / 2,
         "acc / l is the mean of the two blocks' outputs acc1 / l1 and acc2 / l2: a block counts by its share of "
         f"the normaliser, not half. Merge the sums, not the outputs: {rescale}, and add."),
        (one, acc1 / l1 + acc2 / l2,
         "acc / l is the sum of the two blocks' outputs acc1 / l1 and acc2 / l2: a block counts by its share of "
         f"the normaliser. Merge the sums, not the outputs: {rescale}, and add."),
        (l, acc / l,
         "acc is already divided by l: keep acc the unnormalised sum of exp(score - m) * value, and divide only "
         "at the very end (the next merge needs the sums)."),
    ]


def _name_mistake(l, acc, seen, first, second) -> str | None:
    """The message of the classic mistake whose merge gives this state: the same l and acc, else the same acc / l
    (then every mistake with that acc / l is named: they cannot be told apart)."""
    out = acc[seen] / l[seen]
    mistakes = [(wl[seen], wacc[seen], message) for wl, wacc, message in _mistakes(*first, *second)]
    for wl, wacc, message in mistakes:
        if max_diff(l[seen], wl) <= ATOL and max_diff(acc[seen], wacc) <= ATOL:
            return message
    same_out = [message for wl, wacc, message in mistakes if max_diff(out, wacc / wl) <= ATOL]
    return " Or: ".join(same_out) or None


def _state(got, want):
    """The learner's (m, l, acc) as float tensors on the CPU, or an ExerciseError naming what is off in its form."""
    if got is None:
        raise ExerciseError("your merge_partials returned None: is the return statement missing? It must return "
                            "a tuple (m, l, acc).")
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        raise ExerciseError(f"your merge_partials must return a tuple (m, l, acc), got {type(got).__name__}"
                            + (f" of {len(got)}" if isinstance(got, (tuple, list)) else "") + ".")
    if not all(isinstance(t, torch.Tensor) for t in got):
        kinds = ", ".join(type(t).__name__ for t in got)
        raise ExerciseError(f"your merge_partials must return three tensors (m, l, acc), got ({kinds}).")
    got = [t.detach().cpu() for t in got]
    shapes = [tuple(t.shape) for t in got]
    wanted = [tuple(t.shape) for t in want]
    if shapes == [wanted[0], wanted[2], wanted[1]] and wanted[1] != wanted[2]:
        raise ExerciseError(f"l has shape {shapes[1]} and acc {shapes[2]}: they come in the wrong order. Return "
                            "(m, l, acc) in that order: m and l of shape (..., 1), acc (..., dv).")
    for name, shape, expected in zip(("m", "l", "acc"), shapes, wanted):
        if shape != expected:
            hint = (" Keep the last axis of size 1 (keepdim=True; torch.maximum of m1 and m2 keeps it)."
                    if name != "acc" and shape == expected[:-1] else "")
            raise ExerciseError(f"{name} has shape {shape}, expected {expected} (m and l (..., 1), acc (..., dv))."
                                + hint)
    for name, t in zip(("m", "l", "acc"), got):
        if t.dtype != DTYPE:
            raise ExerciseError(f"{name} is {t.dtype}, the states given were {DTYPE}: keep their dtype (no "
                                ".float(), and new tensors made like the inputs), or the merge loses precision "
                                "(float32 keeps about 7 digits).")
    return got


def check_merge_partials(fn) -> None:
    """Check ``fn(m1, l1, acc1, m2, l2, acc2) -> (m, l, acc)``: the state of the two blocks together.

    The checker splits 10 keys into blocks of 6 and 4, computes each block's state, merges them with ``fn`` and
    compares ``acc / l`` with softmax(scores) @ values, and m and l with those of all 10 keys at once. A wrong
    result is compared with the merges of the classic mistakes (no rescaling, factors swapped or the wrong way
    round, outputs averaged, ...) to name the one made.
    """
    for case, (scores, values) in _cases().items():
        first = partial_state(scores[:, :6], values[:6])
        second = partial_state(scores[:, 6:], values[6:])
        want_m, want_l, want_acc = partial_state(scores, values)
        try:
            got = call(fn, *(t.clone() for t in first + second), what="your merge_partials")
        except ExerciseError as err:
            if "must match the size of tensor b" not in str(err.__cause__):
                raise
            raise ExerciseError(
                f"{err} Here m, l and the factors exp(m1 - m), exp(m2 - m) are (..., 1) and acc (..., dv): keep "
                f"the last axis of size 1 (keepdim=True, no squeeze), so that a factor scales every column of acc."
            ) from err
        m, l, acc = _state(got, (want_m, want_l, want_acc))  # noqa: E741
        if m.isnan().any() or l.isnan().any() or acc.isnan().any():
            raise ExerciseError(
                f"{case}: your result has NaN. A block with every key masked has m = -inf, and "
                f"exp(m_block - m) with m = -inf is exp(-inf - -inf) = exp(nan). Subtract a finite stand-in "
                f"(0 where m is -inf) inside the exponentials."
            )
        seen = want_l.squeeze(-1) > 0  # the queries with at least one key
        if max_diff(m, want_m) > ATOL:
            m1, m2 = first[0], second[0]
            if max_diff(m[~seen], want_m[~seen]) > ATOL:
                raise ExerciseError(
                    f"{case}: m must stay -inf for a query with no key, got {m[~seen].flatten()[0].item():.3g}. "
                    f"A finite fill in place of -inf (-1e4, -1e9) belongs only inside the exponentials, as the "
                    f"stand-in subtracted there; m itself is the largest score, -inf when there is none."
                )
            if max_diff(m, m1) <= ATOL:
                raise ExerciseError(f"{case}: m is m1, the first block's maximum; the second block may hold a "
                                    "larger score. m = torch.maximum(m1, m2).")
            if max_diff(m, torch.minimum(m1, m2)) <= ATOL:
                raise ExerciseError(f"{case}: m is the smaller of m1 and m2; it must be the larger, "
                                    "torch.maximum(m1, m2).")
            if (m == m[0]).all():
                raise ExerciseError(f"{case}: m is the same number for all queries, the largest score of all of "
                                    "them: take the maximum per query, elementwise, torch.maximum(m1, m2), not a "
                                    "max over an axis of queries.")
            raise ExerciseError(f"{case}: m must be the larger of m1 and m2 for each query (torch.maximum).")
        if max_diff(l[~seen], want_l[~seen]) + max_diff(acc[~seen], 0 * acc[~seen]) > ATOL:
            raise ExerciseError(f"{case}: a query without any key must keep l = 0 and acc = 0.")
        out, want = acc[seen] / l[seen], torch.softmax(scores[seen], -1) @ values
        if max_diff(out, want) > ATOL:
            mistake = _name_mistake(l, acc, seen, first, second)
            if mistake:
                raise ExerciseError(f"{case}: {mistake}")
            if max_diff(out, want) < 1e-5:
                raise ExerciseError(f"{case}: acc / l agrees with softmax(scores) @ values only to "
                                    f"{max_diff(out, want):.1g}, float32 precision: a step ran in float32 (a "
                                    ".float(), or a tensor made without dtype=). Keep the states' float64.")
            raise ExerciseError(f"{case}: acc / l and softmax(scores) @ values "
                                f"{describe_diff(out, want, 'softmax(scores) @ values')}.")
        if max_diff(l, want_l) > ATOL or max_diff(acc, want_acc) > ATOL:
            raise ExerciseError(
                f"{case}: acc / l is right, but l and acc are not the sums under the common maximum m: "
                f"l should be the sum of exp(score - m) over all 10 keys (factors exp(m1 - m) and exp(m2 - m))."
            )
    passed("the merged state equals the state of all keys at once, and acc / l = softmax(scores) @ values, also "
           "when a whole block is masked.")
