"""attention_course.serving: packing, the paged cache, continuous batching and attention sinks, each against the
computation it rearranges, with property tests where a law holds for all inputs, and its errors."""
import random

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course.decoding import CausalSelfAttention
from attention_course.serving import (
    PagedKVCache, PoolExhausted, Request, Scheduler, StreamingKVCache, TinyDecoder, block_diagonal_mask, cu_seqlens,
    gather_blocks, generate_static, merge_partials, pack, packed_attention, packed_positions, padding_waste,
    partial_attention, sink_attention, streaming_mask, unpack)

DT = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


# ---------------------------------------------------------------------------------------------------------- packing
@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 6), min_size=1, max_size=4), st.integers(0, 1000))
def test_packed_attention_equals_each_sequence_alone(lengths, seed):
    seqs = [randn(3, 2, L, 4, seed=seed + i) for i, L in enumerate(lengths)]
    q, k, v = (torch.cat([s[j] for s in seqs], dim=1) for j in range(3))
    cu = cu_seqlens(lengths)
    out = packed_attention(q, k, v, cu)
    for i, s in enumerate(seqs):
        alone = F.scaled_dot_product_attention(*s, is_causal=True)
        torch.testing.assert_close(out[:, cu[i]:cu[i + 1]], alone, atol=1e-12, rtol=0)


def test_packing_helpers():
    cu = cu_seqlens([2, 3])
    assert cu.tolist() == [0, 2, 5]
    assert packed_positions(cu).tolist() == [0, 1, 0, 1, 2]
    mask = block_diagonal_mask(cu)
    assert mask[2, 1] and not mask[4, 2] and mask[3, 4]
    x, cu2 = pack([torch.ones(2, 3), torch.zeros(3, 3)])
    assert torch.equal(cu2, cu) and [t.shape[0] for t in unpack(x, cu2)] == [2, 3]
    waste = padding_waste([1, 3])
    assert (waste["rows_padded"], waste["rows_packed"], waste["scores_packed"]) == (6, 4, 7)


def test_padding_waste_compares_causal_with_causal_and_full_with_full():
    causal, full = padding_waste([1, 3]), padding_waste([1, 3], causal=False)
    assert (causal["scores_padded"], causal["scores_packed"]) == (2 * 6, 1 + 6)  # two triangles of 3 against 1 + 6
    assert (full["scores_padded"], full["scores_packed"]) == (2 * 9, 1 + 9)  # two squares of 3 against 1 + 9
    assert causal["score_waste"] == 1 - 7 / 12 and full["score_waste"] == 1 - 10 / 18
    assert padding_waste([4, 4])["score_waste"] == 0  # equal lengths: nothing to waste, causal or not


@pytest.mark.parametrize("bad", [[], [0, 2], [1.5], "ab"])
def test_bad_lengths_are_refused(bad):
    with pytest.raises(ValueError, match="lengths"):
        cu_seqlens(bad)


def test_bad_cu_seqlens_is_refused():
    with pytest.raises(ValueError, match="increase strictly"):
        block_diagonal_mask(torch.tensor([0, 3, 3]))
    with pytest.raises(ValueError, match="cu_seqlens ends at"):
        unpack(torch.zeros(4, 2), cu_seqlens([2, 3]))


# ------------------------------------------------------------------------------------------------------------ paged
@settings(max_examples=25, deadline=None)
@given(st.lists(st.integers(1, 9), min_size=1, max_size=4), st.integers(1, 4), st.integers(0, 1000))
def test_gather_returns_what_was_written_whatever_the_order_of_requests(lengths, block_size, seed):
    cache = PagedKVCache(num_blocks=40, block_size=block_size, num_kv_heads=2, head_dim=3, dtype=DT)
    rng, written = random.Random(seed), {i: [] for i in range(len(lengths))}
    for i in written:
        cache.add(i)
    todo = [i for i, L in enumerate(lengths) for _ in range(L)]
    rng.shuffle(todo)  # requests grow interleaved, one token at a time
    for n, i in enumerate(todo):
        k = randn(2, 1, 3, seed=seed + n)
        cache.write(0, cache.reserve(i, 1), k, -k)
        written[i].append(k)
    for i, ks in written.items():
        k, v = cache.gather(0, i)
        assert torch.equal(k, torch.cat(ks, dim=1)) and torch.equal(v, -k)
        assert len(cache.tables[i]) == -(-lengths[i] // block_size)


def test_fork_shares_blocks_and_copies_on_write():
    cache = PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=2, dtype=DT)
    cache.add("a")
    prompt = randn(1, 6, 2)
    cache.write(0, cache.reserve("a", 6), prompt, prompt)
    cache.fork("a", "b")
    assert cache.blocks_in_use == 2 and cache.refs[cache.tables["a"][0]] == 2
    new_a, new_b = randn(1, 1, 2, seed=1), randn(1, 1, 2, seed=2)
    cache.write(0, cache.reserve("b", 1), new_b, new_b)
    cache.write(0, cache.reserve("a", 1), new_a, new_a)
    assert cache.copies == 1 and cache.blocks_in_use == 3
    assert torch.equal(cache.gather(0, "a")[0], torch.cat([prompt, new_a], 1))
    assert torch.equal(cache.gather(0, "b")[0], torch.cat([prompt, new_b], 1))
    cache.free("a")
    cache.free("b")
    assert cache.blocks_in_use == 0 and sorted(cache.free_list) == list(range(8))


