"""The exercise checkers of chapters 4-6: each accepts a right answer and rejects each typical wrong answer
with the diagnostic it promises (what is wrong and where to look), not just "wrong"."""
import math
import warnings

import pytest
import torch

from attention_course.exercises import ExerciseError
from attention_course.exercises import ch04

# ---------------------------------------------------------------------------------------------------------
# Chapter 4: self-attention step by step


def attention(x, W_q, W_k, W_v, key_padding_mask, *, fill=float("-inf"), scale=None, inverted=False,
              mask_rows=False, no_mask=False, softmax_dim=-1, transpose_w=False, swap_qk=False, out_from_x=False,
              after=None, k_dot_T=False, raw_mask=False, where=False):
    if transpose_w:
        W_q, W_k, W_v = W_q.T, W_k.T, W_v.T
    Q, K, V = x @ W_q, x @ W_k, x @ W_v
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # x.T on a 3-D tensor is deprecated
        K_T = K.T if k_dot_T else K.transpose(-2, -1)
    scores = K @ Q.transpose(-2, -1) if swap_qk else Q @ K_T
    scores = scores / (math.sqrt(x.shape[-1]) if scale is None else scale)
    mask = key_padding_mask[:, :, None] if mask_rows else key_padding_mask[:, None, :]
    mask = key_padding_mask if raw_mask else mask  # (B, S) where (B, 1, S) goes
    if where:
        scores = torch.where(mask, fill, scores)
    elif not no_mask and after is None:
        scores = scores.masked_fill(~mask if inverted else mask, fill)
    weights = torch.softmax(scores, dim=softmax_dim)
    if after == "multiply":
        weights = weights * ~mask
    elif after is not None:  # the mask applied to the weights, after the softmax
        weights = weights.masked_fill(mask, after)
    return weights @ (x if out_from_x else V), weights


def test_self_attention_accepts_a_right_answer(capsys):
    ch04.check_self_attention(attention)
    ch04.check_self_attention(lambda *a: attention(*a, fill=-1e9))  # a large finite fill is fine here
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(scale=1.0), "not scaled: divide Q K\\^T by sqrt\\(D\\)"),
    (dict(scale=6.0), "divided by D; the scale is sqrt\\(D\\)"),
    (dict(fill=-1e9, inverted=True), "the mask is inverted"),
    (dict(inverted=True), "contain NaN and the padded keys get the weight.*inverted"),
    (dict(no_mask=True), "the mask was not applied"),
    (dict(mask_rows=True), "contain NaN.*never whole query rows"),
    (dict(mask_rows=True, fill=-1e9), "masked the padded QUERIES"),
    (dict(softmax_dim=1), "COLUMNS sum to 1"),
    (dict(transpose_w=True), "you used x @ W.T"),
    (dict(swap_qk=True), "your scores are K Q\\^T, not Q K\\^T"),
    (dict(out_from_x=True), "output is weights @ x"),
    (dict(after=0.0), r"the mask was applied AFTER the softmax \(weights differ by up to 0.83.*no longer sum to 1.*"
                      r"Mask the SCORES before the softmax: scores.masked_fill\(key_padding_mask\[:, None, :\]"),
    (dict(after="multiply"), "the mask was applied AFTER the softmax"),
    (dict(after=float("-inf")), r"AFTER the softmax \(weights have -inf at 10 of 50 entries where the right "
                                r"answer's are finite, outputs have NaN, inf and -inf"),
    (dict(after=-1e9), "the mask was applied AFTER the softmax"),
    (dict(k_dot_T=True), r"raised RuntimeError: The size of tensor a \(2\) must match .* -- K.T reverses ALL the "
                         r"axes of a 3-D tensor.*Q @ K.transpose\(-2, -1\)"),
    (dict(raw_mask=True), r"raised RuntimeError: .* -- the key_padding_mask \(B, S\) = \(2, 5\) was applied to the "
                          r"\(B, L, S\) scores as it is.*key_padding_mask\[:, None, :\], \(B, 1, S\)"),
    (dict(raw_mask=True, where=True), r"the key_padding_mask \(B, S\) = \(2, 5\) was applied .* as it is"),
])
def test_self_attention_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch04.check_self_attention(lambda *a: attention(*a, **options))


