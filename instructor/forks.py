"""nbgrader's command line without a new interpreter per run: a process that imported nbgrader once forks a child
for each command.

Each `nbgrader autograde` of a class started an interpreter that spent 2 s importing nbgrader (its apps import
jupyter_server, nbconvert and sqlalchemy) before it graded anything: 2 s of every notebook. Here one process (the
zygote: ``python -m instructor.forks``, single-threaded, nothing opened) imports it, then for each command forks a
child that takes the command's folder, environment, standard output and error files, and runs nbgrader's ``main``
as the command line would. Students' code never runs in it: it runs in the kernel, which the child starts in the
sandbox (instructor/grade.py's kernelspec) as the command line did.

The protocol, a JSON object a line: the caller writes {"argv", "env", "cwd", "stdout", "stderr"}; the zygote
answers {"pid"} for each, and {"ended": pid, "code": exit status} when that child ends (-N: killed by signal N).
"""
from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import threading
from pathlib import Path

from . import cleanup


class Child:
    """A forked nbgrader run: ``poll()`` like Popen's, ``kill()``."""

    def __init__(self, zygote: "Zygote", pid: int):
        self.zygote, self.pid = zygote, pid

    def poll(self) -> int | None:
        with self.zygote.ended_changed:
            return self.zygote.ended.get(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        with self.zygote.ended_changed:
            if not self.zygote.ended_changed.wait_for(lambda: self.pid in self.zygote.ended, timeout):
                raise subprocess.TimeoutExpired(["nbgrader"], timeout)
            return self.zygote.ended[self.pid]

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def kill(self) -> None:
        """Asked of the zygote, which alone reaps its children: it signals the pid only while it has not reaped it
        (here, a pid read as alive may already be reaped there, and reused by another process)."""
        if self.poll() is None:
            self.zygote.kill(self.pid)


class Zygote:
    """The caller's side: starts the zygote with this interpreter (nbgrader's environment), forks through it."""

    def __init__(self):
        self.process = subprocess.Popen([sys.executable, "-m", "instructor.forks"], stdin=subprocess.PIPE,
                                        stdout=subprocess.PIPE, text=True, bufsize=1,
                                        cwd=Path(__file__).resolve().parents[1])
        self.lock, self.ended_changed = threading.Lock(), threading.Condition()
        self.ended: dict[int, int] = {}
        self.answers: list[int] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            message = json.loads(line)
            with self.ended_changed:
                if "pid" in message:
                    self.answers.append(message["pid"])
                else:
                    self.ended[message["ended"]] = message["code"]
                self.ended_changed.notify_all()
        with self.ended_changed:  # the zygote is gone: no child will be reported again
            self.answers.append(-1)
            self.ended_changed.notify_all()

    def kill(self, pid: int) -> None:
        with self.lock:
            try:
                self.process.stdin.write(json.dumps({"kill": pid}) + "\n")
                self.process.stdin.flush()
            except (BrokenPipeError, ValueError):  # the zygote is gone, and its children with it
                pass

    def run(self, argv: list[str], env: dict, cwd: Path, stdout: Path, stderr: Path) -> Child:
        request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr)}
        with self.lock:  # one request at a time: its answer is the next pid
            with self.ended_changed:
                self.process.stdin.write(json.dumps(request) + "\n")
                self.process.stdin.flush()
                self.ended_changed.wait_for(lambda: self.answers, 120)
                pid = self.answers.pop(0) if self.answers else -1
        if pid < 0:
            raise RuntimeError("nbgrader's zygote (instructor/forks.py) ended: see its error output above")
        return Child(self, pid)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()


def _child(request: dict) -> None:
    """In the forked child: become the command line, run nbgrader, exit with its status."""
    code = 1
    cleanup.subreaper()  # what the notebook's run detaches stays below this run, and ends with it (finally)
    try:
        os.chdir(request["cwd"])
        os.environ.clear()
        os.environ.update(request["env"])
        stdin = os.open(os.devnull, os.O_RDONLY)
        out = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        for fd, target in ((stdin, 0), (out, 1), (err, 2)):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)
        sys.argv = ["nbgrader", *request["argv"]]
        from nbgrader.apps.nbgraderapp import main

        main()
        code = 0
    except SystemExit as done:
        code = done.code if isinstance(done.code, int) else (0 if done.code is None else 1)
    except BaseException:  # noqa: BLE001  (reported as the command line would: a traceback, status 1)
        import traceback

        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        cleanup.end_descendants()
        os._exit(code)


def serve() -> None:
    """The zygote: read commands on standard input, fork a child for each, report pids and ends."""
    import nbgrader.apps.nbgraderapp  # noqa: F401  (the 2 s each child is spared)

    cleanup.subreaper()  # a run killed by its caller leaves what it started to this process: ended at the end

    children: set[int] = set()
    out, pending, open_ = sys.stdout, b"", True
    while open_ or children:
        ready, _, _ = select.select([0] if open_ else [], [], [], 0.05)
        if ready:  # read from the descriptor itself: a buffered reader would hide a second line from select
            chunk = os.read(0, 1 << 16)
            open_, pending = bool(chunk), pending + chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            request = json.loads(line)
            if "kill" in request:  # a child not reaped yet (still in children): its pid is still its own
                if request["kill"] in children:
                    os.kill(request["kill"], signal.SIGKILL)
                continue
            out.flush()
            pid = os.fork()
            if pid == 0:
                _child(request)
            children.add(pid)
            out.write(json.dumps({"pid": pid}) + "\n")
            out.flush()
        for pid in list(children):
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                children.discard(pid)
                try:
                    out.write(json.dumps({"ended": pid, "code": os.waitstatus_to_exitcode(status)}) + "\n")
                    out.flush()
                except BrokenPipeError:  # the caller is gone: its children are left to finish, then reaped
                    pass
                cleanup.reap(keep=tuple(children))  # orphans of the runs, re-parented here, that ended
    cleanup.end_descendants()


if __name__ == "__main__":
    serve()
