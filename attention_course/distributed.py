"""Attention across processes, on PyTorch's own engine ``torch.distributed`` (gloo on CPU processes).

Two ways to spread one attention layer over P processes ("ranks"), each following from an earlier chapter:

* **Heads over ranks** (tensor parallelism; heads are independent, chapter 5). Rank r keeps heads
  r h/P .. (r+1) h/P: its rows of W_q, W_k, W_v (column-parallel) and the matching columns of W_o (row-parallel).
  Its heads' output times its columns of W_o is its part of the layer's output; one all-reduce adds the parts.
  :func:`head_parallel_by_hand` does it with ``dist.all_reduce``, :func:`parallelize_attention` with
  ``parallelize_module``; :func:`split_in_proj_by_heads` cuts a packed ``in_proj_weight``;
  :func:`tp_bytes_per_layer` is what the all-reduce sends.
* **A sequence around a ring** (partial softmaxes merge exactly, chapter 8). Rank r keeps its block of queries;
  the key/value blocks pass from rank to rank, and each is merged in with the online softmax:
  :func:`ring_attention`, with :func:`zigzag_split` / :func:`zigzag_merge` to balance a causal mask, and
  :class:`RingStats` to count each rank's work, memory and messages.

:func:`launch` starts the ranks on this machine and runs ``fn(rank, world_size, *args)`` in every one.
:func:`ring_worker` and :func:`head_parallel_worker` are such functions, ready to launch. The same worker code
runs unchanged under ``torchrun`` on many machines (backend ``"nccl"`` on GPUs): only the start-up differs.

A worker runs in a fresh process, which imports ``fn`` by its module and name: ``fn`` must live in a file Python
can import (a package module, or a ``.py`` file beside the notebook), not in a notebook cell.
"""
from __future__ import annotations

import copy
import datetime
import itertools
import os
import pickle
import sys
import threading
import time
import traceback
from dataclasses import dataclass
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn

from .checks import check_device, check_positive_int, check_tensor
from .functional import _check_qkv, fused_attention
from .heads import head_dim, merge_heads, split_heads
from .masks import merge_masks
from .multihead import MultiheadAttention
from .tiled import merge_tile


class WorkerError(RuntimeError):
    """A worker process failed: ``rank`` is the worker, ``worker_traceback`` the traceback it printed (text)."""

    def __init__(self, rank: int, world_size: int, message: str, worker_traceback: str = ""):
        self.rank, self.world_size, self.worker_traceback = rank, world_size, worker_traceback
        text = f"worker rank {rank} of {world_size} failed: {message}"
        if worker_traceback:
            text += f"\n\nTraceback in worker rank {rank}:\n{worker_traceback.rstrip()}"
        super().__init__(text)


def _loopback_interface() -> str | None:
    """The name of the loopback network interface ('lo' on Linux, 'lo0' on macOS), for gloo to bind to."""
    try:
        import socket

        names = [name for _, name in socket.if_nameindex()]
    except (AttributeError, OSError):  # no if_nameindex on this platform
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


START_TIMEOUT = 300.0  # seconds the workers may take to start and meet (each imports torch: seconds on a busy machine)


def _end_with(caller: int) -> None:
    """End this worker when the process that launched it is gone (a notebook kernel restarted or killed while the
    workers ran): no orphan is left waiting for messages that will never come."""
    def watch():
        while True:
            time.sleep(1.0)
            try:
                os.kill(caller, 0)  # signal 0: only asks whether the process exists
            except ProcessLookupError:
                os._exit(1)
            except PermissionError:  # exists, owned by another user
                pass

    threading.Thread(target=watch, daemon=True).start()


def _worker(rank: int, world_size: int, port: int, timeout: float, payload: bytes, conn, caller=None) -> None:
    """Runs in each worker process: join the process group, say ("ready",), run fn, send back ("ok", result)
    or ("error", message, traceback)."""
    if caller is not None:
        _end_with(caller)
    try:
        env, fn, args = pickle.loads(payload)  # imports fn's module here, in the worker
        os.environ.clear()
        os.environ.update(env)  # the caller's environment now (the fork server's is that of its start)
        if "GLOO_SOCKET_IFNAME" not in os.environ and _loopback_interface():
            os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()  # stay on 127.0.0.1, whatever the hostname
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size))  # P workers share the cores
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT))
        # gloo's own limit on a collective lies beyond the caller's, so that a hang ends as the caller's TimeoutError.
        dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=2 * timeout + 10))
        conn.send(("ready",))
        try:
            result = fn(rank, world_size, *args)
        finally:
            dist.destroy_process_group()
        message = ("ok", pickle.dumps(result))
    except BaseException as exc:  # noqa: BLE001 -- everything goes back to the caller, with its traceback
        message = ("error", f"{type(exc).__name__}: {exc}", traceback.format_exc())
    conn.send(message)
    conn.close()


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