def test_self_attention_rejects_wrong_shapes_and_types():
    with pytest.raises(ExerciseError, match="return a pair"):
        ch04.check_self_attention(lambda *a: attention(*a)[0])
    with pytest.raises(ExerciseError, match=r"weights has shape \(2, 5\), expected \(B, L, S\)"):
        ch04.check_self_attention(lambda *a: (attention(*a)[0], attention(*a)[1].sum(-1)))
    with pytest.raises(ExerciseError, match="raised ZeroDivisionError"):
        ch04.check_self_attention(lambda *a: 1 / 0)


# ---------------------------------------------------------------------------------------------------------
# Chapter 4: copying hand-made weights into nn.MultiheadAttention


def copy_into(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o, *, transpose=True, order=("q", "k", "v"),
              biases=True, out_proj=True, transpose_out=True):
    mats = {"q": W_q, "k": W_k, "v": W_v}
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([mats[n].T if transpose else mats[n] for n in order]))
        if biases:
            mha.in_proj_bias.copy_(torch.cat([b_q, b_k, b_v]))
            mha.out_proj.bias.copy_(b_o)
        if out_proj:
            mha.out_proj.weight.copy_(W_o.T if transpose_out else W_o)


def test_in_proj_copy_accepts_a_right_answer(capsys):
    ch04.check_in_proj_copy(copy_into)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(transpose=False), r"outputs differ by \d.*in_proj_weight\[0:4\] \(the W_q block\) holds W_q itself, not "
                            r"W_q.T: did you copy W_q without transposing\?"),
    (dict(order=("k", "q", "v")), r"in_proj_weight\[0:4\] \(the W_q block\) holds W_k.T instead of W_q.T"),
    (dict(biases=False), "in_proj_bias was not copied.*biases are zero"),
    (dict(out_proj=False), "outputs differ by .*out_proj.weight was not copied"),
    (dict(transpose_out=False), "out_proj.weight holds W_o, not W_o.T"),
])
def test_in_proj_copy_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch04.check_in_proj_copy(lambda *a: copy_into(*a, **options))


def test_in_proj_copy_explains_no_grad():
    def without_no_grad(mha, W_q, W_k, W_v, *rest):
        mha.in_proj_weight.copy_(torch.cat([W_q.T, W_k.T, W_v.T]))

    with pytest.raises(ExerciseError, match="inside `with torch.no_grad\\(\\):`"):
        ch04.check_in_proj_copy(without_no_grad)


def test_in_proj_copy_rejects_a_replaced_parameter_of_the_wrong_shape():
    def replace(mha, W_q, W_k, W_v, *rest):
        mha.in_proj_weight = torch.nn.Parameter(torch.cat([W_q.T, W_k.T, W_v.T], dim=1))

    with pytest.raises(ExerciseError, match=r"in_proj_weight now has shape \(4, 12\).*\(12, 4\)"):
        ch04.check_in_proj_copy(replace)


# ---------------------------------------------------------------------------------------------------------
# Chapter 5: splitting and merging heads

from attention_course.exercises import ch05  # noqa: E402


