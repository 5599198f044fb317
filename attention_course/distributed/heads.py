"""Heads over ranks (tensor parallelism): W_q, W_k, W_v split by heads (column-parallel), W_o by its input columns
(row-parallel); each rank computes its heads, and one all-reduce sums the ranks' parts of the output.

:func:`head_parallel_by_hand` does it with ``dist.all_reduce``, :func:`parallelize_attention` with
``parallelize_module``; :func:`split_in_proj_by_heads` cuts a packed ``in_proj_weight``; :func:`tp_bytes_per_layer`
is what the all-reduce sends.
"""
from __future__ import annotations

import copy

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..checks import check_positive_int, check_tensor
from ..functional import fused_attention
from ..heads import head_dim, merge_heads, split_heads
from ..masks import merge_masks
from ..multihead import MultiheadAttention


def check_head_split(num_heads: int, world_size: int, num_kv_heads: int | None = None) -> int:
    """The number of heads each rank holds, after checking that ``world_size`` divides the heads.

    With grouped-query attention (``num_kv_heads`` < ``num_heads``) each rank needs whole groups: its query heads
    and the key/value heads they share, so ``world_size`` must divide ``num_kv_heads`` too (or the key/value heads
    would have to be copied to several ranks).
    """
    num_heads, world_size = check_positive_int(num_heads, "num_heads"), check_positive_int(world_size, "world_size")
    fits = [p for p in range(1, num_heads + 1) if num_heads % p == 0]
    if num_heads % world_size:
        raise ValueError(f"{world_size} ranks cannot share {num_heads} heads equally: the world size must divide "
                         f"num_heads. Use {fits} ranks, or a layer with a multiple of {world_size} heads.")
    if num_kv_heads is not None and num_kv_heads % world_size:
        raise ValueError(f"{world_size} ranks cannot share {num_kv_heads} key/value heads: with grouped-query "
                         f"attention each rank holds whole groups, so the world size must divide num_kv_heads too.")
    return num_heads // world_size


