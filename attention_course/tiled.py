"""Tiled attention: softmax(q k^T / sqrt(d) + mask) v, one block of queries and one block of keys at a time.

The explicit version holds the (..., L, S) scores and weights; this one never does. For each block of queries it
walks over the blocks of keys with the online softmax (chapter 8): a running row maximum ``m``, a running
normaliser ``l`` and a running weighted sum ``acc``, rescaled by ``exp(m_old - m_new)`` whenever the maximum
grows. The largest thing alive is one (..., block, block) tile of scores.

    for each key block j:
        s      = q_i k_j^T * scale (+ mask)            # (..., bq, bk)
        m_new  = max(m, rowmax(s))
        p      = exp(s - m_new)
        l      = exp(m - m_new) * l + rowsum(p)
        acc    = exp(m - m_new) * acc + p v_j
    out_i = acc / l

Shapes and masks are those of ``torch.nn.functional.scaled_dot_product_attention``: q (..., L, d),
k (..., S, d), v (..., S, dv); a bool ``attn_mask`` means True = MAY attend (the opposite of the rest of this
package), a float one is added to the scores; ``is_causal=True`` lets query i attend keys 0..i. A query with
nothing to attend to gets a zero output (not NaN), with finite gradients. Plain PyTorch, so autograd
differentiates through the loop.
"""
from __future__ import annotations

import math

import torch

from .checks import check_device, check_positive_int, check_tensor, tracing
from .functional import _check_qkv


def _check_attn_mask(mask, q: torch.Tensor, L: int, S: int) -> torch.Tensor:
    """A bool (True = may attend) or float (additive) mask broadcastable to (..., L, S), as at least 2-D."""
    check_tensor(mask, "attn_mask")
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"attn_mask has dtype {mask.dtype}; it must be bool (True = MAY attend, as in "
            f"F.scaled_dot_product_attention) or floating (added to the scores: 0 = attend, -inf = blocked). "
            f"An ignore mask from this package converts with ~mask."
        )
    if mask.is_floating_point() and mask.dtype != q.dtype:
        raise TypeError(f"attn_mask is a float mask of dtype {mask.dtype} but q is {q.dtype}. "
                        f"Convert it with attn_mask.to(q.dtype).")
    check_device(mask, "attn_mask", q.device, "q")
    scores_shape = (*q.shape[:-2], L, S)
    try:
        fits = torch.broadcast_shapes(mask.shape, scores_shape) == scores_shape
    except RuntimeError:
        fits = False
    if not fits:
        raise ValueError(
            f"attn_mask of shape {tuple(mask.shape)} does not broadcast to the scores' shape (..., L, S) = "
            f"{scores_shape}. A key padding mask (B, S) for q (B, h, L, d) is attn_mask[:, None, None, :]."
        )
    return mask.reshape((1,) * (2 - mask.ndim) + mask.shape)  # (..., L|1, S|1)


def _tile(mask: torch.Tensor, rows: slice, cols: slice) -> torch.Tensor:
    """The (..., bq, bk) piece of a mask that may be broadcast (size 1) along the queries or the keys."""
    if mask.shape[-2] != 1:
        mask = mask[..., rows, :]
    if mask.shape[-1] != 1:
        mask = mask[..., cols]
    return mask


