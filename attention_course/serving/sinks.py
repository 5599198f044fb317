"""Attention sinks: where a softmax row puts the weight it does not want to give.

Softmax weights sum to 1, so a query that should read nothing still reads something. Trained models learn to park
that weight on a token that carries little (often the first one). Two ways to build the parking place in:

* a **learned sink logit** per head, s_h (gpt-oss): one more entry in the softmax's denominator, no value:
  ``w_j = e^{z_j} / (sum_j' e^{z_j'} + e^{s_h})``. :func:`sink_attention`; the same as attention with one extra key
  of logit s_h whose value is zero.
* **StreamingLLM**: keep the first ``n_sink`` tokens in the cache for good, plus a window of the most recent ones;
  :func:`streaming_mask` and :class:`StreamingKVCache`, whose memory stops at n_sink + window entries.

Partial softmaxes merge by their log-sum-exps (:func:`merge_partials`). Convention where they merge: a part with no
key at all (every key masked) has log-sum-exp -inf, and -inf - (-inf) is taken as -inf: that part gets weight 0, and
a row empty everywhere gives output 0, never NaN. :func:`sink_attention` follows it too: a row with every key masked
gives 0, with a finite sink (which takes all the weight) and with a sink of -inf (no sink, nothing to attend to).

:func:`course_sink_attention` is an attention function for transformers' ``AttentionInterface`` that computes
gpt-oss's attention (sinks, sliding windows through the model's own mask) with :func:`sink_attention`.
"""
from __future__ import annotations

import torch

from ..checks import check_floating, check_positive_int
from ..decoding import KVCache, repeat_kv

NEG_INF = float("-inf")


def _scores(q, k, ignore, scale):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    scores = q @ k.transpose(-2, -1) * scale  # (B, h, L, S)
    return scores if ignore is None else scores.masked_fill(ignore, NEG_INF)


