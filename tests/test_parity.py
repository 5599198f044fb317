"""copy_weights, compare (the parity report), assert_close_report, and the benchmark's quick mode and decode section."""
import pytest
import torch
from torch import nn

from attention_course import MultiheadAttention, assert_close_report, causal_mask, compare, copy_weights
from attention_course.parity import MASKS, ParityReport


@pytest.mark.parametrize("masks", MASKS)
@pytest.mark.parametrize("need_weights", [True, False])
def test_compare_ours_with_torch(pair, masks, need_weights):
    ref, ours = pair(8, 2)
    report = compare(ours, ref, masks=masks, need_weights=need_weights, batch_size=3, query_len=4)
    assert report.ok(atol=1e-10, rtol=0), str(report)
    names = [d.name for d in report.differences]
    assert names[0] == "output" and ("weights" in names) == need_weights
    assert "grad input" in names and "grad in_proj_weight" in names and "grad out_proj.bias" in names


@pytest.mark.parametrize("kwargs", [dict(), dict(kdim=3, vdim=5)])
def test_compare_cross_attention_and_per_head_weights(pair, kwargs):
    ref, ours = pair(8, 2, **kwargs)
    report = compare(ref, ours, key_len=6, masks="padding+causal", average_attn_weights=False, seed=3)
    assert report.ok(atol=1e-10, rtol=0)
    assert report["weights"].actual.shape == (2, 2, 5, 6)
    grads = {d.name for d in report.differences if d.name.startswith("grad ") and "proj" not in d.name}
    assert grads == ({"grad query", "grad key"} if not kwargs else {"grad query", "grad key", "grad value"})


def test_compare_with_custom_masks_and_own_dtype(pair):
    ref, ours = pair(8, 2, dtype=torch.float32)
    masks = dict(attn_mask=causal_mask(5))
    report = compare(ours, ref, masks=masks, dtype=None)
    assert report["output"].actual.dtype == torch.float32
    assert report.ok() and "masks='custom'" in str(report)


def test_compare_finds_and_locates_a_difference(pair):
    ref, ours = pair(8, 2)
    with torch.no_grad():
        ours.out_proj.bias[3] += 1e-3
    report = compare(ours, ref, masks="none")
    assert not report.ok()
    assert report["output"].max_abs == pytest.approx(1e-3)
    assert report["output"].abs_index[-1] == 3
    text = str(report)
    assert "output" in text and "1.00e-03" in text and "False" in text and repr(report) == text
    assert report["grad in_proj_weight"].ok()
    with pytest.raises(KeyError, match="no quantity 'nope'"):
        report["nope"]


def test_compare_rejects_bad_arguments(pair):
    ref, ours = pair(8, 2)
    with pytest.raises(ValueError, match="masks must be one of"):
        compare(ours, ref, masks="future")
    with pytest.raises(TypeError, match="must be an attention_course MultiheadAttention or a torch.nn.MultiheadAttention"):
        compare(ours, nn.Linear(8, 8))
    with pytest.raises(ValueError, match="computed different things"):
        compare(ours, _WithoutWeights(ref), masks="none")


class _WithoutWeights(nn.MultiheadAttention):
    """A torch layer that never returns weights, to make compare's two sides differ."""

    def __init__(self, ref):
        super().__init__(ref.embed_dim, ref.num_heads, batch_first=True, dtype=ref.in_proj_weight.dtype)
        self.load_state_dict(ref.state_dict())

    def forward(self, *args, **kwargs):
        return super().forward(*args, **{**kwargs, "need_weights": False})


def test_copy_weights_both_ways():
    ours, ref = MultiheadAttention(8, 2), nn.MultiheadAttention(8, 2, batch_first=True)
    with torch.no_grad():
        ref.in_proj_bias.uniform_()
    copy_weights(ref, ours)
    assert torch.equal(ours.in_proj_bias, ref.in_proj_bias)
    with torch.no_grad():
        ours.out_proj.bias.uniform_()
    copy_weights(ours, ref)
    assert torch.equal(ref.out_proj.bias, ours.out_proj.bias)
    ref64 = nn.MultiheadAttention(8, 2, batch_first=True, dtype=torch.float64)
    copy_weights(ours, ref64)  # keeps dst's dtype
    assert ref64.in_proj_weight.dtype == torch.float64


