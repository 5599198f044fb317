"""The figures of the Chinese edition speak Chinese (book/_ext/zh_figures.py): drawn again from the English run's
record with the words of book/locale/zh_CN/LC_MESSAGES/figures.po, nothing executed again.

The first tests need no build: a figure recorded as a chapter's kernel records it is drawn again, unchanged without a
translation (the same bytes) and in Chinese with one, every glyph found. The others read the English build's execution
cache and the built site (`make book`; ATTENTION_COURSE_SITE): every word a figure of the English build draws has its
translation in the catalog, the Chinese figures draw those translations at the English text sizes, and no downloadable
notebook carries the pickled figures.
"""
import base64
import json
import sys
import warnings
from functools import partial
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from IPython.core.pylabtools import print_figure  # noqa: E402

from attention_course import plots  # noqa: E402
from attention_course.plots import DPI_KEY, FIGURE_KEY, STRINGS_KEY, TEXT_PT_KEY, png_text  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "book" / "_ext"))
import zh_figures  # noqa: E402
from test_site import SITE, figure_problems  # noqa: E402

CHINESE = {"query": "查询", "key": "键", "may attend": "可以关注", "blocked (masked)": "被屏蔽（已掩蔽）",
           "The pad steals weight unless it is masked": "除非被掩蔽，填充位会抢走权重", "ignore mask": "忽略掩码",
           "fused": "融合", "explicit": "显式", "milliseconds": "毫秒", "two ways": "两种做法",
           "the largest": "最大者", "weight": "权重", "One query, four keys": "一个查询，四个键"}


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def shown(fig) -> tuple[bytes, dict]:
    """(the PNG, the output's metadata) of ``fig`` as the book's kernels show it (the inline backend's formatter,
    wrapped by record_text_sizes)."""
    formatter = plots._recording_formatter(partial(print_figure, fmt="png", bbox_inches="tight", base64=True))
    data, metadata = formatter(fig)
    return base64.b64decode(data), metadata


def every_kind_of_text():
    """A figure with each kind of text a chapter draws: title, suptitle, axis and colorbar labels, legends,
    categorical tick labels (set_xticks with labels, and a FixedFormatter), an annotation, a text."""
    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(9, 3), layout="constrained")
    plots.plot_mask(torch.triu(torch.ones(4, 4, dtype=torch.bool), 1), ax=left, legend=True,
                    title="The pad steals weight unless it is masked")
    plots.plot_bars({"explicit": [3, 4], "fused": [1, 2]}, ["two ways", "weight"], ax=middle)
    middle.set_ylabel("milliseconds")
    image = right.imshow([[0.1, 0.9], [0.5, 0.2]])
    fig.colorbar(image, ax=right).set_label("weight")
    right.xaxis.set_major_locator(matplotlib.ticker.FixedLocator([0, 1]))
    right.xaxis.set_major_formatter(matplotlib.ticker.FixedFormatter(["query", "key"]))
    right.annotate("the largest", (1, 0), xytext=(0.2, 1.3), arrowprops={"arrowstyle": "->"})
    right.text(0, 1, "q0", color="white")
    fig.suptitle("One query, four keys")
    return fig


def test_words_are_told_from_numbers_symbols_names_and_code():
    for words in ("key", "may attend", "softmax(2 · scores)", "sentence 0, head 1", "'who is he', padded to 4",
                  "Explicit attention, B=2, h=4, d=16, on cpu", "nn.MultiheadAttention stacks the projections"):
        assert zh_figures.has_words(words), words
    for code in ("q0", "B", "attn_mask", "0.25", "−1.0", "$W_q$  (B, L)", "fp32", "nn.Linear", "softmax(x)", "L=128",
                 "$\\sqrt{d}$", "×2", "k_3", "need_weights=False", "[CLS]", "<pad>"):
        assert not zh_figures.has_words(code), code


@pytest.mark.needs("font")
def test_without_a_translation_the_figure_is_drawn_again_byte_for_byte():
    mask = torch.triu(torch.ones(5, 5, dtype=torch.bool), 1)
    fig = plots.plot_mask(mask, query_labels=list("abcde"), key_labels=["the", "cat", "sat", "on", "it"],
                          title="The pad steals weight unless it is masked").figure
    png, metadata = shown(fig)
    assert zh_figures.translated_png(metadata[FIGURE_KEY], {}) == png  # the record is the figure the chapter showed


@pytest.mark.needs("font")
def test_the_record_holds_every_kind_of_text():
    png, metadata = shown(every_kind_of_text())
    again = zh_figures.translated_png(metadata[FIGURE_KEY], {})
    # drawn a second time, a constrained layout may move by a fraction of a pixel: the same picture, not the same bytes
    assert png_text(again) == png_text(png)
    strings = json.loads(png_text(png)[STRINGS_KEY])
    assert {"The pad steals weight unless it is masked", "may attend", "query", "key", "fused", "two ways",
            "milliseconds", "weight", "the largest", "q0", "One query, four keys"} <= set(strings)


