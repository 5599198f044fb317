"""Mutation catalogues of the exercise checkers: for each checker, correct answers in several styles and wrong
answers made from a correct one by one classic mistake each (a *mutant*).

``tests/test_mutation.py`` runs every catalogue: each correct answer must pass; each mutant must be rejected with an
:class:`~attention_course.exercises.ExerciseError` whose message names its mistake (every pattern of ``names``
matches) in words that the message of no *unrelated* mutant contains (mutants of another ``family``). The score per
checker is printed at the end of the test run.

A chapter's catalogues live in ``tests/mutants/chNN.py`` as ``CATALOGUES = [Catalogue(...), ...]``; list the module
in ``MODULES`` below.
"""
from __future__ import annotations

import importlib
import re
from dataclasses import dataclass, field
from typing import Callable

MODULES = ["ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08", "ch09", "ch10", "ch11", "ch12", "ch13"]


@dataclass
class Mutant:
    """One classic mistake applied to a correct answer.

    ``names``: regular expressions (case-insensitive), all of which the checker's message must match: the few words
    a learner needs to find this mistake. ``family``: mutants of one family are the same mistake in other clothes
    (or mistakes a checker cannot tell apart and names together), so their messages may share words; by default
    each mutant is its own family.
    """
    name: str
    answer: object
    names: tuple[str, ...]
    family: str | None = None

    def __post_init__(self):
        if isinstance(self.names, str):
            self.names = (self.names,)
        self.family = self.family or self.name


@dataclass
class Catalogue:
    """A checker, the correct answers it must accept (style -> answer, at least two) and its mutants."""
    checker: Callable
    correct: dict[str, object]
    mutants: list[Mutant] = field(default_factory=list)

    @property
    def name(self) -> str:
        return f"{self.checker.__module__.rsplit('.', 1)[-1]}.{self.checker.__name__}"


def catalogues() -> list[Catalogue]:
    """Every chapter's catalogues, in chapter order; a chapter whose module is missing has none yet."""
    found = []
    for module in MODULES:
        try:
            found += importlib.import_module(f"{__name__}.{module}").CATALOGUES
        except ModuleNotFoundError as err:
            if err.name != f"{__name__}.{module}":
                raise
    return found


def named(message: str, patterns) -> bool:
    return all(re.search(p, message, re.IGNORECASE | re.DOTALL) for p in patterns)


# Filled by tests/test_mutation.py, printed by tests/conftest.py at the end of the run: checker -> mutant -> verdict
# ("named", "rejected, not named", "rejected, unrelated words", "passed", "crashed").
RESULTS: dict[str, dict[str, str]] = {}
