"""Checkers for chapter 9, the course's layer inside a pretrained BERT encoder.

* :func:`check_course_to_bert` -- copy a course ``MultiheadAttention`` into BERT's attention block;
* :func:`check_previous_token_scores` -- how much each head attends to the previous token, over real queries;
* :func:`check_max_pool` -- the largest value of each feature over the real tokens of each sentence.

The checkers build small stand-ins of their own (no pretrained model is loaded): a BERT attention block is any
module with ``.self.query``, ``.self.key``, ``.self.value`` and ``.output.dense`` (``nn.Linear``) and
``.output.LayerNorm``, as in ``transformers``' ``BertAttention``. Masks here are the tokenizer's KEEP masks
(``attention_mask``: 1 = real token, 0 = pad).
"""
from __future__ import annotations

import math
import re

import torch
from torch import nn

from . import DTYPE, ExerciseError, close, describe_diff, passed, raised, require_shape, require_tensor, same_error


def _call(fn, *args, what: str, hints=()):
    """Run the learner's function; an exception becomes a message with the first hint whose test matches it (the
    mistakes of this chapter), else the course's usual hints."""
    try:
        return fn(*args)
    except ExerciseError:
        raise
    except Exception as err:  # the learner's code may raise anything; report it, do not hide it
        for test, hint in hints:
            if test(err):
                text = str(err).strip()
                raise ExerciseError(f"{what} raised {type(err).__name__}: {text.rstrip('.')}. {hint}") from err
        raise raised(err, what) from err


def _result(answer, name: str) -> torch.Tensor:
    """The learner's result as a CPU tensor; torch.max(dim)'s (values, indices) pair is named as such."""
    if not isinstance(answer, torch.Tensor) and hasattr(answer, "values") and hasattr(answer, "indices"):
        raise ExerciseError(
            f"your function returned {type(answer).__name__}(values, indices), the pair that torch.max(dim) gives: "
            f"return its .values (or use .amax(dim), which gives the values alone)."
        )
    return require_tensor(answer, name, "your function")


def _in_place(before: torch.Tensor, after: torch.Tensor, name: str) -> None:
    if not torch.equal(before, after):
        raise ExerciseError(
            f"your function changed its input {name} in place (a method ending in _, such as masked_fill_): "
            f"the caller's tensor is overwritten. Use the out-of-place method (masked_fill) and return a new tensor."
        )


def _dtype(got: torch.Tensor, want: torch.Tensor, what: str) -> None:
    if got.dtype != want.dtype:
        raise ExerciseError(
            f"{what} came back as {str(got.dtype).replace('torch.', '')} while the inputs are "
            f"{str(want.dtype).replace('torch.', '')}: compute in the inputs' dtype (no .float(), .half() or a "
            f"new tensor of another dtype), so that nothing is rounded away."
        )


# ----------------------------------------------------------------------------------------------------------
# Exercise: from the course's layer back into BERT


def _bert_attention(D: int) -> nn.Module:
    """A module shaped like BertAttention: .self.{query,key,value}, .output.{dense,LayerNorm}."""
    block, self_attention, output = nn.Module(), nn.Module(), nn.Module()
    for name in ("query", "key", "value"):
        setattr(self_attention, name, nn.Linear(D, D, dtype=DTYPE))
    output.dense = nn.Linear(D, D, dtype=DTYPE)
    output.LayerNorm = nn.LayerNorm(D, dtype=DTYPE)
    with torch.no_grad():  # a LayerNorm that is not at its defaults, so a reset shows
        output.LayerNorm.weight.uniform_(0.5, 1.5)
        output.LayerNorm.bias.normal_()
    block.add_module("self", self_attention)
    block.add_module("output", output)
    return block


