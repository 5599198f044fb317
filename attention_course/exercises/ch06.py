"""Checkers for chapter 6, multi-head attention reproduced.

* :func:`check_combine_masks` -- a key padding mask and an attention mask expanded to one (B, h, L, S) mask;
* :func:`check_multihead` -- a whole multi-head attention layer against ``nn.MultiheadAttention``.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from . import ATOL, DTYPE, ExerciseError, call, close, device_hint, max_diff, passed, require_tensor

# ----------------------------------------------------------------------------------------------------------
# Exercise: combine the masks


def _mask_cases(gen: torch.Generator):
    B, h, L, S = 2, 3, 4, 5
    kpm = torch.tensor([[False, False, False, True, True], [False, False, False, False, True]])  # (B, S)
    window = torch.ones(L, S, dtype=torch.bool).triu(2)  # (L, S): key j > i + 1 blocked
    per_head = torch.rand(B * h, L, S, generator=gen) < 0.4  # (B*h, L, S), batch-major
    return (B, h, L, S), [
        ("key_padding_mask only", kpm, None),
        ("a 2-D attn_mask only", None, window),
        ("key_padding_mask and a 2-D attn_mask", kpm, window),
        ("key_padding_mask and a 3-D (B*h, L, S) attn_mask", kpm, per_head),
    ]


def _combine(kpm, attn_mask, B, h, L, S, *, op="or", head_major=False, polarity="ignore"):
    mask = torch.zeros(B, h, L, S, dtype=torch.bool)
    parts = []
    if kpm is not None:
        parts.append(kpm.view(B, 1, 1, S))
    if attn_mask is not None:
        if attn_mask.ndim == 2:
            parts.append(attn_mask.view(1, 1, L, S))
        else:
            parts.append(attn_mask.view(h, B, L, S).transpose(0, 1) if head_major else attn_mask.view(B, h, L, S))
    if op == "and" and len(parts) == 2:
        mask = (parts[0] & parts[1]).expand(B, h, L, S)
    else:
        for part in parts:
            mask = mask | part
    return ~mask if polarity == "allow" else mask


def check_combine_masks(fn) -> None:
    """Check ``fn(key_padding_mask, attn_mask, batch_size, num_heads, query_len, key_len)`` -> (B, h, L, S) bool.

    ``key_padding_mask`` (B, S) bool or None, True at padded keys; ``attn_mask`` (L, S) or (B*h, L, S) bool or
    None, True = blocked, the 3-D form batch-major (row ``b*h + i`` is sentence b, head i). A pair (query, key)
    is blocked in the result if either mask blocks it.
    """
    gen = torch.Generator().manual_seed(6)
    (B, h, L, S), cases = _mask_cases(gen)
    for name, kpm, attn_mask in cases:
        setting = f"with {name} (B={B}, h={h}, L={L}, S={S})"
        got = require_tensor(call(fn, kpm, attn_mask, B, h, L, S, what=f"your function {setting}"), "the mask",
                      "your function")
        want = _combine(kpm, attn_mask, B, h, L, S)
        if got.dtype != torch.bool:
            raise ExerciseError(
                f"your mask has dtype {got.dtype} {setting}; return a bool ignore mask (True = blocked). Combine bool "
                f"masks with | (logical or), not + or *."
            )
        if tuple(got.shape) != (B, h, L, S):
            try:
                broadcastable = torch.broadcast_shapes(got.shape, (B, h, L, S)) == (B, h, L, S)
            except RuntimeError:
                broadcastable = False
            hint = (f" It broadcasts to (B, h, L, S), but the exercise asks for the mask expanded per head: "
                    f"add .expand({B}, {h}, {L}, {S})." if broadcastable else
                    " key_padding_mask (B, S) becomes (B, 1, 1, S): one row of keys per sentence, for every head and "
                    "query; a 2-D attn_mask (L, S) becomes (1, 1, L, S); a 3-D one (B*h, L, S) becomes (B, h, L, S).")
            raise ExerciseError(f"your mask has shape {tuple(got.shape)} {setting}, expected (B, h, L, S) = "
                                f"{(B, h, L, S)}.{hint}")
        if torch.equal(got, want):
            continue
        wrong = (got != want).nonzero()[0].tolist()
        b, i, q, k = wrong
        where = (f"{setting}, entry [b={b}, head={i}, query={q}, key={k}] is {bool(got[b, i, q, k])}, expected "
                 f"{bool(want[b, i, q, k])}")
        variants = [
            (dict(polarity="allow"), "your mask is inverted: it is True where attending is ALLOWED. PyTorch's "
                                     "nn.MultiheadAttention convention is True = blocked (ignore); only "
                                     "F.scaled_dot_product_attention reads True as allowed."),
            (dict(op="and"), "you combined the masks with & (and): a pair must be blocked if EITHER mask blocks "
                             "it, so combine with | (or)."),
            (dict(head_major=True), "you unflattened the 3-D attn_mask head-major, as (h, B, L, S). PyTorch's "
                                    "(B*h, L, S) is batch-major: row b*h + i is sentence b, head i, so use "
                                    "attn_mask.view(B, h, L, S)."),
        ]
        for options, message in variants:
            if torch.equal(got, _combine(kpm, attn_mask, B, h, L, S, **options)):
                raise ExerciseError(f"{where}: {message}")
        if kpm is not None and torch.equal(got, _combine(None, attn_mask, B, h, L, S)):
            raise ExerciseError(f"{where}: the key_padding_mask was ignored.")
        if attn_mask is not None and torch.equal(got, _combine(kpm, None, B, h, L, S)):
            raise ExerciseError(f"{where}: the attn_mask was ignored.")
        raise ExerciseError(f"{where}.")
    passed("padding, 2-D and 3-D masks expand and combine as torch does.")


# ----------------------------------------------------------------------------------------------------------
# Exercise: the whole layer


def _reference(params, query, key, value, mask, h, *, average=True, in_bias=True, out_bias=True, scale="d",
               transpose=True, out_proj=True, polarity="ignore"):
    """Multi-head attention from torch's parameters; mask (B, h, L, S) bool ignore or None. Options = mistakes."""
    B, L, D = query.shape
    S, d = key.shape[1], D // h
    W_q, W_k, W_v = params["in_proj_weight"].chunk(3)
    b_q, b_k, b_v = params["in_proj_bias"].chunk(3) if in_bias else (None, None, None)
    q, k, v = F.linear(query, W_q, b_q), F.linear(key, W_k, b_k), F.linear(value, W_v, b_v)

    def split(t, n):
        return t.reshape(B, n, h, d).transpose(1, 2) if transpose else t.reshape(B, h, n, d)

    q, k, v = split(q, L), split(k, S), split(v, S)  # (B, h, L|S, d)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d if scale == "d" else D)  # (B, h, L, S)
    if mask is not None:
        scores = scores.masked_fill(~mask if polarity == "allow" else mask, float("-inf"))
    weights = torch.softmax(scores, dim=-1)  # (B, h, L, S)
    heads = (weights @ v).transpose(1, 2).reshape(B, L, D)
    out = F.linear(heads, params["out_proj.weight"], params["out_proj.bias"] if out_bias else None) if out_proj \
        else heads
    return out, (weights.mean(1) if average else weights)