@pytest.mark.parametrize("dst, error, match", [
    (MultiheadAttention(8, 4), ValueError, r"same num_heads, got 2 and 4: build dst with num_heads=2"),
    (MultiheadAttention(8, 2, kdim=3), ValueError, "same kdim"),
    (MultiheadAttention(8, 2, bias=False), ValueError, "both have biases"),
    (nn.MultiheadAttention(8, 2, add_zero_attn=True), ValueError, "add_zero_attn"),
    (nn.Linear(8, 8), TypeError, "dst must be"),
])
def test_copy_weights_rejects_mismatched_layers(dst, error, match):
    with pytest.raises(error, match=match):
        copy_weights(MultiheadAttention(8, 2), dst)


def test_assert_close_report_passes_and_reports_the_worst_element():
    a = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    assert_close_report(a, a.clone(), "same")
    assert_close_report(a + 1e-3, a, "loose", atol=1e-2, rtol=0)
    b = a.clone()
    b[1, 0] += 0.5
    b[0, 0] += 0.1
    with pytest.raises(AssertionError) as info:
        assert_close_report(b, a, "output")
    message = str(info.value)
    assert "output is not close: 2 of 4 elements" in message
    assert "greatest absolute error 0.5 at index (1, 0): actual 3.5, expected 3" in message
    # the worst element relative to the tolerance: 0.5 / (1e-5 + 1.3e-6 * 3), float32's defaults
    assert "greatest |actual - expected| / (atol + rtol * |expected|) 3.6e+04 (> 1 fails) at index (1, 0)" in message


def test_assert_close_report_shapes_dtypes_and_nans():
    with pytest.raises(AssertionError, match=r"shape \(2,\) differs from expected \(3,\)"):
        assert_close_report(torch.zeros(2), torch.zeros(3), "x")
    with pytest.raises(AssertionError, match=r"dtype torch.float64 differs from expected torch.float32.*\.to\(torch.float32\)"):
        assert_close_report(torch.zeros(2, dtype=torch.float64), torch.zeros(2), "x")
    nan = torch.tensor([float("nan"), 1.0])
    assert_close_report(nan, nan.clone(), "x")  # NaN equals NaN
    with pytest.raises(AssertionError, match="greatest absolute error inf at index \\(0,\\): actual nan, expected 0"):
        assert_close_report(nan, torch.tensor([0.0, 1.0]), "x")
    with pytest.raises(TypeError, match="expected must be a torch.Tensor"):
        assert_close_report(nan, [1.0], "x")


@pytest.mark.slow
def test_bench_quick_runs_and_prints(capsys):
    from attention_course import bench

    # backend "eager": dynamo's tracing alone, the fastest compile (the script's run, not the compilers, is under test
    # here: inductor and aot_eager are tested in tests/test_dropin.py). 9 s here, against 13 s with aot_eager.
    report = bench.main(["--quick", "--repeats", "1", "--backend", "eager"])
    printed = capsys.readouterr().out
    assert report in printed
    for name in bench.NAMES + bench.COMPILED_NAMES:
        assert name in printed
    assert "parity with nn.MultiheadAttention" in printed and "B=2, L=64, D=64" in printed
    assert "decoding: one CausalSelfAttention layer, E=64" in printed and bench.DECODE_HEADER in printed
    assert "\n\nkernel: " in printed  # chapter 13's section: on the CPU its correctness line (tests/test_bench_kernel.py)


def test_bench_decode_section_checks_parity_and_the_cache_size(capsys):
    from attention_course import bench
    from attention_course.decoding import kv_cache_bytes

    report, results = bench.decode_bench(32, 4, 2, lengths=(8, 24), repeats=1)
    assert set(results) == {8, 24}
    for T, measured in results.items():
        assert measured["diff"] < 1e-5 and measured["cache_bytes"] == kv_cache_bytes(1, 2, 8, T) == 2 * 2 * 8 * T * 4
        assert measured["cached_tps"] > 0 and measured["full_tps"] > 0
    assert bench.DECODE_HEADER in report and "parity checked before timing at every T" in report
    assert all(len(line) <= 79 for line in report.splitlines())
    printed = bench.main(["--section", "decode", "--quick", "--repeats", "1"])
    assert "E=64, heads=4, kv heads=2 (d=16)" in printed and bench.DECODE_HEADER in capsys.readouterr().out


