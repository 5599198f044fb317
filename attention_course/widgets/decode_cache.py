"""DecodeCacheWidget: one step of cached decoding, seen from the query of the token being generated.

At step t the new token, at position t, appends its key and value to the cache, which then holds positions 0 to t,
and its query reads the cached keys (its own among them). With grouped-query attention the ``num_heads`` query heads
share ``num_kv_heads`` key/value heads: query head j reads KV head j // n_rep, n_rep = num_heads // num_kv_heads
(``repeat_interleave`` order), so the cache holds num_kv_heads rows of keys, not num_heads. With a sliding ``window``
W the query reads only the last W positions (t - W < position <= t); a rolling cache keeps just those, so its size
stops growing at W entries. The first ``prompt`` tokens are the prompt: the **prefill** computes their keys and values
in one pass; every later step computes the key and value of its own token only and **reuses** the cached ones,
never recomputing them.

Polarity, as everywhere in the course: an ignore mask, True = may NOT attend. The picture is drawn by
``decode_cache.js`` from the traits; :attr:`DecodeCacheWidget.state` computes the same numbers with torch.
"""
import colorsys

import torch
import traitlets

from ..decoding import KVCache, decode_mask, kv_cache_bytes, repeat_kv
from ._base import CSS, CourseWidget, call, check_range, esm

MAX_HEADS, MAX_STEPS, MAX_HEAD_DIM = 8, 16, 1024
DTYPES = ("float64", "float32", "float16", "bfloat16")  # the cache's element type, by torch's name
OUTSIDE = "#6e7781"  # the fill of a key outside the window (hatched as well), as in decode_cache.js


def divisors(n: int) -> list[int]:
    return [k for k in range(1, n + 1) if n % k == 0]


def kv_fill(g: int) -> tuple[float, float, float]:
    """The fill of KV head g's keys (r, g, b in 0..1): a hue of its own, light (kvFill in decode_cache.js)."""
    return colorsys.hls_to_rgb((g * 137.5 + 15) % 360 / 360, 0.88, 0.62)


