"""Checker for chapter 7, the bug clinic: :func:`check_multihead_attention`, a whole layer put through a battery.

Where chapter 6's :func:`~attention_course.exercises.ch06.check_multihead` checks the layer a learner writes in
that chapter, this one takes any implementation with the interface of ``attention_course.MultiheadAttention`` (a
factory ``factory(embed_dim, num_heads, bias)``; torch's parameter names or a ``from_torch`` constructor) and runs
every check the chapter's bugs fail, in order, naming the first that fails. A difference is diagnosed by rerunning
the reference with each classic mistake applied (chapter 6's list), never by reading the learner's code. As in
chapter 6, the layer runs in :func:`~attention_course.exercises.ch06.probe_layer` alone (in grading, in the process
that runs the learner's code, on the ``boundary.Layer`` the factory returned there), and the checker judges the
plain data it sends back.
"""
from __future__ import annotations

import copy

import torch
from torch import nn

from .. import boundary
from . import ATOL, DTYPE, ExerciseError, call, max_diff, passed, raised
from . import ch06
from .ch06 import (
    Probed, _building, _case_steps, _check_empty_rows, _check_large_logits, _dropout_message, _empty_rows_steps,
    _forward, _gradients, _large_logits_step, _layer_cases, _step, _torch_layer, check_case,
)

TIMEOUT_S = 30.0  # one call of a learner's layer on these tiny inputs takes milliseconds


def _in_time(fn, what: str):
    """``fn()``, or an ExerciseError after TIMEOUT_S (see ch06._in_time)."""
    return ch06._in_time(fn, what, TIMEOUT_S)


def _made(factory, D: int, h: int, bias: bool):
    """The learner's layer from ``factory`` (in grading a ``boundary.Layer``: the layer stays where it was made)."""
    what = f"factory({D}, {h}, bias={bias})"
    layer = _in_time(lambda: call(factory, D, h, bias, what=what), what)
    if not isinstance(layer, (nn.Module, boundary.Layer)):
        raise ExerciseError(f"{what} returned {type(layer).__name__}; it must return an nn.Module.")
    return layer


def _probe(layer, mha: nn.MultiheadAttention, what: str, steps: dict) -> Probed:
    """``steps`` run on ``layer`` holding ``mha``'s weights (by parameter names, else through ``from_torch``); a
    layer that does not take them is reported."""
    probed = Probed(layer, _building(mha, what, from_torch=True), steps, TIMEOUT_S)
    setup, error = probed.setup, probed.setup["error"]
    if isinstance(error, ExerciseError):
        raise error
    if setup["stage"] == "load" and isinstance(error, RuntimeError) and not setup["from_torch"]:
        have = sorted(setup["params"])
        want = sorted(name for name, _ in mha.named_parameters())
        raise ExerciseError(
            f"torch's weights do not load into {what}: it has parameters {have}, nn.MultiheadAttention has "
            f"{want}. Use torch's names and shapes, or give the class a from_torch(mha) classmethod."
        ) from error
    if setup["stage"] == "from_torch":
        raise raised(error, f"{setup['type']}.from_torch") from error
    if error is not None:
        raise error
    return probed


def _bad_shapes(probed: Probed, tries: dict) -> str | None:
    """A wrong shape must raise, not broadcast: a (B, L) padding mask where (B, S) goes, a query of width D + 1."""
    for step, name in tries.items():
        if "error" in probed.step(step):
            if isinstance(probed.step(step)["error"], ExerciseError):
                raise probed.step(step)["error"]
            continue  # raised: right
        return (f"your layer accepted {name} without an error. A shape that does not fit must raise (as torch "
                f"does): a silently broadcast mask masks the wrong keys.")
    return None


