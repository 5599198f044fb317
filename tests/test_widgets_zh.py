"""The widgets in the reader's language: their catalog, how the language is chosen, and what the browser shows.

Every word a widget draws or says is a message of a tr()/trn() call in its ES module, translated in
attention_course/widgets/locale/zh_CN.po. The first tests read the modules and the catalog (no browser): every
message translated, its placeholders and markup kept, no English text written outside a message. Then the language
choice on the Python side (argument, environment variable, the notebook's metadata). Then the ES modules in
Chromium: on a Chinese page (<html lang="zh-CN">) a widget shows and says no English word outside names and code, and
on an English page no Chinese; last, the built site's chapters 3, 5 and 10 in both editions, controls moved.
"""
import json
import re

import pytest
import traitlets
from test_site import SCREENSHOTS, Visit, browser, shared_browser, site  # noqa: F401  (fixtures)
from test_widgets import RENDER

from attention_course.widgets import DecodeCacheWidget, HeadReshapeWidget, MaskBroadcastWidget, _base, _messages

CATALOG_PATH = _messages.LOCALE / "zh_CN.po"
PLACEHOLDER = re.compile(r"\{(\w+)\}")
TAG = re.compile(r"</?\w+>")
CJK = re.compile(r"[\u3400-\u9fff\u3000-\u303f\uff00-\uffef]")

# ---------------------------------------------------------------- what counts as an English word
# Code is not English: a call with its arguments (masked_fill(mask, −∞), x.reshape(B·h, L, d), w.update(...)), a
# name of the package's or torch's API, a Python value, and a symbol: one letter (B, L, W, h), letters and digits
# (k0, q1, s2, kv1, f3, float32), or a name with an underscore (h_kv, head_dim).
CODE_CALL = re.compile(r"[\w.]*\w\([^()]*\)")
CODE_NAMES = {"True", "False", "softmax", "reshape", "transpose", "arange", "nn.MultiheadAttention",
              "MQA", "GQA"}  # the glossary keeps these abbreviations beside their Chinese names


def english_words(text: str) -> list[str]:
    words = re.findall(r"[A-Za-z][A-Za-z0-9_.]*[A-Za-z0-9_]|[A-Za-z]", CODE_CALL.sub(" ", text))
    return [w for w in words if not (w in CODE_NAMES or len(w) == 1 or re.fullmatch(r"[A-Za-z]+\d+", w) or "_" in w)]


def test_english_words_tells_code_from_words():
    assert english_words("批量大小 B，s0 的长度，h_kv = 2，k0 q1 kv1，float32，True = 不可关注") == []
    assert english_words("masked_fill(mask, −∞) 之后的分数；x.reshape(B·h, L, d)") == []
    assert english_words("与 nn.MultiheadAttention 相同；多查询注意力（MQA）") == []
    assert english_words("第 2 步，previous step，window W") == ["previous", "step", "window"]
    assert english_words("head 0") == ["head"]


# ---------------------------------------------------------------- the catalog (no browser)
def test_every_message_of_the_modules_is_in_the_catalog():
    """Every tr()/trn() call's message is translated, and the catalog holds nothing the modules no longer say."""
    found = _messages.messages()
    catalog = _messages.read_po(CATALOG_PATH)
    missing = [s for s, _ in found if s not in catalog]
    assert not missing, f"not translated in {CATALOG_PATH.name}:\n" + "\n".join(missing)
    stale = sorted(set(catalog) - {s for s, _ in found})
    assert not stale, f"in {CATALOG_PATH.name} but said by no module:\n" + "\n".join(stale)
    for singular, plural in found:
        assert isinstance(catalog[singular], list) == (plural is not None), f"{singular!r}: plural forms differ"
    assert len(found) > 200


