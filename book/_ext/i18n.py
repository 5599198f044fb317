"""Sphinx extension (``local_extensions`` in _config.yml): the Chinese edition, 中文版, from the same notebooks.

The English notebooks are the one source. Their Markdown is translated through Sphinx's gettext catalogs,
``book/locale/zh_CN/LC_MESSAGES/<document>.po`` (one per page; ``make translations`` makes and updates them, and
book/locale/TRANSLATING.md says how to fill them); code cells are never extracted, and their outputs come from the
shared execution cache, so code and outputs are the English build's (tests/test_zh.py compares them).
``book/_ext/zh_edition.py`` builds the edition with ``language = zh_CN`` into ``_build/zh/html`` and copies it to
``_build/html/zh/``. This extension, loaded by both builds, does what gettext alone does not:

1. Catalogs: ``locale_dirs`` is book/locale, one catalog per document (``gettext_compact = False``), and the alt
   texts of the figures (cell metadata, ``mystnb.image.alt``) are messages too (``gettext_additional_targets``).
2. Exercise titles (``{exercise} title``) become messages: sphinx-exercise builds them without a source, which
   gettext skips; here the title node gets the directive's raw argument, roles and math kept. The box's title
   around it ("Exercise" or "Solution to", sphinx-exercise's words, from its own catalog) is no message, and the
   copy of each exercise that sphinx-exercise keeps to write solutions' titles and links is the translated one.
3. sphinx-proof writes "Proof. " into the text of a proof's first paragraph; it is taken out before translation (so
   the message is the sentence alone) and put back afterwards in the page's language ("证明．").
4. Every page gets a link to the same page in the other edition (``templates/language-switch.html``, before the
   article's buttons), ``<link rel="alternate" hreflang>`` in its head; Sphinx writes ``<html lang="zh-CN">``.
5. In the Chinese edition: the theme strings set in configuration (the search box's text, the toggle hints, the
   author), the theme's words its catalogs leave in English (``theme_words``: the sidebars' toggles, the colour-mode
   and launch buttons), the sidebar's captions (``toctree_captions``), the theme's own "列印成 PDF" (its zh_CN
   catalog's Taiwan wording) made "打印为 PDF", the Colab button pointed at the
   Chinese rendition (``zh/_colab/...``), the download button and the renditions made from notebooks translated with
   the catalogs (book/_ext/translate_notebooks.py).
6. Chinese search: Sphinx indexes Chinese with jieba (a dev requirement); a query typed without spaces is cut
   here, in the browser, into the longest words the index holds (``splitQuery`` below), so "填充掩码的形状" finds
   what "填充 掩码 形状" finds. jieba cuts the Chinese text alone: Latin words (``perf_counter``) are indexed whole,
   as in the English index. jieba is taught the book's terms (``course_words``: the glossary's, and the words of
   the chapters' headings), so that 因果掩码 or 环形注意力 is a word of the index, not only 因果 and 掩码; and the
   glossary's one-character terms (键, 值, 头) are kept, where Sphinx drops every word of one character. The search
   page ranks sections (book/_ext/search_sections.py).
7. A page the English build read again (a notebook executed again) is read again by the translated build, so that
   both show the same run's outputs.
8. The figures: drawn again in the page's language from the English run's record (book/_ext/zh_figures.py, its
   catalog ``figures.po``), nothing executed again.
"""
from __future__ import annotations

import functools
import json
import re
import sys
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))
LOCALE_DIR = "book/locale"
SECOND = {"zh_CN": ("zh/", "../")}  # language -> (its site's folder under the English site's root, the way back)
NAMES = {"en": "English", "zh_CN": "中文"}  # each language names itself, in its own script
HREFLANG = {"en": "en", "zh_CN": "zh-CN"}
ENGLISH_DOCTREES = ROOT / "_build" / ".doctrees"  # the English build's (jupyter-book build .)
# Strings the configuration or an extension sets, which no catalog translates.
WORDS = {
    "zh_CN": {
        "Proof.": "证明．",
        "search_bar_text": "搜索本书……",
        "togglebutton_hint": "点击显示",
        "togglebutton_hint_hide": "点击隐藏",
        "列印成 PDF": "打印为 PDF",
        "switch_title": "本页的中文版",
        "Launch on Colab": "在 Colab 中打开",  # the launch button's tooltip (sphinx-book-theme: "Launch on" + " Colab")
        "the attention-course authors": "attention-course 项目组",  # _config.yml's author, in the footer
        " (student edition)": "（学生版）",
        "outputs_note": ("关于本中文版：正文、练习、定理、图的说明和图中的文字都已译成中文"
                         "（图中作为模型输入的英文词元和句子保持原样）；代码与英文版完全相同，"
                         "代码运行时打印的内容（检查器的消息、打印出的表格）目前仍是英文。"
                         "搜索中文时，可以直接输入词语，如“掩码”或“填充掩码”；词语之间用空格隔开也可以。"),
    },
    "en": {"Proof.": "Proof.", "switch_title": "This page in English", " (student edition)": " (student edition)"},
}


