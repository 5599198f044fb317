"""Checkers for chapter 3, padding and masks.

* :func:`check_padding_mask` -- the (B, 1, S) ignore mask of a batch of right-padded sentences;
* :func:`check_masked_softmax` -- softmax over the keys a query may attend, zeros for a query with none.

Polarity throughout: an IGNORE mask, True = this key may NOT be attended (``nn.MultiheadAttention``'s).
"""
from __future__ import annotations

import torch

from . import DTYPE, ExerciseError, call, close, max_diff, passed, require_shape, require_tensor

# ----------------------------------------------------------------------------------------------------------
# Exercise: the padding mask of a batch


def _reference_padding_mask(lengths: list[int], max_len: int) -> torch.Tensor:
    return (torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None])[:, None, :]  # (B, 1, S)


def check_padding_mask(fn) -> None:
    """Check ``fn(lengths, max_len) -> mask``: a bool ignore mask (B, 1, S), True at the pads.

    ``lengths`` is a list of B sentence lengths, ``max_len`` = S >= max(lengths). Sentence b is real at
    positions ``0 .. lengths[b] - 1`` and padded from position ``lengths[b]`` on.
    """
    lengths, max_len = [4, 1, 3], 6  # max_len > max(lengths): the batch is padded further than its longest
    B = len(lengths)
    want = _reference_padding_mask(lengths, max_len)
    mask = require_tensor(call(fn, lengths, max_len, what="your function"), f"lengths={lengths}", "your function")
    if mask.dtype != torch.bool:
        raise ExerciseError(
            f"your mask has dtype {mask.dtype}; an ignore mask is bool, True at the pads. Compare positions with "
            f"lengths (positions >= length) instead of building 0/1 numbers."
        )
    shape = tuple(mask.shape)
    if shape == (B, max_len, 1):
        raise ExerciseError(
            f"your mask has shape (B, S, 1) = {shape}: that axis is the QUERIES, so it would blank whole rows. "
            f"Padding hides KEYS (columns): return shape (B, 1, S) = {(B, 1, max_len)}."
        )
    if shape in ((B, max(lengths)), (B, 1, max(lengths))):
        raise ExerciseError(
            f"your mask has {max(lengths)} = max(lengths) columns, but the batch is padded to max_len = {max_len}. "
            f"Use max_len for the number of positions, torch.arange(max_len)."
        )
    if shape == (B, max_len):
        raise ExerciseError(
            f"your mask has shape (B, S) = {shape}, the key padding mask itself. To broadcast it over the queries "
            f"of the (B, L, S) scores, add the query axis: mask[:, None, :] -> {(B, 1, max_len)}."
        )
    if shape == (B, max_len, max_len):
        raise ExerciseError(
            f"your mask has shape (B, S, S) = {shape}: it is already expanded over the queries. Return the "
            f"(B, 1, S) mask {(B, 1, max_len)}; broadcasting expands it for free when it meets the scores."
        )
    require_shape(mask, (B, 1, max_len), "your mask", "(B, 1, S)")
    if torch.equal(mask, want):
        passed(f"(B, 1, S) = {(B, 1, max_len)}, True exactly at the pads, for lengths {lengths} and max_len {max_len}.")
        return
    if torch.equal(mask, ~want):
        raise ExerciseError(
            "your mask is True at the REAL tokens and False at the pads: that is an allow (or keep) mask. The "
            "ignore mask is True where a key may NOT be attended, the pads: positions >= length."
        )
    positions = torch.arange(max_len)[None, None, :]
    lens = torch.tensor(lengths)[:, None, None]
    if torch.equal(mask, positions > lens):
        raise ExerciseError(
            "your mask misses the first pad of each sentence: position lengths[b] is the first pad (positions "
            "start at 0), so the test is position >= length, not >."
        )
    if torch.equal(mask, positions >= lens - 1):
        raise ExerciseError(
            "your mask also hides the last real token of each sentence: positions lengths[b] - 1 is still real. "
            "The test is position >= length."
        )
    wrong = (mask != want).nonzero().tolist()
    raise ExerciseError(
        f"your mask differs from the padding at {len(wrong)} positions, e.g. (sentence, 0, position) = "
        f"{tuple(wrong[0])}. Sentence b is real at 0 .. lengths[b] - 1 and padded from lengths[b] on."
    )


# ----------------------------------------------------------------------------------------------------------
# Exercise: masked softmax


def _masked_softmax(scores, mask):
    """Reference: softmax over the keys not masked; all-zero weights on a row with no key left."""
    mask = mask.expand_as(scores)
    weights = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
    return weights.masked_fill(mask.all(-1, keepdim=True), 0.0)


