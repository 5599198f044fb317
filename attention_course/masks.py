"""Masks: which keys a query may look at, in the four conventions you will meet.

=============  =========================  ===================  ====================================================
name           dtype                      "may attend" is      used by
=============  =========================  ===================  ====================================================
ignore mask    bool                       ``False``            ``nn.MultiheadAttention`` (``key_padding_mask``,
                                                               ``attn_mask``) and this package everywhere
allow mask     bool                       ``True``             ``F.scaled_dot_product_attention(attn_mask=...)``
keep mask      0/1 ints or floats         ``1``                the seed implementations (``mask == 0`` -> masked)
additive mask  float                      ``0`` (``-inf``      added to the scores; any float, ``-inf`` blocks
                                          blocks)              completely
=============  =========================  ===================  ====================================================

The two bool conventions are each other's negation, so mixing them up raises no error: it silently attends to
exactly the wrong keys. Convert explicitly with the functions below; each one refuses a mask of the wrong kind.

Shapes: a *key padding mask* is (B, S), one row per sentence, True at padded keys. An *attention mask* is
(L, S), shared by every sentence and head, or (B*h, L, S), one per sentence and head, batch-major (index
``b * h + head``). :func:`merge_masks` combines them into one (B, h, L, S) mask.
"""
from __future__ import annotations

import torch

from .checks import check_mask, check_tensor, tracing


def _check_bool(mask, name: str, fn: str) -> torch.Tensor:
    check_tensor(mask, name)
    if mask.dtype != torch.bool:
        raise TypeError(
            f"{fn} expects a bool mask, got dtype {mask.dtype}. For an additive float mask (0 / -inf) use "
            f"additive_to_ignore; for a 0/1 keep-mask (1 = keep) use keep_to_ignore."
        )
    return mask


def padding_mask(lengths, max_len: int | None = None, *, device=None) -> torch.Tensor:
    """Ignore mask (B, S) for right-padded sentences: True at positions ``>= lengths[b]`` (the pads).

    ``lengths``: 1-D int tensor or list, one real length per sentence. ``max_len`` (S) defaults to
    ``max(lengths)``.
    """
    if not isinstance(lengths, torch.Tensor):
        lengths = torch.tensor(lengths, dtype=torch.long, device=device)
    if lengths.ndim != 1 or lengths.is_floating_point() or lengths.dtype == torch.bool:
        raise ValueError(
            f"lengths must be a 1-D list or int tensor of sentence lengths, got dtype {lengths.dtype} "
            f"with shape {tuple(lengths.shape)}."
        )
    lengths = lengths.to(device) if device is not None else lengths
    longest = int(lengths.max()) if lengths.numel() else 0
    max_len = longest if max_len is None else max_len
    if lengths.numel() and int(lengths.min()) < 0:
        raise ValueError(f"lengths must be >= 0, got {lengths.tolist()}.")
    if longest > max_len:
        raise ValueError(
            f"lengths must be <= max_len={max_len}, got a length of {longest}. Raise max_len or trim the sentence."
        )
    positions = torch.arange(max_len, device=lengths.device)  # (S,)
    return positions[None, :] >= lengths[:, None]  # (B, S)


def causal_mask(L: int, S: int | None = None, *, device=None) -> torch.Tensor:
    """Ignore mask (L, S): True above the diagonal, so query i may attend keys j <= i only.

    For S != L the diagonal starts at the top-left corner, as in
    ``F.scaled_dot_product_attention(is_causal=True)``.
    """
    S = L if S is None else S
    return torch.ones(L, S, dtype=torch.bool, device=device).triu(1)  # (L, S)


def ignore_to_allow(mask: torch.Tensor) -> torch.Tensor:
    """Ignore mask (True = may NOT attend) -> allow mask (True = may attend), e.g. for torch's SDPA."""
    return ~_check_bool(mask, "mask", "ignore_to_allow")


def allow_to_ignore(mask: torch.Tensor) -> torch.Tensor:
    """Allow mask (True = may attend) -> ignore mask (True = may NOT attend)."""
    return ~_check_bool(mask, "mask", "allow_to_ignore")


def keep_to_ignore(keep: torch.Tensor) -> torch.Tensor:
    """Keep mask of 0/1 numbers (1 = keep) -> bool ignore mask (True where keep == 0)."""
    check_tensor(keep, "keep")
    if keep.dtype == torch.bool:
        raise TypeError(
            "keep_to_ignore expects 0/1 numbers, got a bool mask. If True means 'pad / do not attend' it already "
            "is an ignore mask; if True means 'may attend', convert it with allow_to_ignore."
        )
    bad = keep[(keep != 0) & (keep != 1)]
    if bad.numel():
        raise ValueError(
            f"keep must hold only 0 (masked) and 1 (keep), got other values such as "
            f"{bad.unique()[:5].tolist()}. An additive mask (0 / -inf) converts with additive_to_ignore."
        )
    return keep == 0


def ignore_to_keep(mask: torch.Tensor, dtype: torch.dtype = torch.long) -> torch.Tensor:
    """Bool ignore mask -> keep mask of 0/1 numbers in ``dtype`` (1 = keep)."""
    return (~_check_bool(mask, "mask", "ignore_to_keep")).to(dtype)


