"""masked_softmax, the explicit scaled_dot_product_attention and the fused one."""
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import (
    fused_attention,
    ignore_to_additive,
    ignore_to_allow,
    masked_softmax,
    padding_mask,
    scaled_dot_product_attention,
)

FAST = settings(max_examples=30, deadline=None)
f64 = torch.float64


def random_ignore_mask(shape, generator=None):
    """A random ignore mask in which every row keeps at least key 0."""
    mask = torch.rand(shape, generator=generator) > 0.5
    mask[..., 0] = False
    return mask


# --- masked_softmax -------------------------------------------------------------------------------------------

def test_masked_softmax_without_mask_is_softmax():
    scores = torch.randn(2, 3, 4)
    torch.testing.assert_close(masked_softmax(scores), torch.softmax(scores, -1))
    torch.testing.assert_close(masked_softmax(scores, dim=1), torch.softmax(scores, 1))


def test_masked_softmax_bool_and_additive_agree_with_fill():
    scores = torch.randn(2, 3, 4, dtype=f64)
    mask = random_ignore_mask((2, 3, 4))
    expected = torch.softmax(scores.masked_fill(mask, float("-inf")), -1)
    torch.testing.assert_close(masked_softmax(scores, mask), expected)
    torch.testing.assert_close(masked_softmax(scores, ignore_to_additive(mask, f64)), expected)
    assert (masked_softmax(scores, mask)[mask] == 0).all()


def test_masked_softmax_broadcasts_a_key_mask():
    scores = torch.randn(2, 3, 4, 5)
    kpm = padding_mask([5, 2])  # (B, S)
    expected = masked_softmax(scores, kpm[:, None, None, :].expand(2, 3, 4, 5))
    torch.testing.assert_close(masked_softmax(scores, kpm[:, None, None, :]), expected)
    key_mask = torch.tensor([False, True, False, False, False])  # (S,)
    torch.testing.assert_close(masked_softmax(scores, key_mask), masked_softmax(scores, key_mask.expand(2, 3, 4, 5)))


def test_masked_softmax_along_another_dim():
    scores, mask = torch.randn(4, 3, dtype=f64), random_ignore_mask((3, 4)).T
    expected = masked_softmax(scores.T, mask.T).T
    torch.testing.assert_close(masked_softmax(scores, mask, dim=0), expected)
    torch.testing.assert_close(masked_softmax(scores, mask, dim=-2), expected)


@pytest.mark.parametrize("as_float", [False, True])
def test_fully_masked_rows_give_zeros_and_finite_gradients(as_float):
    scores = torch.randn(3, 4, dtype=f64, requires_grad=True)
    mask = torch.tensor([[False, True, False, False], [True] * 4, [False] * 4])
    mask_in = ignore_to_additive(mask, f64) if as_float else mask
    weights = masked_softmax(scores, mask_in)
    assert torch.equal(weights[1], torch.zeros(4, dtype=f64))
    torch.testing.assert_close(weights[[0, 2]], torch.softmax(scores.masked_fill(mask, float("-inf")), -1)[[0, 2]])
    (weights * torch.randn(3, 4, dtype=f64)).sum().backward()
    assert torch.isfinite(scores.grad).all()
    assert torch.equal(scores.grad[1], torch.zeros(4, dtype=f64))


def test_large_logits_stay_finite():
    scores = torch.randn(2, 5, 6, dtype=f64) * 1e3
    mask = random_ignore_mask((2, 5, 6))
    weights = masked_softmax(scores, mask)
    assert torch.isfinite(weights).all()
    torch.testing.assert_close(weights, torch.softmax(scores.masked_fill(mask, float("-inf")), -1))


