"""Verdicts a submission cannot write (instructor/verdict.py, instructor/check_server.py): in every chapter the
instructor's solutions pass when their checks are re-run apart from the notebook and the released stubs do not; a
forbidden function is unavailable during the student's calls only; what a solution cell keeps; and the rules are
the exercises' own words. The server runs in the bubblewrap sandbox, as `make grade` runs it."""
import json
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from instructor import check_server, sandbox, verdict  # noqa: E402
from instructor.exercises import NOTEBOOKS, chapters, exercises, load, nbgrader_source, source  # noqa: E402
from test_boundary import MISBEHAVING  # noqa: E402

RELEASE = ROOT / "_build" / ".student-course" / "release"
# Chapter 3 is graded whole in tests/test_grading_class.py (correct work in two styles passes, the stubs do not, through
# the same server): not again here.
CHECKED = [path for path in chapters() if any(e.checked for e in exercises(path)) and path.stem != "03_masks"]
needs_release = pytest.mark.skipif(not RELEASE.exists(), reason="run `make student` first (the released notebooks)")
needs_bwrap = pytest.mark.needs("bwrap")  # tests/conftest.py skips it, and says so, where bwrap is missing


@pytest.fixture(scope="module")
def server():
    """chapter -> its check server, started when first asked for and shared by this file's tests, as grading shares
    one per chapter (each check runs in a fresh child of it)."""
    started = {}

    def get(chapter: str) -> verdict.Server:
        if chapter not in started:
            started[chapter] = verdict.Server(verdict.plan(chapter, RELEASE / chapter / f"{chapter}.ipynb"), [],
                                              4 * 2**30)
            started[chapter].start()
        return started[chapter]

    yield get
    for each in started.values():
        each.stop()


@needs_release
@needs_bwrap
@pytest.mark.parametrize("path", CHECKED, ids=lambda p: p.stem)
def test_solutions_pass_and_stubs_do_not_when_the_checks_are_re_run(server, path):
    chapter = server(path.stem)
    good = chapter.check("instructor", verdict.solutions(path), 60)
    stubs = chapter.check("stubs", verdict.solutions(RELEASE / path.stem / path.name), 60)
    labels = [e.label for e in exercises(path) if e.checked]
    assert list(good) == list(stubs) == labels
    for label in labels:
        assert good[label]["passed"] is True and good[label]["message"].startswith("Correct"), good[label]
        assert stubs[label]["passed"] is False, stubs[label]
        assert re.search(r"stub|NotImplementedError", stubs[label]["message"]), stubs[label]


@needs_release
@needs_bwrap
def test_a_kernel_piece_s_mistake_is_named_over_the_boundary(server):
    """Chapter 13's answers are @triton.jit functions, which no Remote can take into a kernel: the kernel runs in
    the learner process and the server names the mistake from the tensors (and tile counts) that come back, the
    exercises before and after it passing in the same learner process."""
    cells = dict(verdict.solutions(NOTEBOOKS / "13_kernels.ipynb"))
    assert cells["ex-ch13-mask"].count("(i + 1) * BLOCK_M") == 1
    cells["ex-ch13-mask"] = cells["ex-ch13-mask"].replace("(i + 1) * BLOCK_M", "(i + 2) * BLOCK_M")
    found = server("13_kernels").check("past the diagonal", list(cells.items()), 60)
    assert found["ex-ch13-mask"]["passed"] is False, found
    assert "your key_end and visible load ONE TILE TOO MANY" in found["ex-ch13-mask"]["message"], found
    assert found["ex-ch13-step"]["passed"] is True and found["ex-ch13-backward"]["passed"] is True, found


@needs_release
def test_a_chapter_of_open_exercises_alone_has_nothing_to_check():
    """Chapter 1's exercises are all graded by hand: its plan holds no setup and no check, and grading starts no server
    for it (tests/test_grading_class.py grades such a notebook)."""
    assert not any(e.checked for e in exercises(ROOT / "notebooks" / "01_scores.ipynb"))
    found = verdict.plan("01_scores", RELEASE / "01_scores" / "01_scores.ipynb")
    assert (found.setup, found.checks, found.points) == ([], {}, {})


SOFTMAX = "def my_softmax(scores, dim=-1):\n    {body}\n"


