"""Chapter 8's checker under mutation: merging two online-softmax states (m, l, acc)."""
import math

import torch

from attention_course.exercises import ch08
from mutants import Catalogue, Mutant

NEG_INF = float("-inf")


def merge(m1, l1, acc1, m2, l2, acc2, *, take_max=torch.maximum, stand_in=True, factor=None, scale_l=(1, 1),
          scale_acc=(1, 1), swap=False, fill=None):
    """A merge with switches: each switch off the reference (``_reference_merge``) is one classic mistake."""
    if fill is not None:  # -inf replaced by a finite number before anything else
        m1, m2 = m1.clamp(min=fill), m2.clamp(min=fill)
    m = take_max(m1, m2)  # (..., 1)
    shift = m.masked_fill(m == NEG_INF, 0.0) if stand_in else m
    factor = factor or (lambda m_block, m_common: torch.exp(m_block - m_common))
    c1, c2 = factor(m1, shift), factor(m2, shift)
    if swap:
        c1, c2 = c2, c1
    use = lambda c, on: c if on else 1.0  # noqa: E731
    l = use(c1, scale_l[0]) * l1 + use(c2, scale_l[1]) * l2  # noqa: E741
    acc = use(c1, scale_acc[0]) * acc1 + use(c2, scale_acc[1]) * acc2
    return m, l, acc


def max_pair(m1, l1, acc1, m2, l2, acc2):
    """torch.cat(...).max(-1, keepdim=True) is a (values, indices) pair, used as if it were the values."""
    m = torch.cat([m1, m2], -1).max(-1, keepdim=True)
    return merge(m1, l1, acc1, m2, l2, acc2, take_max=lambda a, b: m)


def squeezed_factor(m1, l1, acc1, m2, l2, acc2):
    """The factors made (...,) with squeeze(-1): they meet acc (..., dv) from the right."""
    m = torch.maximum(m1, m2)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    c1, c2 = torch.exp(m1 - shift).squeeze(-1), torch.exp(m2 - shift).squeeze(-1)  # (...,)
    return m, (c1 * l1.squeeze(-1) + c2 * l2.squeeze(-1))[..., None], c1 * acc1 + c2 * acc2


def where_style(m1, l1, acc1, m2, l2, acc2):
    """torch.where around the exponentials: 0 where the block has no key."""
    m = torch.maximum(m1, m2)
    c1 = torch.where(m1 == NEG_INF, 0.0, torch.exp(m1 - m))
    c2 = torch.where(m2 == NEG_INF, 0.0, torch.exp(m2 - m))
    return m, c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2


def stacked_style(m1, l1, acc1, m2, l2, acc2):
    """Both blocks stacked on a new axis, the maximum over it, the NaN of exp(-inf - -inf) turned into 0."""
    ms, ls, accs = torch.stack([m1, m2]), torch.stack([l1, l2]), torch.stack([acc1, acc2])  # (2, ..., *)
    m = ms.amax(0)
    c = torch.exp(ms - m).nan_to_num(0.0)  # (2, ..., 1)
    return m, (c * ls).sum(0), (c * accs).sum(0)


def averaged_outputs(m1, l1, acc1, m2, l2, acc2):
    """The mean of the two blocks' outputs, as if both had the same weight."""
    return torch.maximum(m1, m2), torch.ones_like(l1), (acc1 / l1 + acc2 / l2) / 2


def summed_outputs(m1, l1, acc1, m2, l2, acc2):
    return torch.maximum(m1, m2), torch.ones_like(l1), acc1 / l1 + acc2 / l2


def normalised_acc(m1, l1, acc1, m2, l2, acc2):  # acc divided by l before it is returned
    m, l, acc = ch08._reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m, l, acc / l


def global_max(m1, m2):  # the largest m over every query, broadcast: a max over the wrong axis
    return torch.cat([m1, m2]).amax().expand_as(m1)


def first(m1, m2):
    return m1


