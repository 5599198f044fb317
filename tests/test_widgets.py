"""The three widgets: their Python state against torch and the package, their checks, and their ES modules.

The ES modules draw the pictures in the browser from the traits alone; the last tests run them in Chromium with a
stand-in model (no kernel, as on the static site) and compare what they compute with the Python state, then check
what a screen-reader or keyboard user gets: the pictures' names and live summary, the tables, the focus, the contrast.
"""
import json

import pytest
import torch
import traitlets
from hypothesis import given, settings
from hypothesis import strategies as st
from test_site import contrast, focus_ring_problems, low_contrast_marks, picture_words, shared_browser

from attention_course.functional import masked_softmax
from attention_course.heads import split_heads, split_heads_flat
from attention_course.masks import causal_mask, merge_masks, padding_mask
from attention_course.widgets import DecodeCacheWidget, HeadReshapeWidget, MaskBroadcastWidget


def t(x, dtype=None):
    return torch.tensor(x, dtype=dtype)


# ---------------------------------------------------------------- MaskBroadcastWidget
def test_mask_defaults_match_the_package():
    w = MaskBroadcastWidget()
    assert (w.batch_size, w.max_len, w.lengths, w.causal, w.num_heads) == (3, 5, [5, 3, 2], False, 1)
    s = w.state
    expected = padding_mask([5, 3, 2], 5)  # (B, L), True at pads
    assert torch.equal(t(s["key_padding_mask"]), expected)
    assert torch.equal(t(s["broadcast_mask"]), expected[:, None, :].expand(3, 5, 5))
    assert torch.equal(t(s["combined_mask"]), t(s["broadcast_mask"]))  # causal off
    assert s["key_padding_mask"][2] == [False, False, True, True, True]


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_mask_state_matches_merge_masks(data):
    B = data.draw(st.integers(1, 4))
    L = data.draw(st.integers(1, 8))
    lengths = data.draw(st.lists(st.integers(1, L), min_size=B, max_size=B))
    causal, h = data.draw(st.booleans()), data.draw(st.integers(1, 4))
    w = MaskBroadcastWidget(batch_size=B, max_len=L, lengths=lengths, causal=causal, num_heads=h)
    s = w.state
    kpm = padding_mask(lengths, L)
    merged = merge_masks(kpm, None, batch_size=B, num_heads=h, query_len=L, key_len=L, is_causal=causal)  # (B,h,L,L)
    assert torch.equal(t(s["per_head_mask"]), merged.flatten(0, 1))  # (B*h, L, L), row b*h + head
    assert torch.equal(t(s["combined_mask"]), merged[:, 0])
    weights = t(s["weights"], torch.float64)
    assert torch.all(weights[t(s["combined_mask"])] == 0), "a masked cell got weight"
    torch.testing.assert_close(weights.sum(-1), torch.ones(B, L, dtype=torch.float64))
    torch.testing.assert_close(weights, masked_softmax(t(s["scores"], torch.float64), merged[:, 0]))


def test_causal_combines_with_padding():
    s = MaskBroadcastWidget(lengths=(5, 3, 2), causal=True, num_heads=3).state
    assert torch.equal(t(s["causal_mask"]), causal_mask(5))
    assert s["combined_mask"][1][0] == [False, True, True, True, True]  # sentence 1 (length 3), query 0: the future
    assert s["combined_mask"][1][3] == [False, False, False, True, True]  # pad query 3: the pads
    assert len(s["per_head_mask"]) == 9
    assert s["query_is_pad"][1] == [False, False, False, True, True]


def test_setting_traits_updates_state():
    w = MaskBroadcastWidget()
    w.causal = True
    w.num_heads = 2
    w.lengths = [2, 5, 1]
    s = w.state
    assert torch.equal(t(s["key_padding_mask"]), padding_mask([2, 5, 1], 5))
    assert len(s["per_head_mask"]) == 6 and s["per_head_mask"][2] == s["per_head_mask"][3]
    assert s["weights"][2][4] == [1.0, 0.0, 0.0, 0.0, 0.0]  # one real token: all weight on it


def test_batch_size_and_max_len_keep_lengths_valid():
    w = MaskBroadcastWidget(example=2)
    w.batch_size = 4
    assert w.lengths == [5, 3, 2, 4]
    w.max_len = 3
    assert w.lengths == [3, 3, 2, 3]  # clamped
    w.batch_size = 1
    assert (w.lengths, w.example) == ([3], 0)
    w.update(batch_size=2, lengths=[1, 2])
    assert (w.batch_size, w.lengths) == (2, [1, 2])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lengths": [6, 1, 1]}, "lengths[0] must be an integer from 1 to 5, got 6"),
        ({"lengths": [0, 1, 1]}, "at least one real token"),
        ({"lengths": [1, 1]}, "one length per sentence (batch_size=3), got 2"),
        ({"batch_size": 5}, "batch_size must be an integer from 1 to 4"),
        ({"max_len": 9}, "max_len must be an integer from 1 to 8"),
        ({"max_len": 0}, "max_len must be an integer from 1 to 8"),
        ({"num_heads": 0}, "num_heads must be an integer from 1 to 4"),
        ({"example": 3}, "example must be an integer from 0 to 2"),
    ],
)
def test_mask_rejects_bad_settings(change, message):
    w = MaskBroadcastWidget()
    with pytest.raises(traitlets.TraitError) as error:
        for name, value in change.items():
            setattr(w, name, value)
    assert message in str(error.value)
    assert w.lengths == [5, 3, 2] and w.batch_size == 3  # unchanged


def test_mask_constructor_checks_lengths():
    with pytest.raises(traitlets.TraitError, match=r"at most max_len\. To make the batch longer as well: "
                                                   r"w\.update\(max_len=5, lengths=\[5, 3, 2\]\)"):
        MaskBroadcastWidget(max_len=4, lengths=(5, 3, 2))
    assert MaskBroadcastWidget(batch_size=2).lengths == [5, 3]


def test_mask_shrinking_the_batch_clamps_the_example_first():
    w = MaskBroadcastWidget(batch_size=4, example=3)
    sent = record_messages(w)
    w.batch_size = 1  # ipywidgets sends the new batch_size before the observer clamps the rest
    assert (w.example, w.lengths) == (0, [5])
    assert [set(m["state"]) for m in sent] == [{"batch_size"}, {"example", "lengths"}]  # the rest together


# ---------------------------------------------------------------- update(**settings), every widget
def record_messages(widget) -> list[dict]:
    """The messages the widget sends to the front end from now on (the comm is a stand-in: there is no kernel)."""
    sent = []
    widget._send = lambda msg, buffers=None: sent.append(msg)
    return sent


def test_update_is_not_a_name_ipywidgets_or_anywidget_use():
    import anywidget
    import ipywidgets

    for base in (anywidget.AnyWidget, ipywidgets.DOMWidget, ipywidgets.Widget, traitlets.HasTraits):
        assert not hasattr(base, "update"), base
    assert {"update", "state"}.isdisjoint(MaskBroadcastWidget.class_trait_names())


@pytest.mark.parametrize(
    ("widget", "settings_", "expected_message"),
    [
        (MaskBroadcastWidget(example=2), {"batch_size": 2, "lengths": [4, 1], "causal": True},
         {"batch_size": 2, "lengths": [4, 1], "causal": True, "example": 1}),  # example clamped by the widget
        (MaskBroadcastWidget(), {"max_len": 1, "lengths": [1, 1, 1]}, {"max_len": 1, "lengths": [1, 1, 1]}),
        (HeadReshapeWidget(), {"embed_dim": 9, "num_heads": 3, "seq_len": 1},
         {"embed_dim": 9, "num_heads": 3, "seq_len": 1}),  # neither alone is valid from D=8, h=2
        (DecodeCacheWidget(), {"num_heads": 3, "num_kv_heads": 3, "window": 2},
         {"num_heads": 3, "num_kv_heads": 3, "window": 2}),  # neither alone is valid from h=4, h_kv=2
        (DecodeCacheWidget(window=6), {"steps": 4}, {"steps": 4, "step": 3, "window": 4}),  # clamped by the widget
    ],
    ids=["mask-batch", "mask-L1", "head-D-and-h", "decode-h-and-hkv", "decode-steps"],
)
def test_update_sets_everything_in_one_message(widget, settings_, expected_message):
    sent = record_messages(widget)
    widget.update(**settings_)
    assert {name: getattr(widget, name) for name in expected_message} == expected_message
    assert len(sent) == 1 and sent[0]["method"] == "update"
    assert sent[0]["state"] == expected_message