def test_translations_keep_the_placeholders_and_the_markup():
    catalog = _messages.read_po(CATALOG_PATH)
    for singular, plural in _messages.messages():
        english = singular + (plural or "")
        for text in catalog[singular] if plural else [catalog[singular]]:
            kept, asked = set(PLACEHOLDER.findall(text)), set(PLACEHOLDER.findall(english))
            # a plural's count {n} may be left to the words around it; every other placeholder is kept, none added
            assert kept <= asked and asked - kept <= ({"n"} if plural else set()), (singular, text)
            assert sorted(TAG.findall(text)) == sorted(TAG.findall(singular)), (singular, text)
            assert CJK.search(text) or not english_words(text), f"{singular!r} is not translated: {text!r}"


def test_no_english_is_written_outside_a_message():
    """The text of every string and template literal that is not a message: markup, class, attribute, event and
    trait names only. A label written without tr() shows here (the tokenizer reads the modules as JavaScript)."""
    names = {  # HTML, SVG and ARIA vocabulary, events, the traits' and the state's names: never shown as words
        "class", "style", "span", "div", "input", "output", "button", "label", "details", "summary", "svg", "path",
        "rect", "text", "th", "col", "row", "role", "img", "group", "status", "polite", "true", "value", "range",
        "checkbox", "change", "click", "keydown", "middle", "end", "central", "fill", "stroke", "width", "height",
        "viewBox", "transform", "translate", "rotate", "rgb", "px", "scope", "background", "lang", "language", "en",
        "none", "next", "previous", "step", "steps", "window", "prompt", "prefill", "dtype", "kv", "broadcast",
        "combined", "causal", "example", "lengths", "length", "arange", "reshape", "True", "False", "ac",
    }
    for name in _messages.MODULES:
        loose = [w for w in _messages.loose_words((_messages.HERE / name).read_text())
                 if w not in names and not re.search(r"[-_.\d]", w) and not re.fullmatch(r"[0-9a-f]{5,6}", w)]
        assert not loose, f"{name}: words outside tr()/trn(): {sorted(set(loose))}"


def test_the_tokenizer_finds_messages_however_they_are_written():
    src = '''const a = tr("one " +
      "message", { x: 1 }), re = /"[^/]*"/g, b = trn("{n} head", "{n} heads", h);
    const c = `<h4>${tr("heading {k}", { k })}</h4>`; // tr("a comment")
    const loose = "left alone";'''
    found, _ = _messages.calls(src)
    assert found == [("one message", None), ("{n} head", "{n} heads"), ("heading {k}", None)]
    assert _messages.loose_words(src) == ["left", "alone"]
    with pytest.raises(ValueError, match="no string literal"):
        _messages.calls("tr(label)")
    with pytest.raises(ValueError, match="has no plural"):
        _messages.calls('trn("{n} head")')
    with pytest.raises(ValueError, match="plural is not a string literal"):
        _messages.calls('trn("{n} head", plural, n)')


def test_the_template_holds_every_message():
    """``python -m attention_course.widgets._messages``: the .pot a translator merges into the catalog."""
    polib = pytest.importorskip("polib")
    entries = [e for e in polib.pofile(_messages.pot()) if e.msgid]
    assert [(e.msgid, e.msgid_plural or None) for e in entries] == _messages.messages()


def test_the_reader_agrees_with_polib():
    polib = pytest.importorskip("polib")
    catalog = _messages.read_po(CATALOG_PATH)
    entries = [e for e in polib.pofile(str(CATALOG_PATH)) if e.msgid and not e.obsolete and "fuzzy" not in e.flags]
    assert catalog == {e.msgid: ([e.msgstr_plural[0]] if e.msgid_plural else e.msgstr) for e in entries}


def test_the_catalog_ships_with_the_package():
    text = (_messages.HERE.parents[1] / "pyproject.toml").read_text()
    assert re.search(r'"attention_course\.widgets" = \[[^]]*"locale/\*\.po"', text)
    for w in (MaskBroadcastWidget(), HeadReshapeWidget(), DecodeCacheWidget()):
        catalogs = json.loads(re.match(r"const CATALOGS = (.*);\n", w._esm).group(1))
        assert catalogs["zh_CN"]["batch size B" if not isinstance(w, DecodeCacheWidget) else "previous step"]


