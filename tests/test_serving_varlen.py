"""attention_course.serving's varlen path: each query scores its own request's keys only. It gives the packed path's
output (one (N, S) mask over every key of the step) on steps of prefill chunks and decode rows mixed, with GQA and a
window; a whole scheduler run with it gives each request its own tokens; and the scores counted: needed the same on
both paths, N * S per layer computed by the packed one, needed plus padding and masked chunk pairs by the varlen one."""
import functools
import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course.decoding import CausalSelfAttention
from attention_course.serving import PagedKVCache, Request, Scheduler, StepBatch, TinyDecoder, cu_seqlens
from attention_course.serving.attention import paged_self_attention, step_keys, step_scores, varlen_attention

DT = torch.float64


def _step(cache, history, new, seed):
    """Requests 0 .. n-1 hold ``history[i]`` tokens in ``cache`` (random keys and values, every layer); the step
    feeds ``new[i]`` more each. Returns the StepBatch and the packed rows' positions."""
    g = torch.Generator().manual_seed(seed)
    _, _, h_kv, _, d = cache.k.shape
    for i, past in enumerate(history):
        cache.add(i)
        if past:
            slots = cache.reserve(i, past)
            for layer in range(cache.k.shape[0]):
                cache.write(layer, slots, *torch.randn(2, h_kv, past, d, generator=g, dtype=cache.k.dtype))
    slots = torch.cat([cache.reserve(i, n) for i, n in enumerate(new)])
    positions = torch.cat([torch.arange(p, p + n) for p, n in zip(history, new)])
    return lambda: StepBatch(list(range(len(new))), torch.zeros(len(positions), dtype=torch.long), positions, slots,
                             cu_seqlens(new), {})


def _visible(history, new, window):
    return sum(min(p + 1, window or p + 1) for past, n in zip(history, new) for p in range(past, past + n))


@settings(max_examples=30, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 9), st.sampled_from([1, 1, 2, 3, 5])), min_size=1, max_size=5),
       st.sampled_from([(4, 4), (4, 2), (6, 2), (6, 1)]), st.sampled_from([None, 1, 3, 6]), st.integers(0, 1000))
def test_varlen_equals_the_packed_path_on_mixed_steps(requests, heads, window, seed):
    history, new = [p for p, _ in requests], [n for _, n in requests]
    h, h_kv = heads
    torch.manual_seed(seed)
    layer = CausalSelfAttention(4 * h, h, h_kv, window=window, dtype=DT).eval()
    cache = PagedKVCache(40, 3, h_kv, 4, num_layers=1, dtype=DT)
    make = _step(cache, history, new, seed)
    x = torch.randn(sum(new), 4 * h, generator=torch.Generator().manual_seed(seed + 1), dtype=DT)
    packed_batch, varlen_batch = make(), make()
    with torch.no_grad():
        packed = paged_self_attention(layer, x, packed_batch, cache, 0)
        varlen = paged_self_attention(layer, x, varlen_batch, cache, 0, varlen=True)
    torch.testing.assert_close(varlen, packed, atol=1e-12, rtol=0)
    N, S = sum(new), sum(p + n for p, n in zip(history, new))
    needed = _visible(history, new, window)
    assert packed_batch.scores == [N * S, needed] and step_scores(packed_batch, window) == (N * S, needed)
    assert varlen_batch.scores[1] == needed <= varlen_batch.scores[0] <= N * S
    if window is None:  # exactly: the decode rows padded to the longest, a chunk's n (n - 1) / 2 later keys
        decode = [p + 1 for p, n in zip(history, new) if n == 1]
        padding = len(decode) * max(decode) - sum(decode) if decode else 0
        assert varlen_batch.scores[0] == needed + padding + sum(n * (n - 1) // 2 for n in new)


def test_varlen_computes_only_what_is_needed_without_padding_or_chunks():
    cache = PagedKVCache(20, 4, 2, 4, num_layers=1, dtype=DT)
    make = _step(cache, [5, 5, 5], [1, 1, 1], 0)  # three decode rows over 6 keys each
    layer = CausalSelfAttention(16, 4, 2, dtype=DT).eval()
    batch = make()
    with torch.no_grad():
        paged_self_attention(layer, torch.randn(3, 16, dtype=DT), batch, cache, 0, varlen=True)
    assert batch.scores == [18, 18]


def test_varlen_in_float32_matches_to_rounding():
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 4, 2, window=4, dtype=torch.float32).eval()
    cache = PagedKVCache(30, 4, 2, 4, num_layers=1)
    make = _step(cache, [0, 7, 3, 11], [5, 1, 4, 1], 3)
    x = torch.randn(11, 16)
    with torch.no_grad():
        packed = paged_self_attention(layer, x, make(), cache, 0)
        varlen = paged_self_attention(layer, x, make(), cache, 0, varlen=True)
    torch.testing.assert_close(varlen, packed, atol=1e-6, rtol=1e-5)