def language(app_or_config) -> str:
    config = getattr(app_or_config, "config", app_or_config)
    return config.language or "en"


def words(config) -> dict:
    return {**WORDS["en"], **WORDS.get(language(config), {})}


# ---------------------------------------------------------------------------------------------- configuration
def book_title(title: str, lang: str, w: dict) -> str:
    """The book's title (each page's <title>, the header's) in ``lang``: as the root page's catalog translates it
    (its first heading is the title), with the student edition's mark (instructor/student.py) in words of ``lang``."""
    import polib

    student = title.endswith(WORDS["en"][" (student edition)"])
    english = title.removesuffix(WORDS["en"][" (student edition)"])
    catalog = ROOT / LOCALE_DIR / lang / "LC_MESSAGES" / "book" / "intro.po"
    found = polib.pofile(str(catalog)).find(english) if catalog.exists() else None
    translated = found.msgstr if found is not None and found.msgstr and not found.fuzzy else english
    return translated + (w[" (student edition)"] if student else "")


def configure(app, config) -> None:
    config.locale_dirs = [str(ROOT / LOCALE_DIR)]
    config.gettext_compact = False
    config.gettext_uuid = False
    config.gettext_location = True
    config.gettext_additional_targets = sorted({*config.gettext_additional_targets, "image"})
    options = config.html_theme_options
    ends = list(options.get("article_header_end") or ["article-header-buttons.html"])
    if "language-switch.html" not in ends:
        options["article_header_end"] = ["language-switch.html", *ends]
    if language(config) != "en":
        w = words(config)
        config.html_title = book_title(config.html_title, language(config), w)
        options["search_bar_text"] = w["search_bar_text"]
        config.togglebutton_hint = w["togglebutton_hint"]
        config.togglebutton_hint_hide = w["togglebutton_hint_hide"]
        config.author = w.get(config.author, config.author)
        theme_words(language(config))
    exercise_titles_translatable(app)


# The theme's words: book/locale/<language>/LC_MESSAGES/sphinx.po holds those of the templates in templates/ (their
# `_()`), booktheme.po those of sphinx-book-theme that its own catalog leaves in English. Sphinx reads its "sphinx"
# catalog before any extension sets locale_dirs, and the theme reads its catalog from its own folder, so neither sees
# ours: each is given ours to fall back on (a word Sphinx's or the theme's catalog translates keeps their translation).
THEME_DOMAINS = ("sphinx", "booktheme")


def theme_words(lang: str) -> None:
    from sphinx import locale
    from sphinx.util.i18n import CatalogRepository

    for catalog in CatalogRepository(str(ROOT), [LOCALE_DIR], lang, "utf-8").catalogs:
        if catalog.domain in THEME_DOMAINS:
            if catalog.is_outdated():
                catalog.write_mo(lang)
            locale.init([str(ROOT / LOCALE_DIR)], lang, catalog.domain)


def toctree_captions(app, doctree) -> None:
    """The sidebar's captions ("Chapters"), messages of the root page's catalog: sphinx-external-toc puts the root
    page's toctrees in after Sphinx's Locale transform has translated the page, so they kept their English."""
    if language(app) == "en":
        return
    from sphinx import addnodes
    from sphinx.locale import init as init_locale
    from sphinx.util.i18n import docname_to_domain

    toctrees = [node for node in doctree.findall(addnodes.toctree) if node.get("caption")]
    if not toctrees:
        return
    domain = docname_to_domain(app.env.docname, app.config.gettext_compact)
    catalog, _ = init_locale([str(ROOT / LOCALE_DIR)], language(app), domain)
    for node in toctrees:
        node["caption"] = catalog.gettext(node["caption"])


