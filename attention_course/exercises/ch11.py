"""Checkers for chapter 11, attention across processes: heads split over workers, and a sequence passed around a ring.

The exercises, as the learner writes them (the checkers call them with float64 CPU tensors; padding masks are
IGNORE masks, bool, True = this key is padding, as everywhere in the course):

1. ``split_in_proj(in_proj_weight, in_proj_bias, num_heads, rank, world_size) -> (weight, bias)`` --
   :func:`check_split_in_proj`, grade_id ``ex-ch11-split-in-proj``. ``in_proj_weight`` (3D, D) and
   ``in_proj_bias`` (3D,) are ``nn.MultiheadAttention``'s packed projections: the rows of W_q, then of W_k, then of
   W_v, each (D, D) with head j in rows j*d .. (j+1)*d - 1 (d = D / num_heads). Rank ``rank`` of ``world_size``
   owns the heads rank*n .. (rank+1)*n - 1, n = num_heads / world_size (contiguous, as ``ColwiseParallel`` shards),
   and returns its rows in the same packed layout: ``weight`` (3D / world_size, D), the q rows of its heads, then
   their k rows, then their v rows, and ``bias`` (3D / world_size,) likewise. When world_size does not divide
   num_heads it raises ValueError. Without the package's ``split_in_proj_by_heads`` (the checker makes it raise in
   the workers, where grading's own guard does not reach).
2. ``ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal) -> state`` --
   :func:`check_ring_step`, grade_id ``ex-ch11-ring-step``. One step of ring attention on one rank. ``q``
   (B, h, L_q, d) are the rank's own queries, block ``rank`` of ``torch.tensor_split(x, world_size, dim=2)``;
   ``k``, ``v`` (B, h, L_k, d) and ``key_padding_mask`` (B, L_k) (or None) the key/value block the rank holds at
   this step: the blocks travel to rank + 1 at each step, so at step s it is block (rank - s) mod world_size.
   ``state = (m, l, acc)`` is chapter 8's running state of the rank's queries: ``m`` (B, h, L_q, 1) the largest
   score so far (-inf at first), ``l`` (B, h, L_q, 1) the sum of exp(score - m), ``acc`` (B, h, L_q, d) the sum of
   exp(score - m) * value (both 0 at first). The step scores the block (scaled by 1/sqrt(d), padded keys hidden;
   with ``is_causal``, a block after the rank's is skipped, the rank's own block hides the keys after each query,
   a block before it is seen whole) and merges it into the state, rescaling the old l and acc by
   exp(m_old - m_new). It returns the new (m, l, acc); after world_size steps, acc / l is the rank's block of the
   attention output.

Each checker runs the learner's function in two worker processes joined by ``torch.distributed`` (gloo), one
launch per check (:mod:`attention_course.distributed.trial`): on every case, each rank of a world of 1 to 4
simulated, then for real, the two processes talking. What it did there is judged here by the one mechanism
(:mod:`.diagnose`), against the reference and its catalogue of mistakes run in this process.
"""
from __future__ import annotations

import torch

from ..distributed import trial
from ..distributed.trial import Last, Real, blocks, empty_state
from . import DTYPE
from .diagnose import Case, Exercise, Mistake

# ----------------------------------------------------------------------------------------------------------
# Exercise 1: the rows of a packed in_proj_weight that one rank's heads need


def _split(in_proj_weight, in_proj_bias, num_heads, rank, world_size, *, refuse="raise", layout="packed", heads="contiguous",
           out="packed", bias_mode="split", order=(0, 1, 2)):
    """This rank's (weight, bias): the reference, and each classic mistake as an option. refuse "assert" or None;
    layout "per head" (q, k, v of each head together: Megatron's fused layout), "chunks" (the packed rows cut into
    world_size chunks); heads "strided", "mirror", "next", "one"; out "per head"; bias_mode "chunks", "whole",
    "none"; order: the q, k, v blocks permuted."""
    if num_heads % world_size and refuse == "raise":
        raise ValueError("world_size must divide num_heads")
    assert refuse != "assert" or num_heads % world_size == 0
    weight, bias = in_proj_weight, in_proj_bias
    E = weight.shape[1]
    d, n = E // num_heads, num_heads // world_size
    block = lambda r: list(range(r * n, (r + 1) * n))  # noqa: E731
    chosen = {"contiguous": block(rank), "strided": list(range(rank, num_heads, world_size)),
              "mirror": block(world_size - 1 - rank), "next": block((rank + 1) % world_size), "one": [rank]}[heads]
    if layout == "chunks":
        w, b = weight.chunk(world_size)[rank], bias.chunk(world_size)[rank]
    else:
        shape = (3, num_heads, d) if layout == "packed" else (num_heads, 3, d)
        rows, entries = weight.reshape(*shape, E), bias.reshape(shape)
        if layout == "per head":
            rows, entries = rows.transpose(0, 1), entries.transpose(0, 1)  # (3, h, d, ...) as the mistake sees it
        rows, entries = rows[list(order)][:, chosen], entries[list(order)][:, chosen]  # (3, n, d, E), (3, n, d)
        if out == "per head":
            rows, entries = rows.transpose(0, 1), entries.transpose(0, 1)
        w, b = rows.reshape(-1, E), entries.reshape(-1)
    return w, {"split": b, "chunks": bias.chunk(world_size)[rank], "whole": bias, "none": None}[bias_mode]