def test_masked_softmax_rejects_bad_masks():
    scores = torch.randn(2, 3, 4, 5)
    with pytest.raises(ValueError, match=r"does not broadcast to the scores shape.*\(2, 3, 4, 5\)"):
        masked_softmax(scores, torch.zeros(3, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"looks like a key padding mask \(B, S\).*mask\[:, None, None, :\]"):
        masked_softmax(scores, torch.zeros(2, 5, dtype=torch.bool))
    with pytest.raises(ValueError, match="does not broadcast"):  # bigger than the scores
        masked_softmax(scores, torch.zeros(7, 2, 3, 4, 5, dtype=torch.bool))
    with pytest.raises(TypeError, match="keep_to_ignore"):
        masked_softmax(scores, torch.ones(5, dtype=torch.long))
    with pytest.raises(TypeError, match=r"float mask of dtype torch.float64 but scores is torch.float32.*mask\.to\(scores\.dtype\)"):
        masked_softmax(scores, torch.zeros(5, dtype=f64))
    with pytest.raises(ValueError, match="mask is on meta but scores is on cpu"):
        masked_softmax(scores, torch.zeros(5, dtype=torch.bool, device="meta"))
    with pytest.raises(TypeError, match="scores must be a floating-point tensor"):
        masked_softmax(torch.ones(3, dtype=torch.long))


# --- scaled_dot_product_attention -----------------------------------------------------------------------------

shapes = st.tuples(st.integers(1, 2), st.integers(1, 3), st.integers(1, 5), st.integers(1, 5), st.integers(1, 4),
                   st.integers(1, 4))


@FAST
@given(shapes, st.booleans(), st.integers(0, 2**16))
def test_sdpa_matches_torch_with_opposite_bool_polarity(shape, use_float_mask, seed):
    B, h, L, S, d, dv = shape
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, m, generator=g, dtype=f64) for n, m in ((L, d), (S, d), (S, dv)))
    ignore = random_ignore_mask((B, 1, L, S), g)
    mask = ignore_to_additive(ignore, f64) if use_float_mask else ignore
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    expected = F.scaled_dot_product_attention(q, k, v, attn_mask=ignore_to_allow(ignore))
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    assert out.shape == (B, h, L, dv) and weights.shape == (B, h, L, S)
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, h, L, dtype=f64))
    torch.testing.assert_close(fused_attention(q, k, v, mask), expected, atol=1e-12, rtol=0)


def test_sdpa_default_scale_and_explicit_scale():
    q, k, v = torch.randn(3, 4, dtype=f64), torch.randn(5, 4, dtype=f64), torch.randn(5, 2, dtype=f64)
    out, weights = scaled_dot_product_attention(q, k, v)
    torch.testing.assert_close(weights, torch.softmax(q @ k.T / math.sqrt(4), -1))
    torch.testing.assert_close(out, weights @ v)
    _, weights = scaled_dot_product_attention(q, k, v, scale=1.0)
    torch.testing.assert_close(weights, torch.softmax(q @ k.T, -1))
    torch.testing.assert_close(fused_attention(q, k, v, scale=1.0), weights @ v)


def test_sdpa_dropout_only_in_training():
    q, k, v = torch.randn(2, 6, 4), torch.randn(2, 7, 4), torch.randn(2, 7, 3)
    out_eval, w_eval = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=False)
    torch.testing.assert_close(w_eval.sum(-1), torch.ones(2, 6))
    torch.manual_seed(0)
    out_train, w_train = scaled_dot_product_attention(q, k, v, dropout_p=0.5, training=True)
    torch.manual_seed(0)
    expected = F.dropout(w_eval, 0.5)
    torch.testing.assert_close(w_train, expected)
    torch.testing.assert_close(out_train, expected @ v)
    torch.testing.assert_close(fused_attention(q, k, v, dropout_p=0.5), out_eval)
    assert not torch.allclose(fused_attention(q, k, v, dropout_p=0.5, training=True), out_eval)


@pytest.mark.parametrize("as_float", [False, True])
def test_fused_and_explicit_agree_on_fully_masked_rows(as_float):
    q = torch.randn(2, 2, 4, 3, dtype=f64, requires_grad=True)
    k = torch.randn(2, 2, 5, 3, dtype=f64, requires_grad=True)
    v = torch.randn(2, 2, 5, 3, dtype=f64, requires_grad=True)
    ignore = random_ignore_mask((2, 1, 4, 5))
    ignore[0, 0, 1] = True  # query 1 of sentence 0 has no key
    mask = ignore_to_additive(ignore, f64) if as_float else ignore
    grad_out = torch.randn(2, 2, 4, 3, dtype=f64)
    results = []
    for out in (scaled_dot_product_attention(q, k, v, mask)[0], fused_attention(q, k, v, mask)):
        assert torch.equal(out[0, :, 1], torch.zeros(2, 3, dtype=f64))
        grads = torch.autograd.grad((out * grad_out).sum(), (q, k, v))
        assert all(torch.isfinite(g).all() for g in grads)
        results.append((out, *grads))
    for explicit, fused in zip(*results):
        torch.testing.assert_close(fused, explicit, atol=1e-12, rtol=0)


