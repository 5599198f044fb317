"""Chapter 7's :func:`check_multihead_attention` (``ex-ch7-merge``, ``-padding``, ``-float-mask``, ``-cross``): a layer
``factory(embed_dim, num_heads, bias)`` builds, torch's parameter names (or names ending in them, or ``from_torch``) and
forward, through a battery; each case run by :mod:`..probe`."""
from __future__ import annotations

import dataclasses
import functools

import torch

from ..probe import run_layer
from . import ch06
from .ch06 import LayerExercise, layer_case, pads
from .diagnose import Case, Mistake, check

def _accepting(make, D, h, bias=True):  # the battery's mistake: a query too wide cut, a mask that does not fit dropped
    layer = make(D, h, bias)
    fits = lambda m, key: m is None or m.shape[-1] == key.shape[1]  # noqa: E731
    layer.register_forward_pre_hook(lambda _, a, kw: ((a[0][..., :D], *a[1:]), kw if fits(kw["key_padding_mask"], a[1])
                                                      else {**kw, "key_padding_mask": None}), with_kwargs=True)
    return layer

SAYS = {name: says for name, _, says in ch06.LAYER_TABLE}  # the words of each mistake, by name

ONE_MASK = {"kpm": "the key_padding_mask", "attn": "the attn_mask"}
ALONE = [  # the chapter's fixes made for one mask: its own fill, float rule or order, the other mask right
    *[(f"{w} fill {v}", dict(fill=float(v), only=w), f"fills the scores {ONE_MASK[w]} hides with {v}, the other "
       "mask's right: a masked key gets float('-inf'), for every mask.") for w in ONE_MASK for v in ("-1e9", "0")],
    *[(f"{w} after softmax", dict(mask_after=True, only=w), f"applies {ONE_MASK[w]} after the softmax (zeroing "
       "weights), the other before: every mask fills the SCORES with -inf before the softmax.") for w in ONE_MASK],
    *[(f"float {f}, {w}", dict(floats=f, only=w), f"{says}, for {ONE_MASK[w]} alone (the other mask is right).")
      for w in ONE_MASK for f, says in (("mul", "multiplies the scores by a float mask's exp: add it, scores + mask"),
                                          ("neginf", "uses only the -inf entries of a float mask: add it all"),
                                          ("exp", "adds exp(mask), not the mask: add it as it is, scores + mask"),
                                          ("negative", "blocks every key whose float mask is below 0: add it as it is"),
                                          ("twice", "adds a float mask twice: add it once"),
                                          ("sub", "subtracts a float mask: add it, scores + mask"))],
    ("float attn transposed", dict(floats="T", only="attn"), "adds a float attn_mask TRANSPOSED, (S, L): add it as "
     "it is, row i for query i."),
    ("keys and masks cut to L", dict(keys_cut="masks"), "cuts key, value and the key_padding_mask to the queries' "
     "length, [:, :L]: the keys past L are lost, and a mask that does not fit is cut instead of refused. Keep all S "
     "keys."),
    *[(f"float {f}", dict(floats=f), says) for f, says in (
        ("exp", "adds exp(mask) to the scores: a float mask is added as it is, scores + mask (its -inf hides)."),
        ("negative", "hides every key whose float mask is below 0 and ignores its other values: a float mask is "
         "added as it is, scores + mask; -2.0 lowers a key's score by 2, it does not hide it."))],
    *[(f"kpm fill {v}, after attn", dict(fill=float(v), only="kpm", kpm_last=True), f"fills the scores the "
       f"key_padding_mask hides with {v} AFTER the attn_mask's -inf, overwriting it where both block: a masked key "
       "gets float('-inf'), for every mask.") for v in ("-1e9", "0")],
    ("float clamped -1e9", dict(floats="clamp9"), "clamps a float mask at -1e9 before adding it: -inf becomes -1e9, "
     "and a query with no key averages. Add the mask as it is, scores + mask."),
    ("float padding bare", dict(kpm_as="float bare"), "adds a float key_padding_mask as it is, (B, S), without the "
     "view its bool form gets: broadcasting lines it up with (L, S). key_padding_mask.view(B, 1, 1, S) for both."),
    ("float 3-D flat", dict(three="float flat"), "adds a float (B*h, L, S) attn_mask without viewing it (B, h, L, "
     "S) as the bool one is: it broadcasts only when B = 1. attn_mask.view(B, h, L, S) for both."),
    ("padding repeat", dict(kpm_as="repeat"), "copies the key_padding_mask per head with repeat(h, 1), whose copies "
     "are head-major: viewed (B, h, 1, S), heads read other sentences' pads. view(B, 1, 1, S) broadcasts to every "
     "head (or repeat_interleave(h, 0))."),
    ("split and merge", dict(split="none", merge="none"), "splits and merges the heads with reshapes alone, no "
     "transposes: both are consistent, but each head then holds pieces of several tokens. view(B, L, h, d)."
     "transpose(1, 2), and back."),
    ("merge (B, D, L)", dict(merge="DL"), "merges the heads through a (B, D, L) reshape: tokens and features mixed. "
     "transpose(1, 2) to (B, L, h, d), then reshape(B, L, D)."),
    ("merge mean", dict(merge="mean"), "averages the heads, (B, L, d), where they are concatenated: transpose(1, 2) "
     "to (B, L, h, d), then reshape(B, L, D): out_proj takes all D features."),
    ("merge along tokens", dict(merge="tokens"), "concatenates the heads along the TOKENS, (B, h*L, d): their features "
     "go side by side, transpose(1, 2).reshape(B, L, D)."),
    ("d heads", dict(split="d heads"), "splits into d heads of h features, view(B, L, d, h): view(B, L, h, d), h "
     "heads of d = D / h features each."),
    *[(f"padding {k}", dict(kpm_as=k), f"views the key_padding_mask as {s}: one entry per key, on the last axis, "
       "key_padding_mask.view(B, 1, 1, S).") for k, s in (("S11", "(B, S, 1, 1), S on the heads' axis"),
                                                         ("B1S", "(B, 1, S), three axes: B lands on the heads' axis"))]]