def reordered(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = ch08._reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m, acc, l


def no_keepdim(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = ch08._reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m.squeeze(-1), l, acc


def float32_result(m1, l1, acc1, m2, l2, acc2):
    return tuple(t.float() for t in ch08._reference_merge(m1, l1, acc1, m2, l2, acc2))


def float32_factors(m1, l1, acc1, m2, l2, acc2):
    return merge(m1, l1, acc1, m2, l2, acc2, factor=lambda mb, mc: torch.exp((mb - mc).float()))


def doubled(m1, l1, acc1, m2, l2, acc2):  # acc / l right, l and acc on another scale
    m, l, acc = ch08._reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m, 2 * l, 2 * acc


def in_place(m1, l1, acc1, m2, l2, acc2):
    """Each block rescaled in its own tensors (mul_), the caller's states overwritten."""
    m = torch.maximum(m1, m2)
    shift = m.masked_fill(m == NEG_INF, 0.0)
    for c, l, acc in ((torch.exp(m1 - shift), l1, acc1), (torch.exp(m2 - shift), l2, acc2)):
        l.mul_(c)
        acc.mul_(c)
    return m, l1 + l2, acc1 + acc2


def stand_in_returned(m1, l1, acc1, m2, l2, acc2):
    """The stand-in (0 where no key) returned as m."""
    m = torch.maximum(m1, m2)
    m = torch.where(m == NEG_INF, torch.zeros_like(m), m)
    c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2


def no_return(m1, l1, acc1, m2, l2, acc2):
    ch08._reference_merge(m1, l1, acc1, m2, l2, acc2)


def stub(*args):
    raise NotImplementedError()


def mutant(name, names, family=None, **switches):
    return Mutant(name, lambda *s: merge(*s, **switches), names, family)


CATALOGUES = [
    Catalogue(
        ch08.check_merge_partials,
        correct={
            "masked_fill stand-in (the reference)": ch08._reference_merge,
            "torch.where around exp": where_style,
            "stacked blocks, nan_to_num": stacked_style,
        },
        mutants=[
            mutant("no rescaling", (r"different maxima", r"rescale"), scale_l=(0, 0), scale_acc=(0, 0)),
            mutant("only l rescaled", r"only l\b", scale_acc=(0, 0)),
            mutant("only acc rescaled", r"only acc\b", scale_l=(0, 0)),
            mutant("only the first block rescaled", r"only the first block", scale_l=(1, 0), scale_acc=(1, 0)),
            mutant("factors swapped between the blocks", r"swapped", swap=True),
            mutant("exponent the wrong way round, exp(m - m1)", r"wrong way round",
                   factor=lambda mb, mc: torch.exp(mc - mb)),
            mutant("factor without the exponential", r"without the exp", factor=lambda mb, mc: mb - mc),
            mutant("m = m1, the first block's maximum", r"first block's maximum", take_max=first),
            mutant("m = the smaller maximum (torch.minimum)", r"smaller", take_max=torch.minimum),
            mutant("maximum over the wrong axis (all queries)", (r"all queries", r"per query"),
                   take_max=global_max),
            mutant("NaN on empty rows (no stand-in for m = -inf)", (r"NaN", r"exp\(-inf - -inf\)"),
                   stand_in=False),
            mutant("finite fill -1e4 for -inf", r"must stay -inf", "finite fill", fill=-1e4),
            mutant("finite fill -1e9 for -inf", r"must stay -inf", "finite fill", fill=-1e9),
            Mutant("block outputs averaged, without weights", averaged_outputs, r"blocks' outputs",
                   family="outputs"),
            Mutant("block outputs added, without weights", summed_outputs, r"blocks' outputs", family="outputs"),
            Mutant("acc returned divided by l", normalised_acc, r"already divided by l"),
            mutant("reference 0 instead of the common maximum (exp(m1))", r"acc / l is right",
                   family="reference", factor=lambda mb, mc: torch.exp(mb)),
            Mutant("l and acc doubled", doubled, r"l is 2 times the right one", family="reference"),
            Mutant("returns (m, acc, l)", reordered, r"order"),
            Mutant("keepdim lost: m of shape (...,)", no_keepdim,
                   (r"m has shape \(\d+,\), expected \(\d+, 1\)", r"keepdim")),
            Mutant("float32 result", float32_result, r"float32", family="dtype"),
            Mutant("float32 factors", float32_factors, r"float32", family="dtype"),
            Mutant("Python's max on tensors", lambda *s: merge(*s, take_max=max), (r"ONE truth value",
                                                                                   r"torch\.maximum")),
            Mutant("max(dim)'s pair used as m", max_pair, (r"pair \(values, indices\)", r"\.values")),
            Mutant("math.exp on a tensor", lambda *s: merge(*s, factor=lambda a, b: math.exp(a - b)),
                   (r"math\.exp", r"torch\.exp")),
            Mutant("factor broadcast without the last axis", squeezed_factor,
                   (r"must match the size of tensor b", r"keep\s+the last axis of size 1")),
            Mutant("no return statement", no_return, r"`return` missing"),
            Mutant("the states rescaled in place (mul_)", in_place, r"modified its input `l[12]`"),
            Mutant("the stand-in 0 returned as m", stand_in_returned, r"returns m = 0 for a query"),
            mutant("finite fill finfo.min for -inf", r"must stay -inf", "finite fill",
                   fill=torch.finfo(torch.float64).min),
            Mutant("the stub", stub, r"stub"),
        ],
    ),
]
