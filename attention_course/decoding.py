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

from .checks import check_floating, check_positive_int, check_same_device, check_same_dtype, check_shape
from .rope import check_positions


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