def exercise_titles_translatable(app) -> None:
    """``{exercise}`` / ``{exercise-start}`` with a title: the subtitle node gets the raw title and a source, so the
    title is one message ("Scores of a batch, by hand"). The box's title node, which holds sphinx-exercise's word
    ("Exercise", "Solution to") and the subtitle, is no message: Sphinx would make it one of its text, which in the
    Chinese build reads "练习Scores of ..." (the word comes from sphinx-exercise's own catalog), and no catalog
    holds that."""
    from sphinx_exercise.directive import (ExerciseDirective, ExerciseStartDirective, SolutionDirective,
                                           SolutionStartDirective)
    from sphinx_exercise.nodes import exercise_subtitle, exercise_title, solution_title

    def with_source(base):
        class Translatable(base):
            def run(self):
                made = super().run()
                source, line = self.get_source_info()
                for node in made:
                    for title in node.findall(lambda n: isinstance(n, (exercise_title, solution_title))):
                        title["translatable"] = False
                    if self.arguments:
                        for sub in node.findall(exercise_subtitle):
                            sub.rawsource, sub.source, sub.line = self.arguments[0], source, line
                return made

        Translatable.__name__ = f"Translatable{base.__name__}"
        return Translatable

    for name, base in (("exercise", ExerciseDirective), ("exercise-start", ExerciseStartDirective),
                       ("solution", SolutionDirective), ("solution-start", SolutionStartDirective)):
        app.add_directive(name, with_source(base), override=True)


class ExercisesAsTranslated(SphinxTransform):
    """After translation: sphinx-exercise's registry holds a copy of each exercise as its directive made it, in
    English, and a solution's title ("解答 练习 1.1 (...)") and every link to an exercise are written from that copy.
    In a translated build the copy is replaced by one of the translated exercise."""

    default_priority = 27  # after Locale (20) and its follow-ups (25)

    def apply(self):
        from sphinx_exercise.nodes import exercise_enumerable_node, exercise_node

        registry = getattr(self.env, "sphinx_exercise_registry", {})
        if language(self.config) == "en" or self.app.builder.name == "gettext":
            return
        for node in self.document.findall(lambda n: isinstance(n, (exercise_node, exercise_enumerable_node))):
            entry = registry.get(node.get("label"))
            if entry is not None and entry.get("docname") == self.env.docname:
                entry["node"] = node.deepcopy()


# ---------------------------------------------------------------------------------------------- extraction
def messages_as_read(app, doctree) -> None:
    """The gettext builder extracts messages from the doctree as written, after the post-transforms, where myst-nb
    has already chosen text over an output's image (gone with its alt text) and sphinx-exercise has rebuilt the
    titles; Locale translates the doctree as read. So the messages are noted as read, and write_doc adds those
    missing (extraction_of_read_messages)."""
    if app.builder.name != "gettext":
        return
    from sphinx.util.nodes import extract_messages

    found = []
    for node, msg in extract_messages(doctree):
        source, line, up = node.source, node.line, node
        while (source is None or line is None) and up.parent is not None:
            up = up.parent
            source, line = source or up.source, line if line is not None else up.line
        found.append((msg, source or str(app.env.doc2path(app.env.docname)), line or 0))
    app.env.ac_messages_read = getattr(app.env, "ac_messages_read", {})
    app.env.ac_messages_read[app.env.docname] = found


def extraction_of_read_messages(app) -> None:
    if app.builder.name != "gettext":
        return
    from sphinx.builders.gettext import MsgOrigin
    from sphinx.util.i18n import docname_to_domain

    write_doc = app.builder.write_doc

    def write_doc_and_read_messages(docname, doctree):
        write_doc(docname, doctree)
        catalog = app.builder.catalogs[docname_to_domain(docname, app.config.gettext_compact)]
        for msg, source, line in getattr(app.env, "ac_messages_read", {}).get(docname, []):
            if msg not in catalog.metadata:
                catalog.add(msg, MsgOrigin(source, line))
        first = {m: min(line for _, line, _ in catalog.metadata[m]) for m in catalog.messages}
        catalog.messages.sort(key=first.__getitem__)  # in the page's order

    app.builder.write_doc = write_doc_and_read_messages


def forget_messages(app, env, docname) -> None:
    getattr(env, "ac_messages_read", {}).pop(docname, None)
    getattr(env, "ac_untranslated", {}).pop(docname, None)


