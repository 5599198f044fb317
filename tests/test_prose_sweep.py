"""Sweeps of chapters 1-9 for three kinds of claim that a reading audit found wrong (issue 34), as mechanisms.

- A warning said to come on "every call" / "each call" / "per call": under Python's default filter a warning comes
  once per line of code that raises it, and every time only under ``simplefilter("always")``. Such a sentence must
  stand next to a cell that sets ``"always"`` and must name the filter.
- A shape mistake said to be "an error when X != Y" under broadcasting: a size-1 axis broadcasts too, so the same
  cell must say what happens when one of the sizes is 1.
- A merge of partial softmaxes, ``exp(s - m)`` with a running maximum ``m``: while a row has seen only ``-inf``,
  ``m`` is ``-inf`` and ``-inf - (-inf)`` is NaN. Every such function in the chapters is either run here on a
  fully masked first block (no NaN, the softmax's answer) or listed as exempt with the reason the prose gives.

And for the theorems, what a program can see: each statement is followed by its proof, and the hypotheses a proof
names in a few recurring words (finite, independent, "not all", ...) appear in its statement too. Whether a
statement omits a hypothesis its proof uses in other words is left to reading.
"""
import ast
import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch.testing import assert_close

from attention_course.tiled import merge_tile
from test_claims import SENTENCE_END, prose

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted(p for p in (ROOT / "notebooks").glob("0[1-9]_*.ipynb"))


def cells_of(path):
    return json.loads(path.read_text())["cells"]


def text(cell):
    return "".join(cell["source"])


def units(markdown: str) -> list[str]:
    """The sentences of a markdown cell's prose, each table row on its own."""
    rows, lines = [], []
    for line in prose(markdown).splitlines():
        (rows if line.lstrip().startswith("|") else lines).append(line)
    return rows + [u for u in SENTENCE_END.split("\n".join(lines)) if u.strip()]


def neighbours(cells, i):
    """The code cell just before markdown cell i and the two just after (the reach of tests/test_claims.py)."""
    code = [j for j, c in enumerate(cells) if c["cell_type"] == "code"]
    return [text(cells[j]) for j in [j for j in code if j < i][-1:] + [j for j in code if j > i][:2]]


# --- warnings -------------------------------------------------------------------------------------------------

WARNING = re.compile(r"\bwarn", re.IGNORECASE)
REPEATED = re.compile(r"\b(?:every|each|per)\s+(?:call|pass|time|run|step|forward|iteration)s?\b", re.IGNORECASE)


def sets_always(code: str) -> bool:
    return "simplefilter" in code and re.search(r"""["']always["']""", code) is not None


def repeated_warning_claims(cells) -> list[str]:
    """Sentences that say a warning comes every call/pass/time with no "always" filter in reach, or without
    naming the filter they depend on."""
    problems = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        for unit in units(text(cell)):
            if not (WARNING.search(unit) and REPEATED.search(unit)):
                continue
            near = any(sets_always(code) for code in neighbours(cells, i))
            named = re.search(r"filter", unit, re.IGNORECASE)
            if not (near and named):
                problems.append(f"cell {i}: {' '.join(unit.split())[:160]!r}")
    return problems


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_warnings_said_to_repeat_name_the_filter_that_makes_them(path):
    problems = repeated_warning_claims(cells_of(path))
    assert not problems, (
        f"{path.name}: a warning said to come every call/pass/time. Python's default filter shows it once per line "
        f"of code; say so, or say that it is under simplefilter(\"always\") and set that in a cell next to it:\n"
        + "\n".join(problems))


def _md(source):
    return {"cell_type": "markdown", "metadata": {}, "source": [source]}


def _code(source):
    return {"cell_type": "code", "metadata": {}, "source": [source], "outputs": [], "execution_count": None}


def test_a_warning_per_call_is_caught_unless_the_filter_is_named_and_set():
    table = _md("| bug | symptom |\n|---|---|\n| head size as a tensor | a warning per call |\n")
    assert len(repeated_warning_claims([table, _code("import torch")])) == 1
    claim = _md("It costs a warning on every call.")
    always = _code('with warnings.catch_warnings():\n    warnings.simplefilter("always")\n    f(), f()')
    assert len(repeated_warning_claims([claim, always])) == 1  # the filter is set but not named
    named = _md('It warns once per line by default, and on every call under `simplefilter("always")`.')
    assert repeated_warning_claims([named, always]) == []
    assert len(repeated_warning_claims([named, _code("f(), f()")])) == 1  # named but not set
    assert repeated_warning_claims([_md("A debug print prints at every call."), _code("f()")]) == []


