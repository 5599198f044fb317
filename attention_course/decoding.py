"""Causal decoding: the attention of a model that writes, one token after another.

A causal language model lets the token at position t read the tokens at positions <= t only, so its output at t
never changes when later tokens arrive. Generation uses that twice:

* **prefill**: the prompt goes through in one pass, causal mask and all;
* **decode**: each new token needs only its own query against every key and value so far. Those keys and values
  were computed at earlier steps and do not change: keep them in a **KV cache** and append one column per step,
  O(T) work per token instead of recomputing all T tokens (O(T^2)).

The pieces, each a few lines:

* :func:`decode_mask`: the causal (and sliding-window) ignore mask from *positions*, not from indices, so that it
  stays right when the queries are the last of many keys;
* :class:`KVCache`: one layer's cache; appends along the sequence axis (dim 2 of (B, h_kv, S, d)); with a window it
  keeps the last ``window`` entries only, so its memory stops growing;
* :func:`repeat_kv`: grouped-query attention (GQA, MQA when h_kv = 1), h query heads reading h_kv shared key/value
  heads; query head j reads key/value head j // (h / h_kv);
* :func:`kv_cache_bytes`: what a cache costs, 2 * layers * h_kv * d * T * batch * bytes per number;
* :class:`CausalSelfAttention`: all of it in one layer with Llama's projections, RoPE on q and k.

Masks are IGNORE masks here as everywhere in this package: bool, True = may NOT attend.
"""
from __future__ import annotations

import torch
from torch import nn

from .checks import check_floating, check_positive_int, check_same_device, check_same_dtype, check_shape
from .functional import fused_attention
from .heads import head_dim as _head_dim
from .rope import _check_head_dim, apply_rope, check_positions


# ------------------------------------------------------------------------------------------- shared key/value heads
def repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """(B, h_kv, S, d) -> (B, h_kv * n_rep, S, d): each key/value head repeated for the n_rep query heads it serves.

    ``repeat_interleave`` on dim 1 gives heads in the order 0, 0, 1, 1, ... so query head j reads key/value head
    ``j // n_rep``, the grouping of Llama's weights (and of ``F.scaled_dot_product_attention(enable_gqa=True)``).
    ``x.repeat(1, n_rep, 1, 1)`` gives 0, 1, 0, 1, ...: the same numbers, paired with the wrong query heads.
    """
    check_floating(x, "x")
    check_shape(x, "x", ("B", "h_kv", "S", "d"))
    check_positive_int(n_rep, "n_rep")
    return x.repeat_interleave(n_rep, dim=1)  # (B, h_kv * n_rep, S, d)


def _check_num_kv_heads(num_heads: int, num_kv_heads: int) -> int:
    check_positive_int(num_kv_heads, "num_kv_heads")
    if num_heads % num_kv_heads:
        divisors = ", ".join(str(n) for n in range(1, num_heads + 1) if num_heads % n == 0)
        raise ValueError(
            f"num_heads={num_heads} is not a multiple of num_kv_heads={num_kv_heads}: each key/value head serves "
            f"num_heads // num_kv_heads query heads. Choose num_kv_heads among {divisors}."
        )
    return num_heads // num_kv_heads


# -------------------------------------------------------------------------------------------------------- the mask
def decode_mask(q_positions: torch.Tensor, k_positions: torch.Tensor, *, window: int | None = None) -> torch.Tensor:
    """Ignore mask (True = may NOT attend): key position > query position, or (with ``window``) query position -
    key position >= window, so each query reads itself and the ``window - 1`` keys before it.

    ``q_positions`` (L,) or (B, L), ``k_positions`` (S,) or (B, S). Returns (L, S) when both are 1-D, else
    (B, 1, L, S), ready for scores (B, h, L, S). Built from positions, so a decode step's single query at position
    t reads the whole cache (positions < t): a mask built from ``causal_mask(1)`` for the new token alone would
    hide it.
    """
    check_positions(q_positions, "q_positions")
    check_positions(k_positions, "k_positions", device=q_positions.device)
    if window is not None:
        check_positive_int(window, "window")
    if q_positions.ndim == 2 and k_positions.ndim == 2 and q_positions.shape[0] != k_positions.shape[0]:
        raise ValueError(
            f"q_positions {tuple(q_positions.shape)} and k_positions {tuple(k_positions.shape)} must have the "
            f"same batch size B (one row per sentence)."
        )
    distance = q_positions[..., :, None] - k_positions[..., None, :]  # (L, S) or (B, L, S): query - key
    ignore = distance < 0  # a key from the future
    if window is not None:
        ignore = ignore | (distance >= window)  # a key too far in the past
    return ignore if ignore.ndim == 2 else ignore[:, None]  # (L, S) or (B, 1, L, S)


