"""FlashAttention from the Triton kernels of chapter 13: ``flash_attention(q, k, v, causal=..., lengths=...)``.

q (B, h, L, d), k and v (B, h, S, d); ``causal`` lets query i see keys 0..i (aligned at the top left, as
``F.scaled_dot_product_attention(is_causal=True)``); ``lengths`` (B,) lets the queries of sentence b see its first
lengths[b] keys only (key padding). Differentiable: the backward kernels recompute the probabilities from the
log-sum-exp the forward kernel stored. On a machine without a CUDA GPU the kernels run in Triton's interpreter
(``TRITON_INTERPRET=1``, set here before Triton is imported), on CPU tensors: the same source, executed tile by
tile in NumPy; right, and no measure of speed.
"""
from __future__ import annotations

import math
import os

import torch

from ..checks import check_positive_int, check_shape, check_tensor
from ..functional import _check_qkv

MISSING = ("chapter 13 needs Triton, which is not installed here. On Linux: pip install -e \".[kernels]\" (or pip "
           "install triton); on Colab it is already there. Triton has no wheel for macOS or Windows: run the chapter "
           "on Colab or a Linux machine.")


def require_triton():
    """Triton, imported for the kernels: in its interpreter where no CUDA GPU is; without it, an error that says
    what to install (chapter 13's first cell calls it, so that a machine without Triton stops there)."""
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")
        _interpreting_triton()
    try:
        import triton
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        raise ModuleNotFoundError(MISSING, name="triton") from None
    return triton


def _kernels():
    """The kernel modules, imported on first use."""
    require_triton()
    from . import backward, forward
    return forward, backward


def _interpreting_triton() -> None:
    """Triton decides when it is imported whether its own library (tl.zeros, tl.maximum, ...) is interpreted: one
    imported before TRITON_INTERPRET was set (by ``import triton`` in a cell, or by torch.compile) cannot run the
    kernels on the CPU. It is imported again, interpreted; whoever holds the first import keeps it."""
    import sys

    language = sys.modules.get("triton.language")
    if language is None or type(language.zeros).__name__ == "InterpretedFunction":
        return
    for name in [name for name in sys.modules if (name == "triton" or name.startswith("triton."))
                 and not name.startswith("triton._C")]:  # its compiled core stays: it cannot be loaded twice
        del sys.modules[name]
    for name in [name for name in sys.modules if name.startswith(__package__ + ".") and name.split(".")[-1] in
                 ("forward", "backward")]:
        del sys.modules[name]


def interpreted() -> bool:
    """Whether the kernels run in Triton's interpreter (on the CPU) rather than compiled for a GPU."""
    return os.environ.get("TRITON_INTERPRET") == "1" or not torch.cuda.is_available()


def _block_d(d: int) -> int:
    return max(16, 1 << (d - 1).bit_length())  # tl.dot wants every side of a tile a power of two, at least 16


def _accumulator(dtype: torch.dtype):
    import triton.language as tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def _check(q, k, v, lengths, block_m, block_n) -> None:
    _check_qkv(q, k, v)
    check_shape(q, "q", ("B", "h", "L", "d"))
    B, h, L, d = q.shape
    check_shape(k, "k", ("B", "h", "S", "d"), (B, h, None, d))
    check_shape(v, "v", ("B", "h", "S", "d"), (B, h, k.shape[2], d))
    if q.dtype not in (torch.float16, torch.bfloat16, torch.float32, torch.float64):
        raise TypeError(f"q is {q.dtype}; the kernels take float16, bfloat16, float32 or float64.")
    if q.dtype == torch.bfloat16 and interpreted():
        raise TypeError("q is bfloat16, which Triton's interpreter cannot multiply (tl.dot multiplies the raw bits of "
                        "bfloat16 tiles: triton-lang/triton#11584). On the CPU use float16 or float32 "
                        "(q.float()); bfloat16 runs on a GPU.")
    if q.is_cuda is False and not interpreted():
        raise ValueError(f"q is on {q.device} but the kernels are compiled for the GPU here. Move the tensors with "
                         ".cuda(), or run with TRITON_INTERPRET=1 for the interpreter on the CPU.")
    for n, name in ((block_m, "block_m"), (block_n, "block_n")):
        check_positive_int(n, name)
        if n < 16 or n & (n - 1):
            raise ValueError(f"{name} must be a power of two and at least 16 (each side of a tile is the inner size of "
                             f"one of the kernels' tl.dot products, which must be at least 16), got {n}.")
    if lengths is not None:
        check_tensor(lengths, "lengths")
        if lengths.dtype in (torch.bool,) or lengths.is_floating_point() or lengths.is_complex():
            raise TypeError(f"lengths holds each sentence's number of keys: an integer tensor, got {lengths.dtype}. "
                            "Convert it with lengths.long().")
        check_shape(lengths, "lengths", ("B",), (B,))
        if lengths.device != q.device:
            raise ValueError(f"lengths is on {lengths.device} but q is on {q.device}. Move it with "
                             "lengths.to(q.device).")
        if len(lengths) and (lengths.min() < 0 or lengths.max() > k.shape[2]):
            raise ValueError(f"lengths must lie in [0, S] = [0, {k.shape[2]}], got {lengths.tolist()}.")


