"""Chapter 13's Triton kernels (attention_course/kernels), run in Triton's interpreter on the CPU: forward and backward
against F.scaled_dot_product_attention on every shape class, gradcheck in float64, the empty row, the tiles never
read (padding, and the tiles above the diagonal), the tile counts, validation and the message without Triton."""
import math
import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.testing import assert_close

pytest.importorskip("triton", reason="chapter 13's kernels need Triton (pip install -e '.[kernels]', Linux)")
from attention_course.kernels import MISSING, causal_tile_counts, flash_attention, interpreted  # noqa: E402

pytestmark = pytest.mark.slow  # Triton's interpreter: seconds a file, left to `make test`

TIGHT = dict(atol=5e-6, rtol=1e-5)  # float32: the kernel adds in another order than SDPA


def qkv(B=2, h=2, L=37, S=None, d=32, dtype=torch.float32, seed=0):
    gen = torch.Generator().manual_seed(seed)
    S = L if S is None else S
    return [torch.randn(B, h, n, d, generator=gen, dtype=dtype).requires_grad_() for n in (L, S, S)]


def reference(q, k, v, causal=False, lengths=None):
    """SDPA with the same keys visible; a row that sees no key is 0 (SDPA gives NaN there)."""
    allow = None
    if lengths is not None:
        allow = (torch.arange(k.shape[2]) < lengths[:, None])[:, None, None, :]  # (B, 1, 1, S)
        if causal:
            allow = allow & torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril()
            causal = False
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow, is_causal=causal)
    return out if lengths is None else torch.where((lengths > 0)[:, None, None, None], out, 0.0)


def both(q, k, v, causal=False, lengths=None, **blocks):
    """(kernel's output and gradients, SDPA's), for one random upstream gradient."""
    got = flash_attention(q, k, v, causal, lengths, **blocks)
    want = reference(q, k, v, causal, lengths)
    grad = torch.randn_like(got)
    return ((got, *torch.autograd.grad(got, (q, k, v), grad)),
            (want, *torch.autograd.grad(want, (q, k, v), grad)))


SHAPES = {  # name: (B, h, L, S, d, causal, lengths)
    "square, L a multiple of the tiles": (2, 2, 64, 64, 64, False, None),
    "ragged L": (2, 2, 100, 100, 64, False, None),
    "S != L": (1, 2, 37, 83, 64, False, None),
    "S < L": (1, 1, 90, 21, 32, False, None),
    "causal": (2, 2, 100, 100, 64, True, None),
    "causal, S != L (top-left diagonal)": (1, 2, 50, 77, 32, True, None),
    "causal, S < L": (1, 1, 70, 30, 32, True, None),
    "key padding": (3, 2, 45, 45, 32, False, [45, 7, 30]),
    "padding and causal": (3, 1, 45, 45, 32, True, [45, 7, 30]),
    "d = 128": (1, 1, 40, 70, 128, False, None),
    "d not a power of two": (1, 2, 33, 33, 40, True, None),
}


@pytest.mark.parametrize("name", SHAPES)
def test_forward_and_gradients_equal_sdpa(name):
    B, h, L, S, d, causal, lengths = SHAPES[name]
    lengths = None if lengths is None else torch.tensor(lengths)
    got, want = both(*qkv(B, h, L, S, d), causal, lengths)
    for what, a, b in zip(("O", "dQ", "dK", "dV"), got, want):
        assert_close(a, b, **TIGHT, msg=lambda m: f"{name}: {what}: {m}")


@pytest.mark.parametrize("blocks", [dict(block_m=16, block_n=16), dict(block_m=32, block_n=64),
                                    dict(block_m=128, block_n=16)])
def test_the_tiles_change_nothing_but_the_order_of_the_sums(blocks):
    for causal in (False, True):
        got, want = both(*qkv(1, 1, 75, 75, 16), causal, **blocks)
        for a, b in zip(got, want):
            assert_close(a, b, **TIGHT)


@settings(max_examples=12, deadline=None)
@given(L=st.integers(1, 70), S=st.integers(1, 70), d=st.sampled_from([16, 24, 64]), causal=st.booleans(),
       data=st.data())
def test_any_shape_any_lengths(L, S, d, causal, data):
    lengths = data.draw(st.none() | st.lists(st.integers(0, S), min_size=2, max_size=2).map(torch.tensor))
    got, want = both(*qkv(2, 1, L, S, d, seed=L * 71 + S), causal, lengths, block_m=16, block_n=16)
    for a, b in zip(got, want):
        assert_close(a, b, **TIGHT)


