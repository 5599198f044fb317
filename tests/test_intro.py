"""The introduction's numbers about the exercises are the notebooks' numbers (counted with instructor/exercises.py)."""
import re
from pathlib import Path

from instructor.exercises import catalogue

INTRO = " ".join((Path(__file__).resolve().parents[1] / "book" / "intro.md").read_text().split())


def counts(chapters):
    """(exercises, exercises with a checker) of the chapters numbered in ``chapters``."""
    found = [ex for ex in catalogue() if int(ex.chapter[:2]) in chapters]
    return len(found), sum(ex.checked for ex in found)


LAST = len(list((Path(__file__).resolve().parents[1] / 'notebooks').glob('[0-9][0-9]_*.ipynb')))  # the last chapter


def stated(pattern: str) -> tuple[int, ...]:
    match = re.search(pattern, INTRO)
    assert match, f"the introduction no longer says {pattern!r}: update this test with it"
    return tuple(int(n) for n in match.groups())


def test_the_intro_counts_the_checked_exercises():
    total, checked = counts(range(1, LAST + 1))
    assert stated(r"(\d+) of the (\d+) exercises come with a checker") == (checked, total)


def test_the_intro_counts_them_by_part_of_the_book():
    first, first_checked = counts(range(1, 7))
    assert stated(r"Those are (\d+) of the (\d+) exercises of chapters 1 to 6") == (first_checked, first)
    assert "(none of chapter 1's)" in INTRO and counts([1])[1] == 0 < counts([1])[0]
    last, last_checked = counts(range(7, LAST + 1))
    assert stated(rf"and (\d+) of the (\d+) of chapters 7 to {LAST}\b") == (last_checked, last)
