"""The Chinese edition (中文版): one source, translated text, identical code (book/_ext/i18n.py, book/locale/).

- code: every code cell of every page, and its outputs, are the English edition's (figures' alt texts apart: they
  are the translations of the English ones);
- catalogs: no message untranslated or fuzzy (this fails while translators are at work: ``make translations`` lists
  what is left);
- prose: no English sentence left in a Chinese page: a run of MIN_ENGLISH_WORDS or more Latin-script words in the
  page's text (article, sidebars, header, footer), outside code (a program's output quoted in code font), math,
  keyboard keys, outputs, links to API
  documentation and the names in NAMES; no control, picture or sidebar caption named in English (english_names);
- spacing: no space between two Chinese characters in a msgstr (a word replaced in bulk once left some);
- math: no English word in a formula's \\text{...} (a symbol's one-word label, $n_\\text{layers}$, and names of
  code apart): the words of a formula are translated as the prose around it;
- the switch: every page links to the same page in the other edition, both ways, and says its language (``lang``);
- drift: a changed English sentence becomes an untranslated message, and the Chinese page shows the new English
  sentence (never the stale translation) until the catalog is updated (a scratch book, built here);
- titles: every theorem, exercise and solution box names its subject in Chinese, and the instructors' table of the
  exercises is in Chinese (words and titles);
- the student edition: none of the solutions' translated prose in its Chinese pages, notebooks or search index;
- the notebooks made from the catalogs (book/_ext/translate_notebooks.py): Markdown translated (every message of a
  chapter placed), code untouched.
"""
import json
import copy
import functools
import hashlib
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from test_site import PAGES, SITE

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import translate_notebooks  # noqa: E402
import zh_edition  # noqa: E402