# ---------------------------------------------------------------- the language, on the Python side
def notebook(tmp_path, metadata):
    path = tmp_path / "chapter.ipynb"
    path.write_text(json.dumps({"cells": [], "metadata": metadata, "nbformat": 4, "nbformat_minor": 5}))
    return str(path)


def test_the_language_is_chosen_by_argument_variable_then_notebook(tmp_path, monkeypatch):
    monkeypatch.delenv("ATTENTION_COURSE_LANGUAGE", raising=False)
    monkeypatch.delenv("JPY_SESSION_NAME", raising=False)
    assert MaskBroadcastWidget().language == ""  # no notebook to read (the site's build, Colab): the page decides
    monkeypatch.setenv("JPY_SESSION_NAME", notebook(tmp_path, {"attention_course": {"language": "zh_CN"}}))
    assert HeadReshapeWidget().language == "zh_CN"  # the Chinese notebook, in JupyterLab or Notebook 7
    monkeypatch.setenv("JPY_SESSION_NAME", notebook(tmp_path, {"kernelspec": {}}))
    assert DecodeCacheWidget().language == "en"  # an English notebook: English, whatever the page
    monkeypatch.setenv("ATTENTION_COURSE_LANGUAGE", "zh-CN")
    assert DecodeCacheWidget().language == "zh_CN"  # the variable over the notebook
    assert DecodeCacheWidget(language="en").language == "en"  # the argument over both
    monkeypatch.delenv("ATTENTION_COURSE_LANGUAGE")
    broken = tmp_path / "broken.ipynb"
    broken.write_text("{ not json")
    monkeypatch.setenv("JPY_SESSION_NAME", str(broken))
    assert MaskBroadcastWidget().language == ""  # a notebook that cannot be read: the page decides
    monkeypatch.setenv("JPY_SESSION_NAME", notebook(tmp_path, {"attention_course": {"language": "fr"}}))
    assert MaskBroadcastWidget().language == ""  # a language the widgets do not speak: the page decides
    monkeypatch.setenv("JPY_SESSION_NAME", str(tmp_path / "gone.ipynb"))
    assert MaskBroadcastWidget().language == ""  # a path that is not there: the page decides


def test_a_language_is_checked():
    assert [_base.normalise_language(v) for v in ("zh", "zh-CN", "zh_Hans", "en-US", "", None)] == \
        ["zh_CN", "zh_CN", "zh_CN", "en", "", ""]
    with pytest.raises(traitlets.TraitError, match="language must be one of 'en', 'zh_CN'"):
        MaskBroadcastWidget(language="fr")
    w = HeadReshapeWidget(language="zh")
    assert w.language == "zh_CN" and "language" not in w.SETTINGS


def test_python_messages_stay_english():
    """What Python raises stays English, as the course's printed output does: only the browser's words change."""
    with pytest.raises(traitlets.TraitError, match="batch_size must be an integer from 1 to 3"):
        HeadReshapeWidget(language="zh_CN", batch_size=9)


def test_the_chinese_notebooks_say_their_language():
    import sys

    sys.path.insert(0, str(_messages.HERE.parents[1] / "book" / "_ext"))
    import translate_notebooks

    source = {"cells": [{"cell_type": "code", "metadata": {}, "source": ["w = MaskBroadcastWidget()\n"]}],
              "metadata": {"kernelspec": {"name": "python3"}}, "nbformat": 4, "nbformat_minor": 5}
    translated, _ = translate_notebooks.translate_notebook(source, {})
    assert translated["metadata"] == {"kernelspec": {"name": "python3"}, "attention_course": {"language": "zh_CN"}}
    assert translated["cells"] == source["cells"] and "attention_course" not in source["metadata"]


