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
    ch04.check_self_attention(lambda *a: attention(*a, where=True))
    assert capsys.readouterr().out.count("Correct") == 2


def test_self_attention_rejects_a_minus_1e9_fill_where_every_real_score_is_lower():
    with pytest.raises(ExerciseError, match=r"^B=1, L=6, D=4, lengths \[4\], every score about -1e10: your attention "
                                            r"filled the padded keys' scores with -1e9, a finite score"):
        ch04.check_self_attention(lambda *a: attention(*a, fill=-1e9))


@pytest.mark.parametrize("options, message", [
    (dict(scale=1.0), r"^B=1, L=3, D=2, lengths \[3\]: your attention did not scale the scores"),
    (dict(scale=6.0), None),  # right for D = 6 only: described, not named
    (dict(fill=-1e9, inverted=True), r"the mask is inverted.*not -1e9"),
    (dict(inverted=True), r"^B=1, L=3, D=2, lengths \[3\]: your attention masked the real tokens .* inverted"),
    (dict(no_mask=True), "the mask was not applied"),
    (dict(mask_rows=True), r"masked the padded QUERIES.*never whole query rows.$"),
    (dict(mask_rows=True, fill=-1e9), r"masked the padded QUERIES.*not -1e9"),
    (dict(softmax_dim=1), r"normalised over the queries \(softmax dim=-2\)"),
    (dict(transpose_w=True), "used x @ W.T"),
    (dict(swap_qk=True), r"computed the scores K Q\^T \(or W_q and W_k swapped\)"),
    (dict(out_from_x=True), "averaged x: the output is weights @ V"),
    (dict(after=0.0), r"^B=3, L=4, D=3, lengths \[4, 1, 2\]: your attention applied the mask AFTER the softmax"),
    (dict(after="multiply"), "applied the mask AFTER the softmax"),
    (dict(after=float("-inf")), r"^B=3, L=4, D=3, lengths \[4, 1, 2\]: your attention's out has NaN and inf at 24 of "
                                r"36 entries where the right answer is finite, all of them at indices \[1, 2\] of axis 0.$"),  # padded
    (dict(k_dot_T=True), r"used K.T, which reverses ALL the axes.*Q @ K.transpose\(-2, -1\)"),
    (dict(raw_mask=True), r"used the \(B, S\) mask as it is: key_padding_mask\[:, None, :\]"),
    (dict(raw_mask=True, where=True), r"used the \(B, S\) mask as it is"),
])
def test_self_attention_names_each_mistake(options, message):
    with pytest.raises(ExerciseError, match=message or r"^B=1, L=3, D=2, lengths \[3\]: your attention's out differs"):
        ch04.check_self_attention(lambda *a: attention(*a, **options))


