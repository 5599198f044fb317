"""Pictures of attention weights and masks. Each function draws on ``ax`` (or a new figure) and returns the Axes.

Numbers or words written on a heatmap's cells (``annotate_cells``) take black or white, whichever contrasts more
with the colour of their own cell, and are never smaller than ``MIN_LABEL_POINTS``.
"""
from __future__ import annotations

import matplotlib.pyplot as plt
import torch
from matplotlib.colors import ListedColormap, to_rgb
from matplotlib.patches import Patch, Rectangle

from .checks import check_tensor
from .masks import additive_to_ignore, allow_to_ignore, ignore_to_allow, keep_to_ignore

MIN_LABEL_POINTS = 8  # smaller cell labels are hard to read on the site and in a notebook
MAY_ATTEND_COLOR = "#7fb3d5"
BLOCKED_COLOR = "#d9d9d9"
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


def plot_heatmap(values, row_labels=None, col_labels=None, ax=None, title=None, cmap="viridis", vmin=None, vmax=None,
                 labels=None, fmt: str = "{:.2f}", annotate: bool = True, colorbar: bool = True,
                 row_name: str = "row", col_name: str = "column"):
    """Any matrix (rows, columns) as a heatmap, each cell labelled (``annotate_cells``) in a colour it contrasts with.

    ``labels`` (a nested list of strings) replaces the values written on the cells, e.g. the words of sentences.
    """
    values = _as_matrix(values, "values", "Pick one matrix, e.g. values[0] for the first of a batch.")
    ax = ax if ax is not None else _new_axes(values.shape)
    image = ax.imshow(values.float().numpy(), cmap=cmap, vmin=vmin, vmax=vmax)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    _label_axes(ax, values.shape, row_labels, col_labels, row_name, col_name)
    if annotate:
        annotate_cells(ax, image, labels=labels, fmt=fmt)
    if title:
        ax.set_title(title)
    return ax


def plot_attention(weights, query_labels=None, key_labels=None, ax=None, title=None, annotate: bool = True):
    """Heatmap of attention weights (L, S): row i = query i, column j = key j, darker = more attention."""
    weights = _as_matrix(weights, "weights", "Pick one sentence (and head), e.g. weights[0] or weights[0, head].")
    return plot_heatmap(weights, query_labels, key_labels, ax=ax, title=title, cmap="Blues", vmin=0.0, vmax=1.0,
                        annotate=annotate, row_name="query", col_name="key")


def plot_mask(mask, ax=None, title=None, polarity: str = "ignore", query_labels=None, key_labels=None, legend=True):
    """Draw a mask (rows x keys): cells that may attend in colour, blocked cells gray and hatched.

    ``polarity`` says how to read ``mask``: "ignore" (bool, True = blocked), "allow" (bool, True = may attend),
    "keep" (0/1, 1 = keep) or "additive" (float, -inf = blocked). The legend names both colours.
    """
    if polarity not in _TO_ALLOW:
        raise ValueError(f"polarity must be one of {sorted(_TO_ALLOW)}, got {polarity!r}.")
    mask = _as_matrix(mask, "mask", "Pick one mask, e.g. mask[0] for the first of a batch.")
    allowed = _TO_ALLOW[polarity](mask)  # (rows, S): True = may attend
    ax = ax if ax is not None else _new_axes(mask.shape)
    ax.imshow(allowed.numpy(), cmap=ListedColormap([BLOCKED_COLOR, MAY_ATTEND_COLOR]), vmin=0, vmax=1)
    if allowed.numel() <= 2500:  # hatching each cell is slow for big masks; the colour alone still tells them apart
        for i, j in (~allowed).nonzero().tolist():
            ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, hatch="//", edgecolor="gray", linewidth=0))
        ax.set_xticks([j - 0.5 for j in range(1, mask.shape[1])], minor=True)
        ax.set_yticks([i - 0.5 for i in range(1, mask.shape[0])], minor=True)
        ax.grid(which="minor", color="white", linewidth=1.5)
        ax.tick_params(which="minor", length=0)
    _label_axes(ax, mask.shape, query_labels, key_labels, "query", "key")
    if legend:
        ax.legend(
            handles=[Patch(facecolor=MAY_ATTEND_COLOR, label="may attend"),
                     Patch(facecolor=BLOCKED_COLOR, hatch="//", edgecolor="gray", label="blocked (masked)")],
            loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0.0,
        )
    ax.set_title(title if title is not None else f"{polarity} mask")
    return ax
