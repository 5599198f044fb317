"""What grading ends and deletes: the processes it started and the folders it made, never anything else.

A process is ended because it descends from one that grading started (the server or watchdog that calls
:func:`end_descendants` is a *child subreaper*, :func:`subreaper`: a process that its code detaches, by a double
fork or ``setsid``, is re-parented to it rather than to the machine's init, and so stays among its descendants). A
file is deleted because it lies in a folder that grading made (:func:`empty`). Inside bubblewrap's sandbox the
sandbox's own process and mount namespaces may be emptied whole, but only once :func:`own_namespaces` has checked
that this process is in namespaces other than those of the process that started it, never by assumption.

Standard library only: the check server imports it inside the sandbox, where it is bound in read-only beside
``check_server.py`` and nothing else of ``instructor/`` is visible.
"""
from __future__ import annotations

import ctypes
import os
import shutil
import signal
import time

PR_SET_CHILD_SUBREAPER = 36
NAMESPACES = ("pid", "mnt")


def subreaper() -> bool:
    """Make this process the reaper of its orphaned descendants (Linux 3.4+). True when it took."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state), for every process /proc shows."""
    found = {}
    for entry in os.scandir("/proc"):
        if entry.name.isdigit():
            try:
                with open(os.path.join(entry.path, "stat")) as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                found[int(entry.name)] = int(fields[1]), fields[0]
            except (OSError, IndexError, ValueError):
                continue  # ended while /proc was read
    return found


def descendants(root: int, zombies: bool = True) -> list[int]:
    """The processes below ``root`` (not ``root`` itself), parents before children; without the ended ones that
    wait to be reaped when ``zombies`` is False (a signal cannot reach them, and they hold nothing but their pid)."""
    processes = _processes()
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in processes.items():
        children.setdefault(ppid, []).append(pid)
    found, todo = [], list(children.get(root, []))
    while todo:
        pid = todo.pop(0)
        found.append(pid)
        todo.extend(children.get(pid, []))
    return [pid for pid in found if zombies or processes.get(pid, (0, "Z"))[1] != "Z"]


def _parent(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return int(f.read().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def below(pid: int, root: int) -> bool:
    """True when ``pid`` is a descendant of ``root`` now."""
    seen = set()
    while pid not in (0, root) and pid not in seen:
        seen.add(pid)
        pid = _parent(pid)
    return pid == root


def _kill_descendant(root: int, pid: int) -> None:
    """SIGKILL ``pid`` once it is certain to be a descendant of ``root``: the process is pinned first (a pidfd), then
    its ancestry read, so that a pid freed and reused meanwhile by a process that is not ours is never signalled."""
    pin = getattr(os, "pidfd_open", None)
    try:
        fd = pin(pid) if pin is not None else None
    except OSError:
        return  # ended already
    try:
        if below(pid, root):
            signal.pidfd_send_signal(fd, signal.SIGKILL) if fd is not None else os.kill(pid, signal.SIGKILL)
    except OSError:
        pass
    finally:
        if fd is not None:
            os.close(fd)


def reap(keep: tuple[int, ...] = ()) -> None:
    """Collect the ended children of this process (a subreaper inherits orphans, zombies too), but those in
    ``keep`` (a child that a ``subprocess.Popen`` waits for itself)."""
    for pid, (ppid, state) in _processes().items():
        if ppid == os.getpid() and state == "Z" and pid not in keep:
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def end_descendants(root: int | None = None, keep: tuple[int, ...] = (), rounds: int = 100) -> int:
    """SIGKILL every descendant of ``root`` (this process by default), again until none is left alive (one may fork
    while its siblings are killed), reaping those that end as this process's children but the ones in ``keep``.
    The number of kills sent."""
    root = os.getpid() if root is None else root
    ended = 0
    for _ in range(rounds):
        found = descendants(root, zombies=False)
        if not found:
            break
        for pid in found:
            _kill_descendant(root, pid)
        ended += len(found)
        if root == os.getpid():
            time.sleep(0.01)  # SIGKILL is delivered asynchronously: let them end before the next look
            reap(keep)
    return ended


def empty(folder: str) -> None:
    """Delete what lies in ``folder`` (a folder that the caller made, or the sandbox's own /tmp), not the folder."""
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        try:
            shutil.rmtree(path) if os.path.isdir(path) and not os.path.islink(path) else os.unlink(path)
        except OSError:
            pass


def namespaces() -> dict[str, str]:
    """This process's PID and mount namespaces (``/proc/self/ns/*``: ``'pid:[4026531836]'``), {} where unreadable."""
    try:
        return {kind: os.readlink(f"/proc/self/ns/{kind}") for kind in NAMESPACES}
    except OSError:
        return {}


def own_namespaces(outside: dict | None) -> bool:
    """True only when this process is in PID and mount namespaces that differ from ``outside`` (the namespaces of the
    process that started it, as :func:`namespaces` read them there) and PID 1 of its namespace is its ancestor:
    then every process it sees and its /tmp belong to the sandbox. False whenever anything is unknown."""
    mine = namespaces()
    if not mine or not outside or any(not outside.get(kind) or mine[kind] == outside[kind] for kind in NAMESPACES):
        return False
    pid, processes = os.getpid(), _processes()
    while pid not in (0, 1):
        pid = processes.get(pid, (0, ''))[0]
    return pid == 1 and os.getpid() != 1
