"""Chapter 3's checkers; masks are IGNORE masks, True = do NOT attend. ``batch_padding_mask(lengths, max_len)``
(ex-ch3-padding-mask) -> (B, 1, S); ``my_masked_softmax(scores, mask)`` (ex-ch3-masked-softmax), zeros if all masked."""
from __future__ import annotations

import torch

from .diagnose import Case, Exercise, Mistake, check

_pad = lambda lengths, max_len, first=0, cols=None: (  # noqa: E731 - the slips: pads from length + first, cols columns
    torch.arange(max_len if cols is None else cols)[None, :] >= torch.tensor(lengths)[:, None] + first)[:, None, :]
_p = lambda turn=lambda m: m, **slip: lambda lengths, max_len: turn(_pad(lengths, max_len, **slip))  # noqa: E731
PADDING_MASK = Exercise(
    what="your padding mask",
    reference=_pad,
    cases=[Case(f"lengths {n}, max_len = {s}", (n, s)) for n, s in (
        ([1], 1), ([3], 5), ([2, 2], 2), ([1, 3], 4), ([4, 1, 3], 6), ([5, 2, 4, 1], 5), ([4, 3, 2], 4), ([0, 3], 3))],
    mistakes=[
        Mistake(">", "misses the first pad of each sentence, at lengths[b]: position >= length, not >.", _p(first=1)),
        Mistake(">= length - 1", "also hides the last real token, lengths[b] - 1: position >= length.", _p(first=-1)),
        Mistake("left", "puts the pads on the LEFT: pads go from lengths[b] on.", _p(turn=lambda m: m.flip(-1))),
        Mistake("[-n_pads:]", "marks the pads with mask[-n_pads:]: with no pad, [-0:] is the WHOLE row: mask[length:].",
                lambda n, s: _pad(n, s) | (torch.tensor(n) == s)[:, None, None]),
        Mistake("(B, S)", "returns (B, S), the key padding mask itself: mask[:, None, :].", _p(turn=lambda m: m[:, 0])),
        Mistake("(B, S, 1)", "returns (B, S, 1): that axis is the QUERIES. Use (B, 1, S).", _p(turn=lambda m: m.mT)),
        Mistake("(B, S, S)", "is already expanded over the queries, (B, S, S): return (B, 1, S), broadcasting does "
                "the rest.", _p(turn=lambda m: m.expand(-1, m.shape[-1], -1))),
        Mistake("(1, B, S)", "puts the new axis FIRST: mask[:, None, :].", _p(turn=lambda m: m.movedim(1, 0))),
        Mistake("lengths flat", "compares arange(max_len) with the lengths WITHOUT lengths[:, None]: they line up "
                "with the positions (an error unless B = max_len). arange(max_len) >= tensor(lengths)[:, None].",
                lambda n, s: (torch.arange(s) >= torch.as_tensor(n))[None, None, :].expand(len(n), 1, s)),
        Mistake("max(lengths)", "has max(lengths) columns: use arange(max_len).", lambda n, s: _pad(n, s, cols=max(n))),
        Mistake("length 0", "leaves position 0 of an empty sentence (length 0) unmasked: all its positions are pads.",
                lambda lengths, max_len: _pad([max(n, 1) for n in lengths], max_len)),
    ],
    hints=((r"too many indices for tensor of dimension 1", "compare arange(max_len) with tensor(lengths)[:, None]."),),
    passed="(B, 1, S), True exactly at the pads, for one sentence or several, padded to max(lengths) or further.",
)

def check_padding_mask(fn) -> None:
    """Check ``fn(lengths, max_len) -> mask``: a bool ignore mask (B, 1, S), True at the pads."""
    check(PADDING_MASK, fn)

def _msm(scores, mask, fill=float("-inf"), turn=lambda m: m, empty=True, after=None, dim=-1, added=0):
    """The reference; the slips as options (``fill`` None: no mask, ``empty``: how the all-masked rows are found)."""
    m = turn(mask)
    if after:
        w = torch.softmax(scores, dim).masked_fill(m, 0.0)
        w = w / w.sum(dim, keepdim=True) if after == "renormalise" else w
    else:
        w = torch.softmax(scores + m * added if added else scores if fill is None else scores.masked_fill(m, fill), dim)
    rows = {True: lambda: m.all(-1, keepdim=True), "any": lambda: m.any(-1, keepdim=True), "global": m.all,
            "nan": w.isnan, False: lambda: torch.tensor(False), "1": lambda: m.all(1)}[empty]()
    return w.masked_fill(rows, 0.0)

_m = lambda **slip: lambda scores, mask: _msm(scores, mask, **slip)  # noqa: E731
EMPTY = "And a row whose keys are all masked gets {}: give it zeros, mask.all(-1, keepdim=True)."
_both = lambda name, says, gets="NaN", **slip: [Mistake(name, says, _m(**slip)), Mistake(  # noqa: E731 - empty rows too
    f"{name}, {gets}", f"{says} {EMPTY.format(gets)}", _m(empty=False, **slip))]

def _scores(name, scores, mask):
    mask = torch.tensor(mask, dtype=torch.bool)[:, None, :] if isinstance(mask, list) else mask  # (B, 1, S)
    at = mask.expand_as(scores)
    marks = {"at the masked keys": at, "in the rows whose keys are all masked": at.all(-1, keepdim=True).expand_as(at),
             "in the rows that have a masked key": at.any(-1, keepdim=True).expand_as(at)}
    return Case(f"{name}, scores {tuple(scores.shape)}, mask {mask.int().tolist()}", (scores, mask), marks)

