"""Rotary position embeddings (RoPE): positions written into queries and keys as rotations.

Cut a query (or key) of ``d`` features into ``d / 2`` pairs and turn pair ``i`` of the vector at position ``m`` by
the angle ``m * theta_i``, with ``theta_i = base ** (-2i / d)`` (``base`` = 10000): fast turns on the first pairs,
slow ones on the last. A rotation keeps lengths, and two rotations compose by adding their angles, so

    <R(m) q, R(n) k> = <q, R(n - m) k>                  # the score depends on m - n only

which is why RoPE is a *relative* position scheme although each vector only ever sees its absolute position.
Queries and keys are rotated, values never (the rotation is there to shape the scores, not what is averaged).

Two conventions pair the features differently, and both are in use:

* **split halves** (Llama, ``transformers``, this package's default): pair ``i`` is features ``(i, i + d/2)``,
  computed as ``x * cos + rotate_half(x) * sin``;
* **interleaved** (RoFormer, GPT-J, Meta's original Llama code with complex numbers): pair ``i`` is features
  ``(2i, 2i + 1)``.

They are the same computation on features in another order: :func:`halves_from_interleaved` gives the fixed
permutation, so a model trained with one convention runs in the other once the rows of W_q and W_k (within each
head) are permuted. Mixing them up raises no error: the model just reads positions wrong.
"""
from __future__ import annotations

import torch

from .checks import check_floating, check_positive_int, check_tensor


def _check_head_dim(head_dim, name: str = "head_dim") -> int:
    check_positive_int(head_dim, name)
    if head_dim % 2:
        raise ValueError(
            f"RoPE turns pairs of features, so {name} must be even, got {head_dim}. Choose an even head size "
            f"(embed_dim / num_heads), or build the layer with rope=False."
        )
    return head_dim


def check_positions(positions, name: str = "positions", *, length: int | None = None,
                    batch: int | None = None, device=None) -> torch.Tensor:
    """``positions`` must be an integer tensor (L,) or (B, L), with L = ``length`` and B = ``batch`` when given."""
    check_tensor(positions, name)
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise TypeError(
            f"{name} must hold integer token positions (torch.long), got dtype {positions.dtype}. "
            f"Build them with torch.arange(start, start + L)."
        )
    if positions.ndim not in (1, 2):
        raise ValueError(
            f"{name} must have shape (L,) (the same for every sentence) or (B, L), got {tuple(positions.shape)}."
        )
    if length is not None and positions.shape[-1] != length:
        raise ValueError(
            f"{name} must give one position per token: L={length}, got {positions.shape[-1]} in shape "
            f"{tuple(positions.shape)}. With a cache, the new tokens' positions continue the old ones: "
            f"torch.arange(len_seen, len_seen + L)."
        )
    if batch is not None and positions.ndim == 2 and positions.shape[0] != batch:
        raise ValueError(
            f"{name} of shape (B, L) = {tuple(positions.shape)} must have one row per sentence (B={batch}); "
            f"pass one row of shape (L,) if every sentence has the same positions."
        )
    if device is not None and positions.device != torch.device(device):
        raise ValueError(f"{name} is on {positions.device} but the input is on {device}. "
                         f"Move it with {name}.to({str(device)!r}).")
    return positions


def rope_cos_sin(positions: torch.Tensor, head_dim: int, *, base: float = 10000.0,
                 dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of the rotation angles, each of shape ``positions.shape + (head_dim,)``, in ``dtype``.

    Split-halves layout: frequency ``i`` sits at features ``i`` and ``i + head_dim/2``; the angle of position
    ``m`` is ``m * theta_i`` with ``theta_i = 1 / base ** (2i / head_dim)``. Computed in ``dtype`` (written as
    ``transformers`` writes it, so that in float32 the two agree bit for bit).
    """
    check_positions(positions)
    _check_head_dim(head_dim)
    if not dtype.is_floating_point:
        raise TypeError(f"dtype must be a floating-point dtype for the angles, got {dtype}.")
    i2 = torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.int64).to(dtype)  # (d/2,): 0, 2, 4...
    theta = 1.0 / (base ** (i2 / head_dim))  # (d/2,)
    angles = positions[..., None].to(dtype) * theta  # (..., L, d/2)
    angles = torch.cat((angles, angles), dim=-1)  # (..., L, d): frequency i at i and i + d/2
    return angles.cos(), angles.sin()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """(x1, x2) halves of the last dimension -> (-x2, x1): each pair (x1[i], x2[i]) turned by a quarter turn."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def apply_rope(x: torch.Tensor, positions: torch.Tensor, *, base: float = 10000.0, interleaved: bool = False,
               angle_dtype: torch.dtype | None = None) -> torch.Tensor:
    """Rotate queries or keys ``x`` (B, h, L, d) or (B, L, d) by their ``positions`` (L,) or (B, L).

    ``interleaved=False`` (split halves, Llama): ``x * cos + rotate_half(x) * sin``. ``interleaved=True``: pairs
    (0, 1), (2, 3), ... The angles are computed in ``angle_dtype`` (default: ``x``'s dtype, so float64 stays exact;
    ``transformers`` computes them in float32 whatever the model's dtype) and the result has ``x``'s dtype.
    """
    check_floating(x, "x")
    if x.ndim not in (3, 4):
        raise ValueError(f"x must have shape (B, h, L, d) or (B, L, d), got {tuple(x.shape)}.")
    d = _check_head_dim(x.shape[-1], "x's last dimension (head_dim)")
    check_positions(positions, length=x.shape[-2], batch=x.shape[0], device=x.device)
    cos, sin = rope_cos_sin(positions, d, base=base, dtype=angle_dtype or x.dtype)  # (L, d) or (B, L, d)
    cos, sin = cos.to(x.dtype), sin.to(x.dtype)
    if x.ndim == 4 and positions.ndim == 2:
        cos, sin = cos[:, None], sin[:, None]  # (B, 1, L, d): the same rotation for every head
    if not interleaved:
        return x * cos + rotate_half(x) * sin
    a, b = x.unflatten(-1, (d // 2, 2)).unbind(-1)  # each (..., L, d/2): features 0, 2, 4... and 1, 3, 5...
    cos, sin = cos[..., : d // 2], sin[..., : d // 2]  # (..., L, d/2): one angle per pair
    return torch.stack((a * cos - b * sin, b * cos + a * sin), dim=-1).flatten(-2)  # (..., L, d)


def halves_from_interleaved(head_dim: int) -> torch.Tensor:
    """The permutation ``perm`` (LongTensor (head_dim,)) of features that turns interleaved RoPE into split halves:

        apply_rope(x[..., perm], p) == apply_rope(x, p, interleaved=True)[..., perm]

    ``perm = [0, 2, 4, ..., 1, 3, 5, ...]``: pair (2i, 2i + 1) moves to (i, i + head_dim/2). Scores are dot
    products, unchanged when q and k are permuted alike, so an interleaved model's scores are a split-halves
    model's with the rows of W_q and W_k permuted by ``perm`` within each head.
    """
    _check_head_dim(head_dim)
    return torch.cat((torch.arange(0, head_dim, 2), torch.arange(1, head_dim, 2)))
