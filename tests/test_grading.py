"""Grading's bookkeeping, without running nbgrader: every file of a class accounted for (instructor/accounting.py),
open exercises turned into manually graded answer cells (instructor/exercises.py), and the exports
(instructor/export.py). The real nbgrader runs are in tests/test_grading_class.py; the re-run checks in tests/test_verdict.py."""
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from instructor import accounting, export, sandbox  # noqa: E402
from instructor.accounting import account, chapter_by_name, course_chapters, summary  # noqa: E402
from instructor.exercises import (  # noqa: E402
    MANUAL_POINTS, NOTEBOOKS, exercises, load, nbgrader, nbgrader_source,
)

CHAPTERS = course_chapters()


@pytest.mark.parametrize("name, stem", [
    ("03_masks.ipynb", "03_masks"), ("03_masks (1).ipynb", "03_masks"), ("03_masks-2.ipynb", "03_masks"),
    ("Copy of 03_masks.ipynb", "03_masks"), ("03_MASKS.IPYNB", "03_masks"), ("03_masks copy 2.ipynb", "03_masks"),
    ("Copy of 03_Masks (3).ipynb", "03_masks"), ("03 masks.ipynb", "03_masks"), ("03_masks.ipynb.ipynb", "03_masks"),
    ("03_masks_final.ipynb", None), ("masks.ipynb", None), ("homework.ipynb", None),
])
def test_a_chapter_is_recognised_by_its_name(name, stem):
    found = chapter_by_name(name, CHAPTERS)
    assert (found.stem if found else None) == stem


def put(folder: Path, name: str, content, mtime: float | None = None) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(content if isinstance(content, str) else json.dumps(content))
    if mtime is not None:
        os.utime(path, (mtime, mtime))
    return path


