"""How every checker reaches its verdict.

A checker is an :class:`Exercise`: its **cases** (every size the statement leaves free, its edge cases), a
**reference** and a **catalogue of mistakes**, each the reference transformed (indices swapped, a shift by one, a
term dropped, another dtype) with words that tell the learner what it does. :func:`check` runs the answer on a fresh
copy of each case's inputs, then says

1. "Correct: ..." when every case is right and no input changed (unless the answer calls a ``forbidden`` function);
2. the mistake of the catalogue that **agrees with the answer on every case** (values, exception, inputs changed),
   when exactly one does;
3. otherwise **what the answer did**, on the smallest case that shows it: its exception and likeliest cause (a view
   or product that failed set against the reference's on the same case, its sizes named by the case), the inputs it
   changed, its type, shape or dtype, the pattern of the entries that differ (inverted, transposed, an offset or
   factor, float32's rounding, another order, a region the case marks), the sizes that tell the right cases from
   the wrong ones (d = 6; L = S), or a state kept between calls.

``tests/test_catalogues.py`` holds every catalogue to this: each mistake named on its own, each pair told apart."""
from __future__ import annotations

import copy
import inspect
import itertools
import math
import re
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from . import ExerciseError, passed, raised, same_error

@dataclass
class Case:
    """One call of the answer, ``name`` in messages; ``marks``: {name: bool region of the output} to locate a difference;
    ``sizes``: {name: int} the case's sizes its name does not state (an exception's numbers are read with them)."""
    name: str
    args: tuple
    marks: dict = field(default_factory=dict)
    sizes: dict = field(default_factory=dict)

    @property
    def size(self) -> int:
        return sum(a.numel() if isinstance(a, torch.Tensor) else len(a) if isinstance(a, (list, tuple)) else 1
                   for a in self.args)

