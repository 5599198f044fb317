"""Checkers for chapter 5, many heads.

* :func:`check_split_heads` -- (B, L, D) -> (B, h, L, d);
* :func:`check_merge_heads` -- (B, h, L, d) -> (B, L, D).

Both feed the learner's function the integer tensor ``arange(1, B*L*D + 1)`` (as float64), whose every number
says where it came from: number ``v`` is feature ``c`` of token ``l`` of sentence ``b`` with
``v - 1 = (b*L + l)*D + c``. So a wrong answer can be described element by element: whose features ended up where.
"""
from __future__ import annotations

import torch

from . import DTYPE, ExerciseError, passed, raised, require_tensor

# (B, L, D, h): the chapter's example first (B = h, L = d), then one where every size differs
SHAPES = [(2, 4, 8, 2), (2, 3, 12, 4)]


def _labelled(B: int, L: int, D: int) -> torch.Tensor:
    return torch.arange(1, B * L * D + 1, dtype=DTYPE).reshape(B, L, D)  # (B, L, D)


def _whose(values: torch.Tensor, L: int, D: int) -> str:
    """Describe a row of labelled numbers: 'token 1 of sentence 0, features 4..7', or the mix of tokens in it."""
    v = values.round().long() - 1
    if ((values - values.round()).abs() > 1e-9).any() or (v < 0).any():
        return "numbers that are not elements of the input (did you compute with the values?)"
    b, l, c = v // (L * D), v // D % L, v % D
    if (b == b[0]).all() and (l == l[0]).all():
        contiguous = bool((c.diff() == 1).all()) if len(c) > 1 else True
        feats = f"features {int(c[0])}..{int(c[-1])}" if contiguous else f"features {c.tolist()}"
        return f"token {int(l[0])}'s {feats} (sentence {int(b[0])})"
    parts = sorted({(int(bb), int(ll)) for bb, ll in zip(b, l)})
    return "features of several tokens: " + ", ".join(f"token {ll} of sentence {bb}" for bb, ll in parts)


def _run(fn, args, what: str, first: bool):
    """Run the learner's function; name the two slips behind most of its errors: a float size (D / h), and sizes
    written as numbers (which work for the first shape only)."""
    try:
        return fn(*args)
    except Exception as err:  # the learner's code may raise anything: report it, and name what we recognise
        error = raised(err, what)
        text = str(err)
        if "float" in text and ("shape" in text or "size" in text or "int" in text):
            hint = (" A size must be an int, and D / num_heads is a float even when h divides D (8 / 2 = 4.0). "
                    "Use integer division, d = D // h.")
        elif not first:
            hint = (" It ran for the first shape and fails for this one: are sizes written as numbers? Take them "
                    "from the input, B, L, D = x.shape (or B, h, L, d = x.shape), so the function works for any "
                    "shape.")
        else:
            raise error from err
        text = str(error)
        raise ExerciseError(text + ("" if text[-1] in ".!?" else ".") + hint) from err


def _same_dtype(got: torch.Tensor, name: str) -> None:
    """Splitting and merging only move numbers: the dtype must stay the input's."""
    if got.dtype != DTYPE:
        raise ExerciseError(
            f"your {name} has dtype {got.dtype}, the input has {DTYPE}: moving numbers between axes must keep the "
            f"dtype (no .float(), .to(...) or new tensor of a default dtype)."
        )


# ----------------------------------------------------------------------------------------------------------
# Exercise: split heads


def _split_variants(x: torch.Tensor, h: int):
    B, L, D = x.shape
    d = D // h
    return [
        (x.reshape(B, h, L, d),
         "you reshaped to (B, h, L, d) (or to (B*h, L, d)) without transposing: a reshape keeps the row-major order, "
         "so the d-sized pieces of one token fill several rows of one head. Split the last axis first, "
         "x.reshape(B, L, h, d), then .transpose(1, 2) to bring the heads before the tokens."),
        (x.reshape(B, L, d, h).permute(0, 3, 1, 2),
         "each head got every h-th feature (strided) instead of a contiguous block of d features: reshape to "
         "(B, L, h, d), not (B, L, d, h). Head i owns features i*d:(i+1)*d, the layout of torch's weights."),
        (x.reshape(B, L, h, d).transpose(1, 2).flip(1),
         "the heads are in reverse order: head 0 must hold the first d features, 0..d-1, head i features "
         "i*d:(i+1)*d."),
        (x.reshape(B, L, h, d).permute(2, 0, 1, 3),
         "the head axis came first: that is (h, B, L, d), head-major. Keep the sentences first and put the heads at "
         "dim 1: x.reshape(B, L, h, d).transpose(1, 2) (or torch.stack(chunks, dim=1))."),
        (x.reshape(B, L, h, d).permute(0, 2, 3, 1),
         "each head is (d, L), rows of features: that is (B, h, d, L). Rows must be tokens: transpose the token and "
         "head axes, .transpose(1, 2), not the last two."),
    ]


