"""Attention across processes, on PyTorch's own engine ``torch.distributed`` (gloo on CPU processes).

Two ways to spread one attention layer over P processes ("ranks"), each following from an earlier chapter:

* **Heads over ranks** (tensor parallelism; heads are independent, chapter 5), :mod:`.heads`. Rank r keeps heads
  r h/P .. (r+1) h/P: its rows of W_q, W_k, W_v (column-parallel) and the matching columns of W_o (row-parallel).
  Its heads' output times its columns of W_o is its part of the layer's output; one all-reduce adds the parts.
  :func:`head_parallel_by_hand` does it with ``dist.all_reduce``, :func:`parallelize_attention` with
  ``parallelize_module``; :func:`split_in_proj_by_heads` cuts a packed ``in_proj_weight``;
  :func:`tp_bytes_per_layer` is what the all-reduce sends.
* **A sequence around a ring** (partial softmaxes merge exactly, chapter 8), :mod:`.ring`. Rank r keeps its block
  of queries; the key/value blocks pass from rank to rank, and each is merged in with the online softmax:
  :func:`ring_attention`, with :func:`zigzag_split` / :func:`zigzag_merge` to balance a causal mask, and
  :class:`RingStats` to count each rank's work, memory and messages.

:func:`launch` (:mod:`.processes`) starts the ranks on this machine and runs ``fn(rank, world_size, *args)`` in every
one. :func:`ring_worker` and :func:`head_parallel_worker` (:mod:`.workers`) are such functions, ready to launch (on
the CPU: :func:`head_parallel_worker` builds a ``"cpu"`` mesh). :func:`ring_attention` makes its tensors on its inputs'
device, so a script run by ``torchrun`` on GPUs (backend ``"nccl"``) calls it the same way; chapter 11 writes such a
script, and nothing here runs it. :mod:`.ship` sends a function written in a notebook cell to the workers by value,
and :mod:`.trial` runs it there on an exercise's cases, for chapter 11's checkers.

A worker runs in a fresh process, which imports ``fn`` by its module and name: ``fn`` must live in a file Python
can import (a package module, or a ``.py`` file beside the notebook), not in a notebook cell.
"""
from .heads import (HeadParallelAttention, allreduce_bytes, check_head_split, head_parallel_by_hand,
                    parallelize_attention, split_in_proj_by_heads, tp_bytes_per_layer)
from .processes import START_TIMEOUT, WorkerError, launch
from .ring import LAYOUTS, RingStats, block_ranges, ring_attention, zigzag_merge, zigzag_split
from .workers import bytes_sent, head_parallel_worker, peak_memory_bytes, ring_worker

__all__ = [
    "HeadParallelAttention", "LAYOUTS", "RingStats", "START_TIMEOUT", "WorkerError", "allreduce_bytes",
    "block_ranges", "bytes_sent", "check_head_split", "head_parallel_by_hand", "head_parallel_worker", "launch",
    "parallelize_attention", "peak_memory_bytes", "ring_attention", "ring_worker", "split_in_proj_by_heads",
    "tp_bytes_per_layer", "zigzag_merge", "zigzag_split",
]
