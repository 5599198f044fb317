"""On-demand blocks with preemption by recompute (attention_course.serving.scheduler, policy="on_demand"): a preempted
request generates the tokens it would have generated unpreempted, in float64 and float32; the victim rule
(choose_victims); every request finishes and every block returns whatever the workload; more requests run at once
than under reservation on the same pool, and no block sits idle."""
import random
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course.serving import PagedKVCache, Request, Scheduler, TinyDecoder
from attention_course.serving.scheduler import choose_victims


def _model(dtype):
    torch.manual_seed(0)
    return TinyDecoder(vocab=32, dim=16, heads=2, kv_heads=1, layers=2, dtype=dtype).eval()


def _requests(seed, n=8, longest_prompt=9, most_new=10, last_arrival=4):
    rng = random.Random(seed)
    return [Request(i, [rng.randrange(32) for _ in range(rng.randint(1, longest_prompt))],
                    rng.randint(1, most_new), arrival=rng.randint(0, last_arrival)) for i in range(n)]


def _serve(model, requests, num_blocks, policy, block_size=3, **kw):
    cache = PagedKVCache(num_blocks, block_size, 1, 8, num_layers=2, dtype=model.head.weight.dtype)
    scheduler = Scheduler(cache, policy=policy, **kw)
    for r in requests:
        scheduler.submit(Request(r.rid, r.prompt, r.max_new_tokens, r.arrival))
    with torch.no_grad():
        served = scheduler.run(model.step)
    return served, scheduler


def _all_blocks_back(scheduler):
    cache = scheduler.cache
    return (cache.available == cache.num_blocks and cache.blocks_in_use == 0 and not cache.tables
            and sorted(cache.free_list) == list(range(cache.num_blocks)) and scheduler.promised == 0)


# ------------------------------------------------------------------------------------------------------ the theorem
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_a_preempted_request_generates_the_tokens_it_would_have_unpreempted(dtype):
    model = _model(dtype)
    requests = _requests(seed=1)
    served, scheduler = _serve(model, requests, num_blocks=6, policy="on_demand", max_batch_tokens=8, chunk=4)
    inside = {r.rid: r for r in scheduler.waiting + scheduler.running}  # empty: every request finished
    assert not inside and set(served) == {r.rid for r in requests}
    times = [sum(rid in s["preempted"] for s in scheduler.stats) for rid in served]
    assert scheduler.preemptions == sum(times) >= 3 and max(times) >= 2  # several, one request more than once
    assert scheduler.recomputed == sum(s["recomputed"] for s in scheduler.stats) > 0
    for r in requests:
        assert served[r.rid] == model.generate_alone(r.prompt, r.max_new_tokens)
    unpreempted, reserve = _serve(model, requests, num_blocks=6, policy="reserve", max_batch_tokens=8, chunk=4)
    assert served == unpreempted and reserve.preemptions == 0
    assert _all_blocks_back(scheduler)


def test_preemption_drops_generated_tokens_too_and_recomputes_each_once():
    """A victim that was decoding loses the keys of its generated tokens as well; readmitted, it feeds prompt and
    generated tokens again: the tokens recomputed in all are those the cache held at each preemption. Victims go
    the latest admitted first, and back to the front of the queue in the order they were admitted."""
    model = _model(torch.float64)
    requests = _requests(seed=1)
    cache = PagedKVCache(6, 3, 1, 8, num_layers=2, dtype=torch.float64)
    scheduler = Scheduler(cache, max_batch_tokens=8, chunk=4, policy="on_demand")
    for r in requests:
        scheduler.submit(r)
    dropped = {}  # rid -> tokens in the cache at each of its preemptions
    with torch.no_grad():
        while scheduler.waiting or scheduler.running:
            before = {r.rid: r.fed for r in scheduler.running}  # admission order
            scheduler.step(model.step)
            preempted = scheduler.stats[-1]["preempted"]
            for rid in preempted:
                dropped.setdefault(rid, []).append(before[rid])
            front = [r.rid for r in scheduler.waiting[:len(preempted)]]
            assert front == [rid for rid in before if rid in preempted]  # at the front, in admission order
            assert preempted == sorted(preempted, key=list(before).index, reverse=True)  # the latest first
    assert any(max(dropped[r.rid]) > len(r.prompt) for r in requests if r.rid in dropped)  # a decoding victim
    assert any(len(d) >= 2 for d in dropped.values())
    assert scheduler.recomputed == sum(map(sum, dropped.values()))  # every dropped token fed again, once a drop
    assert {r.rid: r.dropped for r in requests if r.preemptions} == {rid: max(d) for rid, d in dropped.items()}


