"""Verdicts a submission cannot write: each checked exercise re-run apart from the student's notebook.

nbgrader runs a chapter's checks in the student's own kernel, after the student's own cells, so what those cells did
(rebinding the checker's name, an IPython input transformer, a patched execution result, ...) decides the mark. Here
the mark comes from elsewhere: a server per chapter (instructor/check_server.py) runs in the same bubblewrap sandbox
as the notebooks and starts from the chapter's code cells as the instructor released them. For each submission it
forks one learner process (attention_course/boundary.py) that runs only the definitions of the student's solution
cells, exercise by exercise; the server runs each check cell as released, with the checker from the package, in
itself, and the checker calls the student's functions in the learner process: what comes back is plain data
(torch.save there, torch.load(weights_only=True) here), so the comparison, the diagnosis and the message are
computed where no student code ever ran. A call that runs over its time, goes over its memory, or kills its process
costs that exercise alone: the next one gets a fresh process. The functions an exercise forbids (:data:`RULES`)
raise during the student's calls. Every checked exercise is checked so: chapter 11's checkers have the learner
process launch their worker processes, chapters 6 and 7's have it build, load, call and differentiate the student's
layer (attention_course.probe.probe_layer), chapter 13's have it run their Triton kernel on the student's
``@triton.jit`` pieces (attention_course.exercises.ch13.in_learner), and judge what comes back. Verdicts come back
on the server's standard output, which no child holds. The notebook itself still runs whole under nbgrader, for the
feedback.

What stays possible is named in the guide's threat model (book/instructors.md); :func:`suspicious` flags the names
code attacking the grader needs, for review by hand.
"""
from __future__ import annotations

import ast
import json
import os
import select
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from . import check_server, cleanup, sandbox
from .exercises import ROOT, Exercise, exercises, load, nbgrader, source

SERVER = Path(__file__).resolve().parent / "check_server.py"
CLEANUP = SERVER.with_name("cleanup.py")  # imported by the server: bound in beside it
PYTHON = ROOT / ".venv" / "bin" / "python"

# Exercises that forbid a function: the names made unavailable during the check, and the rule as the exercise
# states it (tests/test_grading.py asserts that each rule is quoted from its exercise, and that every exercise
# that says "without" a `name` has a rule here).
RULES = {
    "ex-ch2-softmax": (["torch.softmax", "torch.nn.functional.softmax", "torch.Tensor.softmax",
                        "torch.special.softmax"],
                       "Write `my_softmax(scores, dim=-1)` without calling `torch.softmax`."),
    "ex-ch3-padding-mask": (["attention_course.masks.padding_mask"],
                            "*without* the package's `padding_mask`"),
    "ex-ch10-repeat-kv": (["attention_course.decoding.repeat_kv",
                           "transformers.models.llama.modeling_llama.repeat_kv"],
                          "*without* the package's `repeat_kv` (or `transformers`' own)"),
    "ex-ch10-rope": (["attention_course.rope.apply_rope", "attention_course.rope.rope_cos_sin",
                      "attention_course.rope.rotate_half",
                      "transformers.models.llama.modeling_llama.apply_rotary_pos_emb",
                      "transformers.models.llama.modeling_llama.rotate_half"],
                     "*without* the package's `apply_rope`, `rope_cos_sin` or `rotate_half` (nor `transformers`' "
                     "`apply_rotary_pos_emb`)"),
    "ex-ch10-window-mask": (["attention_course.decoding.decode_mask"], "*without* the package's `decode_mask`"),
    "ex-ch11-split-in-proj": (["attention_course.distributed.split_in_proj_by_heads"],
                              "*without* the package's `split_in_proj_by_heads`"),
    "ex-ch12-block-mask": (["attention_course.serving.block_diagonal_mask",
                            "attention_course.serving.packing.block_diagonal_mask"],
                           "*without* the package's `block_diagonal_mask`"),
    "ex-ch12-gather": (["attention_course.serving.gather_blocks", "attention_course.serving.paged.gather_blocks"],
                       "*without* the package's `gather_blocks`"),
}

