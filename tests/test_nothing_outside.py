"""Nothing outside its own: grading ends only the processes it started and deletes only the files it made.

Each test runs grading in a PID and mount namespace of its own (``unshare``; as a user who is not root,
``unshare --user --map-root-user``), with a /tmp and a /dev/shm of its own, beside a process and files that grading
did not make (the *sentinels*, a ``sleep``, /tmp/sentinel.txt and /dev/shm/sentinel.txt): all must still be there
when grading is done. Run so, the old clean-up (every process in /proc killed, /tmp and /dev/shm emptied, outside
bubblewrap too) fails these tests without harming the machine. Bare (``--no-sandbox``) and in the sandbox, a chapter-3 class gets the same verdicts, and a background
process a submission started is gone afterwards. The units: instructor/cleanup.py's checks.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from instructor import cleanup  # noqa: E402

STUDENT = ROOT / "_build" / "student"
GRADER_PYTHON = ROOT / ".venv-grader" / "bin" / "python"


def unshare() -> list[str] | None:
    """The unshare command line that works here (root, or a user namespace), or None."""
    base = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc", "--mount", "--propagation", "private"]
    for prefix in (base, [*base[:1], "--user", "--map-root-user", *base[1:]]):
        try:
            probe = subprocess.run([*prefix, "mount", "-t", "tmpfs", "probe", "/tmp"], capture_output=True,
                                   timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            continue
        if probe.returncode == 0:
            return prefix
    return None


UNSHARE = unshare() if shutil.which("unshare") else None
contained_only = pytest.mark.skipif(UNSHARE is None, reason="neither `unshare --pid --mount` nor `unshare --user "
                                    "--map-root-user ...` works here (no namespaces for this user)")

# Run as PID 1 of the new namespace: a /tmp of its own, the sentinels, the command, then what survived.
CONTAINED = r"""
if [ "${ROOT#/tmp/}" != "$ROOT" ]; then  # a checkout under /tmp stays in reach: bound back into the new /tmp
  mount -t tmpfs stage /mnt && mkdir /mnt/old && mount --bind /tmp /mnt/old || exit 97
fi
mount -t tmpfs -o size=2g contained /tmp || exit 97
if [ -d /mnt/old ]; then
  mkdir -p "$ROOT" && mount --bind "/mnt/old/${ROOT#/tmp/}" "$ROOT" || exit 97
fi
mount -t tmpfs -o size=64m contained /dev/shm || exit 97
sleep 3600 & sentinel=$!
echo "not grading's" > /tmp/sentinel.txt
echo "not grading's" > /dev/shm/sentinel.txt
"$@"
status=$?
alive=no; kill -0 "$sentinel" 2>/dev/null && alive=yes
kept=no; test -f /tmp/sentinel.txt && test -f /dev/shm/sentinel.txt && kept=yes
left=$(ls /tmp | grep -v '^sentinel.txt$' | tr '\n' ' ')
token=no; pgrep -f "$TOKEN" >/dev/null && token=yes
kill "$sentinel" 2>/dev/null
echo "CONTAINED {\"status\": $status, \"sentinel_process\": \"$alive\", \"sentinel_file\": \"$kept\", \"left_in_tmp\": \"$left\", \"token_running\": \"$token\"}"
"""


def contained(argv: list[str], token: str = "no-token-given", timeout: float = 900) -> tuple[dict, str]:
    """Run ``argv`` in the namespace beside the sentinels: (what survived, the output)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MAKE", "MFLAGS"))}
    env["TOKEN"], env["ROOT"] = token, str(ROOT)
    run = subprocess.run([*UNSHARE, "bash", "-c", CONTAINED, "contained", *argv], capture_output=True, text=True,
                         timeout=timeout, cwd=ROOT, env=env)
    output = run.stdout + run.stderr
    lines = [line for line in run.stdout.splitlines() if line.startswith("CONTAINED ")]
    assert run.returncode != 97, f"no /tmp or /dev/shm of its own in the namespace (or {ROOT} not bound back into " \
                                 f"it): {output[-2000:]}"
    assert lines, f"the namespace's shell did not finish (exit {run.returncode}): {output[-4000:]}"
    return json.loads(lines[-1][len("CONTAINED "):]), output


