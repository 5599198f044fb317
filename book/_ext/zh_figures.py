"""The figures of the Chinese edition, drawn again with their words in Chinese, from the English build's run.

When the book's build executes a chapter, every figure it shows is stored as a PNG that lists the strings drawn in
it (a tEXt chunk, ``attention_course.plots.STRINGS_KEY``), and the output's metadata keeps the figure itself, pickled
(``FIGURE_KEY``; attention_course.plots.record_text_sizes). The Chinese build executes nothing: it reads the English
build's execution cache, and here, as myst-nb writes each figure of a page, the figure is unpickled, every text artist
whose string the catalog ``book/locale/zh_CN/LC_MESSAGES/figures.po`` translates is given its translation (titles,
suptitles, axis and colorbar labels, legends, annotations, tick labels, the categorical ones through their
formatters), and the figure is drawn again as the inline backend draws it (``print_figure``, ``bbox_inches="tight"``),
a font with Chinese characters beside matplotlib's own, with the text-size and string chunks written as in English.
The PNG keeps the file name of its English original (the hash of the English picture's bytes), so that the two
editions' outputs are the same HTML, and each page depends on the catalog: a changed translation is drawn by the next
Chinese build, without executing anything (and only the figures whose words changed are drawn again: ``drawn_once``;
the figures missing from that store are drawn before the pages are read, one process per core: ``draw_ahead``).

    python book/_ext/zh_figures.py extract   the catalog made or updated from the English build's execution cache:
        every string drawn in a figure of a chapter that holds a word (``has_words``) is a message, with the
        chapters that draw it; a string no longer drawn becomes obsolete (zh_edition.py translations runs it too).
"""
from __future__ import annotations

import functools
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
LANGUAGE = "zh_CN"
CATALOG = ROOT / "book" / "locale" / LANGUAGE / "LC_MESSAGES" / "figures.po"
CACHE = ROOT / "_build" / ".jupyter_cache"
STORE = ROOT / "_build" / "zh" / "figures"  # the Chinese pictures drawn so far, by digest (drawn_once): both editions'
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

# A word: two or more Latin letters standing alone. Code is not a word: a name joined to digits, underscores or dots
# (attn_mask, q0, nn.Linear, fp32), called (softmax(...)) or given a value (=False), nor a special token ([CLS],
# <pad>); nor is math ($...$) or a single letter (B, L, d).
WORD = re.compile(r"(?<![\w.=<\[])[A-Za-z]{2,}(?![\w(>\]]|\.\w)")
MATH = re.compile(r"\$[^$]*\$")
HAN = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")  # Chinese characters and full-width punctuation


def has_words(text: str) -> bool:
    """Whether a string drawn in a figure holds a word to translate (not only numbers, symbols, names in code, math)."""
    return bool(WORD.search(MATH.sub(" ", str(text))))


def catalog(path: Path = CATALOG) -> dict[str, str]:
    """The catalog's translations (msgid -> msgstr), its untranslated and fuzzy messages left out."""
    import polib

    if not path.exists():
        return {}
    return {e.msgid: e.msgstr for e in polib.pofile(str(path)) if e.msgstr and not e.obsolete and not e.fuzzy}


# ---------------------------------------------------------------------------------------------- drawing
@functools.lru_cache(maxsize=None)
def cjk_family() -> str:
    """The family name of a font with Chinese characters, added to matplotlib's fonts (its cache may predate the
    font): the first that fontconfig lists for Chinese, WenQuanYi Micro Hei or Noto Sans CJK preferred."""
    from matplotlib import font_manager

    files = []
    if shutil.which("fc-list"):
        run = subprocess.run(["fc-list", ":lang=zh", "file"], capture_output=True, text=True)
        files = sorted({line.split(":")[0].strip() for line in run.stdout.splitlines() if line.strip()},
                       key=lambda f: (not re.search(r"wqy-microhei|NotoSansCJK", f), "mono" in f.lower(), f))
    if not files:
        raise RuntimeError("no font with Chinese characters: the Chinese edition's figures cannot be drawn. Install "
                           "one (sudo apt-get install fonts-wqy-microhei; tests/prerequisites.py names it).")
    font_manager.fontManager.addfont(files[0])
    return font_manager.FontProperties(fname=files[0]).get_name()


