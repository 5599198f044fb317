"""Sphinx extension (loaded by _config.yml's ``local_extensions``): the site's search answers with sections.

Sphinx's search ranks pages: a word found anywhere in a chapter gives the chapter, and a section only where the query
is most of a heading. A reader who searches "causal mask" (因果掩码) means the section on it, not chapter 10, where
the words occur too. Here the search index (``searchindex.js``) gets the terms of each section as well, and the
search page ranks sections (``search_sections.js``, the Scorer hook Sphinx loads on the search page alone):

1. At the end of each HTML build, every page of the index is read back as written (the translated text in the
   Chinese edition; no solution in the student edition), and each ``<section>`` of its article gives its own text
   (subsections apart, code outputs left out) and its heading, cut into terms by the build's own search language
   (the same split, stemming and filter as Sphinx's index: jieba's words in Chinese, book/_ext/i18n.py).
   ``searchindex.js`` is written again with them under ``"sections"``; Sphinx reads back the keys it knows only.
2. In the browser, a page must hold every term of the query (as before); its sections are then ranked by the terms
   in their heading (the more of the heading the query covers, the higher), in their text (BM25: rarer terms weigh
   more, a count saturates and weighs less in a longer section; a section's subsections count at half weight) and
   in the page's title, and by the terms it sets in bold (where the book introduces a term); a chapter's exercises
   and summary rank after the sections that teach. Each result is a
   section, linked to its anchor (a page's opening text: the page itself), three at most per page.

tests/test_search.py holds the queries that measure it, on both editions.
"""
from __future__ import annotations

import json
import re
from pathlib import Path

HERE = Path(__file__).resolve().parent
SCORER = HERE / "search_sections.js"
PREFIX, SUFFIX = "Search.setIndex(", ")"  # sphinx.search.js_index's
NUMBER = re.compile(r"^\s*(?:\d+\.)+\s*")  # "3.5.2. " before a heading (Sphinx's section numbers)
LEFT_OUT = ("script", "style")
LEFT_OUT_CLASSES = {"headerlink", "cell_output"}  # the ¶ links; what code printed


def sections_of(page: str) -> list[tuple[str, str, str, int | None]]:
    """(anchor, heading, own text, the index of the section it is in or None, its own bold words) of each section of
    a page's article, in page order; the first is the page's top (anchor "")."""
    import lxml.html

    root = lxml.html.fromstring(page) if page.strip() else None
    article = None if root is None else next(iter(root.iter("article")), None)
    if article is None:
        return []
    found, index = [], {}  # index: a section (its element, kept alive: lxml gives the same one back) -> its number
    for section in article.iter("section"):
        if not headed(section):
            continue
        heading = next(child for child in section if isinstance(child.tag, str))
        title = NUMBER.sub("", " ".join(_text(heading).split()).replace("#", "").strip())
        up = next((index[a] for a in section.iterancestors("section") if a in index), None)
        index[section] = len(found)
        found.append((section.get("id"), title, _text(section, top=True), up, _bold(section)))
    if found and found[0][0] and next(iter(article.iter("h1")), None) is not None:
        found[0] = ("",) + found[0][1:]  # the page's top: the page itself
    return found


def _bold(section) -> str:
    """The words a section sets in bold, its own (not its subsections'), outside code outputs: where the book
    introduces a term (**grouped-query attention**), the section that teaches it."""
    words = []
    for strong in section.iter("strong"):
        around = [a for a in strong.iterancestors() if a is not section]
        if next((a for a in strong.iterancestors("section") if headed(a)), None) is section and not any(
                LEFT_OUT_CLASSES & set((a.get("class") or "").split()) for a in around):
            words.append(strong.text_content())
    return " ".join(words)


HEADING = re.compile(r"^h[1-6]$")
# A chapter's exercises and summary name every idea of the chapter again: a reader searching one means the section
# that teaches it, so these rank after it (their anchors, the same in every edition: the English headings')
SECONDARY = {"exercises", "summary"}


def headed(element) -> bool:
    """A section of the page: one with an id and a heading. sphinx-proof's and sphinx-exercise's bodies are
    <section>s too, without a heading (and all with the same id, proof-content): part of the section around them."""
    if element.tag != "section" or not element.get("id"):
        return False
    first = next((child for child in element if isinstance(child.tag, str)), None)
    return first is not None and bool(HEADING.match(first.tag))


def _text(element, top: bool = False) -> str:
    """The text of ``element``, less what LEFT_OUT and LEFT_OUT_CLASSES name and (but for ``top``) the sections it
    holds, which are sections of their own."""
    parts = [element.text or ""]
    for child in element:
        if isinstance(child.tag, str) and not (
                child.tag in LEFT_OUT or LEFT_OUT_CLASSES & set((child.get("class") or "").split()) or headed(child)):
            parts.append(_text(child))
        parts.append(child.tail or "")
    return " ".join(parts)


def terms_of(lang, text: str, seen: dict | None = None) -> list[str]:
    """The index terms of ``text``, as sphinx.search.IndexBuilder.feed makes them (``seen``: word -> its term or
    None, kept between calls: each word is stemmed once)."""
    seen = {} if seen is None else seen
    found = []
    for word in lang.split(text):
        if word not in seen:
            stemmed = lang.stem(word).lower()
            if not lang.word_filter(stemmed) and lang.word_filter(word):
                stemmed = word
            seen[word] = stemmed if lang.word_filter(stemmed) else None
        if seen[word] is not None:
            found.append(seen[word])
    return found


