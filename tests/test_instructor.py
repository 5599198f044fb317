"""The instructors' side: exercises marked for nbgrader, a student edition without a trace of the solutions, and
grading a folder of submissions (`make student` builds the edition before the tests run; grading needs the
nbgrader environment `make` creates, .venv-grader/)."""
import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from instructor import leaks  # noqa: E402
from instructor.exercises import (  # noqa: E402
    BEGIN_MARK, END_MARK, catalogue, chapters, exercises, load, nbgrader, solution_spans, source,
    strip_solution_prose,
)

STUDENT = ROOT / "_build" / "student"
GRADER_PYTHON = ROOT / ".venv-grader" / "bin" / "python"
needs_edition = pytest.mark.skipif(not (STUDENT / "html").exists(), reason="run `make student` first")
needs_nbgrader = pytest.mark.skipif(not GRADER_PYTHON.exists(), reason="needs .venv-grader (make student)")


# --- the marks in the chapters ----------------------------------------------------------------------------------

@pytest.mark.parametrize("path", chapters(), ids=lambda p: p.name)
def test_solutions_are_marked_for_nbgrader(path):
    nb, ids = load(path), []
    for index, (cell, label) in enumerate(zip(nb["cells"], solution_spans(nb))):
        meta = nbgrader(cell)
        where = f"{path.name} cell {index}"
        if cell["cell_type"] == "code" and label:
            assert meta.get("solution") is True and not meta.get("grade"), f"{where}: a solution cell needs solution: true"
            assert re.fullmatch(re.escape(label) + r"(-\d+)?", meta.get("grade_id", "")), f"{where}: grade_id {label}"
            text = source(cell)
            assert text.count(BEGIN_MARK) == text.count(END_MARK) >= 1, f"{where}: {BEGIN_MARK} ... {END_MARK}"
            assert cell["metadata"].get("jupyter", {}).get("source_hidden") is True, where
        elif meta.get("grade"):
            assert cell["cell_type"] == "code" and label is None, f"{where}: a test cell stands after the solution"
            assert meta.get("locked") is True and meta.get("points", 0) > 0, f"{where}: locked, with points"
            assert meta["grade_id"].endswith("-check") and re.search(r"^check_\w+\(", source(cell), re.M), where
        else:
            assert BEGIN_MARK not in source(cell), f"{where}: solution marks in a cell not marked as a solution"
        if meta.get("grade_id"):
            ids.append(meta["grade_id"])
    assert len(ids) == len(set(ids)), f"{path.name}: grade_ids must be unique"


def test_every_exercise_has_a_solution_and_the_checked_ones_a_test():
    found = catalogue()
    assert len({ex.label for ex in found}) == len(found) >= 18
    assert sum(ex.checked for ex in found) >= 10
    for ex in found:
        assert ex.label.startswith(f"ex-ch{int(ex.chapter[:2])}-"), ex.label
        if ex.checked:
            assert ex.solution_cells and ex.solution_cells[0] < ex.test_cells[0], ex.label


def test_solution_prose_is_cut_between_the_gates():
    cells = [
        {"cell_type": "markdown", "metadata": {}, "source": "Intro.\n\n```{exercise} T\n:label: ex-ch9-a\n\nDo it.\n```\n"},
        {"cell_type": "markdown", "metadata": {}, "source": "```{solution-start} ex-ch9-a\n:class: dropdown\n```\n\nSECRET one"},
        {"cell_type": "code", "metadata": {}, "source": "x = 1", "outputs": [], "execution_count": None},
        {"cell_type": "markdown", "metadata": {}, "source": "SECRET two\n\n```{solution-end}\n```\n\nAfter."},
    ]
    stripped = strip_solution_prose({"cells": cells, "metadata": {}, "nbformat": 4, "nbformat_minor": 5})
    text = json.dumps(stripped)
    assert "SECRET" not in text and "solution-start" not in text and "solution-end" not in text
    assert "Do it." in text and "After." in text and "x = 1" in text  # code is nbgrader's to clear


FIXTURE = ROOT / "tests" / "fixtures" / "solution_in_body.ipynb"  # chapter 3's Ex. 3.2, its prose in the body
PROSE = "Fill with $-\\infty$ before the softmax"


