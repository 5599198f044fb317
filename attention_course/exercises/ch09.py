"""Checkers for chapter 9, the course's layer inside a pretrained BERT encoder (keep masks: 1 = real token):
1. ``course_to_bert(mha, block)`` (``ex-ch9-course-to-bert``): the thirds of in_proj into query, key, value; dense.
2. ``previous_token_scores(weights, keep)`` (``ex-ch9-previous-token``): (h,), real queries i >= 1 on key i - 1.
3. ``max_pool(hidden, keep)`` (``ex-ch9-max-pool``): (B, D), each feature's maximum over the real tokens."""
from __future__ import annotations

import math
from functools import partial, reduce

import torch
from torch import nn

from ..multihead import MultiheadAttention
from . import DTYPE, ExerciseError
from .diagnose import Case, Exercise, Mistake, check

QKV = ("query", "key", "value")

def _bert_attention(D: int) -> nn.Module:
    """A BertAttention stand-in: Linears NaN (a copy missed shows), LayerNorm off its defaults (a reset shows)."""
    block = nn.Module()
    block.self, block.output = nn.Module(), nn.Module()
    block.self.query, block.self.key, block.self.value, block.output.dense = (nn.Linear(D, D, dtype=DTYPE)
                                                                              for _ in range(4))
    block.output.LayerNorm = nn.LayerNorm(D, dtype=DTYPE)
    for name, p in block.named_parameters():
        nn.init.uniform_(p, 0.5, 1.5) if "LayerNorm" in name else nn.init.constant_(p, math.nan)
    return block

def _course_to_bert(mha, block, transpose=False, new=False, n=None):
    """The copy; its switches are mistakes: blocks transposed, new Parameters on mha's memory, n groups of q, k, v."""
    W, b = ((t if n is None else t.view(n(mha), 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)).chunk(3)
            for t in (mha.in_proj_weight.detach(), mha.in_proj_bias.detach()))  # (D, D) and (D,) each
    pairs = [(getattr(block.self, name), W[i].T if transpose else W[i], b[i]) for i, name in enumerate(QKV)]
    with torch.no_grad():
        for linear, w, bias in pairs + [(block.output.dense, mha.out_proj.weight.detach(), mha.out_proj.bias)]:
            if new:  # nn.Parameter(view): the block's parameters ARE mha's
                linear.weight, linear.bias = nn.Parameter(w), nn.Parameter(bias.detach())
            else:
                linear.weight.copy_(w), linear.bias.copy_(bias)

def _to_course(mha, block):  # the "other way" mistake
    with torch.no_grad():
        for p in ("weight", "bias"):
            getattr(mha, f"in_proj_{p}").copy_(torch.cat([getattr(getattr(block.self, n), p) for n in QKV]))
            getattr(mha.out_proj, p).copy_(getattr(block.output.dense, p))

def _after(fn, mha, block) -> dict:
    """Run ``fn(mha, block)``; what the block holds after it, its Linears stacked as in_proj."""
    fn(mha, block)
    layers = [getattr(block.self, name) for name in QKV] + [block.output.dense]
    for name, layer in zip((*(f"self.{n}" for n in QKV), "output.dense"), layers):
        if not isinstance(layer, nn.Linear) or layer.bias is None:
            kind = type(layer).__name__ + " with no bias" * isinstance(layer, nn.Linear)
            raise ExerciseError(f"block.{name} is a {kind} after your course_to_bert: keep BERT's nn.Linear, with its "
                                f"bias, and copy into it.")
    mine = {p.untyped_storage().data_ptr() for p in mha.parameters()}
    return {**{f"stack of the query, key and value {ps} (torch.cat, as in_proj_{p})": torch.cat(
                [getattr(q, p).detach() for q in layers[:3]]) for p, ps in (("weight", "weights"), ("bias", "biases"))},
            **{f"block.output.{m}.{p}{s}": getattr(getattr(block.output, m), p).detach() for m, s in (
                ("dense", ""), ("LayerNorm", ", which must stay as it was,")) for p in ("weight", "bias")},
            "mha.in_proj_weight, which must stay as it was,": mha.in_proj_weight.detach(),
            "list of the block's parameters that share memory with mha (copies share none)":
                [n for n, p in block.named_parameters() if p.untyped_storage().data_ptr() in mine]}

def _bert_case(D: int, h: int) -> Case:
    torch.manual_seed(D + h)
    mha = MultiheadAttention(D, h, dtype=DTYPE)
    nn.init.normal_(mha.in_proj_bias), nn.init.normal_(mha.out_proj.bias)  # non-zero: a bias left behind shows
    return Case(f"D = {D}, h = {h} heads of d = {D // h}, the block's Linears NaN before the copy",
                (mha, _bert_attention(D)))

