"""Checkers for the chapters' exercises.

Each ``check_*`` function takes the learner's answer (a tensor or a function), runs it, and either prints a line
starting with "Correct" or raises :class:`ExerciseError` that says *what* is wrong (shape, values, a mask the
wrong way round) and how to look for the fix -- not just that it is wrong.
"""


class ExerciseError(AssertionError):
    """The learner's answer is not right yet; the message says what differs."""


def passed(message: str) -> None:
    print(f"Correct: {message}")