def test_fused_causal_flag():
    q, k, v = torch.randn(1, 4, 3), torch.randn(1, 6, 3), torch.randn(1, 6, 2)
    causal = torch.ones(4, 6, dtype=torch.bool).triu(1)
    torch.testing.assert_close(fused_attention(q, k, v, is_causal=True), scaled_dot_product_attention(q, k, v, causal)[0])
    with pytest.raises(ValueError, match="either mask or is_causal=True"):
        fused_attention(q, k, v, causal, is_causal=True)


@pytest.mark.parametrize("fn", [scaled_dot_product_attention, fused_attention])
def test_attention_rejects_bad_input(fn):
    q, k, v = torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 6)
    cases = [
        ((q, torch.randn(2, 5, 3), v), ValueError, r"same feature size d.*q \(\.\.\., L, 4\) and k \(\.\.\., S, 3\)"),
        ((q, k, torch.randn(2, 4, 6)), ValueError, r"same number of keys S.*k \(\.\.\., 5, d\) and v \(\.\.\., 4, dv\)"),
        ((q, torch.randn(3, 5, 4), v), ValueError, "same leading"),
        ((q, torch.randn(1, 2, 5, 4), v), ValueError, "same leading"),
        ((torch.randn(4), k, v), ValueError, "at least 2 dimensions"),
        ((q, k.double(), v), TypeError, r"k is torch.float64 but q is torch.float32.*k\.to\(q\.dtype\)"),
        ((q, k, v.to("meta")), ValueError, "v is on meta but q is on cpu"),
        ((q.long(), k, v), TypeError, "q must be a floating-point tensor"),
    ]
    for args, error, match in cases:
        with pytest.raises(error, match=match):
            fn(*args)
    with pytest.raises(ValueError, match=r"dropout_p .* must be in \[0, 1\), got 1.5"):
        fn(q, k, v, dropout_p=1.5)
    with pytest.raises(ValueError, match=r"does not broadcast to the scores shape \(\.\.\., L, S\) = \(2, 3, 5\)"):
        fn(q, k, v, torch.zeros(3, 4, dtype=torch.bool))


def test_a_key_padding_shaped_mask_is_refused_even_when_B_equals_L():
    """The seeds' silent bug: (B, S) broadcast as (L, S). With B == L the shapes agree, and still it must raise."""
    scores = torch.randn(3, 3, 4)  # B = L = 3, S = 4
    kpm = padding_mask([4, 2, 1])  # (B, S) = (3, 4)
    with pytest.raises(ValueError, match=r"looks like a key padding mask \(B, S\).*mask\[:, None, :\].*mask\[None, \.\.\.\]"):
        masked_softmax(scores, kpm)
    torch.testing.assert_close(  # said explicitly, it works
        masked_softmax(scores, kpm[:, None, :]), masked_softmax(scores, kpm[:, None, :].expand(3, 3, 4)))
    q, k, v = torch.randn(3, 3, 2), torch.randn(3, 4, 2), torch.randn(3, 4, 2)
    with pytest.raises(ValueError, match="looks like a key padding mask"):
        scaled_dot_product_attention(q, k, v, kpm)


def test_an_L_by_S_mask_still_broadcasts_when_it_cannot_be_a_padding_mask():
    scores = torch.randn(2, 5, 5)  # B = 2 != L = 5
    causal = torch.ones(5, 5, dtype=torch.bool).triu(1)
    torch.testing.assert_close(masked_softmax(scores, causal), masked_softmax(scores, causal.expand(2, 5, 5)))
