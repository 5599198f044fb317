"""Chapter 4's checkers: ``my_attention(x, W_q, W_k, W_v, key_padding_mask)`` (ex-ch4-by-hand), Q = x @ W_q;
``load_into_torch(mha, W_q, ..., b_o)`` (ex-ch4-copy) into a random ``nn.MultiheadAttention(D, 1)``."""
from __future__ import annotations

import copy

import torch
from torch import nn

from . import ExerciseError
from .ch02 import scale_note
from .diagnose import Case, Exercise, Mistake, check, same

def _attention(x, W_q, W_k, W_v, kpm, by=lambda x: x.shape[-1] ** 0.5, dim=-1, fill=float("-inf"),
               turn=lambda m: m[:, None, :], after=False, scale_after=False, added=False, Wt=False, swap=False,
               kT=lambda K: K.mT, values=lambda x, W_k, W_v: x @ W_v, wT=False, zero=False):
    """The reference; each slip an option (``by``: the divisor, ``fill`` None: no mask, ``turn``: the mask's axes)."""
    W_q, W_k, W_v = (W.T for W in (W_q, W_k, W_v)) if Wt else (W_q, W_k, W_v)
    Q, K, V = x @ W_q, x @ W_k, values(x, W_k, W_v)  # (B, L, D) each
    scores = (K @ Q.mT if swap else Q @ kT(K)) / (1 if scale_after else by(x))  # (B, L, S)
    m = turn(kpm)  # (B, 1, S): the padded keys, for every query
    if not after:
        scores = scores + m if added else scores if fill is None else scores.masked_fill(m, fill)
    weights = torch.softmax(scores, dim)
    weights = weights.masked_fill(m, 0.0) if after else weights / by(x) if scale_after else weights
    out = (weights.mT if wT else weights) @ V
    return out.masked_fill(kpm[..., None], 0.0) if zero else out, weights

def _run(answer, *args):  # twice, on copies: an answer with randomness in it (dropout) answers differently
    first = answer(*copy.deepcopy(args))
    if not same(first, answer(*args), 0.0):
        raise ExerciseError("your attention gave different results for the same inputs: something random runs in it. "
                            "Is dropout on? F.dropout(p) drops by default (training=True); this exercise has none.")
    return first

def _x(B, L, D, lengths, huge=False):
    g = torch.Generator().manual_seed(4)
    x, *W = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((B, L, D), (D, D), (D, D), (D, D)))
    if huge:  # Q = x, K = -x with x of norm 2e5 or more: every real score -1e10 or less, a -1e9 fill the highest
        x, W = (x.abs() + 1) * 1e5, [torch.eye(D, dtype=torch.float64) * sign for sign in (1, -1, 1)]
    kpm = torch.arange(L)[None, :] >= torch.tensor(lengths)[:, None]  # (B, L): True at pads
    name = f"B={B}, L={L}, D={D}, lengths {lengths}" + ", every score about -1e10" * huge
    q = kpm[..., None]  # (B, L, 1): the pad queries
    return Case(name, (x, *W, kpm), {"at the padded keys": kpm[:, None, :].expand(B, L, L), "at the pad queries":
                                     q.expand(B, L, L), "at the pad queries' outputs": q.expand(B, L, D)})

_a = lambda **slip: lambda *args: _attention(*args, **slip)  # noqa: E731
INF = "And fill with float('-inf'), not -1e9, which is an ordinary score."
_both = lambda name, says, **slip: [Mistake(name, says, _a(**slip)),  # noqa: E731 - and with a -1e9 fill
                                    Mistake(f"{name}, -1e9", f"{says} {INF}", _a(fill=-1e9, **slip))]
