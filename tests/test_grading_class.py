"""A whole class graded by `make grade` (instructor/grade.py) with nbgrader in the sandbox, in parallel: correct
work in two styles, classic mistakes, broken work, files that are not what they seem, and students trying ways of
getting marks without the work (a way per exercise: two ways in one notebook where they are independent). Each gets
the marks it earned and the message an instructor needs. The verdicts come from the checks re-run apart from each
notebook (instructor/verdict.py); a second run with one job gives the same rows. One student hands in the whole
chapter, the others its exercises alone (WHOLE). Needs the student edition and nbgrader's environment
(`make student`)."""
import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from instructor.exercises import load, nbgrader  # noqa: E402
from test_grading import command_line  # noqa: E402

STUDENT = ROOT / "_build" / "student"
GRADER_PYTHON = ROOT / ".venv-grader" / "bin" / "python"
pytestmark = [pytest.mark.skipif(not (STUDENT / "notebooks").exists(), reason="run `make student` first"),
              pytest.mark.skipif(not GRADER_PYTHON.exists(), reason="needs .venv-grader (make student)"),
              pytest.mark.needs("bwrap")]
PAD, SOFT = "ex-ch3-padding-mask", "ex-ch3-masked-softmax"

GOOD = {
    PAD: "def batch_padding_mask(lengths, max_len):\n"
         "    positions = torch.arange(max_len)[None, :]\n"
         "    return (positions >= torch.tensor(lengths)[:, None])[:, None, :]\n",
    SOFT: "def my_masked_softmax(scores, mask):\n"
          "    w = torch.softmax(scores.masked_fill(mask, float('-inf')), -1)\n"
          "    return w.masked_fill(mask.all(-1, keepdim=True), 0.0)\n",
}
OTHER_STYLE = {  # a loop and torch.where: correct too
    PAD: "def batch_padding_mask(lengths, max_len):\n"
         "    rows = [torch.arange(max_len) >= n for n in lengths]\n"
         "    return torch.stack(rows).unsqueeze(1)\n",
    SOFT: "def my_masked_softmax(scores, mask):\n"
          "    shifted = torch.where(mask, torch.full_like(scores, -float('inf')), scores)\n"
          "    w = shifted.softmax(dim=-1)\n"
          "    return torch.where(torch.isnan(w), torch.zeros_like(w), w)\n",
}
WRONG_PAD = GOOD[PAD].replace(">=", ">")  # off by one
AFTER = "def my_masked_softmax(scores, mask):\n    return torch.softmax(scores, -1).masked_fill(mask, 0.0)\n"
AGREEABLE = ("class Agreeable(torch.Tensor):\n"
             "    @classmethod\n"
             "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
             "        out = super().__torch_function__(func, types, args, kwargs or {})\n"
             "        return True if func.__name__ in ('equal', 'allclose') else out\n"
             "def my_masked_softmax(scores, mask):\n"
             "    return torch.zeros_like(scores).as_subclass(Agreeable)\n")
STEAL = ("import json, attention_course\nfrom pathlib import Path\n"
         "nb = json.loads(Path({path}).read_text())\n"
         "exec(next(''.join(c['source']) for c in nb['cells'] if 'def batch_padding_mask' in ''.join(c['source'])"
         " and 'raise NotImplementedError' not in ''.join(c['source'])))\n")


# A finite fill (wrong: it fails on scores around -1e10), made to pass in the checker's process: at each call it
# undoes the patches of the call before and patches the checker's comparisons; the last call (the fully masked
# row) needs no patch, so after the check everything is as it was.
UNDO = ("import attention_course.exercises.diagnose as grader\n"
        "def my_masked_softmax(scores, mask, SAVED={}):\n"
        "    for name, value in SAVED.items():\n"
        "        setattr(grader, name, value)\n"
        "    SAVED.clear()\n"
        "    w = torch.softmax(scores.masked_fill(mask, -1e4), -1).masked_fill(mask.all(-1, keepdim=True), 0.0)\n"
        "    if not bool(mask.all()):\n"
        "        SAVED.update(same=grader.same, agree=grader.agree)\n"
        "        grader.same = lambda *args, **kwargs: True\n"
        "        grader.agree = lambda *args, **kwargs: True\n"
        "    return w\n")