def split_right(x, h):
    B, L, D = x.shape
    return x.reshape(B, L, h, D // h).transpose(1, 2)


def test_split_heads_accepts_right_answers(capsys):
    ch05.check_split_heads(split_right)
    ch05.check_split_heads(lambda x, h: x.view(x.shape[0], x.shape[1], h, -1).permute(0, 2, 1, 3).contiguous())
    assert capsys.readouterr().out.count("Correct") == 2


@pytest.mark.parametrize("wrong, message", [
    (lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1),
     r"right shape \(2, 2, 4, 4\) .* head 0's row 1 of sentence 0 holds token 0's features 4..7 \(sentence 0\) "
     r"instead of token 1's features 0..3: you reshaped to \(B, h, L, d\) \(or to \(B\*h, L, d\)\) without transposing"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).permute(0, 3, 1, 2),
     r"holds token 0's features \[0, 2, 4, 6\].*every h-th feature \(strided\)"),
    (lambda x, h: split_right(x, h).flatten(0, 1), r"shape \(4, 4, 4\).*flat \(B\*h, L, d\) layout"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1), r"shape \(2, 4, 2, 4\).*Add .transpose\(1, 2\)"),
    (lambda x, h: split_right(x, h)[:, :, :, :1], r"holds 16 numbers, the input 64"),
    (lambda x, h: split_right(x, h).flip(2), r"head 0's row 0 of sentence 0 holds token 3's features 0..3"),
    (lambda x, h: split_right(x, h) + 0.5, r"not elements of the input"),
    (lambda x, h: x.reshape(2, 4, 2, 4).transpose(1, 2), r"raised RuntimeError"),  # hard-coded for the first shape
    (lambda x, h: [1, 2], r"must return a torch.Tensor"),
])
def test_split_heads_names_each_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        ch05.check_split_heads(wrong)


def merge_right(x):
    B, h, L, d = x.shape
    return x.transpose(1, 2).reshape(B, L, h * d)


def test_merge_heads_accepts_right_answers(capsys):
    ch05.check_merge_heads(merge_right)
    ch05.check_merge_heads(lambda x: x.transpose(1, 2).contiguous().view(x.shape[0], x.shape[2], -1))
    ch05.check_merge_heads(lambda x: x.permute(0, 2, 1, 3).flatten(2))
    assert capsys.readouterr().out.count("Correct") == 3


@pytest.mark.parametrize("wrong, message", [
    (lambda x: x.reshape(x.shape[0], x.shape[2], -1),
     r"token 0 of sentence 0 holds features of several tokens.*straight to \(B, L, D\) without transposing"),
    (lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), r"RuntimeError.*\.contiguous\(\)\.view"),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), r"interleaved"),
    (lambda x: x.transpose(1, 2), r"shape \(2, 4, 2, 4\).*join the last two axes with .flatten\(2\)"),
    (lambda x: merge_right(x).flip(1), r"token 0 of sentence 0 holds token 3's features 0..7"),
])
def test_merge_heads_names_each_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        ch05.check_merge_heads(wrong)


# ---------------------------------------------------------------------------------------------------------
# Chapter 6: combining masks

from attention_course.exercises import ch06  # noqa: E402


def combine(kpm, attn_mask, B, h, L, S, *, op="or", head_major=False, invert=False, expand=True, drop=None):
    parts = []
    if kpm is not None and drop != "kpm":
        parts.append(kpm.view(B, 1, 1, S))
    if attn_mask is not None and drop != "attn":
        if attn_mask.ndim == 2:
            parts.append(attn_mask.view(1, 1, L, S))
        else:
            parts.append(attn_mask.view(h, B, L, S).transpose(0, 1) if head_major else attn_mask.view(B, h, L, S))
    mask = parts[0] if parts else torch.zeros(1, 1, L, S, dtype=torch.bool)
    for part in parts[1:]:
        mask = (mask & part) if op == "and" else (mask | part)
    mask = ~mask if invert else mask
    return mask.expand(B, h, L, S) if expand else mask


def test_combine_masks_accepts_a_right_answer(capsys):
    ch06.check_combine_masks(combine)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(invert=True), "your function is inverted, True where attending is allowed"),
    (dict(op="and"), r"combined the masks with & \(and\)"),
    (dict(head_major=True), r"attn_mask \(B\*h, L, S\): your function unflattened the 3-D attn_mask head-major"),
    (dict(expand=False), r"has shape \(1, 1, 4, 5\), expected \(2, 3, 4, 5\)"),  # described: no catalogue start
    (dict(drop="kpm"), r"attn_mask None: your function's result differs .* where the key_padding_mask alone blocks"),
    (dict(drop="attn"), "all of them where the attn_mask alone blocks"),
])
def test_combine_masks_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch06.check_combine_masks(lambda *a: combine(*a, **options))