SQRT = "the scale is sqrt(D), D = x.shape[-1] the size of the vectors in each dot product."
SUM = "each query's weights over the keys must sum to 1: softmax(..., dim=-1)."
SELF_ATTENTION = Exercise(
    what="your attention",
    reference=_attention,
    cases=[_x(1, 1, 5, [1]), _x(1, 3, 2, [3]), _x(2, 5, 6, [5, 3]), _x(3, 4, 3, [4, 1, 2]), _x(1, 6, 4, [4], True)],
    mistakes=[
        Mistake("no scale", "did not scale the scores: divide Q K^T by sqrt(D).", _a(by=lambda x: 1)),
        *[Mistake(name, f"divided the scores by {name}; {SQRT}", _a(by=by)) for name, by in (
            ("D", lambda x: x.shape[-1]), ("sqrt(L), L = x.shape[1] the number of tokens", lambda x: x.shape[1]**.5))],
        Mistake("scaled after", "scaled the WEIGHTS by 1/sqrt(D): scale the scores.", _a(scale_after=True)),
        *[Mistake(f"{n} softmax", f"normalised over the {n} (softmax dim={d}): {SUM}", _a(dim=d))
          for n, d in (("queries", -2), ("batch, mixing the sentences", 0))],
        *_both("inverted", "masked the real tokens and left the pads: the mask is inverted. key_padding_mask is True "
               "at the PADS: fill the scores with -inf where it is True.", turn=lambda m: ~m[:, None, :]),
        *_both("queries", "masked the padded QUERIES (key_padding_mask[:, :, None]), not the padded KEYS: a -inf row "
               "is NaN. Mask key_padding_mask[:, None, :], never whole query rows.", turn=lambda m: m[:, :, None]),
        Mistake("no mask", "gives the pads weight: the mask was not applied.", _a(fill=None)),
        *[Mistake(f"fill {t}", f"filled the padded keys' scores with {t}, a finite score: {why}. Fill them with "
                  f"float('-inf').", _a(fill=float(t))) for t, why in (
            ("0", "exp(0) = 1, so the pads keep a share"), ("-1e9", "real scores below it leave the pads the weight"))],
        Mistake("added", "added the bool mask to the scores: True counts as 1. Fill with -inf.", _a(added=True)),
        Mistake("after", "applied the mask AFTER the softmax: mask the SCORES, before it.", _a(after=True)),
        Mistake("K.T", "used K.T, which reverses ALL the axes: Q @ K.transpose(-2, -1).",
                _a(kT=lambda K: K.permute(2, 1, 0))),
        *_both("keys and queries", "masked the pad QUERIES too (key_padding_mask[:, :, None]): a row all -inf is NaN. "
               "Mask the keys only, key_padding_mask[:, None, :].", turn=lambda m: m[:, None, :] | m[:, :, None]),
        Mistake("K = Q", "computed the scores Q Q^T: K = x @ W_k.", lambda x, W_q, _, *a: _attention(x, W_q, W_q, *a)),
        Mistake("(B, S) mask", "used the (B, S) mask as it is: key_padding_mask[:, None, :].", _a(turn=lambda m: m)),
        Mistake("x @ W.T", "used x @ W.T: these weights are in the math convention, Q = x @ W_q.", _a(Wt=True)),
        Mistake("K Q^T", "computed the scores K Q^T (or W_q and W_k swapped): Q @ K.transpose(-2, -1).", _a(swap=True)),
        Mistake("V = x", "averaged x: the output is weights @ V with V = x @ W_v.", _a(values=lambda x, *W: x)),
        Mistake("V = x @ W_k", "computed V = x @ W_k: V = x @ W_v.", _a(values=lambda x, W_k, W_v: x @ W_k)),
        Mistake("W_k and W_v swapped", "computed K with W_v and V with W_k, the two swapped: K = x @ W_k, V = x @ W_v.",
                lambda x, W_q, W_k, W_v, *a: _attention(x, W_q, W_v, W_k, *a)),
        Mistake("weights^T V", "multiplies the TRANSPOSED weights by V: out = weights @ V.", _a(wT=True)),
        Mistake("pad outputs 0", "sets out to 0 at the pads: only the pad KEYS are masked.", _a(zero=True)),
        Mistake("pair swapped", "returns (weights, out): return (out, weights).", lambda *a: _attention(*a)[::-1]),
        Mistake("out only", "returns out alone: return the pair (out, weights).", lambda *args: _attention(*args)[0]),
    ],
    passed="weights and output are softmax(mask(Q K^T / sqrt(D))) V, for one token and many, padded or not.",
    run=_run,
    parts=("out", "tensor of weights"),
    notes=lambda got, x, W_q, W_k, W_v, kpm: scale_note(got, (x @ W_q) @ (x @ W_k).mT, x.shape[-1], "D"),
)

