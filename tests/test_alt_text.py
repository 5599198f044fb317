"""Every figure has a text alternative that says what it shows, on both editions of the site.

The alt text of a chapter's figure is written in the notebook, in the metadata of the code cell that draws it, where
myst-nb reads it (``"mystnb": {"image": {"alt": "..."}}``; myst-nb gives that one text to every image the cell
shows, so a cell shows one figure). Three levels:

- the sources: every code cell that draws a figure (FIGURE_CALL) carries an alt text of at least MIN_WORDS words that
  is not a file name, and no other cell carries one;
- the executed notebooks of the build (``_build/jupyter_execute``): every cell whose outputs hold an image is such a
  cell, and holds one image only;
- the built pages of every edition (``_build/html`` or $ATTENTION_COURSE_SITE, ``_build/student/html`` beside it,
  and the Chinese edition of each in their ``zh/``): every image in a page's article has an alt text of at least
  MIN_WORDS words that is not a file name (myst-nb's default is the image's path, ``../_images/<sha256>.png``), and
  no two figures of a page share one. Words are counted in both languages (count_words: Chinese is not written
  with spaces, and twelve Chinese characters are about six words, not one).

The rules are checked on hand-made cases too, each of which must fail.
"""
import functools
import json
import math
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest

from test_site import BOOK, SITE, toc_pages

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "book" / "_ext"))
from translate_notebooks import catalog_for  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXECUTED = SITE.parent / "jupyter_execute" / "notebooks"  # myst-nb's executed copies, beside the site it built
EDITIONS = {"full": SITE, "student": SITE.parent / "student" / "html", "zh": SITE / "zh",
            "zh-student": SITE.parent / "student" / "html" / "zh"}
MIN_WORDS = 8  # "Heat map of the weights." says too little; a figure's alt says what it shows and what to take
# A call that draws a figure: a new matplotlib figure, one of the package's plots, or a widget's static picture.
FIGURE_CALL = re.compile(r"\b(?:plt\.(?:subplots|figure|subplot_mosaic|subplot|imshow|plot|bar|show)"
                         r"|plot_(?:attention|mask|heatmap|bars)|\w+\.figure)\(")
IMAGE_TYPES = ("image/png", "image/jpeg", "image/svg+xml", "image/gif")


def load(path):
    return json.loads(Path(path).read_text())


def alt_of(cell) -> str | None:
    return cell.get("metadata", {}).get("mystnb", {}).get("image", {}).get("alt")


HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff]+")


def count_words(text: str) -> int:
    """Words in English or Chinese text: Latin-script words and numbers, plus the words of each run of Chinese
    characters as jieba cuts it (a dev requirement; without it, two characters a word, about their average)."""
    latin = re.findall(r"[^\W_][\w'’-]*", HAN.sub(" ", text))
    chinese = 0
    for run in HAN.findall(text):
        try:
            import jieba
        except ImportError:
            chinese += math.ceil(len(run) / 2)
        else:
            chinese += sum(1 for word in jieba.lcut(run) if word.strip())
    return len(latin) + chinese


def alt_problems(alt) -> list[str]:
    """What is wrong with an alt text: missing, a file name or path, or fewer than MIN_WORDS words."""
    if alt is None or not str(alt).strip():
        return ["no alt text"]
    alt = str(alt).strip()
    problems = []
    if (re.search(r"\.(?:png|jpe?g|gif|svg|webp)\b", alt, re.I) or re.search(r"[0-9a-f]{16,}", alt, re.I)
            or (" " not in alt and "/" in alt)):
        problems.append(f"alt text {alt[:60]!r} is a file name or path")
    words = count_words(alt)
    if words < MIN_WORDS:
        problems.append(f"alt text {alt!r} has {words} words (fewer than {MIN_WORDS}): say what the figure shows")
    return problems


def source_problems(notebook) -> list[str]:
    """Cells that draw a figure without a good alt text, and alt texts on cells that draw none."""
    problems = []
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        draws, alt = FIGURE_CALL.search(source), alt_of(cell)
        if draws:
            problems += [f"cell {i} ({draws.group(0)}...): {p}: add metadata mystnb.image.alt" if p == "no alt text"
                         else f"cell {i}: {p}" for p in alt_problems(alt)]
        elif alt is not None:
            problems.append(f"cell {i}: an alt text on a cell that draws no figure ({source[:40]!r})")
    return problems


def executed_problems(executed, source) -> list[str]:
    """Cells of an executed notebook whose outputs hold images: the same cell of the source must have an alt text,
    and show one image only (myst-nb would give every image of the cell the same text)."""
    problems = []
    sources = {"".join(c["source"]): c for c in source["cells"] if c["cell_type"] == "code"}
    for i, cell in enumerate(executed["cells"]):
        if cell["cell_type"] != "code":
            continue
        images = [o for o in cell.get("outputs", []) if any(t in o.get("data", {}) for t in IMAGE_TYPES)]
        if not images:
            continue
        text = "".join(cell["source"])
        original = sources.get(text)
        if original is None:
            problems.append(f"cell {i} ({text[:40]!r}) is not in the source: rebuild the book")
            continue
        problems += [f"cell {i} ({text[:40]!r}): {p}" for p in alt_problems(alt_of(original))]
        if len(images) > 1:
            problems.append(f"cell {i} ({text[:40]!r}) shows {len(images)} images, which would share one alt text: "
                            "split the cell, one figure each")
    return problems


