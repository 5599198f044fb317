"""Chapter 6's checkers under mutation: combining the masks, and the whole multi-head layer.

The layer ``MHA`` (also used by chapter 7's catalogue) is a correct multi-head attention layer with torch's names and
interface; each option of ``OK`` switched to another value is one classic mistake.
"""
import math

import torch
import torch.nn.functional as F
from torch import nn

from attention_course.exercises import ch06
from mutants import Catalogue, Mutant

# ----------------------------------------------------------------------------------------------------------
# combine_masks(key_padding_mask, attn_mask, B, h, L, S) -> (B, h, L, S) bool, True = blocked


def combine(kpm, attn_mask, B, h, L, S, *, op="or", head_major=False, invert=False, expand=True, ignore=(),
            kpm_shape="keys", flat_3d=False, turn_2d=False, as_float=False, none_safe=True):
    """view + | + expand, each option a mistake."""
    parts = []
    if kpm is not None and "kpm" not in ignore:
        parts.append({"keys": kpm.view(B, 1, 1, S), "bare": kpm, "queries": kpm.view(B, 1, S, 1),
                      "heads": kpm.view(1, B, 1, S)}[kpm_shape])
    if (attn_mask is not None or not none_safe) and "attn" not in ignore:
        if attn_mask.ndim == 2:
            parts.append(attn_mask.T.reshape(S, L) if turn_2d else attn_mask.view(1, 1, L, S))
        elif flat_3d:
            parts.append(attn_mask)
        else:
            parts.append(attn_mask.view(h, B, L, S).transpose(0, 1) if head_major else attn_mask.view(B, h, L, S))
    mask = torch.zeros(B, h, L, S, dtype=torch.bool) if expand else torch.zeros(1, 1, 1, 1, dtype=torch.bool)
    if op in ("and", "mul") and len(parts) == 2:
        mask = mask | (parts[0] & parts[1] if op == "and" else parts[0] * parts[1])
    else:
        for part in parts:
            mask = mask | part
    mask = ~mask if invert else mask
    return mask.float() if as_float else mask


def combine_where(kpm, attn_mask, B, h, L, S):
    """Another style: logical_or of broadcast views, torch.where over an all-False start."""
    blocked = torch.zeros(B, h, L, S, dtype=torch.bool)
    if kpm is not None:
        blocked = torch.where(kpm[:, None, None, :], True, blocked)
    if attn_mask is not None:
        per_head = attn_mask.unflatten(0, (B, h)) if attn_mask.dim() == 3 else attn_mask[None, None]
        blocked = torch.logical_or(blocked, per_head)
    return blocked


