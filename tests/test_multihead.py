"""Our MultiheadAttention against torch.nn.MultiheadAttention(batch_first=True), number for number."""
import warnings

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from attention_course import MultiheadAttention, causal_mask, ignore_to_additive, padding_mask
from conftest import make_pair

f64 = torch.float64
FAST = settings(max_examples=40, deadline=None)
TIGHT = dict(atol=1e-10, rtol=1e-10)  # float64


def random_masks(kpm_kind, attn_kind, B, h, L, S, g):
    """Random key padding and attention masks of the given kinds, in which key `anchor` stays open to every
    query, so that no row is fully masked (torch gives NaN there; that case is tested on its own)."""
    anchor = 0 if attn_kind == "causal" else int(torch.randint(S, (1,), generator=g))
    kpm = attn = None
    if kpm_kind is not None:
        kpm = torch.rand(B, S, generator=g) > 0.5
        kpm[:, anchor] = False
    if attn_kind == "causal":
        attn = causal_mask(L, S)
    elif attn_kind is not None:
        shape = (L, S) if attn_kind.endswith("2d") else (B * h, L, S)
        attn = torch.rand(shape, generator=g) > 0.6
        attn[..., anchor] = False
        if attn_kind.startswith("float"):  # additive: -inf where blocked, any finite value elsewhere
            attn = torch.randn(shape, generator=g, dtype=f64).masked_fill(attn, float("-inf"))
    if kpm_kind == "float":
        kpm = ignore_to_additive(kpm, f64) + torch.randn(B, S, generator=g, dtype=f64)
    return kpm, attn


@st.composite
def cases(draw):
    h, d, B, L = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 5))
    S = draw(st.sampled_from([L, draw(st.integers(1, 5))]))
    return dict(
        h=h, D=h * d, B=B, L=L, S=S,
        self_attention=S == L and draw(st.booleans()),
        key_is_value=draw(st.booleans()),
        kpm_kind=draw(st.sampled_from([None, "bool", "float"])),
        attn_kind=draw(st.sampled_from([None, "bool2d", "float2d", "bool3d", "float3d", "causal"])),
        need_weights=draw(st.booleans()),
        average=draw(st.booleans()),
        seed=draw(st.integers(0, 2**16)),
    )


def run(layer, inputs, self_attention, key_is_value, kwargs, grad_out, grad_weights):
    """Forward + backward of a random loss; returns output, weights and every gradient."""
    inputs = [x.clone().requires_grad_() for x in inputs]
    if self_attention:
        query = key = value = inputs[0]
    else:
        query, key, value = inputs[0], inputs[1], inputs[1] if key_is_value else inputs[2]
    layer.zero_grad()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch warns about a bool key_padding_mask with a float attn_mask
        out, weights = layer(query, key, value, **kwargs)
    loss = (out * grad_out).sum() + (0 if weights is None else (weights * grad_weights).sum())
    loss.backward()
    grads = [x.grad for x in inputs] + [p.grad for p in layer.parameters()]
    return out, weights, grads


@FAST
@given(cases())
def test_matches_torch_outputs_weights_and_gradients(case):
    B, L, S, D, h = case["B"], case["L"], case["S"], case["D"], case["h"]
    ref, ours = make_pair(D, h, seed=case["seed"])
    g = torch.Generator().manual_seed(case["seed"])
    inputs = [torch.randn(B, n, D, generator=g, dtype=f64) for n in (L, S, S)]
    kpm, attn = random_masks(case["kpm_kind"], case["attn_kind"], B, h, L, S, g)
    kwargs = dict(key_padding_mask=kpm, attn_mask=attn, need_weights=case["need_weights"],
                  average_attn_weights=case["average"])
    grad_out = torch.randn(B, L, D, generator=g, dtype=f64)
    grad_weights = torch.randn(B, h, L, S, generator=g, dtype=f64)
    grad_weights = grad_weights.mean(1) if case["average"] else grad_weights
    args = (inputs, case["self_attention"], case["key_is_value"], kwargs, grad_out, grad_weights)
    out, weights, grads = run(ours, *args)
    ref_out, ref_weights, ref_grads = run(ref, *args)
    torch.testing.assert_close(out, ref_out, **TIGHT)
    if case["need_weights"]:
        assert weights.shape == ((B, L, S) if case["average"] else (B, h, L, S))
        torch.testing.assert_close(weights, ref_weights, **TIGHT)
    else:
        assert weights is None and ref_weights is None
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, **TIGHT)


