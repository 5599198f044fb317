"""Rotary positions: the layout of cos/sin, the relative-position theorem, the two conventions, float64 exactness."""
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from attention_course.rope import apply_rope, halves_from_interleaved, rope_cos_sin, rotate_half

FAST = settings(max_examples=25, deadline=None)
F64 = dict(dtype=torch.float64)


def rope_by_complex_numbers(x, positions, base=10000.0):
    """Meta's original Llama code: pairs (2i, 2i + 1) as complex numbers times e^(i m theta_i), in float64."""
    d = x.shape[-1]
    theta = base ** (-torch.arange(0, d, 2, **F64) / d)  # (d/2,)
    turn = torch.polar(torch.ones(len(positions), d // 2, **F64), positions[:, None].to(torch.float64) * theta)
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], d // 2, 2).contiguous())  # (..., L, d/2)
    return torch.view_as_real(z * turn).flatten(-2)


def test_cos_sin_layout_and_values():
    positions = torch.tensor([0, 1, 5])
    cos, sin = rope_cos_sin(positions, 8, base=100.0, dtype=torch.float64)
    assert cos.shape == sin.shape == (3, 8) and cos.dtype == torch.float64
    theta = 100.0 ** (-torch.arange(0, 8, 2, **F64) / 8)  # (4,): frequency i at features i and i + 4
    expected = positions[:, None].double() * theta
    torch.testing.assert_close(cos[:, :4], expected.cos(), atol=1e-15, rtol=0)
    torch.testing.assert_close(sin[:, 4:], expected.sin(), atol=1e-15, rtol=0)
    assert torch.equal(cos[:, :4], cos[:, 4:]) and torch.equal(cos[0], torch.ones(8, **F64))
    assert rope_cos_sin(torch.zeros(2, 3, dtype=torch.long), 4)[0].shape == (2, 3, 4)  # (B, L) positions


def test_rotate_half_is_a_quarter_turn_of_each_pair():
    x = torch.tensor([1.0, 2.0, 3.0, 4.0])
    assert rotate_half(x).tolist() == [-3.0, -4.0, 1.0, 2.0]
    assert torch.equal(rotate_half(rotate_half(x)), -x)


@FAST
@given(st.integers(0, 2**16), st.sampled_from([2, 4, 8, 16]), st.integers(0, 500), st.integers(0, 500),
       st.integers(-400, 400), st.booleans())
def test_score_depends_on_the_distance_only(seed, d, m, n, shift, interleaved):
    """<R(m) q, R(n) k> = <R(m + s) q, R(n + s) k> for every shift s: the score sees m - n only."""
    shift = max(shift, -min(m, n))  # positions stay >= 0
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 1, 1, d, generator=gen, **F64).unbind(0)  # (1, 1, d) each: B = L = 1

    def score(m, n):
        qm = apply_rope(q, torch.tensor([m]), interleaved=interleaved)
        kn = apply_rope(k, torch.tensor([n]), interleaved=interleaved)
        return (qm * kn).sum()

    torch.testing.assert_close(score(m + shift, n + shift), score(m, n), atol=1e-11, rtol=0)
    # and at equal positions the rotation drops out altogether: <R(m) q, R(m) k> = <q, k>
    torch.testing.assert_close(score(m, m), (q * k).sum(), atol=1e-11, rtol=0)


@FAST
@given(st.integers(0, 2**16), st.sampled_from([2, 4, 6, 32]), st.integers(1, 5))
def test_the_two_conventions_agree_up_to_the_permutation(seed, d, L):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, L, d, generator=gen, **F64)
    p = torch.randint(0, 1000, (L,), generator=gen)
    perm = halves_from_interleaved(d)
    assert sorted(perm.tolist()) == list(range(d))
    torch.testing.assert_close(apply_rope(x[..., perm], p), apply_rope(x, p, interleaved=True)[..., perm],
                               atol=1e-13, rtol=0)
    if d > 2:  # a permutation is needed: used as they are, the two conventions disagree
        assert not torch.allclose(apply_rope(x, p), apply_rope(x, p, interleaved=True))
    # the same theorem on weights: permuting W_q's and W_k's rows turns one model's scores into the other's
    Wq, Wk, tokens = (torch.randn(d, d, generator=gen, **F64) for _ in range(3))
    q, k = tokens @ Wq.T, tokens @ Wk.T  # (d tokens, d features)
    pos = torch.arange(d)
    ours = apply_rope(q[None, :, perm], pos) @ apply_rope(k[None, :, perm], pos).transpose(-2, -1)
    theirs = apply_rope(q[None], pos, interleaved=True) @ apply_rope(k[None], pos, interleaved=True).transpose(-2, -1)
    torch.testing.assert_close(ours, theirs, atol=1e-12, rtol=0)
    torch.testing.assert_close(q[:, perm], tokens @ Wq[perm].T)


