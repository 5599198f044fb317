"""Ring attention: every rank keeps its block of queries; the key/value blocks travel around the ring, and each is
merged into the rank's running softmax (chapter 8's online softmax, :func:`~attention_course.tiled.merge_tile`).

:func:`ring_attention` is one rank's part, called in every process of the group; :func:`zigzag_split` /
:func:`zigzag_merge` balance a causal ring; :class:`RingStats` counts each rank's work, memory and messages.
"""
from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist

from ..checks import check_device, check_positive_int, check_tensor
from ..functional import _check_qkv
from ..tiled import merge_tile


LAYOUTS = ("contiguous", "zigzag")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # coded by index in the handshake


def _sizes(length: int, parts: int) -> list[int]:
    """The lengths of ``torch.tensor_split(x, parts)``'s pieces: the first ``length % parts`` are one longer."""
    base, longer = divmod(length, parts)
    return [base + 1] * longer + [base] * (parts - longer)


def block_ranges(length: int, world_size: int, layout: str = "contiguous") -> list[list[tuple[int, int]]]:
    """The positions of a sequence of ``length`` each rank holds: per rank, a list of ``(start, stop)`` pieces.

    ``"contiguous"``: rank r holds piece r of ``torch.tensor_split(x, world_size)``, one piece.
    ``"zigzag"``: the sequence is cut into 2P pieces and rank r holds pieces r and 2P-1-r, one from each end, so
    that under a causal mask every rank has the same work: its early piece attends few keys, its late piece many
    (see :func:`zigzag_split`).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    n = world_size if layout == "contiguous" else 2 * world_size
    stops = list(itertools.accumulate(_sizes(length, n)))
    pieces = list(zip([0, *stops[:-1]], stops))
    if layout == "contiguous":
        return [[piece] for piece in pieces]
    return [[pieces[r], pieces[n - 1 - r]] for r in range(world_size)]


def zigzag_split(x: torch.Tensor, world_size: int, dim: int = 2) -> list[torch.Tensor]:
    """Cut ``x`` along ``dim`` into 2P pieces (as ``torch.tensor_split`` does) and give rank r pieces r and 2P-1-r.

    With a causal mask, contiguous blocks leave rank 0 one tile of work and rank P-1 P tiles. In the zigzag each
    rank holds an early piece (few keys to attend to) and the mirror late piece (many): 2P+1 tiles each.
    """
    world_size = check_positive_int(world_size, "world_size")
    pieces = torch.tensor_split(x, 2 * world_size, dim=dim)
    return [torch.cat([pieces[r], pieces[2 * world_size - 1 - r]], dim=dim) for r in range(world_size)]


def zigzag_merge(blocks, dim: int = 2) -> torch.Tensor:
    """The inverse of :func:`zigzag_split`: the whole sequence back from the ranks' blocks, in rank order."""
    P = len(blocks)
    sizes = _sizes(sum(b.shape[dim] for b in blocks), 2 * P)
    pieces = [None] * (2 * P)
    for r, block in enumerate(blocks):
        if block.shape[dim] != sizes[r] + sizes[2 * P - 1 - r]:
            raise ValueError(f"block {r} has length {block.shape[dim]} along dim {dim}, but the zigzag of "
                             f"{P} blocks gives it {sizes[r] + sizes[2 * P - 1 - r]}: pass the blocks of "
                             f"zigzag_split, in rank order.")
        pieces[r], pieces[2 * P - 1 - r] = block.split([sizes[r], sizes[2 * P - 1 - r]], dim=dim)
    return torch.cat(pieces, dim=dim)


@dataclass
class RingStats:
    """What one rank did in :func:`ring_attention`. A tile is one (query piece, key piece) block of scores."""

    rank: int
    world_size: int
    tiles: int = 0  # tiles of scores computed
    skipped: int = 0  # tiles skipped: every key in every query's future (causal)
    scores: int = 0  # query-key scores computed, per sentence and head (the sum of bq * bk over the tiles)
    flops: int = 0  # 2 * B * h * bq * bk * (d + dv) summed over the tiles: the matmuls q k^T and p v
    score_bytes: int = 0  # the largest tile of scores held at once
    kv_bytes: int = 0  # the key/value blocks held at once: the one in use and the one arriving
    sent_bytes: int = 0  # bytes sent to the next rank
    compute_s: float = 0.0  # seconds spent computing tiles
    wait_s: float = 0.0  # seconds spent waiting for the next block once the tiles were done (idle)