def _check_importable(fn) -> None:
    """Raise if a spawned process could not import ``fn`` by its module and qualified name."""
    if not callable(fn):
        raise TypeError(f"fn must be a function fn(rank, world_size, *args), got {type(fn).__name__}.")
    module, name = getattr(fn, "__module__", None), getattr(fn, "__qualname__", "")
    main = sys.modules.get("__main__")
    interactive = module == "__main__" and not getattr(main, "__file__", None)
    if interactive or "<lambda>" in name or "<locals>" in name:
        where = ("defined in a notebook cell or an interactive session (module __main__)" if interactive
                 else "a lambda or a function defined inside another function")
        short = getattr(fn, "__name__", "fn")
        raise ValueError(
            f"launch runs fn in fresh Python processes, which import it by module and name; {name or fn!r} is "
            f"{where}, which they cannot import. Put it in a .py file and import it from there: in a notebook, "
            f"start its cell with `%%writefile my_workers.py`, run it, then `from my_workers import {short}`."
        )


def _forget_the_fork_server() -> None:
    """In a process forked from one that launched (a grading server's child for each student, say): the inherited
    record of the parent's fork server, which multiprocessing would ``os.waitpid`` on and fail ("No child
    processes"), is dropped, and so is the parent's temporary folder, where the new server's socket would go (the
    parent may empty or remove it meanwhile: the grading sandbox does between students). This process's first
    launch then starts a fork server of its own, in a folder of its own."""
    from multiprocessing import forkserver, process

    server = forkserver._forkserver
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)  # this process's copy: the parent's server lives on
    server._forkserver_address = server._forkserver_alive_fd = server._forkserver_pid = None
    process.current_process()._config.pop("tempdir", None)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_fork_server)


def _context():
    """Where the start method allows it, workers fork from a server process that imported torch and this package
    once (``forkserver``): later launches start in a fraction of a second instead of seconds. Else ``spawn``."""
    if "forkserver" not in mp.get_all_start_methods():  # Windows
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "attention_course.distributed"])
    return ctx


def launch(world_size: int, fn, *args, timeout: float = 120.0) -> list:
    """Run ``fn(rank, world_size, *args)`` in ``world_size`` new processes joined in a gloo process group.

    Returns the ``world_size`` results, in rank order (each must be picklable: tensors, numbers, dicts...).

    Each worker is a new Python process that connects to a rendezvous store this process holds on
    127.0.0.1 at a free port, joins the default process group (backend gloo, CPU) and calls ``fn``; inside it,
    ``torch.distributed`` (``dist.all_reduce``, ``dist.isend``...) talks to the other workers. Usable from a
    notebook cell, as long as ``fn`` lives in an importable file (see the module's docstring).

    If a worker raises, the others are stopped and :class:`WorkerError` is raised here, naming the rank and holding
    the worker's traceback. If they are not all done ``timeout`` seconds after all of them joined the group (a
    worker waiting forever for a message no one sends: a collective not every rank called, a send without its
    receive), all are stopped and ``TimeoutError`` is raised. (Starting and joining have their own limit,
    ``START_TIMEOUT``.) No process is left behind either way, nor when this process itself is killed: each worker
    ends within a second or so of its caller.

    The first launch starts a server process that imports torch and this package once (seconds); workers fork
    from it, so later launches start in a fraction of a second (``forkserver``; ``spawn`` where there is no fork).
    """
    world_size = check_positive_int(world_size, "world_size")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    _check_importable(fn)
    try:
        payload = pickle.dumps((dict(os.environ), fn, args))
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"the arguments of launch must be picklable to reach the workers: {exc}") from exc
    # The rendezvous: a key-value store the workers meet at. Port 0: the system picks a free one, no race.
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=START_TIMEOUT))
    ctx = _context()
    procs, conns = [], []
    try:
        for rank in range(world_size):
            here, there = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(rank, world_size, store.port, timeout, payload, there, os.getpid()),
                            daemon=True)
            p.start()
            there.close()  # the worker's end stays open in the worker only
            procs.append(p)
            conns.append(here)
        return _collect(procs, conns, world_size, timeout)
    finally:
        for p in procs:  # stop whatever still runs (after a failure, a timeout or an interrupt), and reap it
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(5)
            if p.is_alive():
                p.kill()
                p.join()
        for c in conns:
            c.close()
        del store


# What a rank's error says when it is only the echo of another rank that ended or failed first.
_ECHOES = ("Connection closed by peer", "Connection reset by peer")


