"""A prefix cache: full blocks found by their tokens and everything before them, shared without ``fork``.

:meth:`PagedKVCache.fork` shares a prompt only when someone says that two requests share it. A server finds shared
prefixes itself (vLLM's automatic prefix caching; SGLang's radix tree): each FULL block gets a **key** computed from
its tokens and from the key of the block before it (a hash chain), so that a key names a block's tokens *and* their
positions *and* every token before them, which is all its keys and values depend on (a causal model). A new request
looks its first full blocks up by their keys and attaches every block found (a reference count + 1, no bytes
copied, nothing computed); it computes only the tokens after them.

:func:`block_hash` is the chain's link: sha256 of the parent's digest (nothing for the first block) followed by the
block's token ids, each as 8 little-endian signed bytes. Python's ``hash()`` is not used: it is salted for strings
(another value in every process) and 64 bits wide (collisions a server would serve as wrong keys and values).

:class:`PrefixCachingKVCache` keeps a block that no request holds any more but that has a key (it is *cached*), and
hands it out again, key dropped, only when the pool has no free block left: the least recently used first.
:class:`PrefixScheduler` is :class:`~attention_course.serving.Scheduler` with the two calls that use it: a request
with nothing in the cache yet attaches what the cache holds of its tokens before the step plans them, and the
blocks of every request in the step are registered once the step has written them.
"""
from __future__ import annotations

import hashlib
import struct
from collections import OrderedDict

import torch

from ..checks import check_positive_int
from .paged import PagedKVCache, PoolExhausted
from .scheduler import Scheduler, StepBatch


def _token_ids(tokens, name: str = "tokens") -> list:
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.tolist()
    if not isinstance(tokens, (list, tuple)) or not all(isinstance(t, int) and not isinstance(t, bool)
                                                        for t in tokens):
        raise TypeError(f"{name} must be a list of token ids (ints), got {tokens!r}.")
    return list(tokens)


def block_hash(parent: bytes | None, tokens) -> bytes:
    """The key of a block: sha256 of ``parent`` (the key of the block before it; None for a request's first block)
    followed by the block's token ids, each as 8 little-endian signed bytes. Returns the 32-byte digest."""
    if parent is not None and (not isinstance(parent, bytes) or len(parent) != 32):
        raise ValueError(f"parent must be None (the first block) or the 32-byte key of the block before, got "
                         f"{parent!r}.")
    tokens = _token_ids(tokens)
    if not tokens:
        raise ValueError("a block holds at least one token; got none.")
    if not all(-2 ** 63 <= t < 2 ** 63 for t in tokens):
        raise ValueError(f"token ids must fit in 8 signed bytes, got {tokens}.")
    return hashlib.sha256((parent or b"") + struct.pack(f"<{len(tokens)}q", *tokens)).digest()


def block_keys(tokens, block_size: int) -> list:
    """Keys of every full block of ``tokens`` in order, each chained to the one before; a partial last block has
    none (its tokens are not all known yet, and a block is shared only once it is full)."""
    tokens, size = _token_ids(tokens), check_positive_int(block_size, "block_size")
    keys: list = []
    for start in range(0, len(tokens) - size + 1, size):
        keys.append(block_hash(keys[-1] if keys else None, tokens[start:start + size]))
    return keys


