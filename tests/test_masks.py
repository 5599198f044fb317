"""Masks: the four conventions, their conversions, and merging a key padding mask with an attention mask."""
import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import (
    additive_to_ignore,
    allow_to_ignore,
    causal_mask,
    fully_masked_rows,
    ignore_to_additive,
    ignore_to_allow,
    ignore_to_keep,
    keep_to_ignore,
    merge_masks,
    padding_mask,
)

FAST = settings(max_examples=30, deadline=None)
INF = float("-inf")


def bool_masks(max_side=6):
    shapes = st.tuples(st.integers(1, max_side), st.integers(1, max_side))
    return shapes.flatmap(lambda s: st.lists(st.booleans(), min_size=s[0] * s[1], max_size=s[0] * s[1]).map(
        lambda v: torch.tensor(v, dtype=torch.bool).view(s)))


# --- padding_mask ---------------------------------------------------------------------------------------------

def test_padding_mask_marks_pad_positions():
    mask = padding_mask([3, 1, 0], max_len=4)
    assert mask.dtype == torch.bool
    assert mask.tolist() == [[False, False, False, True], [False, True, True, True], [True, True, True, True]]


def test_padding_mask_defaults_to_the_longest_and_accepts_tensors():
    assert padding_mask(torch.tensor([2, 3])).tolist() == [[False, False, True], [False, False, False]]
    assert padding_mask([], max_len=3).shape == (0, 3)
    assert padding_mask([1], device="cpu").device.type == "cpu"


@pytest.mark.parametrize("lengths, max_len, match", [
    ([2, -1], None, ">= 0"),
    ([2, 5], 4, "<= max_len=4"),
    ([[1, 2]], None, "1-D"),
    (torch.tensor([1.0, 2.0]), None, "1-D list or int tensor"),
])
def test_padding_mask_rejects_bad_lengths(lengths, max_len, match):
    with pytest.raises(ValueError, match=match):
        padding_mask(lengths, max_len)


# --- causal_mask ----------------------------------------------------------------------------------------------

def test_causal_mask_matches_torchs_square_mask():
    expected = torch.nn.Transformer.generate_square_subsequent_mask(5)  # float, -inf above the diagonal
    assert torch.equal(causal_mask(5), torch.isneginf(expected))


@pytest.mark.parametrize("L, S", [(3, 5), (5, 3), (4, 4), (1, 6)])
def test_causal_mask_follows_sdpa_is_causal_for_rectangles(L, S):
    q, k, v = torch.randn(L, 4), torch.randn(S, 4), torch.randn(S, 2)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    actual = F.scaled_dot_product_attention(q, k, v, attn_mask=ignore_to_allow(causal_mask(L, S)))
    torch.testing.assert_close(actual, expected)
    assert not causal_mask(L, S)[:, 0].any()  # query i may always attend key 0


# --- conversions ----------------------------------------------------------------------------------------------

@FAST
@given(bool_masks())
def test_conversions_round_trip(mask):
    assert torch.equal(allow_to_ignore(ignore_to_allow(mask)), mask)
    assert torch.equal(ignore_to_allow(mask), ~mask)
    assert torch.equal(keep_to_ignore(ignore_to_keep(mask)), mask)
    assert torch.equal(keep_to_ignore(ignore_to_keep(mask, torch.float32)), mask)
    assert torch.equal(additive_to_ignore(ignore_to_additive(mask)), mask)


def test_keep_and_additive_values():
    mask = torch.tensor([[False, True]])
    assert ignore_to_keep(mask).tolist() == [[1, 0]]
    additive = ignore_to_additive(mask, torch.float64)
    assert additive.dtype == torch.float64 and additive.tolist() == [[0.0, INF]]
    assert keep_to_ignore(torch.tensor([1, 0, 1])).tolist() == [False, True, False]


@pytest.mark.parametrize("fn", [ignore_to_allow, allow_to_ignore, ignore_to_keep, ignore_to_additive])
def test_bool_conversions_reject_float_masks(fn):
    with pytest.raises(TypeError, match="expects a bool mask, got dtype torch.float32.*keep_to_ignore"):
        fn(torch.zeros(2, 2))


def test_conversions_reject_non_tensors():
    with pytest.raises(TypeError, match="must be a torch.Tensor, got list"):
        ignore_to_allow([True, False])


def test_keep_to_ignore_rejects_bools_and_other_values():
    with pytest.raises(TypeError, match="got a bool mask.*allow_to_ignore"):
        keep_to_ignore(torch.tensor([True]))
    with pytest.raises(ValueError, match=r"only 0 \(masked\) and 1 \(keep\).*\[2"):
        keep_to_ignore(torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="only 0"):
        keep_to_ignore(torch.tensor([0.0, INF]))


def test_additive_to_ignore_refuses_what_a_bool_cannot_say():
    with pytest.raises(ValueError, match="-1e9 is not -inf"):
        additive_to_ignore(torch.tensor([0.0, -1e9]))
    with pytest.raises(TypeError, match="expects a float mask"):
        additive_to_ignore(torch.tensor([True]))


def test_fully_masked_rows():
    bool_mask = torch.tensor([[True, True], [False, True]])
    assert fully_masked_rows(bool_mask).tolist() == [[True], [False]]
    assert fully_masked_rows(ignore_to_additive(bool_mask)).tolist() == [[True], [False]]
    assert fully_masked_rows(torch.tensor([[-1e9, -1e9]])).tolist() == [[False]]  # finite is not blocked
    assert fully_masked_rows(bool_mask, dim=0).tolist() == [[False, True]]


# --- merge_masks ----------------------------------------------------------------------------------------------

def merge(kpm, attn, B=2, h=3, L=4, S=5, **kwargs):
    return merge_masks(kpm, attn, batch_size=B, num_heads=h, query_len=L, key_len=S, **kwargs)


