"""How every checker reaches its verdict.

A checker is an :class:`Exercise`: its **cases** (inputs over every size the statement leaves free, with the edge
cases it allows), a **reference** (the right answer) and a **catalogue of mistakes**, each the reference transformed
(two indices swapped, a shift by one, a term dropped, an order reversed, another dtype) with the words that tell the
learner what it does. :func:`check` runs the answer on every case, on a fresh copy of the inputs, and then:

1. every case right and every input untouched: "Correct: ...";
2. a mistake of the catalogue that **agrees with the answer on every case** (the same values, the same exception,
   the same inputs changed), and only one: the message names it;
3. otherwise the message **describes what the answer did** on the smallest case where it is wrong: the exception and
   its likeliest cause there, the inputs it changed, its type, shape or dtype, or the pattern of the entries that
   differ (inverted, transposed, a whole row, the diagonal, a constant offset or factor, the right values in
   another order, a region the case marks such as a block boundary).

``tests/test_catalogues.py`` holds every catalogue to this: each mistake rejected and named on its own, each pair
of mistakes told apart by some case.
"""
from __future__ import annotations

import copy
import inspect
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import ExerciseError, classic_hint, passed, raised, same_error


@dataclass
class Case:
    """One call of the answer: ``name`` is how a message shows it; ``marks`` names regions of the output (a bool
    tensor of its shape each) that a difference may fill, e.g. ``{"the first token of each block": ...}``."""
    name: str
    args: tuple
    marks: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(a.numel() if isinstance(a, torch.Tensor) else len(a) if isinstance(a, (list, tuple)) else 1
                   for a in self.args)


@dataclass
class Mistake:
    """A classic mistake: ``answer`` is the reference transformed (same signature); ``says`` completes the sentence
    "your <answer> ..." with what it does and the fix."""
    name: str
    says: str
    answer: Callable


@dataclass
class Outcome:
    value: Any = None
    error: Exception | None = None
    changed: tuple = ()  # the names of the inputs the call modified


@dataclass(eq=False)
class Exercise:
    """``what``: the answer in messages ("your gather"); ``passed``: what a right answer got right; ``run(answer,
    *args)``: how an answer is called (a class is built, a function called); ``parts``: the names of the items of a
    returned tuple; ``hints``: (regular expression, likeliest cause) for exceptions this exercise invites."""
    what: str
    reference: Callable
    cases: list[Case]
    mistakes: list[Mistake]
    passed: str
    run: Callable = lambda answer, *args: answer(*args)  # noqa: E731
    atol: float = 1e-10
    parts: tuple = ()
    hints: tuple = ()
    _memo: dict = field(default_factory=dict, repr=False)

    def __post_init__(self):
        self.cases = sorted(self.cases, key=lambda c: c.size)  # the smallest case that shows a mistake is shown
        names = [m.name for m in self.mistakes]
        assert len(names) == len(set(names)), f"two mistakes share a name: {names}"

    @property
    def arguments(self) -> list[str]:
        return list(inspect.signature(self.reference).parameters)

    def outcome(self, answer, case: Case) -> Outcome:
        args = copy.deepcopy(case.args)
        try:
            value = self.run(answer, *args)
        except ExerciseError:
            raise
        except Exception as err:  # noqa: BLE001 - the learner's code may raise anything; it is reported, not hidden
            return Outcome(error=err)
        names = self.arguments + [f"argument {i + 1}" for i in range(len(self.arguments), len(args))]
        changed = tuple(n for n, before, after in zip(names, case.args, args) if not same(before, after, 0.0))
        return Outcome(_detach(value), None, changed)

    def expected(self, key, answer, case: Case) -> Outcome:
        """The outcome of the reference or of a mistake on a case: computed once."""
        if (key, id(case)) not in self._memo:
            self._memo[key, id(case)] = self.outcome(answer, case)
        return self._memo[key, id(case)]


def check(exercise: Exercise, answer) -> None:
    """Print "Correct: ..." or raise :class:`ExerciseError` that names or describes the mistake."""
    got = [exercise.outcome(answer, case) for case in exercise.cases]
    for case, o in zip(exercise.cases, got):
        if type(o.error) is NotImplementedError and not str(o.error):
            raise raised(o.error, exercise.what)  # the student edition's stub
    want = [exercise.expected("reference", exercise.reference, case) for case in exercise.cases]
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if not agree(g, w, exercise.atol)]
    if not wrong:
        return passed(exercise.passed)
    case = exercise.cases[wrong[0]]
    named = naming(exercise, got)
    if len(named) == 1:
        raise ExerciseError(f"{case.name}: {exercise.what} {named[0].says}")
    raise ExerciseError(f"{case.name}: {describe(exercise, case, got[wrong[0]], want[wrong[0]])}")


