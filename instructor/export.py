"""Grades as tables to hand on: ``grades_wide.csv`` for reading, ``canvas.csv`` for Canvas's gradebook import.

Both are made from the rows of ``grades.csv`` (:data:`COLUMNS`, one row per student and exercise) and need no
nbgrader.

``grades_wide.csv``: one row per student (every student folder, also those with nothing graded), columns:

* ``student``;
* one per exercise of each chapter anyone handed in, named by its label (``ex-ch3-padding-mask``), holding the
  points; empty when the student's notebook of that chapter was not graded, or when an open exercise is still to
  be graded by hand;
* ``<chapter> total`` after each chapter's exercises: the sum of the points given so far (empty without a graded
  notebook of that chapter);
* ``total``: the sum over chapters; ``to grade by hand``: how many open exercises of the student wait for a grader.

``canvas.csv`` (with ``--roster``): the roster's identifying columns as Canvas exports them (``Student``, ``ID``,
``SIS User ID``, ``SIS Login ID``, ``Section``), then one column per chapter (an assignment each) with the
student's points for it, the chapter's total as in ``grades_wide.csv``. A column is named by the chapter
(``03_masks``), and ``03_masks (123)`` when Canvas's assignment id is given (``--canvas-assignment
03_masks=123``): Canvas then fills that assignment, and otherwise creates one named so. The second row is Canvas's
``Points Possible`` row. Every roster student has a row, empty for a chapter without a graded notebook; a student
folder is matched to the roster by ``SIS Login ID``, ``SIS User ID``, ``ID`` or ``Student`` (case ignored), and a
folder that matches none is listed in the summary, not in ``canvas.csv``.
"""
from __future__ import annotations

import csv
from pathlib import Path

from .exercises import Exercise

COLUMNS = ["student", "notebook", "exercise", "passed", "points", "message", "max_points", "file", "note"]
ROSTER_COLUMNS = ["Student", "ID", "SIS User ID", "SIS Login ID", "Section"]
MATCHED_BY = ["SIS Login ID", "SIS User ID", "ID", "Student"]


def number(text: str) -> float | None:
    try:
        return float(text)
    except (TypeError, ValueError):
        return None


def fmt(value: float | None) -> str:
    return "" if value is None else f"{value:g}"


def chapter_points(rows: list[dict]) -> dict[tuple[str, str], float]:
    """(student, chapter) -> the points given so far, for every notebook graded (exercise rows only)."""
    totals: dict[tuple[str, str], float] = {}
    for row in rows:
        if row["exercise"]:
            key = (row["student"], row["notebook"])
            totals[key] = totals.get(key, 0.0) + (number(row["points"]) or 0.0)
    return totals


def wide(rows: list[dict], chapters: dict[str, list[Exercise]], students: list[str]) -> list[list[str]]:
    """The wide table (a header, then a row per student): ``chapters`` maps each chapter shown to its exercises."""
    header = ["student"]
    for chapter, found in chapters.items():
        header += [exercise.label for exercise in found] + [f"{chapter} total"]
    header += ["total", "to grade by hand"]
    points = {(row["student"], row["notebook"], row["exercise"]): row for row in rows if row["exercise"]}
    totals = chapter_points(rows)
    table = [header]
    for student in students:
        line, overall, waiting = [student], None, 0
        for chapter, found in chapters.items():
            for exercise in found:
                row = points.get((student, chapter, exercise.label))
                line.append(row["points"] if row else "")
                waiting += bool(row and row["passed"] == "manual" and row["points"] == "")
            total = totals.get((student, chapter))
            line.append(fmt(total))
            overall = overall if total is None else (overall or 0.0) + total
        table.append(line + [fmt(overall), str(waiting)])
    return table


def read_roster(path: Path) -> list[dict]:
    """The students of a Canvas gradebook export (or any CSV with its identifying columns); its "Points Possible"
    row, if any, is skipped."""
    with Path(path).open(newline="", encoding="utf-8-sig") as f:
        reader = csv.DictReader(f)
        missing = [column for column in ("Student", "ID") if column not in (reader.fieldnames or [])]
        if missing:
            raise SystemExit(f"{path}: a roster needs the columns {ROSTER_COLUMNS} (as Canvas's gradebook export "
                             f"has them); missing {missing}")
        return [row for row in reader if not (row.get("Student") or "").strip().startswith("Points Possible")]


def match_roster(students: list[str], roster: list[dict]) -> tuple[dict[str, dict], list[str]]:
    """Each student folder's roster row (by SIS Login ID, SIS User ID, ID, then name; case ignored), and the
    folders that match no one."""
    index: dict[str, dict] = {}
    for column in reversed(MATCHED_BY):  # the earlier columns win a clash
        for person in roster:
            key = (person.get(column) or "").strip().lower()
            if key:
                index[key] = person
    matched = {student: index[student.lower()] for student in students if student.lower() in index}
    return matched, [student for student in students if student not in matched]


def canvas(rows: list[dict], chapters: dict[str, list[Exercise]], roster: list[dict],
           assignment_ids: dict[str, str] | None = None) -> tuple[list[list[str]], list[str]]:
    """The Canvas import table, and the student folders not in the roster."""
    assignment_ids = assignment_ids or {}
    students = sorted({row["student"] for row in rows if row["student"]})
    matched, unknown = match_roster(students, roster)
    by_person = {id(person): student for student, person in matched.items()}
    names = [f"{chapter} ({assignment_ids[chapter]})" if chapter in assignment_ids else chapter
             for chapter in chapters]
    table = [ROSTER_COLUMNS + names,
             ["    Points Possible", "", "", "", ""] + [fmt(sum(e.max_points for e in found))
                                                       for found in chapters.values()]]
    totals = chapter_points(rows)
    for person in roster:
        student = by_person.get(id(person))
        table.append([person.get(column, "") or "" for column in ROSTER_COLUMNS] +
                     [fmt(totals.get((student, chapter))) for chapter in chapters])
    return table, unknown


def write(table: list[list[str]], path: Path) -> Path:
    with Path(path).open("w", newline="", encoding="utf-8") as f:
        csv.writer(f).writerows(table)
    return path
