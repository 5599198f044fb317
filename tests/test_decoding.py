"""Causal decoding: shared key/value heads, the decode mask, the KV cache and its size, the causal layer."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import causal_mask
from attention_course.decoding import KVCache, decode_mask, kv_cache_bytes, repeat_kv

FAST = settings(max_examples=25, deadline=None)
F64 = dict(dtype=torch.float64)


# --- repeat_kv ------------------------------------------------------------------------------------------------

def test_repeat_kv_pairs_query_head_j_with_kv_head_j_over_n_rep():
    x = torch.arange(3.0).view(1, 3, 1, 1).expand(2, 3, 4, 5)  # kv head i holds the number i
    out = repeat_kv(x, 2)
    assert out.shape == (2, 6, 4, 5)
    assert out[0, :, 0, 0].tolist() == [0, 0, 1, 1, 2, 2]
    assert x.repeat(1, 2, 1, 1)[0, :, 0, 0].tolist() == [0, 1, 2, 0, 1, 2]  # the classic mistake: other pairs
    assert torch.equal(repeat_kv(x, 1), x)


def test_repeat_kv_is_what_sdpa_enable_gqa_computes():
    q = torch.randn(2, 6, 5, 4, **F64)
    k, v = torch.randn(2, 2, 7, 4, **F64), torch.randn(2, 2, 7, 4, **F64)
    ours = F.scaled_dot_product_attention(q, repeat_kv(k, 3), repeat_kv(v, 3))
    torch.testing.assert_close(ours, F.scaled_dot_product_attention(q, k, v, enable_gqa=True), atol=1e-14, rtol=0)


@pytest.mark.parametrize("call, error, match", [
    (lambda: repeat_kv(torch.zeros(2, 3, 4), 2), ValueError, r"4 dimensions \(B, h_kv, S, d\)"),
    (lambda: repeat_kv(torch.zeros(1, 2, 3, 4), 0), ValueError, "n_rep must be a positive int"),
    (lambda: repeat_kv(torch.zeros(1, 2, 3, 4, dtype=torch.long), 2), TypeError, "floating-point"),
])
def test_repeat_kv_validation(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- decode_mask ----------------------------------------------------------------------------------------------

def test_decode_mask_over_a_whole_sequence_is_the_causal_mask():
    p = torch.arange(6)
    assert torch.equal(decode_mask(p, p), causal_mask(6))


def test_a_decode_step_reads_the_whole_cache():
    mask = decode_mask(torch.tensor([7]), torch.arange(8))  # the new token at position 7, keys 0..7
    assert mask.shape == (1, 8) and not mask.any()
    assert causal_mask(1, 8).sum() == 7  # the classic mistake: a causal mask for the new token alone hides them


@FAST
@given(st.integers(1, 6), st.integers(0, 12), st.integers(1, 6), st.integers(1, 8))
def test_decode_mask_is_a_band_from_positions(L, offset, extra, window):
    q = torch.arange(offset, offset + L)
    k = torch.arange(offset + L + extra)  # keys may run past the queries: those are the future
    mask = decode_mask(q, k, window=window)
    for i, qi in enumerate(q.tolist()):
        for j, kj in enumerate(k.tolist()):
            assert mask[i, j] == (kj > qi or qi - kj >= window)
    assert (~mask).sum(-1).tolist() == [min(window, qi + 1) for qi in q.tolist()]  # each reads min(W, t+1) keys


def test_decode_mask_per_sentence_positions():
    q = torch.tensor([[3], [1]])  # (B, L): sentence 1 was left-padded by two tokens
    k = torch.tensor([[0, 1, 2, 3], [1, 1, 0, 1]])
    mask = decode_mask(q, k)
    assert mask.shape == (2, 1, 1, 4)
    assert mask[1, 0, 0].tolist() == [False, False, False, False]
    assert decode_mask(q, torch.arange(4)).shape == (2, 1, 1, 4)  # one row of key positions for all


@pytest.mark.parametrize("call, error, match", [
    (lambda: decode_mask(torch.arange(3.0), torch.arange(3)), TypeError, "integer token positions"),
    (lambda: decode_mask(torch.arange(3), torch.arange(3), window=0), ValueError, "window must be a positive int"),
    (lambda: decode_mask(torch.zeros(2, 3, dtype=torch.long), torch.zeros(3, 3, dtype=torch.long)), ValueError,
     "same batch size"),
])
def test_decode_mask_validation(call, error, match):
    with pytest.raises(error, match=match):
        call()


# --- KVCache and its size -------------------------------------------------------------------------------------

def _kv(B=2, h_kv=3, L=4, d=5, dtype=torch.float64):
    return torch.randn(B, h_kv, L, d, dtype=dtype), torch.randn(B, h_kv, L, d, dtype=dtype)


def test_cache_grows_along_the_sequence_axis_and_returns_everything():
    cache = KVCache()
    assert len(cache) == 0 and cache.nbytes == 0 and cache.positions is None
    k1, v1 = _kv(L=4)
    k_all, v_all, p_all = cache.update(k1, v1, torch.arange(4))
    assert k_all is k1 and p_all.tolist() == [0, 1, 2, 3]
    k2, v2 = _kv(L=1)
    k_all, v_all, p_all = cache.update(k2, v2, torch.tensor([4]))
    assert k_all.shape == (2, 3, 5, 5) and torch.equal(k_all[:, :, :4], k1) and torch.equal(v_all[:, :, 4:], v2)
    assert p_all.tolist() == [0, 1, 2, 3, 4] and len(cache) == cache.tokens_seen == 5
    assert cache.nbytes == kv_cache_bytes(1, 3, 5, 5, torch.float64, batch=2) == 2 * 2 * 3 * 5 * 5 * 8
    assert "entries=5" in repr(cache)


def test_rolling_cache_keeps_the_last_window_entries():
    cache = KVCache(window=3)
    k, v = _kv(L=5)
    k_all, _, p_all = cache.update(k, v, torch.arange(5))
    assert k_all.shape[2] == 5 and p_all.tolist() == [0, 1, 2, 3, 4]  # this step's queries still read them all
    assert len(cache) == 3 and cache.positions.tolist() == [2, 3, 4] and torch.equal(cache.k, k[:, :, 2:])
    assert cache.k.untyped_storage().nbytes() == cache.k.nbytes  # a copy: the dropped entries are freed
    sizes = []
    for t in range(5, 12):
        k1, v1 = _kv(L=1)
        k_all, _, p_all = cache.update(k1, v1, torch.tensor([t]))
        assert p_all.tolist() == [t - 3, t - 2, t - 1, t] and torch.equal(k_all[:, :, -1:], k1)
        sizes.append(cache.nbytes)
    assert len(set(sizes)) == 1 and cache.tokens_seen == 12 and len(cache) == 3  # memory stopped growing


def test_cache_mixes_shared_and_per_sentence_positions():
    cache = KVCache()
    cache.update(*_kv(L=2), torch.tensor([[0, 1], [1, 0]]))
    _, _, p = cache.update(*_kv(L=1), torch.tensor([2]))
    assert p.tolist() == [[0, 1, 2], [1, 0, 2]]
    cache = KVCache()
    cache.update(*_kv(L=2), torch.arange(2))
    _, _, p = cache.update(*_kv(L=1), torch.tensor([[2], [1]]))
    assert p.tolist() == [[0, 1, 2], [0, 1, 1]]


@pytest.mark.parametrize("new, error, match", [
    (lambda: (*_kv(B=3, L=1), torch.tensor([4])), ValueError, "must agree in every dimension but S"),
    (lambda: (*_kv(d=6, L=1), torch.tensor([4])), ValueError, "must agree in every dimension but S"),
    (lambda: (*_kv(L=1, dtype=torch.float32), torch.tensor([4])), TypeError, "k is torch.float32 but the cache"),
    (lambda: (*_kv(L=2), torch.tensor([4])), ValueError, "one position per token: L=2, got 1"),
    (lambda: (torch.zeros(2, 3, 5), torch.zeros(2, 3, 5), torch.tensor([4])), ValueError, "4 dimensions"),
    (lambda: (_kv(L=1)[0], torch.zeros(2, 3, 2, 5, **F64), torch.tensor([4])), ValueError, "L_new=1"),
])
def test_cache_validation(new, error, match):
    cache = KVCache()
    cache.update(*_kv(L=4), torch.arange(4))
    with pytest.raises(error, match=match):
        cache.update(*new())


def test_kv_cache_bytes():
    # Llama-2-7B-like: 32 layers, 32 kv heads of 128, 4096 tokens in float16: 2 GiB per sentence
    assert kv_cache_bytes(32, 32, 128, 4096, torch.float16) == 2 * 2**30
    assert kv_cache_bytes(32, 8, 128, 4096, torch.float16) == 2**29  # GQA with 8 kv heads: a quarter
    assert kv_cache_bytes(2, 1, 4, 0) == 0
    with pytest.raises(ValueError, match="kv_heads must be a positive int"):
        kv_cache_bytes(2, 0, 4, 10)
    with pytest.raises(ValueError, match="tokens must be an int >= 0"):
        kv_cache_bytes(2, 1, 4, -1)
    with pytest.raises(TypeError, match="torch.dtype"):
        kv_cache_bytes(2, 1, 4, 3, "float16")
    with pytest.raises(ValueError, match="window must be a positive int"):
        KVCache(window=0)
