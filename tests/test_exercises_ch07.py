"""check_multihead_attention: correct layers pass (ours, a thin wrapper of torch's), each classic mistake is caught
and named where a diagnosis applies, and a broken layer never hangs or crashes the checker."""
import math
import threading
import warnings

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from attention_course import MultiheadAttention
from attention_course.exercises import ExerciseError, check_multihead_attention
from attention_course import probe
from attention_course.exercises import ch07
from mutants.ch07 import LayersInForward  # creates its layers in forward: no parameters
from mutants.ch07 import TorchWrapper  # a thin wrapper of torch's layer, with a from_torch


class Layer(nn.Module):
    """A correct multi-head layer, each step a method a test can break."""

    def __init__(self, D, h, bias=True, dropout=0.0):
        super().__init__()
        if D % h:
            raise ValueError(f"embed_dim {D} is not divisible by num_heads {h}")
        self.D, self.h, self.d, self.p = D, h, D // h, dropout
        self.in_proj_weight = nn.Parameter(torch.randn(3 * D, D) / math.sqrt(D))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * D)) if bias else None
        self.out_proj = nn.Linear(D, D, bias=bias)

    def proj(self, q, k, v):
        bias = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None else [None] * 3
        return [F.linear(t, w, b) for t, w, b in zip((q, k, v), self.in_proj_weight.chunk(3), bias)]

    def split(self, t):
        return t.unflatten(-1, (self.h, self.d)).transpose(1, 2)

    def scale(self):
        return math.sqrt(self.d)

    def fill(self, scores, mask):
        return scores.masked_fill(mask, float("-inf")) if mask.dtype == torch.bool else scores + mask

    def soft(self, scores):
        empty = torch.isneginf(scores).all(-1, keepdim=True)
        return torch.softmax(scores.masked_fill(empty, 0.0), -1).masked_fill(empty, 0.0)

    def drop(self, w):
        return F.dropout(w, self.p, training=self.training)

    def weights_out(self, w, average):
        return w.mean(1) if average else w

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        q, k, v = (self.split(t) for t in self.proj(query, key, value))
        B, h, L, S = q.shape[0], self.h, q.shape[2], k.shape[2]
        scores = q @ k.transpose(-2, -1) / self.scale()
        if key_padding_mask is not None:
            scores = self.pad(scores, key_padding_mask)
        if attn_mask is not None:
            scores = self.attn(scores, attn_mask if attn_mask.dim() == 2 else attn_mask.view(B, h, L, S))
        w = self.drop(self.soft(scores))
        out = self.out_proj(self.merge(w @ v))
        return out, (self.weights_out(w, average_attn_weights) if need_weights else None)

    def pad(self, scores, kpm):  # (B, S) -> (B, 1, 1, S)
        return self.fill(scores, kpm[:, None, None, :])

    def attn(self, scores, mask):
        return self.fill(scores, mask)

    def merge(self, o):  # (B, h, L, d) -> (B, L, D)
        return o.transpose(1, 2).flatten(2)


def mistake(**methods):
    return type("Mistake", (Layer,), methods)


def verdict(cls):
    with pytest.raises(ExerciseError) as info:
        check_multihead_attention(lambda D, h, bias: cls(D, h, bias))
    return str(info.value)


def test_correct_layers_pass(capsys):
    check_multihead_attention(lambda D, h, bias: Layer(D, h, bias))
    check_multihead_attention(lambda D, h, bias: MultiheadAttention(D, h, bias=bias))
    assert capsys.readouterr().out.startswith("Correct: all ")


def test_a_thin_wrapper_of_torch_passes_through_from_torch(capsys):
    check_multihead_attention(lambda D, h, bias: TorchWrapper(D, h, bias))
    out = capsys.readouterr().out
    assert f"all {len(ch07.CASES)} cases" in out and "NaN as torch's" in out


def wrong_branch(self, scores, mask):
    return scores.masked_fill(torch.ones_like(scores, dtype=torch.bool).triu(1), float("-inf")) \
        if mask.dtype == torch.bool and mask.dim() == 4 and mask.shape[2] == 1 else scores