class ArticleImages(HTMLParser):
    """The alt attribute (None when absent) and src of every <img> inside the page's <article>."""

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.depth, self.images = 0, []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag == "article":
            self.depth += 1
        elif tag == "img" and self.depth:
            self.images.append((attrs.get("alt"), attrs.get("src", "")))

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)

    def handle_endtag(self, tag):
        if tag == "article" and self.depth:
            self.depth -= 1


def article_images(page_html: str) -> list[tuple]:
    parser = ArticleImages()
    parser.feed(page_html)
    return parser.images


# A built page parsed once (Python's HTMLParser: a third of a second to over a second a page, some 60 pages): its
# images serve both the check of each page's alt texts and the count of every edition's figures below.
@functools.cache
def built_images(path: Path) -> tuple:
    return tuple(article_images(path.read_text()))


def page_problems(page_html: str) -> list[str]:
    return image_problems(article_images(page_html))


def image_problems(images) -> list[str]:
    problems, seen = [], {}
    for alt, src in images:
        name = Path(src).name[:16]
        problems += [f"image {name}: {p}" for p in alt_problems(alt)]
        if alt and alt in seen:
            problems.append(f"image {name} has the same alt text as {seen[alt]}: {alt[:60]!r}")
        seen.setdefault(alt, name)
    return problems


# ------------------------------------------------------------------------------------------------ the book
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_figure_cell_has_alt_text(path):
    problems = source_problems(load(path))
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


def test_figures_are_found_in_the_sources():
    """The rule finds figures where the chapters have them (a rule that matched nothing would pass everything)."""
    found = {path.name: sum(1 for c in load(path)["cells"] if c["cell_type"] == "code" and alt_of(c))
             for path in NOTEBOOKS}
    assert sum(found.values()) >= 20 and found["03_masks.ipynb"] >= 3, found


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_executed_image_has_its_cells_alt_text(path):
    executed = EXECUTED / path.name
    if not executed.exists():
        pytest.skip(f"no executed notebook in {EXECUTED}: run `make book` first")
    problems = executed_problems(load(executed), load(path))
    assert not problems, f"{executed}:\n" + "\n".join(problems)


PAGES = toc_pages()


@pytest.mark.parametrize("page", PAGES)
@pytest.mark.parametrize("edition", list(EDITIONS))
def test_every_article_image_says_what_it_shows(edition, page):
    site = EDITIONS[edition]
    if not (site / "index.html").exists():
        if edition in ("full", "zh"):
            pytest.fail(f"no built site in {site}: run `make book` first (or set ATTENTION_COURSE_SITE)")
        pytest.skip(f"no student edition in {site}: run `make student` first")
    path = site / f"{page}.html"
    assert path.exists(), f"{path} is missing"
    problems = image_problems(built_images(path))
    assert not problems, f"{edition} edition, {page}.html:\n" + "\n".join(problems)


def test_the_built_editions_show_their_figures():
    """The pages hold the chapters' figures (a parse that found no image would pass everything)."""
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built site in {SITE}: run `make book` first")
    figures = sum(1 for notebook in NOTEBOOKS for c in load(notebook)["cells"] if c["cell_type"] == "code"
                  and alt_of(c))
    for edition, site in EDITIONS.items():
        if not (site / "index.html").exists():
            continue
        shown = [alt for page in PAGES if (site / f"{page}.html").exists()
                 for alt, _ in built_images(site / f"{page}.html")]
        written = {alt_of(c) for notebook in NOTEBOOKS for c in load(notebook)["cells"] if alt_of(c)}
        if edition.startswith("zh"):  # the translations of the notebooks' alt texts (or, untranslated, the English)
            written |= {translated for notebook in NOTEBOOKS
                        for translated in catalog_for(f"notebooks/{notebook.stem}").values()}
        assert set(shown) <= written, f"{edition} edition: alt texts that are not the notebooks': {set(shown) - written}"
        if edition in ("full", "zh"):  # the student edition leaves out solutions, and a figure a solution draws with them
            assert len(shown) == figures, f"{len(shown)} article images, {figures} figure cells in the notebooks"
        else:
            assert shown, f"{edition} edition: no figure at all"


# ------------------------------------------------------------------------------------------------ the rules
GOOD_ALT = "Heat map of the attention weights of 5 queries over 7 keys: each row sums to 1."