def _dtype_hint(fn, dtype: str):
    """``fn()``; an exception that names dtypes gets the usual cause: a tensor created in forward as float32."""
    try:
        return fn()
    except ExerciseError as err:
        text = str(err)
        if "raised" in text and ("dtype" in text or "Half" in text or "Float" in text):
            raise ExerciseError(f"{text.rstrip('.')}. In {dtype} that is most often a tensor created inside forward "
                                f"without dtype= (float32 by default) meeting {dtype} ones: create it with the "
                                f"inputs' dtype (dtype=scores.dtype), or as a Python float.") from err
        raise


def check_multihead_attention(factory) -> None:
    """Check ``factory(embed_dim, num_heads, bias)`` -> a multi-head attention layer against
    ``nn.MultiheadAttention(batch_first=True)``, with every weight and bias random and non-zero.

    The layer has the interface of ``attention_course.MultiheadAttention``: ``forward(query, key, value,
    key_padding_mask=None, need_weights=True, attn_mask=None, average_attn_weights=True)`` returning ``(output,
    weights)``, and torch's parameter names or a ``from_torch`` classmethod. Checks, in order: the layer builds and
    takes torch's weights; 10 features in 4 heads are refused; self- and cross-attention with no mask, bool
    masks, float masks (0 / -inf, and finite values), a causal and a per-head (B*h, L, S) mask, per-head weights;
    nothing printed or warned; need_weights=False; gradients of inputs and parameters; two identical calls;
    training mode; bias=False; scores in the thousands; queries with no key; wrong shapes raise; float32; float16.
    A check that raises is named by its number and name, a crash of the layer included.
    Raises ``ExerciseError`` naming the first failing check; prints "all N checks passed" otherwise.
    """
    gen = torch.Generator().manual_seed(13)
    B, L, S, D, h = 2, 4, 5, 6, 3
    mha = _torch_layer(D, h, gen).eval()
    params = {name: p.detach() for name, p in mha.named_parameters()}
    cases = _layer_cases(gen, B, L, S, D)
    x, memory, kpm_self, kpm_cross = cases[0][1], cases[-1][2], cases[1][4], cases[-1][4]
    per_head = torch.rand(B * h, L, L, generator=gen) < 0.3
    per_head[..., 0] = False  # every query keeps a key
    cases.append(("a per-head (B*h, L, S) bool attn_mask", x, x, x, None, per_head, False))
    plain = nn.MultiheadAttention(D, h, bias=False, batch_first=True, dtype=DTYPE)
    with torch.no_grad():
        for p in plain.parameters():
            p.copy_(0.5 * torch.randn(p.shape, generator=gen, dtype=DTYPE))
    tries = {"wrong padding": f"a key_padding_mask of shape (B, L) = {(B, L)} for keys of length S = {S}",
             "wrong width": f"a query of width D + 1 = {D + 1}"}
    # every call of the learner's layer, in the order of the checks; its warnings are the business of "quiet" alone
    steps = {**_case_steps(cases),
             "quiet": _step(x, x, x, "with a padding mask", warn="record", key_padding_mask=kpm_self),
             "need_weights=False": _step(x, memory, memory, "with need_weights=False", key_padding_mask=kpm_cross,
                                         need_weights=False),
             "gradients": _step(x, memory, memory, "with cross-attention and padding, for the gradients",
                                loss="pair", key_padding_mask=kpm_cross),
             "twice": _step(x, x, x, "in eval mode", key_padding_mask=kpm_self),
             "twice again": _step(x, x, x, "in eval mode", key_padding_mask=kpm_self),
             "training mode": _step(x, x, x, "in training mode", mode="train", key_padding_mask=kpm_self),
             "large scores": _large_logits_step(params, gen, B, L, D, h), **_empty_rows_steps(gen, B, D),
             "wrong padding": _step(x, memory, memory, f"with {tries['wrong padding']}",
                                    key_padding_mask=kpm_cross[:, :L]),
             "wrong width": _step(torch.cat([x, x[..., :1]], -1), memory, memory, f"with {tries['wrong width']}"),
             "float32": _step(x.float(), memory.float(), memory.float(), "in float32", dtype=torch.float32,
                              key_padding_mask=kpm_cross),
             "float16": _step(x.half(), memory.half(), memory.half(), "in float16", dtype=torch.float16,
                              key_padding_mask=kpm_cross)}
    for step in steps.values():
        step["warn"] = step["warn"] or "ignore"
    done = []

    def check(name, run):
        try:
            run()
        except ExerciseError as err:
            raise ExerciseError(f"check {len(done) + 1} ({name}) failed: {err}") from err
        done.append(name)

    probed = None

    def build():
        nonlocal probed
        probed = _probe(_made(factory, D, h, True), mha, f"factory({D}, {h}, bias=True)", steps)

    check("build the layer and load torch's weights", build)

    def indivisible():
        what = "factory(10, 4, bias=True)"
        try:
            _in_time(lambda: factory(10, 4, True), what)
        except ExerciseError:
            raise
        except Exception:
            return  # refused: right
        raise ExerciseError(
            f"{what} built a layer, but 10 features do not split into 4 heads. torch refuses it in the constructor "
            f"(embed_dim must be divisible by num_heads); a layer that accepts it fails at its first call with a "
            f"view error about shapes, or runs with heads of 10 // 4 = 2 features. Check embed_dim % num_heads == 0 "
            f"in __init__ and raise a ValueError that says so.")

    check("sizes that do not split into heads are refused", indivisible)
    for case in cases:
        check(case[0], lambda case=case: check_case(probed, mha, params, case, h))

    def quiet():
        _forward(probed, "quiet")
        printed, caught = probed.step("quiet")["printed"], probed.step("quiet")["warnings"]
        if printed:
            raise ExerciseError(f"your layer prints at every call ({printed.strip()[:60]!r}): a debug "
                                f"print left in forward. Remove it, or use logging at debug level.")
        if caught:
            raise ExerciseError(f"your layer warned when called ({caught[0][0]}: {caught[0][1][:90]}), recorded "
                                f"under warnings.simplefilter(\"always\"), which shows it at every call; Python's "
                                f"default filter shows it once per line of code, at the first call only. A warning "
                                f"from forward buries the ones that matter; a common cause is a size kept as a "
                                f"tensor: use an int and math.sqrt.")

    check("no output and no warnings", quiet)

    def no_weights():
        out, weights = probed.value("need_weights=False", "your layer with need_weights=False")
        if weights is not None:
            raise ExerciseError("with need_weights=False torch returns None for the weights; yours returned them.")
        want = mha(x, memory, memory, key_padding_mask=kpm_cross, need_weights=False)[0]
        if max_diff(out, want) > ATOL:
            raise ExerciseError(f"with need_weights=False the output differs by {max_diff(out, want):.2g}.")

    check("need_weights=False", no_weights)

    def gradients():
        grads = {"yours": probed.value("gradients", "backward"),
                 "torch": _gradients(mha, x, memory, key_padding_mask=kpm_cross)}
        mine = grads["yours"]
        named = {n for n in grads["torch"] if n not in ("query", "key/value")}
        # a layer built by from_torch may keep torch's parameters under a prefix (inner.in_proj_weight); one with
        # names of its own has only its input gradients compared
        found = {n: [k for k in mine if k == n or k.endswith("." + n)] for n in named}
        for what, want in grads["torch"].items():
            if what in named and len(found[what]) != 1:
                if any(found.values()):
                    raise ExerciseError(f"your layer has no parameter named like torch's {what}.")
                continue
            got = mine.get(found[what][0] if what in named else what)
            if got is None or max_diff(got, want) > ATOL:
                size = "missing" if got is None else f"off by {max_diff(got, want):.2g}"
                raise ExerciseError(f"the gradient of {what} is {size} (cross-attention with padding): look for "
                                    f".detach(), .data, in-place writes, or a tensor rebuilt with torch.tensor().")

    check("gradients of the inputs and of every parameter", lambda: call(gradients, what="backward"))

    def twice():
        first, _ = _forward(probed, "twice")
        second, _ = _forward(probed, "twice again")
        if max_diff(first, second) > 0:
            raise ExerciseError(_dropout_message("in eval mode", max_diff(first, second))
                                + " (Layers created inside forward also change at every call.)")

    check("two identical calls give the same output", twice)

    def training_mode():
        out, _ = _forward(probed, "training mode")
        want, _ = mha(x, x, x, key_padding_mask=kpm_self)
        if max_diff(out, want) > ATOL:
            raise ExerciseError(f"in training mode, with the default dropout of 0, your output differs by "
                                f"{max_diff(out, want):.2g}: torch's default dropout is 0.0, so train and eval "
                                f"agree unless you ask for dropout.")

    check("training mode with dropout 0", training_mode)

    def without_bias():
        layer = _made(factory, D, h, False)
        built = _probe(layer, plain, f"factory({D}, {h}, bias=False)", {"bias=False": _step(
            x, memory, memory, "built with bias=False", warn="ignore", key_padding_mask=kpm_cross)})
        out, _ = _forward(built, "bias=False")
        want, _ = plain.eval()(x, memory, memory, key_padding_mask=kpm_cross)
        if max_diff(out, want) > ATOL:
            raise ExerciseError(f"built with bias=False your output differs by {max_diff(out, want):.2g}: without "
                                f"biases every projection is x @ W.T alone.")

    check("bias=False", without_bias)
    check("scores in the thousands", lambda: _check_large_logits(probed, mha, params, h))
    notes = []
    check("queries with no key", lambda: notes.append(_check_empty_rows(probed, mha)))

    def shapes():
        problem = _bad_shapes(probed, tries)
        if problem:
            raise ExerciseError(problem)

    check("wrong shapes raise", shapes)

    def float32():
        out, _ = _forward(probed, "float32")
        mha32 = mha.float()
        try:
            want, _ = mha32(x.float(), memory.float(), memory.float(), key_padding_mask=kpm_cross)
        finally:
            mha.double()
        if max_diff(out, want) > 1e-4:
            raise ExerciseError(f"in float32 your output differs by {max_diff(out, want):.2g} (torch's agrees with "
                                f"float64 to about 1e-6): look for a constant or a tensor built in float64.")

    check("float32", lambda: _dtype_hint(float32, "float32"))

    def float16():
        """The layer in float16 keeps its dtype and is as close to float64's answer as torch's float16 layer."""
        mha16 = mha.half()  # the last check: it stays in float16 afterwards
        x16, memory16 = x.half(), memory.half()
        out, _ = _forward(probed, "float16")
        with torch.no_grad():
            torch16, _ = mha16(x16, memory16, memory16, key_padding_mask=kpm_cross)
            exact, _ = copy.deepcopy(mha16).double()(x16.double(), memory16.double(), memory16.double(),
                                                      key_padding_mask=kpm_cross)
        if out.dtype != torch.float16:
            raise ExerciseError(f"given float16 weights and inputs your layer returns {out.dtype}: a tensor "
                                f"created inside forward without dtype= (float32 by default) promotes the result. "
                                f"Create tensors with the inputs' dtype (dtype=scores.dtype).")
        tolerance = max(4 * max_diff(torch16, exact), 1e-2)
        if max_diff(out, exact) > tolerance:
            raise ExerciseError(f"in float16 your output is off by {max_diff(out, exact):.2g} (torch's float16 "
                                f"layer by {max_diff(torch16, exact):.2g}): a constant out of float16's range "
                                f"(above 65504, such as -1e9), or a sum that overflows before the scale?")

    check("float16", lambda: _dtype_hint(float16, "float16"))
    passed(f"all {len(done)} checks passed: outputs, weights and gradients = torch's to 1e-10 in float64, masks "
           f"of every kind, both layouts of weights, train and eval, no bias, large scores, bad shapes, float32 and "
           f"float16."
           + (notes[0] if notes else ""))