def _pad_weight(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest total weight a query row gives to masked keys (NaN counts as 0)."""
    return float((weights.nan_to_num() * mask).sum(-1).max())


def _sums_to(x: torch.Tensor, value: float) -> bool:
    return close(x, torch.full_like(x, value), 1e-6)


def check_masked_softmax(fn) -> None:
    """Check ``fn(scores, mask) -> weights`` for scores (B, L, S) and a bool ignore mask (B, 1, S).

    Expected: ``softmax`` over the last dimension of the keys where ``mask`` is False, exactly 0 where it is
    True, and a row of zeros (not NaN) for a query whose keys are all masked.
    """
    gen = torch.Generator().manual_seed(3)
    lengths, L, S = [4, 3, 2], 4, 4  # sentence 0 has no pad; 1 and 2 have pads
    scores = torch.randn(len(lengths), L, S, generator=gen, dtype=DTYPE)  # (B, L, S)
    mask = _reference_padding_mask(lengths, S)  # (B, 1, S)
    weights = require_tensor(call(fn, scores, mask, what="your function"), "scores (3, 4, 4)", "your function")
    require_shape(weights, scores.shape, "your weights", "the shape of scores (B, L, S)")
    want = _masked_softmax(scores, mask)
    diff = f"(largest difference: {max_diff(weights, want):.2g})"
    pads = mask.expand_as(scores)  # (B, L, S)
    if not close(weights, want):
        on_real = (weights.nan_to_num() * ~pads).sum(-1)  # (B, L): weight each query gives the real tokens
        if torch.isnan(weights).any():
            nan_rows = torch.isnan(weights).any(-1)  # (B, L)
            if bool(nan_rows[0].all()) and not bool(nan_rows[1:].any()):
                raise ExerciseError(
                    f"the sentence WITHOUT pads gets NaN and the others do not {diff}: you used the mask with "
                    f"inverted polarity, so a sentence with no pad has every key masked (softmax of all -inf = NaN). "
                    f"Here True = IGNORE: fill the scores with -inf where mask is True."
                )
            if torch.equal(torch.isnan(weights), pads):
                raise ExerciseError(
                    f"your weights are NaN exactly in the pad columns {diff}: softmax ran down the columns (over the "
                    f"queries), and a pad column is all -inf. Each query's weights over the keys must sum to 1: "
                    f"softmax(..., dim=-1)."
                )
            raise ExerciseError(
                f"your weights contain NaN {diff}: a row whose scores are all -inf gives 0 / 0. Mask the padded KEYS "
                f"(the columns: the (B, 1, S) mask broadcasts over the rows), never whole query rows."
            )
        if _sums_to(on_real[1:], 0.0) and _sums_to(weights[1:].sum(-1), 1.0):
            raise ExerciseError(
                f"your function puts all the weight on the pads and none on the real tokens {diff}: you used the "
                f"mask with inverted polarity. Here True = IGNORE (nn.MultiheadAttention's convention): mask where "
                f"mask is True, not where it is False."
            )
        if close(weights, torch.softmax(scores, -1)):
            raise ExerciseError(
                f"your function puts weight up to {_pad_weight(weights, pads):.2f} on pad positions: the mask was not "
                f"applied. Fill the masked scores with float('-inf') BEFORE the softmax."
            )
        if close(weights, torch.softmax(scores, -1).masked_fill(pads, 0.0)):
            raise ExerciseError(
                f"your rows sum to {float(on_real.min()):.2f}..{float(on_real.max()):.2f}, not 1 {diff}: you zeroed "
                f"the pads AFTER the softmax, so the share the pads took is lost. Mask the scores with -inf before "
                f"the softmax."
            )
        if close(weights, torch.softmax(scores.masked_fill(pads, float("-inf")), -2).nan_to_num()):
            raise ExerciseError(
                f"your weights sum to 1 down the columns {diff}: softmax ran over the queries. Each query's weights "
                f"over the keys must sum to 1: softmax(..., dim=-1)."
            )
        if _pad_weight(weights, pads) > 1e-6:
            raise ExerciseError(
                f"your function puts weight up to {_pad_weight(weights, pads):.2g} on pad positions {diff}: fill the "
                f"masked scores with float('-inf') before the softmax."
            )
        raise ExerciseError(
            f"the pads get 0 but the real weights differ from softmax over the unmasked keys {diff}: softmax the "
            f"masked scores over the last dimension."
        )

    # Huge logits: a finite fill such as -1e9 is then an ordinary score, not minus infinity.
    big = torch.tensor([[[-3e10, -2e10, -1e10]]], dtype=DTYPE)  # (1, 1, 3): the last key is masked
    big_mask = torch.tensor([[[False, False, True]]])
    got = call(fn, big, big_mask, what="your function on scores around -1e10")
    if not torch.isfinite(got).all():
        raise ExerciseError(
            "with scores around -1e10 (the masked key highest) your function returns NaN or inf. If you zero the "
            "pads after the softmax and renormalise, the real keys have already underflowed to 0 and you divide "
            "0 by 0: mask the scores with float('-inf') before the softmax."
        )
    if _pad_weight(got, big_mask) > 1e-6:
        raise ExerciseError(
            f"with scores around -1e10 your function puts weight {_pad_weight(got, big_mask):.2f} on the masked "
            f"key: a large finite fill like -1e9 is not minus infinity once the real scores are even lower. Fill "
            f"with float('-inf')."
        )

    # A query with nothing to attend to: a sentence of length 0.
    empty = torch.ones(1, 1, S, dtype=torch.bool)
    got = call(fn, scores[:1], empty, what="your function on a fully masked row")
    if torch.isnan(got).any():
        raise ExerciseError(
            "a row whose keys are all masked gives NaN (softmax of all -inf is 0 / 0). Give such rows zero weights: "
            "find them with mask.all(-1, keepdim=True) and masked_fill their weights with 0."
        )
    if not close(got, torch.zeros_like(got)):
        raise ExerciseError(
            f"a row whose keys are all masked gets weights summing to {float(got.sum(-1).max()):.2f}: with nothing "
            f"to attend to, its weights should all be 0 (a -1e9 fill gives a uniform average of the pads instead)."
        )
    passed("pads get exactly 0, rows of real keys sum to 1, huge logits are safe, a fully masked row gives zeros.")
