"""A row with no visible key, in every softmax of the package (issue 53).

A query whose keys are all masked has nothing to average: a plain softmax over a row of -inf computes 0/0 = NaN, in
the forward and the backward pass. The package's convention, everywhere: such a row gives weights 0 and an output
0, and the gradients stay finite. Each function that computes a softmax over rows that a mask can empty is run here
on random masks in which some rows are empty (some masks entirely), with and without sinks, in float64, float32 and
float16, against a reference written row by row (softmax over the visible keys only, 0 where there is none):

functional.masked_softmax, functional.scaled_dot_product_attention, functional.fused_attention,
tiled.tiled_attention and tiled.merge_tile, serving.sink_attention (sinks finite or -inf), serving.partial_attention
and serving.merge_partials (parts of any size, empty ones included), decoding.CausalSelfAttention (left padding),
MultiheadAttention (a sentence of pads), distributed.ring_attention (one rank). gpt-oss through
course_sink_attention with -inf sinks and left padding is in tests/test_serving_transformers.py (it imports
transformers, which `make check` leaves out).
"""
import math

import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention_course import MultiheadAttention, fused_attention, masked_softmax, scaled_dot_product_attention
from attention_course.decoding import CausalSelfAttention
from attention_course.serving import merge_partials, partial_attention, sink_attention
from attention_course.tiled import merge_tile, tiled_attention

NEG_INF = float("-inf")
DTYPES = {"float64": torch.float64, "float32": torch.float32, "float16": torch.float16}
TOL = {torch.float64: 1e-10, torch.float32: 1e-5, torch.float16: 2e-2}
FAST = settings(max_examples=40, deadline=None)


def case(seed, B, h, L, S, d, p_masked, empty_rows, dtype):
    """q (B, h, L, d), k and v (B, h, S, d) in ``dtype``, and an ignore mask (B, h, L, S): each key masked with
    probability p_masked, and the rows flagged in ``empty_rows`` (a bit per query) masked entirely."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, h, n, d, generator=gen, dtype=torch.float64).to(dtype) for n in (L, S, S))
    ignore = torch.rand(B, h, L, S, generator=gen) < p_masked
    rows = torch.tensor([(empty_rows >> i) & 1 for i in range(L)], dtype=torch.bool)  # (L,)
    return q, k, v, ignore | rows[:, None]


def reference(q, k, v, ignore, sinks=None):
    """Row by row in float64: softmax over the visible keys (and the sink, when finite), the sink's weight dropped;
    a row with nothing (no visible key, no sink) gives 0. Returns (out (B, h, L, d), weights (B, h, L, S))."""
    q, k, v = q.double(), k.double(), v.double()
    B, h, L, S = ignore.shape
    out, weights = q.new_zeros(B, h, L, v.shape[-1]), q.new_zeros(B, h, L, S)
    for b in range(B):
        for j in range(h):
            for i in range(L):
                seen = (~ignore[b, j, i]).nonzero().flatten()  # the visible keys' indices
                logits = q[b, j, i] @ k[b, j, seen].T / math.sqrt(q.shape[-1])  # (n,)
                if sinks is not None and sinks[j] > NEG_INF:
                    logits = torch.cat([logits, sinks[j].double().reshape(1)])
                if logits.numel() == 0:
                    continue  # nothing to attend to: 0
                w = torch.softmax(logits, 0)[:len(seen)]
                weights[b, j, i, seen] = w
                out[b, j, i] = w @ v[b, j, seen]
    return out, weights


def shapes(max_S=6):
    return dict(seed=st.integers(0, 10_000), B=st.integers(1, 2), h=st.integers(1, 3), L=st.integers(1, 5),
                S=st.integers(1, max_S), d=st.integers(1, 4), p_masked=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
                empty_rows=st.integers(0, 31), dtype=st.sampled_from(list(DTYPES)))


def check(got, want, dtype):
    assert not got.isnan().any(), "NaN in the output"
    tol = TOL[dtype]
    assert_close(got.double(), want, atol=tol, rtol=tol)


def finite_grads(*tensors):
    for t in tensors:
        assert t.grad is not None and t.grad.isfinite().all(), "a NaN or inf gradient"


def leaves(*tensors):
    return [t.detach().double().requires_grad_() for t in tensors]


# --------------------------------------------------------------------------------------------------- functional.py
@FAST
@given(**shapes(), additive=st.booleans())
def test_masked_softmax_and_both_attentions_give_zeros_on_empty_rows(seed, B, h, L, S, d, p_masked, empty_rows,
                                                                     dtype, additive):
    dtype = DTYPES[dtype]
    q, k, v, ignore = case(seed, B, h, L, S, d, p_masked, empty_rows, dtype)
    mask = torch.zeros(ignore.shape, dtype=dtype).masked_fill(ignore, NEG_INF) if additive else ignore
    want, want_w = reference(q, k, v, ignore)
    scores = q @ k.transpose(-2, -1) / math.sqrt(d)
    check(masked_softmax(scores, mask), want_w, dtype)
    out, weights = scaled_dot_product_attention(q, k, v, mask)
    check(out, want, dtype)
    check(weights, want_w, dtype)
    check(fused_attention(q, k, v, mask), want, dtype)
    # gradients, in float64
    q64, k64, v64 = leaves(q, k, v)
    mask64 = mask.double() if additive else mask
    (scaled_dot_product_attention(q64, k64, v64, mask64)[0].sum() + fused_attention(q64, k64, v64, mask64).sum()
     ).backward()
    finite_grads(q64, k64, v64)


def test_a_plain_softmax_gives_nan_on_the_same_rows():
    """What the package's functions avoid: without the convention the empty rows are NaN, forward and backward."""
    q, k, v, ignore = case(0, 1, 1, 3, 4, 2, 0.0, 0b010, torch.float64)
    v.requires_grad_()
    out = torch.softmax((q @ k.mT).masked_fill(ignore, NEG_INF), -1) @ v
    out.sum().backward()
    assert out[0, 0, 1].isnan().all() and not out[0, 0, [0, 2]].isnan().any()
    assert v.grad.isnan().all()  # the NaN weights of the empty row reach every value's gradient
    assert masked_softmax(torch.full((2, 3), NEG_INF)).isnan().all()  # no mask: the scores are torch.softmax's