def naming(exercise: Exercise, got: list[Outcome]) -> list[Mistake]:
    """The mistakes of the catalogue that agree with the answer's outcomes on every case."""
    return [m for m in exercise.mistakes
            if all(agree(g, exercise.expected(m.name, m.answer, c), exercise.atol) for g, c in zip(got, exercise.cases))]


def agree(a: Outcome, b: Outcome, atol: float) -> bool:
    if a.error is not None or b.error is not None:
        return a.error is not None and b.error is not None and same_error(a.error, b.error)
    return a.changed == b.changed and same(a.value, b.value, atol)


def tolerance(a: torch.Tensor, b: torch.Tensor, atol: float) -> float:
    """``atol`` in float64; a less precise dtype on either side is compared at its own precision."""
    eps = max(torch.finfo(t.dtype).eps if t.is_floating_point() else 0.0 for t in (a, b))
    return max(atol, 64 * eps) if eps > torch.finfo(torch.float64).eps else atol


def same(a, b, atol: float) -> bool:
    """Equal values: tensors of one shape and dtype within ``atol`` (NaN = NaN), sequences item by item (a list
    equals a tuple), numbers within ``atol``, anything else by ``==``."""
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)) or a.shape != b.shape or a.dtype != b.dtype:
            return False
        if not a.is_floating_point():
            return torch.equal(a, b)
        return _max_diff(a, b) <= tolerance(a, b, atol)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y, atol) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k], atol) for k in a)
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return a == b or abs(a - b) <= atol
    try:
        return bool(a == b)
    except Exception:  # noqa: BLE001 - an object that cannot say: not the same
        return False


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.to(torch.float64), b.to(torch.float64)
    diff = (a - b).abs().nan_to_num(nan=math.inf)
    diff = diff.masked_fill((a.isnan() & b.isnan()) | (a == b), 0.0)
    return float(diff.max()) if diff.numel() else 0.0


def _detach(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_detach(v) for v in value) if not hasattr(value, "_fields") else tuple(map(_detach, value))
    return value


# --------------------------------------------------------------------------------------------------------------
# What the answer did, when no mistake of the catalogue explains it.

_PYTHON_ERRORS = [
    (r"list index out of range|tuple index out of range",
     "an index past the end of a Python list: an index computed from the wrong quantity (a quotient for a remainder, "
     "a size of another axis) or a loop that runs one step too far."),
    (r"object is not subscriptable|object is not iterable",
     "a number used where a list or tensor is expected: check what each argument is (print type(x))."),
    (r"unsupported operand type|can't multiply sequence",
     "an operation between a Python list and a number or tensor: make it a tensor first (torch.tensor(x)), or loop."),
    (r"^'?NoneType'? object|'NoneType'",
     "a value that is None: a helper without `return`, or an in-place method's result (x.sort() returns None)."),
    (r"division by zero", "a division by a size or count that is 0 in this case."),
]


def likeliest_cause(exercise: Exercise, case: Case, err: Exception) -> str:
    """A mistake of the catalogue that raises the same error on this case, else the usual cause of that error."""
    for m in exercise.mistakes:
        e = exercise.expected(m.name, m.answer, case).error
        if e is not None and same_error(e, err):
            return f" The same error comes from this mistake: {exercise.what} {m.says}"
    for pattern, cause in (*exercise.hints, *_PYTHON_ERRORS):
        if re.search(pattern, str(err)) or re.search(pattern, type(err).__name__):
            return f" Likeliest cause here: {cause}"
    return ""


def describe(exercise: Exercise, case: Case, got: Outcome, want: Outcome) -> str:
    what = exercise.what
    if got.error is not None:
        text = str(raised(got.error, what))
        cause = "" if classic_hint(got.error) else likeliest_cause(exercise, case, got.error)
        return text + cause
    words = []
    if got.changed != want.changed:
        changed = ", ".join(f"`{n}`" for n in got.changed)
        words.append(f"{what} modified its input {changed} in place; the caller still needs it: work on a copy "
                     f"(x.clone(), list(x), sorted(x) rather than x.sort()), or an out-of-place operation.")
    if not same(got.value, want.value, exercise.atol):
        words.append(f"{what}'s {value_difference(got.value, want.value, case, exercise)}")
    return " And ".join(words)


