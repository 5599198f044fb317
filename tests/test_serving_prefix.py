"""attention_course.serving.prefix: block keys (a hash chain), the prefix-caching pool (match, register, free, LRU
eviction) and the scheduler on it: the same tokens as without the cache, fewer prefill tokens and blocks."""
import hashlib
import random
import struct

import pytest
import torch

from attention_course.serving import (PagedKVCache, PoolExhausted, PrefixCachingKVCache, PrefixScheduler, Request,
                                      Scheduler, TinyDecoder, block_hash, block_keys)

DT = torch.float64


# -------------------------------------------------------------------------------------------------------- block keys
def test_block_keys_are_a_chain_of_sha256_over_8_byte_token_ids():
    keys = block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)
    assert len(keys) == 2  # the partial last block [9] has no key
    first = hashlib.sha256(struct.pack("<4q", 1, 2, 3, 4)).digest()
    assert keys[0] == first == block_hash(None, [1, 2, 3, 4])
    assert keys[1] == hashlib.sha256(first + struct.pack("<4q", 5, 6, 7, 8)).digest() == block_hash(first, [5, 6, 7, 8])
    assert block_keys([1, 2, 3], 4) == [] and block_keys([1, 2, 3, 4], 4) == keys[:1]


def test_the_same_block_elsewhere_has_another_key():
    a, b = block_keys([5, 6, 7, 8, 5, 6, 7, 8], 4), block_keys([0, 0, 0, 0, 5, 6, 7, 8], 4)
    assert a[0] != a[1]  # the same tokens at another position
    assert a[1] != b[1]  # the same tokens at the same position after other tokens
    assert block_keys([-1, 2 ** 40], 2) != block_keys([2 ** 40, -1], 2)


def test_block_keys_are_the_same_in_every_process():
    # a digest written down once: each test run is another process (another hash() salt), and it must not change
    expected = "d6c3196cb2db3ef52af9bf96fe85966089108e7e3524783840e64898b3da413e"
    assert block_keys([1, 2, 3, 4, 5, 6, 7, 8, 9], 4)[1].hex() == expected


def test_block_keys_refuse_what_is_not_token_ids():
    with pytest.raises(TypeError, match="token ids"):
        block_keys("abcd", 2)
    with pytest.raises(TypeError, match="token ids"):
        block_hash(None, [1.0, 2])
    with pytest.raises(ValueError, match="32-byte"):
        block_hash(b"short", [1])
    with pytest.raises(ValueError, match="at least one token"):
        block_hash(None, [])
    with pytest.raises(ValueError, match="8 signed bytes"):
        block_hash(None, [2 ** 63])
    with pytest.raises(ValueError, match="block_size"):
        block_keys([1, 2], 0)


# ------------------------------------------------------------------------------------------------------------- cache
def _cache(num_blocks=6, block_size=2):
    return PrefixCachingKVCache(num_blocks=num_blocks, block_size=block_size, num_kv_heads=1, head_dim=2, dtype=DT)


def _fill(cache, request, tokens):
    """Write ``tokens`` for a request (keys and values = the token id) and register its full blocks."""
    n = len(tokens) - cache.lengths[request]
    x = torch.tensor(tokens[-n:], dtype=DT)[None, :, None].expand(1, n, 2)  # (1, n, 2)
    cache.write(0, cache.reserve(request, n), x, x)
    cache.register(request, tokens)


def test_match_attaches_the_longest_cached_run_and_leaves_the_last_token():
    cache = _cache()
    cache.add("a")
    _fill(cache, "a", [1, 2, 3, 4, 5])  # blocks [1 2] [3 4] registered, [5] partial
    assert len(cache.cached) == 2 and cache.blocks_in_use == 3
    cache.add("b")
    assert cache.match("b", [1, 2, 3, 4, 9]) == 4  # both full blocks, no bytes copied
    assert cache.tables["b"] == cache.tables["a"][:2] and cache.refs[cache.tables["a"][0]] == 2
    cache.add("c")
    assert cache.match("c", [1, 2, 3, 4]) == 2  # 4 tokens: the second block would leave nothing to compute
    cache.add("d")
    assert cache.match("d", [1, 2, 9, 4, 5]) == 2  # the chain stops at the first miss
    cache.add("e")
    assert cache.match("e", [3, 4, 1, 2, 5]) == 0  # the same blocks elsewhere are other blocks
    assert (cache.hits, cache.tokens_saved, cache.blocks_in_use) == (4, 8, 3)
    _fill(cache, "b", [1, 2, 3, 4, 9])  # the next token opens a new block: a shared block is never written
    assert cache.tables["b"][:2] == cache.tables["a"][:2] and cache.copies == 0
    assert torch.equal(cache.gather(0, "b")[0][0, :, 0], torch.tensor([1, 2, 3, 4, 9], dtype=DT))
    with pytest.raises(ValueError, match="already holds"):
        cache.match("b", [1, 2, 3, 4, 9])


