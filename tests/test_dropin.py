"""The drop-in, wherever nn.MultiheadAttention goes: both layouts, nn.Transformer{Encoder,Decoder}Layer and
nn.TransformerEncoder in every mode, torch.compile(fullgraph=True) with 0 graph breaks, torch.export, vmap and
jit.trace, each against torch's numbers."""
import copy
import warnings

import pytest
import torch
from torch import nn

from attention_course import MultiheadAttention, causal_mask, ignore_to_additive, padding_mask
from conftest import make_pair

f64 = torch.float64
TIGHT = dict(atol=1e-10, rtol=1e-10)
# torch's inference fast path runs fused float32 kernels: agreement to float32 rounding, not to the last bit
FAST_PATH = dict(atol=1e-5, rtol=1e-5)
B, L, S, D, H = 3, 5, 6, 8, 2


def kpm_bool(lengths=(L, 3, 2), size=L):
    return padding_mask(list(lengths), size)


MASKS = {  # forward keyword arguments for self-attention over (B, L, D), every kind of mask
    "none": {},
    "key padding (bool)": dict(key_padding_mask=kpm_bool()),
    "key padding (float)": dict(key_padding_mask=ignore_to_additive(kpm_bool())),
    "attn_mask (bool)": dict(attn_mask=causal_mask(L)),
    "attn_mask (float)": dict(attn_mask=ignore_to_additive(causal_mask(L))),
    "attn_mask per head": dict(attn_mask=causal_mask(L).repeat(B * H, 1, 1)),
    "is_causal": dict(is_causal=True),
    "padding + causal": dict(key_padding_mask=kpm_bool(), attn_mask=causal_mask(L)),
    "fully masked row": dict(key_padding_mask=kpm_bool((L, 3, 0))),
}


# --- both layouts ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("need_weights", [True, False])
@pytest.mark.parametrize("cross", [False, True])
def test_sequence_first_layout_matches_torch(need_weights, cross):
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, H, dtype=f64)  # torch's default: batch_first=False, (L, B, D)
    with torch.no_grad():
        ref.in_proj_bias.uniform_(-1, 1)
        ref.out_proj.bias.uniform_(-1, 1)
    ours = MultiheadAttention.from_torch(ref)
    assert ours.batch_first is False
    query = torch.randn(L, B, D, dtype=f64, requires_grad=True)
    memory = torch.randn(S, B, D, dtype=f64, requires_grad=True) if cross else query
    kpm = kpm_bool((S, 4, 1), S) if cross else kpm_bool()
    results = []
    for layer in (ref, ours):
        out, weights = layer(query, memory, memory, key_padding_mask=kpm, need_weights=need_weights)
        grads = torch.autograd.grad(out.pow(2).sum(), [query, *layer.parameters()])
        results.append((out, weights, grads))
    (out, weights, grads), (ref_out, ref_weights, ref_grads) = results[1], results[0]
    assert out.shape == (L, B, D)
    torch.testing.assert_close(out, ref_out, **TIGHT)
    if need_weights:
        assert weights.shape == (B, L, memory.shape[0])  # the weights keep the batch first, as torch's do
        torch.testing.assert_close(weights, ref_weights, **TIGHT)
    for grad, ref_grad in zip(grads, ref_grads):
        torch.testing.assert_close(grad, ref_grad, **TIGHT)


def test_batch_first_is_the_default_and_round_trips():
    assert MultiheadAttention(D, H).batch_first is True  # the course's default; torch's is False
    for batch_first in (True, False):
        ref = nn.MultiheadAttention(D, H, batch_first=batch_first)
        assert MultiheadAttention.from_torch(ref).batch_first is batch_first
        assert MultiheadAttention(D, H, batch_first=batch_first).to_torch().batch_first is batch_first


def test_positional_arguments_are_torchs():
    # torch: (embed_dim, num_heads, dropout, bias, add_bias_kv, add_zero_attn, kdim, vdim, batch_first)
    layer = MultiheadAttention(D, H, 0.1, False, False, False, 3, 5, False)
    assert (layer.dropout, layer.in_proj_bias, layer.kdim, layer.vdim, layer.batch_first) == (0.1, None, 3, 5, False)
    with pytest.raises(ValueError, match="add_bias_kv=True and add_zero_attn=True are not supported"):
        MultiheadAttention(D, H, 0.0, True, True)
    with pytest.raises(TypeError, match="batch_first must be True or False, got 'yes'"):
        MultiheadAttention(D, H, batch_first="yes")