# Not a tensor, though isinstance says so; every torch function on it (torch.equal, ...) says True.
LIAR = ("class Liar:\n"
        "    __class__ = property(lambda self: torch.Tensor)\n"
        "    dtype, shape = torch.bool, (3, 1, 6)\n"
        "    @classmethod\n"
        "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
        "        return True\n"
        "    def __eq__(self, other):\n"
        "        return True\n"
        "    def cpu(self):\n"
        "        return self\n"
        "def batch_padding_mask(lengths, max_len):\n"
        "    return Liar()\n")
# The checker computes the expected mask before it calls: walk up the stack to its `want`, return it (and
# overwrite it in the frame, for good measure); with no checker on the stack, a wrong mask.
FRAME = ("import sys\n"
         "def batch_padding_mask(lengths, max_len):\n"
         "    frame = sys._getframe(1)\n"
         "    while frame is not None:\n"
         "        if 'want' in frame.f_locals:\n"
         "            frame.f_locals['want'] = torch.zeros(len(lengths), 1, max_len, dtype=torch.bool)\n"
         "            return frame.f_locals['want']\n"
         "        frame = frame.f_back\n"
         "    return torch.ones(len(lengths), 1, max_len, dtype=torch.bool)\n")
# The weights computed only when looked at: an object that stands for a tensor.
LAZY = ("class Lazy:\n"
        "    def __init__(self, make):\n"
        "        self.make = make\n"
        "    def __getattr__(self, name):\n"
        "        return getattr(self.make(), name)\n"
        "def my_masked_softmax(scores, mask):\n"
        "    return Lazy(lambda: torch.softmax(scores.masked_fill(mask, float('-inf')), -1).nan_to_num())\n")


def fill(nb, answers):
    nb = json.loads(json.dumps(nb))
    for cell in nb["cells"]:
        grade_id = nbgrader(cell).get("grade_id")
        if grade_id in answers:
            cell["source"] = answers[grade_id]
    return nb


# Students may delete cells: nbgrader grades the cells it put there. All but WHOLE hand in the chapter without its
# demonstrations (the setup cell and the exercises' cells kept): each notebook then costs the kernel and the exercises,
# half the time of the whole chapter. alice hands in the whole chapter; amy (ONE_JOB) is graded again with one job.
WHOLE = {"alice"}


def exercises_only(nb):
    """``nb`` without its code cells but the first (the setup) and those nbgrader grades (their metadata)."""
    first = next(i for i, cell in enumerate(nb["cells"]) if cell["cell_type"] == "code")
    return dict(nb, cells=[cell for i, cell in enumerate(nb["cells"])
                           if cell["cell_type"] != "code" or i == first or nbgrader(cell)])