def _bert_attention_output(block: nn.Module, x: torch.Tensor, keep: torch.Tensor, h: int) -> torch.Tensor:
    """BERT's computation up to its output dense (before dropout, residual and LayerNorm): (B, L, D)."""
    B, L, D = x.shape
    heads = lambda t: t.view(B, L, h, D // h).transpose(1, 2)  # noqa: E731  (B, h, L, d)
    q, k, v = (heads(getattr(block.self, name)(x)) for name in ("query", "key", "value"))
    scores = q @ k.transpose(-2, -1) / (D // h) ** 0.5  # (B, h, L, S)
    scores = scores.masked_fill(keep[:, None, None, :] == 0, float("-inf"))
    context = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, L, D)
    return block.output.dense(context)


_QKV = ("query", "key", "value")


def _row_order(got: torch.Tensor, want: torch.Tensor) -> list[int] | None:
    """The rows of ``want`` that the rows of ``got`` are, in order, if ``got`` is ``want`` with its rows permuted."""
    order = []
    for row in got:
        found = [j for j, other in enumerate(want) if close(row, other)]
        if not found:
            return None
        order.append(found[0])
    return order if sorted(order) == list(range(len(want))) else None


def _wrong_block(got: torch.Tensor, blocks, i: int, where: str, what: str, h: int) -> str | None:
    """What ``got`` is, if it is one of ``blocks`` (in_proj's thirds, weights or biases) with a classic mistake;
    None if it is ``blocks[i]``, the right one."""
    if close(got, blocks[i]):
        return None
    D = blocks[i].shape[0]
    if got.shape != blocks[i].shape:
        return (f"{where} has shape {tuple(got.shape)}, expected {tuple(blocks[i].shape)}: {what} is ({3 * D}, ...), "
                f"three blocks; take one third each, chunk(3) or rows {i}*D:{i + 1}*D.")
    for j, name in enumerate(_QKV):
        if got.dim() == 2 and close(got, blocks[j].T):
            return (f"{where} holds the {name} block TRANSPOSED. Both nn.Linear and in_proj_weight store weights "
                    f"as (out, in): copy the block as it is, without .T.")
    for j, name in enumerate(_QKV):
        if j != i and close(got, blocks[j]):
            return (f"{where} holds the {name} block of {what} (rows {j}*D:{j + 1}*D). {what} stacks "
                    f"query; key; value in that order: {_QKV[i]} is rows {i}*D:{i + 1}*D (chunk(3) gives them "
                    f"in that order).")
    ratio = (got * blocks[i]).sum() / (blocks[i] * blocks[i]).sum()
    if close(got, ratio * blocks[i]) and not close(ratio, torch.ones((), dtype=DTYPE)):
        d = D // h
        sqrt = {1 / math.sqrt(d): "1/sqrt(d) (d = D/h, the head size)",
                1 / math.sqrt(D): "1/sqrt(D) (D, the model width)",
                math.sqrt(d): "sqrt(d) (d = D/h, the head size)", math.sqrt(D): "sqrt(D) (D, the model width)"}
        names = [name for value, name in sqrt.items() if abs(value - float(ratio)) < 1e-9]
        return (f"{where} is the right block SCALED by {float(ratio):.3g}"
                f"{' = ' + names[0] if names else ''}. BERT divides the scores by sqrt(d) itself, as the course's "
                f"layer does: copy the block unscaled.")
    order = _row_order(got, blocks[i]) if got.dim() == 2 else None
    if order is not None:
        d = D // h
        heads = [order[k * d] // d for k in range(h)]
        if order == [heads[k] * d + r for k in range(h) for r in range(d)]:
            return (f"{where} holds the rows of the {_QKV[i]} block with its HEADS in another order: head blocks "
                    f"{heads}, expected {list(range(h))}. Keep the rows as they are: head k is rows k*d:(k+1)*d "
                    f"in both models.")
        return (f"{where} holds the rows of the {_QKV[i]} block PERMUTED across the heads (rows {order}): a "
                f"view(d, h) instead of view(h, d), or a transpose between views? Copy the block as it is.")
    return None


def _check_linear(linear: nn.Linear, before: list[torch.Tensor], W, b, i: int, h: int) -> None:
    """block.self.<name> against the i-th third of in_proj (weights W, biases b); ``before``: its weight and bias
    before the learner's function ran."""
    name = f"block.self.{_QKV[i]}"
    if linear.bias is None:
        raise ExerciseError(f"{name} has no bias (bias=None) after your function: BERT's query, key and value "
                            f"Linears have biases; copy the third of in_proj_bias into {name}.bias.")
    for got, was, blocks, what, part in ((linear.weight, before[0], W, "in_proj_weight", "weight"),
                                         (linear.bias, before[1], b, "in_proj_bias", "bias")):
        got = got.detach()
        if got.dtype != blocks[i].dtype:
            raise ExerciseError(f"{name}.{part} is {str(got.dtype).replace('torch.', '')}, the layer's "
                                f"{str(blocks[i].dtype).replace('torch.', '')}: copy_ into the block's own "
                                f"parameters (it keeps their dtype) rather than replacing them.")
        message = _wrong_block(got, blocks, i, f"{name}.{part}", what, h)
        if message:
            raise ExerciseError(message)
        if not close(got, blocks[i]):
            if torch.equal(got, was):
                raise ExerciseError(
                    f"{name}.{part} is UNCHANGED by your function: its copy did not happen. Copy the third "
                    f"of {what} into it with `{name}.{part}.copy_(...)` inside `with torch.no_grad():`.")
            raise ExerciseError(
                f"{name}.{part} is not rows {i}*D:{i + 1}*D of {what} (its entries and the expected ones "
                f"{describe_diff(got, blocks[i], 'the expected entries')}).")


_COPY_HINTS = (
    (lambda err: "leaf Variable that requires grad" in str(err),
     "Autograd forbids changing a parameter in place while it records: do the copies inside "
     "`with torch.no_grad():`."),
    (lambda err: "cannot assign" in str(err) and "parameter" in str(err),
     "A parameter's attribute takes an nn.Parameter, not a tensor: copy into the existing parameter, "
     "`linear.weight.copy_(...)` inside `with torch.no_grad():`."),
)


def check_course_to_bert(fn) -> None:
    """Check ``fn(mha, block)``: copy the parameters of a course ``MultiheadAttention`` into a BERT attention block.

    After the call ``block.self.query`` holds the first third of ``mha.in_proj_weight`` / ``in_proj_bias``,
    ``.key`` the second, ``.value`` the third, and ``block.output.dense`` holds ``mha.out_proj``; the LayerNorm
    is not part of the attention layer and stays as it was.
    """
    from ..multihead import MultiheadAttention

    D, h = 12, 3  # three heads of d = 4: a head order and a reversal differ
    torch.manual_seed(9)
    mha = MultiheadAttention(D, h, dtype=DTYPE)
    with torch.no_grad():  # non-zero biases, so a bias left behind shows
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    block = _bert_attention(D)
    before = {name: [p.detach().clone() for p in module.parameters()]
              for name, module in block.named_modules() if name}
    size_hint = (lambda err: "size" in str(err) and str(3 * D) in re.findall(r"\d+", str(err)),
                 f"in_proj_weight is (3D, D) = ({3 * D}, {D}), three blocks: take one third for each Linear, "
                 f"chunk(3) or rows i*D:(i+1)*D.")
    _call(fn, mha, block, what="your function", hints=_COPY_HINTS + (size_hint,))
    W, b = mha.in_proj_weight.detach().chunk(3), mha.in_proj_bias.detach().chunk(3)
    for i, name in enumerate(_QKV):
        linear = getattr(block.self, name)
        if not isinstance(linear, nn.Linear):
            raise ExerciseError(f"block.self.{name} is a {type(linear).__name__} after your function; keep it an "
                                f"nn.Linear and copy into its .weight and .bias.")
    for i, name in enumerate(_QKV):
        _check_linear(getattr(block.self, name), before[f"self.{name}"], W, b, i, h)
    dense = block.output.dense
    out = mha.out_proj
    for part in ("weight", "bias"):
        got, want = getattr(dense, part), getattr(out, part)
        if got is None or not close(got.detach(), want.detach()):
            transposed = part == "weight" and got is not None and close(got.detach(), want.detach().T)
            raise ExerciseError(
                f"query, key and value are right, but block.output.dense.{part} is not mha.out_proj.{part}"
                + (" (it holds it TRANSPOSED: both store (out, in), copy without .T)." if transposed else ".")
                + " BERT applies the output projection in BertSelfOutput.dense, before the residual and the "
                "LayerNorm: copy out_proj's weight and bias there.")
    if not all(torch.equal(p.detach(), q) for p, q in zip(block.output.LayerNorm.parameters(),
                                                          before["output.LayerNorm"])):
        raise ExerciseError(
            "your function changed block.output.LayerNorm. The course's layer has no LayerNorm: it ends at "
            "out_proj = BertSelfOutput.dense; the LayerNorm of (dense output + input) stays BERT's own."
        )
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(2, 5, D, generator=gen, dtype=DTYPE)  # (B, L, D)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])  # (B, S)
    with torch.no_grad():
        want, _ = mha(x, x, x, key_padding_mask=keep == 0)
        got_out = _bert_attention_output(block, x, keep, h)
    assert close(got_out, want, 1e-10), "the parameters agree one by one, so the outputs must"
    passed("the BERT block now computes exactly what the course's layer computes (to 1e-10 in float64, with "
           "padding); its LayerNorm is untouched.")


# ----------------------------------------------------------------------------------------------------------
# Exercise: the previous-token head


def _previous_token_scores(weights, keep, offset=-1, queries="real", first_query=False, reduce="mean",
                           denominator="same"):
    """Reference and its variants: mean weight of query i on key i + offset over real queries (B, h, L, S) -> (h,).

    queries: "real" (keep == 1), "all", "pads" (keep == 0) or "keys" (keep shifted by one: key i - 1 real);
    reduce: "mean", "sum" or "sentences" (each sentence's mean, then their mean); denominator "all": the real
    queries summed, divided by the count of every query i >= 1.
    """
    B, h, L, S = weights.shape
    weights = weights.double()
    rows = torch.arange(L)[:, None]  # (L, 1)
    on_key = (torch.arange(S)[None, :] == rows + offset).to(weights.dtype)  # (L, S)
    per_query = (weights * on_key).sum(-1)  # (B, h, L)
    real = keep.bool()
    chosen = {"real": real, "all": torch.ones(B, L, dtype=torch.bool), "pads": ~real,
              "keys": torch.cat([real[:, :1], real[:, :-1]], 1)}[queries]  # (B, L)
    if not first_query:
        chosen = chosen & (rows.T >= 1)  # query 0 has no previous token
    summed = per_query * chosen[:, None, :]  # (B, h, L)
    if reduce == "sum":
        return summed.sum((0, 2))
    if reduce == "sentences":
        return (summed.sum(2) / chosen.sum(1, keepdim=True)).mean(0)
    count = B * (L - 1) if denominator == "all" else chosen.sum()
    return summed.sum((0, 2)) / count


def _planted_weights() -> tuple[torch.Tensor, torch.Tensor]:
    """Weights (B, h, L, S) of 4 heads with the keep mask (B, S): head 2 previous token, head 1 next token,
    head 3 previous token only at the pad queries, head 0 spread out."""
    gen = torch.Generator().manual_seed(5)
    keep = torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0]])
    B, S, h = keep.shape[0], keep.shape[1], 4
    scores = torch.randn(B, h, S, S, generator=gen, dtype=DTYPE)
    i = torch.arange(S)
    scores[:, 1, i[:-1], i[1:]] += 6.0  # next token
    scores[:, 2, i[1:], i[:-1]] += 6.0  # previous token
    pads = (keep == 0)  # (B, S)
    previous = torch.zeros(B, S, S, dtype=torch.bool)
    previous[:, i[1:], i[:-1]] = True
    scores[:, 3] += 12.0 * (previous & pads[:, :, None])  # only the pad queries look back
    scores = scores.masked_fill(pads[:, None, None, :], float("-inf"))
    return scores.softmax(-1), keep