class FlashAttention(torch.autograd.Function):
    """The forward kernel, saving q, k, v, O and the log-sum-exp; the backward kernels from them."""

    @staticmethod
    def forward(ctx, q, k, v, causal, lengths, scale, block_m, block_n):
        forward, _ = _kernels()
        q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        B, H, L, d = q.shape
        S = k.shape[2]
        o = torch.empty_like(q)  # (B, h, L, d)
        lse = torch.empty((B, H, L), device=q.device, dtype=torch.float64 if q.dtype == torch.float64 else torch.float32)
        lens = lengths.to(torch.int32).contiguous() if lengths is not None else q.new_empty(0, dtype=torch.int32)
        forward.forward_kernel[(math.ceil(L / block_m), B * H)](
            q, k, v, o, lse, lens, scale, L, S, H, *q.stride()[:3], *k.stride()[:3], *v.stride()[:3],
            *o.stride()[:3], D=d, BLOCK_D=_block_d(d), BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
            HAS_LENGTHS=lengths is not None, ACC=_accumulator(q.dtype))
        ctx.save_for_backward(q, k, v, o, lse, lens)
        ctx.settings = causal, lengths is not None, scale, block_m, block_n
        return o

    @staticmethod
    def backward(ctx, do):
        _, backward = _kernels()
        q, k, v, o, lse, lens = ctx.saved_tensors
        causal, has_lengths, scale, block_m, block_n = ctx.settings
        B, H, L, d = q.shape
        S = k.shape[2]
        do = do.contiguous()
        delta = (do.to(lse.dtype) * o.to(lse.dtype)).sum(-1)  # (B, h, L): D = rowsum(dO * O)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        common = dict(D=d, BLOCK_D=_block_d(d), BLOCK_M=block_m, BLOCK_N=block_n, CAUSAL=causal,
                      HAS_LENGTHS=has_lengths, ACC=_accumulator(q.dtype))
        strides = (*q.stride()[:3], *k.stride()[:3], *v.stride()[:3])
        backward.kv_kernel[(math.ceil(S / block_n), B * H)](
            q, k, v, do, lse, delta, dk, dv, lens, scale, L, S, H, *strides, **common)
        backward.q_kernel[(math.ceil(L / block_m), B * H)](
            q, k, v, do, lse, delta, dq, lens, scale, L, S, H, *strides, **common)
        return dq, dk, dv, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    lengths: torch.Tensor | None = None, scale: float | None = None, *,
                    block_m: int = 64, block_n: int = 32) -> torch.Tensor:
    """softmax(scale * q k^T, over the keys each query may see) v, by the Triton kernels: (B, h, L, d).

    ``scale`` defaults to 1/sqrt(d); ``block_m`` queries and ``block_n`` keys make a tile. A row that may see no
    key (lengths[b] == 0) is 0.
    """
    _check(q, k, v, lengths, block_m, block_n)
    if not isinstance(causal, bool):
        raise TypeError(f"causal must be True or False, got {causal!r}.")
    if q.shape[2] == 0 or k.shape[2] == 0 or q.numel() == 0:
        return q.new_zeros(q.shape) + 0 * (q.sum() + k.sum() + v.sum())  # nothing to attend to: the empty-row rule
    scale = 1 / math.sqrt(q.shape[-1]) if scale is None else float(scale)
    return FlashAttention.apply(q, k, v, causal, lengths, scale, block_m, block_n)


def causal_tile_counts(L: int, block_m: int, block_n: int | None = None, S: int | None = None) -> tuple[int, int]:
    """(tiles the causal forward kernel loads, tiles of the whole L x S grid): the tiles wholly above the diagonal
    are the difference (query tile i loads the key tiles that start before min(S, (i + 1) block_m, L)). With
    L = S = n * block and block_m = block_n, n(n+1)/2 of n^2 are loaded."""
    block_n = block_m if block_n is None else block_n
    S = L if S is None else S
    loaded = sum(math.ceil(min(S, (i + 1) * block_m, L) / block_n) for i in range(math.ceil(L / block_m)))
    return loaded, math.ceil(L / block_m) * math.ceil(S / block_n)
