"""Checkers for chapter 4, a self-attention module.

* :func:`check_self_attention` -- single-head attention written step by step, with a key padding mask;
* :func:`check_in_proj_copy` -- copying hand-made weights into ``nn.MultiheadAttention(num_heads=1)``.
"""
from __future__ import annotations

import math
import warnings

import torch
from torch import nn

from . import (DTYPE, ExerciseError, close, describe_diff, max_diff, passed, raised, require_shape,
               require_tensor, same_error)

# ----------------------------------------------------------------------------------------------------------
# Exercise: self-attention step by step


def _attention(x, W_q, W_k, W_v, key_padding_mask, *, scale="sqrt", transpose_w=False, swap_qk=False,
               mask="keys", fill=-1e9, softmax_dim=-1, k_dot_T=False):
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
        "added": None,  # the bool mask added to the scores: True counts as 1
    }[mask]
    if blocked is None:
        scores = scores + key_padding_mask[:, None, :]
    else:
        scores = scores.masked_fill(blocked, fill)
    weights = torch.softmax(scores, dim=softmax_dim)
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


def _fitted_divisor(weights, x, W_q, W_k, kpm) -> float | None:
    """The number the learner's scores were divided by, if the weights are softmax(mask(Q K^T / c)) for some c.

    Within a row, log w_ij = s_ij / c - log Z_i over the real keys: centred per row, a line through 0 of slope 1/c.
    """
    s = (x @ W_q) @ (x @ W_k).transpose(-2, -1)  # (B, L, S), unscaled
    keep = (~kpm[:, None, :]).expand_as(s) & (weights > 0)
    if not torch.equal(keep, (~kpm[:, None, :]).expand_as(s)):  # weight on every real key, none on a pad
        return None
    n = keep.sum(-1, keepdim=True)  # real keys per row
    centre = lambda t: (t - (t * keep).sum(-1, keepdim=True) / n) * keep  # noqa: E731
    a, b = centre(weights.clamp_min(1e-300).log()), centre(s)
    slope = float((a * b).sum() / (b * b).sum())
    if slope <= 0 or max_diff(a, slope * b) > 1e-6:
        return None
    return 1 / slope


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
    answers = []
    for _ in range(2):  # twice: a function with randomness in it (dropout) answers differently
        try:
            answers.append(fn(x.clone(), W_q.clone(), W_k.clone(), W_v.clone(), kpm.clone()))
        except Exception as err:  # the learner's code may raise anything: name the mistake if a reference shows it
            raise _why_it_raised(err, x, W_q, W_k, W_v, kpm) from err
    answer = answers[0]
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise ExerciseError(f"return a pair (out, weights); got {type(answer).__name__}.")
    out, weights = (require_tensor(a, n, "your function") for a, n in zip(answer, ("out", "weights")))
    if tuple(out.shape) == (B, L, L) and tuple(weights.shape) == (B, L, D):
        raise ExerciseError(
            f"your first tensor has the weights' shape (B, L, S) = {(B, L, L)} and the second the output's, "
            f"(B, L, D) = {(B, L, D)}: return the pair in the order (out, weights)."
        )
    require_shape(weights, (B, L, L), "weights", "(B, L, S)", "One row per query, one column per key.")
    require_shape(out, (B, L, D), "out", "(B, L, D)")
    for name, got in (("out", out), ("weights", weights)):
        if got.dtype != x.dtype:
            raise ExerciseError(
                f"your {name} has dtype {got.dtype}, but the inputs are {x.dtype}: compute in the inputs' dtype "
                f"(no .float(), no dtype=torch.float32, no new tensor of the default dtype), or the answer loses "
                f"precision."
            )
    again = [require_tensor(a, "out", "your function") for a in answers[1]]
    if max_diff(again[0], out) > 0 or max_diff(again[1], weights) > 0:  # NaN = NaN here
        changed = describe_diff(again[1], weights, "the first call's")
        raise ExerciseError(
            f"two calls with the same inputs gave different results (weights {changed}): "
            f"something random runs in your function. Is dropout on? F.dropout(p) drops by default "
            f"(training=True); this exercise has no dropout."
        )
    want_out, want_w = _attention(x, W_q, W_k, W_v, kpm)
    if close(out, want_out) and close(weights, want_w):
        passed("weights and output are softmax(mask(Q K^T / sqrt(D))) V.")
        return
    ref = "the right answer's"
    diff = f"(weights {describe_diff(weights, want_w, ref)}, outputs {describe_diff(out, want_out, ref)})"
    if close(weights.transpose(-2, -1), want_w):
        also = "" if close(out, want_out) else " (and out was computed from them, so it is wrong too)"
        raise ExerciseError(
            f"your weights are the transpose of the right weights{also} {diff}: row i must hold query i's "
            f"weights over the keys, (B, L, S). Return weights, not weights.transpose(-2, -1) (or .mT)."
        )
    ones = torch.ones(B, L, dtype=DTYPE)
    col_sums = weights.sum(-2)  # (B, S); NaN where a whole column was masked
    finite = ~torch.isnan(col_sums)
    if bool(finite.any()) and close(col_sums[finite], torch.ones_like(col_sums[finite]), 1e-6) \
            and not close(weights.sum(-1), ones, 1e-6):
        raise ExerciseError(
            f"your weights' COLUMNS sum to 1, not their rows {diff}: softmax ran over the queries. "
            f"Each query's weights over the keys must sum to 1: use softmax(..., dim=-1)."
        )
    if close(weights.sum(0), torch.ones(L, L, dtype=DTYPE), 1e-6):
        raise ExerciseError(
            f"your weights sum to 1 over the batch axis {diff}: softmax ran over the batch (dim=0), mixing the two "
            f"sentences. Each query's weights over the keys must sum to 1: use softmax(..., dim=-1)."
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
    if not close(weights.sum(-1), ones, 1e-6):
        if close(weights * math.sqrt(D), _attention(x, W_q, W_k, W_v, kpm, scale="none")[1]):
            raise ExerciseError(
                f"you scaled the WEIGHTS, dividing the softmax's output by sqrt(D) {diff}, so their rows sum to "
                f"1/sqrt(D). The scale belongs to the scores: softmax(Q K^T / sqrt(D))."
            )
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
        (dict(fill=0.0), "the padded keys' scores were filled with 0, and 0 is an ordinary score: exp(0) = 1, so "
                         "the pads keep their share of the weight. Fill them with float('-inf'), whose weight is 0."),
        (dict(mask="added"), "you added the bool mask to the scores: True counts as 1, so the pads' scores went up "
                             "by one instead of being blocked. Use scores.masked_fill(key_padding_mask[:, None, :], "
                             "float('-inf')), or turn the mask into 0 / -inf floats before adding it."),
        (dict(scale="none"), "the scores were not scaled: divide Q K^T by sqrt(D) before the softmax."),
        (dict(scale="D"), "the scores were divided by D; the scale is sqrt(D)."),
        (dict(transpose_w=True), "you used x @ W.T: here the weights are in the math convention, Q = x @ W_q "
                                 "(only nn.Linear stores them transposed)."),
        (dict(swap_qk=True), "your scores are K Q^T, not Q K^T: either the product is the wrong way round or "
                             "W_q and W_k swapped roles (Q = x @ W_k, K = x @ W_q); the two give the same scores. "
                             "Row i must be query i: Q = x @ W_q, K = x @ W_k, Q @ K.transpose(-2, -1)."),
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
        for name, W in (("W_q", W_q), ("W_k", W_k)):
            if close(out, weights @ (x @ W)):
                raise ExerciseError(f"the weights are right but the output uses V = x @ {name} {diff}: "
                                    f"the values have their own weight, V = x @ W_v.")
        raise ExerciseError(f"the weights are right but the output is not {diff}: out = weights @ V with V = x @ W_v.")
    divisor = _fitted_divisor(weights, x, W_q, W_k, kpm)
    if divisor is not None:
        named = {f"sqrt(L) = sqrt({L})": math.sqrt(L), f"L = {L}": float(L)}
        which = next((f" = {n}" for n, v in named.items() if abs(divisor - v) < 1e-6), "")
        raise ExerciseError(
            f"your scores were divided by {divisor:.4g}{which}, not by sqrt(D) = sqrt({D}) = {math.sqrt(D):.4g} "
            f"{diff}. D is the size of the vectors whose dot products are taken, x.shape[-1] (L = x.shape[1] "
            f"counts the tokens)."
        )
    raise ExerciseError(
        f"the weights are not softmax(mask(Q K^T / sqrt(D))) {diff}. Compute Q = x @ W_q and K = x @ W_k, "
        f"the scores Q @ K.transpose(-2, -1) / sqrt(D), mask, then softmax over the last dimension."
    )


# ----------------------------------------------------------------------------------------------------------
# Exercise: copying hand-made weights into nn.MultiheadAttention


def _describe_blocks(weight: torch.Tensor, mats: dict, initial: torch.Tensor) -> list[str]:
    """What is wrong with the W_q, W_k, W_v blocks of ``weight`` (which should hold ``mats[name].T``)."""
    D = weight.shape[1]
    untransposed, problems, sources = [], [], {}
    for i, name in enumerate(("W_q", "W_k", "W_v")):
        rows = slice(i * D, (i + 1) * D)
        block, where = weight[rows], f"in_proj_weight[{rows.start}:{rows.stop}] (the {name} block)"
        for other, W in mats.items():
            if close(block, W.T):
                sources.setdefault(other, []).append(name)
        if close(block, mats[name].T):
            continue
        others = [other for other, W in mats.items() if other != name and close(block, W.T)]
        ratio = (block * mats[name].T).sum() / (mats[name] ** 2).sum()  # block = ratio * W.T fits best
        if close(block, mats[name]):
            untransposed.append((name, where))
        elif others:
            problems.append(f"{where} holds {others[0]}.T instead of {name}.T: the blocks of in_proj_weight are "
                            f"stacked in the order W_q, W_k, W_v (rows 0:D, D:2D, 2D:3D).")
        elif close(block, initial[rows]):
            problems.append(f"{where} still holds its initial random values: {name} was not copied.")
        elif close(block, ratio * mats[name].T):
            problems.append(f"{where} holds {name}.T times {float(ratio):.4g}"
                            + (f" = 1/sqrt(D): nn.MultiheadAttention scales the scores itself (by 1/sqrt(d), "
                               f"with d = D for one head), so copy {name}.T as it is."
                               if abs(ratio * math.sqrt(D) - 1) < 1e-6 else f", not {name}.T itself."))
        else:
            problems.append(f"{where} holds neither {name}.T nor {name}.")
    if untransposed:
        name, where = untransposed[0]
        rest = ", ".join(n for n, _ in untransposed[1:])
        problems.insert(0, f"{where} holds {name} itself, not {name}.T: did you copy {name} without transposing?"
                           + (f" (So do the blocks of {rest}.)" if rest else "")
                           + " nn.Linear-style weights are stored (out, in) and applied as x @ weight.T.")
    repeated = {source: blocks for source, blocks in sources.items() if len(blocks) > 1}
    if repeated:  # one matrix in several blocks: a copy-paste slip, not an order mistake
        source, blocks = next(iter(repeated.items()))
        return [f"in_proj_weight holds {source}.T in {len(blocks)} blocks ({', '.join(blocks)}): a copy-paste slip? "
                f"Each block needs its own matrix: torch.cat([W_q.T, W_k.T, W_v.T])."]
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
    except Exception as err:  # the learner's code may raise anything: name what we recognise
        if "leaf Variable" in str(err) or "requires grad" in str(err):
            raise ExerciseError(
                "copying into a parameter in place raised RuntimeError (" + str(err).split("\n")[0] + "). "
                "Parameters track gradients: do the copies inside `with torch.no_grad():`."
            ) from err
        try:  # the same error as copying a torch.stack of the three blocks?
            torch.empty(3 * D, D, dtype=DTYPE).copy_(torch.stack([W.T for W in mats.values()]))
        except RuntimeError as stack_err:
            if same_error(err, stack_err):
                raise ExerciseError(
                    f"your function raised RuntimeError: {err} -- torch.stack puts the three (D, D) blocks on a "
                    f"new axis, (3, D, D); in_proj_weight is (3D, D), the blocks one below the other: use "
                    f"torch.cat([W_q.T, W_k.T, W_v.T]), not torch.stack."
                ) from err
        raise raised(err, "your function") from err

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
        if params[name].dtype != DTYPE:
            raise ExerciseError(
                f"mha.{name} is now {params[name].dtype}, but the layer and its inputs are {DTYPE}: a new "
                f"nn.Parameter takes the dtype of the tensor it wraps. Copy into the existing parameter "
                f"(param.copy_(...) keeps its dtype), or keep the tensor's dtype."
            )
    if all(close(p.detach(), initial[name]) for name, p in params.items()):
        raise ExerciseError(
            "no parameter of mha changed: it still holds the random values it had before your function ran. Copy "
            "into the layer you are given, mha.in_proj_weight.copy_(...) and so on, not into a new layer or a new "
            "variable of the same name."
        )
    with torch.no_grad():
        got, _ = mha(x, x, x, key_padding_mask=kpm)
    want = _mha_reference(x, kpm, mats["W_q"], mats["W_k"], mats["W_v"], b_q, b_k, b_v, W_o, b_o)
    diff = max_diff(got, want)
    weight, bias = params["in_proj_weight"].detach(), params["in_proj_bias"].detach()
    problems = _describe_blocks(weight, mats, initial["in_proj_weight"])
    want_bias = torch.cat([b_q, b_k, b_v])
    given = {"b_q": b_q, "b_k": b_k, "b_v": b_v}
    held = [next((n for n, b in given.items() if close(chunk, b)), None) for chunk in bias.chunk(3)]
    misplaced = [(h, want) for h, want in zip(held, given) if h is not None and h != want]
    if not close(bias, want_bias):
        if misplaced:
            problems.append(f"in_proj_bias holds {misplaced[0][0]} where {misplaced[0][1]} belongs: the biases are "
                            f"stacked in the order of the blocks, torch.cat([b_q, b_k, b_v]).")
        elif close(bias, initial["in_proj_bias"]) or close(bias, torch.zeros_like(bias)):
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