def _thirds(got: dict, mha, block) -> str:
    """Whose third of in_proj query, key or value holds where not its own; what was never copied (NaN)."""
    moved, nan = [], []
    for p, stack in zip(("weight", "bias"), list(got.values())[:2]):
        W = getattr(mha, f"in_proj_{p}").detach().chunk(3)
        for name, part in zip(QKV, stack.chunk(3) if stack.shape[0] == 3 * W[0].shape[0] else ()):
            src = [QKV[j] for j, w in enumerate(W) if torch.equal(part, w)]
            moved += [f"{name}.{p} holds the {src[0]}'s third."] if src and name not in src else []
            nan += [f"{name}.{p}"] if part.isnan().all() and p == "weight" else []
    nan += [k.split(" (")[0].removeprefix("stack of ") for k, v in list(got.items())[1:]
            if isinstance(v, torch.Tensor) and v.isnan().all()]
    return " ".join(moved + [f"Never copied (still NaN): {', '.join(nan)}."] * bool(nan))

COURSE_TO_BERT = Exercise(
    what="your course_to_bert",
    reference=_course_to_bert,
    cases=[_bert_case(D, h) for D, h in ((2, 1), (4, 4), (6, 2), (12, 3), (8, 2))],
    mistakes=[
        Mistake("transposed", "copies each block TRANSPOSED: nn.Linear and in_proj_weight both store weights as "
                "(out, in); copy the blocks as they are, without .T.", partial(_course_to_bert, transpose=True)),
        Mistake("shared", "gives the block parameters that SHARE MEMORY with mha (an nn.Parameter or a .data made "
                "of a view, without .clone()): the two models are one, and training either changes both. Copy the "
                "values: .copy_(...) inside torch.no_grad().", partial(_course_to_bert, new=True)),
        *[Mistake(how, f"reads in_proj {how}, q, k, v of {u} 0, then of {u} 1: nn.MultiheadAttention stacks W_q, W_k "
                  f"and W_v whole, chunk(3).", partial(_course_to_bert, n=n)) for how, u, n in (
              ("head by head", "head", lambda m: m.num_heads), ("row by row", "feature", lambda m: m.embed_dim))],
        Mistake("other way", "copies the other way, the block into mha: the block is left as it was (NaN) and mha "
                "overwritten. Copy FROM mha's in_proj thirds and out_proj INTO the block's Linears.", _to_course),
        Mistake("LayerNorm reset", "resets block.output.LayerNorm to weight 1, bias 0: copy only into the four "
                "Linears.", lambda m, b: (_course_to_bert(m, b), b.output.LayerNorm.reset_parameters())),
    ],
    passed="query, key and value hold the thirds of in_proj in order, dense holds out_proj, the LayerNorm is "
           "untouched and no parameter is shared, for 1 to 4 heads of sizes 1 to 4.",
    run=_after,
    notes=_thirds,
    hints=((r"must match the size", "in_proj_weight is (3D, D), three blocks of D ROWS: a piece of another size is cut "
            "along dim 1 (the columns), by a number written in, or with D read from in_proj_weight.shape[0] (that is "
            "3D). chunk(3) along dim 0, D = mha.embed_dim."),
           (r"expected 3, got 2", "chunk(3) of an axis of size 2 gives 2 pieces: chunk in_proj along dim 0, not 1."),
           (r"cannot assign .* as parameter", "a slice of in_proj_weight is a plain tensor, not an nn.Parameter: copy "
            "it into the Linear's own weight, .copy_(...) inside torch.no_grad()."),
           (r"leaf Variable that requires grad", "autograd forbids changing a parameter in place while it records: "
            "do the copies inside `with torch.no_grad():`.")),
)
def check_course_to_bert(fn) -> None:
    """Check ``fn(mha, block)``: a course ``MultiheadAttention`` copied into a BERT attention block, in place."""
    check(COURSE_TO_BERT, fn)

def _keep(*lengths, left=False):
    """The keep mask (B, L) of sentences of these lengths (pads on the ``left``?), and how a message names them."""
    keep, s = (torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]).long(), "s" * (len(lengths) > 1)
    return keep.flip(1) if left else keep, f"{len(lengths)} sentence{s} of length{s} {', '.join(map(str, lengths))}" + (
        " padded on the left" * left)

