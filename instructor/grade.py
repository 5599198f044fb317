"""``make grade SUBMISSIONS=<dir>``: grade a class's notebooks with nbgrader.

``<dir>/<student>/<chapter>.ipynb`` holds the submissions (``<chapter>`` as in ``notebooks/``, e.g.
``03_masks.ipynb``). Every file under ``<dir>`` is accounted for first (instructor/accounting.py): a renamed copy
of a chapter (``03_masks (1).ipynb``) or another chapter saved under a chapter's name is recognised and graded as
the chapter it is, with a note; any other file is reported as not graded, with the reason. Each notebook is then
autograded by nbgrader in a fresh kernel of the project's environment, in a bubblewrap sandbox (instructor/sandbox.py:
it reads only its own folder, the course package and the environment, writes only a scratch folder, has no
network, and every process it starts ends with it), with a time limit per cell (the cell is interrupted and the
next one runs), a time limit for the whole notebook and a memory limit (resident memory, watched from /proc; the
kernel is killed, and every exercise of that notebook is reported with the reason); a graded notebook's outputs
are cut past ``--output-limit`` characters, with a note, before its feedback is written. Nothing a submission does
stops the run.
Written under ``_build/grades/``:

* ``grades.csv``: one row per student and exercise, and one per file not graded. Columns: ``student``,
  ``notebook`` (the chapter it was graded as), ``exercise`` (its label; empty for a file not graded), ``passed``
  (1/0 for a checked exercise; ``manual`` for an open one, graded by hand), ``points`` (empty for an open
  exercise not graded yet; 0 for one whose answer cell is still the stub), ``message`` (the checker's diagnosis,
  the error's type and last line, "timed out", the kernel's death, "to grade by hand", or "not graded: <why>" for a
  file), ``max_points``, ``file`` (the submitted file, relative to ``<dir>``), ``note`` (how a renamed file was
  recognised);
* ``grades_wide.csv``: a row per student, a column per exercise with points, totals per chapter and overall, and
  the count of open exercises still to grade by hand (columns in instructor/export.py);
* ``canvas.csv``, with ``--roster <Canvas gradebook export>``: for Canvas's gradebook import, a column per chapter
  (``--canvas-assignment 03_masks=123`` names it ``03_masks (123)``, Canvas's assignment); see instructor/export.py;
* ``summary.txt`` (also printed): students, notebooks graded (and those whose own run failed), not graded with the
  count per reason, and every file not graded, with its reason;
* ``feedback/<student>/<chapter>.html``: nbgrader's feedback, the graded notebook with its scores;
* ``course/gradebook.db``: nbgrader's gradebook (SQLite); ``course/`` is an nbgrader course folder, where
  formgrader grades the open exercises' answer cells by hand.

* ``verdicts/<student>/<chapter>.json``: the verdicts of the re-run checks; ``timings.csv``: seconds per notebook.

The marks of checked exercises are not the notebook's own: each check is re-run apart from the notebook, from the
solution cells' definitions alone, in a fresh process of a sandboxed check server (instructor/verdict.py), and
written into the gradebook and under the test cell in the feedback. ``--jobs`` notebooks are graded at once
(threads, each running nbgrader and its own check servers), with a progress line per notebook; the rows do not
depend on it. Without a working bubblewrap, grading refuses unless given ``--no-sandbox`` (then a submission runs
as the instructor's user, with the instructor's files in reach). book/instructors.md states the threat model.

Run with nbgrader's environment (``make`` creates it): ``.venv-grader/bin/python -m instructor.grade <dir>``.
"""
from __future__ import annotations

import argparse
import atexit
import csv
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from nbgrader.api import Gradebook, MissingEntry

from . import export
from .accounting import Entry, account, summary
from . import cleanup, forks, sandbox, verdict
from .exercises import ROOT, chapters, exercises, load, nbgrader_source, save

OUT = ROOT / "_build" / "grades"
KERNEL = "attention-course-grader"
NBGRADER = ROOT / ".venv-grader" / "bin" / "nbgrader"
CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"
PYTHON = ROOT / ".venv" / "bin" / "python"  # the kernel runs in the project's environment
SANDBOX = Path(__file__).resolve().parent / "sandbox.py"
RISK = ("a student's code then runs as your user, with your files in reach: it can read the solutions in notebooks/, "
        "classmates' submissions, your home folder and keys, write the gradebook, reach the network, and signal "
        "your other processes (grading itself ends only what it started: the processes a notebook starts end when "
        "it is graded, unless it hands them to a service such as cron or systemd)")
