"""The exercise checkers of chapter 10: their private references are right (the identities the chapter proves, and
parity with torch's and transformers' own functions), right answers pass, and typical wrong ones are named.
Every mutant of tests/mutants/ch10.py is run by tests/test_mutation.py."""
import math
import re

import pytest
import torch
import torch.nn.functional as F

from attention_course.exercises import ExerciseError, ch10
from mutants.ch10 import attend, interleaved_complex, through_the_permutation

DT = torch.float64
CHECKERS = (ch10.check_repeat_kv, ch10.check_apply_rope, ch10.check_decode_step, ch10.check_window_mask)


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


def recomputed(q, k, v):
    """Causal attention over all N tokens at once, RoPE at 0 .. N-1: what a cache must reproduce. (B, h, N, d)."""
    positions = torch.arange(q.shape[2])
    return attend(ch10._rope(q, positions), ch10._rope(k, positions), v, positions[None, :] > positions[:, None])


def step_inputs(q, k, v, T, L):
    """The new tokens' q, k, v (unrotated) and the cache of the T before them (keys rotated)."""
    new = lambda t: t[:, :, T:T + L].clone()  # noqa: E731
    return new(q), new(k), new(v), ch10._rope(k[:, :, :T], torch.arange(T)), v[:, :, :T].clone()


# ---------------------------------------------------------------------------------------------------------
# The references


def test_repeat_kv_pairs_query_heads_as_sdpa_enable_gqa_does():
    """torch's own grouped-query attention reads key/value head j // n_rep for query head j: the checker's
    convention; tiling (repeat) gives another result."""
    q, k, v = randn(2, 6, 5, 4, seed=1), randn(2, 2, 7, 4, seed=2), randn(2, 2, 7, 4, seed=3)
    gqa = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    ours = F.scaled_dot_product_attention(q, ch10.REPEAT_KV.reference(k, 3), ch10.REPEAT_KV.reference(v, 3))
    tiled = F.scaled_dot_product_attention(q, k.repeat(1, 3, 1, 1), v.repeat(1, 3, 1, 1))
    torch.testing.assert_close(ours, gqa, atol=1e-12, rtol=0)
    assert (tiled - gqa).abs().max() > 0.1


def test_rope_turns_each_pair_by_position_times_frequency():
    """Feature i and i + d/2 of a token at position p, as a complex number, are multiplied by e^(i p theta_i)."""
    x, positions = randn(1, 1, 3, 8), torch.tensor([0, 5, 97])
    out = ch10._rope(x, positions)
    for l, p in enumerate(positions.tolist()):
        for i in range(4):
            theta = 10000.0 ** (-2 * i / 8)
            z = complex(x[0, 0, l, i], x[0, 0, l, i + 4]) * complex(math.cos(p * theta), math.sin(p * theta))
            assert abs(complex(out[0, 0, l, i], out[0, 0, l, i + 4]) - z) < 1e-12
    torch.testing.assert_close(out[..., 0, :], x[..., 0, :], atol=0, rtol=0)  # position 0: not turned
    torch.testing.assert_close(out.norm(dim=-1), x.norm(dim=-1), atol=1e-12, rtol=0)  # a rotation


def test_rope_scores_depend_on_the_distance_only():
    q, k = randn(1, 2, 1, 8, seed=4), randn(1, 2, 1, 8, seed=5)
    score = lambda m, n: (ch10._rope(q, torch.tensor([m])) *  # noqa: E731
                          ch10._rope(k, torch.tensor([n]))).sum(-1)
    for m, n in [(3, 1), (10, 8), (102, 100)]:
        torch.testing.assert_close(score(m, n), score(m - n, 0), atol=1e-12, rtol=0)
    assert (score(3, 1) - score(3, 2)).abs().max() > 1e-3


def test_the_two_conventions_agree_up_to_a_fixed_permutation():
    """Interleaved RoPE (Meta's complex numbers) on the features permuted (i -> 2i, i + d/2 -> 2i + 1) is
    split-halves RoPE, and on the features as they are it is not."""
    x, positions = randn(2, 3, 5, 8, seed=6), torch.arange(3, 8)
    torch.testing.assert_close(through_the_permutation(x, positions), ch10._rope(x, positions),
                               atol=1e-12, rtol=0)
    assert (interleaved_complex(x, positions) - ch10._rope(x, positions)).abs().max() > 0.1


