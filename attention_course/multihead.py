"""Multi-head attention, a drop-in for ``torch.nn.MultiheadAttention`` (batch-first by default; torch's is not)."""
from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .checks import check_dropout, check_floating, check_positive_int, check_shape, tracing
from .functional import fused_attention, scaled_dot_product_attention
from .heads import head_dim, merge_heads, split_heads
from .masks import merge_masks, padding_mask


def _runs_forward(module, args):
    """A forward pre-hook that does nothing. Its presence is what matters: see ``MultiheadAttention``."""


class MultiheadAttention(nn.Module):
    """Multi-head attention with the parameters, initialisation and masks of ``nn.MultiheadAttention``.

    **Batch-first by default, unlike torch.** Inputs are query (B, L, D), key (B, S, kdim), value (B, S, vdim)
    unless you pass ``batch_first=False`` (then (L, B, D), (S, B, kdim), (S, B, vdim), torch's default layout).
    ``nn.MultiheadAttention(D, h)`` is sequence-first; ``MultiheadAttention(D, h)`` here is batch-first:
    ``from_torch`` / ``to_torch`` copy the flag, but a layer you build yourself for a sequence-first model (such as
    ``nn.TransformerEncoderLayer(D, h, ...)`` without ``batch_first=True``) needs ``batch_first=False``, or every
    sentence attends over the wrong axis without an error.

    Parameter names match torch (``in_proj_weight`` (3D, D) holding W_q; W_k; W_v, ``in_proj_bias`` (3D,),
    ``out_proj`` an ``nn.Linear``; ``q_proj_weight``, ``k_proj_weight``, ``v_proj_weight`` instead of
    ``in_proj_weight`` when kdim or vdim differ from D), so ``load_state_dict`` works both ways, and built after the
    same ``torch.manual_seed`` the two layers hold the same numbers. The positional arguments are torch's too.

    ``forward`` takes torch's masks: bool True = this key is NOT attended, float = added to the scores;
    ``key_padding_mask`` (B, S), ``attn_mask`` (L, S) or (B*h, L, S). Differences from torch, on purpose:

    * a query whose keys are all masked gets zero weights and a zero attention output (so its final output is
      ``out_proj.bias``) with finite gradients; torch gives NaN there (with ``need_weights=True``), and NaN
      gradients for every parameter even when that row is left out of the loss;
    * ``is_causal=True`` blocks future keys (key j > query i) itself, with or without ``attn_mask``; torch
      requires an ``attn_mask`` and only takes the flag as a hint that the mask is causal;
    * only batched inputs; no ``add_bias_kv`` / ``add_zero_attn``;
    * every wrong shape, dtype or device raises a ValueError / TypeError that says what to change;
    * this ``forward`` is what runs, always. ``nn.TransformerEncoderLayer`` (and ``nn.TransformerEncoder``) in
      eval mode without gradients take an inference fast path that never calls ``self_attn.forward``: they read
      ``self_attn.in_proj_weight`` and friends and run torch's own fused kernel on them. They decline that path
      when a module carries hooks, so this layer registers a forward pre-hook that does nothing
      (``_runs_forward``): inside those layers it is this code that computes, in every mode, at the price of the
      fast path's speed. (``nn.TransformerEncoder`` may still hand the layers a nested tensor, which ``forward``
      unpacks, attends over with the matching padding mask, and packs again.)

    ``need_weights=True`` runs the explicit computation (:func:`~attention_course.functional.scaled_dot_product_attention`)
    and returns the weights; ``need_weights=False`` runs torch's fused kernel and returns None for them. Both are
    branch-free, so the layer compiles with ``torch.compile(fullgraph=True)``, exports with ``torch.export``,
    traces with ``torch.jit.trace`` and maps with ``torch.func.vmap``, masks included.
    """

    def __init__(
        self,
        embed_dim: int,
        num_heads: int,
        dropout: float = 0.0,
        bias: bool = True,
        add_bias_kv: bool = False,
        add_zero_attn: bool = False,
        kdim: int | None = None,
        vdim: int | None = None,
        batch_first: bool = True,
        device=None,
        dtype=None,
    ):
        super().__init__()
        if add_bias_kv or add_zero_attn:
            raise ValueError(
                "add_bias_kv=True and add_zero_attn=True are not supported here (they append a learned or zero key "
                "to every sentence); use torch.nn.MultiheadAttention for them."
            )
        if not isinstance(batch_first, bool):
            raise TypeError(f"batch_first must be True or False, got {batch_first!r}.")
        factory = {"device": device, "dtype": dtype}
        self.embed_dim = embed_dim
        self.num_heads = num_heads
        self.head_dim = head_dim(embed_dim, num_heads)
        self.kdim = embed_dim if kdim is None else check_positive_int(kdim, "kdim")
        self.vdim = embed_dim if vdim is None else check_positive_int(vdim, "vdim")
        self._qkv_same_embed_dim = self.kdim == embed_dim and self.vdim == embed_dim
        self.dropout = check_dropout(dropout)
        self.batch_first = batch_first
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
        self.register_forward_pre_hook(_runs_forward)  # keeps torch's encoder fast path from skipping forward

    def _reset_parameters(self) -> None:
        for weight in (self.in_proj_weight, self.q_proj_weight, self.k_proj_weight, self.v_proj_weight):
            if weight is not None:
                nn.init.xavier_uniform_(weight)
        if self.in_proj_bias is not None:
            nn.init.zeros_(self.in_proj_bias)
            nn.init.zeros_(self.out_proj.bias)

    @classmethod
    def from_torch(cls, mha: nn.MultiheadAttention) -> MultiheadAttention:
        """A copy of a ``torch.nn.MultiheadAttention``: same weights, layout (``batch_first``), dtype, device, mode."""
        if not isinstance(mha, nn.MultiheadAttention):
            raise TypeError(f"from_torch expects a torch.nn.MultiheadAttention, got {type(mha).__name__}.")
        if mha.bias_k is not None or mha.add_zero_attn:
            raise ValueError("add_bias_kv=True and add_zero_attn=True are not supported here.")
        weight = next(mha.parameters())
        ours = cls(
            mha.embed_dim, mha.num_heads, dropout=mha.dropout, bias=mha.in_proj_bias is not None,
            kdim=mha.kdim, vdim=mha.vdim, batch_first=mha.batch_first, device=weight.device, dtype=weight.dtype,
        )
        ours.load_state_dict(mha.state_dict())
        return ours.train(mha.training)

    def to_torch(self) -> nn.MultiheadAttention:
        """A ``torch.nn.MultiheadAttention`` holding the same weights, layout, dtype, device and mode."""
        weight = next(self.parameters())
        mha = nn.MultiheadAttention(
            self.embed_dim, self.num_heads, dropout=self.dropout, bias=self.in_proj_bias is not None,
            kdim=self.kdim, vdim=self.vdim, batch_first=self.batch_first, device=weight.device, dtype=weight.dtype,
        )
        mha.load_state_dict(self.state_dict())
        return mha.train(self.training)

    def _check_inputs(self, query, key, value) -> None:
        for x, name in ((query, "query"), (key, "key"), (value, "value")):
            check_floating(x, name)
        batch, length = (0, 1) if self.batch_first else (1, 0)  # where B and L (or S) are
        layout = lambda *dims: dims if self.batch_first else (dims[1], dims[0], dims[2])  # noqa: E731
        check_shape(query, "query", layout("B", "L", "D"), layout(None, None, self.embed_dim))
        check_shape(key, "key", layout("B", "S", "kdim"))
        check_shape(value, "value", layout("B", "S", "vdim"))
        if key.shape[batch] != query.shape[batch] or value.shape[batch] != query.shape[batch]:
            raise ValueError(
                f"query, key and value must hold the same number of sentences B (dimension {batch}), got query "
                f"{tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}."
                + ("" if self.batch_first else " This layer has batch_first=False: inputs are (L, B, D).")
            )
        if key.shape[length] != value.shape[length]:
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
        ``average_attn_weights=False``, None with ``need_weights=False``. With ``batch_first=False`` the inputs and
        the output are (L, B, D); the weights keep the batch first, as torch's do."""
        if isinstance(query, torch.Tensor) and query.is_nested:
            return self._forward_nested(query, key, value, key_padding_mask, attn_mask, need_weights,
                                        average_attn_weights, is_causal)
        if not tracing():
            self._check_inputs(query, key, value)
        if not self.batch_first:
            query, key, value = _to_batch_first(query, key, value)  # (L, B, D) -> (B, L, D)
        (B, L, _), S, h = query.shape, key.shape[1], self.num_heads
        _warn_if_every_key_is_masked(key_padding_mask)
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
        out = self.out_proj(merge_heads(out))  # (B, h, L, d) -> (B, L, D) -> (B, L, D)
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def _forward_nested(self, x, key, value, key_padding_mask, attn_mask, need_weights, average, is_causal):
        """Self-attention over a nested tensor (sentences of different lengths, no padding), the form in which
        ``nn.TransformerEncoder`` passes a padded batch to its layers at inference: pad it, attend with the
        matching key padding mask, and nest the result again."""
        if key is not x or value is not x or key_padding_mask is not None or attn_mask is not None:
            raise ValueError(
                "a nested-tensor input is supported for self-attention without masks (query is key is value), the "
                "way nn.TransformerEncoder passes it; for anything else pad it with x.to_padded_tensor(0.0) and pass "
                "a key_padding_mask."
            )
        if not self.batch_first:
            raise ValueError("a nested-tensor input needs batch_first=True: its sentences are batch-first.")
        lengths = [len(sentence) for sentence in x.unbind()]
        padded = x.to_padded_tensor(0.0)  # (B, L, D)
        pads = padding_mask(lengths, padded.shape[1], device=padded.device)  # (B, L), True at the pads
        out, weights = self.forward(padded, padded, padded, pads, need_weights, None, average, is_causal)
        nested = torch.nested.nested_tensor([o[:n] for o, n in zip(out, lengths)], layout=x.layout)
        return nested, weights

    def extra_repr(self) -> str:
        dims = "" if self._qkv_same_embed_dim else f", kdim={self.kdim}, vdim={self.vdim}"
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout}{dims}, "
                f"batch_first={self.batch_first}")


