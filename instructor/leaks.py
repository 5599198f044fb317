"""Find solution text in a built edition: ``python -m instructor.leaks _build/student``.

What counts as solution text is read from the full chapters: the code between ``### BEGIN SOLUTION`` and ``### END
SOLUTION`` in solution cells, and the prose of the solutions (the body of ``{solution-start}``, and any text between
it and ``{solution-end}``). Lines that also appear outside the solutions (a shared ``return out``, say) prove
nothing and are dropped. Every file of the edition is searched, whatever it is (pages, ``_sources``, notebooks with
their metadata and outputs, the search index, scripts): markup is stripped and whitespace collapsed before
comparing. The search index holds word stems, not sentences, so it is searched for the stems that occur only in
solutions.
"""
from __future__ import annotations

import hashlib
import html
import json
import re
import sys
from pathlib import Path

from .exercises import BEGIN_MARK, END_MARK, END, ROOT, START, chapters, load, nbgrader, solution_spans, source

MIN_CODE, MIN_PROSE = 12, 30  # shorter lines are too common to prove anything
WORD = re.compile(r"[A-Za-z_][A-Za-z_]{3,}")


def flat(text: str) -> str:
    return " ".join(text.split())


def _answer_lines(cell: dict) -> list[str]:
    lines, inside = [], False
    for line in source(cell).splitlines():
        if BEGIN_MARK in line:
            inside = True
        elif END_MARK in line:
            inside = False
        elif inside:
            lines.append(line)
    return lines


def _prose(text: str) -> tuple[str, str]:
    """(the part of a markdown cell inside gated solutions, the part outside). A solution's prose is the body of
    its {solution-start} directive, and whatever stands between the gates."""
    inside_parts, outside_parts, position, inside = [], [], 0, False
    for match in sorted([*START.finditer(text), *END.finditer(text)], key=lambda m: m.start()):
        (inside_parts if inside else outside_parts).append(text[position:match.start()])
        if match.re is START:
            inside_parts.append(match["body"])
        position, inside = match.end(), match.re is START
    (inside_parts if inside else outside_parts).append(text[position:])
    return "\n".join(inside_parts), "\n".join(outside_parts)


def split(paths=None) -> tuple[list[str], list[str]]:
    """(solution lines, every other line) of the chapters."""
    solution, other = [], []
    for path in paths or chapters():
        nb = load(path)
        for cell, label in zip(nb["cells"], solution_spans(nb)):
            if cell["cell_type"] == "code":
                answer = _answer_lines(cell) if nbgrader(cell).get("solution") else []
                solution += answer
                other += [line for line in source(cell).splitlines() if line not in answer]
            else:
                inside, outside = _prose(source(cell)) if label else ("", source(cell))
                solution += [line for line in inside.splitlines() if not line.startswith((":class:", "```"))]
                other += outside.splitlines()
    return solution, other


def fingerprints(paths=None) -> list[str]:
    """The solution lines that say something on their own: long enough, and nowhere outside the solutions."""
    solution, other = split(paths)
    elsewhere = flat("\n".join(other))
    prints = []
    for line in solution:
        line = flat(line)
        is_code = not re.search(r"[.:;]\s*$", line) and ("(" in line or "=" in line)
        if len(line) >= (MIN_CODE if is_code else MIN_PROSE) and line not in elsewhere and line not in prints:
            prints.append(line)
    return prints


def solution_words(paths=None) -> set[str]:
    """Lower-case words whose stem occurs in the solutions and nowhere else in the book (the chapters outside
    their solutions, the prose pages): the search index stores stems, and "shifted" is found as "shift"."""
    solution, other = split(paths)
    other += [line for page in (ROOT / "book").glob("*.md") for line in page.read_text().splitlines()]
    words = lambda lines: {w.lower() for w in WORD.findall("\n".join(lines))}  # noqa: E731
    elsewhere = stems(words(other))
    return {word for word in words(solution) if stems({word}).pop() not in elsewhere}


def text_of(path: Path) -> str:
    """A file's text as a reader or a search would see it: markup stripped, entities decoded, whitespace collapsed;
    a notebook's every string (sources, outputs, metadata)."""
    raw = path.read_text(errors="replace")
    if path.suffix == ".ipynb":
        strings = []

        def walk(node):
            if isinstance(node, str):
                strings.append(node)
            elif isinstance(node, dict):
                for key, value in node.items():
                    strings.append(str(key))
                    walk(value)
            elif isinstance(node, list):
                # a cell's source is a list of lines: join them so that a line split in two still matches
                if all(isinstance(item, str) for item in node):
                    strings.append("".join(node))
                else:
                    for item in node:
                        walk(item)
        walk(json.loads(raw))
        raw = "\n".join(strings)
    return flat(html.unescape(re.sub(r"<[^>]+>", " ", raw)) + " " + html.unescape(re.sub(r"<[^>]+>", "", raw)))


def search_terms(path: Path) -> set[str]:
    """The terms of a Sphinx search index (searchindex.js)."""
    index = json.loads(re.search(r"Search\.setIndex\((.*)\)\s*$", path.read_text(), re.S).group(1))
    return set(index.get("terms", {})) | set(index.get("titleterms", {}))


def stems(words: set[str]) -> set[str]:
    from sphinx.search.en import SearchEnglish

    stemmer = SearchEnglish({})
    return {stemmer.stem(word) for word in words}


def find(edition: Path, prints: list[str] | None = None, words: set[str] | None = None) -> list[str]:
    """Every place in ``edition`` where solution text appears: "file: the line"."""
    prints = fingerprints() if prints is None else prints
    words = solution_words() if words is None else words
    found, searched = [], {}  # the lines found in each content searched: a file's copies (each edition's _static/,
    # the English and Chinese sites' shared assets) are searched once
    for path in sorted(p for p in Path(edition).rglob("*") if p.is_file()):
        if path.suffix in {".png", ".jpg", ".jpeg", ".gif", ".woff", ".woff2", ".ttf", ".eot", ".ico", ".svgz"}:
            continue
        if path.name == "searchindex.js":
            leaked = sorted(search_terms(path) & stems(words))
            found += [f"{path}: search term {term!r}" for term in leaked]
            continue
        content = hashlib.sha256(path.read_bytes()).hexdigest()
        if content not in searched:
            text = text_of(path)
            searched[content] = [line for line in prints if line in text]
        found += [f"{path}: {line}" for line in searched[content]]
    return found


def main(argv=None) -> None:
    edition = Path((argv or sys.argv[1:] or ["_build/student"])[0])
    leaks = find(edition)
    print("\n".join(leaks) or f"no solution text in {edition}")
    raise SystemExit(1 if leaks else 0)


if __name__ == "__main__":
    main()