def no_bias_proj(self, q, k, v):
    return [t @ w.T for t, w in zip((q, k, v), self.in_proj_weight.chunk(3))]


def flat(self, w, average):
    return w.flatten(0, 1)


def prints(self, scores):
    print("scores", tuple(scores.shape))
    return Layer.soft(self, scores)


def warns(self):
    return math.sqrt(torch.tensor(torch.tensor(self.d)))


class NoSizeCheck(Layer):
    def __init__(self, D, h, bias=True):
        nn.Module.__init__(self)
        self.D, self.h, self.d, self.p = D, h, D // h, 0.0  # 10 // 4 = 2: heads of 2 features
        self.in_proj_weight = nn.Parameter(torch.randn(3 * D, D) / math.sqrt(D))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * D)) if bias else None
        self.out_proj = nn.Linear(D, D, bias=bias)


class ParameterCalled(Layer):
    def proj(self, q, k, v):
        return [w(t) for t, w in zip((q, k, v), (self.in_proj_weight,) * 3)]  # a Parameter called like a Linear


class SplitWithQueryLength(Layer):
    def forward(self, query, *args, **kwargs):
        self.L = query.shape[1]  # kept for split: wrong for the keys when S != L
        return super().forward(query, *args, **kwargs)

    def split(self, t):
        return t.view(t.shape[0], self.L, self.h, self.d).transpose(1, 2)


class SelfOnly(Layer):
    def forward(self, x, key_padding_mask=None):
        return super().forward(x, x, x, key_padding_mask=key_padding_mask)


RELEASE = threading.Event()  # set when the test is over: the checker leaves an endless layer's thread running


class Endless(Layer):
    def forward(self, *args, **kwargs):
        while not RELEASE.is_set():  # busy, like `while True: pass`, until the test releases it
            pass


class WrongShapesAccepted(Layer):
    def forward(self, query, key, value, key_padding_mask=None, **kwargs):
        if key_padding_mask is not None and key_padding_mask.shape[1] != key.shape[1]:
            key_padding_mask = None  # silently drops a mask that does not fit
        return super().forward(query[..., :self.D], key, value, key_padding_mask, **kwargs)


