"""Packing without padding: several sequences laid end to end in one row.

A padded batch (B, L_max, D) spends L_max - L_i rows on each short sequence, and (L_max^2 - L_i^2) scores on it
((L_max (L_max + 1) - L_i (L_i + 1)) / 2 when a causal kernel skips the scores above the diagonal on both sides).
A *packed* batch lays the sequences one after another, (N, D) with N = sum L_i, and says where each one starts with
the cumulative lengths ``cu_seqlens = [0, L_0, L_0 + L_1, ..., N]`` (the name FlashAttention's varlen kernels and
transformers' paged attention use). Attention then needs a mask that keeps each query inside its own sequence and,
for a causal model, before itself: a **block-diagonal causal** mask.

Masks here are IGNORE masks, as everywhere in the package: bool, True = may NOT attend.
"""
from __future__ import annotations

import torch

from ..checks import check_floating, check_tensor


def _check_lengths(lengths) -> torch.Tensor:
    if isinstance(lengths, torch.Tensor):
        lengths = lengths.tolist()
    if not isinstance(lengths, (list, tuple)) or not lengths:
        raise ValueError(f"lengths must be a non-empty list of sequence lengths, got {lengths!r}.")
    if any(isinstance(n, bool) or not isinstance(n, int) or n < 1 for n in lengths):
        raise ValueError(f"lengths must be ints >= 1 (one per sequence; an empty sequence has nothing to pack), "
                         f"got {list(lengths)}.")
    return torch.tensor(lengths, dtype=torch.long)


def cu_seqlens(lengths, device=None) -> torch.Tensor:
    """Cumulative lengths (n + 1,): ``[0, L_0, L_0 + L_1, ..., N]``; sequence i is rows cu[i] .. cu[i+1] - 1."""
    lengths = _check_lengths(lengths)
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)]).to(device)  # (n + 1,)


def check_cu_seqlens(cu, name: str = "cu_seqlens") -> torch.Tensor:
    """``cu`` must be an integer tensor (n + 1,) starting at 0 and strictly increasing."""
    check_tensor(cu, name)
    if cu.is_floating_point() or cu.dtype == torch.bool or cu.ndim != 1 or len(cu) < 2:
        raise ValueError(f"{name} must be an integer tensor (n + 1,) = [0, L_0, L_0 + L_1, ..., N], got dtype "
                         f"{cu.dtype} and shape {tuple(cu.shape)}. Build it with cu_seqlens(lengths).")
    if int(cu[0]) != 0 or bool((cu[1:] <= cu[:-1]).any()):
        raise ValueError(f"{name} must start at 0 and increase strictly (every sequence at least one token), got "
                         f"{cu.tolist()}.")
    return cu


def sequence_ids(cu) -> torch.Tensor:
    """(N,): which sequence each packed row belongs to, 0 .. n-1."""
    check_cu_seqlens(cu)
    lengths = cu[1:] - cu[:-1]  # (n,)
    return torch.repeat_interleave(torch.arange(len(lengths), device=cu.device), lengths)  # (N,)


def packed_positions(cu) -> torch.Tensor:
    """(N,): each row's position inside its own sequence, restarting at 0 for every sequence."""
    ids = sequence_ids(cu)
    return torch.arange(len(ids), device=cu.device) - cu[ids]  # (N,)


def block_diagonal_mask(cu, causal: bool = True) -> torch.Tensor:
    """Ignore mask (N, N): True where query row i and key row j belong to different sequences or, with ``causal``,
    where j comes after i. Each diagonal block is one sequence's own (causal) mask; everything off it is hidden."""
    ids = sequence_ids(cu)  # (N,)
    ignore = ids[:, None] != ids[None, :]  # (N, N): another sequence
    if causal:
        rows = torch.arange(len(ids), device=cu.device)
        ignore = ignore | (rows[None, :] > rows[:, None])  # a later key
    return ignore


def pack(sequences) -> tuple[torch.Tensor, torch.Tensor]:
    """A list of (L_i, ...) tensors -> (packed (N, ...), cu_seqlens (n + 1,))."""
    if not isinstance(sequences, (list, tuple)) or not sequences:
        raise ValueError("pack takes a non-empty list of tensors (L_i, ...), one per sequence.")
    for i, s in enumerate(sequences):
        check_tensor(s, f"sequences[{i}]")
        if s.ndim < 1 or s.shape[1:] != sequences[0].shape[1:]:
            raise ValueError(f"sequences[{i}] has shape {tuple(s.shape)}; every sequence must be (L_i, ...) with the "
                             f"same trailing dims as sequences[0], {tuple(sequences[0].shape[1:])}.")
    cu = cu_seqlens([len(s) for s in sequences], device=sequences[0].device)
    return torch.cat(list(sequences)), cu  # (N, ...), (n + 1,)


def unpack(packed: torch.Tensor, cu) -> list[torch.Tensor]:
    """The inverse of :func:`pack`: (N, ...) -> [(L_i, ...)]."""
    check_tensor(packed, "packed")
    check_cu_seqlens(cu)
    if packed.shape[0] != int(cu[-1]):
        raise ValueError(f"packed has {packed.shape[0]} rows but cu_seqlens ends at {int(cu[-1])}: they must agree.")
    return list(packed.split((cu[1:] - cu[:-1]).tolist()))


def packed_attention(q, k, v, cu, causal: bool = True) -> torch.Tensor:
    """Attention of packed sequences: q, k, v (h, N, d), one row per token of every sequence; returns (h, N, d)."""
    for t, name in ((q, "q"), (k, "k"), (v, "v")):
        check_floating(t, name)
        if t.ndim != 3 or t.shape[:2] != q.shape[:2]:
            raise ValueError(f"{name} must be (h, N, d) like q {tuple(q.shape)}, got {tuple(t.shape)}.")
    check_cu_seqlens(cu)
    if q.shape[1] != int(cu[-1]):
        raise ValueError(f"q has N = {q.shape[1]} rows but cu_seqlens ends at {int(cu[-1])}.")
    scores = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5  # (h, N, N)
    scores = scores.masked_fill(block_diagonal_mask(cu, causal), float("-inf"))
    return scores.softmax(-1) @ v  # (h, N, d)


def padding_waste(lengths, causal: bool = True) -> dict:
    """What padding to the longest sequence costs against packing, in token rows and in score entries, like for like.

    ``rows``: B * L_max padded against N = sum L_i packed. ``scores``: the entries the softmax must fill in per head.
    With ``causal``, both sides count the entries on or below the diagonal, as a causal kernel visits them: padded
    B * L_max (L_max + 1) / 2 against packed sum L_i (L_i + 1) / 2. Without, both count full squares: B * L_max^2
    against sum L_i^2.
    """
    lengths = _check_lengths(lengths)
    B, L_max, N = len(lengths), int(lengths.max()), int(lengths.sum())
    if causal:
        padded_scores, packed_scores = B * L_max * (L_max + 1) // 2, int((lengths * (lengths + 1) // 2).sum())
    else:
        padded_scores, packed_scores = B * L_max ** 2, int((lengths ** 2).sum())
    return {"rows_padded": B * L_max, "rows_packed": N, "scores_padded": padded_scores,
            "scores_packed": packed_scores, "row_waste": 1 - N / (B * L_max),
            "score_waste": 1 - packed_scores / padded_scores}
