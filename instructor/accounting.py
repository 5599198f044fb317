"""Every file of a submissions folder accounted for: which are graded, as which chapter, and why the others are not.

:func:`account` looks at every file under ``<dir>`` without running anything and returns one :class:`Entry` per
file (and one per empty student folder). A notebook is graded when it stands in a student folder,
``<dir>/<student>/<file>.ipynb``, is valid JSON, and is recognised as a chapter:

* by its **name**: the chapter's own (``03_masks.ipynb``) or a renamed copy of it, as browsers and file managers
  make them, in any case: ``03_masks (1).ipynb``, ``03_masks-2.ipynb``, ``03_Masks_copy.ipynb``,
  ``Copy of 03_masks.ipynb``;
* by its **content**: the nbgrader ``grade_id``s of its cells (every solution and test cell has one), or else its
  title (the chapter's ``# `` heading).

When name and content disagree, the content wins: ``03_masks.ipynb`` that holds chapter 2 is "chapter 2
(02_softmax) saved as 03_masks.ipynb", graded as 02_softmax when the student handed in no other 02_softmax, and
otherwise not graded. When a student has several candidates for one chapter, one is graded: the most recently
modified file, ties going to the file with the chapter's exact name, then to the first name in sort order; each
other one is reported as not graded, naming the one that was.

Everything else is reported, with a reason a person understands: invalid JSON (with the line), JSON that is no
notebook, a file that is no notebook, a notebook of no chapter, a file outside any student folder or in a folder
nested inside one, an empty student folder.

The grading itself (``instructor.grade``) takes the entries whose ``chapter`` is set, one at a time: a runner
that works in parallel, or in a sandbox, takes the same list.
"""
from __future__ import annotations

import json
import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from .exercises import chapters, load, nbgrader, source

# Reasons a file is not graded, as the summary counts them (Entry.kind).
INVALID_JSON = "not a notebook (invalid JSON)"
NOT_NOTEBOOK = "not a notebook (JSON of another kind)"
UNKNOWN_FILE = "not a notebook (another kind of file)"
NO_CHAPTER = "a notebook of no chapter"
SECOND_COPY = "a second copy of a chapter already graded"
FOREIGN_TAKEN = "another chapter, handed in under its own name too"
OUTSIDE = "not in a student folder"
NESTED = "in a folder inside a student folder"
EMPTY = "empty student folder"
GRADING_FAILED = "the notebook's own run failed (kernel died, stopped or timed out)"


@dataclass
class Entry:
    path: str  # relative to the submissions folder, with "/"
    student: str | None
    chapter: str | None = None  # the chapter it is graded as; None: not graded
    note: str = ""  # for a graded file: how it was recognised, when not by its exact name
    kind: str = ""  # for a file not graded: one of the reasons above
    reason: str = ""  # for a file not graded: the reason, in full

    @property
    def graded(self) -> bool:
        return self.chapter is not None


@dataclass
class Chapter:
    stem: str  # "03_masks"
    grade_ids: frozenset
    title: str

    @property
    def number(self) -> int:
        return int(self.stem[:2])

    def __str__(self) -> str:
        return f"chapter {self.number} ({self.stem})"


def title_of(nb: dict) -> str:
    for cell in nb.get("cells", []):
        if isinstance(cell, dict) and cell.get("cell_type") == "markdown":
            for line in source(cell).splitlines():
                if line.startswith("# "):
                    return line[2:].strip()
    return ""


def grade_ids(nb: dict) -> set[str]:
    return {nbgrader(cell).get("grade_id") for cell in nb.get("cells", []) if isinstance(cell, dict)} - {None}


def course_chapters(paths: list[Path] | None = None) -> list[Chapter]:
    """What recognises each chapter: its name, its cells' grade_ids and its title."""
    found = []
    for path in chapters() if paths is None else paths:
        nb = load(path)
        found.append(Chapter(path.stem, frozenset(grade_ids(nb)), title_of(nb)))
    return found


