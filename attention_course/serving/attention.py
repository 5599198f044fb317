"""The course's causal layer reading a paged cache: a whole continuous-batching step in one attention call.

:func:`paged_self_attention` takes a layer (:class:`~attention_course.decoding.CausalSelfAttention`, its weights and
RoPE) and the packed tokens of a step (N rows from several requests, prefill chunks and decode tokens mixed). It
projects all N rows at once, writes their keys and values into the pool, gathers each request's keys and values
through its block table, lays them end to end (S keys) and attends with one (N, S) ignore mask: a query sees a key
when both belong to the same request and the key's position is not after the query's (and, with the layer's
``window``, less than ``window`` positions before it). The same block-diagonal causal mask as for packing, with
positions taken from the requests rather than from the rows. Every query is scored against all S keys of the step,
the other requests' included: N * S scores a layer, most of them masked.

``varlen=True`` scores each query against its own request's keys only (:func:`varlen_attention`): the keys still
come from one gather (:func:`step_keys`), split per request by position, and attention runs with only the mask each
part needs. Measured on this course's 2-core CPU, shared with other work (load 3 to 7) so single times spread by
up to 2x (torch 2.13, float32, the chapter's throughput workload: 24 requests, budget 32, chunks of 8, at most 6
and 24 running; TinyDecoder of dim 32 and of dim 256 / 8 heads / 2 key-value heads): the attention call alone on the
steps of a recorded run, as a ratio to the packed path's, the median of 7 interleaved repeats, over the four
configurations, 1 thread: one call per request 1.09 to 2.17 (up to 24 small calls a layer); one padded call for all
requests 0.86 to 0.93; decode rows batched in one call, their keys padded to the longest, and prefill chunks batched
in another 0.75 to 1.00; decode rows batched and one call per prefill chunk (kept) 0.76 to 0.96; the same with keys
repeated per head (``repeat_kv``) rather than SDPA's ``enable_gqa`` 0.71 to 1.64. On 2 threads (two configurations,
contended far more) the kept one 0.76 and 0.92, one call per request 2.19 and 2.36. FlexAttention was not tried:
eager on the CPU it is slow, and compiling it costs seconds a shape. Scores, summed over both layers of
the whole run at 24 running: packed 154,016 computed, varlen 13,744 (padding and the masked later keys of a chunk
included), 9,626 needed. In float64 the two paths agree to 1e-15 (the tests assert 1e-12).

:func:`serve_llama` puts it into every layer of a transformers Llama whose attention is the course's
(:func:`attention_course.llama.swap_into_llama`), so that the scheduler drives that model too.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..decoding import CausalSelfAttention, repeat_kv
from ..functional import fused_attention
from ..rope import rope_cos_sin, rotate_half
from .paged import PagedKVCache, check_block_table


def step_keys(batch, cache: PagedKVCache, layer: int):
    """Every key and value the step's requests hold, end to end: k, v (h_kv, S, d), their positions (S,) and the
    index (0 .. n-1) of the request each belongs to (S,). The slots are looked up once per step (every layer shares
    the block tables), in Python numbers (a tensor op per block costs more than the block), each table checked as
    :meth:`PagedKVCache.slots_of` checks it, and read with one indexing of the pool."""
    if getattr(batch, "key_index", None) is None:
        size, refs = cache.block_size, cache.refs
        slots, positions, owners = [], [], []
        for i, request in enumerate(batch.requests):
            cache._known(request)
            table, T = cache.tables[request], cache.lengths[request]
            used = table[:-(-T // size)]
            if len(used) < -(-T // size) or not all(0 <= b < cache.num_blocks and refs[b] > 0 for b in used):
                check_block_table(table, cache.num_blocks, T, size, torch.tensor(refs) > 0)  # raises, and says why
            slots += [b * size + o for b in used for o in range(size)][:T]  # (T,)
            positions += range(T)
            owners += [i] * T
        batch.key_index = tuple(torch.tensor(x, dtype=torch.long, device=cache.k.device)
                                for x in (slots, positions, owners))
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


def step_scores(batch, window: int | None = None) -> tuple[int, int]:
    """(computed, needed) scores of one layer on the packed path: N * S pairs computed, and the pairs a query may see
    (its own request, not later, with ``window`` fewer than ``window`` positions back), heads not multiplied in."""
    positions = batch.positions.long()  # (N,)
    N, S = len(positions), int(sum(batch_key_lengths(batch)))
    visible = positions + 1 if window is None else (positions + 1).clamp(max=window)  # (N,)
    return N * S, int(visible.sum())


def batch_key_lengths(batch) -> list:
    """T_i, the keys request i holds once the step's tokens are written: one past its last row's position."""
    last = batch.positions[batch.cu[1:] - 1]  # (n,): the position of each request's last row
    return (last + 1).tolist()


def _count(batch, computed: int, needed: int) -> None:
    scores = getattr(batch, "scores", None)
    if scores is not None:
        scores[0] += computed
        scores[1] += needed


def varlen_attention(q, k_all, v_all, batch, window: int | None = None) -> tuple[torch.Tensor, int]:
    """Each query against its own request's keys only. q (h, N, d): the step's queries; k_all, v_all (h_kv, S, d):
    the keys of every request end to end (:func:`step_keys`, request i's T_i keys at positions 0 .. T_i - 1).
    Returns the attention output (h, N, d) and the scores it computed (pairs, heads not multiplied in, padding
    counted).

    Decode rows (one query at position T - 1 of its request) are batched into one call, their keys gathered into
    (n_dec, h_kv, K, d) with K the longest of them (a key mask hides the padding); with ``window``, only the last
    ``window`` keys of each are gathered. Prefill chunks (n > 1 queries at positions p .. p + n - 1) run one call each
    on their own keys (from p - window + 1 with a window) with their causal offset mask."""
    h, N, d = q.shape
    plan = _varlen_plan(batch, window, k_all.shape[1], k_all.device)
    gqa = h != k_all.shape[0]
    out = q.new_empty(h, N, d)
    if plan["decode"] is not None:
        rows, index, mask = plan["decode"]  # (n_dec,), (n_dec, K), None or (n_dec, 1, 1, K)
        k = k_all[:, index].transpose(0, 1)  # (h_kv, n_dec, K, d) -> (n_dec, h_kv, K, d)
        v = v_all[:, index].transpose(0, 1)
        q_dec = q[:, rows].transpose(0, 1)[:, :, None]  # (n_dec, h, 1, d)
        y = F.scaled_dot_product_attention(q_dec, k, v, attn_mask=mask, enable_gqa=gqa)  # (n_dec, h, 1, d)
        out[:, rows] = y[:, :, 0].transpose(0, 1)
    for a, b, lo, hi, allow in plan["chunks"]:  # rows a..b-1 over keys lo..hi-1 of k_all
        out[:, a:b] = F.scaled_dot_product_attention(q[:, a:b], k_all[:, lo:hi], v_all[:, lo:hi], attn_mask=allow,
                                                     enable_gqa=gqa)  # (h, n, d)
    return out, plan["computed"]


def _varlen_plan(batch, window, S: int, device) -> dict:
    """:func:`varlen_attention`'s index tensors and masks for one step, built once and kept on the batch for the
    other layers (they depend on the plan and the window, not on the layer)."""
    memo = batch.__dict__.setdefault("_varlen", {})
    if window in memo:
        return memo[window]
    cu = batch.cu.tolist()  # the step's plan in Python numbers: a tensor op per number costs more than the number
    T = (batch.positions[batch.cu[1:] - 1] + 1).tolist()  # keys per request: one past its last row's position
    if sum(T) != S:
        raise ValueError(f"the step's requests hold {sum(T)} keys by their positions, but k_all has "
                         f"{S}: pass step_keys' keys of this very batch.")
    starts = [sum(T[:i]) for i in range(len(T))]  # where request i's keys begin in k_all
    plan = {"decode": None, "chunks": [], "computed": 0}
    decode = [i for i in range(len(T)) if cu[i + 1] - cu[i] == 1]
    if decode:
        seen = [T[i] if window is None else min(T[i], window) for i in decode]  # keys each decode row can see
        K = max(seen)
        first = torch.tensor([starts[i] + T[i] - t for i, t in zip(decode, seen)])  # (n_dec,) its first key in S
        index = (first[:, None] + torch.arange(K)).clamp(max=S - 1).to(device)  # (n_dec, K) into S
        mask = None  # decode rows see every key gathered, unless padded
        if min(seen) < K:
            mask = (torch.arange(K)[None, :] < torch.tensor(seen)[:, None]).to(device)[:, None, None]  # (n_dec,1,1,K)
        plan["decode"] = (torch.tensor([cu[i] for i in decode], device=device), index, mask)
        plan["computed"] += len(decode) * K
    for i in range(len(T)):
        a, b, t, s = cu[i], cu[i + 1], T[i], starts[i]
        n = b - a
        if n == 1:
            continue
        first = 0 if window is None else max(0, t - n - window + 1)  # the earliest key any of the n queries sees
        back = torch.arange(t - n, t)[:, None] - torch.arange(first, t)[None, :]  # (n, K): query minus key position
        allow = (back >= 0 if window is None else (back >= 0) & (back < window)).to(device)
        plan["chunks"].append((a, b, s + first, s + t, allow))
        plan["computed"] += n * (t - first)
    memo[window] = plan
    return plan


def _step_rope(batch, positions, d: int, base: float, angle_dtype, dtype):
    """RoPE's (cos, sin), (N, d), of the step's positions, as ``apply_rope`` computes them: once per step and per
    (d, base, dtypes), kept on the batch for the other layers."""
    memo = batch.__dict__.setdefault("_rope", {})
    key = (d, base, angle_dtype, dtype, positions.device)
    if key not in memo:
        cos, sin = rope_cos_sin(positions, d, base=base, dtype=angle_dtype)
        memo[key] = cos.to(dtype), sin.to(dtype)
    return memo[key]


def paged_self_attention(layer: CausalSelfAttention, x: torch.Tensor, batch, cache: PagedKVCache,
                         layer_idx: int, varlen: bool = False) -> torch.Tensor:
    """The layer on a step's packed rows x (N, E): keys and values written to ``cache`` (layer ``layer_idx``), each
    query reading its own request's cache. Returns (N, E). ``varlen=False`` scores every query against every key of
    the step under one (N, S) mask; ``varlen=True`` scores each query against its own request's keys only
    (:func:`varlen_attention`). Both add (computed, needed) scores to ``batch.scores`` where the batch has it."""
    if not isinstance(layer, CausalSelfAttention):
        raise TypeError(f"layer must be a CausalSelfAttention, got {type(layer).__name__}.")
    if x.ndim != 2 or x.shape != (len(batch.tokens), layer.embed_dim):
        raise ValueError(f"x must be the step's packed rows (N, E) = {(len(batch.tokens), layer.embed_dim)}, got "
                         f"{tuple(x.shape)}.")
    if not isinstance(varlen, bool):
        raise TypeError(f"varlen must be True or False, got {varlen!r}.")
    N = x.shape[0]
    h, h_kv, d = layer.num_heads, layer.num_kv_heads, layer.head_dim
    q = layer.q_proj(x).view(N, h, d).transpose(0, 1)  # (h, N, d)
    k = layer.k_proj(x).view(N, h_kv, d).transpose(0, 1)  # (h_kv, N, d)
    v = layer.v_proj(x).view(N, h_kv, d).transpose(0, 1)  # (h_kv, N, d)
    positions = batch.positions.to(x.device)  # (N,): each token's position in its own request
    if layer.rope:  # apply_rope's rotation, its angles computed once per step for all layers
        cos, sin = _step_rope(batch, positions, d, layer.rope_base, layer.rope_dtype or x.dtype, x.dtype)  # (N, d)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
    cache.write(layer_idx, batch.slots, k, v)
    k_all, v_all, k_positions, k_owners = step_keys(batch, cache, layer_idx)  # (h_kv, S, d) x 2, (S,) x 2
    visible = positions + 1 if layer.window is None else (positions + 1).clamp(max=layer.window)  # (N,)
    if varlen:
        y, computed = varlen_attention(q, k_all, v_all, batch, layer.window)  # (h, N, d)
    else:
        mask = step_mask(batch, k_positions, k_owners, layer.window)  # (N, S)
        y = fused_attention(q[None], repeat_kv(k_all[None], layer.n_rep), repeat_kv(v_all[None], layer.n_rep),
                            mask[None, None])[0]  # (h, N, d)
        computed = N * k_all.shape[1]
    _count(batch, computed, int(visible.sum()))
    return layer.o_proj(y.transpose(0, 1).reshape(N, h * d))  # (N, E)


class _PagedLlamaAttention(nn.Module):
    """A Llama layer's ``self_attn`` that reads the step (batch and cache) set on :func:`serve_llama`'s step."""

    def __init__(self, layer: CausalSelfAttention, layer_idx: int, context: dict):
        super().__init__()
        self.layer, self.layer_idx, self.context = layer, layer_idx, context

    def forward(self, hidden_states, *args, **kwargs):  # hidden_states (1, N, E); transformers' mask is unused
        out = paged_self_attention(self.layer, hidden_states[0], self.context["batch"], self.context["cache"],
                                   self.layer_idx, self.context.get("varlen", False))
        return out[None], None  # (1, N, E), no weights


def serve_llama(model, varlen: bool = False):
    """Replace the course layers of a swapped Llama (``swap_into_llama(model)`` first) by paged ones, in place, and
    return ``forward(batch, cache) -> logits (N, V)`` for :class:`~attention_course.serving.Scheduler`: the model
    runs once on the step's packed tokens (one row), each layer reading and writing the paged cache (``varlen``: see
    :func:`paged_self_attention`)."""
    from ..llama import LlamaCourseAttention

    if not isinstance(varlen, bool):
        raise TypeError(f"varlen must be True or False, got {varlen!r}.")
    layers = model.model.layers
    if not all(isinstance(layer.self_attn, (LlamaCourseAttention, _PagedLlamaAttention)) for layer in layers):
        raise TypeError("serve_llama needs the course's attention in every layer: call swap_into_llama(model) first.")
    context: dict = {"varlen": varlen}
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
