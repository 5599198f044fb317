"""The chapters' exercises, read from the notebooks: one source for the book, the student edition and grading.

How a notebook marks an exercise (see the instructor guide):

* a markdown ```` ```{exercise} Title ```` directive with ``:label: ex-chN-name``;
* its solution between ```` ```{solution-start} ex-chN-name ```` and ```` ```{solution-end} ````, gated, so that
  code cells may sit inside it. The solution's prose is the BODY of the start directive (JupyterLab folds only the
  start cell's own text into the dropdown: a markdown cell between the gates would stay in plain view; the rules
  test in tests/test_notebooks.py forbids one); prose found between the gates anyway is still cut from the
  student edition. Every code cell between the gates carries nbgrader metadata ``solution: true`` with ``grade_id`` the label (``label-2``, ``label-3`` for further cells);
  ``### BEGIN SOLUTION`` / ``### END SOLUTION`` mark the answer when only part of a cell is (the rest, such as the
  ``def`` line, stays in the student's copy);
* an auto-checked exercise has, after its solution, a test cell: nbgrader ``grade: true``, ``locked: true``,
  ``points``, ``grade_id`` ``label-check``, whose code calls the chapter's checker on the learner's function.

An open exercise (no test cell) is graded by hand. The notebooks need no mark for it: :func:`with_answer_cells`
adds, to the copy that the student edition and grading give nbgrader, a markdown *answer cell* after the exercise's
last solution cell, nbgrader's "manually graded answer" (``solution: true``, ``grade: true``, ``points``
:data:`MANUAL_POINTS`, ``grade_id`` ``label-answer``), where the student writes the answer; the code stub above it
stays for any computation that supports it.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
EXERCISE = re.compile(r"```\{exercise\}\s*(?P<title>[^\n]*)\n:label:\s*(?P<label>\S+)")
# A {solution-start} directive, whole: its options, then its body (the solution's prose, which may hold backticks,
# math and lists), up to the line that closes its fence (as MyST reads it: the same fence, alone on its line).
START = re.compile(r"^[ \t]*(?P<fence>`{3,}|:{3,})\{solution-start\}[ \t]*(?P<label>\S+)[^\n]*(?:\n|$)"
                   r"(?P<options>(?:[ \t]*:[\w-]+:[^\n]*\n)*)(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$", re.M | re.S)
END = re.compile(r"^[ \t]*(?P<fence>`{3,}|:{3,})\{solution-end\}[ \t]*\n[ \t]*(?P=fence)[ \t]*$", re.M)
BEGIN_MARK, END_MARK = "### BEGIN SOLUTION", "### END SOLUTION"
MANUAL_POINTS = 1  # the points of an open exercise, graded by hand


@dataclass
class Exercise:
    chapter: str  # notebook name without .ipynb, e.g. "03_masks"
    number: int  # 1, 2, ... within the chapter
    label: str
    title: str
    solution_cells: list[int] = field(default_factory=list)  # indices of the code cells inside the solution
    test_cells: list[int] = field(default_factory=list)  # indices of the graded test cells
    points: float = 0.0

    @property
    def checked(self) -> bool:
        return bool(self.test_cells)

    @property
    def max_points(self) -> float:
        """What the exercise is worth: its test cells' points, or MANUAL_POINTS for an open one."""
        return self.points if self.checked else MANUAL_POINTS


def load(path: Path) -> dict:
    return json.loads(Path(path).read_text())


def save(nb: dict, path: Path) -> None:
    """Write a notebook the way the repository stores them (indent 1, UTF-8, trailing newline)."""
    Path(path).write_text(json.dumps(nb, indent=1, ensure_ascii=False) + "\n")


def source(cell: dict) -> str:
    return "".join(cell["source"])


def nbgrader(cell: dict) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {})


def solution_spans(nb: dict):
    """For every cell: the label of the gated solution it lies in (wholly or partly), or None.

    A markdown cell may hold the end of one solution and the start of the next exercise; it belongs to the
    solution only by the part between the markers, which :func:`strip_solution_prose` cuts.
    """
    current, spans = None, []
    for cell in nb["cells"]:
        text = source(cell) if cell["cell_type"] == "markdown" else ""
        inside = current
        for match in sorted([*START.finditer(text), *END.finditer(text)], key=lambda m: m.start()):
            current = match.groupdict().get("label") if match.re is START else None
            inside = inside or current
        spans.append(inside if cell["cell_type"] == "markdown" else current)
    return spans


