"""MaskBroadcastWidget: a key padding mask (B, S), broadcast over queries and heads, combined with a causal mask.

It shows self-attention, so the keys are the batch's own tokens: S = L. The mask's rows are sentences, its columns
keys; the broadcast copies a sentence's row to every query row, giving (B, L, S).

Polarity everywhere: True = may NOT attend (the "ignore mask" of nn.MultiheadAttention). The picture is drawn by
``mask_broadcast.js`` from the traits; :attr:`MaskBroadcastWidget.state` computes the same numbers with torch.
"""
import torch
import traitlets

from ..functional import masked_softmax
from ..masks import causal_mask, padding_mask
from ._base import CSS, CourseWidget, call, check_range, esm

DEFAULT_LENGTHS = (5, 3, 2, 4)  # lengths of the sentences a new batch size adds
KEPT, PAD, FUTURE = "#eef5fc", "#6e7781", "#bc4c00"  # the cells' fills (FILLS in _common.js), for figure()


def demo_scores(batch_size: int, seq_len: int) -> torch.Tensor:
    """A fixed pattern of scores (B, L, L) in [-1.5, 1.5]; the ES module computes the very same numbers."""
    b = torch.arange(batch_size)[:, None, None]
    i = torch.arange(seq_len)[None, :, None]  # query
    j = torch.arange(seq_len)[None, None, :]  # key
    return ((3 * i + 5 * j + 2 * b) % 7 - 3).double() / 2  # (B, L, L)


def fit_lengths(lengths, batch_size: int, max_len: int) -> list[int]:
    """``lengths`` cut or extended to ``batch_size`` sentences, each clamped to 1..max_len."""
    lengths = list(lengths)[:batch_size] + list(DEFAULT_LENGTHS[len(lengths):batch_size])
    return [min(max(int(n), 1), max_len) for n in lengths]