def _check_ring_inputs(q, k, v, key_padding_mask, layout) -> None:
    """What one rank can check alone, before talking to the others."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_attention runs inside a process group, one call per rank: call it from a function that "
            "launch(world_size, fn) runs, or after torch.distributed.init_process_group(...) (torchrun)."
        )
    _check_qkv(q, k, v)
    if q.ndim != 4:
        raise ValueError(f"q, k and v must be (B, h, L_r, d): this rank's block of every head, got q {tuple(q.shape)}. "
                         f"Split heads first (split_heads(x, h) turns (B, L_r, D) into (B, h, L_r, d)).")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"q holds {q.shape[2]} positions but k and v hold {k.shape[2]}: in ring attention each rank "
                         f"passes the queries, keys and values of the same positions (its block of one sequence).")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise RuntimeError("ring_attention computes the forward pass only: its key/value blocks arrive through "
                           "send/recv, which autograd does not differentiate. Call it under torch.no_grad() (or "
                           "pass tensors that do not require grad).")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    if key_padding_mask is not None:
        check_tensor(key_padding_mask, "key_padding_mask")
        B, L_r = q.shape[0], q.shape[2]
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (B, L_r):
            raise ValueError(
                f"key_padding_mask must be a bool tensor (B, L_r) = ({B}, {L_r}), True at this rank's padded keys, "
                f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}. Cut the whole (B, L) mask like the "
                f"keys, along dim 1: torch.tensor_split(mask, world_size, dim=1)[rank] (or zigzag_split(mask, "
                f"world_size, dim=1)[rank])."
            )
        check_device(key_padding_mask, "key_padding_mask", q.device, "q")


def _handshake(q, v, key_padding_mask, is_causal, layout, rank, P, group) -> list[int]:
    """Every rank's block length, after checking that all ranks called with the same shapes and options."""
    B, h, L_r, d = q.shape
    mine = [B, h, L_r, d, v.shape[-1], key_padding_mask is not None, bool(is_causal), LAYOUTS.index(layout),
            _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1]
    everyone = [torch.zeros(len(mine), dtype=torch.int64, device=q.device) for _ in range(P)]
    dist.all_gather(everyone, torch.tensor(mine, device=q.device), group=group)
    everyone = [t.tolist() for t in everyone]
    names = ["B", "h", None, "d", "dv", "a key_padding_mask", "is_causal", "layout", "dtype"]
    for i, name in enumerate(names):
        values = [row[i] for row in everyone]
        if name is not None and len(set(values)) > 1:
            raise ValueError(f"the ranks disagree on {name}: rank by rank {values}. Every rank must call "
                             f"ring_attention with the same B, h, d, dv, dtype, options, and all or none with a "
                             f"key_padding_mask (all False where a block has no padding).")
    lengths = [row[2] for row in everyone]
    want = [sum(b - a for a, b in pieces) for pieces in block_ranges(sum(lengths), P, layout)]
    if lengths != want:
        cut = ("torch.tensor_split(x, world_size, dim=2)[rank]" if layout == "contiguous"
               else "zigzag_split(x, world_size, dim=2)[rank]")
        raise ValueError(f"rank by rank the blocks hold {lengths} positions, but a sequence of {sum(lengths)} cut "
                         f"into {P} {layout} blocks gives {want}. Cut q, k, v with {cut}.")
    return lengths


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    group=None,
    layout: str = "contiguous",
    return_stats: bool = False,
):
    """Attention of this rank's queries over the whole sequence, whose keys and values are spread over the ranks.

    Called by every rank of ``group`` (default: all), each with its block of one sequence: q, k, v
    (B, h, L_r, d|dv) as ``torch.tensor_split(x, world_size, dim=2)[rank]`` cuts them (``layout="contiguous"``;
    lengths may differ by one) or as ``zigzag_split(x, world_size)[rank]`` does (``layout="zigzag"``), and its
    keys' padding mask (B, L_r), True at pads. Returns this rank's block of the output (B, h, L_r, dv), equal up
    to rounding to full attention over the whole sequence cut the same way; a query with no key to attend to gets
    zeros (as :func:`~attention_course.functional.fused_attention`).

    The ring: at step s (of P) rank r holds the key/value block of rank (r - s) mod P. It starts sending that
    block to rank r+1 and receiving the next from rank r-1 (``isend``/``irecv``), computes the block's tiles of
    scores meanwhile, merges them into its running (m, l, acc) with chapter 8's online softmax, and waits for the
    transfer only then. With ``is_causal=True`` query i attends keys 0..i; tiles whose keys all lie in every
    query's future are skipped. ``return_stats=True`` returns ``(out, RingStats)``: the work and memory of this rank.

    Forward only: the blocks arrive through send/recv, which autograd does not differentiate.
    """
    _check_ring_inputs(q, k, v, key_padding_mask, layout)
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    lengths = _handshake(q, v, key_padding_mask, is_causal, layout, rank, P, group)
    pieces = block_ranges(sum(lengths), P, layout)  # the global (start, stop) of each rank's pieces
    stats = RingStats(rank, P)
    B, h, L_r, d = q.shape
    dv = v.shape[-1]
    peer = lambda r: r if group is None else dist.get_global_rank(group, r)  # noqa: E731
    send_to, recv_from = peer((rank + 1) % P), peer((rank - 1) % P)

    qs = q * d**-0.5  # (B, h, L_r, d), scaled once
    kv = torch.cat([k, v], dim=-1)  # (B, h, L_r, d + dv): one message per step
    pads = None if key_padding_mask is None else key_padding_mask.to(torch.uint8)  # (B, L_r); gloo sends uint8
    states = [(q.new_full((B, h, b - a, 1), float("-inf")), q.new_zeros((B, h, b - a, 1)),
               q.new_zeros((B, h, b - a, dv))) for a, b in pieces[rank]]  # (m, l, acc) per query piece
    for step in range(P):
        src = (rank - step) % P  # whose keys and values we hold now
        if step < P - 1:  # start passing them on, and receiving the next, before computing
            nxt = (rank - step - 1) % P
            recv_kv = kv.new_empty((B, h, lengths[nxt], d + dv))
            ops = [dist.P2POp(dist.isend, kv, send_to), dist.P2POp(dist.irecv, recv_kv, recv_from)]
            stats.sent_bytes += kv.nbytes
            if pads is not None:
                recv_pads = pads.new_empty((B, lengths[nxt]))
                ops += [dist.P2POp(dist.isend, pads, send_to), dist.P2POp(dist.irecv, recv_pads, recv_from)]
                stats.sent_bytes += pads.nbytes
            requests = dist.batch_isend_irecv(ops)
            stats.kv_bytes = max(stats.kv_bytes, kv.nbytes + recv_kv.nbytes)
        stats.kv_bytes = max(stats.kv_bytes, kv.nbytes)
        start = time.perf_counter()
        q_off = 0
        for i, (qa, qb) in enumerate(pieces[rank]):
            k_off = 0
            for ka, kb in pieces[src]:
                k_lo, k_hi, k_off = k_off, k_off + kb - ka, k_off + kb - ka
                if qb == qa or kb == ka:  # an empty piece (a sequence shorter than 2P in the zigzag)
                    continue
                if is_causal and ka > qb - 1:  # every key after every query: nothing to compute
                    stats.skipped += 1
                    continue
                s = qs[:, :, q_off:q_off + qb - qa] @ kv[:, :, k_lo:k_hi, :d].transpose(-2, -1)  # (B, h, bq, bk)
                if is_causal and kb - 1 > qa:  # the tile crosses the diagonal: mask key j > query i
                    future = torch.arange(ka, kb, device=q.device) > torch.arange(qa, qb, device=q.device)[:, None]
                    s = s.masked_fill(future, float("-inf"))
                if pads is not None:
                    s = s.masked_fill(pads[:, None, None, k_lo:k_hi].bool(), float("-inf"))
                states[i] = merge_tile(states[i], s, kv[:, :, k_lo:k_hi, d:])
                stats.tiles += 1
                stats.scores += (qb - qa) * (kb - ka)
                stats.flops += 2 * B * h * (qb - qa) * (kb - ka) * (d + dv)
                stats.score_bytes = max(stats.score_bytes, s.nbytes)
            q_off += qb - qa
        stats.compute_s += time.perf_counter() - start
        if step < P - 1:
            start = time.perf_counter()
            for request in requests:
                request.wait()
            stats.wait_s += time.perf_counter() - start
            kv, pads = recv_kv, (None if pads is None else recv_pads)
    # A query that saw no key has l = 0 and acc = 0: divide by 1 instead, the output is 0.
    out = torch.cat([acc / l.masked_fill(l == 0, 1.0) for m, l, acc in states], dim=2)  # (B, h, L_r, dv)  # noqa: E741
    return (out, stats) if return_stats else out