_OFFSETS = {
    1: "measures the NEXT token (key i + 1, offset +1). The previous token of query i is key i - 1: "
       "diagonal(offset=-1) of the (L, S) weights, or weights[..., i, i - 1].",
    0: "measures each query's weight on ITSELF (the main diagonal, offset 0). The previous token is key i - 1: "
       "diagonal(offset=-1).",
    -2: "measures the token TWO places back (key i - 2, offset -2). The previous token is key i - 1: "
        "diagonal(offset=-1).",
}


def _offset_scores(weights, keep, offset):
    """The mean of diagonal(offset) under each way of lining a real-token mask up with it: (h,) each."""
    diagonal = weights.double().diagonal(offset=offset, dim1=-2, dim2=-1)  # (B, h, n)
    n = diagonal.shape[-1]
    for mask in (keep[:, -n:], keep[:, :n], torch.ones_like(keep[:, :n])):
        mask = mask.to(diagonal.dtype)[:, None, :]  # (B, 1, n)
        yield (diagonal * mask).sum((0, 2)) / mask.sum()
    yield _previous_token_scores(weights, keep, offset=offset)


_PREVIOUS_MISTAKES = [
    (dict(queries="all"), "averages over the pad queries too. Pads are not words: keep the queries with "
                          "keep == 1 (and i >= 1), so that their weights do not count."),
    (dict(queries="pads"), "counts ONLY the pad queries: the keep mask is 1 for real tokens, so the real "
                           "queries are where keep == 1 (you took keep == 0)."),
    (dict(queries="keys"), "selects the queries with the keep mask shifted by one, keep[:, :-1] (whether key "
                           "i - 1 is real), so each sentence's first pad query counts. Query i of "
                           "diagonal(offset=-1) is real where keep[:, 1:] == 1."),
    (dict(first_query=True), "counts query 0 too, which has no previous token: average over the real "
                             "queries i >= 1 only."),
    (dict(reduce="sum"), "adds the weights up instead of averaging: divide by the number of real queries "
                         "i >= 1 in the batch, so that a perfect previous-token head scores 1."),
    (dict(reduce="sentences"), "averages each sentence first, then the sentences: a short sentence weighs as "
                               "much as a long one. Average once over every real query of the batch: the sum "
                               "over sentences and queries, divided by their count."),
    (dict(denominator="all"), "sums over the real queries but divides by the count of ALL queries i >= 1, pads "
                              "included: divide by the number of real queries, keep[:, 1:].sum()."),
]


