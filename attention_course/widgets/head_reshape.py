"""HeadReshapeWidget: where every number of a (B, L, D) tensor lands when it is split into h heads.

The right way: reshape to (B, L, h, d), transpose to (B, h, L, d), flatten to (B*h, L, d). The wrong way, a direct
reshape (B, L, D) -> (B*h, L, d), keeps the row-major order, so a "head" row gets the features of another token or
another head. The picture is drawn by ``head_reshape.js``; :attr:`HeadReshapeWidget.state` computes the same
tensors with torch.
"""
import torch
import traitlets

from ..heads import head_dim
from ._base import CSS, CourseWidget, call, check_range, esm


def nearest_divisor(D: int, h: int) -> int:
    """The head count nearest ``h`` that divides ``D`` (the smaller on a tie), as the D slider picks it."""
    return min((k for k in range(1, D + 1) if D % k == 0), key=lambda k: (abs(k - h), k))


class HeadReshapeWidget(CourseWidget):
    """Pick B (1-3), L (1-6), D (2-12) and h (a divisor of D); see each element of arange(1, B*L*D+1) move.

    Settings: ``batch_size``, ``seq_len``, ``embed_dim``, ``num_heads``. ``num_heads`` must divide ``embed_dim``: a
    setting that breaks this raises with the valid choices. To change both at once, and to redraw on every Jupyter
    (ipywidgets 7 and 8): ``w.update(embed_dim=6, num_heads=3)``.
    """

    SETTINGS = ("batch_size", "seq_len", "embed_dim", "num_heads")

    _esm = esm("head_reshape.js")
    _css = CSS

    batch_size = traitlets.Int(2).tag(sync=True)
    seq_len = traitlets.Int(4).tag(sync=True)
    embed_dim = traitlets.Int(8).tag(sync=True)
    num_heads = traitlets.Int(2).tag(sync=True)

    def __init__(self, batch_size=2, seq_len=4, embed_dim=8, num_heads=2, **kwargs):
        super().__init__(batch_size=batch_size, seq_len=seq_len, embed_dim=embed_dim, num_heads=num_heads, **kwargs)

    @traitlets.validate("batch_size")
    def _valid_batch_size(self, proposal):
        return check_range(proposal.value, "batch_size", 1, 3)

    @traitlets.validate("seq_len")
    def _valid_seq_len(self, proposal):
        return check_range(proposal.value, "seq_len", 1, 6)

    @traitlets.validate("embed_dim", "num_heads")
    def _valid_heads(self, proposal):
        name, value = proposal.trait.name, proposal.value
        if name == "embed_dim":
            check_range(value, "embed_dim", 2, 12)
        D = value if name == "embed_dim" else self.embed_dim
        h = value if name == "num_heads" else self.num_heads
        check_range(h, "num_heads", 1, D, f"It must divide embed_dim {D}: choose num_heads among "
                    f"{', '.join(str(k) for k in range(1, D + 1) if D % k == 0)}.")
        try:
            head_dim(D, h)
        except ValueError as error:
            heads = nearest_divisor(D, h)
            raise traitlets.TraitError(
                f"{error} To change both at once: {call({'embed_dim': D, 'num_heads': heads})}."
            ) from None
        return value

    @property
    def valid_num_heads(self) -> list[int]:
        """The head counts that divide ``embed_dim``: the choices the picture offers."""
        return [h for h in range(1, self.embed_dim + 1) if self.embed_dim % h == 0]

    @property
    def state(self) -> dict:
        """The integer tensors of every step (nested lists) and the rows the wrong reshape gets wrong."""
        B, L, D, h = self.batch_size, self.seq_len, self.embed_dim, self.num_heads
        d = D // h
        x = torch.arange(1, B * L * D + 1).reshape(B, L, D)  # (B, L, D)
        split = x.reshape(B, L, h, d)  # (B, L, h, d): the last axis cut into h groups of d
        transposed = split.transpose(1, 2)  # (B, h, L, d): a view, heads before tokens
        flat = transposed.reshape(B * h, L, d)  # (B*h, L, d): row b*h + head (copies: not contiguous)
        wrong = x.reshape(B * h, L, d)  # (B*h, L, d): row-major order kept, tokens mixed
        mixed = (wrong != flat).any(-1)  # (B*h, L)
        return {
            "shape": {"B": B, "L": L, "D": D, "h": h, "d": d},
            "x": x.tolist(),
            "split": split.tolist(),
            "transposed": transposed.tolist(),
            "flat": flat.tolist(),
            "wrong": wrong.tolist(),
            "mixed_rows": mixed.nonzero().tolist(),  # [[row of B*h, query position], ...]
        }

    def figure(self):
        """A static matplotlib picture: the right (B*h, L, d) layout above the wrong one, coloured as in the widget."""
        import colorsys

        import matplotlib.pyplot as plt

        state = self.state
        B, L, D, h, d = (state["shape"][k] for k in "BLDhd")

        def colour(v):  # hue = token, lightness = head, as in head_reshape.js
            token, head = (v - 1) // D, (v - 1) % D // d
            light = 0.78 if h == 1 else 0.88 - 0.30 * head / (h - 1)
            return colorsys.hls_to_rgb((token * 137.5 + 15) % 360 / 360, light, 0.62)

        fig, axes = plt.subplots(2, B * h, figsize=(1 + 0.5 * d * B * h, 1.4 + 0.8 * L), squeeze=False)
        mixed = {tuple(r) for r in state["mixed_rows"]}
        for row, (name, tensor) in enumerate([("right", state["flat"]), ("wrong", state["wrong"])]):
            for n, ax in enumerate(axes[row]):
                ax.imshow([[colour(v) for v in values] for values in tensor[n]])
                for i, values in enumerate(tensor[n]):
                    for j, v in enumerate(values):
                        ax.text(j, i, v, ha="center", va="center", fontsize=8)
                    if row == 1 and (n, i) in mixed:
                        ax.add_patch(plt.Rectangle((-0.45, i - 0.45), d - 0.1, 0.9, fill=False, ec="red", lw=2))
                ax.set(xticks=[], yticks=[], title=f"{name} [{n}]\ns{n // h} head {n % h}")
                ax.title.set_fontsize(9)
        fig.suptitle(f"(B, L, D) = ({B}, {L}, {D}) -> (B*h, L, d) = ({B * h}, {L}, {d})\n"
                     f"colour: hue = token, shade = head; red: rows the direct reshape mixed", fontsize=9)
        fig.tight_layout()
        return fig
