"""The course's causal layer reading a paged cache: a whole continuous-batching step in one attention call.

:func:`paged_self_attention` takes a layer (:class:`~attention_course.decoding.CausalSelfAttention`, its weights and
RoPE) and the packed tokens of a step (N rows from several requests, prefill chunks and decode tokens mixed). It
projects all N rows at once, writes their keys and values into the pool, gathers each request's keys and values
through its block table, lays them end to end (S keys) and attends with one (N, S) ignore mask: a query sees a key
when both belong to the same request and the key's position is not after the query's (and, with the layer's
``window``, less than ``window`` positions before it). The same block-diagonal causal mask as for packing, with
positions taken from the requests rather than from the rows.

:func:`serve_llama` puts it into every layer of a transformers Llama whose attention is the course's
(:func:`attention_course.llama.swap_into_llama`), so that the scheduler drives that model too.
"""
from __future__ import annotations

import torch
from torch import nn

from ..decoding import CausalSelfAttention, repeat_kv
from ..functional import fused_attention
from ..rope import apply_rope
from .paged import PagedKVCache


def step_keys(batch, cache: PagedKVCache, layer: int):
    """Every key and value the step's requests hold, end to end: k, v (h_kv, S, d), their positions (S,) and the
    index (0 .. n-1) of the request each belongs to (S,). The slots are looked up once per step (every layer shares
    the block tables) and read with one indexing of the pool."""
    if getattr(batch, "key_index", None) is None:
        slots = [cache.slots_of(request) for request in batch.requests]  # (T_i,) each
        batch.key_index = (torch.cat(slots).to(cache.k.device),
                           torch.cat([torch.arange(len(s)) for s in slots]).to(cache.k.device),
                           torch.cat([torch.full((len(s),), i) for i, s in enumerate(slots)]).to(cache.k.device))
    slots, positions, owners = batch.key_index
    block, offset = slots // cache.block_size, slots % cache.block_size
    k = cache.k[layer][block, :, offset].transpose(0, 1)  # (S, h_kv, d) -> (h_kv, S, d)
    v = cache.v[layer][block, :, offset].transpose(0, 1)
    return k, v, positions, owners  # (h_kv, S, d) x 2, (S,) x 2


def step_mask(batch, k_positions, k_owners, window: int | None = None) -> torch.Tensor:
    """Ignore mask (N, S) of a step: another request's key, a later key, or (with ``window``) one too far back."""
    lengths = batch.cu[1:] - batch.cu[:-1]
    q_owners = torch.repeat_interleave(torch.arange(len(lengths)), lengths).to(k_owners.device)  # (N,)
    q_positions = batch.positions.to(k_owners.device)  # (N,)
    back = q_positions[:, None] - k_positions[None, :]  # (N, S): how far the key lies before the query
    ignore = (q_owners[:, None] != k_owners[None, :]) | (back < 0)
    if window is not None:
        ignore = ignore | (back >= window)
    return ignore


def paged_self_attention(layer: CausalSelfAttention, x: torch.Tensor, batch, cache: PagedKVCache,
                         layer_idx: int) -> torch.Tensor:
    """The layer on a step's packed rows x (N, E): keys and values written to ``cache`` (layer ``layer_idx``), each
    query reading its own request's cache. Returns (N, E)."""
    if not isinstance(layer, CausalSelfAttention):
        raise TypeError(f"layer must be a CausalSelfAttention, got {type(layer).__name__}.")
    if x.ndim != 2 or x.shape != (len(batch.tokens), layer.embed_dim):
        raise ValueError(f"x must be the step's packed rows (N, E) = {(len(batch.tokens), layer.embed_dim)}, got "
                         f"{tuple(x.shape)}.")
    N = x.shape[0]
    h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q = layer.q_proj(x).view(N, h, d).transpose(0, 1)  # (h, N, d)
    k = layer.k_proj(x).view(N, h_kv, d).transpose(0, 1)  # (h_kv, N, d)
    v = layer.v_proj(x).view(N, h_kv, d).transpose(0, 1)  # (h_kv, N, d)
    positions = batch.positions.to(x.device)  # (N,): each token's position in its own request
    if layer.rope:
        q = apply_rope(q[None], positions, base=layer.rope_base, angle_dtype=layer.rope_dtype)[0]
        k = apply_rope(k[None], positions, base=layer.rope_base, angle_dtype=layer.rope_dtype)[0]
    cache.write(layer_idx, batch.slots, k, v)
    k_all, v_all, k_positions, k_owners = step_keys(batch, cache, layer_idx)  # (h_kv, S, d) x 2, (S,) x 2
    mask = step_mask(batch, k_positions, k_owners, layer.window)  # (N, S)
    y = fused_attention(q[None], repeat_kv(k_all[None], layer.n_rep), repeat_kv(v_all[None], layer.n_rep),
                        mask[None, None])[0]  # (h, N, d)
    return layer.o_proj(y.transpose(0, 1).reshape(N, h * d))  # (N, E)