def _collect(procs, conns, world_size: int, timeout: float) -> list:
    """Wait for every worker's result. Raise the first error (preferring a cause to an echo: a rank that lost its
    peer), a worker that died without a word, or a timeout."""
    deadline = time.monotonic() + START_TIMEOUT  # until every worker is in the group; then `timeout` more
    results, pending, started, echo = [None] * world_size, dict(enumerate(conns)), 0, None
    while pending:
        ready = wait(list(pending.values()), timeout=max(deadline - time.monotonic(), 0))
        if not ready and echo is not None:
            raise echo
        if not ready:
            raise TimeoutError(
                f"launch: worker rank(s) {sorted(pending)} of {world_size} had not finished {timeout:g} s after "
                f"they all joined the group. Usually a rank waits for a message no one sends: a collective "
                f"(all_reduce, barrier...) that not every rank calls, or a send without its receive. Otherwise "
                f"pass a larger timeout=." if started == world_size else
                f"launch: worker rank(s) {sorted(pending)} of {world_size} had not joined the process group "
                f"after {START_TIMEOUT:g} s."
            )
        for rank in [r for r, c in pending.items() if c in ready]:
            try:
                message = pending.pop(rank).recv()
            except EOFError:  # the process ended without a word: killed, or crashed in C code
                procs[rank].join(5)
                raise WorkerError(rank, world_size, f"the process died without reporting (exit code "
                                  f"{procs[rank].exitcode}): killed, out of memory, or a crash in C code; or, if "
                                  f"launch is called from a script, the script lacks `if __name__ == \"__main__\":` "
                                  f"around that call (each worker imports the script first).") from None
            if message[0] == "ready":
                pending[rank], started = conns[rank], started + 1
                if started == world_size:  # all in the group: fn's time starts now
                    deadline = time.monotonic() + timeout
            elif message[0] == "ok":
                results[rank] = pickle.loads(message[1])
            elif not any(e in message[1] for e in _ECHOES):
                raise WorkerError(rank, world_size, message[1], message[2])
            elif echo is None:  # wait a little for the rank that caused it to say why
                hint = (" (another rank ended or failed while this one still waited for it: a collective or a "
                        "receive that not every rank reached?)")
                echo = WorkerError(rank, world_size, message[1] + hint, message[2])
                deadline = min(deadline, time.monotonic() + 2.0)
    if echo is not None:
        raise echo
    return results


# ---------------------------------------------------------------------------------------------------------------
# Ring attention: every rank keeps its block of queries; the key/value blocks travel around the ring.

LAYOUTS = ("contiguous", "zigzag")
_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)  # coded by index in the handshake


def _sizes(length: int, parts: int) -> list[int]:
    """The lengths of ``torch.tensor_split(x, parts)``'s pieces: the first ``length % parts`` are one longer."""
    base, longer = divmod(length, parts)
    return [base + 1] * longer + [base] * (parts - longer)


def block_ranges(length: int, world_size: int, layout: str = "contiguous") -> list[list[tuple[int, int]]]:
    """The positions of a sequence of ``length`` each rank holds: per rank, a list of ``(start, stop)`` pieces.

    ``"contiguous"``: rank r holds piece r of ``torch.tensor_split(x, world_size)``, one piece.
    ``"zigzag"``: the sequence is cut into 2P pieces and rank r holds pieces r and 2P-1-r, one from each end, so
    that under a causal mask every rank has the same work: its early piece attends few keys, its late piece many
    (see :func:`zigzag_split`).
    """
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    n = world_size if layout == "contiguous" else 2 * world_size
    stops = list(itertools.accumulate(_sizes(length, n)))
    pieces = list(zip([0, *stops[:-1]], stops))
    if layout == "contiguous":
        return [[piece] for piece in pieces]
    return [[pieces[r], pieces[n - 1 - r]] for r in range(world_size)]


def zigzag_split(x: torch.Tensor, world_size: int, dim: int = 2) -> list[torch.Tensor]:
    """Cut ``x`` along ``dim`` into 2P pieces (as ``torch.tensor_split`` does) and give rank r pieces r and 2P-1-r.

    With a causal mask, contiguous blocks leave rank 0 one tile of work and rank P-1 P tiles. In the zigzag each
    rank holds an early piece (few keys to attend to) and the mirror late piece (many): 2P+1 tiles each.
    """
    world_size = check_positive_int(world_size, "world_size")
    pieces = torch.tensor_split(x, 2 * world_size, dim=dim)
    return [torch.cat([pieces[r], pieces[2 * world_size - 1 - r]], dim=dim) for r in range(world_size)]


