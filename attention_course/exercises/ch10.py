"""Checkers for chapter 10, attention that writes: causal decoding, the KV cache, shared key/value heads, rotary
positions and sliding windows.

The exercises, as the learner writes them (the checkers call them with float64 CPU tensors unless said otherwise;
masks are IGNORE masks, bool, True = this key may NOT be attended, as everywhere in the course; RoPE is the
split-halves convention of Llama and ``transformers``, base 10000):

1. ``my_repeat_kv(x, n_rep)`` -- :func:`check_repeat_kv`, grade_id ``ex-ch10-repeat-kv``.
   ``x`` (B, h_kv, S, d): the keys (or the values) of h_kv key/value heads; ``n_rep`` an int >= 1, the number of
   query heads that share one key/value head (h = h_kv * n_rep). Returns (B, h_kv * n_rep, S, d) in x's dtype,
   where query head j reads key/value head ``j // n_rep``: heads 0, 0, 0, 1, 1, 1 for h_kv = 2, n_rep = 3
   (``repeat_interleave`` on dim 1, as ``transformers``' ``repeat_kv``). Without the package's ``repeat_kv``.
2. ``my_apply_rope(x, positions)`` -- :func:`check_apply_rope`, grade_id ``ex-ch10-rope``.
   ``x`` (B, h, L, d) with d even; ``positions`` a LongTensor (L,): the absolute position of each of the L tokens
   (not necessarily 0 .. L-1: a decode step's tokens come after the cache). Returns x rotated, same shape and
   dtype. Frequency i = 0 .. d/2 - 1 is ``theta_i = 10000 ** (-2i / d)``; it turns the pair of features
   (i, i + d/2) by the angle ``p * theta_i``: ``out = x * cos + rotate_half(x) * sin``, where
   ``rotate_half(x) = cat(-x2, x1)`` (x1, x2 the two halves of the last axis) and cos, sin are those of the
   angles (L, d/2) repeated for both halves, ``cat([angles, angles], -1)``. Computed in x's dtype (the checker
   compares in float64 to 1e-10, and also gives a float32 x, which must come back float32). Without the
   package's ``apply_rope``, ``rope_cos_sin`` or ``rotate_half`` (nor ``transformers``' ``apply_rotary_pos_emb``).
3. ``decode_step(q, k, v, cache_k, cache_v) -> (out, cache_k, cache_v)`` -- :func:`check_decode_step`, grade_id
   ``ex-ch10-decode-step``. One step of causal attention with a KV cache, one head group of h heads (no sharing).
   ``q``, ``k``, ``v`` (B, h, L, d): the projections of the L new tokens, NOT yet rotated; ``cache_k``,
   ``cache_v`` (B, h, T, d): the keys (already rotated, each at its own position) and values of the T tokens
   before them; T may be 0 (the prefill). The new tokens sit at positions T .. T+L-1 (T = ``cache_k.shape[2]``).
   The step rotates q and k (RoPE as in exercise 2, never v) at those positions, appends k and v to the cache along
   dim 2 (the sequence axis), and lets new query i (position T + i) attend to every key at a position <= T + i,
   scores scaled by 1/sqrt(d). Returns ``out`` (B, h, L, d) and the grown caches (B, h, T+L, d), the new entries
   at the end, keys stored rotated. The package's ``apply_rope`` may be used. The checker compares with a full
   recomputation over all T + L tokens (to 1e-10), for a prefill, one token, three tokens at once, and a
   generation loop that feeds each step the cache the step before returned.
4. ``window_mask(q_positions, k_positions, window)`` -- :func:`check_window_mask`, grade_id
   ``ex-ch10-window-mask``. ``q_positions`` (L,) and ``k_positions`` (S,) LongTensors (the positions of the
   queries and of the keys, the keys in the order the cache holds them: a rolling cache holds them out of order);
   ``window`` an int W >= 1. Returns the (L, S) bool ignore mask: True where the key comes after the query
   (k > q) or lies W or more positions back (q - k >= W), so that each query sees itself and the W - 1 positions
   before it. Without the package's ``decode_mask``.

Each checker names the classic mistakes (``repeat`` for ``repeat_interleave``, RoPE's other convention, positions
restarting at 0, a cache grown along the wrong axis, a causal mask that hides the cache, an off-by-one window, ...)
by rerunning a private reference with that mistake applied and comparing.
"""
from __future__ import annotations

import math
import sys

import torch
import torch.nn.functional as F

from . import ATOL, DTYPE, ExerciseError, close, describe_diff, max_diff, passed, raised, require_shape, same_error

BASE = 10000.0
NEG_INF = float("-inf")


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


def _run(fn, *args):
    """(result, None) or (None, the exception) of the learner's function; an ExerciseError passes through."""
    try:
        return fn(*args), None
    except ExerciseError:
        raise
    except Exception as err:  # noqa: BLE001 - the learner's code may raise anything; it is named, not hidden
        return None, err


def _forbidden(names: dict[str, tuple[str, ...]]) -> dict:
    """Code object -> "module.function" of the functions an exercise asks the learner not to call: the package's
    (imported here) and ``transformers``' (only if the learner's session imported it)."""
    from attention_course import decoding, rope

    found = {}
    for module, functions in names.items():
        where = {"attention_course.decoding": decoding, "attention_course.rope": rope}.get(module) \
            or sys.modules.get(module)
        for function in functions:
            code = getattr(getattr(where, function, None), "__code__", None)
            if code is not None:
                found[code] = f"{module}.{function}"
    return found


def _run_watched(fn, args, forbidden: dict, used: list):
    """:func:`_run`, noting in ``used`` which of ``forbidden`` the learner's function calls (directly, through an
    alias, or inside a helper of its own: every Python call made while it runs is watched)."""
    def watch(frame, event, arg):
        if event == "call" and frame.f_code in forbidden and forbidden[frame.f_code] not in used:
            used.append(forbidden[frame.f_code])

    previous = sys.getprofile()
    sys.setprofile(watch)
    try:
        return _run(fn, *args)
    finally:
        sys.setprofile(previous)


def _refuse(used: list, what: str, instead: str) -> None:
    """The exercise's rule, once the answer is otherwise right: a wrong answer is told its mistake first (which a
    ready-made function called with the wrong options also makes)."""
    if used:
        raise ExerciseError(
            f"{what} calls {used[0]}: the exercise asks you to write it yourself, WITHOUT the ready-made function "
            f"(it is what the checker compares with). {instead}"
        )


def _error(err: Exception, what: str, hint: str) -> ExerciseError:
    """The learner's exception with the mistake it shows."""
    text = str(err).strip().rstrip(".")
    return ExerciseError(f"{what} raised {type(err).__name__}: {text}. {hint}")


def _same_failure(err: Exception, variants) -> str | None:
    """The message of the first variant (a function of nothing that reruns the reference with one mistake, and its
    message) that raises the same error as the learner's code."""
    for run, message in variants:
        try:
            run()
        except Exception as other:  # noqa: BLE001
            if same_error(err, other):
                return message
    return None


def _tensor(answer, what: str, name: str) -> torch.Tensor:
    if answer is None:
        raise ExerciseError(f"{what} returned None: is the return statement missing? It must return {name}.")
    if not isinstance(answer, torch.Tensor):
        raise ExerciseError(f"{what} must return a torch.Tensor ({name}), got {type(answer).__name__}.")
    return answer.detach().cpu()