_r = (lambda g: lambda *shape: torch.randn(*shape, generator=g, dtype=torch.float64))(torch.Generator().manual_seed(3))
INF = "Fill the masked scores with float('-inf') BEFORE the softmax."
MASKED_SOFTMAX = Exercise(
    what="your masked softmax",
    reference=_msm,
    cases=[_scores("one key", _r(1, 1, 1), [[0]]), _scores("one key, masked", _r(1, 1, 1), [[1]]),
           _scores("lengths 4, 3, 2", _r(3, 4, 4), torch.arange(4) >= torch.tensor([4, 3, 2])[:, None, None]),
           _scores("a sentence all masked", _r(2, 3, 5), [[0, 1, 0, 1, 0], [1] * 5]), _scores("scores around -1e10, "
                   "the masked key highest", torch.tensor([[[-2e10, -2e10, -1e10]]]).double(), [[0, 0, 1]]),
           _scores("scores around -1e6", _r(1, 2, 3) - 1e6, [[0, 0, 1]]),
           _scores("float32 scores", _r(2, 2, 3).float(), [[0, 1, 0], [0, 0, 0]])],
    mistakes=[
        Mistake("not applied", f"puts weight on the masked keys: the mask was not applied. {INF}", _m(fill=None)),
        Mistake("after", f"zeroed the pads AFTER the softmax: the rows no longer sum to 1. {INF}", _m(after="zero")),
        Mistake("renormalised", f"zeroed the pads after the softmax and renormalised: if the pads held all the weight, "
                f"0 / 0 = NaN. {INF}", _m(after="renormalise", empty=False)),
        *_both("inverted", "masks the keys where the mask is False: inverted polarity. Here True = IGNORE "
               "(nn.MultiheadAttention's convention): mask where the mask is True.", turn=lambda m: ~m),
        *_both("query axis", "masks whole query ROWS: the mask was used on the QUERY axis, as (B, S, 1). Use the "
               "(B, 1, S) mask as it comes.", turn=lambda m: m.mT),
        *_both("queries", "sums to 1 down the columns: softmax ran over the queries. Each query's weights over the "
               "keys must sum to 1: softmax(..., dim=-1).", dim=-2),
        *[m for t in ("-1e9", "-1e4", "0") for m in _both(f"fill {t}", f"fills the masked scores with {t}, a finite "
          f"fill: it takes weight unless the real scores are far above. Use -inf.", "equal weights", fill=float(t))],
        Mistake("queries, nan", "sums to 1 down the columns: softmax ran over the queries.", _m(dim=-2, empty="nan")),
        Mistake("all(1)", "found the empty rows with mask.all(1), lined up as (L, S): all(-1, True).", _m(empty="1")),
        Mistake("1/S", "gives a row whose keys are all masked equal weights, 1/S: give it zeros, mask.all(-1, "
                "keepdim=True).", lambda s, m: _msm(s, m) + m.all(-1, keepdim=True).to(s.dtype) / m.shape[-1]),
        Mistake("NaN", "gives NaN on a row whose keys are all masked: zero it, mask.all(-1, True).", _m(empty=False)),
        Mistake("global all", "zeroes rows only if the WHOLE mask.all(): test each row, .all(-1).", _m(empty="global")),
        Mistake("any", "gives zeros to every row with ANY masked key, not only those ALL masked.", _m(empty="any")),
        Mistake("squeezed", "squeezed the mask to (B, S) before masked_fill: against the (B, L, S) scores it lines up "
                "as (L, S), query l gets sentence l's mask. Keep (B, 1, S).", _m(turn=lambda m: m[:, 0], empty="nan")),
        Mistake("mask[:, None]", "indexes the (B, 1, S) mask as a (B, S) one, mask[:, None, :]: it becomes (B, "
                "1, 1, S), the result (B, B, L, S). The mask already has its query axis: use it as it is.",
                lambda sc, m: _msm(sc, m[:, None, :])),
        Mistake("added -1e9", "adds -1e9 at the masked keys, a FINITE fill: a row whose keys are all masked keeps "
                "weights over them (the -1e9 cancels in the softmax). Fill with float('-inf'), and give such a row "
                "zeros.", _m(added=-1e9, empty=False)),
        Mistake("added", "ADDED the bool mask to the scores: True counts as 1. Use masked_fill.", _m(added=1)),
        *_both("mask * -inf", "built an additive mask as mask * float('-inf'): at the kept keys 0 * -inf = NaN. Use "
               "scores.masked_fill(mask, float('-inf')).", added=float("-inf")),
    ],
    passed="masked keys get exactly 0, the others sum to 1, huge scores are safe, an all-masked row gives zeros.",
    hints=((r"mask \[\d+, 1\] at index 1", "mask.all(-1) is (B, 1), meeting the QUERY axis: mask.all(-1, True)."),),
)

def check_masked_softmax(fn) -> None:
    """Check ``fn(scores, mask) -> weights`` for scores (B, L, S) and a bool ignore mask (B, 1, S)."""
    check(MASKED_SOFTMAX, fn)

EXERCISES = [PADDING_MASK, MASKED_SOFTMAX]
