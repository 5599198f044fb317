"""Pictures of attention weights and masks. Each function draws on ``ax`` (or a new figure) and returns the Axes.

Numbers or words written on a heatmap's cells (``annotate_cells``) take black or white, whichever contrasts more
with the colour of their own cell, and are never smaller than ``MIN_LABEL_POINTS``.

Colour never carries a distinction alone: blocked (masked) cells are hatched as well as grey (``plot_mask``, and
``plot_attention`` given ``masked``), and the series of a bar chart differ in hatching as well as in colour
(``plot_bars``), so that a reader who cannot tell the colours apart, or a print in black and white, still can.

``record_text_sizes`` (switched on by the book's build alone, see its docstring) writes into the PNG of every
figure a notebook shows the smallest text it was drawn with, so that the site's tests can tell whether that text is
legible at the size the page shows the picture; it also writes the strings drawn (``STRINGS_KEY``), and keeps the
figure itself, pickled, in the output's metadata (``FIGURE_KEY``), from which the Chinese edition draws the figure
again with its words translated (book/_ext/zh_figures.py) without running the chapter again.
"""
from __future__ import annotations

import base64
import json
import os
import pickle
import struct
import zlib
from contextlib import contextmanager

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path

from .checks import check_tensor
from .masks import additive_to_ignore, allow_to_ignore, ignore_to_allow, keep_to_ignore

MIN_LABEL_POINTS = 8  # smaller cell labels are hard to read on the site and in a notebook
MAY_ATTEND_COLOR = "#7fb3d5"
BLOCKED_COLOR = "#d9d9d9"
BLOCKED_HATCH = "//"  # blocked cells: hatched in BLOCKED_HATCH_COLOR, whatever their fill
BLOCKED_HATCH_COLOR = "gray"
SERIES_HATCHES = ("", "//", "..", "xx", "\\\\", "++")  # plot_bars: the n-th series' pattern, beside its colour
SERIES_EDGE_COLOR = "0.15"  # plot_bars: outlines and hatching
_TO_ALLOW = {
    "ignore": ignore_to_allow,
    "allow": lambda m: ~allow_to_ignore(m),
    "keep": lambda m: ~keep_to_ignore(m),
    "additive": lambda m: ~additive_to_ignore(m),
}


def _as_matrix(x, name: str, hint: str) -> torch.Tensor:
    check_tensor(x, name)
    if x.ndim != 2:
        raise ValueError(f"{name} must be 2-D (rows, columns), got shape {tuple(x.shape)}. {hint}")
    return x.detach().cpu()


def _new_axes(shape):
    rows, cols = shape
    return plt.subplots(figsize=(min(2.5 + 0.5 * cols, 12), min(1.2 + 0.45 * rows, 10)), layout="constrained")[1]


def _label_axes(ax, shape, row_labels, col_labels, row_name: str, col_name: str) -> None:
    for labels, size, which in ((row_labels, shape[0], "row"), (col_labels, shape[1], "column")):
        if labels is not None and len(labels) != size:
            raise ValueError(f"got {len(labels)} {which} labels for {size} {which}s.")
    ax.set_xticks(range(shape[1]), col_labels if col_labels is not None else range(shape[1]))
    ax.set_yticks(range(shape[0]), row_labels if row_labels is not None else range(shape[0]))
    if col_labels is not None:
        plt.setp(ax.get_xticklabels(), rotation=45, ha="right")
    ax.set_xlabel(col_name)
    ax.set_ylabel(row_name)


def relative_luminance(color) -> float:
    """WCAG relative luminance of a matplotlib colour: 0 for black, 1 for white."""
    def linear(c):
        return c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4

    r, g, b = (linear(c) for c in to_rgb(color))
    return 0.2126 * r + 0.7152 * g + 0.0722 * b


def contrast_ratio(color1, color2) -> float:
    """WCAG contrast ratio of two colours, from 1 (the same) to 21 (black on white); text wants 4.5 or more."""
    light, dark = sorted((relative_luminance(color1), relative_luminance(color2)), reverse=True)
    return (light + 0.05) / (dark + 0.05)


def text_color_on(background) -> str:
    """"black" or "white", whichever contrasts more with ``background`` (at least 4.58:1 for any colour)."""
    return "black" if contrast_ratio("black", background) >= contrast_ratio("white", background) else "white"


