"""The two widgets: their Python state against torch and the package, their checks, and their ES modules.

The ES modules draw the pictures in the browser from the traits alone; the last tests run them in Chromium with a
stand-in model (no kernel, as on the static site) and compare what they compute with the Python state.
"""
import json

import pytest
import torch
import traitlets
from hypothesis import given, settings
from hypothesis import strategies as st
from test_site import shared_browser

from attention_course.functional import masked_softmax
from attention_course.heads import split_heads, split_heads_flat
from attention_course.masks import causal_mask, merge_masks, padding_mask
from attention_course.widgets import HeadReshapeWidget, MaskBroadcastWidget


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
    L = data.draw(st.integers(2, 8))
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
    w.set_state({"batch_size": 2, "lengths": [1, 2]})
    assert (w.batch_size, w.lengths) == (2, [1, 2])


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"lengths": [6, 1, 1]}, "lengths[0] must be an integer from 1 to 5, got 6"),
        ({"lengths": [0, 1, 1]}, "at least one real token"),
        ({"lengths": [1, 1]}, "one length per sentence (batch_size=3), got 2"),
        ({"batch_size": 5}, "batch_size must be an integer from 1 to 4"),
        ({"max_len": 9}, "max_len must be an integer from 2 to 8"),
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
    with pytest.raises(traitlets.TraitError, match="raise max_len first"):
        MaskBroadcastWidget(max_len=4, lengths=(5, 3, 2))
    assert MaskBroadcastWidget(batch_size=2).lengths == [5, 3]


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
    w.set_state({"embed_dim": 6, "num_heads": 3})
    assert w.state["shape"]["d"] == 2 and w.valid_num_heads == [1, 2, 3, 6]
    with pytest.raises(traitlets.TraitError, match="choose num_heads among 1, 2, 3, 6"):
        HeadReshapeWidget(embed_dim=6, num_heads=4)
    with pytest.raises(traitlets.TraitError, match="seq_len must be an integer from 1 to 6"):
        HeadReshapeWidget(seq_len=7)


@pytest.mark.parametrize("widget", [MaskBroadcastWidget(causal=True, lengths=(4, 2, 1)), HeadReshapeWidget()],
                         ids=lambda w: type(w).__name__)
def test_figure_draws(widget):
    import matplotlib.pyplot as plt

    fig = widget.figure()
    assert len(fig.axes) >= 3
    plt.close(fig)


def test_widgets_are_one_anywidget_model_with_their_code():
    for w in (MaskBroadcastWidget(), HeadReshapeWidget()):
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
  const module = await import(URL.createObjectURL(new Blob([esm], { type: "text/javascript" })));
  const el = document.createElement("div");
  document.body.append(el);
  module.default.render({ model, el });
}"""


def render(page, widget):
    traits = {name: getattr(widget, name) for name in widget.trait_names(sync=True) if not name.startswith("_")}
    traits = {k: v for k, v in traits.items() if isinstance(v, (int, bool, list))}
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


@pytest.fixture
def page(browser):
    page = browser.new_page(viewport={"width": 900, "height": 900})
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    yield page
    page.close()
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
