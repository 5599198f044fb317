"""Speed of our MultiheadAttention against torch's, measured on this machine: ``python -m attention_course.bench``.

Parity before speed: each implementation is first checked against ``nn.MultiheadAttention`` on the benchmark's
own inputs (output and input gradient). Then the implementations run interleaved, repeat after repeat, and the
table gives the median time of each and the median of the per-repeat ratios to torch's ``need_weights=False``
(ratio < 1: faster than torch). "forward" runs in eval mode under ``torch.no_grad()``; "fwd+bwd" runs in
training mode (dropout 0) and backpropagates the sum of the output into the input and every parameter.

The compiled rows (``torch.compile(layer, fullgraph=True)``, torch's layer and ours; ``--no-compile`` leaves them
out) are checked like the others; their first calls compile, in the parity check and the warm-up, so the times are
those of the compiled code alone.
"""
from __future__ import annotations

import argparse
import os
import statistics
import time

import torch
from torch import nn

from .masks import padding_mask
from .multihead import MultiheadAttention
from .parity import assert_close_report

NAMES = ("torch (need_weights=False)", "ours fused (need_weights=False)", "ours explicit (need_weights=True)")
COMPILED_NAMES = ("torch compiled (need_weights=False)", "ours compiled (need_weights=False)")


def make_layers(D: int, h: int) -> tuple[nn.MultiheadAttention, MultiheadAttention]:
    """torch's layer with random non-zero biases, and ours holding the same weights."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, h, batch_first=True)
    with torch.no_grad():  # torch starts the biases at zero, which would hide a missing bias
        ref.in_proj_bias.uniform_(-0.5, 0.5)
        ref.out_proj.bias.uniform_(-0.5, 0.5)
    return ref, MultiheadAttention.from_torch(ref)


def implementations(ref, ours, mask, compiled=()):
    """One function x -> output per entry of NAMES, then of COMPILED_NAMES when ``compiled`` holds the two
    compiled layers (self-attention with key padding ``mask`` or None)."""
    funcs = [
        lambda x: ref(x, x, x, key_padding_mask=mask, need_weights=False)[0],
        lambda x: ours(x, x, x, key_padding_mask=mask, need_weights=False)[0],
        lambda x: ours(x, x, x, key_padding_mask=mask, need_weights=True)[0],
    ]
    for layer in compiled:
        funcs.append(lambda x, layer=layer: layer(x, x, x, key_padding_mask=mask, need_weights=False)[0])
    return funcs


def check_parity(funcs, x: torch.Tensor, names=NAMES) -> None:
    """Raise AssertionError unless every function's output and input gradient match the first one's."""
    results = []
    for f in funcs:
        xg = x.clone().requires_grad_()
        out = f(xg)
        out.sum().backward()
        results.append((out.detach(), xg.grad))
    for name, (out, grad) in zip(names[1:], results[1:]):
        assert_close_report(out, results[0][0], f"{name}: output", atol=1e-4, rtol=1e-4)
        assert_close_report(grad, results[0][1], f"{name}: input gradient", atol=1e-4, rtol=1e-4)


def _time_once(f, x: torch.Tensor, backward: bool) -> float:
    if backward:
        x = x.detach().requires_grad_()
        start = time.perf_counter()
        f(x).sum().backward()
    else:
        start = time.perf_counter()
        with torch.no_grad():
            f(x)
    return time.perf_counter() - start


def measure(funcs, layers, x: torch.Tensor, backward: bool, repeats: int) -> tuple[list[float], list[float]]:
    """Median seconds per function, and median over repeats of each function's time / the first's."""
    for layer in layers:
        layer.train(backward)
    times = [[] for _ in funcs]
    for _ in range(2):  # warm-up
        for f in funcs:
            _time_once(f, x, backward)
    for r in range(repeats):
        order = list(range(len(funcs)))
        order = order[r % len(order):] + order[: r % len(order)]  # rotate who goes first
        for i in order:
            for layer in layers:
                layer.zero_grad(set_to_none=True)
            times[i].append(_time_once(funcs[i], x, backward))
    medians = [statistics.median(t) for t in times]
    ratios = [statistics.median(t / t0 for t, t0 in zip(ts, times[0])) for ts in times]
    return medians, ratios


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(prog="python -m attention_course.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--quick", action="store_true", help="small sizes (B=2, L=64, D=64, h=4) and 3 repeats")
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="leave out the compiled rows")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled rows")
    args = parser.parse_args(argv)
    if args.quick:
        args.batch, args.length, args.dim, args.heads, args.repeats = 2, 64, 64, 4, 3
    B, L, D, h = args.batch, args.length, args.dim, args.heads
    ref, ours = make_layers(D, h)
    compiled = [torch.compile(m, fullgraph=True, backend=args.backend) for m in (ref, ours)] if args.compile else []
    names = NAMES + (COMPILED_NAMES if args.compile else ())
    x = torch.randn(B, L, D)
    masks = {"none": None, "padding": padding_mask(torch.linspace(L // 2, L, B).long(), L)}
    load_before = os.getloadavg()[0]
    lines = [
        f"B={B}, L={L}, D={D}, heads={h}, float32, {torch.get_num_threads()} threads, torch {torch.__version__}; "
        f"median of {args.repeats} interleaved repeats"
        + (f"; compiled rows: torch.compile(fullgraph=True, backend={args.backend!r})" if args.compile else ""),
        f"{'mask':<9}{'implementation':<37}{'forward ms':>11}{'ratio':>7}{'fwd+bwd ms':>12}{'ratio':>7}",
    ]
    for mask_name, mask in masks.items():
        funcs = implementations(ref, ours, mask, compiled)
        check_parity(funcs, x, names)  # parity before speed
        fwd, fwd_ratio = measure(funcs, (ref, ours), x, backward=False, repeats=args.repeats)
        both, both_ratio = measure(funcs, (ref, ours), x, backward=True, repeats=args.repeats)
        for row in zip(names, fwd, fwd_ratio, both, both_ratio):
            name, t_fwd, r_fwd, t_both, r_both = row
            lines.append(f"{mask_name:<9}{name:<37}{1e3 * t_fwd:>11.1f}{r_fwd:>7.2f}{1e3 * t_both:>12.1f}{r_both:>7.2f}")
    lines.append("parity with nn.MultiheadAttention (output, input gradient) checked before timing: ok")
    lines.append(
        f"1-minute load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs "
        f"(a load above the CPU count means other processes shared them: expect noisier ratios)"
    )
    report = "\n".join(lines)
    print(report)
    return report


if __name__ == "__main__":
    main()