def test_sequence_first_messages_name_its_layout():
    layer = MultiheadAttention(D, H, batch_first=False)
    with pytest.raises(ValueError, match=r"query must have 3 dimensions \(L, B, D\).*\.unsqueeze\(1\)"):
        layer(torch.randn(L, D), torch.randn(L, D), torch.randn(L, D))
    with pytest.raises(ValueError, match=r"same number of sentences B \(dimension 1\).*batch_first=False"):
        layer(torch.randn(L, B, D), torch.randn(S, B + 1, D), torch.randn(S, B + 1, D))


# --- inside torch's Transformer layers --------------------------------------------------------------------------

def with_ours(ref, *names):
    """torch's Transformer layer ``ref`` with random biases, and a copy whose attention modules ``names`` are
    ours, holding the same weights."""
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.uniform_(-1, 1)
    ours = copy.deepcopy(ref)
    for name in names:
        setattr(ours, name, MultiheadAttention.from_torch(getattr(ref, name)))
    return ref, ours


def encoder_pair(batch_first):
    torch.manual_seed(0)
    return with_ours(nn.TransformerEncoderLayer(D, H, 16, dropout=0.0, batch_first=batch_first), "self_attn")


ENCODER_MASKS = {
    "none": {},
    "src_key_padding_mask": dict(src_key_padding_mask=kpm_bool()),
    "src_mask": dict(src_mask=ignore_to_additive(causal_mask(L))),
    "src_mask + is_causal": dict(src_mask=causal_mask(L), is_causal=True),
    "both": dict(src_mask=causal_mask(L), src_key_padding_mask=kpm_bool()),
}


