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
        assert len(ax.patches) == int(ignore.sum())  # one hatched cell per blocked cell


def test_plot_mask_big_masks_skip_hatching_and_titles():
    ax = plot_mask(causal_mask(60), title="causal", query_labels=None)
    assert ax.get_title() == "causal" and len(ax.patches) == 0


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