def _split_cases():
    gen = torch.Generator().manual_seed(11)
    cases = []
    for E, h, P, ranks in ((8, 4, 2, 2), (12, 6, 3, 3), (8, 4, 4, 4), (12, 6, 2, 2), (8, 2, 1, 1), (4, 4, 2, 2),
                           (6, 1, 1, 1), (12, 6, 4, 4), (8, 2, 4, 1)):
        weight, bias = torch.randn(3 * E, E, generator=gen, dtype=DTYPE), torch.randn(3 * E, generator=gen, dtype=DTYPE)
        what = f"{h} head{'s' * (h > 1)} of size {E // h} over {P} rank{'s' * (P > 1)}"
        cases += [Case(f"{what}, rank {r}", (weight, bias, h, r, P)) for r in range(ranks)]
    torch.manual_seed(11)
    mha = torch.nn.MultiheadAttention(8, 4, batch_first=True, dtype=DTYPE)
    with torch.no_grad():
        mha.in_proj_bias.uniform_(-1.0, 1.0)  # torch starts the biases at 0: a bias left out would go unseen
        mha.out_proj.bias.uniform_(-1.0, 1.0)
    real = {"x": torch.randn(2, 5, 8, generator=gen, dtype=DTYPE), "num_heads": 4,
            **{name: t.detach().clone() for name, t in (("in_proj_weight", mha.in_proj_weight), ("in_proj_bias",
               mha.in_proj_bias), ("out_weight", mha.out_proj.weight), ("out_bias", mha.out_proj.bias))}}
    return cases + [Last(f"the real run (nn.MultiheadAttention's 4 heads over {trial.WORLD} processes summed by "
                         f"all_reduce, which a state kept between calls or a rank read from elsewhere than the "
                         f"arguments breaks)", (Real("heads", real),))]


_FIX = ("Rank r owns the CONTIGUOUS heads r*n .. (r+1)*n - 1 (n = num_heads // world_size), as ColwiseParallel cuts "
        "the rows: in_proj_weight.view(3, num_heads, d, D)[:, r*n:(r+1)*n].")
_PACKED = ("the layer reads rows [:D/P] as W_q, the next as W_k, the last as W_v: keep the PACKED ORDER q, k, v of "
           "in_proj_weight.")


def _sw(**switches):
    return lambda *args: _split(*args, **switches)


