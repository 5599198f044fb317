"""Chapter 6's checkers: ``combine_masks(key_padding_mask, attn_mask, B, h, L, S)`` (ex-ch6-masks), bool (B, S), (L, S)
or (B*h, L, S) (row b*h + i: sentence b, head i), True = blocked, each may be None -> (B, h, L, S);
``MyMultiheadAttention(embed_dim, num_heads)`` (ex-ch6-layer): switches of :class:`Reference`, each case run by :mod:`..probe`."""
from __future__ import annotations

import dataclasses
import functools
import math

import torch
import torch.nn.functional as F
from torch import nn

from ..probe import run_layer
from . import DTYPE
from .diagnose import Case, Exercise, Mistake, agree, check, naming, pattern, same

def _combine(kpm, attn, B, h, L, S, polarity=None, op="or", expand=True, drop="", kpm_as="keys", two="11LS",
             three="Bh", none_safe=True, out=lambda m: m):
    parts, drop = [], drop if kpm is not None and attn is not None else ""  # drop: the branch an if/elif skips
    if kpm is not None and "key_padding" not in drop:
        kpm = ~kpm if polarity == "kpm" else kpm
        parts.append(kpm if kpm_as == "bare" else kpm.repeat(h, 1).view(B, h, 1, S) if kpm_as == "repeat" else
                     kpm.view({"keys": (B, 1, 1, S), "queries": (B, 1, S, 1), "heads": (1, B, 1, S)}[kpm_as]))
    if (attn is not None or not none_safe) and drop != "attn":
        attn = ~attn if polarity == "attn" else attn
        parts.append({"11LS": lambda a: a.view(1, 1, L, S), "T": lambda a: a.T.reshape(S, L), "flat": lambda a: a,
                      "L1S": lambda a: a[:, None], "Bh": lambda a: a.view(B, h, L, S),
                      "hB": lambda a: a.view(h, B, L, S).transpose(0, 1), "unsqueeze": lambda a: a.unsqueeze(1),
                      "B2": lambda a: a.view(B, 2, L, S),
                      "SL": lambda a: a.view(B, h, S, L).transpose(-2, -1), "TLS": lambda a: a.T.reshape(L, S)}[
                         two if attn.ndim == 2 else three](attn))
    mask = torch.zeros((B, h, L, S) if expand else (1, 1, 1, 1), dtype=torch.bool)
    for part in parts if op == "or" or len(parts) < 2 else [getattr(parts[0], f"__{op}__")(parts[1])]:
        mask = mask | part
    return out(~mask if polarity == "all" else mask)

def _masks_case(seed, B, h, L, S, kpm, attn):
    g = torch.Generator().manual_seed(seed)
    k = torch.arange(S) >= torch.randint(1, S + 1, (B,), generator=g)[:, None] if kpm else None  # right padding
    a = None if attn is None else torch.rand(*((B * h,) if attn == 3 else ()), L, S, generator=g) < 0.4
    name = f"B={B}, h={h}, L={L}, S={S}, key_padding_mask {'(B, S)' if kpm else 'None'}, attn_mask " + \
        {None: "None", 2: "(L, S)", 3: "(B*h, L, S)"}[attn]
    alone_k, alone_a = _combine(k, None, B, h, L, S), _combine(None, a, B, h, L, S)
    return Case(name, (k, a, B, h, L, S), {"where the key_padding_mask alone blocks": alone_k & ~alone_a,
                                           "where the attn_mask alone blocks": alone_a & ~alone_k})