def _unchanged(before: torch.Tensor, after: torch.Tensor, name: str, what: str) -> None:
    if not torch.equal(before, after):
        raise ExerciseError(
            f"{what} changed its input {name} IN PLACE (an assignment into a slice, or a method ending in _): the "
            f"caller's tensor is overwritten. Compute new tensors and return them, leaving the inputs as they were."
        )


def _same_dtype(got: torch.Tensor, x: torch.Tensor, name: str) -> None:
    if got.dtype != x.dtype:
        raise ExerciseError(
            f"{name} came back as {_name(got.dtype)} for an input in {_name(x.dtype)}: keep the input's dtype "
            f"(no .float() or .double(); new tensors made with dtype=x.dtype)."
        )


# ----------------------------------------------------------------------------------------------------------
# Exercise 1: repeating key/value heads for grouped-query attention


def _reference_repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    return x.repeat_interleave(n_rep, dim=1)  # (B, h_kv * n_rep, S, d): head j reads head j // n_rep


def _repeat_kv_cases():
    gen = torch.Generator().manual_seed(10)
    x = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    return [  # (what, x, n_rep): h_kv > 1 and n_rep > 1 first, where tiling and repeating differ
        ("h_kv = 2 key/value heads shared by n_rep = 3 query heads each", x(2, 2, 5, 4), 3),
        ("h_kv = 3 key/value heads, n_rep = 2", x(2, 3, 5, 4), 2),
        ("one key/value head for 4 query heads (multi-query attention)", x(2, 1, 5, 4), 4),
        ("n_rep = 1 (as many key/value heads as query heads)", x(2, 3, 5, 4), 1),
    ]


_AXES = {0: "batch", 1: "heads", 2: "sequence", 3: "feature"}


def _repeat_shape(got: torch.Tensor, x: torch.Tensor, n_rep: int, case: str) -> None:
    """A message for a result of the wrong shape that names how it came about."""
    B, h_kv, S, d = x.shape
    h = h_kv * n_rep
    want = (B, h, S, d)
    shape = tuple(got.shape)
    if shape == want:
        return
    if shape == tuple(x.shape):
        raise ExerciseError(
            f"{case}: your result has shape {shape}, the input's: the heads are NOT REPEATED (n_rep = {n_rep} was "
            f"not used). Each of the {h_kv} key/value heads must appear n_rep times: {want}."
        )
    if got.dim() == 1 and got.numel() == x.numel() * n_rep:
        raise ExerciseError(
            f"{case}: your result is a FLAT tensor of {got.numel()} entries: repeat_interleave without dim= "
            f"flattens its input first. Give the heads axis: x.repeat_interleave(n_rep, dim=1) -> {want}."
        )
    for dim in (0, 2, 3):
        grown = list(x.shape)
        grown[dim] *= n_rep
        if shape == tuple(grown):
            raise ExerciseError(
                f"{case}: your result has shape {shape}: you repeated along dim {dim}, the {_AXES[dim]} axis "
                f"({x.shape[dim]} became {x.shape[dim] * n_rep}). The heads are dim 1 of (B, h_kv, S, d): repeat "
                f"along dim=1 -> {want}."
            )
    if shape == (B, h_kv * h, S, d) and n_rep > 1:
        raise ExerciseError(
            f"{case}: your result has {h_kv * h} heads: each key/value head was repeated h = {h} times, the number "
            f"of QUERY heads. Repeat each one n_rep = h // h_kv = {n_rep} times -> {want}."
        )
    if shape in ((B, h_kv, n_rep, S, d), (B, n_rep, h_kv, S, d)):
        tiled = " (and merging (B, n_rep, h_kv, ...) would tile the heads: put the new axis AFTER the heads)" \
            if shape[1] == n_rep and n_rep != h_kv else ""
        raise ExerciseError(
            f"{case}: your result is 5-D, {shape}: the new axis was never merged into the heads{tiled}. "
            f"x[:, :, None].expand(B, h_kv, n_rep, S, d).reshape(B, h_kv * n_rep, S, d) -> {want}."
        )
    if shape == (B, S, h, d):
        raise ExerciseError(
            f"{case}: your result has shape (B, S, h, d) = {shape}: the heads and the positions are swapped. The "
            f"input is (B, h_kv, S, d), heads at dim 1, and so is the result: {want}."
        )
    require_shape(got, want, f"{case}: your result", "(B, h_kv * n_rep, S, d)")


def _head_map(got: torch.Tensor, x: torch.Tensor) -> list[int | None]:
    """For each head of ``got``, the head of ``x`` it is a copy of (None if none)."""
    return [next((i for i in range(x.shape[1]) if close(got[:, j], x[:, i])), None) for j in range(got.shape[1])]


_EXPAND_HINT = (
    "expand only repeats an axis of SIZE 1: it works for one key/value head (multi-query attention) and fails for "
    "more. Insert a new axis after the heads and expand that one: x[:, :, None].expand(B, h_kv, n_rep, S, d), then "
    ".reshape(B, h_kv * n_rep, S, d)."
)