def test_the_default_filter_warns_once_per_line_and_always_every_time():
    """The fact the sweep rests on, for a warning torch raises from C++ (the copy warning of chapters 5 and 7)."""
    import warnings

    def copies(action):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter(action)
            for _ in range(3):
                torch.tensor(torch.tensor(2.0))
        return sum("copy construct" in str(w.message) for w in caught)

    assert copies("default") == 1 and copies("always") == 3


# --- broadcasting ---------------------------------------------------------------------------------------------

SHAPE_ERROR = re.compile(r"\b(?:error|fails?|silen\w*)\b[^.]*?\\neq|\\neq[^.]*?\b(?:error|fails?)\b", re.IGNORECASE)
BROADCASTING = re.compile(r"broadcast|aligned from the right|\bread as\b|\bmask\b", re.IGNORECASE)
SIZE_ONE = re.compile(r"(?:=|>|\bis|\bare|\bof|\babove)\s*\$?\s*1\b|size[- ]1", re.IGNORECASE)


def shape_error_claims_without_size_one(cells) -> list[str]:
    """Sentences that tie a broadcasting mistake to an error when two sizes differ, in a cell that never says what
    a size of 1 does (it broadcasts: no error)."""
    problems = []
    for i, cell in enumerate(cells):
        if cell["cell_type"] != "markdown":
            continue
        body = prose(text(cell))
        for unit in units(text(cell)):
            if SHAPE_ERROR.search(unit) and BROADCASTING.search(unit) and not SIZE_ONE.search(body):
                problems.append(f"cell {i}: {' '.join(unit.split())[:160]!r}")
    return problems


@pytest.mark.parametrize("path", CHAPTERS, ids=lambda p: p.name)
def test_broadcasting_errors_say_what_a_size_of_one_does(path):
    problems = shape_error_claims_without_size_one(cells_of(path))
    assert not problems, (f"{path.name}: 'an error when X != Y' about broadcasting, with no word on size 1, which "
                          f"broadcasts silently:\n" + "\n".join(problems))


def test_a_broadcast_error_claim_without_size_one_is_caught():
    old = _md("Added to the scores, a `(B, S)` mask is aligned from the right and read as an `(L, S)` mask: an "
              "error when $B \\neq L$, silence when $B = L$.")
    assert len(shape_error_claims_without_size_one([old])) == 1
    new = _md("Added to the scores, a `(B, S)` mask is aligned from the right and read as an `(L, S)` mask: an "
              "error when $B \\neq L$ and neither is 1; silence when $L = 1$, the scores growing to `(B, B, S)`.")
    assert shape_error_claims_without_size_one([new]) == []


def test_a_b_s_mask_with_one_query_broadcasts_silently():
    """The size-1 case itself: scores (B, 1, S) and a (B, S) mask give (B, B, S), no error."""
    scores = torch.zeros(2, 1, 3)
    mask = torch.tensor([[False, False, True], [False, True, True]])
    assert scores.masked_fill(mask, float("-inf")).shape == (scores + mask).shape == (2, 2, 3)


# --- merging partial softmaxes ----------------------------------------------------------------------------------

RUNNING_MAX = re.compile(r"exp\([^)\n]*-\s*m\w*\b|exp\(m\w* - ")
# Functions of the chapters that merge partial softmaxes, and how to run each on a fully masked first block.
MERGES = {("08_speed.ipynb", "online_softmax"), ("08_speed.ipynb", "merge_partials")}
EXEMPT = {("08_speed.ipynb", "tiled_by_hand"):
          "a first version without masks, said so; the next paragraph shows the NaN and the package's fix"}


def merging_functions():
    """(chapter, function name, source) of every function in chapters 1-9 whose body exponentiates a difference
    with a running maximum."""
    found = []
    for path in CHAPTERS:
        for cell in cells_of(path):
            if cell["cell_type"] != "code" or not RUNNING_MAX.search(text(cell)):
                continue
            code = "\n".join(line for line in text(cell).splitlines() if not line.lstrip().startswith("%"))
            for node in ast.walk(ast.parse(code)):
                source = ast.get_source_segment(code, node) if isinstance(node, ast.FunctionDef) else None
                if source and RUNNING_MAX.search(source):
                    found.append((path.name, node.name, source))
    return found


def test_every_merge_of_partial_softmaxes_is_tested_or_exempt():
    names = {(chapter, name) for chapter, name, _ in merging_functions()}
    assert names == MERGES | set(EXEMPT), (
        f"functions that exponentiate against a running maximum: {sorted(names)}; each must be run on a fully "
        f"masked block below (MERGES) or exempted with its reason (EXEMPT)")


