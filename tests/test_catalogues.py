"""The diagnosis mechanism's promise, held for every chapter's catalogue (attention_course/exercises/diagnose.py):
the reference passes; every mistake of the catalogue is rejected and named on its own; each pair of mistakes is told
apart by some case (else the cases are not good enough to name either); no mistake is the reference in disguise."""
import contextlib
import importlib
import io
import itertools
import pkgutil

import pytest

import attention_course.exercises as exercises
from attention_course.exercises import ExerciseError
from attention_course.exercises.diagnose import agree, check

MODULES = sorted(m.name for m in pkgutil.iter_modules(exercises.__path__) if m.name.startswith("ch"))
EXERCISES = [(module, ex) for module in MODULES for ex in getattr(importlib.import_module(f"{exercises.__name__}.{module}"),
                                                                  "EXERCISES", [])]


def slow(module):
    """Chapter 11's exercises run in worker processes: left to `make test`."""
    return (pytest.mark.slow,) if module == "ch11" else ()


def ident(module, ex):
    return f"{module}:{ex.what.removeprefix('your ')}"


def verdict(ex, answer, name=None) -> str:
    """What check says of ``answer``. ``name``: the catalogue's name of ``answer`` (a mistake): check runs it on every
    case as the answer, and names it by comparing those outcomes with the catalogue's, the outcomes of each mistake
    on each case (``ex.expected``, kept once computed); the answer's are kept there as the mistake's, so that the
    mistake runs once per case in this file, not a second time as the catalogue's (half the time of the layers')."""
    out = io.StringIO()
    if name is not None:
        def outcome(given, case, run=ex.outcome):
            found = run(given, case)
            if given is answer:  # not wrapped by check (no forbidden function to watch): the mistake itself
                ex._memo.setdefault((name, id(case)), found)
            return found
        ex.outcome = outcome
    try:
        with contextlib.redirect_stdout(out):
            check(ex, answer)
    except ExerciseError as err:
        return str(err)
    finally:
        vars(ex).pop("outcome", None)
    return out.getvalue()


@pytest.mark.parametrize("module, ex", [pytest.param(m, e, marks=slow(m), id=ident(m, e)) for m, e in EXERCISES])
def test_the_reference_passes(module, ex):
    assert verdict(ex, ex.reference).startswith("Correct")


MISTAKES = [pytest.param(m, e, k, marks=slow(m), id=f"{ident(m, e)}-{k.name}") for m, e in EXERCISES for k in e.mistakes]


@pytest.mark.parametrize("module, ex, mistake", MISTAKES)
def test_each_mistake_is_rejected_and_named_on_its_own(module, ex, mistake):
    message = verdict(ex, mistake.answer, mistake.name)
    assert not message.startswith("Correct"), f"{mistake.name} passes: it is the reference on every case"
    assert mistake.says in message, f"{mistake.name} is not named; the message was:\n{message}"


@pytest.mark.parametrize("module, ex", [pytest.param(m, e, marks=slow(m), id=ident(m, e)) for m, e in EXERCISES])
def test_each_pair_of_mistakes_is_told_apart_by_some_case(module, ex):
    outcome = {(m.name, i): ex.expected(m.name, m.answer, c) for m in ex.mistakes for i, c in enumerate(ex.cases)}
    alike = [(a.name, b.name) for a, b in itertools.combinations(ex.mistakes, 2)
             if all(agree(outcome[a.name, i], outcome[b.name, i], ex.atol) for i in range(len(ex.cases)))]
    assert not alike, f"no case tells these mistakes apart: add a case that does, {alike}"


def test_every_chapter_with_exercises_has_a_catalogue():
    with_checkers = [m for m in MODULES if any(n.startswith("check_") for n in
                                               dir(importlib.import_module(f"{exercises.__name__}.{m}")))]
    assert [m for m in with_checkers if not getattr(importlib.import_module(f"{exercises.__name__}.{m}"),
                                                   "EXERCISES", None)] == []