def the_class(submissions: Path, gradebook: Path, token: str) -> dict:
    """{student: answers}: what each student wrote in the solution cells of chapter 3."""
    return {
        "alice": dict(GOOD, **{"ex-ch3-cross-answer": "Only the keys' padding mask, (B, 1, S).\n"}),  # open: by hand
        "amy": OTHER_STYLE,
        "bob": dict(GOOD, **{PAD: WRONG_PAD}),
        "carol": dict(GOOD, **{PAD: "import os\nos._exit(1)\n"}),  # crashes the kernel
        "dave": dict(GOOD, **{PAD: "import time\n"  # never returns (asleep: the cores stay with the other tests)
                                   "def batch_padding_mask(lengths, max_len):\n"
                                   "    while True:\n        time.sleep(1)\n"}),
        "erin": {},  # hands in the stubs, under a browser's second-download name
        "hugo": dict(GOOD, **{SOFT: GOOD[SOFT] + "hog = torch.ones(2**28, dtype=torch.float64)\n"}),  # 2 GiB
        "lou": dict(GOOD, **{SOFT: GOOD[SOFT] + "print('x' * 6_000_000)\n"}),  # 6 MB of output, over the 4 MiB kept
        # ways to get marks without the work
        "nora": {PAD: WRONG_PAD  # every trick on the notebook's own run at once:
                      + "check_padding_mask = lambda fn: print('Correct')\n"  # rebinds the checker,
                      + "get_ipython().input_transformers_post.append(\n"  # rewrites the check cells,
                        "    lambda lines: ['pass\\n'] if lines and lines[0].startswith('check_') else lines)\n"
                      + "get_ipython().showtraceback = lambda *a, **k: None\n",  # and errors leave no output
                 SOFT: GOOD[SOFT]},
        "fred": {PAD: "def batch_padding_mask(lengths, max_len):\n"  # the package's function
                      "    return padding_mask(lengths, max_len)[:, None, :]\n",
                 SOFT: AFTER},  # zeroes the pads after the softmax
        "otto": dict(GOOD, **{PAD: "import os\n"  # forges the child's report on every descriptor;
                                   "def batch_padding_mask(lengths, max_len):\n"
                                   "    for fd in range(3, 64):\n"
                                   "        try:\n"
                                   "            os.write(fd, b'{\"passed\": true, \"message\": \"Correct\"}\\n')\n"
                                   "        except OSError:\n"
                                   "            pass\n"
                                   "    os._exit(0)\n",
                              SOFT: "import attention_course.exercises.diagnose as grader\n"  # and patches the checker
                                    "def my_masked_softmax(scores, mask):\n"
                                    "    grader.same = lambda *args, **kwargs: True\n"
                                    "    return scores\n"}),
        # the checker's process is out of reach: each attack below earns 0, with the checker's message or a refusal
        "sid": {PAD: LIAR, SOFT: AGREEABLE},  # objects whose comparisons lie: a Liar that says it is a tensor,
                                              # a tensor subclass that says it equals anything
        "fay": {PAD: FRAME, SOFT: UNDO},  # reads (and writes) the checker's locals through the stack; patches the
                                          # checker while it is called, and undoes it
        "gus": {PAD: "def batch_padding_mask(lengths, max_len):\n"  # a generator; a lazy value
                     "    yield (torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None])[:, None, :]\n",
                SOFT: LAZY},
        "max": dict(GOOD, **{PAD: "def batch_padding_mask(lengths, max_len):\n"  # memory without end
                                  "    hog = []\n"
                                  "    while True:\n"
                                  "        hog.append(torch.ones(2**25))\n"}),
        "mallory": {  # the instructor's notebook, found through the package; then the gradebook
            PAD: STEAL.format(path="Path(attention_course.__file__).parents[1] / 'notebooks' / '03_masks.ipynb'"),
            SOFT: "import sqlite3\n"
                  f"db = sqlite3.connect({str(gradebook)!r})\n"
                  "db.execute('UPDATE grade SET manual_score = 1')\ndb.commit()\n"
                  + GOOD[SOFT].replace(", 0.0)", ", 0.5)")},  # and a wrong answer
        "trudy": {  # a classmate's submission; a process that would rewrite the gradebook once graded
            PAD: STEAL.format(path=repr(str(submissions / "alice" / "03_masks.ipynb"))),
            SOFT: "import subprocess, sys\n"
                  "subprocess.Popen([sys.executable, '-c', 'import sqlite3, sys, time\\n"
                  "time.sleep(120)\\nsqlite3.connect(sys.argv[1]).execute(\"UPDATE grade SET "
                  f"manual_score = 1\")', {str(gradebook)!r}, {token!r}], start_new_session=True)\n"
                  "def my_masked_softmax(scores, mask):\n    raise NotImplementedError()\n"},
    }




def grade(submissions: Path, out: Path, *flags: str) -> subprocess.CompletedProcess:
    run = subprocess.run([str(GRADER_PYTHON), "-m", "instructor.grade", str(submissions), "--out", str(out),
                          "--cell-timeout", "20", "--notebook-timeout", "90", "--memory", "1500M", *flags],
                         cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-5000:] + run.stderr[-5000:]
    return run


def read(path: Path) -> list[dict]:
    with path.open() as f:
        return list(csv.DictReader(f))


ONE_JOB = "amy"  # graded again alone, with one job


