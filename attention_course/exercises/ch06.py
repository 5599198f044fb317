"""Checkers for chapter 6, multi-head attention reproduced.

* :func:`check_combine_masks` -- a key padding mask and an attention mask expanded to one (B, h, L, S) mask;
* :func:`check_multihead` -- a whole multi-head attention layer against ``nn.MultiheadAttention``.

The layer checkers (here and in chapter 7) never hold the learner's layer: :func:`probe_layer` builds it, loads
torch's weights, calls it and runs backward through it, and returns plain data (outputs, weights, gradients,
parameter names, exceptions); the checker builds torch's layer and judges that data. In a notebook the probe runs
in the notebook's process; in grading, in the process that runs the learner's code (``boundary.Remote.apply``), so
the comparison, the diagnosis and the message are computed where no learner code ever ran.
"""
from __future__ import annotations

import contextlib
import io
import math
import re
import threading
import warnings

import torch
import torch.nn.functional as F
from torch import nn

from .. import boundary
from . import (
    ATOL, DTYPE, ExerciseError, call, close, describe_diff, max_diff, passed, raised, require_tensor, same_error,
)

# ----------------------------------------------------------------------------------------------------------
# Exercise: combine the masks


def _mask_cases(gen: torch.Generator):
    B, h, L, S = 2, 3, 4, 5
    kpm = torch.tensor([[False, False, False, True, True], [False, False, False, False, True]])  # (B, S)
    window = torch.ones(L, S, dtype=torch.bool).triu(2)  # (L, S): key j > i + 1 blocked
    per_head = torch.rand(B * h, L, S, generator=gen) < 0.4  # (B*h, L, S), batch-major
    return (B, h, L, S), [
        ("key_padding_mask only", kpm, None),
        ("a 2-D attn_mask only", None, window),
        ("key_padding_mask and a 2-D attn_mask", kpm, window),
        ("key_padding_mask and a 3-D (B*h, L, S) attn_mask", kpm, per_head),
    ]


def _combine(kpm, attn_mask, B, h, L, S, *, op="or", head_major=False, polarity="ignore"):
    mask = torch.zeros(B, h, L, S, dtype=torch.bool)
    parts = []
    if kpm is not None:
        parts.append(~kpm.view(B, 1, 1, S) if polarity == "kpm allow" else kpm.view(B, 1, 1, S))
    if attn_mask is not None:
        attn_mask = ~attn_mask if polarity == "attn allow" else attn_mask
        if attn_mask.ndim == 2:
            parts.append(attn_mask.view(1, 1, L, S))
        else:
            parts.append(attn_mask.view(h, B, L, S).transpose(0, 1) if head_major else attn_mask.view(B, h, L, S))
    if op == "and" and len(parts) == 2:
        mask = (parts[0] & parts[1]).expand(B, h, L, S)
    else:
        for part in parts:
            mask = mask | part
    return ~mask if polarity == "allow" else mask


def _combine_hint(err: ExerciseError, kpm, attn_mask, B, h, L, S) -> str:
    """The likely cause of an exception raised while combining the masks, from the sizes its message names."""
    cause = err.__cause__
    if isinstance(cause, (AttributeError, TypeError)) and "NoneType" in str(cause):
        return (" Either mask may be None (not given): skip it, and start from the other one (or from an all-False "
                "(B, h, L, S) mask when both are None).")
    if not isinstance(cause, RuntimeError):
        return ""
    sizes = set(int(n) for n in re.findall(r"\((\d+)\)", str(cause)))  # "size of tensor a (4) must match ... (5)"
    size = re.search(r"input of size (\d+)", str(cause))
    if size and attn_mask is not None and attn_mask.ndim == 2 and int(size.group(1)) == L * S:
        return (f" A 2-D attn_mask (L, S) has no batch or head axis: it becomes (1, 1, L, S) = (1, 1, {L}, {S}), "
                f"shared by every sentence and head; only the 3-D (B*h, L, S) one is viewed as (B, h, L, S).")
    if kpm is not None and attn_mask is None and sizes == {B, L}:
        return (f" That is a (B, S) key_padding_mask put against (..., L, S) as it is: broadcasting aligns it from "
                f"the right, as an (L, S) mask of the queries (B = {B} against L = {L}). Give it its head and query "
                f"axes: key_padding_mask.view(B, 1, 1, S), or [:, None, None, :].")
    if kpm is not None and attn_mask is None and sizes == {L, S}:
        return (f" The key_padding_mask was put on the query axis: (B, 1, S, 1) lines its S = {S} keys up with the "
                f"L = {L} queries. One entry per key: key_padding_mask.view(B, 1, 1, S).")
    if attn_mask is not None and attn_mask.ndim == 2 and kpm is None and sizes == {L, S}:
        return (f" The 2-D attn_mask was turned around: it is (L, S) = ({L}, {S}), queries by keys, and becomes "
                f"(1, 1, L, S) as it is, without a transpose.")
    if attn_mask is not None and attn_mask.ndim == 3 and B * h in sizes:
        return (f" The 3-D attn_mask is flat, (B*h, L, S) = ({B * h}, {L}, {S}): view it as (B, h, L, S) = "
                f"({B}, {h}, {L}, {S}) before combining (batch-major: row b*h + i is sentence b, head i).")
    return (" key_padding_mask (B, S) becomes (B, 1, 1, S), a 2-D attn_mask (L, S) becomes (1, 1, L, S), a 3-D one "
            "(B*h, L, S) becomes (B, h, L, S); then combine with | and .expand(B, h, L, S).")


def _which_inverted(fn, cases, B, h, L, S, polarities) -> str:
    """With one mask given, inverting it and inverting every mask look the same: the case with both masks tells
    them apart. ``polarities``: the (options, message) of the three inversions, all masks first."""
    name, kpm, attn_mask = cases[2]  # key_padding_mask and a 2-D attn_mask
    try:
        got = fn(kpm, attn_mask, B, h, L, S)
    except Exception:  # noqa: BLE001 - that case is checked, and its error reported, in its turn
        got = None
    for options, message in polarities:
        if isinstance(got, torch.Tensor) and torch.equal(got.cpu(), _combine(kpm, attn_mask, B, h, L, S, **options)):
            return message + ("" if options["polarity"] == "allow" else f" (The case with {name} tells this from "
                                                                      f"inverting both.)")
    return polarities[0][1]