@pytest.mark.parametrize("text, body", [
    ("```{solution-start} ex-a\n:class: dropdown\n```\n", ""),
    ("```{solution-start} ex-a\n:class: dropdown\n\nUse `x[..., None]`, then $e^{-\\infty} = 0$:\n\n- one;\n- two.\n```",
     "\nUse `x[..., None]`, then $e^{-\\infty} = 0$:\n\n- one;\n- two.\n"),
    ("````{solution-start} ex-a\n:class: dropdown\n\nLike this:\n\n```python\nx = 1\n```\n````\nAfter.",
     "\nLike this:\n\n```python\nx = 1\n```\n"),
    (":::{solution-start} ex-a\n:class: dropdown\nThe `body`.\n:::\n", "The `body`.\n"),
])
def test_a_start_directive_is_read_whole(text, body):
    """Options and body up to the closing fence, whatever the body holds (backticks, math, lists, code blocks)."""
    from instructor.exercises import START

    match = START.search(text)
    assert match and match["label"] == "ex-a" and match["body"] == body
    assert text[match.end():].lstrip("\n") in ("", "After.")


def test_a_solution_in_the_start_directives_body():
    """Chapter 3's Ex. 3.2 converted: the prose in the start directive is solution prose, cut from the student's
    notebook and looked for by the leak check; the code between the gates is the solution's code."""
    nb = load(FIXTURE)
    assert solution_spans(nb) == [None, None, None, *["ex-ch3-masked-softmax"] * 3, None]
    [exercise] = exercises(FIXTURE)
    assert exercise.label == "ex-ch3-masked-softmax" and exercise.solution_cells == [4]
    text = json.dumps(strip_solution_prose(nb))
    assert "Fill with" not in text and "0 / 0" not in text and "solution-start" not in text
    assert "Write `my_masked_softmax" in text and "A query whose keys" in text and "### BEGIN SOLUTION" in text
    solution, other = leaks.split([FIXTURE])
    assert any(line.startswith(PROSE) for line in solution) and not any("Fill with" in line for line in other)
    assert not any(line.startswith((":class:", "```")) for line in solution)
    prints = leaks.fingerprints([FIXTURE])
    assert any(p.startswith(PROSE) for p in prints) and any("masked_fill(mask" in p for p in prints)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """{name: the folder of its student copy} for the two notebooks the tests below release: FIXTURE, and chapter 3
    with its padding-mask answer copied into an ordinary cell (planted). Released by one nbgrader run, as `make
    student` releases every chapter (instructor/student.py: each generated as it would be alone; one nbgrader start
    and gradebook instead of two, some 4 s), then each copy in a folder of its own, where its test's leak check
    reads it alone."""
    from instructor import student

    tmp = tmp_path_factory.mktemp("released")
    nb = load(ROOT / "notebooks" / "03_masks.ipynb")
    answer_cell = next(c for c in nb["cells"] if nbgrader(c).get("grade_id") == "ex-ch3-padding-mask")
    planted = {"cell_type": "code", "execution_count": None, "id": "planted", "metadata": {}, "outputs": [],
               "source": [line for line in answer_cell["source"] if "### " not in line]}
    nb["cells"].insert(5, planted)
    chapter = tmp / "chapter" / "03_masks.ipynb"
    chapter.parent.mkdir()
    chapter.write_text(json.dumps(nb))
    folders = {}
    for name, path in zip(("body", "planted"), student.release(tmp / "course", tmp / "all", paths=[FIXTURE, chapter])):
        folders[name] = tmp / name
        folders[name].mkdir()
        shutil.move(path, folders[name] / path.name)
    return folders


@needs_nbgrader
def test_the_student_copy_of_a_solution_in_the_body(released):
    """Released with nbgrader: neither the prose nor the answer reaches the student; the leak check agrees."""
    text = json.dumps(load(released["body"] / FIXTURE.name))
    assert "raise NotImplementedError()" in text and "Fill with" not in text and "torch.softmax" not in text
    assert leaks.find(released["body"], prints=leaks.fingerprints([FIXTURE]), words=set()) == []


# --- no leaks -----------------------------------------------------------------------------------------------------

def test_fingerprints_are_the_answers_not_the_scaffolding():
    prints = leaks.fingerprints()
    assert len(prints) > 50
    joined = "\n".join(prints)
    assert "positions >= torch.tensor(lengths)" in joined  # ex-ch3-padding-mask's answer
    assert "def batch_padding_mask(lengths, max_len):" not in prints  # the def line stays in the student's copy