_mistakes = lambda make, table: [Mistake(n, says, functools.partial(make, **kw)) for n, kw, says in table]  # noqa: E731
MASKS = type("MaskExercise", (Exercise,), {"arguments": ["key_padding_mask", "attn_mask", "B", "h", "L", "S"]})(
    what="your function", reference=_combine, passed="padding, 2-D and 3-D masks, alone, both and neither, as torch's.",
    hints=((r"'NoneType' object", "a mask given as None used as a tensor: either may be None, test `is not None`."),),
    cases=[_masks_case(i, *c) for i, c in enumerate([
        (1, 1, 1, 1, False, None), (2, 3, 4, 5, True, None), (2, 3, 4, 5, False, 2), (2, 3, 4, 5, True, 2),
        (2, 3, 4, 5, True, 3), (2, 3, 4, 5, False, 3), (2, 3, 4, 5, False, None), (3, 2, 3, 3, True, 3),
        (1, 4, 2, 6, True, 2), (4, 1, 4, 2, True, 3), (2, 2, 2, 2, True, 2), (2, 2, 4, 3, False, 2)])],  # L = B*h, 2-D
    mistakes=_mistakes(_combine, [
        ("inverted", dict(polarity="all"), "is inverted: nn.MultiheadAttention's masks are True = blocked."),
        ("kpm inverted", dict(polarity="kpm"), "reads one mask wrong: the key_padding_mask alone is read the other way "
         "round; its True marks a pad, to block. Not ~key_padding_mask."),
        ("attn inverted", dict(polarity="attn"), "reads one mask wrong: the attn_mask alone is read the other way "
         "round; its True marks a pair to block. Not ~attn_mask."),
        ("and", dict(op="and"), "combined the masks with & (and): a pair is blocked where EITHER mask blocks it, |."),
        ("head-major", dict(three="hB"), "unflattened the 3-D attn_mask head-major, (h, B, L, S): (B*h, L, S) is "
         "batch-major, row b*h + i is sentence b, head i: attn_mask.view(B, h, L, S)."),
        ("3-D as (S, L)", dict(three="SL"), "reads the 3-D attn_mask as (B, h, S, L): view(B, h, L, S), no transpose."),
        ("not expanded", dict(expand=False), "only broadcasts: expand it per head, .expand(B, h, L, S)."),
        ("kpm on queries", dict(kpm_as="queries"), "puts the key_padding_mask on the query axis: view(B, 1, 1, S)."),
        ("kpm bare", dict(kpm_as="bare"), "has (B, S) bare: broadcasting aligns it from the right. view(B, 1, 1, S)."),
        ("kpm on heads", dict(kpm_as="heads"), "puts the sentences on the head axis: (B, S) becomes (B, 1, 1, S)."),
        ("3-D flat", dict(three="flat"), "uses a flat attn_mask: the 3-D attn_mask is flat; view it as (B, h, L, S)."),
        ("2-D turned", dict(two="T"), "has the 2-D attn_mask turned around: (L, S) becomes (1, 1, L, S) as it is."),
        ("h = 2", dict(three="B2"), "views the 3-D attn_mask with h = 2 written in: view(B, h, L, S), the h given."),
        ("3-D unsqueezed", dict(three="unsqueeze"), "gave the 3-D attn_mask a head axis by unsqueeze(1): view it."),
        ("2-D transposed", dict(two="TLS"), "transposes the 2-D (L, S) attn_mask (attn_mask.T, back to (L, S)): "
         "query i's row is attn_mask[i], used as it is, view(1, 1, L, S)."),
        ("kpm repeat", dict(kpm_as="repeat"), "copies the key_padding_mask per head with repeat(h, 1), head-major: "
         "row b*h + i must be sentence b; view(B, 1, 1, S) and expand, or repeat_interleave(h, 0)."),
        ("2-D [:, None]", dict(two="L1S"), "makes the (L, S) attn_mask (L, 1, S), L on the heads' axis: [None, None]."),
        ("None", dict(none_safe=False), "fails on attn_mask=None: either mask may be None, skip it then."),
        ("xor", dict(op="xor"), "combined the masks with ^ (xor): a pair BOTH masks block is let through; |."),
        *[(f"elif {m}", dict(drop=m), f"drops the {m} mask when the other is given (if/elif?): apply both.") for m in
          ("key_padding", "attn")],
        ("flat", dict(out=lambda m: m.flatten(0, 1)), "returns the (B*h, L, S) layout: return (B, h, L, S)."),
    ]) + [Mistake("None for None", "returns None when neither mask is given: return an all-False (B, h, L, S) mask.",
                  lambda k, a, *size: None if k is None and a is None else _combine(k, a, *size)),
           Mistake("one not expanded", "returns a single mask as a broadcastable view: .expand(B, h, L, S).",
                   lambda k, a, *size: _combine(k, a, *size, expand=(k is None) == (a is None))),
           Mistake("3-D by size", "tells a 3-D attn_mask by its first size, B*h: a 2-D (L, S) one with L = B*h is "
                   "then viewed as (B, h, L, S). Tell them by attn_mask.dim().", lambda k, a, B, h, L, S: _combine(
                       k, a if a is None or len(a) != B * h else a.view(B, h, L, S).flatten(0, 1), B, h, L, S))])

def check_combine_masks(fn) -> None:
    """Check ``fn(key_padding_mask, attn_mask, batch_size, num_heads, query_len, key_len)`` -> (B, h, L, S) bool."""
    check(MASKS, fn)

SOFTMAX = {"torch": torch.softmax, "naive": lambda s, dim: s.exp() / s.exp().sum(dim, keepdim=True),  # "safe": zeros
           "safe": lambda s, d: torch.softmax(s.masked_fill(e := s.isneginf().all(d, True), 0), d).masked_fill(e, 0),
           "nan_to_num": lambda s, dim: torch.softmax(s, dim).nan_to_num(0.0),
           "float32": lambda s, dim: torch.softmax(s.float(), dim).to(s.dtype),
           "naive, zeros": lambda s, dim: torch.where((t := (e := s.exp()).sum(dim, True)) > 0, e / t, 0.0)}