@pytest.mark.parametrize(
    ("widget", "settings_", "error", "message"),
    [
        (MaskBroadcastWidget(), {"heads": 2}, TypeError,
         "got 'heads', which it does not have; its settings are batch_size, max_len, lengths, causal, num_heads, example"),
        (HeadReshapeWidget(), {"D": 6}, TypeError, "its settings are batch_size, seq_len, embed_dim, num_heads"),
        (MaskBroadcastWidget(), {"batch_size": 2, "lengths": [1, 1, 1]}, traitlets.TraitError,
         "To change both at once: w.update(batch_size=3, lengths=[1, 1, 1])"),
        (MaskBroadcastWidget(), {"causal": True, "lengths": [6, 1, 1]}, traitlets.TraitError,
         "w.update(max_len=6, lengths=[6, 1, 1])"),
        (MaskBroadcastWidget(), {"num_heads": 2, "example": 3}, traitlets.TraitError,
         "example must be an integer from 0 to 2"),
        (HeadReshapeWidget(), {"embed_dim": 7}, traitlets.TraitError,
         "embed_dim 7 is not divisible by num_heads 2: choose num_heads among 1, 7. "
         "To change both at once: w.update(embed_dim=7, num_heads=1)"),
        (HeadReshapeWidget(), {"num_heads": 12}, traitlets.TraitError, "choose num_heads among 1, 2, 4, 8"),
        (HeadReshapeWidget(), {"batch_size": 2, "seq_len": "4"}, traitlets.TraitError, "seq_len"),
        (DecodeCacheWidget(), {"heads": 2}, TypeError,
         "its settings are step, steps, num_heads, num_kv_heads, window, head_dim, dtype"),
        (DecodeCacheWidget(), {"num_heads": 6, "num_kv_heads": 4}, traitlets.TraitError,
         "num_heads 6 is not divisible by num_kv_heads 4: every KV head must serve the same number of query heads. "
         "Choose num_kv_heads among 1, 2, 3, 6; to change both at once: w.update(num_heads=6, num_kv_heads=3)."),
        (DecodeCacheWidget(), {"step": 9}, traitlets.TraitError,
         "step must be an integer from 0 to 7, got 9. It is the position of the new token, from 0 to steps - 1 = 7. "
         "To generate more tokens as well: w.update(steps=10, step=9)."),
        (DecodeCacheWidget(), {"window": 12}, traitlets.TraitError,
         "window must be an integer from 1 to 8, got 12. None means no window: the query reads the whole cache. "
         "For a longer generation: w.update(steps=12, window=12)."),
    ],
    ids=["unknown-mask", "unknown-head", "count", "too-long", "example", "D-prime", "h-too-big", "type",
         "unknown-decode", "decode-hkv", "decode-step", "decode-window"],
)
def test_update_rejects_bad_settings_and_changes_nothing(widget, settings_, error, message):
    before = {name: getattr(widget, name) for name in widget.SETTINGS}
    sent = record_messages(widget)
    with pytest.raises(error) as raised:
        widget.update(**settings_)
    assert message in str(raised.value)
    assert {name: getattr(widget, name) for name in widget.SETTINGS} == before
    assert sent == []


def test_hints_name_update_not_set_state():
    import attention_course.widgets as package
    from attention_course.widgets import _base, decode_cache, head_reshape, mask_broadcast

    for module in (package, _base, decode_cache, head_reshape, mask_broadcast):
        source = open(module.__file__).read()
        assert "set_state(" not in source.replace("w.set_state(...)", ""), module.__name__  # only the warning
    for cls in (MaskBroadcastWidget, HeadReshapeWidget, DecodeCacheWidget):
        assert "w.update(" in cls.__doc__
        assert "set_state" in cls.update.__doc__ and "ipywidgets 7" in cls.update.__doc__


# ---------------------------------------------------------------- HeadReshapeWidget
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_head_state_matches_torch(data):
    B, L, D = data.draw(st.integers(1, 3)), data.draw(st.integers(1, 6)), data.draw(st.integers(2, 12))
    h = data.draw(st.sampled_from([k for k in range(1, D + 1) if D % k == 0]))
    w = HeadReshapeWidget(batch_size=B, seq_len=L, embed_dim=D, num_heads=h)
    s = w.state
    x = torch.arange(1, B * L * D + 1).reshape(B, L, D)
    assert torch.equal(t(s["x"]), x)
    assert torch.equal(t(s["split"]), x.view(B, L, h, D // h))
    assert torch.equal(t(s["transposed"]), split_heads(x, h))
    assert torch.equal(t(s["flat"]), split_heads_flat(x, h))
    wrong = t(s["wrong"])
    assert torch.equal(wrong, x.view(B * h, L, D // h))
    mixed = {tuple(r) for r in s["mixed_rows"]}
    for n in range(B * h):
        for i in range(L):
            assert ((n, i) in mixed) == (not torch.equal(wrong[n, i], split_heads_flat(x, h)[n, i]))
    if h == 1:
        assert not mixed  # one head: both reshapes agree


def test_head_defaults_and_mixed_rows():
    s = HeadReshapeWidget().state  # B=2, L=4, D=8, h=2
    assert s["shape"] == {"B": 2, "L": 4, "D": 8, "h": 2, "d": 4}
    assert s["flat"][1][0] == [5, 6, 7, 8]  # sentence 0, head 1, token 0
    assert s["wrong"][0][1] == [5, 6, 7, 8]  # the direct reshape puts it in head 0 as token 1
    assert [0, 0] not in s["mixed_rows"] and [0, 1] in s["mixed_rows"]
    assert len(s["mixed_rows"]) == 12


def test_head_count_must_divide_embed_dim():
    w = HeadReshapeWidget(embed_dim=8, num_heads=2)
    with pytest.raises(traitlets.TraitError, match="choose num_heads among 1, 2, 4, 8"):
        w.num_heads = 3
    with pytest.raises(traitlets.TraitError, match="embed_dim 7 is not divisible by num_heads 2"):
        w.embed_dim = 7
    assert (w.embed_dim, w.num_heads) == (8, 2)
    w.update(embed_dim=6, num_heads=3)
    assert w.state["shape"]["d"] == 2 and w.valid_num_heads == [1, 2, 3, 6]
    with pytest.raises(traitlets.TraitError, match="choose num_heads among 1, 2, 3, 6"):
        HeadReshapeWidget(embed_dim=6, num_heads=4)
    with pytest.raises(traitlets.TraitError, match="seq_len must be an integer from 1 to 6"):
        HeadReshapeWidget(seq_len=7)


# ---------------------------------------------------------------- DecodeCacheWidget
def test_decode_defaults():
    w = DecodeCacheWidget()
    assert (w.num_heads, w.num_kv_heads, w.window, w.steps, w.step, w.head_dim, w.dtype) == (4, 2, None, 8, 7, 64, "float32")
    s = w.state
    assert s["key_positions"] == list(range(8)) and s["read_positions"] == list(range(8))
    assert s["kv_head_of_query"] == [0, 0, 1, 1]
    assert s["cache_bytes"] == 2 * 2 * 64 * 8 * 4 and s["mha_cache_bytes"] == 2 * s["cache_bytes"]
    assert DecodeCacheWidget(steps=3).step == 2 and DecodeCacheWidget(steps=3, step=0).step == 0  # the last, unless said


@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_decode_state_matches_a_cache_built_by_hand(data):
    """The widget's state against torch alone: the band mask of the whole generation, the head pairing of
    repeat_interleave, a cache kept as a list of positions, and the bytes of real key and value tensors."""
    h = data.draw(st.integers(1, 8))
    h_kv = data.draw(st.sampled_from([k for k in range(1, h + 1) if h % k == 0]))
    T = data.draw(st.integers(1, 16))
    t = data.draw(st.integers(0, T - 1))
    W = data.draw(st.one_of(st.none(), st.integers(1, T)))
    d, dtype = data.draw(st.integers(1, 16)), data.draw(st.sampled_from([torch.float32, torch.float16, torch.float64]))
    s = DecodeCacheWidget(num_heads=h, num_kv_heads=h_kv, window=W, steps=T, step=t, head_dim=d, dtype=dtype).state
    i, j = torch.arange(T)[:, None], torch.arange(T)[None, :]  # (T, T): every query of the generation, every key
    band = causal_mask(T) | ((i - j >= W) if W else torch.zeros(T, T, dtype=torch.bool))
    assert s["key_positions"] == list(range(t + 1))
    assert s["ignore_mask"] == [band[t, :t + 1].tolist()] * h  # the new query's row, the same for every head
    assert s["read_positions"] == [p for p in range(t + 1) if not band[t, p]]
    keys = torch.randn(h_kv, 3)  # a key per KV head: query head j must see the one of KV head j // (h / h_kv)
    read = keys.repeat_interleave(h // h_kv, dim=0)  # (h, 3)
    assert all(torch.equal(read[q], keys[g]) for q, g in enumerate(s["kv_head_of_query"]))
    assert s["kv_head_of_query"] == sorted(s["kv_head_of_query"])  # grouped: 0, 0, 1, 1, never 0, 1, 0, 1
    held = []
    for step in range(T):  # a rolling cache by hand: append, then drop all but the last W
        held = (held + [step])[-W:] if W else held + [step]
        assert s["entries_by_step"][step] == [step + 1, len(held)]
        if step == t:
            assert s["rolling_positions"] == held
    assert s["rolling_positions"] == s["read_positions"]  # a rolling cache holds exactly what the window reads
    assert s["rolling_entries"] == min(t + 1, W or t + 1)
    k = v = torch.zeros(1, h_kv, t + 1, d, dtype=dtype)  # (B, h_kv, S, d): the cache's tensors, one layer
    assert s["cache_bytes"] == k.nbytes + v.nbytes == (t + 1) * s["bytes_per_position"]
    assert s["rolling_bytes"] == s["rolling_entries"] * s["bytes_per_position"]
    assert s["mha_cache_bytes"] == s["cache_bytes"] * h // h_kv


def test_decode_agrees_with_the_attention_it_pictures():
    """In the package's layer, the output at step t changes with the token at position p exactly when the widget
    says the query reads p; decoding token by token, a rolling cache holds the positions the widget shows."""
    from attention_course.decoding import CausalSelfAttention, KVCache

    torch.manual_seed(0)
    h, h_kv, W, T, E = 4, 2, 3, 7, 8
    layer = CausalSelfAttention(E, h, h_kv, window=W, dtype=torch.float64)
    x = torch.randn(1, T, E, dtype=torch.float64)  # (B, L, E)
    for t in (1, 4, 6):
        s = DecodeCacheWidget(num_heads=h, num_kv_heads=h_kv, window=W, steps=T, step=t).state
        base = layer(x)[0, t]
        changed = []
        for p in range(t + 1):
            nudged = x.clone()
            nudged[0, p] += 1
            changed.append(not torch.allclose(layer(nudged)[0, t], base, rtol=0, atol=1e-12))
        assert [p for p in range(t + 1) if changed[p]] == s["read_positions"], t
    cache, held = KVCache(window=W), []
    for t in range(T):
        layer(x[:, t:t + 1], cache=cache)  # one token a step, its position from the cache
        held.append(cache.positions.tolist())
    assert [len(p) for p in held] == [n for _, n in s["entries_by_step"]]
    assert held[-1] == s["rolling_positions"] == [4, 5, 6]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"num_heads": 9}, "num_heads must be an integer from 1 to 8, got 9"),
        ({"num_heads": 3}, "num_heads 3 is not divisible by num_kv_heads 2"),
        ({"num_kv_heads": 3}, "w.update(num_heads=4, num_kv_heads=2)"),
        ({"num_kv_heads": 0}, "num_kv_heads must be an integer from 1 to 4, got 0. Each KV head serves"),
        ({"steps": 17}, "steps must be an integer from 1 to 16, got 17"),
        ({"step": -1}, "step must be an integer from 0 to 7, got -1"),
        ({"window": 0}, "window must be an integer from 1 to 8, got 0. None means no window"),
        ({"window": 2.5}, "The 'window' trait"),
        ({"head_dim": 0}, "head_dim must be an integer from 1 to 1024, got 0"),
        ({"dtype": "int8"}, "dtype must be one of 'float64', 'float32', 'float16', 'bfloat16' (or the torch dtype of "
                            "that name), got 'int8'"),
    ],
)
def test_decode_rejects_bad_settings(change, message):
    w = DecodeCacheWidget(window=4)
    before = {name: getattr(w, name) for name in w.SETTINGS}
    with pytest.raises(traitlets.TraitError) as error:
        w.update(**change)
    assert message in str(error.value)
    assert {name: getattr(w, name) for name in w.SETTINGS} == before


def test_decode_steps_keep_step_and_window_valid():
    w = DecodeCacheWidget(steps=10, step=9, window=8)
    sent = record_messages(w)
    w.steps = 4  # alone: the step and the window follow, in one message after it
    assert (w.step, w.window) == (3, 4)
    assert [set(m["state"]) for m in sent] == [{"steps"}, {"step", "window"}]
    w.update(window=None, steps=16)
    assert (w.step, w.window, w.steps) == (3, None, 16)
    assert w.state["read_positions"] == [0, 1, 2, 3]


def test_decode_prefill_computes_the_prompt_in_one_pass_and_later_steps_reuse_the_cache():
    w = DecodeCacheWidget(steps=8, prompt=3, step=1)  # a query of the prefill: every key it reads is computed now
    assert w.state["new_positions"] == [0, 1] and w.state["reused_positions"] == []
    w.step = 5  # a decode step: its own key is new, the others come from the cache
    s = w.state
    assert s["new_positions"] == [5] and s["reused_positions"] == [0, 1, 2, 3, 4]
    assert s["computed_at"] == ["prefill"] * 3 + ["step 3", "step 4", "step 5"]
    assert DecodeCacheWidget().state["new_positions"] == [7] and DecodeCacheWidget().prompt == 1
    with pytest.raises(traitlets.TraitError, match="prompt must be an integer from 1 to 8, got 9"):
        w.prompt = 9


def test_decode_steps_clamp_the_window_and_prompt_say_so_and_give_them_back():
    w = DecodeCacheWidget(steps=8, window=5, prompt=3)
    assert w.clamped == ""
    w.steps = 1  # T = 1: W and P cannot exceed 1 ...
    assert (w.window, w.prompt, w.step) == (1, 1, 0)
    assert "window 5 is longer than the 1 token generated: it shows as 1" in w.clamped and "prompt 3" in w.clamped
    w.steps = 8  # ... and come back when T goes back up
    assert (w.window, w.prompt, w.clamped) == (5, 3, "")
    w.steps = 4
    w.window = 2  # a window set while clamped is the new one asked for
    w.steps = 8
    assert w.window == 2


def test_decode_dtype_sizes_the_cache():
    sizes = {name: DecodeCacheWidget(dtype=getattr(torch, name)).state["cache_bytes"]
             for name in ("float64", "float32", "float16", "bfloat16")}
    assert sizes == {name: 2 * 2 * 64 * 8 * getattr(torch, name).itemsize for name in sizes}
    assert DecodeCacheWidget(dtype=torch.bfloat16).dtype == "bfloat16"


def test_decode_fills_contrast_with_the_outside_grey():
    """Each KV head's fill against the grey of a key outside the window: >= 3:1, so the window shows in lightness
    too, not in hue alone (and the hatching on the grey is drawn in an ink of >= 3:1, tested in the browser)."""
    from attention_course.plots import contrast_ratio
    from attention_course.widgets.decode_cache import OUTSIDE, kv_fill

    assert min(contrast_ratio(kv_fill(g), OUTSIDE) for g in range(8)) >= 3


def test_decode_figure_hatches_the_keys_outside_the_window():
    import io
    import struct

    import matplotlib.pyplot as plt
    from matplotlib.text import Text

    w = DecodeCacheWidget(num_heads=6, num_kv_heads=2, window=3, steps=16, step=15)
    fig = w.figure()
    hatched = [p for p in fig.axes[0].patches if p.get_hatch()]
    rows = w.num_kv_heads + w.num_heads  # the cache's rows and the query heads' rows
    assert len(hatched) == rows * (16 - 3) and len(fig.axes[0].patches) == rows * 16
    png = io.BytesIO()
    fig.savefig(png, format="png", bbox_inches="tight")
    width = struct.unpack(">II", png.getvalue()[16:24])[0]
    smallest = min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip())
    assert width <= 688 and smallest * fig.dpi / 72 >= 9, (width, smallest)
    plt.close(fig)
    fig = DecodeCacheWidget().figure()  # no window: nothing hatched
    assert not [p for p in fig.axes[0].patches if p.get_hatch()]
    plt.close(fig)


