"""Attention as a GPU kernel (chapter 13): FlashAttention's forward and backward, written in Triton.

``flash.py`` is what a reader calls; ``forward.py`` and ``backward.py`` are the kernels; without a CUDA GPU they
run in Triton's interpreter on the CPU.
"""
from .flash import MISSING, causal_tile_counts, flash_attention, interpreted, require_triton

__all__ = ["MISSING", "causal_tile_counts", "flash_attention", "interpreted", "require_triton"]