def check_previous_token_scores(fn) -> None:
    """Check ``fn(weights, keep) -> scores``: for per-head weights (B, h, L, S) of one layer and the tokenizer's keep
    mask (B, S), the (h,) mean weight that a real query i >= 1 gives to key i - 1, over every such query of the
    batch (query 0 has no previous token; pad queries are not words).
    """
    weights, keep = _planted_weights()
    B, h, L, _ = weights.shape
    want = _previous_token_scores(weights, keep)
    args = weights.clone(), keep.clone()
    diagonal = weights.diagonal(offset=-1, dim1=-2, dim2=-1)  # (B, h, L - 1)
    hints = (
        (lambda err: same_error(err, _failure(lambda: diagonal * keep[:, 1:])),
         f"keep is (B, S) and the diagonal (B, h, L - 1) = {tuple(diagonal.shape)}: the mask lines up from the "
         f"right, its batch axis against the heads. Give it the heads axis: keep[:, None, 1:]."),
    )
    got = _result(_call(fn, *args, what="your function", hints=hints), f"weights {tuple(weights.shape)}")
    _in_place(weights, args[0], "weights")
    _in_place(keep, args[1], "keep")
    if got.dim() == 0:
        raise ExerciseError(
            f"your function returned one number ({got.item():.3g}); return one score per head, shape (h,) = "
            f"({h},), and take .argmax() of it afterwards."
        )
    kept = {(B,): "sentence", (L - 1,): "query", (L,): "query"}
    if tuple(got.shape) in kept:
        raise ExerciseError(
            f"your scores have shape {tuple(got.shape)}, one per {kept[tuple(got.shape)]}: you averaged over "
            f"the HEADS axis (dim 1 of (B, h, L, S)). Keep it, average over the batch and the queries: (h,) = ({h},)."
        )
    if tuple(got.shape) in ((B, h), (h, L - 1), (B, h, L - 1)):
        raise ExerciseError(
            f"your scores have shape {tuple(got.shape)}: an axis is left to average. Average over the batch "
            f"(dim 0) and the queries as well, keeping only the heads: (h,) = ({h},)."
        )
    require_shape(got, (h,), "your result (the scores)", "(h,)",
                  "Average over the batch and the queries: keep the heads axis. (diagonal() takes the diagonal of "
                  "the FIRST two axes, batch and heads, unless told otherwise: diagonal(offset=-1, dim1=-2, "
                  "dim2=-1).)")
    _dtype(got, want, "your scores")
    if close(got, want, 1e-8):
        passed(f"one score per head; in the checker's planted weights the previous-token head is head "
               f"{int(want.argmax())} (score {float(want.max()):.2f}).")
        return
    for variant, message in _PREVIOUS_MISTAKES:
        if close(got, _previous_token_scores(weights, keep, **variant), 1e-8):
            raise ExerciseError(f"your function {message}")
    for offset, message in _OFFSETS.items():
        if any(close(got, scores, 1e-8) for scores in _offset_scores(weights, keep, offset)):
            raise ExerciseError(f"your function {message}")
    raise ExerciseError(
        f"your scores {describe_diff(got, want, 'the expected')}: expected {[round(x, 3) for x in want.tolist()]}, "
        f"the mean of weights[b, head, i, i - 1] over every real query i >= 1 of every sentence b."
    )


