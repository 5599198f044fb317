"""The instructors' page quotes the grader's messages as the grader writes them, in both editions.

book/instructors.md quotes every message of the grader (``grades.csv``'s message column, the notes, the reasons a
file is not graded) with the ``{samp}`` role: program output, kept character for character in the Chinese catalog,
which glosses it beside. Here, read from the sources alone (no grading is run):

- every run of words of a quoted message is one of the grader's own strings (a literal part of a string or an
  f-string of instructor/ and of the package's checkers), whole, cut only where the grader puts a value in (a name,
  a number, a list: no two words in a row) or where the page leaves a part out (``{why}``, ``...``);
- an article the grader computes (``a`` or ``an`` before a type's name, attention_course.boundary.describe) is the
  one it writes;
- the Chinese catalog keeps each message's quotes, the same ones, unchanged.
"""
import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / "book" / "instructors.md"
CATALOG = ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / "instructors.po"
# Where the messages of grades.csv, the notes and summary.txt are written: the grader, the boundary with the
# student's process, and the checkers whose diagnoses the message column holds.
SOURCES = sorted([*(ROOT / "instructor").glob("*.py"), ROOT / "attention_course" / "boundary.py",
                  ROOT / "attention_course" / "probe.py", *(ROOT / "attention_course" / "exercises").glob("*.py")])
SAMP = re.compile(r"\{samp\}`([^`]*)`")
HOLE = "\x00"  # where the page leaves a part out: {why}, ...
TWO_WORDS = re.compile(r"[A-Za-z][\w'’]*\s+[A-Za-z]")
PROSE_WORD = re.compile(r"(?<![\w.])[a-z]{3,}(?![\w.])")  # "held", "uses": a word of prose, not a name or a number


def value(text: str) -> bool:
    """What the grader puts in a string's {...}: a name, a number, a list, a path (my_masked_softmax, 4096, [3],
    03_masks.ipynb, Agreeable), not words of prose: no two words in a row, no lowercase word of three letters."""
    return not TWO_WORDS.search(text) and not PROSE_WORD.search(text)
WORDY = re.compile(r"[A-Za-z]{2}")


def quotes(text: str) -> list[str]:
    return SAMP.findall(text)