def test_self_attention_rejects_wrong_shapes_types_and_randomness():
    with pytest.raises(ExerciseError, match=r"returns out alone: return the pair \(out, weights\)"):
        ch04.check_self_attention(lambda *a: attention(*a)[0])
    with pytest.raises(ExerciseError, match=r"tensor of weights has shape \(3, 4\), expected \(3, 4, 4\)"):
        ch04.check_self_attention(lambda *a: (attention(*a)[0], attention(*a)[1].sum(-1)))
    with pytest.raises(ExerciseError, match="raised ZeroDivisionError"):
        ch04.check_self_attention(lambda *a: 1 / 0)
    with pytest.raises(ExerciseError, match="different results for the same inputs.*dropout"):
        ch04.check_self_attention(lambda *a: (lambda o, w: (o, torch.nn.functional.dropout(w, 0.5)))(*attention(*a)))


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
    (dict(transpose=False), r"^D=2: your load_into_torch copies W_q, W_k and W_v without transposing"),
    (dict(order=("k", "q", "v")), r"^D=1: your load_into_torch puts W_k.T in the W_q block and W_q.T in the W_k block"),
    (dict(biases=False), r"^D=2: your load_into_torch's in_proj_bias differs at 6 of 6 entries"),  # out_proj.bias too
    (dict(out_proj=False), r"^D=1: your load_into_torch leaves out_proj.weight as it was"),
    (dict(transpose_out=False), r"^D=2: your load_into_torch's out_proj.weight is the transpose of the right one"),
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

    with pytest.raises(ExerciseError, match=r"in_proj_weight has shape \(2, 6\), expected \(6, 2\): the right sizes in another order \(.*\), but not the right one"):
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
     r"^x of shape \(1, 2, 3\), num_heads=3, d=1: your split reshaped to \(B, h, L, d\) without transposing"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], -1, h).permute(0, 3, 1, 2), r"every h-th feature \(strided\)"),
    (lambda x, h: split_right(x, h).flatten(0, 1), r"flat \(B\*h, L, d\) layout"),
    (lambda x, h: x.reshape(x.shape[0], x.shape[1], h, -1), r"returns \(B, L, h, d\): the heads are still after the tokens"),
    (lambda x, h: split_right(x, h)[:, :, :, :1], r"^x of shape \(2, 2, 8\), num_heads=4, d=2: your split's result has "
                                                  r"shape \(2, 4, 2, 1\), expected \(2, 4, 2, 2\): axis 3 alone differs, of size 1 where 2"),  # no size 1 in the right shape
    (lambda x, h: split_right(x, h).flip(2), r"right slices along axis 2 in another order: .* \[1, 0\] \(reversed\)"),
    (lambda x, h: split_right(x, h) + 0.5, r"plus the same 0.5 at every entry"),
    (lambda x, h: x.reshape(2, 4, 2, 4).transpose(1, 2), r"raised RuntimeError.*Print x.shape"),  # hard-coded sizes
    (lambda x, h: [1, 2], r"result is a list, expected a torch.Tensor"),
])
def test_split_heads_names_each_mistake(wrong, message):
    with pytest.raises(ExerciseError, match=message):
        ch05.check_split_heads(wrong)


def test_split_and_merge_cases_take_h_from_1_to_D():
    sizes = {(c.args[0].shape[2], c.args[1]) for c in ch05.SPLIT.cases}  # (D, h)
    assert any(h == 1 < D for D, h in sizes) and any(h == D > 1 for D, h in sizes) and len({h for _, h in sizes}) >= 4
    assert [tuple(c.args[0].shape) for c in ch05.MERGE.cases] == [
        (B, h, L, D // h) for B, L, D, h in sorted(ch05.SIZES, key=lambda s: s[0] * s[1] * s[2])]


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
     r"^x of shape \(1, 3, 2, 1\), num_heads=3, D=3: your merge reshaped \(B, h, L, d\) to \(B, L, D\) without transposing"),
    (lambda x: x.transpose(1, 2).view(x.shape[0], x.shape[2], -1), r"RuntimeError.*call .contiguous\(\) before .view"),
    (lambda x: x.permute(0, 2, 3, 1).reshape(x.shape[0], x.shape[2], -1), r"interleaved"),
    (lambda x: x.transpose(1, 2), r"returns \(B, L, h, d\): the transpose is done; now join the last two axes"),
    (lambda x: merge_right(x).flip(1), r"right slices along axis 1 in another order: .* \[1, 0\] \(reversed\)"),
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
    (dict(invert=True), "your function is inverted: nn.MultiheadAttention's masks are True = blocked"),
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
    with pytest.raises(ExerciseError, match=r"shape \(2, 3, 5, 4\), expected \(2, 3, 4, 5\): the right one with its axes "
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
    (dict(invert=True, fill=-1e9), r"fills with -1e9 and the mask polarity is inverted"),
    (dict(softmax_dim=-2), r"ran the softmax over the queries \(dim=-2.*softmax\(scores, dim=-1\)"),
    (dict(softmax_dim=1), r"ran the softmax over the heads \(dim=1"),
    (dict(softmax="naive"), r"large scores \(inputs scaled by 30\): your layer takes exp\(s\) without subtracting the max"),
    (dict(merge="view"), r"raised RuntimeError: view size is not compatible.*call .contiguous\(\) before .view, "
                         r"or use .reshape"),
    (dict(fill=-1e9), r"rows with no key.*a finite fill"),
    (dict(softmax="nan_to_num", additive=True), r"no key.*gradients stay NaN.*BEFORE the softmax"),
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