def split_in_proj_by_heads(in_proj: torch.Tensor, num_heads: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a packed input projection: (3E, E) weight -> (3E/P, E), or (3E,) bias -> (3E/P,).

    ``in_proj_weight`` stacks W_q; W_k; W_v, each (E, E) with head j in rows j*d .. (j+1)*d. Rank r of P holds
    heads r*h/P .. (r+1)*h/P of each: those rows of W_q, then of W_k, then of W_v. (Cutting the packed rows into P
    contiguous pieces instead would give rank 0 all of W_q and part of W_k.)
    """
    check_tensor(in_proj, "in_proj")
    if in_proj.ndim not in (1, 2) or in_proj.shape[0] % 3:
        raise ValueError(f"in_proj must be a packed (3E, E) in_proj_weight or (3E,) in_proj_bias, got shape "
                         f"{tuple(in_proj.shape)}.")
    heads = check_head_split(num_heads, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}.")
    E = in_proj.shape[0] // 3
    d = head_dim(E, num_heads)
    rows = slice(rank * heads * d, (rank + 1) * heads * d)
    return torch.cat([w[rows] for w in in_proj.chunk(3)])  # (3E/P, E) or (3E/P,)


def allreduce_bytes(nbytes: int, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes``: 2 (P-1)/P nbytes (a reduce-scatter, then an
    all-gather, each passing P-1 pieces of nbytes/P). Gloo's all-reduce on the CPU is this ring."""
    return 2 * (world_size - 1) / world_size * nbytes


def tp_bytes_per_layer(batch: int, length: int, embed_dim: int, world_size: int, dtype=torch.float32) -> float:
    """Bytes each rank sends in one forward pass of a head-parallel attention layer: the one all-reduce of the
    (B, L, E) output, 2 (P-1)/P B L E bytes-per-number. It does not depend on the number of heads.

    (The backward pass all-reduces the input's gradient, a partial sum over the ranks' heads: in
    :class:`HeadParallelAttention`, whose three projections are three ``ColwiseParallel`` layers, once per
    projection, three times this. Packing the three into one layer, as Megatron-LM does, makes it once.)"""
    return allreduce_bytes(batch * length * embed_dim * torch.empty((), dtype=dtype).element_size(), world_size)


class HeadParallelAttention(nn.Module):
    """A multi-head attention layer whose heads are spread over the ranks of a 1-D ``DeviceMesh``.

    Built by :func:`parallelize_attention` from a ``MultiheadAttention`` (the course's or torch's, whose packed
    ``in_proj_weight`` is not an ``nn.Linear``): its W_q, W_k, W_v become the ``nn.Linear`` ``q_proj``, ``k_proj``,
    ``v_proj`` and ``parallelize_module`` splits them by output rows (``ColwiseParallel``: rank r keeps heads
    r h/P .. (r+1) h/P), and ``out_proj`` by input columns (``RowwiseParallel``: the columns that multiply those
    heads). Each rank attends with its own heads; ``out_proj`` adds the ranks' parts with one all-reduce.

    ``forward(query, key, value, key_padding_mask=None, attn_mask=None, is_causal=False)`` takes the masks of
    ``MultiheadAttention`` and returns ``(output, None)`` like it with ``need_weights=False``: the same output on
    every rank. The parameters are DTensors holding this rank's shard.
    """

    def __init__(self, mha: nn.Module, mesh):
        # Imported here, not with the package: torch.distributed.tensor is heavy, and only this layer needs it.
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        super().__init__()
        if not isinstance(mha, (nn.MultiheadAttention, MultiheadAttention)):
            raise TypeError(f"parallelize_attention takes a MultiheadAttention (the course's or torch's), got "
                            f"{type(mha).__name__}.")
        if mesh.ndim != 1:
            raise ValueError(f"the mesh must be 1-D (the ranks that share the heads), got {mesh.ndim}-D; pass "
                             f"mesh[name] for the tensor-parallel dimension of a larger mesh.")
        E, h, P = mha.embed_dim, mha.num_heads, mesh.size()
        self.num_heads, self.local_heads = h, check_head_split(h, P)
        self.first_head = mesh.get_local_rank() * self.local_heads
        self.dropout, self.batch_first, self.packed = mha.dropout, mha.batch_first, mha.in_proj_weight is not None
        weight = mha.out_proj.weight
        W = mha.in_proj_weight.chunk(3) if self.packed else (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        b = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
        for name, w, bias in zip(("q_proj", "k_proj", "v_proj"), W, b):
            linear = nn.Linear(w.shape[1], E, bias=bias is not None, device=weight.device, dtype=weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(w)
                if bias is not None:
                    linear.bias.copy_(bias)
            setattr(self, name, linear)
        self.out_proj = copy.deepcopy(mha.out_proj)
        plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
                "out_proj": RowwiseParallel()}
        parallelize_module(self, mesh, plan)  # the weights become DTensors: this rank keeps its shard

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None, is_causal=False):
        if not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))  # (L, B, E) -> (B, L, E)
        (B, L, _), S = query.shape, key.shape[1]
        q, k, v = (split_heads(proj(x), self.local_heads)  # (B, L, E/P): this rank's heads -> (B, h/P, L|S, d)
                   for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        mask = merge_masks(key_padding_mask, attn_mask, batch_size=B, num_heads=self.num_heads, query_len=L,
                           key_len=S, is_causal=is_causal, dtype=query.dtype, device=query.device, expand=False)
        if mask is not None and mask.shape[1] > 1:  # a mask per head: keep this rank's heads
            mask = mask[:, self.first_head:self.first_head + self.local_heads]
        out = fused_attention(q, k, v, mask, self.dropout, self.training)  # (B, h/P, L, d)
        out = self.out_proj(merge_heads(out))  # (B, L, E/P) @ its rows of W_o^T, summed over the ranks: (B, L, E)
        out = torch.ops._c10d_functional.wait_tensor(out)  # the all-reduce runs asynchronously: wait for it
        return (out if self.batch_first else out.transpose(0, 1)), None

    def gathered(self, grads: bool = False) -> dict:
        """The whole parameters (or their gradients), gathered from every rank, under the names of the
        ``MultiheadAttention`` this layer was made from: compare them with it. A collective: every rank calls it."""
        def full(p):
            t = p.grad if grads else p
            return None if t is None else t.full_tensor().detach()
        names = ("q", "k", "v")
        if self.packed:
            out = {"in_proj_weight": torch.cat([full(getattr(self, f"{n}_proj").weight) for n in names])}
        else:
            out = {f"{n}_proj_weight": full(getattr(self, f"{n}_proj").weight) for n in names}
        if self.q_proj.bias is not None:
            out["in_proj_bias"] = torch.cat([full(getattr(self, f"{n}_proj").bias) for n in names])
        out["out_proj.weight"] = full(self.out_proj.weight)
        if self.out_proj.bias is not None:
            out["out_proj.bias"] = full(self.out_proj.bias)
        return out


def parallelize_attention(mha: nn.Module, mesh) -> HeadParallelAttention:
    """``mha`` (the course's or torch's ``MultiheadAttention``) with its heads split over the ranks of ``mesh``.

    Inside a process group, every rank calls it with the same layer and a 1-D mesh, e.g.
    ``init_device_mesh("cpu", (world_size,))``; ``parallelize_module`` copies rank 0's weights to all. The result
    computes the same output and gradients as ``mha`` (see :class:`HeadParallelAttention`). The world size must
    divide the number of heads.
    """
    return HeadParallelAttention(mha, mesh)


def head_parallel_by_hand(mha: nn.Module, x: torch.Tensor, *, key_padding_mask=None, is_causal=False, group=None):
    """Self-attention of x (B, L, E) through this rank's heads of ``mha``, by hand: ``(part, output)``.

    Rank r projects x with its rows of the packed ``in_proj_weight`` (:func:`split_in_proj_by_heads`), attends
    with its h/P heads, and multiplies their merged output (B, L, E/P) by its E/P columns of W_o: ``part``
    (B, L, E), its share of the output. ``dist.all_reduce`` adds the ranks' parts; adding the output bias once
    gives ``output``, equal to ``mha(x, x, x)[0]`` (block matrices: W_o [o_0 ... o_{P-1}]^T = sum_r W_o,r o_r).
    """
    if getattr(mha, "in_proj_weight", None) is None:
        raise ValueError("head_parallel_by_hand takes a layer with a packed in_proj_weight (kdim = vdim = embed_dim).")
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    heads, (B, L, E) = check_head_split(mha.num_heads, P), x.shape
    W = split_in_proj_by_heads(mha.in_proj_weight, mha.num_heads, rank, P)  # (3E/P, E)
    b = None if mha.in_proj_bias is None else split_in_proj_by_heads(mha.in_proj_bias, mha.num_heads, rank, P)
    q, k, v = (split_heads(t, heads) for t in F.linear(x, W, b).chunk(3, dim=-1))  # (B, h/P, L, d) each
    mask = merge_masks(key_padding_mask, None, batch_size=B, num_heads=1, query_len=L, key_len=L,
                       is_causal=is_causal, dtype=x.dtype, device=x.device, expand=False)  # (B|1, 1, L|1, L)
    out = merge_heads(fused_attention(q, k, v, mask))  # (B, L, E/P)
    cols = slice(rank * E // P, (rank + 1) * E // P)
    part = out @ mha.out_proj.weight[:, cols].T  # (B, L, E): this rank's share of the output, before the bias
    total = part.clone()
    dist.all_reduce(total, group=group)  # sum over the ranks, on every rank
    return part, (total if mha.out_proj.bias is None else total + mha.out_proj.bias)
