"""The course's causal layer inside ``transformers``' Llama: ``swap_into_llama(model)``.

Every decoder layer of a ``LlamaForCausalLM`` has a ``self_attn`` (``LlamaAttention``) with the projections
``q_proj``, ``k_proj``, ``v_proj``, ``o_proj``, grouped-query heads and split-halves RoPE: the very parameters of
:class:`~attention_course.decoding.CausalSelfAttention`. :func:`swap_into_llama` replaces each by
:class:`LlamaCourseAttention`, a ``CausalSelfAttention`` holding the same weights (the state dict's keys do not
change) whose ``forward`` takes what the decoder layer passes and turns it into the course's arguments:

* ``position_ids`` (B, L) -> ``positions``: the layer computes its own RoPE from them and ignores the
  ``position_embeddings`` (cos, sin) transformers made (same numbers: it computes the angles in float32 as
  transformers does, also in a float64 model);
* ``attention_mask``, transformers' 4-D mask (B, 1, L, T) (eager: additive, 0 / the dtype's minimum; sdpa: bool,
  True = may attend; or None) -> ``key_padding_mask`` (B, T): the row of the last query, which may read every key
  but the pads. The causal mask the layer builds itself, from positions;
* ``past_key_values``, transformers' cache -> a per-layer view of it with the course's cache interface: the keys and
  values stay in transformers' cache (``generate`` reads its length), their positions are kept beside it.

It returns ``(output, None)`` as transformers expects (no attention weights). Tested with transformers 5 (the
attention interface changed between majors 4 and 5; requirements.txt pins the major).
"""
from __future__ import annotations

import weakref

import torch

from .decoding import CausalSelfAttention

# transformers' cache object -> {layer index: key positions (B, S)}; entries go when the cache is freed.
_KEY_POSITIONS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


class _TransformersCacheView:
    """One layer's part of a transformers ``Cache``, seen through the course's cache interface
    (``update(k, v, positions) -> (k_all, v_all, k_positions)``, ``tokens_seen``)."""

    def __init__(self, cache, layer_idx: int):
        self.cache, self.layer_idx = cache, layer_idx

    @property
    def tokens_seen(self) -> int:
        return self.cache.get_seq_length(self.layer_idx)

    def update(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        B, _, L, _ = k.shape
        held = _KEY_POSITIONS.setdefault(self.cache, {})
        past = held.get(self.layer_idx, positions.new_zeros(B, 0))  # (B, S_past)
        if past.shape[1] != self.tokens_seen:
            raise RuntimeError(
                f"transformers' cache holds {self.tokens_seen} tokens for layer {self.layer_idx} but the course "
                f"layer wrote {past.shape[1]}: it was filled or changed outside it (before swap_into_llama, or by "
                f"beam search or cropping, which this adapter does not follow). Start from a new cache."
            )
        k_all, v_all = self.cache.update(k, v, self.layer_idx)  # (B, h_kv, S_past + L, d) each
        held[self.layer_idx] = k_positions = torch.cat((past, positions.expand(B, L)), dim=1)  # (B, S_past + L)
        return k_all, v_all, k_positions


def _key_padding(attention_mask, B: int) -> torch.Tensor | None:
    """transformers' 4-D mask (B|1, 1, L, T) -> the ignore mask (B, T) of the pads, or None."""
    if attention_mask is None:
        return None
    if not isinstance(attention_mask, torch.Tensor) or attention_mask.ndim != 4:
        raise TypeError(
            f"LlamaCourseAttention reads the 4-D attention masks of attn_implementation 'eager' and 'sdpa', got "
            f"{type(attention_mask).__name__} of shape {getattr(attention_mask, 'shape', None)}. Build the model "
            f"with attn_implementation='sdpa' or 'eager'."
        )
    blocked = ~attention_mask if attention_mask.dtype == torch.bool else attention_mask < 0  # (B|1, 1, L, T)
    return blocked[:, 0, -1, :].expand(B, -1)  # the last query reads every key but the pads


class LlamaCourseAttention(CausalSelfAttention):
    """``CausalSelfAttention`` with ``LlamaAttention``'s call signature, for a layer of a transformers Llama.

    Built by :meth:`from_llama` (or :func:`swap_into_llama`); ``layer_idx`` is the layer's index in the cache.
    """

    def __init__(self, *args, layer_idx: int = 0, **kwargs):
        super().__init__(*args, **kwargs)
        self.layer_idx = layer_idx

    @classmethod
    def from_llama(cls, attn, config) -> LlamaCourseAttention:
        """A course layer holding ``attn``'s weights (a ``LlamaAttention`` of a model built from ``config``)."""
        weight = attn.q_proj.weight
        layer = cls(config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                    rope_base=float(config.rope_parameters["rope_theta"]), rope_dtype=torch.float32,
                    bias=attn.q_proj.bias is not None, layer_idx=attn.layer_idx, device=weight.device,
                    dtype=weight.dtype)
        layer.load_state_dict(attn.state_dict())
        return layer.train(attn.training)

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None,
                past_key_values=None, position_ids=None, **kwargs) -> tuple[torch.Tensor, None]:
        B = hidden_states.shape[0]
        cache = None if past_key_values is None else _TransformersCacheView(past_key_values, self.layer_idx)
        positions = None if position_ids is None else position_ids.expand(B, -1)  # (B, L)
        out = super().forward(hidden_states, positions, cache, _key_padding(attention_mask, B))  # (B, L, E)
        return out, None


def _check_config(config) -> None:
    problems = []
    if config._attn_implementation not in ("eager", "sdpa"):
        problems.append(f"attn_implementation is {config._attn_implementation!r}: build the model with "
                        f"attn_implementation='sdpa' or 'eager' (their masks are the ones the adapter reads)")
    if config.rope_parameters.get("rope_type", "default") != "default":
        problems.append(f"rope_type is {config.rope_parameters['rope_type']!r}: only the plain RoPE ('default') "
                        f"is the course's; scaled variants change the angles")
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    if head_dim * config.num_attention_heads != config.hidden_size:
        problems.append(f"head_dim={head_dim} times num_attention_heads={config.num_attention_heads} is not "
                        f"hidden_size={config.hidden_size}: the course's layer has head_dim = hidden_size / heads")
    if config.attention_dropout:
        problems.append(f"attention_dropout={config.attention_dropout}: the course's layer has no dropout; set 0")
    if problems:
        raise ValueError("swap_into_llama cannot hold this model's attention: " + "; ".join(problems) + ".")


def swap_into_llama(model):
    """Replace the ``self_attn`` of every layer of a transformers ``LlamaForCausalLM`` (or ``LlamaModel``) by a
    :class:`LlamaCourseAttention` holding the same weights, in place; returns ``model``.

    The model then computes the same logits and generates the same tokens, with and without its cache and through
    ``model.generate``, left padding included (tests/test_llama.py). Needs ``attn_implementation`` 'eager' or
    'sdpa' and the default RoPE. Beam search and cache cropping are not followed (an error says so).
    """
    from transformers import LlamaForCausalLM, LlamaModel

    if not isinstance(model, (LlamaForCausalLM, LlamaModel)):
        raise TypeError(f"swap_into_llama expects a transformers LlamaForCausalLM or LlamaModel, got "
                        f"{type(model).__name__}.")
    _check_config(model.config)
    layers = model.model.layers if isinstance(model, LlamaForCausalLM) else model.layers
    for layer in layers:
        if not isinstance(layer.self_attn, LlamaCourseAttention):
            layer.self_attn = LlamaCourseAttention.from_llama(layer.self_attn, model.config)
    return model