@pytest.mark.parametrize("widget", [MaskBroadcastWidget(causal=True, lengths=(4, 2, 1)), HeadReshapeWidget()],
                         ids=lambda w: type(w).__name__)
def test_figure_draws(widget):
    import matplotlib.pyplot as plt

    fig = widget.figure()
    assert len(fig.axes) >= 3
    plt.close(fig)


def test_widgets_are_one_anywidget_model_with_their_code():
    for w in (MaskBroadcastWidget(), HeadReshapeWidget(), DecodeCacheWidget()):
        assert "export default { render }" in w._esm and "computeState" in w._esm
        assert ".ac-widget" in w._css
        assert w._repr_mimebundle_()[0].keys() >= {"application/vnd.jupyter.widget-view+json", "text/plain"}


# ---------------------------------------------------------------- the ES modules, in Chromium, with no kernel
# A stand-in for the widget model: traits in a dict, change events, nothing sent anywhere.
RENDER = """async ([esm, css, traits]) => {
  const listeners = {};
  window.traits = traits;
  const model = {
    get: (k) => traits[k],
    set: (k, v) => { traits[k] = v; (listeners["change:" + k] || []).forEach((f) => f()); },
    save_changes: () => {}, send: () => {}, off: () => {},
    on: (event, f) => { (listeners[event] ||= []).push(f); },
  };
  const style = document.createElement("style");
  style.textContent = css;
  document.head.append(style);
  // A message from the kernel, applied as the ipywidgets 7 and 8 front ends do (Backbone's model.set(state)):
  // every trait of the message first, then one change event per trait.
  window.applyState = async (state) => {
    Object.assign(traits, state);
    for (const k of Object.keys(state)) (listeners["change:" + k] || []).forEach((f) => f());
    await new Promise((resolve) => setTimeout(resolve, 0));  // the widget redraws in a microtask
  };
  const module = await import(URL.createObjectURL(new Blob([esm], { type: "text/javascript" })));
  const el = document.createElement("div");
  document.body.append(el);
  module.default.render({ model, el });
}"""


def render(page, widget):
    traits = {name: getattr(widget, name) for name in widget.trait_names(sync=True) if not name.startswith("_")}
    traits = {k: v for k, v in traits.items() if isinstance(v, (int, bool, list, str, type(None)))}
    page.set_content("<!doctype html><html><body></body></html>")
    page.evaluate(RENDER, [widget._esm, widget._css, traits])
    return page.locator(".ac-widget")


def js_state(page):
    return json.loads(page.locator(".ac-widget").get_attribute("data-state"))


def assert_same_state(js, py):
    assert js.keys() == py.keys()
    for key in py:
        if key == "weights":
            torch.testing.assert_close(t(js[key], torch.float64), t(py[key], torch.float64), atol=1e-12, rtol=0)
        else:
            assert js[key] == py[key], key


@pytest.fixture(scope="session")
def browser():
    yield from shared_browser()


@pytest.fixture(scope="module")
def tab(browser):
    """One tab for this file's tests, recording the errors it meets. (A new context and page per test cost Chromium
    about 1 CPU-s each: 104 CPU-s for the file, 37 with one tab.)"""
    tab = browser.new_page(viewport={"width": 900, "height": 900})
    tab.errors = []
    tab.on("pageerror", lambda error: tab.errors.append(str(error)))
    tab.on("console", lambda message: tab.errors.append(message.text) if message.type == "error" else None)
    yield tab
    tab.close()