@pytest.mark.needs("font")
def test_in_chinese_every_word_is_drawn_in_chinese_with_every_glyph_at_the_same_sizes():
    png, metadata = shown(every_kind_of_text())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chinese = zh_figures.translated_png(metadata[FIGURE_KEY], CHINESE)
    missing = [str(w.message) for w in caught if "missing from" in str(w.message) or "glyph" in str(w.message)]
    assert not missing, f"glyphs drawn as empty boxes: {missing[:3]}"
    drawn = json.loads(png_text(chinese)[STRINGS_KEY])
    assert not [s for s in drawn if zh_figures.has_words(s)], f"English left in the Chinese figure: {drawn}"
    assert {"除非被掩蔽，填充位会抢走权重", "可以关注", "查询", "键", "融合", "两种做法", "毫秒", "权重", "最大者",
            "一个查询，四个键", "q0"} <= set(drawn)
    english = png_text(png)
    assert png_text(chinese)[TEXT_PT_KEY] == english[TEXT_PT_KEY] and png_text(chinese)[DPI_KEY] == english[DPI_KEY]


@pytest.mark.needs("font")
def test_a_character_no_font_has_stops_the_drawing():
    png, metadata = shown(every_kind_of_text())
    with pytest.raises(zh_figures.GlyphMissing, match="empty boxes"):
        zh_figures.translated_png(metadata[FIGURE_KEY], {"key": "\U000f0000 键"})
    with pytest.raises(zh_figures.GlyphMissing, match="glyph"):  # mathtext's words around the math
        zh_figures.translated_png(metadata[FIGURE_KEY], {"fused": "\U000f0000 $x$"})


def test_a_figure_that_cannot_be_pickled_is_shown_without_a_record():
    fig, ax = plt.subplots()
    ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, pos: f"{x:g} s"))
    data = plots._recording_formatter(partial(print_figure, fmt="png", base64=True))(fig)
    assert isinstance(data, str) and STRINGS_KEY in png_text(base64.b64decode(data))  # the picture, no metadata


# ------------------------------------------------------------------------------------------------ the built editions
def english_figures() -> dict[str, list[str]]:
    if not (zh_figures.CACHE / "global.db").exists():
        pytest.fail(f"no execution cache in {zh_figures.CACHE}: run `make book` first")
    return zh_figures.figure_strings()


def test_every_word_drawn_in_an_english_figure_is_translated():
    words = zh_figures.catalog()
    left = {text: where for text, where in english_figures().items()
            if zh_figures.has_words(text) and text not in words}
    assert not left, (f"{len(left)} strings drawn in figures without a translation in "
                      f"{zh_figures.CATALOG.relative_to(ROOT)} (`python book/_ext/zh_figures.py extract` adds them), "
                      "e.g. " + "; ".join(f"{text!r} ({', '.join(where)})" for text, where in list(left.items())[:5]))


def site_figures(folder: Path) -> dict[str, dict]:
    if not folder.exists():
        pytest.fail(f"no {folder}: run `make book` first (or set ATTENTION_COURSE_SITE to a built site)")
    return {png.name: png_text(png.read_bytes()) for png in sorted(folder.glob("*.png"))}


def test_the_chinese_figures_draw_the_translations_at_the_english_sizes():
    english, chinese = site_figures(SITE / "_images"), site_figures(SITE / "zh" / "_images")
    recorded = {name: chunks for name, chunks in english.items() if STRINGS_KEY in chunks}
    assert recorded, f"no figure of {SITE} records its strings: built with book/_ext/legibility.py?"
    translations = set(zh_figures.catalog().values())
    problems = []
    for name, chunks in recorded.items():
        if name not in chinese:
            problems.append(f"{name}: no Chinese figure of that name in {SITE / 'zh' / '_images'}")
            continue
        zh = chinese[name]
        english_words = [s for s in json.loads(zh.get(STRINGS_KEY, "[]"))
                         if zh_figures.has_words(s) and s not in translations]
        if english_words:
            problems.append(f"{name}: drawn in English on the Chinese page: {english_words[:3]}")
        if (zh.get(TEXT_PT_KEY), zh.get(DPI_KEY)) != (chunks[TEXT_PT_KEY], chunks[DPI_KEY]):
            problems.append(f"{name}: smallest text {zh.get(TEXT_PT_KEY)} pt at {zh.get(DPI_KEY)} dpi in Chinese, "
                            f"{chunks[TEXT_PT_KEY]} pt at {chunks[DPI_KEY]} dpi in English")
    assert not problems, "\n".join(problems)


def test_the_chinese_figures_are_legible_where_the_english_ones_are():
    """test_site's rule (9 CSS px or more for the smallest text at 1280 px, where the text column is 688 px wide) on
    the Chinese pictures, as the page shows them: at their own width, or the column's when wider."""
    from PIL import Image

    figures = []
    for name, chunks in site_figures(SITE / "zh" / "_images").items():
        if STRINGS_KEY in chunks:
            width = Image.open(SITE / "zh" / "_images" / name).width
            figures.append({"src": f"zh/_images/{name}", "natural": width, "shown": min(width, 688), "where": name})
    assert figures, f"no Chinese figure on {SITE}"
    assert not figure_problems(figures, SITE)


def test_no_served_notebook_carries_a_pickled_figure():
    served = sorted(SITE.rglob("*.ipynb"))
    assert served, f"no notebook on {SITE}: run `make book` first"
    carrying = [p.relative_to(SITE).as_posix() for p in served if FIGURE_KEY in p.read_text()]
    assert not carrying, f"pickled figures in downloadable notebooks: {carrying}"