def _to_batch_first(query, key, value):
    """(L, B, D) inputs -> (B, L, D), keeping tensors that were the same tensor (self-attention) the same."""
    q = query.transpose(0, 1)
    k = q if key is query else key.transpose(0, 1)
    v = k if value is key else q if value is query else value.transpose(0, 1)
    return q, k, v


def _warn_if_every_key_is_masked(key_padding_mask) -> None:
    """Warn when a key padding mask blocks every key of every sentence: the output is then out_proj.bias
    everywhere, and the cause is almost always a mask of the opposite polarity."""
    if key_padding_mask is None or torch.compiler.is_compiling() or torch.jit.is_tracing():
        return
    blocked = key_padding_mask if key_padding_mask.dtype == torch.bool else torch.isneginf(key_padding_mask)
    try:
        everything = bool(blocked.all())
    except RuntimeError:  # vmap, export: no value to read while tracing, so no warning there
        return
    if everything and blocked.numel():
        warnings.warn(
            "key_padding_mask masks every key of every sentence, so every query has nothing to attend to and the "
            "attention output is all zeros. This is almost always a mask of the opposite polarity: here True "
            "means 'padding, ignore this key'. If yours is True at the real tokens, pass ~key_padding_mask; a 0/1 "
            "mask with 1 at the real tokens converts with keep_to_ignore(mask).",
            UserWarning,
            stacklevel=5,  # the line that called the layer
        )