def zigzag_merge(blocks, dim: int = 2) -> torch.Tensor:
    """The inverse of :func:`zigzag_split`: the whole sequence back from the ranks' blocks, in rank order."""
    P = len(blocks)
    sizes = _sizes(sum(b.shape[dim] for b in blocks), 2 * P)
    pieces = [None] * (2 * P)
    for r, block in enumerate(blocks):
        if block.shape[dim] != sizes[r] + sizes[2 * P - 1 - r]:
            raise ValueError(f"block {r} has length {block.shape[dim]} along dim {dim}, but the zigzag of "
                             f"{P} blocks gives it {sizes[r] + sizes[2 * P - 1 - r]}: pass the blocks of "
                             f"zigzag_split, in rank order.")
        pieces[r], pieces[2 * P - 1 - r] = block.split([sizes[r], sizes[2 * P - 1 - r]], dim=dim)
    return torch.cat(pieces, dim=dim)


@dataclass
class RingStats:
    """What one rank did in :func:`ring_attention`. A tile is one (query piece, key piece) block of scores."""

    rank: int
    world_size: int
    tiles: int = 0  # tiles of scores computed
    skipped: int = 0  # tiles skipped: every key in every query's future (causal)
    scores: int = 0  # query-key scores computed, per sentence and head (the sum of bq * bk over the tiles)
    flops: int = 0  # 2 * B * h * bq * bk * (d + dv) summed over the tiles: the matmuls q k^T and p v
    score_bytes: int = 0  # the largest tile of scores held at once
    kv_bytes: int = 0  # the key/value blocks held at once: the one in use and the one arriving
    sent_bytes: int = 0  # bytes sent to the next rank
    compute_s: float = 0.0  # seconds spent computing tiles
    wait_s: float = 0.0  # seconds spent waiting for the next block once the tiles were done (idle)


def _check_ring_inputs(q, k, v, key_padding_mask, layout) -> None:
    """What one rank can check alone, before talking to the others."""
    if not dist.is_available() or not dist.is_initialized():
        raise RuntimeError(
            "ring_attention runs inside a process group, one call per rank: call it from a function that "
            "launch(world_size, fn) runs, or after torch.distributed.init_process_group(...) (torchrun)."
        )
    _check_qkv(q, k, v)
    if q.ndim != 4:
        raise ValueError(f"q, k and v must be (B, h, L_r, d): this rank's block of every head, got q {tuple(q.shape)}. "
                         f"Split heads first (split_heads(x, h) turns (B, L_r, D) into (B, h, L_r, d)).")
    if k.shape[2] != q.shape[2]:
        raise ValueError(f"q holds {q.shape[2]} positions but k and v hold {k.shape[2]}: in ring attention each rank "
                         f"passes the queries, keys and values of the same positions (its block of one sequence).")
    if torch.is_grad_enabled() and any(x.requires_grad for x in (q, k, v)):
        raise RuntimeError("ring_attention computes the forward pass only: its key/value blocks arrive through "
                           "send/recv, which autograd does not differentiate. Call it under torch.no_grad() (or "
                           "pass tensors that do not require grad).")
    if layout not in LAYOUTS:
        raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}.")
    if key_padding_mask is not None:
        check_tensor(key_padding_mask, "key_padding_mask")
        B, L_r = q.shape[0], q.shape[2]
        if key_padding_mask.dtype != torch.bool or tuple(key_padding_mask.shape) != (B, L_r):
            raise ValueError(
                f"key_padding_mask must be a bool tensor (B, L_r) = ({B}, {L_r}), True at this rank's padded keys, "
                f"got {key_padding_mask.dtype} {tuple(key_padding_mask.shape)}. Cut the whole (B, L) mask like the "
                f"keys, along dim 1: torch.tensor_split(mask, world_size, dim=1)[rank] (or zigzag_split(mask, "
                f"world_size, dim=1)[rank])."
            )
        check_device(key_padding_mask, "key_padding_mask", q.device, "q")


def _handshake(q, v, key_padding_mask, is_causal, layout, rank, P, group) -> list[int]:
    """Every rank's block length, after checking that all ranks called with the same shapes and options."""
    B, h, L_r, d = q.shape
    mine = [B, h, L_r, d, v.shape[-1], key_padding_mask is not None, bool(is_causal), LAYOUTS.index(layout),
            _DTYPES.index(q.dtype) if q.dtype in _DTYPES else -1]
    everyone = [torch.zeros(len(mine), dtype=torch.int64, device=q.device) for _ in range(P)]
    dist.all_gather(everyone, torch.tensor(mine, device=q.device), group=group)
    everyone = [t.tolist() for t in everyone]
    names = ["B", "h", None, "d", "dv", "a key_padding_mask", "is_causal", "layout", "dtype"]
    for i, name in enumerate(names):
        values = [row[i] for row in everyone]
        if name is not None and len(set(values)) > 1:
            raise ValueError(f"the ranks disagree on {name}: rank by rank {values}. Every rank must call "
                             f"ring_attention with the same B, h, d, dv, dtype, options, and all or none with a "
                             f"key_padding_mask (all False where a block has no padding).")
    lengths = [row[2] for row in everyone]
    want = [sum(b - a for a, b in pieces) for pieces in block_ranges(sum(lengths), P, layout)]
    if lengths != want:
        cut = ("torch.tensor_split(x, world_size, dim=2)[rank]" if layout == "contiguous"
               else "zigzag_split(x, world_size, dim=2)[rank]")
        raise ValueError(f"rank by rank the blocks hold {lengths} positions, but a sequence of {sum(lengths)} cut "
                         f"into {P} {layout} blocks gives {want}. Cut q, k, v with {cut}.")
    return lengths


