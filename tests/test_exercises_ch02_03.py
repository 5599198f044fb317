"""The exercise checkers of chapters 2 and 3: each accepts a right answer and rejects each typical wrong answer
with the diagnostic it promises (what is wrong and where to look), not just "wrong"."""
import math

import pytest
import torch

from attention_course.exercises import ExerciseError, ch02, ch03
from attention_course.functional import masked_softmax
from mutants.ch03 import masked  # the reference masked softmax, each classic slip an option

# ---------------------------------------------------------------------------------------------------------
# Chapter 2: a stable softmax


def softmax(scores, dim=-1, *, shift="row", use_exp=True, normalise=True, keepdim=True, ignore_dim=False):
    dim = -1 if ignore_dim else dim
    if shift == "row":
        scores = scores - scores.max(dim, keepdim=keepdim).values
    elif shift == "global":
        scores = scores - scores.max()
    e = scores.exp() if use_exp else scores
    return e / e.sum(dim, keepdim=True) if normalise else e


def test_softmax_accepts_a_right_answer(capsys):
    ch02.check_softmax(softmax)
    ch02.check_softmax(lambda s, dim=-1: torch.softmax(s, dim))
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("fn, message", [
    (lambda s, dim=-1: softmax(s, dim, shift=None), r"^the rows \[-1000, 0, 500\] and \[-800, 0, 800\], shape \(2, 3\): "
     r"your softmax takes exp of the scores as they are: exp\(1000\) overflows.*subtract each row's maximum"),
    (lambda s, dim=-1: softmax(s, dim, shift="global"), r"^the rows \[-1000, 0, 500\] and \[-800, 0, 800\], shape "
     r"\(2, 3\): your softmax subtracts ONE maximum for the whole tensor"),
    (lambda s, dim=-1: softmax(s, dim, ignore_dim=True), r"ordinary scores, shape \(3, 5\), dim=0: .*ignores its `dim`"),
    (lambda s, dim=-1: softmax(s, 0), "normalises down the COLUMNS"),
    (lambda s, dim=-1: softmax(s, dim, shift=None, use_exp=False), "divides the scores by their sum without taking exp"),
    (lambda s, dim=-1: softmax(s, dim, normalise=False), "takes exp but does not divide by the sum"),
    (lambda s, dim=-1: softmax(s, dim, keepdim=False), r"subtracts scores.max\(dim\).values taken without keepdim=True"),
    (lambda s, dim=-1: -softmax(s, dim), r"^one score, shape \(1,\): your softmax's result differs at 1 of 1 entries, "
     r"e.g. at \[0\]: expected 1, got -1.$"),
    (lambda s, dim=-1: softmax(2 * s, dim), r"^two rows 1000 apart, shape \(2, 5\): your softmax's result differs at 10 "
     r"of 10 entries, whole rows \[0, 1\]"),
    (lambda s, dim=-1: softmax(s, dim)[0], r"result has shape \(\), expected \(1,\): an axis of size 1"),
    (lambda s, dim=-1: s.tolist(), "result is a list, expected a torch.Tensor"),
    (lambda s, dim=-1: torch.softmax(s.clamp(max=500.0), dim), r"^scores around 1000, shape \(3, 5\): your softmax's "
     r"result differs at 15 of 15 entries"),
])
def test_softmax_names_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch02.check_softmax(fn)


def test_softmax_cases_cover_every_size_the_statement_leaves_free():
    shapes = {tuple(c.args[0].shape) for c in ch02.SOFTMAX.cases}
    dims = {c.args[1] if len(c.args) > 1 else -1 for c in ch02.SOFTMAX.cases}
    assert {(1,), (4, 4), (2, 3, 4)} <= shapes and dims == {-1, 0, 1}
    assert {c.args[0].dtype for c in ch02.SOFTMAX.cases} == {torch.float32, torch.float64}


# ---------------------------------------------------------------------------------------------------------
# Chapter 2: attention of a batch