def read_again_after_english(app, env, added, changed, removed) -> list[str]:
    """In a translated build: the documents the English build has read since this edition last read them. Sphinx
    reads a document again when its source changed; a notebook executed again with the same source (the execution
    cache cleared after a change to the package, a failed run) would otherwise keep its old outputs here, among
    them its widgets' random model ids, while the English pages show the new run's."""
    if language(app) == "en" or app.builder.name == "gettext":
        return []
    english = ENGLISH_DOCTREES
    again = []
    for doc in sorted(env.all_docs):
        if doc in changed or doc in added or doc in removed:
            continue
        ours, theirs = Path(app.doctreedir) / f"{doc}.doctree", english / f"{doc}.doctree"
        if theirs.exists() and (not ours.exists() or theirs.stat().st_mtime > ours.stat().st_mtime):
            again.append(doc)
    return again


class MessagesShownInEnglish(SphinxTransform):
    """In a translated build, just before Locale: the page's messages that its catalog does not translate (missing,
    empty or fuzzy), code-only ones apart. An English sentence changed since its translation is one of them until
    the catalog is updated. Written to ``untranslated.json`` beside the site (tests/test_zh.py reads it)."""

    default_priority = 19  # Locale is 20

    def apply(self):
        if language(self.config) == "en" or self.app.builder.name == "gettext":
            return
        from sphinx.util.nodes import extract_messages
        from translate_notebooks import catalog_for
        from zh_edition import code_only

        catalog = catalog_for(self.env.docname, language(self.config), ROOT / LOCALE_DIR)
        left = [msg for _, msg in extract_messages(self.document) if msg not in catalog and not code_only(msg)]
        self.env.ac_untranslated = getattr(self.env, "ac_untranslated", {})
        self.env.ac_untranslated[self.env.docname] = list(dict.fromkeys(left))


class FormulasTranslated(SphinxTransform):
    """In a translated build, before Locale: a display formula whose catalog translates it (the words of its
    ``\\text{...}``) takes the translation as its LaTeX. Locale hands a formula's translation to the parser as
    reStructuredText's literal block ("::" and the text indented), which the Markdown parser reads as a paragraph
    "::" followed by another: the formula became "::"."""

    # after MessagesShownInEnglish, which reads the messages (the same priority, added after it: docutils keeps their
    # order), before Locale (20)
    default_priority = 19

    def apply(self):
        if language(self.config) == "en" or self.app.builder.name == "gettext":
            return
        from sphinx.util.nodes import extract_messages
        from translate_notebooks import catalog_for

        catalog = catalog_for(self.env.docname, language(self.config), ROOT / LOCALE_DIR)
        for node, msg in list(extract_messages(self.document)):
            if isinstance(node, nodes.math_block) and catalog.get(msg, msg) != msg:
                node.children = [nodes.Text(catalog[msg])]
                node.rawsource = catalog[msg]
                node["translated"] = True  # Locale leaves it


def report_untranslated(app, exception) -> None:
    if exception or language(app) == "en" or app.builder.name == "gettext":
        return
    left = {doc: msgs for doc, msgs in sorted(getattr(app.env, "ac_untranslated", {}).items())
            if msgs and doc in app.env.found_docs}
    (Path(app.outdir).parent / "untranslated.json").write_text(json.dumps(left, indent=1, ensure_ascii=False) + "\n")
    if left:
        from sphinx.util import logging

        logging.getLogger(__name__).info(
            "%d messages shown in English, untranslated in %d catalogs (`make translations` lists them)",
            sum(map(len, left.values())), len(left))


# ---------------------------------------------------------------------------------------------- "Proof."
PROOF_MARK = "Proof. "


def _first_paragraph(admonition):
    return next(iter(admonition.findall(nodes.paragraph)), None)


class ProofLabelOut(SphinxTransform):
    """Before translation: "Proof. " out of the first paragraph of each proof (text and rawsource)."""

    default_priority = 15  # before Locale (20)

    def apply(self):
        for box in self.document.findall(nodes.admonition):
            if box["classes"][:2] != ["proof", "proof"]:  # sphinx-proof's {prf:proof} (a theorem's is [proof, theorem])
                continue
            para = _first_paragraph(box)
            if para is None or not para.children or not isinstance(para.children[0], nodes.Text):
                continue
            text = str(para.children[0])
            if text.startswith(PROOF_MARK):
                para.replace(para.children[0], nodes.Text(text[len(PROOF_MARK):]))
                para.rawsource = para.rawsource[len(PROOF_MARK):] if para.rawsource.startswith(PROOF_MARK) \
                    else para.rawsource
                para["ac_proof_label"] = True