def check_repeat_kv(fn) -> None:
    """Check ``fn(x, n_rep)``: (B, h_kv, S, d) -> (B, h_kv * n_rep, S, d), query head j reading key/value head
    j // n_rep; for grouped-query (h_kv > 1) and multi-query (h_kv = 1) attention and n_rep = 1."""
    what = "your function"
    forbidden = _forbidden({"attention_course.decoding": ("repeat_kv",),
                            "transformers.models.llama.modeling_llama": ("repeat_kv",)})
    used = []
    for case, x, n_rep in _repeat_kv_cases():
        given = x.clone()
        got, err = _run_watched(fn, (given, n_rep), forbidden, used)
        if err is not None:
            if "expanded size" in str(err):  # expand on the heads axis itself
                raise _error(err, f"{case}: {what}", _EXPAND_HINT)
            raise ExerciseError(f"{case}: {raised(err, what)}") from err
        got = _tensor(got, f"{case}: {what}", f"the repeated heads (B, h_kv * n_rep, S, d)")
        _unchanged(x, given, "x", what)
        _repeat_shape(got, x, n_rep, case)
        _same_dtype(got, x, f"{case}: your result")
        want = _reference_repeat_kv(x, n_rep)
        if close(got, want, ATOL):
            continue
        h_kv, h = x.shape[1], x.shape[1] * n_rep
        mapping, expected = _head_map(got, x), [j // n_rep for j in range(h)]
        if None in mapping:
            j = mapping.index(None)
            raise ExerciseError(
                f"{case}: head {j} of your result is not a copy of any key/value head of x (its entries and the "
                f"expected head's {describe_diff(got[:, j], want[:, j], 'the expected head')}): every output head "
                f"must be one of the "
                f"input's heads, unchanged, for every sentence of the batch."
            )
        if mapping == [j % h_kv for j in range(h)]:
            raise ExerciseError(
                f"{case}: your query heads 0..{h - 1} read key/value heads {mapping}, expected {expected}. The "
                f"whole block of heads is TILED n_rep times (x.repeat(1, n_rep, 1, 1), torch.cat([x] * n_rep, 1), "
                f"or a new axis BEFORE the heads), so query head j reads head j % h_kv: heads paired with the wrong "
                f"group. Repeat each head in place: x.repeat_interleave(n_rep, dim=1)."
            )
        raise ExerciseError(
            f"{case}: your query heads 0..{h - 1} read key/value heads {mapping}, expected {expected}: query head "
            f"j reads key/value head j // n_rep."
        )
    _refuse(used, what, "Build it from tensor operations: x.repeat_interleave(n_rep, dim=1), or a new axis after the "
                        "heads, expanded and reshaped.")
    passed("query head j reads key/value head j // n_rep, for grouped-query attention (h_kv = 2 and 3), "
           "multi-query attention (h_kv = 1) and n_rep = 1.")


# ----------------------------------------------------------------------------------------------------------
# Exercise 2: rotary positions, split halves


def _rope(x: torch.Tensor, positions: torch.Tensor, *, pairs: str = "halves", sign: float = 1.0, start: str = "given",
          exponent: str = "2i/d", layout: str = "cat", swap: bool = False, sin_term: bool = True,
          angle_dtype: torch.dtype | None = None) -> torch.Tensor:
    """RoPE of x (..., L, d) at positions (L,): the reference, and each classic mistake as an option.

    pairs "interleaved": features (2i, 2i + 1) rotated together; sign -1: rotate_half = cat(x2, -x1); start
    "zero" (positions ignored, 0 .. L-1) or "plus one"; exponent "i/d" (the factor 2 lost), "+2i/d" (growing
    frequencies), "per feature" (arange(d) / d, no repetition) or "zero" (integer division); layout "pairs"
    (angles repeat_interleave(2)); swap: cos and sin exchanged; sin_term False: x * cos alone; angle_dtype: the
    frequencies and angles computed in that dtype (float32).
    """
    d = x.shape[-1]
    dtype = angle_dtype or x.dtype
    positions = {"given": positions, "zero": torch.arange(len(positions)), "plus one": positions + 1}[start]
    i = torch.arange(d if exponent == "per feature" else d // 2, dtype=dtype)
    power = {"2i/d": 2 * i / d, "i/d": i / d, "+2i/d": -2 * i / d, "per feature": i / d, "zero": 0 * i}[exponent]
    theta = BASE ** -power  # (d/2,), or (d,) per feature
    angle = positions.to(dtype)[:, None] * theta  # (L, d/2)
    cos, sin = angle.cos(), angle.sin()
    if swap:
        cos, sin = sin, cos
    if pairs == "interleaved":
        even, odd = x[..., 0::2], x[..., 1::2]  # (..., L, d/2) each
        turned = torch.stack([even * cos - sign * odd * sin, odd * cos + sign * even * sin], -1)
        return turned.flatten(-2) if sin_term else torch.stack([even * cos, odd * cos], -1).flatten(-2)
    if exponent != "per feature":
        cos, sin = (torch.cat([t, t], -1) if layout == "cat" else t.repeat_interleave(2, -1) for t in (cos, sin))
    x1, x2 = x.chunk(2, -1)
    half = torch.cat([-sign * x2, sign * x1], -1)  # rotate_half(x)
    return x * cos + half * sin if sin_term else x * cos


def _reference_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    return _rope(x, positions)


_ROPE_MISTAKES = [
    (dict(pairs="interleaved"),
     "your rotation turns INTERLEAVED pairs of features, (0, 1), (2, 3), ... (the convention of RoFormer, GPT-J and "
     "Meta's complex numbers). This exercise uses split halves, Llama's and transformers': frequency i turns "
     "features i and i + d/2, out = x * cos + rotate_half(x) * sin with rotate_half(x) = cat(-x2, x1) and the "
     "angles repeated for both halves, cat([angles, angles], -1)."),
    (dict(sign=-1.0),
     "your rotation turns by MINUS the angle: rotate_half has its sign flipped, cat(x2, -x1). It is "
     "cat(-x2, x1): the first half gets -x2, the second x1."),
    (dict(pairs="interleaved", sign=-1.0),
     "your rotation turns INTERLEAVED pairs of features, (0, 1), (2, 3), ..., and by minus the angle. This "
     "exercise uses split halves: out = x * cos + rotate_half(x) * sin, rotate_half(x) = cat(-x2, x1)."),
    (dict(start="zero"),
     "your rotation uses positions 0 .. L-1, not the positions given: the positions RESTARTED at 0. A decode "
     "step's tokens sit after the cached ones: rotate token l by positions[l] * theta_i."),
    (dict(start="plus one"),
     "your rotation turns each token by its position + 1 (positions counted from 1): position p has the angle "
     "p * theta_i, so the token at position 0 is not rotated at all."),
    (dict(exponent="i/d"),
     "your frequencies are 10000 ** (-i / d): the exponent lost its factor 2. theta_i = 10000 ** (-2i / d) for "
     "i = 0 .. d/2 - 1, that is 10000 ** (-arange(0, d, 2) / d)."),
    (dict(exponent="+2i/d"),
     "your frequencies are 10000 ** (+2i / d) and grow with i: the exponent is NEGATIVE, theta_i = "
     "10000 ** (-2i / d) = 1 / 10000 ** (2i / d)."),
    (dict(exponent="per feature"),
     "your angles have one frequency per FEATURE, 10000 ** (-j / d) for j = 0 .. d-1: RoPE has one per pair of "
     "features, d/2 of them, theta_i = 10000 ** (-2i / d), and each pair (i, i + d/2) shares its angle: "
     "cat([angles, angles], -1)."),
    (dict(exponent="zero"),
     "your rotation turns every pair by the same angle, the position itself: all frequencies came out 1, an "
     "exponent of 0 (integer division, arange(0, d, 2) // d?). theta_i = 10000 ** (-2i / d), with a true "
     "division in floating point."),
    (dict(layout="pairs"),
     "your cos and sin are laid out PER PAIR, repeat_interleave(2) (frequencies 0, 0, 1, 1, ...), the layout of "
     "the interleaved convention, while rotate_half pairs feature i with i + d/2. In split halves the angles are "
     "repeated for both halves: cat([angles, angles], -1) (frequencies 0, 1, ..., 0, 1, ...)."),
    (dict(swap=True),
     "your cos and sin are SWAPPED: out = x * cos + rotate_half(x) * sin, so that position 0 leaves x as it is."),
    (dict(sin_term=False),
     "your result is x * cos alone: the rotate_half(x) * sin term is missing. A rotation mixes the two features "
     "of each pair: out = x * cos + rotate_half(x) * sin."),
]


def _rope_cases():
    gen = torch.Generator().manual_seed(11)
    x = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    return [  # (what, x (B, h, L, d), positions (L,)): L differs from d/2 and d, so a broadcast slip shows
        ("positions 0 .. 4 (a prefill of 5 tokens)", x(2, 3, 5, 8), torch.arange(5)),
        ("positions 40, 41, 42 (three tokens after 40 cached ones)", x(2, 3, 3, 8), torch.arange(40, 43)),
        ("one token at position 97", x(1, 2, 1, 8), torch.tensor([97])),
    ]


def _outer_product_failure(x, positions):
    """The broadcast a learner meets with positions * theta (L,) * (d/2,) instead of an outer product."""
    theta = BASE ** (-torch.arange(0, x.shape[-1], 2, dtype=x.dtype) / x.shape[-1])
    return positions * theta


def _angle_failures(x, positions):
    """The errors of angles of the wrong shape meeting x (B, h, L, d), each with its message (for _same_failure)."""
    d = x.shape[-1]
    theta = BASE ** (-torch.arange(0, d, 2, dtype=x.dtype) / d)  # (d/2,)
    half = positions.to(x.dtype)[:, None] * theta  # (L, d/2)
    flipped = positions.to(x.dtype)[None, :] * theta[:, None]  # (d/2, L)
    return [
        (lambda: x * half.cos(), "Your cos and sin have d/2 columns, one per FREQUENCY, while x has d features: "
                                 "repeat the angles for both halves, cat([angles, angles], -1) -> (L, d)."),
        (lambda: x * torch.cat([flipped, flipped], -1).cos(),
         "Your angles are (d/2, L), frequencies down and positions across: the angles are "
         "positions[:, None] * theta -> (L, d/2), one row per token."),
        (lambda: x * torch.cat([flipped, flipped], 0).cos(),
         "Your angles are (d, L), frequencies down and positions across: the angles are "
         "positions[:, None] * theta -> (L, d/2), one row per token, then cat([angles, angles], -1)."),
    ]


def _rope_values(got, x, positions, case) -> None:
    """``got`` against the reference: nothing if equal, else the mistake named."""
    want = _reference_rope(x, positions)
    if close(got, want, ATOL):
        return
    for variant, message in _ROPE_MISTAKES:  # compared loosely, so that a mistake made in float32 is still named
        wrong = _rope(x, positions, **variant)
        if not close(wrong, want, 1e-3) and close(got, wrong, 1e-5):  # (a mistake that changes nothing here: skip)
            raise ExerciseError(f"{case}: {message}")
    diff = max_diff(got, want)
    if diff < 1e-4:
        raise ExerciseError(
            f"{case}: your result agrees with the rotation only to {diff:.1g}, FLOAT32 precision: the frequencies "
            f"or angles were computed in float32 (torch.arange(0, d, 2) / d is float32, and so is .float()). "
            f"Build them in x's dtype, torch.arange(0, d, 2, dtype=x.dtype), so that float64 stays exact."
        )
    raise ExerciseError(
        f"{case}: your result and the rotation {describe_diff(got, want, 'the rotation')}. Frequency i turns "
        f"features i and i + d/2 by positions[l] * 10000 ** (-2i / d): out = x * cos + rotate_half(x) * sin."
    )


def check_apply_rope(fn) -> None:
    """Check ``fn(x, positions)``: x (B, h, L, d) rotated at positions (L,), split halves, base 10000."""
    what = "your function"
    cases = _rope_cases()
    forbidden = _forbidden({"attention_course.rope": ("apply_rope", "rope_cos_sin", "rotate_half"),
                            "transformers.models.llama.modeling_llama": ("apply_rotary_pos_emb", "rotate_half")})
    used = []
    for case, x, positions in cases:
        given, given_positions = x.clone(), positions.clone()
        got, err = _run_watched(fn, (given, given_positions), forbidden, used)
        if err is not None:
            hint = ("positions (L,) times the frequencies (d/2,) broadcast against each other: take their OUTER "
                    "product, positions[:, None] * theta -> (L, d/2).")
            if _same_failure(err, [(lambda: _outer_product_failure(x, positions), "")]) is not None:
                raise _error(err, f"{case}: {what}", hint)
            message = _same_failure(err, _angle_failures(x, positions))
            if message is not None:
                raise _error(err, f"{case}: {what}", message)
            raise ExerciseError(f"{case}: {raised(err, what)}") from err
        got = _tensor(got, f"{case}: {what}", "x rotated, (B, h, L, d)")
        _unchanged(x, given, "x", what)
        _unchanged(positions, given_positions, "positions", what)
        B, h, L, d = x.shape
        if tuple(got.shape) == (B, h, L, d // 2):
            raise ExerciseError(
                f"{case}: your result has shape {tuple(got.shape)}, HALF the features: return both halves, "
                f"out = x * cos + rotate_half(x) * sin, shape {(B, h, L, d)}."
            )
        require_shape(got, (B, h, L, d), f"{case}: your result", "(B, h, L, d), the shape of x")
        _same_dtype(got, x, f"{case}: your result")
        _rope_values(got, x, positions, case)
    case, x, positions = cases[1]
    x32 = x.float()
    got, err = _run(fn, x32.clone(), positions.clone())
    if err is not None:
        raise ExerciseError(f"x in float32: {raised(err, what)}") from err
    got = _tensor(got, f"x in float32: {what}", "x rotated")
    require_shape(got, tuple(x.shape), "x in float32: your result", "(B, h, L, d)")
    _same_dtype(got, x32, "x in float32: your result")
    if max_diff(got, _reference_rope(x, positions)) > 1e-4:
        raise ExerciseError(f"x in float32: your result and the rotation computed in float64 "
                            f"{describe_diff(got, _reference_rope(x, positions), 'the rotation')}.")
    _refuse(used, what, "Build the angles positions[:, None] * theta yourself and write rotate_half as "
                        "torch.cat([-x2, x1], -1).")
    passed("split-halves RoPE with base 10000 at the positions given (a prefill, a chunk after 40 cached tokens, one "
           "token at 97), exact in float64 and float32 kept float32.")


# ----------------------------------------------------------------------------------------------------------
# Exercise 3: one decode step with a KV cache


def _attend(q, keys, values, mask, *, scale="sqrt(d)", softmax_dim=-1, fill=NEG_INF, where="before",
            sdpa=False, key_axes=(-2, -1)):
    """softmax(q keys^T / sqrt(d), masked) values: (B, h, L, d), (B, h, S, d) x 2, (L, S) ignore mask or None.

    Mistakes as options: ``fill`` a finite fill; ``where`` "after" (weights zeroed after the softmax); ``sdpa``:
    the mask handed to SDPA, which reads True as MAY attend (a query with no True gets zeros); ``key_axes`` the
    axes the keys are transposed on."""
    d = q.shape[-1]
    scores = q @ keys.transpose(*key_axes) / {"sqrt(d)": math.sqrt(d), "d": d, "none": 1.0}[scale]  # (B, h, L, S)
    if sdpa and mask is not None:
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
    if mask is not None and where == "before":
        scores = scores.masked_fill(mask, fill)
    weights = scores.softmax(softmax_dim)
    if mask is not None and where == "after":
        weights = weights.masked_fill(mask, 0.0)
    return weights @ values


def _decode(q, k, v, cache_k, cache_v, *, start="cache", cat_dim=2, mask="positions", own_key=True, store="end",
            rope_on="qk", rerotate=False, twice="", scale="sqrt(d)", softmax_dim=-1, **attend):
    """One decode step: the reference, and each classic mistake as an option.

    start "zero" / "plus one" / "heads": the new tokens rotated at 0 .. L-1 / T+1 .. T+L / h .. h+L-1 (T read from
    cache_k.shape[1]); cat_dim: the axis the cache grows along; mask "none", "top-left" (triu(1) of (L, S), SDPA's
    is_causal), "hide cache" (the cache masked), "L x L" (the new tokens' own (L, L) mask), "zero" (built from
    positions 0 .. L-1), "keep" (the keys each query may see: polarity swapped), "past" (k < q hidden: the
    comparison turned round) or "transposed" ((S, L)); own_key False: the new tokens attend to the old cache only
    ("values only": the new values appended, not the keys); store "front", "unchanged", "new only" or "raw"
    (unrotated keys kept); rope_on: which of q, k, v are rotated; rerotate True: the whole cache (old keys and the
    new unrotated ones) rotated at 0 .. S-1, "all": the cache with the new keys already rotated, rotated again at
    0 .. S-1; twice "k" or "qk": the new keys (and queries) rotated twice at their positions; ``attend``: the
    options of :func:`_attend` (fill, where, sdpa, key_axes).
    """
    T, L = cache_k.shape[2], q.shape[2]
    first = {"cache": T, "zero": 0, "plus one": T + 1, "heads": cache_k.shape[1]}[start]
    positions = torch.arange(first, first + L)
    turn = lambda t, name: _rope(t, positions) if name in rope_on else t  # noqa: E731
    rq, rk, rv = turn(q, "q"), turn(k, "k"), turn(v, "v")
    if "k" in twice:
        rk = _rope(rk, positions)
    if "q" in twice:
        rq = _rope(rq, positions)
    keys = torch.cat([cache_k, rk], cat_dim)  # (B, h, T + L, d)
    values = torch.cat([cache_v, rv], cat_dim)
    if rerotate:
        keys = _rope(keys if rerotate == "all" else torch.cat([cache_k, k], cat_dim), torch.arange(T + L))
    kept_k, kept_v = {"end": (keys, values), "front": (torch.cat([rk, cache_k], 2), torch.cat([rv, cache_v], 2)),
                      "unchanged": (cache_k, cache_v), "new only": (rk, rv),
                      "raw": (torch.cat([cache_k, k], 2), values)}[store]
    if own_key is False:
        keys, values = cache_k, cache_v
    elif own_key == "values only":
        keys = cache_k
    S = keys.shape[2]
    key_at, query_at = torch.arange(S), torch.arange(T, T + L)  # the true positions
    future = key_at[None, :] > query_at[:, None]  # (L, S)
    ones = lambda n, m: torch.ones(n, m, dtype=torch.bool)  # noqa: E731
    masks = {"positions": future, "none": None, "top-left": ones(L, S).triu(1),
             "hide cache": future | (key_at[None, :] < T), "L x L": ones(L, L).triu(1),
             "zero": key_at[None, :] > torch.arange(L)[:, None], "keep": ~future,
             "past": key_at[None, :] < query_at[:, None], "transposed": key_at[:, None] > query_at[None, :]}
    if mask == "flat":  # positions compared element by element: (S,) > (L,), broadcast or an error
        masks["flat"] = key_at > query_at
    out = _attend(rq, keys, values, masks[mask], scale=scale, softmax_dim=softmax_dim, **attend)
    return out, kept_k, kept_v


def _reference_decode_step(q, k, v, cache_k, cache_v):
    return _decode(q, k, v, cache_k, cache_v)


def _full(q, k, v):
    """Causal attention over all N tokens at once, RoPE at 0 .. N-1: what a cache must reproduce. (B, h, N, d)."""
    N = q.shape[2]
    positions = torch.arange(N)
    future = positions[None, :] > positions[:, None]
    return _attend(_rope(q, positions), _rope(k, positions), v, future)


_DECODE_MISTAKES = [
    (dict(start="zero"),
     "the new tokens are rotated at positions 0 .. L-1, as if the sequence RESTARTED at 0: they sit after the T "
     "cached tokens, at positions T .. T+L-1 with T = cache_k.shape[2]. RoPE scores depend on the distance between "
     "query and key, and these distances are off by T."),
    (dict(start="zero", mask="zero"),
     "the new tokens are placed at positions 0 .. L-1, as if the sequence RESTARTED at 0, in the rotation and in "
     "the mask: they sit after the T cached tokens, at positions T .. T+L-1 with T = cache_k.shape[2]."),
    (dict(start="plus one"),
     "the new tokens are rotated one position too far, at T+1 .. T+L: positions start at 0, so the T cached "
     "tokens hold 0 .. T-1 and the first new token is at T = cache_k.shape[2]."),
    (dict(cat_dim=1), "the cache is grown along dim 1, the heads axis: the WRONG AXIS. Append along dim 2, the "
                      "sequence axis of (B, h, T, d): torch.cat([cache_k, k], dim=2)."),
    (dict(cat_dim=3), "the cache is grown along dim 3, the feature axis: the WRONG AXIS. Append along dim 2, the "
                      "sequence axis of (B, h, T, d): torch.cat([cache_k, k], dim=2)."),
    (dict(cat_dim=0), "the cache is grown along dim 0, the batch axis: the WRONG AXIS. Append along dim 2, the "
                      "sequence axis of (B, h, T, d): torch.cat([cache_k, k], dim=2)."),
    (dict(mask="top-left"),
     "the causal mask is aligned TOP-LEFT, as if the new tokens were the first ones: new query i sees keys "
     "0 .. i and the rest of the cache is hidden (triu(1) of an (L, S) mask, or SDPA's is_causal=True with "
     "L != S, which aligns it so). Query i sits at position T + i and reads every key at a position <= T + i: "
     "mask where key position > query position (triu(diagonal=T + 1))."),
    (dict(mask="hide cache"),
     "the mask HIDES THE CACHE: the new tokens see only one another, a mask built for the new tokens alone and "
     "extended with True over the T cached keys. Only keys AFTER a query are hidden: key position > query "
     "position, over all T + L keys."),
    (dict(mask="L x L"),
     "the mask is the new tokens' own (L, L) causal mask, while the scores are (L, S) with S = T + L keys: build "
     "the mask over all S keys, key position > query position (triu(diagonal=T + 1) of an (L, S) mask)."),
    (dict(own_key=False),
     "the new tokens attend to the OLD CACHE ONLY, without their own keys and values: append k and v to the cache "
     "first, then attend to all T + L entries (a token reads itself)."),
    (dict(own_key="values only"),
     "the new KEYS are not appended before the scores (the values are): the new tokens must read their own keys "
     "too. Append k and v to the caches first, then attend to all T + L keys and values."),
    (dict(rope_on="qkv"),
     "the VALUES are rotated too: RoPE turns queries and keys, whose dot product it makes depend on the distance; "
     "values are taken as they are."),
    (dict(rope_on="k"),
     "the QUERIES are not rotated: RoPE turns the new queries and the new keys, both at the new tokens' "
     "positions T .. T+L-1."),
    (dict(rope_on="q"),
     "the new KEYS are not rotated: RoPE turns the new queries and the new keys, both at the new tokens' "
     "positions T .. T+L-1, and the keys are stored in the cache rotated."),
    (dict(rerotate=True),
     "the cached keys are ROTATED AGAIN: the cache holds keys already rotated, each at its own position, so only "
     "the new keys are rotated, at T .. T+L-1, before they are appended."),
    (dict(start="heads"),
     "the new tokens are rotated at positions h .. h+L-1, h the number of HEADS: T was read from the wrong axis of "
     "the cache, cache_k.shape[1]. The cache is (B, h, T, d): T = cache_k.shape[2], the sequence axis."),
    (dict(mask="keep"),
     "the mask's POLARITY IS SWAPPED: -inf fills the keys each query may see (key position <= query position), so "
     "it reads only the keys AFTER it, and a query with none (the last one) gets NaN. masked_fill hides where the "
     "mask is True: fill where key position > query position."),
    (dict(mask="positions", sdpa=True),
     "the IGNORE mask went to F.scaled_dot_product_attention, whose bool attn_mask means the opposite, True = MAY "
     "attend: each query read only the keys AFTER it (and a query with none got zeros). Hand SDPA the keep mask, "
     "~mask (key position <= query position), or use masked_fill(mask, -inf) with the ignore mask."),
    (dict(mask="transposed"),
     "the mask is TRANSPOSED, (S, L): rows are the keys, so each query sees itself and the keys after it, and a "
     "step with L != S new tokens cannot even broadcast it. Build it (L, S), queries down: "
     "key_positions[None, :] > positions[:, None]."),
    (dict(mask="flat"),
     "the mask compares the positions ELEMENT BY ELEMENT, key_positions > positions, without the axes that make "
     "it (L, S): with L = S it is one row of False (no mask at all), with one query it happens to work, with "
     "other L it cannot broadcast. key_positions[None, :] > positions[:, None] -> (L, S)."),
    (dict(mask="none"),
     "there is NO CAUSAL MASK among the new tokens: new token i reads the new tokens after it. With one new token "
     "nothing is hidden, but a prefill or a chunk of L > 1 tokens needs key position > query position hidden."),
    (dict(mask="past"),
     "the comparison is TURNED ROUND: the mask hides the keys BEFORE each query (key position < query position) "
     "and shows itself and the keys after it. Hide key position > query position."),
    (dict(fill=float("inf")),
     "the hidden scores are filled with +inf, not -inf: exp(+inf) takes all the weight and inf / inf is NaN. "
     "Fill with float('-inf'), which exp turns into 0."),
    (dict(fill=0.0),
     "the hidden scores are set to 0, not -inf: a score of 0 still gets the weight exp(0) / sum, as much as an "
     "ordinary key. Fill with float('-inf') (a finite fill must be far below every score, as -1e9 is)."),
    (dict(where="after"),
     "the mask is applied AFTER THE SOFTMAX (weights set to 0): each row's weights no longer sum to 1. Fill the "
     "SCORES with -inf before the softmax, which then shares each row among the visible keys."),
    (dict(rerotate="all"),
     "the keys are ROTATED TWICE: the whole cache, with the new keys already rotated, is rotated again at "
     "0 .. S-1. The cache holds keys rotated once, at their own positions: rotate only the new keys, once, before "
     "appending them."),
    (dict(twice="k"),
     "the new keys are ROTATED TWICE at their positions (rotating twice by p * theta turns by 2p * theta): rotate "
     "k once, with apply_rope(k, positions), and store that."),
    (dict(twice="qk"),
     "the new queries and keys are ROTATED TWICE at their positions (rotating twice by p * theta turns by "
     "2p * theta, while the cached keys were turned once): rotate q and k once each."),
    (dict(key_axes=(1, 2)),
     "the keys are transposed on the wrong axes: keys.transpose(1, 2) swaps the heads and the positions. The "
     "scores are q @ keys.transpose(-2, -1), (B, h, L, d) @ (B, h, d, S) -> (B, h, L, S)."),
    (dict(scale="d"), "the scores are divided by d: the scale is 1/sqrt(d), the square root of the head size."),
    (dict(scale="none"), "the scores are not scaled: divide q @ k^T by sqrt(d), the square root of the head size."),
    (dict(softmax_dim=-2), "the softmax runs over the QUERIES (dim=-2): each query's weights are a distribution "
                           "over the keys, softmax(dim=-1)."),
    (dict(softmax_dim=1), "the softmax runs over the HEADS (dim=1 of the (B, h, L, S) scores): each query's weights "
                          "are a distribution over the keys, softmax(dim=-1)."),
]

# The caches a step returns when its output is right: what is wrong with them.
_CACHE_MISTAKES = [
    (dict(store="unchanged"),
     "the caches returned are the ones given, NOT GROWN: return them with the new keys and values appended, "
     "(B, h, T+L, d), or the next step forgets these tokens."),
    (dict(store="new only"),
     "the caches returned hold ONLY THE NEW keys and values: return the whole cache, the T old entries and the "
     "L new ones, (B, h, T+L, d)."),
    (dict(store="front"),
     "the new keys and values are at the FRONT of the caches returned: append them at the end, "
     "torch.cat([cache_k, k], dim=2), so that entry n of the cache is the token at position n."),
    (dict(store="raw"),
     "the new keys are stored UNROTATED: the cache holds keys rotated at their own positions (so that no later "
     "step rotates them again), so store k after RoPE."),
]


def _decode_cases():
    """(what, q_all, k_all, v_all, T, L): tokens 0 .. T-1 cached, T .. T+L-1 new."""
    gen = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(2, 3, 8, 8, generator=gen, dtype=DTYPE) for _ in range(3))  # (B, h, N, d)
    return (q, k, v), [
        ("a prefill: 4 tokens and an empty cache (T = 0)", 0, 4),
        ("one new token after 5 cached ones", 5, 1),
        ("three new tokens at once after 5 cached ones", 5, 3),
    ]


def _step_inputs(q, k, v, T, L):
    """The new tokens' q, k, v (unrotated) and the cache of the T before them (keys rotated)."""
    new = lambda t: t[:, :, T:T + L].clone()  # noqa: E731
    return new(q), new(k), new(v), _rope(k[:, :, :T], torch.arange(T)), v[:, :, :T].clone()


def _triple(got, case: str):
    what = f"{case}: your decode_step"
    if got is None:
        raise ExerciseError(f"{what} returned None: is the return statement missing? It must return the tuple "
                            f"(out, cache_k, cache_v).")
    if isinstance(got, torch.Tensor):
        raise ExerciseError(f"{what} returned one tensor, {tuple(got.shape)}: return the tuple (out, cache_k, "
                            f"cache_v), the output AND the grown caches, which the next step needs.")
    if not isinstance(got, (tuple, list)) or len(got) != 3:
        size = f" of {len(got)}" if isinstance(got, (tuple, list)) else ""
        raise ExerciseError(f"{what} must return the tuple (out, cache_k, cache_v), got {type(got).__name__}{size}.")
    if not all(isinstance(t, torch.Tensor) for t in got):
        kinds = ", ".join(type(t).__name__ for t in got)
        raise ExerciseError(f"{what} must return three tensors (out, cache_k, cache_v), got ({kinds}).")
    return [t.detach().cpu() for t in got]


def _matching(got, args, mistakes, parts=3) -> list:
    """The mistakes (switches, message) whose step returns what the learner's does (the first ``parts`` tensors:
    3 for all, 1 for out alone)."""
    found = []
    for switches, message in mistakes:
        try:
            candidate = _decode(*args, **switches)
        except Exception:  # noqa: BLE001 - a mistake that raises on this case is not this result
            continue
        if all(close(a, b, 1e-8) for a, b in zip(got[:parts], candidate[:parts])):
            found.append((switches, message))
    return found


def _agrees(fn, switches, args, parts=3) -> bool:
    """Whether the learner's step does on ``args`` what the step with the mistake ``switches`` does: the same
    tensors (the first ``parts``), or the same error."""
    result, err = _run(fn, *[t.clone() for t in args])
    try:
        candidate, other = _decode(*args, **switches), None
    except Exception as failure:  # noqa: BLE001
        candidate, other = None, failure
    if err is not None or other is not None:
        return err is not None and other is not None and same_error(err, other)
    return isinstance(result, (tuple, list)) and len(result) == 3 and all(
        isinstance(a, torch.Tensor) and close(a.detach().cpu(), b, 1e-8)
        for a, b in zip(result[:parts], candidate[:parts]))


def _name_decode(fn, got, args, mistakes, later, parts=3) -> str | None:
    """The message of the mistake whose step returns what the learner's does (all three tensors, or out alone for
    ``parts`` = 1). When several do on this case (a prefill cannot tell a transposed mask from a turned
    comparison), the learner's step is run on the ``later`` cases (name, args) until one is left; if none
    separates them, both are named."""
    found = _matching(got, args, mistakes, parts)
    for name, other in later:
        if len(found) < 2:
            break
        kept = [m for m in found if _agrees(fn, m[0], other, parts)]
        found = kept or found
    if len(found) > 1:
        return (f"two mistakes give this result and no case of the checker tells them apart: either "
                f"{found[0][1][0].lower() + found[0][1][1:]} Or {found[1][1]}")
    return found[0][1] if found else None


def _check_step(fn, args, want, case: str, later=()) -> list[torch.Tensor]:
    """Run one step, compare with ``want`` (out, cache_k, cache_v); name the mistake (running the ``later`` cases,
    (name, args), to choose between mistakes this one cannot tell apart); return the learner's triple."""
    given = [t.clone() for t in args]
    result, err = _run(fn, *given)
    what = f"{case}: your decode_step"
    if err is not None:
        variants = [((lambda s=switches: _decode(*args, **s)), message) for switches, message in _DECODE_MISTAKES]
        message = _same_failure(err, variants)
        if message is not None:
            raise _error(err, what, message[0].upper() + message[1:])
        raise ExerciseError(f"{case}: {raised(err, 'your decode_step')}") from err
    got = _triple(result, case)
    for name, before, after in zip(("q", "k", "v", "cache_k", "cache_v"), args, given):
        _unchanged(before, after, name, "your decode_step")
    out, cache_k, cache_v = got
    q, cache = args[0], args[3]
    B, h, L, d = q.shape
    T = cache.shape[2]
    require_shape(out, (B, h, L, d), f"{what}'s out", "(B, h, L, d), one row per new query")
    if all(close(a, b, ATOL) for a, b in zip(got, want)):
        return got
    message = _name_decode(fn, got, args, _DECODE_MISTAKES, later)
    if message is None and not close(out, want[0], ATOL):
        message = _name_decode(fn, got, args, _DECODE_MISTAKES, later, parts=1)
    if message is not None:
        raise ExerciseError(f"{what}: {message}")
    for name, tensor in (("cache_k", cache_k), ("cache_v", cache_v)):
        if tuple(tensor.shape) == (B, h, T, d) and L:
            raise ExerciseError(f"{what}: {_CACHE_MISTAKES[0][1]}")
        if tuple(tensor.shape) == (B, h, L, d) and T:
            raise ExerciseError(f"{what}: {_CACHE_MISTAKES[1][1]}")
        require_shape(tensor, (B, h, T + L, d), f"{what}'s {name}", "(B, h, T + L, d)")
    for tensor in got:
        _same_dtype(tensor, q, f"{what}'s result")
    if not close(out, want[0], ATOL):
        diff = max_diff(out, want[0])
        precision = (" That is float32 precision: a step ran in float32 (a .float(), or the rotation's angles "
                     "made in float32); keep the inputs' float64.") if diff < 1e-4 else ""
        raise ExerciseError(f"{what}: out and the full recomputation over all T + L tokens "
                            f"{describe_diff(out, want[0], 'the recomputation')}.{precision}")
    message = _name_decode(fn, [want[0], cache_k, cache_v], args, _CACHE_MISTAKES, ())
    if message is not None:
        raise ExerciseError(f"{what}: out is right, but {message}")
    wrong = "cache_k" if not close(cache_k, want[1], ATOL) else "cache_v"
    raise ExerciseError(f"{what}: out is right, but the {wrong} returned is not the old cache with the new entries "
                        f"appended at the end (keys rotated at their positions).")


def check_decode_step(fn) -> None:
    """Check ``fn(q, k, v, cache_k, cache_v) -> (out, cache_k, cache_v)``: one step of causal attention with a KV
    cache (RoPE at positions T .. T+L-1 on q and k) equals the full recomputation over all T + L tokens, and the
    caches it returns carry a generation on."""
    (q, k, v), cases = _decode_cases()
    full = _full(q, k, v)  # (B, h, N, d)
    inputs = [(case, _step_inputs(q, k, v, T, L)) for case, T, L in cases]
    for n, (case, T, L) in enumerate(cases):
        args = inputs[n][1]
        want = (full[:, :, T:T + L], _rope(k[:, :, :T + L], torch.arange(T + L)), v[:, :, :T + L])
        assert close(want[0], _reference_decode_step(*args)[0], 1e-12), "the reference is the recomputation"
        _check_step(fn, args, want, case, later=inputs[n + 1:])
    # A generation: a prefill of 3 tokens, then one token at a time, each step given the caches the last returned.
    N, prefill = q.shape[2], 3
    want = full[:, :, :prefill], _rope(k[:, :, :prefill], torch.arange(prefill)), v[:, :, :prefill]
    _, cache_k, cache_v = _check_step(fn, _step_inputs(q, k, v, 0, prefill), want, "generation, a prefill of 3")
    for t in range(prefill, N):
        args = (q[:, :, t:t + 1].clone(), k[:, :, t:t + 1].clone(), v[:, :, t:t + 1].clone(), cache_k, cache_v)
        result, err = _run(fn, *args)
        what = f"generation step {t - prefill + 1} (token {t}, given the caches your previous call returned)"
        if err is not None:
            raise ExerciseError(f"{what}: {raised(err, 'your decode_step')}") from err
        out, cache_k, cache_v = _triple(result, what)
        if not close(out, full[:, :, t:t + 1], ATOL):
            raise ExerciseError(
                f"{what}: out and the full recomputation {describe_diff(out, full[:, :, t:t + 1], 'the recomputation')}"
                f", though each step alone was right: does your step keep a state of its own between calls (a "
                f"global, a counter)? Everything it needs is in the caches it is given."
            )
    passed(f"one step with the cache equals full recomputation (to {ATOL:g} in float64): a prefill, one token, "
           f"three at once, and a generation of {N - prefill} steps fed back their own caches.")


# ----------------------------------------------------------------------------------------------------------
# Exercise 4: the sliding-window mask


def _window(q_positions, k_positions, window, *, low=">=", causal="strict", band="one-sided"):
    """The (L, S) ignore mask: the reference, and the classic slips as options.

    low ">" (window + 1 keys seen), ">=-1" (window - 1 seen) or "none" (window ignored); causal "none" (future keys
    visible) or "self" (the query's own key hidden too); band "symmetric": |q - k| >= window, no causal part;
    "forward": k - q in place of q - k, the window looking ahead.
    """
    diff = q_positions[:, None] - k_positions[None, :]  # (L, S): how far back each key lies
    if band == "forward":  # k - q for q - k: the window looks ahead
        diff = -diff
    if band == "symmetric":
        return diff.abs() >= window
    future = {"strict": diff < 0, "self": diff <= 0, "none": torch.zeros_like(diff, dtype=torch.bool)}[causal]
    far = {">=": diff >= window, ">": diff > window, ">=-1": diff >= window - 1,
           "none": torch.zeros_like(diff, dtype=torch.bool)}[low]
    return future | far


def _reference_window_mask(q_positions, k_positions, window):
    return _window(q_positions, k_positions, window)


def _window_cases():
    return [  # (what, q_positions, k_positions, window)
        ("a prefill of 6 tokens, window 3", torch.arange(6), torch.arange(6), 3),
        ("one query at position 9 over keys 0 .. 9, window 4", torch.tensor([9]), torch.arange(10), 4),
        ("three queries at 7, 8, 9 over keys 0 .. 9, window 3", torch.arange(7, 10), torch.arange(10), 3),
        ("a rolling cache of 4 entries holding keys 8, 9, 10, 7 (ring-buffer order), query 10, window 3",
         torch.tensor([10]), torch.tensor([8, 9, 10, 7]), 3),
        ("window 1: each query sees itself only", torch.arange(4), torch.arange(4), 1),
        ("window 10 over 5 tokens: the plain causal mask", torch.arange(5), torch.arange(5), 10),
    ]


_WINDOW_MISTAKES = [
    (dict(low=">"),
     "each query sees window + 1 keys: an OFF BY ONE, hiding only q - k > window. With window W a query sees "
     "itself and the W - 1 positions before it: hide q - k >= W."),
    (dict(low=">=-1"),
     "each query sees window - 1 keys: an OFF BY ONE, hiding q - k >= window - 1. With window W a query sees "
     "itself and the W - 1 positions before it: hide q - k >= W."),
    (dict(band="symmetric"),
     "the band is symmetric, |q - k| >= window: it is NOT CAUSAL, the keys up to window - 1 positions AFTER each "
     "query are visible. Hide the future too: k > q, or q - k >= window."),
    (dict(causal="none"),
     "only the keys too far back are hidden: the band is NOT CAUSAL, every key after a query is visible. Hide the "
     "future too: k > q, or q - k >= window."),
    (dict(low="none"),
     "the WINDOW IS IGNORED: this is the plain causal mask, and keys any distance back stay visible. Hide also "
     "the keys window or more positions back: q - k >= window."),
    (dict(band="forward"),
     "the window LOOKS FORWARD: each query sees itself and the window - 1 positions AFTER it, and hides the past "
     "(k - q in place of q - k). back = q_positions[:, None] - k_positions[None, :] is how far back a key lies: "
     "hide back < 0 and back >= window."),
    (dict(causal="self"),
     "each query's OWN KEY is hidden (k >= q): a token attends to itself. Hide only the keys after it, k > q."),
]


def _window_shape(mask, L, S, case) -> None:
    shape = tuple(mask.shape)
    if shape == (S, L) and S != L:
        raise ExerciseError(f"{case}: your mask has shape (S, L) = {shape}, TRANSPOSED: rows are the queries, "
                            f"columns the keys, mask[i, j] for query i and key j -> {(L, S)}.")
    if mask.dim() == 1 and len(mask) in (L, S):
        raise ExerciseError(f"{case}: your mask is 1-D, {shape}: the positions were compared ELEMENT BY ELEMENT "
                            f"(q_positions - k_positions). Every query meets every key: give them axes, "
                            f"q_positions[:, None] - k_positions[None, :] -> (L, S) = {(L, S)}.")
    if mask.dim() > 2 and mask.numel() == L * S:
        raise ExerciseError(f"{case}: your mask has shape {shape}: return the (L, S) = {(L, S)} mask itself; "
                            f"broadcasting adds the batch and head axes when it meets the scores.")
    require_shape(mask, (L, S), f"{case}: your mask", "(L, S)")


def _window_dtype(mask, want, case) -> None:
    if mask.dtype == torch.bool:
        return
    start = f"{case}: your mask has dtype {_name(mask.dtype)}, numbers; an ignore mask is bool, True = hidden."
    values = mask.double()
    if torch.equal(values, torch.zeros_like(values).masked_fill(want, NEG_INF)):
        raise ExerciseError(f"{start} Yours is an ADDITIVE mask (0 or -inf), made to be added to the scores: return "
                            f"the bool comparison itself.")
    if torch.equal(values, (~want).double()):
        raise ExerciseError(f"{start} Yours holds 1 where a key may be attended: a KEEP mask as numbers. Return "
                            f"the bool ignore mask, True where the key is hidden.")
    raise ExerciseError(f"{start} Keep the comparisons' bool result (no .int(), .float() or .long()).")


def _transposed_or_forward(fn, window) -> str:
    """The name of a mask equal to the expected one transposed on a square case: a transposed mask and a window
    that looks forward are the same there; three queries over ten keys tell them apart."""
    q_positions, k_positions = torch.arange(7, 10), torch.arange(10)
    got, err = _run(fn, q_positions.clone(), k_positions.clone(), window)
    got = got.detach().cpu() if err is None and isinstance(got, torch.Tensor) else None
    separate = "queries 7, 8, 9 over keys 0 .. 9"
    if got is not None and tuple(got.shape) == (10, 3):
        return (f"your mask is TRANSPOSED: rows are the queries, columns the keys, mask[i, j] for query i and key j "
                f"(with {separate} it comes out (S, L) = (10, 3)).")
    if got is not None and torch.equal(got, _window(q_positions, k_positions, window, band="forward")):
        return next(message for variant, message in _WINDOW_MISTAKES if variant.get("band") == "forward")
    return (f"your mask is the expected one turned round: either TRANSPOSED (rows must be the queries, columns the "
            f"keys) or a window that LOOKS FORWARD (k - q in place of q - k); on a square mask the two are the same, "
            f"and {separate} tells them apart. Hide back < 0 and back >= window, with "
            f"back = q_positions[:, None] - k_positions[None, :].")


def check_window_mask(fn) -> None:
    """Check ``fn(q_positions, k_positions, window)``: the (L, S) bool ignore mask of causal sliding-window attention,
    True where k > q or q - k >= window, from the positions given (keys possibly out of order)."""
    what = "your function"
    forbidden = _forbidden({"attention_course.decoding": ("decode_mask",)})
    used = []
    for case, q_positions, k_positions, window in _window_cases():
        args = q_positions.clone(), k_positions.clone(), window
        got, err = _run_watched(fn, args, forbidden, used)
        if err is not None:
            raise ExerciseError(f"{case}: {raised(err, what)}") from err
        mask = _tensor(got, f"{case}: {what}", "the (L, S) ignore mask")
        _unchanged(q_positions, args[0], "q_positions", what)
        _unchanged(k_positions, args[1], "k_positions", what)
        L, S = len(q_positions), len(k_positions)
        want = _reference_window_mask(q_positions, k_positions, window)
        _window_shape(mask, L, S, case)
        _window_dtype(mask, want, case)
        if torch.equal(mask, want):
            continue
        if torch.equal(mask, ~want):
            raise ExerciseError(f"{case}: your mask is True where a key MAY be attended: an allow (keep) mask, the "
                                f"convention SWAPPED. The course's masks are ignore masks: True = hidden, where "
                                f"k > q or q - k >= window.")
        if L == S and torch.equal(mask, want.T):  # square: transposed, or looking forward? A non-square case says
            raise ExerciseError(f"{case}: {_transposed_or_forward(fn, window)}")
        for variant, message in _WINDOW_MISTAKES:
            if torch.equal(mask, _window(q_positions, k_positions, window, **variant)):
                raise ExerciseError(f"{case}: {message}")
        by_index = [(torch.arange(L), torch.arange(S), "0 .. L-1 for the queries and 0 .. S-1 for the keys"),
                    (torch.arange(S - L, S), torch.arange(S), "S-L .. S-1 for the queries and 0 .. S-1 for the keys")]
        for q_index, k_index, which in by_index:
            if torch.equal(mask, _window(q_index, k_index, window)):
                raise ExerciseError(
                    f"{case}: your mask is built from INDICES ({which}), not from the positions given: query "
                    f"positions {q_positions.tolist()}, key positions {k_positions.tolist()}. Compare the positions "
                    f"themselves, q_positions[:, None] - k_positions[None, :]: a decode step's queries come after "
                    f"the cache, and a rolling cache holds its keys out of order."
                )
        wrong = (mask != want).nonzero().tolist()
        i, j = wrong[0]
        raise ExerciseError(
            f"{case}: your mask differs at {len(wrong)} of {L * S} entries, e.g. query {i} (position "
            f"{int(q_positions[i])}) and key {j} (position {int(k_positions[j])}): expected "
            f"{bool(want[i, j])}. Hide a key when k > q or q - k >= window."
        )
    _refuse(used, what, "Compare the positions yourself: back = q_positions[:, None] - k_positions[None, :].")
    passed("True exactly where the key is in the future or window or more positions back: a prefill, decode steps, "
           "a rolling cache out of order, window 1 and a window wider than the sequence.")