def combine_add(kpm, attn_mask, B, h, L, S):
    """A third: bool + bool is a logical or; .repeat instead of .expand."""
    out = torch.zeros(1, 1, L, S, dtype=torch.bool)
    if attn_mask is not None:
        out = out + (attn_mask.reshape(B, h, L, S) if attn_mask.dim() == 3 else attn_mask)
    if kpm is not None:
        out = out + kpm.reshape(B, 1, 1, S)
    return out.repeat(B // out.shape[0], h // out.shape[1], 1, 1)


COMBINE_MUTANTS = [
    Mutant("inverted polarity", lambda *a: combine(*a, invert=True), (r"inverted", r"True = blocked")),
    Mutant("combined with &", lambda *a: combine(*a, op="and"), (r"with & \(and\)", r"EITHER")),
    Mutant("combined with *", lambda *a: combine(*a, op="mul"), (r"with & \(and\)",), family="combined with &"),
    Mutant("3-D mask unflattened head-major", lambda *a: combine(*a, head_major=True), (r"head-major",)),
    Mutant("not expanded", lambda *a: combine(*a, expand=False), (r"broadcasts", r"\.expand\(B, h, L, S\)")),
    Mutant("key_padding_mask ignored", lambda *a: combine(*a, ignore=("kpm",)), (r"all of them where the key_padding_mask alone blocks",)),
    Mutant("attn_mask ignored", lambda *a: combine(*a, ignore=("attn",)), (r"all of them where the attn_mask alone blocks",)),
    Mutant("a float result", lambda *a: combine(*a, as_float=True), (r"is float32, expected bool",)),
    Mutant("an int64 result", lambda *a: combine(*a).long(), (r"is int64, expected bool",)),
    Mutant("key_padding_mask as (B, S), aligned from the right", lambda *a: combine(*a, kpm_shape="bare"),
           (r"aligns it from the right", r"view\(B, 1, 1, S\)")),
    Mutant("key_padding_mask on the query axis", lambda *a: combine(*a, kpm_shape="queries"),
           (r"on the query axis",)),
    Mutant("key_padding_mask on the head axis", lambda *a: combine(*a, kpm_shape="heads"),
           (r"\(B, S\) becomes \(B, 1, 1, S\)",)),
    Mutant("3-D attn_mask left flat", lambda *a: combine(*a, flat_3d=True), (r"3-D attn_mask is flat",)),
    Mutant("2-D attn_mask turned around", lambda *a: combine(*a, turn_2d=True), (r"turned around",)),
    Mutant("None not handled", lambda *a: combine(*a, none_safe=False), (r"may be None",)),
    Mutant("key_padding_mask alone inverted", lambda k, a, *s: combine(None if k is None else ~k, a, *s),
           (r"key_padding_mask alone is read the other way round",)),
    Mutant("attn_mask alone inverted", lambda k, a, *s: combine(k, None if a is None else ~a, *s),
           (r"attn_mask alone is read the other way round",)),
    Mutant("3-D attn_mask as (B, h, S, L), transposed", lambda k, a, B, h, L, S: combine(
        k, a if a is None or a.dim() == 2 else a.reshape(B * h, S, L).transpose(-2, -1), B, h, L, S),
           (r"reads the 3-D attn_mask as \(B, h, S, L\)",)),
]

# ----------------------------------------------------------------------------------------------------------
# The whole layer: MyMultiheadAttention(embed_dim, num_heads[, bias, dropout])

OK = dict(
    softmax_dim=-1, scale="d", invert=False, mask_after=False, fill=float("-inf"), kpm_shape="keys",
    split="hd", merge="hd", in_bias=True, out_bias=True, out_proj=True, floats="add", drop="train",
    softmax="torch", need_weights="obey", average="obey", seq_first=False, keys_with_L=False, detach=False,
    ignore=(), bool_as="fill", dropout=None, size_check=True, prints=False, warns=False, shapes="check",
    k_transposed="yes",
)


def safe_softmax(scores, dim):
    empty = torch.isneginf(scores).all(dim, keepdim=True)
    return torch.softmax(scores.masked_fill(empty, 0.0), dim).masked_fill(empty, 0.0)


SOFTMAX = {
    "torch": torch.softmax,
    "safe": safe_softmax,
    "naive": lambda s, dim: s.exp() / s.exp().sum(dim, keepdim=True),
    "nan_to_num": lambda s, dim: torch.softmax(s, dim).nan_to_num(0.0),
    "float32": lambda s, dim: torch.softmax(s.float(), dim).to(s.dtype),
    "float32 kept": torch.softmax,  # replaced in forward
}


class MHA(nn.Module):
    """Packed in_proj, split and merge by view + transpose, bool masks by masked_fill, float masks added."""
    opts: dict = {}

    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        self.o = o = {**OK, **type(self).opts}
        if embed_dim % num_heads and o["size_check"]:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.D, self.h, self.d = embed_dim, num_heads, embed_dim // num_heads
        self.p = dropout if o["dropout"] is None else o["dropout"]
        self.in_proj_weight = nn.Parameter(torch.empty(3 * embed_dim, embed_dim))
        nn.init.xavier_uniform_(self.in_proj_weight)
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        o, h, d = self.o, self.h, self.d
        if o["shapes"] == "accept":  # a query too wide is cut, a mask that does not fit dropped
            query = query[..., :self.D]
            if key_padding_mask is not None and key_padding_mask.shape[1] != key.shape[1]:
                key_padding_mask = None
        if o["prints"]:
            print("query", tuple(query.shape))
        if o["seq_first"]:  # read as (L, B, D): attention over the batch
            query, key, value = (t.transpose(0, 1) for t in (query, key, value))
        B, L, D = query.shape
        S = L if o["keys_with_L"] else key.shape[1]
        W = self.in_proj_weight.detach() if o["detach"] else self.in_proj_weight
        biases = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None and o["in_bias"] else (None,) * 3
        q, k, v = (F.linear(t, w, b) for t, w, b in zip((query, key, value), W.chunk(3), biases))

        def split(t, n):  # (B, n, D) -> (B, h, n, d)
            if o["split"] == "no transpose":
                return t.reshape(B, h, n, d)
            if o["split"] == "dh":
                return t.reshape(B, n, d, h).permute(0, 3, 1, 2)
            return t.view(B, n, h, d).transpose(1, 2)

        q, k, v = split(q, L), split(k, S), split(v, S)
        scores = q @ (k if o["k_transposed"] == "no" else k.transpose(-2, -1))  # (B, h, L, S)
        if o["warns"]:
            scores = scores / torch.sqrt(torch.tensor(torch.tensor(d), dtype=scores.dtype))
        elif o["scale"] is not None:
            scores = scores / math.sqrt({"d": d, "D": D, "h": h}[o["scale"]])
        after = []
        for which, m in (("kpm", key_padding_mask), ("attn", attn_mask)):
            if m is None or which in o["ignore"]:
                continue
            if which == "kpm":
                m = {"keys": lambda: m.view(B, 1, 1, S), "bare": lambda: m,
                     "queries": lambda: m.view(B, 1, S, 1)}[o["kpm_shape"]]()
            elif m.dim() == 3:
                m = m.view(B, h, L, S)
            if m.dtype == torch.bool:
                m = ~m if o["invert"] is True or o["invert"] == which else m
                if o["mask_after"]:
                    after.append(m)
                elif o["bool_as"] == "bias":  # -inf added
                    scores = scores + torch.zeros_like(scores).masked_fill(m, float("-inf"))
                elif o["bool_as"] == "float32 bias":  # a bias tensor created without dtype=: float32
                    scores = scores + torch.zeros(m.shape, device=m.device).masked_fill(m, float("-inf"))
                else:
                    scores = scores.masked_fill(m, o["fill"])
            elif o["floats"] == "add" or (o["floats"] == "kpm bool" and which == "attn"):
                scores = scores + m
            elif o["floats"] == "sub":  # scores - m
                scores = scores - m
            elif o["floats"] == "clamp":  # m.clamp(min=-1e4): -inf made finite
                scores = scores + m.clamp(min=-1e4)
            elif o["floats"] == "mul":
                scores = scores * m.exp()
            elif o["floats"] in ("bool", "kpm bool"):
                scores = scores.masked_fill(m.bool(), o["fill"])
            elif o["floats"] == "neginf":
                scores = scores.masked_fill(torch.isneginf(m), o["fill"])
            else:  # "masked_fill": a float mask handed to masked_fill
                scores = scores.masked_fill(m, o["fill"])
        weights = SOFTMAX[o["softmax"]](scores, o["softmax_dim"])  # (B, h, L, S)
        if o["softmax"] == "float32 kept":  # the weights left in float32 meet the float64 values
            weights = torch.softmax(scores.float(), o["softmax_dim"])
        for m in after:
            weights = weights.masked_fill(m, 0.0)
        weights = F.dropout(weights, self.p, training=o["drop"] == "always" or self.training)
        heads = weights @ v  # (B, h, L, d)
        if o["merge"] == "no transpose":
            heads = heads.reshape(B, L, D)
        elif o["merge"] == "dh":
            heads = heads.permute(0, 2, 3, 1).reshape(B, L, D)
        elif o["merge"] == "23":  # transpose(2, 3): (B, h, d, L)
            heads = heads.transpose(2, 3).reshape(B, L, D)
        elif o["merge"] == "view":
            heads = heads.transpose(1, 2).view(B, L, D)
        else:
            heads = heads.transpose(1, 2).reshape(B, L, D)
        if o["out_proj"]:
            out = F.linear(heads, self.out_proj.weight, self.out_proj.bias if o["out_bias"] else None)
        else:
            out = heads
        if o["seq_first"]:
            out = out.transpose(0, 1)
        if o["need_weights"] == "never" or (not need_weights and o["need_weights"] == "obey"):
            return out, None
        if o["average"] == "flat":
            return out, weights.reshape(B * h, L, S)
        if o["average"] == "sum" and average_attn_weights:
            return out, weights.sum(1)
        average = {"obey": average_attn_weights, "always": True, "never": False, "sum": average_attn_weights}[
            o["average"]]
        return out, weights.mean(1) if average else weights


def layer(**mistakes):
    """A subclass of MHA with the given options: a class, as the checkers take."""
    assert set(mistakes) <= set(OK), set(mistakes) - set(OK)
    return type("MyMultiheadAttention", (MHA,), {"opts": mistakes})


class EinsumMHA(nn.Module):
    """Another style: einsum projections and heads, unflatten / flatten, torch.where masks, a softmax by hand
    (max subtracted; rows with no key get zeros)."""

    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__()
        if embed_dim % num_heads:
            raise ValueError("embed_dim must be divisible by num_heads")
        self.h, self.dropout = num_heads, nn.Dropout(dropout)
        self.in_proj_weight = nn.Parameter(torch.randn(3 * embed_dim, embed_dim) / embed_dim ** 0.5)
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        W = self.in_proj_weight.unflatten(0, (3, self.h, -1))  # (3, h, d, D)
        q = torch.einsum("bld,hed->bhle", query, W[0])  # (B, h, L, d)
        k = torch.einsum("bsd,hed->bhse", key, W[1])
        v = torch.einsum("bsd,hed->bhse", value, W[2])
        if self.in_proj_bias is not None:
            b = self.in_proj_bias.unflatten(0, (3, self.h, 1, -1))  # (3, h, 1, d)
            q, k, v = q + b[0], k + b[1], v + b[2]
        scores = torch.einsum("bhle,bhse->bhls", q, k) / math.sqrt(q.shape[-1])
        B, h, L, S = scores.shape
        for m in (None if key_padding_mask is None else key_padding_mask[:, None, None, :],
                  None if attn_mask is None else attn_mask.reshape(-1, h, L, S) if attn_mask.dim() == 3
                  else attn_mask):
            if m is not None:
                scores = torch.where(m, float("-inf"), scores) if m.dtype == torch.bool else scores + m
        top = scores.amax(-1, keepdim=True)
        e = torch.exp(scores - torch.where(torch.isneginf(top), 0.0, top))
        total = e.sum(-1, keepdim=True)
        weights = self.dropout(e / torch.where(total == 0, 1.0, total))
        out = self.out_proj(torch.einsum("bhls,bhse->blhe", weights, v).flatten(2))
        if not need_weights:
            return out, None
        return out, weights.mean(1) if average_attn_weights else weights


class TorchSubclass(nn.MultiheadAttention):
    """A third: torch's own layer, batch first."""

    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0):
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, batch_first=True)