@pytest.fixture
def page(tab):
    """The shared tab on a new blank document (about:blank: a new document and a new global object, nothing left of
    the test before); the test fails on any error the page met."""
    tab.goto("about:blank")
    tab.errors.clear()
    yield tab
    errors = tab.errors[:]
    assert not errors, errors


@pytest.mark.parametrize(
    ("cls", "settings_"),
    [
        (MaskBroadcastWidget, {}),
        (MaskBroadcastWidget, {"causal": True, "num_heads": 3}),
        (MaskBroadcastWidget, {"batch_size": 4, "max_len": 8, "lengths": (8, 1, 5, 3), "causal": True, "example": 3}),
        (HeadReshapeWidget, {}),
        (HeadReshapeWidget, {"batch_size": 3, "seq_len": 6, "embed_dim": 12, "num_heads": 4}),
        (HeadReshapeWidget, {"batch_size": 1, "seq_len": 1, "embed_dim": 2, "num_heads": 1}),
        (DecodeCacheWidget, {}),
        (DecodeCacheWidget, {"num_heads": 8, "num_kv_heads": 2, "window": 3, "steps": 16, "step": 11}),
        (DecodeCacheWidget, {"num_heads": 6, "num_kv_heads": 1, "window": 1, "step": 0, "head_dim": 128,
                             "dtype": "bfloat16"}),
        (DecodeCacheWidget, {"num_heads": 1, "num_kv_heads": 1, "steps": 1, "dtype": "float64"}),
    ],
)
def test_js_computes_the_python_state(page, cls, settings_):
    w = cls(**settings_)
    render(page, w)
    assert_same_state(js_state(page), w.state)


def test_mask_js_controls_redraw(page):
    widget = render(page, MaskBroadcastWidget())
    before = widget.locator(".ac-picture").inner_html()
    widget.locator("input[name=causal]").check()
    widget.locator("input[name=num_heads]").fill("2")
    widget.locator("input[name=batch_size]").fill("4")
    widget.locator("input[name=max_len]").fill("3")  # clamps the lengths, as in Python
    widget.locator("input[name=length1]").fill("1")
    traits = page.evaluate("window.traits")
    assert traits["lengths"] == [3, 1, 2, 3] and traits["causal"] and traits["num_heads"] == 2
    assert widget.locator(".ac-picture").inner_html() != before
    assert_same_state(js_state(page), MaskBroadcastWidget(**{k: traits[k] for k in
                      ("batch_size", "max_len", "lengths", "causal", "num_heads", "example")}).state)


def test_head_js_offers_only_divisors(page):
    widget = render(page, HeadReshapeWidget())
    assert widget.locator("button[name=num_heads]").all_inner_texts() == ["1", "2", "4", "8"]
    widget.locator("input[name=embed_dim]").fill("9")  # h=2 does not divide 9: the widget picks h=1
    assert widget.locator("button[name=num_heads]").all_inner_texts() == ["1", "3", "9"]
    assert page.evaluate("window.traits")["num_heads"] == 1
    before = widget.locator(".ac-picture").inner_html()
    widget.locator("button[name=num_heads][value='3']").click()
    assert widget.locator(".ac-picture").inner_html() != before
    assert widget.locator(".ac-outline").count() == len(HeadReshapeWidget(embed_dim=9, num_heads=3).state["mixed_rows"])
    assert_same_state(js_state(page), HeadReshapeWidget(embed_dim=9, num_heads=3).state)


def test_mask_widget_shows_the_shortest_sentence_by_default():
    from attention_course.widgets import MaskBroadcastWidget
    assert MaskBroadcastWidget().example == 2                       # lengths (5, 3, 2)
    assert MaskBroadcastWidget(lengths=(2, 5, 5)).example == 0
    assert MaskBroadcastWidget(example=1).example == 1


def apply(page, message):
    """Hand the front end one update message from Python, as a kernel would."""
    assert message["method"] == "update"
    page.evaluate("(state) => window.applyState(state)", message["state"])


def panel_titles(page):
    return page.locator(".ac-panel h4").all_inner_texts()


# ---------------------------------------------------------------- update(...) reaches the picture in one message
@pytest.mark.parametrize(
    ("widget", "settings_"),
    [
        (MaskBroadcastWidget(example=2), {"batch_size": 2, "lengths": [4, 1], "causal": True, "num_heads": 2}),
        (HeadReshapeWidget(), {"embed_dim": 9, "num_heads": 3, "batch_size": 1}),
        (DecodeCacheWidget(), {"num_heads": 6, "num_kv_heads": 3, "window": 2, "step": 4, "dtype": "float16"}),
    ],
    ids=lambda x: type(x).__name__ if not isinstance(x, dict) else "",
)
def test_update_message_redraws_the_picture(page, widget, settings_):
    render(page, widget)
    before = page.locator(".ac-picture").inner_html()
    sent = record_messages(widget)
    widget.update(**settings_)
    [message] = sent
    apply(page, message)
    assert page.locator(".ac-picture").inner_html() != before
    assert_same_state(js_state(page), widget.state)


# ---------------------------------------------------------------- shrinking the batch below the shown sentence
def test_mask_js_batch_shrinks_below_the_shown_sentence_from_python(page):
    w = MaskBroadcastWidget(batch_size=4, max_len=5, example=3)
    render(page, w)
    assert "5. Sentence 3" in panel_titles(page)[-1]
    sent = record_messages(w)
    w.batch_size = 1
    apply(page, sent[0])  # batch_size alone: the picture must not look up sentence 3 (the page fixture checks errors)
    assert panel_titles(page)[-1].startswith("5. Sentence 0 (length 5)")
    for message in sent[1:]:
        apply(page, message)
    assert_same_state(js_state(page), w.state)


def test_mask_js_batch_slider_shrinks_below_the_shown_sentence(page):
    widget = render(page, MaskBroadcastWidget(batch_size=4, example=3))
    widget.locator("input[name=batch_size]").fill("2")
    traits = page.evaluate("window.traits")
    assert (traits["batch_size"], traits["example"], traits["lengths"]) == (2, 1, [5, 3])
    assert panel_titles(page)[-1].startswith("5. Sentence 1 (length 3)")


# ---------------------------------------------------------------- keyboard
def listen_above(page):
    """Keydown listeners on the widget's ancestors, as the notebook's command handling has: what reaches them."""
    page.evaluate("""() => {
      window.heard = [];
      for (const node of [document, document.body, document.querySelector(".ac-widget").parentElement])
        node.addEventListener("keydown", (event) => window.heard.push(event.key));
    }""")


@pytest.mark.parametrize(("cls", "name"), [(MaskBroadcastWidget, "num_heads"), (HeadReshapeWidget, "embed_dim"),
                                           (DecodeCacheWidget, "num_heads")])
def test_sliders_keep_their_keys(page, cls, name):
    widget = render(page, cls(num_heads=2))
    for node in widget.locator("input[type=range]").all():
        assert node.get_attribute("data-lm-suppress-shortcuts") == "true"
    listen_above(page)
    slider = widget.locator(f"input[name={name}]")
    start = page.evaluate("window.traits")[name]
    slider.focus()
    before = widget.locator(".ac-picture").inner_html()
    page.keyboard.press("ArrowRight")
    assert page.evaluate("window.traits")[name] == start + 1
    assert slider.input_value() == str(start + 1)
    assert widget.locator(".ac-picture").inner_html() != before
    page.keyboard.press("ArrowLeft")
    page.keyboard.press("ArrowLeft")
    assert page.evaluate("window.traits")[name] == start - 1
    page.keyboard.press("End")
    assert page.evaluate("window.traits")[name] == int(slider.get_attribute("max"))
    page.keyboard.press("Tab")  # other keys still travel: the notebook keeps its shortcuts there
    assert page.evaluate("window.heard") == ["Tab"] * 3


# ---------------------------------------------------------------- the mask widget's panels
def colour(page, selector, prop="fill"):
    """The fill (or stroke) of the first element matching selector, as the browser draws it: (r, g, b) in 0..255."""
    rgb = page.evaluate("([selector, prop]) => getComputedStyle(document.querySelector(selector))[prop]",
                        [selector, prop])
    return tuple(int(c) for c in rgb[rgb.index("(") + 1:-1].split(",")[:3])


def test_contrast_helper_matches_known_ratios():
    assert contrast((255, 255, 255), (0, 0, 0)) == pytest.approx(21)
    assert contrast((118, 118, 118), (255, 255, 255)) == pytest.approx(4.54, abs=0.01)  # #767676, WCAG's AA grey


def test_mask_masked_and_kept_cells_contrast(page):
    render(page, MaskBroadcastWidget(causal=True, lengths=(5, 3, 2)))
    kept, pad, future = (colour(page, f".ac-picture rect.{cls}:not(.ac-shaded)") for cls in ("ac-ok", "ac-pad", "ac-fut"))
    assert contrast(kept, pad) >= 3 and contrast(kept, future) >= 3
    for masked in (pad, future):  # the cross drawn on a masked cell
        cls = "ac-pad" if masked == pad else "ac-fut"
        cross = colour(page, f".ac-picture g.ac-cell:has(rect.{cls}) path.ac-x", "stroke")
        assert contrast(masked, cross) >= 3
    from attention_course.widgets import mask_broadcast  # figure() and the legend draw with the same fills

    for cls, rgb in (("ac-ok", kept), ("ac-pad", pad), ("ac-fut", future)):
        value = {"ac-ok": mask_broadcast.KEPT, "ac-pad": mask_broadcast.PAD, "ac-fut": mask_broadcast.FUTURE}[cls]
        assert tuple(int(value[i:i + 2], 16) for i in (1, 3, 5)) == rgb, cls
        assert colour(page, f".ac-legend .ac-sw.{cls}", "backgroundColor") == rgb, cls


