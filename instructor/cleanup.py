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


def _signal_descendant(root: int, pid: int, signum: int) -> None:
    """Send ``signum`` to ``pid`` once it is certain to be a descendant of ``root``: the process is pinned first (a
    pidfd), then its ancestry read, so that a pid freed and reused meanwhile by a process that is not ours is never
    signalled."""
    pin = getattr(os, "pidfd_open", None)
    try:
        fd = pin(pid) if pin is not None else None
    except ProcessLookupError:
        return  # ended already
    except OSError:  # no pidfds here (a kernel before 5.3, a seccomp filter): the ancestry alone decides
        fd = None
    try:
        if below(pid, root):
            signal.pidfd_send_signal(fd, signum) if fd is not None else os.kill(pid, signum)
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
    """End every descendant of ``root`` (this process by default): each stopped (SIGSTOP, parents first), then killed
    (SIGKILL, children first), so that none is re-parented out of the tree while the others are ended; again until
    none is left alive, reaping those that end as this process's children but the ones in ``keep``. The number of
    processes ended."""
    root = os.getpid() if root is None else root
    ended = 0
    for _ in range(rounds):
        found = descendants(root, zombies=False)
        if not found:
            break
        for pid in found:  # stopped from the top down: none forks again, none is orphaned before its turn
            _signal_descendant(root, pid, signal.SIGSTOP)
        for pid in reversed(found):  # then killed from the leaves up, each while its parent still holds it
            _signal_descendant(root, pid, signal.SIGKILL)
        ended += len(found)
        time.sleep(0.01)  # SIGKILL is delivered asynchronously: let them end before the next look
        if root == os.getpid():
            reap(keep)
    return ended


def empty(folder: str, keep: tuple[str, ...] = ()) -> None:
    """Delete what lies in ``folder`` (a folder that the caller made, or the sandbox's own /tmp), not the folder, and
    nothing on another file system (a folder bound in from outside, as the server's own is in the sandbox's /tmp)
    nor the paths in ``keep`` (emptied apart)."""
    if not os.path.isdir(folder) or os.path.islink(folder):
        return
    device = os.stat(folder).st_dev
    for name in os.listdir(folder):
        path = os.path.join(folder, name)
        if path in keep:
            continue
        try:
            if os.lstat(path).st_dev != device:
                continue
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
    process that started it, as :func:`namespaces` read them there), /proc is its namespace's, /tmp is a tmpfs
    mounted in its namespace, and PID 1 of its namespace is its ancestor: then every process it sees and its /tmp
    belong to the sandbox. False whenever anything is unknown."""
    mine = namespaces()
    if not mine or not outside or any(not outside.get(kind) or mine[kind] == outside[kind] for kind in NAMESPACES):
        return False
    try:  # /proc is this namespace's (a parent's /proc would list the machine's processes), /tmp a tmpfs of its own
        if os.readlink("/proc/self") != str(os.getpid()) or os.readlink("/proc/1/ns/pid") != mine["pid"]:
            return False
        with open("/proc/self/mountinfo") as f:
            mounts = [line.split(" - ")[1].split()[0] for line in f if line.split()[4] == "/tmp"]
    except (OSError, IndexError):
        return False
    if not mounts or mounts[-1] != "tmpfs":
        return False
    pid, processes, seen = os.getpid(), _processes(), set()
    while pid not in (0, 1) and pid not in seen:
        seen.add(pid)
        pid = processes.get(pid, (0, ""))[0]
    return pid == 1 and os.getpid() != 1