def check_combine_masks(fn) -> None:
    """Check ``fn(key_padding_mask, attn_mask, batch_size, num_heads, query_len, key_len)`` -> (B, h, L, S) bool.

    ``key_padding_mask`` (B, S) bool or None, True at padded keys; ``attn_mask`` (L, S) or (B*h, L, S) bool or
    None, True = blocked, the 3-D form batch-major (row ``b*h + i`` is sentence b, head i). A pair (query, key)
    is blocked in the result if either mask blocks it.
    """
    gen = torch.Generator().manual_seed(6)
    (B, h, L, S), cases = _mask_cases(gen)
    for name, kpm, attn_mask in cases:
        setting = f"with {name} (B={B}, h={h}, L={L}, S={S})"
        try:
            answer = call(fn, kpm, attn_mask, B, h, L, S, what=f"your function {setting}")
        except ExerciseError as err:
            raise ExerciseError(f"{str(err).rstrip('.')}.{_combine_hint(err, kpm, attn_mask, B, h, L, S)}") from err
        got = require_tensor(answer, "the mask", "your function")
        want = _combine(kpm, attn_mask, B, h, L, S)
        if got.dtype != torch.bool:
            raise ExerciseError(
                f"your mask has dtype {got.dtype} {setting}; return a bool ignore mask (True = blocked). Combine bool "
                f"masks with | (logical or), not + or *."
            )
        if tuple(got.shape) != (B, h, L, S):
            try:
                broadcastable = torch.broadcast_shapes(got.shape, (B, h, L, S)) == (B, h, L, S)
            except RuntimeError:
                broadcastable = False
            hint = (f" It broadcasts to (B, h, L, S), but the exercise asks for the mask expanded per head: "
                    f"add .expand({B}, {h}, {L}, {S})." if broadcastable else
                    " key_padding_mask (B, S) becomes (B, 1, 1, S): one row of keys per sentence, for every head and "
                    "query; a 2-D attn_mask (L, S) becomes (1, 1, L, S); a 3-D one (B*h, L, S) becomes (B, h, L, S).")
            raise ExerciseError(f"your mask has shape {tuple(got.shape)} {setting}, expected (B, h, L, S) = "
                                f"{(B, h, L, S)}.{hint}")
        if torch.equal(got, want):
            continue
        wrong = (got != want).nonzero()[0].tolist()
        b, i, q, k = wrong
        where = (f"{setting}, entry [b={b}, head={i}, query={q}, key={k}] is {bool(got[b, i, q, k])}, expected "
                 f"{bool(want[b, i, q, k])}")
        variants = [
            (dict(polarity="allow"), "your mask is inverted: it is True where attending is ALLOWED. PyTorch's "
                                     "nn.MultiheadAttention convention is True = blocked (ignore); only "
                                     "F.scaled_dot_product_attention reads True as allowed."),
            (dict(polarity="kpm allow"), "the key_padding_mask alone is read the other way round: its True marks "
                                         "a PAD, a key to block (the attn_mask you read right). Use it as it is, "
                                         "not ~key_padding_mask."),
            (dict(polarity="attn allow"), "the attn_mask alone is read the other way round: its True marks a pair "
                                          "to BLOCK, as the key_padding_mask's does (which you read right). Use it "
                                          "as it is, not ~attn_mask."),
            (dict(op="and"), "you combined the masks with & (and): a pair must be blocked if EITHER mask blocks "
                             "it, so combine with | (or)."),
            (dict(head_major=True), "you unflattened the 3-D attn_mask head-major, as (h, B, L, S). PyTorch's "
                                    "(B*h, L, S) is batch-major: row b*h + i is sentence b, head i, so use "
                                    "attn_mask.view(B, h, L, S)."),
        ]
        for options, message in variants:
            if torch.equal(got, _combine(kpm, attn_mask, B, h, L, S, **options)):
                if options.get("polarity") == "allow" and (kpm is None or attn_mask is None):
                    message = _which_inverted(fn, cases, B, h, L, S, variants[:3])
                raise ExerciseError(f"{where}: {message}")
        if kpm is not None and torch.equal(got, _combine(None, attn_mask, B, h, L, S)):
            raise ExerciseError(f"{where}: the key_padding_mask was ignored.")
        if attn_mask is not None and torch.equal(got, _combine(kpm, None, B, h, L, S)):
            raise ExerciseError(f"{where}: the attn_mask was ignored.")
        raise ExerciseError(
            f"{where}. A pair is blocked where either mask blocks it: key_padding_mask (B, S) as (B, 1, 1, S), a 2-D "
            f"attn_mask (L, S) as (1, 1, L, S), a 3-D one (B*h, L, S) as (B, h, L, S) (row b*h + i is sentence b, "
            f"head i), combined with | and expanded to (B, h, L, S)."
        )
    passed("padding, 2-D and 3-D masks expand and combine as torch does.")


# ----------------------------------------------------------------------------------------------------------
# Exercise: the whole layer


def _naive_softmax(scores, dim=-1):
    """exp / sum without subtracting the max: exp overflows to inf above ~88.7 in float32, ~709.8 in float64."""
    e = scores.exp()
    return e / e.sum(dim, keepdim=True)


def _masks(kpm, attn_mask, B, h, L, S, *, invert=False, floats="add", kpm_axis="keys", drop=()):
    """(blocked, bias): the (B, h, L, S) bool entries to fill and the (B, h, L, S) float bias to add, from torch's
    two mask arguments (bool: True = blocked; float: added), or None for a mask not given. Options = mistakes:
    ``invert`` bool masks (True: both, "attn": the attn_mask alone), ``floats`` "bool" (float masks used as bool,
    .bool()) or "neginf" (only their -inf entries), ``kpm_axis`` "queries", ``drop`` one or both masks."""
    blocked, bias = torch.zeros(B, h, L, S, dtype=torch.bool), torch.zeros(B, h, L, S, dtype=DTYPE)
    for which, m in (("kpm", kpm), ("attn", attn_mask)):
        if m is None or which in drop:
            continue
        if which == "kpm":
            m = m.view(B, 1, 1, S) if kpm_axis == "keys" else m.view(B, 1, L, 1)
        elif m.dim() == 3:
            m = m.view(B, h, L, S)
        if m.dtype == torch.bool:
            blocked = blocked | (~m if invert is True or invert == which else m)
        elif floats == "add":
            bias = bias + m
        else:
            blocked = blocked | (m != 0 if floats == "bool" else torch.isneginf(m))
    return blocked, bias


