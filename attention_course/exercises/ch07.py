"""Checker for chapter 7, the bug clinic: :func:`check_multihead_attention`, a whole layer put through a battery.

The chapter's exercises -- grade_ids ``ex-ch7-merge``, ``ex-ch7-padding``, ``ex-ch7-float-mask``, ``ex-ch7-cross``
-- each fix a planted bug of a layer, checked with ``check_multihead_attention(lambda D, h, bias: Fixed(D, h,
bias))``. The layer has the interface of ``attention_course.MultiheadAttention``: ``factory(embed_dim, num_heads,
bias)`` builds it, with torch's parameter names (or names ending in them) or a ``from_torch`` classmethod, and
``forward(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True)``
returns ``(output, weights)`` as torch's does. The cases are chapter 6's (:mod:`.ch06`) and the battery's own:
training mode, bias=False, float32 and float16, sizes that do not split into heads and shapes that do not fit (both
refused), and nothing printed or warned. The catalogue is chapter 6's with the battery's two mistakes.
"""
from __future__ import annotations

import threading

import torch
from torch import nn

from .. import boundary
from . import ExerciseError
from . import ch06
from .ch06 import LayerExercise, layer_case, pads
from .diagnose import Case, check

TIMEOUT_S = 30.0  # one call of a learner's layer on these tiny inputs takes milliseconds


def _in_time(fn, what: str):
    """``fn()``, or an ExerciseError after TIMEOUT_S: an endless loop must not hang the notebook. Its thread is left
    behind, a daemon (Python cannot stop a thread); in grading the learner's process is stopped from outside."""
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as err:  # noqa: BLE001  (raised again below, in the checker's thread)
            result["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(TIMEOUT_S)
    if worker.is_alive():
        raise ExerciseError(f"{what} did not return within {TIMEOUT_S:.0f} s: an endless loop? It is still running in "
                            f"the background and slows down everything after it: restart the kernel once it is fixed.")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _run(factory, spec: dict, *args):
    """One case: the factory's layer (a ``boundary.Layer`` in grading, kept in the learner's process) probed."""
    what = f"factory({spec['D']}, {spec['h']}, bias={spec['bias']})"
    try:
        layer = _in_time(lambda: factory(spec["D"], spec["h"], spec["bias"]), what)
        if not isinstance(layer, (nn.Module, boundary.Layer)):
            raise ExerciseError(f"{what} returned {type(layer).__name__}; it must return an nn.Module.")
        spec = {**spec, "make": None, "what": what}
        found = layer.apply(f"{ch06.__name__}:probe_layer", spec, *args) if isinstance(layer, boundary.Layer) \
            else _in_time(lambda: ch06.probe_layer(layer, spec, *args), "your layer")
    except ExerciseError:
        raise
    except Exception:
        if spec.get("refuse"):
            return "raised an error"
        raise
    if found.get("printed"):
        raise ExerciseError(f"{spec['name']}: your layer prints at every call ({found['printed'].strip()[:60]!r}): a "
                            f"debug print left in forward. Remove it, or use logging at debug level.")
    if found.get("warnings"):
        raise ExerciseError(f"{spec['name']}: your layer warned when called ({found['warnings'][0][:90]}), recorded "
                            f"under warnings.simplefilter(\"always\"), which shows it at every call: a warning from "
                            f"forward buries the ones that matter (a size kept as a tensor? use an int and math.sqrt).")
    return ch06.judge(found, spec)


def _wrong(name: str, i: int, change) -> Case:
    """Cross-attention with argument ``i`` changed to a shape that does not fit: it must raise, as torch's does."""
    case = layer_case(name, 2, 4, 5, 6, 3, pads(5, 3), cross=True, refuse=True, seed=20)
    return Case(name, case.args[:i] + (change(case.args[i]),) + case.args[i + 1:])


CASES = ch06.LAYER_CASES + [
    layer_case("in training mode, with torch's default dropout of 0", 2, 4, 4, 6, 3, pads(4, 2), mode="train", seed=21),
    layer_case("built with bias=False, cross-attention", 2, 4, 5, 6, 3, pads(5, 3), cross=True, bias=False, seed=22),
    layer_case("in float32", 2, 4, 5, 6, 3, pads(5, 3), cross=True, dtype=torch.float32, seed=23),
    layer_case("in float16", 2, 4, 5, 6, 3, pads(5, 3), cross=True, dtype=torch.float16, seed=24),
    layer_case("embed_dim=10 in num_heads=4 (they do not split)", 1, 1, 1, 10, 4, state=None, refuse=True),
    _wrong("a (B, L) key_padding_mask for S keys", 4, lambda kpm: kpm[:, :4]),
    _wrong("a query of width D + 1", 1, lambda x: torch.cat([x, x[..., :1]], -1)),
]
EXERCISE = LayerExercise(
    what="your layer", reference=ch06.Reference, run=_run, cases=CASES, hints=ch06.HINTS,
    mistakes=ch06._mistakes(ch06.Reference, ch06.LAYER_TABLE + [
        ("sizes", dict(size_check=False), "builds a layer although 10 features do not split into 4 heads: torch "
         "refuses it in the constructor; check embed_dim % num_heads == 0 in __init__ and raise a ValueError."),
        ("finite fill -1e4", dict(fill=-1e4), "fills with a finite number such as -1e4 (a finite fill): a query with "
         "no key then averages keys it must not see (torch gives NaN, the course's layer zeros). Fill with -inf."),
        ("shapes accepted", dict(shapes="accept"), "runs without an error on a shape that does not fit (a query of "
         "width D + 1, a (B, L) key_padding_mask for S keys): it must raise, as torch's does; a broadcast mask "
         "masks the wrong keys."),
    ]),
    passed=f"all {len(CASES)} cases: " + ch06.PASSED + ", training mode, no bias, float32 and float16, nothing "
    "printed or warned; sizes that do not split and shapes that do not fit refused.",
)


def check_multihead_attention(factory) -> None:
    """Check ``factory(embed_dim, num_heads, bias)`` -> a layer, against ``nn.MultiheadAttention(batch_first=True)``
    with every weight and bias random and non-zero, on every case; name the mistake or describe what it did."""
    check(EXERCISE, factory)


EXERCISES = [EXERCISE]
