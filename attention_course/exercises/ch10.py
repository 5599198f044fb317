"""Checkers for chapter 10, attention that writes (the notebook states each exercise in full; masks are IGNORE masks):
1. ``my_repeat_kv(x, n_rep)`` -- grade_id ``ex-ch10-repeat-kv``: query head j reads key/value head j // n_rep.
2. ``my_apply_rope(x, positions)`` -- grade_id ``ex-ch10-rope``: split-halves RoPE, base 10000, at the positions given.
3. ``decode_step(q, k, v, cache_k, cache_v)`` -- grade_id ``ex-ch10-decode-step``: causal attention with a KV cache.
4. ``window_mask(q_positions, k_positions, window)`` -- grade_id ``ex-ch10-window-mask``: the sliding-window mask."""
from __future__ import annotations

import math
from functools import partial, reduce

import torch
import torch.nn.functional as F

from .diagnose import Case, Exercise, Mistake, check, source

F32 = torch.float32
randn = lambda *shape, seed=10, dtype=torch.float64: torch.randn(  # noqa: E731
    *shape, generator=torch.Generator().manual_seed(seed), dtype=dtype)

_repeat_case = lambda B, h_kv, S, d, n_rep, dtype=torch.float64: Case(  # noqa: E731
    f"{h_kv} key/value head{'s' * (h_kv > 1)}, {f'n_rep = {n_rep}' if n_rep > 1 else 'no copies (n_rep 1)'}, x of "
    f"shape {(B, h_kv, S, d)}" + " in float32" * (dtype == F32), (randn(B, h_kv, S, d, dtype=dtype), n_rep))
AXES = {0: "batch", 1: "heads", 2: "sequence", 3: "feature"}