def check_self_attention(fn) -> None:
    """Check ``fn(x, W_q, W_k, W_v, key_padding_mask) -> (out, weights)``."""
    check(SELF_ATTENTION, fn)

def _copy(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o, blocks=lambda Ws: [W.T for W in Ws], join=torch.cat,
          bias=True, out_w=lambda W_o: W_o.T, out_b=True, scale=()):
    """The reference; the slips: other ``blocks``, another ``join``, a part not copied, those in ``scale`` / sqrt(D)."""
    W_q, b_q = (t / len(b_q) ** 0.5 if n in scale else t for n, t in (("W_q", W_q), ("b_q", b_q)))
    with torch.no_grad():
        mha.in_proj_weight.copy_(join(blocks((W_q, W_k, W_v))))  # (3D, D): each block (out, in)
        mha.in_proj_bias.copy_(torch.cat([b_q, b_k, b_v])) if bias else None
        mha.out_proj.weight.copy_(out_w(W_o)) if out_w else None
        mha.out_proj.bias.copy_(b_o) if out_b else None

def _layer(D):
    g = torch.Generator().manual_seed(5)
    mha = nn.MultiheadAttention(D, 1, batch_first=True, dtype=torch.float64)
    for p in mha.parameters():  # random, non-zero values everywhere, so a missing copy shows
        p.data.copy_(torch.randn(p.shape, generator=g, dtype=torch.float64))
    weights = [torch.randn(*s, generator=g, dtype=torch.float64) for s in [(D, D)] * 3 + [(D,)] * 3 + [(D, D), (D,)]]
    rows = torch.arange(3 * D)[:, None].expand(3 * D, D) // D
    marks = {f"in the {n} block (rows {i * D}:{(i + 1) * D})": rows == i for i, n in enumerate(("W_q", "W_k", "W_v"))}
    return Case(f"D={D}", (mha, *weights), marks)

def _held(got, mha, *given):
    """The notes: which given tensor (or what it held) each block of in_proj_weight, in_proj_bias, out_proj holds."""
    r, names = len(given[3]) ** 0.5, "W_q W_k W_v b_q b_k b_v W_o b_o".split()
    known = [(f"{n}{t}{by}", (W.t() if t else W) / (r if by else 1)) for n, W in zip(names, given)
             for t in ("", ".T") for by in ("", " / sqrt(D)")]
    if not isinstance(got, tuple) or len(got) != 4 or got[0].shape != mha.in_proj_weight.shape:
        return ""
    was = [*mha.in_proj_weight.detach().chunk(3), *mha.in_proj_bias.detach().chunk(3), None, None]
    held = [next((n for n, W in [*known, ("what it held", w)] if same(b, W, 1e-12)), "something else") for b, w in
            zip([*got[0].chunk(3), *got[1].chunk(3), *got[2:]], was)]
    said = held[:6] != "W_q.T W_k.T W_v.T b_q b_k b_v".split() and set(held[:6]) != {"something else"}
    out = [f"Its {n} holds {h}." for n, h, ok in zip(("out_proj.weight", "out_proj.bias"), held[6:], ("W_o.T", "b_o"))
           if h not in (ok, "something else")]
    return " ".join([f"Its in_proj_weight holds {', '.join(held[:3])} in its 3 blocks; in_proj_bias "
                     f"{', '.join(held[3:6])}."] * said + out)

