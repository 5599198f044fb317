"""Chapter 7's battery under mutation: check_multihead_attention(factory) on correct layers in four styles and on
the classic mistakes, those of chapter 6's layer (the same switchable layer) and those the bug clinic teaches."""
import copy
import math

import torch
from torch import nn

from attention_course import MultiheadAttention
from attention_course.exercises import ch07
from mutants import Catalogue, Mutant
from mutants.ch06 import MHA, EinsumMHA, layer


def factory(cls):
    return lambda D, h, bias: cls(D, h, bias=bias)


class TorchWrapper(nn.Module):
    """A thin wrapper of torch's layer, with names of its own and a from_torch."""

    def __init__(self, D, h, bias=True):
        super().__init__()
        self.inner = nn.MultiheadAttention(D, h, bias=bias, batch_first=True)

    @classmethod
    def from_torch(cls, mha):
        wrapper = cls(mha.embed_dim, mha.num_heads, mha.in_proj_bias is not None)
        wrapper.inner = copy.deepcopy(mha)
        return wrapper

    def forward(self, *args, **kwargs):
        return self.inner(*args, **kwargs)


class LayersInForward(nn.Module):
    def __init__(self, D, h, bias=True):
        super().__init__()
        self.D = D

    def forward(self, query, key, value, **masks):
        qkv = nn.Linear(self.D, 3 * self.D).to(query)  # new weights at every call
        q, k, v = qkv(query).chunk(3, -1)
        w = torch.softmax(q @ k.transpose(-2, -1), -1)
        return w @ v, w


class SelfOnly(MHA):
    def forward(self, x, key_padding_mask=None):
        return super().forward(x, x, x, key_padding_mask=key_padding_mask)


class CalledParameter(MHA):
    def forward(self, query, key, value, **kwargs):
        self.in_proj_weight(query)  # a Parameter called like an nn.Linear
        return super().forward(query, key, value, **kwargs)


class BiasIgnored(MHA):
    def __init__(self, D, h, bias=True):
        super().__init__(D, h)  # always with biases


class ScoreValues(MHA):
    """Fills the scores that are 0 (none), not the masked ones: the masks never count."""
    opts = {"ignore": ("kpm", "attn")}


class WrongBranch(MHA):
    """The attn_mask branch masks with the padding mask again."""

    def forward(self, query, key, value, key_padding_mask=None, attn_mask=None, **kwargs):
        if attn_mask is not None and key_padding_mask is not None:
            attn_mask = None
        return super().forward(query, key, value, key_padding_mask=key_padding_mask, attn_mask=attn_mask, **kwargs)


class Float64Constant(MHA):
    """A scale kept as a float64 tensor: right in float64, off in float32."""

    def forward(self, query, *args, **kwargs):
        out, w = super().forward(query, *args, **kwargs)
        if query.dtype == torch.float32:
            out = out + 1e-3 * torch.tensor(math.pi, dtype=torch.float64).to(out.dtype)
        return out, w


def mutant(name, names, family=None, **mistakes):
    return Mutant(name, factory(layer(**mistakes)), names, family)