SPLIT = Exercise(
    what="your split_in_proj",
    reference=_split,
    cases=_split_cases(),
    mistakes=[
        Mistake("chunks", "cuts the packed rows into world_size CONTIGUOUS CHUNKS, which mixes up W_q, W_k and W_v. "
                "Separate q, k and v first (in_proj_weight.view(3, num_heads, d, D), or .chunk(3)), take this "
                "rank's heads from each, and pack them again.", _sw(layout="chunks")),
        Mistake("per head", "reads the rows HEAD BY HEAD, as (num_heads, 3, d): q, k and v of head 0, then of head 1 "
                "(the fused layout of Megatron-LM). nn.MultiheadAttention packs all of W_q, then all of W_k, then "
                "all of W_v: view(3, num_heads, d, D).", _sw(layout="per head")),
        Mistake("strided", f"takes heads rank, rank + world_size, ...: STRIDED. {_FIX}", _sw(heads="strided")),
        Mistake("mirror", f"takes the heads of ANOTHER RANK, rank world_size - 1 - r's (heads counted from the other "
                f"end). {_FIX}", _sw(heads="mirror")),
        Mistake("next", f"takes the heads of ANOTHER RANK, rank r + 1's (an off-by-one in the rank). {_FIX}",
                _sw(heads="next")),
        Mistake("one head", f"keeps ONE HEAD, head r, where each rank owns n = num_heads // world_size heads, "
                f"r*n .. (r+1)*n - 1.",
                _sw(heads="one")),
        Mistake("ordered per head", "has the right rows, but ORDERED PER HEAD (q, k, v rows of one head, then of the "
                "next). Keep the packed layout: all the q rows of the rank's heads, then their k rows, then their v "
                "rows.", _sw(out="per head")),
        *[Mistake(f"order {o}", f"packs the three blocks in the order {', '.join('qkv'[i] for i in o)}: {_PACKED}",
                  _sw(order=o)) for o in ((1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1))],
        Mistake("bias forgotten", "returns the right rows and None for the bias: the bias is FORGOTTEN. Each rank adds "
                "the entries of in_proj_bias that belong to its rows: cut it like the rows.", _sw(bias_mode="none")),
        Mistake("bias whole", "returns the whole in_proj_bias: the bias is NOT SPLIT. Each rank adds the bias of its "
                "own rows only, cut like the rows.", _sw(bias_mode="whole")),
        Mistake("bias chunks", "cuts the bias into world_size contiguous chunks, NOT LIKE THE ROWS: cut in_proj_bias "
                "exactly as in_proj_weight's rows, in_proj_bias.view(3, num_heads, d)[:, r*n:(r+1)*n].reshape(-1).",
                _sw(bias_mode="chunks")),
        Mistake("not split", "returns in_proj_weight and in_proj_bias whole: the rows are NOT SPLIT. Keep the rows of "
                "this rank's heads only, and raise ValueError when world_size does not divide num_heads.",
                lambda w, b, *_: (w, b)),
        Mistake("columns", "splits the COLUMNS, the input features, which every head reads whole. A head is a set of "
                "ROWS of W_q, W_k and W_v: split dim 0, by heads.", lambda w, b, h, r, P: (
                    w.chunk(P, dim=1)[r], _split(w, b, h, r, P)[1])),
        Mistake("only q", "returns the rows of W_q only, ONE OF q, k, v: the rank needs its heads' rows of all three, "
                "packed q, k, v.", lambda *a: tuple(t[:len(t) // 3] for t in _split(*a))),
        Mistake("three", "returns 3 tensors: return the rank's rows PACKED into one weight and one bias, "
                "(torch.cat([w_q, w_k, w_v]), torch.cat([b_q, b_k, b_v])), the layout of in_proj_weight.",
                lambda *a: tuple(_split(*a)[0].chunk(3))),
        Mistake("weight alone", "returns one tensor, the weight: return the tuple (weight, bias), the rank's rows AND "
                "its entries of the bias.", lambda *a: _split(*a)[0]),
        Mistake("no check", "returns rows where world_size does not divide num_heads, and the ranks cannot hold whole "
                "heads: NO DIVISIBILITY CHECK. Raise ValueError when num_heads % world_size != 0.",
                _sw(refuse=None)),
        Mistake("assert", "checks the divisibility with assert, so it raised AssertionError (an assert disappears "
                "under python -O): raise ValueError when num_heads % world_size != 0.", _sw(refuse="assert")),
    ],
    passed=f"the rows and bias of each rank's heads for 1 to 4 ranks, a ValueError when world_size does not divide "
           f"num_heads, and in {trial.WORLD} processes the heads summed by all_reduce equal nn.MultiheadAttention.",
    run=trial.run,
    parts=("weight", "bias"),
)

# The functions the exercise forbids (dotted names) and its words. Grading makes them raise in the process that runs
# the check (instructor/verdict.py's RULES); the learner's code runs in the workers, so the checker does it there.
_SPLIT_RULE = (["attention_course.distributed.split_in_proj_by_heads"], "*without* the package's `split_in_proj_by_heads`")


def check_split_in_proj(fn) -> None:
    """Check ``fn(in_proj_weight, in_proj_bias, num_heads, rank, world_size) -> (weight, bias)``: the packed rows
    (and bias) of rank's heads, in worker processes: every rank of worlds of 1 to 4 simulated, a ValueError when
    world_size does not divide num_heads, and a real tensor-parallel layer of two processes whose all-reduced heads
    equal ``nn.MultiheadAttention``."""
    _verdicts(SPLIT, [fn])[0]()


# ----------------------------------------------------------------------------------------------------------
# Exercise 2: one step of ring attention


def _ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal, *, direction="back",
               rescale="both", causal="blocks", scale="sqrt", guard=True, padding="hide", acc_mode="sum", old=True,
               running=True, skipped="state"):
    """The new (m, l, acc) after merging the block held at ``step``: the reference, and each classic mistake.

    direction "forward": the block counted as (rank + step) mod P. rescale "neither", "l only", "acc only",
    "inverted" (exp(m_new - m_old)). causal "no skip", "triangle everywhere", "diagonal hidden" (triu(0)), "own
    block open", "ignored", "positions" (rank * L_q + i and src * L_k + j). scale "none" or "d". guard False:
    exp(score - m_new) with m_new = -inf. padding "ignored" or "inverted". acc_mode "normalised": acc / l at each
    step. old False: the state dropped; running False: m the block's own maximum; skipped None: None returned.
    """
    m, l, acc = state  # noqa: E741
    src = (rank - step) % world_size if direction == "back" else (rank + step) % world_size
    Lq, Lk = q.shape[2], k.shape[2]
    hide = torch.zeros(Lq, Lk, dtype=torch.bool)
    triangle = torch.ones(Lq, Lk, dtype=torch.bool).triu(1)  # key j after query i, within one block
    if is_causal:
        if causal in ("blocks", "own block open", "diagonal hidden") and src > rank:
            return (m, l, acc) if skipped else None  # every key of a later block comes after every query
        if causal in ("blocks", "no skip") and src == rank or causal == "triangle everywhere":
            hide = triangle
        if causal == "diagonal hidden" and src == rank:
            hide = torch.ones(Lq, Lk, dtype=torch.bool).triu(0)
        if causal == "positions":
            hide = (src * Lk + torch.arange(Lk))[None, :] > (rank * Lq + torch.arange(Lq))[:, None]
    m, l, acc = (m, l, acc) if old else empty_state(q)  # noqa: E741
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) * {"sqrt": d ** -0.5, "none": 1.0, "d": 1.0 / d}[scale]  # (B, h, Lq, Lk)
    scores = scores.masked_fill(hide, float("-inf"))
    if key_padding_mask is not None and padding != "ignored":
        pads = key_padding_mask if padding == "hide" else ~key_padding_mask
        scores = scores.masked_fill(pads[:, None, None, :], float("-inf"))
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True)) if running else scores.amax(-1, keepdim=True)
    shift = m_new.masked_fill(m_new == float("-inf"), 0.0) if guard else m_new  # nothing seen yet: 0
    p = torch.exp(scores - shift)
    c = torch.exp(m - shift) if rescale != "inverted" else torch.exp(shift - m)  # inverted: inf * 0 at first
    l_new = (c if rescale in ("both", "l only", "inverted") else 1.0) * l + p.sum(-1, keepdim=True)
    acc_new = (c if rescale in ("both", "acc only", "inverted") else 1.0) * acc + p @ v
    return m_new, l_new, acc_new / l_new if acc_mode == "normalised" else acc_new