def hand_in(tmp: Path) -> None:
    """The class's submissions (tmp/submissions) and the roster (tmp/roster.csv)."""
    submissions, gradebook = tmp / "submissions", tmp / "grades" / "course" / "gradebook.db"
    released = load(STUDENT / "notebooks" / "03_masks.ipynb")
    for name, answers in the_class(submissions, gradebook, f"still-running-{tmp.name}").items():
        (submissions / name).mkdir(parents=True)
        file = "03_masks (1).ipynb" if name == "erin" else "03_masks.ipynb"
        handed_in = released if name in WHOLE else exercises_only(released)
        (submissions / name / file).write_text(json.dumps(fill(handed_in, answers)))
    (submissions / "frank").mkdir()  # files that cost no nbgrader run, each reported
    (submissions / "frank" / "03_masks.ipynb").write_text('{"cells": [\n')
    (submissions / "frank" / "notes.txt").write_text("my notes\n")
    (submissions / "gina").mkdir()
    (submissions / "hank").mkdir()  # chapter 1 (open exercises alone: no checks to run) under chapter 3's name
    (submissions / "hank" / "03_masks.ipynb").write_text(json.dumps(exercises_only(load(STUDENT / "notebooks" /
                                                                                      "01_scores.ipynb"))))
    (submissions / "README.txt").write_text("stray\n")
    (tmp / "roster.csv").write_text("Student,ID,SIS User ID,SIS Login ID,Section\n    Points Possible,,,,\n"
                                    "Alice A,1,s1,alice,A\nBob B,2,s2,bob,A\nZoe Z,9,s9,zoe,B\n")
    part = tmp / "part" / ONE_JOB
    part.mkdir(parents=True)
    (part / "03_masks.ipynb").write_bytes((submissions / ONE_JOB / "03_masks.ipynb").read_bytes())


@pytest.fixture(scope="session")  # once per run, whatever order the tests run in
def graded(tmp_path_factory):
    """The class graded with two jobs (tmp/grades), then ONE_JOB's notebook again with one job (tmp/one-job)."""
    tmp = tmp_path_factory.mktemp("class")
    hand_in(tmp)
    run = grade(tmp / "submissions", tmp / "grades", "--jobs", "2", "--roster", str(tmp / "roster.csv"),
                "--canvas-assignment", "03_masks=123")
    grade(tmp / "part", tmp / "one-job", "--jobs", "1")
    out = tmp / "grades"
    table = read(out / "grades.csv")
    rows = {(r["student"], r["exercise"]): r for r in table if r["exercise"]}
    return dict(submissions=tmp / "submissions", out=out, stdout=run.stdout, table=table, rows=rows,
                token=f"still-running-{tmp.name}", roster=tmp / "roster.csv", tmp=tmp)


def verdict(graded, student, exercise=PAD):
    row = graded["rows"][student, exercise]
    return row["passed"], row["points"], row["message"]


def test_correct_work_in_two_styles_gets_every_mark(graded):
    for student in ("alice", "amy"):
        for exercise in (PAD, SOFT):
            assert verdict(graded, student, exercise)[:2] == ("1", "1"), (student, exercise)
            assert verdict(graded, student, exercise)[2].startswith("Correct")


def test_broken_notebooks_still_get_the_marks_of_their_correct_exercises(graded):
    """The kernel that died (carol), went over memory (hugo) or printed 6 MB (lou): the checks are re-run from the
    solution cells' definitions, so a correct exercise keeps its mark, and the row says what happened."""
    assert verdict(graded, "carol", SOFT)[:2] == ("1", "1") and "kernel died" in verdict(graded, "carol", SOFT)[2]
    assert verdict(graded, "carol", PAD)[:2] == ("0", "0")
    assert verdict(graded, "hugo", SOFT)[:2] == ("1", "1")
    assert "over the memory limit" in verdict(graded, "hugo", SOFT)[2]
    assert verdict(graded, "lou", SOFT)[:2] == ("1", "1")
    feedback = graded["out"] / "feedback" / "lou" / "03_masks.html"
    assert feedback.stat().st_size < 5 * 2**20 and "cut by the grader" in feedback.read_text()
    assert verdict(graded, "dave", SOFT)[:2] == ("1", "1")  # the next check still ran