# Names that code attacking the grading process needs and an attention exercise does not: a solution that uses one
# and passes is held for review by hand rather than given the points.
SUSPICIOUS = {"os", "sys", "ctypes", "gc", "inspect", "builtins", "importlib", "subprocess", "signal", "threading",
              "multiprocessing", "atexit", "IPython", "get_ipython", "__import__", "exec", "eval", "compile",
              "globals", "setattr", "delattr", "__globals__", "__code__", "__dict__", "__builtins__", "__subclasses__",
              "_exit", "f_back", "f_globals", "sys.modules", "open", "exercises", "check_server"}


def suspicious(code: str) -> list[str]:
    """The names of :data:`SUSPICIOUS` a solution cell uses, in order of appearance."""
    try:
        tree = ast.parse(code)
    except SyntaxError:
        return []
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            names = [node.id]
        elif isinstance(node, ast.Attribute):
            names = [node.attr]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "", *(alias.name for alias in node.names)]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and "/proc" in node.value:
            names = ["/proc"]
        else:
            continue
        for part in (p for name in names for p in name.split(".")):
            if (part in SUSPICIOUS or part == "/proc") and part not in found:
                found.append(part)
    return found


@dataclass
class Plan:
    """What the server of one chapter needs: its setup cells and, per checked exercise, its check."""
    chapter: str
    setup: list[str]
    checks: dict[str, dict] = field(default_factory=dict)
    points: dict[str, float] = field(default_factory=dict)


def plan(chapter: str, release: Path) -> Plan:
    """The plan of ``chapter`` from the notebook nbgrader released (``release``: its path). A chapter whose exercises
    are all open (graded by hand, chapter 1's) has nothing to check: no setup, no server."""
    nb = load(release)
    checked = [e for e in exercises(ROOT / "notebooks" / f"{chapter}.ipynb") if e.checked]
    if not checked:
        return Plan(chapter, [])
    grade_ids = {nbgrader(cell).get("grade_id"): index for index, cell in enumerate(nb["cells"])}
    last = max(grade_ids[f"{e.label}-check"] for e in checked)
    setup = [source(cell) for index, cell in enumerate(nb["cells"][:last])
             if cell["cell_type"] == "code" and not nbgrader(cell).get("solution") and not nbgrader(cell).get("grade")]
    result = Plan(chapter, setup)
    module = f"attention_course.exercises.ch{int(chapter[:2]):02d}"
    for exercise in checked:
        code = source(nb["cells"][grade_ids[f"{exercise.label}-check"]])
        calls = [node.func.id for node in ast.walk(ast.parse(code))
                 if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id.startswith("check")]
        forbidden, rule = RULES.get(exercise.label, ([], ""))
        arguments = [node.id for node in ast.walk(ast.parse(code)) if isinstance(node, ast.Name)
                     and node.id not in calls]
        result.checks[exercise.label] = {"check": code, "module": module, "checkers": calls, "arguments": arguments,
                                         "forbidden": forbidden, "rule": rule}
        result.points[exercise.label] = exercise.points
    return result


def solutions(path: Path) -> list[tuple[str, str]]:
    """The student's solution cells of a submitted notebook, (grade_id, code), in order."""
    return [(nbgrader(cell)["grade_id"], source(cell)) for cell in load(path)["cells"]
            if cell["cell_type"] == "code" and nbgrader(cell).get("solution") and nbgrader(cell).get("grade_id")]


