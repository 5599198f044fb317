"""Checkers for the chapters' exercises: each ``check_*`` runs the learner's answer and prints "Correct: ..." or
raises :class:`ExerciseError` saying what the answer did and where to look for the fix (see ``diagnose.py``)."""
from __future__ import annotations

import re
import textwrap

import torch

class ExerciseError(AssertionError):
    """The learner's answer is not right yet; the message says what differs."""

def passed(message: str) -> None:
    """Print the verdict, wrapped to the width a chapter page shows."""
    print(textwrap.fill(f"Correct: {message}", 79))

DTYPE = torch.float64  # checkers compute in float64, so "equal" can mean equal to 1e-10

# The errors learners' code raises for the usual slips, each with the mistake that most often causes it.
HINTS = [
    (r"(?i)cuda|nvidia", " The checker's tensors are on the CPU: create new tensors on the device of the inputs "
     "(device=x.device), not on the notebook's `device`."),
    (r"view size is not compatible", " .view needs a tensor contiguous in memory, and transpose only swaps strides: "
     "call .contiguous() before .view, or use .reshape."),
    (r"masked_fill.*boolean", " A float mask is not a selection: it is added to the scores (-inf blocks, 0 keeps). "
     "Use masked_fill for bool masks and scores + mask for float ones."),
    (r"'Parameter' object is not callable", " An nn.Parameter is a tensor, not a layer: multiply by it (x @ W.T), or "
     "make the projection an nn.Linear, which is called."),
    (r"out of bounds for dimension|index \S+ out of range for tensor",
     " An index past the end of an axis: an index taken from another axis (L for S, heads for positions), or a "
     "range that runs one too far. Print the shapes of the tensors you index."),
    (r"shape of the mask \[[\d, ]*\] at index \d+ does not match", " A bool mask used as an index must have the "
     "shape of the tensor it indexes, axis for axis (no broadcast there): expand it first, mask.expand_as(x), or "
     "multiply by a 0/1 mask instead."),
    (r"expanded size of the tensor \(\d+\) must match the existing size", " An expand (or a copy into a slice, x[a:b] = y) "
     "only stretches an axis of SIZE 1: to copy an axis of size n > 1, add an axis of 1 beside it (x[:, :, None]), "
     "expand that and merge the two (reshape), or use repeat_interleave; a slice takes a y of its own shape."),
    (r"Dimension out of range",
     " A dim= that the tensor does not have: count its axes, (B, h, L, d) has dims 0 to 3 (or -4 to -1)."),
    (r"shape '\[[\d, -]*\]' is invalid for input of size",
     " A view or reshape to a shape whose product is not the tensor's size: a size hard-coded for another example, "
     "or taken from the wrong tensor or axis (L for S, D for d = D / h). Print x.shape before the view."),
    (r"mat1 and mat2 shapes cannot be multiplied|batch2 tensor|size mismatch, got input",
     " A matrix product whose inner sizes differ, (..., n, k) @ (..., k, m): a transpose missing or misplaced "
     "(q @ k.transpose(-2, -1)), or a weight the wrong way round (nn.Linear stores (out, in): x @ W.T)."),
    (r"Sizes of tensors must match except in dimension",
     " torch.cat joins tensors along one axis and needs every other axis equal: cat along the axis that grows."),
    (r"must match the size of tensor b",
     " Two tensors that broadcasting cannot line up: a size hard-coded or read from another axis (heads for d, L for "
     "S), or a mask or vector without its missing axes as size 1 ([:, None], view(B, 1, 1, S)): axes are matched "
     "from the RIGHT."),
    (r"expected scalar type|same dtype|dtype mismatch|expected m1 and m2 to have the same dtype",
     " Two dtypes met in one operation: a tensor created without dtype= (float32 by default), or a .float() or "
     ".double(). Create new tensors like the inputs: dtype=x.dtype, device=x.device."),
    (r"Boolean value of Tensor with more than one value is ambiguous",
     " Python's if, and, or, max and min need ONE truth value: on tensors use torch.maximum, torch.minimum, "
     "torch.where, & and |."),
    (r"torch\.return_types\.(max|min)",
     " max(dim) and min(dim) return a pair (values, indices): take .values, or use amax(dim) / amin(dim)."),
    (r"only one element tensors can be converted to Python scalars",
     " A math function (math.exp, math.sqrt, float()) was given a whole tensor: use torch.exp, torch.sqrt, or "
     "math.sqrt of a Python number (a size, not a tensor)."),
    (r"list index out of range|tuple index out of range", " An index past the end of a Python list: an index computed "
     "from the wrong quantity (a quotient for a remainder, a size of another axis) or a loop one step too far."),
    (r"object is not subscriptable|object is not iterable",
     " A number used where a list or tensor is expected: check what each argument is (print type(x))."),
    (r"unsupported operand type|can't multiply sequence", " An operation between a Python list and a number or "
     "tensor: make it a tensor first (torch.tensor(x)), or loop."),
    (r"'NoneType'", " A value that is None: a helper without `return`, or an in-place method's result (x.sort() "
     "returns None)."),
    (r"division by zero", " A division by a size or count that is 0 in this case."),
]

def classic_hint(err: Exception) -> str:
    """The likely mistake behind one of the usual errors (a device mismatch, .view on a transposed tensor, an index
    out of bounds, a broadcast or a product of mismatched sizes, two dtypes, max(dim)'s pair, a list index), or ""."""
    return next((hint for pattern, hint in HINTS if re.search(pattern, str(err))), "")

def raised(err: Exception, what: str) -> ExerciseError:
    """The message for an exception raised by the learner's code: its type, its text and a hint."""
    if type(err) is NotImplementedError and not str(err):  # the student edition's stub
        return ExerciseError(
            f"{what} raised NotImplementedError: it is still the exercise's stub (# YOUR CODE HERE). Write its body "
            f"in place of `raise NotImplementedError()`, run that cell, then this one again."
        )
    text, hint = str(err).strip(), classic_hint(err)
    if hint and text and text[-1] not in ".!?":
        text += "."
    return ExerciseError(f"{what} raised {type(err).__name__}: {text}{hint}")

def same_error(a: Exception, b: Exception) -> bool:
    """Whether two exceptions are the same failure: one type, the same numbers (sizes, dims) in their texts, however
    worded (``torch.where`` and ``masked_fill``); "list index out of range" names none: any IndexError meets it."""
    numbers = lambda e: sorted(re.findall(r"\d+", str(e)))  # noqa: E731
    sizeless = type(a) in (IndexError, KeyError) and not (numbers(a) and numbers(b))
    return type(a) is type(b) and (numbers(a) == numbers(b) or sizeless)

def __getattr__(name: str):
    """``check_multihead_attention`` (chapter 7) from here too, loaded on first use: its module imports this one."""
    if name == "check_multihead_attention":
        from .ch07 import check_multihead_attention

        return check_multihead_attention
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