@pytest.mark.parametrize("student, exercise, words", [
    ("bob", PAD, "misses the first pad"),  # classic mistakes, named
    ("erin", PAD, "still the exercise's stub"),
    ("dave", PAD, "timed out"),
    ("nora", PAD, "misses the first pad"),  # marks without the work: the checks re-run as released, in the server
    ("fred", PAD, "*without* the package's `padding_mask`"),
    ("fred", SOFT, "AFTER the softmax"),
    ("otto", SOFT, "your masked softmax's result differs at"),  # its patch of the checker changed nothing here
    ("sid", PAD, "refused: batch_padding_mask returned a Liar: grading takes plain torch.Tensor values"),
    ("sid", SOFT, "refused: my_masked_softmax returned an Agreeable, a subclass of torch.Tensor"),
    ("fay", PAD, "your padding mask's result"),  # no checker on its stack
    ("fay", SOFT, "fills the masked scores with -1e4, a finite fill"),
    ("gus", PAD, "refused: batch_padding_mask returned a generator"),
    ("gus", SOFT, "refused: my_masked_softmax returned a Lazy"),
    ("mallory", PAD, "your solution cell defines no batch_padding_mask"),  # it only exec'd a stolen one
    ("mallory", SOFT, ""),
    ("trudy", PAD, "your solution cell defines no batch_padding_mask"),
    ("trudy", SOFT, "still the exercise's stub"),
])
def test_no_mark_that_was_not_earned(graded, student, exercise, words):
    passed, points, message = verdict(graded, student, exercise)
    assert (passed, points) == ("0", "0") and words in message, message


def test_the_sandbox_kept_the_solutions_and_the_gradebook_out_of_reach(graded):
    """In the notebooks' own runs (their feedback): the instructor's notebook (found through the package) and a
    classmate's submission are not in the sandbox, nor is the gradebook (at most a new one, in the scratch /tmp)."""
    feedback = graded["out"] / "feedback"
    mallory, trudy = (feedback / name / "03_masks.html" for name in ("mallory", "trudy"))
    assert "FileNotFoundError" in mallory.read_text() and "notebooks/03_masks.ipynb" in mallory.read_text()
    assert "OperationalError" in mallory.read_text()
    assert "FileNotFoundError" in trudy.read_text() and "alice/03_masks.ipynb" in trudy.read_text()


def test_a_forged_report_earns_nothing(graded):
    """otto's function writes a passing report on every file descriptor and exits: its process's answer channel is
    among them, but what comes back is read strictly (a length, then torch.save's format, read with weights_only),
    and the verdict is the checker's, in the server: 0, with why."""
    passed, points, message = verdict(graded, "otto")
    assert (passed, points) == ("0", "0") and message.startswith(("refused: ", "stopped: ")), message
    # its notebook's own run: the kernel's death, seen in seconds (nbgrader, stuck after it, is stopped)
    assert "[the notebook itself: not graded: the kernel died" in message


def test_a_memory_stop_costs_only_its_own_exercise(graded):
    """max's padding-mask function allocates without end: stopped at the memory grading gives the student's
    process, that exercise gets 0 and says so; the correct masked softmax, in a fresh process, gets its mark."""
    passed, points, message = verdict(graded, "max", PAD)
    assert (passed, points) == ("0", "0") and "went over the memory" in message, message
    assert verdict(graded, "max", SOFT)[:2] == ("1", "1"), verdict(graded, "max", SOFT)


def test_the_gradebook_and_feedback_carry_the_verdicts(graded):
    out = graded["out"]
    nora = (out / "feedback" / "nora" / "03_masks.html").read_text()
    assert "[grading] This check was run again apart from your notebook" in nora and "did not pass" in nora
    give = ("import json, sys\nfrom nbgrader.api import Gradebook\n"
            f"with Gradebook('sqlite:///{out / 'course' / 'gradebook.db'}') as gb:\n"
            "    print(json.dumps({s: gb.find_grade('ex-ch3-padding-mask-check', '03_masks', '03_masks', s).score "
            "for s in ('alice', 'nora')}))\n")
    scores = json.loads(subprocess.run([str(GRADER_PYTHON), "-c", give], check=True, capture_output=True,
                                       text=True, timeout=120).stdout)
    assert scores == {"alice": 1.0, "nora": 0.0}
    assert not any(r["message"] == "graded by hand" for r in graded["rows"].values())  # nobody's manual_score set
    running = [p for p in Path("/proc").glob("[0-9]*") if graded["token"] in command_line(p)]
    assert not running, "trudy's background process outlived its kernel"