def test_mask_panels_name_keys_and_queries(page):
    widget = render(page, MaskBroadcastWidget(causal=True, num_heads=2))
    titles = panel_titles(page)
    assert titles[0].startswith("1. Key padding mask (B, S) = (3, 5)") and "(B, L)" not in titles[0]
    assert "(B, 1, S) → (B, L, S)" in titles[1] and "(B·h, L, S)" in titles[3]
    for panel in widget.locator(".ac-panel").all():  # every panel says what its rows and its columns are
        axes = panel.locator("text.ac-axis").all_text_contents()
        assert axes[:2] in (["keys (S)", "sentences"], ["keys", "queries"]), axes


def test_mask_allows_a_single_token(page):
    w = MaskBroadcastWidget(max_len=1, lengths=[1, 1, 1], causal=True, num_heads=2)
    assert w.state["weights"] == [[[1.0]]] * 3
    widget = render(page, w)
    assert widget.locator("input[name=max_len]").get_attribute("min") == "1"
    assert_same_state(js_state(page), w.state)
    widget.locator("input[name=max_len]").fill("3")
    widget.locator("input[name=max_len]").fill("1")
    assert page.evaluate("window.traits")["lengths"] == [1, 1, 1]


# ---------------------------------------------------------------- the head widget: D, tooltips, colour key
def test_head_js_D_keeps_h_or_says_why_it_moved(page):
    widget = render(page, HeadReshapeWidget(embed_dim=8, num_heads=4))
    notice = widget.locator(".ac-notice")
    widget.locator("input[name=embed_dim]").fill("12")  # 4 divides 12: kept, nothing to say
    assert page.evaluate("window.traits")["num_heads"] == 4 and notice.inner_text() == ""
    widget.locator("input[name=embed_dim]").fill("10")  # 4 does not divide 10: the nearest divisor, said
    assert page.evaluate("window.traits")["num_heads"] == 5
    assert notice.is_visible()
    assert notice.inner_text() == "h = 4 does not divide D = 10: h is now 5, the nearest head count that does."
    widget.locator("input[name=embed_dim]").focus()
    page.keyboard.press("ArrowRight")  # D = 11, a prime: h = 1, said
    assert page.evaluate("window.traits")["num_heads"] == 1 and "h is now 1" in notice.inner_text()
    page.keyboard.press("ArrowRight")  # D = 12 keeps h = 1: the notice goes
    assert page.evaluate("window.traits")["num_heads"] == 1 and notice.inner_text() == ""
    assert not notice.is_visible()


def test_nearest_divisor_matches_the_js():
    from attention_course.widgets.head_reshape import nearest_divisor

    assert [nearest_divisor(D, 4) for D in (8, 9, 10, 11, 12)] == [4, 3, 5, 1, 4]
    assert nearest_divisor(9, 2) == 1  # a tie (1 and 3): the smaller


def test_head_tooltip_is_on_the_number(page):
    widget = render(page, HeadReshapeWidget(batch_size=1, seq_len=2, embed_dim=4, num_heads=2))
    numbers = widget.locator(".ac-picture text.ac-num")
    assert numbers.count() == 5 * 8  # five panels of 8 numbers
    for n in (0, 13, 39):
        number = numbers.nth(n)
        box = number.bounding_box()
        title = page.evaluate("""([x, y]) => {  // what the reader points at, and the tooltip it shows
          const under = document.elementFromPoint(x, y);
          const cell = under.closest("g.ac-cell");
          return { tag: under.tagName, title: cell && cell.querySelector(":scope > title").textContent };
        }""", [box["x"] + box["width"] / 2, box["y"] + box["height"] / 2])
        v = int(number.text_content())
        token, head = (v - 1) // 4, (v - 1) % 4 // 2
        assert title == {"tag": "text", "title": f"{v}: sentence 0, token {token}, head {head}"}


@pytest.mark.parametrize("settings_", [{}, {"batch_size": 3, "seq_len": 3, "embed_dim": 12, "num_heads": 6},
                                       {"embed_dim": 5, "num_heads": 1}])
def test_head_colour_key_is_what_is_drawn(page, settings_):
    w = HeadReshapeWidget(**settings_)
    widget = render(page, w)
    B, L, D, h, d = (w.state["shape"][k] for k in "BLDhd")
    key = widget.locator(".ac-key rect.ac-keycell")
    fills = [node.get_attribute("style") for node in key.all()]
    assert len(fills) == B * L * h and len(set(fills)) == B * L * h  # one colour per (token, head), all different
    cells = page.evaluate("""() => [...document.querySelectorAll(".ac-picture g.ac-cell")]
      .filter((g) => g.querySelector("rect.ac-el:not(.ac-keycell)"))
      .map((g) => [Number(g.querySelector("text").textContent), g.querySelector("rect").getAttribute("style")])""")
    assert len(cells) == 5 * B * L * D
    for v, style in cells:
        token, head = (v - 1) // D, (v - 1) % D // d
        assert style == fills[token * h + head], v
    text = widget.locator(".ac-key-text").inner_text()
    assert "Hue: its token" in text and "Shade: its head" in text and f"{B * L} tokens" in text



def test_mask_widget_without_heads_keeps_one_head():
    """Chapter 3 comes before heads: show_heads=False keeps num_heads at 1 and says why otherwise."""
    w = MaskBroadcastWidget(show_heads=False, causal=True)
    assert w.num_heads == 1 and len(w.state["per_head_mask"]) == w.batch_size
    with pytest.raises(traitlets.TraitError, match="num_heads must be 1 in a widget made with show_heads=False"):
        w.num_heads = 2
    with pytest.raises(traitlets.TraitError, match="show_heads=False"):
        MaskBroadcastWidget(show_heads=False, num_heads=3)


def test_mask_figure_fits_the_page_column():
    """figure() is drawn at most 688 px wide (the page column at 1280 px), so its 8 pt text shows at 11 px."""
    import io
    import struct

    fig = MaskBroadcastWidget(batch_size=4, max_len=8, lengths=(8, 1, 5, 3), causal=True, example=3).figure()
    png = io.BytesIO()
    fig.savefig(png, format="png", bbox_inches="tight")
    width = struct.unpack(">II", png.getvalue()[16:24])[0]
    from matplotlib.text import Text

    smallest = min(t.get_fontsize() for t in fig.findobj(Text) if t.get_text().strip())
    assert width <= 688 and smallest * fig.dpi / 72 >= 9, (width, smallest)


def test_mask_js_without_heads_has_no_heads_panel_or_control(page):
    widget = render(page, MaskBroadcastWidget(causal=True, show_heads=False))
    titles = panel_titles(page)
    assert not any("head" in t for t in titles) and titles[-1].startswith("4. Sentence")
    assert not widget.locator("input[name=num_heads]").is_visible()
    assert_same_state(js_state(page), MaskBroadcastWidget(causal=True).state)


# ---------------------------------------------------------------- accessible: words, tables, keyboard, contrast
TABLES = """(el) => [...el.querySelectorAll('table')].map((t) => ({
  caption: t.caption ? t.caption.textContent : '',
  columns: [...t.tHead.rows[0].cells].map((c) => c.textContent),
  rows: [...t.tBodies[0].rows].map((r) => [...r.cells].map((c) => c.textContent)),
  headers: [...t.querySelectorAll('th')].map((c) => [c.parentElement.parentElement.tagName, c.getAttribute('scope')]),
}))"""

# Each cell of the picture named `start...`, row by row: its text, "x" for a cross, "" for neither.
DRAWN_CELLS = """(el, start) => {
  const svg = [...el.querySelectorAll('svg')].find((s) => s.getAttribute('aria-label').startsWith(start));
  return [...svg.querySelectorAll('g.ac-cell')].map((g) =>
    g.querySelector('text')?.textContent ?? (g.querySelector('path.ac-x') ? 'x' : ''));
}"""


def tables_of(widget) -> list[dict]:
    tables = widget.evaluate(TABLES)
    for table in tables:  # every table: a caption, its header cells scoped to their column or row
        assert table["caption"].strip()
        assert {tuple(h) for h in table["headers"]} <= {("THEAD", "col"), ("TBODY", "row")}, table["headers"]
    return tables


def drawn_cells(widget, start: str) -> list[str]:
    return widget.evaluate(DRAWN_CELLS, start)


def mask_widget_of(page) -> MaskBroadcastWidget:
    """A Python widget with the settings the page's stand-in model holds now."""
    traits = page.evaluate("window.traits")
    return MaskBroadcastWidget(**{k: traits[k] for k in MaskBroadcastWidget.SETTINGS}, show_heads=traits["show_heads"])


