"""The benchmark's kernel section (chapter 13's Triton FlashAttention against SDPA's flash backend): the FLOP count,
the peak table, the run shapes, the skip rule, the rows, the tile choice and the targets' verdicts on made-up
timings; the timing loop at tiny sizes in Triton's interpreter; and the CPU's correctness line. Nothing here asserts
a speed."""
import re
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F

from attention_course import bench


def test_flops_are_counted_as_flashattention_counts_them():
    forward = 4 * 2 * 3 * 128 * 256 * 64
    assert bench.attention_flops(2, 3, 128, 256, 64) == forward  # two products of 2 B h L S d
    assert bench.attention_flops(2, 3, 128, 256, 64, causal=True) == forward / 2
    assert bench.attention_flops(2, 3, 128, 256, 64, backward=True) == 3.5 * forward  # forward 1 + backward 2.5
    assert bench.attention_flops(2, 3, 128, 256, 64, causal=True, backward=True) == 3.5 * forward / 2


@pytest.mark.parametrize("name, card, peak", [
    ("NVIDIA H100 80GB HBM3", "H100 SXM", 989),
    ("NVIDIA H100 SXM5 80GB", "H100 SXM", 989),
    ("NVIDIA H100 PCIe", "H100 PCIe", 756),
    ("NVIDIA H200", "H200", 989),
    ("NVIDIA A100-SXM4-80GB", "A100", 312),
    ("NVIDIA A100-PCIE-40GB", "A100", 312),
    ("NVIDIA L4", "L4", 121),
    ("Tesla T4", "T4", 65),
])
def test_the_peak_of_a_known_card(name, card, peak):
    assert bench.peak_tflops(name) == (card, peak)


@pytest.mark.parametrize("name", ["NVIDIA L40S", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA GeForce RTX 4090",
                                  "the CPU"])
def test_an_unknown_card_has_no_peak(name):
    assert bench.peak_tflops(name) is None


@pytest.mark.parametrize("d, heads", [(64, 32), (128, 16)])
def test_every_run_does_the_same_work(d, heads):
    for L in bench.KERNEL_LENGTHS:
        B, h = bench.kernel_shape(L, d)
        assert h == heads and B * h * L * d == bench.KERNEL_WORK == 2**25
    assert bench.kernel_shape(16384, 64) == (1, 32)
    assert bench.kernel_shape(64, 16, work=100, width=32) == (1, 2)  # at least one sentence


def test_the_skip_rule():
    GiB = 2**30
    B, h, L = 1, 32, 16384  # d = 64: one (B, h, L, L) float16 matrix is 16 GiB
    skip = lambda name, backward, free=80 * GiB: bench.kernel_skip(name, backward, B, h, L, 2, free)  # noqa: E731
    assert skip("explicit", False) is None  # 3 matrices, 48 GiB of 80
    assert skip("explicit", True) is None  # 4, 64 GiB
    assert skip("explicit", True, 70 * GiB) == "skipped: ~64.0 GiB of 70.0 free"  # more than 90% of it
    assert skip("tiled (ch. 8)", False) == skip("tiled (ch. 8)", True) == "skipped: too long (L > 8192)"
    assert bench.kernel_skip("tiled (ch. 8)", True, 2, 32, 8192, 2, 80 * GiB) is None  # 24 GiB
    assert bench.kernel_skip("tiled (ch. 8)", True, 2, 32, 8192, 2, 20 * GiB).startswith("skipped: ~24.0 GiB")
    for name in ("SDPA", "Triton 128x64"):  # nothing of size L x L
        assert skip(name, True, 1) is None


def made_up(sdpa=1e-3, triton=1.2e-3, tiled=5e-3, explicit="skipped: ~64.0 GiB of 70.0 free"):
    return {"SDPA": ("SDPA", sdpa), "Triton": ("Triton 128x64 best", triton), "tiled (ch. 8)": ("tiled (ch. 8)", tiled),
            "explicit": ("explicit", explicit)}