def _catalogue(make) -> list:
    return ch06._mistakes(make, ch06.LAYER_TABLE + ALONE + [  # float16 tells these from -1e9 and from no mask
        ("fill -1e4", dict(fill=-1e4), SAYS["finite fill"]),
        ("-1e20 at 0", dict(ignore="scores"), SAYS["no mask"])]) + [
        Mistake("sizes", "builds a layer although 10 features do not split into 4 heads: torch refuses it in the "
                "constructor; check embed_dim % num_heads == 0 in __init__ and raise a ValueError.",
                lambda D, h, bias=True: make(D, h if D % h == 0 else 1, bias)),
        Mistake("shapes accepted", "runs without an error on a shape that does not fit (a query of width D + 1, a (B, "
                "L) key_padding_mask for S keys): it must raise, as torch's does; a broadcast mask masks the wrong "
                "keys.", functools.partial(_accepting, make))]

_cross = layer_case("shapes that do not fit", 2, 4, 5, 6, 3, pads(5, 3), cross=True, refuse=True).args
CASES = [Case(c.name, (ch06.Setup({**c.args[0], "factory": True}),) + c.args[1:], c.marks, c.sizes) for c in ch06.LAYER_CASES + [
    layer_case("in training mode, with torch's default dropout of 0", 2, 4, 4, 6, 3, pads(4, 2), mode="train"),
    layer_case("built with bias=False, cross-attention", 2, 4, 5, 6, 3, pads(5, 3), cross=True, bias=False),
    layer_case("in float32", 2, 4, 5, 6, 3, pads(5, 3), cross=True, dtype=torch.float32),
    layer_case("in float16", 2, 4, 5, 6, 3, pads(5, 3), cross=True, dtype=torch.float16),
    layer_case("embed_dim=10 in num_heads=4 (they do not split)", 1, 1, 1, 10, 4, state=None, refuse=True),
    Case("a (B, L) key_padding_mask for S keys", _cross[:4] + (_cross[4][:, :4],) + _cross[5:]),
    Case("a query of width D + 1", _cross[:1] + (torch.cat([_cross[1], _cross[1][..., :1]], -1),) + _cross[2:])]]
EXERCISE = LayerExercise(
    what="your layer", reference=ch06.Reference, run=run_layer, cases=CASES, hints=ch06.HINTS, notes=ch06.before_out_proj,
    mistakes=_catalogue(ch06.Reference), passed=f"all {len(CASES)} cases: " + ch06.PASSED + ", training mode, no "
    "bias, float32 and float16, nothing printed or warned; sizes that do not split and shapes that do not fit refused.")
EXERCISE_SAFE = dataclasses.replace(EXERCISE, reference=ch06.SAFE, mistakes=_catalogue(ch06.SAFE), _memo={})

def check_multihead_attention(factory) -> None:
    """Check ``factory(embed_dim, num_heads, bias)`` -> a layer against ``nn.MultiheadAttention(batch_first=True)``."""
    check(ch06.convention([EXERCISE, EXERCISE_SAFE], factory), factory)

EXERCISES = [EXERCISE, EXERCISE_SAFE]
