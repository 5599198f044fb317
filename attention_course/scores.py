"""Scoring functions: how much a query "likes" each key.

Three ways to score the L tokens of a sentence ``x`` of shape (B, L, D):

* :class:`AdditiveScore` -- a learnable query added to every key, squashed by ``tanh``, projected to one number:
  ``s_i = w^T tanh(W_k x_i + W_q q)``, giving (B, L).
* :class:`DotProductScore` -- a learnable query dotted with every key: ``s_i = q . x_i``, giving (B, L).
* :class:`SelfAttentionScore` -- every token is a query: ``S = Q K^T`` (optionally divided by ``sqrt(D)``),
  with ``Q = x W_q`` and ``K = x W_k``, giving (B, L, L).
"""
import math

import torch
from torch import nn

from .checks import check_floating, check_same_device, check_same_dtype, check_shape


def _check_input(x, module: nn.Module) -> None:
    check_floating(x, "x")
    check_shape(x, "x", ("B", "L", "D"), (None, None, module.embed_dim))
    weight = next(module.parameters())
    check_same_device(x, "x", weight, "the module")
    check_same_dtype(x, "x", weight, "the module")


class AdditiveScore(nn.Module):
    """Additive (Bahdanau-style) score of one learnable query against every token: (B, L, D) -> (B, L)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.query = nn.Parameter(torch.randn(embed_dim))             # (D,)
        self.W_q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_k = nn.Linear(embed_dim, embed_dim, bias=False)
        self.w = nn.Linear(embed_dim, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(x, self)
        hidden = torch.tanh(self.W_k(x) + self.W_q(self.query))       # (B, L, D) + (D,) -> (B, L, D)
        return self.w(hidden).squeeze(-1)                              # (B, L, 1) -> (B, L)


class DotProductScore(nn.Module):
    """Dot-product score of one learnable query against every token: (B, L, D) -> (B, L)."""

    def __init__(self, embed_dim: int):
        super().__init__()
        self.embed_dim = embed_dim
        self.query = nn.Parameter(torch.randn(embed_dim))             # (D,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(x, self)
        return x @ self.query                                          # (B, L, D) @ (D,) -> (B, L)


class SelfAttentionScore(nn.Module):
    """Every token scores every token: (B, L, D) -> (B, L, L), row i = query token i, column j = key token j.

    ``scaled=True`` divides by ``sqrt(D)`` (the scaled dot product of Transformers).
    """

    def __init__(self, embed_dim: int, scaled: bool = True):
        super().__init__()
        self.embed_dim = embed_dim
        self.scaled = scaled
        self.W_q = nn.Linear(embed_dim, embed_dim, bias=False)
        self.W_k = nn.Linear(embed_dim, embed_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _check_input(x, self)
        q, k = self.W_q(x), self.W_k(x)                                # (B, L, D) each
        scores = q @ k.transpose(-2, -1)                               # (B, L, D) @ (B, D, L) -> (B, L, L)
        return scores / math.sqrt(self.embed_dim) if self.scaled else scores