OUTPUT_LIMIT = 4 * 2**20  # characters of output a notebook keeps (the rest is cut, with a note)


def to_bytes(size: str) -> int:
    """"4G" -> 4294967296 (prlimit wants bytes: it reads "4G" as 4 and the kernel cannot even start)."""
    units = {"K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}
    size = size.strip().upper().removesuffix("B")
    return int(float(size[:-1]) * units[size[-1]]) if size[-1] in units else int(size)


def write_kernel(out: Path, notebook_limit: int, memory: str, hide: list[Path], sandboxed: bool = True) -> None:
    """A kernelspec that runs the project's Python under instructor/sandbox.py: in a bubblewrap sandbox (unless
    ``sandboxed`` is False), killed after the notebook's time limit or above the memory limit (resident memory,
    watched from /proc). Cells are interrupted by message (a signal does not cross into the sandbox's session)."""
    folder = out / "kernels" / KERNEL
    folder.mkdir(parents=True, exist_ok=True)
    argv = [sys.executable, str(SANDBOX), "--seconds", str(notebook_limit), "--memory", str(to_bytes(memory))]
    if sandboxed:
        read, path = sandbox.environment(PYTHON)
        argv += [f"--read={p}" for p in read] + [f"--hide={Path(p).resolve()}" for p in [ROOT, *hide]]
        argv += [f"--env=PYTHONPATH={path}"] if path else []
    else:
        argv += ["--bare"]
    argv += ["--", str(PYTHON), "-m", "ipykernel_launcher", "-f", "{connection_file}"]
    spec = {"argv": argv, "display_name": "attention-course (grading)", "language": "python",
            "interrupt_mode": "message"}
    (folder / "kernel.json").write_text(json.dumps(spec, indent=1))


def nbgrader(course: Path, out: Path, *args: str, timeout: float | None = None,
             runtime: Path | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{NBGRADER.parent}:{os.environ.get('PATH', '/usr/bin:/bin')}",
           "JUPYTER_PATH": str(out)}  # finds the grading kernel
    command = [str(NBGRADER), *args, f"--CourseDirectory.root={course}", "--log-level=WARN"]
    if runtime is not None:
        env["JUPYTER_RUNTIME_DIR"] = str(runtime)  # the kernel's connection file and sockets, in a folder of its own
    return run_until_dead(command, env, course, timeout, zygote=zygote())


DEATH = "Kernel died"  # what nbgrader logs when the kernel under a cell has gone
AFTER_DEATH = 5.0  # seconds nbgrader gets to finish after that


_ZYGOTE: list[forks.Zygote] = []
_ZYGOTE_LOCK = threading.Lock()


def zygote() -> forks.Zygote:
    """The process that forks each nbgrader run (instructor/forks.py), started once, on first use."""
    with _ZYGOTE_LOCK:
        if not _ZYGOTE:
            _ZYGOTE.append(forks.Zygote())
            atexit.register(_ZYGOTE[0].stop)
        return _ZYGOTE[0]


def run_until_dead(command: list[str], env: dict, cwd: Path, timeout: float | None,
                   grace: float = AFTER_DEATH, zygote: forks.Zygote | None = None) -> subprocess.CompletedProcess:
    """Run nbgrader, but stop it a few seconds after it logged the kernel's death: jupyter_client can then hang for
    good, joining a heartbeat thread blocked sending to the dead kernel (a submission that scribbles on its file
    descriptors and exits does it), and the notebook's outcome is known already (its kernel died)."""
    with tempfile.TemporaryDirectory(prefix="nbgrader-") as logs:  # outside the runtime folder the kernel sees
        return _run_until_dead(command, env, cwd, Path(logs), timeout, grace, zygote)


def _run_until_dead(command, env, cwd, logs: Path, timeout, grace, zygote):
    """``command`` (nbgrader's, forked by ``zygote`` when one is given) to its end, or its kill."""
    log, err = logs / "stdout", logs / "stderr"
    with log.open("w") as stdout, err.open("w") as stderr:
        if zygote is None:
            process = subprocess.Popen(command, env=env, cwd=cwd, stdout=stdout, stderr=stderr, text=True)
        else:
            process = zygote.run(command[1:], env, cwd, log, err)
        start, died = time.monotonic(), None
        while process.poll() is None:
            now = time.monotonic()
            if timeout is not None and now - start > timeout:
                process.kill()
                process.wait()
                raise subprocess.TimeoutExpired(command, timeout)
            if died is None and DEATH in err.read_text(errors="replace"):
                died = now
            if died is not None and now - died > grace:
                process.kill()
                break
            time.sleep(0.2)
        process.wait()
    return subprocess.CompletedProcess(command, process.returncode, log.read_text(errors="replace"),
                                       err.read_text(errors="replace"))


def prepare(course: Path, out: Path, names: set[str]) -> None:
    """The assignments (one per chapter) in nbgrader's gradebook, from the chapter notebooks."""
    course.mkdir(parents=True, exist_ok=True)
    shutil.copy(CONFIG, course / "nbgrader_config.py")
    for path in chapters():
        if path.stem not in names:
            continue
        folder = course / "source" / path.stem
        folder.mkdir(parents=True, exist_ok=True)
        save(nbgrader_source(path), folder / path.name)
        run = nbgrader(course, out, "generate_assignment", path.stem, "--force")
        if run.returncode:
            raise SystemExit(f"nbgrader generate_assignment {path.stem} failed:\n{run.stderr[-3000:]}")


def last_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else ""


def error_of(cell: dict | None) -> str | None:
    """A cell's error as one line: "timed out", the checker's diagnosis (ExerciseError), or "Type: message"."""
    for output in (cell or {}).get("outputs", []):
        if output["output_type"] == "error":
            if output["ename"] == "CellTimeoutError" or "KeyboardInterrupt" in output["ename"]:
                return "timed out"
            value = " ".join(output["evalue"].split())
            return value if output["ename"] == "ExerciseError" else f"{output['ename']}: {value}"
    return None


def cell_message(test: dict | None, answers: list[dict]) -> str:
    """What a graded test cell says: its error, with the error of the exercise's own cell when that is the cause
    (a NameError after the answer cell failed), or what it printed when it passed."""
    if test is None:
        return "the test cell is missing from the graded notebook"
    error = error_of(test)
    if error is not None:
        cause = next(filter(None, map(error_of, answers)), None)
        return error if cause is None else f"{error} (the exercise's own cell failed first: {cause})"
    streams = [o.get("text", "") for o in test.get("outputs", []) if o["output_type"] == "stream"]
    return " ".join("".join(t if isinstance(t, str) else "".join(t) for t in streams).split()) or "passed"


def grade_one(course: Path, out: Path, student: str, chapter: str, cell_timeout: int, limit: int,
              output_limit: int = OUTPUT_LIMIT):
    """Autograde one notebook; returns None, or why the whole notebook could not be graded."""
    # no TCP: the sandbox has no network. The kernel is killed once the last cell has run, not asked to shut down (a
    # second of every notebook: the interpreter's own teardown); killing its watchdog ends the whole sandbox.
    args = ["autograde", chapter, f"--student={student}", "--force", f"--Execute.timeout={cell_timeout}",
            f"--Execute.kernel_name={KERNEL}", "--KernelManager.transport=ipc", "--Execute.shutdown_kernel=immediate"]
    # a short path: a Unix socket's name has at most 107 bytes
    with tempfile.TemporaryDirectory(prefix="grade-") as runtime:
        try:
            run = nbgrader(course, out, *args, f"--KernelManager.connection_file={runtime}/kernel.json",
                           timeout=limit + 30, runtime=Path(runtime))
        except subprocess.TimeoutExpired:
            return "timed out (the whole notebook)"
        verdict = sandbox.verdict_of(Path(runtime))
        stopped = verdict.read_text() if verdict.exists() else None
        verdict.unlink(missing_ok=True)
    if stopped:
        return f"not graded: the kernel was stopped: it {stopped}"
    graded = course / "autograded" / student / chapter / f"{chapter}.ipynb"
    if run.returncode or not graded.exists():
        text = run.stderr + run.stdout
        if "kernel died" in text.lower() or "DeadKernelError" in text:
            return (f"not graded: the kernel died (the submission crashed it, or went over the memory limit or "
                    f"the {limit} s limit for the whole notebook)")
        if any(words in text for words in ("CellTimeoutError", "Cell execution timed out", "Timeout waiting for")):
            return (f"not graded: a cell ran past the {cell_timeout} s limit per cell and nbgrader stopped (on a "
                    f"busy machine, a larger --cell-timeout)")
        errors = [line for line in text.splitlines() if "Error" in line and "AutogradeApp" not in line]
        return f"not graded: {(errors or [last_line(text)])[-1].strip() or 'nbgrader autograde failed'}"
    sandbox.cut_outputs(graded, output_limit)
    return None


def manual_row(gradebook: Gradebook, exercise, student: str, chapter: str, failure: str | None):
    """An open exercise's row: passed "manual"; points once a grader gave them (formgrader), 0 for an answer
    left as the stub, else empty."""
    grade_id, most = f"{exercise.label}-answer", exercise.max_points
    if failure is not None:
        return "", f"to grade by hand, up to {most:g} (the notebook was not autograded: {failure})"
    try:
        grade = gradebook.find_grade(grade_id, chapter, chapter, student)
    except MissingEntry:
        return "", f"to grade by hand, up to {most:g} (the answer cell {grade_id} is missing)"
    if grade.manual_score is not None:
        return f"{grade.manual_score:g}", "graded by hand"
    if grade.auto_score == 0:
        return "0", "no answer: the answer cell is still YOUR ANSWER HERE"
    return "", f"to grade by hand, up to {most:g}"


def rows_for(course: Path, gradebook: Gradebook, entry: Entry, failure: str | None, found: dict | None):
    """The rows of grades.csv (export.COLUMNS) for one graded notebook: one per exercise of its chapter. A checked
    exercise's mark is its verdict (instructor/verdict.py: the check re-run apart from the notebook), not what the
    notebook's own run of the check printed."""
    student, chapter = entry.student, entry.chapter
    for exercise in exercises(ROOT / "notebooks" / f"{chapter}.ipynb"):
        row = [student, chapter, exercise.label]
        tail = [f"{exercise.max_points:g}", entry.path, entry.note]
        if not exercise.checked:
            yield row + ["manual", *manual_row(gradebook, exercise, student, chapter, failure)] + tail
            continue
        result = (found or {}).get(exercise.label)
        if result is None:
            yield row + [0, 0, failure or "no verdict (the check was not run again)"] + tail
            continue
        passed = {True: 1, False: 0}.get(result["passed"], result["passed"])
        points = exercise.points if passed == 1 else "" if passed == "review" else 0
        message = result["message"] + (f" [the notebook itself: {failure}]" if failure else "")
        yield row + [passed, f"{points:g}" if points != "" else "", message] + tail


def record(course: Path, out: Path, submissions: list[Entry], failures: dict, found: dict) -> None:
    """The verdicts into nbgrader's gradebook (so formgrader and the feedback show the marks grading gives) and, for
    the feedback, under each check cell of the graded notebook: what the check said when it was run again."""
    with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
        for entry in submissions:
            key = entry.student, entry.chapter
            graded = course / "autograded" / entry.student / entry.chapter / f"{entry.chapter}.ipynb"
            if failures[key] is not None or not graded.exists():
                continue
            nb = load(graded)
            cells = {c["metadata"].get("nbgrader", {}).get("grade_id"): c for c in nb["cells"]}
            for exercise in exercises(ROOT / "notebooks" / f"{entry.chapter}.ipynb"):
                result = found[key].get(exercise.label) if exercise.checked else None
                if result is None:
                    continue
                try:
                    grade = gradebook.find_grade(f"{exercise.label}-check", entry.chapter, entry.chapter,
                                                 entry.student)
                except MissingEntry:
                    continue
                grade.auto_score = exercise.points if result["passed"] is True else 0.0
                cell = cells.get(f"{exercise.label}-check")
                if cell is not None:
                    said = {True: "passed", False: "did not pass", "review": "passed, held for review by hand"}
                    cell.setdefault("outputs", []).append({
                        "output_type": "stream", "name": "stdout",
                        "text": f"\n[grading] This check was run again apart from your notebook, from your solution "
                                f"cell's definitions alone: {said[result['passed']]}. {result['message']}\n"})
            gradebook.db.commit()
            mode = graded.stat().st_mode
            graded.chmod(mode | 0o200)
            save(nb, graded)
            graded.chmod(mode)


def assignment_ids(pairs: list[str]) -> dict[str, str]:
    ids = {}
    for pair in pairs:
        chapter, _, number = pair.partition("=")
        if not number.strip():
            raise SystemExit(f"--canvas-assignment {pair}: expected <chapter>=<assignment id>, e.g. 03_masks=123")
        ids[chapter.strip().removesuffix(".ipynb")] = number.strip()
    return ids


def main(argv=None) -> Path:
    parser = argparse.ArgumentParser(prog="python -m instructor.grade", description=__doc__.split("\n")[0])
    parser.add_argument("submissions", type=Path, help="<dir>/<student>/<chapter>.ipynb")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--cell-timeout", type=int, default=120, help="seconds per cell (default 120)")
    parser.add_argument("--notebook-timeout", type=int, default=600, help="seconds per notebook (default 600)")
    parser.add_argument("--memory", default="4G", help="memory limit of a submission's kernel, resident memory of "
                        "all its processes (default 4G)")
    parser.add_argument("--output-limit", type=int, default=OUTPUT_LIMIT,
                        help=f"characters of output a graded notebook keeps (default {OUTPUT_LIMIT}); the rest is cut, "
                             "with a note, before the feedback is written")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                        help="notebooks graded at once (default: the machine's cores, here %(default)s)")
    parser.add_argument("--no-sandbox", action="store_true", help=f"grade without bubblewrap: {RISK}")
    parser.add_argument("--roster", type=Path, help="a Canvas gradebook export (Student, ID, SIS User ID, SIS Login "
                        "ID, Section): also write canvas.csv, for Canvas's gradebook import")
    parser.add_argument("--canvas-assignment", action="append", default=[], metavar="CHAPTER=ID",
                        help="Canvas's assignment id of a chapter (e.g. 03_masks=123), repeatable")
    parser.add_argument("--tables-only", action="store_true",
                        help="run nothing: rewrite grades.csv, grades_wide.csv, canvas.csv and summary.txt from the "
                             "gradebook of an earlier run (with the points given by hand in formgrader since)")
    args = parser.parse_args(argv)
    if not args.submissions.is_dir():
        raise SystemExit(f"{args.submissions} is not a folder: expected <dir>/<student>/<chapter>.ipynb")
    ids = assignment_ids(args.canvas_assignment)
    roster = export.read_roster(args.roster) if args.roster else None
    entries = account(args.submissions)
    submissions = [entry for entry in entries if entry.graded]
    course = args.out / "course"
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tables_only:
        if submissions and not (course / "gradebook.db").exists():
            raise SystemExit(f"--tables-only: no gradebook in {course}; grade the class first")
        failures, found = {}, {}
        for e in submissions:
            saved = args.out / "verdicts" / e.student / f"{e.chapter}.json"
            kept = json.loads(saved.read_text()) if saved.exists() else {
                "notebook": "not graded: it is new since the class was graded", "checks": None}
            failures[e.student, e.chapter], found[e.student, e.chapter] = kept["notebook"], kept["checks"]
        return tables(args, entries, failures, roster, ids, found)
    if submissions:
        problem = None if args.no_sandbox else sandbox.available()
        if problem:
            raise SystemExit(f"make grade runs each submission in a bubblewrap sandbox, but {problem}.\n"
                             f"Install it, or grade without a sandbox with --no-sandbox "
                             f"(make grade GRADE_FLAGS=--no-sandbox): {RISK}")
        if args.no_sandbox:
            print(f"--no-sandbox: {RISK}", flush=True)
        write_kernel(args.out, args.notebook_timeout, args.memory, [args.submissions, args.out],
                     sandboxed=not args.no_sandbox)
        prepare(course, args.out, {entry.chapter for entry in submissions})
    for entry in submissions:
        folder = course / "submitted" / entry.student / entry.chapter
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir(parents=True)
        shutil.copy(args.submissions / entry.path, folder / f"{entry.chapter}.ipynb")
    failures, found = grade_all(args, course, submissions)
    record(course, args.out, submissions, failures, found)
    feedback(course, args.out, submissions, failures, args.jobs)
    return tables(args, entries, failures, roster, ids, found)