FLOATS = {"add": lambda s, m, fill: s + m, "sub": lambda s, m, fill: s - m, "mul": lambda s, m, fill: s * m.exp(),
          "bool": lambda s, m, fill: s.masked_fill(m != 0, fill), "clamp": lambda s, m, fill: s + m.clamp(min=-1e4),
          "neginf": lambda s, m, fill: s.masked_fill(m.isneginf(), fill), "none": lambda s, m, fill: s,
          "twice": lambda s, m, fill: s + m + m, "clamp9": lambda s, m, fill: s + m.clamp(min=-1e9),
          "times": lambda s, m, fill: s * m, "T": lambda s, m, fill: s + m.mT,
          "exp": lambda s, m, fill: s + m.exp(), "negative": lambda s, m, fill: s.masked_fill(m < 0, fill)}
OK = dict(softmax_dim=-1, scale="d", split="hd", merge="hd", in_bias=True, out_bias=True, out_proj=True, average="obey",
          need_weights="obey", invert=None, mask_after=False, fill=-math.inf, kpm_as="keys", floats="add", ignore=(),
          softmax="torch", seq_first=False, keys_with_L=False, detach=False, grow=False, v_from_k=False, qkv=(0, 1, 2),
          W_T=False, three="Bh", scale_last=False, only=None, unmasked=False, kpm_last=False, keys_cut=False,
          kv="key, value")

class Reference(nn.Module):
    """nn.MultiheadAttention(batch_first=True) written out; each keyword of OK switched is a mistake."""

    def __init__(self, embed_dim, num_heads, bias=True, dropout=0.0, **mistake):
        super().__init__()
        self.h, self.o = num_heads, {**OK, **mistake}
        if embed_dim % num_heads:
            raise ValueError(f"embed_dim {embed_dim} is not divisible by num_heads {num_heads}")
        self.in_proj_weight = nn.Parameter(torch.zeros(3 * embed_dim, embed_dim))
        self.in_proj_bias = nn.Parameter(torch.zeros(3 * embed_dim)) if bias else None
        self.out_proj = nn.Linear(embed_dim, embed_dim, bias=bias)

    def forward(self, query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                average_attn_weights=True):
        o, h, kpm = self.o, self.h, key_padding_mask
        query, key, value = (t.transpose(0, 1) if o["seq_first"] else t for t in (query, key, value))
        S = (query if o["keys_with_L"] else key).shape[1]  # the keys' length, as the answer reads it
        key, value = {"key, value": (key, value), "value, key": (value, key), "query": (query, query)}[o["kv"]]
        if o["keys_cut"]:  # the keys (and, "masks", the padding mask) cut to the queries' length
            key, value, S = key[:, :query.shape[1]], value[:, :query.shape[1]], min(S, query.shape[1])
            if o["keys_cut"] == "masks":  # (each mask given)
                kpm, attn_mask = (None if m is None else m[..., :S] for m in (kpm, attn_mask))
        (B, L, D), d = query.shape, query.shape[-1] // h
        W, value = self.in_proj_weight.detach() if o["detach"] else self.in_proj_weight, key if o["v_from_k"] else value
        b = self.in_proj_bias.chunk(3) if self.in_proj_bias is not None and o["in_bias"] else (None,) * 3
        W = [w.mT for w in W.chunk(3)] if o["W_T"] else W.chunk(3)
        q, k, v = (F.linear(t, W[i], b[i]) for t, i in zip((query, key, value), o["qkv"]))
        split = {"hd": lambda t, n: t.reshape(B, n, h, d).transpose(1, 2), "none": lambda t, n: t.reshape(B, h, n, d),
                 "dh": lambda t, n: t.reshape(B, n, d, h).permute(0, 3, 1, 2),
                 "d heads": lambda t, n: t.reshape(B, n, d, h).transpose(1, 2), "23": lambda t, n: t.reshape(
                     B, n, h, d).transpose(2, 3), "nB": lambda t, n: t.reshape(n, B, h, d).permute(1, 2, 0, 3)}[o["split"]]
        q, k, v = split(q, L), split(k, S), split(v, S)  # (B, h, L|S, d)
        scores = q @ k.transpose(-2, -1)  # (B, h, L, S)
        scale = {"d": d ** 0.5, "D": D ** 0.5, "h": h ** 0.5, "d itself": d, None: 1.0}[o["scale"]]
        scores = scores if o["scale_last"] else scores / scale
        after, raw = [], scores
        masks = [("kpm", kpm), ("attn", attn_mask) if o["ignore"] != "copy" or attn_mask is None else
                 ("attn", kpm.view(B, 1, 1, S))]  # "copy": the attn_mask branch masks with the padding
        for which, m in masks[::-1] if o["kpm_last"] else masks:
            if m is None or which in o["ignore"] or o["ignore"] == "scores":  # "scores": where a score is 0
                scores = scores if m is None or o["ignore"] != "scores" else scores.masked_fill(scores == 0, -1e20)
                continue
            mo = o if o["only"] in (None, which) else {**o, **{k: OK[k] for k in ("fill", "floats", "mask_after")}}
            if which == "kpm":  # ("float bare": a float mask alone left (B, S))
                m = m if o["kpm_as"] == "bare" or o["kpm_as"] == "float bare" and m.is_floating_point() else \
                    m.repeat(h, 1).view(B, h, 1, S) if o["kpm_as"] == "repeat" else m.view({"queries": (B, 1, S, 1),
                    "keys": (B, 1, 1, S), "S11": (B, S, 1, 1), "B1S": (B, 1, S), "float bare": (B, 1, 1, S)}[o["kpm_as"]])
            elif m.dim() == 3 and not (o["three"] == "float flat" and m.is_floating_point()):  # (B*h, L, S)
                m = m.view(h, B, L, S).transpose(0, 1) if o["three"] == "hB" else m.view(B, h, L, S)
            if m.dtype == torch.bool:
                m = ~m if o["invert"] in (True, which) else m
                after, scores = (after + [m], scores) if mo["mask_after"] else (after, scores.masked_fill(m, mo["fill"]))
            else:
                how = ("bool" if mo["floats"][0] == which[0] else "add") if " bool" in mo["floats"] else mo["floats"]
                scores = FLOATS[how](scores, m, mo["fill"])
        weights = SOFTMAX[o["softmax"]](scores / scale if o["scale_last"] else scores, o["softmax_dim"])  # (B, h, L, S)
        for m in after:
            weights = weights.masked_fill(m, 0.0)
        heads = weights @ v  # (B, h, L, d), merged to (B, L, D), its own L if it "grows" (a mask broadcast)
        weights = SOFTMAX[o["softmax"]](raw, o["softmax_dim"]) if o["unmasked"] else weights
        n = heads.shape[2] if o["grow"] else L
        heads = {"hd": lambda t: t.transpose(1, 2), "none": lambda t: t, "dh": lambda t: t.permute(0, 2, 3, 1),
                 "23": lambda t: t.transpose(2, 3), "DL": lambda t: t.transpose(1, 2).reshape(B, D, n).mT,
                 "mean": lambda t: t.mean(1), "tokens": lambda t: torch.cat(t.unbind(1), 1), "hB": lambda t: t.transpose(0, 1),
                 "Lh": lambda t: t.transpose(1, 2).reshape(B, h, -1)}[o["merge"]](heads)
        heads = heads if o["merge"] in ("mean", "tokens", "Lh") else heads.reshape(B, n, D)
        out = F.linear(heads, self.out_proj.weight, self.out_proj.bias if o["out_bias"] else None) \
            if o["out_proj"] else heads
        out = out.transpose(0, 1) if o["seq_first"] else out
        if o["need_weights"] == "never" or (not need_weights and o["need_weights"] == "obey"):
            return out, None
        average = o["average"] == "always" or o["average"] in ("obey", "sum") and average_attn_weights
        mean = weights.sum(1) if o["average"] == "sum" else weights.mean(1)
        return out, weights.flatten(0, 1) if o["average"] == "flat" else mean if average else weights

