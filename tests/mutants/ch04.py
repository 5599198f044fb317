"""Chapter 4's checkers under mutation: single-head attention by hand, and copying weights into torch's layer."""
import math
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.exercises import ch04
from mutants import Catalogue, Mutant

# ---------------------------------------------------------------------------------------------------------
# check_self_attention: fn(x, W_q, W_k, W_v, key_padding_mask) -> (out, weights)


def attention(x, W_q, W_k, W_v, kpm, *, dim=-1, scale="D", mask="keys", fill=float("-inf"), after=None,
              transpose_w=False, swap_qk=False, k_dot_T=False, v_with="v", returns="pair", dtype=None,
              dropout=0.0, scale_after=False, add_bool=False, weights_T=False):
    """The reference answer; each option is one classic mistake."""
    if transpose_w:
        W_q, W_k, W_v = W_q.T, W_k.T, W_v.T
    if dtype is not None:
        x, W_q, W_k, W_v = (t.to(dtype) for t in (x, W_q, W_k, W_v))
    Q, K = x @ W_q, x @ W_k  # (B, L, D)
    V = {"v": x @ W_v, "k": x @ W_k, "x": x}[v_with]  # (B, S, D)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # K.T on a 3-D tensor is deprecated
        K_T = K.T if k_dot_T else K.transpose(-2, -1)
    scores = K @ Q.transpose(-2, -1) if swap_qk else Q @ K_T  # (B, L, S)
    D, L = x.shape[-1], x.shape[1]
    divisor = {"D": math.sqrt(D), "none": 1.0, "full D": float(D), "L": math.sqrt(L)}[scale]
    if not scale_after:
        scores = scores / divisor
    blocked = {"keys": kpm[:, None, :], "inverted": ~kpm[:, None, :], "queries": kpm[:, :, None],
               "raw": kpm, "none": None}[mask]
    if blocked is not None and after is None:
        scores = scores + blocked if add_bool else scores.masked_fill(blocked, fill)
    weights = torch.softmax(scores, dim=dim)  # (B, L, S)
    if scale_after:
        weights = weights / divisor
    if after == "fill":
        weights = weights.masked_fill(blocked, 0.0)
    elif after == "multiply":
        weights = weights * ~blocked
    if dropout:
        weights = F.dropout(weights, dropout)  # training=True: the default of the functional form
    out = weights @ V  # (B, L, D)
    if weights_T:
        weights = weights.transpose(-2, -1)
    return {"pair": (out, weights), "swapped": (weights, out), "out": out}[returns]


def attention_einsum_fill(x, W_q, W_k, W_v, kpm, fill=float("-inf")):
    """Another style: einsum, torch.where with -inf, softmax written out."""
    Q, K, V = (torch.einsum("bld,de->ble", x, W) for W in (W_q, W_k, W_v))
    scores = torch.einsum("bld,bsd->bls", Q, K) / x.shape[-1] ** 0.5  # (B, L, S)
    scores = torch.where(kpm[:, None, :], torch.tensor(fill, dtype=x.dtype), scores)
    e = (scores - scores.amax(-1, keepdim=True)).exp()
    weights = e / e.sum(-1, keepdim=True)
    return torch.einsum("bls,bsd->bld", weights, V), weights


def attention_einsum(x, W_q, W_k, W_v, kpm):
    return attention_einsum_fill(x, W_q, W_k, W_v, kpm)


def attention_additive(x, W_q, W_k, W_v, kpm):
    """Another style: the padding as an additive float mask, matmul and F.softmax."""
    additive = torch.zeros(kpm.shape, dtype=x.dtype).masked_fill(kpm, float("-inf"))  # (B, S)
    Q, K, V = torch.matmul(x, W_q), torch.matmul(x, W_k), torch.matmul(x, W_v)
    scores = torch.matmul(Q, K.mT) / math.sqrt(Q.size(-1)) + additive.unsqueeze(1)
    weights = F.softmax(scores, dim=2)
    return torch.matmul(weights, V), weights


def wrong(**options):
    return lambda *args: attention(*args, **options)


