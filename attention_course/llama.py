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
* the cache, transformers' ``Cache`` object, passed as ``cache=`` (transformers 5.24 and later) or
  ``past_key_values=`` (5.0 to 5.23) -> a per-layer view of it with the course's cache interface: the keys and
  values stay in transformers' cache (``generate`` reads its length), their positions are kept beside it.

It returns ``(output, None)`` as transformers expects (no attention weights). An argument it does not understand
is never dropped: a keyword outside :data:`UNDERSTOOD` that carries a value (a cache, a mask or positions under a
name this adapter does not know, as a later transformers may pass) raises :class:`UnknownLlamaArgument`, saying which
transformers is installed and what to do. Tested on the transformers 5 releases of the locked and the lowest and
newest environments (README, "Versions").
"""
from __future__ import annotations

import weakref

import torch

from .decoding import CausalSelfAttention, repeat_kv
from .functional import scaled_dot_product_attention

# Keywords a transformers 5 Llama layer passes that the course's layer reads (the cache under both of its names) or
# may ignore: they change nothing the layer computes (use_cache: the cache argument says it; cache_position: the
# positions come as position_ids; output_* and num_items_in_batch concern the model's outputs and loss).
READ = ("hidden_states", "position_embeddings", "attention_mask", "cache", "past_key_values", "position_ids")
IGNORED = ("use_cache", "cache_position", "output_hidden_states", "output_router_logits", "num_items_in_batch")
UNDERSTOOD = READ + IGNORED


class UnknownLlamaArgument(TypeError):
    """transformers passed the layer an argument the adapter does not understand: running on without it could give
    wrong numbers silently (a cache, a mask or positions under a new name)."""


def _refuse_unknown(kwargs: dict) -> None:
    """Raise for every keyword that carries something this adapter would drop (None and False carry nothing)."""
    unknown = {k: v for k, v in kwargs.items() if k not in UNDERSTOOD and v is not None and v is not False}
    if kwargs.get("output_attentions"):
        unknown["output_attentions"] = True
    if not unknown:
        return
    import transformers

    names = ", ".join(f"{k}={type(v).__name__}" for k, v in unknown.items())
    raise UnknownLlamaArgument(
        f"LlamaCourseAttention was given {names} by transformers {transformers.__version__}, and does not know what "
        f"to do with it: running on without it could compute something else silently (a cache, mask or positions "
        f"under a new name; output_attentions needs weights the layer does not return). The course's adapter "
        f"understands {', '.join(UNDERSTOOD)}. Install the transformers release the course was tested with "
        f"(`pip install -e .` in the course's folder installs a compatible one; the lock file locks/dev.txt names "
        f"the exact one), or report the new argument."
    )

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

    def forward(self, hidden_states: torch.Tensor, position_embeddings=None, attention_mask=None, cache=None,
                past_key_values=None, position_ids=None, **kwargs) -> tuple[torch.Tensor, None]:
        _refuse_unknown(kwargs)
        if cache is not None and past_key_values is not None and cache is not past_key_values:
            raise TypeError("LlamaCourseAttention was given two caches, cache= and past_key_values=: pass one.")
        cache = cache if cache is not None else past_key_values  # (5.24 and later: cache=; before: past_key_values=)
        B = hidden_states.shape[0]
        cache = None if cache is None else _TransformersCacheView(cache, self.layer_idx)
        positions = None if position_ids is None else position_ids.expand(B, -1)  # (B, L)
        out = super().forward(hidden_states, positions, cache, _key_padding(attention_mask, B))  # (B, L, E)
        return out, None


def cache_keyword(model) -> str:
    """The name under which ``model``'s ``forward`` takes its cache: ``"cache"`` from transformers 5.24 on,
    ``"past_key_values"`` before. A wrong name is not an error in either: an older model takes ``cache=`` into its
    ``**kwargs`` and runs without it, so a loop that hands the model its cache must ask which name it reads.
    """
    import inspect

    parameters = inspect.signature(type(model).forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


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


# -- transformers' own extension point ----------------------------------------------------------------------------
COURSE_ATTENTION = "course"


def course_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """The course's attention core as a transformers attention function: what ``AttentionInterface`` calls with the
    layer's queries (B, h, L, d) and keys and values (B, h_kv, S, d), already projected, turned by RoPE and
    appended to the cache, and the model's boolean mask (B|1, 1, L, S), True = may attend. Returns the output as
    (B, L, h, d) and the weights, as transformers expects.

    It replaces only the core of the layer: sharing key/value heads (``repeat_kv``), the scores, the masked softmax
    and the weighted sum. The projections, RoPE, the cache and the mask's construction stay transformers' own.
    """
    if dropout and module.training:
        raise ValueError(f"course_attention has no dropout; the model asks for {dropout}: set attention_dropout=0.")
    k = repeat_kv(key, query.shape[1] // key.shape[1])  # (B, h, S, d)
    v = repeat_kv(value, query.shape[1] // value.shape[1])  # (B, h, S, d)
    ignore = None if attention_mask is None else ~attention_mask  # the course's polarity: True = blocked
    out, weights = scaled_dot_product_attention(query, k, v, ignore, scale=scaling)  # (B, h, L, d), (B, h, L, S)
    return out.transpose(1, 2).contiguous(), weights  # (B, L, h, d)


def full_bool_mask(*args, **kwargs):
    """transformers' boolean SDPA mask (True = may attend), always built in full. ``sdpa_mask`` itself returns None
    where a causal mask without padding would do, because SDPA then runs with ``is_causal``; an attention function
    that does not read ``is_causal`` (the course's) would then attend to the future."""
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, **{**kwargs, "allow_is_causal_skip": False})


def register_attention(name: str, function) -> str:
    """Register an attention function of the course with transformers under ``name``, with :func:`full_bool_mask`;
    returns ``name``, for ``model.set_attn_implementation(name)`` or ``attn_implementation=name``."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, full_bool_mask)
    return name


def register_course_attention() -> str:
    """Register :func:`course_attention` with transformers under the name ``"course"`` and return the name:
    ``model.set_attn_implementation("course")``, or ``attn_implementation="course"`` when building a model, then
    runs the course's core in every attention layer of any model written with transformers' attention interface
    (Llama, Mistral, Qwen, ...), not only Llama."""
    return register_attention(COURSE_ATTENTION, course_attention)