def ignore_to_additive(mask: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Bool ignore mask -> additive float mask: 0 where attending, -inf where blocked."""
    _check_bool(mask, "mask", "ignore_to_additive")
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask, float("-inf"))


def additive_to_ignore(mask: torch.Tensor) -> torch.Tensor:
    """Additive float mask of 0 and -inf -> bool ignore mask (True where -inf).

    Only ``-inf`` blocks a key completely; a large finite value such as -1e9 does not, so a mask holding any
    value other than 0 and -inf is refused.
    """
    check_tensor(mask, "mask")
    if not mask.is_floating_point():
        raise TypeError(f"additive_to_ignore expects a float mask (0 / -inf), got dtype {mask.dtype}.")
    blocked = torch.isneginf(mask)
    bad = mask[~blocked & (mask != 0)]
    if bad.numel():
        raise ValueError(
            f"additive_to_ignore can only convert a mask of 0 and -inf, got other values such as "
            f"{bad.unique()[:5].tolist()}; a bool mask cannot express them (and -1e9 is not -inf)."
        )
    return blocked


def fully_masked_rows(mask: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """True where every entry along ``dim`` is masked (bool True, or -inf in an additive mask); keeps ``dim``."""
    blocked = mask if mask.dtype == torch.bool else torch.isneginf(mask)
    return blocked.all(dim, keepdim=True)


def _check_key_padding_mask(mask: torch.Tensor, B: int, L: int, S: int) -> None:
    if tracing():
        return
    shape, want = tuple(mask.shape), (B, S)
    if shape == want:
        return
    hint = "It has one row per sentence and one column per key, True at padded keys."
    if mask.ndim == 1:
        hint = "For a single sentence add the batch dimension with key_padding_mask.unsqueeze(0)."
    elif mask.ndim in (3, 4) or (shape == (L, S) and B != L):
        hint = "This looks like an attn_mask (per query and key); pass it as attn_mask."
    elif shape == (B, L):
        hint = f"It has one column per query (L={L}), but it masks keys: it needs one column per key (S={S})."
    raise ValueError(f"key_padding_mask must have shape (B, S) = {want}, got {shape}. {hint}")


def _check_attn_mask(mask: torch.Tensor, B: int, h: int, L: int, S: int) -> None:
    if tracing():
        return
    shape = tuple(mask.shape)
    if shape in ((L, S), (B * h, L, S)):
        return
    want = f"(L, S) = {(L, S)} or (B*h, L, S) = {(B * h, L, S)}"
    hint = ""
    if mask.ndim == 2 and shape == (B, S):
        hint = "This looks like a key_padding_mask (B, S); pass it as key_padding_mask."
    elif mask.ndim == 2 and shape == (S, L):
        hint = "It is transposed: rows are queries, columns keys. Use attn_mask.T."
    elif mask.ndim == 2 and shape == (B, L):
        hint = "This looks like a per-sentence padding mask (B, L); padding masks keys: pass key_padding_mask (B, S)."
    elif shape == (B, L, S):
        hint = (
            "It has one mask per sentence; the 3-D form needs one per sentence and head, batch-major. "
            "Use attn_mask.repeat_interleave(num_heads, dim=0)."
        )
    elif shape == (B, h, L, S):
        hint = "Flatten the batch and head dimensions with attn_mask.flatten(0, 1)."
    elif mask.ndim == 3 and shape[0] == 1:
        hint = "For one mask shared by all sentences and heads, pass the 2-D attn_mask[0]."
    raise ValueError(f"attn_mask must have shape {want}, got {shape}. {hint}".rstrip())


def merge_masks(
    key_padding_mask: torch.Tensor | None,
    attn_mask: torch.Tensor | None,
    *,
    batch_size: int,
    num_heads: int,
    query_len: int,
    key_len: int,
    is_causal: bool = False,
    dtype: torch.dtype | None = None,
    device=None,
    expand: bool = True,
) -> torch.Tensor | None:
    """Combine a key padding mask (B, S) and an attention mask (L, S) or (B*h, L, S) into one (B, h, L, S) mask.

    Bool masks are ignore masks (True = blocked) and combine with OR; float masks are additive and combine by
    addition. The result is a bool ignore mask when every input is bool, an additive float mask when any is
    float, and None when there is nothing to mask. ``is_causal=True`` also blocks future keys
    (:func:`causal_mask`). ``dtype`` / ``device`` (the query's), when given, are required of float masks / all
    masks. ``expand=False`` returns the broadcastable (B or 1, h or 1, L or 1, S) mask without expanding it.

    Limitation: a (B, S) padding mask passed as ``attn_mask`` when B == L has the shape of an (L, S) mask, so it
    cannot be told apart and is used as one; every other mix-up of the two raises.
    """
    B, h, L, S = batch_size, num_heads, query_len, key_len
    merged = []  # masks of shape (B|1, h|1, L|1, S)
    if key_padding_mask is not None:
        check_mask(key_padding_mask, "key_padding_mask", float_dtype=dtype, device=device)
        _check_key_padding_mask(key_padding_mask, B, L, S)
        merged.append(key_padding_mask.view(B, 1, 1, S))
    if attn_mask is not None:
        check_mask(attn_mask, "attn_mask", float_dtype=dtype, device=device)
        _check_attn_mask(attn_mask, B, h, L, S)
        merged.append(attn_mask.view(1, 1, L, S) if attn_mask.ndim == 2 else attn_mask.view(B, h, L, S))
    if is_causal:
        merged.append(causal_mask(L, S, device=merged[0].device if merged else device).view(1, 1, L, S))
    if not merged:
        return None
    float_dtypes = {m.dtype for m in merged if m.is_floating_point()}
    if len(float_dtypes) > 1:
        raise TypeError(
            f"key_padding_mask and attn_mask are float masks of different dtypes {sorted(map(str, float_dtypes))}; "
            f"convert both to the query's dtype with .to(query.dtype)."
        )
    if float_dtypes:
        float_dtype = float_dtypes.pop()
        merged = [ignore_to_additive(m, float_dtype) if m.dtype == torch.bool else m for m in merged]
        mask = sum(merged[1:], merged[0])
    else:
        mask = merged[0]
        for m in merged[1:]:
            mask = mask | m
    return mask.expand(B, h, L, S) if expand else mask