def ring_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    key_padding_mask: torch.Tensor | None = None,
    is_causal: bool = False,
    group=None,
    layout: str = "contiguous",
    return_stats: bool = False,
):
    """Attention of this rank's queries over the whole sequence, whose keys and values are spread over the ranks.

    Called by every rank of ``group`` (default: all), each with its block of one sequence: q, k, v
    (B, h, L_r, d|dv) as ``torch.tensor_split(x, world_size, dim=2)[rank]`` cuts them (``layout="contiguous"``;
    lengths may differ by one) or as ``zigzag_split(x, world_size)[rank]`` does (``layout="zigzag"``), and its
    keys' padding mask (B, L_r), True at pads. Returns this rank's block of the output (B, h, L_r, dv), equal up
    to rounding to full attention over the whole sequence cut the same way; a query with no key to attend to gets
    zeros (as :func:`~attention_course.functional.fused_attention`).

    The ring: at step s (of P) rank r holds the key/value block of rank (r - s) mod P. It starts sending that
    block to rank r+1 and receiving the next from rank r-1 (``isend``/``irecv``), computes the block's tiles of
    scores meanwhile, merges them into its running (m, l, acc) with chapter 8's online softmax, and waits for the
    transfer only then. With ``is_causal=True`` query i attends keys 0..i; tiles whose keys all lie in every
    query's future are skipped. ``return_stats=True`` returns ``(out, RingStats)``: the work and memory of this rank.

    Forward only: the blocks arrive through send/recv, which autograd does not differentiate.
    """
    _check_ring_inputs(q, k, v, key_padding_mask, layout)
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    lengths = _handshake(q, v, key_padding_mask, is_causal, layout, rank, P, group)
    pieces = block_ranges(sum(lengths), P, layout)  # the global (start, stop) of each rank's pieces
    stats = RingStats(rank, P)
    B, h, L_r, d = q.shape
    dv = v.shape[-1]
    peer = lambda r: r if group is None else dist.get_global_rank(group, r)  # noqa: E731
    send_to, recv_from = peer((rank + 1) % P), peer((rank - 1) % P)

    qs = q * d**-0.5  # (B, h, L_r, d), scaled once
    kv = torch.cat([k, v], dim=-1)  # (B, h, L_r, d + dv): one message per step
    pads = None if key_padding_mask is None else key_padding_mask.to(torch.uint8)  # (B, L_r); gloo sends uint8
    states = [(q.new_full((B, h, b - a, 1), float("-inf")), q.new_zeros((B, h, b - a, 1)),
               q.new_zeros((B, h, b - a, dv))) for a, b in pieces[rank]]  # (m, l, acc) per query piece
    for step in range(P):
        src = (rank - step) % P  # whose keys and values we hold now
        if step < P - 1:  # start passing them on, and receiving the next, before computing
            nxt = (rank - step - 1) % P
            recv_kv = kv.new_empty((B, h, lengths[nxt], d + dv))
            ops = [dist.P2POp(dist.isend, kv, send_to), dist.P2POp(dist.irecv, recv_kv, recv_from)]
            stats.sent_bytes += kv.nbytes
            if pads is not None:
                recv_pads = pads.new_empty((B, lengths[nxt]))
                ops += [dist.P2POp(dist.isend, pads, send_to), dist.P2POp(dist.irecv, recv_pads, recv_from)]
                stats.sent_bytes += pads.nbytes
            requests = dist.batch_isend_irecv(ops)
            stats.kv_bytes = max(stats.kv_bytes, kv.nbytes + recv_kv.nbytes)
        stats.kv_bytes = max(stats.kv_bytes, kv.nbytes)
        start = time.perf_counter()
        q_off = 0
        for i, (qa, qb) in enumerate(pieces[rank]):
            k_off = 0
            for ka, kb in pieces[src]:
                k_lo, k_hi, k_off = k_off, k_off + kb - ka, k_off + kb - ka
                if qb == qa or kb == ka:  # an empty piece (a sequence shorter than 2P in the zigzag)
                    continue
                if is_causal and ka > qb - 1:  # every key after every query: nothing to compute
                    stats.skipped += 1
                    continue
                s = qs[:, :, q_off:q_off + qb - qa] @ kv[:, :, k_lo:k_hi, :d].transpose(-2, -1)  # (B, h, bq, bk)
                if is_causal and kb - 1 > qa:  # the tile crosses the diagonal: mask key j > query i
                    future = torch.arange(ka, kb, device=q.device) > torch.arange(qa, qb, device=q.device)[:, None]
                    s = s.masked_fill(future, float("-inf"))
                if pads is not None:
                    s = s.masked_fill(pads[:, None, None, k_lo:k_hi].bool(), float("-inf"))
                states[i] = merge_tile(states[i], s, kv[:, :, k_lo:k_hi, d:])
                stats.tiles += 1
                stats.scores += (qb - qa) * (kb - ka)
                stats.flops += 2 * B * h * (qb - qa) * (kb - ka) * (d + dv)
                stats.score_bytes = max(stats.score_bytes, s.nbytes)
            q_off += qb - qa
        stats.compute_s += time.perf_counter() - start
        if step < P - 1:
            start = time.perf_counter()
            for request in requests:
                request.wait()
            stats.wait_s += time.perf_counter() - start
            kv, pads = recv_kv, (None if pads is None else recv_pads)
    # A query that saw no key has l = 0 and acc = 0: divide by 1 instead, the output is 0.
    out = torch.cat([acc / l.masked_fill(l == 0, 1.0) for m, l, acc in states], dim=2)  # (B, h, L_r, dv)  # noqa: E741
    return (out, stats) if return_stats else out