@pytest.mark.slow  # two Python processes, each importing torch
def test_a_kernel_jupyter_server_starts_for_a_chinese_notebook_draws_chinese(tmp_path):
    """The whole chain in Jupyter (JupyterLab, Notebook 7): the Chinese notebook as the build writes it, the
    environment Jupyter Server gives the kernel it starts for that notebook, and a widget made in that kernel."""
    import subprocess
    import sys

    sessions = pytest.importorskip("jupyter_server.services.sessions.sessionmanager")
    kernels = pytest.importorskip("jupyter_server.services.kernels.kernelmanager")
    sys.path.insert(0, str(_messages.HERE.parents[1] / "book" / "_ext"))
    import translate_notebooks

    (tmp_path / "notebooks").mkdir()
    source = {"cells": [], "metadata": {}, "nbformat": 4, "nbformat_minor": 5}
    for name, nb in [("zh.ipynb", translate_notebooks.translate_notebook(source, {})[0]), ("en.ipynb", source)]:
        (tmp_path / "notebooks" / name).write_text(json.dumps(nb))
    manager = sessions.SessionManager(kernel_manager=kernels.MappingKernelManager(root_dir=str(tmp_path)))
    for name, expected in [("zh.ipynb", "zh_CN"), ("en.ipynb", "en")]:
        env = {k: v for k, v in manager.get_kernel_env(f"notebooks/{name}", name).items()
               if k != "ATTENTION_COURSE_LANGUAGE"}
        run = subprocess.run([sys.executable, "-c", "from attention_course.widgets import MaskBroadcastWidget; "
                              "print(MaskBroadcastWidget().language)"], env=env, capture_output=True, text=True)
        assert run.stdout.strip() == expected, run.stderr[-2000:]


# ---------------------------------------------------------------- the ES modules in Chromium, in each language
@pytest.fixture(scope="module")
def tab():
    gen = shared_browser()
    chromium = next(gen)
    tab = chromium.new_page(viewport={"width": 900, "height": 900})
    tab.errors = []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    yield tab
    tab.close()
    next(gen, None)


# What a reader meets in a widget: every text node (the picture's labels, the tables, the live summary, the
# tooltips' <title>s) and every attribute read out (aria-label, title, alt), each apart.
WIDGET_TEXT = """(el) => {
  const out = [];
  const walker = document.createTreeWalker(el, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) if (n.textContent.trim()) out.push(n.textContent.trim());
  for (const node of el.querySelectorAll('[aria-label], [title], [alt], [aria-valuetext]'))
    for (const a of ['aria-label', 'title', 'alt', 'aria-valuetext'])
      if (node.getAttribute(a)) out.push(node.getAttribute(a));
  return out;
}"""


def show(tab, widget, lang):
    traits = {n: getattr(widget, n) for n in widget.trait_names(sync=True) if not n.startswith("_")}
    traits = {k: v for k, v in traits.items() if isinstance(v, (int, bool, list, str, type(None)))}
    tab.set_content(f'<!doctype html><html lang="{lang}"><body></body></html>')
    tab.evaluate(RENDER, [widget._esm, widget._css, traits])
    view = tab.locator(".ac-widget")
    view.locator("details").evaluate("d => { d.open = true; }")
    return view


def wrong_script(texts: list[str], lang: str) -> list[str]:
    if lang == "en":
        return [t for t in texts if CJK.search(t)]
    return [f"{t!r}: {english_words(t)}" for t in texts if english_words(t)]


STATES = [
    MaskBroadcastWidget(),
    MaskBroadcastWidget(batch_size=4, max_len=8, lengths=(8, 1, 5, 3), causal=True, num_heads=3, example=1),
    MaskBroadcastWidget(batch_size=1, max_len=1, lengths=(1,), show_heads=False),
    HeadReshapeWidget(),
    HeadReshapeWidget(batch_size=1, seq_len=1, embed_dim=2, num_heads=1),
    HeadReshapeWidget(batch_size=3, seq_len=6, embed_dim=12, num_heads=3),
    DecodeCacheWidget(),
    DecodeCacheWidget(num_heads=8, num_kv_heads=2, window=3, steps=16, step=11, prompt=4),
    DecodeCacheWidget(num_heads=6, num_kv_heads=1, window=1, step=0, head_dim=128, dtype="bfloat16"),
    DecodeCacheWidget(num_heads=4, num_kv_heads=4, steps=1, prompt=1),
]


