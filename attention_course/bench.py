"""Speed of our MultiheadAttention against torch's, measured on this machine: ``python -m attention_course.bench``.

Parity before speed: each implementation is first checked against ``nn.MultiheadAttention`` on the benchmark's
own inputs (output and input gradient). Then the implementations run interleaved, repeat after repeat, and the
table gives the median time of each and its ratio to the median time of torch's ``need_weights=False`` (ratio < 1:
faster than torch; the ratio of the two medians shown, so it can be checked against them). "forward" runs in eval
mode under ``torch.no_grad()``; "fwd+bwd" runs in training mode (dropout 0) and backpropagates the sum of the output
into the input and every parameter. Every section runs on one device, chosen once: the GPU where there is one, else
the CPU (``--device cpu`` or ``--device cuda`` to choose); a GPU is waited for (synchronized) before and after each
timed call.

The compiled rows (``torch.compile(layer, fullgraph=True)``, torch's layer and ours; ``--no-compile`` leaves them
out) are checked like the others; their first calls compile, in the parity check and the warm-up, so the times are
those of the compiled code alone.

The attention-core section (``--section core``) times the core alone, softmax(q k^T / sqrt(d) + mask) v on
q, k, v of shape (B, h, L, d), forward under ``torch.no_grad()``: the tutorial's explicit version, einsum, the
package's two paths, torch's SDPA (the reference of the ratios), tiled attention and, compiled, flex_attention.
Each one's output at the benchmark's size, and (except flex) its output and q, k, v gradients at a small size, are
first checked against ``F.scaled_dot_product_attention``. Beside the times: achieved GFLOP/s, counting
4 B h L^2 d operations (two matrix products of 2 B h L^2 d) whatever the mask; the fraction of this machine's
measured float32 matrix-multiply rate; and the peak memory one forward call allocates (on the CPU: torch's
allocations as recorded by ``torch.profiler`` with ``profile_memory=True``; on a GPU:
``torch.cuda.max_memory_allocated``), above what was allocated before the call.

The decode section (``--section decode``) times generation's inner step in one causal layer
(:class:`~attention_course.decoding.CausalSelfAttention`, GQA and RoPE): the next token after a context of T tokens,
with the KV cache (one query against T cached keys, O(T)) and without it (the whole sequence again, O(T^2) in the
attention), as tokens per second for growing T. Parity first: at each T the cached step's output is checked against
the last row of the full recomputation, and the cache's bytes against 2 h_kv d T (batch, bytes per number).

The serving section (``--section serving``) serves one workload twice with one random transformers Llama (2 layers,
hidden 128, intermediate 512, 8 heads, 2 key/value heads; 24 prompts of 4-96 tokens, 23 greedy new tokens each):
through transformers' continuous batching (``generate_batch``) and through the course's
:class:`~attention_course.serving.Scheduler` and paged cache driving a copy of the model with the course's layer
swapped in (``swap_into_llama``, ``serve_llama``; the varlen attention path where ``serve_llama`` has one, the line
above the table says which), both with the same pages (128 of 8 slots) and at most 64 tokens a step. Parity first:
every request's tokens must be the same from both. Then both run interleaved, each call whole (cache built, every
request served), and the table gives tokens per second from the median times and their ratio, twice: for the whole
call, and up to the last token (``generate_batch``'s ``record_timestamps``), which leaves out what
``generate_batch`` does after it (on the CPU, stopping its manager's thread and freeing its batch processor, a
garbage collection included, took longer than the generation itself in the runs made here). It runs on one CPU
thread unless ``--serving-threads`` says otherwise (the setting is restored after), and is skipped, with a line
saying so, where transformers is not installed.

The kernel section (``--section kernel``) times chapter 13's Triton FlashAttention
(:func:`~attention_course.kernels.flash_attention`), forward and forward+backward in float16, against SDPA restricted
to its flash backend (the reference of the ratios), chapter 8's tiled attention and the explicit version, at L from
512 to 16384 and d of 64 and 128, causal and not, each run the same work (B h L d = 2^25: h = 2048 / d, B = 16384 / L,
FlashAttention-2's benchmark). Outputs and gradients are checked against SDPA's first; the kernel runs at three tile
sizes and the fastest is shown, named; the explicit version (and tiled attention's backward) is skipped where its
L x L matrices would not fit, tiled attention beyond L = 8192. Beside the median times (CUDA events): the ratio to
SDPA, TFLOP/s as FlashAttention's papers count them (4 B h L^2 d forward, halved when causal, 3.5 times that
forward+backward) and the share of the card's dense float16 peak; then the targets at L = 4096, d = 64 (forward
<= 1.25x SDPA's time, forward+backward <= 1.6x) and whether each is met. Where the kernels are interpreted (no CUDA
GPU), it prints one correctness line instead: the interpreter's time says nothing about a GPU kernel.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import os
import re
import statistics
import sys
import textwrap
import time
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .decoding import CausalSelfAttention, KVCache, kv_cache_bytes
from .functional import fused_attention, scaled_dot_product_attention
from .masks import causal_mask, padding_mask
from .multihead import MultiheadAttention
from .parity import assert_close_report
from .tiled import tiled_attention

NAMES = (
    "torch (need_weights=False)",
    "torch (need_weights=True)",
    "fused QKV projection + SDPA",
    "ours fused (need_weights=False)",
    "ours explicit (need_weights=True)",
)
COMPILED_NAMES = ("torch compiled (need_weights=False)", "ours compiled (need_weights=False)")


def make_layers(D: int, h: int) -> tuple[nn.MultiheadAttention, MultiheadAttention]:
    """torch's layer with random non-zero biases, and ours holding the same weights."""
    torch.manual_seed(0)
    ref = nn.MultiheadAttention(D, h, batch_first=True)
    with torch.no_grad():  # torch starts the biases at zero, which would hide a missing bias
        ref.in_proj_bias.uniform_(-0.5, 0.5)
        ref.out_proj.bias.uniform_(-0.5, 0.5)
    return ref, MultiheadAttention.from_torch(ref)