def value_difference(got, want, case: Case, exercise: Exercise, noun: str = "result") -> str:
    """What ``got`` did differently from ``want``: a phrase after "your answer's"."""
    if got is None and want is not None:
        return f"{noun} is None: nothing returned (a `return` missing?), expected {_show(want)}."
    if isinstance(want, tuple) and exercise.parts and isinstance(got, (tuple, list)) and len(got) == len(want):
        i = next(i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w, exercise.atol))
        return value_difference(got[i], want[i], case, exercise, noun=exercise.parts[i])
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():  # each key names its item
        key = next(k for k in want if not same(got[k], want[k], exercise.atol))
        return value_difference(got[key], want[key], case, exercise, noun=key)
    if isinstance(want, torch.Tensor):
        return f"{noun} {tensor_difference(got, want, case, exercise.atol)}"
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return f"{noun} {sequence_difference(list(got), list(want))}"
    return f"{noun} is {_show(got)}, expected {_show(want)}."


def _show(x) -> str:
    text = repr(x) if not isinstance(x, torch.Tensor) else f"a tensor of shape {tuple(x.shape)}"
    return text if len(text) < 120 else text[:117] + "..."


def sequence_difference(got: list, want: list) -> str:
    shown = f"expected {_show(want)}, got {_show(got)}"
    if len(got) == len(want) and sorted(map(repr, got)) == sorted(map(repr, want)):
        return f"has the right items in another order: {shown}."
    missing = [w for w in want if w not in got]
    extra = [g for g in got if g not in want]
    if missing and not extra:
        return f"leaves out {_show(missing)}: {shown}."
    if extra and not missing:
        return f"has {_show(extra)} too many: {shown}."
    i = next((i for i, (g, w) in enumerate(zip(got, want)) if g != w), min(len(got), len(want)))
    return f"differs first at item {i}: {shown}."


def tensor_difference(got, want: torch.Tensor, case: Case, atol: float) -> str:
    if not isinstance(got, torch.Tensor):
        return f"is a {type(got).__name__}, expected a torch.Tensor."
    if got.shape != want.shape:
        return shape_difference(got, want)
    prefix = ""
    if got.dtype != want.dtype:
        if got.dtype != torch.bool and want.dtype != torch.bool and same(got.to(want.dtype), want, 1e-5):
            return (f"holds the right values in {_name(got.dtype)}, expected {_name(want.dtype)} (the inputs' "
                    f"dtype): a tensor made without dtype=, or a .float() or .double() on the way.")
        if want.dtype == torch.bool:
            return (f"is {_name(got.dtype)}, expected bool: a mask of numbers is not a selection; build it with "
                    f"comparisons (==, <, >) and combine with & and |.")
        if got.dtype == torch.bool:
            return f"is bool, expected {_name(want.dtype)} numbers."
        prefix, got = f"is {_name(got.dtype)}, expected {_name(want.dtype)}, and ", got.to(want.dtype)
    return prefix + pattern(got, want, case, atol)


def shape_difference(got: torch.Tensor, want: torch.Tensor) -> str:
    shown = f"has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    if sorted(got.shape) == sorted(want.shape):
        return f"{shown}: the right sizes with the axes in another order (a transpose or permute missing or extra)."
    if [s for s in got.shape if s != 1] == [s for s in want.shape if s != 1]:
        return f"{shown}: an axis of size 1 too many or missing (an unsqueeze, a squeeze, keepdim=)."
    if got.numel() == want.numel():
        return f"{shown}: the right number of entries arranged in another shape (a view or reshape to other sizes)."
    return f"{shown}."


def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")