COPY_MARKS = re.compile(r"(?:\s*\(\d+\)|[\s_-]+\d+|[\s_-]*copy(?:[\s_-]*\d+)?)$")


def chapter_by_name(name: str, known: list[Chapter]) -> Chapter | None:
    """The chapter a file's name is a copy of: ``Copy of 03_Masks (2).ipynb`` -> 03_masks."""
    stem = name.lower()
    while stem.endswith(".ipynb"):
        stem = stem[:-len(".ipynb")]
    stem = re.sub(r"^(?:copy of\s+)+", "", stem.strip())
    while (shorter := COPY_MARKS.sub("", stem)) != stem:
        stem = shorter
    stem = re.sub(r"[\s-]+", "_", stem.strip())
    return next((chapter for chapter in known if chapter.stem == stem), None)


def chapter_by_content(nb: dict, known: list[Chapter]) -> Chapter | None:
    """The chapter whose grade_ids the notebook shares most; failing any, the chapter with its title."""
    ids = grade_ids(nb)
    best = max(known, key=lambda chapter: len(ids & chapter.grade_ids), default=None)
    if best is not None and ids & best.grade_ids:
        return best
    title = title_of(nb)
    return next((chapter for chapter in known if title and chapter.title == title), None)


def read_notebook(path: Path) -> tuple[dict | None, str]:
    """The notebook, or None and why it is not one."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        return None, "not a notebook: not a text file"
    try:
        nb = json.loads(text)
    except json.JSONDecodeError as error:
        return None, f"not a notebook: invalid JSON at line {error.lineno}, column {error.colno} ({error.msg})"
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        return None, "not a notebook: valid JSON, but without a notebook's list of cells"
    return nb, ""


def account(submissions: Path, known: list[Chapter] | None = None) -> list[Entry]:
    """One entry for every file under ``submissions`` (and for every empty student folder), in path order."""
    known = course_chapters() if known is None else known
    submissions = Path(submissions)
    entries: list[Entry] = []
    candidates: dict[tuple[str, str], list[tuple[Entry, Path, bool]]] = {}
    for path in sorted(submissions.rglob("*")):
        relative = path.relative_to(submissions)
        where = relative.as_posix()
        if path.is_dir():
            if len(relative.parts) == 1 and not any(path.iterdir()):
                entries.append(Entry(where + "/", relative.parts[0], kind=EMPTY,
                                     reason="not graded: an empty student folder, nothing was handed in"))
            continue
        if len(relative.parts) == 1:
            entries.append(Entry(where, None, kind=OUTSIDE, reason="not graded: not in a student folder (expected "
                                 "<student>/<chapter>.ipynb)"))
            continue
        student = relative.parts[0]
        if len(relative.parts) > 2:
            entries.append(Entry(where, student, kind=NESTED, reason=f"not graded: in a folder inside {student}/ "
                                 f"(only {student}/<chapter>.ipynb is graded; move it up to grade it)"))
            continue
        if path.suffix.lower() != ".ipynb":
            entries.append(Entry(where, student, kind=UNKNOWN_FILE,
                                 reason=f"not graded: not a notebook ({path.suffix or 'no extension'})"))
            continue
        nb, why = read_notebook(path)
        if nb is None:
            kind = INVALID_JSON if "invalid JSON" in why else NOT_NOTEBOOK
            entries.append(Entry(where, student, kind=kind, reason=f"not graded: {why}"))
            continue
        by_name, by_content = chapter_by_name(path.name, known), chapter_by_content(nb, known)
        entry = Entry(where, student)
        entries.append(entry)
        if by_content is None:
            entry.kind = NO_CHAPTER
            entry.reason = ("not graded: a notebook of no chapter of the course" if by_name is None else
                            f"not graded: named like {by_name.stem}.ipynb, but holds none of its graded cells "
                            "(no nbgrader grade_id of any chapter, no chapter's title): not a copy of the "
                            "chapter's notebook")
            continue
        if by_name is not None and by_name != by_content:
            entry.note = f"this is {by_content} saved as {path.name}"
        elif path.name != f"{by_content.stem}.ipynb":
            how = "" if by_name is not None else " (recognised by its content)"
            entry.note = f"renamed copy of {by_content.stem}.ipynb{how}"
        exact = by_name is not None and path.name == f"{by_name.stem}.ipynb"
        candidates.setdefault((student, by_content.stem), []).append((entry, path, exact))
    for (student, stem), found in candidates.items():
        # a foreign chapter counts only when the student did not hand that chapter in under its own name
        own = [item for item in found if not item[0].note.startswith("this is")]
        foreign = [item for item in found if item[0].note.startswith("this is")]
        pool = own or foreign
        pool.sort(key=lambda item: (-item[1].stat().st_mtime, not item[2], item[1].name))
        chosen = pool[0][0]
        chosen.chapter = stem
        if chosen.note.startswith("this is"):
            chosen.note += f", graded as {stem} (no other {stem} was handed in)"
        elif chosen.note:
            chosen.note += ", graded as it"
        for entry, path, _ in found:
            if entry is chosen:
                continue
            if entry.note.startswith("this is"):
                entry.kind = FOREIGN_TAKEN
                entry.reason = (f"not graded: {entry.note}; {student} handed in {stem} as "
                                f"{Path(chosen.path).name}, which was graded")
            else:
                entry.kind = SECOND_COPY
                entry.reason = (f"not graded: a second copy of {stem} ({entry.note or 'its own name'}); "
                                f"{Path(chosen.path).name} was graded (the rule: the newest file; on a tie, the "
                                f"chapter's exact name)")
            entry.note = ""
    entries.sort(key=lambda entry: entry.path)
    return entries


def summary(entries: list[Entry], failures: dict[tuple[str, str], str] | None = None) -> str:
    """What happened to the class, as text: students, notebooks graded, those whose own run failed, files not graded
    and why. ``failures``: (student, chapter) -> why the notebook's own run failed (the kernel died, ...); such a
    notebook is still graded, from its checks re-run apart from it (instructor/verdict.py), but gets no feedback."""
    failures = {key: why for key, why in (failures or {}).items() if why}
    students = sorted({entry.student for entry in entries if entry.student})
    graded = [entry for entry in entries if entry.graded]
    failed = [entry for entry in graded if (entry.student, entry.chapter) in failures]
    skipped = [entry for entry in entries if not entry.graded]
    kinds = Counter(entry.kind for entry in skipped)
    noted = sorted((entry for entry in graded if entry.note), key=lambda entry: entry.path)
    renamed = sum(bool(entry.note) for entry in graded)
    lines = [f"students: {len(students)}",
             f"notebooks graded: {len(graded)}" + (f" ({renamed} renamed or another chapter, see the notes below)"
                                                   if renamed else ""),
             f"  of which the notebook's own run failed: {len(failed)} (no feedback; see below)",
             f"not graded: {len(skipped)}"]
    lines += [f"  {count:4d}  {kind}" for kind, count in sorted(kinds.items(), key=lambda item: (-item[1], item[0]))]
    if noted:
        lines += ["", "graded, with a note:"] + [f"  {entry.path}: {entry.note}" for entry in noted]
    if failed:
        lines += ["", f"{GRADING_FAILED} (its checked exercises were graded by re-running their checks; its open "
                      "ones need a look at the notebook):"]
        lines += [f"  {entry.path}: {failures[entry.student, entry.chapter].removeprefix('not graded: ')}"
                  for entry in sorted(failed, key=lambda entry: entry.path)]
    if skipped:
        lines += ["", "not graded:"]
        lines += [f"  {entry.path}: {entry.reason.removeprefix('not graded: ')}"
                  for entry in sorted(skipped, key=lambda entry: entry.path)]
    return "\n".join(lines) + "\n"