# ---------------------------------------------------------------------------------------------------------------
# Heads over ranks (tensor parallelism): W_q, W_k, W_v split by heads (column-parallel), W_o by its input rows
# (row-parallel); each rank computes its heads, and one all-reduce sums the ranks' parts of the output.


def check_head_split(num_heads: int, world_size: int, num_kv_heads: int | None = None) -> int:
    """The number of heads each rank holds, after checking that ``world_size`` divides the heads.

    With grouped-query attention (``num_kv_heads`` < ``num_heads``) each rank needs whole groups: its query heads
    and the key/value heads they share, so ``world_size`` must divide ``num_kv_heads`` too (or the key/value heads
    would have to be copied to several ranks).
    """
    num_heads, world_size = check_positive_int(num_heads, "num_heads"), check_positive_int(world_size, "world_size")
    fits = [p for p in range(1, num_heads + 1) if num_heads % p == 0]
    if num_heads % world_size:
        raise ValueError(f"{world_size} ranks cannot share {num_heads} heads equally: the world size must divide "
                         f"num_heads. Use {fits} ranks, or a layer with a multiple of {world_size} heads.")
    if num_kv_heads is not None and num_kv_heads % world_size:
        raise ValueError(f"{world_size} ranks cannot share {num_kv_heads} key/value heads: with grouped-query "
                         f"attention each rank holds whole groups, so the world size must divide num_kv_heads too.")
    return num_heads // world_size


def split_in_proj_by_heads(in_proj: torch.Tensor, num_heads: int, rank: int, world_size: int) -> torch.Tensor:
    """Rank ``rank``'s rows of a packed input projection: (3E, E) weight -> (3E/P, E), or (3E,) bias -> (3E/P,).

    ``in_proj_weight`` stacks W_q; W_k; W_v, each (E, E) with head j in rows j*d .. (j+1)*d. Rank r of P holds
    heads r*h/P .. (r+1)*h/P of each: those rows of W_q, then of W_k, then of W_v. (Cutting the packed rows into P
    contiguous pieces instead would give rank 0 all of W_q and part of W_k.)
    """
    check_tensor(in_proj, "in_proj")
    if in_proj.ndim not in (1, 2) or in_proj.shape[0] % 3:
        raise ValueError(f"in_proj must be a packed (3E, E) in_proj_weight or (3E,) in_proj_bias, got shape "
                         f"{tuple(in_proj.shape)}.")
    heads = check_head_split(num_heads, world_size)
    if not 0 <= rank < world_size:
        raise ValueError(f"rank must be in 0..{world_size - 1}, got {rank}.")
    E = in_proj.shape[0] // 3
    d = head_dim(E, num_heads)
    rows = slice(rank * heads * d, (rank + 1) * heads * d)
    return torch.cat([w[rows] for w in in_proj.chunk(3)])  # (3E/P, E) or (3E/P,)


def allreduce_bytes(nbytes: int, world_size: int) -> float:
    """Bytes each rank sends in a ring all-reduce of ``nbytes``: 2 (P-1)/P nbytes (a reduce-scatter, then an
    all-gather, each passing P-1 pieces of nbytes/P). Gloo's all-reduce on the CPU is this ring."""
    return 2 * (world_size - 1) / world_size * nbytes