def translate_figure(fig, words: dict[str, str]) -> None:
    """Every text artist of ``fig`` whose string ``words`` translates gets its translation, and so do the labels of
    categorical ticks, which the axis writes again from its formatter whenever it draws."""
    from matplotlib.text import Text
    from matplotlib.ticker import FixedFormatter

    for text in fig.findobj(Text):
        if text.get_text() in words:
            text.set_text(words[text.get_text()])
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            for formatter in (axis.get_major_formatter(), axis.get_minor_formatter()):
                if isinstance(formatter, FixedFormatter):
                    formatter.seq = [words.get(s, s) if isinstance(s, str) else s for s in formatter.seq]
                func = getattr(formatter, "func", None)  # set_ticks(ticks, labels): a FuncFormatter over a dict
                if isinstance(func, functools.partial) and func.args and isinstance(func.args[0], dict):
                    table = func.args[0]
                    for tick, label in table.items():
                        table[tick] = words.get(label, label) if isinstance(label, str) else label


def render(fig) -> bytes:
    """``fig`` as a PNG, as the inline backend shows it, its words in any script (matplotlib's font first, the Chinese
    one for the characters it lacks), with the chunks the English build writes (attention_course.plots). A character
    no font has (drawn as an empty box) stops it: ``GlyphMissing``."""
    import logging
    import warnings

    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import print_figure
    from matplotlib.text import Text

    from attention_course.plots import drawn_texts, text_chunks, with_png_text

    cjk = cjk_family()
    for text in fig.findobj(Text):
        family = [f for f in text.get_fontfamily() if f != cjk]
        if HAN.search(text.get_text()) and MATH.search(text.get_text()):
            # mathtext draws the words around the math in the text's first font alone, without fallback: the Chinese
            # font first (its Latin letters too); the math keeps matplotlib's math fonts
            text.set_fontfamily([cjk, *family])
        else:  # each text's fonts first, the Chinese one for the glyphs they lack
            text.set_fontfamily([*family, cjk])
    missing = MissingGlyphs()
    mathtext = logging.getLogger("matplotlib.mathtext")  # mathtext logs a missing glyph; text warns
    mathtext.addHandler(missing)
    try:
        with warnings.catch_warnings(record=True) as caught, drawn_texts() as found, \
                plt.rc_context({"font.family": [*plt.rcParams["font.family"], cjk]}):  # tick labels made in drawing
            warnings.simplefilter("always")
            png = print_figure(fig, "png", bbox_inches="tight")
    finally:
        mathtext.removeHandler(missing)
    boxes = missing.found + [str(w.message) for w in caught if "missing from font" in str(w.message)]
    if boxes:
        raise GlyphMissing(f"characters no font has, drawn as empty boxes: {'; '.join(dict.fromkeys(boxes))}")
    return with_png_text(png, text_chunks(found, fig.dpi))


class GlyphMissing(RuntimeError):
    """A figure drawn in Chinese would show a character as an empty box."""


class MissingGlyphs:
    """A logging handler that keeps mathtext's messages of a glyph it lacks."""

    level = 0

    def __init__(self):
        self.found = []

    def handle(self, record):
        if "glyph" in record.getMessage():
            self.found.append(record.getMessage())


def digest(record: str, strings: list[str], words: dict[str, str]) -> str:
    """What a figure drawn in Chinese depends on: its record, the translations of the strings it draws, matplotlib."""
    import hashlib

    import matplotlib

    key = json.dumps([record, {s: words.get(s) for s in strings}, matplotlib.__version__], ensure_ascii=True)
    return hashlib.sha256(key.encode()).hexdigest()