def test_gradcheck_in_float64():
    q, k, v = qkv(1, 2, 21, 19, 16, dtype=torch.float64)
    for causal, lengths in ((False, None), (True, None), (False, torch.tensor([11]))):
        assert torch.autograd.gradcheck(
            lambda q, k, v: flash_attention(q, k, v, causal, lengths, block_m=16, block_n=16), (q, k, v),
            fast_mode=True)


def test_half_precision_within_its_tolerance():
    halves = ((torch.float16, 2e-3), (torch.bfloat16, 1.6e-2)) if not interpreted() else ((torch.float16, 2e-3),)
    for dtype, tol in halves:
        q, k, v = (x.detach().to(dtype) for x in qkv(1, 2, 50, 50, 64))
        got = flash_attention(q, k, v, True)
        want = reference(*(x.double() for x in (q, k, v)), True)
        assert got.dtype == dtype
        assert_close(got.double(), want, atol=tol, rtol=0)


def test_an_empty_row_is_zero_with_zero_gradients():
    q, k, v = qkv(2, 1, 20, 20, 16)
    lengths = torch.tensor([0, 20])
    out = flash_attention(q, k, v, lengths=lengths)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and out.isfinite().all()
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert not dq[0].any() and not dk[0].any() and not dv[0].any() and dq[1].any()


@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # NumPy, on the planted NaN
def test_padded_keys_are_never_read():
    """NaN in every padded key and value: a kernel that loaded one (or let a masked 0 multiply it) would return NaN."""
    q, k, v = qkv(2, 2, 40, 70, 32)
    lengths = torch.tensor([33, 64])
    k2, v2 = (x.detach().clone() for x in (k, v))
    for b, n in enumerate(lengths.tolist()):
        k2[b, :, n:] = v2[b, :, n:] = float("nan")
    k2.requires_grad_(), v2.requires_grad_()
    got = flash_attention(q, k2, v2, lengths=lengths)
    want = reference(q, k, v, lengths=lengths)
    grad = torch.randn_like(got)
    got, want = (got, *torch.autograd.grad(got, (q, k2, v2), grad)), (want, *torch.autograd.grad(want, (q, k, v), grad))
    for b, n in enumerate(lengths.tolist()):
        for what, x, y in zip(("O", "dQ", "dK", "dV"), got, want):
            x, y = x[b], y[b]
            if what in ("dK", "dV"):
                assert not x[:, n:].any(), f"{what} of a padded key"
                x, y = x[:, :n], y[:, :n]
            assert_close(x, y, **TIGHT)