@pytest.mark.slow  # imports transformers (seconds): make check leaves transformers to make test
def test_rope_is_transformers_llama_rope():
    """The same convention as transformers' apply_rotary_pos_emb (exactly, given the same cos and sin), and the same
    frequencies as LlamaRotaryEmbedding (which computes its angles in float32)."""
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    from transformers import LlamaConfig

    d, positions = 8, torch.arange(90, 95)
    q, k = randn(2, 3, 5, d, seed=7), randn(2, 3, 5, d, seed=8)
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=DT) / d)
    angles = torch.cat([positions[:, None] * theta] * 2, -1)  # (L, d)
    got = modeling.apply_rotary_pos_emb(q, k, angles.cos()[None], angles.sin()[None])
    for theirs, x in zip(got, (q, k)):
        torch.testing.assert_close(theirs, ch10._rope(x, positions), atol=1e-12, rtol=0)
    config = LlamaConfig(hidden_size=3 * d, num_attention_heads=3, rope_theta=10000.0)
    cos, sin = modeling.LlamaRotaryEmbedding(config)(q, positions[None])
    theirs, _ = modeling.apply_rotary_pos_emb(q, k, cos.double(), sin.double())
    assert (theirs - ch10._rope(q, positions)).abs().max() < 1e-4  # float32 angles


def test_transformers_repeat_kv_is_the_reference():
    modeling = pytest.importorskip("transformers.models.llama.modeling_llama")
    x = randn(2, 3, 5, 4)
    for n_rep in (1, 2, 4):
        assert torch.equal(modeling.repeat_kv(x, n_rep), ch10.REPEAT_KV.reference(x, n_rep))


def test_cached_decoding_equals_full_recomputation_for_every_split():
    """The theorem the decode checker rests on: the reference step, for any cache length T and any number L of new
    tokens, gives the rows T .. T+L-1 of causal attention over all tokens at once."""
    q, k, v = (randn(2, 3, 7, 8, seed=s) for s in (9, 10, 11))
    full = recomputed(q, k, v)
    for T in range(7):
        for L in range(1, 8 - T):
            out, cache_k, cache_v = ch10.DECODE_STEP.reference(*step_inputs(q, k, v, T, L))
            torch.testing.assert_close(out, full[:, :, T:T + L], atol=1e-12, rtol=0)
            torch.testing.assert_close(cache_k, ch10._rope(k[:, :, :T + L], torch.arange(T + L)), atol=1e-12, rtol=0)
            assert torch.equal(cache_v, v[:, :, :T + L])


def test_a_rolling_cache_with_the_window_mask_equals_the_full_cache():
    """Keeping the last W entries of the cache, in ring-buffer order, with the window mask built from their positions,
    gives what the full cache gives under the window mask."""
    N, W = 9, 3
    q, k, v = (randn(1, 2, N, 4, seed=s) for s in (12, 13, 14))
    positions = torch.arange(N)
    want = attend(q, k, v, ch10._window(positions, positions, W))
    ring_k, ring_v, ring_at = torch.zeros(1, 2, W, 4, dtype=DT), torch.zeros(1, 2, W, 4, dtype=DT), [-W] * W
    for t in range(N):
        slot = t % W  # the oldest entry is overwritten
        ring_k[:, :, slot], ring_v[:, :, slot], ring_at[slot] = k[:, :, t], v[:, :, t], t
        mask = ch10._window(torch.tensor([t]), torch.tensor(ring_at), W)
        got = attend(q[:, :, t:t + 1], ring_k, ring_v, mask)
        torch.testing.assert_close(got, want[:, :, t:t + 1], atol=1e-12, rtol=0)


def test_window_mask_extremes():
    positions = torch.arange(5)
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    assert torch.equal(ch10._window(positions, positions, 5), causal)
    assert torch.equal(ch10._window(positions, positions, 1), ~torch.eye(5, dtype=torch.bool))
    assert (~ch10._window(positions, positions, 2)).sum(-1).tolist() == [1, 2, 2, 2, 2]


# ---------------------------------------------------------------------------------------------------------
# The checkers


@pytest.mark.parametrize("check, answer", [
    (ch10.check_repeat_kv, ch10.REPEAT_KV.reference),
    (ch10.check_apply_rope, ch10._rope),
    (ch10.check_decode_step, ch10.DECODE_STEP.reference),
    (ch10.check_window_mask, ch10._window),
], ids=lambda x: getattr(x, "__name__", ""))
def test_a_right_answer_passes(check, answer, capsys):
    check(answer)
    out = capsys.readouterr().out
    assert out.startswith("Correct") and all(len(line) <= 79 for line in out.splitlines())


@pytest.mark.parametrize("check", CHECKERS, ids=lambda c: c.__name__)
def test_a_stub_is_reported_as_a_stub(check):
    def stub(*args):
        raise NotImplementedError()
    with pytest.raises(ExerciseError, match="still the exercise's stub"):
        check(stub)


def decode_with_counter():
    """A step that counts positions itself, across calls, instead of reading the cache's length."""
    seen = [0]

    def step(q, k, v, cache_k, cache_v):
        start = seen[0]
        seen[0] += q.shape[2]
        positions = torch.arange(start, start + q.shape[2])
        rq, rk = ch10._rope(q, positions), ch10._rope(k, positions)
        keys, values = torch.cat([cache_k, rk], 2), torch.cat([cache_v, v], 2)
        future = torch.arange(keys.shape[2])[None, :] > torch.arange(cache_k.shape[2], keys.shape[2])[:, None]
        return attend(rq, keys, values, future), keys, values
    return step


