"""The padding law of chapter 3, swept over random batches.

Masking the padded keys with -inf before the softmax makes a padded batch compute, at every real position of
every sentence, exactly what that sentence computes alone; and what sits in the pad positions does not matter.
"""
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn
from torch.testing import assert_close

from attention_course.functional import scaled_dot_product_attention
from attention_course.masks import padding_mask
from attention_course.multihead import MultiheadAttention

DTYPE = torch.float64
SWEEP = settings(max_examples=40, deadline=None)


@st.composite
def padded_batches(draw, max_batch=4, max_len=7):
    """(lengths, L): B sentence lengths in 1..L, padded to L >= max(lengths)."""
    lengths = draw(st.lists(st.integers(1, max_len), min_size=1, max_size=max_batch))
    L = draw(st.integers(max(lengths), max_len))
    return lengths, L


def random_batch(lengths, L, D, seed, pad_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(len(lengths), L, D, generator=gen, dtype=DTYPE)  # (B, L, D)
    pads = padding_mask(lengths, L)  # (B, L), True at pads
    junk = pad_scale * torch.randn(x.shape, generator=gen, dtype=DTYPE)
    return torch.where(pads[..., None], junk, x), pads


@SWEEP
@given(padded_batches(), st.integers(1, 6), st.integers(0, 2**16))
def test_masked_attention_at_real_positions_equals_each_sentence_alone(batch, d, seed):
    lengths, L = batch
    x, pads = random_batch(lengths, L, 3 * d, seed)
    q, k, v = x.split(d, dim=-1)  # (B, L, d) each
    out, weights = scaled_dot_product_attention(q, k, v, pads[:, None, :])  # mask (B, 1, S)
    for b, n in enumerate(lengths):
        alone, alone_weights = scaled_dot_product_attention(q[b:b + 1, :n], k[b:b + 1, :n], v[b:b + 1, :n])
        assert_close(out[b, :n], alone[0])
        assert_close(weights[b, :n, :n], alone_weights[0])
        assert torch.equal(weights[b, :, n:], torch.zeros_like(weights[b, :, n:]))  # pads get exactly 0


@SWEEP
@given(padded_batches(), st.integers(1, 3), st.integers(1, 3), st.integers(0, 2**16))
def test_multihead_layers_at_real_positions_equal_each_sentence_alone(batch, num_heads, head_size, seed):
    lengths, L = batch
    D = num_heads * head_size
    x, pads = random_batch(lengths, L, D, seed)
    torch.manual_seed(seed)
    theirs = nn.MultiheadAttention(D, num_heads, batch_first=True, dtype=DTYPE)
    with torch.no_grad():  # random biases: torch's zeros would hide a bias applied in the wrong place
        theirs.in_proj_bias.normal_()
        theirs.out_proj.bias.normal_()
    ours = MultiheadAttention.from_torch(theirs)
    for layer in (theirs, ours):
        out, _ = layer(x, x, x, key_padding_mask=pads)
        for b, n in enumerate(lengths):
            alone, _ = layer(x[b:b + 1, :n], x[b:b + 1, :n], x[b:b + 1, :n])
            assert_close(out[b, :n], alone[0])


@SWEEP
@given(padded_batches(), padded_batches(), st.integers(1, 4), st.integers(0, 2**16))
def test_cross_attention_with_padded_queries_and_keys(queries, keys, d, seed):
    (q_lengths, L), (k_lengths, S) = queries, keys
    B = min(len(q_lengths), len(k_lengths))
    q_lengths, k_lengths = q_lengths[:B], k_lengths[:B]
    q, _ = random_batch(q_lengths, L, d, seed)
    kv, k_pads = random_batch(k_lengths, S, 2 * d, seed + 1)
    k, v = kv.split(d, dim=-1)
    out, _ = scaled_dot_product_attention(q, k, v, k_pads[:, None, :])  # (B, L, d)
    for b in range(B):
        m, n = q_lengths[b], k_lengths[b]
        alone, _ = scaled_dot_product_attention(q[b:b + 1, :m], k[b:b + 1, :n], v[b:b + 1, :n])
        assert_close(out[b, :m], alone[0])


@SWEEP
@given(padded_batches(), st.integers(1, 4), st.integers(0, 2**16), st.sampled_from([1e-3, 1.0, 1e3, 1e6]))
def test_what_sits_in_the_pads_changes_the_real_positions_by_exactly_zero(batch, d, seed, pad_scale):
    lengths, L = batch
    x, pads = random_batch(lengths, L, 3 * d, seed)
    other, _ = random_batch(lengths, L, 3 * d, seed + 1, pad_scale)
    other = torch.where(pads[..., None], other, x)  # same real tokens, other (finite) pad embeddings
    outs = [scaled_dot_product_attention(*t.split(d, dim=-1), pads[:, None, :])[0] for t in (x, other)]
    real = ~pads  # (B, L)
    assert torch.equal(outs[0][real], outs[1][real])


def test_the_law_needs_finite_pads():
    """0 * inf is NaN: a pad whose value is infinite poisons every real position despite its weight of 0."""
    x, pads = random_batch([3, 2], 3, 3, seed=0)
    x[1, 2] = float("inf")  # the pad of sentence 1
    out, weights = scaled_dot_product_attention(*x.split(1, dim=-1), pads[:, None, :])
    assert weights[1, :2, 2].eq(0).all()
    assert out[1, :2].isnan().all()