def _constant(node, names: dict) -> list[str] | None:
    """The strings an expression can be when the source says so: a constant, a name bound to one (in its function
    or module), ``"a" if ... else "b"``; None for anything else (a value)."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, int, float)):
        return [node.value]
    if isinstance(node, ast.Name) and node.id in names:
        return names[node.id]
    if isinstance(node, ast.IfExp):
        body, orelse = _constant(node.body, names), _constant(node.orelse, names)
        return body + orelse if body is not None and orelse is not None else None
    return None


def _bindings(body, outer: dict) -> dict:
    names = dict(outer)
    for statement in body:
        if isinstance(statement, ast.Assign) and len(statement.targets) == 1:
            targets = statement.targets[0]
            pairs = (zip(targets.elts, statement.value.elts) if isinstance(targets, ast.Tuple) and
                     isinstance(statement.value, ast.Tuple) else [(targets, statement.value)])
            for target, value in pairs:
                found = _constant(value, names) if isinstance(target, ast.Name) else None
                if found is not None:
                    names[target.id] = found
    return names


def _literals(joined: ast.JoinedStr, names: dict) -> set[str]:
    """The literal parts of an f-string, a known value (a constant, ``{'s' if n != 1 else ''}``) joined to its
    neighbours: each alternative gives its own parts."""
    texts = [""]
    parts: set[str] = set()
    for value in joined.values:
        if isinstance(value, ast.Constant):
            texts = [text + value.value for text in texts]
            continue
        known = _constant(value.value, names)
        if known is not None:
            spec = "".join(v.value for v in (value.format_spec.values if value.format_spec else [])
                           if isinstance(v, ast.Constant))
            texts = [text + format(k, spec) for text in texts for k in known]
            continue
        parts.update(texts)
        texts = [""]
    return parts | set(texts)


def grader_strings() -> tuple[set[str], set[str]]:
    """The literal parts of SOURCES' f-strings and their plain strings of two words or more, each with a word in it
    (two letters in a row, or the article "a" that describe() computes: single letters would spell any word), and
    every plain string, whole (a message of one word: "passed"). Docstrings apart."""
    parts: set[str] = set()
    constants: set[str] = set()
    for path in SOURCES:
        tree = ast.parse(path.read_text())
        docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                      if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))
                      and node.body and isinstance(node.body[0], ast.Expr)
                      and isinstance(node.body[0].value, ast.Constant)}
        module = _bindings(tree.body, {})
        scopes = [(tree, module)] + [(node, _bindings(node.body, module)) for node in ast.walk(tree)
                                     if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]
        for scope, names in scopes:
            for node in ast.walk(scope):
                if isinstance(node, ast.JoinedStr):
                    parts |= _literals(node, names)
                elif isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings:
                    constants.add(node.value)
    literals = {part for part in parts if WORDY.search(part) or part.strip() == "a"}
    # a plain string of one word ("kernel", "the ") is a key or a name, not a message: words in a row would spell any
    # sentence with them
    return literals | {constant for constant in constants if TWO_WORDS.search(constant)}, constants


def produced(quote: str, strings: tuple[set[str], set[str]]) -> bool:
    """Whether ``quote`` (HOLE where the page leaves a part out) is the grader's literals, each whole, with values
    between them (``value``). Next to a HOLE a literal may be cut (the part left out); at
    the quote's two ends, a literal's spaces may be."""
    literals, constants = strings
    if quote in constants:
        return True
    fragments = quote.split(HOLE)
    return all(_fragment(fragment, literals, cut_start=i > 0, cut_end=i < len(fragments) - 1)
               for i, fragment in enumerate(fragments))


def _fragment(text: str, literals: set[str], cut_start: bool, cut_end: bool) -> bool:
    """Whether ``text`` is literals and values in turn (never two values in a row); cut_start: it may begin inside a
    literal; cut_end: it may end inside one."""
    def literal_ends(position: int) -> set[int]:
        rest, found = text[position:], set()
        for literal in literals:
            pieces = {literal, literal.rstrip()}
            if position == 0:
                pieces |= {literal.lstrip(), literal.strip()}
                if cut_start:
                    pieces |= {literal[i:] for i in range(1, len(literal))}
            found |= {position + len(piece) for piece in pieces if piece and rest.startswith(piece)}
        return found

    def ends_here(position: int) -> bool:
        rest = text[position:]
        return not rest or (cut_end and any(literal.startswith(rest.rstrip()) for literal in literals))

    todo, seen = [(0, "literal")], {(0, "literal")}  # at 0 as after a literal: a value or a literal may come
    while todo:
        position, after = todo.pop()
        if ends_here(position):
            return True
        following = {(end, "literal") for end in literal_ends(position)}
        if after == "literal":
            following |= {(end, "value") for end in range(position + 1, len(text) + 1)
                          if value(text[position:end])}
        for state in following - seen:
            seen.add(state)
            todo.append(state)
    return False


def holed(quote: str) -> str:
    """A quote with its parts left out as HOLE: ``{name}`` (samp's variable part) and ``...``."""
    return re.sub(r"\{[^{}]*\}|\.\.\.", HOLE, quote)


@pytest.fixture(scope="module")
def literals():
    return grader_strings()


def test_the_rule_tells_a_message_from_a_paraphrase(literals):
    assert produced(holed("timed out (the check ran over 120 s)"), literals)
    assert produced(holed("renamed copy of 03_masks.ipynb, graded as it"), literals)
    assert produced(holed("held for review by hand: the check passed, but the solution uses os, _exit, which ..."),
                    literals)
    assert produced(holed("not graded: {why}"), literals)
    assert produced(holed("held for review by hand: ... uses os, _exit"), literals), "a part left out, as '...' says"
    assert not produced(holed("held for review: uses os, _exit"), literals), "words the grader does not write"
    assert not produced(holed("your mask misses the first pad of each sentence ..."), literals), "not its words"
    assert not produced(holed("[the notebook itself: the kernel was stopped: it went over the memory limit ...]"),
                        literals), "the grader writes 'not graded: ' inside the brackets"
    assert not produced(holed("the kernel ran out of memory"), literals)


def test_every_message_the_page_quotes_is_one_the_grader_writes(literals):
    found = quotes(PAGE.read_text())
    assert len(found) >= 30, f"{len(found)} quoted messages on {PAGE.name}: are they quoted with {{samp}}?"
    wrong = [quote for quote in found if not produced(holed(quote), literals)]
    assert not wrong, "quoted on the page, written by no grader string:\n" + "\n".join(wrong)


def test_an_article_the_grader_computes_is_the_one_the_page_quotes():
    import torch

    from attention_course import boundary

    found = [m for quote in quotes(PAGE.read_text()) for m in re.finditer(r"returned (an?) ([A-Z]\w*)", quote)]
    assert found
    for match in found:
        kind = type(match.group(2), (torch.Tensor,), {"__module__": "__main__"})
        said = boundary.describe(torch.zeros(1).as_subclass(kind))
        assert said.startswith(f"{match.group(1)} {match.group(2)},"), (match.group(0), said)


def test_the_chinese_page_quotes_the_same_messages_unchanged():
    polib = pytest.importorskip("polib")
    entries = [entry for entry in polib.pofile(str(CATALOG)) if not entry.obsolete and entry.msgstr]
    quoted = [entry for entry in entries if quotes(entry.msgid)]
    assert quoted, "no message of the instructors' page quotes the grader"
    differ = [entry.msgid[:70] for entry in quoted if sorted(quotes(entry.msgstr)) != sorted(quotes(entry.msgid))]
    assert not differ, "the Chinese catalog quotes these messages otherwise than the page:\n" + "\n".join(differ)
    page = set(quotes(PAGE.read_text()))
    catalog = {quote for entry in entries for quote in quotes(entry.msgid)}
    assert page <= catalog, f"quoted on the page, not in the catalog: {sorted(page - catalog)[:3]}"