def _role(src: int, rank: int, causal: bool) -> str:
    if src == rank:
        return "its own block" + (" (causal: each query sees the keys up to itself)" if causal else "")
    if not causal:
        return f"block {src}"
    return f"block {src}, " + ("before its own (causal: seen whole)" if src < rank else "after its own (causal: "
                                                                                         "nothing to see)")


def _ring_tensors(gen, B, h, N, d, lengths):
    q, k, v = (torch.randn(B, h, N, d, generator=gen, dtype=DTYPE) * s for s in (1.5, 1.5, 1.0))
    return q, k, v, None if lengths is None else torch.arange(N)[None, :] >= torch.tensor(lengths)[:, None]


def _ring_cases():
    """Every step of every rank of rings of 1 to 4 (each from the reference's state), then a real ring of two."""
    gen, cases = torch.Generator().manual_seed(12), []
    for what, B, h, N, d, P, causal, lengths in [
            ("one rank, 5 tokens", 1, 1, 5, 4, 1, False, None),
            ("3 ranks, 8 tokens (blocks of 3, 3, 2)", 2, 2, 8, 4, 3, False, None),
            ("2 ranks, sentence 1 has 2 real tokens of 6 (rank 1's block all padding)", 2, 2, 6, 4, 2, False, (6, 2)),
            ("causal, 3 ranks, 8 tokens, 3 heads of size 3", 1, 3, 8, 3, 3, True, None),
            ("causal, 4 ranks, 10 tokens (blocks of 3, 3, 2, 2)", 2, 2, 10, 4, 4, True, None),
            ("causal, 3 ranks, 7 tokens with padding", 2, 2, 7, 4, 3, True, (7, 4)),
            ("4 ranks, 6 tokens (blocks of 2, 2, 1, 1) with padding, 1 head of size 2", 2, 1, 6, 2, 4, False, (5, 3))]:
        q, k, v, pad = _ring_tensors(gen, B, h, N, d, lengths)
        qs, ks, vs, pads = blocks(q, P, 2), blocks(k, P, 2), blocks(v, P, 2), blocks(pad, P, 1)
        for r in range(P):
            state = empty_state(qs[r])
            for s in range(P):
                args = (state, qs[r], ks[(r - s) % P], vs[(r - s) % P], pads[(r - s) % P], s, r, P, causal)
                cases.append(Case(f"{what}: rank {r}, step {s} ({_role((r - s) % P, r, causal)})", args))
                state = _ring_step(*args)
    q, k, v, pad = _ring_tensors(gen, 2, 2, 7, 4, (7, 5))
    marks = {f"in the queries of rank {r}": torch.zeros(2, 2, 7, 4, dtype=torch.bool).index_fill(2, rows, True)
             for r, rows in enumerate(torch.arange(7).tensor_split(trial.WORLD))}
    return cases + [Last(f"a real ring of {trial.WORLD} processes passing the blocks with isend/irecv (causal, 7 "
                         f"tokens with padding), acc / l after the last step (the steps chained, which a state kept "
                         f"between calls or a tensor given changed breaks)",
                         (Real("ring", {"q": q, "k": k, "v": v, "pad": pad, "causal": True}),), marks)]


