"""Multi-head attention, a batch-first drop-in for ``torch.nn.MultiheadAttention(..., batch_first=True)``."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_dropout, check_floating, check_positive_int, check_shape
from .functional import fused_attention, scaled_dot_product_attention
from .heads import head_dim, merge_heads, split_heads
from .masks import merge_masks


class MultiheadAttention(nn.Module):
    """Multi-head attention with the parameters, initialisation and masks of ``nn.MultiheadAttention``.

    Inputs are batch-first: query (B, L, D), key (B, S, kdim), value (B, S, vdim). Parameter names match torch
    (``in_proj_weight`` (3D, D) holding W_q; W_k; W_v, ``in_proj_bias`` (3D,), ``out_proj`` an ``nn.Linear``;
    ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` instead of ``in_proj_weight`` when kdim or vdim
    differ from D), so ``load_state_dict`` works both ways, and built after the same ``torch.manual_seed`` the
    two layers hold the same numbers.

    ``forward`` takes torch's masks: bool True = this key is NOT attended, float = added to the scores;
    ``key_padding_mask`` (B, S), ``attn_mask`` (L, S) or (B*h, L, S). Differences from torch, on purpose:

    * a query whose keys are all masked gets zero weights and a zero attention output (so its final output is
      ``out_proj.bias``) with finite gradients; torch gives NaN there (with ``need_weights=True``), and NaN
      gradients for every parameter even when that row is left out of the loss;
    * ``is_causal=True`` blocks future keys (key j > query i) itself, with or without ``attn_mask``; torch
      requires an ``attn_mask`` and only takes the flag as a hint that the mask is causal;
    * only batched, batch-first inputs; no ``add_bias_kv`` / ``add_zero_attn``;
    * every wrong shape, dtype or device raises a ValueError / TypeError that says what to change.

    ``need_weights=True`` runs the explicit computation (:func:`~attention_course.functional.scaled_dot_product_attention`)
    and returns the weights; ``need_weights=False`` runs torch's fused kernel and returns None for them.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        kdim: int | None = None,
        vdim: int | None = None,
        device=None,
        dtype=None,
    ):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = head_dim(embed_dim, num_heads)
        self.kdim = embed_dim if kdim is None else check_positive_int(kdim, "kdim")
        self.vdim = embed_dim if vdim is None else check_positive_int(vdim, "vdim")
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout = check_dropout(dropout)
        self.batch_first = True
        # Created in torch's order, so that the same seed gives the same initial weights.
        if self._qkv_same_embed_dim:
            self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim, **factory))  # (3D, D)
            for name in ("q_proj_weight", "k_proj_weight", "v_proj_weight"):
                self.register_parameter(name, None)
        else:
            self.register_parameter("in_proj_weight", None)
            self.q_proj_weight = nn.Parameter(torch.empty(embed_dim, embed_dim, **factory))  # (D, D)
            self.k_proj_weight = nn.Parameter(torch.empty(embed_dim, self.kdim, **factory))  # (D, kdim)
            self.v_proj_weight = nn.Parameter(torch.empty(embed_dim, self.vdim, **factory))  # (D, vdim)
        if bias:
            self.in_proj_bias = nn.Parameter(torch.empty(3 * embed_dim, **factory))  # (3D,)
        else:
            self.register_parameter("in_proj_bias", None)
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias, **factory)
        self._reset_parameters()

    def _reset_parameters(self) -> None:
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiheadAttention:
        """A copy of a ``torch.nn.MultiheadAttention(batch_first=True)``: same weights, dtype, device and mode."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(mha).__name__}.")
        if not mha.batch_first:
            raise ValueError(
                "from_torch needs a batch-first layer: this one has batch_first=False and reads (L, B, D) inputs. "
                "Build it with nn.MultiheadAttention(..., batch_first=True) (the weights are the same, "
                "copy them with parity.copy_weights), or transpose your inputs with x.transpose(0, 1)."
            )
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv=True and add_zero_attn=True are not supported here.")
        weight = next(mha.parameters())
        ours = cls(
            mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
            kdim=mha.kdim, vdim=mha.vdim, device=weight.device, dtype=weight.dtype,
        )
        ours.load_state_dict(mha.state_dict())
        return ours.train(mha.training)

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention(batch_first=True)`` holding the same weights, dtype, device and mode."""
        weight = next(self.parameters())
        mha = nn.MultiheadAttention(
            self.embed_dim, self.num_heads, dropout=self.dropout, bias=self.in_proj_bias is not None,
            kdim=self.kdim, vdim=self.vdim, batch_first=True, device=weight.device, dtype=weight.dtype,
        )
        mha.load_state_dict(self.state_dict())
        return mha.train(self.training)

    def _check_inputs(self, query, key, value) -> None:
        for x, name in ((query, "query"), (key, "key"), (value, "value")):
            check_floating(x, name)
        check_shape(query, "query", ("B", "L", "D"), (None, None, self.embed_dim))
        check_shape(key, "key", ("B", "S", "kdim"))
        check_shape(value, "value", ("B", "S", "vdim"))
        if key.shape[0] != query.shape[0] or value.shape[0] != query.shape[0]:
            raise ValueError(
                f"query, key and value must hold the same number of sentences B (dimension 0), got query "
                f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}."
            )
        if key.shape[1] != value.shape[1]:
            raise ValueError(
                f"key and value must have the same length S (one value per key), got key {tuple(key.shape)} "
                f"and value {tuple(value.shape)}."
            )
        for x, name, size, arg in ((key, "key", self.kdim, "kdim"), (value, "value", self.vdim, "vdim")):
            if x.shape[-1] != size:
                raise ValueError(
                    f"{name} has {x.shape[-1]} features but this layer expects {arg}={size} "
                    f"(query has D={self.embed_dim}). Build the layer with {arg}={x.shape[-1]} for such {name}s."
                )
        weight = self.out_proj.weight
        for x, name in ((query, "query"), (key, "key"), (value, "value")):
            if x.dtype != weight.dtype:
                raise TypeError(
                    f"{name} is {x.dtype} but the layer's weights are {weight.dtype}. Convert the input with "
                    f"{name}.to({weight.dtype}) or the layer with layer.to({x.dtype})."
                )
            if x.device != weight.device:
                raise ValueError(
                    f"{name} is on {x.device} but the layer is on {weight.device}. Move the input with "
                    f"{name}.to('{weight.device}') or the layer with layer.to('{x.device}')."
                )

    def _project(self, query, key, value):
        """The input projections q = query W_q^T + b_q, etc.: (B, L, D), (B, S, D), (B, S, D)."""
        D = self.embed_dim
        bias = self.in_proj_bias
        b_q, b_k, b_v = (None, None, None) if bias is None else bias.chunk(3)
        if not self._qkv_same_embed_dim:
            W_q, W_k, W_v = self.q_proj_weight, self.k_proj_weight, self.v_proj_weight
        elif query is key and key is value:  # self-attention: one matmul for all three
            return F.linear(query, self.in_proj_weight, bias).chunk(3, dim=-1)
        elif key is value:  # one matmul for k and v
            W_q, W_kv = self.in_proj_weight.split([D, 2 * D])
            b_kv = None if bias is None else bias[D:]
            return (F.linear(query, W_q, b_q), *F.linear(key, W_kv, b_kv).chunk(2, dim=-1))
        else:
            W_q, W_k, W_v = self.in_proj_weight.chunk(3)
        return F.linear(query, W_q, b_q), F.linear(key, W_k, b_k), F.linear(value, W_v, b_v)

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        need_weights: bool = True,
        attn_mask: torch.Tensor | None = None,
        average_attn_weights: bool = True,
        is_causal: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Returns ``(output (B, L, D), weights)``: weights (B, L, S) averaged over heads, (B, h, L, S) with
        ``average_attn_weights=False``, None with ``need_weights=False``."""
        self._check_inputs(query, key, value)
        (B, L, _), S, h = query.shape, key.shape[1], self.num_heads
        # The fused kernel masks causally by itself when there is no other mask.
        kernel_causal = is_causal and not need_weights and key_padding_mask is None and attn_mask is None
        mask = merge_masks(
            key_padding_mask, attn_mask, batch_size=B, num_heads=h, query_len=L, key_len=S,
            is_causal=is_causal and not kernel_causal, dtype=query.dtype, device=query.device, expand=False,
        )  # (B|1, h|1, L|1, S), bool ignore or additive float, or None
        q, k, v = (split_heads(x, h) for x in self._project(query, key, value))  # (B, h, L|S, d)
        if need_weights:
            out, weights = scaled_dot_product_attention(q, k, v, mask, self.dropout, self.training)
            weights = weights.mean(dim=1) if average_attn_weights else weights  # (B, L, S) or (B, h, L, S)
        else:
            out, weights = fused_attention(q, k, v, mask, self.dropout, self.training, kernel_causal), None
        return self.out_proj(merge_heads(out)), weights  # (B, h, L, d) -> (B, L, D) -> (B, L, D)

    def extra_repr(self) -> str:
        dims = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}{dims}"