def test_combine_masks_rejects_float_and_misplaced_padding():
    with pytest.raises(ExerciseError, match="is float32, expected bool"):
        ch06.check_combine_masks(lambda *a: combine(*a).float())
    with pytest.raises(ExerciseError, match=r"shape \(2, 3, 5, 4\), expected \(2, 3, 4, 5\): the right sizes with the axes "
                                            r"in another order"):
        ch06.check_combine_masks(lambda *a: combine(*a).transpose(-2, -1))


# ---------------------------------------------------------------------------------------------------------
# Chapter 6: the whole layer

import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402


def safe_softmax(scores, dim):
    empty = torch.isneginf(scores).all(dim, keepdim=True)
    return torch.softmax(scores.masked_fill(empty, 0.0), dim).masked_fill(empty, 0.0)


SOFTMAX = {
    "torch": torch.softmax,
    "naive": lambda s, dim: s.exp() / s.exp().sum(dim, keepdim=True),  # no max subtracted: overflows
    "safe": safe_softmax,  # the course's layer: zeros in rows with no key
    "nan_to_num": lambda s, dim: torch.softmax(s, dim).nan_to_num(0.0),  # zeros forward, NaN backward
}


class MHA(nn.Module):
    """A correct multi-head layer, with switches for the typical mistakes."""

    def __init__(self, D, h, *, in_bias=True, out_bias=True, scale_D=False, no_transpose=False, flat_weights=False,
                 no_average=False, use_L_for_keys=False, invert=False, detach=False, always_weights=False,
                 fill=float("-inf"), softmax_dim=-1, softmax="torch", merge="reshape", dropout=0.0, drop=None,
                 additive=False):
        super().__init__()
        self.D, self.h, self.dropout = D, h, dropout
        self.in_proj_weight = nn.Parameter(torch.empty(3 * D, D))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * D))
        self.out_proj = nn.Linear(D, D)
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.opts = dict(in_bias=in_bias, out_bias=out_bias, scale_D=scale_D, no_transpose=no_transpose,
                         flat_weights=flat_weights, no_average=no_average, use_L_for_keys=use_L_for_keys,
                         invert=invert, detach=detach, always_weights=always_weights, fill=fill,
                         softmax_dim=softmax_dim, softmax=softmax, merge=merge, drop=drop,
                         additive=additive)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        o, D, h = self.opts, self.D, self.h
        B, L, _ = query.shape
        S = L if o["use_L_for_keys"] else key.shape[1]
        d = D // h
        W = self.in_proj_weight.detach() if o["detach"] else self.in_proj_weight
        bias = self.in_proj_bias.chunk(3) if o["in_bias"] else (None, None, None)
        q, k, v = (F.linear(t, w, bb) for t, w, bb in zip((query, key, value), W.chunk(3), bias))
        split = (lambda t, n: t.reshape(B, h, n, d)) if o["no_transpose"] else \
            (lambda t, n: t.reshape(B, n, h, d).transpose(1, 2))
        q, k, v = split(q, L), split(k, S), split(v, S)
        scores = q @ k.transpose(-2, -1) / math.sqrt(D if o["scale_D"] else d)
        for m, shape in ((key_padding_mask, (B, 1, 1, S)), (attn_mask, None)):
            if m is None:
                continue
            m = m.view(shape) if shape else (m.view(B, h, L, S) if m.ndim == 3 else m)
            if m.dtype == torch.bool and o["additive"]:  # bool masks as -inf added to the scores
                scores = scores + torch.zeros(m.shape, dtype=scores.dtype).masked_fill(m, float("-inf"))
            elif m.dtype == torch.bool:
                scores = scores.masked_fill(~m if o["invert"] else m, o["fill"])
            else:
                scores = scores + m
        weights = SOFTMAX[o["softmax"]](scores, o["softmax_dim"])
        if o["drop"] is not None:  # "always": F.dropout's default training=True; "train": right
            weights = F.dropout(weights, self.dropout, training=o["drop"] == "always" or self.training)
        heads = (weights @ v).transpose(1, 2)
        out = heads.view(B, L, D) if o["merge"] == "view" else heads.reshape(B, L, D)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias if o["out_bias"] else None)
        if not need_weights and not o["always_weights"]:
            return out, None
        if o["flat_weights"]:
            return out, weights.reshape(B * h, L, S)
        return out, (weights.mean(1) if average_attn_weights and not o["no_average"] else weights)