SELF_ATTENTION = Catalogue(
    ch04.check_self_attention,
    correct={"matmul and masked_fill(-inf)": attention, "einsum, torch.where(-inf), softmax by hand": attention_einsum,
             "additive float mask, F.softmax": attention_additive},
    mutants=[
        Mutant("softmax over the queries (dim=-2)", wrong(dim=-2), (r"normalised over the queries", r"dim=-1"),
               family="queries' softmax"),
        Mutant("softmax over the queries (dim=1)", wrong(dim=1), (r"normalised over the queries", r"dim=-1"),
               family="queries' softmax"),
        Mutant("softmax over the batch (dim=0)", wrong(dim=0), (r"over the batch", r"dim=-1")),
        Mutant("weights returned transposed", wrong(weights_T=True), r"tensor of weights is the transpose of the right one"),
        # the same scores: the checker names both
        Mutant("scores K Q^T", wrong(swap_qk=True), r"K Q\^T", family="K Q^T"),
        Mutant("W_q and W_k swapped", lambda x, q, k, v, m: attention(x, k, q, v, m), r"W_q and W_k",
               family="K Q^T"),
        Mutant("no scale", wrong(scale="none"), r"did not scale"),
        Mutant("divided by D, not sqrt(D)", wrong(scale="full D"), r"divided the scores by D\b", family="wrong scale"),
        Mutant("divided by sqrt(L), not sqrt(D)", wrong(scale="L"), (r"sqrt\(L\)", r"sqrt\(D\)"),
               family="wrong scale"),
        Mutant("scaled after the softmax", wrong(scale_after=True), r"scaled the WEIGHTS"),
        Mutant("mask inverted (-inf)", wrong(mask="inverted"), r"inverted", family="inverted"),
        Mutant("mask inverted (-1e9)", wrong(mask="inverted", fill=-1e9), r"inverted", family="inverted"),
        Mutant("no mask", wrong(mask="none"), r"not applied"),
        Mutant("mask on the queries (-inf)", wrong(mask="queries"), r"query rows", family="queries"),
        Mutant("mask on the queries (-1e9)", wrong(mask="queries", fill=-1e9), r"masked the padded QUERIES",
               family="queries"),
        Mutant("fill -1e9 instead of -inf", wrong(fill=-1e9), r"filled the padded keys' scores with -1e9",
               family="finite fill"),
        Mutant("torch.where(-1e9)", lambda *a: attention_einsum_fill(*a, fill=-1e9),
               r"filled the padded keys' scores with -1e9", family="finite fill"),
        Mutant("fill 0 instead of -inf", wrong(fill=0.0), r"filled the padded keys' scores with 0"),
        Mutant("bool mask added to the scores", wrong(add_bool=True), r"added the bool mask"),
        Mutant("mask applied after the softmax (fill 0)", wrong(after="fill"), r"AFTER the softmax",
               family="after"),
        Mutant("mask applied after the softmax (multiply)", wrong(after="multiply"), r"AFTER the softmax",
               family="after"),
        Mutant("K.T on a 3-D tensor", wrong(k_dot_T=True), r"K\.T, which reverses ALL the axes"),
        Mutant("(B, S) mask not given a query axis", wrong(mask="raw"), r"as it is.*key_padding_mask\[:, None, :\]"),
        Mutant("x @ W.T", wrong(transpose_w=True), r"x @ W\.T"),
        Mutant("V = weights @ x", wrong(v_with="x"), r"averaged x"),
        Mutant("V computed with W_k", wrong(v_with="k"), r"V = x @ W_k"),
        Mutant("(weights, out) returned", wrong(returns="swapped"), r"\(out, weights\)", family="returns"),
        Mutant("only out returned", wrong(returns="out"), r"\(out, weights\)", family="returns"),
        Mutant("computed in float32", wrong(dtype=torch.float32), (r"float32", r"dtype")),
        Mutant("dropout active (F.dropout's default)", wrong(dropout=0.1), r"dropout"),
    ],
)


# ---------------------------------------------------------------------------------------------------------
# check_in_proj_copy: fn(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o) copies into nn.MultiheadAttention(D, 1)


def copy_into(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o, *, order="qkv", transpose="qkv", bias_order="qkv",
              in_bias=True, out_bias=True, out_weight="W_o.T", no_grad=True, q_factor=1.0, stack=False):
    """The reference answer; each option is one classic mistake."""
    mats, biases = {"q": W_q * q_factor, "k": W_k, "v": W_v}, {"q": b_q, "k": b_k, "v": b_v}
    blocks = [mats[n].T if n in transpose else mats[n] for n in order]
    weight = torch.stack(blocks) if stack else torch.cat(blocks)
    with torch.no_grad() if no_grad else torch.enable_grad():
        mha.in_proj_weight.copy_(weight)
        if in_bias:
            mha.in_proj_bias.copy_(torch.cat([biases[n] for n in bias_order]))
        if out_weight:
            mha.out_proj.weight.copy_({"W_o.T": W_o.T, "W_o": W_o}[out_weight])
        if out_bias:
            mha.out_proj.bias.copy_(b_o)


