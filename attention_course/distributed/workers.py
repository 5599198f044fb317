"""Ready-made workers for :func:`~attention_course.distributed.launch` (importable functions
``fn(rank, world_size, ...)`` that run many cases in one launch), and what they measure in their process: the rise of
its resident memory (:func:`peak_memory_bytes`) and the bytes it sent (:func:`bytes_sent`).
"""
from __future__ import annotations

import torch
from torch import nn

from .heads import head_parallel_by_hand, parallelize_attention, tp_bytes_per_layer
from .ring import ring_attention, zigzag_split


def peak_memory_bytes(fn, *args, **kwargs):
    """``(fn(*args, **kwargs), bytes)``: the result, and how far this process's resident memory rose above its
    level at the call while fn ran (Linux: the peak ``VmHWM`` of /proc/self/status, reset first through
    /proc/self/clear_refs; bytes is None elsewhere). Freed memory the allocator keeps counts as held: a measure
    for tensors of megabytes, not of bytes."""
    def read(field):
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets the peak to the current level
        start = read("VmRSS")
    except (OSError, StopIteration):
        return fn(*args, **kwargs), None
    result = fn(*args, **kwargs)
    return result, read("VmHWM") - start



def bytes_sent() -> int | None:
    """Bytes this process has written so far, sockets included (Linux: ``wchar`` of /proc/self/io); the difference
    around a collective is what it sent. None where /proc/self/io does not exist."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return None



def ring_worker(rank: int, world_size: int, cases: list) -> list:
    """Run :func:`ring_attention` on each case and return, per case, ``(out_block, RingStats, peak_bytes)``.

    A case is a dict of whole tensors ``q``, ``k``, ``v`` (B, h, L, d) and optionally ``key_padding_mask``
    (B, L), ``is_causal`` and ``layout``; each rank cuts out its own block (``torch.tensor_split`` or
    :func:`zigzag_split`). ``peak_bytes``: this rank's resident memory rise during the call
    (:func:`peak_memory_bytes`). Join the blocks with ``torch.cat(blocks, dim=2)`` or :func:`zigzag_merge`.
    """
    results = []
    for case in cases:
        layout = case.get("layout", "contiguous")
        cut = ((lambda x, dim: torch.tensor_split(x, world_size, dim=dim)[rank]) if layout == "contiguous"
               else (lambda x, dim: zigzag_split(x, world_size, dim=dim)[rank]))
        q, k, v = (cut(case[name], 2) for name in ("q", "k", "v"))
        mask = case.get("key_padding_mask")
        with torch.no_grad():
            (out, stats), peak = peak_memory_bytes(
                ring_attention, q, k, v, key_padding_mask=None if mask is None else cut(mask, 1),
                is_causal=case.get("is_causal", False), layout=layout, return_stats=True)
        results.append((out, stats, peak))
    return results


def head_parallel_worker(rank: int, world_size: int, mha: nn.Module, x: torch.Tensor, grad_output: torch.Tensor,
                         key_padding_mask=None, is_causal: bool = False) -> dict:
    """Split ``mha``'s heads over the ranks twice, by hand and with ``parallelize_module``, and return a dict:

    ``part``, ``by_hand``: :func:`head_parallel_by_hand`'s share and sum; ``output``: the
    :func:`parallelize_attention` layer's output for self-attention of x; ``grads``: its gradients after
    ``output.backward(grad_output)``, gathered (:meth:`HeadParallelAttention.gathered`), and ``x_grad``;
    ``sent``: the bytes this rank sent in the forward and the backward pass (:func:`bytes_sent`), beside
    ``formula`` (:func:`tp_bytes_per_layer`); ``collectives``: the collectives of each pass, as counted by
    torch's ``CommDebugMode``.
    """
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.debug import CommDebugMode

    masks = {"key_padding_mask": key_padding_mask, "is_causal": is_causal}
    with torch.no_grad():
        part, by_hand = head_parallel_by_hand(mha, x, **masks)
    layer = parallelize_attention(mha, init_device_mesh("cpu", (world_size,)))
    x = x.detach().requires_grad_()
    sent, counts = {}, {}
    for step in ("forward", "backward"):
        before = bytes_sent()
        with CommDebugMode() as comm:
            if step == "forward":
                output, _ = layer(x, x, x, **masks)
            else:
                output.backward(grad_output)
        after = bytes_sent()
        sent[step] = None if before is None else after - before
        counts[step] = {str(op): n for op, n in comm.get_comm_counts().items()}
    B, L, E = x.shape
    return {"part": part, "by_hand": by_hand, "output": output.detach(), "grads": layer.gathered(grads=True),
            "x_grad": x.grad, "sent": sent, "collectives": counts,
            "formula": tp_bytes_per_layer(B, L, E, world_size, x.dtype)}