def test_both_paths_agree_in_float32(pair):
    ref, ours = pair(16, 4, dtype=torch.float32)
    x, y = torch.randn(3, 6, 16), torch.randn(3, 7, 16)
    for q, kv in ((x, x), (x, y)):
        kpm = padding_mask([kv.shape[1], 4, 1])
        explicit = ours(q, kv, kv, key_padding_mask=kpm)[0]
        fused = ours(q, kv, kv, key_padding_mask=kpm, need_weights=False)[0]
        torch.testing.assert_close(fused, explicit)
        torch.testing.assert_close(explicit, ref(q, kv, kv, key_padding_mask=kpm)[0])


@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("with_padding", [True, False])
def test_is_causal_builds_the_mask_torch_requires(pair, need_weights, with_padding):
    ref, ours = pair(8, 2)
    x = torch.randn(2, 5, 8, dtype=f64)
    kpm = padding_mask([5, 3]) if with_padding else None
    expected = ref(x, x, x, key_padding_mask=kpm, attn_mask=causal_mask(5), is_causal=True, need_weights=need_weights)
    for attn_mask in (None, causal_mask(5)):  # torch takes is_causal only as a hint and needs the mask
        actual = ours(x, x, x, key_padding_mask=kpm, attn_mask=attn_mask, is_causal=True, need_weights=need_weights)
        torch.testing.assert_close(actual[0], expected[0], **TIGHT)
        if need_weights:
            torch.testing.assert_close(actual[1], expected[1], **TIGHT)
    with pytest.raises(RuntimeError, match="Need attn_mask"):
        ref(x, x, x, is_causal=True)


def test_is_causal_with_cross_attention_uses_top_left_diagonal(pair):
    _, ours = pair(8, 2)
    x, y = torch.randn(2, 3, 8, dtype=f64), torch.randn(2, 5, 8, dtype=f64)
    _, weights = ours(x, y, y, is_causal=True)
    assert torch.equal(weights == 0, causal_mask(3, 5).expand(2, 3, 5))
    torch.testing.assert_close(ours(x, y, y, is_causal=True, need_weights=False)[0], ours(x, y, y, is_causal=True)[0])


