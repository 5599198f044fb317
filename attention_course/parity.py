"""Checking that two attention layers compute the same numbers, and saying where they do not.

* :func:`copy_weights` -- copy the weights of one layer into another (torch's or ours, either direction);
* :func:`compare` -- run both layers on the same random inputs and masks, backpropagate the same loss, and
  report the largest absolute error (and where it is) and the largest error relative to the tolerance, as
  ``torch.testing.assert_close`` judges it, for the outputs, weights and gradients;
* :func:`assert_close_report` -- ``torch.testing.assert_close`` whose message shows the worst element.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
from torch import nn

from .checks import check_tensor
from .masks import causal_mask, padding_mask
from .multihead import MultiheadAttention

# Default tolerances per dtype, those of torch.testing.assert_close: (rtol, atol).
TOLERANCES = {
    torch.float16: (1e-3, 1e-5),
    torch.bfloat16: (1.6e-2, 1e-5),
    torch.float32: (1.3e-6, 1e-5),
    torch.float64: (1e-7, 1e-7),
}
MASKS = ("none", "padding", "causal", "padding+causal")
_LAYERS = (MultiheadAttention, nn.MultiheadAttention)


def _tolerances(dtype: torch.dtype, atol: float | None, rtol: float | None) -> tuple[float, float]:
    default_rtol, default_atol = TOLERANCES.get(dtype, (0.0, 0.0))
    return (default_atol if atol is None else atol), (default_rtol if rtol is None else rtol)


def _check_layer(m, name: str) -> None:
    if not isinstance(m, _LAYERS):
        raise TypeError(
            f"{name} must be an attention_course MultiheadAttention or a torch.nn.MultiheadAttention, "
            f"got {type(m).__name__}."
        )
    if getattr(m, "bias_k", None) is not None or getattr(m, "add_zero_attn", False):
        raise ValueError(f"{name} uses add_bias_kv or add_zero_attn, which attention_course does not support.")


def copy_weights(src: nn.Module, dst: nn.Module) -> None:
    """Copy every weight of ``src`` into ``dst`` (each ours or torch's MultiheadAttention), keeping dst's dtype/device."""
    _check_layer(src, "src")
    _check_layer(dst, "dst")
    for attr in ("embed_dim", "num_heads", "kdim", "vdim"):
        if getattr(src, attr) != getattr(dst, attr):
            raise ValueError(
                f"src and dst must have the same {attr}, got {getattr(src, attr)} and {getattr(dst, attr)}: "
                f"build dst with {attr}={getattr(src, attr)}."
            )
    if (src.in_proj_bias is None) != (dst.in_proj_bias is None):
        raise ValueError("src and dst must both have biases or both not (bias=True / bias=False).")
    dst.load_state_dict(src.state_dict())


def _error_stats(actual: torch.Tensor, expected: torch.Tensor, atol: float, rtol: float):
    """(max abs error, its index, max error / tolerance, its index); a NaN on one side only counts as inf.

    error / tolerance is ``|actual - expected| / (atol + rtol * |expected|)``, the measure of
    ``torch.testing.assert_close``: <= 1 is close. Unlike ``|actual - expected| / |expected|`` it means something
    where the expected value is exactly 0 (the gradient of the key bias, for one).
    """
    actual, expected = actual.detach().double().cpu(), expected.detach().double().cpu()
    if actual.numel() == 0:
        return 0.0, (), 0.0, ()
    same = (actual == expected) | (actual.isnan() & expected.isnan())  # inf = inf, NaN = NaN
    abs_err = (actual - expected).abs().nan_to_num(nan=float("inf"), posinf=float("inf")).masked_fill(same, 0.0)
    ratio = abs_err / (atol + rtol * expected.abs())
    ratio = ratio.masked_fill(abs_err == 0, 0.0)  # 0 / 0 with atol = rtol = 0: equal, so 0
    i, j = int(abs_err.argmax()), int(ratio.argmax())
    as_index = lambda flat: tuple(int(n) for n in torch.unravel_index(torch.tensor(flat), actual.shape))  # noqa: E731
    return abs_err.view(-1)[i].item(), as_index(i), ratio.view(-1)[j].item(), as_index(j)


def assert_close_report(actual, expected, name: str = "tensor", atol: float | None = None, rtol: float | None = None):
    """Raise AssertionError unless ``|actual - expected| <= atol + rtol * |expected|`` everywhere.

    Like ``torch.testing.assert_close`` (same default tolerances per dtype; NaN only equals NaN), but the message
    gives the largest absolute error and the largest error / tolerance, the index of each and the two values there.
    """
    check_tensor(actual, "actual")
    check_tensor(expected, "expected")
    if actual.shape != expected.shape:
        raise AssertionError(f"{name}: shape {tuple(actual.shape)} differs from expected {tuple(expected.shape)}.")
    if actual.dtype != expected.dtype:
        raise AssertionError(
            f"{name}: dtype {actual.dtype} differs from expected {expected.dtype}; convert with .to({expected.dtype})."
        )
    atol, rtol = _tolerances(expected.dtype, atol, rtol)
    close = torch.isclose(actual.detach(), expected.detach().to(actual.device), rtol=rtol, atol=atol, equal_nan=True)
    if bool(close.all()):
        return
    max_abs, i, max_ratio, j = _error_stats(actual, expected, atol, rtol)
    raise AssertionError(
        f"{name} is not close: {int((~close).sum())} of {close.numel()} elements differ beyond "
        f"atol={atol:g} + rtol={rtol:g} * |expected|.\n"
        f"  greatest absolute error {max_abs:.3g} at index {i}: actual {actual[i].item():.8g}, "
        f"expected {expected[i].item():.8g}\n"
        f"  greatest |actual - expected| / (atol + rtol * |expected|) {max_ratio:.3g} (> 1 fails) at index {j}: "
        f"actual {actual[j].item():.8g}, expected {expected[j].item():.8g}"
    )


@dataclass
class Difference:
    """How one quantity (an output, the weights, a gradient) of layer a differs from layer b's."""

    name: str
    actual: torch.Tensor = field(repr=False)
    expected: torch.Tensor = field(repr=False)

    def __post_init__(self):
        atol, rtol = _tolerances(self.expected.dtype, None, None)
        self.max_abs, self.abs_index, self.max_ratio, self.ratio_index = _error_stats(
            self.actual, self.expected, atol, rtol)

    def ratio(self, atol: float | None = None, rtol: float | None = None) -> float:
        """max |actual - expected| / (atol + rtol * |expected|), at the dtype's default tolerances unless given."""
        atol, rtol = _tolerances(self.expected.dtype, atol, rtol)
        return _error_stats(self.actual, self.expected, atol, rtol)[2]

    def ok(self, atol: float | None = None, rtol: float | None = None) -> bool:
        atol, rtol = _tolerances(self.expected.dtype, atol, rtol)
        return bool(torch.isclose(self.actual, self.expected, rtol=rtol, atol=atol, equal_nan=True).all())

    def row(self, atol: float | None = None, rtol: float | None = None) -> str:
        return f"{self.name:<26}{self.max_abs:>14.2e}{self.ratio(atol, rtol):>13.2e}  {self.abs_index}"

    def __str__(self) -> str:
        return self.row()


@dataclass
class ParityReport:
    """The differences between two layers on the same inputs; ``ok()`` says whether they all are small."""

    setting: str
    differences: list[Difference]

    def __getitem__(self, name: str) -> Difference:
        for d in self.differences:
            if d.name == name:
                return d
        raise KeyError(f"no quantity {name!r}; the report has {[d.name for d in self.differences]}.")

    def ok(self, atol: float | None = None, rtol: float | None = None) -> bool:
        return all(d.ok(atol, rtol) for d in self.differences)

    def table(self, atol: float | None = None, rtol: float | None = None) -> str:
        """The report; err/tol and "all close" at the given tolerances, else the dtype's defaults."""
        dtype = self.differences[0].expected.dtype
        a, r = _tolerances(dtype, atol, rtol)
        which = f"{dtype}'s defaults" if atol is None and rtol is None else "given"
        rows = [self.setting,
                "err/tol = max |a - b| / (atol + rtol * |b|), <= 1 is close",
                f"(as assert_close judges; atol={a:g}, rtol={r:g}, {which})",
                f"{'quantity':<26}{'max abs error':>14}{'max err/tol':>13}  where (abs)"]
        rows += [d.row(atol, rtol) for d in self.differences]
        rows.append(f"all close at these tolerances: {self.ok(atol, rtol)}")
        return "\n".join(rows)

    def __str__(self) -> str:
        return self.table()

    __repr__ = __str__


def _make_masks(masks, B: int, L: int, S: int, generator: torch.Generator, device):
    """(key_padding_mask, attn_mask) for a name in MASKS, or taken from a dict; no query is left without keys."""
    if isinstance(masks, dict):
        return masks.get("key_padding_mask"), masks.get("attn_mask")
    if masks not in MASKS:
        raise ValueError(f"masks must be one of {MASKS} or a dict with key_padding_mask / attn_mask, got {masks!r}.")
    lengths = torch.randint(1, S + 1, (B,), generator=generator)  # at least one real key, at position 0
    key_padding_mask = padding_mask(lengths, S, device=device) if "padding" in masks else None
    attn_mask = causal_mask(L, S, device=device) if "causal" in masks else None
    return key_padding_mask, attn_mask


def _run(layer, inputs, masks, grad_out, grad_weights, need_weights, average_attn_weights):
    """Forward and backward of one layer; returns {name: tensor} of outputs and gradients."""
    inputs = [x.clone().requires_grad_() for x in inputs]
    if len(inputs) == 1:  # self-attention: the same tensor three times, as a layer sees it
        query = key = value = inputs[0]
    elif len(inputs) == 2:  # cross-attention with key is value
        query, key, value = inputs[0], inputs[1], inputs[1]
    else:
        query, key, value = inputs
    key_padding_mask, attn_mask = masks
    out, weights = layer(
        query, key, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask,
        need_weights=need_weights, average_attn_weights=average_attn_weights,
    )
    loss = (out * grad_out).sum() + (0 if weights is None else (weights * grad_weights).sum())
    loss.backward()
    results = {"output": out, "weights": weights}
    names = ["grad input"] if len(inputs) == 1 else ["grad query", "grad key", "grad value"][: len(inputs)]
    results.update({name: x.grad for name, x in zip(names, inputs)})
    results.update({f"grad {name}": p.grad for name, p in layer.named_parameters()})
    return {name: t.detach() for name, t in results.items() if t is not None}


def compare(
    a: nn.Module,
    b: nn.Module,
    *,
    batch_size: int = 2,
    query_len: int = 5,
    key_len: int | None = None,
    masks="padding",
    seed: int = 0,
    dtype: torch.dtype | None = torch.float64,
    need_weights: bool = True,
    average_attn_weights: bool = True,
) -> ParityReport:
    """Run layers ``a`` and ``b`` (ours or torch's) on the same inputs and compare everything they compute.

    The layers are copied (converted to ``dtype`` unless it is None, and put in eval mode, so dropout is off);
    they should already hold the same weights (see :func:`copy_weights`). Self-attention when ``key_len`` is
    None, else cross-attention over ``key_len`` keys. ``masks``: one of ``"none"``, ``"padding"`` (random
    lengths >= 1), ``"causal"``, ``"padding+causal"``, or a dict with ``key_padding_mask`` and/or
    ``attn_mask``. Compares the output, the weights (with ``need_weights``), and the gradients of a random loss
    with respect to the inputs and to every parameter.
    """
    _check_layer(a, "a")
    _check_layer(b, "b")
    a, b = (copy.deepcopy(m).eval() for m in (a, b))
    if dtype is not None:
        a, b = a.to(dtype), b.to(dtype)
    weight = next(a.parameters())
    B, L = batch_size, query_len
    S = L if key_len is None else key_len
    gen = torch.Generator().manual_seed(seed)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=weight.dtype).to(weight.device)  # noqa: E731
    if key_len is None:
        inputs = [randn(B, L, a.embed_dim)]
    elif a.kdim == a.vdim:
        inputs = [randn(B, L, a.embed_dim), randn(B, S, a.kdim)]  # key is value
    else:
        inputs = [randn(B, L, a.embed_dim), randn(B, S, a.kdim), randn(B, S, a.vdim)]
    mask_pair = _make_masks(masks, B, L, S, gen, weight.device)
    grad_out, grad_weights = randn(B, L, a.embed_dim), randn(B, a.num_heads, L, S)
    if average_attn_weights:
        grad_weights = grad_weights[:, 0]
    run = lambda m: _run(m, inputs, mask_pair, grad_out, grad_weights, need_weights, average_attn_weights)  # noqa: E731
    got, want = run(a), run(b)
    if got.keys() != want.keys():
        raise ValueError(f"a and b computed different things: {sorted(got)} and {sorted(want)}.")
    label = masks if isinstance(masks, str) else "custom"
    setting = (f"a vs b in {weight.dtype}: B={B}, L={L}, S={S}\n"
               f"masks={label!r}, need_weights={need_weights}")
    return ParityReport(setting, [Difference(name, got[name], want[name]) for name in got])