# -------------------------------------------------------------------------------------------------------- tiled.py
@FAST
@given(**shapes(), additive=st.booleans(), block_size=st.integers(1, 4))
def test_tiled_attention_gives_zeros_on_empty_rows(seed, B, h, L, S, d, p_masked, empty_rows, dtype, additive,
                                                   block_size):
    dtype = DTYPES[dtype]
    q, k, v, ignore = case(seed, B, h, L, S, d, p_masked, empty_rows, dtype)
    allow = torch.zeros(ignore.shape, dtype=dtype).masked_fill(ignore, NEG_INF) if additive else ~ignore
    want, _ = reference(q, k, v, ignore)
    check(tiled_attention(q, k, v, allow, block_size=block_size), want, dtype)
    q64, k64, v64 = leaves(q, k, v)
    tiled_attention(q64, k64, v64, allow.double() if additive else allow, block_size=block_size).sum().backward()
    finite_grads(q64, k64, v64)


@FAST
@given(**shapes(), cuts=st.lists(st.integers(0, 6), max_size=3))
def test_merge_tile_over_any_cut_of_the_keys(seed, B, h, L, S, d, p_masked, empty_rows, dtype, cuts):
    """Tiles of any widths, empty tiles and tiles that empty a row included, folded with merge_tile."""
    dtype = DTYPES[dtype]
    q, k, v, ignore = case(seed, B, h, L, S, d, p_masked, empty_rows, dtype)
    bounds = [0, *sorted(min(c, S) for c in cuts), S]
    state = (q.new_full((B, h, L, 1), NEG_INF), q.new_zeros((B, h, L, 1)), q.new_zeros((B, h, L, d)))
    s = (q @ k.transpose(-2, -1) / math.sqrt(d)).masked_fill(ignore, NEG_INF)
    for a, b in zip(bounds[:-1], bounds[1:]):
        state = merge_tile(state, s[..., a:b], v[..., a:b, :])
    m, l, acc = state  # noqa: E741
    empty = ignore.all(-1, keepdim=True)
    assert torch.equal(m.isneginf(), empty) and (l[empty] == 0).all() and (acc * empty == 0).all()
    check(acc / l.masked_fill(l == 0, 1.0), reference(q, k, v, ignore)[0], dtype)