def test_paged_errors_say_what_is_wrong():
    cache = PagedKVCache(num_blocks=2, block_size=4, num_kv_heads=1, head_dim=2)
    cache.add("a")
    with pytest.raises(PoolExhausted, match="needs 3 more block"):
        cache.reserve("a", 9)
    with pytest.raises(KeyError, match="not in the cache"):
        cache.gather(0, "nobody")
    slots = cache.reserve("a", 2)
    with pytest.raises(ValueError, match=r"\(h_kv, n, d\)"):
        cache.write(0, slots, torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))
    with pytest.raises(TypeError, match="pool holds"):
        cache.write(0, slots, torch.zeros(1, 2, 2, dtype=DT), torch.zeros(1, 2, 2, dtype=DT))
    table = list(cache.tables["a"])
    cache.free("a")
    with pytest.raises(RuntimeError, match="freed block"):
        gather_blocks(cache.k[0], table, 2, torch.tensor(cache.refs) > 0)
    with pytest.raises(IndexError, match="outside the pool"):
        gather_blocks(cache.k[0], [5], 2)
    with pytest.raises(ValueError, match="ceil"):
        gather_blocks(cache.k[0], [0], 5)


# -------------------------------------------------------------------------------------------------------- scheduler
def _requests(n, seed):
    rng = random.Random(seed)
    return [Request(i, [rng.randrange(32) for _ in range(rng.randint(1, 7))], rng.randint(1, 6),
                    arrival=rng.randint(0, 4)) for i in range(n)]


@settings(max_examples=6, deadline=None)
@given(st.integers(0, 10_000), st.integers(2, 9), st.integers(1, 5))
def test_continuous_batching_gives_each_request_its_own_tokens(seed, budget, chunk):
    torch.manual_seed(seed)
    model = TinyDecoder(vocab=32, dim=16, heads=2, kv_heads=1, layers=2).eval()
    cache = PagedKVCache(num_blocks=12, block_size=3, num_kv_heads=1, head_dim=8, num_layers=2, dtype=DT)
    scheduler = Scheduler(cache, max_batch_tokens=budget, chunk=chunk)
    requests = _requests(5, seed)
    for r in requests:
        scheduler.submit(Request(r.rid, r.prompt, r.max_new_tokens, r.arrival))
    with torch.no_grad():
        served = scheduler.run(model.step)
        static, _ = generate_static(model, [r.prompt for r in requests], [r.max_new_tokens for r in requests], 2)
    for r, s in zip(requests, static):
        assert served[r.rid] == model.generate_alone(r.prompt, r.max_new_tokens) == s
    assert cache.blocks_in_use == 0 and scheduler.promised == 0


def test_max_running_caps_the_requests_running_at_once_and_wastes_no_row():
    torch.manual_seed(0)
    model = TinyDecoder(vocab=32, dim=16, heads=2, kv_heads=1, layers=2).eval()
    cache = PagedKVCache(num_blocks=40, block_size=3, num_kv_heads=1, head_dim=8, num_layers=2, dtype=DT)
    scheduler = Scheduler(cache, max_batch_tokens=8, chunk=4, max_running=2)
    requests = [Request(i, [1 + i] * (2 + i), 3 + i % 2) for i in range(5)]  # all waiting at step 0
    for r in requests:
        scheduler.submit(Request(r.rid, r.prompt, r.max_new_tokens))
    running, rows = [], []
    with torch.no_grad():
        served = scheduler.run(model.step, lambda s, batch: (running.append(len(s.running) + len(s.log[-1][1])),
                                                             rows.append(len(batch.tokens))))
    assert max(running) == 2 and running[0] == 2  # the cap, reached
    assert sum(rows) == sum(r.total for r in requests)  # each prompt token and each needed generated token, once
    for r in requests:
        assert served[r.rid] == model.generate_alone(r.prompt, r.max_new_tokens)
    with pytest.raises(ValueError, match="max_running"):
        Scheduler(cache, max_running=0)