def check_mask_tables(widget, w: MaskBroadcastWidget):
    """The tables say what the picture draws and what torch computes (w.state)."""
    st, B, L, ex = w.state, w.batch_size, w.max_len, w.example
    tables = tables_of(widget)
    assert len(tables) == 1 + B + 2
    padding, masks, (scores, weights) = tables[0], tables[1:1 + B], tables[-2:]
    keys = [f"key {j}" for j in range(L)]
    assert padding["columns"] == ["sentence", "length", *keys]
    assert [r[:2] for r in padding["rows"]] == [[f"s{b}", str(n)] for b, n in enumerate(w.lengths)]
    assert [[c.startswith("True") for c in r[2:]] for r in padding["rows"]] == st["key_padding_mask"]
    assert drawn_cells(widget, "Key padding mask") == [c[0] for r in padding["rows"] for c in r[2:]]  # T / F
    for b, table in enumerate(masks):
        assert table["caption"].startswith(f"Sentence {b}: its mask (L, S)") and table["columns"] == ["query", *keys]
        assert [[c.startswith("True") for c in r[1:]] for r in table["rows"]] == st["combined_mask"][b]
        why = [[c[6:-1] for c in r[1:] if c != "False"] for r in table["rows"]]
        assert all(reason == ("pad" if st["key_padding_mask"][b][j] else "future")
                   for row, reasons in zip(st["combined_mask"][b], why)
                   for j, reason in zip([j for j, m in enumerate(row) if m], reasons))
        if w.causal:
            assert drawn_cells(widget, f"s{b} combined") == ["x" if c != "False" else "" for r in table["rows"] for c in r[1:]]
    assert scores["caption"].startswith(f"Sentence {ex}: scores") and weights["caption"].startswith(f"Sentence {ex}: weights")
    assert [r[0].split(" (")[0] for r in scores["rows"]] == [
        f"pad {i}" if st["query_is_pad"][ex][i] else f"q{i}" for i in range(L)]
    assert drawn_cells(widget, f"Scores of sentence {ex}") == [c.split(" ")[0] for r in scores["rows"] for c in r[1:]]
    assert drawn_cells(widget, f"Weights of sentence {ex}") == [
        "x" if c.startswith("0 (") else c for r in weights["rows"] for c in r[1:-1]]
    for i, row in enumerate(weights["rows"]):
        assert [0.0 if c.startswith("0 (") else float(c) for c in row[1:-1]] == pytest.approx(st["weights"][ex][i], abs=0.005)
        assert float(row[-1]) == pytest.approx(sum(st["weights"][ex][i]), abs=0.005)


@pytest.mark.parametrize("settings_", [{}, {"causal": True, "num_heads": 2, "example": 1},
                                       {"batch_size": 4, "max_len": 8, "lengths": (8, 1, 5, 3), "causal": True}])
def test_mask_tables_match_the_picture(page, settings_):
    widget = render(page, MaskBroadcastWidget(**settings_))
    check_mask_tables(widget, mask_widget_of(page))
    widget.locator("input[name=causal]").click()  # a control moves: the tables follow
    widget.locator("input[name=example]").fill("0")
    check_mask_tables(widget, mask_widget_of(page))


def check_head_tables(widget, w: HeadReshapeWidget):
    st = w.state
    B, L, D, h, d = (st["shape"][k] for k in "BLDhd")
    x, right, wrong = tables_of(widget)
    assert x["columns"] == ["token", *[f"f{f} (h{f // d})" for f in range(D)]]
    assert [[int(c) for c in r[1:]] for r in x["rows"]] == [row for s in st["x"] for row in s]
    assert [[int(c) for c in r[1:]] for r in right["rows"]] == [row for block in st["flat"] for row in block]
    assert [[int(c) for c in r[1:-1]] for r in wrong["rows"]] == [row for block in st["wrong"] for row in block]
    mixed = {tuple(r) for r in st["mixed_rows"]}
    assert [r[-1].endswith("(wrong)") for r in wrong["rows"]] == [(n, l) in mixed for n in range(B * h) for l in range(L)]
    # against the picture: every number drawn in the right and wrong panels, and the wrong panel's row labels
    drawn_right = widget.locator(".ac-compare .ac-col:not(.ac-wrong) g.ac-cell text").all_text_contents()
    assert drawn_right == [c for r in right["rows"] for c in r[1:]]
    drawn_wrong = widget.locator(".ac-wrong g.ac-cell text").all_text_contents()
    assert drawn_wrong == [c for r in wrong["rows"] for c in r[1:-1]]
    sources = [t for t in widget.locator(".ac-wrong svg > text").all_text_contents() if t.startswith("s")]
    assert sources == [r[-1].split(" (")[0] for r in wrong["rows"]]


def test_head_tables_match_the_picture(page):
    widget = render(page, HeadReshapeWidget())
    check_head_tables(widget, HeadReshapeWidget())
    widget.locator("button[name=num_heads][value='4']").click()
    widget.locator("input[name=seq_len]").fill("3")
    check_head_tables(widget, HeadReshapeWidget(seq_len=3, num_heads=4))


@pytest.mark.parametrize(("cls", "control"), [(MaskBroadcastWidget, "batch_size"), (HeadReshapeWidget, "batch_size"),
                                              (DecodeCacheWidget, "step")])
def test_tables_open_from_the_keyboard(page, cls, control):
    widget = render(page, cls())
    summary = widget.locator("details.ac-tables > summary")
    assert not widget.locator("table").first.is_visible()  # folded away until asked for
    widget.locator("input:visible, button:visible").last.focus()
    page.keyboard.press("Tab")  # the last control, then the summary: in the tab order
    assert page.evaluate("document.activeElement.tagName") == "SUMMARY" and "tables" in summary.inner_text()
    page.keyboard.press("Enter")
    assert widget.locator("table").first.is_visible()
    widget.locator(f"input[name={control}]").fill("1")  # redrawn: the tables change, and stay open
    assert widget.locator("details.ac-tables").get_attribute("open") is not None
    assert widget.locator("table").first.is_visible()


def test_mask_pictures_say_what_they_show_and_follow_the_controls(page):
    widget = render(page, MaskBroadcastWidget())  # lengths (5, 3, 2), sentence 2 shown
    words = picture_words(widget)
    assert all(role == "img" and len(name.split()) >= 5 for role, name in words["pictures"]), words["pictures"]
    for _, name in words["pictures"]:  # each an image in the accessibility tree, named so
        assert page.get_by_role("img", name=name, exact=True).count() >= 1, name
    assert words["pictures"][0][1] == ("Key padding mask (B, S) = (3, 5), True = pad, may not attend: s0, length 5: "
                                       "no pads; s1, length 3: keys 3 and 4 are pads; s2, length 2: keys 2 to 4 are pads.")
    assert words["live"] == ["Batch of 3 sentences of lengths 5, 3 and 2, padded to L = S = 5: the key padding mask "
                             "(B, 1, S) broadcast to (B, L, S) = (3, 5, 5); causal off; 1 head: (B·h, L, S) = (3, 5, 5). "
                             "Showing sentence 2 (of 0 to 2): 2 tokens and 3 pads."]
    scores = next(name for _, name in words["pictures"] if name.startswith("Scores"))
    assert scores.startswith("Scores of sentence 2") and "keys 2 to 4 (pads)" in scores and "queries 2 to 4 greyed" in scores

    widget.locator("input[name=example]").focus()
    page.keyboard.press("ArrowLeft")  # show sentence 1
    after = picture_words(widget)
    assert after["live"][0].endswith("Showing sentence 1 (of 0 to 2): 3 tokens and 2 pads.")
    scores = next(name for _, name in after["pictures"] if name.startswith("Scores"))
    assert scores.startswith("Scores of sentence 1") and "keys 3 and 4 (pads)" in scores

    widget.locator("input[name=causal]").check()
    widget.locator("input[name=num_heads]").fill("2")
    causal = picture_words(widget)
    assert "combined with the causal mask; 2 heads: (B·h, L, S) = (6, 5, 5)" in causal["live"][0]
    names = [name for _, name in causal["pictures"]]
    assert "Causal mask (L, S) = (5, 5): query i may not attend the keys after i; 10 of 25 cells blocked." in names
    w = mask_widget_of(page)
    for n in range(6):  # each head's copy: its sentence, and as many blocked cells as torch's per-head mask holds
        blocked = sum(map(sum, w.state["per_head_mask"][n]))
        assert f"[{n}] = s{n // 2} head {n % 2}: a copy of s{n // 2}'s combined mask, {blocked} of 25 cells blocked." in names

    region = widget.locator(".ac-sr[aria-live=polite]")  # polite, read whole, out of sight, in the accessibility tree
    assert region.count() == 1 and region.get_attribute("aria-atomic") == "true"
    box = region.bounding_box()
    assert box["width"] <= 1 and box["height"] <= 1
    assert "Showing sentence 1 (of 0 to 2)" in widget.aria_snapshot()


def test_head_pictures_say_what_they_show_and_follow_the_controls(page):
    widget = render(page, HeadReshapeWidget())
    words = picture_words(widget)
    assert all(role == "img" and len(name.split()) >= 5 for role, name in words["pictures"]), words["pictures"]
    assert words["live"] == ["(B, L, D) = (2, 4, 8) split into h = 2 heads of d = 4: reshape to (B, L, h, d) = "
                             "(2, 4, 2, 4), transpose to (B, h, L, d) = (2, 2, 4, 4), reshape to (B·h, L, d) = (4, 4, 4),"
                             " row n = b·h + head. Without the transpose, the direct reshape puts another token's or "
                             "another head's features in 12 of 16 rows."]
    widget.locator("button[name=num_heads][value='4']").click()
    after = picture_words(widget)
    assert after["pictures"] != words["pictures"]
    assert after["live"][0].startswith("(B, L, D) = (2, 4, 8) split into h = 4 heads of d = 2")
    st = HeadReshapeWidget(num_heads=4).state
    assert after["live"][0].endswith(f"in {len(st['mixed_rows'])} of 32 rows.")
    wrong = [name for _, name in after["pictures"] if "should be" in name]
    assert len(wrong) == 8
    for n, name in enumerate(wrong):  # each wrong row named as torch finds it
        bad = sum(1 for r in st["mixed_rows"] if r[0] == n)
        assert name.startswith(f"[{n}] should be s{n // 4} head {n % 4}; t0 holds {st['wrong'][n][0][0]} to ")
        assert name.count(", wrong") == bad
    widget.locator("button[name=num_heads][value='1']").click()
    assert picture_words(widget)["live"][0].endswith("agrees in all 8 rows: with one head there is nothing to mix.")


