"""The process that re-runs a chapter's checked exercises for grading, inside the sandbox (instructor/verdict.py).

It imports nothing of ``instructor/`` (hidden in the sandbox; this one file is bound in read-only) and speaks JSON
lines on its standard input and output, a channel its children cannot reach:

1. ``{"setup": [code, ...], "checks": {label: {"check": code, "forbidden": [dotted name, ...], "rule": text,
   ...}}, "memory": bytes, "outside": {"pid": ..., "mnt": ...}, "folder": path, "scratch": path}`` (the sandbox's
   memory limit; the namespaces of the process that started the server; the folders it made for the server: its
   working folder, and, bare, the one for its temporary files):
   it runs the chapter's own code cells from the instructor's released notebook (errors are kept, not fatal), once.
   Answers ``{"ready": ..., "setup_errors": [...]}``.
2. ``{"student": s, "solutions": [[label, code], ...], "timeout": seconds}``, any number of times. The server
   forks one *learner process* per student (attention_course.boundary), which runs only the *definitions* of the
   student's solution cells (imports, ``def``, ``class``, simple assignments: nothing else of the notebook),
   exercise by exercise, up to the exercise checked; then the server runs the exercise's check cell as released, in
   itself, with the checker taken from the package and a ``boundary.Remote`` for each of the student's names it
   passes: the checker's calls run in the learner process, and what comes back is plain data (or refused, with what
   it was). No student code ever runs in this process. A call that runs over the timeout, goes over the memory given
   to the learner process, or ends it, costs that exercise alone: the next one forks a fresh process. The functions
   the exercise forbids raise during the student's calls (in the learner process). A checker that runs the
   student's function in worker processes (chapter 11) has the learner process launch them; one that builds,
   loads and differentiates the student's layer (chapters 6 and 7) has it do that (a layer a student's factory
   returns stays there, a ``boundary.Layer``); one that runs a Triton kernel on the student's ``@triton.jit``
   functions (chapter 13) has it run the kernel: only plain data comes back, and the comparison, the diagnosis and
   the message are computed here. No learner process holds this process's channel, and this process is not
   dumpable (its /proc/<pid>/fd cannot be opened by its children). Between students, every process below this one
   ends and its scratch folder is emptied (:func:`clean_between_students`): inside the sandbox, once checked, every
   other process of the sandbox and its /tmp; outside it (``--no-sandbox``), nothing that grading did not start.
   Answers ``{"student": s, "verdicts": {label: {"passed": bool, "message": text}}}``.
"""
from __future__ import annotations

import ast
import ctypes
import io
import json
import os
import signal
import sys
import time
import traceback

try:  # run as a script (the sandbox binds cleanup.py beside this file), or imported from instructor/
    from . import cleanup
except ImportError:
    import cleanup

PROTOCOL_IN = PROTOCOL_OUT = DEVNULL = None  # set by main()
MESSAGE_LIMIT = 4000


def send(message: dict) -> None:
    PROTOCOL_OUT.write(json.dumps(message) + "\n")
    PROTOCOL_OUT.flush()