def annotate_cells(ax, image, labels=None, fmt: str = "{:.2f}", fontsize: float = MIN_LABEL_POINTS):
    """Write a label on every cell of the heatmap ``image`` (what ``ax.imshow`` returned) and return the texts.

    ``labels``: a nested list (rows, columns) of strings, or None for the cell values formatted with ``fmt``. Each
    label is black or white, whichever contrasts more with its own cell's colour, so it stays readable on every
    colour map (white on a yellow viridis cell would not). ``fontsize`` is raised to ``MIN_LABEL_POINTS`` if smaller:
    when the labels do not fit, give the figure more room or annotate fewer cells, never a smaller font.
    """
    values = image.get_array()
    rows, cols = values.shape[:2]
    if labels is not None and (len(labels) != rows or any(len(row) != cols for row in labels)):
        raise ValueError(f"labels must be a {rows} x {cols} nested list, one label per cell.")
    colors = image.to_rgba(values)  # the colour of each cell, through the image's colour map and limits
    texts = []
    for i in range(rows):
        for j in range(cols):
            label = labels[i][j] if labels is not None else fmt.format(values[i, j])
            texts.append(ax.text(j, i, label, ha="center", va="center", fontsize=max(fontsize, MIN_LABEL_POINTS),
                                 color=text_color_on(colors[i, j])))
    return texts


def blocked_runs(blocked: torch.Tensor) -> list[tuple[int, int, int]]:
    """The blocked cells of a 2-D bool tensor as runs along its rows: (row, first column, length), one per run."""
    runs = []
    for i, row in enumerate(blocked.tolist()):
        j = 0
        while j < len(row):
            if row[j]:
                start = j
                while j < len(row) and row[j]:
                    j += 1
                runs.append((i, start, j - start))
            else:
                j += 1
    return runs


def hatch_cells(ax, blocked) -> PathPatch | None:
    """Hatch the cells of an image drawn by ``ax.imshow`` where ``blocked`` (2-D bool, rows x columns) is True.

    One patch whose outline is every run of blocked cells along a row, so that even a big mask draws quickly (one
    hatched shape, not one per cell). The hatching lies over the cells' fill and under any label written on them.
    Returns the patch (None when nothing is blocked); its ``blocked_cells`` is the set of (row, column) it covers.
    """
    blocked = torch.as_tensor(blocked, dtype=torch.bool)
    runs = blocked_runs(blocked)
    if not runs:
        return None
    vertices, codes = [], []
    for i, j, n in runs:
        left, top = j - 0.5, i - 0.5
        vertices += [(left, top), (left + n, top), (left + n, top + 1), (left, top + 1), (left, top)]
        codes += [Path.MOVETO, Path.LINETO, Path.LINETO, Path.LINETO, Path.CLOSEPOLY]
    hatched = PathPatch(Path(vertices, codes), facecolor="none", edgecolor=BLOCKED_HATCH_COLOR, hatch=BLOCKED_HATCH,
                        linewidth=0, zorder=2)
    hatched.blocked_cells = {(i, j + k) for i, j, n in runs for k in range(n)}
    ax.add_patch(hatched)
    return hatched