@pytest.mark.parametrize("block_m, block_n", [(32, 32), (64, 32), (32, 64)])
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # NumPy, on the planted NaN
def test_no_program_loads_a_tile_above_its_diagonal(block_m, block_n):
    """Causal, L = S = 128: for each query tile i, NaN in every key from (i + 1) block_m on (rounded up to a key tile).
    The programs of query tiles 0..i see none of them; one that loaded a tile past its diagonal would return NaN in
    its rows (a masked NaN value still meets a probability of 0 in tl.dot)."""
    q, k, v = (x.detach() for x in qkv(1, 2, 128, 128, 16))
    want = reference(q, k, v, True)
    for i in range(128 // block_m):
        first = -(-(i + 1) * block_m // block_n) * block_n  # the first key tile no query of tiles 0..i may see
        k2, v2 = k.clone(), v.clone()
        k2[..., first:, :] = v2[..., first:, :] = float("nan")
        out = flash_attention(q, k2, v2, True, block_m=block_m, block_n=block_n)[..., :(i + 1) * block_m, :]
        assert_close(out, want[..., :(i + 1) * block_m, :], **TIGHT)


@pytest.mark.parametrize("L", [32, 64, 70])
@pytest.mark.filterwarnings("ignore:All-NaN slice:RuntimeWarning")  # NumPy, on the planted NaN
def test_no_tile_past_the_last_query_is_read(L):
    """Causal, S > L: no query sees a key at L or after (the diagonal starts at the top left). NaN from the first key
    tile past L on: a kernel that loaded it (its loop's end taken from the query tile, not the sequence) returns NaN."""
    q, k, v = (x.detach() for x in qkv(1, 1, L, L + 122, 16))
    first = -(-L // 32) * 32
    k, v = k.clone(), v.clone()
    k[..., first:, :] = v[..., first:, :] = float("nan")
    out = flash_attention(q, k, v, True, block_m=64, block_n=32)
    assert_close(out, reference(q, k[..., :L, :], v[..., :L, :], True), **TIGHT)
    dq = torch.autograd.grad(flash_attention(q.requires_grad_(), k, v, True, block_m=64, block_n=32).sum(), q)[0]
    assert dq.isfinite().all()


def test_the_causal_tile_count():
    """n(n+1)/2 of n^2 tiles loaded (n(n-1)/2 skipped) when L = S = n tiles of equal sides; in general, the tiles
    holding at least one pair (i, j) with j <= i."""
    for n in range(1, 9):
        assert causal_tile_counts(32 * n, 32) == (n * (n + 1) // 2, n * n)
    for L, S, bm, bn in ((100, 100, 64, 32), (70, 130, 16, 32), (130, 40, 32, 16), (5, 5, 16, 16)):
        tiles = {(i // bm, j // bn) for i in range(L) for j in range(min(i + 1, S))}
        assert causal_tile_counts(L, bm, bn, S) == (len(tiles), math.ceil(L / bm) * math.ceil(S / bn))


def test_no_query_or_no_key():
    q, k, v = qkv(1, 2, 0, 5, 16)
    assert flash_attention(q, k, v).shape == (1, 2, 0, 16)
    q, k, v = qkv(1, 2, 4, 0, 16)
    out = flash_attention(q, k, v)
    assert out.shape == (1, 2, 4, 16) and not out.any()


def test_any_layout_of_the_inputs():
    """Heads split from (B, L, h, d) by a transpose: not contiguous, the same numbers."""
    q, k, v = (x.detach().transpose(1, 2).contiguous().transpose(1, 2) for x in qkv(2, 3, 30, 30, 16))
    assert not q.is_contiguous()
    assert_close(flash_attention(q, k, v, True), reference(q, k, v, True), **TIGHT)


@pytest.mark.parametrize("call, error, words", [
    (lambda q, k, v: flash_attention(q[0], k[0], v[0]), ValueError, "4 dimensions (B, h, L, d)"),
    (lambda q, k, v: flash_attention(q, k[:, :1], v[:, :1]), ValueError, "same leading (batch, head)"),
    (lambda q, k, v: flash_attention(q, k, v[:, :, :5]), ValueError, "same number of keys S"),
    (lambda q, k, v: flash_attention(q, k[..., :8], v), ValueError, "same feature size"),
    (lambda q, k, v: flash_attention(q, k.double(), v), TypeError, "k.to(q.dtype)"),
    (lambda q, k, v: flash_attention(q.int(), k.int(), v.int()), TypeError, "floating-point"),
    (lambda q, k, v: flash_attention(q, k, v, lengths=torch.tensor([3.0, 4.0])), TypeError, "lengths.long()"),
    (lambda q, k, v: flash_attention(q, k, v, lengths=torch.tensor([3])), ValueError, "B=2"),
    (lambda q, k, v: flash_attention(q, k, v, lengths=torch.tensor([3, 10])), ValueError, "[0, S] = [0, 9]"),
    (lambda q, k, v: flash_attention(q, k, v, causal=1), TypeError, "True or False"),
    (lambda q, k, v: flash_attention(q, k, v, block_m=48), ValueError, "power of two"),
    (lambda q, k, v: flash_attention(q, k, v, block_n=8), ValueError, "at least 16"),
])
def test_bad_input_is_named(call, error, words):
    q, k, v = (x.detach() for x in qkv(2, 2, 6, 9, 16))
    with pytest.raises(error, match=None) as raised:
        call(q, k, v)
    assert words in str(raised.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's limits: a machine without a GPU")
def test_bfloat16_is_refused_by_the_interpreter_with_the_reason():
    """Triton's interpreter multiplies bfloat16 tiles as raw bits (answers near 1e10): refused, not computed."""
    assert interpreted()
    q = torch.zeros(1, 1, 4, 16, dtype=torch.bfloat16)
    with pytest.raises(TypeError, match="interpreter cannot multiply.*float16 or float32"):
        flash_attention(q, q, q)


def test_without_triton_the_message_says_what_to_do():
    code = ("import sys; sys.modules['triton'] = None\n"
            "import torch\nfrom attention_course.kernels import flash_attention\n"
            "x = torch.zeros(1, 1, 4, 16)\n"
            "try:\n    flash_attention(x, x, x)\nexcept ModuleNotFoundError as e:\n    print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == MISSING