def _by_shape(got, want, table) -> str:
    """What a wrong shape of ``got`` may mean, from ``table`` ((shape, "what: fix"), ...): only a shape one entry has,
    said as a shape (other slips can give it)."""
    said = [w.split(": ", 1) for s, w in table if isinstance(got, torch.Tensor) and tuple(got.shape) == s != want]
    return f"Its shape is that of {said[0][0]}; if so, {said[0][1]}." if len(said) == 1 else ""

def _previous(weights, keep, offset=-1, queries=lambda keep, n: keep[:, -n:], count=None, sentences=False):
    """diagonal(offset) of the weights summed over the chosen queries (B, n), divided by their number (``count``)."""
    previous = weights.diagonal(offset=offset, dim1=-2, dim2=-1)  # (B, h, n): query i on key i + offset
    mask = queries(keep, previous.shape[-1]).to(weights.dtype)[:, None, :]  # (B, 1, n)
    if sentences:  # each sentence's mean, then their mean
        return ((previous * mask).sum(2) / mask.sum(2)).mean(0)
    return (previous * mask).sum((0, 2)) / (mask.sum() if count is None else count(keep))

def _weights_case(h, *lengths, left=False):
    (keep, name), B, L = _keep(*lengths, left=left), len(lengths), max(lengths)
    scores = torch.randn(B, h, L, L, generator=torch.Generator().manual_seed(L * h + B), dtype=DTYPE)
    scores[:, 0].diagonal(offset=-1, dim1=-2, dim2=-1).add_(4.0)  # head 0 looks at the previous token
    weights = scores.masked_fill(keep[:, None, None, :] == 0, -math.inf).softmax(-1)  # (B, h, L, S)
    return Case(f"{name}, {h} head{'s' * (h > 1)}", (weights, keep))

_q, _c = (lambda f: partial(_previous, queries=f)), (lambda f: partial(_previous, count=f))  # the queries, the count
PREVIOUS_TOKEN = Exercise(
    what="your previous_token_scores",
    reference=_previous,
    cases=[_weights_case(1, 2), _weights_case(3, 3, 1), _weights_case(4, 6, 4, 3), _weights_case(3, 5, 5),
           _weights_case(2, 2, 4, 1, 3), _weights_case(2, 4, 2, 3, left=True)],
    mistakes=[
        *[Mistake(f"offset {k}{q}", f"measures {says}. The previous token of query i is key i - 1: diagonal(offset=-1)"
                  f" of the (L, S) weights.", partial(_previous, offset=k, **({"queries": lambda k, n: k[:, :n]} if q
                                                                             else {}))) for k, q, says in (
            (1, "", "the NEXT token (key i + 1, diagonal offset +1)"), (-2, "", "the token TWO places back (key i - 2, "
            "offset -2)"), (0, "", "each query's weight on ITSELF (offset 0)"), (1, ", queries 0..", "the NEXT token "
            "(key i + 1, offset +1) of queries 0 to L - 2"))],
        Mistake("pads counted", "divides by every query i >= 1, pads included: divide by the number of REAL queries "
                "i >= 1.", _c(lambda keep: keep[:, 1:].numel())),
        Mistake("all queries", "averages over the pad queries too. Pads are not words: count only the queries with "
                "keep == 1 (and i >= 1).", _q(lambda keep, n: torch.ones_like(keep[:, -n:]))),
        Mistake("pads", "counts ONLY the pad queries: the keep mask is 1 for real tokens, so the real queries are "
                "where keep == 1 (you took keep == 0).", _q(lambda keep, n: 1 - keep[:, -n:])),
        Mistake("keys", "selects the queries with the keep mask shifted by one, keep[:, :-1]: query i of diagonal("
                "offset=-1) is real where keep[:, 1:] == 1.", _q(lambda k, n: k[:, :n])),
        Mistake("from query 0", "starts at query 0, whose key i - 1 = -1 is the LAST key (Python's negative index): "
                "query 0 has no previous token; start at i = 1.", lambda w, k: _previous(w.roll(1, -1), k, offset=0)),
        Mistake("query 0", "counts query 0 too, which has no previous token: average over the real queries i >= 1 "
                "only.", _c(lambda keep: keep.sum())),
        Mistake("sum", "sums the weights of the real queries i >= 1, not divided by their number.", _c(lambda _: 1)),
        Mistake("key real", "counts only the queries whose key i - 1 is real too: with the pads on the LEFT, the first "
                "real token's is a pad. Every real query i >= 1 counts.", _q(lambda k, n: k[:, -n:] * k[:, :n])),
        Mistake("first positions", "takes queries 1 .. n - 1, n = keep[b].sum(): with the pads on the LEFT those are "
                "not the real tokens.", _q(lambda k, n: (torch.arange(1, n + 1) < k.sum(1, keepdim=True)).to(k))),
        Mistake("last query", "leaves out the last query, i = L - 1 (range(1, L - 1) one short): every real query i >= "
                "1 counts.", _q(lambda k, n: k[:, -n:] * (torch.arange(n) < n - 1))),
        Mistake("sentences", "averages each sentence first, then the sentences: a short sentence weighs as much as a "
                "long one. Average once over every real query of the batch.", partial(_previous, sentences=True)),
    ],
    passed="one score per head, the mean over every real query i >= 1 of the batch: one sentence or several, with "
           "and without pads, sentences of one token, one head or four.",
    notes=lambda got, w, keep: _by_shape(got, (w.shape[1],), (((w.shape[-2] - 1,), "one score per query position, the "
        "heads reduced: keep them (dim 1)"), ((12,), "12 scores, MiniLM's heads written in: these weights have "
        "weights.shape[1]"), ((w.shape[0], w.shape[1]), "one row per sentence: average over the sentences too"),
        ((w.shape[0],), "one score per sentence, the heads reduced: keep them (dim 1)"), (tuple(w.diagonal(-1).shape),
        "the diagonal of dims 0 and 1, diagonal()'s defaults: diagonal(offset=-1, dim1=-2, dim2=-1)"))),
    hints=((r"index 1 is out of bounds for dimension 0 with size 1", "keep used as an index? A 0/1 INTEGER tensor picks rows 0 "
            "and 1: select with keep.bool() (or keep == 1)."),),
)
def check_previous_token_scores(fn) -> None:
    """Check ``fn(weights, keep) -> scores`` (h,): the mean weight of a real query i >= 1 on key i - 1."""
    check(PREVIOUS_TOKEN, fn)