@pytest.mark.parametrize("key", ["Enter", "Space", "click"])
def test_head_button_keeps_the_focus(page, key):
    widget = render(page, HeadReshapeWidget())  # h = 2 of 1, 2, 4, 8
    for value in ("4", "1", "8"):
        before = widget.locator(".ac-picture").inner_html()
        button = widget.locator(f"button[name=num_heads][value='{value}']")
        if key == "click":
            button.click()
        else:
            button.focus()
            page.keyboard.press(key)
        assert page.evaluate("window.traits")["num_heads"] == int(value)
        assert widget.locator(".ac-picture").inner_html() != before
        assert button.get_attribute("aria-pressed") == "true"
        assert widget.locator("button[aria-pressed=true]").count() == 1
        assert page.evaluate("[document.activeElement.name, document.activeElement.value]") == ["num_heads", value]
    widget.locator("button[name=num_heads][value='2']").focus()
    page.keyboard.press(key if key != "click" else "Enter")
    page.keyboard.press("Tab")  # the keyboard goes on from the pressed button: to the next one
    assert page.evaluate("document.activeElement.value") == "4"


def test_head_buttons_keep_the_focus_when_D_changes_from_python(page):
    w = HeadReshapeWidget(embed_dim=8, num_heads=4)
    widget = render(page, w)
    widget.locator("button[name=num_heads][value='4']").focus()
    sent = record_messages(w)
    w.update(embed_dim=12)  # new choices 1, 2, 3, 4, 6, 12; 4 still among them
    apply(page, sent[0])
    assert widget.locator("button[name=num_heads]").all_inner_texts() == ["1", "2", "3", "4", "6", "12"]
    assert page.evaluate("document.activeElement.value") == "4"


def test_button_group_is_named_by_its_visible_label(page):
    w = HeadReshapeWidget()
    widget = render(page, w)
    group = page.get_by_role("group", name="heads h (divides D)", exact=True)
    assert group.count() == 1 and group.get_by_role("button").all_inner_texts() == ["1", "2", "4", "8"]
    label = page.locator(f"#{group.get_attribute('aria-labelledby')}")
    assert label.is_visible() and label.inner_text() == "heads h (divides D)"
    for node in widget.locator("[role=group], [role=radiogroup]").all():  # every group: named by text one sees
        ids = (node.get_attribute("aria-labelledby") or "").split()
        assert ids and all(page.locator(f"#{i}").is_visible() for i in ids)
    page.evaluate(RENDER, [w._esm, w._css, {"batch_size": 2, "seq_len": 4, "embed_dim": 8, "num_heads": 2}])  # a second view
    ids = page.evaluate("[...document.querySelectorAll('[id]')].map((e) => e.id)")
    assert len(ids) >= 2 and len(set(ids)) == len(ids)  # its own label ids: each group keeps its own name
    assert page.get_by_role("group", name="heads h (divides D)", exact=True).count() == 2


def test_text_colour_reaches_4_5_on_any_fill(page):
    """textOn(fill), which colours every label and cross drawn on a cell, on fills across the whole RGB cube."""
    from attention_course.widgets._base import HERE

    page.set_content("<!doctype html><html><body></body></html>")
    steps = list(range(0, 256, 15))
    pairs = page.evaluate("""([common, steps]) => {
      const textOn = new Function(common + "\\nreturn textOn;")();
      return steps.flatMap((r) => steps.flatMap((g) => steps.map((b) => [[r, g, b], textOn([r, g, b])])));
    }""", [(HERE / "_common.js").read_text(), steps])
    assert len(pairs) == len(steps) ** 3
    worst = min(contrast(fill, ink) for fill, ink in pairs)
    assert worst >= 4.5, worst


def sweep_contrast(page, states) -> int:
    """Apply each state to the rendered widget and check every drawn label and cross; the greyed labels checked."""
    greyed = 0
    for state in states:
        page.evaluate("(state) => window.applyState(state)", state)
        problems, marks = low_contrast_marks(page, "document")
        assert marks and not problems, (state, problems[:10])
        greyed += sum(1 for m in marks if m["greyed"] and m["kind"] == "text")
    return greyed