def test_rows_from_made_up_timings():
    B, h, L, d = 2, 32, 4096, 64
    rows = bench.kernel_rows(made_up(), B, h, L, d, causal=False, backward=False, peak=989)
    assert [row[14:34].rstrip() for row in rows] == ["SDPA", "Triton 128x64 best", "tiled (ch. 8)", "explicit"]
    tflops = 4 * B * h * L * L * d / 1e-3 / 1e12  # 274.9 TFLOP/s for SDPA
    assert rows[0].split()[2:] == ["SDPA", "1.000", "1.00", f"{tflops:.1f}", f"{tflops / 989:.0%}"]
    assert rows[1].split()[-4:] == ["1.200", "1.20", f"{tflops / 1.2:.1f}", f"{tflops / 1.2 / 989:.0%}"]
    assert rows[3].endswith("skipped: ~64.0 GiB of 70.0 free") and rows[3].startswith("  4096 none   explicit")
    causal = bench.kernel_rows(made_up(), B, h, L, d, causal=True, backward=True, peak=None)  # an unknown card
    assert causal[0].split() == ["4096", "causal", "SDPA", "1.000", "1.00", f"{tflops * 3.5 / 2:.1f}"]
    assert all(len(row) <= 79 for row in rows + causal) and len(bench.KERNEL_HEADER) <= 79
    header = bench.KERNEL_HEADER.split()
    assert header[:3] == ["L", "mask", "implementation"] and header[-2:] == ["of", "peak"]


def test_the_fastest_tile_pair_is_shown_and_named():
    times = {"Triton 64x32": 2e-3, "Triton 128x64": 1.5e-3, "Triton 128x32": "skipped: OutOfResources"}
    assert bench.best_tiles(times) == ("Triton 128x64 best", 1.5e-3)
    nothing = {name: "skipped: OutOfResources" for name in times}
    assert bench.best_tiles(nothing) == ("Triton", "skipped: no tile pair ran")


def test_the_targets_verdicts():
    results = {(64, 4096, "none", "forward", "Triton"): dict(ratio=1.2),
               (64, 4096, "causal", "forward", "Triton"): dict(ratio=1.3),
               (64, 4096, "none", "fwd+bwd", "Triton"): dict(ratio=1.6),  # the bound itself is met
               (64, 4096, "causal", "fwd+bwd", "Triton"): dict(skipped="skipped: no tile pair ran")}
    assert bench.kernel_verdicts(results) == [
        "target: Triton forward <= 1.25x SDPA, L=4096, d=64, none: 1.20x, met",
        "target: Triton forward <= 1.25x SDPA, L=4096, d=64, causal: 1.30x, NOT met",
        "target: Triton fwd+bwd <= 1.6x SDPA, L=4096, d=64, none: 1.60x, met",
        "target: Triton fwd+bwd <= 1.6x SDPA, L=4096, d=64, causal: not measured",
    ]
    assert all(line.endswith("not measured") for line in bench.kernel_verdicts({}))


def test_a_gpu_call_is_timed_between_cuda_events(monkeypatch):
    log = []

    class Event:  # torch.cuda.Event's part the timer uses, with a made-up clock
        def __init__(self, enable_timing):
            assert enable_timing
            self.at = None

        def record(self):
            self.at = len(log)
            log.append("record")

        def synchronize(self):
            log.append("synchronize")

        def elapsed_time(self, end):  # milliseconds
            return 250.0 * (end.at - self.at)

    monkeypatch.setattr(torch.cuda, "Event", Event)
    seconds = bench._seconds(lambda: log.append("call"), torch.device("cuda"))
    assert log == ["record", "call", "record", "synchronize"] and seconds == 0.5
    assert bench._seconds(lambda: None, torch.device("cpu")) >= 0  # the wall clock


class OutOfResources(Exception):  # Triton's error for a tile pair too big for the multiprocessor, by its name
    pass


def qkv(L=8, d=4):
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(1, 2, L, d, generator=gen).requires_grad_() for _ in range(3)] + [torch.randn(1, 2, L, d)]


def sdpa(q, k, v):
    return F.scaled_dot_product_attention(q, k, v)


def raises(error):
    def f(q, k, v):
        raise error
    return f