def not_dumpable() -> None:
    """PR_SET_DUMPABLE 0: no other process of this user may open /proc/<this pid>/fd or ptrace it."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except (OSError, AttributeError):
        pass


# ---------------------------------------------------------------- what of a solution cell is kept: definitions
def python(code: str) -> str:
    """A cell's code as Python: IPython's magics (``%pip``) become calls, as in a kernel."""
    from IPython.core.inputtransformer2 import TransformerManager

    return TransformerManager().transform_cell(code)


def definitions(code: str) -> str:
    """The definitions of a solution cell: imports, def, class, and assignments of names to a lambda, a constant, a
    name or an attribute. Calls, loops, prints and demonstrations are left out."""
    tree = ast.parse(python(code))
    simple = (ast.Lambda, ast.Constant, ast.Name, ast.Attribute)
    kept = [node for node in tree.body if isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                                                             ast.AsyncFunctionDef, ast.ClassDef))
            or isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, simple)
            and all(isinstance(t, ast.Name) for t in (node.targets if isinstance(node, ast.Assign) else [node.target]))]
    return ast.unparse(ast.Module(body=kept, type_ignores=[]))


def stub(code: str) -> bool:
    """True when a cell still raises NotImplementedError at its top level (nbgrader's stub)."""
    try:
        body = ast.parse(python(code)).body
    except SyntaxError:
        return False
    return any(isinstance(node, ast.Raise) and "NotImplementedError" in ast.unparse(node) for node in body)


class ForbiddenCall(Exception):
    pass


# ---------------------------------------------------------------- the guard around every call into the student's code
class Guard:
    """Entered around each call into the student's code, in the learner process: forbidden functions raise."""

    def __init__(self, forbidden: list[str], rule: str, namespace: dict):
        self.forbidden, self.rule, self.namespace = [resolve(name) for name in forbidden], rule, namespace
        self.depth, self.used, self.saved = 0, [], []

    def stub(self, name: str, original):
        def forbidden(*args, **kwargs):
            self.used.append(name)
            raise ForbiddenCall(f"{name} may not be used in this exercise: it says \u201c{self.rule}\u201d")
        forbidden.__name__ = getattr(original, "__name__", name.rsplit(".", 1)[-1])
        return forbidden

    def enter(self):
        self.depth += 1
        if self.depth > 1:
            return
        for i, (name, owner, attr, original) in enumerate(self.forbidden):
            stub = self.stub(name, original)
            code = getattr(original, "__code__", None)
            if code is not None and not code.co_freevars:  # a Python function: every alias of it is caught
                key = f"__grading_stub_{i}__"  # one per function: two of them may share a module's globals
                self.saved.append((original.__globals__, key, None))
                self.saved.append((original, "__code__", code))
                original.__globals__[key] = stub  # the stub's code calls it
                original.__code__ = compile_stub(code.co_name, key).__code__
            else:
                self.saved.append((owner, attr, original))
                setattr(owner, attr, stub)
            for key, value in list(self.namespace.items()):  # the notebook's own names for it
                if value is original:
                    self.saved.append((self.namespace, key, value))
                    self.namespace[key] = stub

    def exit(self):
        self.depth -= 1
        if self.depth:
            return
        for owner, attr, original in reversed(self.saved):
            if isinstance(owner, dict):
                if original is None:
                    owner.pop(attr, None)
                else:
                    owner[attr] = original
            else:
                setattr(owner, attr, original)
        self.saved = []

def compile_stub(name: str, key: str):
    scope = {}
    exec(f"def {name}(*args, **kwargs):\n    return {key}(*args, **kwargs)\n", scope)
    return scope[name]


def resolve(dotted: str):
    """'torch.Tensor.softmax' -> (name, owner, attribute, object)."""
    import importlib

    parts = dotted.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            owner = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        for attr in parts[cut:-1]:
            owner = getattr(owner, attr)
        return dotted, owner, parts[-1], getattr(owner, parts[-1])
    raise ValueError(f"cannot find {dotted}")


def explained(message: str, passed: bool, own_error: str | None, label: str, solutions: list, check: dict) -> str:
    """The message of a check that did not pass, with why: the solution cell's definitions failed, it is still the
    stub, or it defines no function of the name the check cell passes."""
    still_stub = any(stub(code) for cell_label, code in solutions if exercise_of(cell_label) == label)
    undefined = not passed and message.startswith("NameError")
    if own_error and not passed:
        message = f"{message} (the solution cell's definitions failed first: {own_error})"
    elif undefined and still_stub:
        message = (f"no answer: the solution cell is still the exercise's stub (# YOUR CODE HERE, raise "
                   f"NotImplementedError()), so it defines nothing ({message})")
    elif undefined and any(f"'{name}'" in message for name in check.get("arguments", [])):
        message = (f"your solution cell defines no {message.split(chr(39))[1]}: grading runs the check again from "
                   f"the definitions of your solution cells alone (their imports, def, class and simple "
                   f"assignments), apart from the rest of the notebook ({message})")
    return message


# ---------------------------------------------------------------- one exercise, over the boundary
def failure(error: BaseException) -> str:
    """The message of an exception that ended a check (the checker's ExerciseError: its text alone)."""
    if type(error).__name__ == "ExerciseError":
        return str(error)
    if isinstance(error, ForbiddenCall) or isinstance(error.__cause__, ForbiddenCall):
        return str(error.__cause__ if isinstance(error.__cause__, ForbiddenCall) else error)
    return f"{type(error).__name__}: {error}"


def learner_process(namespace: dict, checks: dict, memory: int):
    """A fork of this server that runs one submission's code (attention_course.boundary): the exercises' guards
    around its calls, its output nowhere, this server's channel closed; the memory it may allocate is what the
    sandbox's limit leaves over this server's own (counted twice: the fork's shared pages too), with a margin."""
    from attention_course import boundary

    guards = {}

    def guard(label):
        if label not in guards:
            guards[label] = Guard(checks[label].get("forbidden", []), checks[label].get("rule", ""), namespace)
        return guards[label]

    def prepare():
        os.dup2(DEVNULL, 0)
        os.dup2(DEVNULL, 2)
        PROTOCOL_OUT.close()
        sys.stdout = sys.stderr = open(os.devnull, "w")

    own = boundary._statm(os.getpid(), 1)
    budget = max(256 * 2**20, int(0.6 * (memory - 2 * own)))
    return boundary.Learner.fork(namespace, budget, guard=guard, prepare=prepare)


def over_boundary(state: dict, namespace: dict, label: str, solutions: list, check: dict, timeout: float) -> dict:
    """One exercise checked here, in the server, where no student code runs: the check cell as released, with the
    checker from the package and, for each of the student's names it passes, a boundary.Remote that calls the
    function in the submission's learner process (``state["learner"]``, forked when there is none, kept across
    the exercises of one submission) and takes back plain data only."""
    from attention_course import boundary

    if state.get("learner") is None or not state["learner"].alive:
        state["learner"], state["ran"] = learner_process(namespace, state["checks"], state["memory"]), set()
    learner = state["learner"]
    learner.deadline = time.monotonic() + timeout
    learner.used = []
    own_error, passed, message = None, False, ""
    out = io.StringIO()
    try:
        for cell_label, code in solutions:
            if cell_label in state["ran"]:
                continue
            state["ran"].add(cell_label)
            try:
                kept = definitions(code)
            except SyntaxError as error:
                if exercise_of(cell_label) == label and own_error is None:
                    own_error = f"SyntaxError: {error.msg} (line {error.lineno})"
                continue
            error = learner.run(kept, f"<{cell_label}>")
            if error is not None and exercise_of(cell_label) == label and own_error is None:
                own_error = f"{type(error).__name__}: {error}"
        scope = dict(namespace)
        for name in learner.names():
            if name in check.get("arguments", []):
                scope[name] = boundary.Remote(learner, name, context=label)
        scope.update(check["trusted"])  # the checker from the package, whatever the student named
        sys.stdout = out
        try:
            exec(compile(check["check"], f"<{label}-check>", "exec"), scope)
            passed = True
        finally:
            sys.stdout = io.StringIO()
    except boundary.Stopped as stop:
        message = (f"timed out (the check ran over {timeout:g} s)" if str(stop).startswith("timed out")
                   else f"stopped: {stop}")
    except boundary.Refused as refusal:
        message = f"refused: {refusal} (grading runs your function in a process of its own and takes back data only)"
    except BaseException as error:  # noqa: BLE001  (the checker's verdict, or the student's exception rebuilt)
        message = failure(error)
    if learner.busy:  # a call still waited on by a checker's thread that gave up on it (chapter 7's time limit)
        learner.kill()  # the next exercise forks a fresh process
    if passed:
        message = " ".join(out.getvalue().split()) or "passed"
    message = explained(message, passed, own_error, label, solutions, check)
    if learner.used:
        passed, message = False, (f"not accepted: the exercise says \u201c{check['rule']}\u201d, and your code "
                                  f"called {learner.used[0]} during the check")
    return {"passed": passed, "message": " ".join(message.split())[:MESSAGE_LIMIT]}


def clean_between_students(setup: dict) -> None:
    """Between students, what the last one's code left ends, and only that (instructor/cleanup.py): every process
    below this server (a subreaper: what a learner detached came back to it), and the folders the caller made for
    this server (``setup["folder"]``, its working folder, and ``setup["scratch"]``, its TMPDIR when bare). Inside
    bubblewrap, once checked (``own_namespaces``), also every other process of the sandbox's namespace and its /tmp
    and /dev/shm, which are the sandbox's own."""
    cleanup.end_descendants()
    if cleanup.own_namespaces(setup.get("outside")):
        me = os.getpid()
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in (1, me):
                try:
                    os.kill(int(entry), signal.SIGKILL)
                except OSError:
                    pass
        cleanup.reap()
        for folder in ("/tmp", "/dev/shm"):
            cleanup.empty(folder)
    if setup.get("scratch"):
        cleanup.empty(setup["scratch"])
    if setup.get("folder"):  # its working folder, which its starter made (writable in the sandbox too)
        cleanup.empty(setup["folder"], keep=(setup.get("scratch") or "",))


def main() -> None:
    global PROTOCOL_IN, PROTOCOL_OUT, DEVNULL
    os.environ.setdefault("MPLBACKEND", "Agg")
    os.environ["TORCHDYNAMO_DISABLE"] = "1"  # torch.compile in a setup runs eagerly: the checks need no compiling
    PROTOCOL_IN, PROTOCOL_OUT = sys.stdin, os.fdopen(os.dup(1), "w")
    DEVNULL = os.open(os.devnull, os.O_RDWR)
    os.dup2(DEVNULL, 1)  # the setup's prints must not reach the channel
    sys.stdout = io.StringIO()
    not_dumpable()
    cleanup.subreaper()  # what a learner's code detaches stays below this process, where the clean-up finds it
    setup = json.loads(PROTOCOL_IN.readline())
    import torch

    torch.set_num_threads(1)
    namespace = {"__name__": "__main__"}
    errors = []
    for index, code in enumerate(setup["setup"]):
        try:
            exec(compile(python(code), f"<setup cell {index}>", "exec"), namespace)
        except BaseException as error:  # noqa: BLE001  (a cell that needs a solution: kept, not fatal)
            errors.append(f"cell {index}: {type(error).__name__}: {error}")
    sys.stdout = io.StringIO()
    checks = setup["checks"]
    for check in checks.values():
        module = __import__(check["module"], fromlist=["_"])
        check["trusted"] = {name: getattr(module, name) for name in check["checkers"]}
    send({"ready": True, "setup_errors": errors})
    for line in PROTOCOL_IN:
        request = json.loads(line)
        solutions = [tuple(pair) for pair in request["solutions"]]
        verdicts, state = {}, {"checks": checks, "memory": setup["memory"]}
        for label, check in checks.items():
            upto = [pair for pair in solutions if labels_before(pair[0], label, list(checks))]
            verdicts[label] = over_boundary(state, namespace, label, upto, check, request["timeout"])
        if state.get("learner") is not None:
            state["learner"].close()
        clean_between_students(setup)
        send({"student": request["student"], "verdicts": verdicts})


def exercise_of(cell_label: str) -> str:
    """The exercise a solution cell belongs to: its grade_id, less nbgrader's "-2", "-3" of a second cell."""
    base, _, number = cell_label.rpartition("-")
    return base if number.isdigit() and base else cell_label


def labels_before(cell_label: str, label: str, order: list[str]) -> bool:
    """A solution cell of this exercise or of an exercise before it (any exercise not checked counts as before)."""
    base = exercise_of(cell_label)
    return base not in order or order.index(base) <= order.index(label)


if __name__ == "__main__":
    try:
        main()
    except Exception:  # noqa: BLE001
        sys.stderr.write(traceback.format_exc())
        raise