@needs_release
@needs_bwrap
def test_a_forbidden_function_is_unavailable_during_the_students_calls_only(server):
    """Chapter 2 forbids torch.softmax: reached by any name (the function, an alias, the method, F.softmax) it raises
    during the student's call and the verdict quotes the rule; the checker's own use of it still works."""
    chapter = server("02_softmax")
    attention = ("def attention(q, k, v):\n"
                 "    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)\n"
                 "    return w @ v, w\n")
    answers = {
        "exp": "shifted = scores - scores.amax(dim, keepdim=True)\n    e = shifted.exp()\n"
               "    return e / e.sum(dim, keepdim=True)",
        "function": "return torch.softmax(scores, dim)",
        "method": "return scores.softmax(dim)",
        "functional": "return F.softmax(scores, dim=dim)",
        "special": "return torch.special.softmax(scores, dim)",
        "caught": "try:\n        return torch.softmax(scores, dim)\n    except Exception:\n"
                  "        e = (scores - scores.amax(dim, keepdim=True)).exp()\n        return e / e.sum(dim, keepdim=True)",
    }
    found = {name: chapter.check(name, [("ex-ch2-softmax", SOFTMAX.format(body=body)),
                                        ("ex-ch2-attention", attention)], 30) for name, body in answers.items()}
    alias = chapter.check("alias", [("ex-ch2-softmax", "my_softmax = torch.softmax\n"),
                                    ("ex-ch2-attention", attention)], 30)
    assert found["exp"]["ex-ch2-softmax"]["passed"] is True
    for name, result in [*found.items(), ("alias", alias)]:
        assert result["ex-ch2-attention"]["passed"] is True, (name, result)  # torch.softmax is allowed there
        if name != "exp":
            assert result["ex-ch2-softmax"]["passed"] is False, name
            assert "without calling `torch.softmax`" in result["ex-ch2-softmax"]["message"], name


def test_each_forbidden_function_of_one_module_names_itself():
    """Two forbidden functions from the same module (their stubs live in its globals, one name each)."""
    import torch

    import attention_course.masks as masks

    guard = check_server.Guard(["attention_course.masks.ignore_to_allow", "attention_course.masks.allow_to_ignore"],
                               "*without* the package's mask converters", {})
    mask = torch.tensor([[True, False]])
    guard.enter()
    try:
        for fn, name in ((masks.ignore_to_allow, "ignore_to_allow"), (masks.allow_to_ignore, "allow_to_ignore")):
            with pytest.raises(check_server.ForbiddenCall, match=f"^attention_course.masks.{name} may not be used"):
                fn(mask)
    finally:
        guard.exit()
    assert masks.ignore_to_allow(mask).tolist() == [[False, True]] and guard.used == [
        "attention_course.masks.ignore_to_allow", "attention_course.masks.allow_to_ignore"]


def test_only_definitions_are_kept():
    cell = ("import torch\nfrom math import sqrt\nSCALE = 2\nalias = torch.softmax\nf = lambda x: x\n"
            "def g(x):\n    return x\nclass H:\n    pass\nprint('hi')\nx = g(3)\nfor i in range(3):\n    pass\n"
            "check_softmax = print\n%time g(1)\n")
    kept = check_server.definitions(cell)
    assert [line for line in kept.splitlines() if line and not line.startswith(" ")] == [
        "import torch", "from math import sqrt", "SCALE = 2", "alias = torch.softmax", "f = lambda x: x",
        "def g(x):", "class H:", "check_softmax = print"]  # the checker is rebound from the package afterwards


@pytest.mark.parametrize("code, names", [
    ("def f(x):\n    return x.softmax(-1)\n", []),
    ("import os\ndef f(x):\n    os._exit(0)\n", ["os", "_exit"]),
    ("def f(x):\n    import attention_course.exercises.ch03 as c\n    return x\n", ["exercises"]),
    ("def f(x):\n    return open('/proc/self/fd/3')\n", ["open", "/proc"]),
    ("def f(x):\n    return f.__globals__\n", ["__globals__"]),
    ("def f(x):\n    get_ipython()\n", ["get_ipython"]),
])
def test_names_an_attack_needs_are_flagged(code, names):
    assert verdict.suspicious(code) == names


WITHOUT = re.compile(r"without\*?\s+(?:calling\s+|using\s+)?(?:the package's\s+)?`([\w.]+)`")


