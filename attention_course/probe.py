"""A learner's layer run on one case, for the checkers of chapters 6 and 7 (:mod:`.exercises.ch07`) and for grading:
built (a class, or a factory's layer), torch's weights loaded, called twice or differentiated, inside a time limit.
:func:`probe_layer` alone holds the layer; in grading it runs in the learner's process (:mod:`.boundary`) and sends
back plain data, which :func:`judge` reads where no learner code runs."""
from __future__ import annotations

import contextlib
import copy
import io
import threading
import warnings

import torch
from torch import nn

from . import boundary
from .exercises import DTYPE, ExerciseError
from .exercises.diagnose import same

TIMEOUT_S = 30.0  # one call of a learner's layer on these tiny inputs takes milliseconds

def _in_time(fn, what: str):
    """``fn()``, or an ExerciseError after TIMEOUT_S: its thread is left behind, a daemon (Python cannot stop one)."""
    result, modes = {}, torch.overrides._get_current_function_mode_stack()  # the checker's, in its thread too

    def run():
        try:
            with contextlib.ExitStack() as stack:
                for mode in modes:
                    stack.enter_context(mode)
                result["value"] = fn()
        except BaseException as err:  # noqa: BLE001  (raised again in the checker's thread)
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

def probe_layer(target, spec: dict, query, key, value, key_padding_mask, attn_mask, need_weights, average):
    """Build ``target`` (``spec["make"]``), load torch's weights, call it twice or differentiate ``spec["rows"]``."""
    layer, (args, kwargs) = target, spec["make"] or ((), {})
    with contextlib.suppress(TypeError):  # a class that takes no dropout= is built without it, below
        layer = target(*args, **kwargs) if kwargs else layer
    layer = target(*args) if spec["make"] and layer is target else layer
    if spec["state"] is None:
        return {}
    layer = layer.to("cpu", DTYPE)
    try:
        layer.load_state_dict(spec["state"])
    except RuntimeError:
        if not hasattr(type(layer), "from_torch"):
            return {"parameters": {n: tuple(p.shape) for n, p in layer.named_parameters()}}
        mha = nn.MultiheadAttention(spec["D"], spec["h"], bias=spec["bias"], batch_first=True, dtype=DTYPE)
        mha.load_state_dict(spec["state"])
        layer = type(layer).from_torch(mha.eval()).to("cpu", DTYPE)
    layer = layer.train(spec["mode"] == "train").to(spec["dtype"])
    inputs, kwargs = [query, key, value], dict(key_padding_mask=key_padding_mask, need_weights=need_weights,
                                               attn_mask=attn_mask, average_attn_weights=average)
    again = copy.deepcopy(inputs)  # the first call may change its inputs: the second gets them as they were
    with contextlib.redirect_stdout(io.StringIO()) as printed, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if spec["loss"] is None:
            found = {"calls": [layer(*x, **kwargs) for x in (inputs, again)]}
        else:
            inputs = [t.clone().requires_grad_() for t in inputs]
            out = layer(*inputs, **kwargs)[0]
            out[spec["rows"]].pow(2).sum().backward()
            params = dict(layer.named_parameters())
            found = {n: [p for m, p in params.items() if m == n or m.endswith("." + n)] for n in spec["state"]}
            found = {"output": out, "gradients": {**{n: t.grad for n, t in zip(("query", "key", "value"), inputs)},
                                                  **{n: p[0].grad if len(p) == 1 else None for n, p in found.items()}}}
    try:
        found = boundary.plain(found, "your layer returned")
    except boundary.Refused as refusal:
        raise ExerciseError(f"{spec['name']}: {refusal}.") from None
    return {**found, "printed": printed.getvalue(), "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}

def run_layer(answer, spec: dict, *args):
    """One case: :func:`probe_layer` on a class, or on a factory's layer (a ``boundary.Layer`` in grading)."""
    try:
        if spec.get("factory"):
            spec = {**spec, "make": None, "what": f"factory({spec['D']}, {spec['h']}, bias={spec['bias']})"}
            answer = _in_time(lambda: answer(spec["D"], spec["h"], spec["bias"]), spec["what"])
            if not isinstance(answer, (nn.Module, boundary.Layer)):
                raise ExerciseError(f"{spec['what']} returned {type(answer).__name__}; it must return an nn.Module.")
        found = answer.apply(f"{__name__}:probe_layer", spec, *args) if isinstance(answer, boundary.Remote) else \
            _in_time(lambda: probe_layer(answer, spec, *args), "your layer")
    except ExerciseError:
        raise
    except Exception:
        if spec.get("refuse"):
            return "raised an error"
        raise
    return judge(found, spec)

def judge(found: dict, spec: dict):
    """What the probe found, as the checker compares it: {"output", "attention-weight tensor"}, or the gradients."""
    if spec.get("refuse"):
        return "ran without an error"
    if "parameters" in found:
        want = {n: tuple(t.shape) for n, t in spec["state"].items()}
        raise ExerciseError(f"torch's weights do not load into {spec['what']}: it has parameters "
                            f"{found['parameters']}, torch's layer {want}: use torch's names and shapes.")
    if spec.get("factory") and (found["printed"] or found["warnings"]):
        raise ExerciseError(f"{spec['name']}: your layer " + (f"prints at every call ({found['printed'][:50]!r}): "
                            "a debug print left in forward?" if found["printed"] else f"warned when called ("
                            f"{found['warnings'][0][:90]}), at every call: a size kept as a tensor? Use an int."))
    if spec["loss"] == "values" and not bool(found["output"][spec["rows"]].isfinite().all()):  # NaN's own course
        return {f"gradient of {n}": "none: the output is not finite where the loss reads it" for n in found["gradients"]}
    if spec["loss"] is not None:  # "finite": torch's NaN rows give NaN gradients; the course's zeros finite ones
        return {f"gradient of {n}" + " (finite?)" * (spec["loss"] == "finite"): g if spec["loss"] == "values" else
                None if g is None else bool(g.isfinite().all()) for n, g in found["gradients"].items()}
    first, second = found["calls"]
    if not (isinstance(first, tuple) and len(first) == 2):
        raise ExerciseError(f"{spec['name']}: your layer must return a pair (output, weights) like torch's; got "
                            f"{type(first).__name__}.")
    if not same(first, second, 0.0):
        raise ExerciseError(f"{spec['name']}: two identical calls of your layer give different outputs: " + (
            "dropout is active in eval mode: F.dropout(weights, p, training=self.training), or an nn.Dropout (layers "
            "created in forward change at every call too)." if spec["mode"] == "eval" else "in training mode, a "
            "default dropout above 0? torch's default dropout is 0.0, and a new layer is in training mode."))
    return {"output": first[0], "attention-weight tensor": first[1]}