def test_mask_drawn_text_contrast_in_every_state(page):
    render(page, MaskBroadcastWidget(batch_size=4, max_len=8, lengths=(8, 1, 5, 3), num_heads=2))
    states = [{"batch_size": 4, "max_len": 8, "lengths": [8, 1, 5, 3], "causal": causal, "example": ex}
              for causal in (False, True) for ex in range(4)]
    states += [{"batch_size": 3, "max_len": L, "lengths": [L, (L + 1) // 2, 1], "causal": causal, "example": ex}
               for L in range(1, 8) for causal in (False, True) for ex in (1, 2)]
    assert sweep_contrast(page, states) > 100  # pad query rows (greyed) among them


def test_head_drawn_text_contrast_in_every_state(page):
    render(page, HeadReshapeWidget(batch_size=3, seq_len=6, embed_dim=12, num_heads=1))
    # the fills are the heads' colours: every number of heads once, 1 to 12, each with the widest embedding it divides
    states = [{"embed_dim": 12 // h * h, "num_heads": h} for h in range(1, 13)]
    assert {s["num_heads"] for s in states} == set(range(1, 13)) and all(s["embed_dim"] % s["num_heads"] == 0
                                                                          for s in states)
    sweep_contrast(page, states)


@pytest.mark.parametrize("cls", [MaskBroadcastWidget, HeadReshapeWidget, DecodeCacheWidget])
def test_focus_ring_contrast(page, cls):
    widget = render(page, cls())
    assert not focus_ring_problems(page, widget, "no page theme")


# ---------------------------------------------------------------- the decode widget in the browser
def decode_widget_of(page) -> DecodeCacheWidget:
    """A Python widget with the settings the page's stand-in model holds now."""
    traits = page.evaluate("window.traits")
    return DecodeCacheWidget(**{k: traits[k] for k in DecodeCacheWidget.SETTINGS})


def hatched_cells(widget) -> int:
    return widget.locator(".ac-picture g.ac-cell:has(rect.ac-out) path.ac-hatch").count()


@pytest.mark.parametrize("key", ["Enter", "Space", "click"])
def test_decode_step_buttons_keep_the_focus(page, key):
    """A step button that cannot act is disabled (the attribute, and so the accessible state a screen reader says);
    the one that stepped keeps the focus, and when it becomes disabled the focus goes to the other, not the page."""
    widget = render(page, DecodeCacheWidget(steps=3))  # step 2, the last
    previous, following = (widget.locator(f"button[name=step][value={v}]") for v in ("previous", "next"))
    assert following.is_disabled() and previous.is_enabled()

    def press(button):
        before = widget.locator(".ac-picture").inner_html()
        if key == "click":
            button.click()
        else:
            button.focus()
            page.keyboard.press(key)
        return widget.locator(".ac-picture").inner_html() != before

    assert press(previous) and page.evaluate("window.traits")["step"] == 1
    assert page.evaluate("[document.activeElement.name, document.activeElement.value]") == ["step", "previous"]
    assert following.is_enabled()
    assert press(previous) and page.evaluate("window.traits")["step"] == 0
    assert previous.is_disabled() and previous.get_attribute("disabled") is not None
    # at step 0 "previous" cannot act: disabled, out of the Tab order, and the focus it held moved to "next"
    assert page.evaluate("[document.activeElement.name, document.activeElement.value]") == ["step", "next"]
    assert press(following) and page.evaluate("window.traits")["step"] == 1
    assert previous.is_enabled() and following.is_enabled()
    assert widget.locator("input[name=step]").input_value() == "1"
    assert_same_state(js_state(page), decode_widget_of(page).state)


def test_decode_step_buttons_disabled_in_the_accessibility_tree(page):
    """What a screen reader hears: "previous step", unavailable at step 0; available after one step forward."""
    render(page, DecodeCacheWidget(steps=4, step=0))

    def states():  # get_by_role matches the accessible state, as the accessibility tree holds it
        return {name: page.get_by_role("button", name=f"{name} step", disabled=True).count() == 1
                for name in ("previous", "next")}

    assert states() == {"previous": True, "next": False}
    assert page.locator("button[name=step][value=previous]").get_attribute("disabled") is not None
    page.locator("button[name=step][value=next]").click()
    assert states() == {"previous": False, "next": False}
    assert page.get_by_role("button", name="previous step", disabled=False).count() == 1


def test_decode_heads_slider_keeps_kv_heads_dividing(page):
    widget = render(page, DecodeCacheWidget(num_heads=4, num_kv_heads=2))
    notice, kv = widget.locator(".ac-notice"), widget.locator("button[name=num_kv_heads]")
    assert kv.all_inner_texts() == ["1", "2", "4"] and notice.inner_text() == ""
    widget.locator("input[name=num_heads]").fill("3")  # 2 does not divide 3: the largest divisor below it, said
    assert page.evaluate("window.traits")["num_kv_heads"] == 1 and kv.all_inner_texts() == ["1", "3"]
    assert notice.inner_text() == "h_kv = 2 does not divide h = 3: h_kv is now 1, the largest KV head count below it that does."
    widget.locator("input[name=num_heads]").fill("6")  # 1 divides 6: kept, nothing to say
    assert page.evaluate("window.traits")["num_kv_heads"] == 1 and notice.inner_text() == ""
    widget.locator("button[name=num_kv_heads][value='3']").click()
    assert widget.locator("button[aria-pressed=true]").all_inner_texts() == ["3"]
    assert len(widget.locator(".ac-multiples figure").all()) == 3  # a figure per KV head
    assert_same_state(js_state(page), DecodeCacheWidget(num_heads=6, num_kv_heads=3).state)


def test_decode_kv_buttons_keep_the_focus_when_h_changes_from_python(page):
    w = DecodeCacheWidget(num_heads=4, num_kv_heads=2)
    widget = render(page, w)
    widget.locator("button[name=num_kv_heads][value='2']").focus()
    sent = record_messages(w)
    w.update(num_heads=8)  # new choices 1, 2, 4, 8; 2 still among them
    apply(page, sent[0])
    assert widget.locator("button[name=num_kv_heads]").all_inner_texts() == ["1", "2", "4", "8"]
    assert page.evaluate("document.activeElement.value") == "2"
    group = page.get_by_role("group", name="KV heads h_kv (divides h)", exact=True)
    assert group.count() == 1 and group.get_by_role("button").count() == 4


def test_decode_window_greys_and_hatches_the_keys_outside_it(page):
    widget = render(page, DecodeCacheWidget())  # 4 query heads over 2 KV heads, step 7, no window
    W = widget.locator("input[name=window]")
    assert not W.is_visible() and hatched_cells(widget) == 0 and widget.locator(".ac-sw.ac-out").count() == 0
    widget.locator("input[name=window_on]").check()
    assert page.evaluate("window.traits")["window"] == 4 and W.is_visible()  # half the generation, to start with
    W.fill("2")
    assert hatched_cells(widget) == (2 + 4) * 6  # 6 of the 8 positions, in the 2 cache rows and the 4 query rows
    assert widget.locator(".ac-sw.ac-out").count() == 1
    widget.locator("input[name=window_on]").uncheck()
    assert page.evaluate("window.traits")["window"] is None and hatched_cells(widget) == 0
    widget.locator("input[name=window_on]").check()  # the window comes back as it was
    assert page.evaluate("window.traits")["window"] == 2
    widget.locator("input[name=steps]").fill("3")  # fewer steps: the step and the window follow, as in Python
    traits = page.evaluate("window.traits")
    assert (traits["steps"], traits["step"], traits["window"]) == (3, 2, 2)
    assert_same_state(js_state(page), decode_widget_of(page).state)
    w = DecodeCacheWidget(steps=10, step=9, window=8)
    w.steps = 3
    assert (w.step, w.window) == (2, 3)
    render(page, DecodeCacheWidget(steps=10, step=9, window=8)).locator("input[name=steps]").fill("3")
    assert page.evaluate("[window.traits.step, window.traits.window]") == [2, 3]


def test_decode_outside_cells_differ_in_lightness_and_pattern(page):
    render(page, DecodeCacheWidget(num_heads=8, num_kv_heads=8, window=2, step=7))
    grey = colour(page, ".ac-picture rect.ac-out")
    hatch = colour(page, ".ac-picture path.ac-hatch", "stroke")
    assert contrast(grey, hatch) >= 3
    for g in range(8):  # each KV head's fill, as drawn
        kept = colour(page, f".ac-picture svg:first-of-type g.ac-cell:nth-of-type({8 * g + 7}) rect", "fill")
        assert kept != grey and contrast(kept, grey) >= 3, g
    from attention_course.widgets.decode_cache import OUTSIDE

    assert tuple(int(OUTSIDE[i:i + 2], 16) for i in (1, 3, 5)) == grey
    assert colour(page, ".ac-legend .ac-sw.ac-out", "backgroundColor") == grey


def test_decode_pictures_say_what_they_show_and_follow_the_controls(page):
    widget = render(page, DecodeCacheWidget(window=3, step=5))
    words = picture_words(widget)
    assert [role for role, _ in words["pictures"]] == ["img"] * 3  # the cache, then a picture per KV head
    assert [name for _, name in words["pictures"]] == [
        "The cache's keys after step 5: 2 KV heads (rows) by 6 key positions, 0 to 5 (columns). The new query reads "
        "positions 3 to 5, not positions 0 to 2 (hatched: outside the window).",
        "Query heads 0 and 1 (rows) each read the keys of KV head 0 (columns, positions 0 to 5): positions 3 to 5, "
        "not positions 0 to 2 (hatched: outside the window).",
        "Query heads 2 and 3 (rows) each read the keys of KV head 1 (columns, positions 0 to 5): positions 3 to 5, "
        "not positions 0 to 2 (hatched: outside the window).",
    ]
    assert words["live"] == [
        "Step t = 5 (of 0 to 7): the new token at position 5 has added its key and value, so the cache holds 6 "
        "positions per KV head (positions 0 to 5). Decode step: only position 5's key and value are computed now; "
        "positions 0 to 4 are reused from the cache, not recomputed (position 0 at step 0, each later one at its own "
        "step). 4 query heads share 2 KV heads, 2 each (grouped-query attention): "
        "query heads 0 and 1 read KV head 0 and query heads 2 and 3 read KV head 1. Sliding window W = 3: it reads "
        "positions 3 to 5; positions 0 to 2 are outside the window, and a rolling cache of 3 entries has dropped "
        "them. Cache per layer: 6,144 bytes; rolling cache: 3,072 bytes."]
    s = DecodeCacheWidget(window=3, step=5).state
    assert "6,144 bytes" in words["live"][0] and s["cache_bytes"] == 6144 and s["rolling_bytes"] == 3072
    summary = widget.locator(".ac-summary").inner_text()
    assert "keeps 3 (positions 3 to 5), and never more than 3" in summary and "12,288 bytes, 2 times as much" in summary

    widget.locator("input[name=step]").focus()
    page.keyboard.press("Home")  # step 0: one key, inside any window
    after = picture_words(widget)
    assert after["live"][0].startswith("Step t = 0 (of 0 to 7): the new token at position 0 has added its key and "
                                       "value, so the cache holds 1 position per KV head (position 0).")
    assert "it reads position 0, the whole cache: nothing is outside the window yet." in after["live"][0]
    assert after["pictures"][1][1].endswith("each read the keys of KV head 0 (columns, position 0): position 0, the "
                                            "whole cache.")
    widget.locator("button[name=num_kv_heads][value='1']").click()
    mqa = picture_words(widget)
    assert "4 query heads share 1 KV head, 4 each (multi-query attention): query heads 0 to 3 read KV head 0." \
        in mqa["live"][0]
    widget.locator("button[name=num_kv_heads][value='4']").click()
    assert "4 query heads with a KV head each (multi-head attention, no sharing)." in picture_words(widget)["live"][0]
    region = widget.locator(".ac-sr[aria-live=polite]")
    assert region.count() == 1 and region.get_attribute("aria-atomic") == "true"
    assert "multi-head attention, no sharing" in widget.aria_snapshot()


def test_decode_tables_match_the_picture(page):
    widget = render(page, DecodeCacheWidget(num_heads=6, num_kv_heads=2, window=4, steps=10, step=6))
    for moved in (False, True):
        w = decode_widget_of(page)
        s = w.state
        reads, sizes = tables_of(widget)
        cols = [f"key {j}" for j in s["key_positions"]]
        assert reads["columns"] == ["query head", "reads KV head", *cols]
        assert [r[:2] for r in reads["rows"]] == [[f"q{j}", f"kv{g}"] for j, g in enumerate(s["kv_head_of_query"])]
        assert [[c != "read" for c in r[2:]] for r in reads["rows"]] == s["ignore_mask"]
        for g in range(w.num_kv_heads):  # each KV head's picture: a position where read, hatching where not
            heads = [j for j, kv in enumerate(s["kv_head_of_query"]) if kv == g]
            name = f"Query heads {heads[0]} to {heads[-1]}" if len(heads) > 2 else f"Query heads {heads[0]} and {heads[1]}"
            drawn = drawn_cells(widget, name)  # the key computed at this step is starred ("6*"), the others reused
            assert [c.rstrip("*") for c in drawn] == [c.split(" ")[0].replace("read", str(p)).replace("not", "x")
                                                      for r in reads["rows"] if r[0] in [f"q{j}" for j in heads]
                                                      for p, c in enumerate(r[2:])]
            assert {c for c in drawn if c.endswith("*")} <= {f"{s['key_positions'][-1]}*"}
        assert [r[0].split(" ")[0] for r in sizes["rows"]] == [str(n) for n in range(w.steps)]
        assert sizes["rows"][w.step][0] == f"{w.step} (shown)"
        assert [[int(r[1]), int(r[3])] for r in sizes["rows"]] == s["entries_by_step"]
        assert [int(r[2].split(" ")[0].replace(",", "")) for r in sizes["rows"]] == [
            full * s["bytes_per_position"] for full, _ in s["entries_by_step"]]
        if not moved:
            widget.locator("input[name=num_heads]").fill("8")  # h_kv 2 still divides: 4 query heads a KV head
            widget.locator("button[name=step][value=next]").click()


def test_decode_drawn_text_contrast_in_every_state(page):
    render(page, DecodeCacheWidget(num_heads=8, num_kv_heads=8, steps=16))
    states = [{"num_heads": h, "num_kv_heads": k, "window": W, "steps": 16, "step": 15}
              for h in range(1, 9) for k in range(1, h + 1) if h % k == 0 for W in (None, 1)]
    assert len(states) == 40  # every head pairing, every KV head's fill; with W = 1, hatching on all keys but one
    sweep_contrast(page, states)
    problems, marks = low_contrast_marks(page, "document")
    assert not problems and sum(m["kind"] == "cross" for m in marks) == (8 + 8) * 15  # the hatching of every cell