@pytest.mark.parametrize("need_weights", [True, False])
def test_fully_masked_rows_give_zeros_and_finite_gradients_where_torch_gives_nan(pair, need_weights):
    ref, ours = pair(8, 2)
    x = torch.randn(2, 4, 8, dtype=f64, requires_grad=True)
    kpm = padding_mask([4, 0])  # sentence 1 is all padding: none of its queries has a key
    out, weights = ours(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
    torch.testing.assert_close(out[1], ours.out_proj.bias.expand(4, 8))  # zero attention, then out_proj
    if need_weights:
        assert torch.equal(weights[1], torch.zeros(4, 4, dtype=f64))
    out.sum().backward()  # the loss includes the empty rows
    assert torch.isfinite(x.grad).all()
    assert all(torch.isfinite(p.grad).all() for p in ours.parameters())
    ref_out, ref_weights = ref(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
    torch.testing.assert_close(out[0], ref_out[0], **TIGHT)
    if need_weights:  # torch's explicit path: NaN
        assert ref_out[1].isnan().all() and ref_weights[1].isnan().all()
    else:  # torch's SDPA path: zeros, like ours
        torch.testing.assert_close(out, ref_out, **TIGHT)


def test_fully_masked_row_from_left_padding_and_causal_mask(pair):
    """Left padding + a causal mask leaves the first queries with no key: the seeds' -inf fill gave NaN."""
    _, ours = pair(8, 2)
    x = torch.randn(2, 4, 8, dtype=f64, requires_grad=True)
    kpm = torch.tensor([[True, True, False, False], [False, False, False, False]])
    for need_weights in (True, False):
        out, _ = ours(x, x, x, key_padding_mask=kpm, is_causal=True, need_weights=need_weights)
        assert torch.isfinite(out).all()
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all()


@st.composite
def padded_batches(draw):
    h, d = draw(st.integers(1, 3)), draw(st.integers(1, 3))
    lengths = draw(st.lists(st.integers(1, 6), min_size=1, max_size=3))
    return h, h * d, lengths, draw(st.booleans()), draw(st.integers(0, 2**16))


@settings(max_examples=25, deadline=None)
@given(padded_batches())
def test_padded_batch_equals_each_sentence_alone(batch):
    h, D, lengths, is_causal, seed = batch
    _, ours = make_pair(D, h, seed=seed)
    S = max(lengths)
    x = torch.randn(len(lengths), S, D, dtype=f64, generator=torch.Generator().manual_seed(seed))
    kpm = padding_mask(lengths, S)
    for need_weights in (True, False):
        out, weights = ours(x, x, x, key_padding_mask=kpm, is_causal=is_causal, need_weights=need_weights)
        x_new_pads = x.masked_fill(kpm[..., None], 7.0)  # what sits in the pads must not matter
        out_new_pads, _ = ours(x_new_pads, x_new_pads, x_new_pads, key_padding_mask=kpm, is_causal=is_causal,
                               need_weights=need_weights)
        for b, n in enumerate(lengths):
            alone = x[b: b + 1, :n]
            out_alone, weights_alone = ours(alone, alone, alone, is_causal=is_causal, need_weights=need_weights)
            torch.testing.assert_close(out[b, :n], out_alone[0], **TIGHT)
            torch.testing.assert_close(out_new_pads[b, :n], out[b, :n], **TIGHT)
            if need_weights:
                torch.testing.assert_close(weights[b, :n, :n], weights_alone[0], **TIGHT)
                assert (weights[b, :, n:] == 0).all()


def test_large_logits_stay_finite(pair):
    ref, ours = pair(8, 2)
    x = (torch.randn(2, 5, 8, dtype=f64) * 1e3).requires_grad_()
    kpm = padding_mask([5, 3])
    for need_weights in (True, False):
        out, _ = ours(x, x, x, key_padding_mask=kpm, need_weights=need_weights)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, ref(x, x, x, key_padding_mask=kpm)[0], rtol=1e-9, atol=1e-6)
        (grad,) = torch.autograd.grad(out.sum(), x)
        assert torch.isfinite(grad).all()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_with_masks(dtype):
    """The seeds' -1e9 fill overflowed float16; -inf does not."""
    layer = MultiheadAttention(8, 2, dtype=dtype)
    x = torch.randn(2, 5, 8, dtype=dtype)
    kpm = padding_mask([5, 2])
    explicit, weights = layer(x, x, x, key_padding_mask=kpm, is_causal=True)
    fused, _ = layer(x, x, x, key_padding_mask=kpm, is_causal=True, need_weights=False)
    assert explicit.dtype == dtype and torch.isfinite(explicit).all() and torch.isfinite(weights).all()
    torch.testing.assert_close(fused, explicit, atol=2e-2, rtol=2e-2)


def test_dropout_matches_torch_with_the_same_seed_and_stops_in_eval(pair):
    ref, ours = pair(8, 2, dropout=0.3)
    x = torch.randn(2, 5, 8, dtype=f64)
    for need_weights in (True, False):
        torch.manual_seed(1)
        expected = ref(x, x, x, need_weights=need_weights)
        torch.manual_seed(1)
        actual = ours(x, x, x, need_weights=need_weights)
        torch.testing.assert_close(actual[0], expected[0], **TIGHT)
        if need_weights:
            torch.testing.assert_close(actual[1], expected[1], **TIGHT)
    ours.eval()
    first, weights = ours(x, x, x)
    torch.testing.assert_close(weights.sum(-1), torch.ones(2, 5, dtype=f64))
    assert torch.equal(ours(x, x, x)[0], first)


def test_same_seed_same_initial_weights_as_torch():
    for kwargs in (dict(), dict(bias=False), dict(kdim=3, vdim=5)):
        torch.manual_seed(0)
        ref = nn.MultiheadAttention(8, 2, batch_first=True, **kwargs)
        torch.manual_seed(0)
        ours = MultiheadAttention(8, 2, **kwargs)
        assert list(ours.state_dict()) == list(ref.state_dict())
        for name, value in ref.state_dict().items():
            assert torch.equal(ours.state_dict()[name], value), name
    assert (ours.in_proj_bias == 0).all() and (ours.out_proj.bias == 0).all()
    assert isinstance(ours.out_proj, nn.Linear)
    assert ours.in_proj_weight is None and ours.q_proj_weight.shape == (8, 8)


def test_state_dicts_load_both_ways(pair):
    ref, ours = pair(8, 2)
    fresh_torch = nn.MultiheadAttention(8, 2, batch_first=True, dtype=f64)
    fresh_torch.load_state_dict(ours.state_dict())
    fresh_ours = MultiheadAttention(8, 2, dtype=f64)
    fresh_ours.load_state_dict(ref.state_dict())
    x = torch.randn(2, 3, 8, dtype=f64)
    torch.testing.assert_close(fresh_torch(x, x, x)[0], ref(x, x, x)[0], **TIGHT)
    torch.testing.assert_close(fresh_ours(x, x, x)[0], ref(x, x, x)[0], **TIGHT)


@pytest.mark.parametrize("kwargs", [dict(bias=False), dict(kdim=3, vdim=5), dict(kdim=3, vdim=5, bias=False)])
def test_without_bias_and_with_other_key_and_value_sizes(pair, kwargs):
    ref, ours = pair(8, 2, **kwargs)
    x, k, v = torch.randn(2, 4, 8, dtype=f64), torch.randn(2, 6, ours.kdim, dtype=f64), torch.randn(2, 6, ours.vdim, dtype=f64)
    kpm = padding_mask([6, 2])
    for need_weights in (True, False):
        actual = ours(x, k, v, key_padding_mask=kpm, need_weights=need_weights)[0]
        torch.testing.assert_close(actual, ref(x, k, v, key_padding_mask=kpm)[0], **TIGHT)


def test_from_torch_and_to_torch_keep_dtype_device_and_mode(pair):
    ref, _ = pair(8, 2, dropout=0.1)
    ref.eval()
    ours = MultiheadAttention.from_torch(ref)
    assert ours.in_proj_weight.dtype == f64 and ours.in_proj_weight.device == ref.in_proj_weight.device
    assert not ours.training and ours.dropout == 0.1
    back = ours.to_torch()
    assert isinstance(back, nn.MultiheadAttention) and back.batch_first and not back.training
    for name, value in ref.state_dict().items():
        assert torch.equal(back.state_dict()[name], value)


def test_from_torch_rejects_what_it_cannot_copy():
    with pytest.raises(ValueError, match="add_bias_kv"):
        MultiheadAttention.from_torch(nn.MultiheadAttention(8, 2, batch_first=True, add_bias_kv=True))
    with pytest.raises(TypeError, match="expects a torch.nn.MultiheadAttention, got Linear"):
        MultiheadAttention.from_torch(nn.Linear(2, 2))


def test_trains_like_a_module():
    """The seeds made their layers inside forward: no parameters, fresh weights every call."""
    layer = MultiheadAttention(8, 2)
    assert len(list(layer.parameters())) == 4
    x = torch.randn(2, 3, 8)
    first = layer(x, x, x)[0]
    assert torch.equal(layer(x, x, x)[0], first)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    first.pow(2).sum().backward()
    optimizer.step()
    assert not torch.allclose(layer(x, x, x)[0], first)


def test_repr():
    assert "embed_dim=8, num_heads=2, dropout=0.0, batch_first=True" in repr(MultiheadAttention(8, 2))
    assert "kdim=3, vdim=8" in repr(MultiheadAttention(8, 2, kdim=3))