def check_split_heads(fn) -> None:
    """Check ``fn(x, num_heads)``: (B, L, D) -> (B, h, L, d) with head i holding features ``i*d:(i+1)*d``."""
    for index, (B, L, D, h) in enumerate(SHAPES):
        d = D // h
        x = _labelled(B, L, D)
        got = _run(fn, (x.clone(), h), f"your function on x of shape {(B, L, D)} with num_heads={h}", index == 0)
        got = require_tensor(got, "split heads", "your function")
        want = x.reshape(B, L, h, d).transpose(1, 2)  # (B, h, L, d)
        shape = tuple(got.shape)
        setting = f"for (B, L, D) = {(B, L, D)} and h = {h}"
        if shape != tuple(want.shape):
            if shape == (B * h, L, d):
                hint = ("that is the flat (B*h, L, d) layout; this exercise asks for the 4-D one (B, h, L, d): "
                        "do not flatten the batch and head axes.")
            elif shape == (B, L, h, d):
                hint = "that is (B, L, h, d): the heads are still after the tokens. Add .transpose(1, 2)."
            elif shape == (h, B, L, d):
                hint = ("that is (h, B, L, d), head-major: keep the sentences first and put the heads at dim 1, "
                        "x.reshape(B, L, h, d).transpose(1, 2).")
            elif shape == (B, h, d, L):
                hint = ("that is (B, h, d, L): each head is (d, L), rows of features. Transpose the token and head "
                        "axes, .transpose(1, 2), not the last two.")
            elif got.numel() != x.numel():
                hint = f"it holds {got.numel()} numbers, the input {x.numel()}: splitting must not add or drop any."
            else:
                hint = "the axes are in the wrong order."
            raise ExerciseError(
                f"your output has shape {shape} {setting}, expected (B, h, L, d) = {tuple(want.shape)}: {hint}"
            )
        _same_dtype(got, "output")
        if torch.equal(got, want):
            continue
        mismatch = (got.to(DTYPE) != want).any(-1).nonzero()[0].tolist()  # first wrong (b, head, l)
        b, head, l = mismatch
        where = (f"your output has the right shape {shape} {setting}, but head {head}'s row {l} of sentence {b} "
                 f"holds {_whose(got[b, head, l].to(DTYPE), L, D)} instead of token {l}'s features "
                 f"{head * d}..{(head + 1) * d - 1}")
        for variant, reason in _split_variants(x, h):
            if torch.equal(got.to(DTYPE), variant):
                raise ExerciseError(f"{where}: {reason}")
        raise ExerciseError(f"{where}. Reshape to (B, L, h, d), then transpose the token and head axes.")
    passed("every feature of every token is in its own head and row.")


# ----------------------------------------------------------------------------------------------------------
# Exercise: merge heads


def check_merge_heads(fn) -> None:
    """Check ``fn(x)``: (B, h, L, d) -> (B, L, D), the inverse of the split (features of head i at i*d:(i+1)*d)."""
    for index, (B, L, D, h) in enumerate(SHAPES):
        d = D // h
        x = _labelled(B, L, D)  # what the merge must give back
        heads = x.reshape(B, L, h, d).transpose(1, 2).contiguous()  # (B, h, L, d), contiguous like a matmul output
        setting = f"for (B, h, L, d) = {(B, h, L, d)}"
        try:
            got = _run(fn, (heads.clone(),), f"your function {setting}", index == 0)
        except ExerciseError as err:
            text = str(err)
            if "view" in text and ("stride" in text or "contiguous" in text):
                raise ExerciseError(
                    f"your function raised RuntimeError {setting}: {text.split('RuntimeError: ')[-1].splitlines()[0]}"
                    f" After transpose the tensor is no longer contiguous in memory, and .view cannot merge axes "
                    f"that are not adjacent in memory. Use .reshape(B, L, D), or .contiguous().view(B, L, D)."
                ) from err
            raise
        got = require_tensor(got, "merged heads", "your function")
        shape = tuple(got.shape)
        if shape != (B, L, D):
            hint = ""
            if shape == (B, L, h, d):
                hint = (" That is (B, L, h, d): the transpose is done; now join the last two axes with "
                        ".flatten(2).")
            elif shape == (B * h, L, d):
                hint = " You returned the flat split layout: the merge must undo the split."
            elif shape == (B, h * L, d):
                hint = (" That is (B, h*L, d): the heads were joined along the tokens axis. Join them along the "
                        "features: torch.cat(heads, dim=-1), or transpose to (B, L, h, d) and reshape.")
            elif shape == (B, L, d):
                hint = (" That is (B, L, d): the heads were reduced (summed or averaged). A merge keeps every "
                        "head: their d features are concatenated, head 0's first, to D = h*d.")
            raise ExerciseError(f"your output has shape {shape} {setting}, expected (B, L, D) = {(B, L, D)}.{hint}")
        _same_dtype(got, "output")
        if torch.equal(got, x):
            continue
        b, l = (got != x).any(-1).nonzero()[0].tolist()
        where = (f"your output has the right shape {shape} {setting}, but token {l} of sentence {b} holds "
                 f"{_whose(got[b, l], L, D)} instead of its own features 0..{D - 1}")
        if torch.equal(got, heads.reshape(B, L, D)):
            raise ExerciseError(
                f"{where}: you reshaped (B, h, L, d) straight to (B, L, D) without transposing. Bring the tokens "
                f"before the heads first: x.transpose(1, 2) -> (B, L, h, d), then reshape to (B, L, D)."
            )
        if torch.equal(got, heads.permute(0, 2, 3, 1).reshape(B, L, D)):
            raise ExerciseError(
                f"{where}: the heads' features are interleaved (feature 0 of every head, then feature 1, ...). "
                f"Transpose to (B, L, h, d), not (B, L, d, h): head i's d features must stay together at i*d:(i+1)*d."
            )
        if torch.equal(got, heads.flip(1).transpose(1, 2).reshape(B, L, D)):
            raise ExerciseError(f"{where}: the heads are in reverse order. Head 0's d features come first, at "
                                f"0..d-1; head i's at i*d:(i+1)*d.")
        raise ExerciseError(f"{where}. Transpose to (B, L, h, d), then reshape to (B, L, D).")
    passed("every token got its D features back, head after head.")