_c = lambda **slip: lambda *args: _copy(*args, **slip)  # noqa: E731
_parameters = lambda answer, mha, *weights: [answer(mha, *weights), tuple(  # noqa: E731 - called, then read
    p.detach().clone() for p in (mha.in_proj_weight, mha.in_proj_bias, *mha.out_proj.parameters()))][1]
CAT = "torch.cat([W_q.T, W_k.T, W_v.T])"
IN_PROJ_COPY = Exercise(
    what="your load_into_torch",
    reference=_copy,
    cases=[_layer(D) for D in (1, 2, 3, 4)],
    mistakes=[
        Mistake("not transposed", f"copies W_q, W_k and W_v without transposing: in_proj_weight holds (out, in) blocks "
                f"as nn.Linear does: {CAT}.", _c(blocks=list)),
        Mistake("q k order", f"puts W_k.T in the W_q block and W_q.T in the W_k block: the order is {CAT}.",
                _c(blocks=lambda Ws: [Ws[1].T, Ws[0].T, Ws[2].T])),
        Mistake("W_q everywhere", f"copies W_q.T into all 3 blocks: {CAT}.", _c(blocks=lambda Ws: [Ws[0].T] * 3)),
        *[Mistake(f"{n} scaled", f"divides {n} by sqrt(D): nn.MultiheadAttention scales the scores itself, so copy "
                  f"{n} as {'they are' if ' ' in n else 'it is'}.", _c(scale=n)) for n in ("W_q.T", "W_q.T and b_q")],
        *[Mistake(f"stack^T{n}", f"transposes the whole (3D, D) stack, torch.cat([W_q, W_k, W_v]).T{n}: transpose "
                  f"each block, {CAT}.", _c(blocks=list, join=j)) for n, j in (
            ("", lambda Ws: torch.cat(Ws).T), (".reshape(3D, D)", lambda Ws: torch.cat(Ws).T.reshape(-1, len(Ws[0]))))],
        Mistake("stack", f"stacks them, (3, D, D): in_proj_weight is {CAT}, not torch.stack.", _c(join=torch.stack)),
        *[Mistake(n, f"leaves {what} as it was: it must hold {must}.", _c(**slip)) for n, what, must, slip in (
            ("in bias", "in_proj_bias", "torch.cat([b_q, b_k, b_v]) (a parity check against a new layer, whose biases "
             "are 0, misses it)", dict(bias=False)), ("out weight", "out_proj.weight", "W_o.T", dict(out_w=None)),
            ("out bias", "out_proj.bias", "b_o", dict(out_b=False)),
            ("out_proj", "out_proj (weight and bias)", "W_o.T and b_o", dict(out_w=None, out_b=False)))],
        Mistake("nothing", "changes no parameter of mha: copy into the layer you are given.", lambda *args: None),
    ],
    passed="every parameter copied: in_proj_weight = [W_q.T; W_k.T; W_v.T], its bias, out_proj = W_o.T and b_o.",
    run=_parameters,
    parts=("in_proj_weight", "in_proj_bias", "out_proj.weight", "out_proj.bias"),
    notes=_held,
    hints=((r"leaf Variable|requires grad", "parameters track gradients: copy inside `with torch.no_grad():`."),
           (r"expanded size of the tensor|must match the size of tensor", "a block copied into a slice of another size: "
            "a size written in (the chapter's D?) or read from another tensor. D = W_q.shape[0]: in_proj_weight[:D], "
            "[D:2*D], [2*D:]."),),
)

def check_in_proj_copy(fn) -> None:
    """Check ``fn(mha, W_q, W_k, W_v, b_q, b_k, b_v, W_o, b_o)``, which copies hand-made weights into ``mha``."""
    check(IN_PROJ_COPY, fn)

EXERCISES = [SELF_ATTENTION, IN_PROJ_COPY]