def sink_attention(q, k, v, sinks, ignore=None, scale=None) -> torch.Tensor:
    """Attention with one sink logit per head: q (B, h, L, d), k and v (B, h, S, d), sinks (h,), finite or -inf
    (-inf: no sink, plain attention), ``ignore`` an ignore mask broadcastable to (B, h, L, S). Returns (B, h, L, d).
    A row with every key masked gives 0: a finite sink takes all its weight, and with a sink of -inf the row has no
    logit at all, which the module's convention, -inf - (-inf) read as -inf, turns into weights 0 (no NaN, in either
    pass)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v"), (sinks, "sinks")):
        check_floating(t, name)
    if q.ndim != 4 or k.shape != v.shape or k.shape[:2] != q.shape[:2] or k.shape[-1] != q.shape[-1]:
        raise ValueError(f"q must be (B, h, L, d) and k, v (B, h, S, d) with the same B, h, d; got q "
                         f"{tuple(q.shape)}, k {tuple(k.shape)}, v {tuple(v.shape)}. Repeat shared key/value heads "
                         f"(repeat_kv) first.")
    if sinks.shape != (q.shape[1],):
        raise ValueError(f"sinks must hold one logit per head, shape (h,) = ({q.shape[1]},), got "
                         f"{tuple(sinks.shape)}.")
    scores = _scores(q, k, ignore, scale)  # (B, h, L, S)
    sink = sinks.to(scores.dtype)[:, None, None].expand(*scores.shape[:-1], 1)  # (B, h, L, 1)
    logits = torch.cat([scores, sink], dim=-1)  # (B, h, L, S + 1)
    # A row of -inf only (every key masked, no sink) would be 0/0 = NaN in the softmax and its gradient: give it
    # logits 0, then weights 0. masked_fill sends no gradient to what it overwrites. Branch-free, as masked_softmax.
    empty = (logits == NEG_INF).all(-1, keepdim=True)  # (B, h, L, 1)
    weights = logits.masked_fill(empty, 0.0).softmax(-1).masked_fill(empty, 0.0)
    return weights[..., :-1] @ v  # (B, h, L, d); the sink's weight is dropped: it has no value


def partial_attention(q, k, v, ignore=None, scale=None):
    """Attention over some keys, and the log-sum-exp of its logits: (out (..., L, d), lse (..., L, 1)).
    A row with every key masked: lse = -inf, out = 0."""
    scores = _scores(q, k, ignore, scale)  # (..., L, S)
    lse = scores.logsumexp(-1, keepdim=True)  # (..., L, 1); -inf for an empty row
    weights = (scores - lse.masked_fill(lse == NEG_INF, 0.0)).exp()  # -inf - (-inf) read as -inf: weight 0
    return weights @ v, lse


def merge_partials(parts):
    """Merge [(out, lse), ...] of attention over disjoint sets of keys into attention over all of them:
    out = sum_p e^{lse_p - m} out_p / sum_p e^{lse_p - m}, m = max_p lse_p. Returns (out, lse). A part empty in a row
    (lse = -inf) gets weight 0 there; a row empty in every part gives out = 0 and lse = -inf."""
    parts = list(parts)
    if not parts:
        raise ValueError("merge_partials needs at least one (out, lse) part, to know the output's shape; for "
                         "attention over no key at all, pass partial_attention over an empty set of keys (out 0, "
                         "lse -inf).")
    lses = torch.stack([lse for _, lse in parts])  # (P, ..., L, 1)
    m = lses.max(0).values
    safe = m.masked_fill(m == NEG_INF, 0.0)  # every part empty: -inf - (-inf) read as -inf, weights 0
    scale = (lses - safe).exp()  # (P, ..., L, 1)
    total = scale.sum(0)
    out = sum(s * o for s, (o, _) in zip(scale, parts)) / total.masked_fill(total == 0, 1.0)
    return out, safe + total.log()


def streaming_mask(q_positions, k_positions, n_sink: int, window: int) -> torch.Tensor:
    """StreamingLLM's ignore mask (L, S): a key is hidden when it comes after the query, or when it is ``window`` or
    more positions back and not one of the first ``n_sink`` tokens (positions 0 .. n_sink - 1)."""
    check_positive_int(window, "window")
    if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
        raise ValueError(f"n_sink must be an int >= 0, got {n_sink!r}.")
    back = q_positions[:, None] - k_positions[None, :]  # (L, S)
    return (back < 0) | ((back >= window) & (k_positions[None, :] >= n_sink))


class StreamingKVCache(KVCache):
    """Chapter 10's cache with StreamingLLM's policy: after each update it keeps the first ``n_sink`` tokens and the
    last ``window - 1`` ones, so between steps it holds at most n_sink + window - 1 entries, whatever the length.
    Keys keep their original positions. Fed one token per step to a layer built without a window, each query reads
    the sinks, the window - 1 tokens before it and itself: attention with :func:`streaming_mask`. (A prefill of
    many tokens in one call reads every one of them: feed the tokens one by one, or mask with streaming_mask.)"""

    def __init__(self, n_sink: int, window: int):
        super().__init__()
        if isinstance(n_sink, bool) or not isinstance(n_sink, int) or n_sink < 0:
            raise ValueError(f"n_sink must be an int >= 0, got {n_sink!r}.")
        self.n_sink, self.budget = n_sink, check_positive_int(window, "window")

    def update(self, k, v, positions):
        k_all, v_all, p_all = super().update(k, v, positions)  # (B, h_kv, S, d) x 2, (S,)
        S, n, keep_last = k_all.shape[2], self.n_sink, self.budget - 1
        if S > n + keep_last:  # evict the middle (copies, so the evicted entries are freed)
            keep = torch.cat([torch.arange(n), torch.arange(S - keep_last, S)]).to(k_all.device)
            self.k, self.v = k_all[:, :, keep].clone(), v_all[:, :, keep].clone()
            self.positions = p_all[..., keep].clone()
        return k_all, v_all, p_all


def course_sink_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, s_aux=None,
                          **kwargs):
    """gpt-oss's attention core with :func:`sink_attention`, for transformers' ``AttentionInterface``: query
    (B, h, L, d), key and value (B, h_kv, S, d) after RoPE and the cache, the model's bool mask (True = may attend;
    the sliding layers' mask already holds their window), the sinks as ``s_aux`` (or ``module.sinks``). Returns
    (out (B, L, h, d), None)."""
    if dropout and module.training:
        raise ValueError("course_sink_attention has no dropout: set attention_dropout=0 or call model.eval().")
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    if sinks is None:
        raise ValueError("course_sink_attention needs the layer's sinks (s_aux= or module.sinks): this model has "
                         "none; use the course's plain attention instead.")
    n_rep = query.shape[1] // key.shape[1]
    ignore = None if attention_mask is None else ~attention_mask  # (B|1, 1, L, S), the course's polarity
    out = sink_attention(query, repeat_kv(key, n_rep), repeat_kv(value, n_rep), sinks, ignore, scaling)
    return out.transpose(1, 2).contiguous(), None  # (B, L, h, d)


def register_sink_attention(name: str = "course_sinks") -> str:
    """Register :func:`course_sink_attention` under ``name``, with transformers' bool SDPA mask built in full (SDPA's
    mask may be None where a causal mask without padding suffices: SDPA then passes is_causal, which this function,
    like the course's attention, does not read); returns ``name``, for ``model.set_attn_implementation(name)``."""
    from ..llama import register_attention

    return register_attention(name, course_sink_attention)