def _rs(**switches):
    return lambda *args: _ring_step(*args, **switches)


RING = Exercise(
    what="your ring_step",
    reference=_ring_step,
    cases=_ring_cases(),
    mistakes=[
        Mistake("no rescaling", "rescales NEITHER l NOR acc: when the largest score grows from m_old to m_new, the "
                "sums made with exp(score - m_old) must be multiplied by exp(m_old - m_new) before the block's "
                "exp(score - m_new) are added.", _rs(rescale="neither")),
        Mistake("acc unscaled", "rescales l but leaves acc UNSCALED: multiply the old acc by exp(m_old - m_new) too.",
                _rs(rescale="l only")),
        Mistake("l unscaled", "rescales acc but leaves l UNSCALED: multiply the old l by exp(m_old - m_new) too.",
                _rs(rescale="acc only")),
        Mistake("inverted", "rescales by the INVERTED factor exp(m_new - m_old): the old sums were made with "
                "exp(score - m_old), and exp(score - m_old) * exp(m_old - m_new) = exp(score - m_new). (At the "
                "first step m_old = -inf: exp(m_new - m_old) is inf, and inf * 0 is NaN.)", _rs(rescale="inverted")),
        Mistake("normalised", "NORMALISES acc at each step (divided by l): keep the unnormalised sum of "
                "exp(score - m) * value, and divide by l once, after the last step.", _rs(acc_mode="normalised")),
        Mistake("not scaled", "does NOT SCALE the scores: divide q @ k^T by sqrt(d) (d = q.shape[-1]).",
                _rs(scale="none")),
        Mistake("divided by d", "divides the scores by d: the scale is 1/sqrt(d), the SQUARE ROOT of the head "
                "dimension.", _rs(scale="d")),
        Mistake("no guard", "gives NaN when every key of a block is padding (or hidden) and the state is still empty: m_new = -inf "
                "and exp(score - m_new) = exp(-inf + inf) = NaN. Shift by 0 where nothing has been seen yet: shift = "
                "m_new.masked_fill(m_new == -inf, 0), then exp(score - shift) and exp(m_old - shift).",
                _rs(guard=False)),
        Mistake("padding ignored", "IGNORES THE PADDING: key_padding_mask (True = a padded key) must hide those keys, "
                "scores.masked_fill(key_padding_mask[:, None, None, :], -inf).", _rs(padding="ignored")),
        Mistake("padding inverted", "uses the padding mask the WRONG WAY ROUND: True marks a padded key, to be "
                "hidden; yours hides the real keys and keeps the pads.", _rs(padding="inverted")),
        Mistake("forward", "counts the block index the WRONG WAY ROUND THE RING: the blocks travel to rank + 1, so at "
                "step s a rank holds the block of rank (rank - s) mod world_size, not (rank + s) mod world_size.",
                _rs(direction="forward")),
        Mistake("no skip", "attends a block AFTER THE RANK'S OWN (causal): its keys all come after every query of "
                "this rank; skip it (return the state unchanged) when (rank - step) mod world_size > rank.",
                _rs(causal="no skip")),
        Mistake("triangle everywhere", "puts the own block's TRIANGLE on every block: only the rank's own block "
                "(src == rank) needs ones(L, L).triu(1); a block before it is seen whole, a block after it skipped.",
                _rs(causal="triangle everywhere")),
        Mistake("diagonal hidden", "hides each query's OWN KEY (causal): within the rank's own block query i may see "
                "keys j <= i, the diagonal j = i included, so the mask is torch.ones(L_q, L_k, "
                "dtype=torch.bool).triu(1), not triu(0).", _rs(causal="diagonal hidden")),
        Mistake("own block open", "does not mask the rank's OWN BLOCK (causal): within it, query i may see only keys "
                "j <= i; hide the rest with torch.ones(L_q, L_k, dtype=torch.bool).triu(1).",
                _rs(causal="own block open")),
        Mistake("causal ignored", "IGNORES is_causal: with is_causal, a block after the rank's own is skipped and the "
                "own block hides the keys after each query.", _rs(causal="ignored")),
        Mistake("positions", "takes the positions as rank * L_q + i and src * L_k + j, which holds only when every "
                "block has ONE LENGTH: torch.tensor_split gives the first N mod world_size blocks one more token. "
                "Decide by blocks instead: src < rank seen whole, src == rank the triangle, src > rank skipped.",
                _rs(causal="positions")),
        Mistake("old dropped", "DROPS THE OLD STATE: the new state is this block's alone, as if nothing had been seen "
                "before. Keep what the earlier blocks brought: m_new = max(m, the block's maximum), and add "
                "exp(m - m_new) * l and exp(m - m_new) * acc to the block's sums.", _rs(old=False)),
        Mistake("block maximum", "takes m as the maximum of this block alone, not the RUNNING MAXIMUM over every "
                "block so far: m_new = torch.maximum(m, the block's largest score).", _rs(running=False)),
        Mistake("m not updated", "returns the old m: m is NOT UPDATED, but l and acc are now relative to m_new = "
                "torch.maximum(m, the block's largest score); return it.", lambda s, *a: (s[0],
                                                                                          *_ring_step(s, *a)[1:])),
        Mistake("no keepdim", "returns m without its last axis: reduce with keepdim=True (amax(-1, keepdim=True)), "
                "so that m is (B, h, L_q, 1) and broadcasts against the scores and acc.",
                lambda *a: (_ring_step(*a)[0].squeeze(-1), *_ring_step(*a)[1:])),
        Mistake("order", "returns the state in the order (m, acc, l): return it in the ORDER (m, l, acc).",
                lambda *a: tuple(_ring_step(*a)[i] for i in (0, 2, 1))),
        Mistake("acc returned", "returns one tensor, acc: return the new STATE, the tuple (m, l, acc), which the next "
                "step merges into; the output acc / l comes after the last step.", lambda *a: _ring_step(*a)[2]),
        Mistake("None skipped", "returns None for a block it skips: a skipped block leaves the state as it was, so "
                "return the state unchanged, (m, l, acc) as given.", _rs(skipped=None)),
    ],
    passed=f"every step of every rank for 1 to 4 ranks (uneven blocks, padding, causal) merges its block as the online "
           f"softmax does, and a real ring of {trial.WORLD} processes gives attention over the whole sequence.",
    run=lambda answer, state, *rest: trial.run(answer, state if isinstance(state, Real) else tuple(
        t.clone() for t in state), *rest),  # the state is the step's to give away: a copy, to change if it likes
    parts=("m", "l", "acc"),
)


def check_ring_step(fn) -> None:
    """Check ``fn(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal) -> (m, l, acc)``, one step of
    ring attention, in worker processes: every rank of worlds of 1 to 4 simulated (lengths not divisible by the
    world size, padding, causal), each step compared with the online-softmax merge, then a real ring of two
    processes whose acc / l equals attention over the whole sequence."""
    _verdicts(RING, [fn])[0]()


def _verdicts(exercise: Exercise, answers: list) -> list:
    """One launch for every answer; for each, a function of nothing that judges it (tests/mutants/ch11.py judges a
    whole catalogue so). The positions of rank and world_size among the arguments let the workers simulate them."""
    if exercise is SPLIT:
        return trial.verdicts(SPLIT, answers, (3, 4), _SPLIT_RULE)
    return trial.verdicts(RING, answers, (6, 7))


EXERCISES = [SPLIT, RING]
