"""Checkers for chapter 4, a self-attention module.

* :func:`check_self_attention` -- single-head attention written step by step, with a key padding mask;
* :func:`check_in_proj_copy` -- copying hand-made weights into ``nn.MultiheadAttention(num_heads=1)``.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from . import (DTYPE, ExerciseError, close, describe_diff, device_hint, max_diff, passed, raised, require_shape,
               require_tensor, same_error)

# ----------------------------------------------------------------------------------------------------------
# Exercise: self-attention step by step


def _attention(x, W_q, W_k, W_v, key_padding_mask, *, scale="sqrt", transpose_w=False, swap_qk=False,
               mask="keys", softmax_dim=-1, k_dot_T=False):
    """Reference single-head attention, and the typical mistakes as options. Returns (out, weights)."""
    if transpose_w:
        W_q, W_k, W_v = W_q.T, W_k.T, W_v.T
    Q, K, V = x @ W_q, x @ W_k, x @ W_v  # (B, L, D) each
    with warnings.catch_warnings():  # K.T on a 3-D tensor warns (once per session: keep it for the learner)
        warnings.simplefilter("ignore")
        K_T = K.T if k_dot_T else K.transpose(-2, -1)  # K.T reverses every axis: (D, S, B)
    scores = K @ Q.transpose(-2, -1) if swap_qk else Q @ K_T  # (B, L, L)
    D = x.shape[-1]
    scores = scores / {"sqrt": math.sqrt(D), "none": 1.0, "D": float(D)}[scale]
    blocked = {
        "keys": key_padding_mask[:, None, :],  # (B, 1, S): padded keys, for every query
        "inverted": ~key_padding_mask[:, None, :],
        "queries": key_padding_mask[:, :, None],  # (B, L, 1): whole rows of padded queries
        "none": torch.zeros_like(key_padding_mask[:, None, :]),
        "after": torch.zeros_like(key_padding_mask[:, None, :]),  # masked below, after the softmax
        "unexpanded": key_padding_mask,  # (B, S) against (B, L, S): lines up as (1, B, S)
    }[mask]
    weights = torch.softmax(scores.masked_fill(blocked, -1e9), dim=softmax_dim)
    if mask == "after":
        weights = weights.masked_fill(key_padding_mask[:, None, :], 0.0)
    return weights @ V, weights


def _why_it_raised(err: Exception, *args) -> ExerciseError:
    """Name the mistake whose reference raises the learner's error (same type, same sizes), else report it."""
    B, L = args[-1].shape
    D = args[0].shape[-1]
    mistakes = [
        (dict(k_dot_T=True), f"K.T reverses ALL the axes of a 3-D tensor, (B, S, D) -> (D, S, B) = ({D}, {L}, {B}), "
                             f"so the batched Q @ K.T cannot line up. Transpose only the last two: "
                             f"Q @ K.transpose(-2, -1) (or K.mT)."),
        (dict(mask="unexpanded"), f"the key_padding_mask (B, S) = ({B}, {L}) was applied to the (B, L, S) scores as "
                                  f"it is, and broadcasting lines it up as (1, B, S): its batch axis meets the "
                                  f"queries' axis. Give it a query axis: key_padding_mask[:, None, :], (B, 1, S)."),
    ]
    for options, message in mistakes:
        try:
            _attention(*args, **options)
        except Exception as ref_err:  # noqa: BLE001 -- the mistake applied to the reference raises: compare
            if same_error(err, ref_err):
                return ExerciseError(f"your function raised {type(err).__name__}: {str(err).strip()} -- {message}")
    return raised(err, "your function")