# ----------------------------------------------------------------------------------------------------------
# Exercise: max pooling over real tokens

_LOW, _HIGH = -1e30, 1e6  # real values this low, pads this high: a finite fill or penalty shows


def _pool_data() -> tuple[torch.Tensor, torch.Tensor]:
    """Hidden states (B, L, D) and keep mask (B, L) on which every classic mistake of max pooling shows.

    Real values are negative (so 0 wins over them) but one; feature 4 of the two short sentences is about -1e30 at
    every real token (so a finite fill, -1e4 or -1e9, wins over it); pads hold 1e6 to 2e6 (so a penalty -1e4 added
    to them leaves them the largest, and -1e9 beats -1e30), a value no real token has.
    """
    gen = torch.Generator().manual_seed(7)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0], [1, 1, 0, 0]])
    B, L, D = keep.shape[0], keep.shape[1], 5
    hidden = -1.0 - torch.rand(B, L, D, generator=gen, dtype=DTYPE)  # (B, L, D) all negative ...
    hidden[0, 1, 0] = 2.0  # ... but one feature of the full sentence
    hidden[1:, :, 4] = _LOW * (1 + torch.rand(B - 1, L, generator=gen, dtype=DTYPE))
    pads = keep[..., None] == 0  # (B, L, 1)
    hidden = torch.where(pads, _HIGH * (1 + torch.rand(B, L, D, generator=gen, dtype=DTYPE)), hidden)
    return hidden, keep


