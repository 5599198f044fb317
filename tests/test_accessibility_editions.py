"""The student and Chinese editions' pages, audited as the full edition's are in tests/test_accessibility.py
(``every_page``), in a file of their own so that another test process takes them (tests run a file to a process).

The Chinese edition: every page, axe's rules in light mode at 1280 px and the reader's checks of tests/test_site.py.
A student edition's page is the page of the edition it is made from less the solutions (asserted here, tag by tag:
it adds nothing, and every reference to an id on it still resolves), so axe, which judges what a page shows, finds
on it what it finds on that page, audited already, but for what leaving out can change (a container left empty, a
reference to what is gone): that is judged on the page that leaves out the most, with axe, and on every page, the
references.
"""
import re

import pytest
from test_accessibility import EDITIONS, axe_source, browser, every_page, served  # noqa: F401  (fixtures)
from test_site import PAGES

STUDENT = {"student": "full", "zh-student": "zh"}  # a student edition -> the edition it is made from
SUFFIXES = (" (student edition)", "（学生版）")  # what instructor/student.py adds to the book's title (book/_ext/i18n.py)
REFERENCES = ("aria-labelledby", "aria-describedby", "aria-controls", "aria-owns", "aria-activedescendant", "for")


def tag_lines(path) -> list[str]:
    """The page's HTML, a tag (or a text between tags) a line, without Sphinx's ``?v=<checksum>`` after a stylesheet or
    script: Sphinx writes it only when the file is in the output folder already as the page is written, so a site
    built again in its folder has it and one built afresh does not (the same file either way)."""
    return re.sub(r">\s*<", ">\n<", re.sub(r'\?v=[0-9a-f]{8}"', '"', path.read_text())).splitlines()


def left_out(parent: list[str], child: list[str]) -> int | None:
    """How many runs of ``parent``'s lines ``child`` leaves out, when ``child`` is ``parent`` with lines left out and
    nothing else (the book's title aside: SUFFIXES); None when it is not."""
    i, runs = 0, 0
    for line in child:
        start, plain = i, line
        for suffix in SUFFIXES:
            plain = plain.replace(suffix, "")
        while i < len(parent) and line != parent[i] and plain != parent[i]:
            i += 1
        if i == len(parent):
            return None
        runs, i = runs + (i > start), i + 1
    return runs + (i < len(parent))


def unresolved(path) -> list[str]:
    """References on the page to an id it does not hold: ARIA's, a label's, a link to a place on the page."""
    import lxml.html

    tree = lxml.html.parse(str(path))
    ids = set(tree.xpath("//@id"))
    wanted = [(name, ref) for name in REFERENCES for value in tree.xpath(f"//@{name}") for ref in value.split()]
    wanted += [("href", href[1:]) for href in tree.xpath("//a/@href") if href.startswith("#") and len(href) > 1]
    return [f"{name}={ref!r}" for name, ref in wanted if ref not in ids]


def test_the_rule_finds_what_a_page_adds():
    parent = ["<html>", "<title>T</title>", "<p>", "a", "</p>", "<div>", "solution", "</div>", "</html>"]
    assert left_out(parent, parent) == 0
    assert left_out(parent, ["<html>", "<title>T (student edition)</title>", "<p>", "a", "</p>", "</html>"]) == 1
    assert left_out(parent, ["<html>", "<title>T</title>", "<p>", "b", "</p>", "</html>"]) is None  # changed
    assert left_out(parent, ["<html>", "<p>", "a", "</p>", "<title>T</title>", "</html>"]) is None  # moved


@pytest.mark.parametrize("edition", STUDENT)
def test_a_student_page_is_its_editions_page_less_the_solutions(edition):
    folder, parent = EDITIONS[edition], EDITIONS[STUDENT[edition]]
    if not (folder / "index.html").exists():
        pytest.skip(f"no student edition in {folder}: run `make student` first")
    added = [page for page in PAGES if left_out(tag_lines(parent / f"{page}.html"), tag_lines(folder / f"{page}.html"))
             is None]
    assert not added, f"pages of the {edition} edition with markup or text that {STUDENT[edition]}'s lack: {added}"
    broken = {page: unresolved(folder / f"{page}.html") for page in PAGES}
    assert not any(broken.values()), f"references to what the {edition} edition left out: " + str(
        {page: refs[:5] for page, refs in broken.items() if refs})


def most_left_out(edition: str) -> str:
    """The page of a student edition that leaves out the most runs of its edition's page."""
    folder, parent = EDITIONS[edition], EDITIONS[STUDENT[edition]]
    return max(PAGES, key=lambda page: left_out(tag_lines(parent / f"{page}.html"),
                                                tag_lines(folder / f"{page}.html")) or 0)


@pytest.mark.parametrize("edition", [edition for edition in EDITIONS if edition != "full"])
def test_every_page(browser, served, axe_source, edition):  # noqa: F811
    """The Chinese edition's every page; a student edition's page that leaves out the most."""
    if edition in STUDENT and not (EDITIONS[edition] / "index.html").exists():
        pytest.skip(f"no student edition in {EDITIONS[edition]}: run `make student` first")
    every_page(browser, served, axe_source, edition, [most_left_out(edition)] if edition in STUDENT else PAGES)