@pytest.mark.parametrize("check, answer, words", [
    (ch10.check_repeat_kv, lambda x, n: x.repeat(1, n, 1, 1), "is TILED"),
    (ch10.check_repeat_kv, lambda x, n: x, "NOT REPEATED"),
    (ch10.check_apply_rope, lambda x, p: ch10._rope(x, p, pairs=True), "INTERLEAVED pairs"),
    (ch10.check_apply_rope, lambda x, p: ch10._rope(x, p, start=0), "RESTARTED at 0"),
    (ch10.check_apply_rope, lambda x, p: ch10._rope(x, p, start=1), "position + 1"),
    (ch10.check_decode_step, lambda *a: ch10._decode(*a, start=0), "RESTARTED at 0"),
    (ch10.check_decode_step, lambda *a: ch10._decode(*a, cat=1), "WRONG AXIS"),
    (ch10.check_decode_step, lambda *a: ch10._decode(*a, mask="hide cache"), "HIDES THE CACHE"),
    (ch10.check_decode_step, lambda *a: ch10._decode(*a, own=False), "OLD CACHE ONLY"),
    (ch10.check_window_mask, lambda q, k, w: ch10._window(q, k, w, far=1), "OFF BY ONE"),
    (ch10.check_window_mask, lambda q, k, w: ch10._window(q, k, w, band="symmetric"), "NOT CAUSAL"),
    (ch10.check_window_mask, lambda q, k, w: ~ch10._window(q, k, w), "polarity swapped"),
])
def test_each_classic_mistake_is_named(check, answer, words):
    with pytest.raises(ExerciseError) as info:
        check(answer)
    assert words in str(info.value)


def test_a_step_that_keeps_its_own_state_is_told_so():
    """A step that counts positions across calls gives another result on the same inputs the second time."""
    with pytest.raises(ExerciseError, match=r"another result when called again .* keeps a state between calls"):
        ch10.check_decode_step(decode_with_counter())


def test_the_spec_names_every_exercise():
    for name in ("my_repeat_kv(x, n_rep)", "my_apply_rope(x, positions)", "decode_step(q, k, v, cache_k, cache_v)",
                 "window_mask(q_positions, k_positions, window)", "ex-ch10-repeat-kv", "ex-ch10-rope",
                 "ex-ch10-decode-step", "ex-ch10-window-mask"):
        assert name in ch10.__doc__, name


def test_the_package_agrees_with_the_checkers():
    """The chapter's own functions compute what the checkers' references do, on the checkers' cases: one convention
    throughout. Handed to the checkers as answers, they are refused: the exercises ask for them written by hand."""
    from attention_course.decoding import decode_mask, repeat_kv
    from attention_course.rope import apply_rope

    for x, n_rep in (case.args for case in ch10.REPEAT_KV.cases):
        assert torch.equal(repeat_kv(x, n_rep), ch10.REPEAT_KV.reference(x, n_rep))
    for x, positions in (case.args for case in ch10.APPLY_ROPE.cases):
        torch.testing.assert_close(apply_rope(x, positions), ch10._rope(x, positions), atol=1e-12, rtol=0)
    for q_positions, k_positions, window in (case.args for case in ch10.WINDOW_MASK.cases):
        assert torch.equal(decode_mask(q_positions, k_positions, window=window),
                           ch10._window(q_positions, k_positions, window))
    for check, answer in ((ch10.check_repeat_kv, repeat_kv), (ch10.check_apply_rope, apply_rope),
                          (ch10.check_window_mask, lambda q, k, w: decode_mask(q, k, window=w))):
        with pytest.raises(ExerciseError, match="WITHOUT the ready-made function"):
            check(answer)


def test_the_rules_resolve_to_functions_that_exist():
    """Grading makes each forbidden name unavailable during the check: every one must exist."""
    import importlib
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from instructor import verdict

    for label, (names, rule) in verdict.RULES.items():
        if not label.startswith("ex-ch10-"):
            continue
        for name in names:
            module, attr = name.rsplit(".", 1)
            assert callable(getattr(importlib.import_module(module), attr)), name
            assert attr in rule, (label, attr)


def test_a_repeat_kv_outside_the_catalogue_is_told_which_heads_it_holds():
    """A wrong repeat_kv in no way the catalogue names is told which head of x each of its heads holds, against
    head j // n_rep, and a copy count other than n_rep (3 written in) is said."""
    with pytest.raises(ExerciseError, match=re.escape("Its 9 heads hold x's heads [0, 0, 0, 1, 1, 1, 2, 2, 2], where the "
                                                      "right 6 hold [0, 0, 1, 1, 2, 2] (head j // n_rep): each head 3 "
                                                      "times, n_rep = 2.")):
        ch10.check_repeat_kv(lambda x, n_rep: x.repeat_interleave(3, dim=1))