def _function(chapter, name):
    source = next(src for ch, n, src in merging_functions() if (ch, n) == (chapter, name))
    namespace = {"torch": torch, "math": math}
    exec(compile(source, f"{chapter}:{name}", "exec"), namespace)
    return namespace[name]


def _row():
    gen = torch.Generator().manual_seed(0)
    scores = torch.randn(24, generator=gen, dtype=torch.float64)
    scores[:8] = -math.inf  # the first block: every key masked
    values = torch.randn(24, 3, generator=gen, dtype=torch.float64)
    return scores, values, torch.softmax(scores, 0) @ values


def test_online_softmax_of_chapter_8_survives_a_masked_first_block():
    scores, values, exact = _row()
    assert (scores[:8] - scores[:8].max()).isnan().all()  # what subtracting m_1 = -inf gives
    out, _ = _function("08_speed.ipynb", "online_softmax")(scores, values, 8)
    assert_close(out, exact, atol=1e-12, rtol=0)


def test_merge_partials_of_chapter_8_survives_empty_blocks():
    merge = _function("08_speed.ipynb", "merge_partials")
    scores, values, exact = _row()
    empty = (torch.full((1,), -math.inf, dtype=torch.float64), torch.zeros(1, dtype=torch.float64),
             torch.zeros(3, dtype=torch.float64))
    m2 = scores[8:].max().reshape(1)
    p = torch.exp(scores[8:] - m2)
    full = (m2, p.sum().reshape(1), p @ values[8:])
    m, l, acc = merge(*empty, *full)  # noqa: E741
    assert_close(acc / l, exact, atol=1e-12, rtol=0)
    m, l, acc = merge(*empty, *empty)  # noqa: E741
    assert m.isneginf().all() and (l == 0).all() and (acc == 0).all()


def test_merge_tile_follows_theorem_8_1_on_a_masked_first_block():
    scores, values, exact = _row()
    state = (torch.full((1, 1), -math.inf, dtype=torch.float64), torch.zeros(1, 1, dtype=torch.float64),
             torch.zeros(1, 3, dtype=torch.float64))
    for j0 in range(0, 24, 8):
        state = merge_tile(state, scores[None, j0:j0 + 8], values[j0:j0 + 8])
        if j0 == 0:
            assert state[0].isneginf().all() and (state[1] == 0).all() and (state[2] == 0).all()
    m, l, acc = state  # noqa: E741
    assert_close(acc[0] / l[0], exact, atol=1e-12, rtol=0)


# --- theorems ---------------------------------------------------------------------------------------------------

THEOREM = re.compile(r"```\{prf:theorem\}[^\n]*\n(.*?)\n```", re.DOTALL)
PROOF = re.compile(r"```\{prf:proof\}[^\n]*\n(.*?)\n```", re.DOTALL)
# Words in which proofs of this book name a hypothesis; whichever a proof uses, its statement must use too.
HYPOTHESIS_WORDS = [r"\bfinite\b", r"\\ge 1\b", r"\\ge 2\b", r"\bindependent\b", r"\bnot all\b",
                    r"-\\infty - \(-\\infty\)"]


def theorems():
    """(chapter, statement, proof) of every theorem of chapters 1-9; proof None if none follows the statement."""
    found = []
    for path in CHAPTERS:
        cells = cells_of(path)
        for i, cell in enumerate(cells):
            source = text(cell)
            for match in THEOREM.finditer(source):
                after = [text(c) for c in cells[i + 1:i + 2] if c["cell_type"] == "markdown"]
                rest = source[match.end():] + "".join(after)
                proof = PROOF.search(rest)
                follows = proof is not None and not THEOREM.search(rest[:proof.start()])
                found.append((path.name, match.group(1), proof.group(1) if follows else None))
    return found


def test_the_chapters_have_their_four_theorems():
    """A new theorem is read against its proof, hypothesis by hypothesis, before it is added to this list."""
    assert [chapter for chapter, _, _ in theorems()] == [
        "01_scores.ipynb", "03_masks.ipynb", "05_heads.ipynb", "08_speed.ipynb"]


@pytest.mark.parametrize("chapter, statement, proof", theorems(), ids=[t[0] for t in theorems()])
def test_a_hypothesis_the_proof_names_is_in_the_statement(chapter, statement, proof):
    assert proof is not None, f"{chapter}: a theorem with no proof right after it"
    missing = [w for w in HYPOTHESIS_WORDS if re.search(w, proof) and not re.search(w, statement)]
    assert not missing, f"{chapter}: the proof relies on {missing}, which the statement does not say"