def _torch_layer(D: int, h: int, gen: torch.Generator) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(D, h, batch_first=True, dtype=DTYPE)
    with torch.no_grad():  # random non-zero values everywhere: zero biases would hide missing biases
        for p in mha.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=DTYPE))
    return mha


def _layer_cases(gen: torch.Generator, B: int, L: int, S: int, D: int):
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    x, memory = rand(B, L, D), rand(B, S, D)
    kpm_self = torch.arange(L)[None, :] >= torch.tensor([L, 2])[:, None]  # (B, L)
    kpm_cross = torch.arange(S)[None, :] >= torch.tensor([S, 3])[:, None]  # (B, S)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    additive = lambda m: torch.zeros(m.shape, dtype=DTYPE).masked_fill(m, float("-inf"))  # noqa: E731
    return [
        # (name, query, key, value, key_padding_mask, attn_mask, average_attn_weights)
        ("self-attention without masks", x, x, x, None, None, True),
        ("a bool key_padding_mask", x, x, x, kpm_self, None, True),
        ("key padding plus a causal attn_mask", x, x, x, kpm_self, causal, True),
        ("float (additive) masks", x, x, x, additive(kpm_self), additive(causal), True),
        ("average_attn_weights=False", x, x, x, kpm_self, causal, False),
        (f"cross-attention, L={L} queries over S={S} keys", x, memory, memory, kpm_cross, None, True),
    ]


