"""Chapter 10's checkers under mutation: repeated key/value heads, rotary positions, a decode step with a KV cache and
the sliding-window mask."""
import math

import torch
import torch.nn.functional as F

from attention_course import decoding, rope
from attention_course.exercises import ch10
from mutants import Catalogue, Mutant


def stub(*args):
    raise NotImplementedError()


def no_return(*args):
    pass


# ---------------------------------------------------------------------------------------------------------
# check_repeat_kv


def expand_reshape(x, n_rep):
    """transformers' repeat_kv: a new axis after the heads, expanded (no copy) then merged."""
    B, h_kv, S, d = x.shape
    if n_rep == 1:
        return x
    return x[:, :, None].expand(B, h_kv, n_rep, S, d).reshape(B, h_kv * n_rep, S, d)


def index_select(x, n_rep):
    return x.index_select(1, torch.arange(x.shape[1] * n_rep) // n_rep)


def stacked_heads(x, n_rep):
    return torch.stack([x[:, j // n_rep] for j in range(x.shape[1] * n_rep)], dim=1)


def selection_einsum(x, n_rep):
    """A 0/1 matrix that picks key/value head j // n_rep for query head j."""
    h_kv = x.shape[1]
    pick = (torch.arange(h_kv * n_rep)[:, None] // n_rep == torch.arange(h_kv)[None, :]).to(x.dtype)  # (h, h_kv)
    return torch.einsum("jk,bksd->bjsd", pick, x)


def axis_before_heads(x, n_rep):
    B, h_kv, S, d = x.shape
    return x[:, None].expand(B, n_rep, h_kv, S, d).reshape(B, h_kv * n_rep, S, d)


def expand_without_merge(x, n_rep):
    B, h_kv, S, d = x.shape
    return x[:, :, None].expand(B, h_kv, n_rep, S, d)


def view_after_expand(x, n_rep):
    B, h_kv, S, d = x.shape
    return x[:, :, None].expand(B, h_kv, n_rep, S, d).view(B, h_kv * n_rep, S, d)


def unsqueeze_repeat_flatten(x, n_rep):
    """A new axis after the heads, repeated (a copy) and flattened into the heads."""
    return x.unsqueeze(2).repeat(1, 1, n_rep, 1, 1).flatten(1, 2)


def through_the_package(x, n_rep):
    """The rule broken inside a helper of the learner's own."""
    return decoding.repeat_kv(x, n_rep).clone()


def interleaved_then_reshaped(x, n_rep):
    """Repeated along the sequence axis, then reshaped into heads: the right shape, scrambled rows."""
    B, h_kv, S, d = x.shape
    return x.repeat_interleave(n_rep, dim=2).reshape(B, h_kv * n_rep, S, d)


REPEAT_KV = Catalogue(
    ch10.check_repeat_kv,
    correct={
        "repeat_interleave (the reference)": ch10.REPEAT_KV.reference,
        "expand and reshape (transformers' repeat_kv)": expand_reshape,
        "index_select with j // n_rep": index_select,
        "a loop over the query heads, stacked": stacked_heads,
        "einsum with a 0/1 selection": selection_einsum,
        "unsqueeze, repeat, flatten": unsqueeze_repeat_flatten,
    },
    mutants=[
        Mutant("repeat instead of repeat_interleave", lambda x, n: x.repeat(1, n, 1, 1), (r"TILED", r"wrong group"),
               family="tiled"),
        Mutant("torch.cat([x] * n_rep, dim=1)", lambda x, n: torch.cat([x] * n, dim=1), (r"TILED",), family="tiled"),
        Mutant("new axis before the heads", axis_before_heads, (r"TILED", r"BEFORE the heads"), family="tiled"),
        Mutant("repeated along the sequence axis", lambda x, n: x.repeat_interleave(n, dim=2),
               (r"along dim 2", r"sequence axis")),
        Mutant("repeated along the feature axis", lambda x, n: x.repeat_interleave(n, dim=-1),
               (r"along dim 3", r"feature axis")),
        Mutant("repeated along the batch axis", lambda x, n: x.repeat_interleave(n, dim=0),
               (r"along dim 0", r"batch axis")),
        Mutant("repeat_interleave without dim", lambda x, n: x.repeat_interleave(n), (r"FLAT", r"without dim=")),
        Mutant("n_rep ignored", lambda x, n: x, (r"NOT REPEATED", r"n_rep unused")),
        Mutant("repeated num_heads times", lambda x, n: x.repeat_interleave(x.shape[1] * n, dim=1),
               (r"once per QUERY head",)),
        Mutant("expanded, never merged (5-D)", expand_without_merge, (r"5-D", r"never merged")),
        Mutant("expand on the heads axis (multi-query only)", lambda x, n: x.expand(-1, x.shape[1] * n, -1, -1),
               (r"SIZE 1", r"multi-query")),
        Mutant("view after expand", view_after_expand, (r"view", r"\.reshape")),
        Mutant("(B, S, h, d) returned", lambda x, n: x.repeat_interleave(n, dim=1).transpose(1, 2),
               (r"axes in another order",)),
        Mutant("heads in reverse order", lambda x, n: x.repeat_interleave(n, dim=1).flip(1),
               (r"slices along axis 1 in another order",)),
        Mutant("sentences mixed", lambda x, n: x.repeat_interleave(n, dim=1).flip(0),
               (r"slices along axis 0 in another order",)),
        Mutant("repeated along the sequence, reshaped into heads", interleaved_then_reshaped,
               (r"repeats each ROW, the sequence axis",)),
        Mutant("the package's repeat_kv", decoding.repeat_kv, (r"calls attention_course\.decoding\.repeat_kv",
                                                                r"WITHOUT the ready-made"), family="package"),
        Mutant("the package's repeat_kv inside a helper", through_the_package,
               (r"calls attention_course\.decoding\.repeat_kv",), family="package"),
        Mutant("float32 result", lambda x, n: x.repeat_interleave(n, dim=1).float(),
               (r"in float32, expected float64", r"inputs' dtype")),
        Mutant("no return statement", no_return, (r"nothing returned",)),
        Mutant("the stub", stub, (r"stub",)),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# check_apply_rope


def angles(x, positions):
    """(L, d/2) angles positions * 10000 ** (-2i / d), in x's dtype."""
    d = x.shape[-1]
    theta = 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)  # (d/2,)
    return positions.to(x.dtype)[:, None] * theta


def complex_halves(x, positions):
    """The two halves as the real and imaginary parts of d/2 complex numbers, each multiplied by e^(i angle)."""
    z = torch.complex(*x.chunk(2, -1)) * torch.polar(torch.ones_like(angles(x, positions)), angles(x, positions))
    return torch.cat([z.real, z.imag], -1)


def frequency_loop(x, positions):
    """One frequency at a time, the pair (i, i + d/2) turned by hand."""
    d = x.shape[-1]
    out = torch.empty_like(x)
    for i in range(d // 2):
        a = positions.to(x.dtype) * 10000.0 ** (-2 * i / d)  # (L,)
        cos, sin = a.cos(), a.sin()
        out[..., i] = x[..., i] * cos - x[..., i + d // 2] * sin
        out[..., i + d // 2] = x[..., i + d // 2] * cos + x[..., i] * sin
    return out


def rotation_matrices(x, positions):
    """A 2x2 rotation matrix per position and frequency, applied to the pairs (x_i, x_{i + d/2}) by einsum."""
    a = angles(x, positions)
    cos, sin = a.cos(), a.sin()
    R = torch.stack([torch.stack([cos, -sin], -1), torch.stack([sin, cos], -1)], -2)  # (L, d/2, 2, 2)
    pairs = torch.stack(x.chunk(2, -1), -1)  # (B, h, L, d/2, 2)
    turned = torch.einsum("lirc,bhlic->bhlir", R, pairs)
    return torch.cat([turned[..., 0], turned[..., 1]], -1)


def interleaved_complex(y, positions):
    """Meta's RoPE: pairs (2i, 2i + 1) as complex numbers."""
    z = torch.view_as_complex(y.reshape(*y.shape[:-1], -1, 2).contiguous())
    z = z * torch.polar(torch.ones_like(angles(y, positions)), angles(y, positions))
    return torch.view_as_real(z).flatten(-2)


def through_the_permutation(x, positions):
    """The interleaved convention applied to x with its features permuted: the same rotation, up to that fixed
    permutation (feature i goes to 2i, feature i + d/2 to 2i + 1)."""
    d = x.shape[-1]
    perm = torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], -1).flatten()
    return interleaved_complex(x[..., perm], positions)[..., perm.argsort()]


def hf_float32(x, positions):
    """transformers' habit: frequencies made in float32 (.float()), then cast back."""
    d = x.shape[-1]
    theta = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    a = positions.float()[:, None] * theta
    cos, sin = torch.cat([a, a], -1).cos().to(x.dtype), torch.cat([a, a], -1).sin().to(x.dtype)
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def integer_division(x, positions):
    d = x.shape[-1]
    theta = 10000.0 ** (-(torch.arange(0, d, 2) // d))  # all exponents 0
    a = positions[:, None] * theta
    cos, sin = torch.cat([a, a], -1).cos().to(x.dtype), torch.cat([a, a], -1).sin().to(x.dtype)
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


def no_outer_product(x, positions):
    d = x.shape[-1]
    a = positions * 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)  # (L,) * (d/2,)
    x1, x2 = x.chunk(2, -1)
    return x * torch.cat([a, a], -1).cos() + torch.cat([-x2, x1], -1) * torch.cat([a, a], -1).sin()


def first_half_only(x, positions):
    a = angles(x, positions)
    x1, x2 = x.chunk(2, -1)
    return x1 * a.cos() - x2 * a.sin()


def rotated_in_place(x, positions):
    return x.copy_(ch10._rope(x, positions))


def base_1000(x, positions):
    d = x.shape[-1]
    a = positions.to(x.dtype)[:, None] * 1000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)
    x1, x2 = x.chunk(2, -1)
    return x * torch.cat([a, a], -1).cos() + torch.cat([-x2, x1], -1) * torch.cat([a, a], -1).sin()


def package_rotate_half(x, positions):
    a = torch.cat([angles(x, positions)] * 2, -1)
    return x * a.cos() + rope.rotate_half(x) * a.sin()


def angles_not_repeated(x, positions):
    a = angles(x, positions)  # (L, d/2), never repeated for the second half
    x1, x2 = x.chunk(2, -1)
    return x * a.cos() + torch.cat([-x2, x1], -1) * a.sin()


def angles_transposed(x, positions):
    d = x.shape[-1]
    a = positions.to(x.dtype)[None, :] * 10000.0 ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)[:, None]  # (d/2, L)
    a = torch.cat([a, a], -1)
    x1, x2 = x.chunk(2, -1)
    return x * a.cos() + torch.cat([-x2, x1], -1) * a.sin()


def rope_mutant(name, names, family=None, **switches):
    return Mutant(name, lambda x, p: ch10._rope(x, p, **switches), names, family)


APPLY_ROPE = Catalogue(
    ch10.check_apply_rope,
    correct={
        "rotate_half (the reference)": ch10._rope,
        "complex numbers on the two halves": complex_halves,
        "a loop over the frequencies": frequency_loop,
        "2x2 rotation matrices and einsum": rotation_matrices,
        "Meta's interleaved complex RoPE through the fixed permutation": through_the_permutation,
    },
    mutants=[
        Mutant("interleaved pairs (Meta's complex numbers)", interleaved_complex, (r"turns INTERLEAVED pairs",),
               family="interleaved"),
        rope_mutant("interleaved pairs, by hand", (r"turns INTERLEAVED pairs",), "interleaved", pairs=True),
        rope_mutant("interleaved pairs, sign flipped", (r"turns INTERLEAVED pairs",), "interleaved",
                    pairs=True, sign=-1),
        rope_mutant("rotate_half sign flipped", (r"MINUS the angle", r"cat\(x2, -x1\)"), sign=-1),
        rope_mutant("positions ignored (0 .. L-1)", (r"RESTARTED at 0",), start=0),
        rope_mutant("positions + 1", (r"position \+ 1",), start=1),
        rope_mutant("exponent -i/d (the 2 lost)", (r"lost its factor 2",), power=1),
        rope_mutant("exponent +2i/d", (r"NEGATIVE",), power=-2),
        rope_mutant("a frequency per feature", (r"per FEATURE",), power=1, layout="feature"),
        Mutant("integer division in the exponent", integer_division, (r"same angle", r"integer division")),
        rope_mutant("cos and sin repeat_interleave(2)", (r"PER PAIR", r"not cat\(\[angles, angles\]\)"),
                    layout="pairs"),
        rope_mutant("cos and sin swapped", (r"SWAPPED",), swap=True),
        rope_mutant("the sin term forgotten", (r"sin term is missing",), sin_term=0),
        Mutant("frequencies in float32 (.float())", hf_float32, (r"FLOAT32 precision",), family="float32"),
        rope_mutant("angles in float32", (r"FLOAT32 precision",), "float32", dtype=torch.float32),
        Mutant("computed in float64 whatever x's dtype", lambda x, p: ch10._rope(x.double(), p),
               (r"in float64, expected float32", r"inputs' dtype")),
        Mutant("positions times frequencies, no outer product", no_outer_product, (r"OUTER",)),
        Mutant("the first half only", first_half_only, (r"first HALF of the features",)),
        Mutant("x rotated in place", rotated_in_place, (r"modified its input `x` in place",)),
        Mutant("base 1000", base_1000, (r"uses the base 1000",)),
        Mutant("the package's apply_rope", lambda x, p: rope.apply_rope(x, p),
               (r"calls attention_course\.rope\.apply_rope", r"WITHOUT the ready-made"), family="package"),
        Mutant("the package's apply_rope, interleaved", lambda x, p: rope.apply_rope(x, p, interleaved=True),
               (r"turns INTERLEAVED pairs",), family="interleaved"),
        Mutant("the package's rotate_half", package_rotate_half, (r"calls attention_course\.rope\.rotate_half",),
               family="package"),
        Mutant("angles not repeated for both halves", angles_not_repeated, (r"one per FREQUENCY", r"both halves")),
        Mutant("angles (d/2, L), the outer product turned round", angles_transposed, (r"frequencies down",
                                                                                      r"positions\[:, None\]")),
        Mutant("no return statement", no_return, (r"nothing returned",)),
        Mutant("the stub", stub, (r"stub",)),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# check_decode_step


def rope_complex(x, positions):
    return complex_halves(x, positions)


def sdpa_step(q, k, v, cache_k, cache_v):
    """SDPA with a bool mask, True = MAY attend (the other convention), built from the positions."""
    T, L = cache_k.shape[2], q.shape[2]
    positions = torch.arange(T, T + L)
    q, k = rope_complex(q, positions), rope_complex(k, positions)
    cache_k, cache_v = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    allowed = torch.arange(T + L)[None, :] <= positions[:, None]  # (L, S)
    return F.scaled_dot_product_attention(q, cache_k, cache_v, attn_mask=allowed), cache_k, cache_v


def loop_step(q, k, v, cache_k, cache_v):
    """Each new query alone over the keys up to its own position."""
    T, L = cache_k.shape[2], q.shape[2]
    positions = torch.arange(T, T + L)
    q, k = frequency_loop(q, positions), frequency_loop(k, positions)
    keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    outs = []
    for i in range(L):
        scores = q[:, :, i:i + 1] @ keys[:, :, :T + i + 1].transpose(-2, -1) / math.sqrt(q.shape[-1])
        outs.append(scores.softmax(-1) @ values[:, :, :T + i + 1])
    return torch.cat(outs, dim=2), keys, values


def einsum_step(q, k, v, cache_k, cache_v):
    """einsum and a triu mask shifted by the cache's length."""
    T, L = cache_k.shape[2], q.shape[2]
    positions = torch.arange(T, T + L)
    q, k = rotation_matrices(q, positions), rotation_matrices(k, positions)
    keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    scores = torch.einsum("bhld,bhsd->bhls", q, keys) / q.shape[-1] ** 0.5
    hidden = torch.ones(L, T + L, dtype=torch.bool).triu(T + 1)
    weights = scores.masked_fill(hidden, float("-inf")).softmax(-1)
    return torch.einsum("bhls,bhsd->bhld", weights, values), keys, values


def is_causal_step(q, k, v, cache_k, cache_v):
    """SDPA's is_causal=True: the mask aligned to the top left when L != S."""
    T, L = cache_k.shape[2], q.shape[2]
    positions = torch.arange(T, T + L)
    q, k = ch10._rope(q, positions), ch10._rope(k, positions)
    cache_k, cache_v = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    return F.scaled_dot_product_attention(q, cache_k, cache_v, is_causal=True), cache_k, cache_v


def prepended(q, k, v, cache_k, cache_v):
    out, _, _ = ch10.DECODE_STEP.reference(q, k, v, cache_k, cache_v)
    T = cache_k.shape[2]
    rk = ch10._rope(k, torch.arange(T, T + q.shape[2]))
    return out, torch.cat((rk, cache_k), 2), torch.cat((v, cache_v), 2)


def float32_step(q, k, v, cache_k, cache_v):
    out, ck, cv = ch10.DECODE_STEP.reference(*(t.float() for t in (q, k, v, cache_k, cache_v)))
    return out.double(), ck.double(), cv.double()


def float32_result(q, k, v, cache_k, cache_v):
    return tuple(t.float() for t in ch10.DECODE_STEP.reference(q, k, v, cache_k, cache_v))


def queries_rotated_in_place(q, k, v, cache_k, cache_v):
    T = cache_k.shape[2]
    q.copy_(ch10._rope(q, torch.arange(T, T + q.shape[2])))
    out, ck, cv = ch10.DECODE_STEP.reference(q, k, v, cache_k, cache_v)
    return out, ck, cv


def attend(q, keys, values, mask):
    """softmax(q keys^T / sqrt(d), the ignore mask filled with -inf) values."""
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(mask, float("-inf"))
    return scores.softmax(-1) @ values


def step_parts(q, k, v, cache_k, cache_v):
    """The rotation and the grown caches of a right step: (q, keys, values, positions, T)."""
    T, L = cache_k.shape[2], q.shape[2]
    positions = torch.arange(T, T + L)
    q, k = rope.apply_rope(q, positions), rope.apply_rope(k, positions)
    return q, torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2), positions, T


def finite_fill_step(q, k, v, cache_k, cache_v):
    """-1e9 for -inf: exp(-1e9 - max) is 0 in float64, as exp(-inf) is."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    future = torch.arange(keys.shape[2])[None, :] > positions[:, None]
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(future, -1e9)
    return scores.softmax(-1) @ values, keys, values


def keep_mask_filled(q, k, v, cache_k, cache_v):
    """masked_fill with the keys each query MAY see: the polarity swapped."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    allowed = torch.arange(keys.shape[2])[None, :] <= positions[:, None]
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(allowed, float("-inf"))
    return scores.softmax(-1) @ values, keys, values


def ignore_mask_to_sdpa(q, k, v, cache_k, cache_v):
    """The course's ignore mask handed to SDPA, which reads True as MAY attend."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    future = torch.arange(keys.shape[2])[None, :] > positions[:, None]
    return F.scaled_dot_product_attention(q, keys, values, attn_mask=future), keys, values


def transposed_mask(q, k, v, cache_k, cache_v):
    """The mask built keys down, (S, L): fine in shape only when L == S or L == 1... and wrong in values."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    future = torch.arange(keys.shape[2])[:, None] > positions[None, :]  # (S, L)
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ values, keys, values


def past_hidden(q, k, v, cache_k, cache_v):
    """The comparison turned round: key < query hidden."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    earlier = torch.arange(keys.shape[2])[None, :] < positions[:, None]
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(earlier, float("-inf"))
    return scores.softmax(-1) @ values, keys, values


def everything_rotated_again(q, k, v, cache_k, cache_v):
    """Rotated and appended, then the whole cache rotated "to be safe" at 0 .. S-1."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    keys = rope.apply_rope(keys, torch.arange(keys.shape[2]))
    return attend(q, keys, values, torch.arange(keys.shape[2])[None, :] > positions[:, None]), keys, values


def flat_mask(q, k, v, cache_k, cache_v):
    """key_positions > positions without [None, :] and [:, None]."""
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    future = torch.arange(keys.shape[2]) > positions
    scores = (q @ keys.transpose(-2, -1) / math.sqrt(q.shape[-1])).masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ values, keys, values


def t_from_the_heads(q, k, v, cache_k, cache_v):
    T, L = cache_k.shape[1], q.shape[2]  # the heads axis, not the sequence axis
    positions = torch.arange(T, T + L)
    q, k = rope.apply_rope(q, positions), rope.apply_rope(k, positions)
    keys, values = torch.cat([cache_k, k], dim=2), torch.cat([cache_v, v], dim=2)
    future = torch.arange(keys.shape[2])[None, :] > torch.arange(cache_k.shape[2], cache_k.shape[2] + L)[:, None]
    return attend(q, keys, values, future), keys, values


def keys_transposed_1_2(q, k, v, cache_k, cache_v):
    q, keys, values, positions, T = step_parts(q, k, v, cache_k, cache_v)
    scores = q @ keys.transpose(1, 2) / math.sqrt(q.shape[-1])
    future = torch.arange(keys.shape[2])[None, :] > positions[:, None]
    return scores.masked_fill(future, float("-inf")).softmax(-1) @ values, keys, values


def decode_mutant(name, names, family=None, **switches):
    return Mutant(name, lambda *a: ch10._decode(*a, **switches), names, family)


DECODE_STEP = Catalogue(
    ch10.check_decode_step,
    correct={
        "matmul and masked_fill (the reference)": ch10.DECODE_STEP.reference,
        "SDPA with an allow mask, complex RoPE": sdpa_step,
        "a loop over the new queries": loop_step,
        "einsum and triu(T + 1)": einsum_step,
        "a finite fill, -1e9": finite_fill_step,
    },
    mutants=[
        decode_mutant("positions restart at 0", (r"RESTARTED at 0",), "restart", start=0),
        decode_mutant("positions restart at 0, mask too", (r"RESTARTED at 0",), "restart", start=0, mask="zero"),
        decode_mutant("positions one too far", (r"one position too far",), start=1),
        decode_mutant("cache grown along the heads", (r"WRONG AXIS", r"dim 1, the heads"), "axis", cat=1),
        decode_mutant("cache grown along the features", (r"WRONG AXIS", r"dim 3, the feature"), "axis", cat=3),
        decode_mutant("cache grown along the batch", (r"WRONG AXIS", r"dim 0, the batch"), "axis", cat=0),
        decode_mutant("causal mask aligned top-left (triu(1))", (r"TOP-LEFT",), "top-left", mask="top-left"),
        Mutant("SDPA is_causal=True", is_causal_step, (r"TOP-LEFT", r"is_causal"), "top-left"),
        decode_mutant("the mask hides the cache", (r"HIDES THE CACHE",), mask="hide cache"),
        decode_mutant("the new tokens' own (L, L) mask", (r"own \(L, L\) causal mask",), mask="L x L"),
        decode_mutant("no causal mask", (r"NO CAUSAL MASK",), mask="none"),
        decode_mutant("own key not appended before attending", (r"OLD CACHE ONLY",), own=False),
        decode_mutant("own key not appended, own value appended", (r"not the new KEYS",),
                      own="values"),
        decode_mutant("values rotated", (r"rotates the VALUES",), turn="qkv"),
        decode_mutant("queries not rotated", (r"not rotate the QUERIES",), turn="k"),
        decode_mutant("new keys not rotated", (r"not rotate the new KEYS",), turn="q"),
        decode_mutant("cached keys rotated again", (r"cached keys AGAIN",), again="cache"),
        Mutant("keep mask in masked_fill (polarity swapped)", keep_mask_filled, (r"POLARITY IS SWAPPED",
                                                                                 r"only the keys AFTER")),
        Mutant("ignore mask handed to SDPA", ignore_mask_to_sdpa, (r"IGNORE mask to F\.scaled_dot_product",
                                                                   r"True as MAY attend")),
        Mutant("mask built (S, L)", transposed_mask, (r"TRANSPOSED, \(S, L\)",)),
        Mutant("comparison turned round (key < query hidden)", past_hidden, (r"TURNED ROUND",)),
        decode_mutant("hidden scores filled with 0", (r"hidden scores to 0, not -inf",), fill=0.0),
        decode_mutant("hidden scores filled with +inf", (r"with \+inf",), fill=float("inf")),
        Mutant("positions compared element by element", flat_mask, (r"ELEMENT BY ELEMENT",)),
        decode_mutant("softmax over the heads", (r"softmax over the HEADS",), softmax=1),
        decode_mutant("mask after the softmax", (r"AFTER THE SOFTMAX",), after=True),
        Mutant("whole cache rotated again", everything_rotated_again, (r"ROTATED TWICE", r"whole cache")),
        decode_mutant("new keys rotated twice", (r"new keys TWICE",), turn="qkk"),
        decode_mutant("new queries and keys rotated twice", (r"queries and keys TWICE",), turn="qqkk"),
        Mutant("T read from cache_k.shape[1]", t_from_the_heads, (r"number of HEADS", r"shape\[1\]")),
        Mutant("keys transposed on dims 1, 2", keys_transposed_1_2, (r"on the wrong axes",
                                                                     r"transpose\(-2, -1\)")),
        decode_mutant("scaled by 1/d", (r"divides the scores by d",), power=1),
        decode_mutant("not scaled", (r"unscaled",), power=0),
        decode_mutant("softmax over the queries", (r"softmax over the QUERIES",), softmax=-2),
        decode_mutant("cache returned unchanged", (r"NOT GROWN",), store="unchanged"),
        decode_mutant("only the new entries returned", (r"caches of ONLY THE NEW keys",), store="new"),
        Mutant("new entries put in front", prepended, (r"right out", r"FRONT")),
        decode_mutant("new keys stored unrotated", (r"stores the new keys UNROTATED",), store="raw"),
        Mutant("computed in float32", float32_step, (r"float32 precision",)),
        Mutant("float32 returned", float32_result, (r"in float32, expected float64",)),
        Mutant("only out returned", lambda *a: ch10.DECODE_STEP.reference(*a)[0], (r"is a tensor of shape .* expected a tuple of 3",)),
        Mutant("(out, (k, v)) returned", lambda *a: (ch10.DECODE_STEP.reference(*a)[0],
                                                     ch10.DECODE_STEP.reference(*a)[1:]),
               (r"is a tuple of 2, expected a tuple of 3",)),
        Mutant("queries rotated in place", queries_rotated_in_place, (r"modified its input `q` in place",)),
        Mutant("no return statement", no_return, (r"nothing returned",)),
        Mutant("the stub", stub, (r"stub",)),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# check_window_mask


def keep_negated(q, k, window):
    seen = (k[None, :] <= q[:, None]) & (k[None, :] > q[:, None] - window)  # (L, S)
    return ~seen


def window_loop(q, k, window):
    mask = torch.zeros(len(q), len(k), dtype=torch.bool)
    for i, qp in enumerate(q.tolist()):
        for j, kp in enumerate(k.tolist()):
            mask[i, j] = kp > qp or qp - kp >= window
    return mask


def window_where(q, k, window):
    diff = q[:, None] - k[None, :]
    return torch.where(diff < 0, True, diff >= window)


def from_indices(q, k, window):
    L, S = len(q), len(k)
    return ch10._window(torch.arange(L), torch.arange(S), window)


def from_key_indices(q, k, window):
    L, S = len(q), len(k)
    return ch10._window(torch.arange(S - L, S), torch.arange(S), window)


def looking_forward(q, k, window):
    ahead = k[None, :] - q[:, None]  # k - q: the sign turned
    return (ahead < 0) | (ahead >= window)


def element_by_element(q, k, window):
    back = q - k  # no outer difference
    return (back < 0) | (back >= window)


def window_mutant(name, names, family=None, **switches):
    return Mutant(name, lambda q, k, w: ch10._window(q, k, w, **switches), names, family)


WINDOW_MASK = Catalogue(
    ch10.check_window_mask,
    correct={
        "comparisons of the positions (the reference)": ch10._window,
        "the keep mask, negated": keep_negated,
        "loops": window_loop,
        "torch.where": window_where,
    },
    mutants=[
        window_mutant("window + 1 keys seen", (r"window \+ 1 keys", r"OFF BY ONE"), far=1),
        window_mutant("window - 1 keys seen", (r"window - 1 keys", r"OFF BY ONE"), far=-1),
        window_mutant("symmetric band", (r"symmetric", r"NOT CAUSAL"), "not causal", band="symmetric"),
        window_mutant("no causal part", (r"NOT CAUSAL",), "not causal", near=-math.inf),
        window_mutant("window ignored", (r"WINDOW IS IGNORED",), far=math.inf),
        window_mutant("own key hidden", (r"OWN KEY",), near=1),
        Mutant("keep mask (convention swapped)", lambda q, k, w: ~ch10._window(q, k, w),
               (r"polarity swapped",)),
        Mutant("built from indices 0 .. L-1", from_indices, (r"INDICES", r"0 \.\. L-1 and 0 \.\. S-1"),
               family="indices"),
        Mutant("built from key indices", from_key_indices, (r"INDICES", r"S-L \.\. S-1"), family="indices"),
        Mutant("transposed", lambda q, k, w: ch10._window(k, q, w), (r"`q_positions` and `k_positions` EXCHANGED",),
               family="transposed"),
        Mutant("(L, S) mask returned .T", lambda q, k, w: ch10._window(q, k, w).T,
               (r"axes in another order",), family="transposed"),
        Mutant("window looks forward (k - q)", looking_forward, (r"LOOKS FORWARD", r"AFTER it")),
        Mutant("positions compared element by element", element_by_element, (r"ELEMENT BY ELEMENT",)),
        Mutant("the package's decode_mask", lambda q, k, w: decoding.decode_mask(q, k, window=w),
               (r"calls attention_course\.decoding\.decode_mask",)),
        Mutant("additive float mask", lambda q, k, w: torch.zeros(len(q), len(k)).masked_fill(
            ch10._window(q, k, w), float("-inf")), (r"float32, expected bool", r"mask of numbers"), family="numbers"),
        Mutant("keep mask as numbers", lambda q, k, w: (~ch10._window(q, k, w)).float(),
               (r"float32, expected bool", r"mask of numbers"), family="numbers"),
        Mutant("mask as integers", lambda q, k, w: ch10._window(q, k, w).int(),
               (r"int32, expected bool", r"mask of numbers"), family="numbers"),
        Mutant("(1, L, S) returned", lambda q, k, w: ch10._window(q, k, w)[None],
               (r"axis of size 1 too many",)),
        Mutant("a list returned", lambda q, k, w: ch10._window(q, k, w).tolist(),
               (r"expected a torch\.Tensor",)),
        Mutant("the stub", stub, (r"stub",)),
    ],
)

CATALOGUES = [REPEAT_KV, APPLY_ROPE, DECODE_STEP, WINDOW_MASK]