# ------------------------------------------------------------------------------------------------------- the cache
class KVCache:
    """One layer's keys and values so far, (B, h_kv, S, d) each, and their positions (S,) or (B, S).

    ``update(k, v, positions)`` appends the new entries along the sequence axis (dim 2) and returns what the new
    queries read: ``(k_all, v_all, k_positions)``. With ``window`` the cache is *rolling*: after the call it keeps
    only its last ``window`` entries (all a later query may read with a window of that size), so ``len(cache)``
    and ``cache.nbytes`` stop growing; the call itself still returns every entry this step's queries may need
    (during a prefill longer than the window, the early queries read keys that are then dropped).

    ``tokens_seen`` counts every token ever appended, dropped or not: the next token's position when positions
    are 0, 1, 2, ...; ``len(cache)`` counts those held.
    """

    def __init__(self, window: int | None = None):
        self.window = None if window is None else check_positive_int(window, "window")
        self.k = self.v = self.positions = None  # (B, h_kv, S, d), (B, h_kv, S, d), (S,) or (B, S)
        self.tokens_seen = 0

    def __len__(self) -> int:
        return 0 if self.k is None else self.k.shape[2]

    @property
    def nbytes(self) -> int:
        """Bytes held by the keys and values (positions not counted)."""
        return 0 if self.k is None else self.k.nbytes + self.v.nbytes

    def __repr__(self) -> str:
        shape = None if self.k is None else tuple(self.k.shape)
        return f"KVCache(window={self.window}, entries={len(self)}, tokens_seen={self.tokens_seen}, k/v shape={shape})"

    def _check(self, k, v, positions) -> None:
        check_floating(k, "k")
        check_shape(k, "k", ("B", "h_kv", "L_new", "d"))
        B, h_kv, L, d = k.shape
        check_floating(v, "v")
        check_shape(v, "v", ("B", "h_kv", "L_new", "d"), (B, h_kv, L, None))
        check_same_dtype(v, "v", k, "k")
        check_same_device(v, "v", k, "k")
        check_positions(positions, length=L, batch=B, device=k.device)
        if self.k is None:
            return
        if (self.k.shape[0], self.k.shape[1], self.k.shape[3], self.v.shape[3]) != (B, h_kv, d, v.shape[3]):
            raise ValueError(
                f"the cache holds keys (B, h_kv, S, d) = {tuple(self.k.shape)} and values {tuple(self.v.shape)}; "
                f"new keys {tuple(k.shape)} and values {tuple(v.shape)} must agree in every dimension but S "
                f"(dim 2, the one it grows along). A new batch or a new layer needs a new KVCache()."
            )
        check_same_dtype(k, "k", self.k, "the cache")
        check_same_device(k, "k", self.k, "the cache")

    def update(self, k: torch.Tensor, v: torch.Tensor, positions: torch.Tensor):
        """Append k, v (B, h_kv, L_new, d) at ``positions`` (L_new,) or (B, L_new); return (k_all, v_all,
        k_positions), (B, h_kv, S, d) twice and (S,) or (B, S), old entries first."""
        self._check(k, v, positions)
        if self.k is None:
            k_all, v_all, p_all = k, v, positions
        else:
            old = self.positions
            if old.ndim != positions.ndim:  # one row for all sentences meets a row each: spell it out per sentence
                B = k.shape[0]
                old, positions = old.expand(B, -1) if old.ndim == 1 else old, positions.expand(B, -1)
            k_all = torch.cat((self.k, k), dim=2)  # (B, h_kv, S + L_new, d)
            v_all = torch.cat((self.v, v), dim=2)
            p_all = torch.cat((old, positions), dim=-1)  # (S + L_new,) or (B, S + L_new)
        self.tokens_seen += k.shape[2]
        self.k, self.v, self.positions = k_all, v_all, p_all
        if self.window is not None and len(self) > self.window:  # roll: copies, so the dropped entries are freed
            W = self.window
            self.k, self.v, self.positions = k_all[:, :, -W:].clone(), v_all[:, :, -W:].clone(), p_all[..., -W:].clone()
        return k_all, v_all, p_all


