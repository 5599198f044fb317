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


def _numbers_not_bool(mask: torch.Tensor, want: torch.Tensor) -> str:
    """The message for a mask of numbers where a bool ignore mask is expected: which convention it looks like."""
    start = f"your mask has dtype {mask.dtype}, numbers; an ignore mask is bool, True at the pads."
    if tuple(mask.shape) == tuple(want.shape):
        values = mask.detach().cpu().double()
        if torch.equal(values, torch.zeros_like(values).masked_fill(want, float("-inf"))):
            return (f"{start} Yours is an ADDITIVE mask (0 at the real tokens, -inf at the pads), made to be added "
                    f"to the scores; this exercise asks for the bool mask itself: positions >= length.")
        if torch.equal(values, want.double()):
            return (f"{start} Yours holds 1 at the pads and 0 elsewhere: the right positions as numbers. Keep the "
                    f"comparison's bool result (positions >= length), with no .int(), .float() or .long().")
        if torch.equal(values, (~want).double()):
            return (f"{start} Yours holds 1 at the real tokens and 0 at the pads: a keep mask (1 = attend), the "
                    f"other convention. Return positions >= length, a bool tensor True at the pads.")
    return f"{start} Compare positions with lengths (positions >= length) instead of building numbers."


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
        raise ExerciseError(_numbers_not_bool(mask, want))
    shape = tuple(mask.shape)
    if shape == (1, B, max_len):
        raise ExerciseError(
            f"your mask has shape (1, B, S) = {shape}: you put the new axis FIRST. The query axis goes between "
            f"the sentences and the keys: mask[:, None, :] -> {(B, 1, max_len)}."
        )
    if shape in ((max_len, B), (max_len, 1, B)):
        raise ExerciseError(
            f"your mask has shape {shape}: one row per POSITION and one column per sentence, the transpose. "
            f"Compare torch.arange(max_len)[None, :] (1, S) with torch.tensor(lengths)[:, None] (B, 1): one row "
            f"per sentence, (B, S), then add the query axis: (B, 1, S)."
        )
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
    if torch.equal(mask, want.flip(-1)):
        raise ExerciseError(
            "your mask puts the pads on the LEFT (the first max_len - lengths[b] positions). These sentences are "
            "padded on the right: real at 0 .. lengths[b] - 1, pads from position lengths[b] on."
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


def _masked_softmax(scores, mask, *, fill=float("-inf"), dim=-1, empty_zero=True, where="before"):
    """Reference: softmax over the keys not masked; all-zero weights on a row with no key left.

    The classic slips as options: another ``fill``, the softmax over another ``dim``, NaN left on empty rows
    (``empty_zero=False``), the pads zeroed ``where="after"`` the softmax, the bool mask ``where="added"`` to the
    scores, or ``where="nowhere"``.
    """
    if where == "after":
        weights = torch.softmax(scores, dim).masked_fill(mask, 0.0)
    else:
        masked = {"before": lambda: scores.masked_fill(mask, fill), "added": lambda: scores + mask,
                  "nowhere": lambda: scores}[where]()
        weights = torch.softmax(masked, dim)
    return weights.masked_fill(mask.all(-1, keepdim=True), 0.0) if empty_zero else weights


def _pad_weight(weights: torch.Tensor, mask: torch.Tensor) -> float:
    """The largest total weight a query row gives to masked keys (NaN counts as 0)."""
    return float((weights.nan_to_num() * mask).sum(-1).max())


def _masked_softmax_mistake(weights: torch.Tensor, scores: torch.Tensor, mask: torch.Tensor) -> str:
    """What a wrong masked softmax did: each classic slip rerun on the same scores (with and without zeros on
    the rows that have no key left) until one gives the learner's weights; then the symptoms."""
    pads = mask.expand_as(scores)  # (B, L, S)
    weight = f"{_pad_weight(weights, pads):.2f}"
    slips = [
        (dict(mask=mask.transpose(-2, -1)),
         "your function masks whole query ROWS, not key columns: the mask was used on the QUERY axis, as (B, S, 1) "
         "(a transpose, view or unsqueeze(-1)?). Use the (B, 1, S) mask as it comes: it broadcasts over the "
         "queries and hides the pad keys of every row."),
        (dict(mask=~mask),
         ("the sentence WITHOUT pads gets NaN, and the others put their weight on the pads" if weights.isnan().any()
          else "your function puts the weight on the pads and none on the real tokens") +
         ": you used the mask with inverted polarity (a sentence without pads then has every key masked). Here "
         "True = IGNORE "
         "(nn.MultiheadAttention's convention): mask where mask is True, not where it is False (no mask == 0)."),
        (dict(where="nowhere"),
         f"your function puts weight up to {weight} on pad positions: the mask was not applied. Fill the masked "
         f"scores with float('-inf') BEFORE the softmax."),
        (dict(where="after"),
         "your rows of real keys do not sum to 1: you zeroed the pads AFTER the softmax, so the share the pads "
         "took is lost. Mask the scores with -inf before the softmax."),
        (dict(fill=0.0),
         f"your pads get weight (up to {weight} per row): you filled with 0, a finite fill, and a score of 0 is an "
         f"ordinary score (e^0 = 1). Fill the masked scores with float('-inf')."),
        (dict(dim=-2),
         "your weights sum to 1 down the columns: softmax ran over the queries. Each query's weights over the "
         "keys must sum to 1: softmax(..., dim=-1)."),
        (dict(where="added"),
         "you ADDED the bool mask to the scores: True counts as 1, so a pad's score goes up by 1 instead of "
         "being blocked. Use scores.masked_fill(mask, float('-inf')) (adding works for a float mask of 0 and "
         "-inf, not for a bool one)."),
    ]
    for options, message in slips:
        options = {"mask": mask, **options}
        if any(close(weights, _masked_softmax(scores, **options, empty_zero=z)) for z in (True, False)):
            return message
    if torch.isnan(weights).any():
        return ("your weights contain NaN: a row whose scores are all -inf gives 0 / 0. Mask the padded KEYS "
                "(the columns: the (B, 1, S) mask broadcasts over the rows), never whole query rows.")
    if _pad_weight(weights, pads) > 1e-6:
        return (f"your function puts weight up to {_pad_weight(weights, pads):.2g} on pad positions: the masked "
                f"scores still count (a finite fill, or a mask that misses some pads?). Fill them with "
                f"float('-inf') before the softmax.")
    return ("the pads get 0 but the real weights differ from softmax over the unmasked keys: softmax the masked "
            "scores over the last dimension.")


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
    if weights.dtype != scores.dtype:
        raise ExerciseError(
            f"your weights have dtype {weights.dtype} for scores of dtype {scores.dtype}: keep the scores' dtype "
            f"(no .float() or dtype= on the way)."
        )
    want = _masked_softmax(scores, mask)
    if not close(weights, want):
        raise ExerciseError(
            f"{_masked_softmax_mistake(weights, scores, mask)} (largest difference: {max_diff(weights, want):.2g})"
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
            f"key: a large finite fill like -1e4 or -1e9 is not minus infinity once the real scores are even "
            f"lower. Fill with float('-inf')."
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