class Server:
    """One chapter's check server in its sandbox; restarted after it is killed (memory, time)."""

    def __init__(self, chapter_plan: Plan, hide: list[Path], memory: int, sandboxed: bool = True,
                 seconds: float = 24 * 3600):
        self.plan, self.hide, self.memory, self.sandboxed, self.seconds = chapter_plan, hide, memory, sandboxed, seconds
        self.process = None
        self.setup_errors: list[str] = []

    def start(self) -> None:
        """Start the server, in the sandbox or bare. Bare, its temporary files go to a folder of its own
        (``<folder>/tmp``, TMPDIR), the one it empties between students; in the sandbox, the sandbox's /tmp."""
        self.folder = Path(tempfile.mkdtemp(prefix="checks-"))
        argv = [sys.executable, str(sandbox.__file__), "--seconds", str(self.seconds), "--memory", str(self.memory),
                "--folder", str(self.folder)]
        env, scratch = None, None
        if self.sandboxed:
            read, path = sandbox.environment(PYTHON)
            argv += [f"--read={p}" for p in [*read, SERVER, CLEANUP]] + [f"--hide={Path(p).resolve()}"
                                                                          for p in [ROOT, *self.hide]]
            argv += [f"--env=PYTHONPATH={path}"] if path else []
        else:
            scratch = self.folder / "tmp"
            scratch.mkdir()
            env = {**os.environ, "TMPDIR": str(scratch)}
            argv += ["--bare"]
        argv += ["--", str(PYTHON), str(SERVER)]
        self.log = open(self.folder.with_suffix(".log"), "w+")
        self.process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
                                        cwd=self.folder, text=True, bufsize=1, env=env)
        setup = {"setup": self.plan.setup, "checks": self.plan.checks, "memory": self.memory,
                 "outside": cleanup.namespaces(), "folder": str(self.folder),
                 "scratch": str(scratch) if scratch else None}
        self.process.stdin.write(json.dumps(setup) + "\n")
        self.process.stdin.flush()
        ready = self.receive(600)
        if not ready or not ready.get("ready"):
            why = self.why()
            self.stop()
            raise RuntimeError(f"the check server of {self.plan.chapter} did not start: {why}")
        self.setup_errors = ready["setup_errors"]

    def receive(self, timeout: float) -> dict | None:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        return json.loads(line) if line.strip() else None

    def why(self) -> str:
        verdict = sandbox.verdict_of(self.folder)
        if verdict.exists():
            return f"the sandbox was stopped: it {verdict.read_text()}"
        self.log.seek(0)
        lines = [line for line in self.log.read().splitlines() if line.strip()]
        return lines[-1] if lines else f"it ended (exit status {self.process.poll()})"

    def check(self, student: str, cells: list[tuple[str, str]], timeout: float) -> dict[str, dict]:
        """{label: {"passed", "message"}} for every checked exercise of the chapter."""
        if self.process is None or self.process.poll() is not None:
            self.stop()  # a server that died: its folder and log go before the next one's
            self.start()
        request = {"student": student, "solutions": cells, "timeout": timeout}
        try:
            self.process.stdin.write(json.dumps(request) + "\n")
            self.process.stdin.flush()
            answer = self.receive(timeout * len(self.plan.checks) + 60)
        except (BrokenPipeError, ValueError):
            answer = None
        if answer is None or answer.get("student") != student:
            why = self.why()
            self.stop()
            return {label: {"passed": False, "message": f"no verdict: {why}"} for label in self.plan.checks}
        return answer["verdicts"]

    def stop(self) -> None:
        """Stops the server, and removes its folder and log (a class graded left one of each per chapter in /tmp)."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
        self.process = None
        if getattr(self, "folder", None) is not None:
            if getattr(self, "log", None) is not None:
                self.log.close()
            self.folder.with_suffix(".log").unlink(missing_ok=True)
            shutil.rmtree(self.folder, ignore_errors=True)
            self.folder = None


def verdicts(server: Server, student: str, path: Path, timeout: float) -> dict[str, dict]:
    """The verdict of each checked exercise of one submission, with a flag for review where a passing solution uses
    names that only an attack on the grader would need."""
    cells = solutions(path)
    found = server.check(student, cells, timeout)
    for label, verdict in found.items():
        names = [name for cell_label, code in cells if check_server.exercise_of(cell_label) == label
                 for name in suspicious(code)]
        if verdict["passed"] and names:
            verdict["passed"] = "review"
            verdict["message"] = (f"held for review by hand: the check passed, but the solution uses "
                                  f"{', '.join(dict.fromkeys(names))}, which an attention exercise does not need and "
                                  f"an attempt on the grader would; read it, then give the points in formgrader or "
                                  f"not ({verdict['message']})")
    return found


__all__ = ["Exercise", "Plan", "RULES", "Server", "plan", "solutions", "suspicious", "verdicts"]
