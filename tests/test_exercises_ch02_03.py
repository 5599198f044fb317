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
    (lambda s, dim=-1: -softmax(s, dim), r"your softmax's result is -1 times the right one at every entry.$"),
    (lambda s, dim=-1: softmax(2 * s, dim), r"^two rows 1000 apart, shape \(2, 5\): your softmax's result differs at 10 "
     r"of 10 entries, whole rows \[0, 1\]"),
    (lambda s, dim=-1: softmax(s, dim)[0], r"result has shape \(3,\), expected \(2, 3\): an axis of size 2 missing"),
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
    (lambda q, k, v: (attention(q, k, v)[0] * 2, attention(q, k, v)[1]), r"your attention's output is 2 times the right one at every entry"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1] * 0.5), r"tensor of weights is 0.5 times the right one"),
    (lambda q, k, v: attention(q, k, v)[0], r"returns the output alone: return the pair \(output, weights\)"),
    (lambda q, k, v: (attention(q, k, v)[0], attention(q, k, v)[1][0]), r"tensor of weights has shape \(4, 4\), "
     r"expected \(3, 4, 4\)"),
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
    assert (1, 1, 6, 1, 1) in sizes  # one query, one key; d = 6, the chapter's, as in 2 more cases
    assert any(L != S for _, L, _, S, _ in sizes) and any(L == S > 1 for _, L, _, S, _ in sizes)
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
    (dict(polarity="keep"), r"^lengths \[3\], max_len = 5: your padding mask's result is the opposite of the right one "
                            r"at every entry: True where it should be False \(the polarity swapped\).$"),
    (dict(compare=">"), "misses the first pad.*not >"),
    (dict(compare=">=-1"), "also hides the last real token"),
    (dict(query_axis=False), r"returns \(B, S\), the key padding mask itself.*mask\[:, None, :\]"),
    (dict(shape="rows"), r"returns \(B, S, 1\): that axis is the QUERIES"),
    (dict(shape="expanded"), "already expanded over the queries"),
    (dict(shape="max"), r"^lengths \[3\], max_len = 5: your padding mask has max\(lengths\) columns"),
    (dict(dtype=torch.long), "result is int64, expected bool: a mask of numbers is not a selection"),
])
def test_padding_mask_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch03.check_padding_mask(lambda lengths, max_len: padding(lengths, max_len, **options))


def test_padding_mask_reports_any_other_difference():
    def one_wrong(lengths, max_len):
        mask = padding(lengths, max_len).clone()
        mask[-1, 0, 0] = len(lengths) == 4  # right for one, two and three sentences, wrong for four
        return mask
    with pytest.raises(ExerciseError, match=r"^lengths \[5, 2, 4, 1\], max_len = 5: your padding mask's result differs "
                                            r"at 1 of 20 entries, e.g. at \[3, 0, 0\]: expected False, got True.$"):
        ch03.check_padding_mask(one_wrong)


def test_padding_mask_cases_cover_one_sentence_no_pad_and_padding_beyond_the_longest():
    cases = [c.args for c in ch03.PADDING_MASK.cases]
    assert any(len(n) == 1 for n, _ in cases) and any(s == max(n) for n, s in cases) and any(s > max(n) for n, s in cases)
    assert any(min(n) == 1 for n, _ in cases) and len({len(n) for n, _ in cases}) >= 3


# ---------------------------------------------------------------------------------------------------------
# Chapter 3: masked softmax


def test_masked_softmax_accepts_a_right_answer(capsys):
    ch03.check_masked_softmax(masked)
    ch03.check_masked_softmax(masked_softmax)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(apply=False), r"^scores around -1e10, the masked key highest, scores \(1, 1, 3\), mask \[\[\[0, 0, 1\]\]\]: "
                        r"your masked softmax puts weight on the masked keys: the mask was not applied"),
    (dict(after=True, zero_empty=False), "zeroed the pads AFTER the softmax"),
    (dict(renormalise=True, zero_empty=False), r"renormalised: .* 0 / 0 = NaN"),
    (dict(inverted=True), r"inverted polarity. Here True = IGNORE .* mask where the mask is True.$"),
    (dict(inverted=True, zero_empty=False), r"inverted polarity.*And a row whose keys are all masked gets NaN"),
    (dict(fill=-1e9), r"fills the masked scores with -1e9, a finite fill"),
    (dict(fill=-1e4), r"fills the masked scores with -1e4, a finite fill"),
    (dict(zero_empty=False), r"^one key, masked, .*: your masked softmax gives NaN on a row whose keys are all masked"),
    (dict(dim=-2, zero_empty=False), r"softmax ran over the queries.*softmax\(\.\.\., dim=-1\).*gets NaN"),
    (dict(query_axis=True), r"masks whole query ROWS.*QUERY axis.*\(B, 1, S\) mask as it comes"),
    (dict(added=True), "ADDED the bool mask.*masked_fill"),
])
def test_masked_softmax_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch03.check_masked_softmax(lambda s, m: masked(s, m, **options))


def test_masked_softmax_describes_a_uniform_fully_masked_row_and_a_small_fill():
    def uniform_when_empty(scores, mask):  # right everywhere except the fully masked row
        weights = masked(scores, mask, zero_empty=False)
        return torch.where(mask.all(-1, keepdim=True), 1.0 / scores.shape[-1], weights)
    with pytest.raises(ExerciseError, match=r"gives a row whose keys are all masked equal weights, 1/S"):
        ch03.check_masked_softmax(uniform_when_empty)
    with pytest.raises(ExerciseError, match=r"differs at 6 of 6 entries, all of them in the rows that have a masked key"):
        ch03.check_masked_softmax(lambda s, m: masked(s, m, fill=-5.0))


def test_masked_softmax_rejects_wrong_shapes():
    with pytest.raises(ExerciseError, match=r"result has shape \(2, 2\), expected \(2, 2, 3\)"):
        ch03.check_masked_softmax(lambda s, m: masked(s, m).sum(-1))