def test_every_rule_is_quoted_from_its_exercise_and_every_forbidding_exercise_has_one():
    texts = {}
    for path in chapters():
        for cell in load(path)["cells"]:
            for match in re.finditer(r"```\{exercise\}[^\n]*\n:label: (\S+)\n(.*?)```", source(cell), re.S):
                texts[match[1]] = " ".join(match[2].split())
    forbidding = {label for label, text in texts.items() if WITHOUT.search(text)}
    checked = {e.label for path in chapters() for e in exercises(path) if e.checked}
    assert forbidding & checked == set(verdict.RULES), "an exercise that forbids a function needs a rule in RULES"
    for label, (names, rule) in verdict.RULES.items():
        assert " ".join(rule.split()) in texts[label], label
        assert all(name.split(".")[-1] in rule or name.endswith("softmax") for name in names), label


# ---------------------------------------------------------------- the boundary (attention_course/boundary.py)
LEARNER = '''
import sys, types
class Sub(torch.Tensor):
    pass
class Liar:
    __class__ = property(lambda self: torch.Tensor)
    def __eq__(self, other):
        return True
def double(x):
    return 2 * x
def sub():
    return torch.ones(2).as_subclass(Sub)
def liar():
    return Liar()
def gen():
    yield torch.ones(2)
def lazy():
    return lambda: torch.ones(2)
def key():
    raise KeyError("k")
def stub():
    raise NotImplementedError()
def frame():
    return sorted(sys._getframe(1).f_locals)
''' + MISBEHAVING


@pytest.fixture
def learner():
    import torch

    from attention_course import boundary

    process = boundary.Learner.fork({"torch": torch}, 256 * 2**20)
    assert process.run(LEARNER, "<learner>") is None
    yield process
    process.close()


def test_the_boundary_takes_back_plain_data_and_refuses_the_rest_by_name(learner):
    import torch

    from attention_course.boundary import Refused, Remote

    assert torch.equal(Remote(learner, "double")(torch.ones(2)), torch.full((2,), 2.0))
    for name, words in [("sub", "returned a Sub, a subclass of torch.Tensor"), ("liar", "returned a Liar: "),
                        ("gen", "returned a generator"), ("lazy", "returned a function, something to call")]:
        with pytest.raises(Refused, match=words):
            Remote(learner, name)()
    assert "double" in learner.names() and "torch" not in learner.names()
    assert Remote(learner, "double").apply("attention_course.boundary:describe").startswith("a function")
    with pytest.raises(ValueError, match="takes a function of attention_course"):
        Remote(learner, "double").apply("os:system")


def test_the_learners_exceptions_come_back_as_themselves(learner):
    from attention_course.boundary import Remote

    with pytest.raises(KeyError) as caught:
        Remote(learner, "key")()
    assert str(caught.value) == "'k'"
    with pytest.raises(NotImplementedError) as caught:
        Remote(learner, "stub")()
    assert type(caught.value) is NotImplementedError and str(caught.value) == ""


def test_no_checker_is_on_the_learners_stack_and_a_layer_it_fills_comes_back(learner):
    import torch

    from attention_course.boundary import Remote

    secret = "want"  # noqa: F841  (a local of the caller: not in the learner process)
    assert "secret" not in Remote(learner, "frame")()
    layer = torch.nn.Linear(2, 2)
    Remote(learner, "fill")(layer)
    assert torch.equal(layer.weight.detach(), torch.full((2, 2), 3.0)) and layer.weight.requires_grad


@pytest.mark.parametrize("name, words", [("forever", "timed out"),
                                         ("hog", r"went over the memory .*stopped there: keep fewer or smaller")])
def test_a_stopped_call_stops_its_process_only(learner, name, words):
    import time

    from attention_course.boundary import Stopped

    learner.deadline = time.monotonic() + (3 if name == "forever" else 60)  # the hog is stopped by memory alone
    with pytest.raises(Stopped, match=words):
        learner.call(name, (), {})
    assert not learner.alive


def test_the_strict_reader_refuses_any_object_but_plain_data():
    import collections

    from attention_course import boundary

    class Evil:
        def __reduce__(self):
            return (print, ("ran in the checker",))
    for value in (Evil(), collections.OrderedDict(a=1), {"kind": "ok", "value": [1, {2: Evil()}]}):
        with pytest.raises(boundary.Refused):
            boundary.decode(boundary.encode(value))
    assert boundary.decode(boundary.encode({"kind": "ok", "value": (1, "a", None)}))["value"] == (1, "a", None)


