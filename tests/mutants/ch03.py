"""Chapter 3's checkers under mutation: the padding mask of a batch, and the masked softmax."""
import torch

from attention_course.exercises import ch03
from attention_course.functional import masked_softmax
from attention_course.masks import padding_mask
from mutants import Catalogue, Mutant

# ---------------------------------------------------------------------------------------------------------
# check_padding_mask


def padding(lengths, max_len, *, compare=">=", polarity="ignore", layout="(B, 1, S)", columns=None, dtype=None,
            side="right"):
    """The reference padding mask, with each classic slip as an option."""
    positions = torch.arange(max_len if columns is None else columns)[None, :]  # (1, S)
    lens = torch.tensor(lengths)[:, None]  # (B, 1)
    if side == "left":
        positions = positions.flip(-1)
    mask = {">=": positions >= lens, ">": positions > lens, ">=-1": positions >= lens - 1,
            "from 1": positions + 1 >= lens}[compare]  # (B, S)
    mask = ~mask if polarity == "keep" else mask
    mask = {"(B, 1, S)": lambda m: m[:, None, :], "(B, S)": lambda m: m, "(B, S, 1)": lambda m: m[:, :, None],
            "(B, S, S)": lambda m: m[:, None, :].expand(-1, m.shape[1], -1), "(1, B, S)": lambda m: m[None],
            "(S, 1, B)": lambda m: m.T[:, None, :]}[layout](mask)
    return mask if dtype is None else mask.to(dtype)


def padding_loop(lengths, max_len):
    mask = torch.zeros(len(lengths), 1, max_len, dtype=torch.bool)
    for b, n in enumerate(lengths):
        mask[b, 0, n:] = True
    return mask


def padding_catalogue():
    def with_options(**options):
        return lambda lengths, max_len: padding(lengths, max_len, **options)

    def one_wrong(lengths, max_len):
        mask = padding(lengths, max_len).clone()
        mask[1, 0, 0] = True
        return mask

    return Catalogue(
        ch03.check_padding_mask,
        correct={
            "arange >= lengths": padding,
            "a loop over the sentences": padding_loop,
            "the package's padding_mask, unsqueezed": lambda lengths, max_len: padding_mask(lengths, max_len).unsqueeze(1),
            "~(arange < lengths)": lambda lengths, max_len: ~(torch.arange(max_len) < torch.tensor(lengths)[:, None])[
                :, None],
        },
        mutants=[
            Mutant("allow polarity", with_options(polarity="keep"), r"polarity swapped"),
            Mutant("position > length", with_options(compare=">"), r"misses the first pad"),
            Mutant("position >= length - 1", with_options(compare=">=-1"), r"also hides the last real token",
                   family="hides the last real token"),
            Mutant("positions counted from 1", with_options(compare="from 1"), r"also hides the last real token",
                   family="hides the last real token"),
            Mutant("pads on the left", with_options(side="left"), r"on the LEFT"),
            Mutant("no query axis (B, S)", with_options(layout="(B, S)"), r"key padding mask itself"),
            Mutant("query axis last (B, S, 1)", with_options(layout="(B, S, 1)"), r"that axis is the QUERIES"),
            Mutant("expanded (B, S, S)", with_options(layout="(B, S, S)"), r"already expanded over the queries"),
            Mutant("new axis first (1, B, S)", with_options(layout="(1, B, S)"), r"new axis FIRST"),
            Mutant("sentences and positions swapped", with_options(layout="(S, 1, B)"),
                   r"has shape \(5, 1, 1\), expected \(1, 1, 5\): the right one with its axes in another order"),
            Mutant("max(lengths) columns", with_options(columns=4), r"has shape \(1, 1, 4\), expected \(1, 1, 5\): axis 2 alone differs, 4 for 5 \(max_len = 5\), one too few"),
            Mutant("max(lengths) columns, any batch",
                   lambda lengths, max_len: padding(lengths, max_len, columns=max(lengths)),
                   r"max\(lengths\) columns"),
            Mutant("int 0/1 ignore mask", with_options(dtype=torch.long), r"is int64, expected bool",
                   family="numbers, not bool"),
            Mutant("float 0/1 ignore mask", with_options(dtype=torch.float32),
                   r"is float32, expected bool", family="numbers, not bool"),
            Mutant("uint8 keep mask", with_options(polarity="keep", dtype=torch.uint8),
                   r"is uint8, expected bool", family="numbers, not bool"),
            Mutant("additive float mask", lambda lengths, max_len: torch.zeros(len(lengths), 1, max_len).masked_fill(
                padding(lengths, max_len), float("-inf")), r"is float32, expected bool",
                   family="numbers, not bool"),
            Mutant("one position wrong", one_wrong, r"your padding mask raised IndexError"),
            Mutant("a list, not a tensor", lambda lengths, max_len: padding(lengths, max_len).tolist(),
                   r"is a list, expected a torch\.Tensor"),
        ],
    )


# ---------------------------------------------------------------------------------------------------------
# check_masked_softmax


