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