def test_free_keeps_cached_blocks_and_eviction_takes_the_least_recently_released():
    cache = _cache(num_blocks=5, block_size=2)
    for r, tokens in (("a", [1, 2, 3, 4]), ("b", [5, 6, 7]), ("c", [8, 9])):
        cache.add(r)
        _fill(cache, r, tokens)
    a, b, c = (list(cache.tables[r]) for r in "abc")
    cache.free("b")  # [5 6] cached, [7] (partial, no key) free
    cache.free("a")  # released last to first: [3 4], then [1 2]
    cache.free("c")
    assert list(cache.evictable) == [b[0], a[1], a[0], c[0]] and cache.free_list == [b[1]]
    assert (cache.available, cache.blocks_in_use, len(cache.cached)) == (5, 0, 4)
    cache.add("d")
    assert cache.match("d", [1, 2, 3, 4, 0]) == 4  # attached again: no longer evictable
    assert list(cache.evictable) == [b[0], c[0]] and cache.available == 3
    cache.add("e")
    cache.reserve("e", 4)  # 2 blocks: the free one, then the least recently released
    assert cache.tables["e"] == [b[1], b[0]] and cache.evictions == 1 and len(cache.cached) == 3
    cache.add("f")
    assert cache.match("f", [5, 6, 7]) == 0  # its key went with it
    with pytest.raises(PoolExhausted, match="0 free and 1 cached unused"):
        cache.reserve("f", 4)  # needs 2, 1 available: the blocks d holds are never taken
    cache.reserve("f", 2)
    assert cache.tables["f"] == [c[0]] and cache.evictions == 2 and cache.available == 0
    for r in "def":
        cache.free(r)
    assert cache.available == 5 and cache.blocks_in_use == 0


def test_register_refuses_unwritten_or_other_tokens_and_keeps_the_first_of_two_equal_blocks():
    cache = _cache()
    for r in "ab":
        cache.add(r)
        _fill(cache, r, [1, 2, 3])  # computed at once, neither matched: the first keeps the key
    assert cache.cached[block_keys([1, 2], 2)[0]] == cache.tables["a"][0]
    assert cache.tables["b"][0] not in cache.key_of
    with pytest.raises(ValueError, match="only written blocks"):
        cache.register("a", [1, 2, 3, 4])
    cache.add("c")
    cache.match("c", [1, 2, 3])
    cache.chains["c"].clear()  # forget the chain: registering other tokens for the block now fails
    with pytest.raises(ValueError, match="cached for other tokens"):
        cache.register("c", [9, 9])
    cache.free("b")
    assert cache.tables["a"][0] in cache.key_of and len(cache.free_list) == 6 - 2
    with pytest.raises(TypeError, match="PrefixCachingKVCache"):
        PrefixScheduler(PagedKVCache(4, 2, 1, 2))


def test_fork_still_shares_and_copies_on_write():
    cache = _cache(num_blocks=8, block_size=2)
    cache.add("a")
    _fill(cache, "a", [1, 2, 3])
    cache.fork("a", "b")
    _fill(cache, "b", [1, 2, 3, 4])  # writes into the shared partial block [3]: copied first
    assert cache.copies == 1 and cache.tables["b"][0] == cache.tables["a"][0]
    assert len(cache.cached) == 2 and cache.chains["b"] == block_keys([1, 2, 3, 4], 2)


# --------------------------------------------------------------------------------------------------------- scheduler
SYSTEM = [3, 1, 4, 1, 5, 9, 2, 6, 5, 3, 5, 8, 9, 7, 9, 3, 2, 3, 8, 4]  # 20 tokens: 5 blocks of 4