def test_no_check_runs_beside_the_students_code():
    """Every checker runs in the server over the boundary, the layers of chapters 6 and 7 too: no child that runs a
    check beside the student's code is left, nor the integrity check it needed."""
    assert not hasattr(verdict, "IN_CHILD")
    assert not any(hasattr(check_server, name) for name in ("in_child", "run_check", "snapshot", "guard_names"))


# ---------------------------------------------------------------- chapter 7's layers, over the boundary
@pytest.fixture(scope="module")
def clinic(server, tmp_path_factory):
    """Chapter 7's check server: the one the tests above share where nbgrader released the chapter (`make student`);
    else one planned from the notebook nbgrader releases from (instructor.exercises.nbgrader_source: the setup and
    check cells of the release), so that these tests need no `make student`."""
    if (RELEASE / "07_bug_clinic").exists():
        yield server("07_bug_clinic")
        return
    path = tmp_path_factory.mktemp("source") / "07_bug_clinic.ipynb"
    path.write_text(json.dumps(nbgrader_source(NOTEBOOKS / path.name)))
    own = verdict.Server(verdict.plan("07_bug_clinic", path), [], 4 * 2**30)
    own.start()
    yield own
    own.stop()


# A wrong merge (no transpose) that made itself pass where the check ran beside it: at each call its layer undoes
# the patches of the call before and makes the checker's comparisons agree; in float16 it merges right and patches
# nothing, so after the check everything is as it was.
PATCHING = """
import attention_course.exercises.diagnose as grader6
import attention_course.probe as grader7
class FixedMerge(BuggyMerge):
    SAVED = []
    def merge(self, t):
        B, h, L, d = t.shape
        if t.dtype == torch.float16:
            return t.transpose(1, 2).reshape(B, L, h * d)
        return t.reshape(B, L, h * d)
    def forward(self, *args, **kwargs):
        while self.SAVED:
            setattr(*self.SAVED.pop())
        if args[0].dtype != torch.float16:
            for module, name, fake in ((grader6, "same", lambda *a, **k: True),
                                       (grader6, "agree", lambda *a, **k: True),
                                       (grader7, "same", lambda *a, **k: True)):
                self.SAVED.append((module, name, getattr(module, name)))
                setattr(module, name, fake)
        return super().forward(*args, **kwargs)
"""


@needs_bwrap
def test_a_layer_that_patches_the_checker_while_it_is_called_gets_the_checkers_diagnosis(clinic):
    found = clinic.check("patching", [("ex-ch7-merge", PATCHING)], 60)["ex-ch7-merge"]
    assert found["passed"] is False, found
    # right in float16 alone, it agrees with no mistake of the catalogue on every case: described, not named
    assert found["message"].startswith("average_attn_weights=False, heads of size 1: your layer's output differs at 32 "
                                       "of 32 entries"), found


@needs_bwrap
@pytest.mark.parametrize("code, words", [
    ("class Agreeable(torch.Tensor):\n"  # says it equals anything
     "    @classmethod\n"
     "    def __torch_function__(cls, func, types, args=(), kwargs=None):\n"
     "        out = super().__torch_function__(func, types, args, kwargs or {})\n"
     "        return True if func.__name__ in ('equal', 'allclose') else out\n"
     "class FixedMerge(BuggyMerge):\n"
     "    def forward(self, *args, **kwargs):\n"
     "        out, weights = super().forward(*args, **kwargs)\n"
     "        return torch.zeros_like(out).as_subclass(Agreeable), weights\n",
     "returned an Agreeable, a subclass of torch.Tensor"),
    ("class FixedMerge(BuggyMerge):\n"
     "    def forward(self, *args, **kwargs):\n"
     "        yield super().forward(*args, **kwargs)\n",
     "returned a generator (the function yields: return the value instead)"),
], ids=["tensor subclass", "generator"])
def test_a_layer_that_returns_no_plain_data_is_refused_by_name(clinic, code, words):
    found = clinic.check("not data", [("ex-ch7-merge", code)], 60)["ex-ch7-merge"]
    assert found["passed"] is False, found
    assert found["message"].startswith("one token, one head: your layer " + words), found