class ProofLabelIn(SphinxTransform):
    """After translation: the label back at the paragraph's start, in the page's language."""

    default_priority = 26  # after Locale (20) and its follow-ups (25)

    def apply(self):
        label = words(self.config)["Proof."]
        for para in self.document.findall(nodes.paragraph):
            if para.get("ac_proof_label"):
                para.insert(0, nodes.Text(label + ("" if label.endswith("．") else " ")))
                del para["ac_proof_label"]


# ---------------------------------------------------------------------------------------------- the pages
def translations_adopted(app, doctree) -> None:
    """In a translated build: the nodes Locale makes of a translated message keep, as their document, the small
    document the message was parsed in, and its settings hold the build environment. Pickled with the page, that
    environment (everything read so far) went into every doctree: the last chapter's was 3.3 MB against 0.18 MB in
    English, and writing and reading them back took 3 of the 27 s of a Chinese build. The page's own document is
    theirs now."""
    if language(app) == "en":
        return
    for node in doctree.findall():  # text nodes too
        if node.__dict__.get("_document") not in (None, doctree):
            node.document = doctree


def edition_note(app, doctree) -> None:
    """The Chinese introduction says once, plainly, that what the code prints stays English (and how to search)."""
    note = words(app.config).get("outputs_note")
    if not note or app.env.docname != app.config.root_doc:
        return
    section = next(iter(doctree.findall(nodes.section)), None)
    if section is None:
        return
    title = next(iter(section.findall(nodes.title)), None)
    box = nodes.note("", nodes.paragraph(text=note), classes=["ac-edition-note"])
    section.insert(section.index(title) + 1 if title is not None else 0, box)


def other_edition(config) -> tuple[str, str]:
    """(the other edition's language, the relative path from this edition's root to the other's)."""
    lang = language(config)
    if lang == "en":
        return "zh_CN", SECOND["zh_CN"][0]
    return "en", SECOND[lang][1]


def page_context(app, pagename, templatename, context, doctree) -> None:
    other, prefix = other_edition(app.config)
    up = "../" * pagename.count("/")
    url = f"{up}{prefix}{pagename}.html"
    w = {**WORDS["en"], **WORDS.get(other, {})}
    context["ac_language_switch"] = {"url": url, "text": NAMES[other], "hreflang": HREFLANG[other],
                                     "title": w["switch_title"]}
    context["metatags"] = context.get("metatags", "") + (
        f'\n<link rel="alternate" hreflang="{HREFLANG[other]}" href="{url}" />')


def fix_buttons(app, pagename, templatename, context, doctree) -> None:
    """The Chinese edition's header buttons: "打印为 PDF", and Colab opening the Chinese rendition."""
    if language(app) == "en":
        return
    fixes = words(app.config)
    prefix_here = SECOND[language(app)][0]

    def walk(buttons):
        for button in buttons or []:
            if isinstance(button, dict):
                for key in ("tooltip", "text", "label"):
                    if isinstance(button.get(key), str) and button[key] in fixes:
                        button[key] = fixes[button[key]]
                url = str(button.get("url", ""))
                if "colab.research.google.com" in url and "/_colab/" in url and f"/{prefix_here}_colab/" not in url:
                    button["url"] = url.replace("/_colab/", f"/{prefix_here}_colab/")
                walk(button.get("buttons"))

    walk(context.get("header_buttons"))


# ---------------------------------------------------------------------------------------------- notebooks
RENDITION_WORDS = {  # colab_rendition.py's fixed English, in the rendition of the Chinese edition
    "zh_CN": [
        (re.compile(r"^(#+ )Solution to (.+?) \(click to show\)$", re.M), r"\1\2 的解答（点击显示）"),
        (re.compile(r"^(#+ )(.+?) \(continued\)$", re.M), r"\1\2（续）"),
        (re.compile(r"^#@title Solution \(click to show\)$", re.M), "#@title 解答（点击显示）"),
        (re.compile(r"\*\*Proof\.\*\*"), "**证明．**"),
        (re.compile(r"\bExercise (\d+\.\d+)"), r"练习 \1"),
        (re.compile(r"\bTheorem (\d+\.\d+)"), r"定理 \1"),
        (re.compile(r"^(#+ 练习 \d+\.\d+) \((.+)\)$", re.M), r"\1（\2）"),  # full-width, as the catalogs write
        (re.compile(r"\*\*定理 (\d+\.\d+) \((.+?)\)\.\*\*"), r"**定理 \1（\2）．**"),
    ],
}
COLAB_NOTE_ZH = ("> *Colab 版。* 这份笔记本把书中的练习、定理和带编号的公式写成了 Colab 能显示的普通 Markdown；"
                 "解答折叠在“……的解答”标题下（点击显示）。请先运行第一个代码单元：它会安装本课程的软件包。"
                 "代码和它打印的内容（检查器的消息、表格）保持英文。")