def check_self_attention(fn) -> None:
    """Check ``fn(x, W_q, W_k, W_v, key_padding_mask) -> (out, weights)``.

    ``x`` (B, L, D); ``W_q, W_k, W_v`` (D, D) with ``Q = x @ W_q`` (no bias, no output projection);
    ``key_padding_mask`` (B, L) bool, True at padded tokens. Expected: ``weights`` (B, L, L) =
    softmax over the keys of ``Q K^T / sqrt(D)`` with padded keys masked, ``out = weights @ V`` (B, L, D).
    """
    gen = torch.Generator().manual_seed(4)
    B, L, D = 2, 5, 6
    x = torch.randn(B, L, D, generator=gen, dtype=DTYPE)
    W_q, W_k, W_v = (torch.randn(D, D, generator=gen, dtype=DTYPE) for _ in range(3))
    lengths = torch.tensor([5, 3])
    kpm = torch.arange(L)[None, :] >= lengths[:, None]  # (B, L): True at pads
    try:
        answer = fn(x, W_q, W_k, W_v, kpm)
    except Exception as err:  # the learner's code may raise anything: name the mistake if a reference shows it
        raise _why_it_raised(err, x, W_q, W_k, W_v, kpm) from err
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise ExerciseError(f"return a pair (out, weights); got {type(answer).__name__}.")
    out, weights = (require_tensor(a, n, "your function") for a, n in zip(answer, ("out", "weights")))
    require_shape(weights, (B, L, L), "weights", "(B, L, S)", "One row per query, one column per key.")
    require_shape(out, (B, L, D), "out", "(B, L, D)")
    want_out, want_w = _attention(x, W_q, W_k, W_v, kpm)
    if close(out, want_out) and close(weights, want_w):
        passed("weights and output are softmax(mask(Q K^T / sqrt(D))) V.")
        return
    ref = "the right answer's"
    diff = f"(weights {describe_diff(weights, want_w, ref)}, outputs {describe_diff(out, want_out, ref)})"
    col_sums = weights.sum(-2)  # (B, S); NaN where a whole column was masked
    finite = ~torch.isnan(col_sums)
    if bool(finite.any()) and close(col_sums[finite], torch.ones_like(col_sums[finite]), 1e-6) \
            and not close(weights.sum(-1), torch.ones(B, L, dtype=DTYPE), 1e-6):
        raise ExerciseError(
            f"your weights' COLUMNS sum to 1, not their rows {diff}: softmax ran over the queries. "
            f"Each query's weights over the keys must sum to 1: use softmax(..., dim=-1)."
        )
    if torch.isnan(weights).any():
        rows_ok = ~torch.isnan(weights).any(-1)  # (B, L): rows without NaN
        on_pads = (weights.nan_to_num() * kpm[:, None, :]).sum(-1)  # weight each row gives to padded keys
        if bool(rows_ok[1].any()) and bool((on_pads[1][rows_ok[1]] > 0.5).all()):
            raise ExerciseError(
                f"your weights contain NaN and the padded keys get the weight {diff}: the mask is inverted. "
                f"key_padding_mask is True at the PADS: fill the scores with -inf where it is True. (The sentence "
                f"without pads had all its keys masked: softmax over a row of -inf gives 0/0 = NaN.)"
            )
        raise ExerciseError(
            f"your weights contain NaN {diff}: a row of scores that is all -inf gives 0/0 in softmax. "
            f"Mask the padded KEYS (the columns: key_padding_mask[:, None, :]), never whole query rows."
        )
    pad_cols = kpm[:, None, :].expand(B, L, L)
    _, w_unmasked = _attention(x, W_q, W_k, W_v, kpm, mask="none")
    if close(weights[~pad_cols], w_unmasked[~pad_cols]) and not close(weights, w_unmasked):
        sums = weights.sum(-1)[1].min().item()  # the padded sentence's lowest row sum
        raise ExerciseError(
            f"the mask was applied AFTER the softmax {diff}: the real keys' weights are those of a softmax over "
            f"all keys, pads included, and only then were the pads' weights overwritten, so the rows of the padded "
            f"sentence no longer sum to 1 (one row of sentence 1 sums to {sums:.3g}) and the pads' scores still "
            f"shaped the weights. Mask the SCORES before the softmax: scores.masked_fill(key_padding_mask[:, None, "
            f":], float('-inf')), then softmax(..., dim=-1)."
        )
    if not close(weights.sum(-1), torch.ones(B, L, dtype=DTYPE), 1e-6):
        raise ExerciseError(f"the rows of your weights do not sum to 1 {diff}: apply softmax over the last dimension.")
    variants = [
        (dict(mask="inverted"), "the mask is inverted: the real tokens got weight 0 and the pads got all of it. "
                                "key_padding_mask is True at the PADS: fill the scores with -inf where it is True "
                                "(masked_fill(key_padding_mask[:, None, :], ...)), not where it is False."),
        (dict(mask="none"), "the padded keys still receive weight: the mask was not applied. Fill the scores of "
                            "the padded keys (key_padding_mask[:, None, :], broadcast over the queries) with -inf "
                            "BEFORE the softmax."),
        (dict(mask="queries"), "you masked the padded QUERIES (rows) instead of the padded KEYS (columns): "
                               "a pad must not be attended TO, so use key_padding_mask[:, None, :] (B, 1, S), "
                               "not key_padding_mask[:, :, None]."),
        (dict(scale="none"), "the scores were not scaled: divide Q K^T by sqrt(D) before the softmax."),
        (dict(scale="D"), "the scores were divided by D; the scale is sqrt(D)."),
        (dict(transpose_w=True), "you used x @ W.T: here the weights are in the math convention, Q = x @ W_q "
                                 "(only nn.Linear stores them transposed)."),
        (dict(swap_qk=True), "your weights are transposed: you computed K Q^T. Row i must be query i: Q @ K.transpose(-2, -1)."),
    ]
    for options, message in variants:
        out_v, w_v = _attention(x, W_q, W_k, W_v, kpm, **options)
        if close(weights, w_v):
            raise ExerciseError(f"{message} {diff}")
    if (weights.masked_select(pad_cols).abs() > 1e-8).any():
        raise ExerciseError(
            f"the padded keys still receive weight {diff}: mask the columns of the padded keys before the softmax."
        )
    if close(weights, want_w):
        if close(out, weights @ x):
            raise ExerciseError(f"the weights are right but the output is weights @ x {diff}: use V = x @ W_v.")
        raise ExerciseError(f"the weights are right but the output is not {diff}: out = weights @ V with V = x @ W_v.")
    raise ExerciseError(
        f"the weights are not softmax(mask(Q K^T / sqrt(D))) {diff}. Compute Q = x @ W_q and K = x @ W_k, "
        f"the scores Q @ K.transpose(-2, -1) / sqrt(D), mask, then softmax over the last dimension."
    )