def _pool(hidden, keep, fill=-math.inf, pads=lambda keep: keep == 0, add=False):
    """Pads filled with -inf, then the maximum over the tokens; each switch off it is a classic mistake."""
    mask = pads(keep)[..., None]  # (B, L, 1)
    return (hidden + fill * mask).amax(1) if add else hidden.masked_fill(mask, fill).amax(1)  # (B, D)

def _pool_case(D, pad, *lengths, left=False):
    """Real values negative but one, -1e30 at feature D - 1 of short sentences; pads ``pad`` to 2 ``pad`` (inf, NaN)."""
    (keep, name), B, L = _keep(*lengths, left=left), len(lengths), max(lengths)
    gen = torch.Generator().manual_seed(D + B)
    hidden = -1.0 - torch.rand(B, L, D, generator=gen, dtype=DTYPE)  # (B, L, D)
    hidden[0, 0, 0] = 2.0
    hidden[keep.sum(1) < L, :, D - 1] *= 1e300  # -1e300 to -2e300, below float32's range
    hidden = torch.where(keep[..., None] == 0, pad * (1 + torch.rand(B, L, D, generator=gen, dtype=DTYPE)), hidden)
    pads = f", pads holding {pad:g}" + f" to {2 * pad:g}" * math.isfinite(pad) if L > min(lengths) else ""
    return Case(f"{name}, D = {D}{pads.replace('e+0', 'e')}", (hidden, keep))

