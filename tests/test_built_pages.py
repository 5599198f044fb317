"""Every built page is read for what a failed run leaves in it: an error's output, a traceback, or a deprecation
warning printed by a cell. A page that shows one fails the test, naming the page and the cell.

It reads the HTML files themselves (no browser), in every edition that was built: the website (``_build/html``) and
the student edition (``_build/student/html``). Together with book/_ext/failed_runs.py (a notebook whose run failed is
executed again by the next build) and the Makefile (a failed build removes the site), a broken page cannot be
published by a build that exits 0.
"""
import os
import re
from pathlib import Path

import pytest
from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("ATTENTION_COURSE_SITE", ROOT / "_build" / "html")).resolve()
EDITIONS = {"website": SITE, "student edition": ROOT / "_build" / "student" / "html"}

# What a failed or deprecated call leaves in a cell's output. The course's chapters show warnings and caught errors
# on purpose (a UserWarning of PyTorch's, "RuntimeError: ..." printed by a cell that catches it), never a traceback
# of an uncaught error or a DeprecationWarning / FutureWarning.
TRACEBACK = re.compile(r"Traceback \(most recent call last\)|\bDeprecationWarning\b|\bFutureWarning\b")


def problems(html: str) -> list[str]:
    """'cell N: what it shows' for each code cell whose output holds an error, a traceback or a deprecation."""
    if not TRACEBACK.search(html) and not re.search(r'class="[^"]*\b(traceback|error)\b', html):
        return []  # nothing to find: no output's text or class can show one (parsing is most of this test's time)
    soup = BeautifulSoup(html, "html.parser")
    found = []
    for number, cell in enumerate(soup.select("div.cell"), start=1):
        for output in cell.select("div.cell_output, div.output"):
            classes = " ".join(output.get("class", []))
            text = output.get_text("\n")
            match = TRACEBACK.search(text)
            if "traceback" in classes.split() or "error" in classes.split() or match:
                source = cell.select_one("div.cell_input")
                first = (source.get_text().strip().splitlines() or [""])[0][:80] if source else ""
                found.append(f"cell {number} ({first!r}): {(match.group(0) if match else classes)!r}")
                break
    return found


def test_an_error_output_is_found_and_named():
    page = """<div class="cell docutils container"><div class="cell_input"><pre>x = f()</pre></div>
      <div class="cell_output docutils container"><div class="output traceback highlight-ipythontb">
      <pre>AssertionError: ('float32', 'loop, cache')</pre></div></div></div>
      <div class="cell docutils container"><div class="cell_output"><div class="output stderr">
      <pre>FutureWarning: `x` is deprecated</pre></div></div></div>
      <div class="cell docutils container"><div class="cell_output"><div class="output stderr">
      <pre>UserWarning: a warning the chapter shows</pre></div></div></div>"""
    assert problems(page) == ["cell 1 ('x = f()'): 'output traceback highlight-ipythontb'",
                              "cell 2 (''): 'FutureWarning'"]


@pytest.mark.parametrize("edition", EDITIONS)
def test_no_built_page_shows_an_error(edition):
    site = EDITIONS[edition]
    if not (site / "index.html").exists():
        pytest.skip(f"the {edition} is not built ({site}): `make book` / `make student`")
    pages = [p for p in sorted(site.rglob("*.html")) if not {"_static", "_sources", "_colab"} & set(p.parts)]
    found = {str(p.relative_to(site)): problems(p.read_text(encoding="utf-8")) for p in pages}
    found = {page: cells for page, cells in found.items() if cells}
    assert not found, f"pages of the {edition} showing a failed run: {found}"
    assert len(pages) >= 12, f"only {len(pages)} pages in {site}"
