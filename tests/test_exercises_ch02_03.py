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
    (lambda s, dim=-1: softmax(s, dim, shift=None), "NaN or inf for scores around 1000.*subtract each row's maximum"),
    (lambda s, dim=-1: softmax(s, dim, shift="global"), "subtracted ONE maximum for the whole tensor"),
    (lambda s, dim=-1: softmax(s, dim, ignore_dim=True), "ignores its `dim`"),
    (lambda s, dim=-1: softmax(s, 0), "sum to 1 down each COLUMN"),
    (lambda s, dim=-1: softmax(s, dim, shift=None, use_exp=False), "divided the scores by their sum without .*exp"),
    (lambda s, dim=-1: softmax(s, dim, normalise=False), "took exp but did not divide"),
    (lambda s, dim=-1: softmax(s, dim, keepdim=False), "forget keepdim=True"),
    (lambda s, dim=-1: -softmax(s, dim), "negative weights"),
    (lambda s, dim=-1: softmax(s, dim) * 0.5, "do not sum to 1"),
    (lambda s, dim=-1: softmax(2 * s, dim), "are not softmax\\(scores\\)"),
    (lambda s, dim=-1: softmax(s, dim)[0], "the result has shape \\(5,\\), expected the shape of scores"),
    (lambda s, dim=-1: s.tolist(), "must return a torch.Tensor"),
])
def test_softmax_names_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch02.check_softmax(fn)


def test_softmax_with_a_large_shift_only_right_on_small_scores_is_named():
    def shifted_by_1000(s, dim=-1):  # right for scores near 0, wrong (not NaN) around 1000
        return torch.softmax(s.clamp(max=500.0), dim)
    with pytest.raises(ExerciseError, match="for scores around 1000 your weights differ"):
        ch02.check_softmax(shifted_by_1000)


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
    (lambda q, k, v: attention(q, k, v, scale=1.0), "did not scale the scores: divide q k\\^T by sqrt\\(d\\)"),
    (lambda q, k, v: attention(q, k, v, scale=4.0), "divided the scores by d; the scale is sqrt\\(d\\)"),
    (lambda q, k, v: attention(q, k, v, scale=math.sqrt(6)), "divided by sqrt\\(dv\\)"),
    (lambda q, k, v: attention(q, k, v, scale=math.sqrt(5)), "divided by sqrt\\(S\\)"),
    (lambda q, k, v: attention(q, k, v, softmax_dim=-2), "COLUMNS sum to 1"),
    (lambda q, k, v: attention(q, k, v, swap=True), "raised RuntimeError .* its weights are those of k q\\^T"),
    (lambda q, k, v: (torch.zeros(1), torch.softmax(k @ q.mT / 2, -1)), "the transpose of \\(B, L, S\\): you computed k q\\^T"),
    (lambda q, k, v: attention(q, k, v, values="k"), "you averaged the keys"),
    (lambda q, k, v: attention(q, k, v, plain_t=True), "works on one sentence .* k.transpose\\(-2, -1\\)"),
    (lambda q, k, v: (attention(q, k, v)[0] * 2, attention(q, k, v)[1]), "weights are right but the output is not"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1] * 0.5), "rows of your weights do not sum to 1"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(3 * q, k, v)[1]), "weights are not softmax\\(q k\\^T / sqrt"),
    (lambda q, k, v: attention(q, k, v)[0], "return a pair"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1][0]), "weights has shape \\(3, 5\\), expected"),
    (lambda q, k, v: 1 / 0, "raised ZeroDivisionError on a batch"),
])
@pytest.mark.filterwarnings("ignore:The use of `x.T`:UserWarning")  # the mistake under test
def test_attention_names_each_mistake(fn, message):
    with pytest.raises(ExerciseError, match=message):
        ch02.check_attention(fn)


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