def _shared_prompt_requests(n=24, seed=0):
    rng = random.Random(seed)
    return [Request(i, SYSTEM + [rng.randrange(32) for _ in range(rng.randint(1, 8))], rng.randint(1, 6),
                    arrival=i // 3) for i in range(n)]


def _serve(requests, cached: bool, model, num_blocks=48, **kwargs):
    kind = PrefixCachingKVCache if cached else PagedKVCache
    cache = kind(num_blocks=num_blocks, block_size=4, num_kv_heads=1, head_dim=8, num_layers=2, dtype=DT)
    scheduler = (PrefixScheduler if cached else Scheduler)(cache, max_batch_tokens=32, chunk=16, **kwargs)
    for r in requests:
        scheduler.submit(Request(r.rid, r.prompt, r.max_new_tokens, r.arrival))
    peak = []
    with torch.no_grad():
        served = scheduler.run(model.step, lambda s, batch: peak.append(s.cache.blocks_in_use))
    rows = sum(rows for _, _, rows, _ in scheduler.log)
    return served, rows, max(peak), cache


def test_a_shared_system_prompt_is_computed_once_and_the_tokens_do_not_change():
    torch.manual_seed(0)
    model = TinyDecoder(vocab=32, dim=16, heads=2, kv_heads=1, layers=2).eval()
    requests = _shared_prompt_requests()
    plain, rows, peak, _ = _serve(requests, False, model)
    served, rows_cached, peak_cached, cache = _serve(requests, True, model)
    for r in requests:
        assert served[r.rid] == plain[r.rid] == model.generate_alone(r.prompt, r.max_new_tokens)
    assert rows == sum(r.total for r in requests)
    assert rows_cached == rows - cache.tokens_saved and cache.tokens_saved == 4 * cache.hits
    assert cache.hits >= 5 * (len(requests) - 3)  # as many blocks as 21 requests finding the whole system prompt
    assert peak_cached < peak and cache.evictions == 0
    assert cache.blocks_in_use == 0 and cache.available == cache.num_blocks


def test_a_small_pool_evicts_and_the_tokens_still_do_not_change():
    torch.manual_seed(1)
    model = TinyDecoder(vocab=32, dim=16, heads=2, kv_heads=1, layers=2).eval()
    rng = random.Random(1)
    requests = [Request(i, ([7] * 8 if i % 2 else [9] * 8) + [rng.randrange(32) for _ in range(rng.randint(1, 9))],
                        rng.randint(1, 5), arrival=i) for i in range(12)]
    plain, _, _, _ = _serve(requests, False, model, num_blocks=12, max_running=2)
    served, _, _, cache = _serve(requests, True, model, num_blocks=12, max_running=2)
    assert served == plain
    assert cache.evictions > 0 and cache.hits > 0
    assert cache.blocks_in_use == 0 and cache.available == cache.num_blocks


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_on_demand_with_preemption_and_the_cache_gives_the_tokens_of_each_alone(dtype):
    """Blocks on demand in a pool too small for all: requests are preempted, recompute, and find the blocks they
    (or others) left cached; admissions that did not fit leave no hit counted."""
    torch.manual_seed(2)
    model = TinyDecoder(vocab=32, dim=16, heads=2, kv_heads=1, layers=2, dtype=dtype).eval()
    requests = _shared_prompt_requests(12, seed=3)
    kind = {"num_blocks": 14, "block_size": 4, "num_kv_heads": 1, "head_dim": 8, "num_layers": 2, "dtype": dtype}
    runs = {}
    for cached in (False, True):
        cache = (PrefixCachingKVCache if cached else PagedKVCache)(**kind)
        scheduler = (PrefixScheduler if cached else Scheduler)(cache, max_batch_tokens=16, chunk=8,
                                                               policy="on_demand")
        for r in requests:
            scheduler.submit(Request(r.rid, r.prompt, r.max_new_tokens, r.arrival))
        with torch.no_grad():
            runs[cached] = scheduler.run(model.step), scheduler, cache
    (plain, s_plain, _), (served, s_cached, cache) = runs[False], runs[True]
    assert served == plain == {r.rid: model.generate_alone(r.prompt, r.max_new_tokens) for r in requests}
    assert s_plain.preemptions > 0 and s_cached.preemptions > 0
    rows = {s: sum(rows for _, _, rows, _ in s.log) for s in (s_plain, s_cached)}
    assert rows[s_plain] == sum(r.total for r in requests) + s_plain.recomputed  # every token once, and again
    assert rows[s_cached] < rows[s_plain]
    assert cache.hits > 0 and cache.tokens_saved == 4 * cache.hits
    assert cache.blocks_in_use == 0 and cache.available == cache.num_blocks


def test_the_oldest_request_is_not_preempted_when_later_ones_share_blocks():
    """Two later requests share a cached prefix: each alone frees 1 block, both together 4 (their shared 2 come free
    when both have left). The pool is looked at again after each victim, so the oldest is never preempted."""
    def forward(batch, cache):
        return torch.zeros(len(batch.tokens), 16)  # greedy: token 0 every time

    shared = [1, 2, 3, 4, 5, 6, 7, 8]
    oldest = Request("A", list(range(20, 56)), 1)  # 36 prompt tokens: 9 blocks of 4, in chunks of 12
    requests = [oldest, Request("B", shared + [9], 6), Request("C", shared + [10], 6, arrival=1)]
    scheduler = PrefixScheduler(PrefixCachingKVCache(10, 4, 1, 2), max_batch_tokens=30, chunk=12, policy="on_demand")
    for r in requests:
        scheduler.submit(r)
    out = scheduler.run(forward, max_steps=500)
    assert scheduler.preemptions > 0 and oldest.preemptions == 0
    assert {rid: len(tokens) for rid, tokens in out.items()} == {"A": 1, "B": 6, "C": 6}