@pytest.fixture
def folder():
    """A folder outside /tmp (the namespace hides /tmp behind its own): made here, removed here."""
    (ROOT / "_build").mkdir(exist_ok=True)
    made = Path(tempfile.mkdtemp(prefix="contained-", dir=ROOT / "_build"))
    yield made
    shutil.rmtree(made, ignore_errors=True)


# ------------------------------------------------------------------------ the check server, bare (chapter 11's)
@pytest.mark.slow
@contained_only
def test_a_bare_check_server_ends_only_what_it_started():
    """Chapter 11's check server without bubblewrap (as `make grade --no-sandbox` runs it, and as this test's
    sibling in test_exercises_ch11.py runs it in the sandbox): a student's worker processes start and end, the
    verdicts are right, and the sentinel process and file outlive it."""
    script = ("import sys; sys.path[:0] = [{tests!r}, {root!r}]\n"
              "import test_exercises_ch11 as t\nt.rerun_both_checks(sandboxed=False)\nprint('CHECKED')\n"
              ).format(tests=str(ROOT / "tests"), root=str(ROOT))
    found, output = contained([sys.executable, "-c", script])
    assert found["status"] == 0 and "CHECKED" in output, output[-4000:]
    assert found["sentinel_process"] == "yes", "the check server killed a process it did not start"
    assert found["sentinel_file"] == "yes", "the check server deleted a file it did not make"
    assert not grading_s(found["left_in_tmp"]), f"grading's folders left in /tmp: {found['left_in_tmp']}"


# ------------------------------------------------------------------------ a class graded, bare and sandboxed
needs_student = pytest.mark.skipif(not (STUDENT / "notebooks").exists(), reason="run `make student` first")
needs_grader = pytest.mark.skipif(not GRADER_PYTHON.exists(), reason="needs .venv-grader (make student)")
BACKGROUND = ("import subprocess, sys\n"
              "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)', {token!r}],\n"
              "                 start_new_session=True)\n")


def hand_in(submissions: Path, token: str) -> None:
    """Ordinary chapter-3 work: right in two styles, two classic mistakes (one per exercise, in one notebook: the
    exercises are checked apart), and the stubs; alice's right work also leaves a process running in the background
    (its own session: outside the kernel's process group). Four notebooks, two per job (a fifth, the same right work
    without the process, added a third round to each grading and no verdict this file asserts: her masked softmax,
    which names subprocess, is held for review, as that notebook's was; amy's passes)."""
    from test_grading_class import AFTER, GOOD, OTHER_STYLE, SOFT, WRONG_PAD, PAD, exercises_only, fill

    from instructor.exercises import load

    released = exercises_only(load(STUDENT / "notebooks" / "03_masks.ipynb"))
    work = {"alice": dict(GOOD, **{SOFT: GOOD[SOFT] + BACKGROUND.format(token=token)}), "amy": OTHER_STYLE,
            "bob": {PAD: WRONG_PAD, SOFT: AFTER}, "erin": {}}
    for name, answers in work.items():
        (submissions / name).mkdir(parents=True)
        (submissions / name / "03_masks.ipynb").write_text(json.dumps(fill(released, answers)))


def grade_contained(folder: Path, *flags: str) -> tuple[dict, list[dict], str]:
    token = f"background-{folder.name}"
    hand_in(folder / "submissions", token)
    argv = [str(GRADER_PYTHON), "-m", "instructor.grade", str(folder / "submissions"), "--out", str(folder / "out"),
            "--cell-timeout", "60", "--notebook-timeout", "300", "--memory", "1500M", "--jobs", "2", *flags]
    found, output = contained(argv, token=token)
    assert found["status"] == 0, output[-5000:]
    with (folder / "out" / "grades.csv").open() as f:
        import csv

        rows = [row for row in csv.DictReader(f) if row["exercise"]]
    return found, rows, output