def code(text, alt=None, outputs=()):
    metadata = {"mystnb": {"image": {"alt": alt}}} if alt is not None else {}
    return {"cell_type": "code", "metadata": metadata, "source": text.splitlines(keepends=True),
            "outputs": list(outputs), "execution_count": None}


def notebook(*cells):
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


PNG_OUTPUT = {"output_type": "display_data", "data": {"image/png": "iVBORw0KGgo=", "text/plain": "<Figure>"},
              "metadata": {}}


@pytest.mark.parametrize("alt, expected", [
    (None, "no alt text"),
    ("", "no alt text"),
    ("../_images/2f46c8fd51082a01630fd20da2221d52dd01961cbc2ed367145b1c8f99c33a63.png", "file name or path"),
    ("figure.png", "file name or path"),
    ("Attention weights", "has 2 words"),
    ("A heat map of the weights.", "has 6 words"),
])
def test_bad_alt_texts_are_caught(alt, expected):
    problems = alt_problems(alt)
    assert problems and any(expected in p for p in problems), problems


def test_chinese_words_are_counted():
    """Chinese has no spaces: a short Chinese alt text is not "1 word" (which would fail anything), nor a long one."""
    assert alt_problems("注意力权重的热力图") and "has 1 words" not in alt_problems("注意力权重的热力图")[0]
    good = "5 个查询对 7 个键的注意力权重热力图：每一行的和都是 1，对角线以上因果掩码遮住的位置全是 0。"
    assert count_words(good) >= MIN_WORDS and alt_problems(good) == []
    assert count_words("mask 掩码") == 2


def test_a_good_alt_text_passes():
    assert alt_problems(GOOD_ALT) == []
    assert alt_problems("Three bar charts of softmax(t · scores) for t = 0.25, 1 and 4: peaked at 4.") == []


def test_the_source_rule_on_hand_made_notebooks():
    good = notebook(code("x = 1"), code("fig, ax = plt.subplots()\nax.plot(x)", alt=GOOD_ALT),
                    code("plot_attention(w[0], tokens, tokens);", alt=GOOD_ALT), code("w.figure();", alt=GOOD_ALT),
                    code("from attention_course.plots import plot_mask"))
    assert source_problems(good) == []
    bad = notebook(code("fig, ax = plt.subplots()"), code("plot_mask(m, title='mask')", alt="mask"),
                   code("y = 2", alt=GOOD_ALT))
    problems = source_problems(bad)
    assert len(problems) == 3, problems
    assert problems[0].startswith("cell 0 (plt.subplots(...): no alt text")
    assert problems[1].startswith("cell 1: alt text 'mask' has 1 words")
    assert problems[2].startswith("cell 2: an alt text on a cell that draws no figure")


def test_the_executed_rule_on_hand_made_notebooks():
    source = notebook(code("show(a)", alt=GOOD_ALT), code("show(b)"), code("show(c)", alt=GOOD_ALT))
    executed = notebook(code("show(a)", outputs=[PNG_OUTPUT]), code("show(b)", outputs=[PNG_OUTPUT]),
                        code("show(c)", outputs=[PNG_OUTPUT, PNG_OUTPUT]), code("show(d)", outputs=[PNG_OUTPUT]))
    problems = executed_problems(executed, source)
    assert len(problems) == 3, problems
    assert "cell 1 ('show(b)'): no alt text" in problems[0]
    assert "cell 2 ('show(c)') shows 2 images" in problems[1] and "split the cell" in problems[1]
    assert "cell 3 ('show(d)') is not in the source" in problems[2]


def test_the_page_rule_on_hand_made_html():
    """As myst-nb writes a figure without alt text (its path), and with one; images outside the article (the
    theme's logos) are not figures."""
    path = "../_images/2f46c8fd51082a01630fd20da2221d52dd01961cbc2ed367145b1c8f99c33a63.png"
    page = (f'<html><body><header><img alt="Colab logo" src="logo.png"></header><main><article class="bd-article">'
            f'<section><div class="cell_output"><img alt="{path}" src="{path}" /></div>'
            f'<div class="cell_output"><img alt="{GOOD_ALT}" src="a.png" /></div>'
            f'<div class="cell_output"><img src="b.png"></div>'
            f'<div class="cell_output"><img alt="{GOOD_ALT}" src="c.png"></div></section></article></main>'
            f'<footer><img alt="" src="x.png"></footer></body></html>')
    assert [src for _, src in article_images(page)] == [path, "a.png", "b.png", "c.png"]
    problems = page_problems(page)
    assert len(problems) == 4, problems
    assert "file name or path" in problems[0] and "has 3 words" in problems[1]  # _images, the hash, png
    assert problems[2] == "image b.png: no alt text"
    assert problems[3].startswith("image c.png has the same alt text as a.png")
    assert page_problems(page.replace(f'<img alt="{path}" src="{path}" />', "").replace('<img src="b.png">', "")
                         .replace(f'<img alt="{GOOD_ALT}" src="c.png">', "")) == []
