"""Input validation shared by the whole package.

Every check raises with a message written for a learner: which argument, what was expected,
what arrived, and the likely fix. ``TypeError`` for a wrong type or dtype, ``ValueError`` for a
wrong shape, value or device.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def check_tensor(x, name: str) -> torch.Tensor:
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}. Wrap it with torch.tensor(...).")
    return x


def check_floating(x, name: str) -> torch.Tensor:
    check_tensor(x, name)
    if not x.is_floating_point():
        raise TypeError(
            f"{name} must be a floating-point tensor (float32, float64, ...), got {x.dtype}. "
            f"Convert it with {name}.float()."
        )
    return x


def check_shape(x: torch.Tensor, name: str, dims: Sequence[str], expected: Sequence[int | None] | None = None) -> None:
    """Check ``x.ndim == len(dims)`` and, where ``expected[i]`` is not None, ``x.shape[i] == expected[i]``.

    ``dims`` names the axes, e.g. ``("B", "L", "D")``; the message shows the expected shape in those names.
    """
    want = "(" + ", ".join(dims) + ")"
    if x.ndim != len(dims):
        raise ValueError(
            f"{name} must have {len(dims)} dimensions {want}, got {x.ndim} with shape {tuple(x.shape)}."
            + (" Add a batch dimension with .unsqueeze(0)." if x.ndim == len(dims) - 1 else "")
        )
    if expected is None:
        return
    for axis, (dim, size) in enumerate(zip(dims, expected)):
        if size is not None and x.shape[axis] != size:
            raise ValueError(
                f"{name} must have shape {want} with {dim}={size}, got shape {tuple(x.shape)} "
                f"({dim}={x.shape[axis]} at dimension {axis})."
            )


def check_same_device(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if x.device != ref.device:
        raise ValueError(
            f"{name} is on {x.device} but {ref_name} is on {ref.device}. Move it with {name}.to({ref_name}.device)."
        )
