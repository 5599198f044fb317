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

import torch
from torch import nn

from . import DTYPE, ExerciseError, call, close, describe_diff, passed, require_shape, require_tensor

# ----------------------------------------------------------------------------------------------------------
# Exercise: from the course's layer back into BERT


def _bert_attention(D: int) -> nn.Module:
    """A module shaped like BertAttention: .self.{query,key,value}, .output.{dense,LayerNorm}."""
    block, self_attention, output = nn.Module(), nn.Module(), nn.Module()
    for name in ("query", "key", "value"):
        setattr(self_attention, name, nn.Linear(D, D, dtype=DTYPE))
    output.dense = nn.Linear(D, D, dtype=DTYPE)
    output.LayerNorm = nn.LayerNorm(D, dtype=DTYPE)
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


def check_course_to_bert(fn) -> None:
    """Check ``fn(mha, block)``: copy the parameters of a course ``MultiheadAttention`` into a BERT attention block.

    After the call ``block.self.query`` holds the first third of ``mha.in_proj_weight`` / ``in_proj_bias``,
    ``.key`` the second, ``.value`` the third, and ``block.output.dense`` holds ``mha.out_proj``; the LayerNorm
    is not part of the attention layer and stays as it was.
    """
    from ..multihead import MultiheadAttention

    D, h = 8, 2
    torch.manual_seed(9)
    mha = MultiheadAttention(D, h, dtype=DTYPE)
    with torch.no_grad():  # non-zero biases, so a bias left behind shows
        mha.in_proj_bias.normal_()
        mha.out_proj.bias.normal_()
    block = _bert_attention(D)
    norm_before = [p.detach().clone() for p in block.output.LayerNorm.parameters()]
    call(fn, mha, block, what="your function")
    W, b = mha.in_proj_weight.detach().chunk(3), mha.in_proj_bias.detach().chunk(3)
    names = ("query", "key", "value")
    got = {name: getattr(block.self, name) for name in names}
    for name, linear in got.items():
        if not isinstance(linear, nn.Linear):
            raise ExerciseError(f"block.self.{name} is a {type(linear).__name__} after your function; keep it an "
                                f"nn.Linear and copy into its .weight and .bias.")
    for i, name in enumerate(names):
        weight = got[name].weight.detach()
        if close(weight, W[i]):
            continue
        if close(weight, W[i].T):
            raise ExerciseError(
                f"block.self.{name}.weight holds the right block TRANSPOSED. Both nn.Linear and in_proj_weight "
                f"store weights as (out, in): copy in_proj_weight[{i}*D:{i + 1}*D] as it is, without .T."
            )
        for j, other in enumerate(names):
            if j != i and close(weight, W[j]):
                raise ExerciseError(
                    f"block.self.{name}.weight holds the {other} block of in_proj_weight (rows {j}*D:{j + 1}*D). "
                    f"in_proj_weight stacks W_q; W_k; W_v in that order: {name} is rows {i}*D:{i + 1}*D."
                )
        raise ExerciseError(
            f"block.self.{name}.weight is not rows {i}*D:{i + 1}*D of in_proj_weight (it "
            f"{describe_diff(weight, W[i], 'the expected entries')}). Did the copy happen? Use "
            f"`linear.weight.copy_(...)` inside `with torch.no_grad():`."
        )
    for i, name in enumerate(names):
        if not close(got[name].bias.detach(), b[i]):
            raise ExerciseError(
                f"the weights are in place but block.self.{name}.bias is not in_proj_bias[{i}*D:{i + 1}*D]: "
                f"copy the three thirds of in_proj_bias too."
            )
    dense = block.output.dense
    if not (close(dense.weight.detach(), mha.out_proj.weight.detach())
            and close(dense.bias.detach(), mha.out_proj.bias.detach())):
        raise ExerciseError(
            "query, key and value are right, but block.output.dense is not mha.out_proj (weight and bias). BERT "
            "applies its output projection in BertSelfOutput.dense, before the residual and the LayerNorm."
        )
    if not all(torch.equal(p.detach(), q) for p, q in zip(block.output.LayerNorm.parameters(), norm_before)):
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


def _previous_token_scores(weights, keep, offset=-1, pad_queries=False, first_query=False, mean=True):
    """Reference and its variants: mean weight of query i on key i + offset over real queries (B, h, L, S) -> (h,)."""
    B, h, L, S = weights.shape
    weights = weights.double()
    rows = torch.arange(L)[:, None]  # (L, 1)
    on_key = (torch.arange(S)[None, :] == rows + offset).to(weights.dtype)  # (L, S)
    per_query = (weights * on_key).sum(-1)  # (B, h, L)
    queries = torch.ones(B, L, dtype=torch.bool) if pad_queries else keep.bool()  # (B, L)
    if not first_query:
        queries = queries & (rows.T >= 1)  # query 0 has no previous token
    total = (per_query * queries[:, None, :]).sum((0, 2))  # (h,)
    return total / queries.sum() if mean else total


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