def test_the_latest_request_preempts_itself_and_the_earlier_is_untouched():
    """a (7 prompt tokens, 2 blocks of 4) and b (4, 1 block) fill the pool of 3 at step 0; at step 1 b's next token
    needs a block: b, the latest admitted, preempts itself and waits; a runs on; b recomputes after a is done."""
    model = _model(torch.float64)
    a, b = Request("a", [3, 1, 4, 1, 5, 9, 2], 5), Request("b", [6, 5, 3, 5], 3)
    cache = PagedKVCache(3, 4, 1, 8, num_layers=2, dtype=torch.float64)
    scheduler = Scheduler(cache, max_batch_tokens=16, chunk=8, policy="on_demand")
    scheduler.submit(a)
    scheduler.submit(b)
    with torch.no_grad():
        served = scheduler.run(model.step)
    assert scheduler.log[0][0] == ["a", "b"] and scheduler.stats[0]["blocks_in_use"] == 3
    assert scheduler.stats[1]["preempted"] == ["b"] and scheduler.log[1][2] == 1  # only a's token in step 1
    assert (a.preemptions, b.preemptions, b.dropped) == (0, 1, 4)
    assert scheduler.recomputed == 4 and served == {r.rid: model.generate_alone(r.prompt, r.max_new_tokens)
                                                    for r in (a, b)}
    assert _all_blocks_back(scheduler)


# ---------------------------------------------------------------------------------------------- the victim rule
def test_choose_victims_takes_the_latest_first_until_enough():
    running = [("a", 3), ("b", 2), ("c", 1), ("d", 2)]  # admission order, oldest first
    assert choose_victims(running, "a", available=5, need=2) == []  # enough: no one
    assert choose_victims(running, "a", available=0, need=2) == ["d"]  # d frees 2: an exact fit stops there
    assert choose_victims(running, "a", available=0, need=3) == ["d", "c"]
    assert choose_victims(running, "b", available=1, need=4) == ["d", "c"]  # 1 + 2 + 1
    assert choose_victims(running, "a", available=0, need=5) == ["d", "c", "b"]
    assert choose_victims(running, "a", available=0, need=0) == []
    assert choose_victims((r for r in running), "a", 0, 1) == ["d"]  # any iterable of pairs


def test_choose_victims_the_latest_left_preempts_itself():
    running = [("a", 3), ("b", 2), ("c", 1)]
    assert choose_victims(running, "c", available=0, need=1) == ["c"]  # latest: itself, a and b untouched
    assert choose_victims(running, "b", available=0, need=2) == ["c", "b"]  # c is not enough, then b itself
    assert choose_victims(running, "b", available=0, need=1) == ["c"]
    assert choose_victims([("a", 0)], "a", available=0, need=1) == ["a"]  # alone and short: itself
    assert choose_victims(running, "a", available=0, need=99) == ["c", "b", "a"]


@pytest.mark.parametrize("args, match", [
    (([("a", 1)], "z", 0, 1), "'z' is not among the running ones"),
    (([("a", 1)], "a", -1, 1), "available = -1"),
    (([("a", 1)], "a", 0, -2), "need = -2"),
    (([("a", -1)], "a", 0, 1), "blocks of 'a' = -1"),
    (([("a", 1)], "a", 0, 1.5), "need = 1.5"),
    (([("a", 1)], "a", True, 1), "available = True"),
])
def test_choose_victims_errors_say_what_is_wrong(args, match):
    with pytest.raises(ValueError, match=match):
        choose_victims(*args)


# --------------------------------------------------------------------------------- every workload, both policies
@settings(max_examples=8, deadline=None)
@given(st.integers(0, 10_000), st.integers(4, 10), st.integers(1, 9), st.integers(1, 5),
       st.sampled_from([None, 1, 2, 3]))