N = ": sentence b has n = keep[b].sum() real tokens, positions 0 to n - 1."
_f = lambda **switches: partial(_pool, **switches)  # noqa: E731 - the reference with switches
MAX_POOL = Exercise(
    what="your max_pool",
    reference=_pool,
    cases=[_pool_case(1, 0.0, 1), _pool_case(4, 1e6, 3, 1), _pool_case(5, 1e6, 4, 3, 2), _pool_case(3, math.inf, 2, 5),
           _pool_case(2, math.nan, 4, 1, 2), _pool_case(5, 0.5, 1, 3, 2, 3), _pool_case(3, 1e6, 2, 4, left=True)],
    mistakes=[
        Mistake("no mask", "includes the pads in the maximum: fill them with -inf before it, "
                "hidden.masked_fill(keep[..., None] == 0, float('-inf')).", lambda x, k: x.amax(1)),
        Mistake("multiplied", "multiplies by the keep mask: pads become 0 (NaN from inf), and 0 beats a negative "
                "feature (right for a sum, not a maximum): fill with -inf.", lambda x, k: (x * k[..., None]).amax(1)),
        Mistake("zero", "fills the pads with 0, and 0 beats every negative feature: fill with -inf.", _f(fill=0.0)),
        *[Mistake(f"{verb} {t}", f"{says}, {t}: pads must never count, whatever they and the real values hold. Fill "
                  f"them with float('-inf').", _f(fill=float(t), add=verb == "add")) for t in ("-1e4", "-1e9")
          for verb, says in (("fill", "fills the pads with a FINITE value"),
                             ("add", "ADDS a finite penalty to the pads"))],
        Mistake("NaN", "fills the pads with NaN, and a maximum over a NaN is NaN: fill with -inf.", _f(fill=math.nan)),
        Mistake("keep * x + (1 - keep) * -1e9", "fills the pads by arithmetic, x * keep + (1 - keep) * -1e9: a finite "
                "fill, and inf or NaN in a pad survives (inf * 0 is NaN). masked_fill(keep[..., None] == 0, float('-inf"
                "')).", lambda x, k: (x * k[..., None] + (1 - k[..., None]) * -1e9).amax(1)),
        Mistake("inverted", "has its mask the wrong way round: it keeps the pads and drops the real tokens (keep is 1 "
                "for real tokens). Fill with -inf where keep == 0.", _f(pads=lambda keep: keep == 1)),
        Mistake("mean", "takes the MEAN over the real tokens, the model card's pooling: this exercise asks for the "
                "maximum.", lambda x, k: (x * k[..., None]).sum(1) / k.sum(1, keepdim=True)),
        *[Mistake(f"slice {e}", says, lambda x, k, e=e: torch.stack([s[:int(n.sum()) + e].amax(0) for s, n in
                                                                     zip(x, k)])) for e, says in (
            (-1, f"leaves out each sentence's LAST real token, one position short (hidden[b, :n - 1]){N}"),
            (1, f"takes in each short sentence's FIRST PAD too, one position too many (hidden[b, :n + 1]){N}"),
            (0, "takes each sentence's first n = keep[b].sum() positions, hidden[b, :n]: with the pads on the LEFT "
                "those are not the real tokens. Select by keep, not by position."))],
        Mistake("fill min", "fills the pads with hidden.min(), pads included: a pad holding NaN makes it NaN. Fill "
                "with float('-inf'), which no real value is below.", lambda x, k: _pool(x, k, fill=x.min().item())),
        Mistake("float32 min", "fills the pads with float32's lowest number, -3.4e38: a real value below it (float64 "
                "holds -1e300) loses to a pad, and float16 cannot hold it. Fill with float('-inf').",
                _f(fill=torch.finfo(torch.float32).min)),
        Mistake("log", "adds log(keep): -inf at the pads, but a pad holding inf or NaN gives NaN. Fill instead, "
                "masked_fill(keep[..., None] == 0, float('-inf')).", lambda x, k: (x + k[..., None].log()).amax(1)),
        Mistake("running from token 0", "starts its running maximum at token 0 without checking that it is real (with "
                "the pads on the LEFT it is a pad): start at -inf.", lambda x, k: reduce(lambda m, t: torch.where(
                    k[:, t, None] == 1, torch.maximum(m, x[:, t]), m), range(1, x.shape[1]), x[:, 0])),
    ],
    passed="the maximum over the real tokens only: pads holding 1e6, inf or NaN never win, real values as low as -1e300 "
           "still do, for sentences of 1 to 5 tokens and 1 to 5 features.",
    notes=lambda got, x, keep: _by_shape(got, (x.shape[0], x.shape[2]), (
        ((x.shape[0], x.shape[1]), "one value per token, the features reduced (dim=2): reduce the tokens, dim=1"),
        ((x.shape[1], x.shape[2]), "one row per position, the sentences reduced (dim 0): reduce the tokens, dim=1"),
        ((x.shape[2],), "one row for the whole batch, its sentences pooled together: one row per sentence, (B, D)"))),
    hints=((r"masked_fill.*bool", "keep is the tokenizer's 0/1 INTEGER mask, not a bool one: the pads are keep == 0 "
            "(a bool tensor); ~ on integers flips bits (~1 = -2), it does not swap 0 and 1."),
           (r"must match the size", "the mask must line up with the tokens axis of (B, L, D): keep[..., None] is "
            "(B, L, 1); keep[:, None] is (B, 1, L), the tokens against the features.")),
)
def check_max_pool(fn) -> None:
    """Check ``fn(hidden, keep) -> pooled``: (B, L, D) and (B, L) give (B, D), the maximum over the real tokens."""
    check(MAX_POOL, fn)

EXERCISES = [COURSE_TO_BERT, PREVIOUS_TOKEN, MAX_POOL]