def attention(q, k, v, *, scale=None, softmax_dim=-1, swap=False, values="v", plain_t=False):
    kt = k.T if plain_t else k.transpose(-2, -1)
    scores = (k @ q.transpose(-2, -1) if swap else q @ kt) / (math.sqrt(q.shape[-1]) if scale is None else scale)
    weights = torch.softmax(scores, softmax_dim)
    return weights @ (k if values == "k" else v), weights


def test_attention_accepts_a_right_answer(capsys):
    ch02.check_attention(attention)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("fn, message", [
    (lambda q, k, v: attention(q, k, v, scale=1.0), r"^B=1, L=1 query, S=3 keys, d=2, dv=3: your attention did not "
     r"scale the scores: divide q k\^T by sqrt\(d\)"),
    (lambda q, k, v: attention(q, k, v, scale=q.shape[-1]), r"divided the scores by d; the scale is sqrt\(d\)"),
    (lambda q, k, v: attention(q, k, v, scale=math.sqrt(v.shape[-1])), r"divided the scores by sqrt\(dv\)"),
    (lambda q, k, v: attention(q, k, v, scale=math.sqrt(k.shape[-2])), r"divided the scores by sqrt\(S\)"),
    (lambda q, k, v: attention(q, k, v, softmax_dim=-2), r"normalised over the queries \(softmax dim=-2\)"),
    (lambda q, k, v: attention(q, k, v, swap=True), r"computes k q\^T: row i must be query i"),
    (lambda q, k, v: attention(q, k, v, values="k"), "averaged the keys: the output is weights @ v"),
    (lambda q, k, v: attention(q, k, v, plain_t=True), r"uses k.T: on a 3-D tensor .* k.transpose\(-2, -1\)"),
    (lambda q, k, v: (attention(q, k, v)[0] * 2, attention(q, k, v)[1]), r"your attention's output differs at"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1] * 0.5), r"tensor of weights differs .* got 0.5"),
    (lambda q, k, v: attention(q, k, v)[0], r"returns the output alone: return the pair \(output, weights\)"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1][0]), r"tensor of weights has shape \(1, 1\), "
     r"expected \(1, 1, 1\)"),
    (lambda q, k, v: 1 / 0, "your attention raised ZeroDivisionError"),
])
@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")  # the mistake under test
def test_attention_names_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch02.check_attention(fn)


def test_attention_weights_divided_after_the_softmax_are_named_as_such_not_as_a_softmax_axis():
    def after(q, k, v):
        weights = torch.softmax(q @ k.mT, -1) / math.sqrt(q.shape[-1])
        return weights @ v, weights
    with pytest.raises(ExerciseError, match=r"divided the WEIGHTS by sqrt\(d\), after the softmax") as err:
        ch02.check_attention(after)
    assert "dim=-2" not in str(err.value) and "BATCH" not in str(err.value)


def test_attention_cases_leave_every_size_free():
    sizes = [(*q.shape, k.shape[1], v.shape[2]) for q, k, v in (c.args for c in ch02.ATTENTION.cases)]  # B, L, d, S, dv
    assert (1, 1, 1, 1, 1) in sizes and any(L != S for _, L, _, S, _ in sizes) and any(L == S > 1 for _, L, _, S, _ in sizes)
    assert all(len({s[i] for s in sizes}) > 2 for i in range(5))  # B, L, S, d, dv: each takes three values or more


# ---------------------------------------------------------------------------------------------------------
# Chapter 3: the padding mask of a batch


def padding(lengths, max_len, *, compare=">=", polarity="ignore", query_axis=True, shape=None, dtype=None):
    positions = torch.arange(max(lengths) if shape == "max" else max_len)[None, :]
    lens = torch.tensor(lengths)[:, None]
    mask = {">=": positions >= lens, ">": positions > lens, ">=-1": positions >= lens - 1}[compare]  # (B, S)
    mask = ~mask if polarity == "keep" else mask
    if shape == "rows":
        mask = mask[:, :, None]
    elif shape == "expanded":
        mask = mask[:, None, :].expand(-1, max_len, -1)
    elif query_axis:
        mask = mask[:, None, :]
    return mask if dtype is None else mask.to(dtype)