def translated_notebooks(app, exception) -> None:
    """The Chinese edition's notebooks: the download button's copy (``_sources/``) and the Colab renditions,
    translated with the catalogs of this build."""
    if exception or language(app) == "en" or getattr(app.builder, "format", None) != "html":
        return
    if getattr(app.config, "student_edition", False):
        return  # book/_ext/zh_edition.py serves the student notebooks, translated (the sources hold the solutions)
    sys.path.insert(0, str(HERE))
    import colab_rendition
    from translate_notebooks import catalog_for, translate_notebook

    lang = language(app)
    for docname in sorted(d for d in app.env.found_docs if str(app.env.doc2path(d)).endswith(".ipynb")):
        source = json.loads(Path(app.env.doc2path(docname)).read_text())
        translated, _missing = translate_notebook(source, catalog_for(docname, lang, ROOT / LOCALE_DIR))
        served = Path(app.outdir) / "_sources" / f"{docname}.ipynb"
        served.parent.mkdir(parents=True, exist_ok=True)
        served.write_text(json.dumps(translated, indent=1, ensure_ascii=False) + "\n")
        if not app.config.html_theme_options.get("launch_buttons", {}).get("colab_url", ""):
            continue  # the student edition: no renditions
        rendition = colab_rendition.render_notebook(translated, colab_rendition._context(app, docname))
        for cell in rendition["cells"]:
            text = "".join(cell["source"])
            if text == colab_rendition.COLAB_NOTE:
                text = COLAB_NOTE_ZH
            elif cell["cell_type"] == "markdown" or text.startswith("#@title"):
                for pattern, new in RENDITION_WORDS.get(lang, []):
                    text = pattern.sub(new, text)
            cell["source"] = text.splitlines(keepends=True)
        target = Path(app.outdir) / colab_rendition.RENDITION_DIR / f"{docname}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(rendition, indent=1, ensure_ascii=False) + "\n")


# ---------------------------------------------------------------------------------------------- search
# Sphinx's splitQuery for Chinese splits a query at spaces and punctuation only: "填充掩码" is one term, which the
# index (jieba's words: 填充, 掩码, 填充掩码 ...) may not hold. This one cuts each run of Han characters into the
# longest words the index holds, from the left; a single character the index lacks is dropped (Sphinx drops
# one-character words from the index, and a term no page holds would leave no result).
SPLIT_QUERY = r"""
var splitQuery = (query) => {
  const terms = (typeof Search !== "undefined" && Search._index) ? Search._index.terms : {};
  const known = (w) => Object.prototype.hasOwnProperty.call(terms, w);
  const out = [];
  // a term of Chinese and Latin words (掩蔽 softmax, 在线 softmax) is also one term of the index, written with or
  // without the space: the longest end of the Chinese run that makes one with the Latin word after it is searched for
  // as well as its words (search_sections.js ranks with it, and asks no page to hold it)
  for (const [, han, latin] of query.matchAll(/(\p{Script=Han}+)\s*([A-Za-z]+)/gu)) {
    for (let k = han.length; k >= 1; k--) {
      const term = han.slice(-k) + latin.toLowerCase();
      if (known(term)) { out.push(term); break; }
    }
  }
  for (const part of query.split(/[^\p{Letter}\p{Number}_\p{Emoji_Presentation}]+/gu)) {
    for (const run of part.split(/(\p{Script=Han}+)/u)) {
      if (!run) continue;
      if (!/\p{Script=Han}/u.test(run)) { out.push(run); continue; }
      let i = 0;
      while (i < run.length) {
        let j = Math.min(run.length, i + 8);
        while (j > i + 1 && !known(run.slice(i, j))) j--;
        const word = run.slice(i, j);
        if (word.length > 1 || known(word)) out.push(word);
        i = j;
      }
    }
  }
  return out;
};
"""


HAN_RUN = re.compile(r"[\u4e00-\u9fff]+")