MISTAKES = [  # (name, class, key words of the verdict)
    ("layers created in forward", LayersInForward, ["do not load", "parameters {}"]),
    ("masking the scores' values", mistake(fill=lambda self, s, m: s.masked_fill(s == 0, -1e20)),
     ["without any mask", "filled where a score is 0"]),
    ("a branch with the wrong mask", mistake(fill=wrong_branch), ["differs"]),
    ("the attn_mask branch masks the padding again", mistake(attn=lambda self, s, m: s),
     ["key_padding_mask alone", "its own mask"]),
    ("missing in_proj biases", mistake(proj=no_bias_proj), ["in_proj_bias is not used"]),
    ("mask polarity", mistake(fill=lambda self, s, m: s.masked_fill(~m, float("-inf"))
                              if m.dtype == torch.bool else s + m), ["polarity is inverted"]),
    ("a -1e9 fill", mistake(fill=lambda self, s, m: s.masked_fill(m, -1e9) if m.dtype == torch.bool else
                            (s + m).clamp(min=-1e9), soft=lambda self, s: torch.softmax(s, -1)),
     ["in the rows of queries that see no key", "cannot be converted to type c10::Half"]),
    ("dropout at evaluation", mistake(drop=lambda self, w: F.dropout(w, 0.1)), ["dropout is active in eval mode"]),
    ("heads split without transpose", mistake(split=lambda self, t: t.reshape(t.shape[0], self.h, -1, self.d)),
     ["without the transpose"]),
    ("sqrt(D)", mistake(scale=lambda self: math.sqrt(self.D)), ["sqrt(D)"]),
    ("softmax over the queries", mistake(soft=lambda self, s: torch.softmax(s, -2)), ["over the queries"]),
    ("head size as a tensor", mistake(scale=warns), ["warned when called", "int"]),
    ("weights per (B*h)", mistake(weights_out=flat), ["flat (B*h, L, S) layout"]),
    ("self-attention only", SelfOnly, ["raised TypeError"]),
    ("a debug print", mistake(soft=prints), ["prints at every call", "debug print"]),
    ("a naive softmax", mistake(soft=lambda self, s: s.exp() / s.exp().sum(-1, keepdim=True)),
     ["subtract", "max"]),
    ("a default dropout of 0.1", type("Default", (Layer,), {"__init__": lambda self, D, h, bias=True:
                                                          Layer.__init__(self, D, h, bias, dropout=0.1)}),
     ["training mode", "dropout"]),
    ("wrong shapes accepted", WrongShapesAccepted, ["without an error", "broadcast"]),
    ("sizes that do not split into heads", NoSizeCheck, ["10 features do not split into 4 heads"]),
    ("a parameter called like a layer", ParameterCalled, ["'Parameter' object is not callable", "x @ W.T"]),
    ("a float mask in masked_fill", mistake(fill=lambda self, s, m: s.masked_fill(m, float("-inf"))),
     ["masked_fill", "added to the scores"]),
    ("a (B, S) mask broadcast as (L, S)",
     mistake(pad=lambda self, s, m: self.fill(s, m)), ["aligns it from the right", "[:, None, None, :]"]),
    # the chapter's four find-the-bug exercises
    ("heads merged without the transpose", mistake(merge=lambda self, o: o.reshape(o.shape[0], o.shape[2], -1)),
     ["merged without undoing the split's transpose"]),
    ("a padding mask that blocks queries",
     mistake(pad=lambda self, s, m: self.fill(s, m.view(m.shape[0], 1, s.shape[-1], 1))),
     ["applied to the queries, not the keys"]),
    ("a float mask multiplied", mistake(fill=lambda self, s, m: s * m.exp() if m.dtype != torch.bool else
                                        Layer.fill(self, s, m)), ["multiplies the scores by a float mask"]),
    ("keys split with the queries' length", SplitWithQueryLength, ["split k and v with key.shape[1]"]),
    # float masks with finite values: .bool() blocks every nonzero entry (0 / -inf masks alone do not show it)
    ("a float mask made bool", mistake(fill=lambda self, s, m: s.masked_fill(m.bool(), float("-inf"))),
     ["float masks, finite values", "reads a float mask as a bool mask"]),
    # a tensor created without dtype= is float32: harmless in float64 and float32, a crash in float16
    ("a float32 bias in float16", mistake(fill=lambda self, s, m: s + torch.zeros(m.shape).masked_fill(m, -math.inf)
                                          if m.dtype == torch.bool else s + m),
     ["in float16", "without dtype="]),
    ("a crash labelled by the running check", mistake(fill=lambda self, s, m: 1 / 0),
     ["heads of size 1: your layer raised ZeroDivisionError"]),
    # outside the catalogue, seen before out_proj (undone: its weights are the case's): a factor, an arrangement
    ("merged heads divided by h", mistake(merge=lambda self, o: Layer.merge(self, o) / self.h),
     ["Its output with out_proj undone (the merged heads, (B, L, D)) is 0.25 times the right one at every entry"]),
    ("merged through transpose(1, 3)", mistake(merge=lambda self, o: o.transpose(1, 3).reshape(o.shape[0], o.shape[2],
                                                                                              -1)),
     ["Its output with out_proj undone (the merged heads, (B, L, D)) holds the right values, arranged differently"]),
    # ... or the same vector added at every position: a bias left out, or added twice
    ("out_proj's bias left out", type("NoOutBias", (Layer,), {"forward": lambda self, *a, **k: (
        Layer.forward(self, *a, **k)[0] - (0 if self.out_proj.bias is None else self.out_proj.bias),
        Layer.forward(self, *a, **k)[1])}),
     ["the right one plus the same vector at every position, -out_proj.bias: out_proj's bias left out"]),
    ("the value bias added twice", mistake(proj=lambda self, q, k, v: [*Layer.proj(self, q, k, v)[:2], Layer.proj(
        self, q, k, v)[2] + (0 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)[2])]),
     ["+b_v W_o^T: the value bias (in_proj_bias's last third) added twice"]),
    ("out_proj applied twice", mistake(merge=lambda self, o: self.out_proj(Layer.merge(self, o))),
     ["Its output is out_proj applied TWICE to the merged heads"]),
    # ... or the heads it gets wrong, where others are right: the padding reaches head 0 alone
    ("padding for head 0 only", mistake(pad=lambda self, s, m: torch.cat([Layer.pad(self, s[:, :1], m), s[:, 1:]], 1)),
     ["(the merged heads) is right in head 0 and wrong in heads 1, 2, 3, of sentence 1 only, the one with pads"]),
]