def test_a_call_out_of_memory_is_a_skip_not_a_crash():
    q, k, v, grad = qkv()
    funcs = {"SDPA": sdpa, "big": raises(torch.cuda.OutOfMemoryError("CUDA out of memory")),
             "Triton 128x64": raises(OutOfResources("shared memory"))}
    for backward in (False, True):
        times = bench.time_kernels(funcs, q, k, v, grad, backward, repeats=3)
        assert times["big"] == "skipped: OutOfMemoryError" and times["Triton 128x64"] == "skipped: OutOfResources"
        assert isinstance(times["SDPA"], float) and times["SDPA"] >= 0
    with pytest.raises(ValueError, match="a real bug"):
        bench.time_kernels({"SDPA": sdpa, "wrong": raises(ValueError("a real bug"))}, q, k, v, grad, False, 1)


class BigBackward(torch.autograd.Function):
    """The identity, whose backward pass runs out of memory."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise torch.cuda.OutOfMemoryError("CUDA out of memory in the backward pass")


def big_backward(q, k, v):
    return BigBackward.apply(sdpa(q, k, v))


def test_parity_before_speed_catches_a_wrong_implementation_and_skips_what_does_not_fit():
    q, k, v, grad = qkv()
    no_scale = lambda q, k, v: torch.softmax(q @ k.transpose(-2, -1), -1) @ v  # noqa: E731
    with pytest.raises(AssertionError, match="forgot the scale: output"):
        bench.check_kernel_parity({"SDPA": sdpa, "forgot the scale": no_scale}, q, k, v, grad)
    detached_grad = lambda q, k, v: sdpa(q, k.detach(), v)  # noqa: E731  # right output, no gradient for k
    with pytest.raises(AssertionError, match="no k gradient: grad k"):
        bench.check_kernel_parity({"SDPA": sdpa, "no k gradient": lambda q, k, v: detached_grad(q, k, v) + 0 * k},
                                  q, k, v, grad)
    worst, failed = bench.check_kernel_parity(  # forward only (not in grads): its output alone is compared
        {"SDPA": sdpa, "explicit": lambda q, k, v: bench.explicit_attention(q, k, v), "no k gradient": detached_grad,
         "big": raises(torch.cuda.OutOfMemoryError("CUDA out of memory")), "big backward": big_backward},
        q, k, v, grad, grads={"SDPA", "explicit", "big", "big backward"})
    assert 0 <= worst < 1e-5
    assert failed == {("big", False): "skipped: OutOfMemoryError", ("big", True): "skipped: OutOfMemoryError",
                      ("big backward", True): "skipped: OutOfMemoryError"}  # its forward ran, and is compared
    with pytest.raises(RuntimeError, match="a real bug"):
        bench.check_kernel_parity({"SDPA": sdpa, "wrong": raises(RuntimeError("a real bug"))}, q, k, v, grad)


def test_the_reference_backend_is_the_first_that_runs_here():
    from torch.nn.attention import SDPBackend

    # the CPU has a flash backend of its own and no memory-efficient one
    assert bench.sdpa_backend("cpu", torch.float32) == SDPBackend.FLASH_ATTENTION
    assert bench.sdpa_backend("cpu", torch.float32, ("EFFICIENT_ATTENTION", "MATH")) == SDPBackend.MATH
    with pytest.raises(RuntimeError, match=r"none of SDPA's backends \('EFFICIENT_ATTENTION',\) runs torch.float32"):
        bench.sdpa_backend("cpu", torch.float32, ("EFFICIENT_ATTENTION",))


def test_the_section_on_a_gpu_runs_the_benchmark(monkeypatch):
    import attention_course.kernels as kernels

    asked = []
    monkeypatch.setattr(kernels, "interpreted", lambda: False)
    monkeypatch.setattr(bench, "kernel_bench", lambda *args, **kwargs: (asked.append((args, kwargs)) or "table", {}))
    args = SimpleNamespace(device="cuda", kernel_lengths=(512,), kernel_dims=(64,), kernel_repeats=3, kernel_work=7)
    assert bench.kernel_section(args) == "table"
    assert asked == [(((512,), (64,), 3, 7), dict(device="cuda"))]


def test_the_section_without_triton_says_so(monkeypatch):
    from attention_course.kernels import MISSING, flash

    def missing():
        raise ModuleNotFoundError(MISSING, name="triton")

    monkeypatch.setattr(flash, "_kernels", missing)
    text = " ".join(bench.kernel_smoke().split())
    assert text.startswith("kernel: skipped, Triton is not installed.") and "pip install" in text

    def broken():
        raise ModuleNotFoundError("No module named 'numpy'", name="numpy")

    monkeypatch.setattr(flash, "_kernels", broken)
    with pytest.raises(ModuleNotFoundError, match="numpy"):
        bench.kernel_smoke()


def test_on_the_cpu_the_section_checks_the_kernel_and_times_nothing(capsys):
    pytest.importorskip("triton")
    printed = bench.main(["--section", "kernel", "--device", "cpu"])
    assert printed in capsys.readouterr().out
    section = printed.split("\n\n1-minute load average")[0]
    text = " ".join(section.split())
    assert "Triton's interpreter" in text and "measures nothing about a GPU kernel's speed" in text
    diff = float(re.search(r"max \|difference\| (\S+) \(atol 1e-5\): ok", text).group(1))
    assert 0 <= diff < 1e-5
    assert " ms" not in text and "TFLOP/s" not in text  # no time printed
    assert all(len(line) <= 79 for line in section.splitlines())


@pytest.mark.slow  # the timing loop, its kernels interpreted (seconds)
def test_the_timing_loop_runs_at_tiny_sizes_in_the_interpreter():
    pytest.importorskip("triton")
    one = 2 * 2 * 32 * 32 * 4  # bytes of one (B, h, L, L) float32 matrix at B = h = 2, L = 32
    report, results = bench.kernel_bench(lengths=(32,), dims=(16,), repeats=1, work=2 * 2 * 32 * 16,
                                         tiles=((16, 16), (32, 16)), device="cpu", dtype=torch.float32,
                                         free=int(3.5 / 0.9 * one), tiled_longest=16, width=32, at=(32, 16))
    for mask in ("none", "causal"):
        for mode in bench.KERNEL_MODES:
            got = {name: results[16, 32, mask, mode, name] for name in
                   ("SDPA", "Triton 16x16", "Triton 32x16", "Triton", "tiled (ch. 8)", "explicit")}
            assert got["SDPA"]["ratio"] == 1.0 and got["SDPA"]["B"] == got["SDPA"]["h"] == 2
            best = min((got[n]["seconds"], n) for n in ("Triton 16x16", "Triton 32x16"))
            assert got["Triton"]["seconds"] == best[0] and got["Triton"]["label"] == best[1] + " best"
            assert got["Triton"]["tflops"] == pytest.approx(
                bench.attention_flops(2, 2, 32, 32, 16, mask == "causal", mode == "fwd+bwd") / best[0] / 1e12)
            assert got["tiled (ch. 8)"]["skipped"] == "skipped: too long (L > 16)"
            # the explicit version's 3 matrices fit, its 4 with the backward do not
            assert ("seconds" in got["explicit"]) == (mode == "forward")
    text = " ".join(report.split())
    assert "against SDPA restricted to its FLASH_ATTENTION backend" in text and "timed by the wall clock" in text
    assert "unknown for this card: not shown" in text and "tiles (block_m x block_n) 16x16, 32x16" in text
    assert "parity with SDPA checked before timing at every size" in text
    assert "Triton's tiles at L=32, d=16: forward, none: 16x16 " in text
    assert len(re.findall(r"target: Triton (forward|fwd\+bwd) <= 1\.(25|6)x SDPA, L=32, d=16, (none|causal): "
                          r"\d+\.\d\dx, (met|NOT met)", text)) == 4
    assert report.count(bench.KERNEL_HEADER) == 2 and all(len(line) <= 79 for line in report.splitlines())


def test_the_free_memory_the_skip_rule_counts_on(monkeypatch):
    assert bench.free_bytes(torch.device("cpu")) > 0  # the machine's available memory
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device: (3 * 2**30, 80 * 2**30))  # (free, total)
    assert bench.free_bytes(torch.device("cuda")) == 3 * 2**30
