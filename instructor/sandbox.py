"""A submission's kernel in a bubblewrap (``bwrap``) sandbox, with a time limit and a memory limit.

``make grade`` writes a kernelspec whose command is this file: ``python instructor/sandbox.py [options] --
<kernel command>``. It runs the kernel under ``bwrap`` where

* the whole file system is read-only, and the places that hold people's files are hidden by empty in-memory
  folders: ``/tmp``, ``/var/tmp``, ``/work``, ``/root``, ``/home``, ``/mnt``, ``/media``, ``/srv``, ``/run``, the
  checkout (with ``notebooks/``, ``instructor/``, ``_build/`` and its gradebook), the submissions folder and the
  grading output (every ``--hide``); only the Python environment, the course package and the kernel's own folder
  (its notebook, where nbgrader starts it) come back, read-only (``--read``);
* it writes only a scratch ``/tmp`` of its own (in memory, ``--scratch`` bytes at most, also its ``HOME``) and the
  folder of its connection file (``--write``: the kernel's ZMQ sockets, IPC transport);
* the environment is cleared (no instructor's tokens), the network is cut (``--unshare-net``: a socket reaches
  nothing, not even 127.0.0.1), and it has its own process namespace (``--unshare-pid``), so every process it
  starts, a background one too, ends with the kernel; ``--die-with-parent`` ends it with this watchdog.

The watchdog (this process, outside the sandbox) kills the sandbox after ``--seconds`` (the notebook's time limit)
or when the resident memory of its processes together goes over ``--memory`` (read from ``/proc`` every
``POLL`` seconds: a limit on memory used, not on address space, so CUDA's large virtual reservations still work),
and then writes why to ``<folder of the connection file>.verdict``, beside that folder (the kernel can write into
it, not beside it), where ``instructor.grade`` reads it.
GPUs (``/dev/nvidia*``, ``/dev/dri``) are passed through when present.

:func:`available` probes once whether bwrap works here; :func:`command` builds the bwrap command line (tests run
small programs with it directly).
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

try:  # imported from instructor/, or run as a script (the kernelspec's command)
    from . import cleanup
except ImportError:
    import cleanup

HIDDEN = ["/tmp", "/var/tmp", "/work", "/root", "/home", "/mnt", "/media", "/srv", "/run"]
POLL = 0.2


def verdict_of(folder: Path) -> Path:
    """Where the watchdog says why it stopped the kernel whose connection file is in ``folder``."""
    return Path(f"{folder}.verdict")


def available() -> str | None:
    """None when bwrap runs a process in the sandbox this module builds; otherwise why not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap (bwrap) is not installed (Debian/Ubuntu: apt-get install bubblewrap)"
    try:
        probe = subprocess.run(command(["true"]), capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as error:
        return f"bwrap does not work here: {error}"
    if probe.returncode:
        return f"bwrap does not work here: {probe.stderr.strip() or f'exit status {probe.returncode}'}"
    return None


def command(argv: list[str], read: list[str] = (), write: list[str] = (), hide: list[str] = (),
            cwd: str | None = None, env: dict[str, str] | None = None, scratch: int = 512 * 2**20) -> list[str]:
    """The bwrap command line that runs ``argv`` in the sandbox (see the module's docstring)."""
    args = ["bwrap", "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc",
            "--unshare-pid", "--unshare-net", "--unshare-ipc", "--unshare-uts", "--die-with-parent", "--new-session"]
    hidden = sorted(p for p in {str(Path(p).resolve()) for p in [*HIDDEN, *hide] if Path(p).is_dir()}
                    if p != "/tmp" and not p.startswith("/tmp/"))  # a fresh /tmp hides what is under /tmp
    for path in hidden:
        args += ["--tmpfs", path]
    args += ["--size", str(scratch), "--tmpfs", "/tmp", "--size", str(64 * 2**20), "--tmpfs", "/dev/shm"]
    for device in sorted(Path("/dev").glob("nvidia*")) + [Path("/dev/dri")]:
        args += ["--dev-bind-try", str(device), str(device)]
    for path in dict.fromkeys(read):
        args += ["--ro-bind", str(Path(path).resolve()), str(Path(path).resolve())]
        if Path(path).absolute() != Path(path).resolve():  # a symlink (.venv -> elsewhere): both paths work
            args += ["--ro-bind", str(Path(path).resolve()), str(Path(path).absolute())]
    for path in write:
        args += ["--bind", str(Path(path).resolve()), str(Path(path).resolve())]
    for path in hidden:  # empty and read-only (the folders made in them to bind paths back stay empty)
        args += ["--remount-ro", path]
    environment = {"PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": "/tmp", "TMPDIR": "/tmp", "LANG": "C.UTF-8",
                   **(env or {})}
    args += ["--clearenv"]
    for name, value in environment.items():
        args += ["--setenv", name, value]
    if cwd is not None:
        args += ["--chdir", str(Path(cwd).resolve())]
    return args + ["--", *argv]


def environment(python: Path, package: str = "attention_course") -> tuple[list[str], str | None]:
    """What a kernel of ``python`` must read: its environment, the Python it was made from (a pyenv under /root,
    say), the package's folder; and the folder to put on PYTHONPATH when the package is found through the current
    one (else None)."""
    probe = ("import importlib.util, os, sys\n"
             f"spec = importlib.util.find_spec({package!r})\n"
             "print(sys.prefix); print(sys.base_prefix); print(os.path.dirname(spec.origin))\n")
    env = {name: value for name, value in os.environ.items() if name != "PYTHONPATH"}
    found = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True, cwd="/")
    prefix, base, folder = found.stdout.split("\n")[:3]
    alone = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, cwd="/", env=env)
    path = None if alone.returncode == 0 and alone.stdout.split("\n")[2] == folder else str(Path(folder).parent)
    return [str(python.parent.parent), prefix, base, folder], path


