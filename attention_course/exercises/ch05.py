"""Chapter 5's checkers: ``my_split_heads(x, num_heads)`` (ex-ch5-split), (B, L, D) -> (B, h, L, d), head i holding
features i*d:(i+1)*d, and its inverse ``my_merge_heads(x)`` (ex-ch5-merge); on ``arange`` tensors, h = 1 to D."""
from __future__ import annotations

import torch

from .diagnose import Case, Exercise, Mistake, check

SIZES = [(1, 1, 1, 1), (1, 2, 3, 3), (2, 4, 8, 2), (2, 3, 12, 4), (3, 2, 4, 1), (1, 3, 6, 2), (2, 2, 8, 4)]  # B L D h
FLOAT = (r"ints.*float", "a size must be an int, and D / h is a float even when h divides D (8 / 2 = 4.0): use D // h.")

SQUEEZED = "squeezes the result: every axis of size 1 (B = 1, say) is lost. Return it without .squeeze()."
_split = lambda x, h, order=(0, 2, 1, 3): x.reshape(*x.shape[:2], h, -1).permute(*order)  # noqa: E731 - (B, h, L, d)
_x = lambda B, L, D: torch.arange(1.0, B * L * D + 1, dtype=torch.float64).reshape(B, L, D)  # noqa: E731
_s = lambda order: lambda x, h: _split(x, h, order)  # noqa: E731
_h = lambda h: f"num_heads={h}" if h > 1 else "one head"  # noqa: E731 - "=1" would read as a size written in
SPLIT = Exercise(
    what="your split",
    reference=_split,
    cases=[Case(f"x of shape {(B, L, D)}, {_h(h)}, d={D // h}", (_x(B, L, D), h), sizes={"num_heads": h})
           for B, L, D, h in SIZES],
    mistakes=[
        Mistake("no transpose", "reshaped to (B, h, L, d) without transposing: the pieces of one token fill several "
                "rows: (B, L, h, d), then .transpose(1, 2).", lambda x, h: x.reshape(x.shape[0], h, x.shape[1], -1)),
        Mistake("strided", "gives each head every h-th feature (strided), not a block of d: reshape to (B, L, h, d), "
                "not (B, L, d, h).", lambda x, h: x.unflatten(-1, (-1, h)).permute(0, 3, 1, 2)),
        Mistake("(B, L, h, d)", "returns (B, L, h, d): the heads are still after the tokens.", _s((0, 1, 2, 3))),
        Mistake("(h, B, L, d)", "returns (h, B, L, d), head-major: the heads go at dim 1.", _s((2, 0, 1, 3))),
        Mistake("(B, h, d, L)", "returns (B, h, d, L): transpose axes 1 and 2, not the last two.", _s((0, 2, 3, 1))),
        Mistake("overlap", "takes x[..., i:i+d] for head i: the heads overlap. Head i starts at i*d.",
                lambda x, h: torch.stack([x[..., i:i + x.shape[-1] // h] for i in range(h)], 1)),
        Mistake("(B*h, L, d)", "returns the flat (B*h, L, d) layout: the exercise asks for (B, h, L, d).",
                lambda x, h: _split(x, h).flatten(0, 1)),
        Mistake("transpose first", "transposed to (B, D, L) before the reshape: reshape to (B, L, h, d) first, then "
                ".transpose(1, 2).", lambda x, h: x.transpose(1, 2).reshape(x.shape[0], h, x.shape[1], -1)),
        Mistake("d heads", "made d heads of h features (h and d swapped in a reshape, or pieces of h): reshape to "
                "(B, L, h, d), then .transpose(1, 2).", lambda x, h: x.unflatten(-1, (-1, h)).transpose(1, 2)),
        Mistake("last two", "transposed the last two axes, (B, L, d, h): .transpose(1, 2).", _s((0, 1, 3, 2))),
        Mistake("d from L", "took d from L, x.shape[1]: d = D // h, D = x.shape[-1].",
                lambda x, h: x.reshape(*x.shape[:2], h, x.shape[1] // h).transpose(1, 2)),
        Mistake("last head dropped", "stops one head short, range(num_heads - 1): the last head is missing. "
                "range(num_heads).", lambda x, h: torch.stack([x[..., i * (x.shape[-1] // h):(i + 1) * (x.shape[-1] // h)]
                                                              for i in range(h - 1)], 1)),
        Mistake("squeezed", SQUEEZED, lambda x, h: _split(x, h).squeeze()),
        Mistake("transpose(2, 3)", "swaps the heads' axis with the features' (transpose(2, 3)) before the reshape to "
                "(B, h, L, d): reshape to (B, L, h, d), then .transpose(1, 2).",
                lambda x, h: x.reshape(*x.shape[:2], h, -1).transpose(2, 3).reshape(x.shape[0], h, x.shape[1], -1)),
        Mistake("chunk tokens", "chunked the TOKENS: x.chunk(h, -1).", lambda x, h: torch.stack(x.chunk(h, 1), 1)),
    ],
    passed="every feature of every token is in its own head and row, for h = 1 to D.",
    hints=(FLOAT,),
)

def check_split_heads(fn) -> None:
    """Check ``fn(x, num_heads)``: (B, L, D) -> (B, h, L, d) with head i holding features ``i*d:(i+1)*d``."""
    check(SPLIT, fn)

_merge = lambda x, order=(0, 2, 1, 3): x.permute(*order).reshape(x.shape[0], x.shape[2], -1)  # noqa: E731 - (B, L, D)
_mo = lambda order: lambda x: _merge(x, order)  # noqa: E731
THEN = "bring the tokens before the heads, x.transpose(1, 2), then reshape to (B, L, D)."
MERGE = Exercise(
    what="your merge",
    reference=_merge,
    cases=[Case(f"x of shape {(B, h, L, D // h)}, {_h(h)}, D={D}", (_split(_x(B, L, D), h).contiguous(),),
                sizes={"num_heads": h}) for B, L, D, h in SIZES],
    mistakes=[
        Mistake("no transpose", f"reshaped (B, h, L, d) to (B, L, D) without transposing: {THEN}", _mo((0, 1, 2, 3))),
        Mistake("interleaved", "interleaved the heads' features: (B, L, h, d), not (B, L, d, h).", _mo((0, 2, 3, 1))),
        Mistake("axes 0, 1", f"transposes axes 0 and 1, the batch and the heads: {THEN}", _mo((1, 0, 2, 3))),
        Mistake("axes 2, 3", f"transposes axes 2 and 3, the tokens and the features: {THEN}", _mo((0, 1, 3, 2))),
        Mistake("B, L, h, d", "reads x.shape as (B, L, h, d), L and h swapped in the reshape: B, h, L, d = x.shape.",
                lambda x: x.transpose(1, 2).reshape(*x.shape[:2], -1)),
        Mistake("flatten(1)", "flattens all axes after the batch, (B, h*L*d): keep (B, L, D).", lambda x: x.flatten(1)),
        Mistake("not merged", "returns (B, L, h, d): the transpose is done; now join the last two axes, .flatten(2).",
                lambda x: x.transpose(1, 2)),
        Mistake("along tokens", "joins the heads along the tokens axis, (B, h*L, d): join them along the features.",
                lambda x: x.flatten(1, 2)),
        Mistake("last head dropped", "stops one head short, range(h - 1): the last head's features are missing.",
                lambda x: torch.cat([x[:, i] for i in range(x.shape[1] - 1)], -1)),
        Mistake("heads reversed", "concatenates the heads in REVERSE order, the last head's features first: head 0's come first.",
                lambda x: _merge(x.flip(1))),
        Mistake("flatten(2)", f"joins each head's tokens and features, x.flatten(2), (B, h, L*d): {THEN}",
                lambda x: x.flatten(2)),
        Mistake("squeezed", SQUEEZED, lambda x: _merge(x).squeeze()),
        Mistake("flat", "returns the flat split layout, (B*h, L, d): return (B, L, D).", lambda x: x.flatten(0, 1)),
        *[Mistake(name, "reduced the heads to one, (B, L, d): a merge keeps every head, concatenated, to D = h*d.",
                  lambda x, f=f: f(x, 1)) for name, f in (("mean", torch.mean), ("sum", torch.sum))],
    ],
    passed="every token got its D features back, head after head, for h = 1 to D.",
    hints=(FLOAT,),
)

def check_merge_heads(fn) -> None:
    """Check ``fn(x)``: (B, h, L, d) -> (B, L, D), the inverse of the split (features of head i at i*d:(i+1)*d)."""
    check(MERGE, fn)

EXERCISES = [SPLIT, MERGE]
