"""tiled_attention: parity with F.scaled_dot_product_attention for every kind of mask, empty rows, gradients,
memory, validation; and the attention-core section of the benchmark."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

from attention_course import bench, causal_mask, fused_attention, padding_mask, tiled_attention

EXACT = dict(atol=1e-10, rtol=0)


def qkv(B=2, h=3, L=37, S=None, d=8, dv=None, seed=0):
    gen = torch.Generator().manual_seed(seed)
    S, dv = S or L, dv or d
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    return randn(B, h, L, d), randn(B, h, S, d), randn(B, h, S, dv)


@pytest.mark.parametrize("block_size", [1, 5, 16, 37, 64])
@pytest.mark.parametrize("is_causal", [False, True])
def test_equals_sdpa_without_a_mask_for_any_block_size(block_size, is_causal):
    q, k, v = qkv()
    want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
    assert_close(tiled_attention(q, k, v, is_causal=is_causal, block_size=block_size), want, **EXACT)


def test_cross_attention_with_other_lengths_and_value_size():
    q, k, v = qkv(L=23, S=41, dv=5)  # 23 and 41 are not multiples of 8
    for is_causal in (False, True):  # causal with S != L: the diagonal starts at the top left, as in SDPA
        want = F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)
        got = tiled_attention(q, k, v, is_causal=is_causal, block_size=8)
        assert got.shape == (2, 3, 23, 5)
        assert_close(got, want, **EXACT)


def test_bool_masks_mean_may_attend_like_sdpa():
    q, k, v = qkv(L=21, S=30)
    gen = torch.Generator().manual_seed(1)
    allow_padding = ~padding_mask([30, 11], 30)[:, None, None, :]  # (B, 1, 1, S), True = may attend
    per_head = torch.rand(2, 3, 21, 30, generator=gen) < 0.6  # (B, h, L, S)
    per_head[..., 0] = True
    one_for_all = ~causal_mask(21, 30)  # (L, S)
    only_keys = torch.rand(1, 30, generator=gen) < 0.8  # (1, S): the same keys for every query
    only_keys[0, 0] = True
    for allow in (allow_padding, per_head, one_for_all, only_keys):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=allow)
        assert_close(tiled_attention(q, k, v, allow, block_size=8), want, **EXACT)
    assert_close(tiled_attention(q, k, v, only_keys[0], block_size=8), tiled_attention(q, k, v, only_keys), **EXACT)
    # handed the opposite polarity, it computes something else (as SDPA would): the convention matters
    wrong = tiled_attention(q, k, v, ~one_for_all | torch.eye(21, 30, dtype=torch.bool), block_size=8)
    assert (wrong - F.scaled_dot_product_attention(q, k, v, attn_mask=one_for_all)).abs().max() > 0.1


def test_float_masks_are_added():
    q, k, v = qkv(L=19, S=19)
    gen = torch.Generator().manual_seed(2)
    bias = torch.randn(19, 19, generator=gen, dtype=torch.float64)  # e.g. a relative-position bias
    additive = torch.zeros(2, 1, 1, 19, dtype=torch.float64)
    additive[1, ..., 12:] = float("-inf")
    for mask in (bias, additive, bias + additive):
        want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert_close(tiled_attention(q, k, v, mask, block_size=6), want, **EXACT)


def test_very_negative_finite_scores_are_not_lost():
    """A row whose scores are all -1e4 is an ordinary row (uniform weights), not an empty one."""
    q, k, v = qkv(B=1, h=1, L=4, S=6)
    mask = torch.full((4, 6), -1e4, dtype=torch.float64)
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert_close(tiled_attention(q, k, v, mask, block_size=2), want, **EXACT)


def test_fully_masked_rows_give_zeros_and_finite_gradients():
    q, k, v = qkv(L=9, S=9)
    allow = ~(padding_mask([9, 4], 9)[:, None, :] | causal_mask(9))[:, None]  # (B, 1, L, S)
    allow[1, :, 2] = False  # sentence 1, query 2: no key at all
    inputs = [t.clone().requires_grad_() for t in (q, k, v)]
    out = tiled_attention(*inputs, allow, block_size=4)
    assert torch.isfinite(out).all()
    assert (out[1, :, 2] == 0).all()
    # everywhere else it is SDPA; the package's fused path gives the empty row zeros too
    assert_close(out, fused_attention(q, k, v, ~allow), **EXACT)
    out.pow(2).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in inputs)


@pytest.mark.parametrize("is_causal", [False, True])
def test_gradients_equal_sdpa(is_causal):
    q, k, v = qkv(B=1, h=2, L=13, S=13, dv=3)
    pulls = torch.randn(1, 2, 13, 3, generator=torch.Generator().manual_seed(3), dtype=torch.float64)

    def grads(attention):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        (pulls * attention(*inputs)).sum().backward()
        return [t.grad for t in inputs]

    want = grads(lambda *t: F.scaled_dot_product_attention(*t, is_causal=is_causal))
    got = grads(lambda *t: tiled_attention(*t, is_causal=is_causal, block_size=4))
    for g, w in zip(got, want):
        assert_close(g, w, **EXACT)


def test_gradcheck():
    q, k, v = (t[:, :1, :6, :3].clone().requires_grad_() for t in qkv())
    assert torch.autograd.gradcheck(lambda *t: tiled_attention(*t, is_causal=True, block_size=4), (q, k, v))


def test_three_dimensional_inputs_and_scale():
    q, k, v = (t[0] for t in qkv())  # (h, L, d) as a batch of 3
    want = F.scaled_dot_product_attention(q, k, v, scale=0.3)
    assert_close(tiled_attention(q, k, v, scale=0.3, block_size=10), want, **EXACT)


@settings(max_examples=40, deadline=None)
@given(
    L=st.integers(1, 20), S=st.integers(1, 20), block_size=st.integers(1, 24), is_causal=st.booleans(),
    with_mask=st.booleans(), seed=st.integers(0, 2**16),
)
def test_any_sizes_and_blocks_equal_sdpa(L, S, block_size, is_causal, with_mask, seed):
    q, k, v = qkv(B=1, h=2, L=L, S=S, d=4, seed=seed)
    mask = None
    if with_mask and not is_causal:
        mask = torch.rand(1, 1, L, S, generator=torch.Generator().manual_seed(seed)) < 0.7
        mask[..., 0] = True  # SDPA's own empty rows are NaN on some paths: leave none
    want = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=is_causal)
    assert_close(tiled_attention(q, k, v, mask, is_causal, block_size), want, **EXACT)


def test_memory_holds_tiles_not_the_score_matrix():
    """Counted allocations, not time: the explicit version holds (B, h, L, S) scores, the tiled one does not."""
    B, h, L, d = 1, 4, 1024, 16
    q, k, v = (torch.randn(B, h, L, d) for _ in range(3))
    scores_bytes = B * h * L * L * 4
    with torch.no_grad():
        explicit = bench.peak_memory(lambda: bench.explicit_attention(q, k, v))
        tiled = bench.peak_memory(lambda: tiled_attention(q, k, v, block_size=64))
    assert explicit >= scores_bytes
    assert tiled < scores_bytes / 10


@pytest.mark.parametrize(
    "kwargs, error, words",
    [
        (dict(attn_mask=torch.ones(5, 5, dtype=torch.long)), TypeError, "True = MAY attend"),
        (dict(attn_mask=torch.zeros(5, 5, dtype=torch.float32)), TypeError, "attn_mask.to(q.dtype)"),
        (dict(attn_mask=torch.ones(2, 5, dtype=torch.bool)), ValueError, "attn_mask[:, None, None, :]"),
        (dict(attn_mask=torch.ones(5, 5, dtype=torch.bool), is_causal=True), ValueError, "either attn_mask"),
        (dict(block_size=0), ValueError, "block_size must be a positive int"),
        (dict(attn_mask="causal"), TypeError, "torch.Tensor"),
    ],
)
def test_bad_input_is_explained(kwargs, error, words):
    q, k, v = qkv(B=1, h=1, L=5)
    with pytest.raises(error) as info:
        tiled_attention(q, k, v, **kwargs)
    assert words in str(info.value)


def test_mismatched_qkv_are_explained():
    q, k, v = qkv(B=1, h=1, L=5)
    with pytest.raises(ValueError, match="same feature size d"):
        tiled_attention(q, k[..., :3], v)


# ------------------------------------------------------------------------------------ the benchmark's core section
def test_peak_memory_counts_what_a_call_allocates():
    block = 1 << 20  # 1 MiB
    peak = bench.peak_memory(lambda: (torch.empty(block, dtype=torch.uint8), torch.empty(block, dtype=torch.uint8)))
    assert 2 * block <= peak < 2 * block + 4096
    assert bench.peak_memory(lambda: None) == 0


@pytest.mark.slow  # times every implementation of the core (seconds): make test runs it
def test_attention_core_checks_parity_and_reports_targets():
    report, results = bench.attention_core(1, 2, 96, 8, block_size=32, repeats=1, masks=("none",), flex=False,
                                          targets=True)
    text = " ".join(report.split())  # the report's long lines are wrapped
    assert "parity with F.scaled_dot_product_attention checked before timing: ok" in text
    assert "targets, no mask: tiled peak memory" in text and "GFLOP/s" in text
    assert set(results) == {("none", name) for name in bench.CORE_NAMES}
    tiled, sdpa = results["none", "tiled"], results["none", bench.CORE_NAMES[0]]
    assert tiled["diff"] < 1e-4 and tiled["peak"] > 0 and 0 < tiled["fraction"]
    assert tiled["ratio"] == tiled["seconds"] / sdpa["seconds"]  # the ratio of the two medians the table shows
    assert max(len(line) for line in report.splitlines()) <= 79  # fits a page's column


def test_ratios_are_ratios_of_the_medians_shown():
    """A median of per-repeat ratios can disagree with the two medians beside it; the ratio of the medians cannot."""
    medians, ratios = bench._medians_and_ratios([[1.0, 2.0, 3.0], [5.0, 2.0, 9.0]])
    assert medians == [2.0, 5.0] and ratios == [1.0, 2.5]  # the median of the per-repeat 5, 1, 3 would be 3


def test_core_parity_catches_a_wrong_implementation():
    q, k, v = qkv(B=1, h=1, L=6)
    right = lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True)  # noqa: E731
    no_scale = lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v  # noqa: E731
    with pytest.raises(AssertionError, match="forgot the scale: output"):
        bench.check_core_parity([right, no_scale], ("SDPA", "forgot the scale"), q, k, v, grads=True)


@pytest.mark.parametrize("value", [0.5, 1.0, 99.999, 1234.5, 12345.6, 1.5e6, 3e12])
def test_a_table_cell_keeps_its_width_whatever_is_measured(value):
    """A row of the bench's tables must fit the page's column on any machine: a number too wide for its format
    (a ratio of 12000 on a loaded machine) switches to a shorter one, never widens the row."""
    for width, formats in ((7, (".2f", ".0f")), (8, (".1f", ".0f")), (6, (".0%", ".0e")), (9, (".1f", ".0f"))):
        cell = bench._fit(value, width, *formats)
        assert len(cell) == width and cell[0] == " ", (cell, width)