class MaskBroadcastWidget(CourseWidget):
    """Pick a batch of sentence lengths, causal on/off and a head count; see every mask the attention layer builds.

    Settings (each a control in the picture): ``batch_size`` 1-4, ``max_len`` (L = S) 1-8, ``lengths`` one per
    sentence in 1..max_len, ``causal``, ``num_heads`` 1-4, ``example`` the sentence whose scores and weights are shown.

    ``show_heads=False`` (fixed when the widget is made) leaves the heads out: no heads control and no
    ``(B*h, L, S)`` panel, for a chapter that comes before heads; ``num_heads`` stays 1.

    Setting ``lengths`` to a wrong count or a length outside 1..max_len raises; changing ``batch_size`` or
    ``max_len`` alone keeps ``lengths`` and ``example`` valid (cut, extended or clamped). To change several at once,
    and to redraw on every Jupyter (ipywidgets 7 and 8): ``w.update(batch_size=2, lengths=[4, 1])``.
    """

    SETTINGS = ("batch_size", "max_len", "lengths", "causal", "num_heads", "example")

    _esm = esm("mask_broadcast.js")
    _css = CSS

    batch_size = traitlets.Int(3).tag(sync=True)
    max_len = traitlets.Int(5).tag(sync=True)
    lengths = traitlets.List(traitlets.Int(), default_value=[5, 3, 2]).tag(sync=True)
    causal = traitlets.Bool(False).tag(sync=True)
    num_heads = traitlets.Int(1).tag(sync=True)
    example = traitlets.Int(0).tag(sync=True)
    show_heads = traitlets.Bool(True).tag(sync=True)  # a display choice, not a setting: see the class docstring

    def __init__(self, batch_size=3, max_len=5, lengths=None, causal=False, num_heads=1, example=None,
                 show_heads=True, **kwargs):
        self.show_heads = show_heads  # first: the num_heads check reads it
        lengths = fit_lengths(DEFAULT_LENGTHS, batch_size, max_len) if lengths is None else list(lengths)
        if example is None:  # show the shortest sentence: the one whose padding there is most to see
            example = min(range(len(lengths)), key=lengths.__getitem__) if lengths else 0
        super().__init__(
            batch_size=batch_size, max_len=max_len, lengths=lengths, causal=causal, num_heads=num_heads,
            example=example, **kwargs,
        )

    @traitlets.validate("batch_size")
    def _valid_batch_size(self, proposal):
        return check_range(proposal.value, "batch_size", 1, 4)

    @traitlets.validate("max_len")
    def _valid_max_len(self, proposal):
        return check_range(proposal.value, "max_len", 1, 8)

    @traitlets.validate("num_heads")
    def _valid_num_heads(self, proposal):
        if not self.show_heads and proposal.value != 1:
            raise traitlets.TraitError(
                f"num_heads must be 1 in a widget made with show_heads=False (it leaves heads out), got "
                f"{proposal.value!r}. For heads: MaskBroadcastWidget(num_heads={proposal.value!r})."
            )
        return check_range(proposal.value, "num_heads", 1, 4)

    @traitlets.validate("example")
    def _valid_example(self, proposal):
        return check_range(proposal.value, "example", 0, self.batch_size - 1, "It indexes a sentence of the batch.")

    @traitlets.validate("lengths")
    def _valid_lengths(self, proposal):
        lengths = list(proposal.value)
        if len(lengths) != self.batch_size:
            hint = f" To change both at once: {call({'batch_size': len(lengths), 'lengths': lengths})}." \
                if 1 <= len(lengths) <= 4 else " A batch holds 1 to 4 sentences."
            raise traitlets.TraitError(
                f"lengths must hold one length per sentence (batch_size={self.batch_size}), got {len(lengths)}: "
                f"{lengths}.{hint}"
            )
        for b, n in enumerate(lengths):
            hint = "A sentence has at least one real token and at most max_len."
            if isinstance(n, int) and self.max_len < n <= 8:
                hint += f" To make the batch longer as well: {call({'max_len': max(lengths), 'lengths': lengths})}."
            check_range(n, f"lengths[{b}]", 1, self.max_len, hint)
        return lengths

    @traitlets.observe("batch_size", "max_len")
    def _keep_lengths_valid(self, change):
        # example first: a picture drawn between the two changes must not look up a sentence the batch lost
        with self.hold_sync():
            self.example = min(self.example, self.batch_size - 1)
            self.lengths = fit_lengths(self.lengths, self.batch_size, self.max_len)

    @property
    def state(self) -> dict:
        """Every mask and matrix of the picture, as nested lists (True = may NOT attend)."""
        B, L, h = self.batch_size, self.max_len, self.num_heads
        key_padding = padding_mask(self.lengths, L)  # (B, S), S = L: True at the pad keys
        broadcast = key_padding[:, None, :].expand(B, L, L)  # (B, 1, S) -> (B, L, S): one copy per query row
        future = causal_mask(L) if self.causal else torch.zeros(L, L, dtype=torch.bool)  # (L, L)
        combined = broadcast | future  # (B, L, L)
        per_head = combined.repeat_interleave(h, dim=0)  # (B*h, L, L), row b*h + head
        scores = demo_scores(B, L)  # (B, L, L)
        weights = masked_softmax(scores, combined)  # (B, L, L); masked cells 0
        return {
            "lengths": list(self.lengths),
            "key_padding_mask": key_padding.tolist(),
            "broadcast_mask": broadcast.tolist(),
            "causal_mask": future.tolist(),
            "combined_mask": combined.tolist(),
            "per_head_mask": per_head.tolist(),
            "scores": scores.tolist(),
            "weights": weights.tolist(),
            "query_is_pad": key_padding.tolist(),  # their outputs exist but are ignored downstream
        }

    def figure(self):
        """A static matplotlib picture: the key padding mask, the combined mask and the example's weights."""
        import matplotlib.pyplot as plt
        import numpy as np
        from matplotlib.colors import ListedColormap

        state, b, L = self.state, self.example, self.max_len
        cells = ListedColormap([KEPT, PAD, FUTURE])  # 0 kept, 1 pad key, 2 future key: the widget's colours
        pad, future = np.array(state["key_padding_mask"], dtype=bool), np.array(state["causal_mask"], dtype=bool)
        kinds = [np.where(pad, 1, 0), np.where(pad[b][None, :], 1, np.where(future, 2, 0))]  # panels 1 and 2
        # Two panels above, the weights below: 6.8 in at 100 dpi fits a 688 px page column unscaled, so the
        # smallest text (8 pt) shows at 11 px.
        fig, grid = plt.subplots(2, 2, figsize=(6.8, 6.6))
        grid[1, 1].remove()
        axes = [grid[0, 0], grid[0, 1], grid[1, 0]]
        panels = [
            (state["key_padding_mask"], f"key_padding_mask\n(B, S) = ({self.batch_size}, {L})", "sentence"),
            (state["combined_mask"][b], f"combined mask (L, S),\nsentence {b}", "query (L)"),
            (state["combined_mask"][b], f"weights, sentence {b}\n(grey rows: pad queries)", "query (L)"),
        ]
        for panel, (ax, (mask, title, rows)) in enumerate(zip(axes, panels)):
            if panel < 2:
                ax.imshow(kinds[panel], cmap=cells, vmin=0, vmax=2)
            else:
                ax.imshow(np.ma.masked_array(state["weights"][b], mask), cmap="Blues", vmin=0, vmax=1)
                ax.imshow(np.ma.masked_array(kinds[1], ~np.array(mask)), cmap=cells, vmin=0, vmax=2)
            for i, row in enumerate(mask):
                for j, blocked in enumerate(row):
                    text = "×" if blocked else ("" if panel < 2 else f"{state['weights'][b][i][j]:.2f}")
                    dark = blocked or (panel == 2 and state["weights"][b][i][j] > 0.5)
                    ax.text(j, i, text, ha="center", va="center", fontsize=8 if panel == 2 else 11,
                            color="white" if dark else "black")
                if panel == 2 and state["query_is_pad"][b][i]:
                    ax.axhspan(i - 0.5, i + 0.5, color="0.55", alpha=0.3)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("key (S)", fontsize=9)
            ax.set_ylabel(rows, fontsize=9)
            ax.set(xticks=range(L), yticks=range(len(mask)))
            ax.tick_params(labelsize=9)
        fig.text(0.55, 0.25, "True (×) = may NOT attend,\nthe nn.MultiheadAttention\nconvention", fontsize=10,
                 va="center")
        fig.tight_layout()
        return fig