class FusedQKV(nn.Module):
    """Self-attention the way compact GPT code writes it: one (D, 3D) projection, split, SDPA, output projection.

    Holds torch's layer's weights (``in_proj_weight`` is the stacked W_q; W_k; W_v already).
    """

    def __init__(self, ref: nn.MultiheadAttention):
        super().__init__()
        self.h = ref.num_heads
        self.qkv = nn.Linear(ref.embed_dim, 3 * ref.embed_dim)
        self.out = nn.Linear(ref.embed_dim, ref.embed_dim)
        self.qkv.load_state_dict({"weight": ref.in_proj_weight, "bias": ref.in_proj_bias})
        self.out.load_state_dict(ref.out_proj.state_dict())

    def forward(self, x: torch.Tensor, key_padding_mask: torch.Tensor | None = None) -> torch.Tensor:
        B, L, D = x.shape
        q, k, v = self.qkv(x).view(B, L, 3, self.h, D // self.h).permute(2, 0, 3, 1, 4)  # 3 x (B, h, L, d)
        allow = None if key_padding_mask is None else ~key_padding_mask[:, None, None, :]  # (B, 1, 1, S)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=allow)  # (B, h, L, d)
        return self.out(y.transpose(1, 2).reshape(B, L, D))


def implementations(ref, ours, mask, compiled=(), fused_qkv=None):
    """One function x -> output per entry of NAMES, then of COMPILED_NAMES when ``compiled`` holds the two
    compiled layers (self-attention with key padding ``mask`` or None)."""
    fused_qkv = FusedQKV(ref) if fused_qkv is None else fused_qkv
    funcs = [
        lambda x: ref(x, x, x, key_padding_mask=mask, need_weights=False)[0],
        lambda x: ref(x, x, x, key_padding_mask=mask, need_weights=True)[0],
        lambda x: fused_qkv(x, key_padding_mask=mask),
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
        _sync(x.device)
        start = time.perf_counter()
        f(x).sum().backward()
    else:
        _sync(x.device)
        start = time.perf_counter()
        with torch.no_grad():
            f(x)
    _sync(x.device)  # a GPU runs what was asked of it later: wait for it
    return time.perf_counter() - start


def _medians_and_ratios(times: list[list[float]]) -> tuple[list[float], list[float]]:
    """The median of each list of times, and each median divided by the first: the ratio of the two medians a
    table shows, which a reader can check (a median of per-repeat ratios can disagree with them)."""
    medians = [statistics.median(t) for t in times]
    return medians, [m / medians[0] for m in medians]


def measure(funcs, layers, x: torch.Tensor, backward: bool, repeats: int) -> tuple[list[float], list[float]]:
    """Median seconds per function, and each median divided by the first function's median."""
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
    return _medians_and_ratios(times)


# ---------------------------------------------------------------------------------------------- the attention core
CORE_NAMES = (
    "SDPA (torch, reference)",
    "explicit, tutorial style",
    "einsum",
    "ours explicit (returns weights)",
    "ours fused",
    "tiled",
)
FLEX_NAME = "flex_attention (compiled)"
# The columns of the core's table, 79 characters wide: a page's column, a terminal.
TABLE_HEADER = (f"{'implementation':<31}{'|out-SDPA|':>10}{'fwd ms':>8}{'ratio':>7}{'GFLOP/s':>8}{'of mm':>6}"
                f"{'peak MiB':>9}")


def _ms(seconds: float) -> str:
    """Milliseconds in at most 7 characters: 0.75, 593.2, 12345."""
    ms = 1e3 * seconds
    return f"{ms:.2f}" if ms < 100 else f"{ms:.1f}" if ms < 10_000 else f"{ms:.0f}"


def _fit(value: float, width: int, *formats: str) -> str:
    """``value`` right-aligned in ``width`` characters with a space before it, in the first format that fits: a
    table row keeps its width whatever the machine measures (a ratio of 12000 on a loaded machine, say)."""
    for spec in formats:
        text = format(value, spec)
        if len(text) < width:
            return text.rjust(width)
    return format(value, ".0e").rjust(width)


def _wrap(text: str) -> list[str]:
    """A long line of the report as lines of at most 79 characters."""
    return textwrap.wrap(text, 79, break_on_hyphens=False)


def explicit_attention(q, k, v, ignore=None):
    """The attention of a tutorial: scores, -inf where ``ignore`` is True, softmax, weighted sum. A row with every key
    masked gives NaN here (0/0), as in a tutorial; the benchmark's masks (none, causal) leave no such row."""
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])  # (B, h, L, S)
    if ignore is not None:
        scores = scores.masked_fill(ignore, float("-inf"))
    return torch.softmax(scores, dim=-1) @ v  # (B, h, L, d)


def einsum_attention(q, k, v, ignore=None):
    """The same with einsum, the index notation of the formulas."""
    scores = torch.einsum("bhld,bhsd->bhls", q, k) / math.sqrt(q.shape[-1])  # (B, h, L, S)
    if ignore is not None:
        scores = scores.masked_fill(ignore, float("-inf"))
    return torch.einsum("bhls,bhsd->bhld", torch.softmax(scores, dim=-1), v)  # (B, h, L, d)


def core_implementations(L: int, causal: bool, block_size: int, device=None) -> list:
    """One function (q, k, v) -> output (B, h, L, d) per entry of CORE_NAMES, self-attention, causal or not."""
    ignore = causal_mask(L, device=device) if causal else None  # (L, S), True = blocked
    return [
        lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=causal),
        lambda q, k, v: explicit_attention(q, k, v, ignore),
        lambda q, k, v: einsum_attention(q, k, v, ignore),
        lambda q, k, v: scaled_dot_product_attention(q, k, v, ignore)[0],
        lambda q, k, v: fused_attention(q, k, v, is_causal=causal),
        lambda q, k, v: tiled_attention(q, k, v, is_causal=causal, block_size=block_size),
    ]


def flex_implementation(L: int, causal: bool, backend: str = "inductor", device=None):
    """flex_attention compiled with ``backend`` (the causal mask as a mask_mod), or None where torch lacks it."""
    try:
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    except ImportError:  # pragma: no cover - torch older than 2.5
        return None
    compiled = torch.compile(flex_attention, backend=backend, dynamic=False)
    block_mask = None
    if causal:
        block_mask = create_block_mask(lambda b, h, i, j: j <= i, None, None, L, L, device=device or "cpu")
    return lambda q, k, v: compiled(q, k, v, block_mask=block_mask)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@contextlib.contextmanager