class DecodeCacheWidget(CourseWidget):
    """Step through generation and see which cached keys the new token's query reads, head by head.

    Settings (the first five are controls in the picture): ``step`` t, from 0 to steps - 1 (default: the last);
    ``steps`` 1-16, the tokens generated; ``prompt`` 1 to steps, the tokens of the prompt, prefilled in one pass; ``num_heads`` 1-8 query heads; ``num_kv_heads``, which must divide
    num_heads (1: multi-query, num_heads: plain multi-head attention); ``window`` None (no window: the whole cache)
    or 1 to steps. ``head_dim`` (1-1024) and ``dtype`` (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"``
    or a torch dtype) only size the cache in the summary: bytes per layer for a batch of one.

    Changing ``steps`` alone keeps ``step``, ``window`` and ``prompt`` valid: clamped, and said in
    :attr:`clamped`; a window or prompt that was clamped comes back when ``steps`` grows again. A setting that breaks the rest raises
    with the valid choices; to change several at once, and to redraw on every Jupyter (ipywidgets 7 and 8):
    ``w.update(num_heads=6, num_kv_heads=3)``.
    """

    SETTINGS = ("step", "steps", "num_heads", "num_kv_heads", "window", "head_dim", "dtype", "prompt")

    _esm = esm("decode_cache.js")
    _css = CSS

    step = traitlets.Int(7).tag(sync=True)
    steps = traitlets.Int(8).tag(sync=True)
    num_heads = traitlets.Int(4).tag(sync=True)
    num_kv_heads = traitlets.Int(2).tag(sync=True)
    window = traitlets.Int(None, allow_none=True).tag(sync=True)
    head_dim = traitlets.Int(64).tag(sync=True)
    dtype = traitlets.Unicode("float32").tag(sync=True)
    prompt = traitlets.Int(1).tag(sync=True)

    def __init__(self, num_heads=4, num_kv_heads=2, window=None, steps=8, step=None, head_dim=64, dtype="float32",
                 prompt=1, **kwargs):
        self._asked = {"window": window, "prompt": prompt}  # what was set, before any clamping by ``steps``
        if isinstance(dtype, torch.dtype):
            dtype = str(dtype).removeprefix("torch.")
        if step is None:  # the last step: the fullest cache
            step = steps - 1 if isinstance(steps, int) and not isinstance(steps, bool) and steps >= 1 else 0
        super().__init__(num_heads=num_heads, num_kv_heads=num_kv_heads, window=window, steps=steps, step=step,
                         head_dim=head_dim, dtype=dtype, prompt=prompt, **kwargs)

    @traitlets.validate("steps")
    def _valid_steps(self, proposal):
        return check_range(proposal.value, "steps", 1, MAX_STEPS, "It is the number of tokens generated.")

    @traitlets.validate("step")
    def _valid_step(self, proposal):
        hint = f"It is the position of the new token, from 0 to steps - 1 = {self.steps - 1}."
        if isinstance(proposal.value, int) and self.steps <= proposal.value < MAX_STEPS:
            hint += f" To generate more tokens as well: {call({'steps': proposal.value + 1, 'step': proposal.value})}."
        return check_range(proposal.value, "step", 0, self.steps - 1, hint)

    @traitlets.validate("window")
    def _valid_window(self, proposal):
        if proposal.value is None:
            return None
        hint = "None means no window: the query reads the whole cache."
        if isinstance(proposal.value, int) and self.steps < proposal.value <= MAX_STEPS:
            hint += f" For a longer generation: {call({'steps': proposal.value, 'window': proposal.value})}."
        return check_range(proposal.value, "window", 1, self.steps, hint)

    @traitlets.validate("prompt")
    def _valid_prompt(self, proposal):
        return check_range(proposal.value, "prompt", 1, self.steps,
                           "It is the number of prompt tokens, prefilled in one pass (1: no prompt but the first token).")

    @traitlets.validate("num_heads", "num_kv_heads")
    def _valid_heads(self, proposal):
        name, value = proposal.trait.name, proposal.value
        if name == "num_heads":
            check_range(value, "num_heads", 1, MAX_HEADS)
        h = value if name == "num_heads" else self.num_heads
        h_kv = value if name == "num_kv_heads" else self.num_kv_heads
        choices = ", ".join(map(str, divisors(h)))
        check_range(h_kv, "num_kv_heads", 1, h, f"Each KV head serves num_heads // num_kv_heads query heads: "
                    f"choose num_kv_heads among {choices}.")
        if h % h_kv:
            fix = call({"num_heads": h, "num_kv_heads": max(k for k in divisors(h) if k <= h_kv)})
            raise traitlets.TraitError(
                f"num_heads {h} is not divisible by num_kv_heads {h_kv}: every KV head must serve the same number "
                f"of query heads. Choose num_kv_heads among {choices}; to change both at once: {fix}."
            )
        return value

    @traitlets.validate("head_dim")
    def _valid_head_dim(self, proposal):
        return check_range(proposal.value, "head_dim", 1, MAX_HEAD_DIM, "It is d, the size of one head's key.")

    @traitlets.validate("dtype")
    def _valid_dtype(self, proposal):
        if proposal.value not in DTYPES:
            raise traitlets.TraitError(
                f"dtype must be one of {', '.join(map(repr, DTYPES))} (or the torch dtype of that name), "
                f"got {proposal.value!r}."
            )
        return proposal.value

    @traitlets.observe("window", "prompt")
    def _remember(self, change):
        if not getattr(self, "_clamping", False):
            self._asked[change["name"]] = change["new"]

    @traitlets.observe("steps")
    def _keep_step_and_window_valid(self, change):
        self._clamping = True
        try:
            with self.hold_sync():
                self.step = min(self.step, self.steps - 1)
                asked = self._asked.get("window", self.window)
                self.window = None if asked is None else min(asked, self.steps)
                self.prompt = min(self._asked.get("prompt", self.prompt), self.steps)
        finally:
            self._clamping = False

    @property
    def clamped(self) -> str:
        """What ``steps`` has clamped, in words ("" when nothing): a window or prompt longer than the generation."""
        said = []
        for name, shown in (("window", self.window), ("prompt", self.prompt)):
            asked = self._asked.get(name)
            if asked is not None and shown is not None and asked > shown:
                tokens = "1 token" if self.steps == 1 else f"{self.steps} tokens"
                said.append(f"{name} {asked} is longer than the {tokens} generated: it shows as {shown} until "
                            f"steps is {asked} or more again")
        return "; ".join(said)

    @property
    def n_rep(self) -> int:
        """The query heads each KV head serves: num_heads // num_kv_heads."""
        return self.num_heads // self.num_kv_heads

    @property
    def state(self) -> dict:
        """What step t reads and holds, as lists and ints (masks: True = may NOT attend), from the package's
        decode_mask, repeat_kv, KVCache and kv_cache_bytes."""
        h, h_kv, t, W, d = self.num_heads, self.num_kv_heads, self.step, self.window, self.head_dim
        dtype = getattr(torch, self.dtype)
        keys = torch.arange(t + 1)  # (S,): the positions in the cache once the new token's key is in, S = t + 1
        ignore = decode_mask(torch.tensor([t]), keys, window=W)  # (1, S): the new query's row
        heads = torch.arange(h_kv, dtype=torch.float64).view(1, h_kv, 1, 1)  # (B, h_kv, S, d) = (1, h_kv, 1, 1)
        kv_of_query = repeat_kv(heads, self.n_rep).flatten().long()  # (h,): the KV head query head j reads
        # A rolling cache (a full one without a window) fed one token a step: what it holds after each step
        cache, held = KVCache(window=W), []
        for s in range(self.steps):
            kv = torch.zeros(1, h_kv, 1, d, dtype=dtype)  # (B, h_kv, L_new, d): one new position
            cache.update(kv, kv, torch.tensor([s]))
            held.append(len(cache))
            if s == t:
                rolling, rolling_bytes = cache.positions.tolist(), cache.nbytes
        P = self.prompt
        new = list(range(t + 1)) if t < P else [t]  # computed at this step: the prefill's pass, or this token alone
        return {
            "prompt": P,
            "new_positions": new,  # keys and values computed at this step
            "reused_positions": [j for j in range(t + 1) if j not in new],  # read from the cache, not recomputed
            "computed_at": ["prefill" if j < P else f"step {j}" for j in range(t + 1)],
            "key_positions": keys.tolist(),
            "kv_head_of_query": kv_of_query.tolist(),
            "ignore_mask": ignore.expand(h, -1).tolist(),  # (h, S): every query head the same row
            "read_positions": keys[~ignore[0]].tolist(),
            "rolling_positions": rolling,
            "cache_entries": t + 1,
            "rolling_entries": len(rolling),
            "bytes_per_position": kv_cache_bytes(1, h_kv, d, 1, dtype),  # K and V, one layer, batch of one
            "cache_bytes": kv_cache_bytes(1, h_kv, d, t + 1, dtype),
            "rolling_bytes": rolling_bytes,
            "mha_cache_bytes": kv_cache_bytes(1, h, d, t + 1, dtype),  # one KV head per query head
            "entries_by_step": [[s + 1, held[s]] for s in range(self.steps)],  # [full, rolling] after step s
        }

    def figure(self):
        """A static matplotlib picture of the current step: the cache's keys, then each query head's reads."""
        import matplotlib.pyplot as plt
        from matplotlib.patches import Rectangle

        from ..plots import text_color_on

        state, h, h_kv, t = self.state, self.num_heads, self.num_kv_heads, self.step
        read = set(state["read_positions"])
        S = t + 1
        # rows, top to bottom: the cache's KV heads, a gap, then the query heads grouped by the KV head they read
        rows = [(f"kv{g} cache", g) for g in range(h_kv)] + [None]
        for g in range(h_kv):
            rows += [(f"q{j} → kv{g}", g) for j in range(g * self.n_rep, (g + 1) * self.n_rep)] + [None]
        rows.pop()
        fig, ax = plt.subplots(figsize=(min(6.8, 1.6 + 0.34 * S), 1.2 + 0.3 * len(rows)))
        for i, row in enumerate(rows):
            if row is None:
                continue
            label, g = row
            for j in range(S):
                inside = j in read
                fill = kv_fill(g) if inside else OUTSIDE
                # the hatch is drawn in the edge's colour (no hatchcolor=: matplotlib 3.10 added it)
                ax.add_patch(Rectangle((j, i), 1, 1, facecolor=fill, edgecolor="white", lw=1,
                                       hatch=None if inside else "///"))
                if inside:
                    ax.text(j + 0.5, i + 0.5, str(j), ha="center", va="center", fontsize=8,
                            color=text_color_on(fill))
            ax.text(-0.2, i + 0.5, label, ha="right", va="center", fontsize=8)
        ax.set(xlim=(0, S), ylim=(len(rows), 0), xticks=[j + 0.5 for j in range(S)], yticks=[])
        ax.set_xticklabels(range(S), fontsize=8)
        ax.set_xlabel("key position (the cache after step t)", fontsize=9)
        for side in ("left", "right", "top"):
            ax.spines[side].set_visible(False)
        window = "no window" if self.window is None else f"window W = {self.window}, hatched: outside it"
        ax.set_title(f"Step t = {t}: {h} query heads over {h_kv} KV heads, {window}", fontsize=9)
        fig.tight_layout()
        return fig
