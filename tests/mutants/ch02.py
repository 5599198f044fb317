"""Chapter 2's checkers under mutation: a stable softmax, and attention of a batch."""
import math
import warnings

import torch

from attention_course.exercises import ch02
from mutants import Catalogue, Mutant

# ---------------------------------------------------------------------------------------------------------
# check_softmax


def softmax(scores, dim=-1, *, shift="max", use_exp=True, normalise=True, keepdim=True, dim_used=None,
            values=True, sum_keepdim=True):
    """The reference softmax, with each classic slip as an option."""
    dim = dim if dim_used is None else dim_used
    if shift == "max":
        top = scores.max(dim, keepdim=keepdim)
        scores = scores - (top.values if values else top)
    elif shift == "global":
        scores = scores - scores.max()
    elif shift == "min":
        scores = scores - scores.min(dim, keepdim=True).values
    elif shift == "mean":
        scores = scores - scores.mean(dim, keepdim=True)
    e = scores.exp() if use_exp else scores
    return e / e.sum(dim, keepdim=sum_keepdim) if normalise else e


def in_place(scores, dim=-1):
    scores -= scores.max(dim, keepdim=True).values  # changes the caller's tensor
    e = scores.exp()
    return e / e.sum(dim, keepdim=True)


def logsumexp_style(scores, dim=-1):
    return (scores - scores.logsumexp(dim, keepdim=True)).exp()


def hard_max(scores, dim=-1):
    return torch.zeros_like(scores).scatter(dim, scores.argmax(dim, keepdim=True), 1.0)


def softmax_catalogue():
    return Catalogue(
        ch02.check_softmax,
        correct={
            "shifted by the row maximum": softmax,
            "torch.softmax": lambda s, dim=-1: torch.softmax(s, dim),
            "exp(s - logsumexp)": logsumexp_style,
            "amax and torch.exp": lambda s, dim=-1: (lambda e: e / torch.sum(e, dim, keepdim=True))(
                torch.exp(s - torch.amax(s, dim, keepdim=True))),
        },
        mutants=[
            Mutant("no shift: overflows", lambda s, dim=-1: softmax(s, dim, shift=None),
                   (r"overflows to inf", r"subtract each row's maximum")),
            Mutant("one maximum for the whole tensor", lambda s, dim=-1: softmax(s, dim, shift="global"),
                   r"ONE maximum for the whole tensor"),
            Mutant("shift by the row minimum", lambda s, dim=-1: softmax(s, dim, shift="min"),
                   (r"MAXIMUM", r"not its minimum or mean"), family="shift by another statistic"),
            Mutant("shift by the row mean", lambda s, dim=-1: softmax(s, dim, shift="mean"),
                   (r"MAXIMUM", r"not its minimum or mean"), family="shift by another statistic"),
            Mutant("clamped instead of shifted", lambda s, dim=-1: torch.softmax(s.clamp(max=500.0), dim),
                   r"scores around 1000, shape \(3, 5\): your softmax's result differs"),
            Mutant("softmax over the columns", lambda s, dim=-1: softmax(s, dim_used=0), r"down the COLUMNS"),
            Mutant("dim ignored", lambda s, dim=-1: softmax(s, dim_used=-1), r"ignores its `dim`"),
            Mutant("no exp", lambda s, dim=-1: softmax(s, dim, shift=None, use_exp=False),
                   r"without taking exp"),
            Mutant("no division by the sum", lambda s, dim=-1: softmax(s, dim, normalise=False),
                   r"does not divide by the sum"),
            Mutant("max without keepdim", lambda s, dim=-1: softmax(s, dim, keepdim=False),
                   r"without keepdim=True", family="keepdim"),
            Mutant("sum without keepdim", lambda s, dim=-1: softmax(s, dim, sum_keepdim=False),
                   r"without keepdim=True", family="keepdim"),
            Mutant("max without .values", lambda s, dim=-1: softmax(s, dim, values=False), r"a pair \(values, indices\)"),
            Mutant("negative weights", lambda s, dim=-1: -softmax(s, dim), r"is -1 times the right one at every entry"),
            Mutant("log-softmax returned", lambda s, dim=-1: torch.log_softmax(s, dim), r"log_softmax|log-softmax"),
            Mutant("rows sum to one half", lambda s, dim=-1: softmax(s, dim) * 0.5, r"is 0\.5 times the right one at every entry"),
            Mutant("hard maximum (one-hot)", hard_max, (r"one-hot", r"argmax")),
            Mutant("scores doubled", lambda s, dim=-1: softmax(2 * s, dim),
                   r"two rows 1000 apart, shape \(2, 5\): your softmax's result differs"),
            Mutant("shifted in place", in_place, r"in place"),
            Mutant("float32 result", lambda s, dim=-1: torch.softmax(s.float(), dim), r"in float32, expected float64"),
            Mutant("wrong shape", lambda s, dim=-1: softmax(s, dim)[0], r"has shape \(3,\), expected \(2, 3\): an axis of size 2 missing"),
            Mutant("a list, not a tensor", lambda s, dim=-1: softmax(s, dim).tolist(),
                   r"is a list, expected a torch\.Tensor"),
        ],
    )


# ---------------------------------------------------------------------------------------------------------
# check_attention