def _stderr_silenced():
    """torch.profiler's C++ side writes a line to the process's stderr each time it starts and stops: send file
    descriptor 2 to /dev/null meanwhile (a Python exception is still raised, and printed after)."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def peak_memory(f, device=None) -> int:
    """Bytes one call ``f()`` allocates at its peak, above what was allocated before (its result included).

    GPU: ``torch.cuda.max_memory_allocated``. CPU: torch keeps no such statistic, so the call runs under
    ``torch.profiler`` with ``profile_memory=True``, which records every allocation and free of torch's CPU
    allocator; the peak is the largest running sum of those, in time order. (``tracemalloc`` sees only Python's
    own allocations, not tensors; the process's resident size would also count memory the C library keeps.)
    """
    device = torch.device(device or "cpu")
    if device.type == "cuda":
        _sync(device)
        torch.cuda.reset_peak_memory_stats(device)
        before = torch.cuda.memory_allocated(device)
        result = f()
        _sync(device)
        peak = torch.cuda.max_memory_allocated(device) - before
        del result
        return peak
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = f()
    del result
    allocations, todo = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while todo:
        event = todo.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            allocations.append((event.start_time_ns, event.extra_fields.alloc_size))  # < 0: a free
        todo.extend(event.children)
    now = peak = 0
    for _, size in sorted(allocations):
        now += size
        peak = max(peak, now)
    return peak


def matmul_rate(n: int = 2048, repeats: int = 5, device=None) -> float:
    """This machine's float32 matrix-multiply rate, GFLOP/s: the best of ``repeats`` (n, n) @ (n, n) products
    (the best, not the median: the rate the hardware reaches, which other processes can only lower)."""
    device = torch.device(device or "cpu")
    a, b = torch.randn(n, n).to(device), torch.randn(n, n).to(device)
    a @ b  # warm-up
    times = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        a @ b
        _sync(device)
        times.append(time.perf_counter() - start)
    return 2 * n**3 / min(times) / 1e9


def check_core_parity(funcs, names, q, k, v, grads: bool) -> list[float]:
    """Largest |output - SDPA's| per function (the first is SDPA); with ``grads`` also the q, k, v gradients.

    Raises AssertionError (with the report of :func:`assert_close_report`) on the first disagreement.
    """
    tol = dict(atol=1e-8, rtol=1e-8) if q.dtype == torch.float64 else dict(atol=1e-4, rtol=1e-4)
    results = []
    for f in funcs:
        with torch.set_grad_enabled(grads):
            inputs = [t.detach().clone().requires_grad_(grads) for t in (q, k, v)]
            out = f(*inputs)
            if grads:
                out.sum().backward()
        results.append([out.detach()] + ([t.grad for t in inputs] if grads else []))
    worst = [0.0]
    for name, result in zip(names[1:], results[1:]):
        for what, got, want in zip(("output", "grad q", "grad k", "grad v"), result, results[0]):
            assert_close_report(got, want, f"{name}: {what}", **tol)
        worst.append(max((got - want).abs().max().item() for got, want in zip(result, results[0])))
    return worst


def measure_core(funcs, q, k, v, repeats: int) -> tuple[list[float], list[float]]:
    """Median forward seconds per function under no_grad, and each median divided by the first function's."""
    times = [[] for _ in funcs]
    with torch.no_grad():
        for f in funcs:  # warm-up
            f(q, k, v)
        for r in range(repeats):
            order = list(range(len(funcs)))
            for i in order[r % len(order):] + order[: r % len(order)]:  # rotate who goes first
                _sync(q.device)
                start = time.perf_counter()
                funcs[i](q, k, v)
                _sync(q.device)
                times[i].append(time.perf_counter() - start)
    return _medians_and_ratios(times)


def attention_core(B=1, h=8, L=4096, d=64, block_size=256, repeats=5, masks=("none", "causal"), flex=True,
                   backend="inductor", device=None, targets=False) -> tuple[str, dict]:
    """The attention-core benchmark: the report's lines, and per (mask, name) a dict of what was measured.

    ``targets``: add a line comparing tiled attention with the explicit version and SDPA against the course's
    targets (set for B=1, h=8, L=4096, d=64: peak memory <= 5% of the explicit version's, forward <= 2.5x SDPA's
    and no slower than the explicit version).
    """
    device = torch.device(device or "cpu")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(B, h, L, d, generator=gen).to(device) for _ in range(3))
    L_small = block_size + 45  # two query and two key blocks, the last ones partial
    small = [torch.randn(2, 2, L_small, 16, generator=gen, dtype=torch.float64).to(device) for _ in range(3)]
    flex = flex and flex_implementation(L_small, False, "eager") is not None  # torch 2.5 or later
    rate = matmul_rate(device=device)
    flops = 4 * B * h * L * L * d
    names = CORE_NAMES + ((FLEX_NAME,) if flex else ())
    lines = [
        *_wrap(f"attention core: q, k, v (B, h, L, d) = ({B}, {h}, {L}, {d}), float32, on {device}, forward under "
               f"no_grad; tiled block_size={block_size}; median of {repeats} interleaved repeats; ratio = median "
               f"forward time / SDPA's median"),
        *_wrap(f"float32 matmul (2048 x 2048 @ 2048 x 2048) here: {rate:.0f} GFLOP/s (the column 'of mm' is the "
               f"share of it); attention counted as 4 B h L^2 d = {flops / 1e9:.1f} GFLOP, also when causal (causal "
               f"needs half of it)"),
    ]
    results = {}
    for mask in masks:
        lines += ["", f"mask: {mask}", TABLE_HEADER]
        causal = mask == "causal"
        funcs = core_implementations(L, causal, block_size, device)
        small_funcs = core_implementations(L_small, causal, block_size, device)
        if flex:
            funcs.append(flex_implementation(L, causal, backend, device))
        check_core_parity(small_funcs, names, *small, grads=True)  # parity before speed: gradients, small size
        with torch.no_grad():
            diffs = check_core_parity(funcs, names, q, k, v, grads=False)  # and the output at this size
        times, ratios = measure_core(funcs, q, k, v, repeats)
        for name, f, diff, t, ratio in zip(names, funcs, diffs, times, ratios):
            with torch.no_grad():
                peak = peak_memory(lambda f=f: f(q, k, v), device)
            gflops = flops / t / 1e9
            results[mask, name] = dict(diff=diff, seconds=t, ratio=ratio, gflops=gflops, fraction=gflops / rate,
                                       peak=peak)
            lines.append(f"{name:<31}{diff:>10.1e}{_ms(t):>8}{_fit(ratio, 7, '.2f', '.0f')}"
                         f"{_fit(gflops, 8, '.1f', '.0f')}{_fit(gflops / rate, 6, '.0%', '.0e')}"
                         f"{_fit(peak / 2**20, 9, '.1f', '.0f')}")
    lines += ["", *_wrap(
        "parity with F.scaled_dot_product_attention checked before timing: ok (output at this size; output and "
        f"q, k, v gradients in float64 at (2, 2, {L_small}, 16){', except flex' if flex else ''})"
    )]
    if targets and "none" in masks:
        tiled, explicit, sdpa = (results["none", n] for n in ("tiled", "explicit, tutorial style", CORE_NAMES[0]))
        memory = tiled["peak"] / explicit["peak"]
        met = lambda ok: "met" if ok else "NOT met"  # noqa: E731
        lines += _wrap(
            f"targets, no mask: tiled peak memory {memory:.1%} of the explicit version's "
            f"{explicit['peak'] / 2**20:.0f} MiB (<= 5%: {met(memory <= 0.05)}); tiled forward "
            f"{tiled['ratio']:.2f}x SDPA (<= 2.5x: {met(tiled['ratio'] <= 2.5)}) and "
            f"{tiled['seconds'] / explicit['seconds']:.2f}x explicit (<= 1x: "
            f"{met(tiled['seconds'] <= explicit['seconds'])})"
        )
    return "\n".join(lines), results


# -------------------------------------------------------------------------------------------------------- decoding
DECODE_HEADER = (f"{'T':>6}{'cache KiB':>11}{'|cached-full|':>15}{'cached tok/s':>14}{'full tok/s':>12}"
                 f"{'speed-up':>10}")


def decode_step(layer, x_new, cache) -> torch.Tensor:
    """One decode step through ``cache``, which is left as it was: (B, 1, E) -> (B, 1, E), the KV cache's O(T) path.

    ``KVCache.update`` builds new tensors and never writes into the ones it held, so putting them back restores it.
    """
    held = cache.k, cache.v, cache.positions, cache.tokens_seen
    out = layer(x_new, cache=cache)
    cache.k, cache.v, cache.positions, cache.tokens_seen = held
    return out


def decode_bench(D=256, h=8, h_kv=2, lengths=(128, 256, 512, 1024, 2048), repeats=9, batch=1,
                 device=None) -> tuple[str, dict]:
    """The decode benchmark: the report's lines, and per T a dict of what was measured.

    For each context length T: a KV cache prefilled with T tokens; the next token's output with it (``cached``)
    and by recomputing all T + 1 tokens (``full``, its last row), checked equal first (float32: 1e-4), then timed
    interleaved, forward under ``torch.no_grad()``; tokens per second = 1 / median seconds per step.
    """
    device = torch.device(device or "cpu")
    torch.manual_seed(0)
    layer = CausalSelfAttention(D, h, h_kv, device=device).eval()
    d = D // h
    x = torch.randn(batch, max(lengths) + 1, D, generator=torch.Generator().manual_seed(1)).to(device)
    lines = [
        *_wrap(f"decoding: one CausalSelfAttention layer, E={D}, heads={h}, kv heads={h_kv} (d={d}), RoPE, batch "
               f"{batch}, float32, on {device}; the next token after T tokens, with the KV cache (one query against "
               f"T cached keys) and without (all T + 1 tokens again); median of {repeats} interleaved repeats"),
        DECODE_HEADER,
    ]
    results = {}
    with torch.no_grad():
        for T in lengths:
            cache = KVCache()
            layer(x[:, :T], cache=cache)  # prefill
            new, everything = x[:, T:T + 1], x[:, :T + 1]
            cached, full = decode_step(layer, new, cache), layer(everything)[:, -1:]
            assert_close_report(cached, full, f"T={T}: cached step against full recomputation", atol=1e-4, rtol=1e-4)
            expected_bytes = kv_cache_bytes(1, h_kv, d, T, torch.float32, batch=batch)
            assert cache.nbytes == expected_bytes, (cache.nbytes, expected_bytes)
            times = {"cached": [], "full": []}
            for r in range(repeats):
                for name in (("cached", "full") if r % 2 == 0 else ("full", "cached")):  # who goes first, in turn
                    _sync(device)
                    start = time.perf_counter()
                    if name == "cached":
                        decode_step(layer, new, cache)
                    else:
                        layer(everything)
                    _sync(device)
                    times[name].append(time.perf_counter() - start)
            t_cached, t_full = statistics.median(times["cached"]), statistics.median(times["full"])
            diff = (cached - full).abs().max().item()
            results[T] = dict(diff=diff, cache_bytes=cache.nbytes, cached_tps=1 / t_cached, full_tps=1 / t_full,
                              speedup=t_full / t_cached)
            lines.append(f"{T:>6}{cache.nbytes / 1024:>11.1f}{diff:>15.1e}{1 / t_cached:>14.0f}{1 / t_full:>12.0f}"
                         f"{t_full / t_cached:>10.1f}")
    lines += _wrap("parity checked before timing at every T: the cached step's output equals the last row of the "
                   "full recomputation (atol 1e-4), and the cache holds 2 * kv heads * d * T * 4 bytes: ok")
    return "\n".join(lines), results


