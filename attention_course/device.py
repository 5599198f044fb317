"""Choosing the device once and seeding, for the first cell of every chapter; and the torch a chapter needs."""
import importlib.util
import os
import random
import re

import numpy as np
import torch

DEVICE_ENV = "ATTENTION_COURSE_DEVICE"


def seed_everything(seed: int = 0) -> None:
    """Seed Python's, NumPy's and torch's generators (CPU and every GPU): a chapter prints the same numbers each run."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)  # also seeds every CUDA device


def pick_device(seed: int = 0, verbose: bool = True) -> torch.device:
    """Return the device a chapter runs on, and seed.

    ``cuda`` when a GPU is available, else ``cpu``. Set the environment variable
    ``ATTENTION_COURSE_DEVICE`` (e.g. ``cpu``) to force one.
    """
    wanted = os.environ.get(DEVICE_ENV, "").strip()
    if wanted:
        try:
            device = torch.device(wanted)
        except RuntimeError:
            raise ValueError(f"{DEVICE_ENV}={wanted!r} is not a device name. Use 'cpu' or 'cuda' (or 'cuda:1', ...).") from None
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"{DEVICE_ENV}={wanted!r} asks for a GPU, but torch.cuda.is_available() is False here. "
                f"Unset {DEVICE_ENV} or set it to 'cpu'."
            )
        if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
            raise ValueError(
                f"{DEVICE_ENV}={wanted!r} asks for GPU {device.index}, but only {torch.cuda.device_count()} "
                f"GPU(s) are visible. Use 'cuda' or 'cuda:0'."
            )
        if device.type not in ("cpu", "cuda"):
            raise ValueError(f"{DEVICE_ENV}={wanted!r}: this course runs on 'cpu' or 'cuda', not {device.type!r}.")
    else:
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    seed_everything(seed)
    if verbose:
        print(f"torch {torch.__version__}, running on {device}")
    return device


class TorchTooOld(RuntimeError):
    """Raised by :func:`require_torch`. In a notebook it shows as its message alone, without a traceback."""

    def _render_traceback_(self) -> list[str]:  # IPython calls this instead of printing the traceback
        return [f"{type(self).__name__}: {self}"]


def _release(version: str) -> tuple[int, ...]:
    """(2, 12) from "2.12", "2.12.0+cpu" or "2.12.0.dev20260101": the release numbers, a pre-release of 2.12 counted
    as 2.12."""
    found = re.match(r"\s*(\d+)\.(\d+)(?:\.(\d+))?", str(version))
    if found is None:
        raise ValueError(f"cannot read a version number from {version!r}: expected e.g. '2.12' or '2.12.0+cpu'.")
    return tuple(int(n) for n in found.groups(default="0"))


def require_torch(minimum: str, chapter: str | None = None, version: str | None = None) -> None:
    """Stop, with one sentence and the command that fixes it, when the running torch is older than ``minimum``.

    A chapter that needs a newer torch than the rest calls it in its first cell (``require_torch("2.13",
    chapter="11")``), so that an older torch fails there, plainly, and not halfway through or in a hung worker.
    ``version`` defaults to ``torch.__version__``; a local tag (``+cpu``) or a pre-release suffix is ignored.
    """
    version = torch.__version__ if version is None else version
    if _release(version) >= _release(minimum):
        return
    who = f"Chapter {chapter}" if chapter is not None else "This code"
    # torchvision and torchaudio (Colab ships both) each pin the torch they were built for: upgraded with it
    beside = "".join(f" {name}" for name in ("torchvision", "torchaudio") if importlib.util.find_spec(name))
    command = f'pip install -U "torch>={minimum}"{beside}'
    raise TorchTooOld(
        f"{who} needs torch {minimum} or newer, and this Python runs torch {version}: run {command} (in a notebook, "
        f"%{command}), then restart the kernel."
    )
