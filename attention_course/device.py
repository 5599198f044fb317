"""Choosing the device once and seeding, for the first cell of every chapter."""
import os
import random

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