def _pool(hidden, keep, fill=float("-inf"), where="pads", how="fill", reduce="max", lengths=0):
    """Reference and its variants: (B, L, D), (B, L) -> (B, D)."""
    keep = keep.clone()
    if lengths:  # one token more or less than the real ones, as a slice :n + lengths does
        n = keep.sum(1)
        keep = (torch.arange(keep.shape[1])[None, :] < (n + lengths)[:, None]).long()
    pads = (keep == 0) if where == "pads" else (keep == 1)
    pads = pads[..., None]  # (B, L, 1)
    if reduce == "mean":
        return (hidden * ~pads).sum(1) / (~pads).sum(1)
    if how == "add":
        return (hidden + fill * pads).amax(1)
    if how == "none":
        return hidden.amax(1)
    return hidden.masked_fill(pads, fill).amax(1)


_POOL_MISTAKES = [
    (dict(how="none"), "your maximum includes the pads: the short sentences get the pads' values (1e6 to 2e6 "
                       "here). Fill the pads with -inf before the maximum: "
                       "hidden.masked_fill(keep[..., None] == 0, float('-inf'))."),
    (dict(fill=0.0), "the pads became 0 (you multiplied by the keep mask, or filled with 0), and 0 beats every "
                     "negative feature, so the short sentences' maxima are 0. Multiplying works for a sum, not a "
                     "maximum: fill the pads with -inf."),
    (dict(where="real"), "your mask is the wrong way round: you kept the pads and dropped the real tokens (the "
                         "tokenizer's mask is 1 for real tokens). Fill with -inf where keep == 0."),
    (dict(reduce="mean"), "you took the MEAN over the real tokens, which is the model card's pooling: this "
                          "exercise asks for the maximum, .amax(1) after the pads are filled with -inf."),
    (dict(lengths=-1), "your maximum leaves out each sentence's LAST real token: one position short "
                       "(hidden[b, :n - 1] or a mask shifted by one). Sentence b has n = keep[b].sum() real "
                       "tokens, positions 0 to n - 1."),
    (dict(lengths=1), "your maximum takes in each short sentence's FIRST PAD too: one position too many "
                      "(hidden[b, :n + 1] or a mask shifted by one). Sentence b has n = keep[b].sum() real tokens, "
                      "positions 0 to n - 1."),
]


def _number(x) -> str:
    """-1e4, not -1e+04: as a learner writes it."""
    return f"{float(x):.3g}".replace("e+0", "e").replace("e+", "e")