def copy_by_slices(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o):
    """Another style: block by block, through .data."""
    D = W_q.shape[0]
    for i, (W, b) in enumerate(((W_q, b_q), (W_k, b_k), (W_v, b_v))):
        mha.in_proj_weight.data[i * D:(i + 1) * D] = W.t()
        mha.in_proj_bias.data[i * D:(i + 1) * D] = b
    mha.out_proj.weight.data[:] = W_o.t()
    mha.out_proj.bias.data[:] = b_o


def copy_by_state_dict(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o):
    """Another style: one load_state_dict, the stack transposed as a whole."""
    mha.load_state_dict({"in_proj_weight": torch.cat([W_q, W_k, W_v], dim=1).T,
                         "in_proj_bias": torch.cat([b_q, b_k, b_v]),
                         "out_proj.weight": W_o.T, "out_proj.bias": b_o})


def copy_as_new_parameters(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o, *, dtype=None, dim=0):
    """Another style: new nn.Parameters in place of the old ones (right shape, right dtype)."""
    as_param = lambda t: nn.Parameter(t.to(dtype or t.dtype))  # noqa: E731
    mha.in_proj_weight = as_param(torch.cat([W_q.T, W_k.T, W_v.T], dim=dim))
    mha.in_proj_bias = as_param(torch.cat([b_q, b_k, b_v]))
    mha.out_proj.weight = as_param(W_o.T.contiguous())
    mha.out_proj.bias = as_param(b_o.clone())


def nothing_copied(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o):
    """Copies into a new layer of its own, not into the one it was given."""
    mha = nn.MultiheadAttention(W_q.shape[0], 1, batch_first=True, dtype=W_q.dtype)
    copy_into(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o)


def copied(**options):
    return lambda *args: copy_into(*args, **options)


IN_PROJ_COPY = Catalogue(
    ch04.check_in_proj_copy,
    correct={"torch.cat and copy_ under no_grad": copy_into, "block by block through .data": copy_by_slices,
             "load_state_dict": copy_by_state_dict, "new nn.Parameters": copy_as_new_parameters},
    mutants=[
        Mutant("W_q, W_k, W_v not transposed", copied(transpose=""), r"without transposing", family="W not W.T"),
        Mutant("W_v alone not transposed", copied(transpose="qk"), r"all of them in the W_v block", family="W not W.T"),
        Mutant("chunks in the order k, q, v", copied(order="kqv"), (r"W_k\.T in the W_q block", r"order"),
               family="order"),
        Mutant("chunks in the order q, v, k", copied(order="qvk"), r"`W_k` and `W_v` EXCHANGED",
               family="order"),
        Mutant("W_q copied into every block", copied(order="qqq"), r"W_q\.T into all 3 blocks"),
        Mutant("in_proj_bias not copied", copied(in_bias=False), r"leaves in_proj_bias as it was"),
        Mutant("in_proj_bias in the order k, q, v", copied(bias_order="kqv"), r"`b_q` and `b_k` EXCHANGED"),
        Mutant("out_proj.bias not copied", copied(out_bias=False), r"leaves out_proj\.bias as it was"),
        Mutant("out_proj.weight not copied", copied(out_weight=None), r"leaves out_proj\.weight as it was"),
        Mutant("out_proj.weight not transposed", copied(out_weight="W_o"),
               r"out_proj\.weight is the transpose of the right one"),
        Mutant("copy_ without no_grad", copied(no_grad=False), r"torch\.no_grad"),
        Mutant("W_q pre-divided by sqrt(D)", copied(q_factor=0.5), r"all of them in the W_q block"),
        Mutant("W_q divided by sqrt(D)", lambda *a: copy_into(*a, q_factor=a[1].shape[0] ** -0.5),
               r"scales the scores itself"),
        Mutant("torch.stack instead of torch.cat", copied(stack=True), r"torch\.cat.*not torch\.stack"),
        Mutant("new parameter concatenated along dim=1",
               lambda *args: copy_as_new_parameters(*args, dim=1), r"in_proj_weight has shape \(2, 6\), expected \(6, 2\)"),
        Mutant("new parameters in float32", lambda *args: copy_as_new_parameters(*args, dtype=torch.float32),
               r"float32"),
        Mutant("copied into another layer", nothing_copied, r"changes no parameter of mha"),
    ],
)

CATALOGUES = [SELF_ATTENTION, IN_PROJ_COPY]
