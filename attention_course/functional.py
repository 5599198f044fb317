"""Scaled dot-product attention, written out step by step.

    scores  = q k^T / sqrt(d)              # (..., L, S): how much query i likes key j
    weights = softmax(scores + mask)       # (..., L, S): each row sums to 1 over the keys it may attend
    output  = weights v                    # (..., L, dv)

Masks here are IGNORE masks (bool, True = may NOT attend) or additive float masks (0 = attend, -inf = blocked),
like ``nn.MultiheadAttention``. Beware: ``torch.nn.functional.scaled_dot_product_attention`` reads a bool mask
the other way round (True = MAY attend); see :mod:`attention_course.masks`.

A query whose keys are all masked has nothing to average. Here it gets all-zero weights and a zero output,
with finite gradients, instead of the NaN a plain softmax over ``-inf`` gives.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from .checks import check_dropout, check_floating, check_mask, check_same_device, check_same_dtype, tracing
from .masks import fully_masked_rows


def _check_mask_fits(mask: torch.Tensor, ref: torch.Tensor, ref_name: str) -> None:
    """``mask`` must be bool or of ``ref``'s float dtype, on its device, and broadcast to its (..., L, S) shape."""
    if tracing():
        return
    check_mask(mask, "mask", float_dtype=ref.dtype, device=ref.device, ref_name=ref_name)
    if mask.ndim == 2 and ref.ndim >= 3 and mask.shape == (ref.shape[0], ref.shape[-1]):
        # Shaped like a key padding mask (B, S). Broadcasting would read it as an (L, S) mask, silently so
        # whenever B == L: refuse, even then, and let the learner say which one it is.
        pad = "mask[:, " + "None, " * (ref.ndim - 2) + ":]"
        one = "mask[" + "None, " * (ref.ndim - 2) + "...]"
        raise ValueError(
            f"mask of shape {tuple(mask.shape)} against {ref_name} {tuple(ref.shape)}: this looks like a key padding "
            f"mask (B, S), which broadcasting would read as an (L, S) mask. Give it the missing dimensions: "
            f"{pad} for a key padding mask, or {one} if it really is one (L, S) mask for every sentence."
        )
    try:
        fits = torch.broadcast_shapes(mask.shape, ref.shape) == ref.shape
    except RuntimeError:
        fits = False
    if fits:
        return
    raise ValueError(
        f"mask of shape {tuple(mask.shape)} does not broadcast to the {ref_name} shape (..., L, S) = "
        f"{tuple(ref.shape)}."
    )


def masked_softmax(scores: torch.Tensor, mask: torch.Tensor | None = None, dim: int = -1) -> torch.Tensor:
    """Softmax of ``scores`` over ``dim``, skipping masked entries.

    ``mask``: bool ignore mask (True = skip) or additive float mask, broadcastable to ``scores``; a (B, S) padding
    mask for (B, L, S) scores is ``mask[:, None, :]``, and a 2-D mask shaped (B, S) raises rather than being read
    as (L, S), even when B == L. A row whose
    entries are all masked gets all-zero weights, and no NaN reaches the gradient. The scores themselves are expected
    finite: without a mask this is ``torch.softmax``, and a row of -inf scores gives NaN (-inf belongs in the mask).
    """
    check_floating(scores, "scores")
    if mask is None:
        return torch.softmax(scores, dim)
    _check_mask_fits(mask, scores, "scores")
    scores = scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    # softmax over a row of -inf is 0/0 = NaN, in the forward and the backward pass: give the rows with nothing to
    # attend to finite scores, then set their weights to zero. masked_fill sends no gradient to the entries it
    # overwrites. Always both steps, never `if blocked.any()`: a branch on the data would stop torch.compile,
    # torch.export, vmap and jit.trace from seeing one graph.
    blocked = fully_masked_rows(mask, dim)  # (..., L, 1): True on rows with nothing to attend to
    weights = torch.softmax(scores.masked_fill(blocked, 0.0), dim)
    return weights.masked_fill(blocked, 0.0)


