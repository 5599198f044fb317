"""The two pictures: attention weights and masks. They return Axes and never call plt.show()."""
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

from attention_course import causal_mask, ignore_to_additive, ignore_to_allow, ignore_to_keep, plot_attention, plot_mask  # noqa: E402


@pytest.fixture(autouse=True)
def close_figures():
    yield
    plt.close("all")


def blocked_cells(ignore) -> set:
    return {tuple(ij) for ij in ignore.nonzero().tolist()}


def hatched_cells(ax) -> set:
    """The (row, column) cells that the Axes' hatched patches cover (plots.hatch_cells)."""
    cells = set()
    for patch in ax.patches:
        assert patch.get_hatch(), f"an unhatched patch {patch} on the picture"
        cells |= patch.blocked_cells
    return cells


def test_plot_attention_draws_labels_and_numbers():
    weights = torch.softmax(torch.randn(3, 4), -1)
    ax = plot_attention(weights, ["the", "cat", "sat"], ["a", "b", "c", "d"], title="weights")
    assert ax.get_title() == "weights"
    assert [t.get_text() for t in ax.get_yticklabels()] == ["the", "cat", "sat"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["a", "b", "c", "d"]
    assert len(ax.texts) == 12 and ax.texts[0].get_text() == f"{weights[0, 0]:.2f}"
    assert ax.get_xlabel() == "key" and ax.get_ylabel() == "query"


def test_plot_attention_on_given_axes_without_numbers():
    fig, ax = plt.subplots()
    weights = torch.softmax(torch.randn(2, 5, dtype=torch.float64), -1).requires_grad_()
    assert plot_attention(weights, ax=ax, annotate=False) is ax
    assert len(ax.texts) == 0


def test_plot_attention_rejects_bad_input():
    with pytest.raises(ValueError, match=r"weights must be 2-D.*weights\[0, head\]"):
        plot_attention(torch.rand(2, 3, 4))
    with pytest.raises(ValueError, match="got 2 row labels for 3 rows"):
        plot_attention(torch.rand(3, 4), query_labels=["a", "b"])
    with pytest.raises(ValueError, match="got 1 column labels for 4 columns"):
        plot_attention(torch.rand(3, 4), key_labels=["a"])
    with pytest.raises(TypeError, match="torch.Tensor"):
        plot_attention([[0.5, 0.5]])


def test_plot_mask_reads_every_polarity_the_same():
    ignore = causal_mask(4)
    expected_allowed = ignore_to_allow(ignore).numpy()
    for mask, polarity in ((ignore, "ignore"), (ignore_to_allow(ignore), "allow"),
                           (ignore_to_keep(ignore), "keep"), (ignore_to_additive(ignore), "additive")):
        ax = plot_mask(mask, polarity=polarity)
        assert (ax.images[0].get_array() == expected_allowed).all()
        assert [t.get_text() for t in ax.get_legend().get_texts()] == ["may attend", "blocked (masked)"]
        assert ax.get_title() == f"{polarity} mask"
        assert hatched_cells(ax) == blocked_cells(ignore)  # every blocked cell hatched, and only those


def test_plot_mask_hatches_big_masks_too_and_takes_a_title():
    mask = causal_mask(60)
    ax = plot_mask(mask, title="causal", query_labels=None)
    assert ax.get_title() == "causal"
    assert hatched_cells(ax) == blocked_cells(mask) and len(ax.patches) == 1  # one hatched shape for 1770 cells


def test_plot_mask_rejects_bad_input():
    with pytest.raises(ValueError, match="polarity must be one of"):
        plot_mask(causal_mask(3), polarity="keep-out")
    with pytest.raises(TypeError, match="expects a bool mask"):
        plot_mask(torch.zeros(3, 3), polarity="ignore")
    with pytest.raises(ValueError, match=r"mask must be 2-D.*mask\[0\]"):
        plot_mask(torch.zeros(2, 3, 3, dtype=torch.bool))


def test_plot_mask_can_leave_out_the_legend():
    import torch
    from attention_course.plots import plot_mask
    assert plot_mask(torch.eye(3, dtype=torch.bool)).get_legend() is not None
    assert plot_mask(torch.eye(3, dtype=torch.bool), legend=False).get_legend() is None


# ------------------------------------------------------------------------------------ readable cell labels
from attention_course.plots import (  # noqa: E402
    MIN_LABEL_POINTS, annotate_cells, contrast_ratio, plot_heatmap, relative_luminance, text_color_on)


def cell_labels(ax):
    """(text artist, colour of the cell under it) for every label written on the Axes' heatmap."""
    image = ax.images[0]
    colors = image.to_rgba(image.get_array())
    pairs = []
    for text in ax.texts:
        x, y = text.get_position()
        pairs.append((text, colors[int(round(y)), int(round(x))]))
    return pairs


def assert_labels_readable(ax):
    """Every label contrasts with its own cell (WCAG 4.5:1), is at least 8 pt, and fits inside its cell."""
    fig = ax.figure
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    (x0, y0), (x1, y1) = ax.transData.transform([(0, 0), (1, 1)])
    cell_width = abs(x1 - x0)
    pairs = cell_labels(ax)
    assert pairs, "no cell labels drawn"
    for text, cell in pairs:
        where = f"label {text.get_text()!r} at {text.get_position()}"
        ratio = contrast_ratio(text.get_color(), cell)
        assert ratio >= 4.5, f"{where}: {text.get_color()} on {cell} has contrast {ratio:.2f} < 4.5"
        assert text.get_fontsize() >= MIN_LABEL_POINTS, f"{where}: {text.get_fontsize()} pt"
        width = text.get_window_extent(renderer).width
        assert width <= cell_width, f"{where}: {width:.0f} px wide in a {cell_width:.0f} px cell"


def test_luminance_and_contrast_follow_wcag():
    assert relative_luminance("black") == 0 and relative_luminance("white") == pytest.approx(1)
    assert contrast_ratio("black", "white") == pytest.approx(21)
    assert contrast_ratio("#777777", "#777777") == pytest.approx(1)
    assert text_color_on("yellow") == "black" and text_color_on("#fde725") == "black"  # viridis' top
    assert text_color_on("navy") == "white" and text_color_on("#440154") == "white"  # viridis' bottom


@pytest.mark.parametrize("cmap", ["viridis", "Blues", "RdBu", "magma", "cividis"])
def test_every_label_contrasts_with_its_own_cell(cmap):
    values = torch.linspace(-3, 5, 20).reshape(4, 5)  # the whole colour map, light and dark ends
    ax = plot_heatmap(values, cmap=cmap, fmt="{:.1f}")
    assert len(ax.texts) == 20
    assert {t.get_color() for t in ax.texts} == {"black", "white"}  # both are needed on these maps
    assert_labels_readable(ax)


def test_attention_labels_are_readable_in_a_row_of_panels():
    """As the chapters draw them: three sentences side by side, 5 tokens each, in a 12-inch figure."""
    fig, axes = plt.subplots(1, 3, figsize=(12, 3.4), layout="constrained")
    tokens = ["the", "cat", "sat", "on", "<pad>"]
    for ax in axes:
        plot_attention(torch.softmax(3 * torch.randn(5, 5), -1), tokens, tokens, ax=ax)
        assert_labels_readable(ax)


def test_word_labels_with_a_small_font_asked_for_are_raised_to_the_minimum():
    weights = torch.softmax(4 * torch.randn(3, 6), -1)
    words = [["good", "film", "bad", "plot", "ok", "end"]] * 3
    fig, ax = plt.subplots(figsize=(6, 2.2), layout="constrained")
    image = ax.imshow(weights.numpy(), cmap="Blues", vmin=0, vmax=1)
    texts = annotate_cells(ax, image, labels=words, fontsize=6)
    assert [t.get_text() for t in texts[:6]] == words[0]
    assert all(t.get_fontsize() == MIN_LABEL_POINTS for t in texts)
    assert_labels_readable(ax)


def test_annotate_cells_checks_the_labels_shape():
    fig, ax = plt.subplots()
    image = ax.imshow(torch.rand(2, 3).numpy())
    with pytest.raises(ValueError, match="2 x 3 nested list"):
        annotate_cells(ax, image, labels=[["a", "b", "c"]])


def test_the_contrast_check_catches_white_on_yellow():
    """The check above fails on the old way: white text on every cell of a viridis map."""
    fig, ax = plt.subplots()
    ax.imshow(torch.arange(4.0).reshape(2, 2).numpy(), cmap="viridis")
    for i in range(2):
        for j in range(2):
            ax.text(j, i, "0.0", color="white", fontsize=8, ha="center", va="center")
    with pytest.raises(AssertionError, match="contrast"):
        assert_labels_readable(ax)


# ----------------------------------------------------------------------------- not by colour alone
from attention_course.plots import SERIES_HATCHES, hatch_cells, plot_bars  # noqa: E402


def cell_luminance_spread(ax, cells, margin=0.2):
    """For each (row, column) cell of the Axes' image: max - min luminance of the rendered pixels inside it (a band
    ``margin`` of a cell wide left out along its edges, where grid lines lie). Greyscale, so that a difference that
    only a colour made would not count."""
    import numpy as np

    fig = ax.figure
    fig.canvas.draw()
    pixels = np.asarray(fig.canvas.buffer_rgba())[..., :3].astype(float) / 255
    luminance = pixels @ np.array([0.2126, 0.7152, 0.0722])
    height = pixels.shape[0]
    spread = {}
    for i, j in cells:
        (x0, y0), (x1, y1) = ax.transData.transform([(j - 0.5 + margin, i - 0.5 + margin),
                                                     (j + 0.5 - margin, i + 0.5 - margin)])
        rows = slice(int(height - max(y0, y1)), int(height - min(y0, y1)))  # the canvas' y grows upwards
        block = luminance[rows, int(min(x0, x1)):int(max(x0, x1))]
        spread[(i, j)] = float(block.max() - block.min())
    return spread


def test_masked_cells_are_hatched_in_the_picture_itself():
    """Rendered, in greyscale: every blocked cell of plot_mask shows lines across it, every allowed cell is flat."""
    mask = causal_mask(4) | torch.tensor([False, False, False, True])
    fig, ax = plt.subplots(figsize=(4, 4), dpi=100)
    plot_mask(mask, ax=ax, legend=False)
    cells = [(i, j) for i in range(4) for j in range(4)]
    spread = cell_luminance_spread(ax, cells)
    for cell in cells:
        if mask[cell]:
            assert spread[cell] > 0.2, f"blocked cell {cell} is flat: no hatching drawn"
        else:
            assert spread[cell] < 0.02, f"allowed cell {cell} is not flat ({spread[cell]:.2f})"


def test_the_picture_check_fails_on_a_mask_told_by_colour_alone():
    """The check above catches the mask drawn as two colours only (blocked grey, allowed blue)."""
    from matplotlib.colors import ListedColormap

    mask = causal_mask(4)
    fig, ax = plt.subplots(figsize=(4, 4), dpi=100)
    ax.imshow((~mask).numpy(), cmap=ListedColormap(["#d9d9d9", "#7fb3d5"]))
    spread = cell_luminance_spread(ax, [(0, 3)])
    assert spread[(0, 3)] < 0.02  # flat: only its colour tells it apart


def test_attention_weights_hatch_their_masked_cells():
    pad = torch.tensor([False, False, True, True])  # a key padding row (S,): broadcast to every query
    weights = torch.softmax(torch.randn(3, 4).masked_fill(pad, float("-inf")), -1)
    ax = plot_attention(weights, masked=pad)
    assert hatched_cells(ax) == {(i, j) for i in range(3) for j in (2, 3)}
    assert len(ax.texts) == 12  # the numbers are still written, hatched cells included
    assert_labels_readable(ax)
    causal = causal_mask(3)
    ax = plot_attention(torch.softmax(torch.randn(3, 3).masked_fill(causal, float("-inf")), -1), masked=causal)
    assert hatched_cells(ax) == blocked_cells(causal)
    assert len(plot_attention(weights).patches) == 0  # no mask, no hatching
    assert len(plot_attention(weights, masked=torch.zeros(4, dtype=torch.bool)).patches) == 0
    with pytest.raises(TypeError, match="bool ignore mask"):
        plot_attention(weights, masked=pad.float())
    with pytest.raises(ValueError, match=r"of shape \(3,\), does not broadcast to the matrix's shape \(3, 4\)"):
        plot_attention(weights, masked=torch.tensor([True, False, False]))


def test_hatch_cells_covers_runs_along_the_rows():
    fig, ax = plt.subplots()
    blocked = torch.tensor([[True, True, False, True], [False, False, False, False], [True, True, True, True]])
    ax.imshow(blocked.numpy())
    patch = hatch_cells(ax, blocked)
    assert patch.blocked_cells == blocked_cells(blocked) and patch.get_hatch() == "//"
    assert len(patch.get_path().vertices) == 3 * 5  # three runs, one rectangle each
    assert hatch_cells(ax, torch.zeros(2, 2, dtype=torch.bool)) is None


def test_bar_series_differ_in_pattern_as_well_as_colour():
    series = {"alone": [0.2, 0.3, 0.5, 0.0], "padded, no mask": [0.1, 0.3, 0.4, 0.2],
              "padded, masked": [0.2, 0.3, 0.5, 0.0]}
    ax = plot_bars(series, ["who", "is", "he", "<pad>"], title="weights")
    assert len(ax.containers) == 3 and ax.get_title() == "weights"
    hatches = [{bar.get_hatch() or "" for bar in container} for container in ax.containers]
    assert hatches == [{SERIES_HATCHES[0]}, {SERIES_HATCHES[1]}, {SERIES_HATCHES[2]}]
    assert len({h for (h,) in hatches}) == 3  # three different patterns
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == list(series)
    assert [(h.get_hatch() or "") for h in legend.legend_handles] == list(SERIES_HATCHES[:3])  # the key shows them
    bars = ax.containers[1]  # side by side: the second series in the middle of each group
    assert [round(b.get_x() + b.get_width() / 2, 6) for b in bars] == [0, 1, 2, 3]
    assert [b.get_height() for b in bars] == pytest.approx(series["padded, no mask"])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["who", "is", "he", "<pad>"]


def test_horizontal_bars_read_from_the_top():
    ax = plot_bars({"none": [1.0, 2.0], "causal": [1.5, 2.5]}, ["SDPA", "tiled"], horizontal=True, legend=False)
    assert ax.yaxis_inverted() and ax.get_legend() is None
    assert [t.get_text() for t in ax.get_yticklabels()] == ["SDPA", "tiled"]
    assert [b.get_width() for b in ax.containers[1]] == [1.5, 2.5]
    assert ax.containers[1][0].get_hatch() == SERIES_HATCHES[1]


def test_plot_bars_rejects_bad_input():
    with pytest.raises(ValueError, match="series 'b' has 1 values for 2 categories"):
        plot_bars({"a": [1, 2], "b": [1]}, ["x", "y"])
    with pytest.raises(ValueError, match="at least one series"):
        plot_bars({}, ["x"])
    with pytest.raises(ValueError, match="at most"):
        plot_bars({str(n): [1] for n in range(len(SERIES_HATCHES) + 1)}, ["x"])