def section_index(index: dict, pages: dict[str, str], lang) -> dict:
    """The "sections" of the index: ``sections`` [[file, anchor, title, the section it is in or -1], ...], ``terms``
    {term: [section, count, ...]}, ``titleterms`` and ``bold`` {term: [section, ...]}, ``lengths`` (each section's
    number of terms) and ``secondary`` (the sections that rank after the others: SECONDARY), from the pages' HTML
    (docname -> text)."""
    titles = {(file, anchor or ""): title for title, places in index["alltitles"].items() for file, anchor in places}
    sections, terms, titleterms, bold, lengths, seen = [], {}, {}, {}, [], {}
    for file, docname in enumerate(index["docnames"]):
        first = len(sections)
        for anchor, heading, text, parent, strong in sections_of(pages.get(docname, "")):
            number = len(sections)
            title = titles.get((file, anchor), heading)
            sections.append([file, anchor, title, -1 if parent is None else first + parent])
            counts, words = {}, terms_of(lang, text, seen)
            for term in words:
                counts[term] = counts.get(term, 0) + 1
            lengths.append(len(words))
            for term, count in sorted(counts.items()):
                terms.setdefault(term, []).extend([number, count])
            for term in sorted(set(terms_of(lang, title, seen))):
                titleterms.setdefault(term, []).append(number)
            for term in sorted(set(terms_of(lang, strong, seen))):
                bold.setdefault(term, []).append(number)
    secondary = [number for number, (_, anchor, _, _) in enumerate(sections) if anchor in SECONDARY]
    return {"sections": sections, "terms": terms, "titleterms": titleterms, "bold": bold, "lengths": lengths,
            "secondary": secondary}


# TeX in a heading or a page's text ("为什么要除以 \\sqrt{d}", "\\(\\sqrt{d}\\)") is shown as the reader reads it on the page
# (√d): the titles of the index here, the summaries in search_sections.js (its untex, the same rules)
TEX_WORDS = {"infty": "∞", "top": "⊤", "times": "×", "cdot": "·", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥",
             "neq": "≠", "to": "→", "in": "∈", "ldots": "…", "dots": "…", "approx": "≈", "lfloor": "⌊",
             "rfloor": "⌋", "bmod": "mod", "mid": "|", "sum": "Σ"}
TEX_ROMAN = re.compile(r"\\(?:text|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}")
TEX_SQRT = re.compile(r"\\sqrt\s*(?:\{([^{}]*)\}|(\w))")
TEX_WORD = re.compile(r"\\([A-Za-z]+)")


def untex(text: str) -> str:
    if "\\" not in text:
        return text
    text = re.sub(r"\\[()\[\]]", "", text)
    text = TEX_ROMAN.sub(r"\1", text)
    text = TEX_SQRT.sub(lambda m: "√" + (m.group(1) or m.group(2)), text)
    text = TEX_WORD.sub(lambda m: TEX_WORDS.get(m.group(1), m.group(1)), text)
    return re.sub(r"\\[,;!: ]", " ", text).replace("{", "").replace("}", "")


def add_sections(app, exception) -> None:
    if exception or getattr(app.builder, "name", None) != "html" or getattr(app.builder, "indexer", None) is None:
        return
    path = Path(app.outdir) / app.builder.searchindex_filename
    if not path.exists():
        return
    text = path.read_text(encoding="utf-8")
    index = json.loads(text[len(PREFIX):-len(SUFFIX)])
    suffix = app.builder.out_suffix
    pages = {doc: (Path(app.outdir) / f"{doc}{suffix}").read_text(encoding="utf-8")
             for doc in index["docnames"] if (Path(app.outdir) / f"{doc}{suffix}").exists()}
    index["sections"] = section_index(index, pages, app.builder.indexer.lang)
    index["titles"] = [untex(title) for title in index["titles"]]
    titles = {}
    for title, places in index["alltitles"].items():
        titles.setdefault(untex(title), []).extend(places)
    index["alltitles"] = titles
    for section in index["sections"]["sections"]:
        section[2] = untex(section[2])
    path.write_text(PREFIX + json.dumps(index, separators=(",", ":"), sort_keys=True, ensure_ascii=False) + SUFFIX,
                    encoding="utf-8")


def scorer(app, config) -> None:
    config.html_search_scorer = str(SCORER)  # read into language_data.js, which only the search page loads


# Sphinx's answer when nothing matches points to "categories" this site does not have; the edition's own words, from
# its sphinx.po (book/locale/<language>/LC_MESSAGES), replace it on the search page (Sphinx reads the words its
# search page speaks from its own translations.js alone)
NO_RESULTS = ("Your search did not match any documents. Please make sure that all words are spelled correctly and "
              "that you've selected enough categories.")


def own_words(app, msgid: str) -> str | None:
    from babel.messages.pofile import read_po

    for folder in app.config.locale_dirs:
        path = Path(app.confdir, folder, str(app.config.language), "LC_MESSAGES", "sphinx.po")
        if path.exists():
            with path.open("rb") as file:
                message = read_po(file).get(msgid)
            if message is not None and message.string:
                return message.string
    return None


def search_page_style(app, pagename, templatename, context, doctree) -> None:
    if pagename == "search":
        app.add_css_file("search.css")  # static/search.css: called here, for this page alone
        words = own_words(app, NO_RESULTS) if app.config.language not in (None, "en") else None
        if words:
            app.add_js_file(None, body=f"Documentation.TRANSLATIONS[{json.dumps(NO_RESULTS)}] = {json.dumps(words)};")


def setup(app):
    app.connect("config-inited", scorer)
    app.connect("html-page-context", search_page_style)
    app.connect("build-finished", add_sections)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
