"""Checkers for the chapters' exercises.

Each ``check_*`` function takes the learner's answer (a tensor or a function), runs it, and either prints a line
starting with "Correct" or raises :class:`ExerciseError` that says *what* is wrong (shape, values, a mask the
wrong way round) and how to look for the fix -- not just that it is wrong.
"""
from __future__ import annotations

import textwrap

import torch


class ExerciseError(AssertionError):
    """The learner's answer is not right yet; the message says what differs."""


def passed(message: str) -> None:
    """Print the verdict, wrapped to the width a chapter page shows."""
    print(textwrap.fill(f"Correct: {message}", 79))


# Helpers shared by the chapters' checkers.

DTYPE = torch.float64  # checkers compute in float64, so "equal" can mean equal to 1e-10
ATOL = 1e-10


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of two tensors of the same shape; NaN on one side only counts as inf.

    Compared on the CPU: the checkers' tensors live there, a learner's answer may be on the GPU.
    """
    a, b = a.detach().to("cpu", DTYPE), b.detach().to("cpu", DTYPE)
    diff = (a - b).abs().nan_to_num(nan=float("inf")).masked_fill(a.isnan() & b.isnan(), 0.0)
    return float(diff.max()) if diff.numel() else 0.0


def close(a, b, atol: float = 1e-8) -> bool:
    return isinstance(a, torch.Tensor) and a.shape == b.shape and max_diff(a, b) <= atol


def require_tensor(answer, name: str, what: str) -> torch.Tensor:
    """``answer`` moved to the CPU, where the checkers' tensors are (a mask built on the GPU is a right answer too)."""
    if not isinstance(answer, torch.Tensor):
        raise ExerciseError(f"{what} must return a torch.Tensor for {name}, got {type(answer).__name__}.")
    return answer.cpu()


def require_shape(answer: torch.Tensor, expected: tuple, name: str, dims: str, hint: str = "") -> None:
    if tuple(answer.shape) != tuple(expected):
        raise ExerciseError(
            f"{name} has shape {tuple(answer.shape)}, expected {dims} = {tuple(expected)}." + (f" {hint}" if hint else "")
        )


def device_hint(err: Exception) -> str:
    """A hint for an error that mentions the GPU: the checkers pass CPU tensors."""
    if "cuda" not in str(err).lower():
        return ""
    return (" The checker's tensors are on the CPU: create new tensors on the device of the inputs "
            "(device=x.device), not on the notebook's `device`.")


def call(fn, *args, what: str):
    """Run the learner's function; turn an exception into a message that names it."""
    try:
        return fn(*args)
    except ExerciseError:
        raise
    except Exception as err:  # the learner's code may raise anything; report it, do not hide it
        raise ExerciseError(f"{what} raised {type(err).__name__}: {err}{device_hint(err)}") from err