def attention(q, k, v, *, scale="sqrt_d", softmax_dim=-1, swap=False, values="v", transpose="last two",
              softmax=True):
    """The reference attention, with each classic slip as an option. Returns (output, weights)."""
    d = q.shape[-1]
    with warnings.catch_warnings():  # k.T on a batch warns; the mistake under test
        warnings.simplefilter("ignore", UserWarning)
        kt = {"last two": k.transpose(-2, -1), "T": k.T, "first two": k.transpose(0, 1)}[transpose]
    raw = k @ q.transpose(-2, -1) if swap else q @ kt
    scores = {"sqrt_d": raw / math.sqrt(d), "none": raw, "d": raw / d, "sqrt_dv": raw / math.sqrt(v.shape[-1]),
              "sqrt_S": raw / math.sqrt(k.shape[-2]), "sqrt_L": raw / math.sqrt(q.shape[-2]),
              "times_sqrt_d": raw * math.sqrt(d)}[scale]
    weights = torch.softmax(scores, softmax_dim) if softmax else scores
    return weights @ {"v": v, "k": k}[values], weights


def attention_einsum(q, k, v):
    scores = torch.einsum("bld,bsd->bls", q, k) / q.shape[-1] ** 0.5  # (B, L, S)
    weights = scores.softmax(-1)
    return torch.einsum("bls,bsv->blv", weights, v), weights


def attention_explicit(q, k, v):
    scores = torch.bmm(q, k.permute(0, 2, 1)) * q.size(-1) ** -0.5  # (B, L, S)
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    weights = e / e.sum(-1, keepdim=True)
    return torch.bmm(weights, v), weights


def attention_catalogue():
    def with_weights(make_out=None, make_weights=None):
        def fn(q, k, v):
            out, weights = attention(q, k, v)
            return (make_out(out) if make_out else out), (make_weights(weights, q, k, v) if make_weights else weights)
        return fn

    return Catalogue(
        ch02.check_attention,
        correct={
            "matmul and torch.softmax": attention,
            "einsum": attention_einsum,
            "bmm, permute and a hand-written softmax": attention_explicit,
            "k.mT": lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(q @ k.mT / math.sqrt(q.shape[-1]), -1)),
        },
        mutants=[
            Mutant("no scale", lambda q, k, v: attention(q, k, v, scale="none"), r"did not scale the scores"),
            Mutant("divided by d", lambda q, k, v: attention(q, k, v, scale="d"), r"divided the scores by d;"),
            Mutant("multiplied by sqrt(d)", lambda q, k, v: attention(q, k, v, scale="times_sqrt_d"),
                   r"MULTIPLIED"),
            Mutant("divided by sqrt(dv)", lambda q, k, v: attention(q, k, v, scale="sqrt_dv"),
                   r"divided the scores by sqrt\(dv\)"),
            Mutant("divided by sqrt(S)", lambda q, k, v: attention(q, k, v, scale="sqrt_S"),
                   r"divided the scores by sqrt\(S\)"),
            Mutant("divided by sqrt(L)", lambda q, k, v: attention(q, k, v, scale="sqrt_L"),
                   r"divided the scores by sqrt\(L\)"),
            Mutant("softmax over the queries", lambda q, k, v: attention(q, k, v, softmax_dim=-2),
                   r"normalised over the queries"),
            Mutant("softmax over the batch", lambda q, k, v: attention(q, k, v, softmax_dim=0),
                   r"over the BATCH"),
            Mutant("no softmax", lambda q, k, v: attention(q, k, v, softmax=False), r"no softmax"),
            Mutant("weights divided by sqrt(d) after the softmax",
                   lambda q, k, v: (lambda w: (w @ v, w))(torch.softmax(q @ k.mT, -1) / math.sqrt(q.shape[-1])),
                   r"divided the WEIGHTS by sqrt\(d\), after the softmax"),
            Mutant("k q^T (raises)", lambda q, k, v: attention(q, k, v, swap=True),
                   r"computes k q\^T", family="k q^T"),
            Mutant("weights transposed", lambda q, k, v: (torch.zeros(1), torch.softmax(k @ q.mT / 2, -1)),
                   r"output has shape \(1,\)", family="k q^T"),
            Mutant("k.T on a batch", lambda q, k, v: attention(q, k, v, transpose="T"),
                   r"uses k\.T: on a 3-D tensor", family="transpose of all dimensions"),
            Mutant("k.transpose(0, 1)", lambda q, k, v: attention(q, k, v, transpose="first two"),
                   r"transpose missing or misplaced", family="transpose of all dimensions"),
            Mutant("keys averaged", lambda q, k, v: attention(q, k, v, values="k"), r"averaged the keys"),
            Mutant("pair swapped", lambda q, k, v: attention(q, k, v)[::-1], r"\(output, weights\), in that order"),
            Mutant("output scaled", with_weights(make_out=lambda o: 2 * o), r"output is 2 times the right one at every entry\. Its tensor of weights is right"),
            Mutant("weights halved", with_weights(make_weights=lambda w, q, k, v: w / 2),
                   r"tensor of weights is 0\.5 times the right one at every entry\. Its output is right"),
            Mutant("other weights", with_weights(make_weights=lambda w, q, k, v: attention(3 * q, k, v)[1]),
                   r"tensor of weights differs at 48 of 48 entries.*Its output is right"),
            Mutant("float32 results", lambda q, k, v: attention(q.float(), k.float(), v.float()),
                   r"output holds the right values in float32"),
            Mutant("output only", lambda q, k, v: attention(q, k, v)[0], r"return the pair \(output, weights\)"),
            Mutant("weights of one sentence", with_weights(make_weights=lambda w, q, k, v: w[0]),
                   r"tensor of weights has shape \(4, 4\), expected \(3, 4, 4\): an axis of size 3 missing"),
            Mutant("a crash", lambda q, k, v: 1 / 0, r"raised ZeroDivisionError"),
        ],
    )


CATALOGUES = [softmax_catalogue(), attention_catalogue()]