def _finite(got: torch.Tensor, hidden: torch.Tensor, keep: torch.Tensor, want: torch.Tensor) -> str | None:
    """The message for a finite fill (the same value wherever it wins) or a finite penalty added to the pads."""
    wrong = ~torch.isclose(got, want, rtol=1e-12, atol=1e-8)  # (B, D)
    values = got[wrong]
    if values.numel() and torch.all(values == values[0]) and torch.isfinite(values[0]):
        return (f"your maximum is {_number(values[0])} wherever the real values are all below it: you filled the "
                f"pads with a FINITE value, {_number(values[0])}. Pads must never count, whatever the real "
                f"values: fill with float('-inf'), the value no real one falls below.")
    pads = (keep == 0)[..., None]
    for penalty in (1e4, 1e9, 1e30):  # larger ones sink the pads below -1e30: right on these inputs
        if torch.allclose(got, (hidden - penalty * pads).amax(1), rtol=1e-12, atol=1e-8):
            return (f"you ADDED a finite penalty, {_number(-penalty)}, to the pads: a pad whose hidden state is "
                    f"larger still wins (here they hold 1e6 to 2e6). Pads must never count, whatever they hold: "
                    f"fill them with float('-inf') (masked_fill or torch.where), do not add to them.")
    return None


def check_max_pool(fn) -> None:
    """Check ``fn(hidden, keep) -> pooled``: hidden states (B, L, D) and the keep mask (B, L) give (B, D), the
    largest value of each feature over the REAL tokens of each sentence (pads never count)."""
    hidden, keep = _pool_data()
    B, L, D = hidden.shape
    want = _pool(hidden, keep)  # (B, D)
    args = hidden.clone(), keep.clone()
    wrong_axis = lambda err: same_error(err, _broadcast(hidden, keep))  # noqa: E731
    hints = (
        (lambda err: "masked_fill" in str(err) and "bool" in str(err),
         "keep is the tokenizer's 0/1 INTEGER mask, not a bool one: the pads are keep == 0 (a bool tensor); "
         "~ on integers flips bits, it does not swap 0 and 1."),
        (lambda err: isinstance(err, IndexError),
         "Sentence b has n = keep[b].sum() real tokens, at positions 0 .. n - 1: position n is a pad (past "
         "the end for a full sentence). Slice hidden[b, :n], or mask the pads, rather than indexing position n."),
        (wrong_axis, f"The mask must line up with the tokens axis of (B, L, D): keep[..., None] is (B, L, 1); "
                     f"keep[:, None] is (B, 1, L) and sets L = {L} against D = {D}."),
    )
    got = _result(_call(fn, *args, what="your function", hints=hints), f"hidden {tuple(hidden.shape)}")
    _in_place(hidden, args[0], "hidden")
    _in_place(keep, args[1], "keep")
    if tuple(got.shape) in ((B, L), (L, D)):
        raise ExerciseError(
            f"your result has shape {tuple(got.shape)}: the maximum was taken over the wrong axis. Pool over the "
            f"tokens, dim=1 of (B, L, D), to get (B, D) = {(B, D)}."
        )
    if tuple(got.shape) == (D, B):
        raise ExerciseError(f"your result has shape {(D, B)}, (D, B): the pooled values TRANSPOSED. Return "
                            f"(B, D) = {(B, D)}, one row per sentence (no .T).")
    require_shape(got, (B, D), "your result", "(B, D)")
    if not got.is_floating_point():
        raise ExerciseError(f"your result is {str(got.dtype).replace('torch.', '')}: positions (indices, from "
                            f"argmax or max(dim).indices), not values. Return the values: .amax(1).")
    _dtype(got, want, "your result")
    if close(got, want):
        passed("the maximum over the real tokens only; pads (here 1e6 to 2e6) never win, and real values as low "
               "as -1e30 still do.")
        return
    for variant, message in _POOL_MISTAKES:
        if close(got, _pool(hidden, keep, **variant)):
            raise ExerciseError(message)
    message = _finite(got, hidden, keep, want)
    if message:
        raise ExerciseError(message)
    raise ExerciseError(f"your maxima and the expected ones {describe_diff(got, want, 'the expected values')}; "
                        f"expected, per sentence and feature, the largest value over the tokens with keep == 1.")


def _failure(run):
    """The exception ``run()`` raises (the reference with one mistake), to compare with the learner's."""
    try:
        run()
    except Exception as err:  # noqa: BLE001
        return err
    return None


def _broadcast(hidden, keep):
    """The mask on the wrong axis, (B, 1, L): the error it raises names that mistake."""
    try:
        return hidden.masked_fill(keep[:, None] == 0, float("-inf"))
    except RuntimeError as err:
        return err
