"""Causal decoding: shared key/value heads, the decode mask, the KV cache and its size, the causal layer."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import causal_mask
from attention_course.decoding import CausalSelfAttention, KVCache, decode_mask, kv_cache_bytes, repeat_kv

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


# --- CausalSelfAttention --------------------------------------------------------------------------------------

def make_layer(E=16, h=4, h_kv=2, seed=0, dtype=torch.float64, **kwargs):
    torch.manual_seed(seed)
    return CausalSelfAttention(E, h, h_kv, dtype=dtype, **kwargs)


def left_padded(lengths, E=16, seed=1, dtype=torch.float64):
    """x (B, T, E) with sentence b's lengths[b] tokens at the right end, its positions (B, T) (0, 1, ... on the
    real tokens, 0 on the pads, as batched generation numbers them) and the key padding mask (B, T)."""
    T = max(lengths)
    x = torch.randn(len(lengths), T, E, generator=torch.Generator().manual_seed(seed), dtype=dtype)
    pad = torch.arange(T)[None, :] < (T - torch.tensor(lengths))[:, None]  # (B, T), True at pads
    positions = ((~pad).cumsum(-1) - 1).clamp(min=0)
    return x, positions, pad


def decode(layer, x, prefill, positions=None, pad=None, cache=None):
    """Prefill the first ``prefill`` tokens, then one token per step, through ``cache``; the outputs (B, T, E)."""
    cache = KVCache(window=layer.window) if cache is None else cache
    outs = []
    for a, b in [(0, prefill)] + [(t, t + 1) for t in range(prefill, x.shape[1])]:
        p = None if positions is None else positions[..., a:b]
        outs.append(layer(x[:, a:b], p, cache, None if pad is None else pad[:, :b]))
    return torch.cat(outs, dim=1)


@pytest.mark.parametrize("h_kv", [4, 2, 1])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("padded", [False, True])
def test_cached_decoding_equals_full_recomputation(h_kv, window, padded):
    layer = make_layer(h_kv=h_kv, window=window)
    if padded:
        x, positions, pad = left_padded([9, 6, 2])
    else:
        x, positions, pad = torch.randn(3, 9, 16, **F64), None, None
    with torch.no_grad():
        full = layer(x, positions, key_padding_mask=pad)  # every token at once, no cache
        cached = decode(layer, x, 4, positions, pad)  # prefill 4, then 5 steps of one token
    real = slice(None) if pad is None else ~pad
    torch.testing.assert_close(cached[real], full[real], atol=1e-12, rtol=0)


@pytest.mark.parametrize("window", [None, 3])
def test_left_padded_sentences_compute_what_they_compute_alone(window):
    layer = make_layer(window=window)
    lengths = [9, 6, 2]
    x, positions, pad = left_padded(lengths)
    with torch.no_grad():
        batch = decode(layer, x, 4, positions, pad)
        for b, n in enumerate(lengths):
            alone = layer(x[b:b + 1, -n:])  # unpadded, positions 0 .. n-1 by default
            torch.testing.assert_close(batch[b, -n:], alone[0], atol=1e-12, rtol=0)


def test_rolling_cache_equals_the_full_cache_with_the_window_mask():
    layer = make_layer(window=3)
    x = torch.randn(2, 10, 16, **F64)
    rolling, full = KVCache(window=3), KVCache()
    with torch.no_grad():
        torch.testing.assert_close(decode(layer, x, 2, cache=rolling), decode(layer, x, 2, cache=full),
                                   atol=1e-12, rtol=0)
    assert len(rolling) == 3 and len(full) == 10 and rolling.tokens_seen == full.tokens_seen == 10


def test_without_rope_and_shared_heads_it_is_torchs_causal_multihead_attention():
    layer = make_layer(h_kv=4, rope=False)
    mha = torch.nn.MultiheadAttention(16, 4, bias=False, batch_first=True, **F64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([layer.q_proj.weight, layer.k_proj.weight, layer.v_proj.weight]))
        mha.out_proj.weight.copy_(layer.o_proj.weight)
        x = torch.randn(2, 7, 16, **F64)
        expected = mha(x, x, x, attn_mask=causal_mask(7), need_weights=False)[0]
        torch.testing.assert_close(layer(x), expected, atol=1e-12, rtol=0)


def test_shared_heads_are_full_heads_holding_copies_of_the_shared_weights():
    gqa, mha = make_layer(h_kv=2), make_layer(h_kv=4, seed=1)
    with torch.no_grad():
        for name in ("q_proj", "o_proj"):
            getattr(mha, name).weight.copy_(getattr(gqa, name).weight)
        for name in ("k_proj", "v_proj"):  # kv head i's rows, once for each of the 2 query heads it serves
            w = getattr(gqa, name).weight.view(2, 4, 16)  # (h_kv, d, E)
            getattr(mha, name).weight.copy_(w.repeat_interleave(2, dim=0).reshape(16, 16))
        x = torch.randn(2, 7, 16, **F64)
        torch.testing.assert_close(gqa(x), mha(x), atol=1e-12, rtol=0)


@FAST
@given(st.integers(0, 2**16), st.integers(1, 7), st.sampled_from([None, 1, 2, 4]))
def test_the_output_at_t_depends_on_tokens_up_to_t_only(seed, t, window):
    layer = make_layer(window=window)
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 8, 16, generator=gen, **F64)
    changed = x.clone()
    changed[:, t:] = torch.randn(2, 8 - t, 16, generator=gen, **F64)  # new tokens from t on
    with torch.no_grad():
        before, after = layer(x), layer(changed)
    torch.testing.assert_close(after[:, :t], before[:, :t], atol=1e-12, rtol=0)
    assert not torch.allclose(after[:, t:], before[:, t:])


def test_the_classic_mistakes_change_the_output():
    layer = make_layer()
    x = torch.randn(1, 6, 16, **F64)
    with torch.no_grad():
        full = layer(x)
        cache = KVCache()
        layer(x[:, :5], cache=cache)
        right = layer(x[:, 5:], cache=cache)  # default positions continue at cache.tokens_seen = 5
        torch.testing.assert_close(right, full[:, 5:], atol=1e-12, rtol=0)
        cache = KVCache()
        layer(x[:, :5], cache=cache)
        restarted = layer(x[:, 5:], torch.tensor([0]), cache)  # positions restarting at 0 in decode
        assert (restarted - full[:, 5:]).abs().max() > 1e-3
        alone = layer(x[:, 5:], torch.tensor([5]))  # no cache: the new token reads itself alone
        assert (alone - full[:, 5:]).abs().max() > 1e-3


@pytest.mark.parametrize("dtype, atol", [(torch.float32, 1e-5), (torch.float64, 1e-12)])
def test_float32_and_float64(dtype, atol):
    layer = make_layer(dtype=dtype)
    x = torch.randn(2, 6, 16, dtype=dtype)
    with torch.no_grad():
        out = decode(layer, x, 3)
        assert out.dtype == dtype
        torch.testing.assert_close(out, layer(x), atol=atol, rtol=0)


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_device_follows_the_inputs(device):
    layer = make_layer(window=3).to(device)
    x, positions, pad = (t.to(device) for t in left_padded([5, 3]))
    with torch.no_grad():
        cache = KVCache(window=3)
        out = decode(layer, x, 2, positions, pad, cache)
        assert out.device.type == cache.k.device.type == device
        torch.testing.assert_close(out[~pad], layer(x, positions, key_padding_mask=pad)[~pad], atol=1e-12, rtol=0)


def test_no_tensor_is_made_on_another_device():
    """On torch's "meta" device tensors have shapes but no numbers: any tensor the layer or cache made on the CPU
    by itself (a hard-coded device) would meet a meta tensor and raise."""
    layer = make_layer(window=3, dtype=torch.float32).to("meta")
    x, positions, pad = (t.to("meta") for t in left_padded([5, 3], dtype=torch.float32))
    cache = KVCache(window=3)
    out = decode(layer, x, 2, positions, pad, cache)
    assert out.device.type == cache.k.device.type == "meta" and out.shape == (2, 5, 16) and len(cache) == 3
    assert layer(x).device.type == "meta"  # default positions too


@pytest.mark.parametrize("build, error, match", [
    (lambda: CausalSelfAttention(16, 4, 3), ValueError, "num_heads=4 is not a multiple of num_kv_heads=3.*1, 2, 4"),
    (lambda: CausalSelfAttention(12, 4), ValueError, r"head_dim = embed_dim / num_heads = 12 / 4 must be even"),
    (lambda: CausalSelfAttention(16, 3), ValueError, "not divisible by num_heads 3"),
    (lambda: CausalSelfAttention(16, 4, window=0), ValueError, "window must be a positive int"),
])
def test_layer_construction_validation(build, error, match):
    with pytest.raises(error, match=match):
        build()
    assert CausalSelfAttention(12, 4, rope=False).head_dim == 3  # odd head sizes are fine without RoPE


@pytest.mark.parametrize("call, error, match", [
    (lambda m: m(torch.zeros(6, 16, **F64)), ValueError, r"3 dimensions \(B, L, E\).*unsqueeze\(0\)"),
    (lambda m: m(torch.zeros(1, 6, 8, **F64)), ValueError, "E=16"),
    (lambda m: m(torch.zeros(1, 6, 16)), TypeError, "x is torch.float32 but the layer is torch.float64"),
    (lambda m: m(torch.zeros(1, 6, 16, **F64), torch.arange(5)), ValueError, "one position per token: L=6, got 5"),
    (lambda m: m(torch.zeros(2, 6, 16, **F64), torch.zeros(3, 6, dtype=torch.long)), ValueError, "one row per"),
    (lambda m: m(torch.zeros(1, 6, 16, **F64), cache=[]), TypeError, "cache must be a KVCache"),
    (lambda m: m(torch.zeros(1, 6, 16, **F64), key_padding_mask=torch.zeros(1, 6)), TypeError,
     "bool tensor, True at pads.*attention_mask == 0"),
    (lambda m: m(torch.zeros(1, 6, 16, **F64), key_padding_mask=torch.zeros(1, 5, dtype=torch.bool)), ValueError,
     r"\(B, T\) = \(1, 6\)"),
    (lambda m: m(torch.zeros(1, 6, 16, **F64), key_padding_mask=torch.zeros(1, 6, dtype=torch.bool, device="meta")),
     ValueError, r"on meta but x is on cpu.*key_padding_mask.to\(x.device\)"),
    (lambda m: m(torch.zeros(1, 6, 16, **F64), torch.arange(6, device="meta")), ValueError, "positions is on meta"),
])
def test_forward_validation(call, error, match):
    with pytest.raises(error, match=match):
        call(make_layer())


def test_key_padding_mask_grows_with_the_cache():
    layer = make_layer()
    cache = KVCache()
    x = torch.randn(1, 4, 16, **F64)
    layer(x[:, :3], cache=cache, key_padding_mask=torch.zeros(1, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"\(B, T\) = \(1, 4\).*append a column of False"):
        layer(x[:, 3:], cache=cache, key_padding_mask=torch.zeros(1, 3, dtype=torch.bool))
    assert len(cache) == cache.tokens_seen == 3  # refused before the cache changed
    assert "num_kv_heads=2, window=None, rope=True" in repr(layer)