GRADINGS_FOLDERS = ("checks-", "grade-", "nbgrader-")  # instructor/'s temporary folders (others: torch's caches)


def grading_s(left: str) -> list[str]:
    return [name for name in left.split() if name.startswith(GRADINGS_FOLDERS)]


def survived(found: dict) -> None:
    assert found["sentinel_process"] == "yes", "grading killed a process it did not start"
    assert found["sentinel_file"] == "yes", "grading deleted a file it did not make"
    assert found["token_running"] == "no", "a submission's background process outlived grading"


VERDICTS = {}  # flags -> {(student, exercise): (passed, message)}


@pytest.mark.slow
@contained_only
@needs_student
@needs_grader
@pytest.mark.parametrize("flags", [("--no-sandbox",), pytest.param((), marks=pytest.mark.needs("bwrap"))],
                         ids=["bare", "sandboxed"])
def test_grading_a_class_ends_only_what_it_started(folder, flags):
    """`make grade`'s command on a chapter-3 class, bare (--no-sandbox) and in bubblewrap's sandbox: grades for all,
    the sentinels intact, the submission's background process ended, and nothing of grading's left in /tmp."""
    found, rows, output = grade_contained(folder, *flags)
    survived(found)
    assert not grading_s(found["left_in_tmp"]), f"grading's folders left in /tmp: {found['left_in_tmp']}"
    assert {r["student"] for r in rows} == {"alice", "amy", "bob", "erin"}, rows
    VERDICTS[flags] = {(r["student"], r["exercise"]): (r["passed"], r["message"]) for r in rows}
    passed = {(s, e) for (s, e), (p, _) in VERDICTS[flags].items() if p == "1"}
    assert ("alice", "ex-ch3-padding-mask") in passed and ("amy", "ex-ch3-masked-softmax") in passed, rows
    assert ("bob", "ex-ch3-padding-mask") not in passed and ("erin", "ex-ch3-padding-mask") not in passed, rows
    assert ("bob", "ex-ch3-masked-softmax") not in passed, rows


@pytest.mark.slow
def test_bare_and_sandboxed_grading_give_the_same_verdicts():
    """For ordinary work the sandbox changes nothing but the risks: the same row for every student and exercise."""
    if len(VERDICTS) < 2:
        pytest.skip("needs both gradings of this file's test above (run the whole file)")
    assert VERDICTS[("--no-sandbox",)] == VERDICTS[()]


# ------------------------------------------------------------------------ instructor/cleanup.py
def test_descendants_are_found_and_ended_and_nothing_else():
    """A tree started here (a child, its child in a session of its own) is found and ended; a process started
    beside it, not below, is not touched."""
    beside = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    tree = subprocess.Popen([sys.executable, "-c", "import subprocess, sys, time\n"
                             "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], "
                             "start_new_session=True)\ntime.sleep(60)\n"])
    try:
        for _ in range(100):
            below = cleanup.descendants(tree.pid)
            if below:
                break
            __import__("time").sleep(0.05)
        assert len(below) == 1 and cleanup.below(below[0], tree.pid) and not cleanup.below(beside.pid, tree.pid)
        assert cleanup.end_descendants(tree.pid) >= 1
        assert cleanup.descendants(tree.pid, zombies=False) == []
        assert beside.poll() is None and tree.poll() is None  # neither the one beside nor the root itself
    finally:
        for process in (beside, tree):
            process.kill()
            process.wait()


CHAIN = ("import subprocess, sys, time\n"
         "n = int(sys.argv[1])\n"
         "if n:\n"
         "    subprocess.Popen([sys.executable, '-c', sys.argv[2], str(n - 1), sys.argv[2]])\n"
         "time.sleep(60)\n")