class _PagedLlamaAttention(nn.Module):
    """A Llama layer's ``self_attn`` that reads the step (batch and cache) set on :func:`serve_llama`'s step."""

    def __init__(self, layer: CausalSelfAttention, layer_idx: int, context: dict):
        super().__init__()
        self.layer, self.layer_idx, self.context = layer, layer_idx, context

    def forward(self, hidden_states, *args, **kwargs):  # hidden_states (1, N, E); transformers' mask is unused
        out = paged_self_attention(self.layer, hidden_states[0], self.context["batch"], self.context["cache"],
                                   self.layer_idx)
        return out[None], None  # (1, N, E), no weights


def serve_llama(model):
    """Replace the course layers of a swapped Llama (``swap_into_llama(model)`` first) by paged ones, in place, and
    return ``forward(batch, cache) -> logits (N, V)`` for :class:`~attention_course.serving.Scheduler`: the model
    runs once on the step's packed tokens (one row), each layer reading and writing the paged cache."""
    from ..llama import LlamaCourseAttention

    layers = model.model.layers
    if not all(isinstance(layer.self_attn, (LlamaCourseAttention, _PagedLlamaAttention)) for layer in layers):
        raise TypeError("serve_llama needs the course's attention in every layer: call swap_into_llama(model) first.")
    context: dict = {}
    for i, layer in enumerate(layers):
        inner = layer.self_attn.layer if isinstance(layer.self_attn, _PagedLlamaAttention) else layer.self_attn
        layer.self_attn = _PagedLlamaAttention(inner, i, context)

    def forward(batch, cache):
        context.update(batch=batch, cache=cache)
        device = model.lm_head.weight.device
        out = model(input_ids=batch.tokens[None].to(device), position_ids=batch.positions[None].to(device),
                    use_cache=False)
        return out.logits[0]  # (N, V)

    return forward


def continuous_batching_config(page_size: int, num_blocks: int, max_batch_tokens: int):
    """transformers' ``ContinuousBatchingConfig`` for a pool of ``num_blocks`` pages of ``page_size`` slots and at
    most ``max_batch_tokens`` tokens a step. The page size is ``page_size`` from transformers 5.18 and ``block_size``
    before (Colab's 5.15): the name is read from the installed class's signature, not from its version."""
    import inspect

    import transformers

    taken = inspect.signature(transformers.ContinuousBatchingConfig).parameters
    name = next((n for n in ("page_size", "block_size") if n in taken), None)
    if name is None:
        raise TypeError(f"transformers {transformers.__version__}'s ContinuousBatchingConfig takes neither page_size "
                        f"(the name from 5.18) nor block_size (before): this release names the page size otherwise. "
                        f'Install one the course knows: pip install "transformers>=5.15,<{transformers.__version__}".')
    return transformers.ContinuousBatchingConfig(**{name: page_size}, num_blocks=num_blocks,
                                                 max_batch_tokens=max_batch_tokens)


def paged_implementation() -> str:
    """The attention implementation to give a transformers model before ``generate_batch``: ``"paged|sdpa"`` up to
    transformers 5.18, plain ``"sdpa"`` from 5.19 on, which deprecates the prefix (``set_attn_implementation`` warns,
    a FutureWarning: "The `paged|` prefix is no longer needed"). Releases up to 5.18 also take a plain ``"sdpa"``:
    ``generate_batch`` adds the prefix itself for the run (read in the sources of 5.15 to 5.24, and run on 5.15 and
    5.24)."""
    import transformers

    major, minor = (int(part) for part in transformers.__version__.split(".")[:2])
    return "paged|sdpa" if (major, minor) < (5, 19) else "sdpa"