def test_bench_decode_section_refuses_to_time_a_wrong_cache(monkeypatch):
    from attention_course import bench
    from attention_course.decoding import KVCache

    monkeypatch.setattr(bench, "KVCache", lambda: KVCache(window=4))  # a cache that forgets: the step reads too little
    with pytest.raises(AssertionError, match="T=8: cached step against full recomputation is not close"):
        bench.decode_bench(32, 4, 2, lengths=(8,), repeats=1)


def test_difference_of_empty_tensors():
    from attention_course.parity import Difference

    empty = Difference("nothing", torch.zeros(0), torch.zeros(0))
    assert empty.max_abs == 0.0 and empty.ok() and "nothing" in str(empty)


def test_error_over_tolerance_is_finite_where_the_reference_is_exactly_zero(pair):
    """The key bias does not change the softmax, so its gradient is 0 in exact arithmetic; computed, it comes out as
    0.0 or as ~1e-17 in either layer, depending on the order in which the processor's kernels sum. Where the
    reference holds an exact 0 and the other layer does not, |a - b| / |b| would be inf (printed as 1.80e+308 beside
    "all close: True"); |a - b| / (atol + rtol |b|) is assert_close's own measure, and <= 1 exactly when the element
    is close. The exact zero is built here on purpose (the reference's key-bias gradient set to 0.0, ours to 1e-17),
    so that the case is tested on every processor."""
    from attention_course.parity import Difference

    ref, ours = pair(8, 2)
    report = compare(ours, ref, masks="none", seed=0)
    bias = report["grad in_proj_bias"]
    keys = slice(8, 16)  # the key bias: rows E..2E of in_proj_bias
    assert bias.expected[keys].abs().max() < 1e-12 and bias.actual[keys].abs().max() < 1e-12  # 0 up to rounding
    expected, actual = bias.expected.clone(), bias.actual.clone()
    expected[keys], actual[keys] = 0.0, 1e-17
    made = Difference(bias.name, actual, expected)
    report.differences[report.differences.index(bias)] = made
    assert 0 < made.max_ratio < 1e-6 and made.ok() and report.ok()
    text = str(report)
    assert "e+308" not in text and "inf" not in text
    assert "err/tol = max |a - b| / (atol + rtol * |b|), <= 1 is close" in text
    assert "(as assert_close judges; atol=1e-07, rtol=1e-07, torch.float64's defaults)" in text
    assert text.endswith("all close at these tolerances: True")
    assert all(len(line) <= 79 for line in text.splitlines())


def test_error_over_tolerance_agrees_with_ok():
    from attention_course.parity import Difference

    f64 = dict(dtype=torch.float64)  # defaults atol = rtol = 1e-7
    d = Difference("grad key bias", torch.tensor([1e-17, 0.5, 2.0 + 6e-7], **f64), torch.tensor([0.0, 0.5, 2.0], **f64))
    assert d.max_ratio == pytest.approx(6e-7 / (1e-7 + 1e-7 * 2.0)) and d.ratio_index == (2,)
    assert d.max_ratio > 1 and not d.ok()
    assert d.ratio(atol=1e-5, rtol=0) == pytest.approx(0.06) and d.ok(atol=1e-5, rtol=0)
    assert Difference("x", torch.tensor([1e-17]), torch.tensor([0.0])).ratio(atol=0, rtol=0) == float("inf")
    assert Difference("x", torch.tensor([0.0]), torch.tensor([0.0])).ratio(atol=0, rtol=0) == 0.0
    inf = torch.tensor([float("inf")])
    assert Difference("x", inf, inf.clone()).max_ratio == 0.0 and Difference("x", inf, inf.clone()).ok()
    table = ParityReport("setting", [d]).table(atol=1e-5, rtol=0)
    assert "atol=1e-05, rtol=0, given)" in table and table.endswith("all close at these tolerances: True")