def _reference(params, query, key, value, masks, h, *, average=True, in_bias=True, out_bias=True, scale="d",
               transpose=True, merge_transpose=True, out_proj=True, softmax_dim=-1, softmax=torch.softmax,
               fill=float("-inf"), mask_after=False, multiply=False, split_order="hd", merge_order="hd"):
    """Multi-head attention from torch's parameters; ``masks`` = (blocked, bias) of :func:`_masks` or None.
    Options = mistakes."""
    B, L, D = query.shape
    S, d = key.shape[1], D // h
    W_q, W_k, W_v = params["in_proj_weight"].chunk(3)
    b_q, b_k, b_v = params["in_proj_bias"].chunk(3) if in_bias else (None, None, None)
    q, k, v = F.linear(query, W_q, b_q), F.linear(key, W_k, b_k), F.linear(value, W_v, b_v)

    def split(t, n):
        if not transpose:
            return t.reshape(B, h, n, d)
        if split_order == "dh":  # head i takes features i, i + h, i + 2h, ...
            return t.reshape(B, n, d, h).permute(0, 3, 1, 2)
        return t.reshape(B, n, h, d).transpose(1, 2)

    q, k, v = split(q, L), split(k, S), split(v, S)  # (B, h, L|S, d)
    scores = q @ k.transpose(-2, -1)  # (B, h, L, S)
    if scale is not None:
        scores = scores / math.sqrt({"d": d, "D": D, "h": h}[scale])
    blocked, bias = masks if masks is not None else (None, None)
    if bias is not None:
        scores = scores * bias.exp() if multiply else scores + bias
    if blocked is not None and not mask_after:
        scores = scores.masked_fill(blocked, fill)
    weights = softmax(scores, dim=softmax_dim)  # (B, h, L, S)
    if blocked is not None and mask_after:
        weights = weights.masked_fill(blocked, 0.0)
    heads = weights @ v  # (B, h, L, d)
    if not merge_transpose:
        heads = heads.reshape(B, L, D)
    elif merge_order == "hd":
        heads = heads.transpose(1, 2).reshape(B, L, D)
    else:
        heads = heads.permute(0, 2, 3, 1).reshape(B, L, D)  # (B, L, d, h): features of the heads interleaved
    out = F.linear(heads, params["out_proj.weight"], params["out_proj.bias"] if out_bias else None) if out_proj \
        else heads
    return out, (weights.sum(1) if average == "sum" else weights.mean(1) if average else weights)


def _torch_layer(D: int, h: int, gen: torch.Generator) -> nn.MultiheadAttention:
    mha = nn.MultiheadAttention(D, h, batch_first=True, dtype=DTYPE)
    with torch.no_grad():  # random non-zero values everywhere: zero biases would hide missing biases
        for p in mha.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=DTYPE))
    return mha


def _layer_cases(gen: torch.Generator, B: int, L: int, S: int, D: int):
    rand = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    x, memory = rand(B, L, D), rand(B, S, D)
    kpm_self = torch.arange(L)[None, :] >= torch.tensor([L, 2])[:, None]  # (B, L)
    kpm_cross = torch.arange(S)[None, :] >= torch.tensor([S, 3])[:, None]  # (B, S)
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    additive = lambda m: torch.zeros(m.shape, dtype=DTYPE).masked_fill(m, float("-inf"))  # noqa: E731
    # float masks with finite values too: they favour (> 0) or penalise (< 0) a key, only -inf hides one
    favour = torch.tensor([[0.0, -1.5, 0.7, -0.4], [0.0, 0.9, -2.0, 0.3], [-0.6, 0.0, 1.2, -1.0],
                           [0.5, -0.8, 0.0, 1.1]], dtype=DTYPE)  # (L, L)
    favour = favour.masked_fill(causal, float("-inf"))
    return [
        # (name, query, key, value, key_padding_mask, attn_mask, average_attn_weights)
        ("self-attention without masks", x, x, x, None, None, True),
        ("a bool key_padding_mask", x, x, x, kpm_self, None, True),
        ("key padding plus a causal attn_mask", x, x, x, kpm_self, causal, True),
        ("float (additive) masks", x, x, x, additive(kpm_self), additive(causal), True),
        ("float masks with finite values", x, x, x, additive(kpm_self) - 0.8 * (torch.arange(L) == 1), favour, True),
        ("average_attn_weights=False", x, x, x, kpm_self, causal, False),
        (f"cross-attention, L={L} queries over S={S} keys", x, memory, memory, kpm_cross, None, True),
    ]


def _matches(got: torch.Tensor, want: torch.Tensor) -> bool:
    """``got`` equals ``want`` wherever ``want`` is a number: a mistake made with a finite fill such as -1e9 gives
    numbers where the same mistake with -inf gives NaN rows."""
    defined = torch.isfinite(want)
    return got.shape == want.shape and bool(defined.any()) and close(got[defined], want[defined], 1e-8)


def _dropout_message(setting: str, spread: float) -> str:
    return (f"{setting}: two identical calls of your layer in eval mode give different outputs (by up to "
            f"{spread:.2g}): dropout is active in eval mode. F.dropout's training argument defaults to True: use "
            f"F.dropout(weights, p, training=self.training), or an nn.Dropout module, which .eval() turns off.")


def _broadcast_from_the_right(err: ExerciseError, query, key, kpm) -> bool:
    """Whether ``err`` is the error that masking (B, L, S) or (B, h, L, S) scores with the bare (B, S) ``kpm`` gives
    (found by making that mistake on zeros and comparing the errors)."""
    if kpm is None or kpm.dim() != 2 or not isinstance(err.__cause__, RuntimeError):
        return False
    B, L, S = query.shape[0], query.shape[1], key.shape[1]
    for shape in ((B, L, S), (B, 1, L, S)):
        try:
            torch.zeros(shape).masked_fill(torch.ones(kpm.shape, dtype=torch.bool), 0.0)
        except RuntimeError as mistake:
            if same_error(err.__cause__, mistake):
                return True
    return False


# The learner's layer is touched by probe_layer alone: it builds the layer, loads torch's weights into it, calls it
# and runs backward through it, in this process in a notebook, in grading in the process that runs the learner's code
# (boundary.Remote.apply), and sends back plain data. The checkers judge that data; they never hold the layer.

class _Late(ExerciseError):
    """A call of the learner's code that did not return in time."""