class Progress:
    """A line per notebook graded: a bar, the count, the time spent and the time left (from the pace so far)."""

    def __init__(self, total: int, jobs: int):
        self.total, self.done, self.start, self.jobs = total, 0, time.monotonic(), jobs

    def step(self, text: str) -> None:
        self.done += 1
        spent = time.monotonic() - self.start
        left = spent / self.done * (self.total - self.done)
        bar = "#" * round(20 * self.done / self.total)
        print(f"[{bar:20}] {self.done}/{self.total}  {clock(spent)} spent, about {clock(left)} left  {text}",
              flush=True)


def clock(seconds: float) -> str:
    return f"{int(seconds // 60)} min {int(seconds % 60):02d} s"


def grade_all(args, course: Path, submissions: list[Entry]) -> tuple[dict, dict]:
    """Autograde every notebook (for its feedback) and take every checked exercise's verdict, ``args.jobs`` at a
    time; the results do not depend on the number of jobs. Returns (failures, verdicts) by (student, chapter)."""
    plans = {chapter: verdict.plan(chapter, course / "release" / chapter / f"{chapter}.ipynb")
             for chapter in sorted({entry.chapter for entry in submissions})}
    idle, servers, lock = {chapter: [] for chapter in plans}, [], threading.Lock()
    hide = [args.submissions, args.out]

    # A chapter's check servers: one serves every job while its checks (a fraction of a second) never overlap; a job
    # that finds none idle (another job's check is running, or timing out) starts one more. Each costs the chapter's
    # setup, seconds.
    def take(chapter: str) -> verdict.Server:
        with lock:
            if idle[chapter]:
                return idle[chapter].pop()
            servers.append(verdict.Server(plans[chapter], hide, to_bytes(args.memory), not args.no_sandbox))
            return servers[-1]

    def give_back(chapter: str, each: verdict.Server) -> None:
        with lock:
            idle[chapter].append(each)

    def checks(entry: Entry) -> dict:
        server = take(entry.chapter)
        try:
            return verdict.verdicts(server, entry.student, args.submissions / entry.path, args.cell_timeout)
        except RuntimeError as error:  # the chapter's own setup does not run in the sandbox: nobody can be graded
            return {label: {"passed": False, "message": f"no verdict: {error}"} for label in plans[entry.chapter].checks}
        finally:
            give_back(entry.chapter, server)

    def one(entry: Entry):
        start = time.monotonic()
        failure = grade_one(course, args.out, entry.student, entry.chapter, args.cell_timeout,
                            args.notebook_timeout, args.output_limit)
        ran = time.monotonic()
        result = checks(entry) if plans[entry.chapter].checks else {}  # open exercises alone: nothing to re-run
        saved = args.out / "verdicts" / entry.student / f"{entry.chapter}.json"
        saved.parent.mkdir(parents=True, exist_ok=True)
        saved.write_text(json.dumps({"notebook": failure, "checks": result}, indent=1) + "\n")
        timings.append((entry.student, entry.chapter, f"{ran - start:.2f}", f"{time.monotonic() - ran:.2f}"))
        return failure, result

    failures, found, timings = {}, {}, []
    progress = Progress(len(submissions), args.jobs)
    try:
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = {pool.submit(one, entry): entry for entry in submissions}
            for future in as_completed(futures):
                entry = futures[future]
                key = entry.student, entry.chapter
                failures[key], found[key] = future.result()
                note = f" [{entry.note}]" if entry.note else ""
                marks = sum(v["passed"] is True for v in found[key].values())
                progress.step(f"graded {entry.path}{note}: {failures[key] or 'ok'}; "
                              f"{marks}/{len(found[key])} checks passed")
    finally:
        for each in servers:
            each.stop()
    export.write([["student", "notebook", "notebook_seconds", "checks_seconds"], *sorted(timings)],
                 args.out / "timings.csv")
    return failures, found


