"""The checkers' messages agree subject and verb: no "it differ", "acc differ" or "where the merge are finite".

The message strings are read from the checkers' source (every string and f-string, with each ``{describe_diff(...)}``
read as the words it gives, "differ by up to ...", and every other ``{...}`` as a placeholder), and searched for
the slips that can be found mechanically: a singular subject before a plural verb, a plural subject before a
singular one.
"""
import ast
import re
from pathlib import Path

import pytest
import torch

from attention_course.exercises import describe_diff

EXERCISES = Path(__file__).resolve().parents[1] / "attention_course" / "exercises"
# Chapter 11's checkers are not yet in this list: their "{name} {describe_diff(...)}" gives "acc differ".
MODULES = ["__init__", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08", "ch09", "ch10", "ch11"]

SINGULAR = (r"it|this|your (?:result|output|mask|layer|function|state|merge_partials|decode_step|maximum)|"
            r"the (?:result|output|state|merge|mask|recomputation|rotation)|acc|out")
PLURAL = r"they|(?:your|the) (?:scores|weights|outputs|caches|maxima|heads)"
SLIPS = [
    re.compile(rf"(?<!and )\b(?:{SINGULAR}) (?:differ|have|are|were|agree)\b"),  # "m and acc differ" is right
    re.compile(rf"\b(?:{PLURAL}) (?:differs|has|is|was|agrees)\b"),
    re.compile(r"(?:^|[(:,;] )X differ by up to"),  # "{name} {describe_diff(...)}": "acc differ" for one name
]


def _text(node: ast.AST) -> str:
    """A string constant or f-string as a reader sees it: describe_diff's words in place, "X" for other fields."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
        elif isinstance(value.value, ast.Call) and getattr(value.value.func, "id", "") == "describe_diff":
            parts.append("differ by up to 0.1")
        else:
            parts.append("X")
    return "".join(parts)


def _messages(module: str) -> list[tuple[int, str]]:
    tree = ast.parse((EXERCISES / f"{module}.py").read_text())
    docstrings = {id(n.body[0].value) for n in ast.walk(tree) if isinstance(
        n, (ast.Module, ast.FunctionDef, ast.ClassDef)) and n.body and isinstance(n.body[0], ast.Expr)}
    strings = [n for n in ast.walk(tree) if id(n) not in docstrings and (isinstance(n, ast.JoinedStr)
               or (isinstance(n, ast.Constant) and isinstance(n.value, str)))]
    inner = {id(v) for n in strings if isinstance(n, ast.JoinedStr) for v in n.values}
    return [(n.lineno, _text(n)) for n in strings if id(n) not in inner]


@pytest.mark.parametrize("module", MODULES)
def test_no_subject_verb_slip_in_the_messages(module):
    slips = [f"line {line}: ...{match.group(0)}... in {text[:100]!r}"
             for line, text in _messages(module) for pattern in SLIPS
             for match in [pattern.search(text)] if match]
    assert not slips, "\n".join(slips)


def test_the_slip_finder_finds_slips():
    """The patterns catch the slips they are for, and leave right sentences alone."""
    for slip in ("(it differ by up to 0.1)", "acc differ by up to 2", "your scores has shape", "the result are",
                 "X differ by up to 0.1"):
        assert any(p.search(slip) for p in SLIPS), slip
    for fine in ("m and acc differ", "m and l are", "out and the recomputation differ", "your scores have shape",
                 "the keys that have", "out is right"):
        assert not any(p.search(fine) for p in SLIPS), fine


def test_describe_diff_agrees_with_its_reference():
    nan, one = torch.tensor([float("nan"), 1.0]), torch.tensor([0.0, 1.0])
    assert describe_diff(nan, one, "the merge").endswith("where the merge is finite")
    assert describe_diff(nan, one, "torch's").endswith("where torch's are finite")