def tp_bytes_per_layer(batch: int, length: int, embed_dim: int, world_size: int, dtype=torch.float32) -> float:
    """Bytes each rank sends in one forward pass of a head-parallel attention layer: the one all-reduce of the
    (B, L, E) output, 2 (P-1)/P B L E bytes-per-number. It does not depend on the number of heads.

    (The backward pass all-reduces the input's gradient, a partial sum over the ranks' heads: in
    :class:`HeadParallelAttention`, whose three projections are three ``ColwiseParallel`` layers, once per
    projection, three times this. Packing the three into one layer, as Megatron-LM does, makes it once.)"""
    return allreduce_bytes(batch * length * embed_dim * torch.empty((), dtype=dtype).element_size(), world_size)


def bytes_sent() -> int | None:
    """Bytes this process has written so far, sockets included (Linux: ``wchar`` of /proc/self/io); the difference
    around a collective is what it sent. None where /proc/self/io does not exist."""
    try:
        with open("/proc/self/io") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("wchar:"))
    except (OSError, StopIteration):
        return None


class HeadParallelAttention(nn.Module):
    """A multi-head attention layer whose heads are spread over the ranks of a 1-D ``DeviceMesh``.

    Built by :func:`parallelize_attention` from a ``MultiheadAttention`` (the course's or torch's, whose packed
    ``in_proj_weight`` is not an ``nn.Linear``): its W_q, W_k, W_v become the ``nn.Linear`` ``q_proj``, ``k_proj``,
    ``v_proj`` and ``parallelize_module`` splits them by output rows (``ColwiseParallel``: rank r keeps heads
    r h/P .. (r+1) h/P), and ``out_proj`` by input columns (``RowwiseParallel``: the columns that multiply those
    heads). Each rank attends with its own heads; ``out_proj`` adds the ranks' parts with one all-reduce.

    ``forward(query, key, value, key_padding_mask=None, attn_mask=None, is_causal=False)`` takes the masks of
    ``MultiheadAttention`` and returns ``(output, None)`` like it with ``need_weights=False``: the same output on
    every rank. The parameters are DTensors holding this rank's shard.
    """

    def __init__(self, mha: nn.Module, mesh):
        # Imported here, not with the package: torch.distributed.tensor is heavy, and only this layer needs it.
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        super().__init__()
        if not isinstance(mha, (nn.MultiheadAttention, MultiheadAttention)):
            raise TypeError(f"parallelize_attention takes a MultiheadAttention (the course's or torch's), got "
                            f"{type(mha).__name__}.")
        if mesh.ndim != 1:
            raise ValueError(f"the mesh must be 1-D (the ranks that share the heads), got {mesh.ndim}-D; pass "
                             f"mesh[name] for the tensor-parallel dimension of a larger mesh.")
        E, h, P = mha.embed_dim, mha.num_heads, mesh.size()
        self.num_heads, self.local_heads = h, check_head_split(h, P)
        self.first_head = mesh.get_local_rank() * self.local_heads
        self.dropout, self.batch_first, self.packed = mha.dropout, mha.batch_first, mha.in_proj_weight is not None
        weight = mha.out_proj.weight
        W = mha.in_proj_weight.chunk(3) if self.packed else (mha.q_proj_weight, mha.k_proj_weight, mha.v_proj_weight)
        b = (None,) * 3 if mha.in_proj_bias is None else mha.in_proj_bias.chunk(3)
        for name, w, bias in zip(("q_proj", "k_proj", "v_proj"), W, b):
            linear = nn.Linear(w.shape[1], E, bias=bias is not None, device=weight.device, dtype=weight.dtype)
            with torch.no_grad():
                linear.weight.copy_(w)
                if bias is not None:
                    linear.bias.copy_(bias)
            setattr(self, name, linear)
        self.out_proj = copy.deepcopy(mha.out_proj)
        plan = {"q_proj": ColwiseParallel(), "k_proj": ColwiseParallel(), "v_proj": ColwiseParallel(),
                "out_proj": RowwiseParallel()}
        parallelize_module(self, mesh, plan)  # the weights become DTensors: this rank keeps its shard

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None, is_causal=False):
        if not self.batch_first:
            query, key, value = (x.transpose(0, 1) for x in (query, key, value))  # (L, B, E) -> (B, L, E)
        (B, L, _), S = query.shape, key.shape[1]
        q, k, v = (split_heads(proj(x), self.local_heads)  # (B, L, E/P): this rank's heads -> (B, h/P, L|S, d)
                   for proj, x in ((self.q_proj, query), (self.k_proj, key), (self.v_proj, value)))
        mask = merge_masks(key_padding_mask, attn_mask, batch_size=B, num_heads=self.num_heads, query_len=L,
                           key_len=S, is_causal=is_causal, dtype=query.dtype, device=query.device, expand=False)
        if mask is not None and mask.shape[1] > 1:  # a mask per head: keep this rank's heads
            mask = mask[:, self.first_head:self.first_head + self.local_heads]
        out = fused_attention(q, k, v, mask, self.dropout, self.training)  # (B, h/P, L, d)
        out = self.out_proj(merge_heads(out))  # (B, L, E/P) @ its rows of W_o^T, summed over the ranks: (B, L, E)
        out = torch.ops._c10d_functional.wait_tensor(out)  # the all-reduce runs asynchronously: wait for it
        return (out if self.batch_first else out.transpose(0, 1)), None

    def gathered(self, grads: bool = False) -> dict:
        """The whole parameters (or their gradients), gathered from every rank, under the names of the
        ``MultiheadAttention`` this layer was made from: compare them with it. A collective: every rank calls it."""
        def full(p):
            t = p.grad if grads else p
            return None if t is None else t.full_tensor().detach()
        names = ("q", "k", "v")
        if self.packed:
            out = {"in_proj_weight": torch.cat([full(getattr(self, f"{n}_proj").weight) for n in names])}
        else:
            out = {f"{n}_proj_weight": full(getattr(self, f"{n}_proj").weight) for n in names}
        if self.q_proj.bias is not None:
            out["in_proj_bias"] = torch.cat([full(getattr(self, f"{n}_proj").bias) for n in names])
        out["out_proj.weight"] = full(self.out_proj.weight)
        if self.out_proj.bias is not None:
            out["out_proj.bias"] = full(self.out_proj.bias)
        return out