@pytest.mark.parametrize("masks", ENCODER_MASKS, ids=str)
@pytest.mark.parametrize("mode", ["train", "eval", "eval, no_grad", "eval, inference_mode"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_encoder_layer_matches_torch_in_every_mode(masks, mode, batch_first):
    ref, ours = encoder_pair(batch_first)
    x = torch.randn(B, L, D) if batch_first else torch.randn(L, B, D)
    for layer in (ref, ours):
        layer.train(mode == "train")
    context = {"eval, no_grad": torch.no_grad, "eval, inference_mode": torch.inference_mode}.get(mode, torch.enable_grad)
    with context():
        expected, actual = ref(x, **ENCODER_MASKS[masks]), ours(x, **ENCODER_MASKS[masks])
    torch.testing.assert_close(actual, expected, **FAST_PATH)


class CountingTorchAttention(nn.MultiheadAttention):
    """torch's layer with a forward that counts its calls: what a learner writes to log or change attention."""

    calls = 0

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return super().forward(*args, **kwargs)


class CountingAttention(MultiheadAttention):
    calls = 0

    def forward(self, *args, **kwargs):
        type(self).calls += 1
        return super().forward(*args, **kwargs)


def test_the_inference_fast_path_skips_a_custom_forward_but_not_ours():
    """The choice made here: our layer declines torch's encoder fast path, so its forward is what computes."""
    ref, _ = encoder_pair(batch_first=True)
    x = torch.randn(B, L, D)
    calls = {}
    for cls in (CountingTorchAttention, CountingAttention):
        layer = copy.deepcopy(ref).eval()
        layer.self_attn = cls(D, H, batch_first=True)
        layer.self_attn.load_state_dict(ref.self_attn.state_dict())
        layer.self_attn.eval()
        cls.calls = 0
        with torch.no_grad():
            layer(x, src_key_padding_mask=kpm_bool())
        layer(x)  # with gradients: the slow path, for both
        calls[cls.__name__] = cls.calls
    assert calls == {"CountingTorchAttention": 1, "CountingAttention": 2}


def test_encoder_stack_with_nested_tensors_matches_torch():
    """nn.TransformerEncoder at inference packs a padded batch into a nested tensor for its layers."""
    layer, _ = encoder_pair(batch_first=True)
    ref = nn.TransformerEncoder(layer, 2, enable_nested_tensor=True).eval()
    ours = copy.deepcopy(ref)
    for block in ours.layers:
        block.self_attn = MultiheadAttention.from_torch(block.self_attn)
    x, kpm = torch.randn(B, L, D), kpm_bool()
    seen = []
    ours.layers[0].self_attn.register_forward_hook(lambda module, args, out: seen.append(args[0].is_nested))
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch: "nested tensors are in prototype stage"
        expected, actual = ref(x, src_key_padding_mask=kpm), ours(x, src_key_padding_mask=kpm)
    assert seen == [True]  # our forward ran, on the nested tensor
    torch.testing.assert_close(actual, expected, **FAST_PATH)
    for mode in ("train", "eval"):  # and with gradients, padded tensors throughout
        ref.train(mode == "train"), ours.train(mode == "train")
        torch.testing.assert_close(ours(x, src_key_padding_mask=kpm), ref(x, src_key_padding_mask=kpm), **FAST_PATH)


def test_nested_input_outside_an_encoder_is_refused_with_the_fix():
    layer = MultiheadAttention(D, H)
    nested = torch.nested.nested_tensor([torch.randn(3, D), torch.randn(2, D)])
    with pytest.raises(ValueError, match=r"nested-tensor input is supported for self-attention.*to_padded_tensor"):
        layer(nested, nested, nested, key_padding_mask=torch.zeros(2, 3, dtype=torch.bool))
    with pytest.raises(ValueError, match="needs batch_first=True"):
        MultiheadAttention(D, H, batch_first=False)(nested, nested, nested)


@pytest.mark.parametrize("mode", ["train", "eval", "eval, no_grad"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_decoder_layer_matches_torch(mode, batch_first):
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(D, H, 16, dropout=0.0, batch_first=batch_first)
    ref, ours = with_ours(layer, "self_attn", "multihead_attn")
    tgt, memory = torch.randn(B, L, D), torch.randn(B, S, D)
    if not batch_first:
        tgt, memory = tgt.transpose(0, 1), memory.transpose(0, 1)
    masks = dict(tgt_mask=causal_mask(L), tgt_is_causal=True, tgt_key_padding_mask=kpm_bool(),
                 memory_key_padding_mask=kpm_bool((S, 4, 1), S))
    for layer in (ref, ours):
        layer.train(mode == "train")
    with torch.set_grad_enabled(mode != "eval, no_grad"):
        torch.testing.assert_close(ours(tgt, memory, **masks), ref(tgt, memory, **masks), **FAST_PATH)


# --- compile, export, vmap, trace -------------------------------------------------------------------------------

# torch's compiler, exporter and tracer run with the coverage tracer paused (tests/conftest.py: NOT_MEASURED)
@pytest.mark.no_cover
@pytest.mark.parametrize("need_weights", [True, False])
# one mask in `make check` (each compile takes seconds); every mask in `make test`
@pytest.mark.parametrize("masks", [pytest.param(m, marks=() if i == 0 else pytest.mark.slow)
                                   for i, m in enumerate(MASKS)], ids=str)
def test_compiles_with_fullgraph_and_no_graph_breaks(masks, need_weights):
    torch._dynamo.reset()
    _, ours = make_pair(D, H, dtype=torch.float32)
    x = torch.randn(B, L, D)

    def attend(x):
        return ours(x, x, x, need_weights=need_weights, **MASKS[masks])

    # fullgraph: any graph break is an error, with its reason (one trace; torch._dynamo.explain would trace again)
    compiled = torch.compile(attend, fullgraph=True, backend="aot_eager")
    try:
        out, weights = compiled(x)
    except torch._dynamo.exc.Unsupported as error:
        pytest.fail(f"a graph break in the forward ({masks}, need_weights={need_weights}): {error}")
    ref_out, ref_weights = attend(x)
    torch.testing.assert_close(out, ref_out)
    assert torch.isfinite(out).all()
    if need_weights:
        torch.testing.assert_close(weights, ref_weights)


@pytest.mark.no_cover
def test_compiled_fully_masked_rows_keep_zeros_and_finite_gradients():
    torch._dynamo.reset()
    _, ours = make_pair(D, H, dtype=torch.float32)
    x = torch.randn(B, L, D, requires_grad=True)
    kpm = kpm_bool((L, 3, 0))  # the third sentence has no key at all

    def loss(x):
        out, weights = ours(x, x, x, key_padding_mask=kpm)
        return out.sum() + weights.sum(), weights

    (value, weights), compiled = loss(x), torch.compile(loss, fullgraph=True, backend="aot_eager")
    c_value, c_weights = compiled(x)
    assert torch.equal(c_weights[2], torch.zeros(L, L))
    (grad,) = torch.autograd.grad(c_value, x)
    assert torch.isfinite(grad).all()
    torch.testing.assert_close(c_value, value)


@pytest.mark.slow
@pytest.mark.no_cover
def test_compiles_with_inductor_in_both_layouts():
    """One compile with the default backend (generated C++ on the CPU) per layout, against eager numbers."""
    for batch_first in (True, False):
        torch._dynamo.reset()
        ours = MultiheadAttention(D, H, batch_first=batch_first)
        x = torch.randn(B, L, D) if batch_first else torch.randn(L, B, D)
        compiled = torch.compile(ours, fullgraph=True)
        kwargs = dict(key_padding_mask=kpm_bool(), need_weights=False)
        torch.testing.assert_close(compiled(x, x, x, **kwargs)[0], ours(x, x, x, **kwargs)[0])


class SelfAttention(nn.Module):
    """A wrapper with tensor-only arguments, for export and trace."""

    def __init__(self, attention):
        super().__init__()
        self.attention = attention

    def forward(self, x, key_padding_mask, attn_mask):
        return self.attention(x, x, x, key_padding_mask=key_padding_mask, attn_mask=attn_mask)


@pytest.mark.no_cover
@pytest.mark.parametrize("kpm", [kpm_bool(), ignore_to_additive(kpm_bool((L, 3, 0)))], ids=["bool", "float"])
def test_exports_with_masks(kpm):
    _, ours = make_pair(D, H, dtype=torch.float32)
    model = SelfAttention(ours).eval()
    args = (torch.randn(B, L, D), kpm, causal_mask(L) if kpm.dtype == torch.bool else None)
    exported = torch.export.export(model, args)
    for actual, expected in zip(exported.module()(*args), model(*args)):
        torch.testing.assert_close(actual, expected)


@pytest.mark.no_cover
def test_traces_and_the_trace_works_for_other_sizes():
    _, ours = make_pair(D, H, dtype=torch.float32)
    model = SelfAttention(ours).eval()
    example = (torch.randn(B, L, D), kpm_bool(), causal_mask(L))
    with warnings.catch_warnings():
        warnings.simplefilter("error", torch.jit.TracerWarning)  # no size frozen into the trace
        # torch deprecates jit.trace (a DeprecationWarning in 2.13, a FutureWarning from 2.15); it still works, and the
        # layer is tested under it as long as torch ships it. Only that deprecation is let through.
        warnings.filterwarnings("ignore", r".*jit\.trace.*deprecated", DeprecationWarning)
        warnings.filterwarnings("ignore", r".*jit\.trace.*deprecated", FutureWarning)
        traced = torch.jit.trace(model, example)
    other = (torch.randn(2, 7, D), padding_mask([7, 2]), causal_mask(7))
    for args in (example, other):
        for actual, expected in zip(traced(*args), model(*args)):
            torch.testing.assert_close(actual, expected)


@pytest.mark.parametrize("need_weights", [True, False])
def test_vmap_over_batched_masks(need_weights):
    _, ours = make_pair(D, H, dtype=torch.float32)
    N = 4
    x = torch.randn(N, B, L, D)
    kpm = torch.rand(N, B, L) > 0.5
    kpm[1, 0] = True  # a sentence with every key masked, inside the map

    def attend(x, kpm):
        return ours(x, x, x, key_padding_mask=kpm, need_weights=need_weights)[0]

    mapped = torch.func.vmap(attend)(x, kpm)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        looped = torch.stack([attend(x[i], kpm[i]) for i in range(N)])
    torch.testing.assert_close(mapped, looped)


# --- a mask that blocks everything -----------------------------------------------------------------------------

def test_a_padding_mask_that_masks_every_key_warns_with_the_likely_cause():
    layer = MultiheadAttention(D, H)
    x = torch.randn(B, L, D)
    keep = ~kpm_bool()  # True at the real tokens: the opposite polarity
    with pytest.warns(UserWarning, match=r"masks every key of every sentence.*opposite polarity.*~key_padding_mask"):
        layer(x, x, x, key_padding_mask=keep | kpm_bool())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        layer(x, x, x, key_padding_mask=kpm_bool((L, 3, 0)))  # one empty sentence: a real case, no warning
        layer(x, x, x, key_padding_mask=keep)