CATALOGUES = [
    Catalogue(
        ch07.check_multihead_attention,
        correct={
            "packed in_proj, view + transpose, masked_fill": factory(layer()),
            "einsum, torch.where, softmax by hand": factory(EinsumMHA),
            "attention_course.MultiheadAttention": factory(MultiheadAttention),
            "a thin wrapper of torch's, from_torch": factory(TorchWrapper),
        },
        mutants=[
            Mutant("layers created in forward", factory(LayersInForward), (r"do not load", r"parameters \{\}")),
            Mutant("a parameter called like a layer", factory(CalledParameter), (r"'Parameter' object is not callable",
                                                                                r"x @ W.T")),
            Mutant("the bias argument ignored", factory(BiasIgnored), (r"bias=False\)", r"do not load")),
            mutant("sizes that do not split into heads", (r"do not split into 4 heads",), size_check=False),
            mutant("softmax over the queries", (r"over the queries",), softmax_dim=-2),
            mutant("scaled by sqrt(D)", (r"by sqrt\(D\), D the embedding",), scale="D"),
            mutant("not scaled", (r"not scale",), scale=None),
            mutant("scaled by sqrt(h)", (r"sqrt\(h\)", r"number of HEADS"), scale="h"),
            mutant("weights summed over the heads", (r"SUMS the weights over the heads",),
                   average="sum"),
            mutant("q @ k, no transpose", (r"inner sizes differ", r"q @ k\.transpose\(-2, -1\)"),
                   k_transposed="no"),
            mutant("weights left in float32", (r"Two dtypes met",), softmax="float32 kept"),
            mutant("inverted polarity", (r"polarity is inverted",), invert=True),
            mutant("attn_mask alone inverted", (r"attn_mask alone is read the other way round",), invert="attn"),
            mutant("mask after the softmax", (r"after the softmax",), mask_after=True),
            mutant("fill -1e9", (r"no key", r"finite fill"), fill=-1e9),
            mutant("fill -1e4", (r"no key", r"finite fill"), family="fill -1e9", fill=-1e4),
            mutant("fill 0", (r"set to 0, not -inf",), family="zero", fill=0.0),
            mutant("padding mask on the query axis", (r"applied to the queries, not the keys",),
                   kpm_shape="queries"),
            mutant("(B, S) mask broadcast from the right", (r"aligns it from the right",), kpm_shape="bare"),
            mutant("split without transpose", (r"splits the heads without the transpose",), split="no transpose"),
            mutant("merge without transpose", (r"merged without undoing",), merge="no transpose"),
            mutant("head order (d, h)", (r"wrong order, \(B, L, d, h\)",), split="dh", merge="dh"),
            mutant("no in_proj bias", (r"in_proj_bias is not used",), in_bias=False),
            mutant("no out_proj bias", (r"out_proj.bias is not used",), out_bias=False),
            mutant("no out_proj", (r"out_proj is missing",), out_proj=False),
            mutant("float mask multiplied", (r"multiplies",), family="zero", floats="mul"),
            mutant("float mask as bool (.bool())", (r"float masks, finite values",
                                                    r"reads a float mask as a bool mask"), floats="bool"),
            # the audit's wrong answers to the chapter's exercises 7.1 to 7.3
            mutant("merge after transpose(2, 3)", (r"transpose\(2, 3\)",), merge="23"),
            mutant("float padding mask read as bool", (r"float key_padding_mask as bool",), floats="kpm bool"),
            mutant("float mask subtracted", (r"subtracts a float mask",), floats="sub"),
            mutant("float mask clamped to -1e4", (r"clamps a float mask",), floats="clamp"),
            mutant("float mask: only -inf used", (r"only the -inf entries",), floats="neginf"),
            mutant("float mask in masked_fill", (r"masked_fill", r"added to the scores"), floats="masked_fill"),
            mutant("dropout active in eval", (r"dropout is active in eval mode",), drop="always", dropout=0.1),
            mutant("a default dropout of 0.1", (r"training mode", r"default dropout"), dropout=0.1),
            mutant("naive softmax", (r"without subtracting the max",), softmax="naive"),
            mutant("nan_to_num after the softmax", (r"gradients", r"BEFORE the softmax"), softmax="nan_to_num",
                   bool_as="bias"),
            mutant("softmax in float32", (r"float32 precision",), softmax="float32"),
            mutant("mask bias created in float32", (r"in float16", r"without dtype="),
                   family="weights left in float32",
                   bool_as="float32 bias"),
            mutant("weights always returned", (r"need_weights=False: your layer's attention-weight tensor is a",),
                   need_weights="always"),
            mutant("weights never returned", (r"attention-weight tensor is None",), need_weights="never"),
            mutant("weights always averaged", (r"one matrix per head",), average="always"),
            mutant("weights flat (B*h, L, S)", (r"flat \(B\*h, L, S\) layout",), average="flat"),
            mutant("sequence-first inputs", (r"batch_first",), seq_first=True),
            mutant("keys split with the queries' length", (r"split k and v with key.shape\[1\]",),
                   keys_with_L=True),
            mutant("graph cut by detach", (r"gradient of in_proj_weight is (missing|None)",), detach=True),
            Mutant("the attn_mask branch masks the padding again", factory(WrongBranch),
                   (r"key_padding_mask alone",)),
            Mutant("masking the scores' values", factory(ScoreValues), (r"without any mask",)),
            mutant("a debug print", (r"prints at every call",), prints=True),
            mutant("head size as a tensor", (r"warned when called",), warns=True),
            Mutant("self-attention only", factory(SelfOnly),
                   (r"raised TypeError", r"forward\(query, key, value")),
            mutant("wrong shapes accepted", (r"without an error", r"broadcast"), shapes="accept"),
            Mutant("a float64 constant", factory(Float64Constant), (r"in float32.*plus the same",)),
        ],
    ),
]
