"""Every bad input raises a ValueError / TypeError whose message names the argument, what was expected, what
arrived and the fix. The chapters show these messages to learners."""
import pytest
import torch

from attention_course import MultiheadAttention, padding_mask
from attention_course.checks import (
    check_device,
    check_dropout,
    check_floating,
    check_mask,
    check_positive_int,
    check_same_device,
    check_same_dtype,
    check_shape,
    check_tensor,
)

B, L, S, D, H = 2, 3, 4, 8, 2


@pytest.fixture(scope="module")
def layer():
    return MultiheadAttention(D, H)


def x(*shape, **kwargs):
    return torch.randn(*shape, **kwargs)


q, kv = x(B, L, D), x(B, S, D)
BOOL = dict(dtype=torch.bool)

# (description, (query, key, value), forward kwargs, error, key phrase of the message)
BAD_CALLS = [
    ("unbatched query", (x(L, D), x(S, D), x(S, D)), {}, ValueError, r"query must have 3 dimensions \(B, L, D\).*\.unsqueeze\(0\)"),
    ("4-D query", (x(1, B, L, D), kv, kv), {}, ValueError, r"query must have 3 dimensions \(B, L, D\), got 4"),
    ("unbatched key", (q, x(S, D), x(S, D)), {}, ValueError, r"key must have 3 dimensions \(B, S, kdim\).*unsqueeze"),
    ("query embed dim", (x(B, L, 6), kv, kv), {}, ValueError, r"query must have shape \(B, L, D\) with D=8, got shape \(2, 3, 6\)"),
    ("key embed dim", (q, x(B, S, 6), kv), {}, ValueError, r"key has 6 features but this layer expects kdim=8.*kdim=6"),
    ("value embed dim", (q, kv, x(B, S, 5)), {}, ValueError, r"value has 5 features but this layer expects vdim=8"),
    ("key and value lengths", (q, kv, x(B, S + 1, D)), {}, ValueError, r"key and value must have the same length S"),
    ("batch mismatch", (q, x(B + 1, S, D), x(B + 1, S, D)), {}, ValueError, r"same number of sentences B.*query \(2, 3, 8\), key \(3, 4, 8\)"),
    ("int query", (q.long(), kv, kv), {}, TypeError, r"query must be a floating-point tensor.*query\.float\(\)"),
    ("list query", ([[0.0]], kv, kv), {}, TypeError, r"query must be a torch.Tensor, got list"),
    ("float64 input, float32 layer", (q.double(), kv.double(), kv.double()), {}, TypeError,
     r"query is torch.float64 but the layer's weights are torch.float32.*query\.to\(torch.float32\).*layer\.to\(torch.float64\)"),
    ("input on another device", (q.to("meta"), kv, kv), {}, ValueError, r"query is on meta but the layer is on cpu\. Move the input with query\.to\('cpu'\) or the layer with layer\.to\('meta'\)"),
    ("key_padding_mask not (B, S)", (q, kv, kv), dict(key_padding_mask=torch.zeros(B, S + 1, **BOOL)), ValueError,
     r"key_padding_mask must have shape \(B, S\) = \(2, 4\), got \(2, 5\)"),
    ("key_padding_mask per query", (q, kv, kv), dict(key_padding_mask=torch.zeros(B, L, **BOOL)), ValueError,
     r"one column per query \(L=3\).*one column per key \(S=4\)"),
    ("attn_mask passed as key_padding_mask", (q, kv, kv), dict(key_padding_mask=torch.zeros(L, S, **BOOL)), ValueError,
     r"looks like an attn_mask.*pass it as attn_mask"),
    ("key_padding_mask passed as attn_mask", (q, kv, kv), dict(attn_mask=torch.zeros(B, S, **BOOL)), ValueError,
     r"looks like a key_padding_mask \(B, S\); pass it as key_padding_mask"),
    ("(B, L) mask where (L, S) is expected", (q, kv, kv), dict(attn_mask=torch.zeros(B, L, **BOOL)), ValueError,
     r"per-sentence padding mask \(B, L\)"),
    ("attn_mask transposed", (q, kv, kv), dict(attn_mask=torch.zeros(S, L, **BOOL)), ValueError, r"attn_mask\.T"),
    ("attn_mask per sentence only", (q, kv, kv), dict(attn_mask=torch.zeros(B, L, S, **BOOL)), ValueError,
     r"repeat_interleave\(num_heads, dim=0\)"),
    ("attn_mask 4-D", (q, kv, kv), dict(attn_mask=torch.zeros(B, H, L, S, **BOOL)), ValueError, r"flatten\(0, 1\)"),
    ("attn_mask of another size", (q, kv, kv), dict(attn_mask=torch.zeros(L, S + 2, **BOOL)), ValueError,
     r"attn_mask must have shape \(L, S\) = \(3, 4\) or \(B\*h, L, S\) = \(4, 3, 4\), got \(3, 6\)"),
    ("int key_padding_mask", (q, kv, kv), dict(key_padding_mask=torch.ones(B, S, dtype=torch.long)), TypeError,
     r"bool \(True = ignore this key\).*keep_to_ignore\(key_padding_mask\)"),
    ("int attn_mask", (q, kv, kv), dict(attn_mask=torch.ones(L, S, dtype=torch.int32)), TypeError, r"keep_to_ignore\(attn_mask\)"),
    ("float attn_mask of another dtype", (q, kv, kv), dict(attn_mask=torch.zeros(L, S, dtype=torch.float64)), TypeError,
     r"attn_mask is a float mask of dtype torch.float64 but query is torch.float32.*attn_mask\.to\(query\.dtype\)"),
    ("float key_padding_mask of another dtype", (q, kv, kv), dict(key_padding_mask=torch.zeros(B, S, dtype=torch.float16)),
     TypeError, r"key_padding_mask\.to\(query\.dtype\)"),
    ("mask on another device", (q, kv, kv), dict(key_padding_mask=torch.zeros(B, S, device="meta", **BOOL)), ValueError,
     r"key_padding_mask is on meta but query is on cpu"),
]


