"""Splitting D features into h heads of d, in the 4-D and the flat (batch-major) layouts."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course import head_dim, merge_heads, merge_heads_flat, split_heads, split_heads_flat

FAST = settings(max_examples=30, deadline=None)


@FAST
@given(st.integers(1, 3), st.integers(1, 5), st.integers(1, 4), st.integers(1, 4))
def test_split_and_merge_round_trip(B, L, h, d):
    x = torch.randn(B, L, h * d)
    heads = split_heads(x, h)
    assert heads.shape == (B, h, L, d)
    assert torch.equal(merge_heads(heads), x)
    flat = split_heads_flat(x, h)
    assert flat.shape == (B * h, L, d)
    assert torch.equal(merge_heads_flat(flat, h), x)


def test_head_i_owns_features_i_d_to_i_plus_1_d():
    x = torch.arange(2 * 3 * 6.0).view(2, 3, 6)
    heads = split_heads(x, 3)  # d = 2
    for i in range(3):
        assert torch.equal(heads[:, i], x[..., 2 * i: 2 * i + 2])


def test_flat_layout_is_batch_major_like_torch():
    B, L, h, d = 2, 3, 4, 5
    x = torch.randn(B, L, h * d)
    flat = split_heads_flat(x, h)
    for b in range(B):
        for head in range(h):
            assert torch.equal(flat[b * h + head], x[b, :, head * d: (head + 1) * d])
    # torch's multi_head_attention_forward: (L, B, D) -> (L, B*h, d) -> (B*h, L, d)
    torch_layout = x.transpose(0, 1).reshape(L, B * h, d).transpose(0, 1)
    assert torch.equal(flat, torch_layout)


def test_head_dim_lists_the_divisors():
    assert head_dim(12, 4) == 3
    with pytest.raises(ValueError, match="embed_dim 10 is not divisible by num_heads 4: choose num_heads among 1, 2, 5, 10"):
        head_dim(10, 4)
    with pytest.raises(ValueError, match="num_heads must be a positive int, got 0"):
        head_dim(8, 0)
    with pytest.raises(ValueError, match="embed_dim must be a positive int, got 8.0"):
        head_dim(8.0, 2)


def test_split_heads_rejects_bad_input():
    with pytest.raises(ValueError, match="not divisible"):
        split_heads(torch.randn(2, 3, 10), 4)
    with pytest.raises(ValueError, match=r"3 dimensions \(B, L, D\).*unsqueeze\(0\)"):
        split_heads(torch.randn(3, 8), 2)
    with pytest.raises(TypeError, match="torch.Tensor"):
        split_heads([[1.0]], 1)


def test_merge_heads_rejects_bad_input():
    with pytest.raises(ValueError, match=r"merge_heads_flat\(x, num_heads\)"):
        merge_heads(torch.randn(6, 3, 2))
    with pytest.raises(ValueError, match=r"4 dimensions \(B, h, L, d\)"):
        merge_heads(torch.randn(1, 2, 6, 3, 2))
    with pytest.raises(ValueError, match="not a multiple of num_heads=4"):
        merge_heads_flat(torch.randn(6, 3, 2), 4)
    with pytest.raises(ValueError, match=r"3 dimensions \(B\*h, L, d\)"):
        merge_heads_flat(torch.randn(6, 3), 2)