def check_previous_token_scores(fn) -> None:
    """Check ``fn(weights, keep) -> scores``: for per-head weights (B, h, L, S) of one layer and the tokenizer's keep
    mask (B, S), the (h,) mean weight that a real query i >= 1 gives to key i - 1, over every such query of the
    batch (query 0 has no previous token; pad queries are not words).
    """
    weights, keep = _planted_weights()
    h = weights.shape[1]
    want = _previous_token_scores(weights, keep)
    got = require_tensor(call(fn, weights.clone(), keep.clone(), what="your function"), "weights (3, 4, 6, 6)",
                         "your function")
    if got.dim() == 0:
        raise ExerciseError(
            f"your function returned one number ({got.item():.3g}); return one score per head, shape (h,) = "
            f"({h},), and take .argmax() of it afterwards."
        )
    require_shape(got, (h,), "your scores", "(h,)", "Average over the batch and the queries: keep the heads axis.")
    if close(got, want, 1e-8):
        passed(f"one score per head; the previous-token head here is head {int(want.argmax())} "
               f"(score {float(want.max()):.2f}).")
        return
    mistakes = [
        (dict(offset=1), "measures the NEXT token (key i + 1). The previous token of query i is key i - 1: "
                         "diagonal(offset=-1) of the (L, S) weights, or weights[..., i, i - 1]."),
        (dict(offset=0), "measures each query's weight on ITSELF (the diagonal). The previous token is key i - 1."),
        (dict(pad_queries=True), "averages over the pad queries too. Pads are not words: keep the queries with "
                                 "keep == 1 (and i >= 1), so that their weights do not count."),
        (dict(first_query=True), "counts query 0 too, which has no previous token: average over the real "
                                 "queries i >= 1 only."),
        (dict(mean=False), "adds the weights up instead of averaging: divide by the number of real queries "
                           "i >= 1 in the batch, so that a perfect previous-token head scores 1."),
    ]
    for variant, message in mistakes:
        if close(got, _previous_token_scores(weights, keep, **variant), 1e-8):
            raise ExerciseError(f"your function {message}")
    raise ExerciseError(
        f"your scores {describe_diff(got, want, 'the expected')}: expected {[round(x, 3) for x in want.tolist()]}, "
        f"the mean of weights[b, head, i, i - 1] over every real query i >= 1 of every sentence b."
    )


# ----------------------------------------------------------------------------------------------------------
# Exercise: max pooling over real tokens


def check_max_pool(fn) -> None:
    """Check ``fn(hidden, keep) -> pooled``: hidden states (B, L, D) and the keep mask (B, L) give (B, D), the
    largest value of each feature over the REAL tokens of each sentence (pads never count)."""
    gen = torch.Generator().manual_seed(7)
    keep = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]])
    B, L, D = keep.shape[0], keep.shape[1], 5
    hidden = -1.0 - torch.rand(B, L, D, generator=gen, dtype=DTYPE)  # (B, L, D) all negative ...
    hidden[0, 1, 0] = 2.0  # ... but one feature of the full sentence
    hidden = hidden.masked_fill(keep[..., None] == 0, 0.5)  # pads: larger than every real value but one
    want = hidden.masked_fill(keep[..., None] == 0, float("-inf")).amax(1)  # (B, D)
    got = require_tensor(call(fn, hidden.clone(), keep.clone(), what="your function"), "hidden (3, 4, 5)",
                         "your function")
    if tuple(got.shape) in ((B, L), (L, D)):
        raise ExerciseError(
            f"your result has shape {tuple(got.shape)}: the maximum was taken over the wrong axis. Pool over the "
            f"tokens, dim=1 of (B, L, D), to get (B, D) = {(B, D)}."
        )
    require_shape(got, (B, D), "your result", "(B, D)")
    if close(got, want):
        passed("the maximum over the real tokens only; pads (here larger than the real values) never win.")
        return
    if close(got, hidden.amax(1)):
        raise ExerciseError(
            "your maximum includes the pads: sentences 1 and 2 get the pad value 0.5. Fill the pads with -inf "
            "before the maximum: hidden.masked_fill(keep[..., None] == 0, float('-inf'))."
        )
    if close(got, (hidden * keep[..., None]).amax(1)):
        raise ExerciseError(
            "you multiplied by the keep mask: the pads become 0, and 0 beats every negative feature, so the "
            "short sentences' maxima are 0. Multiplying works for a sum, not a maximum: fill the pads with -inf."
        )
    if close(got, hidden.masked_fill(keep[..., None] == 1, float("-inf")).amax(1)):
        raise ExerciseError(
            "your mask is the wrong way round: you kept the pads and dropped the real tokens (the tokenizer's "
            "mask is 1 for real tokens). Fill with -inf where keep == 0."
        )
    raise ExerciseError(f"your result {describe_diff(got, want, 'the expected maxima')}; expected, per sentence "
                        f"and feature, the largest value over the tokens with keep == 1.")