def batches(students: list[str], jobs: int) -> list[str]:
    """Globs (nbgrader's --student takes one) that split ``students`` into at most ``jobs`` groups of about equal size,
    by the last character of the name: ["*[02468]", "*[13579]"] for student0000 to student0199 and two jobs. One group,
    "*", where a name ends in anything but a letter, a digit, "_" or "-" (which a glob's brackets would misread)."""
    last = {}
    for student in students:
        last[student[-1:]] = last.get(student[-1:], 0) + 1
    if jobs < 2 or len(last) < 2 or not all(c.isascii() and (c.isalnum() or c in "_-") for c in last):
        return ["*"]
    groups = [[] for _ in range(min(jobs, len(last)))]
    sizes = [0] * len(groups)
    for char, count in sorted(last.items(), key=lambda kv: (-kv[1], kv[0])):  # the largest first, to the emptiest
        i = sizes.index(min(sizes))
        groups[i].append(char)
        sizes[i] += count
    # "-" first in the brackets: read as itself there, never as a range
    return ["*[" + "".join(sorted(group, key=lambda c: (c != "-", c))) + "]" for group in groups]


def feedback(course: Path, out: Path, submissions: list[Entry], failures: dict, jobs: int = 1) -> None:
    """nbgrader's feedback (an HTML rendering of the graded notebooks, no second run), per chapter, ``jobs`` runs at a
    time, each for a share of the students (:func:`batches`), copied to <out>/feedback/<student>/<chapter>.html. (A run
    per student, two at a time, was tried: for a class of 200, the feedback and tables then took about 3.2 min after
    the last notebook, against 2.7 min for one run per chapter: each run costs nbgrader's start and the gradebook's
    reading.)"""
    runs = []
    for chapter in sorted({entry.chapter for entry in submissions}):
        students = sorted({entry.student for entry in submissions if entry.chapter == chapter})
        runs += [(chapter, glob) for glob in batches(students, jobs)]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        done = pool.map(lambda run: nbgrader(course, out, "generate_feedback", run[0], f"--student={run[1]}", "--force"),
                        runs)
        for (chapter, glob), run in zip(runs, done):
            if run.returncode:
                print(f"nbgrader generate_feedback {chapter} --student={glob} failed (the notebooks it covers get no "
                      f"feedback file): {last_line(run.stderr)}", flush=True)
    for entry in submissions:
        html = course / "feedback" / entry.student / entry.chapter / f"{entry.chapter}.html"
        if failures[entry.student, entry.chapter] is None and html.exists():
            (out / "feedback" / entry.student).mkdir(parents=True, exist_ok=True)
            shutil.copy(html, out / "feedback" / entry.student / f"{entry.chapter}.html")