def kv_cache_bytes(layers: int, kv_heads: int, head_dim: int, tokens: int, dtype: torch.dtype = torch.float32,
                   batch: int = 1) -> int:
    """Bytes of a full KV cache: 2 (keys and values) * layers * kv_heads * head_dim * tokens * batch * bytes per
    number. GQA divides it by num_heads / kv_heads; a window caps ``tokens``."""
    for n, name in ((layers, "layers"), (kv_heads, "kv_heads"), (head_dim, "head_dim"), (batch, "batch")):
        check_positive_int(n, name)
    if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
        raise ValueError(f"tokens must be an int >= 0, got {tokens!r}.")
    if not isinstance(dtype, torch.dtype):
        raise TypeError(f"dtype must be a torch.dtype such as torch.float16, got {dtype!r}.")
    return 2 * layers * kv_heads * head_dim * tokens * batch * dtype.itemsize


# ------------------------------------------------------------------------------------------------------- the layer
class CausalSelfAttention(nn.Module):
    """Causal self-attention as a decoder-only model (Llama) writes it: GQA, RoPE, an optional sliding window, a cache.

    ``num_heads`` query heads of size d = embed_dim / num_heads read ``num_kv_heads`` key/value heads (default
    num_heads: plain multi-head attention; 1: multi-query attention); query head j reads key/value head
    j // (num_heads / num_kv_heads). Submodules are Llama's: ``q_proj`` (E -> h d), ``k_proj`` and ``v_proj``
    (E -> h_kv d), ``o_proj`` (h d -> E), so a Llama layer's weights load as they are. RoPE (``rope=True``, split
    halves, ``rope_base``) turns queries and keys by their positions, never values; ``rope_dtype`` is the dtype of
    the angles (default: the input's; ``transformers`` uses float32 even in a float64 model). With ``window`` a
    query at position t reads keys at t - window + 1 .. t only.

    ``forward(x (B, L, E), positions=None, cache=None, key_padding_mask=None) -> (B, L, E)``:

    * ``positions`` (L,) or (B, L): the tokens' positions; default ``arange(n, n + L)`` with n =
      ``cache.tokens_seen`` (0 without a cache), so decoding continues where the cache stopped and never restarts
      at 0. Left-padded sentences give a row each. The causal (and window) mask comes from positions
      (:func:`decode_mask`).
    * ``cache``: a :class:`KVCache` (or any object with ``update(k, v, positions) -> (k_all, v_all, k_positions)``
      and ``tokens_seen``); the new keys and values are appended to it and the queries read all it returns.
    * ``key_padding_mask`` (B, T), True at pads, over every token so far (the cache's past and the L new ones,
      T = ``cache.tokens_seen`` after this call, L without a cache), as a generation loop keeps it; with a rolling
      cache its last columns are used.

    Float32 and float64, on whatever device the layer and its inputs share.
    """

    def __init__(self, embed_dim: int, num_heads: int, num_kv_heads: int | None = None, *, window: int | None = None,
                 rope_base: float = 10000.0, rope: bool = True, rope_dtype: torch.dtype | None = None,
                 bias: bool = False, device=None, dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = _head_dim(embed_dim, num_heads)
        self.num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        self.n_rep = _check_num_kv_heads(num_heads, self.num_kv_heads)  # query heads per key/value head
        if rope:
            _check_head_dim(self.head_dim, f"head_dim = embed_dim / num_heads = {embed_dim} / {num_heads}")
        self.window = None if window is None else check_positive_int(window, "window")
        self.rope, self.rope_base, self.rope_dtype = rope, rope_base, rope_dtype
        d, h, h_kv = self.head_dim, num_heads, self.num_kv_heads
        self.q_proj = nn.Linear(embed_dim, h * d, bias=bias, **factory)
        self.k_proj = nn.Linear(embed_dim, h_kv * d, bias=bias, **factory)
        self.v_proj = nn.Linear(embed_dim, h_kv * d, bias=bias, **factory)
        self.o_proj = nn.Linear(h * d, embed_dim, bias=bias, **factory)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, num_kv_heads={self.num_kv_heads}, "
                f"window={self.window}, rope={self.rope}")

    def _check_input(self, x, cache) -> None:
        check_floating(x, "x")
        check_shape(x, "x", ("B", "L", "E"), (None, None, self.embed_dim))
        check_same_dtype(x, "x", self.q_proj.weight, "the layer")
        check_same_device(x, "x", self.q_proj.weight, "the layer")
        if cache is not None and not (hasattr(cache, "update") and hasattr(cache, "tokens_seen")):
            raise TypeError(f"cache must be a KVCache (one per layer), got {type(cache).__name__}.")

    def _padding(self, key_padding_mask, B: int, T: int, device) -> torch.Tensor:
        """The (B, T) mask of every token so far, checked, as (B, 1, 1, T)."""
        if not isinstance(key_padding_mask, torch.Tensor) or key_padding_mask.dtype != torch.bool:
            got = type(key_padding_mask).__name__ if not isinstance(key_padding_mask, torch.Tensor) \
                else key_padding_mask.dtype
            raise TypeError(f"key_padding_mask must be a bool tensor, True at pads, got {got}. A 0/1 attention "
                            f"mask as tokenizers give it (1 = real token) converts with attention_mask == 0.")
        if key_padding_mask.shape != (B, T):
            raise ValueError(
                f"key_padding_mask must have shape (B, T) = {(B, T)}: one column per token so far (the cache's "
                f"past and the new ones), got {tuple(key_padding_mask.shape)}. In a generation loop, append a "
                f"column of False for each new token."
            )
        if key_padding_mask.device != device:
            raise ValueError(f"key_padding_mask is on {key_padding_mask.device} but x is on {device}. "
                             f"Move it with key_padding_mask.to(x.device).")
        return key_padding_mask[:, None, None, :]  # (B, 1, 1, T)

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None, cache=None,
                key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        self._check_input(x, cache)
        B, L, _ = x.shape
        h, h_kv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if positions is None:
            start = 0 if cache is None else cache.tokens_seen  # continue after the cache, never restart at 0
            positions = torch.arange(start, start + L, device=x.device)  # (L,)
        check_positions(positions, length=L, batch=B, device=x.device)
        pad = None  # checked before the cache changes
        if key_padding_mask is not None:
            T = L + (0 if cache is None else cache.tokens_seen)  # every token so far, the new ones included
            pad = self._padding(key_padding_mask, B, T, x.device)  # (B, 1, 1, T)
        q = self.q_proj(x).view(B, L, h, d).transpose(1, 2)  # (B, h, L, d)
        k = self.k_proj(x).view(B, L, h_kv, d).transpose(1, 2)  # (B, h_kv, L, d)
        v = self.v_proj(x).view(B, L, h_kv, d).transpose(1, 2)  # (B, h_kv, L, d)
        if self.rope:  # queries and keys learn where they are; values do not
            q = apply_rope(q, positions, base=self.rope_base, angle_dtype=self.rope_dtype)
            k = apply_rope(k, positions, base=self.rope_base, angle_dtype=self.rope_dtype)
        k_positions = positions
        if cache is not None:
            k, v, k_positions = cache.update(k, v, positions)  # (B, h_kv, S, d) twice, (S,) or (B, S)
        S = k.shape[2]
        mask = decode_mask(positions, k_positions, window=self.window)  # (L, S) or (B, 1, L, S)
        mask = mask if mask.ndim == 4 else mask[None, None]  # (1|B, 1, L, S)
        if pad is not None:
            mask = mask | pad[..., T - S:]  # (B, 1, L, S): a rolling cache holds the last S tokens only
        y = fused_attention(q, repeat_kv(k, self.n_rep), repeat_kv(v, self.n_rep), mask)  # (B, h, L, d)
        return self.o_proj(y.transpose(1, 2).reshape(B, L, h * d))  # (B, L, E)