def chinese_search_language():
    from sphinx.search.zh import JIEBA, SearchChinese

    class SearchChineseCourse(SearchChinese):
        """Sphinx's Chinese index, its Latin words made as the English index makes them. Sphinx hands jieba the
        whole text, and jieba cuts a Latin identifier at its underscores: ``time.perf_counter()`` and
        ``ax.label_outer()`` put "counter" and "outer" in the index, words that in the English index (which keeps
        ``perf_counter`` whole) occur only in the solutions, so the student edition's leak check
        (instructor/leaks.py) found them in the Chinese student edition. jieba cuts the runs of Chinese
        characters alone here; Latin words come whole, from Sphinx's own pattern, as before."""

        js_splitter_code = SPLIT_QUERY

        # Sphinx 7 keeps the Latin words seen in a list shared by every instance and searches it for each word it
        # stems: a minute of the Chinese build went there. A set per index gives the same stems.
        def init(self, options):
            super().init(options)
            self.latin_terms = set()
            if JIEBA:
                import jieba

                for word in sorted(course_words()):
                    jieba.add_word(word)  # a frequency of jieba's choosing: one that keeps the word whole
            self.single = {word for word in course_words() if len(word) == 1}

        def word_filter(self, stemmed_word: str) -> bool:
            return super().word_filter(stemmed_word) or stemmed_word in self.single

        def split(self, input: str) -> list[str]:
            chinese = [word for run in HAN_RUN.findall(input) for word in jieba_cut(run)] if JIEBA else []
            latin = [term.strip() for term in self.latin1_letters.findall(input)]
            self.latin_terms.update(latin)
            mixed = mixed_terms()
            whole = [re.sub(r"\s+", "", found).lower() for found in mixed.findall(input)] if mixed else []
            return chinese + latin + whole

    return SearchChineseCourse


GLOSSARY = ROOT / LOCALE_DIR / "glossary.md"
TERM_SEPARATORS = re.compile(r"[^\u4e00-\u9fff]+")  # the glossary writes alternatives with / 、（） and Latin


@functools.cache
def course_words(lang: str = "zh_CN") -> frozenset[str]:
    """The book's Chinese terms: each run of Chinese characters of the glossary's second column (键值缓存（KV
    cache）gives 键值缓存; 查询 / 键 / 值 and 查询、键和值 give 查询, 键, 值), and of the chapters' headings as translated, those of 2 to
    6 characters (分页缓存, 写时复制; a longer run is a phrase, which jieba cuts into its words)."""
    glossary = set()
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2 and not set(cells[1]) <= set("-: "):
            glossary.update(word for run in TERM_SEPARATORS.split(cells[1]) for word in JOINED.split(run) if word)
    from translate_notebooks import catalog_for

    headings = set()
    for notebook in sorted((ROOT / "notebooks").glob("*.ipynb")):
        catalog = catalog_for(f"notebooks/{notebook.stem}", lang, ROOT / LOCALE_DIR)
        for cell in json.loads(notebook.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] != "markdown":
                continue
            for heading in re.findall(r"^#{1,6}\s+(.+?)\s*$", "".join(cell["source"]), re.M):
                headings.update(HAN_RUN.findall(catalog.get(heading, "")))
    # a heading's run is a term when it has no particle or preposition in it (not 填充的代价, 为什么要除以), holds no
    # longer glossary term (not 自注意力模块, which would hide 自注意力 from the index), and is not a one-character
    # term run into a word
    single = {term for term in glossary if len(term) == 1}
    terms = {run for run in headings if 2 <= len(run) <= 6 and not PHRASE.search(run)
             and not any(len(term) >= 3 and term in run and term != run for term in glossary)
             and run[0] not in single and run[-1] not in single}  # not 值模式, of 查询-键-值模式
    return frozenset(glossary | terms)


@functools.cache
def mixed_terms(lang: str = "zh_CN") -> re.Pattern | None:
    """The glossary's terms of a Chinese and a Latin word (掩蔽 softmax, 在线 softmax, 汇聚点 logit): the index holds
    each whole as well (掩蔽softmax), so that a query of the term finds the page that writes it, not every page that
    writes its two words (the search page's splitQuery joins them in a query the same way)."""
    terms = set()
    for line in GLOSSARY.read_text(encoding="utf-8").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if line.startswith("|") and len(cells) >= 2:
            terms.update(re.findall(r"[\u4e00-\u9fff]+ [A-Za-z]+(?![\w（(])", cells[1]))
    patterns = [r"\s*".join(map(re.escape, term.split())) for term in sorted(terms)]
    return re.compile("|".join(patterns), re.I) if patterns else None


JOINED = re.compile("[和与或及]")  # 查询、键和值: the terms 查询, 键 and 值
PHRASE = re.compile("[的与和或及从把为被时在是不按要之以再先让给对向于而也都就能会吗呢]")