def test_interleaved_is_multiplication_by_complex_numbers_in_float64():
    x = torch.randn(2, 3, 7, 16, **F64)
    p = torch.tensor([0, 1, 2, 100, 1000, 10_000, 123_456])
    torch.testing.assert_close(apply_rope(x, p, interleaved=True), rope_by_complex_numbers(x, p), atol=1e-12, rtol=0)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotations_keep_lengths_and_position_zero_is_the_identity(interleaved):
    x = torch.randn(2, 4, 6, 8, **F64)
    p = torch.arange(1000, 1006)
    pair_norms = lambda y: (y.unflatten(-1, (4, 2)) if interleaved else y.unflatten(-1, (2, 4)).transpose(-2, -1))\
        .pow(2).sum(-1)  # noqa: E731
    torch.testing.assert_close(pair_norms(apply_rope(x, p, interleaved=interleaved)), pair_norms(x),
                               atol=1e-13, rtol=0)
    assert torch.equal(apply_rope(x, torch.zeros(6, dtype=torch.long), interleaved=interleaved), x)


def test_positions_per_sentence_and_three_dimensional_inputs():
    x = torch.randn(2, 3, 4, 8, **F64)
    p = torch.tensor([[0, 1, 2, 3], [5, 6, 7, 8]])
    out = apply_rope(x, p)
    torch.testing.assert_close(out[1], apply_rope(x[1:], p[1])[0], atol=0, rtol=0)
    torch.testing.assert_close(apply_rope(x[:, 0], p), out[:, 0], atol=0, rtol=0)  # (B, L, d)


def test_dtype_follows_the_input_and_angles_in_float32_are_less_exact():
    x = torch.randn(1, 1, 1, 64, **F64)
    p = torch.tensor([4095])
    exact, rough = apply_rope(x, p), apply_rope(x, p, angle_dtype=torch.float32)
    assert exact.dtype == rough.dtype == torch.float64
    perm = halves_from_interleaved(64)
    by_complex = rope_by_complex_numbers(x[..., torch.argsort(perm)], p)[..., perm]  # halves, via the permutation
    torch.testing.assert_close(exact, by_complex, atol=1e-12, rtol=0)
    assert 1e-6 < (exact - rough).abs().max() < 1e-2  # float32 angles at position 4095: off by ~1e-4 radians
    assert apply_rope(x.float(), p).dtype == torch.float32


@pytest.mark.parametrize("call, error, match", [
    (lambda: apply_rope(torch.zeros(1, 2, 3, 5), torch.arange(3)), ValueError, "must be even, got 5"),
    (lambda: apply_rope(torch.zeros(1, 2, 3, 4), torch.arange(4)), ValueError, "one position per token: L=3, got 4"),
    (lambda: apply_rope(torch.zeros(1, 2, 3, 4), torch.arange(3.0)), TypeError, "integer token positions"),
    (lambda: apply_rope(torch.zeros(2, 2, 3, 4), torch.zeros(3, 3, dtype=torch.long)), ValueError,
     "one row per sentence"),
    (lambda: apply_rope(torch.zeros(3, 4), torch.arange(3)), ValueError, r"\(B, h, L, d\) or \(B, L, d\)"),
    (lambda: apply_rope(torch.zeros(1, 3, 4), torch.zeros(1, 1, 3, dtype=torch.long)), ValueError, r"\(L,\)"),
    (lambda: apply_rope(torch.zeros(1, 3, 4, dtype=torch.long), torch.arange(3)), TypeError, "floating-point"),
    (lambda: rope_cos_sin(torch.arange(3), 4, dtype=torch.long), TypeError, "floating-point dtype"),
    (lambda: halves_from_interleaved(7), ValueError, "must be even"),
])
def test_validation_names_the_fix(call, error, match):
    with pytest.raises(error, match=match):
        call()