def merge_tile(state, s: torch.Tensor, v: torch.Tensor):
    """The online softmax's step: fold a tile of scores s (..., bq, bk) over values v (..., bk, dv) into the running
    (m, l, acc) of its queries -> the new (m, l, acc). m (..., bq, 1) is the running maximum, l (..., bq, 1) the
    running normaliser, acc (..., bq, dv) the running weighted sum; a row that has seen only -inf keeps m = -inf,
    l = 0 and acc = 0, and a tile of no key at all (bk = 0) changes nothing. Used by tiled_attention and, across
    ranks, by distributed.ring_attention."""
    m, l, acc = state  # noqa: E741
    if s.shape[-1] == 0:  # no key: nothing to fold in (amax over an empty axis would raise); a branch on the shape only
        return m, l, acc
    # The output does not depend on m (it cancels in acc / l): no gradient needs to flow through it.
    m_new = torch.maximum(m, s.amax(-1, keepdim=True)).detach()  # (..., bq, 1)
    # A row that has seen only -inf so far subtracts 0 instead: exp(-inf - 0) = 0, where -inf - -inf = NaN.
    shift = m_new.masked_fill(m_new == float("-inf"), 0.0)  # (..., bq, 1)
    p = torch.exp(s - shift)  # (..., bq, bk), unnormalised weights of this tile
    correction = torch.exp(m - shift)  # (..., bq, 1), rescales what was summed under the old maximum
    return m_new, correction * l + p.sum(-1, keepdim=True), correction * acc + p @ v  # (..., bq, dv)


def tiled_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    attn_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    block_size: int = 256,
    scale: float | None = None,
) -> torch.Tensor:
    """Attention of q (..., L, d) over k (..., S, d), v (..., S, dv), computed tile by tile -> (..., L, dv).

    Equal (up to rounding) to ``F.scaled_dot_product_attention(q, k, v, attn_mask, is_causal=is_causal,
    scale=scale)``, with the same bool polarity (True = may attend), except that a query with no key to attend
    to gets zeros. ``block_size`` queries and keys per tile: memory (..., block_size, block_size) per tile
    instead of (..., L, S). ``scale`` defaults to ``1 / sqrt(d)``.
    """
    _check_qkv(q, k, v)
    block_size = check_positive_int(block_size, "block_size")
    L, S = q.shape[-2], k.shape[-2]
    if attn_mask is not None:
        if is_causal:
            raise ValueError("tiled_attention takes either attn_mask or is_causal=True, as "
                             "F.scaled_dot_product_attention does; merge the causal mask into attn_mask.")
        if not tracing():
            attn_mask = _check_attn_mask(attn_mask, q, L, S)
    if scale is None:
        scale = 1.0 / math.sqrt(q.shape[-1])
    out = q.new_empty((*q.shape[:-1], v.shape[-1]))  # (..., L, dv), filled one block of queries at a time
    for i0 in range(0, L, block_size):
        i1 = min(i0 + block_size, L)
        qi = q[..., i0:i1, :] * scale  # (..., bq, d), scaled once for all its tiles
        m = q.new_full((*qi.shape[:-1], 1), float("-inf"))  # (..., bq, 1) running maximum
        l = q.new_zeros(m.shape)  # (..., bq, 1) running normaliser  # noqa: E741
        acc = q.new_zeros((*qi.shape[:-1], v.shape[-1]))  # (..., bq, dv) running weighted sum
        for j0 in range(0, S, block_size):
            j1 = min(j0 + block_size, S)
            if is_causal and j0 > i1 - 1:
                break  # this key block and all later ones are in every query's future
            s = qi @ k[..., j0:j1, :].transpose(-2, -1)  # (..., bq, bk)
            if is_causal and j1 - 1 > i0:  # the tile crosses the diagonal
                rows = torch.arange(i0, i1, device=q.device)[:, None]
                cols = torch.arange(j0, j1, device=q.device)[None, :]
                s = s.masked_fill(cols > rows, float("-inf"))
            elif attn_mask is not None:
                tile = _tile(attn_mask, slice(i0, i1), slice(j0, j1))
                s = s.masked_fill(~tile, float("-inf")) if tile.dtype == torch.bool else s + tile
            m, l, acc = merge_tile((m, l, acc), s, v[..., j0:j1, :])  # noqa: E741
        # A query that saw no key has l = 0 and acc = 0: divide by 1 instead, the output is 0.
        out[..., i0:i1, :] = acc / l.masked_fill(l == 0, 1.0)  # autograd records the copy into the slice
    return out  # (..., L, dv)
