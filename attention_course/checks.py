"""Input validation shared by the whole package.

Every check raises with a message written for a learner: which argument, what was expected,
what arrived, and the likely fix. ``TypeError`` for a wrong type or dtype, ``ValueError`` for a
wrong shape, value or device.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch


def tracing() -> bool:
    """True inside ``torch.jit.trace``, where the checks stand aside.

    The tracer records every size it is asked for as a tensor, so that the trace works for other sizes; a check
    that compared those sizes with Python numbers would freeze its answer into the trace (with a TracerWarning
    each). A trace records the computation only; run the layer once eagerly to have its input checked.
    """
    return torch.jit.is_tracing()


def _attribute(ref_name: str, attribute: str, value) -> str:
    """``q.dtype`` when ``ref_name`` names a variable the learner has, else the value itself: runnable either way."""
    return f"{ref_name}.{attribute}" if ref_name.isidentifier() else repr(value)


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
    if tracing():
        return
    want = "(" + ", ".join(dims) + ")"
    if x.ndim != len(dims):
        raise ValueError(
            f"{name} must have {len(dims)} dimensions {want}, got {x.ndim} with shape {tuple(x.shape)}."
            + (f" Add a batch dimension with .unsqueeze({list(dims).index('B')})."
               if x.ndim == len(dims) - 1 and "B" in dims else "")
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
            f"{name} is on {x.device} but {ref_name} is on {ref.device}. Move it with {name}.to({_attribute(ref_name, 'device', str(ref.device))})."
        )


def check_device(x: torch.Tensor, name: str, device: torch.device, ref_name: str) -> None:
    """Like :func:`check_same_device`, against a device rather than a tensor."""
    if x.device != torch.device(device):
        raise ValueError(f"{name} is on {x.device} but {ref_name} is on {device}. Move it with {name}.to({device!r}).")


def check_same_dtype(x: torch.Tensor, name: str, ref: torch.Tensor, ref_name: str) -> None:
    if x.dtype != ref.dtype:
        raise TypeError(f"{name} is {x.dtype} but {ref_name} is {ref.dtype}. Convert it with {name}.to({_attribute(ref_name, 'dtype', ref.dtype)}).")


def check_positive_int(n, name: str) -> int:
    if tracing() and isinstance(n, torch.Tensor):  # a size recorded by jit.trace
        return n
    if isinstance(n, bool) or not isinstance(n, int) or n <= 0:
        raise ValueError(f"{name} must be a positive int, got {n!r}.")
    return n


def check_dropout(p, name: str = "dropout") -> float:
    if isinstance(p, bool) or not isinstance(p, (int, float)) or not 0.0 <= p < 1.0:
        raise ValueError(f"{name} is a probability of zeroing a weight: it must be in [0, 1), got {p!r}.")
    return float(p)


def check_mask(
    mask,
    name: str,
    *,
    float_dtype: torch.dtype | None = None,
    device: torch.device | None = None,
    ref_name: str = "query",
) -> torch.Tensor:
    """Check that ``mask`` is a bool (True = ignore) or floating (additive) tensor.

    A floating mask must have ``float_dtype`` (the query's dtype) when given; the mask must be on ``device`` when
    given. ``ref_name`` names what those two come from, for the message.
    """
    check_tensor(mask, name)
    if mask.dtype != torch.bool and not mask.is_floating_point():
        raise TypeError(
            f"{name} has dtype {mask.dtype}; a mask must be bool (True = ignore this key) or floating "
            f"(additive: 0 = attend, -inf = blocked). If it is a keep-mask (1 = keep, 0 = pad), convert it with "
            f"keep_to_ignore({name})."
        )
    if float_dtype is not None and mask.is_floating_point() and mask.dtype != float_dtype:
        raise TypeError(
            f"{name} is a float mask of dtype {mask.dtype} but {ref_name} is {float_dtype}. "
            f"Convert it with {name}.to({_attribute(ref_name, 'dtype', float_dtype)})."
        )
    if device is not None:
        check_device(mask, name, device, ref_name)
    return mask
