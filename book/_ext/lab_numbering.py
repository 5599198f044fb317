"""The website's numbers in JupyterLab too: "Exercise 3.1", "Theorem 3.1", "(3.1)" in chapter 3.

jupyterlab-myst (2.7) numbers a notebook on its own, from 1 ("Exercise 1"), unless the notebook's first Markdown
cell opens with MyST frontmatter that gives each kind an enumerator template::

    ---
    numbering:
      exercise:
        enumerator: 3.%s
      equation:
        enumerator: 3.%s
      proof:theorem:
        enumerator: 3.%s
    ---
    # Padding and masks

1. As a Sphinx extension (``local_extensions`` in _config.yml): the website numbers chapters itself (_toc.yml) and
   myst-nb does not read frontmatter in a cell (it would show it as a heading), so the block is cut from the first
   cell before the page is parsed. (book/_ext/colab_rendition.py cuts it from the Colab rendition too.)
2. ``python book/_ext/lab_numbering.py``: writes (or updates) that block in every chapter listed in _toc.yml, with
   the chapter's number on the website (its place in the numbered part). tests/test_notebooks.py checks that every
   chapter carries the block its number asks for.

JupyterLab numbers every display equation, the website only labelled ones (``$$ ... $$ (label)``): the two agree
when every display equation has a label, which tests/test_notebooks.py checks as well.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
KINDS = ("exercise", "equation", "proof:theorem")  # what the chapters number
FRONTMATTER = re.compile(r"\A---[ \t]*\n(?P<yaml>.*?\n)---[ \t]*(?:\n|\Z)", re.S)


def frontmatter(chapter: str) -> str:
    """The block for chapter ``chapter`` ("3")."""
    lines = [f"  {kind}:\n    enumerator: {chapter}.%s\n" for kind in KINDS]
    return "---\nnumbering:\n" + "".join(lines) + "---\n"


def split_frontmatter(text: str) -> tuple[str, str]:
    """(the frontmatter block, or "", the rest) of a Markdown cell's text."""
    match = FRONTMATTER.match(text)
    return (match.group(0), text[match.end():]) if match else ("", text)


def chapter_numbers(root: Path = ROOT) -> dict[str, str]:
    """Notebook path (notebooks/03_masks) -> its chapter number on the website, from _toc.yml's numbered parts."""
    import yaml

    toc, numbers = yaml.safe_load((root / "_toc.yml").read_text()), {}
    for part in toc.get("parts", []):
        if part.get("numbered"):
            for entry in part.get("chapters", []):
                numbers[entry["file"]] = str(len(numbers) + 1)
    return numbers


def cut_frontmatter(app, docname, source) -> None:
    """Sphinx's source-read: the notebook's first Markdown cell without its frontmatter."""
    if not str(app.env.doc2path(docname)).endswith(".ipynb"):
        return
    notebook = json.loads(source[0])
    first = next((c for c in notebook["cells"] if c["cell_type"] == "markdown"), None)
    if first is None:
        return
    text = "".join(first["source"]) if isinstance(first["source"], list) else first["source"]
    block, rest = split_frontmatter(text)
    if block:
        first["source"] = rest
        source[0] = json.dumps(notebook)


def write(root: Path = ROOT) -> list[Path]:
    """Give every numbered chapter the frontmatter of its number; returns the notebooks changed."""
    changed = []
    for entry, number in chapter_numbers(root).items():
        path = root / f"{entry}.ipynb"
        notebook = json.loads(path.read_text())
        first = next(c for c in notebook["cells"] if c["cell_type"] == "markdown")
        block, rest = split_frontmatter("".join(first["source"]))
        if block != frontmatter(number):
            first["source"] = (frontmatter(number) + rest).splitlines(keepends=True)
            path.write_text(json.dumps(notebook, indent=1, ensure_ascii=False) + "\n")
            changed.append(path)
    return changed


def setup(app):
    app.connect("source-read", cut_frontmatter)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    done = write(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT)
    print("\n".join(f"numbered {path.relative_to(ROOT)}" for path in done) or "every chapter is numbered already")