class PrefixCachingKVCache(PagedKVCache):
    """A :class:`PagedKVCache` whose full blocks, once written, are kept under their key (:func:`block_hash`) and
    attached to any later request whose tokens start with the same blocks.

    * :meth:`register` gives every full block of a request its key, once its keys and values are written;
    * :meth:`match`, for a request just added, attaches the longest run of cached blocks whose keys are those of its
      first full blocks and returns the number of tokens they hold; it always leaves the last token to compute;
    * :meth:`free`: a block no request holds any more stays cached if it has a key (*evictable*), else it returns
      to the free list;
    * allocation takes a free block first, else evicts the least recently used evictable block (its key dropped).

    "Used" is the moment a block was last released, i.e. the moment its last holder let it go: only a block that no
    request holds can be evicted, and an attached block is always released before it can be, so the release is its
    last use. A request releases its blocks from the last to the first, so that a block goes before its parent: a
    block is found only through its parent's key (:meth:`match` walks the chain from the first block), so a parent
    evicted first would leave its children cached but unreachable.

    ``available`` counts the free and the evictable blocks; ``blocks_in_use`` those some request holds. A block a
    live request holds is never evicted, and a request never writes into a cached block: cached blocks are full, so
    the next token after a match opens a new block (both asserted). Counters: ``hits`` (blocks attached from the
    cache), ``tokens_saved`` (tokens those blocks hold), ``evictions``.
    """

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.key_of: dict = {}  # block -> its key
        self.cached: dict = {}  # key -> block
        self.evictable: OrderedDict = OrderedDict()  # cached blocks no request holds, least recently released first
        self.chains: dict = {}  # request -> keys of its first full blocks, registered or matched
        self.hits = self.tokens_saved = self.evictions = 0

    def __repr__(self) -> str:
        return (f"PrefixCachingKVCache(blocks={self.num_blocks} x {self.block_size} slots, free={len(self.free_list)}, "
                f"cached={len(self.cached)} ({len(self.evictable)} evictable), requests={len(self.tables)})")

    @property
    def available(self) -> int:
        """Blocks a request can still get: the free ones and the cached ones no request holds."""
        return len(self.free_list) + len(self.evictable)

    @property
    def blocks_in_use(self) -> int:
        """Blocks held by at least one request (a cached block no one holds is available, not in use)."""
        return self.num_blocks - self.available

    def add(self, request) -> None:
        super().add(request)
        self.chains[request] = []

    def fork(self, parent, child) -> None:
        super().fork(parent, child)
        self.chains[child] = list(self.chains[parent])

    # -- the cache ----------------------------------------------------------------------------------------------
    def register(self, request, tokens) -> None:
        """Give each full block of ``request`` not registered yet its key. ``tokens``: the request's token ids so
        far, those written to the cache (at most its length). A key already held by another block is left to that
        block (two requests that computed the same block at once): this block then stays unshared."""
        self._known(request)
        tokens, size = _token_ids(tokens), self.block_size
        if len(tokens) > self.lengths[request]:
            raise ValueError(f"request {request!r} has {self.lengths[request]} tokens written in the cache, but "
                             f"{len(tokens)} were given to register: only written blocks can be shared.")
        chain, table = self.chains[request], self.tables[request]
        for i in range(len(chain), len(tokens) // size):
            key = block_hash(chain[-1] if chain else None, tokens[i * size:(i + 1) * size])
            chain.append(key)
            block = table[i]
            if block in self.key_of:
                if self.key_of[block] != key:
                    raise ValueError(f"block {block} of request {request!r} is cached for other tokens than "
                                     f"{tokens[i * size:(i + 1) * size]}: register the tokens written, in order.")
            elif key not in self.cached:
                self.cached[key], self.key_of[block] = block, key

    def match(self, request, tokens) -> int:
        """Attach to ``request`` (just added: nothing in the cache yet) the longest run of cached blocks whose keys
        are those of the first full blocks of ``tokens``; returns the tokens they hold. At most
        (len(tokens) - 1) // block_size blocks: the last token is always left to compute, its logits being needed."""
        self._known(request)
        if self.tables[request]:
            raise ValueError(f"request {request!r} already holds {len(self.tables[request])} block(s): match a request "
                             f"right after add(), before anything is written for it.")
        tokens, size = _token_ids(tokens), self.block_size
        if not tokens:
            raise ValueError("match needs the request's tokens; got none.")
        chain, table = self.chains[request], self.tables[request]
        for i in range((len(tokens) - 1) // size):
            block = self.cached.get(block_hash(chain[-1] if chain else None, tokens[i * size:(i + 1) * size]))
            if block is None:
                break
            chain.append(self.key_of[block])
            table.append(block)
            self.evictable.pop(block, None)  # held again: not evictable
            self.refs[block] += 1
        self.lengths[request] = len(table) * size
        assert self.lengths[request] % size == 0  # the next token opens a new block: nothing shared is written
        self.hits += len(table)
        self.tokens_saved += len(table) * size
        return self.lengths[request]

    def free(self, request) -> None:
        """Drop ``request``, releasing its blocks from the last to the first: a block no one holds stays cached
        (evictable, most recently used) if it has a key, else it returns to the free list."""
        self._known(request)
        for b in reversed(self.tables.pop(request)):
            self.refs[b] -= 1
            if self.refs[b] == 0:
                if b in self.key_of:
                    self.evictable[b] = None
                else:
                    self.free_list.append(b)
        del self.lengths[request], self.chains[request]

    def _evict(self) -> None:
        block, _ = self.evictable.popitem(last=False)  # the least recently released
        assert self.refs[block] == 0  # a block a request holds is never evicted
        del self.cached[self.key_of.pop(block)]
        self.free_list.append(block)
        self.evictions += 1

    def reserve(self, request, n: int) -> torch.Tensor:
        """:meth:`PagedKVCache.reserve`, evicting as many cached blocks as the free list lacks first."""
        self._known(request)
        check_positive_int(n, "n")
        table, length, size = self.tables[request], self.lengths[request], self.block_size
        partial_shared = length % size and self.refs[table[-1]] > 1
        need = self.blocks_for(length + n) - len(table) + bool(partial_shared)
        if need > self.available:
            raise PoolExhausted(
                f"request {request!r} needs {need} more block(s) of {size} slots for {n} token(s), but the pool has "
                f"{len(self.free_list)} free and {len(self.evictable)} cached unused of {self.num_blocks}. Free "
                f"finished requests first, admit fewer at once, or build the cache with more num_blocks.")
        while len(self.free_list) < need:
            self._evict()
        slots = super().reserve(request, n)  # (n,)
        assert not any(int(b) in self.key_of for b in slots // size)  # a request never writes into a cached block
        return slots


class PrefixScheduler(Scheduler):
    """:class:`~attention_course.serving.Scheduler` on a :class:`PrefixCachingKVCache`: a running request with
    nothing in the cache yet attaches the cached blocks of its tokens just before the step plans them (its ``fed``
    starts after them), and after each step the full blocks of the step's requests are registered (before the
    finished ones are freed).

    Under the reservation policy a request is promised the blocks of its whole length, shared blocks included, as
    without the cache: the promise stays an upper bound on the blocks it holds (a shared block counted in each of
    its holders), so no reserve ever fails; the cache saves prefill and blocks held, not admission."""

    def __init__(self, cache: PrefixCachingKVCache, *args, **kwargs):
        if not isinstance(cache, PrefixCachingKVCache):
            raise TypeError(f"cache must be a PrefixCachingKVCache, got {type(cache).__name__}.")
        super().__init__(cache, *args, **kwargs)

    def _admit(self) -> list:  # under "reserve"
        admitted = super()._admit()
        for r in self.running:
            if not self.cache.tables[r.rid]:  # nothing written yet (admitted now, or not scheduled so far)
                self._attach(r)
        return admitted

    def _attach(self, r) -> None:  # under "on_demand", right after cache.add
        r.fed = self.cache.match(r.rid, r.prompt + r.generated)

    def _detach(self, r) -> None:  # an admission that did not fit: its hits are not counted
        self.cache.hits -= len(self.cache.tables[r.rid])
        self.cache.tokens_saved -= r.fed
        super()._detach(r)

    def update(self, batch: StepBatch, logits: torch.Tensor) -> list:
        for r in self.running:
            if r.rid in batch.requests:  # its tokens up to fed are written, in every layer
                self.cache.register(r.rid, (r.prompt + r.generated)[:r.fed])
        return super().update(batch, logits)
