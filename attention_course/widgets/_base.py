"""What the widgets share: their front-end files and catalogs, their language, range checks with a learner-friendly
message, and ``update``.

The words a widget draws and says in the browser are in the page's language: English, or Chinese from
``locale/zh_CN.po`` (see ``_messages.py``). The messages Python raises (the TraitErrors below) stay English, as the
course's printed output does.
"""
import functools
import json
import os
from pathlib import Path

import anywidget
import traitlets

from . import _messages

HERE = Path(__file__).parent
CSS = (HERE / "widgets.css").read_text()
LANGUAGE_VARIABLE = "ATTENTION_COURSE_LANGUAGE"


def esm(name: str) -> str:
    """The ES module ``name`` beside this file, after the helpers of ``_common.js`` and the translations of their
    messages, CATALOGS (read once, at import)."""
    wanted = {singular for singular, _ in _messages.messages(("_common.js", name))}
    catalogs = {lang: {k: v for k, v in catalog.items() if k in wanted}
                for lang, catalog in _messages.catalogs().items()}
    return (f"const CATALOGS = {json.dumps(catalogs, ensure_ascii=False, sort_keys=True)};\n"
            + (HERE / "_common.js").read_text() + "\n" + (HERE / name).read_text())


def normalise_language(value) -> str:
    """"zh", "zh-CN", "zh_CN", "zh-Hans" -> "zh_CN"; "en", "en-US" -> "en"; "" or None -> "" (the page decides)."""
    text = str(value or "").strip()
    if not text:
        return ""
    for lang in _messages.LANGUAGES:
        if text.replace("-", "_").lower().split("_")[0] == lang.split("_")[0]:
            return lang
    raise traitlets.TraitError(f"language must be one of {', '.join(map(repr, _messages.LANGUAGES))} (or '' for the "
                               f"page's language), got {value!r}.")


@functools.lru_cache(maxsize=8)  # read again only when the file changed (its mtime_ns and size are in the key)
def _metadata_language(path: str, mtime_ns: int, size: int) -> str:
    try:
        metadata = json.loads(Path(path).read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError, AttributeError):
        return ""
    return normalise_language((metadata.get("attention_course") or {}).get("language") or "en")


def notebook_language() -> str:
    """The language of the notebook this kernel runs, from its metadata (``attention_course.language``; the Chinese
    notebooks carry "zh_CN", book/_ext/translate_notebooks.py), found by the path Jupyter Server gives its kernels in
    $JPY_SESSION_NAME (JupyterLab, Notebook 7); "en" for a notebook without it; "" where there is no notebook file
    to read (the site's build, Colab, a console): then the page's language decides."""
    path = os.environ.get("JPY_SESSION_NAME", "")
    if not path.endswith(".ipynb") or not os.path.isfile(path):
        return ""
    try:
        stat = os.stat(path)
        return _metadata_language(path, stat.st_mtime_ns, stat.st_size)
    except traitlets.TraitError:
        return ""


def chosen_language(language=None) -> str:
    """The widget's language: the argument, else $ATTENTION_COURSE_LANGUAGE, else the notebook's; "" if none says
    (the front end then follows the page: <html lang="zh-CN"> on the Chinese site; English elsewhere)."""
    for source in (language, os.environ.get(LANGUAGE_VARIABLE)):
        if source:
            return normalise_language(source)
    return notebook_language()


def check_range(value: int, name: str, low: int, high: int, hint: str = "") -> int:
    """``value`` if it is an int in [low, high], else a TraitError saying what was expected."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise traitlets.TraitError(f"{name} must be an integer from {low} to {high}, got {value!r}. {hint}".rstrip())
    return value


def call(settings: dict) -> str:
    """``w.update(a=1, b=[2, 3])``: the call a hint tells the learner to make."""
    return "w.update(" + ", ".join(f"{name}={value!r}" for name, value in settings.items()) + ")"


class CourseWidget(anywidget.AnyWidget):
    """An anywidget whose settings (the traits named in ``SETTINGS``) change together with :meth:`update`."""

    SETTINGS: tuple[str, ...] = ()

    # The language of the words drawn and said in the browser, fixed when the widget is drawn: "en", "zh_CN", or ""
    # to follow the page. Not a setting of the picture (``update`` leaves it alone).
    language = traitlets.Unicode("").tag(sync=True)

    def __init__(self, *args, language=None, **kwargs):
        super().__init__(*args, language=chosen_language(language), **kwargs)

    @traitlets.validate("language")
    def _valid_language(self, proposal):
        return normalise_language(proposal.value)

    def update(self, **settings) -> None:
        """Change several settings at once, e.g. ``w.update(batch_size=2, lengths=[4, 1])``; the picture redraws.

        The values are checked together, after all are in place: a combination that is valid only as a whole
        (a new batch size with its lengths, a new D with its h) is accepted, and a bad one raises a TraitError
        that names the valid choices and leaves every setting as it was. The changes reach the picture as one
        message, so it never draws a half-changed state.

        Use this, not ``w.set_state(...)``: ``set_state`` is how ipywidgets applies a message *from* the browser,
        so on ipywidgets 7 (Colab, classic Notebook) it changes the Python side without redrawing the picture.
        """
        unknown = [name for name in settings if name not in self.SETTINGS]
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.update() got {', '.join(map(repr, unknown))}, which it does not have; "
                f"its settings are {', '.join(self.SETTINGS)}."
            )
        # hold_trait_notifications: each trait's check runs at the end, on the new values together (and every value
        # is rolled back if one fails); hold_sync: what changed, observers' changes included, goes out in one message.
        with self.hold_sync(), self.hold_trait_notifications():
            for name, value in settings.items():
                setattr(self, name, value)