def test_every_request_finishes_and_every_block_returns(seed, num_blocks, budget, chunk, max_running):
    model = _model(torch.float64)
    requests = [r for r in _requests(seed, n=6, longest_prompt=7, most_new=6)
                if -(-r.total // 3) <= num_blocks]  # submit refuses the others
    served, scheduler = _serve(model, requests, num_blocks, "on_demand", max_batch_tokens=budget, chunk=chunk,
                               max_running=max_running)
    for r in requests:
        assert served[r.rid] == model.generate_alone(r.prompt, r.max_new_tokens)
    assert _all_blocks_back(scheduler)
    for stats, (admitted, _, rows, _) in zip(scheduler.stats, scheduler.log):
        assert stats["blocks_idle"] == 0 and stats["blocks_in_use"] + stats["blocks_free"] == num_blocks
        assert rows == stats["rows"] <= budget and stats["running"] <= (max_running or len(requests))
        assert not (stats["preempted"] and admitted)  # no admission in a step that preempted
    assert scheduler.recomputed == sum(s["recomputed"] for s in scheduler.stats)


def test_on_demand_runs_more_at_once_than_reservation_on_the_same_pool():
    model = _model(torch.float64)
    requests = _requests(seed=7, n=10)
    runs = {policy: _serve(model, requests, num_blocks=10, policy=policy, max_batch_tokens=8, chunk=4)
            for policy in ("reserve", "on_demand")}
    (served_r, reserve), (served_o, on_demand) = runs["reserve"], runs["on_demand"]
    assert served_r == served_o
    running = {p: statistics.mean(s["running"] for s in sched.stats) for p, (_, sched) in runs.items()}
    assert running["on_demand"] > running["reserve"]
    assert max(s["running"] for s in on_demand.stats) > max(s["running"] for s in reserve.stats)
    assert all(s["blocks_idle"] == 0 for s in on_demand.stats)  # a block is taken when a token needs it
    assert statistics.mean(s["blocks_idle"] for s in reserve.stats) > 0  # promised blocks wait for their tokens
    for s in reserve.stats:  # held (each holding a token), promised, free: the whole pool
        assert s["blocks_in_use"] + s["blocks_idle"] + s["blocks_free"] == 10
    assert reserve.preemptions == reserve.recomputed == 0 < on_demand.preemptions
    assert _all_blocks_back(reserve) and _all_blocks_back(on_demand)


def test_policy_and_pool_are_checked():
    cache = PagedKVCache(num_blocks=2, block_size=2, num_kv_heads=1, head_dim=2)
    with pytest.raises(ValueError, match="policy must be one of"):
        Scheduler(cache, policy="lazy")
    with pytest.raises(ValueError, match="whole pool has 2"):  # on demand or not, a request must fit the pool alone
        Scheduler(cache, policy="on_demand").submit(Request("big", [1, 2, 3, 4], 2))


def test_prefilling_means_feeding_more_than_the_last_generated_token():
    r = Request("r", [1, 2, 3], 4)
    assert r.prefilling and r.pending == 3
    r.fed = 2
    assert r.prefilling and r.pending == 1  # a prompt token is left: still a prompt's chunk
    r.fed, r.generated = 3, [7]
    assert not r.prefilling and r.pending == 1  # decoding: its last generated token
    r.fed, r.generated = 0, [7, 8]  # preempted: everything to feed again
    assert r.prefilling and r.pending == 5
    r.fed = 3
    assert r.prefilling and r.pending == 2  # the prompt fed again, two generated tokens to go
    r.fed = 4
    assert not r.prefilling and r.pending == 1  # recomputed up to its last generated token: a decode row again


def test_a_one_token_prompt_chunk_is_not_a_decode_row():
    """A prompt of 5 in chunks of 4 feeds 1 token at its second step: a prefill row, not a decode row."""
    cache = PagedKVCache(num_blocks=8, block_size=4, num_kv_heads=1, head_dim=2)
    scheduler = Scheduler(cache, max_batch_tokens=8, chunk=4)
    scheduler.submit(Request("a", [1, 2, 3, 4, 5], 2))
    decodes = []
    while scheduler.running or scheduler.waiting:
        batch = scheduler.schedule()
        decodes.append(batch.decode_tokens)
        scheduler.update(batch, torch.zeros(len(batch.tokens), 4))
        scheduler.clock += 1
    assert decodes == [0, 0, 1]  # 4 prompt tokens, the fifth, then the first generated token