def mutant(name, names, family=None, **mistakes):
    return Mutant(name, layer(**mistakes), names, family)


LAYER_MUTANTS = [
    mutant("softmax over the queries", (r"over the queries",), softmax_dim=-2),
    mutant("softmax over the heads", (r"softmax over the heads",), softmax_dim=1),
    mutant("scaled by sqrt(D)", (r"by sqrt\(D\), D the embedding", r"sqrt\(d\)"), scale="D"),
    mutant("not scaled", (r"not scale", r"sqrt\(d\)"), scale=None),
    mutant("scaled by sqrt(h)", (r"sqrt\(h\)", r"number of HEADS"), scale="h"),
    mutant("weights summed over the heads", (r"SUMS the weights over the heads",),
           average="sum"),
    mutant("q @ k, no transpose", (r"inner sizes differ", r"q @ k\.transpose\(-2, -1\)"), k_transposed="no"),
    mutant("weights left in float32", (r"Two dtypes met", r"dtype=x\.dtype"), softmax="float32 kept"),
    mutant("inverted polarity", (r"polarity is inverted",), invert=True),
    mutant("inverted polarity, -1e9 fill", (r"polarity is inverted",), family="inverted polarity", invert=True,
           fill=-1e9),
    mutant("attn_mask alone inverted", (r"attn_mask alone is read the other way round",), invert="attn"),
    mutant("mask after the softmax", (r"after the softmax",), mask_after=True),
    mutant("fill -1e9", (r"no key", r"finite fill"), fill=-1e9),
    mutant("fill -1e4", (r"no key", r"finite fill"), family="fill -1e9", fill=-1e4),
    mutant("fill 0", (r"set to 0, not -inf",), family="zero", fill=0.0),
    mutant("padding mask on the query axis", (r"applied to the queries, not the keys",), kpm_shape="queries"),
    mutant("(B, S) mask broadcast from the right", (r"aligns it from the right", r"\[:, None, None, :\]"),
           kpm_shape="bare"),
    mutant("split without transpose", (r"splits the heads without the transpose",), split="no transpose"),
    mutant("merge without transpose", (r"merged without undoing",), merge="no transpose"),
    mutant("merge by view", (r"view size is not compatible", r"contiguous"), merge="view"),
    mutant("head order (d, h) in split and merge", (r"wrong order, \(B, L, d, h\)",), split="dh", merge="dh"),
    mutant("head order (d, h) in the merge", (r"merges the heads in the wrong order",), merge="dh"),
    mutant("no in_proj bias", (r"in_proj_bias is not used",), in_bias=False),
    mutant("no out_proj bias", (r"out_proj.bias is not used",), out_bias=False),
    mutant("no out_proj", (r"out_proj is missing",), out_proj=False),
    mutant("float mask multiplied", (r"multiplies",), family="zero", floats="mul"),
    mutant("float mask as bool (.bool())", (r"reads a float mask as a bool mask",), floats="bool"),
    mutant("float padding mask read as bool", (r"float key_padding_mask as bool",), floats="kpm bool"),
    mutant("float mask subtracted", (r"subtracts a float mask",), floats="sub"),
    mutant("float mask clamped to -1e4", (r"clamps a float mask",), floats="clamp"),
    mutant("merge after transpose(2, 3)", (r"transpose\(2, 3\)",), merge="23"),
    mutant("float mask: only -inf used", (r"only the -inf entries",), floats="neginf"),
    mutant("float mask in masked_fill", (r"masked_fill", r"added to the scores"), floats="masked_fill"),
    mutant("dropout active in eval", (r"dropout is active in eval mode",), drop="always"),
    mutant("naive softmax", (r"without subtracting the max",), softmax="naive"),
    mutant("nan_to_num after the softmax", (r"gradients", r"BEFORE the softmax"), softmax="nan_to_num",
           bool_as="bias"),
    mutant("softmax in float32", (r"float32 precision",), softmax="float32"),
    mutant("weights always returned", (r"need_weights=False: your layer's attention-weight tensor is a tensor",),
           need_weights="always"),
    mutant("weights never returned", (r"attention-weight tensor is None",), need_weights="never"),
    mutant("weights always averaged", (r"one matrix per head",), average="always"),
    mutant("weights never averaged", (r"average over the heads",), average="never"),
    mutant("weights flat (B*h, L, S)", (r"flat \(B\*h, L, S\) layout",), average="flat"),
    mutant("sequence-first inputs", (r"batch_first",), seq_first=True),
    mutant("keys split with the queries' length", (r"split k and v with key.shape\[1\]",), keys_with_L=True),
    mutant("graph cut by detach", (r"gradient of in_proj_weight is None",), detach=True),
    mutant("attn_mask ignored", (r"key_padding_mask alone",), ignore=("attn",)),
    mutant("both masks ignored", (r"without any mask",), ignore=("kpm", "attn")),
]

CATALOGUES = [
    Catalogue(ch06.check_combine_masks,
              correct={"view, | and expand": combine, "torch.where and logical_or": combine_where,
                       "bool + and repeat": combine_add},
              mutants=COMBINE_MUTANTS),
    Catalogue(ch06.check_multihead,
              correct={"packed in_proj, view + transpose, masked_fill": layer(),
                       "einsum, torch.where, softmax by hand": EinsumMHA,
                       "a subclass of nn.MultiheadAttention": TorchSubclass,
                       "safe softmax (zeros in rows with no key)": layer(softmax="safe")},
              mutants=LAYER_MUTANTS),
]