def _heads_read(got, x, n_rep):
    """Which head of x each head of a wrong result holds, against head j // n_rep."""
    if not (isinstance(got, torch.Tensor) and got.dim() == 4 and got.shape[::2] == x.shape[::2] and
            got.shape[3] == x.shape[3]):
        return ""
    held = [source(got[:, j], {str(i): x[:, i] for i in range(x.shape[1])}) for j in range(got.shape[1])]
    right = [str(j // n_rep) for j in range(x.shape[1] * n_rep)]
    k = len(held) // x.shape[1]  # each head k times, in order: a copy count other than n_rep
    times = f": each head {k} time{'s' * (k > 1)}, n_rep = {n_rep}" if held == [str(j // k) for j in range(len(held))] \
        and k not in (0, n_rep) else ""
    return "" if held in (right, ["none"] * len(held)) else f"Its {len(held)} heads hold x's heads [{', '.join(held)}]" \
        f", where the right {len(right)} hold [{', '.join(right)}] (head j // n_rep){times}."

REPEAT_KV = Exercise(
    what="your repeat_kv", reference=lambda x, n_rep: x.repeat_interleave(n_rep, dim=1),  # head j reads j // n_rep
    cases=[_repeat_case(*c) for c in ((1, 1, 1, 1, 1), (1, 2, 1, 1, 3), (1, 1, 2, 3, 4), (2, 3, 3, 2, 2),
                                      (2, 3, 2, 4, 1), (1, 2, 3, 2, 2, F32))],
    mistakes=[
        Mistake("tiled", "is TILED (x.repeat(1, n_rep, 1, 1), a new axis BEFORE the heads): query head j reads head "
                "j % h_kv, the wrong group: use repeat_interleave(n_rep, dim=1).", lambda x, n: x.repeat(1, n, 1, 1)),
        Mistake("not repeated", "returns x: the heads are NOT REPEATED, n_rep unused.", lambda x, n: x),
        *[Mistake(f"dim {a}", f"repeats along dim {a}, the {AXES[a]} axis: the heads are dim 1 of (B, h_kv, S, d).",
                  partial(lambda x, n, a: x.repeat_interleave(n, dim=a), a=a)) for a in (0, 2, 3)],
        Mistake("flat", "is FLAT: repeat_interleave without dim= flattens x. Give it dim=1.", torch.repeat_interleave),
        Mistake("h times", "repeats each head h_kv * n_rep times, once per QUERY head: n_rep times is enough.",
                lambda x, n: x.repeat_interleave(x.shape[1] * n, dim=1)),
        Mistake("h_kv times", "repeats each head h_kv times.", lambda x, n: x.repeat_interleave(x.shape[1], 1)),
        *[Mistake(f"copies at {a}", f"repeats each {w} (or stacks the copies after that axis), then reshapes: values "
                  f"scrambled. Put the copies RIGHT AFTER THE HEADS, x[:, :, None].expand(B, h_kv, n_rep, S, d).",
                  lambda x, n, a=a: torch.stack([x] * n, a).flatten(1, 2).view_as(x.repeat_interleave(n, 1)))
          for a, w in ((3, "ROW, the sequence axis"), (4, "FEATURE"))],
        *[Mistake(f"head {j}", f"gives query head j key/value head {j}: head j // n_rep, each serving n_rep heads in a "
                  f"row.", lambda x, n, f=f: x[:, f(torch.arange(x.shape[1] * n), x.shape[1], n)])
          for j, f in (("j // h_kv", lambda j, h, n: j // h), ("j // h_kv (clamped)", lambda j, h, n: (j // h).clamp(
              max=h - 1)), ("j % n_rep", lambda j, h, n: j % n))],
        Mistake("S, d swapped", "views the result as (B, h, d, S), S and d swapped: values scrambled, no transpose "
                "fixes it.", lambda x, n: x.repeat_interleave(n, 1).reshape(*x.shape[:1], -1, *x.shape[:1:-1])),
        Mistake("groups per sentence", "makes one group per SENTENCE, range(x.shape[0]), the batch size: one per "
                "key/value head, x.shape[1].", lambda x, n: torch.cat([x[:, g:g + 1].expand(-1, n, -1, -1)
                                                                       for g in range(x.shape[0])], 1)),
        Mistake("n_rep // h_kv", "repeats each head n_rep // h_kv times, n_rep read as the number of query heads: "
                "each key/value head serves n_rep query heads, repeat_interleave(n_rep, dim=1).",
                lambda x, n: x.repeat_interleave(n // x.shape[1], dim=1)),
        Mistake("5-D", "is 5-D: the new axis was never merged into the heads, .reshape(B, h_kv * n_rep, S, d).",
                lambda x, n: x[:, :, None].expand(-1, -1, n, -1, -1)),
        Mistake("expand", "expands the heads axis: expand repeats only an axis of SIZE 1 (multi-query attention). "
                "Expand a new axis after the heads, x[:, :, None].", lambda x, n: x.expand(-1, x.shape[1] * n, -1, -1)),
    ],
    passed="query head j reads key/value head j // n_rep: h_kv = 1 to 3, n_rep = 1 to 4, float32 kept float32.",
    notes=_heads_read,
    forbidden=("attention_course.decoding.repeat_kv", "transformers.models.llama.modeling_llama.repeat_kv"),
    instead="Build it from tensor operations: x.repeat_interleave(n_rep, dim=1), or a new axis expanded and merged.",
)
def check_repeat_kv(fn) -> None:
    """Check ``fn(x, n_rep)``: (B, h_kv, S, d) -> (B, h_kv * n_rep, S, d), query head j reading head j // n_rep."""
    check(REPEAT_KV, fn)

def _rope(x, positions, pairs=False, sign=1, start=None, power=2, layout="cat", swap=False, sin_term=1, outer="rows",
          dtype=None, axis=-1, over=-1, base=10000.0, first=0, width=None, half=True):  # RoPE of x (..., L, d) at (L,)
    d, n, dtype = x.shape[over], x.shape[axis], dtype or x.dtype
    p = (torch.arange(len(positions)) if start == 0 else positions + (start or 0)).to(dtype)
    theta = base ** (-power * torch.arange(first, (n if layout == "feature" else n // 2) + first, dtype=dtype) /
                     (width or d))  # (d/2,), and the slips (the frequencies from i = 1, d written in)
    angle = p[:, None] * theta if outer == "rows" else p * theta if outer == "flat" else theta[:, None] * p[None, :]
    cos, sin = (angle.sin(), angle.cos()) if swap else (angle.cos(), angle.sin())  # (L, d/2)
    if pairs:  # interleaved: features (2i, 2i + 1) turned together
        even, odd = x[..., 0::2], x[..., 1::2]
        return torch.stack([even * cos - sign * odd * sin, odd * cos + sign * even * sin], -1).flatten(-2)
    if layout in ("cat", "pairs"):
        cos, sin = (torch.cat([t, t], -1) if layout == "cat" else t.repeat_interleave(2, -1) for t in (cos, sin))
    x1, x2 = x.chunk(2, -1)
    return x * cos + (torch.cat([-sign * x2, sign * x1], -1) if half else x) * sin * sin_term  # + rotate_half(x) sin

_rope_case = lambda B, h, at, d, dtype=torch.float64: Case(  # noqa: E731
    f"positions {at}, x of shape {(B, h, len(at), d)}" + " in float32" * (dtype == F32),
    (randn(B, h, len(at), d, seed=11, dtype=dtype), torch.tensor(at)),
    {"at the frequencies i > 0, whose theta_i is not 1": (torch.arange(d) % (d // 2) > 0).expand(B, h, len(at), d),
     "in the second half of the features (i >= d/2)": (torch.arange(d) >= d // 2).expand(B, h, len(at), d)})
_turn = lambda name, says, **switches: Mistake(name, says, partial(_rope, **switches))  # noqa: E731
HALVES = "here features i and i + d/2 turn together: x * cos + rotate_half(x) * sin, rotate_half = cat(-x2, x1)."
APPLY_ROPE = Exercise(
    what="your apply_rope", reference=_rope,
    cases=[_rope_case(*c) for c in ((1, 1, [0], 2), (1, 1, [7], 2), (1, 2, [40, 41, 42], 4), (1, 2, [5, 6], 8, F32),
                                    (2, 1, [3, 97], 6), (2, 3, [*range(5)], 8), (1, 2, [12, 0, 7, 30], 8))],
    mistakes=[
        _turn("interleaved", "turns INTERLEAVED pairs (2i, 2i + 1), RoFormer's and Meta's way: " + HALVES, pairs=True),
        _turn("interleaved, minus", "turns INTERLEAVED pairs, by minus the angle: " + HALVES, pairs=True, sign=-1),
        _turn("minus", "turns by MINUS the angle: rotate_half is cat(-x2, x1), not cat(x2, -x1).", sign=-1),
        _turn("x * sin", "multiplies x ITSELF by sin, x * cos + x * sin: the sine term is rotate_half(x) * sin, "
              "rotate_half = cat(-x2, x1).", half=False),
        _turn("restart", "uses positions 0 .. L-1: the positions RESTARTED at 0. Use the positions given.", start=0),
        _turn("plus one", "turns each token by its position + 1: position p has the angle p * theta_i.", start=1),
        _turn("i/d", "uses 10000 ** (-i / d): the exponent lost its factor 2, -arange(0, d, 2) / d.", power=1),
        _turn("+2i/d", "uses 10000 ** (+2i / d), growing with i: the exponent is NEGATIVE, -2i / d.", power=-2),
        _turn("4i/d", "uses 10000 ** (-4i / d): the 2 counted twice, arange(0, d, 2) already steps by 2.", power=4),
        *[_turn(f"d = L{a}", "reads d from x.shape[-2], the number of TOKENS: d is x.shape[-1].", over=-2, axis=a)
          for a in (-1, -2)],
        _turn("per feature", "has a frequency per FEATURE: RoPE has d/2, one per pair.", power=1, layout="feature"),
        _turn("integer division", "turns every pair by the same angle: the exponent came out 0, an integer division "
              "(arange(0, d, 2) // d). Divide in floating point, in x's dtype.", power=0, dtype=F32),
        _turn("pairs", "lays cos and sin out PER PAIR (0, 0, 1, 1, ..), not cat([angles, angles]).", layout="pairs"),
        _turn("swapped", "has cos and sin SWAPPED: x * cos + rotate_half(x) * sin.", swap=True),
        *[_turn(f"base {b:g}", f"uses the base {b:g}: this exercise's is 10000.", base=b) for b in (1e3, 1e5, 5e5)],
        _turn("from 1", "counts the frequencies from i = 1: theta_i = 10000^(-2i/d) for i = 0 .. d/2 - 1.", first=1),
        _turn("d = 16", "divides the exponent by 16, the chapter's d, written in: theta_i = 10000^(-2i/d), d = "
              "x.shape[-1].", width=16),
        _turn("no sin", "returns x * cos: the sin term is missing, + rotate_half(x) * sin.", sin_term=0),
        _turn("no outer", "multiplies positions (L,) by frequencies (d/2,): take their OUTER product.", outer="flat"),
        _turn("turned", "builds the angles (d/2, L), frequencies down: positions[:, None] * theta.", outer="turned"),
        _turn("not repeated", "has d/2 angles, one per FREQUENCY: repeat them for both halves.", layout=None),
        Mistake("first half", "returns the first HALF of the features only.", lambda x, p: _rope(x, p).chunk(2, -1)[0]),
        Mistake("half turned", "turns the first half only: the second half is x2 * cos + x1 * sin, not x2.",
                lambda x, p: torch.cat([_rope(x, p).chunk(2, -1)[0], x.chunk(2, -1)[1]], -1)),
    ],
    passed="split-halves RoPE at the positions given (any order, after a cache), d = 2 to 8, float32 kept float32.",
    forbidden=tuple(f"attention_course.rope.{f}" for f in ("apply_rope", "rope_cos_sin", "rotate_half")) + tuple(
        f"transformers.models.llama.modeling_llama.{f}" for f in ("apply_rotary_pos_emb", "rotate_half")),
    instead="Build the angles positions[:, None] * theta yourself and write rotate_half as torch.cat([-x2, x1], -1).",
)
def check_apply_rope(fn) -> None:
    """Check ``fn(x, positions)``: x (B, h, L, d) rotated at positions (L,), split halves, base 10000."""
    check(APPLY_ROPE, fn)

def _decode(q, k, v, cache_k, cache_v, start=None, cat=2, mask="future", own=True, store="end", turn="qk", again="",
            fill=-math.inf, after=False, sdpa=False, axes=(-2, -1), power=0.5, softmax=-1, width=0, front=False, by=-1,
            v_is_k=False):
    """One decode step: the reference, and the classic slips as switches (turn: what is rotated, how many times)."""
    T, L = cache_k.shape[2], q.shape[2]
    at = torch.arange(L) + {None: T, 0: 0, 1: T + 1, "heads": cache_k.shape[1], "d": cache_k.shape[3], "L": L}[start]
    rq, rk, rv = (reduce(lambda t, _: _rope(t, at), range(turn.count(c)), t) for t, c in ((q, "q"), (k, "k"), (v, "v")))
    rv = k if v_is_k else rv  # (a copy-paste: the values cache fed the new keys)
    keys, values = (torch.cat([new, old] if front else [old, new], cat) for old, new in ((cache_k, rk), (cache_v, rv)))
    if again:  # the whole cache (with the new keys unrotated, or rotated) rotated again at 0 .. S-1
        keys = _rope(keys if again == "all" else torch.cat([cache_k, k], 2), torch.arange(keys.shape[2]))
    kept = {"end": (keys, values), "front": (torch.cat([rk, cache_k], 2), torch.cat([rv, cache_v], 2)),
            "unchanged": (cache_k, cache_v), "new": (rk, rv), "raw": (torch.cat([cache_k, k], 2), values),
            "again": (_rope(torch.cat([cache_k, k], 2), torch.arange(T + L)), values)}[store]
    keys, values = {True: (keys, values), False: (cache_k, cache_v), "values": (cache_k, values)}[own]
    key, query, S = torch.arange(keys.shape[2]), torch.arange(T, T + L), keys.shape[2]
    back = query[:, None] - key[None, :]  # (L, S): how far back each key lies
    hidden = key > query if mask == "flat" else {  # "flat": (S,) > (L,)
        "future": back < 0, "none": None, "past": back > 0, "keep": back >= 0, "own": back <= 0,
        "top-left": torch.ones(L, S).triu(1) > 0, "L x L": torch.ones(L, L).triu(1) > 0, "transposed": (back < 0).T,
        "hide cache": (back < 0) | (key < T), "zero": key > torch.arange(L)[:, None]}[mask]
    if sdpa:
        return (F.scaled_dot_product_attention(rq, keys, values, attn_mask=hidden), *kept)  # True = MAY attend
    scores = rq @ keys.transpose(*axes) / ((L if by == "L" else keys.shape[by]) * q.shape[1] ** width) ** power
    weights = (scores if hidden is None or after else scores.masked_fill(hidden, fill)).softmax(softmax)
    return ((weights.masked_fill(hidden, 0.0) if after else weights) @ values, *kept)

def _steps(answer, q, k, v, cache_k, cache_v, *chunks):  # one call, or a generation fed the caches it returns
    outs, at = [], 0
    for n in chunks:
        out, cache_k, cache_v = answer(*(t[:, :, at:at + n] for t in (q, k, v)), cache_k, cache_v)
        outs, at = outs + [out], at + n
    return (torch.cat(outs, 2), cache_k, cache_v) if chunks else answer(q, k, v, cache_k, cache_v)

def _decode_case(B, h, T, L, d, *chunks):
    q, k, v = (randn(B, h, T + L, d, seed=s) for s in (12, 13, 14))  # (B, h, T + L, d): tokens 0 .. T+L-1
    name = f"{L} new token{'s' * (L > 1)} after T = {T} cached" if T else f"a prefill of {L} token{'s' * (L > 1)}"
    name = f"a generation, steps of {list(chunks)} tokens fed the caches returned" if chunks else name
    return Case(f"{name}, B = {B}, h = {h}, d = {d}",
                (q[:, :, T:], k[:, :, T:], v[:, :, T:], _rope(k[:, :, :T], torch.arange(T)), v[:, :, :T], *chunks))

_step = lambda name, says, **switches: Mistake(name, says, partial(_decode, **switches))  # noqa: E731
DECODE_STEP = Exercise(
    what="your decode_step", reference=lambda q, k, v, cache_k, cache_v: _decode(q, k, v, cache_k, cache_v),
    run=_steps, parts=("out", "cache_k", "cache_v"),
    cases=[_decode_case(*c) for c in ((1, 1, 0, 1, 2), (1, 1, 1, 1, 2), (1, 2, 0, 3, 4), (2, 1, 3, 1, 4),
                                      (1, 2, 2, 3, 2), (2, 3, 5, 2, 6), (1, 1, 4, 4, 8), (2, 2, 0, 6, 4, 3, 1, 1, 1))],
    mistakes=[
        _step("restart", "rotates the new tokens at 0 .. L-1, as if RESTARTED at 0: they sit at T .. T+L-1.", start=0),
        _step("masked 0", "rotates and masks the new tokens at 0 .. L-1, RESTARTED at 0, not T.", start=0, mask="zero"),
        _step("plus one", "rotates the new tokens one position too far, at T+1 .. T+L: the first is at T.", start=1),
        _step("T = L", "rotates the new tokens at L .. 2L-1, T read from q: T = cache_k.shape[2].", start="L"),
        _step("heads", "reads T from cache_k.shape[1], the number of HEADS: T = cache_k.shape[2].", start="heads"),
        _step("T = d", "reads T from cache_k.shape[-1], the head size d: T = cache_k.shape[2].", start="d"),
        *[_step(f"dim {a}", f"grows the cache along dim {a}, the {AXES[a]} axis: the WRONG AXIS. Append along dim 2, "
                "the sequence axis: torch.cat([cache_k, k], dim=2).", cat=a) for a in (0, 1, 3)],
        _step("top-left", "aligns the causal mask TOP-LEFT (triu(1) of an (L, S) mask, SDPA's is_causal=True), as if "
              "the new tokens came first (query i then reads keys <= i): new query i must read the keys at positions <= T + "
              "i.", mask="top-left"),
        _step("hide cache", "HIDES THE CACHE from the new tokens: hide only keys after a query.", mask="hide cache"),
        _step("L x L", "uses the new tokens' own (L, L) causal mask on (L, S) scores: mask all keys.", mask="L x L"),
        _step("no mask", "has NO CAUSAL MASK: a new token reads the new tokens after it.", mask="none"),
        _step("old cache only", "attends to the OLD CACHE ONLY: append k and v first, a token sees itself.", own=False),
        _step("values only", "appends the new values, not the new KEYS, before the scores: append both.", own="values"),
        _step("values cache gets k", "appends the new KEYS k to the values cache (a copy-paste?): cache_v grows "
              "with v, torch.cat([cache_v, v], dim=2).", v_is_k=True),
        _step("values rotated", "rotates the VALUES too: RoPE turns queries and keys alone.", turn="qkv"),
        _step("queries unrotated", "does not rotate the QUERIES: RoPE turns the new queries and keys.", turn="k"),
        _step("keys unrotated", "does not rotate the new KEYS: rotate them, and store them rotated.", turn="q"),
        _step("new keys twice", "rotates the new keys TWICE (by 2p * theta): rotate k once, store that.", turn="qkk"),
        _step("q and k twice", "rotates the new queries and keys TWICE (by 2p * theta): once each.", turn="qqkk"),
        _step("cache again", "rotates the cached keys AGAIN: they are kept rotated. Rotate new keys.", again="cache"),
        _step("all twice", "rotates the whole cache again: keys ROTATED TWICE. Rotate new keys, once.", again="all"),
        _step("keep mask", "fills the keys each query may see: the mask's POLARITY IS SWAPPED, a query reads only the "
              "keys AFTER it (the last, none: NaN). Hide key position > query position.", mask="keep"),
        _step("sdpa", "hands the IGNORE mask to F.scaled_dot_product_attention, which reads True as MAY attend: pass "
              "~mask, or masked_fill(mask, -inf) yourself.", sdpa=True),
        _step("transposed", "builds the mask TRANSPOSED, (S, L): queries down, keys across.", mask="transposed"),
        _step("flat", "compares the positions ELEMENT BY ELEMENT: keys[None, :] > queries[:, None].", mask="flat"),
        _step("past", "hides the keys BEFORE each query, the comparison TURNED ROUND: hide key > query.", mask="past"),
        _step("own key", "hides each new token's OWN KEY (key >= query): hide only key > query.", mask="own"),
        _step("+inf", "fills the hidden scores with +inf: exp(+inf) takes the weight, NaN. Use -inf.", fill=math.inf),
        _step("fill 0", "sets the hidden scores to 0, not -inf: exp(0) still gives them weight.", fill=0.0),
        _step("after", "masks AFTER THE SOFTMAX: rows no longer sum to 1. Fill the scores with -inf.", after=True),
        _step("axes", "transposes the keys on the wrong axes, (1, 2): q @ keys.transpose(-2, -1).", axes=(1, 2)),
        _step("scale d", "divides the scores by d: the scale is 1/sqrt(d).", power=1),
        _step("scale D", "divides by sqrt(h * d), the model's width: the scale is 1/sqrt(d), a head's.", width=1),
        _step("scale S", "divides the scores by sqrt(T + L), the number of keys: the scale is 1/sqrt(d).", by=2),
        _step("not scaled", "leaves the scores unscaled: divide them by sqrt(d).", power=0),
        _step("scale L", "divides the scores by sqrt(L), the number of NEW tokens, q.shape[2]: the scale is 1/sqrt(d), "
              "d = q.shape[-1].", by="L"),
        _step("softmax queries", "runs the softmax over the QUERIES: over the keys, softmax(dim=-1).", softmax=-2),
        _step("softmax heads", "runs the softmax over the HEADS: over the keys, softmax(dim=-1).", softmax=1),
        _step("not grown", "returns the caches NOT GROWN: append the new keys and values.", store="unchanged"),
        _step("new only", "returns caches of ONLY THE NEW keys and values: the T old ones and the L new.", store="new"),
        _step("front", "returns the right out, but the new entries at the FRONT of the caches.", store="front"),
        _step("prepended", "puts the new keys and values BEFORE the cache: append, cat([cache_k, k], 2).", front=True),
        _step("raw", "stores the new keys UNROTATED: the cache holds keys rotated at their positions.", store="raw"),
        _step("stored again", "stores cat([cache_k, k]) rotated at 0 .. T+L-1: the old keys TURNED TWICE.", store="again"),
    ],
    passed="each step equals attention over all T + L tokens: prefills, one token, chunks, d = 2 to 8, a generation.",
)
def check_decode_step(fn) -> None:
    """Check ``fn(q, k, v, cache_k, cache_v) -> (out, cache_k, cache_v)``: one causal step with a KV cache."""
    check(DECODE_STEP, fn)

def _window(q_positions, k_positions, window, near=0, far=0, band="causal", flat=False):  # and the slips
    back = q_positions - k_positions if flat else q_positions[:, None] - k_positions[None, :]  # (L, S)
    back = -back if band == "forward" else back
    return back.abs() >= window if band == "symmetric" else (back < near) | (back >= window + far)  # 0: the future

def _window_case(q, k, window):
    back = (q := torch.tensor(q))[:, None] - (k := torch.tensor(k))[None, :]
    marks = {"where the key is after the query (k > q)": back < 0, "at the query's own key (k = q)": back == 0,
             "at keys exactly window positions back": back == window, "at keys window - 1 back": back == window - 1}
    return Case(f"queries at {q.tolist()}, keys at {k.tolist()}, window = {window}", (q, k, window), marks)

_band = lambda name, says, **switches: Mistake(name, says, partial(_window, **switches))  # noqa: E731
SEES = "A query sees itself and the window - 1 positions before it: hide q - k >= window."
WINDOW_MASK = Exercise(
    what="your window_mask", reference=_window,
    cases=[_window_case(*c) for c in (([0], [0], 1), ([9], [*range(10)], 4), ([10], [8, 9, 10, 7], 3),
                                      ([7, 8, 9], [*range(10)], 3), ([2, 13], [13, 9, 4, 12, 10], 4),
                                      *(([*range(n)], [*range(n)], w) for n, w in ((4, 1), (6, 3), (5, 10))))],
    mistakes=[
        _band("window + 1", "lets a query see window + 1 keys: an OFF BY ONE, hiding q - k > window. " + SEES, far=1),
        _band("window - 1", "lets each query see window - 1 keys: an OFF BY ONE. " + SEES, far=-1),
        _band("symmetric", "hides |q - k| >= window, a symmetric band: NOT CAUSAL. Hide k > q too.", band="symmetric"),
        _band("no causal", "hides only the keys too far back: NOT CAUSAL. Hide k > q too.", near=-math.inf),
        _band("no window", "is the plain causal mask: the WINDOW IS IGNORED. Hide q - k >= window too.", far=math.inf),
        _band("own key", "hides each query's OWN KEY (k >= q): hide only k > q.", near=1),
        _band("shifted", "hides the query's OWN KEY, sees q - k = window: the window one step back. " + SEES, near=1, far=1),
        _band("forward", "LOOKS FORWARD: a query sees the window - 1 positions AFTER it (k - q).", band="forward"),
        _band("flat", "compares the positions ELEMENT BY ELEMENT: q[:, None] - k[None, :] is (L, S).", flat=True),
        Mistake("indices", "is built from INDICES 0 .. L-1 and 0 .. S-1, not from the positions given.",
                lambda q, k, w: _window(torch.arange(len(q)), torch.arange(len(k)), w)),
        Mistake("key indices", "is built from INDICES S-L .. S-1 and 0 .. S-1, not from the positions given.",
                lambda q, k, w: _window(torch.arange(len(k) - len(q), len(k)), torch.arange(len(k)), w)),
        Mistake("queries as indices", "takes the queries' INDICES 0 .. L-1 for their positions: use q_positions.",
                lambda q, k, w: _window(torch.arange(len(q)), k, w)),
        Mistake("keys as indices", "takes the keys' INDICES 0 .. S-1 for their positions: use k_positions.",
                lambda q, k, w: _window(q, torch.arange(len(k)), w)),
        Mistake("window by index", "keeps the last `window` keys BY INDEX (mask[:, :-window] = True), as if the keys "
                "were in position order: a ring buffer's are not. Hide q - k >= window, by positions.",
                lambda q, k, w: _window(q, k, math.inf) | (torch.arange(len(k)) < len(k) - w)[None, :]),
        Mistake("keys sorted", "SORTS the keys: column j is key j, in the order given (a ring buffer's).",
                lambda q, k, w: _window(q, k.sort().values, w)),
    ],
    passed="True where k > q or q - k >= window: prefills, decode steps, a ring buffer, windows 1 to 10.",
    forbidden=("attention_course.decoding.decode_mask",),
    instead="Compare the positions yourself: back = q_positions[:, None] - k_positions[None, :].",
)
def check_window_mask(fn) -> None:
    """Check ``fn(q_positions, k_positions, window)``: the (L, S) ignore mask, True where k > q or q - k >= window."""
    check(WINDOW_MASK, fn)

EXERCISES = [REPEAT_KV, APPLY_ROPE, DECODE_STEP, WINDOW_MASK]
