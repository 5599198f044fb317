"""Every checker tested by mutation (catalogues in tests/mutants/): correct answers in several styles pass, and each
classic mistake is rejected with a message that names it, in words an unrelated mistake's message does not use."""
import contextlib
import functools
import io

import pytest

from attention_course.exercises import ExerciseError
from mutants import RESULTS, catalogues, named

CATALOGUES = catalogues()


@functools.cache
def verdict(catalogue_index: int, mutant_index: int) -> tuple[str, str]:
    """(kind, message) of the checker on one mutant: kind is "rejected", "passed" or "crashed" (an exception that
    is not an ExerciseError: a raw traceback instead of a diagnosis)."""
    catalogue = CATALOGUES[catalogue_index]
    mutant = catalogue.mutants[mutant_index]
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            catalogue.checker(mutant.answer)
    except ExerciseError as err:
        return "rejected", str(err)
    except Exception as err:  # noqa: BLE001 - what a learner would see instead of a diagnosis
        return "crashed", f"{type(err).__name__}: {err}"
    return "passed", ""


def test_every_catalogue_has_two_correct_styles_and_mutants():
    assert CATALOGUES, "no catalogue found in tests/mutants/"
    for catalogue in CATALOGUES:
        assert len(catalogue.correct) >= 2, f"{catalogue.name}: give at least two correct answers in other styles"
        assert catalogue.mutants, f"{catalogue.name}: no mutants"
        names = [m.name for m in catalogue.mutants]
        assert len(names) == len(set(names)), f"{catalogue.name}: two mutants share a name"


def launches(catalogue) -> tuple:
    """Chapter 11's checkers start worker processes (seconds a launch), chapter 13's run Triton's interpreter (a
    second a check): slow, left to `make test`."""
    return (pytest.mark.slow,) if catalogue.name.startswith(("ch11.", "ch13.")) else ()


@pytest.mark.parametrize("ci, style", [pytest.param(ci, style, marks=launches(c)) for ci, c in enumerate(CATALOGUES)
                                       for style in c.correct],
                         ids=lambda x: x if isinstance(x, str) else CATALOGUES[x].name)
def test_a_correct_answer_passes(ci, style):
    catalogue = CATALOGUES[ci]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        catalogue.checker(catalogue.correct[style])
    assert out.getvalue().startswith("Correct"), out.getvalue()


@pytest.mark.parametrize("ci, mi", [pytest.param(ci, mi, marks=launches(c)) for ci, c in enumerate(CATALOGUES)
                                    for mi in range(len(c.mutants))],
                         ids=[f"{c.name}-{m.name}" for c in CATALOGUES for m in c.mutants])
def test_a_mutant_is_rejected_and_named(ci, mi):
    catalogue = CATALOGUES[ci]
    mutant = catalogue.mutants[mi]
    kind, message = verdict(ci, mi)
    record = RESULTS.setdefault(catalogue.name, {})
    record[mutant.name] = kind
    assert kind != "passed", f"{mutant.name!r} passes {catalogue.name}"
    assert kind != "crashed", f"{catalogue.name} crashed on {mutant.name!r} instead of naming it: {message}"
    if not named(message, mutant.names):
        record[mutant.name] = "rejected, not named"
        pytest.fail(f"{catalogue.name} rejects {mutant.name!r} but its message does not match {mutant.names}:\n"
                    f"{message}")
    # The words that name this mistake must not also name an unrelated one.
    for other_index, other in enumerate(catalogue.mutants):
        if other.family == mutant.family:
            continue
        other_kind, other_message = verdict(ci, other_index)
        if other_kind == "rejected" and named(other_message, mutant.names):
            record[mutant.name] = "rejected, unrelated words"
            pytest.fail(f"{catalogue.name}: the words {mutant.names} that name {mutant.name!r} also appear in the "
                        f"message for {other.name!r}:\n{other_message}")
    record[mutant.name] = "named"
