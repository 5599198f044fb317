"""Starting worker processes on this machine: :func:`launch` runs ``fn(rank, world_size, *args)`` in each, joined in a
gloo process group, and returns their results in rank order (a worker's exception comes back as
:class:`WorkerError`; a hang ends in ``TimeoutError``; no process is left behind).

A worker runs in a fresh process, which imports ``fn`` by its module and name: ``fn`` must live in a file Python
can import (a package module, or a ``.py`` file beside the notebook), not in a notebook cell. (To run a function
written in a notebook cell, send it by value: :mod:`attention_course.distributed.ship`.)
"""
from __future__ import annotations

import datetime
import importlib
import os
import pickle
import sys
import threading
import time
import traceback
from multiprocessing.connection import wait

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ..checks import check_positive_int


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


def _worker(rank: int, world_size: int, timeout: float, payload: bytes, conn, caller=None) -> None:
    """Runs in each worker process: take the rendezvous's port from the caller, join the process group, say
    ("ready",), run fn, send back ("ok", result) or ("error", message, traceback)."""
    if caller is not None:
        _end_with(caller)
    try:
        if not conn.poll(START_TIMEOUT):
            raise TimeoutError(f"the caller sent no rendezvous port in {START_TIMEOUT:g} s")
        port = conn.recv()
        env, fn, args = pickle.loads(payload)  # imports fn's module here, in the worker
        os.environ.clear()
        os.environ.update(env)  # the caller's environment now (the fork server's is that of its start)
        if "GLOO_SOCKET_IFNAME" not in os.environ and _loopback_interface():
            os.environ["GLOO_SOCKET_IFNAME"] = _loopback_interface()  # stay on 127.0.0.1, whatever the hostname
        # P workers share the cores, each with no more threads than its caller had (OMP_NUM_THREADS kept)
        torch.set_num_threads(max(1, min(torch.get_num_threads(), (os.cpu_count() or 1) // world_size)))
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


# What a worker imports before it runs fn, once for all: torch.distributed.tensor (parallelize_module, DeviceMesh)
# too, seconds to import, once in the caller (fork) or the fork server instead of in every worker of a head-parallel
# launch.
PRELOAD = ["torch", "torch.distributed", "torch.distributed.tensor.parallel", "torch.distributed.tensor.debug",
           "attention_course.distributed"]


def _one_thread() -> bool:
    """Whether this process runs a single thread (counted by Linux: /proc/self/task) and has not started CUDA: then
    a fork copies all it needs and nothing half done (a lock another thread held, a GPU context)."""
    try:
        threads = len(os.listdir("/proc/self/task"))
    except OSError:  # not Linux, or no /proc: unknown
        return False
    return threads == 1 and not (torch.cuda.is_available() and torch.cuda.is_initialized())


def _context():
    """How workers start. From a process that runs one thread (a script, a grading server's child for a student:
    :func:`_one_thread`), they fork from it (``fork``): they have torch and everything it imported at once. From one
    with several (a notebook's kernel, a test runner), where a fork could copy a lock another thread holds, they fork
    from a server process that imported torch and this package once (``forkserver``): later launches start in a
    fraction of a second instead of seconds. Else (Windows) ``spawn``."""
    if "forkserver" not in mp.get_all_start_methods():  # Windows
        return mp.get_context("spawn")
    if _one_thread():
        for module in PRELOAD:  # imported once here, not in every worker (a no-op once imported)
            importlib.import_module(module)
        if _one_thread():  # asked again: an import may start a thread
            return mp.get_context("fork")
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(PRELOAD)
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

    From a process that runs one thread (a script), the workers fork from it. From one with several (a notebook's
    kernel), the first launch starts a server process that imports torch and this package once (seconds); workers
    fork from it, so later launches start in a fraction of a second (``forkserver``; ``spawn`` where there is no
    fork).
    """
    world_size = check_positive_int(world_size, "world_size")
    if isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or not timeout > 0:
        raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}.")
    _check_importable(fn)
    try:
        payload = pickle.dumps((dict(os.environ), fn, args))
    except Exception as exc:  # noqa: BLE001
        raise TypeError(f"the arguments of launch must be picklable to reach the workers: {exc}") from exc
    ctx = _context()  # before the store, whose server is a thread of this process
    procs, conns, store = [], [], None
    try:
        for rank in range(world_size):
            here, there = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(rank, world_size, timeout, payload, there, os.getpid()), daemon=True)
            p.start()
            there.close()  # the worker's end stays open in the worker only
            procs.append(p)
            conns.append(here)
        # The rendezvous: a key-value store the workers meet at, its port sent to each. Port 0: the system picks a
        # free one, no race.
        store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=START_TIMEOUT))
        for conn in conns:
            conn.send(store.port)
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