@pytest.mark.parametrize("inputs, kwargs, error, match", [case[1:] for case in BAD_CALLS],
                         ids=[case[0] for case in BAD_CALLS])
@pytest.mark.parametrize("need_weights", [True, False])
def test_forward_rejects_bad_input(layer, inputs, kwargs, error, match, need_weights):
    with pytest.raises(error, match=match):
        layer(*inputs, need_weights=need_weights, **kwargs)


def test_padding_mask_as_attn_mask_with_B_equal_L_is_not_detectable(layer):
    """Documented limitation: a (B, S) key padding mask passed as attn_mask when B == L has the (L, S) shape."""
    q3 = x(3, 3, D)
    kpm = padding_mask([3, 2, 1])
    as_attn = layer(q3, q3, q3, attn_mask=kpm)[0]  # accepted, and means something else
    as_kpm = layer(q3, q3, q3, key_padding_mask=kpm)[0]
    assert not torch.allclose(as_attn, as_kpm)


@pytest.mark.parametrize("args, kwargs, match", [
    ((10, 4), {}, "embed_dim 10 is not divisible by num_heads 4: choose num_heads among 1, 2, 5, 10"),
    ((8, 0), {}, "num_heads must be a positive int, got 0"),
    ((8.0, 2), {}, "embed_dim must be a positive int"),
    ((8, 2), dict(dropout=1.0), r"dropout is a probability.*\[0, 1\), got 1.0"),
    ((8, 2), dict(dropout=-0.1), r"\[0, 1\)"),
    ((8, 2), dict(kdim=0), "kdim must be a positive int"),
    ((8, 2), dict(vdim=2.5), "vdim must be a positive int"),
])
def test_constructor_rejects_bad_arguments(args, kwargs, match):
    with pytest.raises(ValueError, match=match):
        MultiheadAttention(*args, **kwargs)


# --- the checks themselves --------------------------------------------------------------------------------------

def test_check_helpers_pass_good_input():
    t = torch.zeros(2, 3)
    assert check_tensor(t, "t") is t and check_floating(t, "t") is t
    check_shape(t, "t", ("B", "L"), (2, None))
    check_shape(t, "t", ("B", "L"))
    check_same_device(t, "t", t, "u")
    check_device(t, "t", torch.device("cpu"), "u")
    check_same_dtype(t, "t", t, "u")
    assert check_positive_int(3, "n") == 3 and check_dropout(0, "p") == 0.0
    assert check_mask(t, "m", float_dtype=torch.float32, device=t.device) is t


def test_check_helpers_messages():
    with pytest.raises(ValueError, match=r"t must have shape \(B, L\) with L=4, got shape \(2, 3\) \(L=3 at dimension 1\)"):
        check_shape(torch.zeros(2, 3), "t", ("B", "L"), (None, 4))
    with pytest.raises(TypeError, match=r"t is torch.float64 but u is torch.float32. Convert it with t\.to\(u\.dtype\)"):
        check_same_dtype(torch.zeros(1, dtype=torch.float64), "t", torch.zeros(1), "u")
    with pytest.raises(ValueError, match=r"t is on meta but u is on cpu\. Move it with t\.to\("):
        check_device(torch.zeros(1, device="meta"), "t", torch.device("cpu"), "u")
    with pytest.raises(ValueError, match="p is a probability"):
        check_dropout(True, "p")
    with pytest.raises(ValueError, match="n must be a positive int, got True"):
        check_positive_int(True, "n")