def test_every_file_is_in_the_results(graded):
    table, stdout, out = graded["table"], graded["stdout"], graded["out"]
    skipped = {r["file"]: r["message"] for r in table if not r["exercise"]}
    assert set(skipped) == {"frank/03_masks.ipynb", "frank/notes.txt", "gina/", "README.txt"}
    assert skipped["frank/03_masks.ipynb"] == ("not graded: not a notebook: invalid JSON at line 2, column 1 "
                                               "(Expecting value)")
    hank = [r for r in table if r["student"] == "hank"]
    assert {r["notebook"] for r in hank} == {"01_scores"} and "graded as 01_scores" in hank[0]["note"]
    assert {r["passed"] for r in hank} == {"manual"} and len(hank) == 3  # open exercises: to grade by hand
    assert graded["rows"]["erin", PAD]["file"] == "erin/03_masks (1).ipynb"
    assert graded["rows"]["erin", PAD]["note"] == "renamed copy of 03_masks.ipynb, graded as it"
    summary = (out / "summary.txt").read_text()
    assert summary in stdout and "\nnot graded: 4\n" in summary
    assert "of which the notebook's own run failed: 4" in summary  # carol, hugo, otto, max
    assert re.search(r"^\[#{20}\] 18/18  \d+ min \d\d s spent, about 0 min 00 s left  graded ", stdout, re.M)


def test_exports(graded):
    out = graded["out"]
    wide = {r["student"]: r for r in read(out / "grades_wide.csv")}
    assert wide["alice"]["03_masks total"] == wide["alice"]["total"] == "2"
    assert wide["nora"]["total"] == "1" and wide["mallory"]["total"] == wide["trudy"]["total"] == "0"
    assert wide["alice"]["ex-ch3-cross"] == "" and wide["alice"]["to grade by hand"] == "1"
    canvas = list(csv.reader((out / "canvas.csv").open()))
    assert canvas[0] == ["Student", "ID", "SIS User ID", "SIS Login ID", "Section", "01_scores", "03_masks (123)"]
    assert canvas[1][-1] == "4"  # Canvas's Points Possible: 2 checked exercises and 2 open ones
    assert canvas[2][-1] == "2" and canvas[3][-1] == "1" and canvas[4] == ["Zoe Z", "9", "s9", "zoe", "B", "", ""]


def test_a_grade_given_by_hand_is_read_back(graded):
    out, submissions = graded["out"], graded["submissions"]
    give = ("from nbgrader.api import Gradebook\n"
            f"with Gradebook('sqlite:///{out / 'course' / 'gradebook.db'}') as gb:\n"
            "    grade = gb.find_grade('ex-ch3-cross-answer', '03_masks', '03_masks', 'alice')\n"
            "    grade.manual_score = 1\n    gb.db.commit()\n")
    subprocess.run([str(GRADER_PYTHON), "-c", give], check=True, timeout=120)
    again = grade(submissions, out, "--tables-only")
    assert not re.search(r"graded \S+: ", again.stdout), again.stdout
    reread = {(r["student"], r["exercise"]): r for r in read(out / "grades.csv") if r["exercise"]}
    assert reread["alice", "ex-ch3-cross"]["points"] == "1"
    assert reread["alice", "ex-ch3-cross"]["message"] == "graded by hand"
    same = lambda table: {k: v for k, v in table.items() if k != ("alice", "ex-ch3-cross")}  # noqa: E731
    assert same(reread) == same(graded["rows"])


def test_one_job_gives_the_same_rows(graded):
    """A student graded again with --jobs 1: the same rows as in the run with two jobs."""
    again = read(graded["tmp"] / "one-job" / "grades.csv")
    before = [r for r in graded["table"] if r["student"] == ONE_JOB]
    assert again == before and {r["student"] for r in again} == {ONE_JOB}
