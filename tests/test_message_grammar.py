"""The checkers' messages agree subject and verb: no "it differ", "acc differ" or "where the merge are finite".

The message strings are read from the checkers' source and the mechanism's (every string and f-string, each
``{...}`` as a placeholder), and searched for the slips that can be found mechanically: a singular subject before a
plural verb, a plural subject before a singular one. The mechanism's descriptions are singular ("your mask's result
differs at ..."), whatever the answer's noun.
"""
import ast
import re
from pathlib import Path

import pytest

EXERCISES = Path(__file__).resolve().parents[1] / "attention_course" / "exercises"
MODULES = ["__init__", "diagnose", "ch02", "ch03", "ch04", "ch05", "ch06", "ch07", "ch08", "ch09", "ch10", "ch11", "ch12",
           "ch13", "../probe"]  # (the layer's run for chapters 6 and 7, its messages too)

SINGULAR = (r"it|this|your (?:result|output|mask|layer|function|state|merge_partials|decode_step|maximum)|"
            r"the (?:result|output|state|merge|mask|recomputation|rotation)|acc|out")
PLURAL = r"they|(?:your|the) (?:scores|weights|outputs|caches|maxima|heads)"
SLIPS = [
    re.compile(rf"(?<!and )\b(?:{SINGULAR}) (?:differ|have|are|were|agree)\b"),  # "m and acc differ" is right
    re.compile(rf"\b(?:{PLURAL}) (?:differs|has|is|was|agrees)\b"),
]


def _text(node: ast.AST) -> str:
    """A string constant or f-string as a reader sees it, "X" for its fields."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    parts = []
    for value in node.values:
        if isinstance(value, ast.Constant):
            parts.append(str(value.value))
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
    for slip in ("(it differ by up to 0.1)", "acc differ by up to 2", "your scores has shape", "the result are"):
        assert any(p.search(slip) for p in SLIPS), slip
    for fine in ("m and acc differ", "m and l are", "out and the recomputation differ", "your scores have shape",
                 "the keys that have", "out is right"):
        assert not any(p.search(fine) for p in SLIPS), fine