# --------------------------------------------------------------------------------------------------------- serving
SERVING_NAMES = ("transformers generate_batch", "course Scheduler + serve_llama")
SERVING_HEADER = (f"{'median of the repeats':<31}{'call s':>7}{'tok/s':>7}{'ratio':>6}{'last token s':>13}{'tok/s':>7}"
                  f"{'ratio':>6}")


def serving_workload(requests: int, shortest: int, longest: int, vocab: int, seed: int = 1) -> list:
    """``requests`` prompts of random token ids below ``vocab``, their lengths drawn uniformly from shortest..longest
    (both included), seeded."""
    if not 1 <= shortest <= longest:
        raise ValueError(f"prompt lengths need 1 <= shortest <= longest, got {shortest} and {longest}.")
    gen = torch.Generator().manual_seed(seed)
    lengths = torch.randint(shortest, longest + 1, (requests,), generator=gen).tolist()
    return [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]


def _serving_path(serve_llama, varlen: bool | None) -> tuple[dict, str]:
    """The keyword arguments for ``serve_llama`` and a line saying which attention path they choose. ``varlen``
    None: the varlen path where this ``serve_llama`` has one (it takes ``varlen=``), else the packed one."""
    import inspect

    has_varlen = "varlen" in inspect.signature(serve_llama).parameters
    if varlen and not has_varlen:
        raise ValueError("varlen=True, but this serve_llama takes no varlen argument: it has the packed path only.")
    use = has_varlen if varlen is None else varlen
    if use:
        return {"varlen": True}, "the course's path: varlen, serve_llama(model, varlen=True): each query scores its " \
                                 "own request's keys only"
    why = "serve_llama(model, varlen=False)" if has_varlen else "this serve_llama has no varlen argument"
    return ({"varlen": False} if has_varlen else {}), (
        f"the course's path: packed ({why}): each query scores every key of the step, other requests' masked")