def _in_time(fn, what: str, timeout: float | None):
    """``fn()``, or an ExerciseError if it has not returned after ``timeout`` seconds (None: no limit here; in
    grading the process running the learner's code is stopped from outside). An endless loop must not hang the
    notebook: the thread it runs in is left behind, as a daemon (Python cannot stop a thread), so the message says
    to restart the kernel."""
    if timeout is None:
        return fn()
    result = {}

    def run():
        try:
            result["value"] = fn()
        except BaseException as err:  # reported below, in the checker's thread
            result["error"] = err

    worker = threading.Thread(target=run, daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        raise _Late(f"{what} did not return within {timeout:.0f} s: an endless loop? It is still running in the "
                    f"background and slows down everything after it: restart the kernel once the loop is fixed.")
    if "error" in result:
        raise result["error"]
    return result["value"]


def _step(query, key, value, setting: str, *, mode="eval", dtype=DTYPE, warn=None, loss=None, **kwargs) -> dict:
    """One call of the learner's layer for :func:`probe_layer`: ``forward(query, key, value, **kwargs)`` in ``mode``
    and ``dtype``. ``warn``: "ignore" its warnings, or "record" them and what it prints. ``loss``: differentiate
    instead, "pair": sum(out**2) + sum(weights**2) with key and value one tensor; a (B, L) bool tensor: the sum of
    squares of those rows of the output, query, key and value one tensor. ``setting`` ends "your layer ...".
    """
    return {"args": (query, key, value), "kwargs": kwargs, "setting": setting, "mode": mode, "dtype": dtype,
            "warn": warn, "loss": loss}


def _building(mha: nn.MultiheadAttention, what: str, make=None, from_torch=False) -> dict:
    """How :func:`probe_layer` gets the learner's layer with ``mha``'s weights: ``make`` = (args, kwargs) to call the
    learner's class with (None: it is given the layer), then by parameter names, else (``from_torch``) through the
    class's ``from_torch``."""
    return {"make": make, "state": dict(mha.state_dict()), "D": mha.embed_dim, "h": mha.num_heads,
            "bias": mha.in_proj_bias is not None, "from_torch": from_torch, "what": what}


def _gradients(layer, query, memory, rows=None, **kwargs) -> dict:
    """Gradients of sum(out**2) + sum(weights**2) for cross-attention of ``query`` over ``memory``, or (``rows``, a
    (B, L) bool tensor) of the sum of squares of those output rows for self-attention of ``query``: of "query",
    "key/value" and of every parameter of ``layer``, by name."""
    layer.zero_grad()
    q_in = query.clone().requires_grad_()
    kv_in = q_in if rows is not None else memory.clone().requires_grad_()
    out, weights = layer(q_in, kv_in, kv_in, **kwargs)
    loss = out[rows].pow(2).sum() if rows is not None else out.pow(2).sum() + weights.pow(2).sum()
    loss.backward()
    return {"query": q_in.grad, "key/value": None if rows is not None else kv_in.grad,
            **{n: p.grad for n, p in layer.named_parameters()}}


def _call(layer, step: dict):
    """One step on the layer: (its answer, {"printed", "warnings"} where they are recorded)."""
    query, key, value = step["args"]
    if step["loss"] is not None:
        rows = None if isinstance(step["loss"], str) else step["loss"]
        run = lambda: _gradients(layer, query, key, rows=rows, **step["kwargs"])  # noqa: E731
    else:
        run = lambda: layer(query, key, value, **step["kwargs"])  # noqa: E731
    if step["warn"] is None:
        return run(), {}
    with contextlib.redirect_stdout(io.StringIO()) if step["warn"] == "record" else contextlib.nullcontext() as \
            printed, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always" if step["warn"] == "record" else "ignore")
        answer = run()
    if step["warn"] != "record":
        return answer, {}
    return answer, {"printed": printed.getvalue(), "warnings": [[w.category.__name__, str(w.message)]
                                                                for w in caught]}


def probe_layer(target, building: dict, steps: dict, timeout: float | None = None) -> dict:
    """Build the learner's layer, load torch's weights into it (:func:`_building`) and run ``steps`` (name ->
    :func:`_step`) on it, in order: what it did, as plain data. ``target``: the learner's class (or factory), or
    the layer itself. Returns {"setup": {"stage", "error", "type", "params", "from_torch"}, "steps": {name:
    {"value": ...} or {"error": exception} or {"refused": what it returned}}, "stopped": None or the ExerciseError of
    a call over ``timeout`` seconds, which ends it, as a failed setup does. In a notebook the checker runs it; in
    grading the learner process does (:func:`_probed`), where the learner's code may run, and the checker judges
    what comes back."""
    setup = {"stage": "make", "error": None, "type": None, "params": {}, "from_torch": False}
    found = {"setup": setup, "steps": {}, "stopped": None}

    def set_up():
        make = building["make"]
        layer = target if make is None else target(*make[0], **make[1])
        setup.update(stage="move", type=type(layer).__name__)
        layer = layer.to("cpu", DTYPE)
        setup.update(stage="load", params={name: tuple(p.shape) for name, p in layer.named_parameters()},
                     from_torch=hasattr(type(layer), "from_torch"))
        try:
            layer.load_state_dict(building["state"])
        except RuntimeError:
            if not (building["from_torch"] and setup["from_torch"]):
                raise
            setup["stage"] = "from_torch"
            mha = nn.MultiheadAttention(building["D"], building["h"], bias=building["bias"], batch_first=True,
                                        dtype=DTYPE)
            mha.load_state_dict(building["state"])
            layer = type(layer).from_torch(mha.eval())
            setup["stage"] = "move"
            layer = layer.to("cpu", DTYPE)
        return layer.eval()

    try:
        layer = _in_time(set_up, building["what"], timeout)
    except _Late as late:
        setup["error"] = found["stopped"] = late
        return found
    except Exception as err:  # noqa: BLE001  (the learner's code may raise anything: judged by the checker)
        setup["error"] = err
        return found
    setup["stage"] = None
    state = {"mode": "eval", "dtype": DTYPE}

    def run(step):
        if step["mode"] != state["mode"]:
            layer.train(step["mode"] == "train")
            state["mode"] = step["mode"]
        if step["dtype"] != state["dtype"]:
            layer.to(step["dtype"])
            state["dtype"] = step["dtype"]
        return _call(layer, step)

    for name, step in steps.items():
        what = f"your layer {step['setting']}"
        try:
            answer, extra = _in_time(lambda step=step: run(step), what, timeout)
        except _Late as late:  # the call is still running, in a thread left behind: nothing more can be asked
            found["stopped"] = late
            return found
        except Exception as err:  # noqa: BLE001
            found["steps"][name] = {"error": err}
            continue
        where = f"backward through {what} gave" if step["loss"] is not None else f"{what} returned"
        try:
            found["steps"][name] = {"value": boundary.plain(answer, where), **extra}
        except boundary.Refused as refusal:
            found["steps"][name] = {"refused": str(refusal)}
    return found


def _probed(target, building: dict, steps: dict) -> dict:
    """:func:`probe_layer` in grading's learner process (``boundary.Remote.apply``), its exceptions as
    ``boundary.exception_data``."""
    found = probe_layer(target, building, steps)
    if found["setup"]["error"] is not None:
        found["setup"]["error"] = boundary.exception_data(found["setup"]["error"])
    for step in found["steps"].values():
        if "error" in step:
            step["error"] = boundary.exception_data(step["error"])
    return found


class Probed:
    """What :func:`probe_layer` found, for the checker: each step's value, or the message of its failure. The
    learner's layer runs in the learner's process in grading (``target`` a ``boundary.Remote``: a class, or the
    ``boundary.Layer`` a factory returned), here in a notebook, within ``timeout`` seconds a call."""

    def __init__(self, target, building: dict, steps: dict, timeout: float | None = None):
        self.steps = steps
        if isinstance(target, boundary.Remote):
            found = target.apply(f"{__name__}:_probed", building, steps)
            error = found["setup"]["error"]
            found["setup"]["error"] = boundary.rebuilt(error) if type(error) is dict else error
            for step in found["steps"].values():
                if "error" in step:
                    step["error"] = boundary.rebuilt(step["error"])
        else:
            found = probe_layer(target, building, steps, timeout)
        self.found, self.setup = found, found["setup"]

    def step(self, name: str) -> dict:
        if name not in self.found["steps"]:  # after a call that did not return: its message
            raise self.found["stopped"] or ExerciseError(f"your layer gave no answer {self.steps[name]['setting']}.")
        return self.found["steps"][name]

    def value(self, name: str, what: str):
        """The step's value; a failure as the learner's code raising (:func:`call`), or as what it returned."""
        step = self.step(name)
        if "refused" in step:
            raise ExerciseError(f"{step['refused']}.")
        if "error" in step:
            if isinstance(step["error"], ExerciseError):
                raise step["error"]
            raise raised(step["error"], what) from step["error"]
        return step["value"]


def _forward(probed: Probed, name: str):
    """(output, weights) of the step ``name`` of the learner's layer, any exception reported with its likely cause."""
    step = probed.steps[name]
    (query, key, _), setting = step["args"], step["setting"]
    try:
        answer = probed.value(name, f"your layer {setting}")
    except ExerciseError as err:
        if _broadcast_from_the_right(err, query, key, step["kwargs"].get("key_padding_mask")):
            raise ExerciseError(
                f"{str(err).rstrip('.')}. That is the error of a (B, S) key_padding_mask put against the (..., L, S) "
                f"scores as it is: broadcasting aligns it from the right, as an (L, S) mask of the queries (silently "
                f"wrong when B == L). Give it its query (and head) axes: key_padding_mask[:, None, None, :], "
                f"(B, 1, 1, S).") from err
        cause = str(err.__cause__)
        if isinstance(err.__cause__, TypeError) and "argument" in cause:
            raise ExerciseError(f"{str(err).rstrip('.')}. The layer is called as torch's is: forward(query, key, "
                                f"value, key_padding_mask=None, need_weights=True, attn_mask=None, "
                                f"average_attn_weights=True), keywords included.") from err
        if key.shape[1] != query.shape[1] and ("invalid for input of size" in cause or "must match" in cause):
            raise ExerciseError(f"{str(err).rstrip('.')}. Keys and values have S = {key.shape[1]} positions, "
                                f"queries L = {query.shape[1]}: split k and v with key.shape[1], not the query's "
                                f"L.") from err
        raise
    if not isinstance(answer, tuple) or len(answer) != 2:
        raise ExerciseError(f"your layer must return a pair (output, weights) like torch's; got "
                            f"{type(answer).__name__} {setting}.")
    out = require_tensor(answer[0], "the output", "your layer").detach()
    weights = None if answer[1] is None else require_tensor(answer[1], "the weights", "your layer").detach()
    return out, weights


def _case_steps(cases, warn=None) -> dict:
    """Each forward case (:func:`_layer_cases`) twice: a second call tells dropout from a mistake."""
    steps = {}
    for name, query, key, value, kpm, attn_mask, average in cases:
        for again in ("", " again"):
            steps[name + again] = _step(query, key, value, f"with {name}", warn=warn, key_padding_mask=kpm,
                                        attn_mask=attn_mask, average_attn_weights=average)
    return steps


def _large_logits_step(params, gen, B, L, D, h) -> dict:
    """Scores of a few thousand: exp overflows unless the softmax subtracts each row's max first."""
    x = 30.0 * torch.randn(B, L, D, generator=gen, dtype=DTYPE)
    kpm = torch.arange(L)[None, :] >= torch.tensor([L, 2])[:, None]
    q, k = F.linear(x, params["in_proj_weight"][:D]), F.linear(x, params["in_proj_weight"][D:2 * D])
    top = float((q.view(B, L, h, -1).transpose(1, 2) @ k.view(B, L, h, -1).permute(0, 2, 3, 1)).abs().max())
    top /= math.sqrt(D // h)
    return _step(x, x, x, f"with large scores (inputs scaled by 30, |scores| up to {top:.0f})", key_padding_mask=kpm)


def _check_large_logits(probed: Probed, mha, params, h) -> None:
    step = probed.steps["large scores"]
    x, kpm, setting = step["args"][0], step["kwargs"]["key_padding_mask"], step["setting"]
    B, L, _ = x.shape
    out, weights = _forward(probed, "large scores")
    with torch.no_grad():
        want_out, want_w = mha(x, x, x, key_padding_mask=kpm)
    scale = float(want_out.abs().max())
    if max_diff(out, want_out) <= 1e-9 * scale and max_diff(weights, want_w) <= 1e-9:
        return
    diff = f"(outputs {describe_diff(out, want_out)}, weights {describe_diff(weights, want_w)})"
    naive_out, _ = _reference(params, x, x, x, _masks(kpm, None, B, h, L, L), h, softmax=_naive_softmax)
    if not torch.isfinite(out).all() and (naive_out.isnan() == out.isnan()).all():
        raise ExerciseError(
            f"{setting} your layer gives NaN or inf where torch's is finite {diff}: a softmax computed as exp(s) / "
            f"exp(s).sum() without subtracting the max overflows (exp(s) is inf above s = 88.7 in float32, 709.8 "
            f"in float64, and inf / inf = NaN). Subtract each row's max first, s - s.amax(-1, keepdim=True), or use "
            f"torch.softmax(scores, dim=-1), which does."
        )
    raise ExerciseError(f"{setting} your layer differs from nn.MultiheadAttention {diff}, though it agrees on "
                        f"ordinary inputs: look at how the softmax handles scores in the thousands.")


def _empty_rows_steps(gen, B, D) -> dict:
    """Queries with no key: left padding and a causal mask; the forward call, then backward from the rows that
    have keys."""
    L = 4
    x = torch.randn(B, L, D, generator=gen, dtype=DTYPE)
    kpm = torch.tensor([[True, True, False, False], [False] * L])  # 2 pads on the left
    causal = torch.ones(L, L, dtype=torch.bool).triu(1)
    setting = "with left padding and a causal mask (queries 0 and 1 of sentence 0 may see no key)"
    return {"no key": _step(x, x, x, setting, key_padding_mask=kpm, attn_mask=causal),
            "no key, gradients": _step(x, x, x, f"{setting}, for the gradients", loss=~kpm, key_padding_mask=kpm,
                                       attn_mask=causal)}


def _check_empty_rows(probed: Probed, mha) -> str:
    """Queries with no key: torch gives NaN there (with weights), the course's layer zeros. Either is accepted."""
    step = probed.steps["no key"]
    x, kpm, causal, setting = step["args"][0], step["kwargs"]["key_padding_mask"], step["kwargs"]["attn_mask"], \
        step["setting"]
    D = x.shape[-1]
    empty = (kpm[:, None, :] | causal).all(-1)  # (B, L): queries 0 and 1 of sentence 0 see only pads
    out, weights = _forward(probed, "no key")
    with torch.no_grad():
        want_out, want_w = mha(x, x, x, key_padding_mask=kpm, attn_mask=causal)
    if not close(out[~empty], want_out[~empty]) or not close(weights[~empty], want_w[~empty]):
        where = "NaN reaches rows that have keys" if out[~empty].isnan().any() else "the rows that have keys differ"
        raise ExerciseError(f"{setting}: {where} (outputs {describe_diff(out[~empty], want_out[~empty])}, weights "
                            f"{describe_diff(weights[~empty], want_w[~empty])}). A row with no key must not "
                            f"change the others.")
    if out[empty].isnan().all() and weights[empty].isnan().all():
        return " Rows with no key give NaN, as torch's do; the course's layer gives them zeros (safe softmax)."
    zero_rows = close(weights[empty], torch.zeros_like(weights[empty]))
    bias = mha.out_proj.bias.detach().expand(int(empty.sum()), D)
    if not zero_rows or not close(out[empty], bias):
        sums = weights[empty].nan_to_num(nan=float("inf")).sum(-1).max()
        raise ExerciseError(
            f"{setting}: in the rows with no key your weights sum to {float(sums):.2g} and the output is not "
            f"out_proj.bias. A query with nothing to attend to gets NaN in torch (softmax of all -inf is 0 / 0) and "
            f"all-zero weights in the course's layer; a finite fill such as -1e9 gives a uniform average over keys "
            f"it must not see instead. Fill with float('-inf') and, for zeros, a safe softmax: find the empty rows "
            f"with torch.isneginf(scores).all(-1, keepdim=True), fill their scores with 0 before the softmax and "
            f"their weights with 0 after."
        )
    grads = probed.value("no key, gradients", f"your layer {setting}, for the gradients")
    bad = [n for n, g in grads.items() if n not in ("query", "key/value") and g is not None
           and not torch.isfinite(g).all()]
    if not torch.isfinite(grads["query"]).all():
        bad.append("the input")
    if bad:
        raise ExerciseError(
            f"{setting}: the rows with no key get zero weights, but the gradients of {', '.join(bad)} are NaN, "
            f"although the loss leaves those rows out. Zeroing the weights after a softmax that made "
            f"NaN (nan_to_num, torch.where) does not stop backward from multiplying with the NaN: give the empty "
            f"rows finite scores BEFORE the softmax (scores.masked_fill(empty, 0.0)), then zero their weights."
        )
    return " Rows with no key get zero weights and finite gradients."


def _check_dropout(cls, mha, query, kpm, D, h) -> None:
    """A layer built with dropout=0.5, in eval mode, must compute what torch's does (no dropout)."""
    setting = f"with {cls.__name__}({D}, {h}, dropout=0.5) in eval mode"
    steps = {"first": _step(query, query, query, setting, key_padding_mask=kpm),
             "second": _step(query, query, query, setting, key_padding_mask=kpm)}
    probed = Probed(cls, _building(mha, f"{cls.__name__}({D}, {h}, dropout=0.5)", make=((D, h), {"dropout": 0.5})),
                    steps)
    error = probed.setup["error"]
    if probed.setup["stage"] == "make" and isinstance(error, TypeError):  # the exercise does not ask for dropout
        return
    if error is not None:
        raise error
    first, _ = _forward(probed, "first")
    second, _ = _forward(probed, "second")
    if max_diff(first, second) > 0:
        raise ExerciseError(_dropout_message(setting, max_diff(first, second)))
    want, _ = mha(query, query, query, key_padding_mask=kpm)
    if max_diff(first, want) > ATOL:
        raise ExerciseError(f"{setting}, your output and torch's {describe_diff(first, want)}: in eval mode "
                            f"dropout is off, weights are neither dropped nor rescaled by 1 / (1 - p).")


def check_case(probed: Probed, mha, params, case, h: int) -> None:
    """One forward case against torch's layer ``mha``: shapes, output, weights; a difference is named by rerunning
    the reference with each classic mistake applied. ``case``: (name, query, key, value, key_padding_mask,
    attn_mask, average_attn_weights), probed as the steps ``name`` and ``name`` + " again" (:func:`_case_steps`)."""
    name, query, key, value, kpm, attn_mask, average = case
    B, D, d = query.shape[0], query.shape[-1], query.shape[-1] // h
    setting = f"with {name}"
    kwargs = dict(key_padding_mask=kpm, attn_mask=attn_mask, average_attn_weights=average)
    out, weights = _forward(probed, name)
    if weights is None:
        raise ExerciseError(f"your layer returned None for the weights {setting}; with need_weights=True "
                            f"(the default) torch returns them.")
    with torch.no_grad():
        want_out, want_w = mha(query, key, value, **kwargs)
    Lq, Sk = query.shape[1], key.shape[1]
    if tuple(out.shape) != (B, Lq, D):
        raise ExerciseError(f"your output has shape {tuple(out.shape)} {setting}, expected (B, L, D) = {(B, Lq, D)}.")
    want_shape = tuple(want_w.shape)
    if tuple(weights.shape) != want_shape:
        shape = tuple(weights.shape)
        if shape == (B * h, Lq, Sk):
            hint = (" These are the per-head weights in the flat (B*h, L, S) layout: view them as (B, h, L, S)"
                    + (" and average over the heads with .mean(dim=1)." if average else "."))
        elif average and shape == (B, h, Lq, Sk):
            hint = " With average_attn_weights=True, average over the heads: weights.mean(dim=1)."
        elif not average and shape == (B, Lq, Sk):
            hint = " With average_attn_weights=False, return one matrix per head, (B, h, L, S), not their mean."
        elif shape in ((Lq, B, B), (Lq, h, B, B)):
            hint = (" That is attention over the batch: your layer reads its inputs as (L, B, D), sequence first. "
                    "The layer checked here is nn.MultiheadAttention(batch_first=True): inputs (B, L, D).")
        else:
            hint = ""
        raise ExerciseError(f"your weights have shape {shape} {setting}, torch's {want_shape}.{hint}")
    diff_out, diff_w = max_diff(out, want_out), max_diff(weights, want_w)
    if diff_out <= ATOL and diff_w <= ATOL:
        return
    again, _ = _forward(probed, f"{name} again")
    if max_diff(again, out) > 0:
        raise ExerciseError(_dropout_message(setting, max_diff(again, out)))
    diff = f"(outputs {describe_diff(out, want_out)}, weights {describe_diff(weights, want_w)})"
    masked = kpm is not None or attn_mask is not None
    floats = any(m is not None and m.dtype != torch.bool for m in (kpm, attn_mask))
    bools = any(m is not None and m.dtype == torch.bool for m in (kpm, attn_mask))
    masks = lambda **options: _masks(kpm, attn_mask, B, h, Lq, Sk, **options) if masked else None  # noqa: E731
    variants = [
        (dict(softmax_dim=-2), "the softmax ran over the queries (dim=-2 of the (B, h, L, S) scores): each "
                               "query's weights over the keys must sum to 1, so use softmax(scores, dim=-1)."),
        (dict(softmax_dim=1), "the softmax ran over the heads (dim=1 of the (B, h, L, S) scores): each query's "
                              "weights over the keys must sum to 1, so use softmax(scores, dim=-1)."),
        (dict(scale="D"), f"the scores were divided by sqrt(D) = sqrt({D}); with heads the scale is sqrt(d), "
                          f"d = D / h = {d}, the size of the vectors whose dot product is taken."),
        (dict(scale="h"), f"the scores were divided by sqrt(h) = sqrt({h}), the number of HEADS; the scale is "
                          f"sqrt(d), d = D / h = {d}, the size of the vectors whose dot product is taken."),
        (dict(scale=None), f"the scores were not scaled: divide q @ k.transpose(-2, -1) by sqrt(d) = sqrt({d}), "
                           f"d = D / h the head size, before the softmax."),
        (dict(transpose=False), "the heads were split without the transpose: reshape to (B, L, h, d), then "
                                "transpose(1, 2); a direct reshape mixes tokens across heads (chapter 5)."),
        (dict(merge_transpose=False), "the heads were merged without undoing the split's transpose: (B, h, L, d) "
                                      "must become (B, L, h, d) with transpose(1, 2) before the reshape to (B, L, "
                                      "D); a direct reshape hands each token pieces of other tokens."),
        (dict(split_order="dh", merge_order="dh"),
         "the features were cut into heads in the wrong order, (B, L, d, h): head i must hold the d consecutive "
         "features i*d ... (i+1)*d - 1, as torch's in_proj and out_proj assume. Split with view(B, L, h, d)."),
        (dict(merge_order="dh"), "the heads were merged in the wrong order: (B, h, L, d) must become (B, L, h, d) "
                                 "(transpose(1, 2)), so that head i fills features i*d ... (i+1)*d - 1; "
                                 "(B, L, d, h) interleaves the heads' features."),
        (dict(in_bias=False), "in_proj_bias is not used: add the biases b_q, b_k, b_v (in_proj_bias.chunk(3)). "
                              "torch starts them at zero, which is why a check with a fresh layer misses this."),
        (dict(out_bias=False), "out_proj.bias is not used: apply the whole out_proj (an nn.Linear)."),
        (dict(out_proj=False), "the output projection out_proj is missing: apply it after merging the heads."),
    ]
    if average:
        variants.append((dict(average="sum"), "the weights were SUMMED over the heads: with "
                                              "average_attn_weights=True torch returns their mean, "
                                              "weights.mean(dim=1), so that each row still sums to 1."))
    if bools:
        variants += [
            (dict(masks=masks(invert=True)),
             "the mask polarity is inverted: in nn.MultiheadAttention a bool True must mean padding / ignore this "
             "key, False attend. Fill the scores with -inf where the mask is True (masked_fill(mask, "
             "float('-inf'))), not where it is False."),
            (dict(mask_after=True), "the mask was applied after the softmax (weights set to 0 where masked): the "
                                    "kept weights no longer sum to 1. Fill the SCORES with -inf before the "
                                    "softmax, which then shares each row among the visible keys."),
            (dict(fill=0.0), "the masked scores were set to 0, not -inf: a score of 0 still gets the weight "
                             "exp(0) / sum, as much as an ordinary key. Fill with float('-inf') (or, if you "
                             "multiplied a mask into the scores: a mask is added, never multiplied)."),
        ]
    if floats:
        variants += [
            (dict(multiply=True), "the float mask was multiplied into the scores (scores * mask.exp()?): a float "
                                  "mask is ADDED, scores + mask; -inf added hides a key, while a product turns "
                                  "its score into 0, which still gets weight."),
            (dict(masks=masks(floats="bool")),
             "the float mask was used as a bool mask (.bool(), != 0): every nonzero entry blocked. A float mask is "
             "added to the scores as it is: finite values favour (> 0) or penalise (< 0) a key, only -inf hides it."),
            (dict(masks=masks(floats="neginf")),
             "only the -inf entries of the float mask were used (isneginf, == -inf): its finite values must be "
             "added too. Add a float mask to the scores as it is, scores + mask."),
        ]
    if masked:
        variants.append((dict(masks=masks(drop=("kpm", "attn"))),
                         "your output is the one without any mask: the mask never reaches the scores (filled where "
                         "a score is 0 rather than where the mask is True? a branch that skips it? a result not "
                         "assigned back?)."))
    if kpm is not None and attn_mask is not None and attn_mask.dtype == torch.bool:
        variants.append((dict(masks=masks(invert="attn")),
                         "the attn_mask alone is read the other way round (the key_padding_mask you read right): in "
                         "nn.MultiheadAttention a bool attn_mask's True blocks the pair too. Fill with -inf where it "
                         "is True, not ~attn_mask."))
    if kpm is not None and attn_mask is not None:
        variants.append((dict(masks=masks(drop=("attn",))),
                         "your output is the one with the key_padding_mask alone: the attn_mask never reaches the "
                         "scores (a branch that masks with the padding mask again?). Each branch must use its own "
                         "mask."))
        variants.append((dict(masks=masks(drop=("kpm",))),
                         "your output is the one with the attn_mask alone: the key_padding_mask is dropped when both "
                         "are given. Combine them: a key is ignored if either mask ignores it."))
    if kpm is not None and Lq == Sk:  # the padding given the query axis: it blanks query rows, not keys
        variants.append((dict(masks=masks(kpm_axis="queries")),
                         "the key_padding_mask was applied to the queries, not the keys: (B, S) becomes (B, 1, 1, S), "
                         "one entry per key, so that every query ignores the pad keys; (B, 1, S, 1) blanks whole "
                         "query rows."))
    for options, message in variants:
        options.setdefault("masks", masks())
        options.setdefault("average", average)
        v_out, v_w = _reference(params, query, key, value, options.pop("masks"), h, **options)
        if _matches(out, v_out) and _matches(weights, v_w):
            raise ExerciseError(f"{setting}: {message} {diff}")
    if diff_out > ATOL and diff_w <= ATOL:
        raise ExerciseError(f"{setting}, the weights are right but the output is not {diff}: multiply the "
                            f"per-head weights by the values v (B, h, S, d), merge the heads, apply out_proj.")
    if diff_out <= ATOL and diff_w > ATOL:
        raise ExerciseError(f"{setting}, the output is right but the weights returned are not {diff}: return the "
                            f"softmax weights themselves, (B, h, L, S) per head, or their mean over the heads "
                            f"(dim=1) when average_attn_weights=True, before any dropout.")
    if diff_out <= 1e-4 * max(1.0, float(want_out.abs().max())) and diff_w <= 1e-4:
        raise ExerciseError(f"{setting}, your layer agrees with nn.MultiheadAttention only to float32 precision "
                            f"{diff}, though both run in float64: a step of yours computes in float32 (a tensor "
                            f"created without dtype=, .float(), a float32 constant). Create tensors with the "
                            f"inputs' dtype and device (dtype=scores.dtype).")
    raise ExerciseError(f"{setting}, your layer differs from nn.MultiheadAttention {diff}.")


def check_multihead(cls) -> None:
    """Check a multi-head attention class against ``nn.MultiheadAttention(batch_first=True)``.

    ``cls(embed_dim, num_heads)`` must have torch's parameter names and shapes (``in_proj_weight`` (3D, D),
    ``in_proj_bias`` (3D,), ``out_proj`` an ``nn.Linear``), and ``forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True)`` must return
    ``(output (B, L, D), weights)`` like torch's: (B, L, S) averaged, (B, h, L, S) per head, None without weights.
    Checked in float64 to 1e-10 with random non-zero weights and biases, in eval mode, for self- and
    cross-attention, bool and float masks (float with finite values too), outputs, weights and gradients; then
    scores in the thousands, queries with no key (torch's NaN or the course's zeros), and, if ``cls`` takes
    ``dropout=``, dropout off in eval mode.
    """
    gen = torch.Generator().manual_seed(7)
    B, L, S, D, h = 2, 4, 5, 6, 3
    mha = _torch_layer(D, h, gen).eval()
    params = {name: p.detach() for name, p in mha.named_parameters()}
    cases = _layer_cases(gen, B, L, S, D)
    name, query, key, value, kpm, attn_mask, average = cases[-1]  # cross-attention, for the gradients
    steps = {**_case_steps(cases),
             "gradients": _step(query, key, value, f"with {name}, for the gradients", loss="pair",
                                key_padding_mask=kpm),
             "need_weights=False": _step(query, key, value, "with need_weights=False", key_padding_mask=kpm,
                                         need_weights=False),
             "large scores": _large_logits_step(params, gen, B, L, D, h), **_empty_rows_steps(gen, B, D)}
    what = f"{cls.__name__}({D}, {h})"
    probed = Probed(cls, _building(mha, what, make=((D, h), {})), steps)  # the layer runs there, is judged here
    error = probed.setup["error"]
    if probed.setup["stage"] == "make":
        raise raised(error, what) from error
    if probed.setup["stage"] == "load" and isinstance(error, RuntimeError):
        have = probed.setup["params"]
        want = {name: tuple(p.shape) for name, p in mha.named_parameters()}
        raise ExerciseError(
            f"torch's weights do not load into your layer: it has parameters {have}, torch's layer has {want}. "
            f"Use the same names and shapes (out_proj is an nn.Linear(D, D)), biases included."
        ) from error
    if error is not None:
        raise error
    for case in cases:
        check_case(probed, mha, params, case, h)
    # Gradients, once forward agrees: of the inputs and of every parameter.
    grads = {"yours": probed.value("gradients", "backward"),
             "torch": _gradients(mha, query, key, key_padding_mask=kpm)}
    for what, want in grads["torch"].items():
        got = grads["yours"].get(what)
        if got is None:
            raise ExerciseError(f"the gradient of {what} is None with your layer: something in forward cuts the graph "
                                f"(.detach(), .data, or a tensor built with torch.tensor(...)).")
        if max_diff(got, want) > ATOL:
            raise ExerciseError(f"outputs agree but the gradients of {what} differ by {max_diff(got, want):.2g}: "
                                f"look for .detach(), .data or in-place writes in forward.")
    # need_weights=False
    out, weights = probed.value("need_weights=False", "your layer with need_weights=False")
    if weights is not None:
        raise ExerciseError("with need_weights=False torch returns None for the weights; yours returned a tensor.")
    if max_diff(out, mha(query, key, value, key_padding_mask=kpm, need_weights=False)[0]) > ATOL:
        raise ExerciseError("with need_weights=False your output changes: the flag should only drop the weights.")
    _check_large_logits(probed, mha, params, h)
    empty_rows = _check_empty_rows(probed, mha)
    _check_dropout(cls, mha, *cases[1][1:5:3], D, h)  # query and key_padding_mask of the self-attention case
    passed("outputs, weights and gradients = torch's, to 1e-10 in float64; scores in the thousands are safe."
           + empty_rows)