def exercises(path: Path) -> list[Exercise]:
    """The exercises of one chapter notebook, in order, with their solution and test cells and points."""
    nb, chapter = load(path), Path(path).stem
    found: dict[str, Exercise] = {}
    for cell in nb["cells"]:
        if cell["cell_type"] == "markdown":
            for match in EXERCISE.finditer(source(cell)):
                found[match["label"]] = Exercise(chapter, len(found) + 1, match["label"], match["title"].strip())
    for index, (cell, label) in enumerate(zip(nb["cells"], solution_spans(nb))):
        meta = nbgrader(cell)
        if cell["cell_type"] == "code" and label:
            found[label].solution_cells.append(index)
        if meta.get("grade") and cell["cell_type"] == "code":
            exercise = found[meta["grade_id"].removesuffix("-check")]
            exercise.test_cells.append(index)
            exercise.points += float(meta.get("points", 0))
    return list(found.values())


def chapters() -> list[Path]:
    return sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))


def catalogue() -> list[Exercise]:
    """Every exercise of the book, chapter by chapter."""
    return [exercise for path in chapters() for exercise in exercises(path)]


def strip_solution_prose(nb: dict) -> dict:
    """A copy of ``nb`` without the prose of gated solutions: the text between each ``{solution-start}`` and its
    ``{solution-end}`` (both directives included) is cut from the markdown cells, and cells left empty are dropped.
    Code cells inside solutions are left to nbgrader, which replaces their answers with stubs."""
    nb = json.loads(json.dumps(nb))
    cells, inside = [], False
    for cell in nb["cells"]:
        if cell["cell_type"] != "markdown":
            cells.append(cell)
            continue
        text, kept, position = source(cell), [], 0
        for match in sorted([*START.finditer(source(cell)), *END.finditer(source(cell))], key=lambda m: m.start()):
            if not inside and match.re is START:
                kept.append(text[position:match.start()])
                inside = True
            elif inside and match.re is END:
                position, inside = match.end(), False
        if not inside:
            kept.append(text[position:])
        text = "".join(kept).strip("\n")
        if text.strip():
            cell["source"] = (text + "\n").splitlines(True)
            cell["source"][-1] = cell["source"][-1].rstrip("\n")
            cells.append(cell)
    nb["cells"] = cells
    return nb


def answer_cell(exercise: Exercise) -> dict:
    """The manually graded markdown cell in which a student answers an open exercise (nbgrader clears what lies
    between the solution marks to "YOUR ANSWER HERE"; an answer left so scores 0 without a grader)."""
    chapter = f"{int(exercise.chapter[:2])}." if exercise.chapter[:2].isdigit() else ""
    text = (f"**Your answer to Exercise {chapter}{exercise.number}, {exercise.title}** (graded by hand, "
            f"{MANUAL_POINTS:g} point{'s' if MANUAL_POINTS != 1 else ''}):\n\n{BEGIN_MARK}\nYOUR ANSWER HERE\n{END_MARK}")
    meta = {"grade": True, "grade_id": f"{exercise.label}-answer", "locked": False, "points": MANUAL_POINTS,
            "schema_version": 3, "solution": True, "task": False}
    return {"cell_type": "markdown", "id": f"{exercise.label}-answer", "metadata": {"nbgrader": meta},
            "source": text.splitlines(True)}


def with_answer_cells(nb: dict, found: list[Exercise]) -> dict:
    """A copy of ``nb`` with an answer cell after the last solution cell of each open exercise of ``found`` (the
    chapter's exercises; cells are found by grade_id, so ``nb`` may already have lost its solution prose)."""
    nb = json.loads(json.dumps(nb))
    for exercise in found:
        if exercise.checked:
            continue
        own = re.compile(re.escape(exercise.label) + r"(-\d+)?")
        last = max((i for i, cell in enumerate(nb["cells"]) if own.fullmatch(nbgrader(cell).get("grade_id", ""))),
                   default=None)
        if last is not None:
            nb["cells"].insert(last + 1, answer_cell(exercise))
    return nb


def nbgrader_source(path: Path) -> dict:
    """The chapter as nbgrader gets it, for the student edition and for grading: the solution prose cut, an answer
    cell for each open exercise."""
    return with_answer_cells(strip_solution_prose(load(path)), exercises(path))


def markdown_table() -> str:
    """The list of exercises as a Markdown table, for the instructor guide."""
    rows = ["| chapter | # | label | exercise | auto-checked | points |", "|---|---|---|---|---|---|"]
    for ex in catalogue():
        checked = "yes" if ex.checked else "no: graded by hand"
        rows.append(f"| {ex.chapter} | {ex.number} | `{ex.label}` | {ex.title} | {checked} | {ex.max_points:g} |")
    return "\n".join(rows)