def test_padding_mask_accepts_a_right_answer(capsys):
    ch03.check_padding_mask(padding)
    ch03.check_padding_mask(lambda lengths, max_len: __import__("attention_course").padding_mask(
        lengths, max_len)[:, None, :])
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(polarity="keep"), "True at the REAL tokens.*allow \\(or keep\\) mask"),
    (dict(compare=">"), "misses the first pad.*not >"),
    (dict(compare=">=-1"), "also hides the last real token"),
    (dict(query_axis=False), "the key padding mask itself.*mask\\[:, None, :\\]"),
    (dict(shape="rows"), "\\(B, S, 1\\).*the QUERIES"),
    (dict(shape="expanded"), "already expanded over the queries"),
    (dict(shape="max"), "max\\(lengths\\) columns.*max_len = 6"),
    (dict(dtype=torch.long), "dtype torch.int64, numbers; an ignore mask is bool.*1 at the pads"),
])
def test_padding_mask_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch03.check_padding_mask(lambda lengths, max_len: padding(lengths, max_len, **options))


def test_padding_mask_reports_any_other_difference():
    def one_wrong(lengths, max_len):
        mask = padding(lengths, max_len).clone()
        mask[1, 0, 0] = True
        return mask
    with pytest.raises(ExerciseError, match="differs from the padding at 1 positions, e.g. .* \\(1, 0, 0\\)"):
        ch03.check_padding_mask(one_wrong)


# ---------------------------------------------------------------------------------------------------------
# Chapter 3: masked softmax


def test_masked_softmax_accepts_a_right_answer(capsys):
    ch03.check_masked_softmax(masked)
    ch03.check_masked_softmax(masked_softmax)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(apply=False), "puts weight up to 0\\.\\d\\d on pad positions: the mask was not applied"),
    (dict(after=True, zero_empty=False), "you zeroed the pads AFTER the softmax"),
    (dict(renormalise=True, zero_empty=False), "returns NaN or inf.*renormalise"),
    (dict(inverted=True), "the weight on the pads and none on the real tokens.*inverted polarity"),
    (dict(inverted=True, zero_empty=False), "sentence WITHOUT pads gets NaN.*inverted polarity"),
    (dict(fill=-1e9), "puts weight 1\\.00 on the masked key: a large finite fill like -1e4 or -1e9"),
    (dict(zero_empty=False), "all masked gives NaN"),
    (dict(dim=-2, zero_empty=False), "sum to 1 down the columns: softmax ran over the queries.*softmax\\(\\.\\.\\., dim=-1\\)"),
    (dict(fill=-5.0), "weight up to .* on pad positions.*finite fill.*before the softmax"),
    (dict(query_axis=True), "masks whole query ROWS.*QUERY axis.*\\(B, 1, S\\) mask as it comes"),
    (dict(added=True), "ADDED the bool mask.*masked_fill"),
])
def test_masked_softmax_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch03.check_masked_softmax(lambda s, m: masked(s, m, **options))


def test_masked_softmax_names_a_uniform_fully_masked_row():
    def uniform_when_empty(scores, mask):  # right everywhere except the fully masked row
        weights = masked(scores, mask, zero_empty=False)
        return torch.where(mask.all(-1, keepdim=True), 1.0 / scores.shape[-1], weights)
    with pytest.raises(ExerciseError, match="summing to 1\\.00: .* should all be 0"):
        ch03.check_masked_softmax(uniform_when_empty)


def test_masked_softmax_rejects_wrong_shapes():
    with pytest.raises(ExerciseError, match="your weights has shape \\(3, 4\\), expected the shape of scores"):
        ch03.check_masked_softmax(lambda s, m: masked(s, m).sum(-1))