@pytest.fixture(scope="module")
def a_class(tmp_path_factory):
    """Every case of accounting in one folder; returns it and its entries by path."""
    root = tmp_path_factory.mktemp("submissions")
    masks, softmax = load(NOTEBOOKS / "03_masks.ipynb"), load(NOTEBOOKS / "02_softmax.ipynb")
    untitled = {"cells": [c for c in masks["cells"] if c["cell_type"] == "markdown"][:3], "metadata": {},
                "nbformat": 4, "nbformat_minor": 5}  # the title, no graded cell: recognised by its title
    for cell in untitled["cells"]:
        cell["metadata"] = {}
    put(root, "alice/03_masks.ipynb", masks)  # as handed out
    put(root, "bob/03_masks (1).ipynb", masks)  # a second download
    put(root, "carol/Copy of 03_Masks.ipynb", masks, mtime=1_000)  # two candidates: the newer is graded
    put(root, "carol/03_masks-2.ipynb", masks, mtime=2_000)
    put(root, "dave/03_masks.ipynb", softmax)  # chapter 2 under chapter 3's name, no other chapter 2: graded as 2
    put(root, "erin/03_masks.ipynb", softmax)  # chapter 2 under chapter 3's name, and chapter 2 too: not graded
    put(root, "erin/02_softmax.ipynb", softmax)
    put(root, "frank/03_masks.ipynb", '{"cells": [\n  {"cell_type": "code",\n')  # corrupt JSON, line 3
    put(root, "frank/answers.py", "x = 1\n")
    put(root, "gina/03_masks.ipynb", {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    put(root, "gina/notes.ipynb", [1, 2])  # JSON, not a notebook
    put(root, "hank/homework.ipynb", untitled)
    put(root, "ivan/old/03_masks.ipynb", masks)  # a nested folder
    (root / "judy").mkdir()  # an empty student folder
    put(root, "grades.txt", "stray\n")  # at the top level
    return root, {entry.path: entry for entry in account(root)}


def test_every_file_is_accounted_for(a_class):
    root, entries = a_class
    files = {p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()}
    assert set(entries) == files | {"judy/"}
    for entry in entries.values():
        assert entry.graded != bool(entry.reason), entry
        assert entry.graded or entry.reason.startswith("not graded: ") and entry.kind, entry


def test_renamed_copies_are_graded_with_a_note(a_class):
    _, entries = a_class
    assert entries["alice/03_masks.ipynb"].chapter == "03_masks" and entries["alice/03_masks.ipynb"].note == ""
    assert entries["bob/03_masks (1).ipynb"].chapter == "03_masks"
    assert entries["bob/03_masks (1).ipynb"].note == "renamed copy of 03_masks.ipynb, graded as it"
    assert entries["hank/homework.ipynb"].chapter == "03_masks"  # by its title
    assert "recognised by its content" in entries["hank/homework.ipynb"].note


def test_of_two_candidates_the_newer_is_graded(a_class):
    _, entries = a_class
    newer, older = entries["carol/03_masks-2.ipynb"], entries["carol/Copy of 03_Masks.ipynb"]
    assert newer.chapter == "03_masks" and "renamed copy" in newer.note
    assert older.chapter is None and older.kind == accounting.SECOND_COPY
    assert "03_masks-2.ipynb was graded" in older.reason and "newest" in older.reason


def test_another_chapter_under_a_chapters_name(a_class):
    _, entries = a_class
    dave = entries["dave/03_masks.ipynb"]
    assert dave.chapter == "02_softmax"
    assert dave.note.startswith("this is chapter 2 (02_softmax) saved as 03_masks.ipynb, graded as 02_softmax")
    erin = entries["erin/03_masks.ipynb"]
    assert erin.chapter is None and erin.kind == accounting.FOREIGN_TAKEN
    assert "this is chapter 2 (02_softmax) saved as 03_masks.ipynb" in erin.reason
    assert "02_softmax.ipynb, which was graded" in erin.reason
    assert entries["erin/02_softmax.ipynb"].chapter == "02_softmax"


@pytest.mark.parametrize("path, kind, words", [
    ("frank/03_masks.ipynb", accounting.INVALID_JSON, "invalid JSON at line 3"),
    ("frank/answers.py", accounting.UNKNOWN_FILE, "not a notebook (.py)"),
    ("gina/03_masks.ipynb", accounting.NO_CHAPTER, "named like 03_masks.ipynb, but holds none of its graded cells"),
    ("gina/notes.ipynb", accounting.NOT_NOTEBOOK, "without a notebook's list of cells"),
    ("ivan/old/03_masks.ipynb", accounting.NESTED, "in a folder inside ivan/"),
    ("judy/", accounting.EMPTY, "empty student folder"),
    ("grades.txt", accounting.OUTSIDE, "not in a student folder"),
])
def test_each_file_not_graded_says_why(a_class, path, kind, words):
    entry = a_class[1][path]
    assert entry.chapter is None and entry.kind == kind and words in entry.reason, entry


def test_the_summary_counts_and_lists(a_class):
    _, entries = a_class
    text = summary(list(entries.values()), {("alice", "03_masks"): "not graded: the kernel died"})
    lines = text.splitlines()
    assert "students: 10" in lines  # alice ... judy
    assert "notebooks graded: 6 (4 renamed or another chapter, see the notes below)" in lines  # alice too
    assert "  of which the notebook's own run failed: 1 (no feedback; see below)" in lines
    assert "not graded: 9" in lines
    counts = {line.split(None, 1)[1]: int(line.split()[0]) for line in lines if line[:6].strip().isdigit()}
    assert counts == {accounting.INVALID_JSON: 1, accounting.UNKNOWN_FILE: 1, accounting.NO_CHAPTER: 1,
                      accounting.NOT_NOTEBOOK: 1, accounting.NESTED: 1, accounting.EMPTY: 1, accounting.OUTSIDE: 1,
                      accounting.SECOND_COPY: 1, accounting.FOREIGN_TAKEN: 1}
    failed, listed = text.split("\nnot graded:\n", 1)[0], text.split("\nnot graded:\n", 1)[1]
    for path, entry in entries.items():
        assert (f"  {path}: " in listed) == (not entry.graded), path
    assert f"\n{accounting.GRADING_FAILED} (" in failed
    assert "  alice/03_masks.ipynb: the kernel died" in failed


# --- open exercises: answer cells graded by hand ----------------------------------------------------------------

def test_open_exercises_get_a_manually_graded_answer_cell():
    path = NOTEBOOKS / "03_masks.ipynb"
    nb, found = nbgrader_source(path), exercises(path)
    open_ones = [exercise for exercise in found if not exercise.checked]
    assert [e.label for e in open_ones] == ["ex-ch3-left-padding", "ex-ch3-cross"]
    ids = [nbgrader(cell).get("grade_id") for cell in nb["cells"]]
    for exercise in found:
        answer = f"{exercise.label}-answer"
        if exercise.checked:
            assert answer not in ids
            continue
        index = ids.index(answer)
        assert ids[index - 1] == exercise.label  # right after the exercise's stub
        cell = nb["cells"][index]
        meta = nbgrader(cell)
        assert cell["cell_type"] == "markdown" and meta["grade"] is True and meta["solution"] is True
        assert meta["points"] == MANUAL_POINTS == exercise.max_points and not meta["locked"]
        assert "### BEGIN SOLUTION\nYOUR ANSWER HERE\n### END SOLUTION" in "".join(cell["source"])
        assert exercise.title in "".join(cell["source"])
    assert sum(1 for i in ids if i and i.endswith("-answer")) == len(open_ones)
    clinic = NOTEBOOKS / "07_bug_clinic.ipynb"  # every exercise checked: no answer cell
    assert not any(nbgrader(c).get("grade_id", "").endswith("-answer") for c in nbgrader_source(clinic)["cells"])


# --- exports ------------------------------------------------------------------------------------------------------

def rows(*lines):
    return [dict(zip(export.COLUMNS, line.split("|"))) for line in lines]


GRADES = rows(
    "alice|03_masks|ex-ch3-padding-mask|1|1|passed|1|alice/03_masks.ipynb|",
    "alice|03_masks|ex-ch3-masked-softmax|1|1|passed|1|alice/03_masks.ipynb|",
    "alice|03_masks|ex-ch3-left-padding|manual||to grade by hand, up to 1|1|alice/03_masks.ipynb|",
    "alice|03_masks|ex-ch3-cross|manual|1|graded by hand|1|alice/03_masks.ipynb|",
    "bob|03_masks|ex-ch3-padding-mask|0|0|misses the first pad|1|bob/03_masks (1).ipynb|renamed",
    "bob|03_masks|ex-ch3-masked-softmax|1|1|passed|1|bob/03_masks (1).ipynb|renamed",
    "bob|03_masks|ex-ch3-left-padding|manual|0|no answer|1|bob/03_masks (1).ipynb|renamed",
    "bob|03_masks|ex-ch3-cross|manual||to grade by hand, up to 1|1|bob/03_masks (1).ipynb|renamed",
    "bob|02_softmax|ex-ch2-softmax|1|1|passed|1|bob/02_softmax.ipynb|",
    "carol||||||not graded: not a notebook: invalid JSON at line 3||carol/03_masks.ipynb|",
)


def shown(*stems):
    return {stem: exercises(NOTEBOOKS / f"{stem}.ipynb") for stem in stems}


def test_the_wide_table():
    table = export.wide(GRADES, shown("02_softmax", "03_masks"), ["alice", "bob", "carol"])
    header, *lines = table
    assert header == ["student", "ex-ch2-softmax", "ex-ch2-attention", "ex-ch2-variance", "ex-ch2-temperature",
                      "02_softmax total", "ex-ch3-padding-mask", "ex-ch3-masked-softmax", "ex-ch3-left-padding",
                      "ex-ch3-cross", "03_masks total", "total", "to grade by hand"]
    got = {line[0]: dict(zip(header, line)) for line in lines}
    assert got["alice"]["02_softmax total"] == "" and got["alice"]["ex-ch3-left-padding"] == ""
    assert got["alice"]["ex-ch3-cross"] == "1" and got["alice"]["03_masks total"] == "3"
    assert got["alice"]["total"] == "3" and got["alice"]["to grade by hand"] == "1"
    assert got["bob"]["02_softmax total"] == "1" and got["bob"]["03_masks total"] == "1"
    assert got["bob"]["ex-ch3-left-padding"] == "0" and got["bob"]["total"] == "2"
    assert got["bob"]["to grade by hand"] == "1"
    assert list(got["carol"].values()) == ["carol"] + [""] * 11 + ["0"]  # nothing graded: empty, not 0


def test_the_canvas_table(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text(  # as Canvas exports it: a BOM, a Points Possible row, columns beyond the five
        "\ufeffStudent,ID,SIS User ID,SIS Login ID,Section,Old quiz (7)\n"
        "    Points Possible,,,,,10\n"
        "Alice Liddell,101,S1,alice,Sec A,9\n"
        "\"Brown, Bob\",102,S2,BOB,Sec A,8\n"
        "Dora Explorer,103,S3,dora,Sec B,\n")
    table, unknown = export.canvas(GRADES, shown("02_softmax", "03_masks"), export.read_roster(roster),
                                   {"03_masks": "123"})
    assert table[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "02_softmax", "03_masks (123)"]
    assert table[1] == ["    Points Possible", "", "", "", "", "4", "4"]  # 2 checked + 2 by hand
    assert table[2] == ["Alice Liddell", "101", "S1", "alice", "Sec A", "", "3"]
    assert table[3] == ["Brown, Bob", "102", "S2", "BOB", "Sec A", "1", "1"]  # matched by login, any case
    assert table[4] == ["Dora Explorer", "103", "S3", "dora", "Sec B", "", ""]  # no submission: empty
    assert unknown == ["carol"]  # reported in the summary
    written = export.write(table, tmp_path / "canvas.csv")
    with written.open(newline="") as f:
        assert list(csv.reader(f)) == table


def test_a_roster_without_canvas_columns_is_refused(tmp_path):
    roster = tmp_path / "roster.csv"
    roster.write_text("name,email\nAlice,a@x\n")
    with pytest.raises(SystemExit, match="Student"):
        export.read_roster(roster)


# --- the sandbox a submission's kernel runs in (instructor/sandbox.py) -------------------------------------------

needs_bwrap = pytest.mark.needs("bwrap")  # tests/conftest.py skips it, and says so, where bwrap is missing
PROBE = r'''
import json, os, socket, subprocess, sys
import attention_course
result = {"package": attention_course.__file__, "env": sorted(os.environ)}
for name, path in [("notebooks", NOTEBOOK), ("instructor", INSTRUCTOR), ("secret", SECRET), ("mine", "mine.txt")]:
    try:
        result[name] = open(path).read()[:5]
    except OSError as error:
        result[name] = type(error).__name__
for name, path in [("write mine", "new.txt"), ("write etc", "/etc/new.txt"), ("write scratch", "/tmp/new.txt")]:
    try:
        open(path, "w").write("x")
        result[name] = "wrote"
    except OSError as error:
        result[name] = type(error).__name__
try:
    socket.create_connection(("127.0.0.1", PORT), timeout=2)
    result["socket"] = "connected"
except OSError as error:
    result["socket"] = type(error).__name__
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", TOKEN], start_new_session=True)
print(json.dumps(result))
'''


@pytest.mark.slow
@needs_bwrap
def test_the_sandbox_lets_a_kernel_read_only_itself_and_the_environment(tmp_path, monkeypatch):
    import socket
    mine, secret = tmp_path / "mine", tmp_path / "classmate"
    mine.mkdir(), secret.mkdir()
    (mine / "mine.txt").write_text("mine\n")
    (secret / "answers.ipynb").write_text("theirs\n")
    server = socket.create_server(("127.0.0.1", 0))  # the instructor's machine listens; the sandbox reaches nothing
    token = f"sandboxed-{tmp_path.name}"
    code = (PROBE.replace("NOTEBOOK", repr(str(NOTEBOOKS / "03_masks.ipynb")))
            .replace("INSTRUCTOR", repr(str(ROOT / "instructor" / "grade.py")))
            .replace("SECRET", repr(str(secret / "answers.ipynb"))).replace("PORT", str(server.getsockname()[1]))
            .replace("TOKEN", repr(token)))
    python = ROOT / ".venv" / "bin" / "python"
    read, path = sandbox.environment(python)
    monkeypatch.setenv("INSTRUCTORS_TOKEN", "s3cret")
    argv = sandbox.command([str(python), "-c", code], read=[*read, str(mine)], hide=[str(ROOT), str(tmp_path)],
                           cwd=str(mine), env={"PYTHONPATH": path} if path else {})
    run = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    server.close()
    assert run.returncode == 0, run.stderr
    result = json.loads(run.stdout)
    assert result["package"].endswith("attention_course/__init__.py")
    assert result["mine"] == "mine\n"
    assert result["notebooks"] == result["instructor"] == result["secret"] == "FileNotFoundError"
    assert "Error" in result["write mine"] and "Error" in result["write etc"] and result["write scratch"] == "wrote"
    assert "Error" in result["socket"]
    assert "INSTRUCTORS_TOKEN" not in result["env"]
    assert not [p for p in Path("/proc").glob("[0-9]*") if token in command_line(p)], \
        "a background process outlived the sandbox"


def command_line(process):
    """A process's command line, or "" for one that ended while /proc was being read."""
    try:
        return process.joinpath("cmdline").read_text(errors="replace")
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return ""


GRADER_PYTHON = ROOT / ".venv-grader" / "bin" / "python"


@pytest.mark.slow
@pytest.mark.skipif(not GRADER_PYTHON.exists(), reason="needs .venv-grader (make student)")
def test_nbgrader_is_stopped_soon_after_it_logs_the_kernels_death():
    """After "Kernel died", jupyter_client can hang for good (a heartbeat thread blocked on the dead kernel): the
    grader stops nbgrader a few seconds later instead of waiting for the whole notebook's limit. A run that only
    prints is left to finish, its output kept."""
    hang = ("import sys, time\n"
            "print('[AutogradeApp | ERROR] Kernel died while waiting for execute reply.', file=sys.stderr, flush=True)\n"
            "time.sleep(600)\n")
    probe = f"""import subprocess, sys
from instructor.grade import run_until_dead
try:
    died = run_until_dead([sys.executable, '-c', {hang!r}], {{}}, '.', timeout=120, grace=0.5).returncode
except subprocess.TimeoutExpired:
    died = 'waited for the timeout'
fine = run_until_dead([sys.executable, '-c', 'print(42)'], {{}}, '.', timeout=120)
print(died, fine.returncode, fine.stdout.strip())
"""
    run = subprocess.run([str(GRADER_PYTHON), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.stdout.split() == ["-9", "0", "42"], run.stdout + run.stderr


@pytest.mark.slow
@pytest.mark.skipif(not GRADER_PYTHON.exists(), reason="needs .venv-grader (make student)")
def test_nbgrader_forked_by_the_zygote_runs_as_its_command_line(tmp_path):
    """instructor/forks.py: each nbgrader run is a fork of a process that imported nbgrader once. A run writes to the
    output files it is given and ends with nbgrader's exit status, as the command line does (its folder and
    environment: tests/test_grading_class.py, where nbgrader finds the grading kernel through them); runs asked for
    one after the other run side by side; a run can be killed; the zygote ends when its caller stops it."""
    probe = f"""import json, os, sys, time
from pathlib import Path
from instructor.forks import Zygote
out = Path({str(tmp_path)!r})
z = Zygote()
env = dict(os.environ)
version = z.run(['--version'], env, out, out / 'v.out', out / 'v.err')
wrong = z.run(['autograde'], env, out, out / 'w.out', out / 'w.err')  # no assignment named
hold = z.run(['autograde', '--help-all'], env, out, out / 'h.out', out / 'h.err')
hold.kill()
codes = [version.wait(60), wrong.wait(60), hold.wait(60)]
print(json.dumps({{"codes": codes, "version": (out / 'v.out').read_text(), "wrong": (out / 'w.err').read_text()[-300:],
                  "zygote": z.process.pid}}))
z.stop()
"""
    run = subprocess.run([str(GRADER_PYTHON), "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    found = json.loads(run.stdout)
    assert found["codes"][0] == 0 and "nbgrader version" in found["version"], found
    assert found["codes"][1] == 1 and "An assignment id must be specified" in found["wrong"], found  # as the CLI
    assert found["codes"][2] in (0, -9), found  # killed, unless it had printed its help and ended first
    assert not Path(f"/proc/{found['zygote']}").exists() or "instructor.forks" not in command_line(
        Path(f"/proc/{found['zygote']}"))


@pytest.mark.slow
def test_the_watchdog_stops_a_kernel_over_its_memory_or_time(tmp_path):
    verdict = sandbox.verdict_of(tmp_path / "runtime")
    hog = [sys.executable, "-c", "import time\nx = b'x' * (400 * 2**20)\ntime.sleep(60)"]
    assert sandbox.watch(hog, seconds=60, memory=100 * 2**20, verdict=verdict) != 0
    assert verdict.read_text().startswith("went over the memory limit (100 MiB; it used ")
    verdict.unlink()
    endless = [sys.executable, "-c", "import time\ntime.sleep(60)"]
    assert sandbox.watch(endless, seconds=1, memory=2**30, verdict=verdict) != 0
    assert verdict.read_text() == "went over the 1 s limit for the whole notebook"


def test_outputs_over_the_limit_are_cut_with_a_note(tmp_path):
    stream = lambda text: {"output_type": "stream", "name": "stdout", "text": text}  # noqa: E731
    error = {"output_type": "error", "ename": "ValueError", "evalue": "bad", "traceback": ["t"] * 50}
    nb = {"cells": [{"cell_type": "code", "source": "", "metadata": {}, "outputs": [stream("small\n")]},
                    {"cell_type": "code", "source": "", "metadata": {}, "outputs": [stream("y" * 10_000), error]},
                    {"cell_type": "code", "source": "", "metadata": {}, "outputs": [stream("later\n")]},
                    {"cell_type": "markdown", "source": "", "metadata": {}}],
          "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    path = put(tmp_path, "graded.ipynb", nb)
    assert not sandbox.cut_outputs(path, 100_000) and load(path) == json.loads(json.dumps(nb))
    path.chmod(0o444)  # as nbgrader leaves it
    assert sandbox.cut_outputs(path, 1000) and path.stat().st_mode & 0o777 == 0o444
    cells = load(path)["cells"]
    assert cells[0]["outputs"] == [stream("small\n")]
    cut, kept = cells[1]["outputs"]
    assert cut["text"].startswith("y" * 900) and len(cut["text"]) < 1200
    assert "[cut by the grader: this notebook's outputs went over 1000 characters" in cut["text"]
    assert kept["ename"] == "ValueError" and len(kept["traceback"]) == 20  # an error stays: grading reads it
    assert cells[2]["outputs"] == [] and "outputs" not in cells[3]


@pytest.mark.skipif(not GRADER_PYTHON.exists(), reason="needs .venv-grader (make student)")
def test_the_feedback_batches_split_the_class_once_and_evenly():
    """instructor/grade.py's batches: the globs nbgrader's generate_feedback runs take, ``jobs`` at a time. Every
    student is matched by exactly one glob (fnmatch: nbgrader's glob of a folder name), the groups differ in size by
    at most the largest group of one last character, and a name a glob's brackets would misread gives one run for all."""
    import fnmatch
    import random

    rng = random.Random(0)
    alphabet = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-"
    classes = [[f"student{n:04d}" for n in range(200)], ["alice", "bob", "carol", "x-"], ["ann"],
               ["".join(rng.choice(alphabet) for _ in range(rng.randint(1, 8))) for _ in range(60)],
               ["alice", "bob*", "carl"], ["zoë", "anna"]]
    probe = ("import json, sys\nfrom instructor.grade import batches\n"
             "print(json.dumps([[batches(c, jobs) for jobs in (1, 2, 3)] for c in json.loads(sys.argv[1])]))\n")
    run = subprocess.run([str(GRADER_PYTHON), "-c", probe, json.dumps(classes)], cwd=ROOT, capture_output=True,
                         text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    found = json.loads(run.stdout)
    assert found[0][1] == ["*[02468]", "*[13579]"]
    for students, by_jobs in zip(classes, found):
        assert by_jobs[0] == ["*"]
        for jobs, globs in zip((1, 2, 3), by_jobs):
            assert len(globs) <= jobs
            for student in students:
                assert sum(fnmatch.fnmatchcase(student, glob) for glob in globs) == 1, (student, globs)
            sizes = [sum(fnmatch.fnmatchcase(s, glob) for s in students) for glob in globs]
            largest = max(sum(s[-1] == c for s in students) for c in {s[-1] for s in students})
            assert max(sizes) - min(sizes) <= largest, (globs, sizes)
    assert found[4][1] == found[5][1] == ["*"]  # "*" and "ë" end names: one run