def tree(root: int) -> list[int]:
    """``root`` and its descendants, from /proc."""
    return [root, *cleanup.descendants(root)]


def resident(pids: list[int]) -> int:
    """Bytes of resident memory of these processes together."""
    total = 0
    for pid in pids:
        try:
            total += int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * os.sysconf("SC_PAGE_SIZE")
        except (OSError, IndexError, ValueError):
            pass
    return total


def watch(args: list[str], seconds: float, memory: int, verdict: Path | None) -> int:
    """Run ``args`` (bwrap), kill it and what it started after ``seconds`` or above ``memory`` bytes resident, and
    say why. Run as the kernel's command (:func:`main`), this process is a subreaper: what the kernel detaches comes
    back below it, and :func:`main` ends it too."""
    process = subprocess.Popen(args)

    def kill(why: str | None) -> None:
        if why and verdict is not None:
            verdict.write_text(why)
        cleanup.end_descendants(process.pid)
        try:
            process.kill()  # its own child, not reaped yet: process.wait() reaps it
        except OSError:
            pass

    signal.signal(signal.SIGTERM, lambda *_: (kill(None), sys.exit(143)))
    signal.signal(signal.SIGINT, lambda *_: None)  # interrupts go to the kernel as messages
    deadline = time.monotonic() + seconds
    while process.poll() is None:
        used = resident(tree(process.pid))
        if used > memory:
            kill(f"went over the memory limit ({memory / 2**20:.0f} MiB; it used {used / 2**20:.0f} MiB)")
        elif time.monotonic() > deadline:
            kill(f"went over the {seconds:g} s limit for the whole notebook")
        try:
            process.wait(POLL)
        except subprocess.TimeoutExpired:
            pass
    return process.returncode


def cut_outputs(path: Path, limit: int) -> bool:
    """Keep at most ``limit`` characters of a graded notebook's outputs (its feedback goes to the student): the
    first output past it keeps its beginning and a note, the later ones go; errors stay (their message cut to 2000
    characters, their traceback to its last 20 lines), as grading reads them. True when it cut."""
    nb, left, cut = json.loads(Path(path).read_text()), limit, False
    for cell in nb["cells"]:
        kept = []
        for output in cell.get("outputs", []):
            if output["output_type"] == "error":
                output["evalue"] = output.get("evalue", "")[:2000]
                output["traceback"] = [line[:2000] for line in output.get("traceback", [])[-20:]]
                kept.append(output)
                continue
            size = len(json.dumps(output))
            if size <= left:
                left -= size
                kept.append(output)
                continue
            if not cut:
                head = "".join(output.get("text", ""))[:left] if output["output_type"] == "stream" else ""
                kept.append({"output_type": "stream", "name": "stderr", "text": head + (
                    f"\n[cut by the grader: this notebook's outputs went over {limit} characters; the rest is "
                    f"not shown]\n")})
            cut, left = True, 0
        if "outputs" in cell:
            cell["outputs"] = kept
    if cut:
        mode = Path(path).stat().st_mode  # nbgrader leaves the graded copy read-only
        Path(path).chmod(mode | 0o200)
        Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")
        Path(path).chmod(mode)
    return cut


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="instructor/sandbox.py", description=__doc__.split("\n")[0])
    parser.add_argument("--read", action="append", default=[], help="a path the kernel may read")
    parser.add_argument("--hide", action="append", default=[], help="a folder hidden (also the checkout's)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE")
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--memory", type=int, required=True, help="bytes")
    parser.add_argument("--scratch", type=int, default=512 * 2**20, help="bytes of /tmp")
    parser.add_argument("--folder", type=Path, help="the folder it may write (default: the connection file's)")
    parser.add_argument("--bare", action="store_true", help="no bwrap: only the limits (make grade --no-sandbox)")
    parser.add_argument("kernel", nargs=argparse.REMAINDER, help="-- <kernel command> (-f <connection file>)")
    args = parser.parse_args(argv)
    kernel = args.kernel[1:] if args.kernel[:1] == ["--"] else args.kernel
    folder = args.folder.resolve() if args.folder else Path(kernel[kernel.index("-f") + 1]).resolve().parent
    if str(folder) in ["/", *HIDDEN]:  # the kernel writes here: a folder of its own, never all of /tmp
        raise SystemExit(f"sandbox.py: the connection file or --folder {folder} must be a folder of its own")
    env = dict(pair.split("=", 1) for pair in args.env)
    if not args.bare:
        kernel = command(kernel, read=[*args.read, os.getcwd()], write=[str(folder)], hide=args.hide,
                         cwd=os.getcwd(), env=env, scratch=args.scratch)
    cleanup.subreaper()  # this program starts nothing else: every process below it is the kernel's
    try:
        return watch(kernel, args.seconds, args.memory, verdict_of(folder))
    finally:
        cleanup.end_descendants()  # what the kernel left running (bare: a submission's background process)


if __name__ == "__main__":
    sys.exit(main())