# ----------------------------------------------------------------------------------------------------------
# Exercise: copying hand-made weights into nn.MultiheadAttention


def _describe_blocks(weight: torch.Tensor, mats: dict, initial: torch.Tensor) -> list[str]:
    """What is wrong with the W_q, W_k, W_v blocks of ``weight`` (which should hold ``mats[name].T``)."""
    D = weight.shape[1]
    untransposed, problems = [], []
    for i, name in enumerate(("W_q", "W_k", "W_v")):
        rows = slice(i * D, (i + 1) * D)
        block, where = weight[rows], f"in_proj_weight[{rows.start}:{rows.stop}] (the {name} block)"
        if close(block, mats[name].T):
            continue
        others = [other for other, W in mats.items() if other != name and close(block, W.T)]
        if close(block, mats[name]):
            untransposed.append((name, where))
        elif others:
            problems.append(f"{where} holds {others[0]}.T instead of {name}.T: the blocks of in_proj_weight are "
                            f"stacked in the order W_q, W_k, W_v (rows 0:D, D:2D, 2D:3D).")
        elif close(block, initial[rows]):
            problems.append(f"{where} still holds its initial random values: {name} was not copied.")
        else:
            problems.append(f"{where} holds neither {name}.T nor {name}.")
    if untransposed:
        name, where = untransposed[0]
        rest = ", ".join(n for n, _ in untransposed[1:])
        problems.insert(0, f"{where} holds {name} itself, not {name}.T: did you copy {name} without transposing?"
                           + (f" (So do the blocks of {rest}.)" if rest else "")
                           + " nn.Linear-style weights are stored (out, in) and applied as x @ weight.T.")
    return problems


def _mha_reference(x, kpm, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o):
    """Single-head attention with biases, math convention (Q = x @ W_q + b_q, out = heads @ W_o + b_o)."""
    Q, K, V = x @ W_q + b_q, x @ W_k + b_k, x @ W_v + b_v
    scores = (Q @ K.transpose(-2, -1) / math.sqrt(x.shape[-1])).masked_fill(kpm[:, None, :], float("-inf"))
    return torch.softmax(scores, dim=-1) @ V @ W_o + b_o