def test_merge_nothing_is_none():
    assert merge(None, None) is None


def test_merge_key_padding_only():
    kpm = padding_mask([5, 2])
    merged = merge(kpm, None)
    assert merged.shape == (2, 3, 4, 5) and merged.dtype == torch.bool
    for b in range(2):
        assert torch.equal(merged[b], kpm[b].expand(3, 4, 5))
    assert merge(kpm, None, expand=False).shape == (2, 1, 1, 5)


def test_merge_2d_and_3d_attn_masks():
    attn2 = torch.rand(4, 5) > 0.5
    assert torch.equal(merge(None, attn2), attn2.expand(2, 3, 4, 5))
    attn3 = torch.rand(6, 4, 5) > 0.5  # (B*h, L, S), batch-major: row b*h + head
    merged = merge(None, attn3)
    for b in range(2):
        for head in range(3):
            assert torch.equal(merged[b, head], attn3[b * 3 + head])


def test_merge_bool_masks_with_or():
    kpm, attn = padding_mask([5, 3]), causal_mask(4, 5)
    merged = merge(kpm, attn)
    assert torch.equal(merged, (kpm[:, None, None, :] | attn).expand(2, 3, 4, 5))
    assert torch.equal(merge(kpm, None, is_causal=True), merged)
    assert torch.equal(merge(None, None, is_causal=True), attn.expand(2, 3, 4, 5))


def test_merge_float_with_bool_adds():
    kpm = padding_mask([5, 3])
    attn = torch.randn(4, 5, dtype=torch.float64)
    merged = merge(kpm, attn)
    assert merged.dtype == torch.float64
    assert torch.equal(merged, (ignore_to_additive(kpm, torch.float64)[:, None, None, :] + attn).expand(2, 3, 4, 5))
    float_kpm = ignore_to_additive(kpm, torch.float64)
    assert torch.equal(merge(float_kpm, attn), merged)


def test_merge_rejects_float_masks_of_two_dtypes():
    with pytest.raises(TypeError, match="different dtypes"):
        merge(torch.zeros(2, 5), torch.zeros(4, 5, dtype=torch.float64))


@pytest.mark.parametrize("kpm, match", [
    (torch.zeros(5, dtype=torch.bool), r"unsqueeze\(0\)"),
    (torch.zeros(4, 5, dtype=torch.bool), "looks like an attn_mask"),
    (torch.zeros(2, 4, 5, dtype=torch.bool), "looks like an attn_mask"),
    (torch.zeros(2, 4, dtype=torch.bool), r"one column per query \(L=4\).*\(S=5\)"),
    (torch.zeros(3, 5, dtype=torch.bool), r"must have shape \(B, S\) = \(2, 5\), got \(3, 5\)"),
])
def test_merge_rejects_bad_key_padding_masks(kpm, match):
    with pytest.raises(ValueError, match=match):
        merge(kpm, None)


@pytest.mark.parametrize("attn, match", [
    (torch.zeros(2, 5, dtype=torch.bool), r"looks like a key_padding_mask \(B, S\); pass it as key_padding_mask"),
    (torch.zeros(5, 4, dtype=torch.bool), r"transposed.*attn_mask\.T"),
    (torch.zeros(2, 4, dtype=torch.bool), r"per-sentence padding mask \(B, L\)"),
    (torch.zeros(2, 4, 5, dtype=torch.bool), r"repeat_interleave\(num_heads, dim=0\)"),
    (torch.zeros(2, 3, 4, 5, dtype=torch.bool), r"flatten\(0, 1\)"),
    (torch.zeros(1, 4, 5, dtype=torch.bool), r"attn_mask\[0\]"),
    (torch.zeros(3, 3, dtype=torch.bool), r"\(L, S\) = \(4, 5\) or \(B\*h, L, S\) = \(6, 4, 5\), got \(3, 3\)\.$"),
])
def test_merge_rejects_bad_attn_masks(attn, match):
    with pytest.raises(ValueError, match=match):
        merge(None, attn)


def test_padding_mask_as_attn_mask_is_undetectable_when_B_equals_L():
    """The documented limitation: a (B, S) mask with B == L has the shape of (L, S) and is taken as one."""
    kpm = padding_mask([5, 3, 2, 1])
    assert merge(None, kpm, B=4, L=4).shape == (4, 3, 4, 5)
    with pytest.raises(ValueError, match="looks like a key_padding_mask"):
        merge(None, kpm, B=4, L=6)


def test_merge_rejects_int_masks_with_the_fix():
    with pytest.raises(TypeError, match=r"key_padding_mask has dtype torch.int64.*keep_to_ignore\(key_padding_mask\)"):
        merge(torch.ones(2, 5, dtype=torch.long), None)


def test_merge_checks_float_dtype_and_device():
    with pytest.raises(TypeError, match=r"attn_mask is a float mask of dtype torch.float32 but query is torch.float64"
                                        r".*attn_mask\.to\(query\.dtype\)"):
        merge(None, torch.zeros(4, 5), dtype=torch.float64)
    meta = torch.zeros(2, 5, dtype=torch.bool, device="meta")
    with pytest.raises(ValueError, match="key_padding_mask is on meta but query is on cpu"):
        merge(meta, None, device=torch.device("cpu"))


def test_B_by_L_mask_where_L_by_S_is_expected_raises_even_when_B_equals_L():
    """Cross-attention (S != L): a (B, L) padding mask over the queries cannot pass for (L, S), even if B == L."""
    with pytest.raises(ValueError, match=r"per-sentence padding mask \(B, L\)"):
        merge(None, padding_mask([4, 3, 2, 1]), B=4, L=4, S=6)