def _as_ignore(mask):
    return None if mask is None else (mask if mask.dtype == torch.bool else torch.isneginf(mask))


def check_multihead(cls) -> None:
    """Check a multi-head attention class against ``nn.MultiheadAttention(batch_first=True)``.

    ``cls(embed_dim, num_heads)`` must have torch's parameter names and shapes (``in_proj_weight`` (3D, D),
    ``in_proj_bias`` (3D,), ``out_proj`` an ``nn.Linear``), and ``forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True)`` must return
    ``(output (B, L, D), weights)`` like torch's: (B, L, S) averaged, (B, h, L, S) per head, None without weights.
    Checked in float64 to 1e-10 with random non-zero weights and biases, for self- and cross-attention, bool and
    float masks, outputs, weights and gradients.
    """
    gen = torch.Generator().manual_seed(7)
    B, L, S, D, h = 2, 4, 5, 6, 3
    d = D // h
    mha = _torch_layer(D, h, gen)
    try:
        ours = cls(D, h)
    except Exception as err:
        raise ExerciseError(f"{cls.__name__}({D}, {h}) raised {type(err).__name__}: {err}{device_hint(err)}") from err
    ours = ours.to("cpu", DTYPE)  # where the checker's tensors are, even if the layer moved itself to the GPU
    try:
        ours.load_state_dict(mha.state_dict())
    except RuntimeError as err:
        have = {name: tuple(p.shape) for name, p in ours.named_parameters()}
        want = {name: tuple(p.shape) for name, p in mha.named_parameters()}
        raise ExerciseError(
            f"torch's weights do not load into your layer: it has parameters {have}, torch's layer has {want}. "
            f"Use the same names and shapes (out_proj is an nn.Linear(D, D)), biases included."
        ) from err
    params = {name: p.detach() for name, p in mha.named_parameters()}
    for name, query, key, value, kpm, attn_mask, average in _layer_cases(gen, B, L, S, D):
        setting = f"with {name}"
        kwargs = dict(key_padding_mask=kpm, attn_mask=attn_mask, average_attn_weights=average)
        try:
            answer = call(lambda: ours(query, key, value, **kwargs), what=f"your layer {setting}")
        except ExerciseError as err:
            if key.shape[1] != query.shape[1]:
                raise ExerciseError(f"{err} Keys and values have S = {key.shape[1]} positions, queries L = "
                                    f"{query.shape[1]}: split k and v with key.shape[1], not the query's L.") from err
            raise
        if not isinstance(answer, tuple) or len(answer) != 2:
            raise ExerciseError(f"your layer must return a pair (output, weights) like torch's; got "
                                f"{type(answer).__name__} {setting}.")
        out, weights = answer
        out = require_tensor(out, "the output", "your layer")
        weights = require_tensor(weights, "the weights", "your layer")
        want_out, want_w = mha(query, key, value, **kwargs)
        Lq, Sk = query.shape[1], key.shape[1]
        if tuple(out.shape) != (B, Lq, D):
            raise ExerciseError(f"your output has shape {tuple(out.shape)} {setting}, expected (B, L, D) = {(B, Lq, D)}.")
        want_shape = tuple(want_w.shape)
        if tuple(weights.shape) != want_shape:
            shape = tuple(weights.shape)
            if shape == (B * h, Lq, Sk):
                hint = (" These are the per-head weights in the flat (B*h, L, S) layout: view them as (B, h, L, S)"
                        + (" and average over the heads with .mean(dim=1)." if average else "."))
            elif average and shape == (B, h, Lq, Sk):
                hint = " With average_attn_weights=True, average over the heads: weights.mean(dim=1)."
            elif not average and shape == (B, Lq, Sk):
                hint = " With average_attn_weights=False, return one matrix per head, (B, h, L, S), not their mean."
            else:
                hint = ""
            raise ExerciseError(f"your weights have shape {shape} {setting}, torch's {want_shape}.{hint}")
        diff_out, diff_w = max_diff(out, want_out), max_diff(weights, want_w)
        if diff_out <= ATOL and diff_w <= ATOL:
            continue
        diff = f"(outputs differ by up to {diff_out:.2g}, weights by {diff_w:.2g})"
        mask = None
        if kpm is not None or attn_mask is not None:
            mask = torch.zeros(B, h, Lq, Sk, dtype=torch.bool)
            if kpm is not None:
                mask = mask | _as_ignore(kpm).view(B, 1, 1, Sk)
            if attn_mask is not None:
                mask = mask | _as_ignore(attn_mask)
        variants = [
            (dict(polarity="allow"), "the mask is inverted: bool True means BLOCKED in nn.MultiheadAttention."),
            (dict(scale="D"), f"the scores were divided by sqrt(D) = sqrt({D}); with heads the scale is sqrt(d), "
                              f"d = D / h = {d}, the size of the vectors whose dot product is taken."),
            (dict(transpose=False), "the heads were split without the transpose: reshape to (B, L, h, d), then "
                                    "transpose(1, 2); a direct reshape mixes tokens across heads (chapter 5)."),
            (dict(in_bias=False), "in_proj_bias is not used: add the biases b_q, b_k, b_v (in_proj_bias.chunk(3)). "
                                  "torch starts them at zero, which is why a check with a fresh layer misses this."),
            (dict(out_bias=False), "out_proj.bias is not used: apply the whole out_proj (an nn.Linear)."),
            (dict(out_proj=False), "the output projection out_proj is missing: apply it after merging the heads."),
        ]
        for options, message in variants:
            v_out, v_w = _reference(params, query, key, value, mask, h, average=average, **options)
            if close(out, v_out, 1e-8) and close(weights, v_w, 1e-8):
                raise ExerciseError(f"{setting}: {message} {diff}")
        if diff_out > ATOL and diff_w <= ATOL:
            raise ExerciseError(f"{setting}, the weights are right but the output is not {diff}: multiply the "
                                f"per-head weights by the values v (B, h, S, d), merge the heads, apply out_proj.")
        raise ExerciseError(f"{setting}, your layer differs from nn.MultiheadAttention {diff}.")
    # Gradients, once forward agrees: of the inputs and of every parameter.
    name, query, key, value, kpm, attn_mask, average = _layer_cases(gen, B, L, S, D)[5]
    grads = {}
    for label, layer in (("yours", ours), ("torch", mha)):
        layer.zero_grad()
        q_in, kv_in = query.clone().requires_grad_(), key.clone().requires_grad_()
        out, weights = layer(q_in, kv_in, kv_in, key_padding_mask=kpm)
        (out.pow(2).sum() + weights.pow(2).sum()).backward()
        grads[label] = {"query": q_in.grad, "key/value": kv_in.grad,
                        **{n: p.grad for n, p in layer.named_parameters()}}
    for what, want in grads["torch"].items():
        got = grads["yours"].get(what)
        if got is None:
            raise ExerciseError(f"the gradient of {what} is None with your layer: something in forward cuts the graph "
                                f"(.detach(), .data, or a tensor built with torch.tensor(...)).")
        if max_diff(got, want) > ATOL:
            raise ExerciseError(f"outputs agree but the gradients of {what} differ by {max_diff(got, want):.2g}: "
                                f"look for .detach(), .data or in-place writes in forward.")
    # need_weights=False
    out, weights = call(lambda: ours(query, key, value, key_padding_mask=kpm, need_weights=False),
                         what="your layer with need_weights=False")
    if weights is not None:
        raise ExerciseError("with need_weights=False torch returns None for the weights; yours returned a tensor.")
    if max_diff(out, mha(query, key, value, key_padding_mask=kpm, need_weights=False)[0]) > ATOL:
        raise ExerciseError("with need_weights=False your output changes: the flag should only drop the weights.")
    passed("outputs, weights and gradients = torch's, to 1e-10 in float64.")