def tables(args, entries: list[Entry], failures: dict, roster: list[dict] | None, ids: dict[str, str],
           found: dict) -> Path:
    """grades.csv, grades_wide.csv, canvas.csv (given a roster) and summary.txt, from the gradebook."""
    course = args.out / "course"
    submissions = [entry for entry in entries if entry.graded]
    rows = []
    if submissions:
        with Gradebook(f"sqlite:///{course / 'gradebook.db'}") as gradebook:
            for entry in submissions:
                key = entry.student, entry.chapter
                rows.extend(rows_for(course, gradebook, entry, failures[key], found.get(key)))
    for entry in entries:
        if not entry.graded:
            print(f"{entry.path}: {entry.reason}", flush=True)
            rows.append([entry.student or "", "", "", "", "", entry.reason, "", entry.path, ""])
    table = [export.COLUMNS] + [[str(value) for value in row] for row in rows]
    grades = export.write(table, args.out / "grades.csv")
    records = [dict(zip(export.COLUMNS, row)) for row in table[1:]]
    chapters_shown = {path.stem: exercises(path) for path in chapters()
                      if any(entry.chapter == path.stem for entry in submissions)}
    students = sorted({entry.student for entry in entries if entry.student})
    export.write(export.wide(records, chapters_shown, students), args.out / "grades_wide.csv")
    text = summary(entries, failures)
    if roster is not None:
        table, unknown = export.canvas(records, chapters_shown, roster, ids)
        export.write(table, args.out / "canvas.csv")
        text += f"\ncanvas.csv: {len(roster)} students of the roster"
        text += ("; every student folder is in the roster\n" if not unknown else
                 f"; {len(unknown)} student folder(s) not in the roster, so not in canvas.csv: "
                 f"{', '.join(unknown)}\n")
    (args.out / "summary.txt").write_text(text)
    print("\n" + text, end="")
    print(f"{len(rows)} rows in {grades}; grades_wide.csv, summary.txt{', canvas.csv' if roster else ''} beside "
          f"it; feedback in {args.out / 'feedback'}; gradebook {course / 'gradebook.db'}")
    return grades


if __name__ == "__main__":
    cleanup.subreaper()  # what grading started and a run left behind comes back here, and ends with grading
    try:
        main()
    finally:
        cleanup.end_descendants()