def parallelize_attention(mha: nn.Module, mesh) -> HeadParallelAttention:
    """``mha`` (the course's or torch's ``MultiheadAttention``) with its heads split over the ranks of ``mesh``.

    Inside a process group, every rank calls it with the same layer and a 1-D mesh, e.g.
    ``init_device_mesh("cpu", (world_size,))``; ``parallelize_module`` copies rank 0's weights to all. The result
    computes the same output and gradients as ``mha`` (see :class:`HeadParallelAttention`). The world size must
    divide the number of heads.
    """
    return HeadParallelAttention(mha, mesh)


def head_parallel_by_hand(mha: nn.Module, x: torch.Tensor, *, key_padding_mask=None, is_causal=False, group=None):
    """Self-attention of x (B, L, E) through this rank's heads of ``mha``, by hand: ``(part, output)``.

    Rank r projects x with its rows of the packed ``in_proj_weight`` (:func:`split_in_proj_by_heads`), attends
    with its h/P heads, and multiplies their merged output (B, L, E/P) by its E/P columns of W_o: ``part``
    (B, L, E), its share of the output. ``dist.all_reduce`` adds the ranks' parts; adding the output bias once
    gives ``output``, equal to ``mha(x, x, x)[0]`` (block matrices: W_o [o_0 ... o_{P-1}]^T = sum_r W_o,r o_r).
    """
    if getattr(mha, "in_proj_weight", None) is None:
        raise ValueError("head_parallel_by_hand takes a layer with a packed in_proj_weight (kdim = vdim = embed_dim).")
    rank, P = dist.get_rank(group), dist.get_world_size(group)
    heads, (B, L, E) = check_head_split(mha.num_heads, P), x.shape
    W = split_in_proj_by_heads(mha.in_proj_weight, mha.num_heads, rank, P)  # (3E/P, E)
    b = None if mha.in_proj_bias is None else split_in_proj_by_heads(mha.in_proj_bias, mha.num_heads, rank, P)
    q, k, v = (split_heads(t, heads) for t in F.linear(x, W, b).chunk(3, dim=-1))  # (B, h/P, L, d) each
    mask = merge_masks(key_padding_mask, None, batch_size=B, num_heads=1, query_len=L, key_len=L,
                       is_causal=is_causal, dtype=x.dtype, device=x.device, expand=False)  # (B|1, 1, L|1, L)
    out = merge_heads(fused_attention(q, k, v, mask))  # (B, L, E/P)
    cols = slice(rank * E // P, (rank + 1) * E // P)
    part = out @ mha.out_proj.weight[:, cols].T  # (B, L, E): this rank's share of the output, before the bias
    total = part.clone()
    dist.all_reduce(total, group=group)  # sum over the ranks, on every rank
    return part, (total if mha.out_proj.bias is None else total + mha.out_proj.bias)


# ---------------------------------------------------------------------------------------------------------------
# Workers for launch: importable functions fn(rank, world_size, ...) that run many cases in one launch.


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