def test_scheduler_refuses_what_cannot_run():
    cache = PagedKVCache(num_blocks=2, block_size=2, num_kv_heads=1, head_dim=2)
    scheduler = Scheduler(cache)
    with pytest.raises(ValueError, match="whole pool has 2"):
        scheduler.submit(Request("big", [1, 2, 3, 4], 2))
    scheduler.submit(Request("a", [1], 1))
    with pytest.raises(ValueError, match="already taken"):
        scheduler.submit(Request("a", [1], 1))
    with pytest.raises(ValueError, match="prompt must be"):
        Request("x", [], 1)
    with pytest.raises(TypeError, match="PagedKVCache"):
        Scheduler(object())
    batch = scheduler.schedule()
    with pytest.raises(ValueError, match=r"logits \(N, V\)"):
        scheduler.update(batch, torch.zeros(3, 4))


# ------------------------------------------------------------------------------------------------------------ sinks
@settings(max_examples=25, deadline=None)
@given(st.integers(1, 5), st.integers(0, 1000))
def test_a_sink_is_a_key_with_value_zero(S, seed):
    q, k, v = randn(1, 2, 3, 4, seed=seed), randn(1, 2, S, 4, seed=seed + 1), randn(1, 2, S, 4, seed=seed + 2)
    sinks = randn(2, seed=seed + 3)
    scores = torch.cat([q @ k.transpose(-2, -1) / 2.0, sinks[None, :, None, None].expand(1, 2, 3, 1)], -1)
    v0 = torch.cat([v, torch.zeros(1, 2, 1, 4, dtype=DT)], 2)
    torch.testing.assert_close(sink_attention(q, k, v, sinks), scores.softmax(-1) @ v0, atol=1e-12, rtol=0)
    merged, _ = merge_partials([partial_attention(q, k, v), (torch.zeros_like(q), sinks[:, None, None].expand(1, 2, 3, 1))])
    torch.testing.assert_close(merged, sink_attention(q, k, v, sinks), atol=1e-12, rtol=0)


def test_empty_rows_merge_to_zero_not_nan():
    q, k, v = randn(1, 1, 2, 4), randn(1, 1, 3, 4, seed=1), randn(1, 1, 3, 4, seed=2)
    hidden = torch.ones(2, 3, dtype=torch.bool)
    out, lse = merge_partials([partial_attention(q, k, v, hidden), partial_attention(q, k, v, hidden)])
    assert not out.isnan().any() and (out == 0).all() and torch.isneginf(lse).all()
    assert (sink_attention(q, k, v, torch.zeros(1, dtype=DT), hidden) == 0).all()


def test_streaming_cache_is_streaming_mask_and_bounded():
    layer = CausalSelfAttention(8, 2, dtype=DT).eval()
    x, pos = randn(1, 20, 8), torch.arange(20)
    cache, outs = StreamingKVCache(2, 4), []
    with torch.no_grad():
        for t in range(20):
            outs.append(layer(x[:, t:t + 1], cache=cache))
            assert len(cache) <= 2 + 4 - 1
    mask = streaming_mask(pos, pos, 2, 4)
    assert mask.sum(1).tolist()[-1] == 20 - 6  # the last query reads 2 sinks and 4 recent keys
    with pytest.raises(ValueError, match="n_sink"):
        StreamingKVCache(-1, 4)


def test_sink_attention_refuses_bad_shapes():
    q = randn(1, 2, 3, 4)
    with pytest.raises(ValueError, match=r"one logit per head"):
        sink_attention(q, q, q, torch.zeros(3, dtype=DT))
    with pytest.raises(ValueError, match="repeat_kv"):
        sink_attention(q, randn(1, 1, 3, 4), randn(1, 1, 3, 4), torch.zeros(2, dtype=DT))