def pattern(got: torch.Tensor, want: torch.Tensor, case: Case, atol: float) -> str:
    """The shape of the difference between two tensors of one shape and dtype: words after "its result"."""
    tol = tolerance(got, want, atol)
    if want.is_floating_point():
        g64, w64 = got.to(torch.float64), want.to(torch.float64)
        bad = ~torch.isfinite(got) & torch.isfinite(want)
        if bool(bad.any()):
            kinds = [k for k, m in (("NaN", got.isnan()), ("inf", got.isinf())) if bool((m & bad).any())]
            return (f"has {' and '.join(kinds)} at {int(bad.sum())} of {bad.numel()} entries where the right answer "
                    f"is finite{_where(bad, case)}.")
        differ = (((g64 - w64).abs() > tol) | want.isnan()) & ~(got.isnan() & want.isnan()) & (got != want)
    else:
        differ = got != want
    n, total = int(differ.sum()), differ.numel()
    if want.dtype == torch.bool and torch.equal(got, ~want):
        return "is the opposite of the right one at every entry: True where it should be False (polarity swapped)."
    if want.ndim >= 2 and want.shape[-1] == want.shape[-2] and same(got, want.mT, atol):
        return "is the transpose of the right one: rows and columns swapped (the last two axes)."
    if want.is_floating_point():
        delta, ratio = g64 - w64, g64 / w64
        finite = torch.isfinite(w64) & torch.isfinite(g64)
        if finite.all() and n and float(delta.max() - delta.min()) <= tol:
            return f"is the right one plus the same {float(delta.flatten()[0]):.4g} at every entry: a constant offset."
        nz = finite & (w64.abs() > 1e-6)
        if n and bool(nz.any()) and not (differ & ~nz).any():
            r = ratio[nz]
            if float(r.max() - r.min()) <= 1e-6 * float(r.abs().max()) and abs(float(r[0]) - 1) > 1e-6:
                return f"is {float(r[0]):.4g} times the right one at every entry{_root(float(r[0]))}: a factor."
    for axis in range(want.ndim):
        perm = _permutation(got, want, axis, tol)
        if perm is not None:
            return (f"holds the right slices along axis {axis} in another order: position i holds the right "
                    f"answer's {perm} ({_kind(perm)}).")
    if got.numel() > 1 and same(got.flatten().sort().values, want.flatten().sort().values, atol):
        return "holds the right values, arranged differently."
    return f"differs at {n} of {total} entries{_where(differ, case)}, e.g. at {_first(differ, got, want)}."


def _root(r: float) -> str:
    for value, name in ((r * r, "√{:.0f}"), (1 / (r * r), "1/√{:.0f}")):
        if abs(value - round(value)) < 1e-6 and round(value) > 1:
            return " (" + name.format(round(value)) + ")"
    return ""


def _permutation(got, want, axis: int, tol: float):
    size = want.shape[axis]
    if size < 2:
        return None
    perm = []
    for i in range(size):
        g = got.select(axis, i)
        match = [j for j in range(size) if same(g, want.select(axis, j), tol)]
        if not match:
            return None
        perm.append(match[0] if i not in match else i)
    return perm if perm != list(range(size)) and sorted(perm) == list(range(size)) else None


def _kind(perm: list) -> str:
    n = len(perm)
    if perm == list(range(n))[::-1]:
        return "reversed"
    for k in range(1, n):
        if perm == [(i + k) % n for i in range(n)] or perm == [(i - k) % n for i in range(n)]:
            return f"rotated by {k}"
    return "permuted"


def _where(differ: torch.Tensor, case: Case) -> str:
    """Where the differing entries lie: a region the case marks, the diagonal, whole rows or columns."""
    for name, region in case.marks.items():
        if region.shape == differ.shape and bool(differ.any()) and not (differ & ~region).any():
            return f", all of them {name}"
    if differ.ndim >= 2 and bool(differ.any()):
        i = torch.arange(differ.shape[-2])[:, None]
        j = torch.arange(differ.shape[-1])[None, :]
        for name, region in (("on the diagonal (key = query)", i == j), ("above the diagonal (key after query)", j > i),
                             ("below the diagonal (key before query)", j < i)):
            if not (differ & ~region).any():
                return f", all of them {name}"
        rows = differ.flatten(0, -2).all(-1) if differ.ndim == 2 else None
        if rows is not None and bool(rows.any()) and not (differ & ~rows[:, None]).any():
            return f", whole rows {rows.nonzero().flatten().tolist()}"
        cols = differ.all(-2) if differ.ndim == 2 else None
        if cols is not None and bool(cols.any()) and not (differ & ~cols[None, :]).any():
            return f", whole columns {cols.nonzero().flatten().tolist()}"
    return ""


def _first(differ, got, want) -> str:
    index = tuple(differ.nonzero()[0].tolist())
    return f"{list(index)}: expected {_number(want[index])}, got {_number(got[index])}"


def _number(x: torch.Tensor) -> str:
    v = x.item()
    return repr(v) if isinstance(v, bool) else f"{v:.4g}"