# ------------------------------------------------------------------------------------------------ serving/sinks.py
@FAST
@given(**shapes(), sink_kind=st.sampled_from(["none", "finite", "mixed"]))
def test_sink_attention_gives_zeros_on_empty_rows_with_and_without_sinks(seed, B, h, L, S, d, p_masked, empty_rows,
                                                                         dtype, sink_kind):
    dtype = DTYPES[dtype]
    q, k, v, ignore = case(seed, B, h, L, S, d, p_masked, empty_rows, dtype)
    sinks = torch.randn(h, generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    if sink_kind == "none":
        sinks[:] = NEG_INF
    elif sink_kind == "mixed":
        sinks[::2] = NEG_INF
    sinks = sinks.to(dtype)
    check(sink_attention(q, k, v, sinks, ignore), reference(q, k, v, ignore, sinks)[0], dtype)
    q64, k64, v64, s64 = leaves(q, k, v, sinks)
    sink_attention(q64, k64, v64, s64, ignore).sum().backward()
    finite_grads(q64, k64, v64, s64)


def test_sink_attention_without_sinks_is_the_masked_attention():
    """A sink of -inf is no sink: the package's attention, empty rows (0) included."""
    q, k, v, ignore = case(7, 2, 3, 4, 5, 4, 0.5, 0b0101, torch.float64)
    none = torch.full((3,), NEG_INF, dtype=torch.float64)
    assert_close(sink_attention(q, k, v, none, ignore), scaled_dot_product_attention(q, k, v, ignore)[0],
                 atol=1e-12, rtol=0)
    assert (sink_attention(q, k, v, none, ignore)[:, :, [0, 2]] == 0).all()


@FAST
@given(**shapes(), cuts=st.lists(st.integers(0, 6), max_size=3))
def test_partials_over_any_cut_merge_to_the_whole_and_empty_rows_to_zero(seed, B, h, L, S, d, p_masked, empty_rows,
                                                                          dtype, cuts):
    dtype = DTYPES[dtype]
    q, k, v, ignore = case(seed, B, h, L, S, d, p_masked, empty_rows, dtype)
    bounds = [0, *sorted(min(c, S) for c in cuts), S]
    parts = [partial_attention(q, k[..., a:b, :], v[..., a:b, :], ignore[..., a:b])
             for a, b in zip(bounds[:-1], bounds[1:])]
    for (out, lse), a, b in zip(parts, bounds[:-1], bounds[1:]):
        part_empty = ignore[..., a:b].all(-1, keepdim=True)  # (B, h, L, 1); every row of a part of no key
        assert not out.isnan().any() and (out * part_empty == 0).all() and torch.equal(lse.isneginf(), part_empty)
    out, lse = merge_partials(parts)
    check(out, reference(q, k, v, ignore)[0], dtype)
    scores = (q.double() @ k.double().transpose(-2, -1) / math.sqrt(d)).masked_fill(ignore, NEG_INF)
    want_lse = scores.logsumexp(-1, keepdim=True)  # -inf on an empty row
    assert torch.equal(lse.isneginf(), want_lse.isneginf())
    seen = ~want_lse.isneginf()
    assert_close(lse.double()[seen], want_lse[seen], atol=TOL[dtype], rtol=TOL[dtype])
    q64, k64, v64 = leaves(q, k, v)
    parts = [partial_attention(q64, k64[..., a:b, :], v64[..., a:b, :], ignore[..., a:b])
             for a, b in zip(bounds[:-1], bounds[1:])]
    merge_partials(parts)[0].sum().backward()
    finite_grads(q64, k64, v64)


def test_merge_partials_needs_a_part():
    with pytest.raises(ValueError, match="at least one"):
        merge_partials([])
    q = torch.randn(1, 1, 2, 3, dtype=torch.float64)
    none = q[:, :, :0]  # no key at all: out 0, lse -inf
    out, lse = merge_partials([partial_attention(q, none, none)])
    assert (out == 0).all() and lse.isneginf().all()


# ------------------------------------------------------------------------------------------------ the layers on top
def test_causal_layer_left_padding_empty_pad_rows_give_zeros_real_rows_their_own():
    """Left pads at positions 0, 1, 2 read only pads under the causal mask: empty rows, output 0 (o_proj has no
    bias); the real tokens give what the sentence gives alone."""
    torch.manual_seed(0)
    layer = CausalSelfAttention(16, 4, 2, window=3, dtype=torch.float64).eval()
    x = torch.randn(2, 7, 16, dtype=torch.float64)
    pads = torch.zeros(2, 7, dtype=torch.bool)
    pads[1, :3] = True
    with torch.no_grad():
        out = layer(x, key_padding_mask=pads)
        alone = layer(x[1:, 3:])
    assert not out.isnan().any() and (out[1, :3] == 0).all()
    assert_close(out[1, 3:], alone[0], atol=1e-12, rtol=0)  # RoPE: relative positions, the same scores


def test_multihead_attention_with_a_sentence_of_pads():
    torch.manual_seed(0)
    layer = MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    x = torch.randn(2, 4, 8, dtype=torch.float64, requires_grad=True)
    pads = torch.zeros(2, 4, dtype=torch.bool)
    pads[1] = True
    for need_weights in (False, True):
        out = layer(x, x, x, key_padding_mask=pads, need_weights=need_weights)[0]
        assert_close(out[1], layer.out_proj.bias.expand(4, 8), atol=1e-12, rtol=0)  # attention 0, then the bias
        out.sum().backward()
        assert x.grad.isfinite().all()


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_ring_attention_of_one_rank_with_an_empty_sentence(group_of_one):
    from attention_course.distributed import ring_attention

    q, k, v, _ = case(5, 2, 2, 6, 6, 4, 0.0, 0, torch.float64)
    pads = torch.zeros(2, 6, dtype=torch.bool)
    pads[0, ::2] = True
    pads[1] = True  # a sentence of pads: every row empty
    for causal in (False, True):
        ignore = pads[:, None, None, :].expand(2, 2, 6, 6)
        if causal:
            ignore = ignore | torch.ones(6, 6, dtype=torch.bool).triu(1)
        with torch.no_grad():
            out = ring_attention(q, k, v, key_padding_mask=pads, is_causal=causal)
        assert_close(out, reference(q, k, v, ignore)[0], atol=1e-12, rtol=0)
        assert (out[1] == 0).all()
