"""Splitting the embedding into heads and back.

With ``D = h * d``, head ``i`` owns the features ``i*d : (i+1)*d`` of every token. Two layouts:

* 4-D (B, h, L, d): :func:`split_heads` / :func:`merge_heads`;
* flat (B*h, L, d), batch-major (row ``b * h + head``), the layout of the seeds and of torch's 3-D ``attn_mask``:
  :func:`split_heads_flat` / :func:`merge_heads_flat`.
"""
import torch

from .checks import check_positive_int, check_shape, check_tensor, tracing


def head_dim(embed_dim: int, num_heads: int) -> int:
    """``embed_dim // num_heads``, or a ValueError listing the head counts that divide ``embed_dim``."""
    check_positive_int(embed_dim, "embed_dim")
    check_positive_int(num_heads, "num_heads")
    if embed_dim % num_heads:
        divisors = ", ".join(str(n) for n in range(1, embed_dim + 1) if embed_dim % n == 0)
        raise ValueError(
            f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}: choose num_heads among {divisors}."
        )
    return embed_dim // num_heads


def split_heads(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, L, D) -> (B, h, L, d)."""
    check_tensor(x, "x")
    check_shape(x, "x", ("B", "L", "D"))
    d = x.shape[-1] // num_heads if tracing() else head_dim(x.shape[-1], num_heads)
    return x.unflatten(-1, (num_heads, d)).transpose(1, 2)  # (B, L, h, d) -> (B, h, L, d)


def merge_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, h, L, d) -> (B, L, D) with D = h * d."""
    check_tensor(x, "x")
    if x.ndim == 3:
        raise ValueError(
            f"x must have 4 dimensions (B, h, L, d), got shape {tuple(x.shape)}. "
            f"For the flat layout (B*h, L, d) use merge_heads_flat(x, num_heads)."
        )
    check_shape(x, "x", ("B", "h", "L", "d"))
    return x.transpose(1, 2).flatten(2)  # (B, L, h, d) -> (B, L, D)


def split_heads_flat(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, L, D) -> (B*h, L, d), row ``b * h + head``."""
    return split_heads(x, num_heads).flatten(0, 1)  # (B, h, L, d) -> (B*h, L, d)


def merge_heads_flat(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B*h, L, d) -> (B, L, D), the inverse of :func:`split_heads_flat`."""
    check_tensor(x, "x")
    check_shape(x, "x", ("B*h", "L", "d"))
    check_positive_int(num_heads, "num_heads")
    if x.shape[0] % num_heads:
        raise ValueError(
            f"x has {x.shape[0]} rows in dimension 0, which is not a multiple of num_heads={num_heads}: "
            f"expected (B*h, L, d) from split_heads_flat with the same num_heads."
        )
    return merge_heads(x.unflatten(0, (-1, num_heads)))  # (B, h, L, d) -> (B, L, D)