@pytest.mark.parametrize("lang", ["zh-CN", "en"])
@pytest.mark.parametrize("widget", STATES, ids=lambda w: type(w).__name__)
def test_a_widget_speaks_the_page_language(tab, widget, lang):
    view = show(tab, widget, lang)
    assert view.get_attribute("lang") == lang
    texts = view.evaluate(WIDGET_TEXT)
    assert not wrong_script(texts, lang), wrong_script(texts, lang)[:20]
    assert not tab.errors


@pytest.mark.parametrize("lang", ["zh-CN", "en"])
def test_the_live_summary_joins_its_sentences_as_the_language_does(tab, lang):
    """The decode widget's live region says several sentences: in Chinese each ends in 。 and the next follows with no
    space; in English, one space."""
    view = show(tab, DecodeCacheWidget(num_heads=4, num_kv_heads=2, window=4, steps=10, step=7), lang)
    said = view.locator("[aria-live=polite].ac-sr").text_content()
    if lang == "en":
        assert ". " in said and "  " not in said, said
    else:
        assert said.count("。") >= 3 and not re.search(r"。\s", said), said
    assert not tab.errors


def test_notices_speak_the_page_language(tab):
    """The notices a control writes (a head count moved, a window clamped), in Chinese on a Chinese page."""
    view = show(tab, HeadReshapeWidget(embed_dim=8, num_heads=4), "zh-CN")
    view.locator("input[name=embed_dim]").fill("10")
    notice = view.locator(".ac-notice").inner_text()
    assert notice.startswith("h = 4 不能整除 D = 10") and not english_words(notice)
    view = show(tab, DecodeCacheWidget(num_heads=4, num_kv_heads=2, window=6, steps=8, prompt=5), "zh-CN")
    view.locator("input[name=steps]").fill("3")
    view.locator("input[name=num_heads]").fill("3")
    notice = view.locator(".ac-notice").inner_text()
    assert "窗口 W = 6 超过了生成的 3 个词元" in notice and "h_kv = 2 不能整除 h = 3" in notice, notice
    assert not english_words(notice), notice
    texts = view.evaluate(WIDGET_TEXT)
    assert not wrong_script(texts, "zh-CN")
    assert not tab.errors


def test_a_view_drawn_before_it_is_in_the_page_speaks_the_page_language(tab):
    """A front end may draw a view into an element it puts in the page afterwards (on the site, now and then): the
    page's language is then the document's, as the element has no parent to ask yet."""
    detached = RENDER.replace("document.body.append(el);\n  module.default.render({ model, el });",
                              "module.default.render({ model, el });\n  document.body.append(el);")
    assert detached != RENDER
    widget = MaskBroadcastWidget()
    traits = {n: getattr(widget, n) for n in widget.trait_names(sync=True) if not n.startswith("_")}
    traits = {k: v for k, v in traits.items() if isinstance(v, (int, bool, list, str, type(None)))}
    tab.set_content('<!doctype html><html lang="zh-CN"><body></body></html>')
    tab.evaluate(detached, [widget._esm, widget._css, traits])
    view = tab.locator(".ac-widget")
    assert view.get_attribute("lang") == "zh-CN" and "批量大小 B" in view.inner_text()
    assert not tab.errors


def test_the_model_language_wins_over_the_page(tab):
    """Python's choice (an argument, the variable, the notebook's metadata) over the page's language."""
    view = show(tab, MaskBroadcastWidget(language="zh_CN"), "en")
    assert view.get_attribute("lang") == "zh-CN" and "批量大小 B" in view.inner_text()
    view = show(tab, MaskBroadcastWidget(language="en"), "zh-CN")
    assert view.get_attribute("lang") == "en" and "batch size B" in view.inner_text()
    view = show(tab, MaskBroadcastWidget(language=""), "")  # nothing says: English
    assert "batch size B" in view.inner_text()


