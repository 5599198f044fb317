"""A paged KV cache: keys and values in fixed-size blocks of one shared pool, a block table per request.

Chapter 10's cache is one tensor per request that grows (or is preallocated to the longest length it might reach).
PagedAttention (vLLM) cuts the cache into **blocks** of ``block_size`` token slots, all in one pool
``(num_blocks, h_kv, block_size, d)`` per layer, and gives each request a **block table**: the list of the blocks
that hold its tokens, in order. Token t of a request sits in block ``table[t // block_size]`` at offset
``t % block_size``. A request holds at most one partly filled block, so at most ``block_size - 1`` slots are idle
per request, whatever the lengths.

Blocks carry a reference count. :meth:`PagedKVCache.fork` lets a second request share every block of a first (the
same prompt, computed once); a shared block is read by both and written by neither: the first write into a shared,
partly filled block copies it first (**copy on write**).
"""
from __future__ import annotations

import torch

from ..checks import check_floating, check_positive_int, check_tensor


class PoolExhausted(RuntimeError):
    """The pool has fewer free blocks than a request needs now."""


def check_block_table(table, num_blocks: int, length: int, block_size: int, live=None) -> torch.Tensor:
    """``table`` must list (as an int tensor or list) at least ceil(length / block_size) blocks of the pool, each
    in range and, if ``live`` (bool (num_blocks,)) is given, not freed. Returns the table as a LongTensor."""
    table = torch.as_tensor(table, dtype=torch.long)
    if table.ndim != 1:
        raise ValueError(f"a block table is a 1-D list of block numbers, got shape {tuple(table.shape)}.")
    needed = -(-length // block_size)
    if len(table) < needed:
        raise ValueError(f"{length} tokens need ceil({length} / {block_size}) = {needed} blocks, but the block table "
                         f"names {len(table)}: {table.tolist()}.")
    bad = [int(b) for b in table if not 0 <= int(b) < num_blocks]
    if bad:
        raise IndexError(f"the block table {table.tolist()} names blocks {bad} outside the pool (0 .. "
                         f"{num_blocks - 1}).")
    if live is not None:
        freed = [int(b) for b in table[:needed] if not bool(live[b])]
        if freed:
            raise RuntimeError(f"the block table {table.tolist()} points at freed block(s) {freed}: their slots may "
                               f"already hold another request's tokens. A table must be dropped when its request "
                               f"is freed (or its blocks forked, which counts a reference, before it is).")
    return table


def gather_blocks(pool: torch.Tensor, table, length: int, live=None) -> torch.Tensor:
    """One request's entries from a pool (num_blocks, h_kv, block_size, d): the blocks its table names, in order,
    laid end to end, cut at ``length`` tokens. Returns (h_kv, length, d), the contiguous cache of that request."""
    check_floating(pool, "pool")
    if pool.ndim != 4:
        raise ValueError(f"pool must be (num_blocks, h_kv, block_size, d), got shape {tuple(pool.shape)}.")
    num_blocks, h_kv, block_size, d = pool.shape
    table = check_block_table(table, num_blocks, length, block_size, live).to(pool.device)
    needed = -(-length // block_size)
    blocks = pool[table[:needed]]  # (n_blocks, h_kv, block_size, d)
    return blocks.transpose(0, 1).reshape(h_kv, needed * block_size, d)[:, :length]  # (h_kv, length, d)


class PagedKVCache:
    """Keys and values of many requests in one pool of blocks, for ``num_layers`` layers sharing the block tables.

    ``k``, ``v``: (num_layers, num_blocks, h_kv, block_size, d). Per request: a block table and a length. A request
    is added with :meth:`add` (or :meth:`fork` of another), grows by :meth:`reserve` (slots for its next tokens,
    blocks allocated as needed) and :meth:`write` (one layer's keys and values into those slots), is read by
    :meth:`gather` and leaves with :meth:`free`, which returns every block no other request holds.
    """

    def __init__(self, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int, num_layers: int = 1,
                 dtype: torch.dtype = torch.float32, device=None):
        for n, name in ((num_blocks, "num_blocks"), (block_size, "block_size"), (num_kv_heads, "num_kv_heads"),
                        (head_dim, "head_dim"), (num_layers, "num_layers")):
            check_positive_int(n, name)
        shape = (num_layers, num_blocks, num_kv_heads, block_size, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (layers, blocks, h_kv, block_size, d)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.num_blocks, self.block_size = num_blocks, block_size
        self.refs = [0] * num_blocks  # how many requests hold each block
        self.free_list = list(range(num_blocks))
        self.tables: dict = {}  # request -> [block, ...]
        self.lengths: dict = {}  # request -> tokens written
        self.copies = 0  # blocks copied on write

    # -- bookkeeping ------------------------------------------------------------------------------------------
    def __repr__(self) -> str:
        return (f"PagedKVCache(blocks={self.num_blocks} x {self.block_size} slots, free={len(self.free_list)}, "
                f"requests={len(self.tables)})")

    @property
    def block_bytes(self) -> int:
        """Bytes of one block, keys and values, over all layers."""
        return 2 * self.k[:, 0].nbytes

    @property
    def blocks_in_use(self) -> int:
        return self.num_blocks - len(self.free_list)

    @property
    def available(self) -> int:
        """Blocks a request can still get: the free ones."""
        return len(self.free_list)

    def blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _known(self, request) -> None:
        if request not in self.tables:
            raise KeyError(f"request {request!r} is not in the cache (known: {sorted(map(str, self.tables))}). Add it "
                           f"with add() or fork() first; a freed request is gone.")

    def add(self, request) -> None:
        if request in self.tables:
            raise ValueError(f"request {request!r} is already in the cache.")
        self.tables[request], self.lengths[request] = [], 0

    def fork(self, parent, child) -> None:
        """``child`` starts as a copy of ``parent`` that shares every block (no bytes copied): reference counts + 1."""
        self._known(parent)
        self.add(child)
        self.tables[child], self.lengths[child] = list(self.tables[parent]), self.lengths[parent]
        for b in self.tables[child]:
            self.refs[b] += 1

    def _allocate(self) -> int:
        block = self.free_list.pop(0)
        self.refs[block] = 1
        return block

    def free(self, request) -> None:
        """Drop ``request``: each of its blocks loses a reference; blocks no one holds go back to the pool."""
        self._known(request)
        for b in self.tables.pop(request):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                self.free_list.append(b)
        del self.lengths[request]

    # -- writing ------------------------------------------------------------------------------------------------
    def reserve(self, request, n: int) -> torch.Tensor:
        """Slots (n,) for ``request``'s next n tokens, as flat indices block * block_size + offset, allocating
        blocks as needed; a shared, partly filled last block is copied first (copy on write)."""
        self._known(request)
        check_positive_int(n, "n")
        table, length, size = self.tables[request], self.lengths[request], self.block_size
        partial_shared = length % size and self.refs[table[-1]] > 1
        new_blocks = self.blocks_for(length + n) - len(table) + bool(partial_shared)
        if new_blocks > len(self.free_list):
            raise PoolExhausted(
                f"request {request!r} needs {new_blocks} more block(s) of {size} slots for {n} token(s), but the pool "
                f"has {len(self.free_list)} free of {self.num_blocks}. Free finished requests first, admit fewer at "
                f"once, or build the cache with more num_blocks."
            )
        if partial_shared:  # copy on write: the other holders keep the old block
            old, new = table[-1], self._allocate()
            self.k[:, new], self.v[:, new] = self.k[:, old], self.v[:, old]
            self.refs[old] -= 1
            table[-1] = new
            self.copies += 1
        while len(table) < self.blocks_for(length + n):
            table.append(self._allocate())
        self.lengths[request] = length + n
        return torch.tensor([table[t // size] * size + t % size for t in range(length, length + n)])  # (n,)

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's keys and values, (h_kv, n, d) each, in the slots :meth:`reserve` gave."""
        check_tensor(slots, "slots")
        _, _, h_kv, size, d = self.k.shape
        for t, name in ((k, "k"), (v, "v")):
            check_floating(t, name)
            if t.shape != (h_kv, len(slots), d):
                raise ValueError(f"{name} must be (h_kv, n, d) = {(h_kv, len(slots), d)} for {len(slots)} slots, got "
                                 f"{tuple(t.shape)}.")
            if t.dtype != self.k.dtype:
                raise TypeError(f"{name} is {t.dtype} but the pool holds {self.k.dtype}: build the cache with the "
                                f"model's dtype.")
        slots = slots.to(self.k.device)
        block, offset = slots // size, slots % size
        self.k[layer, block, :, offset] = k.transpose(0, 1)  # (n, h_kv, d) into the slots
        self.v[layer, block, :, offset] = v.transpose(0, 1)

    # -- reading ------------------------------------------------------------------------------------------------
    def gather(self, layer: int, request) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v), (h_kv, T, d) each: ``request``'s T tokens so far, through its block table."""
        self._known(request)
        live = torch.tensor(self.refs) > 0
        table, T = self.tables[request], self.lengths[request]
        return (gather_blocks(self.k[layer], table, T, live),  # (h_kv, T, d)
                gather_blocks(self.v[layer], table, T, live))

    def slots_of(self, request) -> torch.Tensor:
        """(T,) flat slot indices (block * block_size + offset) of ``request``'s tokens, in order; its table checked
        against freed blocks."""
        self._known(request)
        table, T = self.tables[request], self.lengths[request]
        table = check_block_table(table, self.num_blocks, T, self.block_size, torch.tensor(self.refs) > 0)
        t = torch.arange(T)
        return table[t // self.block_size] * self.block_size + t % self.block_size  # (T,)

    def snapshot(self) -> list:
        """For each block, the (request, first token, last token) entries that hold it (several when shared)."""
        held = [[] for _ in range(self.num_blocks)]
        for request, table in self.tables.items():
            for i, b in enumerate(table):
                last = min((i + 1) * self.block_size, self.lengths[request]) - 1
                held[b].append((request, i * self.block_size, last))
        return held


def preallocated_slots(lengths, max_len: int) -> int:
    """Token slots a cache reserves when every request gets ``max_len`` slots up front (one contiguous tensor per
    request, sized for the longest it may grow)."""
    if any(n > max_len for n in lengths):
        raise ValueError(f"max_len={max_len} is shorter than the longest request, {max(lengths)}.")
    return len(lengths) * max_len


def paged_slots(lengths, block_size: int) -> int:
    """Token slots a paged cache holds for requests of these lengths: ceil(L / block_size) blocks each."""
    check_positive_int(block_size, "block_size")
    return sum(-(-n // block_size) for n in lengths) * block_size