def serving_bench(requests=24, shortest=4, longest=96, new_tokens=23, hidden=128, intermediate=512, heads=8,
                  kv_heads=2, layers=2, vocab=512, block_size=8, num_blocks=128, max_batch_tokens=64, repeats=5,
                  threads=1, varlen=None, device=None) -> tuple[str, dict]:
    """The serving benchmark: the report's lines, and per name of SERVING_NAMES a dict of what was measured.

    One random Llama (transformers' ``LlamaForCausalLM``, seeded, float32, sdpa attention) serves the same greedy
    requests twice: through transformers' continuous batching (``generate_batch`` with a paged cache of
    ``num_blocks`` pages of ``block_size`` slots, at most ``max_batch_tokens`` tokens a step), and through the
    course's :class:`~attention_course.serving.Scheduler` with a :class:`~attention_course.serving.PagedKVCache` of
    the same pages and budget, driving a copy of the model with the course's layer swapped in
    (``swap_into_llama``, then ``serve_llama``; ``varlen``: see :func:`_serving_path`). Every request's tokens must be
    the same from both (AssertionError otherwise); then both run interleaved, ``repeats`` times, the one going first
    in turn, each call timed whole (its cache built, every request admitted, generated and retired). Tokens per
    second = requests x new_tokens / median seconds; ratio = tokens per second over generate_batch's (the ratio of
    the two medians). ``threads``: ``torch.set_num_threads`` for the section, restored after (None: left as is).
    Without transformers the section is skipped, and says so.
    """
    try:
        import transformers
    except ImportError:
        return ("serving: skipped, transformers is not installed (the section compares the course's serving with "
                "its generate_batch; pip install transformers)"), {}
    import copy

    from .llama import swap_into_llama
    from .serving import (PagedKVCache, Request, Scheduler, continuous_batching_config, paged_implementation,
                          serve_llama)

    device = torch.device(device or "cpu")
    kwargs, path = _serving_path(serve_llama, varlen)
    prompts = serving_workload(requests, shortest, longest, vocab)
    before = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        verbosity = transformers.logging.get_verbosity()
        transformers.logging.set_verbosity_error()  # eos_token_id=-1 (never stops): no warning about it
        torch.manual_seed(0)
        config = transformers.LlamaConfig(
            vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_hidden_layers=layers,
            num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=longest + new_tokens,
            attn_implementation="sdpa")
        theirs_model = transformers.LlamaForCausalLM(config).to(device).eval()
        forward = serve_llama(swap_into_llama(copy.deepcopy(theirs_model)), **kwargs)
        theirs_model.set_attn_implementation(paged_implementation())
        greedy = transformers.GenerationConfig(max_new_tokens=new_tokens, do_sample=False, eos_token_id=-1,
                                               pad_token_id=0)
        head_dim = hidden // heads

        def theirs() -> tuple[list, float]:
            out = theirs_model.generate_batch(
                inputs=prompts, generation_config=greedy, progress_bar=False, record_timestamps=True,
                continuous_batching_config=continuous_batching_config(block_size, num_blocks, max_batch_tokens))
            results = [out[f"req_{i}"] for i in range(len(prompts))]
            return [r.generated_tokens for r in results], max(r.timestamps[-1] for r in results)

        def ours() -> tuple[list, float]:
            cache = PagedKVCache(num_blocks, block_size, kv_heads, head_dim, num_layers=layers, device=device)
            scheduler = Scheduler(cache, max_batch_tokens=max_batch_tokens)
            for i, prompt in enumerate(prompts):
                scheduler.submit(Request(i, prompt, new_tokens))
            last = []
            done = scheduler.run(forward, on_step=lambda *_: last.append(time.perf_counter()))
            passes.append(scheduler.clock)
            return [done[i] for i in range(len(prompts))], last[-1]

        passes = []  # the course's scheduler's passes, per call
        funcs = (theirs, ours)
        with torch.no_grad():
            tokens = [f()[0] for f in funcs]  # parity before speed (and the warm-up)
            _check_serving_tokens(*tokens, new_tokens)
            whole, to_last = [[] for _ in funcs], [[] for _ in funcs]
            for r in range(repeats):
                for i in (0, 1) if r % 2 == 0 else (1, 0):  # who goes first, in turn
                    _sync(device)
                    start = time.perf_counter()
                    _, last = funcs[i]()
                    _sync(device)
                    whole[i].append(time.perf_counter() - start)
                    to_last[i].append(last - start)
        threads_used = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
        transformers.logging.set_verbosity(verbosity)
    generated = requests * new_tokens
    need = sum(-(-(len(p) + new_tokens - 1) // block_size) for p in prompts)  # every request's whole length at once
    lines = [
        *_wrap(f"serving: a random Llama ({layers} layers, hidden {hidden}, intermediate {intermediate}, {heads} "
               f"heads, {kv_heads} kv heads, vocab {vocab}), float32, on {device}, {threads_used} CPU "
               f"thread{'s' * (threads_used != 1)}, torch {torch.__version__}, transformers "
               f"{transformers.__version__}; {requests} prompts of {shortest}-{longest} tokens, {new_tokens} greedy "
               f"new tokens each; both with {num_blocks} pages of {block_size} slots (all requests at once would "
               f"need {need}) and at most {max_batch_tokens} tokens a step; median of {repeats} interleaved repeats"),
        *_wrap(path),
        *_wrap(f"tokens: the same from both for every request ({requests} of {requests}, {generated} new tokens): "
               f"ok; the course's scheduler took {passes[0]} passes"),
        SERVING_HEADER,
    ]
    results = {}
    (call, call_ratio), (last, last_ratio) = _medians_and_ratios(whole), _medians_and_ratios(to_last)
    for i, name in enumerate(SERVING_NAMES):
        rate, rate_last = generated / call[i], generated / last[i]
        results[name] = dict(seconds=call[i], tokens_per_second=rate, ratio=1 / call_ratio[i], to_last=last[i],
                             tokens_per_second_to_last=rate_last, ratio_to_last=1 / last_ratio[i])
        lines.append(f"{name:<31}{call[i]:>7.3f}{_fit(rate, 7, '.0f')}{_fit(1 / call_ratio[i], 6, '.2f', '.0f')}"
                     f"{last[i]:>13.3f}{_fit(rate_last, 7, '.0f')}{_fit(1 / last_ratio[i], 6, '.2f', '.0f')}")
    spread = [sorted(t0 / t1 for t0, t1 in zip(*times)) for times in (whole, to_last)]  # the course's, per repeat
    lines += _wrap(
        f"tok/s: {generated} new tokens / the median time; ratio: tokens per second over generate_batch's (the ratio "
        f"of the medians; per repeat the course's ranged {spread[0][0]:.2f}-{spread[0][-1]:.2f} for the whole call, "
        f"{spread[1][0]:.2f}-{spread[1][-1]:.2f} to the last token). call: the whole call, from before it to its "
        f"return; last token: from before the call to the last token's time (generate_batch's record_timestamps; the "
        f"course's last pass), without what a call does after it (generate_batch stops its manager's thread and "
        f"frees its batch processor there)")
    return "\n".join(lines), results


def _check_serving_tokens(theirs: list, ours: list, new_tokens: int) -> None:
    """AssertionError naming every request whose tokens differ (where first, and what each gave), or that fell short."""
    wrong = []
    for rid, (a, b) in enumerate(zip(theirs, ours)):
        if a == b and len(a) == new_tokens:
            continue
        if len(a) != new_tokens or len(b) != new_tokens:
            wrong.append(f"request {rid}: {len(b)} new tokens from the course, {len(a)} from generate_batch "
                         f"(asked {new_tokens})")
            continue
        at = next(j for j, (x, y) in enumerate(zip(a, b)) if x != y)
        wrong.append(f"request {rid} from new token {at} on (course {b[at]}, generate_batch {a[at]})")
    if wrong:
        raise AssertionError(
            f"serving: the course's tokens differ from generate_batch's for {len(wrong)} of {len(theirs)} requests: "
            + "; ".join(wrong) + ". Speeds of different outputs are not compared: nothing was timed.")


# ------------------------------------------------------------------------------ chapter 13's kernel, on a CUDA GPU
KERNEL_NAMES = ("SDPA", "Triton", "tiled (ch. 8)", "explicit")
KERNEL_MODES = ("forward", "fwd+bwd")
KERNEL_LENGTHS = (512, 1024, 2048, 4096, 8192, 16384)
KERNEL_DIMS = (64, 128)
KERNEL_TILES = ((64, 32), (128, 64), (128, 32))  # (block_m, block_n) pairs timed; the table shows the fastest
KERNEL_WORK = 2**25  # B * h * L * d of every run: 16384 tokens of hidden size 2048, as FlashAttention-2's benchmark
KERNEL_TARGETS = {"forward": 1.25, "fwd+bwd": 1.6}  # Triton's time over SDPA's, at most, at (L, d) = KERNEL_AT
KERNEL_AT = (4096, 64)
KERNEL_TOLERANCE = 2e-2  # float16 outputs and gradients, against SDPA's (atol and rtol)
# Dense float16 tensor-core peaks in TFLOP/s, by a pattern of the name torch.cuda.get_device_name gives (first match)
PEAKS = (
    ("H100 PCIe", r"H100.*PCIe", 756),
    ("H100 SXM", r"H100.*(SXM|HBM3)", 989),  # the SXM card calls itself "NVIDIA H100 80GB HBM3"
    ("H200", r"H200(?!.*NVL)", 989),
    ("A100", r"A100", 312),
    ("L4", r"\bL4\b", 121),  # not the L40
    ("T4", r"\bT4\b", 65),
)
KERNEL_HEADER = f"{'L':>6} {'mask':<7}{'implementation':<20}{'ms':>9}{'x SDPA':>8}{'TFLOP/s':>9}{'of peak':>8}"


def attention_flops(B: int, h: int, L: int, S: int, d: int, causal: bool = False, backward: bool = False) -> float:
    """Floating-point operations of attention as FlashAttention's papers count them: 4 B h L S d for the forward
    pass (two matrix products of 2 B h L S d), halved when causal; the backward pass 2.5 times the forward (five
    products), so forward+backward 3.5 times."""
    flops = 4 * B * h * L * S * d / (2 if causal else 1)
    return 3.5 * flops if backward else flops


def peak_tflops(device_name: str) -> tuple[str, float] | None:
    """(the card, its dense float16 peak in TFLOP/s) from PEAKS, or None for a card not there."""
    for card, pattern, peak in PEAKS:
        if re.search(pattern, device_name):
            return card, peak
    return None


def kernel_shape(L: int, d: int, work: int = KERNEL_WORK, width: int = 2048) -> tuple[int, int]:
    """(B, h) for a run of length L and head size d: h = width / d heads (a model of that width) and B sentences of
    L tokens, so that B h L d = ``work`` (at least one sentence)."""
    h = max(1, width // d)
    return max(1, work // (h * L * d)), h


def kernel_skip(name: str, backward: bool, B: int, h: int, L: int, element: int, free: int,
                tiled_longest: int = 8192) -> str | None:
    """Why ``name`` is not timed at this size, or None. The explicit version holds (B, h, L, L) matrices: about 3
    of them alive at once in its forward pass, 4 with the backward; tiled attention's backward keeps each tile's
    probabilities for autograd, about 3. Skipped where that needs more than 90% of the ``free`` bytes. Tiled
    attention is a Python loop over (L / 256)^2 tiles: skipped beyond L = ``tiled_longest``, too long."""
    matrices = {("explicit", False): 3, ("explicit", True): 4, ("tiled (ch. 8)", True): 3}.get((name, backward), 0)
    need = matrices * B * h * L * L * element
    if need > 0.9 * free:
        return f"skipped: ~{need / 2**30:.1f} GiB of {free / 2**30:.1f} free"
    if name == "tiled (ch. 8)" and L > tiled_longest:
        return f"skipped: too long (L > {tiled_longest})"
    return None


def _sdpa_with(backend):
    """F.scaled_dot_product_attention restricted to one of its backends."""
    from torch.nn.attention import sdpa_kernel

    def sdpa(q, k, v, causal):
        with sdpa_kernel(backend):
            return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return sdpa


def sdpa_backend(device, dtype, backends=("FLASH_ATTENTION", "EFFICIENT_ATTENTION", "MATH")):
    """The first of SDPA's ``backends`` that runs a small call here: the flash backend where there is one (a T4 has
    none: sm_80 and later only)."""
    from torch.nn.attention import SDPBackend

    q = torch.zeros(1, 1, 16, 64, device=device, dtype=dtype)
    for name in backends:
        try:
            with warnings.catch_warnings():  # each backend that cannot run warns why: expected here
                warnings.simplefilter("ignore")
                _sdpa_with(getattr(SDPBackend, name))(q, q, q, False)
        except RuntimeError:
            continue
        return getattr(SDPBackend, name)
    raise RuntimeError(f"none of SDPA's backends {backends} runs {dtype} on {device}, so the kernel has no reference "
                       "to be timed against here. Run the section on a CUDA GPU, or with --device cpu for its "
                       "correctness line alone.")


def kernel_implementations(L: int, causal: bool, backend, tiles=KERNEL_TILES, device=None) -> dict:
    """name -> function (q, k, v) -> output (B, h, L, d): SDPA restricted to ``backend``, chapter 13's kernel at each
    (block_m, block_n) of ``tiles``, tiled attention, the explicit version."""
    from .kernels import flash_attention

    sdpa = _sdpa_with(backend)
    ignore = causal_mask(L, device=device) if causal else None  # (L, S), True = blocked
    funcs = {KERNEL_NAMES[0]: lambda q, k, v: sdpa(q, k, v, causal)}
    for m, n in tiles:
        funcs[f"Triton {m}x{n}"] = lambda q, k, v, m=m, n=n: flash_attention(q, k, v, causal, block_m=m, block_n=n)
    funcs[KERNEL_NAMES[2]] = lambda q, k, v: tiled_attention(q, k, v, is_causal=causal)
    funcs[KERNEL_NAMES[3]] = lambda q, k, v: explicit_attention(q, k, v, ignore)
    return funcs


def _seconds(call, device: torch.device) -> float:
    """One call's seconds: on a GPU between two CUDA events recorded around it (the GPU's clock, waited for), else
    the wall clock."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        call()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3  # milliseconds to seconds
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def _kernel_call(f, q, k, v, grad, backward: bool):
    """The call to time: the forward under no_grad, or the forward and the q, k, v gradients of ``grad``."""
    if backward:
        return lambda: torch.autograd.grad(f(q, k, v), (q, k, v), grad)
    return lambda: f(q, k, v)


def _too_big(error: Exception) -> bool:
    """Whether a call failed for want of memory (torch) or of a multiprocessor's resources (Triton, a tile pair)."""
    return isinstance(error, torch.cuda.OutOfMemoryError) or type(error).__name__ == "OutOfResources"


def _attempt(call):
    """(call(), None), or (None, the reason) where it ran out of memory or of a multiprocessor's resources; any
    other error is raised."""
    try:
        return call(), None
    except Exception as error:
        if not _too_big(error):
            raise
        return None, f"skipped: {type(error).__name__}"


def time_kernels(funcs: dict, q, k, v, grad, backward: bool, repeats: int) -> dict:
    """name -> median seconds (or, for a call that ran out of memory, the reason), one warm-up call each, then
    ``repeats`` rounds in which every function runs once, the one going first in turn."""
    calls, times = {}, {}
    with torch.set_grad_enabled(backward):
        for name, f in funcs.items():
            call = _kernel_call(f, q, k, v, grad, backward)
            _, times[name] = _attempt(lambda: _seconds(call, q.device))  # warm-up (Triton compiles here)
            if times[name] is None:
                calls[name], times[name] = call, []
        names = list(calls)
        for r in range(repeats):
            for name in names[r % len(names):] + names[:r % len(names)]:
                times[name].append(_seconds(calls[name], q.device))
    return {name: t if isinstance(t, str) else statistics.median(t) for name, t in times.items()}


def check_kernel_parity(funcs: dict, q, k, v, grad, grads=None, tol: float = KERNEL_TOLERANCE) -> tuple[float, dict]:
    """(the largest |output or q, k, v gradient - SDPA's|, (name, backward) -> why it could not run) over the
    functions, the first SDPA; the gradients of those in ``grads`` only (default: all). AssertionError (the report
    of :func:`assert_close_report`) where one is not within ``tol`` (atol and rtol); a forward or backward pass that
    runs out of memory is skipped, with the reason (a forward's for both)."""
    results, failed = {}, {}
    for name, f in funcs.items():
        backward = grads is None or name in grads
        with torch.set_grad_enabled(backward):
            out, failed[name, False] = _attempt(lambda: f(q, k, v))
        if out is None:
            failed[name, True] = failed[name, False]
            continue
        results[name] = (out.detach(),)
        if backward:
            got, failed[name, True] = _attempt(lambda: torch.autograd.grad(out, (q, k, v), grad))
            results[name] += got or ()
    reference, worst = results.pop(KERNEL_NAMES[0]), 0.0
    for name, result in results.items():
        for what, got, want in zip(("output", "grad q", "grad k", "grad v"), result, reference):
            assert_close_report(got, want, f"{name}: {what}", atol=tol, rtol=tol)
            worst = max(worst, (got.float() - want.float()).abs().max().item())
    return worst, {key: why for key, why in failed.items() if why}


def kernel_rows(entries: dict, B: int, h: int, L: int, d: int, causal: bool, backward: bool, peak) -> list[str]:
    """The table's rows for one length and mask: ``entries`` maps each name of KERNEL_NAMES to (label, seconds or
    the reason it was skipped); the ratio is to SDPA's seconds, the share to ``peak`` TFLOP/s (None: unknown)."""
    flops = attention_flops(B, h, L, L, d, causal, backward)
    sdpa = entries[KERNEL_NAMES[0]][1]
    rows = []
    for name in KERNEL_NAMES:
        label, t = entries[name]
        head = f"{L:>6} {'causal' if causal else 'none':<7}{label:<20}"
        if isinstance(t, str):
            rows.append(head + t.rjust(42))
            continue
        tflops = flops / t / 1e12
        share = "" if peak is None else _fit(tflops / peak, 8, ".0%", ".0e")
        rows.append(f"{head}{_fit(1e3 * t, 9, '.3f', '.1f', '.0f')}{_fit(t / sdpa, 8, '.2f', '.0f')}"
                    f"{_fit(tflops, 9, '.1f', '.0f')}{share}")
    return rows


def best_tiles(times: dict, tiles=KERNEL_TILES) -> tuple[str, float | str]:
    """(label, seconds) of the fastest of the kernel's tile pairs in ``times`` (name -> seconds or a reason)."""
    timed = [(times[f"Triton {m}x{n}"], f"Triton {m}x{n}") for m, n in tiles
             if not isinstance(times[f"Triton {m}x{n}"], str)]
    if not timed:
        return "Triton", "skipped: no tile pair ran"
    t, label = min(timed)
    return f"{label} best", t


def kernel_verdicts(results: dict, at: tuple[int, int] = KERNEL_AT) -> list[str]:
    """The targets' lines: Triton's time over SDPA's at (L, d) = ``at``, each mode and mask, met or not (or not
    measured)."""
    (L, d), lines = at, []
    for mode, most in KERNEL_TARGETS.items():
        for mask in ("none", "causal"):
            entry = results.get((d, L, mask, mode, "Triton"))
            if entry is None or "ratio" not in entry:
                verdict = "not measured"
            else:
                verdict = f"{entry['ratio']:.2f}x, {'met' if entry['ratio'] <= most else 'NOT met'}"
            lines.append(f"target: Triton {mode} <= {most}x SDPA, L={L}, d={d}, {mask}: {verdict}")
    return lines


def _cell(t: float | str) -> str:
    """Seconds as milliseconds, or the reason nothing was timed."""
    return t if isinstance(t, str) else f"{_ms(t)} ms"


def kernel_smoke() -> str:
    """Where the kernels are interpreted: one tiny forward on the CPU against SDPA, and why nothing is timed."""
    from .kernels import flash_attention

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 48, 16, generator=gen) for _ in range(3))
    worst = 0.0
    try:
        for causal in (False, True):
            got = flash_attention(q, k, v, causal)
            want = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
            assert_close_report(got, want, f"kernel (causal={causal}): output", atol=1e-5, rtol=1e-5)
            worst = max(worst, (got - want).abs().max().item())
    except ModuleNotFoundError as error:
        if error.name != "triton":
            raise
        return "\n".join(_wrap(f"kernel: skipped, Triton is not installed. {error}"))
    return "\n".join(_wrap(
        f"kernel: chapter 13's Triton kernels run here in Triton's interpreter (no CUDA GPU, or TRITON_INTERPRET=1), "
        f"which executes them tile by tile in NumPy on the CPU: its time measures nothing about a GPU kernel's speed, "
        f"and none is printed. Correctness only: flash_attention on q, k, v (1, 2, 48, 16) float32, tiles 64x32, "
        f"causal and not, against F.scaled_dot_product_attention: max |difference| {worst:.1e} (atol 1e-5): ok. On a "
        f"CUDA GPU this section times it against SDPA's flash backend."))


def free_bytes(device: torch.device) -> int:
    """The bytes :func:`kernel_skip` counts on: the GPU's free memory, or the memory the machine has available. On
    the GPU torch's allocator first hands back what it holds unused (earlier sections' blocks), which the driver
    would not count as free."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
        return torch.cuda.mem_get_info(device)[0]
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def kernel_section(args) -> str:
    """The kernel section: timed on a CUDA GPU; where the kernels are interpreted, :func:`kernel_smoke`'s line."""
    from .kernels import interpreted

    if torch.device(args.device).type != "cuda" or interpreted():
        return kernel_smoke()
    return kernel_bench(args.kernel_lengths, args.kernel_dims, args.kernel_repeats, args.kernel_work,
                        device=args.device)[0]


def kernel_bench(lengths=KERNEL_LENGTHS, dims=KERNEL_DIMS, repeats=10, work=KERNEL_WORK, tiles=KERNEL_TILES,
                 device=None, dtype=torch.float16, free=None, tiled_longest=8192, width=2048,
                 at=KERNEL_AT) -> tuple[str, dict]:
    """Chapter 13's kernel against SDPA's flash backend, tiled attention and the explicit version: the report's lines,
    and per (d, L, mask, mode, name) a dict of what was measured (mode "forward" or "fwd+bwd"; name one of
    KERNEL_NAMES, "Triton" the fastest tile pair, or "Triton {block_m}x{block_n}").

    Meant for a CUDA GPU (:func:`kernel_section` runs it there only); it also runs on the CPU, the kernels
    interpreted, which a test does at tiny sizes in float32, where its times mean nothing. ``free``: the bytes
    :func:`kernel_skip` may count on (default: the GPU's free memory, or the machine's); ``at``: the (L, d) of the
    targets."""
    device = torch.device(device or "cpu")
    gpu = device.type == "cuda"
    backend = sdpa_backend(device, dtype)
    free = free_bytes(device) if free is None else free
    name = torch.cuda.get_device_name(device) if gpu else "the CPU"
    card = peak_tflops(name)
    element = torch.tensor([], dtype=dtype).element_size()
    lines = _wrap(
        f"kernel: chapter 13's Triton FlashAttention (flash_attention) against SDPA restricted to its "
        f"{backend.name} backend (the reference of the ratios), chapter "
        f"8's tiled_attention (block_size 256) and the explicit softmax(q k^T / sqrt d) v; {dtype}, on {name}, "
        f"torch {torch.__version__}. q, k, v (B, h, L, d) with h = {width} / d heads and B = {work} / (h L d) "
        f"sentences, so every run has B h L d = {work}; median of {repeats} interleaved runs after a warm-up, timed "
        f"{'with CUDA events' if gpu else 'by the wall clock'}. TFLOP/s as FlashAttention's papers count: "
        f"4 B h L^2 d forward, halved when causal, 3.5 times that for fwd+bwd (the backward 2.5 times); 'of peak': "
        f"the share of the card's dense float16 peak, "
        + (f"{card[1]} TFLOP/s ({card[0]})." if card else "unknown for this card: not shown.")
        + " Triton: the tiles (block_m x block_n) " + ", ".join(f"{m}x{n}" for m, n in tiles)
        + " each timed, the fastest shown.")
    results, worst, at_target = {}, 0.0, []
    for d in dims:
        tables = {mode: [] for mode in KERNEL_MODES}
        for L in lengths:
            B, h = kernel_shape(L, d, work, width)
            gen = torch.Generator().manual_seed(L + d)
            q, k, v, grad = (torch.randn(B, h, L, d, generator=gen).to(device, dtype) for _ in range(4))
            q, k, v = (t.requires_grad_() for t in (q, k, v))
            for causal in (False, True):
                mask = "causal" if causal else "none"
                funcs = kernel_implementations(L, causal, backend, tiles, device)
                skips = {(f, b): kernel_skip(f, b, B, h, L, element, free, tiled_longest) for f in funcs
                         for b in (False, True)}
                diff, failed = check_kernel_parity(  # parity before speed
                    {f: g for f, g in funcs.items() if skips[f, False] is None}, q, k, v, grad,
                    grads={f for f in funcs if skips[f, True] is None})
                worst = max(worst, diff)
                for mode, backward in zip(KERNEL_MODES, (False, True)):
                    why = {f: failed.get((f, backward)) or skips[f, backward] for f in funcs}
                    times = time_kernels({f: g for f, g in funcs.items() if why[f] is None}, q, k, v, grad, backward,
                                         repeats)
                    times = {f: why[f] or times[f] for f in funcs}
                    entries = {f: (f, times[f]) for f in KERNEL_NAMES if f != "Triton"}
                    entries["Triton"] = best_tiles(times, tiles)
                    flops = attention_flops(B, h, L, L, d, causal, backward)
                    for f, t in [*times.items(), ("Triton", entries["Triton"][1])]:
                        results[d, L, mask, mode, f] = dict(label=entries.get(f, (f,))[0], B=B, h=h, **(
                            dict(skipped=t) if isinstance(t, str) else
                            dict(seconds=t, ratio=t / times[KERNEL_NAMES[0]], tflops=flops / t / 1e12)))
                    tables[mode] += kernel_rows(entries, B, h, L, d, causal, backward, card and card[1])
                    if (L, d) == at:
                        at_target.append(f"{mode}, {mask}: " + ", ".join(
                            f"{m}x{n} {_cell(times[f'Triton {m}x{n}'])}" for m, n in tiles))
        for mode in KERNEL_MODES:
            lines += ["", f"d={d}, {mode}", KERNEL_HEADER, *tables[mode]]
    lines += ["", *_wrap(
        f"parity with SDPA checked before timing at every size: outputs, and q, k, v gradients where fwd+bwd runs, "
        f"within atol = rtol = {KERNEL_TOLERANCE} (largest difference {worst:.1e}): ok")]
    if at_target:
        lines += _wrap(f"Triton's tiles at L={at[0]}, d={at[1]}: " + "; ".join(at_target))
    lines += kernel_verdicts(results, at)
    return "\n".join(lines), results


def layer_section(args) -> str:
    """The layers: ours against nn.MultiheadAttention, forward and fwd+bwd, with and without key padding."""
    B, L, D, h, device = args.batch, args.length, args.dim, args.heads, torch.device(args.device)
    ref, ours = (layer.to(device) for layer in make_layers(D, h))
    fused_qkv = FusedQKV(ref).to(device)
    compiled = [torch.compile(m, fullgraph=True, backend=args.backend) for m in (ref, ours)] if args.compile else []
    names = NAMES + (COMPILED_NAMES if args.compile else ())
    x = torch.randn(B, L, D).to(device)
    masks = {"none": None, "padding": padding_mask(torch.linspace(L // 2, L, B).long(), L).to(device)}
    threads = torch.get_num_threads()
    lines = [
        f"B={B}, L={L}, D={D}, heads={h}, float32, on {device}, {threads} CPU thread{'s' * (threads != 1)}, "
        f"torch {torch.__version__}; "
        f"median of {args.repeats} interleaved repeats"
        + (f"; compiled rows: torch.compile(fullgraph=True, backend={args.backend!r})" if args.compile else ""),
        f"{'mask':<9}{'implementation':<37}{'forward ms':>11}{'ratio':>7}{'fwd+bwd ms':>12}{'ratio':>7}",
    ]
    for mask_name, mask in masks.items():
        funcs = implementations(ref, ours, mask, compiled, fused_qkv)
        check_parity(funcs, x, names)  # parity before speed
        fwd, fwd_ratio = measure(funcs, (ref, ours, fused_qkv), x, backward=False, repeats=args.repeats)
        both, both_ratio = measure(funcs, (ref, ours, fused_qkv), x, backward=True, repeats=args.repeats)
        for row in zip(names, fwd, fwd_ratio, both, both_ratio):
            name, t_fwd, r_fwd, t_both, r_both = row
            lines.append(f"{mask_name:<9}{name:<37}{_ms(t_fwd):>11}{r_fwd:>7.2f}{_ms(t_both):>12}{r_both:>7.2f}")
    lines.append("parity with nn.MultiheadAttention (output, input gradient) checked before timing: ok")
    return "\n".join(lines)


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(prog="python -m attention_course.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--section", choices=("all", "layer", "core", "decode", "serving", "kernel"), default="all",
                        help="the layers, the attention core, decoding with and without the KV cache, serving (the "
                             "course's continuous batching against transformers' generate_batch), chapter 13's "
                             "Triton kernel against SDPA's flash backend (on a CUDA GPU; elsewhere a correctness "
                             "line only), or all (default)")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--dim", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--core-batch", type=int, default=1)
    parser.add_argument("--core-heads", type=int, default=8)
    parser.add_argument("--core-length", type=int, default=4096)
    parser.add_argument("--core-dim", type=int, default=64, help="head size d of the attention core")
    parser.add_argument("--core-repeats", type=int, default=5)
    parser.add_argument("--block-size", type=int, default=256, help="tiled attention's block size")
    parser.add_argument("--decode-dim", type=int, default=256)
    parser.add_argument("--decode-heads", type=int, default=8)
    parser.add_argument("--decode-kv-heads", type=int, default=2)
    parser.add_argument("--decode-lengths", type=lambda s: tuple(int(n) for n in s.split(",")),
                        default=(128, 256, 512, 1024, 2048), help="context lengths T, comma-separated")
    parser.add_argument("--decode-repeats", type=int, default=9)
    parser.add_argument("--serving-requests", type=int, default=24)
    parser.add_argument("--serving-prompt-lengths", type=lambda s: tuple(int(n) for n in s.split(",")), default=(4, 96),
                        help="shortest,longest prompt (lengths drawn uniformly between them)")
    parser.add_argument("--serving-new-tokens", type=int, default=23, help="greedy new tokens per request")
    parser.add_argument("--serving-hidden", type=int, default=128, help="the Llama's hidden size (8 heads, 2 kv heads)")
    parser.add_argument("--serving-intermediate", type=int, default=512, help="the Llama's MLP size")
    parser.add_argument("--serving-blocks", type=int, default=128, help="pages in the pool, the same for both")
    parser.add_argument("--serving-block-size", type=int, default=8, help="slots per page")
    parser.add_argument("--serving-batch-tokens", type=int, default=64, help="at most this many tokens a step")
    parser.add_argument("--serving-repeats", type=int, default=5)
    parser.add_argument("--serving-threads", type=int, default=1,
                        help="torch.set_num_threads for the serving section (restored after); default 1")
    parser.add_argument("--serving-packed", action="store_true",
                        help="the course's packed attention path even where serve_llama has the varlen one")
    parser.add_argument("--kernel-lengths", type=lambda s: tuple(int(n) for n in s.split(",")),
                        default=KERNEL_LENGTHS, help="the kernel section's lengths L, comma-separated")
    parser.add_argument("--kernel-dims", type=lambda s: tuple(int(n) for n in s.split(",")), default=KERNEL_DIMS,
                        help="the kernel section's head sizes d, comma-separated")
    parser.add_argument("--kernel-work", type=int, default=KERNEL_WORK,
                        help="B h L d of every run of the kernel section (default 2^25: 16384 tokens of width 2048)")
    parser.add_argument("--kernel-repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true",
                        help="small sizes (layers B=2, L=64, D=64, h=4; core B=1, h=2, L=160, d=16; decode E=64, h=4, "
                             "h_kv=2, T=16,32,64; serving 6 prompts of 4-24 tokens, 5 new tokens, hidden 64, "
                             "intermediate 128, 32 pages, 16 tokens a step; kernel L=512,4096, d=64) and 3 "
                             "repeats")
    parser.add_argument("--no-compile", dest="compile", action="store_false",
                        help="leave out the compiled rows (and flex_attention)")
    parser.add_argument("--backend", default="inductor", help="torch.compile backend of the compiled rows")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                        help="where every section runs (default: the GPU where there is one, else the CPU)")
    args = parser.parse_args(argv)
    if len(args.serving_prompt_lengths) != 2:
        parser.error(f"--serving-prompt-lengths takes two numbers, shortest,longest; got {args.serving_prompt_lengths}")
    if args.quick:
        args.batch, args.length, args.dim, args.heads, args.repeats = 2, 64, 64, 4, 3
        args.core_batch, args.core_heads, args.core_length, args.core_dim = 1, 2, 160, 16
        args.core_repeats, args.block_size = min(args.repeats, 3), 64
        args.decode_dim, args.decode_heads, args.decode_kv_heads = 64, 4, 2
        args.decode_lengths, args.decode_repeats = (16, 32, 64), min(args.repeats, 3)
        args.serving_requests, args.serving_prompt_lengths, args.serving_new_tokens = 6, (4, 24), 5
        args.serving_hidden, args.serving_intermediate, args.serving_blocks = 64, 128, 32
        args.serving_batch_tokens, args.serving_repeats = 16, min(args.repeats, 3)
        args.kernel_lengths, args.kernel_dims, args.kernel_repeats = (512, 4096), (64,), min(args.repeats, 3)
    load_before = os.getloadavg()[0]
    # float32 as torch computes it by default: inductor's hint to let matrix products round to TF32 on a GPU (which
    # would change the numbers the parity checks compare) is left out of the report
    warnings.filterwarnings("ignore", message="TensorFloat32 tensor cores for float32 matrix multiplication")
    sections = []
    if args.section in ("all", "layer"):
        sections.append(layer_section(args))
    if args.section in ("all", "core"):
        sections.append(attention_core(
            args.core_batch, args.core_heads, args.core_length, args.core_dim, args.block_size, args.core_repeats,
            flex=args.compile, backend=args.backend, device=args.device, targets=True,
        )[0])
    if args.section in ("all", "decode"):
        sections.append(decode_bench(args.decode_dim, args.decode_heads, args.decode_kv_heads, args.decode_lengths,
                                     args.decode_repeats, device=args.device)[0])
    if args.section in ("all", "serving"):
        shortest, longest = args.serving_prompt_lengths
        sections.append(serving_bench(
            args.serving_requests, shortest, longest, args.serving_new_tokens, args.serving_hidden,
            args.serving_intermediate, block_size=args.serving_block_size, num_blocks=args.serving_blocks,
            max_batch_tokens=args.serving_batch_tokens, repeats=args.serving_repeats, threads=args.serving_threads,
            varlen=False if args.serving_packed else None, device=args.device,
        )[0])
    if args.section in ("all", "kernel"):
        sections.append(kernel_section(args))
    sections.append(
        f"1-minute load average: {load_before:.2f} before, {os.getloadavg()[0]:.2f} after, on {os.cpu_count()} CPUs "
        f"(a load above the CPU count means other processes shared them: expect noisier ratios)"
    )
    report = "\n\n".join(sections)
    print(report)
    return report


if __name__ == "__main__":
    main()