ZH = SITE / "zh"
CATALOGS = sorted((ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES").rglob("*.po"))
MIN_ENGLISH_WORDS = 4
# Names that stay as they are in Chinese text (titles of works, products): a short list, not a way around the rule.
NAMES = ["Attention Is All You Need", "Dive into Deep Learning", "Jupyter Book", "Google Colab", "JupyterLab",
         "PyTorch", "Flash Attention", "FlashAttention", "Online normalizer calculation for softmax",
         "Self-attention does not need memory"]  # the last: the title chapter 8 cites, its $O(n^2)$ skipped as math
SKIPPED = "pre, code, kbd, samp, script, style, .math, mjx-container, .cell_output, .cell_input"
bs4 = pytest.importorskip("bs4")


# A <pre> block (code, an output) and its content: most of a chapter's tags are the highlighter's spans inside them.
PRE = re.compile(r"(<pre\b[^>]*)>(.*?)</pre>", re.S)


def flat_pre(match: re.Match) -> str:
    """A <pre> block as its text alone, its markup kept as a digest in ``data-markup``: the tests read code as text,
    and compare outputs and code markup through the digest."""
    markup = hashlib.sha1(match.group(2).encode()).hexdigest()[:16]
    return f'{match.group(1)} data-markup="{markup}">{re.sub(r"<[^>]*>", "", match.group(2))}</pre>'


@functools.lru_cache(maxsize=None)
def soup(path: Path):
    """A page's tree, parsed once for this file's tests (lxml: a third of html.parser's time), each <pre> block flat
    (``flat_pre``: its tags, eight in ten of a chapter's, took most of the parsing). Shared: a test that takes elements
    out copies what it changes."""
    return bs4.BeautifulSoup(PRE.sub(flat_pre, path.read_text()), "lxml")


def built(page: str):
    en, zh = SITE / f"{page}.html", ZH / f"{page}.html"
    if not en.exists():
        pytest.fail(f"no {en}: run `make book` first")
    if not zh.exists():
        pytest.fail(f"no {zh}: the Chinese edition is built by `make book` (book/_ext/zh_edition.py build)")
    return soup(en), soup(zh)


def cells(page_soup) -> list[tuple[str, str, list]]:
    """(code, each block with its markup's digest; outputs' HTML without alt texts; the alt texts) of every code cell of
    a page, in order."""
    found = []
    for cell in page_soup.select("div.cell"):
        code = "\n".join(pre.get_text() + f" ({pre.get('data-markup')})" for pre in cell.select(".cell_input pre"))
        outputs = cell.select(".cell_output")
        alts = [img.get("alt") for out in outputs for img in out.select("img")]
        html = re.sub(r'(<img\b[^>]*?) alt="[^"]*"', r"\1", "".join(str(o) for o in outputs))
        found.append((code, html, alts))
    return found


def test_a_flat_pre_block_keeps_its_text_and_tells_its_markup_apart():
    one = '<div><pre class="x"><span class="n">a</span> &lt; <span class="k">b</span></pre></div>'
    other = one.replace('class="k"', 'class="n"')  # the same text, highlighted otherwise
    flat = [bs4.BeautifulSoup(PRE.sub(flat_pre, page), "lxml").pre for page in (one, other)]
    assert [pre.get_text() for pre in flat] == ["a < b", "a < b"] and flat[0]["class"] == ["x"]
    assert flat[0]["data-markup"] != flat[1]["data-markup"] and not flat[0].find("span")


# ------------------------------------------------------------------------------------------------ the built editions
@pytest.mark.parametrize("page", PAGES)
def test_code_and_outputs_are_the_english_editions(page):
    en, zh = built(page)
    en_cells, zh_cells = cells(en), cells(zh)
    assert len(zh_cells) == len(en_cells), f"{page}: {len(en_cells)} code cells in English, {len(zh_cells)} in Chinese"
    catalog = translate_notebooks.catalog_for(page)
    for n, ((code, out, alts), (zh_code, zh_out, zh_alts)) in enumerate(zip(en_cells, zh_cells)):
        assert zh_code == code, f"{page}, code cell {n}: the Chinese edition's code differs"
        assert zh_out == out, f"{page}, code cell {n}: the Chinese edition's outputs differ"
        assert zh_alts == [catalog.get(a, a) for a in alts], f"{page}, code cell {n}: alt texts {zh_alts}"


def formulas(page_soup) -> list[str]:
    """The LaTeX of every display formula of a page, its number apart."""
    found = []
    for div in page_soup.select("div.math"):
        div = copy.copy(div)
        for number in div.select(".eqno"):
            number.decompose()
        found.append(div.get_text().strip())
    return found


@pytest.mark.parametrize("page", PAGES)
def test_the_formulas_of_a_chinese_page_are_the_english_ones_translated(page):
    """A display formula shows its catalog's translation (the words of its \text{...}) and otherwise the English
    page's LaTeX: Sphinx's Locale turned each translated formula into "::" (the Markdown parser reads the literal
    block it builds as a paragraph), book/_ext/i18n.py's FormulasTranslated puts the translation in place."""
    en, zh = built(page)
    translated = {msgid.strip(): msgstr.strip() for msgid, msgstr in translate_notebooks.catalog_for(page).items()
                  if msgid != msgstr and msgid.strip()}
    expected = []
    for formula in formulas(en):
        for msgid, msgstr in translated.items():
            if msgid in formula:
                formula = formula.replace(msgid, msgstr)
        expected.append(formula)
    assert formulas(zh) == expected, f"zh/{page}.html: its formulas differ from the English ones translated"


@pytest.mark.parametrize("page", PAGES)
def test_every_page_switches_to_the_other_language_and_back(page):
    en, zh = built(page)
    assert en.html.get("lang") == "en" and zh.html.get("lang") == "zh-CN", (en.html.get("lang"), zh.html.get("lang"))
    for here, there, target, lang in ((en, SITE / f"{page}.html", ZH / f"{page}.html", "zh-CN"),
                                      (zh, ZH / f"{page}.html", SITE / f"{page}.html", "en")):
        links = here.select("a.ac-language-switch")
        assert len(links) == 1, f"{there}: {len(links)} language switches"
        assert links[0].get("hreflang") == lang and links[0].get("lang") == lang and links[0].get_text(strip=True)
        assert (there.parent / links[0]["href"]).resolve() == target.resolve(), f"{there}: switch to {links[0]['href']}"


def chinese_part(page_soup):
    """A copy of the page's body without what is meant to stay as it is: SKIPPED elements, and whatever is marked as
    English (``lang="en"``: the switch to the English page)."""
    body = copy.copy(page_soup.body or page_soup)
    for skipped in body.select(f"{SKIPPED}, [lang|=en]"):
        skipped.decompose()
    return body


def english_runs(page_soup) -> list[str]:
    """Runs of MIN_ENGLISH_WORDS or more Latin-script words in the page's text, the sidebars, header and footer with
    the article (SKIPPED elements and NAMES apart), each with a little context."""
    article = chinese_part(page_soup)
    for link in article.select("a[href]"):
        if re.search(r"(pytorch\.org|python\.org|numpy\.org|huggingface\.co)/.*(docs|api|generated)", link["href"]):
            link.decompose()  # a link to an API's documentation: its name, usually a qualified one
    text = re.sub(r"\s+", " ", article.get_text(" "))
    for name in NAMES:
        text = text.replace(name, " ")
    word = r"[A-Za-z][A-Za-z'’-]*"
    return [m.group(0) for m in re.finditer(rf"{word}(?:[ ,;:]+{word}){{{MIN_ENGLISH_WORDS - 1},}}", text)]


# Attributes that name a control or a picture for a reader: a screen reader speaks them, a mouse shows some as tooltips.
NAMING = ("title", "aria-label", "alt", "placeholder", "data-bs-title")
LATIN_WORD = re.compile(r"[A-Za-z]{2,}")


def english_names(page_soup) -> list[str]:
    """Names in English where a Chinese reader meets them: a naming attribute (NAMING) of two Latin words or more with no
    Chinese in it ("Toggle primary sidebar", "Colab logo"), and a caption of the sidebar with a Latin word and no
    Chinese ("Chapters"). A single word is a name or a file type there ("Colab", ".pdf")."""
    body = chinese_part(page_soup)
    found = [f'{name}="{element[name]}"' for element in body.find_all(True) for name in NAMING
             if len(LATIN_WORD.findall(element.get(name) or "")) >= 2 and not HAN.search(element[name])]
    found += [f"caption {caption.get_text(strip=True)!r}" for caption in body.select("[role=heading]")
              if LATIN_WORD.search(caption.get_text()) and not HAN.search(caption.get_text())]
    return found


@pytest.mark.parametrize("page", PAGES)
def test_no_english_sentence_left_in_a_chinese_page(page):
    _, zh = built(page)
    runs = english_runs(zh)
    assert not runs, f"zh/{page}.html: {len(runs)} English runs left, e.g. " + "; ".join(r[:60] for r in runs[:5])
    names = english_names(zh)
    assert not names, f"zh/{page}.html: {len(names)} names left in English: " + "; ".join(names[:6])


TITLED = ("proof", "exercise", "solution")  # sphinx-proof's theorems (and proofs), sphinx-exercise's boxes
HAN = re.compile(r"[\u4e00-\u9fff]")


def box_titles(page_soup) -> list[str]:
    """The title of every theorem, exercise and solution box of a page, in order, code and math taken out."""
    found = []
    for title in page_soup.select(", ".join(f"div.{kind} > p.admonition-title" for kind in TITLED)):
        title = copy.copy(title)
        for skipped in title.select(SKIPPED):
            skipped.decompose()
        found.append(re.sub(r"\s+", " ", title.get_text(" ")).strip())
    return found


def named_part(title: str) -> str:
    """What a box's title names, in its last parentheses: "Exercise 3.1 (The padding mask of a batch)" ->
    "The padding mask of a batch"; "" for a box with a number alone."""
    match = re.search(r"[(（]([^()（）]*)[)）]\s*$", title)
    return match.group(1).strip() if match else ""


@pytest.mark.parametrize("page", PAGES)
def test_every_box_title_is_translated(page):
    """A theorem's, an exercise's or a solution's title names it in Chinese: a title of a word or two ("Temperature")
    is shorter than an English run the rule above counts, and a solution's title is written from its exercise's."""
    en, zh = built(page)
    en_titles, zh_titles = box_titles(en), box_titles(zh)
    assert len(zh_titles) == len(en_titles), f"{page}: {len(en_titles)} titled boxes in English, {len(zh_titles)}"
    left = [f"{zh_title!r} (English: {en_title!r})" for en_title, zh_title in zip(en_titles, zh_titles)
            if not zh_edition.code_only(named_part(en_title)) and not HAN.search(named_part(zh_title))]
    assert not left, f"zh/{page}.html: {len(left)} titles left in English: " + "; ".join(left[:4])


@pytest.mark.parametrize("folder", [ZH, SITE.parent / "student" / "html" / "zh"], ids=["zh", "zh-student"])
def test_the_book_is_named_in_chinese_on_every_page(folder):
    """Each page's <title> and the header name the book as the root page's catalog translates its title (the student
    edition's mark in Chinese too): no English book title in a Chinese page."""
    if not (folder / "index.html").exists():
        pytest.skip(f"no {folder}: `make book` (`make student`: the student edition) builds it")
    import polib

    english = yaml.safe_load((ROOT / "_config.yml").read_text())["title"]
    chinese = polib.pofile(str(ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "book" / "intro.po")).find(english)
    assert chinese is not None and chinese.msgstr, f"the root page's catalog translates no title {english!r}"
    import lxml.html

    left = {}
    for page in PAGES:  # lxml's own tree: the student pages are read by this test alone (a tenth of soup's time)
        tree = lxml.html.parse(str(folder / f"{page}.html"))
        logos = tree.xpath("//*[contains(concat(' ', normalize-space(@class), ' '), ' logo__title ')]")
        names = [tree.findtext(".//title")] + [t.text_content() for t in logos]
        if len(names) < 2 or any(english in name or "student edition" in name or chinese.msgstr not in name
                                 for name in names):
            left[page] = names
    assert not left, f"pages of {folder} naming the book in English: {dict(list(left.items())[:3])}"


@pytest.mark.parametrize("folder", ["zh", "zh/student"], ids=["zh", "zh-student"])
def test_a_chinese_doctree_holds_its_own_page_alone(folder):
    """No node of a Chinese page's doctree keeps, as its document, the one its translated message was parsed in
    (book/_ext/i18n.py, translations_adopted): that document's settings hold the build environment, and with them
    every doctree held all the pages read before it (the last chapter's was 3.3 MB, 0.18 MB in English)."""
    import pickle

    doctrees = sorted((ROOT / "_build" / folder / ".doctrees").rglob("*.doctree"))
    if not doctrees:
        pytest.skip(f"no doctrees in _build/{folder}: `make book` (`make student`: the student edition) makes them")
    foreign = {}
    for path in doctrees:
        doctree = pickle.loads(path.read_bytes())
        others = [node for node in doctree.findall() if node.__dict__.get("_document") not in (None, doctree)]
        if others:
            foreign[path.stem] = f"{len(others)} nodes, e.g. {others[0].astext()[:40]!r}"
    assert not foreign, f"nodes of another document in the doctrees of _build/{folder}: {foreign}"


def test_the_exercise_table_is_in_chinese():
    """book/instructors.md's table of every exercise (book/_ext/exercise_tools.py, ``exercise-list``): its headings
    and words in Chinese, each exercise named by its chapter's translation of its title."""
    _, zh = built("book/instructors")
    table = zh.select_one("table.exercise-list")
    assert table is not None, "zh/book/instructors.html: no table of the exercises"
    header = [th.get_text(strip=True) for th in table.select("thead th")]
    assert all(HAN.search(h) for h in header if h), f"headings {header}"
    rows = [[td.get_text(strip=True) for td in tr.select("td")] for tr in table.select("tbody tr")]
    assert rows and all(HAN.search(row[3]) for row in rows), [row[3] for row in rows if not HAN.search(row[3])]
    for chapter, _label, title, *_ in rows:
        assert title in translate_notebooks.catalog_for(f"notebooks/{chapter}").values(), (chapter, title)


def test_the_english_rule_finds_english_and_spares_code_math_and_names():
    page = bs4.BeautifulSoup(
        "<article><p>这一句是中文，带 <code>torch.nn.functional.softmax</code> 和 <span class='math'>\\(Q K^T\\)</span>。"
        "</p><p>Attention Is All You Need 这篇论文。</p><div class='cell_output'><pre>all checks passed for "
        "this exercise</pre></div><p>This sentence was left in English.</p></article>", "html.parser")
    assert english_runs(page) == ["This sentence was left in English"]


def test_the_english_rule_spares_quoted_program_output_and_flags_english_prose():
    """A message a program prints, quoted in code font (inline code, or the {samp} role whose italics stand for a
    value: Sphinx writes both as <code>, each word in a span), is the program's output, quoted as it prints it (the
    instructors' page quotes the grader so, with a gloss beside): the rule lets it be, however many English words it
    has. The same words as prose, or between Chinese quotation marks without code font, are still an English
    sentence left in the page."""
    def code(words, role=""):
        spans = " ".join(f'<span class="pre">{w}</span>' if w != "WHY" else '<em><span class="pre">why</span></em>'
                         for w in words.split())
        return f'<code class="{role}docutils literal notranslate">{spans}</code>'

    page = bs4.BeautifulSoup(
        "<article>"
        f"<p>超时的练习得 0 分，并写明 {code('timed out (the check ran over 120 s)')}（检查超过了 120 秒）。</p>"
        f"<p>未评分的文件写明原因：{code('not graded: WHY', 'samp ')}（未评分：原因）。</p>"
        f"<p>该行写明 {code('held for review by hand: the check passed, but the solution uses os, _exit', 'samp ')}"
        "（留待手工审阅）。</p>"
        "<p>The check passed, but the solution uses os, so it is held for review.</p>"
        "<p>该行写明“held for review by hand”。</p></article>", "html.parser")
    assert english_runs(page) == ["The check passed, but the solution uses os, so it is held for review",
                                  "held for review by hand"]


def test_the_english_rule_reads_the_whole_page_and_the_names_of_its_controls():
    """What the Chinese pages once showed around their article: the sidebar's captions and the theme's buttons."""
    page = bs4.BeautifulSoup(
        "<body><nav aria-label='Main'><p class='caption' role='heading'><span class='caption-text'>Chapters</span></p>"
        "<p class='caption' role='heading'><span class='caption-text'>Teaching with the course</span></p></nav>"
        "<button title='Toggle primary sidebar'></button><button aria-label='Color mode'></button>"
        "<a title='在 Colab 中打开'><img alt='Colab logo'>Colab</a><a lang='en' title='This page in English'>English</a>"
        "<article><p>正文。</p></article><footer>作者：the attention-course project team</footer></body>", "html.parser")
    assert english_runs(page) == ["Chapters Teaching with the course Colab", "the attention-course project team"]
    assert english_names(page) == ['title="Toggle primary sidebar"', 'aria-label="Color mode"', 'alt="Colab logo"',
                                   "caption 'Chapters'", "caption 'Teaching with the course'"]


# Words of a formula: \text{...} (and its kin) in a msgstr's math.
MATH_TEXT = re.compile(r"\\(?:text|textrm|textit|textbf|mbox)\{([^{}]*)\}")
# Names that stay as they are inside \text{}: values and arguments of the code (NaN, None, the forward's query, key and
# value, RoPE's base, BERT's dense and BertAttention) and lse, the log-sum-exp the chapter names so.
MATH_NAMES = {"NaN", "None", "query", "key", "value", "base", "lse", "dense", "BertAttention"}


def english_in_math(msgstr: str) -> list[str]:
    r"""The \text{...} of a message that hold an English word: not a one-word label of a symbol ($n_\text{layers}$,
    $d_{\text{model}}$), not a name in MATH_NAMES, not an identifier (out\_proj, float32)."""
    found = []
    for match in MATH_TEXT.finditer(msgstr):
        body, before = match.group(1), msgstr[:match.start()]
        if (before.endswith(("_", "^")) or before.endswith(("_{", "^{"))) and re.fullmatch(r"\s*[A-Za-z]+\s*", body):
            continue
        words = re.findall(r"[A-Za-z][\w'’]*", re.sub(r"[\w\\]*\\_[\w\\]*", " ", body))
        if any(word not in MATH_NAMES for word in words if len(word) > 1 and not re.search(r"[\d_]", word)):
            found.append(match.group(0))
    return found


def test_the_math_rule_finds_english_words_in_a_formula():
    assert english_in_math(r"&\text{with } W_q \in \mathbb{R}^{D} \text{ and } b_q") == [r"\text{with }",
                                                                                     r"\text{ and }"]
    assert english_in_math(r"\text{cache bytes} = 2 \cdot n_\text{layers} \cdot d_{\text{model}}") == [
        r"\text{cache bytes}"]
    assert english_in_math(r"\text{缓存字节数} = 2 \cdot n_\text{layers} \cdot 0 \cdot \text{NaN}") == []
    assert english_in_math(r"\underbrace{x}_{\text{课程的层，out\_proj = dense}}\Big)}_{\text{BertAttention}}") == []
    assert english_in_math(r"\underbrace{x}_{\text{course's layer, out\_proj = dense}}") != []
    assert english_in_math(r"2 \cdot B h L S \cdot 4 \text{ 字节（float32）}") == []


@pytest.mark.parametrize("catalog", [c for c in CATALOGS if c.parent.name in ("notebooks", "book")],
                         ids=lambda p: p.relative_to(p.parents[2]).as_posix())
def test_no_english_word_in_a_formula(catalog):
    r"""A formula's words (\text{...}) are translated with the message: "with", "where", "bytes per number" read in
    Chinese as the sentence around them; MathJax sets Chinese inside \text in the page's font."""
    import polib

    left = [f"{hit} in {entry.msgid[:60]!r}" for entry in polib.pofile(str(catalog))
            if not entry.obsolete and entry.msgstr for hit in english_in_math(entry.msgstr)]
    assert not left, f"{catalog.name}: {len(left)} English words in formulas:\n" + "\n".join(left)


# Markup of a msgstr, each replaced by one mark: inline code, roles, math, link targets, HTML.
MSG_MARKUP = re.compile(r"\{[\w:-]+\}`[^`]*`|``[^`]*``|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|<[^>]*>", re.S)
SPACE_IN_CHINESE = re.compile(r"[\u4e00-\u9fff][ \u3000]+[\u4e00-\u9fff]")


def test_the_spacing_rule_finds_a_space_inside_chinese():
    assert SPACE_IN_CHINESE.search(MSG_MARKUP.sub("§", "这个层只为 布尔掩码而写"))
    assert not SPACE_IN_CHINESE.search(MSG_MARKUP.sub("§", "批量大小为 8 的张量，`x` 的形状，$h$ 个头"))


@pytest.mark.parametrize("catalog", CATALOGS, ids=lambda p: p.relative_to(p.parents[2]).as_posix())
def test_no_space_between_two_chinese_characters(catalog):
    """TRANSLATING.md: a space between Chinese and Latin letters or numbers, none inside Chinese. A space between two
    Chinese characters shows on the page as a gap (a word replaced in bulk, "只为 布尔掩码", left one)."""
    import polib

    left = [f"{hit.group()!r} in {entry.msgid[:50]!r}" for entry in polib.pofile(str(catalog))
            if not entry.obsolete and entry.msgstr for hit in SPACE_IN_CHINESE.finditer(MSG_MARKUP.sub("§", entry.msgstr))]
    assert not left, f"{catalog.name}: spaces inside Chinese:\n" + "\n".join(left)


@pytest.mark.parametrize("catalog", CATALOGS, ids=lambda p: p.relative_to(p.parents[2]).as_posix())
def test_every_message_is_translated(catalog):
    import polib

    entries = [e for e in polib.pofile(str(catalog)) if not e.obsolete]
    untranslated = [e.msgid for e in entries if not e.msgstr]
    fuzzy = [e.msgid for e in entries if e.msgstr and "fuzzy" in e.flags]
    assert not untranslated and not fuzzy, (
        f"{catalog.name}: {len(untranslated)} untranslated and {len(fuzzy)} fuzzy of {len(entries)} messages, e.g. "
        f"{(untranslated + fuzzy)[0][:70]!r} (`make translations` lists them; book/locale/TRANSLATING.md)")


def test_the_chinese_build_shows_no_message_in_english():
    """What the last Chinese build found untranslated, page by page (book/_ext/i18n.py, MessagesShownInEnglish): a
    changed English sentence is listed here until its catalog is updated and the new sentence translated."""
    report = ZH.parents[1] / "zh" / "untranslated.json"
    if not report.exists():
        pytest.fail(f"no {report}: build the Chinese edition (book/_ext/zh_edition.py build)")
    left = json.loads(report.read_text())
    assert not left, "shown in English: " + "; ".join(f"{doc}: {len(msgs)} ({msgs[0][:50]!r} ...)"
                                                      for doc, msgs in left.items())


def test_a_catalog_per_page():
    missing = [page for page in PAGES if not any(c.as_posix().endswith(f"LC_MESSAGES/{page}.po") for c in CATALOGS)]
    assert not missing, f"pages without a catalog: {missing} (`make translations` makes them)"


def test_chinese_search_index_holds_chinese_words():
    index = ZH / "searchindex.js"
    if not index.exists():
        pytest.fail(f"no {index}: build the Chinese edition")
    terms = json.loads(re.search(r"Search\.setIndex\((.*)\)\s*$", index.read_text(), re.S).group(1))["terms"]
    chinese = [t for t in terms if re.search(r"[\u4e00-\u9fff]", t)]
    assert len(chinese) > 10, "no Chinese words in the index: is jieba installed?"
    assert "掩码" in terms, "the index has no 掩码 (mask): is chapter 3 translated?"


def test_the_chinese_student_edition_holds_no_translated_solution():
    """The leak check (instructor/leaks.py, tests/test_instructor.py) looks for the English solutions everywhere
    under _build/student, the Chinese student edition included; a solution's prose reaches that edition translated,
    so it is looked for here in its translations: every message of a solution's prose, and nowhere else in the
    chapters, is in no file of the Chinese student edition."""
    sys.path.insert(0, str(ROOT))
    from instructor import leaks

    edition = ROOT / "_build" / "student" / "html" / "zh"
    if not (edition / "index.html").exists() and not (edition / "book" / "intro.html").exists():
        pytest.fail(f"no {edition}: `make student` builds it (book/_ext/zh_edition.py build --student)")
    solution, other = leaks.split()
    inside, outside = leaks.flat("\n".join(solution)), leaks.flat("\n".join(other))
    prints = []
    for catalog in CATALOGS:
        if catalog.parent.name != "notebooks":
            continue
        for msgid, msgstr in translate_notebooks.catalog_for(f"notebooks/{catalog.stem}").items():
            if leaks.flat(msgid) in inside and leaks.flat(msgid) not in outside:
                # its Chinese prose between the markup (code, math, roles, links, emphasis), as the page shows it
                prose = re.split(r"\{[\w:-]+\}`[^`]*`|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|[*\[]", msgstr)
                prints += [said for said in map(leaks.flat, prose) if len(said) >= 12 and HAN.search(said)]
    full = " ".join(leaks.text_of(page) for page in sorted((ZH / "notebooks").glob("*.html")))
    shown = [said for said in prints if said in full]
    assert len(shown) > 20, f"{len(shown)} of {len(prints)} translated solutions found in the full edition"
    found = []
    for path in sorted(edition.rglob("*")):
        if path.is_file() and path.suffix in {".html", ".ipynb", ".js", ".txt", ".json"}:
            text = leaks.text_of(path)
            found += [f"{path.relative_to(edition)}: {said[:40]}" for said in prints if said in text]
    assert not found, "translated solution text in the Chinese student edition:\n" + "\n".join(found[:20])


def test_the_chinese_index_keeps_latin_words_whole():
    """jieba alone would cut ``perf_counter`` into "perf" and "counter": a word the English index never holds, and
    one the leak check knows only from a solution (book/_ext/i18n.py, SearchChineseCourse)."""
    pytest.importorskip("jieba")
    import i18n

    words = i18n.chinese_search_language()({}).split("用 time.perf_counter() 计时；填充掩码的形状，ax.label_outer()")
    assert {"perf_counter", "label_outer", "time", "填充", "掩码", "形状"} <= set(words), words
    assert not {"counter", "outer", "perf", "_"} & set(words), words


# ------------------------------------------------------------------------------------------------ the notebooks
NOTEBOOK = {"cells": [
    {"cell_type": "markdown", "metadata": {}, "source": ["# Padding and masks\n", "\n", "A mask says which keys\n",
                                                         "a query may see.\n", "\n", "- Padding masks\n",
                                                         "  hide pads.\n", "\n", "| Mask | Shape |\n", "|---|---|\n",
                                                         "| causal | (L, L) |\n", "\n",
                                                         ":::{exercise} The mask's shape\n", ":label: ex-1\n",
                                                         "Write it.\n", ":::\n"]},
    {"cell_type": "code", "metadata": {"mystnb": {"image": {"alt": "A heat map of the causal mask of 5 tokens."}}},
     "source": ["# A mask says which keys\n", "mask = causal(5)"], "outputs": [], "execution_count": None}],
    "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
CATALOG = {"Padding and masks": "填充与掩码", "A mask says which keys a query may see.": "掩码规定查询能看到哪些键。",
           "Padding masks hide pads.": "填充掩码遮住填充位。", "Mask": "掩码", "Shape": "形状", "causal": "因果",
           "The mask's shape": "掩码的形状", "Write it.": "写出它。",
           "A heat map of the causal mask of 5 tokens.": "5 个词元的因果掩码的热力图。", "Not in the notebook.": "不在。"}


def test_a_notebook_translated_with_its_catalog():
    translated, missing = translate_notebooks.translate_notebook(NOTEBOOK, CATALOG)
    text = "".join(translated["cells"][0]["source"])
    assert text == ("# 填充与掩码\n\n掩码规定查询能看到哪些键。\n\n- 填充掩码遮住填充位。\n\n| 掩码 | 形状 |\n|---|---|\n"
                    "| 因果 | (L, L) |\n\n:::{exercise} 掩码的形状\n:label: ex-1\n写出它。\n:::\n")
    code = translated["cells"][1]
    assert code["source"] == NOTEBOOK["cells"][1]["source"], "a code cell was changed"
    assert code["metadata"]["mystnb"]["image"]["alt"] == CATALOG["A heat map of the causal mask of 5 tokens."]
    assert missing == {"Not in the notebook."}
    assert "".join(NOTEBOOK["cells"][0]["source"]).startswith("# Padding"), "the source notebook was changed"


def test_a_theorem_title_translated_in_a_notebook():
    """sphinx-proof's message for a theorem's title is "(title)": in the notebook it stands after the directive."""
    text = "```{prf:theorem} Masking before softmax\n:label: thm-mask\nThe weights add up to one.\n```\n"
    catalog = {"(Masking before softmax)": "（在 softmax 之前掩蔽）", "The weights add up to one.": "权重之和为一。"}
    translated, placed = translate_notebooks.translate_text(text, catalog)
    assert translated == "```{prf:theorem} 在 softmax 之前掩蔽\n:label: thm-mask\n权重之和为一。\n```\n", translated
    assert placed == set(catalog)


@pytest.mark.parametrize("chapter", sorted(p.stem for p in (ROOT / "notebooks").glob("*.ipynb")))
def test_every_message_reaches_the_chinese_notebook(chapter):
    """The downloaded and Colab notebooks are translated with the page's catalog: every message of it (a figure's
    own file apart: code) finds its place in the notebook, or a reader of the notebook sees that text in English."""
    notebook = json.loads((ROOT / "notebooks" / f"{chapter}.ipynb").read_text())
    _, missing = translate_notebooks.translate_notebook(notebook, translate_notebooks.catalog_for(f"notebooks/{chapter}"))
    left = sorted(m for m in missing if not zh_edition.code_only(m))
    assert not left, f"{chapter}: {len(left)} messages not placed in the notebook, e.g. {left[0][:70]!r}"


def test_the_colab_rendition_words_in_chinese():
    """colab_rendition.py's fixed English in the Chinese rendition: boxes' words, full-width parentheses."""
    import i18n

    text = ("### Exercise 3.1 (一个批量的填充掩码)\n**Theorem 3.1 (在 softmax 之前掩蔽).** 设\n"
            "### Solution to Exercise 3.1 (click to show)\n### Exercise 3.1 (continued)\n**Proof.** 由")
    for pattern, new in i18n.RENDITION_WORDS["zh_CN"]:
        text = pattern.sub(new, text)
    assert text == ("### 练习 3.1（一个批量的填充掩码）\n**定理 3.1（在 softmax 之前掩蔽）．** 设\n"
                    "### 练习 3.1 的解答（点击显示）\n### 练习 3.1（续）\n**证明．** 由"), text


def test_the_chinese_notebooks_keep_every_code_cell():
    """The download button's notebooks (``zh/_sources``): the English code cells, all of them, unchanged."""
    for page in PAGES:
        source = ROOT / f"{page}.ipynb"
        if not source.exists():
            continue
        served = ZH / "_sources" / f"{page}.ipynb"
        if not served.exists():
            pytest.fail(f"no {served}: build the Chinese edition")
        code = lambda nb: [c["source"] for c in json.loads(nb.read_text())["cells"] if c["cell_type"] == "code"]  # noqa
        assert code(served) == code(source), f"{served}: its code cells are not the English notebook's"


def test_a_page_the_english_build_read_again_is_read_again(tmp_path, monkeypatch):
    """A notebook executed again with the same source (the execution cache cleared after a change to the package)
    gives the English pages new outputs (widgets' random model ids among them); the Chinese build, whose sources
    did not change, reads again the pages whose English doctree is newer than its own (book/_ext/i18n.py)."""
    import os
    import types

    import i18n

    english, ours = tmp_path / "en", tmp_path / "zh"
    for folder in (english / "notebooks", english / "book", ours / "notebooks", ours / "book"):
        folder.mkdir(parents=True)
    for name, en_time, zh_time in (("notebooks/03_masks", 200, 100), ("notebooks/05_heads", 100, 200),
                                   ("book/intro", 100, None)):
        os.utime(_touch(english / f"{name}.doctree"), (en_time, en_time))
        if zh_time is not None:
            os.utime(_touch(ours / f"{name}.doctree"), (zh_time, zh_time))
    monkeypatch.setattr(i18n, "ENGLISH_DOCTREES", english)
    env = types.SimpleNamespace(all_docs={"notebooks/03_masks": 0, "notebooks/05_heads": 0, "book/intro": 0,
                                          "notebooks/changed": 0})
    app = types.SimpleNamespace(config=types.SimpleNamespace(language="zh_CN"),
                                builder=types.SimpleNamespace(name="html"), doctreedir=str(ours))
    assert i18n.read_again_after_english(app, env, set(), {"notebooks/changed"}, set()) == [
        "book/intro", "notebooks/03_masks"]
    app.config.language = "en"
    assert i18n.read_again_after_english(app, env, set(), set(), set()) == []


def _touch(path: Path) -> Path:
    path.write_bytes(b"")
    return path


# ------------------------------------------------------------------------------------------------ drift
# The scratch book's search index in English whatever the language built: the Chinese one loads jieba's dictionary
# (a second of each Chinese build, two here), and what this book tests is its catalogs and pages, not its search.
SCRATCH_CONF = """
extensions = ["myst_parser"]
language = "en"
locale_dirs = ["locale"]
gettext_compact = False
html_search_language = "en"
"""


def sphinx_build(book: Path, builder: str, out: str, language: str | None = None) -> None:
    command = [sys.executable, "-m", "sphinx", "-q", "-W", "-b", builder, str(book), str(book / out),
               "-d", str(book / f".doctrees-{out}")]
    if language:
        command += ["-D", f"language={language}"]
    subprocess.run(command, check=True, capture_output=True)


def catalog_state(book: Path) -> dict:
    subprocess.run([sys.executable, "-m", "sphinx_intl", "update", "-p", str(book / "pot"), "-l", "zh_CN",
                    "-d", str(book / "locale")], check=True, capture_output=True)
    return {r["file"]: r for r in zh_edition.counts(book / "locale")}["zh_CN/LC_MESSAGES/index.po"]


def test_a_changed_english_sentence_is_untranslated_until_updated(tmp_path):
    pytest.importorskip("sphinx_intl")
    polib = pytest.importorskip("polib")
    book = tmp_path / "book"
    book.mkdir()
    (book / "conf.py").write_text(SCRATCH_CONF)
    page = book / "index.md"
    page.write_text("# Masks\n\nA mask hides the keys a query must not see.\n")
    sphinx_build(book, "gettext", "pot")
    assert catalog_state(book)["untranslated"] == 2
    po_path = book / "locale" / "zh_CN" / "LC_MESSAGES" / "index.po"
    po = polib.pofile(str(po_path))
    for entry in po:
        entry.msgstr = {"Masks": "掩码", "A mask hides the keys a query must not see.": "掩码遮住查询不该看到的键。"}[entry.msgid]
    po.save()
    assert catalog_state(book)["untranslated"] == 0
    sphinx_build(book, "html", "html", "zh_CN")
    assert "掩码遮住查询不该看到的键。" in (book / "html" / "index.html").read_text()

    page.write_text("# Masks\n\nA padding mask hides the keys that are only padding.\n")  # the English changes
    sphinx_build(book, "gettext", "pot")
    state = catalog_state(book)
    assert state["untranslated"] + state["fuzzy"] == 1 and state["translated"] == 1, state
    sphinx_build(book, "html", "html", "zh_CN")
    shown = (book / "html" / "index.html").read_text()
    assert "A padding mask hides the keys that are only padding." in shown and "掩码遮住" not in shown
    assert "掩码" in shown  # the heading, unchanged, keeps its translation


def test_a_document_from_defaults_parsed_once_is_the_one_myst_makes():
    """book/_ext/i18n.py's defaults_computed_once: myst-parser's make_document, with the default settings parsed once
    per parser class, gives a document whose settings are the defaults, a fresh copy each time."""
    import subprocess

    script = ("import sys; sys.path.insert(0, sys.argv[1]); import i18n\n"
              "from myst_parser.mdit_to_docutils import base\n"
              "before = base.make_document('x')\n"
              "i18n.defaults_computed_once(); i18n.defaults_computed_once()\n"
              "one, two = base.make_document('x'), base.make_document('y')\n"
              "same = lambda d: {k: v for k, v in vars(d.settings).items() if k != 'record_dependencies'}\n"
              "assert base.make_document.defaults_once and same(one) == same(two) == same(before)\n"
              "assert one.settings is not two.settings and two['source'] == 'y'\n"
              "one.settings.tab_width = 99\n"
              "assert base.make_document('z').settings.tab_width == before.settings.tab_width\n"
              "print('ok')\n")
    run = subprocess.run([sys.executable, "-c", script, str(ROOT / "book" / "_ext")], capture_output=True, text=True,
                         timeout=120)
    assert run.stdout.strip() == "ok", run.stderr[-2000:]


def test_a_catalog_is_compiled_whole_or_not_at_all(tmp_path, monkeypatch):
    """While a build compiles a catalog, another build reading its .mo finds the whole previous file (i18n.py,
    catalogs_written_whole): a .mo read half-written is no translation at all, which once made every page of a
    Chinese edition English (the two Chinese builds of `make test`, on a fresh clone)."""
    import gettext

    import i18n
    from babel.messages import mofile
    from sphinx.util import i18n as sphinx_i18n

    i18n.catalogs_written_whole()
    folder = tmp_path / "zh_CN" / "LC_MESSAGES"
    folder.mkdir(parents=True)
    po = folder / "page.po"

    def catalog(word):
        po.write_text(f'msgid ""\nmsgstr ""\n"Content-Type: text/plain; charset=UTF-8\\n"\n\nmsgid "mask"\n'
                      f'msgstr "{word}"\n')

    def read():
        return gettext.GNUTranslations(open(folder / "page.mo", "rb")).gettext("mask")

    info = sphinx_i18n.CatalogInfo(str(folder), "page", "utf-8")
    catalog("掩码")
    info.write_mo("zh_CN")
    assert read() == "掩码"
    seen, write = [], mofile.write_mo

    def watched(file, po, use_fuzzy=False):
        seen.append(read())  # what another build would read now
        write(file, po, use_fuzzy)
        file.flush()
        seen.append(read())

    monkeypatch.setattr(mofile, "write_mo", watched)
    monkeypatch.setattr(sphinx_i18n, "write_mo", watched, raising=False)
    catalog("遮罩")
    info.write_mo("zh_CN")
    assert seen == ["掩码", "掩码"] and read() == "遮罩"
    assert sorted(p.name for p in folder.iterdir()) == ["page.mo", "page.po"]  # no partial file left beside