def drawn_once(record: str, strings: list[str], words: dict[str, str], store: Path | None) -> bytes:
    """``translated_png``, kept in ``store`` under a digest of all it depends on (the record, the translations of the
    strings the English figure draws, matplotlib's version): a Chinese build reads every chapter with figures again
    when the catalog changes, and draws again only the figures whose words changed (drawing is most of its cost)."""
    if store is None:
        return translated_png(record, words)
    kept = store / f"{digest(record, strings, words)}.png"
    if kept.exists():
        return kept.read_bytes()
    png = translated_png(record, words)
    store.mkdir(parents=True, exist_ok=True)
    partial = kept.with_name(f"{kept.stem}.{os.getpid()}.part")  # the two Chinese editions may build at once
    partial.write_bytes(png)
    partial.replace(kept)  # whole or absent, whatever stops the build
    return png


def translated_png(record: str, words: dict[str, str]) -> bytes:
    """The PNG of the figure pickled in ``record`` (the output's metadata), drawn with ``words``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from attention_course.plots import figure_from

    fig = figure_from(record)
    try:
        translate_figure(fig, words)
        return render(fig)
    finally:
        plt.close(fig)


# ---------------------------------------------------------------------------------------------- the Chinese build
def draw_in_language(app) -> None:
    """In a translated build: myst-nb's image outputs of a figure the English run recorded are drawn again here."""
    from i18n import language

    if language(app) == "en" or app.builder.name == "gettext":
        return
    from myst_nb.core.render import NbElementRenderer

    from attention_course.plots import FIGURE_KEY, STRINGS_KEY, png_text

    words = catalog()
    english = NbElementRenderer.render_image
    if getattr(english, "draws_in_language", False):
        return

    def render_image(self, data):
        made = english(self, data)
        record = data.output_metadata.get(data.mime_type, {}).get(FIGURE_KEY) if data.mime_type == "image/png" \
            else None
        if record is None or len(made) != 1 or not made[0].get("uri"):
            return made
        if self.renderer.sphinx_env is not None:
            self.renderer.sphinx_env.note_dependency(str(CATALOG))  # a changed translation: the page read again
        import base64

        strings = json.loads(png_text(base64.b64decode(data.content)).get(STRINGS_KEY, "[]"))
        # the English picture's name (the hash of its bytes), the Chinese picture's bytes
        self.write_file([Path(made[0]["uri"]).name], drawn_once(record, strings, words, STORE), overwrite=True)
        return made

    render_image.draws_in_language = True
    NbElementRenderer.render_image = render_image