def test_a_right_output_gets_no_note_of_the_output():
    """Weights returned where None is asked: the output is right, and nothing is said of it (no vector of zeros)."""
    message = verdict(mistake(forward=lambda self, *a, **k: Layer.forward(self, *a, **{**k, "need_weights": True})))
    assert "expected None" in message and "Its output" not in message, message


def test_an_output_of_another_shape_is_reported_without_a_crash():
    """A layer whose output is (L, B, D), sequence first, is told its shape; the notes that read a (B, L, D) output
    say nothing, and never raise."""
    message = verdict(mistake(forward=lambda self, *a, **k: (Layer.forward(self, *a, **k)[0].transpose(0, 1),
                                                              Layer.forward(self, *a, **k)[1])))
    assert "has shape" in message, message


@pytest.mark.parametrize("name, cls, words", MISTAKES, ids=[m[0] for m in MISTAKES])
def test_each_mistake_is_caught_and_named(name, cls, words):
    message = verdict(cls)
    assert not message.startswith("Correct"), message
    for word in words:
        assert word in message, (word, message)


@pytest.mark.skipif(torch.cuda.is_available(), reason="on a GPU machine a discarded .to('cuda') runs")
def test_a_hard_coded_gpu_call_is_reported_on_the_cpu():
    class GPU(Layer):
        def fill(self, scores, mask):
            mask.to("cuda")  # a device call, result discarded: fails without CUDA
            return super().fill(scores, mask)

    message = verdict(GPU)
    assert "raised" in message and "The checker's tensors are on the CPU" in message  # the checker's words, not torch's


@pytest.mark.parametrize("torch_says", [
    "Torch not compiled with CUDA enabled",  # the CPU wheel
    "Found no NVIDIA driver on your system. Please check that you have an NVIDIA GPU and installed a driver",  # CUDA build
    "Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
])
def test_a_gpu_error_gets_the_device_hint_whatever_torch_build_words_it(torch_says):
    from attention_course.exercises import classic_hint

    assert "The checker's tensors are on the CPU" in classic_hint(RuntimeError(torch_says))


def test_an_endless_layer_does_not_hang_the_checker(monkeypatch):
    monkeypatch.setattr(probe, "TIMEOUT_S", 0.5)
    try:
        message = verdict(Endless)
    finally:
        RELEASE.set()  # a spinning thread left alive holds the GIL half the time: every later test would crawl
    assert "did not return within" in message and "endless loop" in message and "restart the kernel" in message


def test_a_factory_that_returns_no_module_or_raises():
    with pytest.raises(ExerciseError, match="must return an nn.Module"):
        check_multihead_attention(lambda D, h, bias: "layer")
    with pytest.raises(ExerciseError, match=r"your layer raised ZeroDivisionError"):
        check_multihead_attention(lambda D, h, bias: 1 / 0)


def test_gradients_cut_by_detach_are_caught():
    cls = mistake(soft=lambda self, s: Layer.soft(self, s).detach())
    assert "gradient" in verdict(cls)


def test_float64_constants_are_caught_in_float32():
    class Float64Scale(Layer):
        def scale(self):
            return torch.tensor(math.sqrt(self.d), dtype=torch.float64) + 1e-3 * (self.in_proj_weight.dtype
                                                                                   == torch.float32)

    assert "float32" in verdict(Float64Scale)


def test_no_warning_from_a_correct_layer():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        check_multihead_attention(lambda D, h, bias: Layer(D, h, bias))