def plot_heatmap(values, row_labels=None, col_labels=None, ax=None, title=None, cmap="viridis", vmin=None, vmax=None,
                 labels=None, fmt: str = "{:.2f}", annotate: bool = True, colorbar: bool = True,
                 row_name: str = "row", col_name: str = "column", masked=None):
    """Any matrix (rows, columns) as a heatmap, each cell labelled (``annotate_cells``) in a colour it contrasts with.

    ``labels`` (a nested list of strings) replaces the values written on the cells, e.g. the words of sentences.
    ``masked``: an ignore mask (bool, True = blocked) of the matrix's shape, or one that broadcasts to it (a key
    padding row (columns,), a column (rows, 1)); its blocked cells are hatched (``hatch_cells``).
    """
    values = _as_matrix(values, "values", "Pick one matrix, e.g. values[0] for the first of a batch.")
    blocked = None
    if masked is not None:
        check_tensor(masked, "masked")
        if masked.dtype != torch.bool:
            raise TypeError(f"masked must be a bool ignore mask (True = blocked), got dtype {masked.dtype}.")
        try:
            blocked = torch.broadcast_to(masked.detach().cpu(), values.shape)
        except RuntimeError:
            raise ValueError(f"masked, of shape {tuple(masked.shape)}, does not broadcast to the matrix's shape "
                             f"{tuple(values.shape)}.") from None
    ax = ax if ax is not None else _new_axes(values.shape)
    image = ax.imshow(values.float().numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    if blocked is not None:
        hatch_cells(ax, blocked)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    _label_axes(ax, values.shape, row_labels, col_labels, row_name, col_name)
    if annotate:
        annotate_cells(ax, image, labels=labels, fmt=fmt)
    if title:
        ax.set_title(title)
    return ax


def plot_attention(weights, query_labels=None, key_labels=None, ax=None, title=None, annotate: bool = True,
                   masked=None):
    """Heatmap of attention weights (L, S): row i = query i, column j = key j, darker = more attention.

    ``masked``: the ignore mask the weights were computed with ((L, S), or (S,) for a key padding mask): its
    blocked cells are hatched, so that they read as masked and not merely as small.
    """
    weights = _as_matrix(weights, "weights", "Pick one sentence (and head), e.g. weights[0] or weights[0, head].")
    return plot_heatmap(weights, query_labels, key_labels, ax=ax, title=title, cmap="Blues", vmin=0.0, vmax=1.0,
                        annotate=annotate, row_name="query", col_name="key", masked=masked)


def plot_mask(mask, ax=None, title=None, polarity: str = "ignore", query_labels=None, key_labels=None, legend=True):
    """Draw a mask (rows x keys): cells that may attend in colour, blocked cells gray and hatched (at any size).

    ``polarity`` says how to read ``mask``: "ignore" (bool, True = blocked), "allow" (bool, True = may attend),
    "keep" (0/1, 1 = keep) or "additive" (float, -inf = blocked). The legend names both colours.
    """
    if polarity not in _TO_ALLOW:
        raise ValueError(f"polarity must be one of {sorted(_TO_ALLOW)}, got {polarity!r}.")
    mask = _as_matrix(mask, "mask", "Pick one mask, e.g. mask[0] for the first of a batch.")
    allowed = _TO_ALLOW[polarity](mask)  # (rows, S): True = may attend
    ax = ax if ax is not None else _new_axes(mask.shape)
    ax.imshow(allowed.numpy(), cmap=ListedColormap([BLOCKED_COLOR, MAY_ATTEND_COLOR]), vmin=0, vmax=1)
    hatch_cells(ax, ~allowed)  # the colour alone does not tell them apart for every reader
    if allowed.numel() <= 2500:  # white lines between the cells, while the cells are big enough to show them
        ax.set_xticks([j - 0.5 for j in range(1, mask.shape[1])], minor=True)
        ax.set_yticks([i - 0.5 for i in range(1, mask.shape[0])], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
    _label_axes(ax, mask.shape, query_labels, key_labels, "query", "key")
    if legend:
        ax.legend(
            handles=[Patch(facecolor=MAY_ATTEND_COLOR, label="may attend"),
                     Patch(facecolor=BLOCKED_COLOR, hatch=BLOCKED_HATCH, edgecolor=BLOCKED_HATCH_COLOR,
                           label="blocked (masked)")],
            loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
        )
    ax.set_title(title if title is not None else f"{polarity} mask")
    return ax


def plot_bars(series: dict, categories, ax=None, title=None, horizontal: bool = False, legend=True, **legend_kw):
    """Grouped bars: one group per category, one bar per series in it, side by side in the order of ``series``.

    ``series`` maps each series' name to its values (one per category). The n-th series takes the n-th colour of
    the colour cycle and the n-th pattern of ``SERIES_HATCHES`` (none for the first), and the legend shows both, so
    the series stay apart without colour. ``horizontal``: bars along x, the categories down the y axis from the top.
    Returns the Axes; ``ax.containers`` holds one BarContainer per series.
    """
    categories = list(categories)
    if not series:
        raise ValueError("plot_bars needs at least one series.")
    if len(series) > len(SERIES_HATCHES):
        raise ValueError(f"plot_bars tells at most {len(SERIES_HATCHES)} series apart, got {len(series)}.")
    for name, values in series.items():
        if len(values) != len(categories):
            raise ValueError(f"series {name!r} has {len(values)} values for {len(categories)} categories.")
    if ax is None:
        ax = plt.subplots(figsize=(max(4.0, 1.0 + 0.45 * len(categories) * len(series)), 3.0),
                          layout="constrained")[1]
    width = 0.8 / len(series)
    draw = ax.barh if horizontal else ax.bar
    for n, (name, values) in enumerate(series.items()):
        positions = [k + (n - (len(series) - 1) / 2) * width for k in range(len(categories))]
        values = [float(v) for v in values]
        size = {"height": width} if horizontal else {"width": width}
        # the outline takes the hatching's colour: dark, to show on every colour of the cycle
        draw(positions, values, label=name, hatch=SERIES_HATCHES[n], edgecolor=SERIES_EDGE_COLOR, linewidth=0.5,
             **size)
    if horizontal:
        ax.set_yticks(range(len(categories)), categories)
        if not ax.yaxis_inverted():
            ax.invert_yaxis()
    else:
        ax.set_xticks(range(len(categories)), categories)
    if legend:
        ax.legend(**legend_kw)
    if title:
        ax.set_title(title)
    return ax


# ---------------------------------------------------------------------------------------------- text sizes in PNGs
TEXT_PT_KEY = "attention-course:smallest-text-pt"  # tEXt chunk: the smallest font size drawn, in points
DPI_KEY = "attention-course:dpi"  # tEXt chunk: the dots per inch it was drawn at (pixels per point = dpi / 72)
STRINGS_KEY = "attention-course:strings"  # tEXt chunk: the strings drawn, a JSON list (ASCII)
FIGURE_KEY = "attention-course/figure"  # the output's metadata (image/png): the figure, pickled (pickled_figure)
RECORD_ENV = "ATTENTION_COURSE_RECORD_TEXT_SIZES"  # "1": record_text_sizes() runs when this package is imported


@contextmanager
def drawn_texts():
    """Collect (font size in points, dpi, the string of the text artist drawn) of every non-empty text matplotlib's Agg
    renderer draws meanwhile: tick labels, titles, legends, annotations, mathtext; texts that are hidden or outside the
    drawn area never reach it. A text of several lines is drawn line by line: each line counts, with the whole
    string."""
    from matplotlib.backends.backend_agg import RendererAgg
    from matplotlib.text import Text

    found, draw_text, draw_artist, drawing = [], RendererAgg.draw_text, Text.draw, []

    def recording(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if str(s).strip():
            whole = drawing[-1].get_text() if drawing else str(s)
            found.append((prop.get_size_in_points(), self.dpi, whole))
        return draw_text(self, gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    def draw(self, renderer):
        drawing.append(self)
        try:
            return draw_artist(self, renderer)
        finally:
            drawing.pop()

    RendererAgg.draw_text, Text.draw = recording, draw
    try:
        yield found
    finally:
        RendererAgg.draw_text, Text.draw = draw_text, draw_artist


@contextmanager
def drawn_text_sizes():
    """Collect (font size in points, dpi) of every non-empty text matplotlib's Agg renderer draws meanwhile (see
    ``drawn_texts``)."""
    sizes = []
    with drawn_texts() as found:
        yield sizes
    sizes += [(points, dpi) for points, dpi, _ in found]


def png_text(png: bytes) -> dict:
    """The tEXt chunks of a PNG, as a dict (keyword -> text)."""
    if png[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("not a PNG: it does not start with the PNG signature.")
    found, at = {}, 8
    while at + 8 <= len(png):
        length, kind = struct.unpack(">I4s", png[at:at + 8])
        if kind == b"tEXt":
            key, _, value = png[at + 8:at + 8 + length].partition(b"\0")
            found[key.decode("latin-1")] = value.decode("latin-1")
        at += 12 + length
    return found


def with_png_text(png: bytes, items: dict) -> bytes:
    """``png`` with a tEXt chunk per item, placed right after the header chunk (IHDR); the image is unchanged."""
    png_text(png)  # checks the signature
    end_of_header = 8 + 12 + struct.unpack(">I", png[8:12])[0]
    chunks = b""
    for key, value in items.items():
        data = f"{key}\0{value}".encode("latin-1")
        chunks += struct.pack(">I", len(data)) + b"tEXt" + data + struct.pack(">I", zlib.crc32(b"tEXt" + data))
    return png[:end_of_header] + chunks + png[end_of_header:]


def text_chunks(found: list, dpi) -> dict:
    """The tEXt chunks of a picture whose texts ``drawn_texts`` found: its smallest text and dpi, its strings (JSON, in
    ASCII: a tEXt chunk is Latin-1), in the order first drawn."""
    points, dpi = min(found, key=lambda text: text[0] * text[1])[:2] if found else ("none", dpi)
    strings = list(dict.fromkeys(text for _, _, text in found))
    return {TEXT_PT_KEY: f"{points:g}" if found else points, DPI_KEY: f"{dpi:g}", STRINGS_KEY: json.dumps(strings)}


def pickled_figure(fig) -> str | None:
    """``fig`` pickled, compressed and in base64 (for a notebook's JSON), or None where it cannot be pickled (an artist
    holding a lambda, say); ``figure_from`` makes it a Figure again."""
    try:
        return base64.b64encode(zlib.compress(pickle.dumps(fig), 9)).decode("ascii")
    except Exception:  # noqa: BLE001 - pickle raises what the unpicklable object raises
        return None


def figure_from(record: str):
    """The Figure ``pickled_figure`` made ``record`` of. Only for records this project's own build wrote: unpickling
    runs whatever the record names."""
    return pickle.loads(zlib.decompress(base64.b64decode(record)))


def _recording_formatter(original):
    """A PNG formatter for Figures: ``original``'s picture, with its smallest text and its strings recorded in it
    (``text_chunks``), and the figure itself, pickled, in the output's metadata (``FIGURE_KEY``)."""
    def formatter(fig):
        with drawn_texts() as found:
            data = original(fig)
        if not data:
            return data
        data, metadata = data if isinstance(data, tuple) else (data, {})
        raw = base64.b64decode(data) if isinstance(data, str) else data
        raw = with_png_text(raw, text_chunks(found, fig.dpi))
        data = base64.b64encode(raw).decode("ascii") if isinstance(data, str) else raw
        record = pickled_figure(fig)
        if record is None:
            return (data, metadata) if metadata else data
        return data, {**(metadata or {}), FIGURE_KEY: record}

    formatter.records_text_sizes = True
    return formatter


def record_text_sizes(shell=None) -> bool:
    """In an IPython kernel: every matplotlib figure it shows as a PNG carries three tEXt chunks, ``TEXT_PT_KEY``
    (the smallest font size drawn in it, in points, or "none" when it has no text), ``DPI_KEY`` and ``STRINGS_KEY``
    (the strings drawn), and its output's metadata holds the figure, pickled (``FIGURE_KEY``). Returns whether it is
    on.

    The book's build switches it on (book/_ext/legibility.py sets $ATTENTION_COURSE_RECORD_TEXT_SIZES=1 for the
    kernels it starts; this package calls it when imported there); a learner's kernel is left as it is unless they
    call it. The pictures themselves are unchanged: the chunks are metadata that viewers ignore. The pickled figure
    stays in the build's execution cache: the notebooks a reader downloads are the sources, without outputs.
    """
    if shell is None:
        try:
            from IPython import get_ipython
        except ImportError:  # pragma: no cover - IPython comes with Jupyter
            return False
        shell = get_ipython()
    if shell is None or not hasattr(shell, "display_formatter"):
        return False
    from matplotlib.figure import Figure

    def wrap(*_):
        formatter = shell.display_formatter.formatters["image/png"]
        current = formatter.lookup_by_type(Figure) if Figure in formatter else None
        if current is not None and not getattr(current, "records_text_sizes", False):
            formatter.for_type(Figure, _recording_formatter(current))

    backend = getattr(plt, "_get_backend_mod", None)
    if backend is not None:
        backend()  # load the inline backend now: it installs its own formatter, which the wrapper then goes around
    wrap()
    if not getattr(shell, "_attention_course_records_text_sizes", False):
        # the inline backend installs its own formatter when the first figure loads it, in the middle of a cell, and
        # shows that cell's figures after it (post_execute): wrap again before each cell and after it
        shell.events.register("pre_run_cell", wrap)
        shell.events.register("post_execute", wrap)
        shell._attention_course_records_text_sizes = True
    return True


if os.environ.get(RECORD_ENV) == "1":
    record_text_sizes()