def _draw(record: str, strings: list[str], words: dict[str, str]) -> None:
    """In a pool process: one figure drawn into the store."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    drawn_once(record, strings, words, STORE)


def draw_ahead(app, env, docnames) -> None:
    """Before a translated build reads its pages: the figures of the notebooks it will read that the store lacks are
    drawn in a pool of processes, one per core (myst-nb reads the pages one after the other); each page then finds
    its figures drawn. A figure that fails here is drawn again as its page is read, which reports the failure."""
    from i18n import language

    if language(app) == "en" or app.builder.name == "gettext" or env.mystnb_config.execution_mode != "cache":
        return
    import base64
    from concurrent.futures import ProcessPoolExecutor

    from jupyter_cache import get_cache
    from myst_nb.core.read import create_nb_reader

    from attention_course.plots import FIGURE_KEY, STRINGS_KEY, png_text

    cache, words, todo = get_cache(env.mystnb_config.execution_cache_path or str(CACHE)), catalog(), []
    for docname in docnames:
        path = str(env.doc2path(docname))
        if not path.endswith(".ipynb"):
            continue
        text = Path(path).read_text(encoding="utf8")
        notebook = create_nb_reader(path, env.myst_config, env.mystnb_config, text).read(text)
        try:
            executed = cache.get_cache_bundle(cache.match_cache_notebook(notebook).pk).nb
        except KeyError:
            continue
        for cell in executed.cells:
            for output in cell.get("outputs", []):
                record = output.get("metadata", {}).get("image/png", {}).get(FIGURE_KEY)
                if record is None:
                    continue
                strings = json.loads(png_text(base64.b64decode(output["data"]["image/png"])).get(STRINGS_KEY, "[]"))
                if not (STORE / f"{digest(record, strings, words)}.png").exists():
                    todo.append((record, strings))
    if len(todo) < 2:
        return
    from sphinx.util import logging

    workers = min(len(todo), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    logging.getLogger(__name__).info("drawing %d figures in Chinese, %d at a time", len(todo), workers)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn")) as pool:
        for run in [pool.submit(_draw, record, strings, words) for record, strings in todo]:
            try:
                run.result()
            except Exception:  # noqa: BLE001 - drawn again, and reported, as its page is read
                pass


# ---------------------------------------------------------------------------------------------- the catalog
def figure_strings(cache_path: Path = CACHE, notebooks: Path = ROOT / "notebooks") -> dict[str, list[str]]:
    """{string drawn: the chapters (notebooks/NN_x.ipynb) whose figures draw it}, every string of every figure the
    English build's execution cache holds for the chapters as they are now, in the order drawn."""
    import base64

    import nbformat
    from jupyter_cache import get_cache

    from attention_course.plots import STRINGS_KEY, png_text

    cache, found = get_cache(str(cache_path)), {}
    for path in sorted(notebooks.glob("*.ipynb")):
        try:
            record = cache.match_cache_notebook(nbformat.read(path, as_version=4))
        except KeyError:
            raise LookupError(f"the execution cache {cache_path} holds no run of {path.name} as it is now: build "
                              "the English edition first (make book-en)") from None
        executed = cache.get_cache_bundle(record.pk).nb
        for cell in executed.cells:
            for output in cell.get("outputs", []):
                png = output.get("data", {}).get("image/png")
                if png is None:
                    continue
                chunk = png_text(base64.b64decode(png)).get(STRINGS_KEY)
                for text in json.loads(chunk) if chunk else []:
                    found.setdefault(text, [])
                    where = path.relative_to(ROOT).as_posix()
                    if where not in found[text]:
                        found[text].append(where)
    return found


def extract(cache_path: Path = CACHE, path: Path = CATALOG) -> tuple[int, int]:
    """The catalog updated with the strings with words of the English build's figures: (new messages, obsolete)."""
    import polib

    strings = {text: where for text, where in figure_strings(cache_path).items() if has_words(text)}
    if path.exists():
        po = polib.pofile(str(path), wrapwidth=0)
    else:
        po = polib.POFile(wrapwidth=0)
        po.metadata = {"Project-Id-Version": "attention-course", "Language": LANGUAGE, "MIME-Version": "1.0",
                       "Content-Type": "text/plain; charset=utf-8", "Content-Transfer-Encoding": "8bit"}
        po.header = ("The words drawn in the chapters' figures (book/_ext/zh_figures.py). Made and updated by "
                     "`python book/_ext/zh_figures.py extract`\n(zh_edition.py translations runs it) from the "
                     "English build; book/locale/TRANSLATING.md says how to translate.")
    new = 0
    for text, where in strings.items():
        entry = po.find(text, include_obsolete_entries=True)
        if entry is None:
            entry = polib.POEntry(msgid=text, msgstr="")
            po.append(entry)
            new += 1
        entry.obsolete = False
        entry.occurrences = [(w, "") for w in where]
    gone = 0
    for entry in po:
        if entry.msgid not in strings and not entry.obsolete:
            entry.obsolete, gone = True, gone + 1
    first = {text: n for n, text in enumerate(strings)}
    po[:] = sorted(po, key=lambda e: (e.obsolete, first.get(e.msgid, 0)))
    path.parent.mkdir(parents=True, exist_ok=True)
    po.save(str(path))
    return new, gone


def setup(app):
    app.connect("builder-inited", draw_in_language)
    app.connect("env-before-read-docs", draw_ahead)
    return {"parallel_read_safe": True, "parallel_write_safe": True}


if __name__ == "__main__":
    if sys.argv[1:] != ["extract"]:
        sys.exit(__doc__)
    added, obsolete = extract()
    print(f"{CATALOG.relative_to(ROOT)}: {added} new messages, {obsolete} obsolete; translate the new ones "
          "(book/locale/TRANSLATING.md)")
