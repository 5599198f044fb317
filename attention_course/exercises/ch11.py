"""Checkers for chapter 11, attention across processes (float64 CPU tensors; padding masks: True = a padded key), each
run in worker processes (:mod:`..distributed.trial`) and judged by :mod:`.diagnose`:
1. ``split_in_proj(in_proj_weight, in_proj_bias, num_heads, rank, world_size)`` (``ex-ch11-split-in-proj``): the rows
   of rank r's heads r*n .. (r+1)*n - 1 in W_q, W_k, W_v, and their bias entries.
2. ``ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)`` (``ex-ch11-ring-step``): block
   (r - s) mod world_size merged into chapter 8's state (m, l, acc)."""
from __future__ import annotations

import torch

from ..distributed import trial
from ..distributed.trial import Last, Real, blocks, empty_state
from . import DTYPE
from .diagnose import Case, Exercise, Mistake, source

def _split(in_proj_weight, in_proj_bias, num_heads, rank, world_size, *, refuse="raise", layout="packed",
           heads="contiguous", out="packed", bias_mode="split", order=(0, 1, 2)):
    """This rank's (weight, bias), and each classic mistake as an option ("per head": Megatron's fused layout)."""
    if num_heads % world_size and refuse == "raise":
        raise ValueError("world_size must divide num_heads")
    assert refuse != "assert" or num_heads % world_size == 0
    weight, bias, E, n = in_proj_weight, in_proj_bias, in_proj_weight.shape[1], num_heads // world_size
    block = lambda r: list(range(r * n, (r + 1) * n))  # noqa: E731
    chosen = {"contiguous": block(rank), "strided": list(range(rank, num_heads, world_size)),
              "mirror": block(world_size - 1 - rank), "next": block((rank + 1) % world_size), "one": [rank],
              "from rank": list(range(rank, rank + n))}[heads]
    if layout == "chunks":  # the packed rows cut into world_size pieces
        return weight.chunk(world_size)[rank], bias.chunk(world_size)[rank]
    shape = (3, num_heads, E // num_heads) if layout == "packed" else (num_heads, 3, E // num_heads)
    rows, entries = weight.reshape(*shape, E), bias.reshape(shape)
    if layout == "per head":
        rows, entries = rows.transpose(0, 1), entries.transpose(0, 1)  # (3, h, d, ...) as the mistake sees it
    rows, entries = rows[list(order)][:, chosen], entries[list(order)][:, chosen]  # (3, n, d, E), (3, n, d)
    if out == "per head":
        rows, entries = rows.transpose(0, 1), entries.transpose(0, 1)
    w, b = rows.reshape(-1, E), entries.reshape(-1)
    return w, {"split": b, "chunks": bias.chunk(world_size)[rank], "whole": bias, "none": None}[bias_mode]

def _split_cases():
    """Every rank of worlds of 1 to 4 (d = 1 to 6), worlds that do not divide the heads, the real run last."""
    gen, cases = torch.Generator().manual_seed(11), []
    for E, h, P, ranks in ((8, 4, 2, 2), (12, 6, 3, 3), (8, 4, 4, 4), (12, 6, 2, 2), (8, 2, 1, 1), (4, 4, 2, 2),
                           (6, 1, 1, 1), (12, 6, 4, 4), (8, 2, 4, 1), (6, 3, 4, 1)):  # (4 divides 8 and 12, not 6)
        w, b = torch.randn(3 * E, E, generator=gen, dtype=DTYPE), torch.randn(3 * E, generator=gen, dtype=DTYPE)
        what = f"{h} head{'s' * (h > 1)} of size {E // h} over {P} rank{'s' * (P > 1)}"
        cases += [Case(f"{what}, rank {r}", (w, b, h, r, P)) for r in range(ranks)]
    return cases + [Last(f"the real run (a layer's 4 heads over {trial.WORLD} ranks in as many processes, summed by "
                         f"all_reduce, which a state kept between calls or a rank read from elsewhere than the "
                         f"arguments breaks)", (Real("heads", trial.layer(8, 4, gen)),))]

_FIX = ("Rank r owns the CONTIGUOUS heads r*n .. (r+1)*n - 1 (n = num_heads // world_size), as ColwiseParallel cuts "
        "the rows: in_proj_weight.view(3, num_heads, d, D)[:, r*n:(r+1)*n].")
_s = lambda **switches: lambda *args: _split(*args, **switches)  # noqa: E731 - the reference with one switch
_n = lambda r, h, P: slice(r * h // P, (r + 1) * h // P)  # noqa: E731 - rank r's heads
_PASSED = (f"the rows and bias of each rank's heads for 1 to 4 ranks, a ValueError when world_size does not divide "
           f"num_heads, and in {trial.WORLD} processes the heads summed by all_reduce equal the whole layer.")
_CASES = _split_cases()
def _rows(got, w, b=None, h=None, r=None, P=None):
    """Which rows of in_proj_weight a wrong shard's weight holds ("k2": W_k's row 2), against rank r's."""
    got = got[0] if isinstance(got, (tuple, list)) and got else got
    if not (isinstance(w, torch.Tensor) and isinstance(got, torch.Tensor) and got.dim() == 2 and
            got.shape[1] == w.shape[1] and got.dtype == w.dtype):
        return ""
    E = w.shape[1]
    rows = lambda t: [source(x, {f"{'qkv'[i // E]}{i % E}": w[i] for i in range(len(w))}, "?") for x in t]  # noqa: E731
    show = lambda found: f"[{', '.join(found[:12])}{', ...' * (len(found) > 12)}]"  # noqa: E731
    held, right = rows(got), rows(_split(w, b, h, r, P)[0])
    return "" if held == right else f"Its weight holds the rows {show(held)} of in_proj_weight (k2: W_k's row 2), " \
        f"where rank {r}'s are {show(right)}."

SPLIT = Exercise(  # the rows where world_size divides num_heads; REFUSE, the ValueError where it does not
    what="your split_in_proj",
    reference=_split,
    cases=[c for c in _CASES if isinstance(c.args[0], Real) or c.args[2] % c.args[4] == 0],
    mistakes=[
        Mistake("chunks", "cuts the packed rows into world_size CONTIGUOUS CHUNKS, which mixes up W_q, W_k and W_v: "
                "take the rank's heads from each of the three, view(3, num_heads, d, D).", _s(layout="chunks")),
        Mistake("per head", "reads the rows HEAD BY HEAD, q, k, v of head 0, then of head 1 (Megatron-LM's fused "
                "layout): nn.MultiheadAttention packs W_q, then W_k, then W_v.", _s(layout="per head")),
        Mistake("strided", f"takes heads rank, rank + world_size, ...: STRIDED. {_FIX}", _s(heads="strided")),
        Mistake("mirror", f"takes ANOTHER RANK's heads, P - 1 - r's (from the other end). {_FIX}", _s(heads="mirror")),
        Mistake("next", f"takes ANOTHER RANK's heads, r + 1's (an off-by-one). {_FIX}", _s(heads="next")),
        Mistake("d by heads", "views each third as (d, num_heads): head j is rows j*d .. (j+1)*d - 1 of each third.",
                lambda w, b, h, r, P: tuple(t.unflatten(0, (3, -1, h))[:, :, _n(r, h, P)].flatten(0, 2) for t in [w, b])),
        Mistake("d = D / P", "takes d = D // world_size, a rank's share of D, for the head size: d = D // num_heads. "
                "view(3, num_heads, d, D)[:, r*n:(r+1)*n].", lambda w, b, h, r, P: tuple(
                    t.unflatten(0, (3, P, -1))[:, _n(r, h, P)].flatten(0, 2) for t in (w, b))),
        Mistake("D from rows", "reads D from in_proj_weight.shape[0], which is 3D: d comes out three times too large. "
                "D = in_proj_weight.shape[1], d = D // num_heads.", lambda w, b, h, r, P: (
                    w.reshape(3, h, w.shape[0] // h, -1)[:, _n(r, h, P)].reshape(-1, w.shape[1]),
                    b.reshape(3, h, w.shape[0] // h)[:, _n(r, h, P)].reshape(-1))),
        Mistake("n rows", "takes num_heads // world_size ROWS of each third, one per head: a head has d rows.",
                lambda w, b, h, r, P: tuple(t.unflatten(0, (3, -1))[:, _n(r, h, P)].flatten(0, 1) for t in (w, b))),
        Mistake("from rank", f"takes heads rank .. rank + n - 1. {_FIX}", _s(heads="from rank")),
        Mistake("one head", "keeps ONE HEAD, head r: a rank owns n = num_heads // world_size heads.", _s(heads="one")),
        Mistake("ordered per head", "has the right rows ORDERED PER HEAD (q, k, v of one head, then of the next): "
                "pack the q rows of the rank's heads, then their k rows, then their v rows.", _s(out="per head")),
        *[Mistake(f"order {o}", f"packs the blocks in the order {', '.join('qkv'[i] for i in o)}: keep the PACKED "
                  f"ORDER q, k, v of in_proj_weight, which the layer reads.", _s(order=o))
          for o in ((1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1))],
        Mistake("bias forgotten", "returns None for the bias: the bias is FORGOTTEN.", _s(bias_mode="none")),
        Mistake("bias whole", "returns the whole in_proj_bias: the bias is NOT SPLIT.", _s(bias_mode="whole")),
        Mistake("bias chunks", "cuts the bias into world_size contiguous chunks, NOT LIKE THE ROWS: "
                "in_proj_bias.view(3, num_heads, d)[:, r*n:(r+1)*n].", _s(bias_mode="chunks")),
        Mistake("not split", "returns in_proj_weight whole: the rows are NOT SPLIT.", lambda w, b, *_: (w, b)),
        Mistake("bias of q", "cuts the bias from b_q alone: take the rank's entries of b_q, b_k and b_v.",
                lambda *a: (_split(*a)[0], _split(*a)[1][:len(_split(*a)[1]) // 3])),
        Mistake("columns", "splits the COLUMNS, the input features, which every head reads whole: a head is ROWS of "
                "W_q, W_k and W_v.", lambda w, b, h, r, P: (w.chunk(P, dim=1)[r], _split(w, b, h, r, P)[1])),
        Mistake("only q", "returns the rows of W_q only, ONE OF q, k, v: the rank needs its heads' rows of all three.",
                lambda *a: tuple(t[:len(t) // 3] for t in _split(*a))),
        Mistake("three", "returns 3 tensors: the rows PACKED in one weight, then the bias.",
                lambda *a: tuple(_split(*a)[0].chunk(3))),
        Mistake("weight alone", "returns one tensor, the weight: return (weight, bias).", lambda *a: _split(*a)[0]),
    ],
    passed=_PASSED, run=trial.run, parts=("weight", "bias"), notes=_rows, exchange=False,
    hints=((r"(?i)divid|divisib|uneven|evenly|share", "your divisibility check fires where world_size DIVIDES "
            "num_heads: raise only if num_heads % world_size."),),
)
REFUSE = Exercise("your split_in_proj", _split, [c for c in _CASES if not isinstance(c.args[0], Real) and
                                               c.args[2] % c.args[4]], mistakes=[
        Mistake("no check", "returns rows where world_size does not divide num_heads, whose ranks cannot hold whole "
                "heads: NO DIVISIBILITY CHECK. Raise ValueError there.", _s(refuse=None)),
        Mistake("assert", "checks the divisibility with assert, so it raised AssertionError, and an assert disappears "
                "under python -O: raise ValueError.", _s(refuse="assert"))], passed=_PASSED, run=trial.run, exchange=False)

_SPLIT_RULE = (["attention_course.distributed.split_in_proj_by_heads"],  # made to raise in the workers, which
               "*without* the package's `split_in_proj_by_heads`")  # grading's RULES (instructor/verdict.py) miss

def check_split_in_proj(fn) -> None:
    """Check ``fn(in_proj_weight, in_proj_bias, num_heads, rank, world_size) -> (weight, bias)`` in workers."""
    _verdicts("split", [fn])[0]()

def _ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal, *, direction="back",
               rescale="both", causal="blocks", scale="sqrt", guard=True, padding="hide", acc_mode="sum", old=True,
               running=True, skipped="state", l_over=-1):
    """The new (m, l, acc) after merging the block held at ``step``, and each classic mistake as an option."""
    m, l, acc = state  # noqa: E741
    src = {"back": rank - step, "forward": rank + step, "swapped": step - rank}[direction] % world_size
    Lq, Lk = q.shape[2], k.shape[2]
    hide = torch.zeros(Lq, Lk, dtype=torch.bool)
    if (is_causal or causal == "always") and causal not in ("no skip", "ignored", "positions", "everywhere") and (
            src < rank if causal == "before" else src > rank):  # every key of a later block comes after every query
        return {"state": (m, l, acc), None: None, "empty": empty_state(q)}[skipped]
    if is_causal:
        if causal in ("blocks", "no skip", "before", "always") and src == rank or "everywhere" in causal:
            hide = torch.ones(Lq, Lk, dtype=torch.bool).triu(1)  # key j after query i, within one block
        if causal in ("diagonal hidden", "past hidden") and src == rank:  # triu(0), or tril(-1): the past
            hide = torch.ones(Lq, Lk, dtype=torch.bool).triu(0) if causal[0] == "d" else (~hide).tril(-1)
        if causal == "positions":
            hide = (src * Lk + torch.arange(Lk))[None, :] > (rank * Lq + torch.arange(Lq))[:, None]
    m, l, acc = (m, l, acc) if old else empty_state(q)  # noqa: E741
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) * {"sqrt": d ** -0.5, "none": 1.0, "d": 1.0 / d, "L_k": Lk ** -0.5}[scale]
    scores = scores.masked_fill(hide, float("-inf"))
    if key_padding_mask is not None and padding != "ignored" and not (padding == "elif" and is_causal):
        pads = key_padding_mask if padding != "inverted" else ~key_padding_mask
        pads = pads[:, None, :, None] if padding == "queries" else pads[:, None, None, :]
        scores = scores.masked_fill(pads, float("-inf"))
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True)) if running else scores.amax(-1, keepdim=True)
    shift = m_new.masked_fill(m_new == float("-inf"), 0.0) if guard else m_new  # nothing seen yet: 0
    p = torch.exp(scores - shift)
    c = torch.exp(m - shift) if rescale != "inverted" else torch.exp(shift - m)  # inverted: inf * 0 at first
    l_new = (c if rescale in ("both", "l only", "inverted") else 1.0) * l + (
        p.sum(-1, keepdim=True) if l_over == -1 else p.sum(-2, keepdim=True).mT)  # -2: over the queries
    acc_new = (c if rescale in ("both", "acc only", "inverted") else 1.0) * acc + p @ v
    return m_new, l_new, acc_new / l_new if acc_mode == "normalised" else acc_new

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
        q, k, v, pad = trial.sequence(B, h, N, d, lengths, gen)
        qs, ks, vs, pads = blocks(q, P, 2), blocks(k, P, 2), blocks(v, P, 2), blocks(pad, P, 1)
        for r in range(P):
            state = empty_state(qs[r])
            for s, src in ((s, (r - s) % P) for s in range(P)):
                args = (state, qs[r], ks[src], vs[src], pads[src], s, r, P, causal)
                held = "its own block" if src == r else f"block {src}" + ("" if not causal else ", before its own"
                                                                          if src < r else ", after its own")
                cases.append(Case(f"{what}: rank {r}, step {s} ({held})", args))
                state = _ring_step(*args)
    q, k, v, pad = trial.sequence(2, 2, 7, 4, (7, 5), gen)
    marks = {f"in the queries of rank {r}": torch.zeros(2, 2, 7, 4, dtype=torch.bool).index_fill(2, rows, True)
             for r, rows in enumerate(torch.arange(7).tensor_split(trial.WORLD))}
    return cases + [Last(f"a real ring of {trial.WORLD} processes passing the blocks with isend/irecv (causal, 7 "
                         f"tokens with padding), acc / l after the last step (the steps chained, which a state kept "
                         f"between calls or a tensor given changed breaks)",
                         (Real("ring", {"q": q, "k": k, "v": v, "pad": pad, "causal": True}),), marks)]

_r = lambda **switches: lambda *args: _ring_step(*args, **switches)  # noqa: E731
_RESCALE = "multiply the old one by exp(m_old - m_new), the factor from exp(score - m_old) to exp(score - m_new)."
_TRIU = "query i sees keys j <= i, the rest hidden with torch.ones(L_q, L_k, dtype=torch.bool).triu(1)"
RING = Exercise(
    what="your ring_step",
    reference=_ring_step,
    cases=_ring_cases(),
    mistakes=[
        Mistake("no rescaling", f"rescales NEITHER l NOR acc as the maximum grows: {_RESCALE}", _r(rescale="neither")),
        Mistake("acc unscaled", f"rescales l but leaves acc UNSCALED: {_RESCALE}", _r(rescale="l only")),
        Mistake("l unscaled", f"rescales acc but leaves l UNSCALED: {_RESCALE}", _r(rescale="acc only")),
        Mistake("inverted", f"rescales by the INVERTED factor exp(m_new - m_old) (inf at the first step, where m_old = "
                f"-inf: NaN): {_RESCALE}", _r(rescale="inverted")),
        Mistake("normalised", "NORMALISES acc at each step (divided by l): keep the sum of exp(score - m) * value, and "
                "divide by l once, after the last step.", _r(acc_mode="normalised")),
        Mistake("not scaled", "does NOT SCALE the scores: divide q @ k^T by sqrt(d).", _r(scale="none")),
        Mistake("L_k", "scales the scores by 1/sqrt(L_k), the block's LENGTH: the scale is 1/sqrt(d).", _r(scale="L_k")),
        Mistake("divided by d", "divides the scores by d: the scale is 1/sqrt(d), the SQUARE ROOT.", _r(scale="d")),
        Mistake("no guard", "gives NaN when every key of a block is padding (or hidden) and the state is still empty: "
                "exp(-inf + inf). Shift by m_new.masked_fill(m_new == -inf, 0).", _r(guard=False)),
        Mistake("padding ignored", "IGNORES THE PADDING: hide the padded keys, scores.masked_fill("
                "key_padding_mask[:, None, None, :], -inf).", _r(padding="ignored")),
        Mistake("padding inverted", "uses the padding mask the WRONG WAY ROUND: True hides.", _r(padding="inverted")),
        Mistake("padding elif", "hides padded keys only when NOT is_causal (an elif): hide them always.", _r(padding="elif")),
        Mistake("padding on queries", "lays the padding mask along the QUERIES, [:, None, :, None]: it marks KEYS, "
                "key_padding_mask[:, None, None, :].", _r(padding="queries")),
        Mistake("forward", "counts the block index the WRONG WAY ROUND THE RING: the blocks travel to rank + 1, so at "
                "step s a rank holds block (rank - s) mod world_size.", _r(direction="forward")),
        Mistake("swapped", "takes block (step - rank) mod world_size: rank and step SWAPPED.", _r(direction="swapped")),
        Mistake("no skip", "attends a block AFTER THE RANK'S OWN (causal), whose keys all come after every query: "
                "return the state unchanged when (rank - step) mod world_size > rank.", _r(causal="no skip")),
        Mistake("triangle everywhere", "puts the own block's TRIANGLE on every block: a block before the rank's own is "
                "seen whole.", _r(causal="triangle everywhere")),
        Mistake("triangle, no skip", "puts the own block's TRIANGLE on every block and skips none (causal): a block "
                "before the rank's own is seen whole, one after it skipped; only the own block takes the triangle.",
                _r(causal="everywhere")),
        Mistake("skips before", "skips the blocks BEFORE its own (causal), which it must see whole: skip those AFTER, "
                "(rank - step) mod world_size > rank.", _r(causal="before")),
        Mistake("skips always", "skips later blocks when NOT CAUSAL too: skip only if is_causal.", _r(causal="always")),
        Mistake("diagonal hidden", f"hides each query's OWN KEY (causal): {_TRIU}, not triu(0).",
                _r(causal="diagonal hidden")),
        Mistake("past hidden", f"hides the PAST of each query in its own block: {_TRIU}.", _r(causal="past hidden")),
        Mistake("own block open", f"does not mask the rank's OWN BLOCK: {_TRIU}.", _r(causal="own block open")),
        Mistake("causal ignored", "IGNORES is_causal: skip later blocks, mask the own block.", _r(causal="ignored")),
        Mistake("positions", "takes the positions as rank * L_q + i and src * L_k + j, true only if every block has "
                "ONE LENGTH (tensor_split's need not): decide by blocks, src <, == or > rank.", _r(causal="positions")),
        Mistake("l over queries", "sums the block's weights over the QUERIES for l, p.sum(-2): l sums each query's "
                "weights over the keys, p.sum(-1, keepdim=True).", _r(l_over=-2)),
        Mistake("old dropped", "DROPS THE OLD STATE, as if nothing had been seen before: rescale the old l and acc to "
                "m_new and add the block's sums.", _r(old=False)),
        Mistake("block maximum", "takes m as this block's maximum, not the RUNNING MAXIMUM: torch.maximum(m, the "
                "block's largest score).", _r(running=False)),
        Mistake("m not updated", "returns the old m: m is NOT UPDATED to the m_new its l and acc are relative to.",
                lambda s, *a: (s[0], *_ring_step(s, *a)[1:])),
        Mistake("no keepdim", "returns m without its last axis: reduce with keepdim=True, m is (B, h, L_q, 1).",
                lambda *a: (_ring_step(*a)[0].squeeze(-1), *_ring_step(*a)[1:])),
        Mistake("order", "returns the state in the order (m, acc, l): return it in the ORDER (m, l, acc).",
                lambda *a: tuple(_ring_step(*a)[i] for i in (0, 2, 1))),
        Mistake("acc returned", "returns one tensor, acc: return the new STATE.", lambda *a: _ring_step(*a)[2]),
        Mistake("empty skipped", "returns an EMPTY state (-inf, 0, 0) for a block it skips, which forgets the blocks "
                "seen before: return the state unchanged.", _r(skipped="empty")),
        Mistake("None skipped", "returns None for a block it skips: return the state unchanged.", _r(skipped=None)),
    ],
    passed=f"every step of every rank for 1 to 4 ranks (uneven blocks, padding, causal) merges its block as the online "
           f"softmax does, and a real ring of {trial.WORLD} processes gives attention over the whole sequence.",
    run=lambda answer, state, *rest: trial.run(  # a copy of the state, the step's to change in place if it likes
        answer, state if isinstance(state, Real) else tuple(t.clone() for t in state), *rest),
    parts=("m", "l", "acc"), exchange=False,
)

def check_ring_step(fn) -> None:
    """Check ``fn(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal) -> (m, l, acc)`` in workers."""
    _verdicts("ring", [fn])[0]()

def _verdicts(name: str, answers: list) -> list:
    """One launch, a verdict function per answer (tests/mutants/ch11.py's catalogues); (3, 4): rank, world_size."""
    if name == "split":
        return trial.verdicts([SPLIT, REFUSE], answers, (3, 4), _SPLIT_RULE)
    return trial.verdicts([RING], answers, (6, 7))

EXERCISES = [SPLIT, REFUSE, RING]
