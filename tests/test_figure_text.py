"""Figures record their smallest text (attention_course.plots.record_text_sizes), for the site's legibility test."""
import base64
import json
import importlib
from functools import partial

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
from IPython.core.formatters import PNGFormatter  # noqa: E402
from IPython.core.pylabtools import print_figure  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attention_course import plots  # noqa: E402
from attention_course.plots import (  # noqa: E402
    DPI_KEY, TEXT_PT_KEY, drawn_text_sizes, png_text, record_text_sizes, with_png_text)


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def figure(*sizes, dpi=100):
    fig, ax = plt.subplots(figsize=(3, 2), dpi=dpi)
    ax.set_axis_off()
    for k, size in enumerate(sizes):
        ax.text(0.1, 0.2 * k, f"text {k}", fontsize=size)
    return fig


class FakeShell:
    """What record_text_sizes uses of an IPython shell: its PNG formatter and its events."""

    def __init__(self):
        self.display_formatter = type("Formatters", (), {"formatters": {"image/png": PNGFormatter()}})()
        self.callbacks = []
        self.events = type("Events", (), {"register": lambda _, event, f: self.callbacks.append((event, f))})()
        self.inline()

    def inline(self):
        """As IPython's inline backend does when it loads: its own formatter for Figures."""
        self.display_formatter.formatters["image/png"].for_type(Figure, partial(print_figure, fmt="png", base64=True))

    def show(self, fig) -> dict:
        data = self.display_formatter.formatters["image/png"](fig)
        data = data[0] if isinstance(data, tuple) else data  # (picture, metadata): the recording formatter's
        return png_text(base64.b64decode(data))


def test_text_chunks_round_trip_and_leave_the_picture_alone():
    fig = figure(10)
    png = print_figure(fig, fmt="png")
    marked = with_png_text(png, {"a": "1", "b": "two"})
    assert png_text(marked)["a"] == "1" and png_text(marked)["b"] == "two"
    assert "a" not in png_text(png)
    from PIL import Image
    import io
    assert Image.open(io.BytesIO(marked)).tobytes() == Image.open(io.BytesIO(png)).tobytes()
    with pytest.raises(ValueError, match="not a PNG"):
        png_text(b"GIF89a")


def test_the_sizes_drawn_are_collected_hidden_and_empty_texts_not():
    fig = figure(12, 7)
    fig.axes[0].text(0, 0, "hidden", fontsize=3, visible=False)
    fig.axes[0].text(0, 0, "  ", fontsize=2)
    with drawn_text_sizes() as sizes:
        print_figure(fig, fmt="png", dpi=150)
    assert min(sizes) == (7, 150) and {s for s, _ in sizes} == {12, 7}
    with drawn_text_sizes() as after:
        pass
    assert after == []  # the renderer is restored


def test_a_shown_figure_carries_its_smallest_text_and_dpi():
    shell = FakeShell()
    assert record_text_sizes(shell) is True
    record = shell.show(figure(11, 6.5, 9))
    assert record[TEXT_PT_KEY] == "6.5" and record[DPI_KEY] == "100"
    assert shell.show(figure())[TEXT_PT_KEY] == "none"  # no text at all
    assert shell.display_formatter.formatters["image/png"](plt.figure()) is None  # nothing drawn, nothing shown
    bare = PNGFormatter()  # bytes instead of base64 text
    bare.for_type(Figure, plots._recording_formatter(partial(print_figure, fmt="png")))
    assert png_text(bare(figure(8))[0])[TEXT_PT_KEY] == "8"  # (picture, metadata with the pickled figure)


def test_the_wrapper_survives_the_inline_backend_loading_later():
    shell = FakeShell()
    record_text_sizes(shell)
    record_text_sizes(shell)  # a second call registers nothing more
    assert sorted(event for event, _ in shell.callbacks) == ["post_execute", "pre_run_cell"]
    shell.inline()  # the backend replaces the formatter mid-cell
    assert TEXT_PT_KEY not in shell.show(figure(10))
    for _, callback in shell.callbacks:
        callback()
    assert shell.show(figure(10))[TEXT_PT_KEY] == "10"


def test_off_outside_ipython_and_on_only_when_asked(monkeypatch):
    assert record_text_sizes(object()) is False  # not a shell
    import IPython
    monkeypatch.setattr(IPython, "get_ipython", lambda: None)
    assert record_text_sizes() is False  # a plain Python process
    shell = FakeShell()
    monkeypatch.setattr(IPython, "get_ipython", lambda: shell)
    importlib.reload(plots)  # imported without the variable: nothing happens
    assert not [c for _, c in shell.callbacks if "record_text_sizes" in c.__qualname__]
    assert TEXT_PT_KEY not in shell.show(figure(10))
    monkeypatch.setenv(plots.RECORD_ENV, "1")
    try:
        importlib.reload(plots)  # imported with it (the book's build): on
        ours = [event for event, callback in shell.callbacks if "record_text_sizes" in callback.__qualname__]
        assert ours == ["pre_run_cell", "post_execute"]  # (pyplot may add its own, when first imported here)
        assert shell.show(figure(10))[TEXT_PT_KEY] == "10"
    finally:
        monkeypatch.delenv(plots.RECORD_ENV)
        importlib.reload(plots)


def test_the_strings_drawn_are_recorded_whole_and_the_figure_kept():
    shell = FakeShell()
    record_text_sizes(shell)
    fig = figure(10)
    fig.axes[0].set_title("two\nlines")
    fig.axes[0].text(0, 0, "hidden", visible=False)
    data, metadata = shell.display_formatter.formatters["image/png"](fig)
    drawn = json.loads(png_text(base64.b64decode(data))[plots.STRINGS_KEY])
    assert drawn == ["text 0", "two\nlines"]  # a title of two lines drawn line by line, recorded once, whole
    again = plots.figure_from(metadata[plots.FIGURE_KEY])
    assert again.axes[0].get_title() == "two\nlines" and [t.get_text() for t in again.axes[0].texts] == [
        "text 0", "hidden"]