def _workload(n, seed):
    rng = random.Random(seed)
    return [Request(i, [rng.randrange(32) for _ in range(rng.randint(1, 9))], rng.randint(1, 7),
                    arrival=rng.randint(0, 4)) for i in range(n)]


@pytest.mark.parametrize("dtype, window", [(torch.float64, None), (torch.float32, None), (torch.float64, 3)])
def test_a_scheduler_run_with_varlen_gives_each_request_its_own_tokens(dtype, window):
    torch.manual_seed(1)
    model = TinyDecoder(vocab=32, dim=24, heads=6, kv_heads=2, window=window, dtype=dtype).eval()
    requests, counts = _workload(7, 2), {}
    for varlen in (False, True):
        cache = PagedKVCache(30, 3, 2, 4, num_layers=2, dtype=dtype)
        scheduler = Scheduler(cache, max_batch_tokens=7, chunk=3)
        for r in requests:
            scheduler.submit(Request(r.rid, r.prompt, r.max_new_tokens, r.arrival))
        seen = counts[varlen] = [0, 0, 0]  # computed, needed, N * S summed over steps and layers

        def count(scheduler, batch):
            seen[0] += batch.scores[0]
            seen[1] += batch.scores[1]
            seen[2] += 2 * step_scores(batch, window)[0]

        with torch.no_grad():
            served = scheduler.run(functools.partial(model.step, varlen=varlen), count)
            for r in requests:
                assert served[r.rid] == model.generate_alone(r.prompt, r.max_new_tokens)
    assert counts[False][0] == counts[False][2]  # packed: every query against every key of its step
    assert counts[True][1] == counts[False][1] < counts[True][0] < counts[False][0]


def test_varlen_refuses_bad_input():
    layer = CausalSelfAttention(16, 4, 2, dtype=DT).eval()
    cache = PagedKVCache(20, 4, 2, 4, num_layers=1, dtype=DT)
    make = _step(cache, [2, 0], [1, 3], 0)
    with pytest.raises(TypeError, match="varlen must be True or False"):
        paged_self_attention(layer, torch.randn(4, 16, dtype=DT), make(), cache, 0, varlen="yes")
    with pytest.raises(ValueError, match=r"x must be the step's packed rows \(N, E\) = \(4, 16\)"):
        paged_self_attention(layer, torch.randn(3, 16, dtype=DT), make(), cache, 0, varlen=True)
    batch = make()
    k, v, _, _ = step_keys(batch, cache, 0)
    with pytest.raises(ValueError, match="hold 6 keys by their positions, but k_all has 5"):
        varlen_attention(torch.randn(4, 4, 4, dtype=DT), k[:, :5], v[:, :5], batch)


def test_step_keys_reads_the_slots_slots_of_gives_and_refuses_a_freed_block():
    cache = PagedKVCache(10, 3, 1, 2, dtype=DT)
    for request, n in (("a", 7), ("b", 2), ("c", 3)):
        cache.add(request)
        cache.reserve(request, n)
    cache.fork("a", "d")  # shares a's blocks

    def batch():
        return StepBatch(["a", "b", "c", "d"], torch.zeros(4), torch.zeros(4), torch.zeros(4), cu_seqlens([1] * 4), {})

    step = batch()
    step_keys(step, cache, 0)
    slots, positions, owners = step.key_index
    assert torch.equal(slots, torch.cat([cache.slots_of(r) for r in step.requests]))
    assert positions.tolist() == [*range(7), 0, 1, 0, 1, 2, *range(7)]
    assert owners.tolist() == [0] * 7 + [1] * 2 + [2] * 3 + [3] * 7
    cache.tables["b"] = [9]  # a block no request holds
    with pytest.raises(RuntimeError, match=r"points at freed block\(s\) \[9\]"):
        step_keys(batch(), cache, 0)
    cache.tables["b"] = [99]
    with pytest.raises(IndexError, match=r"names blocks \[99\] outside the pool"):
        step_keys(batch(), cache, 0)