@needs_edition
def test_the_student_edition_holds_no_solution():
    found = leaks.find(STUDENT)
    assert not found, "solution text in the student edition:\n" + "\n".join(found[:20])


@needs_edition
def test_the_student_edition_has_what_students_need():
    notebooks = sorted((STUDENT / "notebooks").glob("*.ipynb"))
    assert [p.name for p in notebooks] == [p.name for p in chapters()]
    student = load(STUDENT / "notebooks" / "03_masks.ipynb")
    stub = next(c for c in student["cells"] if nbgrader(c).get("grade_id") == "ex-ch3-padding-mask")
    assert source(stub).startswith("def batch_padding_mask(lengths, max_len):")
    assert "# YOUR CODE HERE" in source(stub) and "raise NotImplementedError()" in source(stub)
    page = (STUDENT / "html" / "notebooks" / "03_masks.html").read_text()
    assert "ex-ch3-padding-mask" in page and "check_padding_mask" in page  # the exercise and its test stay
    assert "colab.research.google.com" not in page  # the Colab button would open the full notebook
    assert not (STUDENT / "html" / "_colab").exists()
    download = STUDENT / "html" / "_sources" / "notebooks" / "03_masks.ipynb"
    assert load(download) == student  # the download button serves the student notebook


@needs_edition
def test_a_planted_solution_is_found(tmp_path):
    """The leak check must fail on a solution planted anywhere: a page, a notebook's metadata, the search index."""
    answer = next(p for p in leaks.fingerprints() if "positions >= torch.tensor(lengths)" in p)
    page = tmp_path / "page.html"  # highlighted as Pygments does: a span per token, ">" escaped
    tokens = answer.replace(">", "&gt;").split(" ")
    page.write_text("<pre>" + " ".join(f'<span class="n">{t}</span>' for t in tokens) + "</pre>")
    notebook = tmp_path / "nb.ipynb"
    nb = load(STUDENT / "notebooks" / "03_masks.ipynb")
    nb["cells"][0]["metadata"]["note"] = answer
    notebook.write_text(json.dumps(nb))
    index = tmp_path / "searchindex.js"
    word = sorted(leaks.solution_words())[0]
    index.write_text('Search.setIndex({"terms": {"%s": [1]}, "titleterms": {}})' % leaks.stems({word}).pop())
    found = leaks.find(tmp_path)
    assert any(f.startswith(str(page)) for f in found), found
    assert any(f.startswith(str(notebook)) for f in found), found
    assert any(f.startswith(str(index)) for f in found), found
    assert not leaks.find(tmp_path, prints=[], words=set())  # and nothing without solutions to look for


@needs_nbgrader
def test_an_answer_copied_into_an_unmarked_cell_reaches_the_student_and_is_caught(released):
    """nbgrader clears only what is marked: the same answer in an ordinary cell goes out to students. The leak
    check, which reads the answers from the marked cells, finds the copy."""
    copy = released["planted"] / "03_masks.ipynb"
    assert copy.exists() and "raise NotImplementedError()" in json.dumps(load(copy))
    found = leaks.find(released["planted"], prints=leaks.fingerprints([ROOT / "notebooks" / "03_masks.ipynb"]),
                       words=set())
    assert any("positions >= torch.tensor(lengths)" in f for f in found), found


# --- grading ------------------------------------------------------------------------------------------------------

@needs_nbgrader
def test_grading_without_a_sandbox_is_refused_unless_asked(tmp_path):
    (tmp_path / "alice").mkdir()
    shutil.copy(ROOT / "notebooks" / "03_masks.ipynb", tmp_path / "alice")
    run = subprocess.run([str(GRADER_PYTHON), "-m", "instructor.grade", str(tmp_path), "--out", str(tmp_path / "out")],
                         cwd=ROOT, capture_output=True, text=True, timeout=120, env={"PATH": str(tmp_path)})  # no bwrap
    assert run.returncode != 0 and "bubblewrap (bwrap) is not installed" in run.stderr, run.stderr
    assert "--no-sandbox" in run.stderr and "your files in reach" in run.stderr
    assert not (tmp_path / "out" / "course").exists()