def masked(scores, mask, *, fill=float("-inf"), inverted=False, after=False, renormalise=False, dim=-1,
           zero_empty=True, apply=True, query_axis=False, added=False):
    """The reference masked softmax, with each classic slip as an option."""
    mask = mask.transpose(-2, -1) if query_axis else mask  # (B, 1, S) -> (B, S, 1)
    mask = ~mask if inverted else mask
    if added:
        weights = torch.softmax(scores + mask, dim)
    elif after or renormalise:
        weights = torch.softmax(scores, dim).masked_fill(mask, 0.0)
        if renormalise:
            weights = weights / weights.sum(dim, keepdim=True)
    else:
        weights = torch.softmax(scores.masked_fill(mask, fill) if apply else scores, dim)
    return weights.masked_fill(mask.all(-1, keepdim=True), 0.0) if zero_empty else weights


def masked_where(scores, mask):
    scores = torch.where(mask, float("-inf"), scores)
    return torch.softmax(scores, -1).nan_to_num(0.0)  # a row of -inf only: 0 / 0 = NaN -> 0


def masked_explicit(scores, mask):
    filled = scores.masked_fill(mask, float("-inf"))
    top = filled.amax(-1, keepdim=True)  # (B, L, 1); -inf on a row with no key left
    e = (filled - top.masked_fill(top == float("-inf"), 0.0)).exp()  # exactly 0 on masked keys
    return e / e.sum(-1, keepdim=True).clamp(min=torch.finfo(scores.dtype).tiny)  # an empty row: 0 / tiny = 0


def masked_catalogue():
    def with_options(**options):
        return lambda scores, mask: masked(scores, mask, **options)

    def uniform_when_empty(scores, mask):
        weights = masked(scores, mask, zero_empty=False)
        return torch.where(mask.all(-1, keepdim=True), 1.0 / scores.shape[-1], weights)

    return Catalogue(
        ch03.check_masked_softmax,
        correct={
            "masked_fill, then zero the empty rows": masked,
            "torch.where and nan_to_num": masked_where,
            "exp of the shifted scores, divided by a clamped sum": masked_explicit,
            "the package's masked_softmax": masked_softmax,
        },
        mutants=[
            Mutant("mask not applied", with_options(apply=False), r"mask was not applied"),
            Mutant("pads zeroed after the softmax", with_options(after=True), r"AFTER the softmax",
                   family="after the softmax"),
            Mutant("pads zeroed after the softmax, NaN rows", with_options(after=True, zero_empty=False),
                   r"AFTER the softmax", family="after the softmax"),
            Mutant("zeroed after the softmax and renormalised", with_options(renormalise=True, zero_empty=False),
                   (r"renormalised", r"0 / 0"), family="after the softmax"),
            Mutant("inverted polarity", with_options(inverted=True), r"inverted polarity", family="inverted"),
            Mutant("inverted polarity, NaN rows", with_options(inverted=True, zero_empty=False),
                   r"inverted polarity", family="inverted"),
            Mutant("keep-mask style on an ignore mask", lambda s, m: masked(s, m == 0), r"inverted polarity",
                   family="inverted"),
            Mutant("mask on the query axis", with_options(query_axis=True), (r"QUERY axis", r"\(B, 1, S\)"),
                   family="query axis"),
            Mutant("mask on the query axis, NaN rows", with_options(query_axis=True, zero_empty=False),
                   (r"QUERY axis", r"\(B, 1, S\)"), family="query axis"),
            # One family: a finite fill, whichever number; the checker names the number where it can tell.
            Mutant("fill -1e9", with_options(fill=-1e9), (r"finite fill", r"-1e9"), family="finite fill"),
            Mutant("fill -1e4", with_options(fill=-1e4), (r"finite fill", r"-1e4"), family="finite fill"),
            Mutant("fill 0", with_options(fill=0.0), (r"finite fill", r"with 0, a finite fill"), family="finite fill"),
            Mutant("fill -5", with_options(fill=-5.0),
                   r"differs at 6 of 6 entries, all of them in the rows that have a masked key",
                   family="finite fill"),
            Mutant("NaN on empty rows", with_options(zero_empty=False), r"gives NaN on a row whose keys are all masked"),
            Mutant("uniform on empty rows", uniform_when_empty,
                   r"gives a row whose keys are all masked equal weights, 1/S"),
            Mutant("softmax over the queries", with_options(dim=-2), r"softmax ran over the queries",
                   family="softmax over the queries"),
            Mutant("softmax over the queries, NaN rows", with_options(dim=-2, zero_empty=False),
                   r"softmax ran over the queries", family="softmax over the queries"),
            Mutant("bool mask added to the scores", with_options(added=True), r"ADDED the bool mask"),
            Mutant("bool mask made float for masked_fill", lambda s, m: masked(s, m.float()),
                   r"float mask is not a selection"),
            Mutant("float32 weights", lambda s, m: masked(s.float(), m), r"float32, expected float64"),
            Mutant("wrong shape", lambda s, m: masked(s, m).sum(-1), r"has shape \(2, 2\), expected \(2, 2, 3\): an axis of size 3 missing"),
        ],
    )


CATALOGUES = [padding_catalogue(), masked_catalogue()]