class LayerExercise(Exercise):  # an answer that is a layer: a case's arguments, a setup (layer_case) and forward's
    arguments = ["setup", "query", "key", "value", "key_padding_mask", "attn_mask", "need_weights",
                 "average_attn_weights"]

def before_out_proj(got, spec, *args):
    """A wrong output seen before out_proj, which is undone (its weights are the case's): a factor, an order of the
    heads, show there (where the right merged heads are finite)."""
    out, state = got.get("output") if isinstance(got, dict) else None, spec.get("state") or {}
    if spec.get("refuse") or not (isinstance(out, torch.Tensor) and out.dim() == 3 and out.dtype == DTYPE and
                                  "out_proj.weight" in state):
        return ""
    W, b = state["out_proj.weight"], state.get("out_proj.bias", 0.0)
    want = run_layer(functools.partial(Reference, out_proj=False), spec, *args)["output"]  # (B, L, D)
    if out.shape != want.shape:
        return ""
    shift = (out - F.linear(want, W, state.get("out_proj.bias"))).flatten(0, 1)  # (B L, D): one vector, a bias?
    if want.isfinite().all() and shift.isfinite().all() and same(shift, shift[:1].expand_as(shift), 1e-8) and \
            not same(shift[0], torch.zeros_like(shift[0]), 1e-8):  # (an output right: the notes are of the output)
        b_v = F.linear(state["in_proj_bias"].chunk(3)[2], W) if "in_proj_bias" in state else None  # through out_proj
        said = [f"{sign}{name}: {what} {how}" for sign, how in (("-", "left out"), ("+", "added twice"))
                for name, what, vector in (("out_proj.bias", "out_proj's bias", state.get("out_proj.bias")),
                                           ("b_v W_o^T", "the value bias (in_proj_bias's last third)", b_v))
                if vector is not None and same(shift[0], vector if sign == "+" else -vector, 1e-8)]
        return (f"Its output is the right one plus the same vector at every position, " +
                (f"{said[0]}." if said else f"{[round(float(x), 4) for x in shift[0]]}: a bias added, or left out."))
    heads = torch.linalg.solve(W, (out - b).mT).mT.where(want.isfinite(), want)  # out = heads W^T + b
    if want.isfinite().all() and same(torch.linalg.solve(W, (heads - b).mT).mT, want, 1e-8):  # undone twice
        return "Its output is out_proj applied TWICE to the merged heads: apply it once, in forward, not in merge too."
    sizes = dict(B=out.shape[0], L=out.shape[1], D=spec["D"], h=spec["h"], d=spec["D"] // spec["h"])
    if same(heads, want, 1e-8):
        return ""
    kind, said = pattern(heads, want, Case("", args, {}, sizes), 1e-8)  # only a pattern: where entries differ is said
    if kind != "entries":
        return f"Its output with out_proj undone (the merged heads, (B, L, D)) {said}"
    wrong = (~((heads - want).abs() <= 1e-8)).view(*want.shape[:2], sizes["h"], -1).any(-1).any(1)  # (B, h): NaN too
    bad, good = ([i for i in range(sizes["h"]) if bool(wrong[:, i].any()) == w] for w in (True, False))
    some, kpm = [b for b in range(len(wrong)) if wrong[b].any()], args[3]
    padded = [] if kpm is None else (kpm if kpm.dtype == torch.bool else kpm.isneginf()).any(-1).nonzero().flatten().tolist()
    return "" if not good else (f"Its output with out_proj undone (the merged heads) is right in head"
                                f"{'s' * (len(good) > 1)} {', '.join(map(str, good))} and wrong in head"
                                f"{'s' * (len(bad) > 1)} {', '.join(map(str, bad))}"
                                + (f", of sentence{'s' * (len(some) > 1)} {', '.join(map(str, some))} only"
                                   + (", the one" + "s" * (len(some) > 1) + " with pads (key_padding_mask)" if
                                      some == padded else "") if len(some) < len(wrong) else "") + ".")

class Setup(dict):  # a case's setup, the checker's own and only read: not copied for each call as the inputs are
    __deepcopy__ = lambda self, memo: self  # noqa: E731

def pads(*lengths, S=None, left=False):
    """(B, S) bool, True at the pads (S: the longest length): each sentence's pads on the right (or the left)."""
    mask = torch.arange(S or max(lengths))[None, :] >= torch.tensor(lengths)[:, None]
    return mask.flip(-1) if left else mask

def layer_case(name, B, L, S, D, h, kpm=None, attn=None, *, floats=False, cross=False, scale=1.0, average=True,
               need_weights=True, make=None, bias=True, dtype=DTYPE, **spec):
    """A case: torch's weights random and non-zero (zero biases hide missing ones), masks bool or (``floats``) -inf."""
    g = torch.Generator().manual_seed(sum(map(ord, name)))  # each case its own random numbers
    shapes = {"in_proj_weight": (3 * D, D), "in_proj_bias": (3 * D,), "out_proj.weight": (D, D), "out_proj.bias": (D,)}
    state = {n: 0.5 * torch.randn(s, generator=g, dtype=DTYPE) for n, s in shapes.items() if bias or "bias" not in n}
    x = scale * torch.randn(B, L, D, generator=g, dtype=DTYPE)
    kv = torch.randn(2, B, S, D, generator=g, dtype=DTYPE) if cross else x.expand(2, B, L, D)  # key, value
    hidden = torch.zeros(B, L, S, dtype=torch.bool)  # (B, L, S): the keys every head hides from each query
    for i, m in enumerate(m if m is None or m.dtype == torch.bool else m.isneginf() for m in (kpm, attn)):
        m = m if m is None or i == 1 else m[:, None]  # (B, 1, S), (L, S) or (B*h, L, S): hidden from every head?
        hidden = hidden if m is None else hidden | (m.view(B, -1, L, S).all(1) if m.dim() == 3 and i else m)
    kpm, attn = (additive(kpm), additive(attn)) if floats else (kpm, attn)
    spec = Setup({"name": name, "D": D, "h": h, "bias": bias, "state": state, "make": make or ((D, h), {}), "mode": "eval",
            "dtype": dtype, "loss": None, "rows": ~hidden.all(-1), "what": "your layer", **spec})  # rows: see a key
    marks = {"in the rows of queries that see no key": hidden.all(-1, True).expand(B, L, D),
             "at the keys the masks hide": hidden} if kpm is not None or attn is not None else {}
    return Case(name, (spec, x.to(dtype), kv[0].to(dtype), kv[1].to(dtype), kpm, attn, need_weights, average), marks,
                dict(B=B, L=L, S=S, D=D, h=h, d=D // h))

causal = lambda L: torch.ones(L, L, dtype=torch.bool).triu(1)  # noqa: E731
additive = lambda m: None if m is None else torch.zeros(m.shape, dtype=DTYPE).masked_fill(m, -math.inf)  # noqa: E731
_per_head = (torch.rand(8, 3, 5, generator=torch.Generator().manual_seed(6)) < 0.4).index_fill(-1, torch.tensor([0]), 0)
_two = torch.arange(4) == 1  # a finite penalty on key 1 (and a favour on key 2)
_finite = torch.randn(4, 4, generator=torch.Generator().manual_seed(7), dtype=DTYPE).masked_fill(causal(4), -math.inf)
LAYER_CASES = [  # (name, B, L, S, D, h, key_padding_mask, attn_mask); _finite: favours and penalties
    layer_case("one token, one head", 1, 1, 1, 2, 1),
    layer_case("self-attention without masks", 2, 4, 4, 6, 3),
    layer_case("a bool key_padding_mask", 2, 4, 4, 6, 3, pads(4, 2)),
    layer_case("key padding and a causal attn_mask", 3, 5, 5, 8, 2, pads(5, 3, 4), causal(5)),
    layer_case("float masks, 0 and -inf, the attn_mask per head (B*h, L, S)", 3, 5, 5, 8, 2, pads(5, 3, 4),
               causal(5) | (torch.rand(6, 5, 5, generator=torch.Generator().manual_seed(8)) < 0.3), floats=True),
    layer_case("float masks, finite values", 2, 4, 4, 6, 3, additive(pads(4, 2)) - 0.8 * _two + 0.5 * (torch.arange(4) == 2), _finite),
    layer_case("average_attn_weights=False, heads of size 1", 2, 4, 4, 4, 4, pads(4, 3), causal(4), average=False),
    layer_case("cross-attention, L=4 queries over S=5 keys", 2, 4, 5, 6, 3, pads(5, 3), cross=True),
    layer_case("a per-head (B*h, L, S) attn_mask, L=3 over S=5 keys", 2, 3, 5, 8, 4, pads(5, 4), _per_head, cross=True,
               average=False),
    layer_case("need_weights=False", 2, 4, 4, 6, 3, pads(4, 2), need_weights=False),
    layer_case("large scores (inputs scaled by 30)", 2, 4, 4, 6, 3, pads(4, 2), scale=30.0),
    layer_case("one query over S=6 keys", 3, 1, 6, 6, 2, pads(6, 2, 4), cross=True),
    layer_case("B = L = 3", 3, 3, 3, 6, 2, pads(3, 1, 2)),
    layer_case("rows with no key (left padding and a causal mask)", 2, 4, 4, 6, 3, pads(2, 4, left=True), causal(4)),
    layer_case("rows with no key, float masks", 2, 4, 4, 6, 3, pads(2, 4, left=True), causal(4), floats=True),
    layer_case("gradients, cross-attention with padding", 2, 4, 5, 6, 3, pads(4, 3, S=5), cross=True, loss="values"),
    layer_case("gradients, rows with no key", 2, 4, 4, 6, 3, pads(2, 4, left=True), causal(4), floats=True,
               loss="finite"),
]
LAYER_TABLE = [  # (name, switches of Reference, what "your layer ..." does)
    *[(f"softmax over {w}", dict(softmax_dim=k), f"ran the softmax over the {w} (dim={k} of (B, h, L, S)): each "
       "query's weights over the keys sum to 1, softmax(scores, dim=-1).") for w, k in (("queries", -2), ("heads", 1))],
    ("scale D", dict(scale="D"), "divides the scores by sqrt(D), D the embedding size: divide by sqrt(d), d = D / h."),
    ("scale h", dict(scale="h"), "divides the scores by sqrt(h), the number of HEADS: divide by sqrt(d), d = D / h."),
    ("scale by d", dict(scale="d itself"), "divides the scores by d, the head size itself: by sqrt(d)."),
    ("q, v, k", dict(qkv=(0, 2, 1)), "reads in_proj's thirds in the order q, v, k: the keys get W_v and the values "
     "W_k. in_proj_weight.chunk(3) is W_q, W_k, W_v, in that order."),
    ("k, q, v", dict(qkv=(1, 0, 2)), "reads in_proj's thirds in the order k, q, v: the queries get W_k and the keys "
     "W_q. in_proj_weight.chunk(3) is W_q, W_k, W_v, in that order."),
    ("key and value swapped", dict(kv="value, key"), "projects the keys from `value` and the values from `key`: "
     "forward(query, key, value), k from key, v from value."),
    ("keys from query", dict(kv="query"), "projects the keys and values from `query`, ignoring `key` and `value`: "
     "right in self-attention only. k from key, v from value."),
    ("kpm ignored", dict(ignore=("kpm",)), "gives the output with the attn_mask alone: the key_padding_mask never "
     "reaches the scores (dropped, or an if/elif that skips it): apply both masks."),
    ("float times mask", dict(floats="times"), "multiplies the scores by a float mask: it is ADDED, scores + mask."),
    ("not scaled", dict(scale=None), "does not scale the scores: divide them by sqrt(d), d = D / h the head size."),
    ("split", dict(split="none"), "splits the heads without the transpose: view(B, L, h, d).transpose(1, 2)."),
    ("merge", dict(merge="none"), "has its heads merged without undoing the split's transpose, transpose(1, 2)."),
    ("merge (2, 3)", dict(merge="23"), "merges the heads after transpose(2, 3), which swaps positions and features."),
    ("order (d, h)", dict(split="dh", merge="dh"), "splits in the wrong order, (B, L, d, h): view(B, L, h, d)."),
    ("merge (d, h)", dict(merge="dh"), "merges the heads in the wrong order, interleaved: transpose(1, 2) first."),
    ("merge (h, B)", dict(merge="hB"), "merges through transpose(0, 1), (h, B, L, d): sentences and heads swapped, "
     "the rows of different sentences mixed. transpose(1, 2) to (B, L, h, d), then reshape(B, L, D)."),
    ("merge (B, h, L*d)", dict(merge="Lh"), "merges to (B, h, L*d): L and h swapped in the reshape (B, L, h = t.shape "
     "read after the transpose?). transpose(1, 2).reshape(B, L, h * d)."),
    ("split (d, h)", dict(split="dh"), "splits the features interleaved, view(B, L, d, h): head i gets features i, i + "
     "h, ... where a head is a block of d features: view(B, L, h, d).transpose(1, 2)."),
    ("split (L, B)", dict(split="nB"), "splits with the batch and length sizes swapped, view(L, B, h, d): tokens of "
     "different sentences mixed. view(B, L, h, d).transpose(1, 2)."),
    ("split transpose(2, 3)", dict(split="23"), "splits with transpose(2, 3), (B, L, d, h): the last two axes "
     "swapped, not the heads and positions. view(B, L, h, d).transpose(1, 2)."),
    ("keys cut to L", dict(keys_cut=True), "cuts key and value to the queries' length, key[:, :L]: the keys past L "
     "are lost and the masks for S keys no longer fit. Keep all S keys: L and S are separate lengths."),
    ("in_proj_bias", dict(in_bias=False), "adds no in_proj_bias (in_proj_bias is not used; torch's start at 0)."),
    ("out_proj.bias", dict(out_bias=False), "adds no bias after the merge: out_proj.bias is not used."),
    ("out_proj", dict(out_proj=False), "skips the output projection: out_proj is missing after the merge."),
    ("always averaged", dict(average="always"), "averages when asked for one matrix per head, (B, h, L, S)."),
    ("never averaged", dict(average="never"), "returns per-head weights by default: average over the heads, .mean(1)."),
    ("flat", dict(average="flat"), "gives the flat (B*h, L, S) layout: view it (B, h, L, S), then .mean(dim=1)."),
    ("inverted", dict(invert=True), "masks the wrong keys: the mask polarity is inverted. Fill -inf where it is True."),
    ("inverted, finite fill", dict(invert=True, fill=-1e9), "fills with -1e9 and the mask polarity is inverted: fill "
     "-inf where True."),
    ("attn inverted", dict(invert="attn"), "reads one mask wrong: the attn_mask alone is read the other way round."),
    ("kpm inverted", dict(invert="kpm"), "reads one mask wrong: the key_padding_mask alone is read the other way "
     "round."),
    ("after softmax", dict(mask_after=True), "applies the mask after the softmax: fill the SCORES with -inf first."),
    ("finite fill", dict(fill=-1e9), "uses -1e9, a finite fill: a query with no key then averages. Use -inf."),
    ("zero fill", dict(fill=0.0), "leaves masked scores set to 0, not -inf: a score of 0 still gets weight."),
    ("float multiplied", dict(floats="mul"), "multiplies the scores by a float mask's exp: a float mask is ADDED."),
    ("float as bool", dict(floats="bool"), "reads a float mask as a bool mask (!= 0): it is added to the scores."),
    ("float kpm as bool", dict(floats="kpm bool"), "reads a float key_padding_mask as bool: it is added as it is."),
    ("unmasked weights", dict(unmasked=True), "returns the weights before the masks: return those the output used."),
    ("float -inf only", dict(floats="neginf"), "uses only the -inf entries of a float mask: add it, scores + mask."),
    ("float subtracted", dict(floats="sub"), "subtracts a float mask, scores - mask: it is ADDED, scores + mask."),
    ("float clamped", dict(floats="clamp"), "clamps a float mask to a finite floor (-1e4?): add it as it is."),
    ("kpm on queries", dict(kpm_as="queries"), "has the key_padding_mask applied to the queries, not the keys."),
    ("kpm bare", dict(kpm_as="bare"), "puts (B, S) bare: broadcasting aligns it from the right: [:, None, None, :]."),
    ("no mask", dict(ignore=("kpm", "attn")), "computes the output without any mask: the mask never reaches the scores "
     "(filled where a score is 0 rather than where the mask is True? a branch that skips it?)."),
    ("attn ignored", dict(ignore=("attn",)), (IGNORED := "gives the output with the key_padding_mask alone: the "
     "attn_mask never reaches the scores (a branch masking with the padding mask again?): each uses its own mask.")),
    ("naive softmax", dict(softmax="naive"), "takes exp(s) without subtracting the max: exp overflows to NaN."),
    ("nan_to_num", dict(softmax="nan_to_num"), "zeroes NaN rows once the softmax made them: gradients stay NaN. Fill "
     "BEFORE the softmax."),
    ("float32", dict(softmax="float32"), "agrees only to float32 precision: a tensor made without dtype=, .float()?"),
    ("sequence first", dict(seq_first=True), "reads its inputs as (L, B, D): this layer is batch_first=True."),
    ("values from key", dict(v_from_k=True), "projects the values from key: v comes from value, the third argument."),
    ("v with W_k", dict(qkv=(0, 1, 1)), "projects the values with the KEY's W_k and b_k: v is in_proj's last third."),
    ("W transposed", dict(W_T=True), "computes x @ W: weights are stored (out, in), so x @ W.T (F.linear(x, W, b))."),
    ("summed", dict(average="sum"), "SUMS the weights over the heads: average them, .mean(dim=1)."),
    ("float ignored", dict(floats="none"), "ignores a float mask: add it to the scores, scores + mask."),
    ("3-D head-major", dict(three="hB"), "reads a (B*h, L, S) attn_mask head-major: row b*h + i is b, head i."),
    ("mask scaled", dict(scale_last=True), "divides by sqrt(d) after adding the mask: scale first."),
    ("naive softmax, zeros", dict(softmax="naive, zeros"), "takes exp(s) without subtracting the max (0 / 0 = 0)."),
    ("keys with L", dict(keys_with_L=True), "splits k (or v) with the queries' L: split k and v with "
     "key.shape[1]."),
    ("detach", dict(detach=True), "cuts the graph: the gradient of in_proj_weight is None (.detach(), .data?)"),
]
LAYER_TABLE += [(name + ", grown", {**switches, "grow": True}, says) for name, switches, says in LAYER_TABLE
                if name in ("kpm on queries", "kpm bare")] + [("attn branch copied", dict(ignore="copy"), IGNORED)]
HINTS = ((r"positional argument|unexpected keyword|multiple values for", "the layer is called as torch's is: forward("
          "query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True)."),)
PASSED = ("outputs, weights and gradients = torch's to 1e-10 in float64, 1 to 4 heads, self- and cross-attention, "
          "bool, float and per-head masks, one query, big scores, no key (NaN as torch's, or zeros: finite gradients)")
OWN = [("float attn as bool", dict(floats="attn bool"), "reads a float attn_mask as bool (!= 0): add it as it is.")]
LAYER = LayerExercise(
    what="your layer", reference=Reference, mistakes=_mistakes(Reference, LAYER_TABLE + OWN), hints=HINTS,
    run=run_layer, notes=before_out_proj,
    cases=LAYER_CASES + [layer_case("built with dropout=0.5, in eval mode", 2, 4, 4, 6, 3, pads(4, 2), make=((6, 3), {
        "dropout": 0.5})), layer_case("a float key_padding_mask, finite values", 2, 4, 4, 6, 3, additive(pads(4, 2)) -
                                      0.8 * _two, additive(causal(4)))], passed=PASSED + ", no dropout in eval mode.")
SAFE = functools.partial(Reference, softmax="safe")  # the course's convention: a query with no key gets zeros
LAYER_SAFE = dataclasses.replace(LAYER, reference=SAFE, mistakes=_mistakes(SAFE, LAYER_TABLE + OWN), _memo={})

def convention(exercises, answer):
    """The exercise in the answer's convention for a query with no key: torch's NaN, or (zero rows) the course's."""
    got = [exercises[0].outcome(answer, case) for case in exercises[0].cases]  # right, or one mistake named, or zeros
    agrees = [sum(agree(g, ex.expected("reference", ex.reference, c), ex.atol) for g, c in zip(got, ex.cases))
              for ex in exercises]  # else the one it agrees with on more cases, or (as many) the zeros it shows
    if len(got) in agrees:  # right in one of them: no catalogue needs running
        return exercises[agrees.index(len(got))]
    right = [len(naming(ex, got)) == 1 for ex in exercises]
    zeros = any(isinstance(w, torch.Tensor) and bool((w == 0).all(-1).any()) for g in got if isinstance(g.value, dict)
                for w in [g.value.get("attention-weight tensor")])
    return exercises[right.index(True) if True in right else agrees.index(max(agrees)) if len(set(agrees)) > 1 else
                     zeros]

def check_multihead(cls) -> None:
    """Check ``cls(embed_dim, num_heads)`` (``dropout=0.5`` too if it takes it) against ``nn.MultiheadAttention``."""
    check(convention([LAYER, LAYER_SAFE], cls), cls)

EXERCISES = [MASKS, LAYER, LAYER_SAFE]