def test_multihead_accepts_a_right_layer(capsys):
    ch06.check_multihead(MHA)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize("options, message", [
    (dict(in_bias=False), "in_proj_bias is not used"),
    (dict(out_bias=False), "out_proj.bias is not used"),
    (dict(scale_D=True), r"divides the scores by sqrt\(D\).*sqrt\(d\), d = D / h"),
    (dict(no_transpose=True), "splits the heads without the transpose"),
    (dict(invert=True), r"heads of size 1: your layer masks the wrong keys: the mask polarity is inverted"),
    (dict(invert=True, fill=-1e9), r"the mask polarity is inverted \(and the fill is a finite -1e9\)"),
    (dict(softmax_dim=-2), r"ran the softmax over the queries \(dim=-2.*softmax\(scores, dim=-1\)"),
    (dict(softmax_dim=1), r"ran the softmax over the heads \(dim=1"),
    (dict(softmax="naive"), r"large scores \(inputs scaled by 30\): your layer computes exp\(s\) / exp\(s\).sum\(\) "
                            r"without subtracting the max"),
    (dict(merge="view"), r"raised RuntimeError: view size is not compatible.*call .contiguous\(\) before .view, "
                         r"or use .reshape"),
    (dict(fill=-1e9), r"rows with no key.*a finite fill"),
    (dict(softmax="nan_to_num", additive=True), r"no key.*the gradients stay NaN.*finite scores BEFORE the softmax"),
    (dict(dropout=0.1, drop="always"), r"two identical calls of your layer give different outputs: dropout is active in "
                                       r"eval mode.*training=self.training\), or an nn.Dropout"),
    (dict(flat_weights=True), r"flat \(B\*h, L, S\) layout.*\.mean\(dim=1\)"),
    (dict(no_average=True), r"per-head weights by default: average over the heads"),
    (dict(use_L_for_keys=True), r"cross-attention.*split k and v with key.shape\[1\]"),
    (dict(detach=True), "gradient of in_proj_weight is None"),
    (dict(always_weights=True), r"need_weights=False: your layer's attention-weight tensor is a tensor"),
])
def test_multihead_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message):
        ch06.check_multihead(lambda D, h: MHA(D, h, **options))


def test_multihead_accepts_the_safe_softmax_and_dropout_off_in_eval(capsys):
    """Either convention for a query with no key: the course's zeros (a safe softmax) or torch's NaN."""
    assert ch06.convention([ch06.LAYER, ch06.LAYER_SAFE], lambda D, h: MHA(D, h, softmax="safe")) is ch06.LAYER_SAFE
    ch06.check_multihead(lambda D, h: MHA(D, h, softmax="safe"))
    assert capsys.readouterr().out.startswith("Correct")
    ch06.check_multihead(lambda D, h, dropout=0.0: MHA(D, h, dropout=dropout, drop="train"))
    assert capsys.readouterr().out.startswith("Correct")


def test_multihead_tries_a_dropout_argument_in_eval_mode():
    """A layer that takes dropout= is built with dropout=0.5: in eval mode it must not drop."""
    with pytest.raises(ExerciseError, match=r"built with dropout=0.5, in eval mode: two identical calls.*dropout is "
                                            r"active in eval mode.*training=self.training"):
        ch06.check_multihead(lambda D, h, dropout=0.0: MHA(D, h, dropout=dropout, drop="always"))


def test_multihead_explains_missing_parameters():
    class NoBias(MHA):
        def __init__(self, D, h):
            super().__init__(D, h)
            del self.in_proj_bias

    with pytest.raises(ExerciseError, match="do not load into your layer.*'in_proj_weight': \\(6, 2\\)"):
        ch06.check_multihead(NoBias)