def _check_qkv(q, k, v) -> None:
    if tracing():
        return
    for x, name in ((q, "q"), (k, "k"), (v, "v")):
        check_floating(x, name)
        if x.ndim < 2:
            raise ValueError(f"{name} must have at least 2 dimensions (..., length, features), got {tuple(x.shape)}.")
    if not q.ndim == k.ndim == v.ndim or not q.shape[:-2] == k.shape[:-2] == v.shape[:-2]:
        raise ValueError(
            f"q, k and v must have the same leading (batch, head) dimensions, got q {tuple(q.shape)}, "
            f"k {tuple(k.shape)}, v {tuple(v.shape)}."
        )
    if q.shape[-1] != k.shape[-1]:
        raise ValueError(
            f"q and k must have the same feature size d (each score is a dot product of a query and a key), "
            f"got q (..., L, {q.shape[-1]}) and k (..., S, {k.shape[-1]})."
        )
    if k.shape[-2] != v.shape[-2]:
        raise ValueError(
            f"k and v must hold the same number of keys S (one value per key), got k (..., {k.shape[-2]}, d) "
            f"and v (..., {v.shape[-2]}, dv)."
        )
    for x, name in ((k, "k"), (v, "v")):
        check_same_dtype(x, name, q, "q")
        check_same_device(x, name, q, "q")


def _scores_shape_probe(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """An empty-memory stand-in with the shape of the scores (..., L, S), to check a mask against."""
    return q.new_empty(()).expand(*q.shape[:-1], k.shape[-2])


def scaled_dot_product_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    scale: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention of queries q (..., L, d) over keys k (..., S, d) and values v (..., S, dv).

    Returns ``(output (..., L, dv), weights (..., L, S))``. ``mask`` is an IGNORE mask (bool, True = blocked) or
    an additive float mask broadcastable to (..., L, S): the opposite bool polarity of torch's
    ``F.scaled_dot_product_attention``. For 4-D q (B, h, L, d) a key padding mask is (B, 1, 1, S). A 2-D mask
    shaped (B, S) raises instead of being broadcast as an (L, S) mask, even when B == L (then an (L, S) mask
    meant for every sentence must be written ``mask[None, None]``). ``scale`` defaults to ``1 / sqrt(d)``. Dropout zeroes weights (and rescales the rest)
    only when ``training`` is True; the weights returned are those after dropout.
    """
    _check_qkv(q, k, v)
    check_dropout(dropout_p, "dropout_p")
    if mask is not None:
        _check_mask_fits(mask, _scores_shape_probe(q, k), "scores")
    if scale is None:  # under jit.trace the size d is a tensor, and math.sqrt would freeze it
        scale = q.shape[-1] ** -0.5 if tracing() else 1.0 / math.sqrt(q.shape[-1])
    scores = (q * scale) @ k.transpose(-2, -1)  # (..., L, d) @ (..., d, S) -> (..., L, S)
    weights = masked_softmax(scores, mask)  # (..., L, S)
    if training and dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)
    return weights @ v, weights  # (..., L, S) @ (..., S, dv) -> (..., L, dv)


def fused_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    mask: torch.Tensor | None = None,
    dropout_p: float = 0.0,
    training: bool = False,
    is_causal: bool = False,
    scale: float | None = None,
) -> torch.Tensor:
    """The output of :func:`scaled_dot_product_attention`, computed by torch's fused kernel (no weights).

    Same mask convention as :func:`scaled_dot_product_attention` (IGNORE mask or additive), translated here to
    the allow mask torch's ``F.scaled_dot_product_attention`` wants. ``is_causal=True`` (without a mask) uses
    the kernel's own causal masking. Fully masked query rows give zeros with finite gradients on every backend.
    """
    _check_qkv(q, k, v)
    check_dropout(dropout_p, "dropout_p")
    dropout_p = dropout_p if training else 0.0
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, dropout_p=dropout_p, is_causal=is_causal, scale=scale)
    if is_causal:
        raise ValueError("fused_attention takes either mask or is_causal=True; merge the causal mask into mask.")
    _check_mask_fits(mask, _scores_shape_probe(q, k), "scores")
    # Rows with nothing to attend to may attend everywhere inside the kernel (no NaN, in either pass); their output
    # is zeroed afterwards. Branch-free, as in masked_softmax.
    blocked = fully_masked_rows(mask)  # (..., L|1, 1)
    if mask.dtype == torch.bool:
        sdpa_mask = ~mask | blocked  # torch's bool convention: True = MAY attend
    else:
        sdpa_mask = mask.masked_fill(blocked, 0.0)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=sdpa_mask, dropout_p=dropout_p, scale=scale)
    return out.masked_fill(blocked, 0.0)  # (..., L, dv)
