"""Absolute words in the chapters' prose stand next to a cell that checks them.

The course's rule: "exactly", "always", "never", "every", "identical" and "guaranteed" only where a cell asserts it.
A program cannot tell whether a cell asserts *that* sentence, but it can find every sentence that uses such a word
with no checking cell anywhere near: the code cell just before it, or one of the two just after it, must hold an
``assert``, an ``assert_close``, a ``torch.equal`` or an exercise checker (``check_...``). Each such sentence is
then either reworded to what is shown, or given the cell that shows it. Fenced code inside markdown (directive
headers, code examples) is left out: it is not prose.
"""
import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))

ABSOLUTE = re.compile(r"\b(exactly|always|never|every|identical(?:ly)?|guarantee[sd]?)\b", re.IGNORECASE)
CHECKING = re.compile(r"\bassert\b|\bassert_close\b|torch\.equal\b|\bcheck_\w+\(")
FENCED_CODE = re.compile(r"^(`{3,}|~{3,})[^\n]*\n.*?^\1[ \t]*$", re.MULTILINE | re.DOTALL)
DIRECTIVE_HEADER = re.compile(r"^(`{3,}|:{3,})\{[\w:-]+\}[^\n]*$|^:[\w-]+:.*$", re.MULTILINE)
SENTENCE_END = re.compile(r"(?<=[.!?])\s+(?=[A-Z(`$*])")


def prose(markdown: str) -> str:
    """The prose of a markdown cell: code blocks dropped, directive fences and options dropped, bodies kept."""
    markdown = FENCED_CODE.sub(lambda m: "" if not re.match(r"[`~:]{3,}\{", m.group(0)) else _body(m.group(0)),
                               markdown)
    return DIRECTIVE_HEADER.sub("", markdown)


def _body(directive: str) -> str:
    """A MyST directive (```{exercise} ... ```) is prose: keep its body, drop its fences and options."""
    return DIRECTIVE_HEADER.sub("", re.sub(r"^[`:]{3,}[ \t]*$", "", directive, flags=re.MULTILINE))


def unchecked_absolutes(cells: list) -> list[str]:
    """Sentences with an absolute word and no checking code cell next to them: "cell i: sentence"."""
    code = [i for i, cell in enumerate(cells) if cell["cell_type"] == "code"]
    checks = {i for i in code if CHECKING.search("".join(cells[i]["source"]))}
    problems = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        before = [j for j in code if j < i][-1:]
        after = [j for j in code if j > i][:2]
        if checks.intersection(before + after):
            continue
        for sentence in SENTENCE_END.split(prose("".join(cell["source"]))):
            word = ABSOLUTE.search(sentence)
            if word:
                problems.append(f"cell {i}: {word.group(0)!r} in {' '.join(sentence.split())[:160]!r}")
    return problems


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_absolute_words_stand_next_to_a_check(path):
    problems = unchecked_absolutes(json.loads(path.read_text())["cells"])
    assert not problems, (f"{path.name}: absolute words with no checking cell near them (reword to what is shown, "
                          f"or add the cell that asserts it):\n" + "\n".join(problems))


def _md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": [text]}


def _code(text):
    return {"cell_type": "code", "metadata": {}, "source": [text], "outputs": [], "execution_count": None}


def test_an_unchecked_always_is_caught_and_a_checked_one_is_not():
    claim = _md("The weights always sum to 1. Nothing else here.")
    assert unchecked_absolutes([claim, _code("w = torch.softmax(s, -1)\nprint(w.sum(-1))")]) == [
        "cell 0: 'always' in 'The weights always sum to 1.'"]
    assert unchecked_absolutes([claim, _code("x = 1"), _code("assert_close(w.sum(-1), ones)")]) == []
    assert unchecked_absolutes([_code("assert torch.equal(a, b)"), claim]) == []
    # Three code cells away is too far; a checker call counts as a check.
    far = [claim, _code("a = 1"), _code("b = 2"), _code("assert a + 1 == b")]
    assert len(unchecked_absolutes(far)) == 1
    assert unchecked_absolutes([claim, _code("check_softmax(my_softmax)")]) == []


def test_code_in_markdown_is_not_prose_but_directive_bodies_are():
    code_only = _md("Run this:\n\n```python\nfor every in range(3):\n    pass\n```\n")
    assert unchecked_absolutes([code_only, _code("x = 1")]) == []
    exercise = _md("```{exercise} Softmax\n:label: ex-x\n\nShow that the weights never go negative.\n```\n")
    assert unchecked_absolutes([exercise, _code("x = 1")]) == [
        "cell 0: 'never' in 'Show that the weights never go negative.'"]