def check_in_proj_copy(fn) -> None:
    """Check ``fn(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o)``, which copies hand-made weights into ``mha``.

    ``mha`` is ``nn.MultiheadAttention(D, num_heads=1, batch_first=True)``; the weights are in the math
    convention ``Q = x @ W_q + b_q``, ``out = heads @ W_o + b_o`` with ``W_*`` (D, D) and ``b_*`` (D,). After the
    call, ``mha`` must compute the same outputs as those weights.
    """
    gen = torch.Generator().manual_seed(5)
    B, L, D = 2, 5, 4
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    mats = {"W_q": rand(D, D), "W_k": rand(D, D), "W_v": rand(D, D)}
    b_q, b_k, b_v, W_o, b_o = rand(D), rand(D), rand(D), rand(D, D), rand(D)
    mha = nn.MultiheadAttention(D, 1, batch_first=True, dtype=DTYPE)
    with torch.no_grad():  # start from random, non-zero values everywhere, so a missing copy shows
        for p in mha.parameters():
            p.copy_(torch.randn(p.shape, generator=gen, dtype=DTYPE))
    initial = {name: p.detach().clone() for name, p in mha.named_parameters()}
    try:
        fn(mha, mats["W_q"], mats["W_k"], mats["W_v"], b_q, b_k, b_v, W_o, b_o)
    except RuntimeError as err:
        if "leaf Variable" in str(err) or "requires grad" in str(err):
            raise ExerciseError(
                "copying into a parameter in place raised RuntimeError (" + str(err).split("\n")[0] + "). "
                "Parameters track gradients: do the copies inside `with torch.no_grad():`."
            ) from err
        raise ExerciseError(f"your function raised RuntimeError: {err}{device_hint(err)}") from err
    except Exception as err:
        raise ExerciseError(f"your function raised {type(err).__name__}: {err}{device_hint(err)}") from err

    x = rand(B, L, D)
    kpm = torch.arange(L)[None, :] >= torch.tensor([5, 3])[:, None]  # (B, L): True at pads
    params = dict(mha.named_parameters())
    shapes = {"in_proj_weight": (3 * D, D), "in_proj_bias": (3 * D,), "out_proj.weight": (D, D), "out_proj.bias": (D,)}
    for name, shape in shapes.items():
        if tuple(params[name].shape) != shape:
            raise ExerciseError(
                f"mha.{name} now has shape {tuple(params[name].shape)}, but torch's layer needs {shape}: "
                f"copy values into the existing parameter (param.copy_(...)) rather than replacing it."
            )
    with torch.no_grad():
        got, _ = mha(x, x, x, key_padding_mask=kpm)
    want = _mha_reference(x, kpm, mats["W_q"], mats["W_k"], mats["W_v"], b_q, b_k, b_v, W_o, b_o)
    diff = max_diff(got, want)
    weight, bias = params["in_proj_weight"].detach(), params["in_proj_bias"].detach()
    problems = _describe_blocks(weight, mats, initial["in_proj_weight"])
    want_bias = torch.cat([b_q, b_k, b_v])
    if not close(bias, want_bias):
        if close(bias, initial["in_proj_bias"]) or close(bias, torch.zeros_like(bias)):
            problems.append("in_proj_bias was not copied: it must hold torch.cat([b_q, b_k, b_v]). (A copy that "
                            "forgets the biases passes a parity check only while torch's biases are zero, as "
                            "they are right after nn.MultiheadAttention(...) is built.)")
        else:
            problems.append("in_proj_bias is not torch.cat([b_q, b_k, b_v]) (biases are not transposed; check "
                            "their order q, k, v).")
    out_w, out_b = params["out_proj.weight"].detach(), params["out_proj.bias"].detach()
    if not close(out_w, W_o.T):
        if close(out_w, W_o):
            problems.append("out_proj.weight holds W_o, not W_o.T: out_proj is an nn.Linear, stored (out, in).")
        elif close(out_w, initial["out_proj.weight"]):
            problems.append("out_proj.weight was not copied: the output projection is part of the layer too.")
        else:
            problems.append("out_proj.weight holds neither W_o.T nor W_o.")
    if not close(out_b, b_o):
        problems.append("out_proj.bias was not copied: it must hold b_o.")
    if diff <= 1e-8 and not problems:
        passed(f"every parameter copied; outputs agree (max diff {diff:.1e}).")
        return
    if not problems:  # outputs differ although every parameter checks out: should not happen, but say so
        problems.append("every parameter looks right, yet the layer computes something else.")
    raise ExerciseError(f"outputs differ by {diff:.2g}: " + " Also: ".join(problems))