def test_a_chain_is_ended_whole_though_nothing_reaps_its_orphans():
    """A chain of four processes below one that is not a subreaper: killed parents first, the rest would be
    re-parented out of the tree and missed; stopped top-down and killed bottom-up, all four end."""
    import time

    root = subprocess.Popen([sys.executable, "-c", CHAIN, "4", CHAIN])
    try:
        for _ in range(200):
            if len(cleanup.descendants(root.pid)) == 4:
                break
            time.sleep(0.05)
        chain = cleanup.descendants(root.pid)
        assert len(chain) == 4
        cleanup.end_descendants(root.pid)
        time.sleep(0.2)
        states = cleanup._processes()
        alive = [pid for pid in chain if states.get(pid, (0, "Z"))[1] != "Z"]
        assert alive == [] and root.poll() is None
    finally:
        root.kill()
        root.wait()


def test_a_process_in_its_starters_namespaces_is_never_told_it_is_in_its_own():
    """own_namespaces: False here (the same namespaces as the caller's), False when anything is unknown; it is what
    keeps the check server's clean-up of a whole namespace inside bubblewrap's."""
    here = cleanup.namespaces()
    assert set(here) == {"pid", "mnt"} and all(v.startswith(k + ":[") for k, v in here.items())
    assert cleanup.own_namespaces(here) is False
    assert cleanup.own_namespaces(None) is False and cleanup.own_namespaces({}) is False
    assert cleanup.own_namespaces({"pid": here["pid"]}) is False


def test_emptying_a_folder_keeps_the_folder_and_follows_no_link(tmp_path):
    made, elsewhere = tmp_path / "made", tmp_path / "elsewhere"
    made.mkdir(), elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("not ours")
    (made / "sub").mkdir()
    (made / "sub" / "file").write_text("ours")
    (made / "link").symlink_to(elsewhere)
    cleanup.empty(str(made))
    assert made.is_dir() and list(made.iterdir()) == [] and (elsewhere / "keep.txt").exists()
    cleanup.empty(str(made / "link"))  # a link is not a folder of ours: nothing


def test_the_student_edition_never_empties_a_folder_it_did_not_make(tmp_path):
    """`python -m instructor.student --out DIR` empties DIR before it writes: only a folder it made (its mark in
    it), an empty or a new one; a folder of someone's files is refused and left as it was."""
    from instructor import student

    foreign = tmp_path / "home"
    foreign.mkdir()
    (foreign / "thesis.tex").write_text("mine")
    with pytest.raises(SystemExit, match="not a folder this command made"):
        student.clear(foreign)
    assert (foreign / "thesis.tex").read_text() == "mine"
    made = tmp_path / "made"
    student.clear(made)
    (made / "old.ipynb").write_text("{}")
    student.clear(made)
    assert [p.name for p in made.iterdir()] == [student.MADE_HERE]


OWN = ("import json, sys\nsys.path.insert(0, {folder!r})\nimport cleanup\n"
       "print(cleanup.own_namespaces(json.loads(sys.argv[1])))\n").format(folder=str(ROOT / "instructor"))


@pytest.mark.slow
@pytest.mark.needs("bwrap")
def test_only_inside_bubblewrap_is_a_process_told_it_is_in_namespaces_of_its_own():
    """What lets the check server empty a whole namespace: True in bubblewrap's sandbox, started from here; False
    for the same program started bare from here."""
    from instructor import sandbox

    python = ROOT / ".venv" / "bin" / "python"
    read, path = sandbox.environment(python)
    outside = json.dumps(cleanup.namespaces())
    argv = sandbox.command([str(python), "-c", OWN, outside], read=[*read, str(ROOT / "instructor" / "cleanup.py")],
                           env={"PYTHONPATH": path} if path else {})
    inside = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    bare = subprocess.run([str(python), "-c", OWN, outside], capture_output=True, text=True, timeout=120)
    assert (inside.stdout.strip(), bare.stdout.strip()) == ("True", "False"), inside.stderr + bare.stderr