def jieba_cut(text: str) -> list[str]:
    """jieba's words for search, and the dictionary's words inside each word it guessed (its HMM joins characters
    it does not know: 键和值 is one such word, and 键 and 值 are in it)."""
    import jieba

    words = []
    for word in jieba.cut_for_search(text):
        words.append(word)
        if len(word) > 1 and not jieba.dt.FREQ.get(word):
            words.extend(piece for piece in jieba.cut(word, HMM=False) if piece != word)
    return words


def defaults_computed_once() -> None:
    """myst-parser's renderer makes a docutils document with default settings each time it renders, even when it is
    handed one (its ``options.get("document", make_document())`` evaluates the default first): 2 ms of option
    parsing per render. Sphinx renders each translated message apart, some 2,100 per Chinese build. The same
    document, its default settings parsed once per parser class and copied: about 4 s of each Chinese build here.
    Left alone where myst-parser's function is not the one this was written for."""
    import copy
    import inspect

    from docutils.frontend import get_default_settings
    from docutils.utils import new_document
    from myst_parser.mdit_to_docutils import base

    made = getattr(base, "make_document", None)
    if made is None or getattr(made, "defaults_once", False) or \
            list(inspect.signature(made).parameters) != ["source_path", "parser_cls"]:
        return
    parser, defaults = inspect.signature(made).parameters["parser_cls"].default, {}

    def make_document(source_path="notset", parser_cls=parser):
        if parser_cls not in defaults:
            defaults[parser_cls] = get_default_settings(parser_cls)
        return new_document(source_path, settings=copy.deepcopy(defaults[parser_cls]))

    make_document.defaults_once = True
    base.make_document = make_document


def catalogs_written_whole() -> None:
    """Sphinx compiles each outdated catalog (.po) into its .mo as a build starts, writing the .mo in place, and reads a
    .mo it cannot parse as no translation at all (``sphinx.locale.init`` passes over any error). `make test` builds
    the Chinese edition and its student edition at once: on a fresh clone, where no .mo exists, one build read the
    .mo files the other was writing and made every page English. Each .mo is written beside, then renamed into place,
    so that a reader finds the whole file or none (and then compiles it itself)."""
    import os
    import tempfile

    from babel.messages import mofile
    from babel.messages.pofile import read_po
    from sphinx.util.i18n import CatalogInfo

    def write_whole(self, locale: str, use_fuzzy: bool = False) -> None:
        with open(self.po_path, encoding=self.charset) as po_file:
            po = read_po(po_file, locale)
        handle, partial = tempfile.mkstemp(prefix=f".{Path(self.mo_path).name}.", dir=Path(self.mo_path).parent)
        try:
            with os.fdopen(handle, "wb") as mo_file:
                mofile.write_mo(mo_file, po, use_fuzzy)
            os.chmod(partial, 0o644)
            os.replace(partial, self.mo_path)
        except BaseException:
            Path(partial).unlink(missing_ok=True)
            raise

    CatalogInfo.write_mo = write_whole


def setup(app):
    defaults_computed_once()
    catalogs_written_whole()
    app.setup_extension("zh_figures")  # the figures' words in the page's language
    app.connect("config-inited", configure, priority=100)  # before sphinx-togglebutton reads its hints (500)
    app.add_transform(ProofLabelOut)
    app.add_transform(ProofLabelIn)
    app.add_transform(MessagesShownInEnglish)
    app.add_transform(FormulasTranslated)
    app.add_transform(ExercisesAsTranslated)
    app.connect("build-finished", report_untranslated)
    app.connect("doctree-read", edition_note)
    app.connect("doctree-read", toctree_captions)
    app.connect("doctree-read", translations_adopted, priority=900)  # after every handler that adds nodes
    app.connect("doctree-read", messages_as_read, priority=400)  # before edition_note adds its Chinese note
    app.connect("env-purge-doc", forget_messages)
    app.connect("env-get-outdated", read_again_after_english)
    app.connect("builder-inited", extraction_of_read_messages)
    # the switch before the theme drops templates that render empty (pydata-sphinx-theme, priority 500)
    app.connect("html-page-context", page_context, priority=100)
    app.connect("html-page-context", fix_buttons, priority=901)  # after colab_rendition's Colab button (900)
    app.connect("build-finished", translated_notebooks, priority=600)  # after colab_rendition's renditions (500)
    app.add_search_language(chinese_search_language())
    return {"parallel_read_safe": True, "parallel_write_safe": True}