@dataclass
class Mistake:
    """``answer``: the reference transformed (same signature); ``says`` completes "your <answer> ...": what, fix."""
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
    returned tuple; ``hints``: (regular expression, likeliest cause) for exceptions this exercise invites;
    ``forbidden``: the functions ("module.function", Python functions) the statement forbids: an answer right on every
    case that calls one while it runs (by any name, inside a helper too) is refused, told ``instead``; ``notes(got,
    *args)``: what the exercise's own terms say of a wrong result (a plan over its budget), "" when nothing;
    ``exchange``: whether the reference is tried on its inputs exchanged (:func:`exchanges`; not where a call is costly)."""
    what: str
    reference: Callable
    cases: list[Case]
    mistakes: list[Mistake]
    passed: str
    run: Callable = lambda answer, *args: answer(*args)  # noqa: E731
    atol: float = 1e-10
    parts: tuple = ()
    hints: tuple = ()
    forbidden: tuple = ()
    instead: str = ""
    notes: Callable = lambda got, *args: ""  # noqa: E731
    exchange: bool = True
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
    used = []
    got = [exercise.outcome(watching(answer, exercise.forbidden, used), case) for case in exercise.cases]
    for case, o in zip(exercise.cases, got):
        if type(o.error) is NotImplementedError and not str(o.error):
            raise raised(o.error, exercise.what)  # the student edition's stub
    want = [exercise.expected("reference", exercise.reference, case) for case in exercise.cases]
    wrong = [i for i, (g, w) in enumerate(zip(got, want)) if not agree(g, w, exercise.atol)]
    if not wrong and used:  # the statement's rule, once the answer is right: a wrong one is told its mistake first
        raise ExerciseError(f"{exercise.what} calls {used[0]}: the exercise asks you to write it yourself, WITHOUT the "
                            f"ready-made function (it is what the checker compares with). {exercise.instead}")
    if not wrong:
        return passed(exercise.passed)
    named, case = naming(exercise, got), exercise.cases[wrong[0]]
    if len(named) == 1:
        raise ExerciseError(f"{case.name}: {exercise.what} {named[0].says}")
    returned = [i for i in wrong if got[i].error is None]
    named = [m for m in naming(exercise, got, [i for i, g in enumerate(got) if g.error is None]) if all(
        exercise.expected(m.name, m.answer, exercise.cases[i]).error is not None for i in wrong if got[i].error is not
        None)] if returned else []  # (a mistake that returns where the answer raises is another mistake)
    if len(named) == 1 and len(returned) < len(wrong):  # one mistake wherever it returns, an exception elsewhere
        f = next(i for i in wrong if got[i].error is not None)
        raise ExerciseError(f"{exercise.cases[f].name}: {exception(exercise, got[f].error, exercise.cases[f])} And "
                            f"{on(exercise.cases[returned[0]])}, {exercise.what} {named[0].says}")
    swapped = naming(exercise, got, mistakes=exchanges(exercise))
    if len(swapped) == 1:  # outside the catalogue: the reference on its inputs exchanged
        raise ExerciseError(f"{case.name}: {exercise.what} {swapped[0].says}")
    if not agree(exercise.outcome(answer, case), got[wrong[0]], exercise.atol):  # called again, the same inputs
        raise ExerciseError(f"{case.name}: {exercise.what} gives another result when called again on the same inputs: "
                            f"it keeps a state between calls (a global, a counter) or draws random numbers. Everything "
                            f"it needs is in its arguments.")
    raise ExerciseError(describe(exercise, exercise.cases, got, want, wrong))

def watching(answer, forbidden, used: list):
    """``answer``, noting in ``used`` the ``forbidden`` functions it calls while it runs (of the modules imported)."""
    codes = {getattr(getattr(sys.modules.get(f.rsplit(".", 1)[0]), f.rsplit(".", 1)[1], None), "__code__", None): f
             for f in forbidden}
    codes.pop(None, None)

    def watched(*args):
        previous = sys.getprofile()
        sys.setprofile(lambda frame, *_: used.append(codes[frame.f_code]) if frame.f_code in codes else None)
        try:
            return answer(*args)
        finally:
            sys.setprofile(previous)
    return watched if codes else answer

def naming(exercise: Exercise, got: list[Outcome], on: list[int] | None = None, mistakes=None) -> list[Mistake]:
    """The mistakes of the catalogue (or of ``mistakes``) that agree with the answer's outcomes on every case (of
    ``on``)."""
    on = sorted(range(len(got)) if on is None else on, key=lambda i: agree(  # the wrong cases first: most differ there
        got[i], exercise.expected("reference", exercise.reference, exercise.cases[i]), exercise.atol))
    return [m for m in (exercise.mistakes if mistakes is None else mistakes) if all(agree(got[i], exercise.expected(m.name, m.answer, exercise.cases[i]),
                                                      exercise.atol) for i in on)]

def agree(a: Outcome, b: Outcome, atol: float) -> bool:
    """``a`` is ``b``: same values and inputs changed, or same failure (one naming no size: any of its type)."""
    if a.error is not None or b.error is not None:
        sizeless = b.error is not None and not re.search(r"\d", str(b.error))
        return a.error is not None and b.error is not None and (same_error(a.error, b.error) or
                                                                 (sizeless and type(a.error) is type(b.error)))
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
        if not a.is_floating_point() or torch.equal(a, b):  # (equal: the common case, at once)
            return torch.equal(a, b)
        a64, b64 = a.to(torch.float64), b.to(torch.float64)  # NaN = NaN, inf = inf; any other NaN: differs
        diff = (a64 - b64).abs().nan_to_num(nan=math.inf).masked_fill((a.isnan() & b.isnan()) | (a64 == b64), 0.0)
        return float(diff.max() if diff.numel() else 0.0) <= tolerance(a, b, atol)
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


def source(piece: torch.Tensor, sources: dict, missing: str = "none") -> str:
    """Where a slice of an answer came from: the label of the first of ``sources`` ({label: tensor}) it equals
    exactly, in its own dtype (the notes say which head, row or slot each slice of a result holds)."""
    return next((k for k, t in sources.items() if t.shape == piece.shape and torch.equal(piece, t.to(piece.dtype))),
                missing)

def exchanges(exercise: Exercise) -> list[Mistake]:
    """The reference with two of its arguments of one kind (tensors of one shape and dtype, or ints) swapped, or one
    read in place of the other: slips of the inputs no catalogue lists (a function's, where ``exchange``)."""
    if not exercise.exchange or inspect.isclass(getattr(exercise.reference, "func", exercise.reference)):  # a layer
        return []
    names = exercise.arguments

    def kind(x):
        return (x.shape, x.dtype) if isinstance(x, torch.Tensor) else int if type(x) is int else None
    pairs = [(i, j) for i, j in itertools.permutations(range(len(names)), 2) if any(
        kind(c.args[i]) is not None and kind(c.args[i]) == kind(c.args[j]) for c in exercise.cases if len(c.args) > max(i, j))]

    def exchanged(i, j, both):
        def answer(*args):
            args = list(args)
            args[j], args[i] = (args[i], args[j]) if both else (args[i], args[i])
            return exercise.reference(*args)
        return answer
    return [Mistake(f"inputs {i} {j} {both}", (
        f"gives, on every case, what the right one gives with `{names[i]}` and `{names[j]}` EXCHANGED: it reads "
        f"{names[i]} where {names[j]} belongs, and {names[j]} where {names[i]} does." if both else
        f"gives, on every case, what the right one gives with `{names[i]}` passed for `{names[j]}` too: it reads "
        f"{names[i]} where {names[j]} belongs."), exchanged(i, j, both))
        for i, j in pairs for both in (True, False) if not both or i < j]

def _detach(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return type(value)(_detach(v) for v in value) if not hasattr(value, "_fields") else tuple(map(_detach, value))
    return value

# What the answer did, when no mistake of the catalogue explains it.

def _big(exercise: Exercise, got: list[Outcome], want: list[Outcome], wrong: list[int]) -> list[int]:
    """The wrong cases whose (first differing item of its) output has 4 entries or more: one is shown if any."""
    return [i for i in wrong if not isinstance(w := _differing(got[i].value, want[i].value, exercise.atol)[2],
                                               torch.Tensor) or w.numel() >= 4]

def _differing(got, want, atol: float, key=None):
    """(key, got's item, want's item) of a tuple's or dict's first differing item; else (None, got, want)."""
    if isinstance(want, tuple) and isinstance(got, (tuple, list)) and len(got) == len(want) or \
            isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():
        k = next((k for k in (want if isinstance(want, dict) else range(len(want))) if not same(got[k], want[k], atol)),
                 None)
        return (key, got, want) if k is None else _differing(got[k], want[k], atol, k)
    return key, got, want

def describe(exercise: Exercise, cases: list, got: list[Outcome], want: list[Outcome], wrong: list[int]) -> str:
    i = (_big(exercise, got, want, wrong) or wrong)[0]
    if got[i].error is not None:  # of the cases that raise it, the one whose sizes say most about it
        alike = [j for j in wrong if type(got[j].error) is type(got[i].error)]
        i = max(alike, key=lambda j: (locate(exercise, got[j].error, cases[j]).startswith(" On"), j == i))
    elif _reordered(got[i].value, want[i].value, exercise.atol):  # a case whose sizes tell the axes apart
        turned = [j for j in wrong if got[j].error is None and _reordered(got[j].value, want[j].value, exercise.atol)]
        i = next((j for j in turned if _reordered(got[j].value, want[j].value, exercise.atol, turned=False)),
                 next((j for j in turned if _reordered(got[j].value, want[j].value, exercise.atol, True)), i))
    elif 1 in _shape(want[i].value, got[i].value, exercise.atol):  # a size 1 tells no axis from its absence
        i = next((j for j in wrong if got[j].error is None and _shape(want[j].value, got[j].value, exercise.atol)
                  and 1 not in _shape(want[j].value, got[j].value, exercise.atol)), i)
    what, case, words = exercise.what, cases[i], []
    if got[i].error is not None:
        words.append(exception(exercise, got[i].error, case) + (written := _written_in(exercise, cases, got, wrong)))
    elif want[i].error is not None:  # the statement asks for an exception here, and the answer returned
        return (f"{case.name}: {what} returned {_show(got[i].value)}, where it should raise "
                f"{type(want[i].error).__name__} ({want[i].error}).")
    moved = [j for j in wrong if got[j].error is None and got[j].changed != want[j].changed]
    if moved:  # inputs changed in place (those the reference leaves alone), on this case or another
        names = [n for n in got[moved[0]].changed if n not in want[moved[0]].changed]
        given = dict(zip(exercise.arguments, cases[moved[0]].args))
        lists = any(isinstance(given.get(n), (list, dict)) for n in names)
        fix = "(list(x), sorted(x) rather than x.sort())." if lists else "(x.clone()), or out of place: x = x - m, " \
            "not x -= m or x.sub_(m)."
        words.append(("" if moved[0] == i else f"{on(cases[moved[0]])}, ") + (
            f"{what} modified its input {', '.join(f'`{n}`' for n in names)} in place; the caller still needs it: work "
            f"on a copy {fix}" if names else f"{what} leaves unchanged an input it should change in place."))
    valued = [j for j in wrong if got[j].error is None and want[j].error is None and
              not same(got[j].value, want[j].value, exercise.atol)]
    if valued:  # the values it gets wrong, after an exception elsewhere too: the exception may hide the real slip
        j = i if i in valued else (_big(exercise, got, want, valued) or valued)[0]
        kinds = {kind(got[k].value, want[k].value, exercise) for k in _big(exercise, got, want, valued) or valued}
        phrase = value_difference(got[j].value, want[j].value, cases[j], exercise, strong=len(kinds) == 1)
        try:
            note = exercise.notes(got[j].value, *cases[j].args)
        except Exception:  # noqa: BLE001 - a note is an extra: one that cannot read this result says nothing
            note = ""
        item = _differing(got[j].value, want[j].value, exercise.atol)[1]
        given = source(item, {f"the input `{n}`": a for n, a in zip(exercise.arguments, cases[j].args)
                              if isinstance(a, torch.Tensor)}, "") if isinstance(item, torch.Tensor) else ""
        note = (f"It equals {given}, as given. " if given else "") + note
        words.append(("" if j == i else f"{on(cases[j])}, ") + f"{what}'s {phrase}" + (f" {note}" if note else ""))
    kept = [j for j in wrong if got[j].error is None and got[j].value is not None]
    if len(kept) > 1 and all(same(got[j].value, got[kept[0]].value, 0.0) for j in kept) and not all(
            same(want[j].value, want[kept[0]].value, 0.0) for j in kept):  # the same whatever the input: written in
        value = got[kept[0]].value
        empty = value.numel() == 0 if isinstance(value, torch.Tensor) else hasattr(value, "__len__") and not len(value)
        words.append(f"it returns the same result on all {len(kept)} cases it gets wrong, whatever their inputs: " + (
            "does a return fire before the work is done?" if empty else
            "is that result written in (the chapter's example?), where it should be computed from them?"))
    failed = [j for j in wrong if got[j].error is not None]
    if failed and got[i].error is None:  # and an exception elsewhere: said too
        words.append(f"{on(cases[failed[0]])}, " + exception(exercise, got[failed[0]].error, cases[failed[0]]))
    blind = [k for k, c in enumerate(cases) if _blind(exercise, c, want[k])]
    return f"{case.name}: " + " And ".join(words) + ("" if got[i].error is not None and written else
                                                      only_where(cases, wrong, blind))  # (one number said is enough)

def _written_in(exercise: Exercise, cases: list, got: list[Outcome], wrong: list[int]) -> str:
    """" On the 3 cases where its view fails, axis 3 is 5 where S belongs": one wrong number, whatever the size."""
    seen = {}
    for j in (j for j in wrong if got[j].error is not None):
        for axis, s, g in re.findall(r"axis (\d+) should be (\d+)(?: \([^)]*\))?, not (\d+)",
                                     locate(exercise, got[j].error, cases[j])):
            seen.setdefault((axis, g), []).append((cases[j].sizes, int(s)))
    for (axis, g), found in seen.items():
        names = set.intersection(*({k for k, v in sizes.items() if v == s} for sizes, s in found))
        tied = set.intersection(*({k for k, v in sizes.items() if v == int(g)} for sizes, _ in found))  # D used?
        fixed = set.intersection(*(set(sizes.items()) for sizes, _ in found))  # d = 2 on each: 4 may be 2 * d
        if len({s for _, s in found}) > 1 and len(names) == 1 and len(tied) < 2 and (tied or not fixed):
            n, right = names.pop(), ", ".join(map(str, dict.fromkeys(s for _, s in found)))
            said = f" On the {len(found)} cases where that view fails, axis {axis} is {g}, where the right view has {right}"
            return said + (f", and {(t := tied.pop())} = {g} on each of them: is {t} read there, or {g} written in?"
                           if tied else f": is {g} written into it as a number, where it should come from the inputs?")
    return ""

def _blind(exercise: Exercise, case: Case, want: Outcome) -> bool:
    """Few slips show on ``case``: all mistakes of the catalogue but a tenth are right there (one token, one head)."""
    misses = itertools.accumulate(not agree(exercise.expected(m.name, m.answer, case), want, exercise.atol)
                                  for m in exercise.mistakes)
    return bool(exercise.mistakes) and all(n <= len(exercise.mistakes) // 10 for n in misses)

def _reordered(got, want, atol: float, distinct: bool = False, turned: bool | None = None) -> bool:
    """The first differing item has the right sizes in another order (``distinct``: sizes all different, none 1;
    ``turned``: it is, or is not, the right one with its axes in another order)."""
    _, got, want = _differing(got, want, atol)
    return isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape != want.shape and \
        sorted(got.shape) == sorted(want.shape) and (not distinct or len(set(want.shape) - {1}) == want.ndim) and \
        (turned is None or (_turned(got, want) is not None) == turned)

def _shape(want, got, atol: float) -> tuple:
    """The right shape of the first differing item where the answer's has another; else ()."""
    _, got, want = _differing(got, want, atol)
    shaped = isinstance(got, torch.Tensor) and isinstance(want, torch.Tensor) and got.shape != want.shape
    return tuple(want.shape) if shaped else ()

def on(case: Case) -> str:  # "on <the case>", or its name where it starts with its own preposition ("in float16")
    return case.name if re.match(r"(in|on|with|without|for|at|after|under) ", case.name) else f"on {case.name}"

def exception(exercise: Exercise, err: Exception, case: Case | None = None) -> str:
    own = next((f" Likeliest cause here: {cause}" for pattern, cause in exercise.hints if re.search(pattern, str(err))
                or re.search(pattern, type(err).__name__)), "")  # the exercise's own cause before torch's generic one
    found = locate(exercise, err, case) if case is not None else ""  # the size that failed, where it can be said
    text = f"{exercise.what} raised {type(err).__name__}: {str(err).strip()}" if own or found.startswith(" On") else \
        str(raised(err, exercise.what))  # (a broadcast's sizes named, its usual causes still said)
    return text + ("" if text[-1] in ".!?" else ".") + found + own

class _Shapes(torch.overrides.TorchFunctionMode):
    """What the reference asks of torch on a case: each view's (tensor size, shape), each product's two matrices."""
    def __init__(self):
        super().__init__()
        self.views, self.products = [], []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out, name = func(*args, **(kwargs or {})), getattr(func, "__name__", "")
        a, b = (list(args) + [None, None])[:2]
        if name in ("view", "reshape", "unflatten") and isinstance(out, torch.Tensor) and not isinstance(b, torch.dtype):
            self.views.append((a.numel(), tuple(out.shape)))
        elif name in ("linear", "matmul", "mm") and all(isinstance(t, torch.Tensor) and t.ndim >= 2 for t in (a, b)) \
                and (name == "linear" or b.ndim == 2):  # torch's "mat1 and mat2": a flattened to rows, b (or W.T)
            self.products.append(((a.numel() // a.shape[-1], a.shape[-1]), tuple(b.shape[::-1] if name == "linear"
                                                                                 else b.shape)))
        return out

def _names(case: Case, n: int) -> str:
    """" (S = 5)": the case's sizes equal to ``n`` (and B·h, B·L), where at most three."""
    sizes = {f"{k} = {v}": int(v) for k, v in case.sizes.items()}
    for phrase in _sizes(case.name).values():
        sizes.setdefault(re.sub(r"(\w+) ?= ?", r"\1 = ", phrase), int(float(re.search(r"\d[\d.]*", phrase).group())))
    found = [p for p, v in sizes.items() if v == n]
    found = [p for p in found if "=" in p] or found  # "S = 5", not also "5 keys": one size said twice
    if n == 1 and len(found) > 1:  # (B = 1, h = 1: any size may be 1)
        return ""
    short = {p.split(" = ")[0]: v for p, v in sizes.items() if " = " in p}
    found += [f"{x}·{y} = {n}" for x, y in (("B", "h"), ("B", "L")) if min(short.get(x, 0), short.get(y, 0)) > 1 and short[x] * short[y] == n]
    return f" ({' or '.join(found)})" if 0 < len(found) <= 3 else ""

def _named(case: Case, got: int, want: int) -> str:
    """The answer's wrong size glossed by the one size of the case it equals, where the right one is named too (a size
    read from another axis, "not 4 (L = 4)"), else "": a number written in may equal a size by chance."""
    said = _names(case, got)
    return said if _names(case, want) and " or " not in said else ""

def locate(exercise: Exercise, err: Exception, case: Case) -> str:
    """A view, product or broadcast that failed, set against what the reference does on the same case: the axis and
    the sizes (named by the case) that differ; "" where it cannot be said."""
    text, shapes = str(err), _Shapes()
    if re.search(r"must match the size of tensor b", text):
        a, b = map(int, re.search(r"tensor a \((\d+)\) must match the size of tensor b \((\d+)\)", text).groups())
        na, nb = _names(case, a), _names(case, b)
        return f" Here {a}{na} meets {b}{nb}." if na and nb else ""
    view = re.search(r"shape '\[([-\d, ]*)\]' is invalid for input of size (\d+)", text)
    product = re.search(r"mat1 and mat2 shapes cannot be multiplied \((\d+)x(\d+) and (\d+)x(\d+)\)", text)
    if not (view or product):
        return ""
    try:
        with shapes:
            exercise.run(exercise.reference, *copy.deepcopy(case.args))
    except Exception:  # noqa: BLE001 - a reference that raises here says nothing about the answer
        return ""
    if view:
        got, n = [int(s) for s in view.group(1).split(",")], int(view.group(2))
        fits = lambda w: sum(g in (s, -1) for g, s in zip(got, w[1])) + (w[0] == n)  # noqa: E731
        best = max((w for w in shapes.views if len(w[1]) == len(got)), key=fits, default=None)
        if best is None or fits(best) < len(got) - (len(got) > 3):
            return ""
        said = [f"axis {i} should be {s}{_names(case, s)}, not {g}{_named(case, g, s)}" for i, (g, s) in
                enumerate(zip(got, best[1])) if g not in (s, -1)]
        return (f" On this case the right answer views a tensor of {best[0]} entries as {best[1]}: "
                f"{'; '.join(said)}." if said else "")
    got = tuple(map(int, product.groups()))
    fits = lambda w: sum(g == s for g, s in zip(got, w[0] + w[1]))  # noqa: E731
    best = max(shapes.products, key=fits, default=None)
    if best is None or fits(best) < 3:
        return ""
    said = [f"the {side} matrix's {axis} should be {s}{_names(case, s)}, not {g}{_named(case, g, s)}" for side, axis, g, s
            in zip(("left", "left", "right", "right"), ("rows", "columns") * 2, got, best[0] + best[1]) if g != s]
    return f" On this case the right answer multiplies {best[0]} by {best[1]} there: {'; '.join(said)}."

def _sizes(name: str) -> dict:
    """The sizes a case's name states: "d=2", "T = 2", "4 heads", "blocks of 2" (key: how it is said)."""
    found = {k: f"{k} = {v}" for k, v in re.findall(r"\b([A-Za-z_]\w*) ?= ?(\d[\d.]*)\b", name)}
    found |= {w[:4]: f"{n} {w}" for n, w in re.findall(r"\b(\d+) ([a-z]+s|head|query|key|rank|token)\b(?!/)", name)}
    return found | {w: f"{w} of {n}" for w, n in re.findall(r"\b([a-z]+) of (\d+)\b", name)}

def only_where(cases: list, wrong: list[int], blind: list[int] = ()) -> str:
    """" It is right on every case with d = 6, and on no other", where a size the cases state tells the right ones
    from the wrong ones (a size written into the answer as a number, a slip that shows only with one head)."""
    sizes = [{**{k: f"{k} = {v}" for k, v in c.sizes.items()}, **_sizes(c.name)} for c in cases]
    right = [k for k in range(len(cases)) if k not in wrong and k not in blind]  # (a case no mistake shows: no sign)
    both = sorted(k for k in set.intersection(*map(set, sizes)) if all(" = " in s[k] for s in sizes))
    pairs = [(x, y) for x, y in itertools.combinations(both, 2) if len(right) > 1 and len(wrong) > 1 and all(
        (sizes[k][x].split(" = ")[1] != sizes[k][y].split(" = ")[1]) == (k in wrong) for k in range(len(cases)))]
    if len(pairs) == 1:  # two sizes equal exactly on the right cases (said before one size alone)
        (x, y), = pairs
        return (f" It is right on every case with {x} = {y} and wrong on every case with {x} ≠ {y}: is {x} used "
                f"where {y} belongs, or {y} where {x} does?")
    if pairs:  # B = S and L = S on the same cases: which, the cases cannot tell
        said = " and where ".join(f"{x} = {y}" for x, y in pairs)
        return f" It is right exactly where {said} (the same cases): is one of these sizes used where the other belongs?"
    for side, said in ((right, "right"), (wrong, "wrong")):
        others = [k for k in range(len(cases)) if k not in side]
        if len(side) < 2 or not others:
            continue
        found, ones = {}, set()  # every size that tells them apart, B = 3 and h = 2 alike ("h = 2", not "2 heads")
        number = lambda k, key: float(re.search(r"\d[\d.]*", sizes[k].get(key) or "0").group())  # noqa: E731
        for key in sorted(set().union(*(sizes[k] for k in side))):  # right at 1 is no sign (a slip may not show there)
            use = [k for k in side if said == "wrong" or number(k, key) != 1]
            values = {sizes[k].get(key) for k in use}
            tied = any(o != key and all(o in sizes[k] and number(k, o) == number(k, key) for k in use) for o in
                       sizes[use[0]]) if use else False  # another size equal to it on those cases: which is it?
            if len(use) > 1 and len(values) == 1 and not values & {sizes[k].get(key) for k in others} and \
                    (number(use[0], key) > 1 or said == "wrong") and not (tied and said == "right"):
                found[sizes[use[0]][key]], ones = number(use[0], key), ones | {sizes[k][key] for k in side if k not in use}
        found = [p for p, n in found.items() if "=" in p or not any("=" in q and m == n for q, m in found.items())]
        if len(found) > 1 and said == "right":  # B = 3 and h = 2 on the same cases: which one, they cannot tell
            return ""
        if found:
            numbers = " or ".join(dict.fromkeys(re.search(r"\d[\d.]*", p).group() for p in found))
            hint = f": is {numbers} written into it as a number, where it should come from the inputs?" \
                if said == "right" else "."
            rest = "on no other" if said == "wrong" or not (ones or blind) else "wrong on every other" + (
                f" ({' or '.join(sorted(ones))} aside)" if ones else "") + " where a slip can show" * bool(blind)
            same = " (the same cases)" if len(found) > 1 else ""
            return f" It is {said} on every case with {' or '.join(found)}{same} and {rest}{hint}"
    parts = [set(re.split(r",\s*(?![^()]*\))", c.name)) for c in cases]  # a name's parts ("attn_mask (B*h, L, S)")
    for part in dict.fromkeys(p for k in wrong for p in sorted(parts[k]) if not re.search(r"\d", p)):
        if len(wrong) > 1 and right and all((part in parts[k]) == (k in wrong) for k in range(len(cases))):
            return f" It is wrong on every case with {part} and right on every other."
    return ""

def kind(got, want, exercise: Exercise) -> str:
    """The class of a difference (inverted, transposed, offset, factor, order...), to claim it only where every
    wrong case shows the same (of a tuple's or a dict's items, the first that differs, and which)."""
    key, got, want = _differing(got, want, exercise.atol)
    if key is not None:
        return f"{key}: {kind(got, want, exercise)}"
    if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and got.shape == want.shape:
        return pattern(got, want, Case("", ()), exercise.atol)[0] if got.dtype == want.dtype else "dtype"
    if isinstance(want, torch.Tensor) and isinstance(got, torch.Tensor) and _turned(got, want) is not None:
        return "transposed"  # the same mistake where L = S (same shape) and where not (sizes in another order)
    return type(got).__name__

def _turned(got: torch.Tensor, want: torch.Tensor) -> tuple | None:
    """The order p of the axes (not the identity) in which ``want.permute(p)`` is ``got`` (in want's dtype), if any."""
    return next((p for p in itertools.permutations(range(want.ndim)) if p != tuple(range(want.ndim)) and
                 want.permute(p).shape == got.shape and same(want.permute(p), got.to(want.dtype), 1e-6)), None)

def value_difference(got, want, case: Case, exercise: Exercise, noun: str = "result", strong: bool = True) -> str:
    """What ``got`` did differently from ``want``: a phrase after "your answer's"."""
    parts = isinstance(want, tuple) and exercise.parts
    expected = f"a tuple of {len(want)}, ({', '.join(exercise.parts)})" if parts else _show(want)
    if got is None and want is not None:
        return f"{noun} is None: nothing returned (a `return` missing?), expected {expected}." if noun == "result" \
            else f"{noun} is None, expected {expected}" + (": no gradient reached it (is that input used at all, or is a .detach(), torch.no_grad() or .data on its way?)."
                                                           if noun.startswith("gradient") else ".")
    if parts:
        if not isinstance(got, (tuple, list)) or len(got) != len(want):
            shown = _show(got) if isinstance(got, torch.Tensor) else f"a {type(got).__name__}"
            return f"{noun} is {shown}{f' of {len(got)}' * isinstance(got, (tuple, list))}, expected {expected}."
        right = [exercise.parts[j] for j, (g, w) in enumerate(zip(got, want)) if same(g, w, exercise.atol)]
        i = next(i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w, exercise.atol))
        named = f"{', '.join(right[:-1])} and {right[-1]} are" if len(right) > 1 else f"{right[0]} is" if right else ""
        and_right = f" Its {named} right." if right else ""
        return value_difference(got[i], want[i], case, exercise, noun=exercise.parts[i], strong=strong) + and_right
    if isinstance(want, dict) and isinstance(got, dict) and got.keys() == want.keys():  # each key names its item
        key = next(k for k in want if not same(got[k], want[k], exercise.atol))
        return value_difference(got[key], want[key], case, exercise, noun=key, strong=strong)
    if isinstance(want, torch.Tensor):
        return f"{noun} {tensor_difference(got, want, case, exercise.atol, strong)}"
    if isinstance(want, (list, tuple)) and isinstance(got, (list, tuple)):
        return f"{noun} {sequence_difference(list(got), list(want))}"
    return f"{noun} is {_show(got)}, expected {_show(want)}."

def _show(x) -> str:
    if isinstance(x, (tuple, list)) and any(isinstance(t, torch.Tensor) for t in x):  # shapes, not values
        return "(" + ", ".join(map(_show, x)) + ("," if len(x) == 1 else "") + ")"
    text = repr(x) if not isinstance(x, torch.Tensor) else f"a tensor of shape {tuple(x.shape)}"
    return text if len(text) < 120 else text[:117] + "..."

def sequence_difference(got: list, want: list) -> str:
    shown = f"expected {_show(want)}, got {_show(got)}"
    if len(got) == len(want) and sorted(map(repr, got)) == sorted(map(repr, want)):
        return f"has the right items in another order: {shown}."
    missing = [w for w in want if not any(same(w, g, 0.0) for g in got)]  # (`in` would compare tensors with ==)
    extra = [g for g in got if not any(same(g, w, 0.0) for w in want)]
    if missing and not extra:
        return f"leaves out {_show(missing)}: {shown}."
    if extra and not missing:
        return f"has {_show(extra)} too many: {shown}."
    i = next((i for i, (g, w) in enumerate(zip(got, want)) if not same(g, w, 0.0)), min(len(got), len(want)))
    return f"differs first at item {i}: {shown}."

def tensor_difference(got, want: torch.Tensor, case: Case, atol: float, strong: bool = True) -> str:
    if isinstance(got, tuple) and len(got) == 2 and all(isinstance(t, torch.Tensor) for t in got):
        return ("is a pair of tensors (values, indices), as max(dim), min(dim), sort and topk return: take its "
                ".values (amax(dim) and amin(dim) give the values alone).")
    if not isinstance(got, torch.Tensor):
        return f"is a {type(got).__name__}, expected a torch.Tensor."
    if got.shape != want.shape:
        return shape_difference(got, want, case)
    prefix = ""
    if got.dtype != want.dtype:
        size = float(want.abs().nan_to_num(0.0, 0.0, 0.0).max()) if want.is_floating_point() and want.numel() else 0.0
        if got.dtype != torch.bool and want.dtype != torch.bool and same(got.to(want.dtype), want,
                                                                         1e-5 * max(1.0, size)):  # relative
            return (f"holds the right values in {_name(got.dtype)}, expected {_name(want.dtype)} (the inputs' "
                    f"dtype): a tensor made without dtype=, or a .float() or .double() on the way.")
        if want.is_floating_point() and not got.is_floating_point() and got.dtype != torch.bool:
            return (f"is {_name(got.dtype)}, expected {_name(want.dtype)}: integers where values are expected "
                    f"(positions from argmax or .indices, or a tensor built from Python ints).")
        if want.dtype == torch.bool:
            return (f"is {_name(got.dtype)}, expected bool: a mask of numbers is not a selection; build it with "
                    f"comparisons (==, <, >) and combine with & and |.")
        if got.dtype == torch.bool:
            return f"is bool, expected {_name(want.dtype)} numbers."
        prefix, got = (f"is {_name(got.dtype)}, expected {_name(want.dtype)} (a .float() or .double() on the way, or "
                       f"a tensor made without dtype=), and ", got.to(want.dtype))
    return prefix + pattern(got, want, case, atol, strong)[1]

def shape_difference(got: torch.Tensor, want: torch.Tensor, case: Case | None = None) -> str:
    shown = f"has shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    axes = [a for a in range(want.ndim) if got.ndim == want.ndim and got.shape[a] != want.shape[a]]
    said = "; ".join(f"axis {a} is {got.shape[a]}{_named(case, got.shape[a], want.shape[a])} where {want.shape[a]}"
                     f"{_names(case, want.shape[a])} belongs" for a in axes) if case is not None else ""
    if sorted(got.shape) == sorted(want.shape):  # axes turned, or sizes listed in another order?
        turned = _turned(got, want)
        return f"{shown}: " + (f"the right one with its axes in another order (a transpose or permute missing or "
                               f"extra): the right one's .permute{turned}." if turned else
                               f"the right sizes in another order ({said}), but not the right one with its axes "
                               f"swapped: the sizes listed in another order (a view or reshape to (B, L, d, h) for (B, "
                               f"L, h, d)), or a torch.cat along another dim.")
    for a in range(want.ndim - 1):  # two neighbouring axes joined into one, or one cut in two
        joined = want.shape[:a] + (want.shape[a] * want.shape[a + 1],) + want.shape[a + 2:]
        if min(want.shape[a:a + 2]) > 1 and tuple(got.shape) == joined:
            return (f"{shown}: axes {a} and {a + 1} of the right one ({want.shape[a]} and {want.shape[a + 1]}) "
                    f"joined into one of {joined[a]}: a "
                    f"flatten({a}) or a reshape that merges them.")
    for a in range(got.ndim - 1):  # ... or one of the right one's axes cut in two
        if min(got.shape[a:a + 2]) > 1 and want.shape == got.shape[:a] + (got.shape[a] * got.shape[a + 1],) + \
                got.shape[a + 2:]:
            return (f"{shown}: axis {a} of the right one ({want.shape[a]}) cut in two, {got.shape[a]} by "
                    f"{got.shape[a + 1]}: a torch.stack where a torch.cat belongs, or a view that splits it.")
    if [s for s in got.shape if s != 1] == [s for s in want.shape if s != 1]:
        if 1 not in got.shape and want.ndim - got.ndim > 1:  # every axis of size 1 gone at once
            return f"{shown}: the right one with EVERY axis of size 1 removed, as .squeeze() without a dim does."
        return f"{shown}: an axis of size 1 too many or missing (an unsqueeze, a squeeze, keepdim=)."
    if got.numel() == want.numel():
        return f"{shown}: the right number of entries arranged in another shape (a view or reshape to other sizes)."
    if got.ndim == 0:
        return f"{shown}: one number, a reduction over every axis (a sum, mean, max or argmax without dim=)."
    if len(axes) == 1:
        g, w = got.shape[axes[0]], want.shape[axes[0]]
        if g == 1:
            return (f"{shown}: axis {axes[0]} alone differs, of size 1 where {w} is expected: an axis never expanded "
                    f"(.expand, .repeat), a slice of one entry, a sum or max that kept its axis, or a size read from "
                    f"another tensor or axis.")
        how, when = {w - 1: "one too few", w + 1: "one too many"}.get(g, "too few" if g < w else "too many"), \
            "early" if g < w else "late"
        part = _part(got, want, axes[0])
        g, w = f"{g}{_named(case, g, w)}" if case else g, f"{w}{_names(case, w)}" if case else w
        return (f"{shown}: axis {axes[0]} alone differs, {g} for {w}, {how} (a range, slice or count that stops "
                f"{when}, or a size read from another tensor or axis).{part}")
    extra = _extra(want.shape, got.shape)
    if extra:
        return (f"{shown}: the expected axes and more, of size{'s' * (len(extra) > 1)} {', '.join(map(str, extra))} "
                f"(a reduction over too few axes, or a broadcast that added one).")
    missing = _extra(got.shape, want.shape)
    if missing:
        return (f"{shown}: an axis of size{'s' * (len(missing) > 1)} {', '.join(map(str, missing))} missing (a "
                f"reduction over too many axes).")
    return f"{shown}."

def _part(got: torch.Tensor, want: torch.Tensor, axis: int) -> str:
    """" It holds the right one's first 3 along axis 1, not its last 3.": along ``axis`` (the only one that differs),
    the shorter of the two is the start or the end of the longer one; else ""."""
    short, long = sorted((got, want), key=lambda t: t.shape[axis])
    n, m = short.shape[axis], long.shape[axis]
    for where, start, other in (("first", 0, "last"), ("last", m - n, "first")):
        if n and same(long.narrow(axis, start, n), short, 1e-10):
            return (f" It holds the right one's {where} {n} along axis {axis}, not its {other} {m - n}." if short is got
                    else f" It holds the right one along axis {axis}, and {m - n} more {'after' if start == 0 else 'before'} it.")
    return ""

def _extra(short, long) -> list:
    """The sizes of ``long`` left over once ``short`` is found in it in order (a subsequence), else []."""
    rest, left = list(long), list(short)
    extra = []
    for size in rest:
        if left and size == left[0]:
            left.pop(0)
        else:
            extra.append(size)
    return extra if not left else []

def _name(dtype) -> str:
    return str(dtype).removeprefix("torch.")

def pattern(got: torch.Tensor, want: torch.Tensor, case: Case, atol: float, strong: bool = True) -> tuple[str, str]:
    """(kind, words after "its result"): the shape of the difference between two tensors of one shape and dtype.
    The strong kinds (inverted, transposed, an offset, a factor, an order) only when ``strong``: where every wrong
    case shows the same kind."""
    tol = tolerance(got, want, atol)
    if want.is_floating_point():
        g64, w64 = got.to(torch.float64), want.to(torch.float64)
        bad = ~torch.isfinite(got) & torch.isfinite(want)
        if bool(bad.any()):
            kinds = [k for k, m in (("NaN", got.isnan()), ("inf", got == math.inf), ("-inf", got == -math.inf))
                     if bool((m & bad).any())]
            return "nonfinite", (f"has {' and '.join(kinds)} at {int(bad.sum())} of {bad.numel()} entries where the "
                                 f"right answer is finite{_where(bad, case)}.")
        differ = (((g64 - w64).abs() > tol) | want.isnan()) & ~(got.isnan() & want.isnan()) & (got != want)
    else:
        differ = got != want
    n, total = int(differ.sum()), differ.numel()
    if not n:
        return "equal", "has the right values."
    weak = "entries", f"differs at {n} of {total} entries{_where(differ, case)}, e.g. at {_first(differ, got, want)}."
    if not strong:
        return weak
    if want.dtype == torch.bool and torch.equal(got, ~want):
        return "inverted", ("is the opposite of the right one at every entry: True where it should be False (the polarity "
                            "swapped).")
    if want.dtype == torch.bool and (got.all() or not got.any()):
        return "constant", f"is {bool(got.flatten()[0])} at every entry, expected {int(want.sum())} True of {total}."
    if want.ndim >= 2 and want.shape[-1] == want.shape[-2] and same(got, want.mT, atol):
        return "transposed", "is the transpose of the right one: rows and columns swapped (the last two axes)."
    for a, b in itertools.combinations(range(want.ndim), 2):  # two axes of one size swapped
        if want.shape[a] == want.shape[b] > 1 and same(got, want.transpose(a, b), atol):
            return "transposed", f"is the right one with axes {a} and {b} swapped (a transpose({a}, {b}) missing or extra)."
    if want.is_floating_point():
        delta, ratio = g64 - w64, g64 / w64
        finite = torch.isfinite(w64) & torch.isfinite(g64)
        varied = n and bool((w64 != w64.flatten()[0]).any())  # one right value everywhere: offset and factor alike
        if finite.all() and varied and float(delta.max() - delta.min()) <= tol:
            return "offset", f"is the right one plus the same {float(delta.flatten()[0]):.4g} at every entry."
        nz = finite & (w64.abs() > 1e-6)  # a ratio measured where the right value is not tiny, and held where it is
        fits = lambda f: bool(((g64 - f * w64).abs() <= tol)[differ & ~nz].all())  # noqa: E731
        if varied and bool(nz.any()) and bool(finite[differ].all()) and fits(float(ratio[nz][0])):
            r = ratio[nz]
            if not r.any():
                return "zeros", ("is 0 at every entry where the right one is not: nothing computed or added there, "
                                 "or a value that underflowed (an exp far below 0), or a NaN turned to 0.")
            rel = max(1e-6, 16 * torch.finfo(got.dtype).eps)  # a factor measured at the answer's precision
            if float(r.max() - r.min()) <= rel * float(r.abs().max()) and abs(float(r[0]) - 1) > rel:
                return "factor", (f"is {float(r[0]):.4g} times the right one at every entry{_root(float(r[0]))}"
                                  f"{_per(case, float(r[0]))}.")
        rows = delta.reshape(-1, delta.shape[-1]) if want.ndim >= 2 and want.shape[-1] > 1 else None
        right = w64.reshape(-1, want.shape[-1])  # (a column where the right one is one value: a factor, an offset)
        if rows is not None and len(rows) > 1 and finite.all() and float((rows - rows[0]).abs().max()) <= tol and \
                bool(((right - right[0]).abs() > tol).any(0)[rows[0].abs() > tol].all()):
            shown = ", ".join(f"{float(v):.4g}" for v in rows[0][:4]) + ", ..." * (len(rows[0]) > 4)
            return "bias", (f"is the right one plus the same vector [{shown}] at every position (along the last "
                            f"axis, of size {want.shape[-1]}): a bias added twice, or left out.")
        gap = float((g64 - w64)[differ].abs().max()) if n else 0.0
        near = (((g64 - w64).abs() <= 1e-4 * w64.abs().clamp(min=1.0)) & finite)[differ]  # each entry, its own size
        r = ratio[differ & (w64 != 0)]  # one factor near 1 on every entry: a constant added, not float32's rounding
        if n and bool(near.all()) and r.numel() > 1 and float(r.max() - r.min()) < 1e-3 * float((r - 1).abs().min()):
            return "epsilon", (f"is {float(r[0]):.12g} times the right one wherever it differs: a small constant "
                               f"added where it divides (an epsilon in a sum, {1 / float(r[0]) - 1:+.0e}?).")
        if want.dtype == torch.float64 and n and bool(near.all()):  # float32's rounding, carried through
            return "float32", (f"agrees with the right one only to {gap:.1g}, FLOAT32 PRECISION: part of it ran in "
                               f"float32 (a tensor made without dtype=, which is float32, or a .float()); keep the "
                               f"inputs' float64.")
        if 1 < n < total and finite[differ].all():  # some entries only: the same offset or factor on all of them
            d, r, rel = delta[differ], ratio[differ], max(1e-6, 16 * torch.finfo(got.dtype).eps)
            at = f"at the {n} of {total} entries that differ{_where(differ, case)}"
            if not g64[differ].any():
                return "zeros", f"is 0 {at}, right elsewhere: nothing computed or kept there (or a NaN turned to 0)."
            if float(d.max() - d.min()) <= tol:
                return "offset", f"is the right one plus the same {float(d[0]):.4g} {at}, right elsewhere."
            if bool((w64[differ].abs() > 1e-6).all()) and float(r.max() - r.min()) <= rel * float(r.abs().max()):
                return "factor", f"is {float(r[0]):.4g} times the right one{_root(float(r[0]))} {at}, right elsewhere."
        nz = w64.abs() > 1e-6  # a factor per row (rows of zeros right as they are)
        if want.ndim and want.shape[-1] > 1 and finite.all() and not (differ & ~nz).any() and nz.any(-1).sum() > 1:
            hi, lo = ratio.masked_fill(~nz, -math.inf).amax(-1), ratio.masked_fill(~nz, math.inf).amin(-1)
            some = nz.any(-1)
            if bool(((hi - lo)[some] <= 1e-6 * hi[some].abs()).all()):
                return "rows", (f"is the right one with each row (last axis) times a factor of its own, from "
                                f"{float(lo[some].min()):.4g} to {float(hi[some].max()):.4g}: a division or product once "
                                f"too often or too few (by a row's sum, its l, a count), or a normalisation over the "
                                f"wrong entries.")
    if want.ndim == 2 and want.shape[0] % want.shape[1] == 0 and want.shape[0] > want.shape[1]:  # blocks, each turned
        c = want.shape[1]
        if same(got.reshape(-1, c, c).mT.reshape(want.shape), want, atol):
            return "blocks", (f"holds each ({c}, {c}) block of the right one transposed: W.T where W belongs, or W "
                              f"where W.T does.")
    for axis in range(want.ndim):
        perm = _permutation(got, want, axis, tol)
        if perm is not None:
            return f"order {axis}", (f"holds the right slices along axis {axis} in another order: position i holds "
                                     f"the right answer's {perm} ({_kind(perm)}).")
    if got.numel() > 1 and same(got.flatten().sort().values, want.flatten().sort().values, atol):
        return "arranged", (f"holds the right values, arranged differently: {n} of {total} entries moved"
                            f"{_where(differ, case)}.")
    return weak

def _root(r: float) -> str:
    """" (√8)" for 2.828, " (1/√6)" for 0.408: a square root of a whole number that is not itself whole; 0: none."""
    for value, name in ((r * r, "√{:.0f}"), (1 / (r * r) if r else 0.0, "1/√{:.0f}")):
        if abs(value - round(value)) < 1e-6 and round(value) > 1 and math.isqrt(round(value)) ** 2 != round(value):
            return " (" + name.format(round(value)) + ")"
    return ""

def _per(case: Case, r: float) -> str:
    """", 1/4 (S = 4)": a factor one over a size of the case, or a size, 3 or more (a mean for a sum, a sum for a
    mean; a 2 or 1/2 is often a constant)."""
    n, m = round(1 / r) if r else 0, round(r)
    if n > 2 and abs(1 / r - n) < 1e-9 and _names(case, n):
        return f", 1/{n}{_names(case, n)}"
    return f", {m}{_names(case, m)}" if m > 2 and abs(r - m) < 1e-9 and _names(case, m) else ""

def _permutation(got, want, axis: int, tol: float):
    size = want.shape[axis]
    if size < 2:
        return None
    perm = []
    for i in range(size):  # (equal slices are interchangeable: each is matched to one not yet taken)
        g = got.select(axis, i)
        match = [j for j in range(size) if j not in perm and same(g, want.select(axis, j), tol)]
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
    """Where the differing entries lie: a region the case marks; some indices of a leading axis (a head, a
    sentence); the diagonal, whole rows or columns, a triangle."""
    if not bool(differ.any()):
        return ""
    for name, region in case.marks.items():
        if region.shape == differ.shape and not (differ & ~region).any():
            return f", all of them {name}"
    at = [(a, hit.nonzero().flatten().tolist()) for a in range(differ.ndim - 2) if differ.shape[a] > 1 and
          not bool((hit := differ.movedim(a, 0).flatten(1).any(1)).all())] if differ.sum() > 1 else []  # one head
    lead = ", all of them at " + " and ".join(f"index {i[0]} of axis {a}" if len(i) == 1 else f"indices {i} of axis {a}" for a, i in at) \
        if at else ""
    return lead + _region(differ, ", " if lead else ", all of them ")

def _region(differ: torch.Tensor, words: str) -> str:
    if differ.ndim < 2 or min(differ.shape[-2:]) < 2:  # a vector (a column of m, say) has no diagonal, no rows
        return ""
    if differ.ndim == 2:
        for axis, name in ((-1, "rows"), (-2, "columns")):
            whole = differ.all(axis, keepdim=True)
            if not (differ & ~whole).any():
                return f", whole {name} {whole.flatten().nonzero().flatten().tolist()}"
    if differ.shape[-1] != differ.shape[-2]:  # (L, d) has no diagonal to speak of: a square (L, L) has
        return ""
    i, j = torch.arange(differ.shape[-2])[:, None], torch.arange(differ.shape[-1])[None, :]
    if not (differ & (i != j)).any():
        return f"{words}on the diagonal"
    for name, region in (("above the diagonal", j > i), ("below the diagonal", j < i),
                         ("on or above the diagonal", j >= i), ("on or below the diagonal", j <= i)):
        if not (differ & ~region).any():
            return f"{words}{name}"
    return ""

def _first(differ, got, want) -> str:
    index = tuple(differ.nonzero()[0].tolist())
    number = lambda v: repr(v) if isinstance(v, bool) else f"{v:.4g}"  # noqa: E731
    return f"{list(index)}: expected {number(want[index].item())}, got {number(got[index].item())}"
