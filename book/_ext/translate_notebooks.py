"""The catalogs of book/locale applied to the notebooks themselves (polib): Chinese notebooks for JupyterLab and Colab.

The site is built from the English notebooks and the catalogs (Sphinx's gettext route, book/_ext/i18n.py); the
notebooks a reader downloads or opens in Colab from the Chinese edition are made here, at build time, never
committed: each message of a document's catalog (a paragraph, a heading, a list item, a table cell, an exercise's
title, a figure's alt text) is found in that notebook's Markdown cells and replaced by its translation. Sphinx's
message is the paragraph's MyST source with its line breaks made spaces, so a message is matched with any run of
white space (line breaks, indentation) between its words, and only where it fills its whole block: from a line's
start (after indentation, a list or quote marker, a heading's #s, a directive's fence and name, a table's |) to the
end of a line or cell. Longer messages are placed first; no two overlap. A theorem's title, whose message
sphinx-proof makes "(title)", is placed after its directive's name (``{prf:theorem} title``), without the
parentheses. Code cells are never touched; alt texts in cell metadata (``mystnb.image.alt``) are translated whole. The
notebook's metadata gets its language, for the widgets.

    python book/_ext/translate_notebooks.py [OUT]    writes every chapter, translated, into OUT (default
                                                     _build/zh/notebooks) and lists the messages not placed
"""
from __future__ import annotations

import copy
import functools
import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LOCALE = ROOT / "book" / "locale"
BEFORE = (r"(?:(?:^|(?<=\n))[ \t]*(?:>[ \t]*)*(?:[-*+][ \t]+|\d+[.)][ \t]+|#{1,6}[ \t]+|[`:~]{3,}\{[\w:-]+\}[ \t]*)?"
          r"|\|[ \t]*)")
AFTER = r"(?=[ \t]*(?:\||\n|$))"


def catalog_for(docname: str, language: str = "zh_CN", locale: Path = LOCALE) -> dict[str, str]:
    """msgid -> msgstr of one document's catalog: translated, not fuzzy, messages only."""
    import polib

    path = Path(locale) / language / "LC_MESSAGES" / f"{docname}.po"
    if not path.exists():
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path)) if e.msgstr and "fuzzy" not in e.flags and not e.obsolete}


@functools.lru_cache(maxsize=None)
def _words(msgid: str) -> tuple[str, ...]:
    return tuple(msgid.split())


@functools.lru_cache(maxsize=None)  # every cell is searched for every message of its page: compile each once
def _pattern(msgid: str) -> re.Pattern:
    return re.compile("(" + BEFORE + ")(" + r"\s+".join(map(re.escape, _words(msgid))) + ")" + AFTER)


def translate_text(text: str, catalog: dict[str, str]) -> tuple[str, set[str]]:
    """(``text`` with every message that fills a block replaced, the msgids placed)."""
    spans = []  # (start, end, replacement, msgid)
    for msgid, msgstr in catalog.items():  # a theorem's title first: its message is "(title)"
        title, translated = re.fullmatch(r"\((.+)\)", msgid, re.S), re.fullmatch(r"[(（](.+)[)）]", msgstr, re.S)
        if not (title and translated):
            continue
        words = r"\s+".join(map(re.escape, title.group(1).split()))
        for m in re.finditer(r"(?m)^[ \t]*[`:~]{3,}\{prf:[\w-]+\}[ \t]+(" + words + r")[ \t]*$", text):
            start, end = m.start(1), m.end(1)
            if not any(s < end and start < e for s, e, _, _ in spans):
                spans.append((start, end, translated.group(1), msgid))
    for msgid in sorted(catalog, key=len, reverse=True):
        if not msgid.strip():
            continue
        # the pattern holds each word of the message as it is: where one is not in the text, it cannot match (a
        # substring search is some thirty times cheaper than the pattern's, which tries a block's start at every
        # position; most of a page's messages are in none of a given cell)
        if not all(word in text for word in _words(msgid)):
            continue
        for m in _pattern(msgid).finditer(text):
            start, end = m.start(2), m.end(2)
            if any(s < end and start < e for s, e, _, _ in spans):
                continue
            indent = re.match(r"[ \t]*", text[text.rfind("\n", 0, start) + 1:]).group(0)
            new = catalog[msgid].replace("\n", "\n" + indent)  # a translation over several lines keeps the block's
            spans.append((start, end, new, msgid))
    out, at = [], 0
    for start, end, new, _ in sorted(spans):
        out += [text[at:start], new]
        at = end
    out.append(text[at:])
    return "".join(out), {s[3] for s in spans}


def _text(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def translate_notebook(notebook: dict, catalog: dict[str, str], language: str = "zh_CN") -> tuple[dict, set[str]]:
    """(a translated copy of ``notebook``, the msgids of ``catalog`` found nowhere in it).

    The copy's metadata says its language, ``"attention_course": {"language": "zh_CN"}``: the course's widgets read it
    in Jupyter (attention_course/widgets/_base.py, notebook_language) and draw their words in it."""
    new, placed = copy.deepcopy(notebook), set()
    metadata = new.setdefault("metadata", {})
    metadata["attention_course"] = {**metadata.get("attention_course", {}), "language": language}
    for cell in new["cells"]:
        if cell["cell_type"] == "markdown":
            text, found = translate_text(_text(cell), catalog)
            cell["source"] = text.splitlines(keepends=True)
            placed |= found
        elif cell["cell_type"] == "code":
            image = cell.get("metadata", {}).get("mystnb", {}).get("image", {})
            if image.get("alt") in catalog:
                placed.add(image["alt"])
                image["alt"] = catalog[image["alt"]]
    return new, set(catalog) - placed


def main(out: Path) -> int:
    sys.path.insert(0, str(ROOT / "book" / "_ext"))
    from lab_numbering import chapter_numbers

    out.mkdir(parents=True, exist_ok=True)
    lost = 0
    for entry in chapter_numbers(ROOT):
        notebook = json.loads((ROOT / f"{entry}.ipynb").read_text())
        translated, missing = translate_notebook(notebook, catalog_for(entry))
        (out / f"{Path(entry).name}.ipynb").write_text(json.dumps(translated, indent=1, ensure_ascii=False) + "\n")
        lost += len(missing)
        for msgid in sorted(missing):
            print(f"{entry}: not placed: {msgid[:70]!r}")
    print(f"wrote {len(chapter_numbers(ROOT))} notebooks into {out}; {lost} translated messages not placed")
    return 0


if __name__ == "__main__":
    sys.exit(main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "_build" / "zh" / "notebooks"))