# ---------------------------------------------------------------- the built site: chapters 3, 5 and 10, both editions
CHAPTERS = {"mask-broadcast": ["notebooks/03_masks", "notebooks/05_heads"], "head-reshape": ["notebooks/05_heads"],
            "decode-cache": ["notebooks/10_decoding"]}


def move_controls(view, widget):
    """Move the widget's controls, so that more of its words are drawn: yields after each move."""
    if widget == "mask-broadcast":
        view.locator("input[name=causal]").click()
        yield
        view.locator("input[name=causal]").click()
        if view.locator("input[name=num_heads]").is_visible():
            view.locator("input[name=num_heads]").fill("3")
            yield
    elif widget == "head-reshape":
        view.locator("button[name=num_heads][aria-pressed=false]").first.click()
        yield
        view.locator("input[name=embed_dim]").fill("9")
        yield
    else:
        view.locator("input[name=step]").fill("0")
        yield
        window = view.locator("input[name=window_on]")
        window.click()
        yield
        view.locator("input[name=steps]").fill("2")
        yield


@pytest.mark.slow  # the built site in Chromium, chapter by chapter: left to `make test`
@pytest.mark.parametrize("edition", ["zh", "en"])
@pytest.mark.parametrize("widget", CHAPTERS)
def test_widgets_on_the_site_speak_the_edition_language(site, widget, edition):
    """Each view of the widget on its chapters' pages: what it shows and says (text, names, tooltips, the live
    summary, the tables' captions and headers) in the edition's language, as drawn and after its controls move.
    A screenshot of the first view goes to _build/screenshots/widget-<widget>-<edition>.png."""
    lang = "zh-CN" if edition == "zh" else "en"
    for page in CHAPTERS[widget]:
        v = Visit(site, f"{'zh/' if edition == 'zh' else ''}{page}.html")
        assert v.tab.evaluate("document.documentElement.lang") == lang
        views = v.tab.locator(f".ac-widget[data-ac-widget={widget}]")
        views.first.wait_for()
        if page == CHAPTERS[widget][0]:
            views.first.scroll_into_view_if_needed()
            views.first.screenshot(path=str(SCREENSHOTS / f"widget-{widget}-{edition}.png"))
        problems = []
        for n in range(views.count()):
            view = views.nth(n)
            assert view.get_attribute("lang") == lang
            view.locator("details").evaluate("d => { d.open = true; }")
            problems += wrong_script(view.evaluate(WIDGET_TEXT), lang)
            for _ in move_controls(view, widget):
                problems += wrong_script(view.evaluate(WIDGET_TEXT), lang)
        problems += v.close()
        assert not problems, f"{page}, {edition}:\n" + "\n".join(sorted(set(problems))[:30])


@pytest.mark.slow  # the built site in Chromium, chapter by chapter: left to `make test`
@pytest.mark.parametrize("edition", ["zh", "en"])
def test_decode_previous_step_is_disabled_at_the_first_step_on_the_site(site, edition):
    """At step 0 "previous step" cannot act: disabled (the attribute, and the state a screen reader says); one step
    forward, it is enabled again. Enter on it at step 0 does nothing (it cannot be focused)."""
    v = Visit(site, f"{'zh/' if edition == 'zh' else ''}notebooks/10_decoding.html")
    view = v.tab.locator(".ac-widget[data-ac-widget=decode-cache]").first
    view.wait_for()
    name = "上一步" if edition == "zh" else "previous step"
    view.locator("input[name=step]").fill("0")
    previous = view.locator("button[name=step][value=previous]")
    assert previous.is_disabled() and previous.get_attribute("disabled") is not None
    assert view.get_by_role("button", name=name, disabled=True).count() == 1
    before = view.get_attribute("data-state")
    previous.focus()
    v.tab.keyboard.press("Enter")
    assert view.get_attribute("data-state") == before
    view.locator("button[name=step][value=next]").click()
    assert json.loads(view.get_attribute("data-state"))["key_positions"] == [0, 1]
    assert previous.is_enabled() and view.get_by_role("button", name=name, disabled=False).count() == 1
    assert not v.close()
