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

Each checker runs the learner's function in real worker processes joined by ``torch.distributed`` (gloo, two
processes, one launch per check): the learner's function is sent to them by value
(:mod:`attention_course.distributed.ship`: its compiled code, with the functions, modules and values it uses), so
that a function written in a notebook cell works there too. In the workers it is called on many cases (several world sizes, simulated: ``dist.get_rank()`` and
``dist.get_world_size()`` answer the simulated ones during those calls) and once for real: the heads of a
``nn.MultiheadAttention`` summed by ``all_reduce``, and a ring of the two processes passing key/value blocks with
``isend``/``irecv``. The workers send back what it returned; the checker compares it here with its own reference and
names the classic mistakes (q, k, v packed rows cut into contiguous chunks, heads strided, the bias forgotten; the
old state not rescaled, future blocks attended, the block index counted the wrong way round the ring, NaN from a
block of padding, ...) by rerunning the reference with that mistake applied.

The functions marked ``# pragma: no cover (worker)`` run only in the worker processes, where the tests' line
coverage does not follow; tests/test_exercises_ch11.py and the chapter's mutation catalogue run every one of them.
"""
from __future__ import annotations

import contextlib
import io

import torch

from .. import boundary
from ..distributed import ship
from . import ATOL, DTYPE, ExerciseError, close, describe_diff, passed, raised, require_shape

NEG_INF = float("-inf")
WORLD = 2  # processes per check: one launch, every case inside it
TIMEOUT = 60.0  # seconds the workers may run the learner's code (after they started)


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace("torch.", "")


# ----------------------------------------------------------------------------------------------------------
# The workers: the learner's function, sent by value (attention_course.distributed.ship), run on every case


def _worker(rank: int, world_size: int, job: dict):  # pragma: no cover (worker)
    """Runs in each worker process (launched by :func:`_gather`): every answer of the job on this rank's share of
    the simulated cases, then on the real case, in which the ranks talk."""
    ship.install_pretence()
    ship.forbid(job["forbidden"], job["rule"])
    run = {"split": _split_worker, "ring": _ring_worker}[job["exercise"]]
    results = []
    for parcel in job["answers"]:
        try:
            fn = ship.unpack(parcel)
        except Exception as err:  # noqa: BLE001
            fn = _unloadable(err)
        printed = io.StringIO()  # a worker's own output goes to no notebook: it comes back with the results
        with contextlib.redirect_stdout(printed):
            results.append(run(fn, rank, world_size, job["cases"], job["real"]))
        results[-1]["printed"] = printed.getvalue()
    return results


def _unloadable(err: Exception):
    def cannot(*args):
        raise RuntimeError(f"the function could not be rebuilt in the worker process: {type(err).__name__}: {err}")
    return cannot


def _gather(exercise: str, answers: list, cases: list, real: dict, forbidden: tuple[list[str], str]) -> list:
    """One launch of :data:`WORLD` worker processes that run every answer; for each answer, what every rank sent
    back (a list, rank by rank). Raises ExerciseError when the workers do not finish."""
    from attention_course.distributed import WorkerError, launch

    parcels = [ship.pack(fn) for fn in answers]
    job = {"exercise": exercise, "answers": parcels, "cases": cases, "real": real, "forbidden": forbidden[0],
           "rule": forbidden[1]}
    try:
        per_rank = launch(WORLD, _worker, job, timeout=TIMEOUT)
    except TimeoutError as err:
        raise ExerciseError(
            f"your function did not return in the worker processes within {TIMEOUT:g} s (an endless loop? a "
            f"collective such as dist.all_reduce or dist.barrier called on some ranks only? The exercise needs no "
            f"communication of its own: the checker moves the tensors). ({err})") from None
    except WorkerError as err:
        raise ExerciseError(f"the worker processes that run your function failed: {err}") from None
    for parcel in parcels:
        parcel["absent"] = ship.absent_names(parcel)
    return [{"ranks": [per_rank[r][i] for r in range(WORLD)], "absent": parcel["absent"]}
            for i, parcel in enumerate(parcels)]


def _learner_error(err: BaseException, what: str, absent: dict[str, str], ring: bool = False) -> ExerciseError:
    """The message for an exception of the learner's code in a worker."""
    if isinstance(err, ship.Forbidden):
        return ExerciseError(f"{what}: not accepted: {err}.")
    if isinstance(err, NameError):
        name = str(err).split("'")[1] if "'" in str(err) else ""
        if name in absent:
            return ExerciseError(
                f"{what} raised NameError: {err}. Your function uses `{name}`, a {absent[name]} from the notebook, "
                f"which cannot be sent to the worker processes: make it inside the function, or pass what it holds "
                f"as numbers.")
        return ExerciseError(
            f"{what} raised NameError: {err}. The worker processes receive your function with the modules, "
            f"functions and values it names; define or import `{name}` in the cell of your function.")
    if ring:
        hint = _ring_hint(str(err))
        if hint:
            text = str(err).strip().rstrip(".")
            return ExerciseError(f"{what} raised {type(err).__name__}: {text}. {hint}")
    return raised(err, what)


def _ring_hint(text: str) -> str:
    """What a raw PyTorch error in a ring step most likely means (empty when no classic cause is known)."""
    if "first two dimensions of batch2" in text or "cannot be multiplied" in text:
        return ("The scores are q @ k^T: k must be TRANSPOSED on its last two axes, q @ k.transpose(-2, -1) (or "
                "k.mT), (B, h, L_q, d) @ (B, h, d, L_k) -> (B, h, L_q, L_k).")
    if "must match the size of tensor" in text:
        return ("Two tensors do not broadcast: the scores are (B, h, L_q, L_k), m and l (B, h, L_q, 1) (reduced "
                "keeping their last axis), and the padding mask (B, L_k) hides keys as key_padding_mask[:, None, None, :]; "
                "the blocks may differ in length (torch.tensor_split), so take L_q from q and L_k from k.")
    if "out of bounds" in text or "out of range" in text:
        return ("An index past the end of a block: the blocks of torch.tensor_split may differ in length by one, so "
                "take L_q from q.shape[2] and L_k from k.shape[2], never from the other.")
    return ""




def _ranges(indices: list[int | None]) -> str:  # pragma: no cover (worker)
    """[4, 5, 6, 7, 12, 13] -> "4-7, 12-13" (and how many were found nowhere)."""
    found, parts = [i for i in indices if i is not None], []
    for i in found:
        if parts and i == parts[-1][1] + 1:
            parts[-1][1] = i
        else:
            parts.append([i, i])
    text = ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts) or "none"
    missing = len(indices) - len(found)
    return text + (f", and {missing} found nowhere in it" if missing else "")


# ----------------------------------------------------------------------------------------------------------
# Exercise 1: the rows of a packed in_proj_weight that one rank's heads need


def _split(weight, bias, num_heads, rank, world_size, *, layout="packed", heads="contiguous", out="packed",
           bias_mode="split", order=(0, 1, 2)):
    """This rank's (weight, bias): the reference, and each classic mistake as an option.

    layout "per head": the rows read as (num_heads, 3, d) (q, k, v of each head together: Megatron's fused layout);
    "chunks": the packed rows cut into world_size contiguous chunks. heads "strided" (rank, rank + P, ...),
    "mirror" (rank P - 1 - r's), "next" (rank r + 1's), "one" (head r alone). out "per head": the right rows,
    head by head. bias_mode "chunks", "whole" (not split), "none". order: the q, k, v blocks permuted.
    """
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
    b = {"split": b, "chunks": bias.chunk(world_size)[rank], "whole": bias, "none": None}[bias_mode]
    return w, b


def _reference_split_in_proj(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    if num_heads % world_size:
        raise ValueError(f"world_size {world_size} must divide num_heads {num_heads}")
    return _split(in_proj_weight, in_proj_bias, num_heads, rank, world_size)


def _split_cases():
    """(what, E, num_heads, world_size): the ranks of a world simulated, each rank checked."""
    return [
        ("4 heads over 2 ranks", 8, 4, 2),
        ("6 heads of dimension 2 over 3 ranks", 12, 6, 3),
        ("4 heads over 4 ranks, one head each", 8, 4, 4),
        ("6 heads over 2 ranks, 3 heads each", 12, 6, 2),
        ("one rank (world_size 1): the whole layer", 8, 2, 1),
    ]


_INDIVISIBLE = ("6 heads over 4 ranks", 12, 6, 4)


def _split_job():
    gen = torch.Generator().manual_seed(11)
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    cases = [(what, randn(3 * E, E), randn(3 * E), h, P) for what, E, h, P in [*_split_cases(), _INDIVISIBLE]]
    torch.manual_seed(11)
    mha = torch.nn.MultiheadAttention(8, 4, batch_first=True, dtype=DTYPE)
    with torch.no_grad():
        mha.in_proj_bias.uniform_(-1.0, 1.0)  # torch starts the biases at 0: a bias left out would go unseen
        mha.out_proj.bias.uniform_(-1.0, 1.0)
    x = randn(2, 5, 8)
    with torch.no_grad():
        want = mha(x, x, x, need_weights=False)[0]
    real = {"x": x, "num_heads": 4, "in_proj_weight": mha.in_proj_weight.detach().clone(),
            "in_proj_bias": mha.in_proj_bias.detach().clone(), "out_weight": mha.out_proj.weight.detach().clone(),
            "out_bias": mha.out_proj.bias.detach().clone()}
    return cases, real, want


def _heads_output(x, weight, bias, out_weight, n):
    """The output projection's share of n heads, from their packed rows (3 n d, E): what one rank adds up."""
    import torch.nn.functional as F

    B, L, _ = x.shape
    d = weight.shape[0] // (3 * n)
    q, k, v = (t.reshape(B, L, n, d).transpose(1, 2) for t in (x @ weight.T + bias).chunk(3, -1))
    heads = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, n * d)
    return heads @ out_weight.T  # (B, L, E): out_weight is the columns of out_proj.weight that these heads meet



def _split_worker(fn, rank: int, world_size: int, cases, real):  # pragma: no cover (worker)
    import torch.distributed as dist

    simulated = {}
    for index, (what, weight, bias, h, P) in enumerate(cases):
        if index % world_size != rank:
            continue
        records = []
        for r in (range(P) if h % P == 0 else [1]):
            args = [weight.clone(), bias.clone(), h, r, P]
            ship.pretend(r, P)
            try:
                outcome = ship.call(fn, *args)
            finally:
                ship.pretend(None, None)
            records.append({"rank": r, "outcome": outcome,
                            "changed": ship.changed([weight, bias], args, ["in_proj_weight", "in_proj_bias"])})
        simulated[index] = records
    # The real thing: this process's heads of one layer, summed over the processes by all_reduce.
    h, x = real["num_heads"], real["x"]
    E, n = x.shape[-1], h // world_size
    outcome, share = ("raised", RuntimeError("not run")), torch.zeros_like(x)
    try:
        got = fn(real["in_proj_weight"].clone(), real["in_proj_bias"].clone(), h, rank, world_size)
        outcome = ("ok", ship.plain(got))
        cols = real["out_weight"][:, rank * n * (E // h):(rank + 1) * n * (E // h)]
        if tuple(got[0].shape) == (3 * E // world_size, E) and tuple(got[1].shape) == (3 * E // world_size,):
            share = _heads_output(x, got[0], got[1], cols, n)
    except Exception as err:  # noqa: BLE001 - the rank still takes part in the all_reduce, with zeros
        if outcome[0] != "ok":
            outcome = ("raised", ship.sendable_error(err))
    share = share.detach().to(DTYPE).contiguous() if share.shape == x.shape else torch.zeros_like(x)
    dist.all_reduce(share)  # sum over the ranks: every head's contribution
    return {"simulated": simulated, "real": {"outcome": outcome, "out": share + real["out_bias"]}}


def _row_map(got: torch.Tensor, full: torch.Tensor) -> list[int | None]:  # pragma: no cover (worker)
    """For each row (or entry) of ``got``, the index of the row of ``full`` it equals (None if none)."""
    got, full = got.reshape(got.shape[0], -1).to(DTYPE), full.reshape(full.shape[0], -1).to(DTYPE)
    equal = ((got[:, None, :] - full[None, :, :]).abs() <= ATOL).all(-1)  # (rows of got, rows of full)
    return [int(row.nonzero()[0]) if bool(row.any()) else None for row in equal]


def _thirds(lo: int, hi: int, E: int) -> str:
    """Rows lo .. hi - 1 of a packed (3E, E) weight, in words: "all of W_q's rows and W_k's rows 0-3"."""
    found = []
    for part, name in enumerate(("W_q", "W_k", "W_v")):
        a, b = max(lo, part * E) - part * E, min(hi, (part + 1) * E) - part * E
        if a < b:
            found.append(f"all of {name}'s rows" if (a, b) == (0, E) else f"{name}'s rows {a}-{b - 1}")
    return " and ".join(found)


def _split_mistakes(E, h, r, P):
    """(switches, message) of the classic mistakes, for rank r of P with h heads of width E."""
    d, n = E // h, h // P
    mine = f"heads {r * n}-{(r + 1) * n - 1}" if n > 1 else f"head {r}"
    strided = list(range(r, h, P))
    fix = (f"Rank r owns the CONTIGUOUS heads r*n .. (r+1)*n - 1 (n = num_heads // world_size = {n}), here {mine}, "
           f"as ColwiseParallel cuts the rows: in_proj_weight.view(3, num_heads, d, D)[:, r*n:(r+1)*n]")
    return [
        (dict(layout="chunks"),
         f"the packed rows are cut into {P} CONTIGUOUS CHUNKS: rank {r} got rows {r * 3 * E // P}-"
         f"{(r + 1) * 3 * E // P - 1} of in_proj_weight, {_thirds(r * 3 * E // P, (r + 1) * 3 * E // P, E)}, "
         f"which mixes up W_q, W_k and W_v. Separate q, k and v first (in_proj_weight.view(3, num_heads, d, D), or "
         f".chunk(3)), take this rank's heads from each, and pack them again."),
        (dict(layout="per head"),
         f"the rows are read HEAD BY HEAD, as (num_heads, 3, d): q, k and v of head 0, then of head 1 (the fused "
         f"layout of Megatron-LM). nn.MultiheadAttention packs all of W_q, then all of W_k, then all of W_v: "
         f"view(3, num_heads, d, D)."),
        (dict(heads="strided"),
         f"rank {r} took heads {strided}, one in every {P}: STRIDED. {fix}."),
        (dict(heads="mirror"),
         f"rank {r} took the heads of ANOTHER RANK, rank {P - 1 - r}'s (heads counted from the other end). {fix}."),
        (dict(heads="next"),
         f"rank {r} took the heads of ANOTHER RANK, rank {(r + 1) % P}'s (an off-by-one in the rank). {fix}."),
        (dict(out="per head"),
         f"the rows of {mine} are all there, but ORDERED PER HEAD (q, k, v rows of one head, then of the next). Keep "
         f"the packed layout: all the q rows of the rank's heads, then their k rows, then their v rows, so that "
         f"weight[:D // world_size] is the rank's share of W_q."),
        *[(dict(order=order),
           f"the three blocks come in the order {', '.join('qkv'[i] for i in order)}: the PACKED ORDER q, k, v of "
           f"in_proj_weight must be kept (the layer reads rows [:D/P] as W_q, the next as W_k, the last as W_v).")
          for order in [(1, 0, 2), (0, 2, 1), (2, 1, 0), (1, 2, 0), (2, 0, 1)]],
    ]


def _split_shape(w: torch.Tensor, E: int, h: int, r: int, P: int, case: str) -> None:
    """A message for rows of the wrong shape that names how they came about."""
    d, n = E // h, h // P
    want, shape = (3 * E // P, E), tuple(w.shape)
    if shape == want:
        return
    named = {
        (3 * E, E): f"the rows are NOT SPLIT: {shape} is the whole in_proj_weight. Keep the rows of this rank's "
                    f"heads only, {want}.",
        (3 * E, E // P): f"the COLUMNS are split ({shape}): the columns are the input features, which every head "
                         f"reads whole. A head is a set of ROWS of W_q, W_k and W_v: split dim 0, by heads -> {want}.",
        (E, 3 * E // P): f"your weight is TRANSPOSED, {shape}: keep in_proj_weight's layout, (out features, in "
                         f"features) -> {want}.",
        (E // P, E): f"your weight has the rows of ONE OF q, k, v only ({shape}): the rank needs its heads' rows of "
                     f"all three, packed q, k, v -> {want}.",
        (3, E // P, E): f"your weight is still 3-D, {shape}: pack it back, .reshape(3 * D // world_size, D) -> "
                        f"{want}.",
        (3, n, d, E): f"your weight is still 4-D, {shape}: pack it back, .reshape(3 * D // world_size, D) -> {want}.",
    }
    if n > 1:
        named[(3 * d, E)] = (f"your weight has the rows of ONE HEAD ({shape}): each of the {P} ranks owns n = "
                             f"num_heads // world_size = {n} heads -> {want}.")
    if shape in named and shape != want:
        raise ExerciseError(f"{case}: {named[shape]}")
    require_shape(w, want, f"{case}: your weight", "(3 D / world_size, D)")


def _bias_shape(b: torch.Tensor, E: int, P: int, case: str) -> None:
    want, shape = (3 * E // P,), tuple(b.shape)
    if shape == want:
        return
    if shape == (3 * E,):
        raise ExerciseError(f"{case}: the bias is NOT SPLIT ({shape}, the whole in_proj_bias): each rank adds the "
                            f"bias of its own rows only, cut like the rows -> {want}.")
    if shape == (E // P,):
        raise ExerciseError(f"{case}: your bias has the entries of ONE OF q, k, v only ({shape}): take the rank's "
                            f"heads from the q, k and v thirds of in_proj_bias, packed -> {want}.")
    if b.numel() == 3 * E // P:
        raise ExerciseError(f"{case}: your bias has shape {shape}: flatten it, .reshape(-1) -> {want}.")
    require_shape(b, want, f"{case}: your bias", "(3 D / world_size,)")


def _split_fits(switches, seen) -> bool:
    """Whether the weight a rank returned (``seen``: its record and case) is the reference with this mistake."""
    record, (what, weight, bias, h, P) = seen
    items = _items(record, 2)
    if items is None or h % P:
        return True  # nothing to compare here
    try:
        made = _split(weight, bias, h, record["rank"], P, **switches)[0]
    except Exception:  # noqa: BLE001
        return False
    return close(items[0], made, ATOL)


def _judge_split_record(record, what, weight, bias, h, P, absent, records=()) -> None:
    r = record["rank"]
    E = weight.shape[1]
    case = f"{what}, rank {r} of {P}"
    kind, got = record["outcome"]
    if kind == "raised":
        raise _learner_error(got, f"{case}: your split_in_proj", absent)
    if got[0] == "none":
        raise ExerciseError(f"{case}: your split_in_proj returned None: is the return statement missing? It must "
                            f"return the tuple (weight, bias).")
    if got[0] == "tensor":
        raise ExerciseError(f"{case}: your split_in_proj returned one tensor, {tuple(got[1].shape)}: return the "
                            f"tuple (weight, bias), the rank's rows AND its entries of the bias.")
    if got[0] != "sequence":
        raise ExerciseError(f"{case}: your split_in_proj must return the tuple (weight, bias), got {ship.describe(got)}.")
    items = got[2]
    if len(items) in (3, 6):
        raise ExerciseError(f"{case}: your split_in_proj returned {len(items)} items: return the rank's rows PACKED "
                            f"into one weight and one bias, (torch.cat([w_q, w_k, w_v]), torch.cat([b_q, b_k, "
                            f"b_v])), the layout of in_proj_weight.")
    if len(items) != 2:
        raise ExerciseError(f"{case}: your split_in_proj must return the tuple (weight, bias), got a "
                            f"{got[1]} of {len(items)}.")
    if not ship.valid_tensor(items[0]):
        raise ExerciseError(f"{case}: the weight your split_in_proj returned is {ship.describe(items[0])}, not a tensor.")
    if record["changed"]:
        raise ExerciseError(f"{case}: your split_in_proj changed {record['changed'][0]} IN PLACE (an assignment "
                            f"into a slice, or a method ending in _): every rank reads the same full weights. Return "
                            f"new tensors (slices, reshape, cat) and leave the inputs as they were.")
    w = items[0][1]
    _split_shape(w, E, h, r, P, case)
    if w.dtype != weight.dtype:
        raise ExerciseError(f"{case}: your weight came back as {_name(w.dtype)} for an in_proj_weight in "
                            f"{_name(weight.dtype)}: keep the input's dtype.")
    want_w, want_b = _reference_split_in_proj(weight, bias, h, r, P)
    if not close(w, want_w, ATOL):
        found = [(switches, message) for switches, message in _split_mistakes(E, h, r, P)
                 if close(w, _split(weight, bias, h, r, P, **switches)[0], ATOL)]
        if found:  # several mistakes can give these rows: the one that gives every rank's of every case, if any
            every = [(switches, message) for switches, message in found
                     if all(_split_fits(switches, other) for other in records)]
            raise ExerciseError(f"{case}: {(every or found)[0][1]}")
        rows = _row_map(w, weight)
        raise ExerciseError(
            f"{case}: your weight holds rows {_ranges(rows)} of in_proj_weight; rank {r} of {P} needs rows "
            f"{_ranges(_row_map(want_w, weight))}: the rows of its heads in W_q (rows 0-{E - 1}), W_k ({E}-"
            f"{2 * E - 1}) and W_v ({2 * E}-{3 * E - 1}), in that order.")
    if items[1][0] == "none":
        raise ExerciseError(f"{case}: your weight is right but the bias is None: the bias is FORGOTTEN. Each rank "
                            f"adds the entries of in_proj_bias that belong to its rows: cut it like the rows.")
    if not ship.valid_tensor(items[1]):
        raise ExerciseError(f"{case}: the bias your split_in_proj returned is {ship.describe(items[1])}, not a tensor.")
    b = items[1][1]
    _bias_shape(b, E, P, case)
    if b.dtype != bias.dtype:
        raise ExerciseError(f"{case}: your bias came back as {_name(b.dtype)} for an in_proj_bias in "
                            f"{_name(bias.dtype)}: keep the input's dtype.")
    if not close(b, want_b, ATOL):
        if close(b, bias.chunk(P)[r], ATOL):
            raise ExerciseError(f"{case}: your weight is right, but the bias is cut into {P} contiguous chunks, "
                                f"NOT LIKE THE ROWS: cut in_proj_bias exactly as in_proj_weight's rows, "
                                f"in_proj_bias.view(3, num_heads, d)[:, r*n:(r+1)*n].reshape(-1).")
        raise ExerciseError(f"{case}: your weight is right, but your bias holds entries {_ranges(_row_map(b, bias))} "
                            f"of in_proj_bias, where the rank needs {_ranges(_row_map(want_b, bias))}: cut the bias "
                            f"exactly as the rows.")


def _judge_indivisible(record, absent) -> None:
    what, E, h, P = _INDIVISIBLE
    case = f"{what} (world_size {P} does not divide num_heads {h})"
    kind, got = record["outcome"]
    if kind == "ok":
        raise ExerciseError(
            f"{case}: your split_in_proj returned {ship.describe(got)}, though {P} ranks cannot hold whole heads of "
            f"{h} ({h / P:g} each): NO DIVISIBILITY CHECK. Raise ValueError when num_heads % world_size != 0, "
            f"saying that world_size must divide num_heads.")
    if type(got) is not ValueError:
        hint = " (an assert disappears under python -O)" if isinstance(got, AssertionError) else ""
        raise ExerciseError(
            f"{case}: your split_in_proj raised {type(got).__name__}: {str(got).strip()}. Check the divisibility "
            f"yourself before splitting and raise ValueError{hint}, saying that world_size must divide num_heads.")


def _simulated(result) -> dict:
    """case index -> what the workers recorded of it, gathered from every rank."""
    simulated = {}
    for from_rank in result["ranks"]:
        simulated.update(from_rank["simulated"])
    return simulated


_LAYER = "nn.MultiheadAttention's output"


def _judge_split(result, cases, real, want) -> None:
    simulated = _simulated(result)
    every = [(record, cases[index]) for index in range(len(cases) - 1) for record in simulated[index]]
    for record, (what, weight, bias, h, P) in every:
        _judge_split_record(record, what, weight, bias, h, P, result["absent"], every)
    _judge_indivisible(simulated[len(cases) - 1][0], result["absent"])
    for rank, from_rank in enumerate(result["ranks"]):
        real = from_rank["real"]
        case = f"the real run ({WORLD} processes, rank {rank}, 4 heads of nn.MultiheadAttention)"
        if real["outcome"][0] == "raised":
            raise _learner_error(real["outcome"][1], f"{case}: your split_in_proj", result["absent"])
        if not close(real["out"], want, ATOL):
            raise ExerciseError(
                f"{case}: each rank's rows were right when the world was simulated, but here "
                f"{_gap('heads summed by all_reduce', real['out'], want, _LAYER)}: "
                f"does your function keep a state of its own between calls, or read the rank from elsewhere than "
                f"its arguments?")


# The functions the exercise forbids (dotted names) and its words. Grading makes them raise in the process that runs
# the check (instructor/verdict.py's RULES); the learner's code runs in the workers, so the checker does it there.
_SPLIT_RULE = (["attention_course.distributed.split_in_proj_by_heads"],
               "*without* the package's `split_in_proj_by_heads`")


def check_split_in_proj(fn) -> None:
    """Check ``fn(in_proj_weight, in_proj_bias, num_heads, rank, world_size) -> (weight, bias)``: the packed rows
    (and bias) of rank's heads, in worker processes: every rank of worlds of 1 to 4 simulated, a ValueError when
    world_size does not divide num_heads, and a real tensor-parallel layer of two processes whose all-reduced heads
    equal ``nn.MultiheadAttention``."""
    _verdicts("split", [fn])[0]()


# ----------------------------------------------------------------------------------------------------------
# Exercise 2: one step of ring attention


def _ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal, *, direction="back",
               rescale="both", causal="blocks", scale="sqrt", guard=True, padding="hide", acc_mode="sum"):
    """The new (m, l, acc) after merging the block held at ``step``: the reference, and each classic mistake.

    direction "forward": the block counted as (rank + step) mod P. rescale "neither", "l only" (acc left as it
    was), "acc only", "inverted" (exp(m_new - m_old)). causal "no skip" (a later block seen whole), "triangle
    everywhere" (the own block's triangle on every block), "diagonal hidden" (the own block's triangle with its
    diagonal, triu(0)), "own block open" (later blocks skipped, the own block not masked), "ignored", "positions"
    (global positions taken as rank * L_q + i and src * L_k + j, right only for blocks of one length). scale
    "none" or "d". guard False: exp(score - m_new) with m_new = -inf. padding "ignored" or "inverted". acc_mode
    "normalised": acc divided by l at each step.
    """
    m, l, acc = state  # noqa: E741
    src = (rank - step) % world_size if direction == "back" else (rank + step) % world_size
    Lq, Lk = q.shape[2], k.shape[2]
    hide = torch.zeros(Lq, Lk, dtype=torch.bool)
    triangle = torch.ones(Lq, Lk, dtype=torch.bool).triu(1)  # key j after query i, within one block
    if is_causal:
        if causal in ("blocks", "own block open", "diagonal hidden") and src > rank:
            return m, l, acc  # every key of a later block comes after every query: nothing to merge
        if causal in ("blocks", "no skip") and src == rank or causal == "triangle everywhere":
            hide = triangle
        if causal == "diagonal hidden" and src == rank:
            hide = torch.ones(Lq, Lk, dtype=torch.bool).triu(0)  # triu(0): each query's own key hidden too
        if causal == "positions":
            hide = (src * Lk + torch.arange(Lk))[None, :] > (rank * Lq + torch.arange(Lq))[:, None]
    d = q.shape[-1]
    scores = q @ k.transpose(-2, -1) * {"sqrt": d ** -0.5, "none": 1.0, "d": 1.0 / d}[scale]  # (B, h, Lq, Lk)
    scores = scores.masked_fill(hide, NEG_INF)
    if key_padding_mask is not None and padding != "ignored":
        pads = key_padding_mask if padding == "hide" else ~key_padding_mask
        scores = scores.masked_fill(pads[:, None, None, :], NEG_INF)
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))  # (B, h, Lq, 1)
    shift = m_new.masked_fill(m_new == NEG_INF, 0.0) if guard else m_new  # a row with nothing seen yet: 0
    p = torch.exp(scores - shift)
    old = torch.exp(m - shift) if rescale != "inverted" else torch.exp(shift - m)  # inverted: inf * 0 at first
    l_new = (old if rescale in ("both", "l only", "inverted") else 1.0) * l + p.sum(-1, keepdim=True)
    acc_new = (old if rescale in ("both", "acc only", "inverted") else 1.0) * acc + p @ v
    if acc_mode == "normalised":
        acc_new = acc_new / l_new
    return m_new, l_new, acc_new


def _reference_ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    return _ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)


def _empty_state(q: torch.Tensor):
    B, h, L, d = q.shape
    return q.new_full((B, h, L, 1), NEG_INF), q.new_zeros(B, h, L, 1), q.new_zeros(B, h, L, d)


def _full_attention(q, k, v, pad, causal):
    """Attention over the whole sequence at once (SDPA): what the ring must give."""
    import torch.nn.functional as F

    N = q.shape[2]
    allowed = torch.ones(q.shape[0], 1, N, N, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    if pad is not None:
        allowed = allowed & ~pad[:, None, None, :]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed)


def _ring_cases():
    """(what, N, world_size, is_causal, real lengths of the two sentences or None)."""
    return [
        ("one rank: the whole sequence in one step", 5, 1, False, None),
        ("3 ranks, 8 keys (blocks of 3, 3, 2)", 8, 3, False, None),
        ("2 ranks with padding: sentence 1 has 2 real tokens of 6, so rank 1's own block is all padding", 6, 2,
         False, (6, 2)),
        ("causal, 3 ranks, 8 tokens (blocks of 3, 3, 2)", 8, 3, True, None),
        ("causal, 4 ranks, 10 tokens (blocks of 3, 3, 2, 2)", 10, 4, True, None),
        ("causal with padding, 3 ranks, 7 tokens", 7, 3, True, (7, 4)),
        ("4 ranks, 6 keys (blocks of 2, 2, 1, 1) with padding", 6, 4, False, (5, 3)),
    ]


_RING_REAL = ("causal with padding, 7 tokens (blocks of 4 and 3)", 7, True, (7, 5))


def _ring_tensors(gen, N, lengths):
    randn = lambda *shape: torch.randn(*shape, generator=gen, dtype=DTYPE)  # noqa: E731
    q, k, v = randn(2, 2, N, 4) * 1.5, randn(2, 2, N, 4) * 1.5, randn(2, 2, N, 4)
    pad = None if lengths is None else torch.arange(N)[None, :] >= torch.tensor(lengths)[:, None]  # (2, N)
    return q, k, v, pad


def _ring_job():
    gen = torch.Generator().manual_seed(12)
    cases = [(what, *_ring_tensors(gen, N, lengths), P, causal) for what, N, P, causal, lengths in _ring_cases()]
    what, N, causal, lengths = _RING_REAL
    q, k, v, pad = _ring_tensors(gen, N, lengths)
    real = {"what": what, "q": q, "k": k, "v": v, "pad": pad, "causal": causal}
    return cases, real, _full_attention(q, k, v, pad, causal)


def _as_state(raw):
    if isinstance(raw, (tuple, list)) and len(raw) == 3 and all(isinstance(t, torch.Tensor) for t in raw):
        return tuple(raw)
    return None


def _blocks(t: torch.Tensor | None, P: int, dim: int):
    return [None] * P if t is None else list(torch.tensor_split(t, P, dim=dim))


def _simulate_ring(fn, case):  # pragma: no cover (worker)
    """Every rank of the case's world, each step given the block the ring brings it; the learner's own state is
    carried from step to step, as in the ring. Per rank, a record per step until the first unusable result."""
    what, q, k, v, pad, P, causal = case
    qs, ks, vs, pads = _blocks(q, P, 2), _blocks(k, P, 2), _blocks(v, P, 2), _blocks(pad, P, 1)
    per_rank = []
    for r in range(P):
        state, records = _empty_state(qs[r]), []
        for step in range(P):
            src = (r - step) % P
            inputs = [qs[r], ks[src], vs[src], pads[src]]
            args = ship.cloned(inputs)
            given = tuple(t.detach().clone() for t in state)
            ship.pretend(r, P)
            try:
                raw, outcome = fn(state, *args, step, r, P, causal), None
            except Exception as err:  # noqa: BLE001
                raw, outcome = None, ("raised", ship.sendable_error(err))
            finally:
                ship.pretend(None, None)
            records.append({"step": step, "input": given, "outcome": outcome or ("ok", ship.plain(raw)),
                            "changed": ship.changed(inputs, args, ["q", "k", "v", "key_padding_mask"])})
            state = _as_state(raw)
            if state is None:
                break
        per_rank.append(records)
    return per_rank


def _real_ring(fn, real, rank: int, P: int):  # pragma: no cover (worker)
    """The ring for real: this process keeps its queries; the key/value blocks (and their padding) go to rank + 1
    at each step with isend/irecv, posted before the learner's step runs and waited for after it."""
    import torch.distributed as dist

    q, causal = real["q"], real["causal"]
    sizes = [t.shape[2] for t in _blocks(real["k"], P, 2)]
    B, h, _, d = q.shape
    mine = _blocks(q, P, 2)[rank]
    kv = torch.stack([_blocks(real["k"], P, 2)[rank], _blocks(real["v"], P, 2)[rank]]).contiguous()
    pads = _blocks(real["pad"], P, 1)[rank].to(torch.uint8).contiguous()
    state, failure = _empty_state(mine), None
    for step in range(P):
        requests = []
        if step < P - 1:
            incoming = sizes[(rank - step - 1) % P]
            kv_next, pads_next = kv.new_empty(2, B, h, incoming, d), pads.new_empty(B, incoming)
            nxt, prev = (rank + 1) % P, (rank - 1) % P
            requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, nxt), dist.P2POp(dist.irecv, kv_next, prev),
                                               dist.P2POp(dist.isend, pads, nxt),
                                               dist.P2POp(dist.irecv, pads_next, prev)])
        if failure is None:  # after a failure the rank still passes the blocks on: no other rank waits forever
            try:
                raw = fn(state, mine.clone(), kv[0], kv[1], pads.bool(), step, rank, P, causal)
                state = _as_state(raw)
                if state is None:
                    failure = ("ok", ship.plain(raw))
            except Exception as err:  # noqa: BLE001
                failure = ("raised", ship.sendable_error(err))
        for request in requests:
            request.wait()
        if step < P - 1:
            kv, pads = kv_next, pads_next
    out = None
    if failure is None:
        try:
            out = (state[2] / state[1]).detach().to(DTYPE).clone()
        except Exception as err:  # noqa: BLE001
            failure = ("raised", ship.sendable_error(err))
    return {"failure": failure, "out": out}


def _ring_worker(fn, rank: int, world_size: int, cases, real):  # pragma: no cover (worker)
    simulated = {index: _simulate_ring(fn, case) for index, case in enumerate(cases) if index % world_size == rank}
    return {"simulated": simulated, "real": _real_ring(fn, real, rank, world_size)}


def _role(src: int, rank: int, causal: bool) -> str:
    if src == rank:
        return "its own block" + (" (causal: each query sees the keys up to itself)" if causal else "")
    if not causal:
        return f"block {src}"
    return f"block {src}, " + ("before its own (causal: seen whole)" if src < rank else "after its own (causal: "
                                                                                         "nothing to see)")


_RING_MISTAKES = [
    (dict(rescale="neither"),
     "NEITHER l NOR acc IS RESCALED: when the largest score grows from m_old to m_new, the sums made with "
     "exp(score - m_old) must be multiplied by exp(m_old - m_new) before the block's exp(score - m_new) are added."),
    (dict(rescale="l only"),
     "l is rescaled but acc is LEFT UNSCALED: multiply the old acc by exp(m_old - m_new) too."),
    (dict(rescale="acc only"),
     "acc is rescaled but l is LEFT UNSCALED: multiply the old l by exp(m_old - m_new) too."),
    (dict(rescale="inverted"),
     "the rescaling factor is INVERTED, exp(m_new - m_old): the old sums were made with exp(score - m_old), and "
     "exp(score - m_old) * exp(m_old - m_new) = exp(score - m_new). (At the first step m_old = -inf: "
     "exp(m_new - m_old) is inf, and inf * 0 is NaN.)"),
    (dict(acc_mode="normalised"),
     "acc is NORMALISED at each step (divided by l): keep the unnormalised sum of exp(score - m) * value, and "
     "divide by l once, after the last step."),
    (dict(scale="none"),
     "the scores are NOT SCALED: divide q @ k^T by sqrt(d) (d = q.shape[-1]), as attention does."),
    (dict(scale="d"),
     "the scores are divided by d: the scale is 1/sqrt(d), the SQUARE ROOT of the head dimension."),
    (dict(guard=False),
     "NaN: when every key of a block is padding and the state is still empty, m_new = -inf and "
     "exp(score - m_new) = exp(-inf + inf) = NaN. Shift by 0 where nothing has been seen yet: "
     "shift = m_new.masked_fill(m_new == -inf, 0), then exp(score - shift) and exp(m_old - shift)."),
    (dict(padding="ignored"),
     "the PADDING IS IGNORED: key_padding_mask (True = a padded key) must hide those keys, "
     "scores.masked_fill(key_padding_mask[:, None, None, :], -inf)."),
    (dict(padding="inverted"),
     "the padding mask is used the WRONG WAY ROUND: True marks a padded key, to be hidden; yours hides the real "
     "keys and keeps the pads."),
    (dict(direction="forward"),
     "the block index goes the WRONG WAY ROUND THE RING: the blocks travel to rank + 1, so at step s a rank holds "
     "the block of rank (rank - s) mod world_size, not (rank + s) mod world_size."),
    (dict(causal="no skip"),
     "a block AFTER THE RANK'S OWN is attended (causal): its keys all come after every query of this rank; skip "
     "it (return the state unchanged) when (rank - step) mod world_size > rank."),
    (dict(causal="triangle everywhere"),
     "the own block's TRIANGLE is put on every block: only the rank's own block (src == rank) needs "
     "ones(L, L).triu(1); a block before it is seen whole, a block after it skipped."),
    (dict(causal="diagonal hidden"),
     "each query's OWN KEY is hidden (causal): within the rank's own block query i may see keys j <= i, the "
     "diagonal j = i included, so the mask is torch.ones(L_q, L_k, dtype=torch.bool).triu(1), not triu(0)."),
    (dict(causal="own block open"),
     "the rank's OWN BLOCK is not masked (causal): within it, query i may see only keys j <= i; hide the rest "
     "with torch.ones(L_q, L_k, dtype=torch.bool).triu(1)."),
    (dict(causal="ignored"),
     "is_causal is IGNORED: with is_causal, a block after the rank's own is skipped and the own block hides the "
     "keys after each query."),
    (dict(causal="positions"),
     "the positions are taken as rank * L_q + i and src * L_k + j, which holds only when every block has ONE "
     "LENGTH: torch.tensor_split gives the first N mod world_size blocks one more token. Decide by blocks "
     "instead: src < rank seen whole, src == rank the triangle, src > rank skipped."),
]


def _state_shapes(items, B, h, Lq, Lk, d, where) -> None:
    want = [(B, h, Lq, 1), (B, h, Lq, 1), (B, h, Lq, d)]
    shapes = [tuple(t.shape) for t in items]
    if shapes == want:
        return
    names = ("m", "l", "acc")
    if sorted(shapes) == sorted(want) and shapes[2] != want[2]:
        raise ExerciseError(f"{where} returned tensors of shapes {shapes}: the state is in the ORDER (m, l, acc), "
                            f"shapes {want}.")
    for name, shape, expected in zip(names, shapes, want):
        if shape == expected:
            continue
        if shape == expected[:-1] and name != "acc":
            raise ExerciseError(f"{where}: {name} has shape {shape}, expected (B, h, L_q, 1) = {expected}: reduce "
                                f"with keepdim=True (amax(-1, keepdim=True), sum(-1, keepdim=True)), so that it "
                                f"broadcasts against the scores and acc.")
        if name == "acc" and shape == (B, h, Lq, Lk):
            raise ExerciseError(f"{where}: acc has shape {shape}, the weights of the block's keys: multiply them by "
                                f"v, exp(score - m_new) @ v -> {expected}.")
        raise ExerciseError(f"{where}: {name} has shape {shape}, expected {expected} "
                            f"({'(B, h, L_q, 1)' if name != 'acc' else '(B, h, L_q, d)'}).")


def _record_args(record, case, r):
    """The arguments the step of ``record`` (on rank r of the case) was called with."""
    what, q, k, v, pad, P, causal = case
    src = (r - record["step"]) % P
    blocks = [_blocks(t, P, dim)[i] for t, dim, i in ((q, 2, r), (k, 2, src), (v, 2, src), (pad, 1, src))]
    return (record["input"], *blocks, record["step"], r, P, causal)


def _items(record, length: int = 3):
    """The tensors a call returned as a tuple of ``length``, or None."""
    kind, got = record["outcome"]
    if kind != "ok" or got[0] != "sequence" or len(got[2]) != length or not ship.valid_tensor(got[2][0]):
        return None
    return [item[1] if ship.valid_tensor(item) else None for item in got[2]]


def _fits(switches, items, args) -> bool:
    """Whether a step that returned ``items`` for ``args`` is the reference with this mistake."""
    try:
        made = _ring_step(*args, **switches)
    except Exception:  # noqa: BLE001 - a mistake that cannot run on these inputs is not this one
        return False
    return all(a.shape == b.shape and close(a, b, ATOL) for a, b in zip(items, made))


def _judge_ring_record(record, case, r, absent, records) -> None:
    what, q, k, v, pad, P, causal = case
    step = record["step"]
    src = (r - step) % P
    B, h, Lq, d = _blocks(q, P, 2)[r].shape
    Lk = _blocks(k, P, 2)[src].shape[2]
    where = f"{what}: rank {r}, step {step} ({_role(src, r, causal)}): your ring_step"
    kind, got = record["outcome"]
    if kind == "raised":
        raise _learner_error(got, where, absent, ring=True)
    skipped = " (for a block to skip, return the state unchanged)" if causal and src > r else ""
    if got[0] == "none" and skipped:
        raise ExerciseError(f"{where} returned None for a block it skips: a skipped block leaves the state as it "
                            f"was, so return the state unchanged, (m, l, acc) as given.")
    if got[0] == "none":
        raise ExerciseError(f"{where} returned None: is the return statement missing? It returns the new state, "
                            f"the tuple (m, l, acc).")
    if got[0] == "tensor":
        raise ExerciseError(f"{where} returned one tensor, {tuple(got[1].shape)}: return the new STATE, the tuple "
                            f"(m, l, acc), which the next step merges into; the output acc / l comes after the "
                            f"last step.")
    if got[0] != "sequence" or len(got[2]) != 3:
        raise ExerciseError(f"{where} must return the new state, the tuple (m, l, acc), got {ship.describe(got)}.")
    bad = next((item for item in got[2] if not ship.valid_tensor(item)), None)
    if bad is not None:
        raise ExerciseError(f"{where} must return three tensors (m, l, acc); one of them is {ship.describe(bad)}"
                            f"{skipped}.")
    if record["changed"]:
        name = record["changed"][0]
        raise ExerciseError(f"{where} changed {name} IN PLACE (an assignment into a slice, or a method ending in _). "
                            f"In the ring the block goes on to the next rank after your step, and its isend may "
                            f"still be reading it: compute new tensors and leave q, k, v and the mask as they were.")
    items = [item[1] for item in got[2]]
    _state_shapes(items, B, h, Lq, Lk, d, where)
    for name, tensor in zip(("m", "l", "acc"), items):
        if tensor.dtype != DTYPE:
            raise ExerciseError(f"{where}: {name} came back as {_name(tensor.dtype)} for inputs in {_name(DTYPE)}: "
                                f"keep the inputs' dtype (new tensors made with dtype=q.dtype).")
    args = _record_args(record, case, r)
    want = _reference_ring_step(*args)
    if all(close(a, b, ATOL) for a, b in zip(items, want)):
        return
    found = [(switches, message) for switches, message in _RING_MISTAKES if _fits(switches, items, args)]
    if found:  # several mistakes can give this one step: the one that gives every step of the case, if any
        every = [(switches, message) for switches, message in found if all(
            _fits(switches, _items(other), _record_args(other, case, rank)) for rank, other in records
            if _items(other) is not None and all(t is not None for t in _items(other)))]
        raise ExerciseError(f"{where}: {(every or found)[0][1]}")
    if causal and src > r and not all(close(a, b, ATOL) for a, b in zip(items, record["input"])):
        raise ExerciseError(f"{where}: this block comes AFTER the rank's own, so with is_causal every key is in the "
                            f"future of every query: the state must come back unchanged.")
    m_old = record["input"][0]
    empty = _reference_ring_step(_empty_state(args[1]), *args[1:])  # the block merged into an empty state
    if not close(m_old, want[0], ATOL) and close(items[0], m_old, ATOL):
        raise ExerciseError(f"{where}: m is NOT UPDATED: you return the old m, but the block raised the largest "
                            f"score; return m_new = torch.maximum(m, the block's largest score), the maximum your "
                            f"l and acc are now relative to.")
    if not close(m_old, empty[0], ATOL) and all(close(a, b, ATOL) for a, b in zip(items, empty)):
        raise ExerciseError(f"{where}: the OLD STATE IS DROPPED: your state is this block's alone, as if nothing had "
                            f"been seen before. Keep what the earlier blocks brought: m_new = max(m, the block's "
                            f"maximum), and add exp(m - m_new) * l and exp(m - m_new) * acc to the block's sums.")
    if close(items[0], empty[0], ATOL) and not close(items[0], want[0], ATOL):
        raise ExerciseError(f"{where}: m is the maximum of this block alone, not the RUNNING MAXIMUM over every block "
                            f"so far: m_new = torch.maximum(m, the block's largest score). (acc / l may still come "
                            f"out right, but m is the state's maximum: the next step rescales by exp(m - m_new), "
                            f"which overflows when m is not the largest.)")
    wrong = [_gap(name, a, b) for name, a, b in zip(("m", "l", "acc"), items, want) if not close(a, b, ATOL)]
    right = [name for name, a, b in zip(("m", "l", "acc"), items, want) if close(a, b, ATOL)]
    raise ExerciseError(f"{where}: the new state is not the online-softmax merge of this block: "
                        f"{'; '.join(wrong)}" + (f" ({' and '.join(right)} right)" if right else "") +
                        f". m_new = max(m, the block's largest score); l and acc are rescaled by exp(m - m_new) and "
                        f"the block's exp(score - m_new) added.")


def _gap(name: str, got: torch.Tensor, want: torch.Tensor, ref: str = "") -> str:
    """"your acc is off the merge's by up to 0.3", or "your m has NaN at 3 of 40 entries where the merge's m is
    finite" (``ref``: what is compared with, default the merge's ``name``)."""
    ref = ref or f"the merge's {name}"
    text = describe_diff(got, want, "")
    if text.startswith("have "):  # "have -inf at 4 of 12 entries where ... finite": keep what, and say where
        found = text.removeprefix("have ").split(" where ")[0]
        return f"your {name} has {found} where {ref} is finite"
    return f"your {name} is off {ref} by up to {text.removeprefix('differ by up to ')}"


def _judge_ring(result, cases, real, want) -> None:
    simulated = _simulated(result)
    for index, case in enumerate(cases):
        every = [(r, record) for r, records in enumerate(simulated[index]) for record in records]
        for r, record in every:
            _judge_ring_record(record, case, r, result["absent"], every)
    blocks = _blocks(want, WORLD, 2)
    for rank, from_rank in enumerate(result["ranks"]):
        got = from_rank["real"]
        where = f"the real ring ({WORLD} processes passing the blocks with isend/irecv; {real['what']}), rank {rank}"
        if got["failure"] is not None:
            kind, value = got["failure"]
            if kind == "raised":
                raise _learner_error(value, f"{where}: your ring_step", result["absent"], ring=True)
            raise ExerciseError(f"{where}: your ring_step returned {ship.describe(value)}: return the tuple (m, l, acc).")
        if not close(got["out"], blocks[rank], ATOL):
            raise ExerciseError(
                f"{where}: every step was right when the checker called it alone, but in the ring "
                f"{_gap('acc / l', got['out'], blocks[rank], 'the attention over the whole sequence')}: does "
                f"your function keep a state of its own between calls, or change a tensor it was given?")


_RING_RULE = ([], "")


def check_ring_step(fn) -> None:
    """Check ``fn(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal) -> (m, l, acc)``, one step of
    ring attention, in worker processes: every rank of worlds of 1 to 4 simulated (lengths not divisible by the
    world size, padding, causal), each step compared with the online-softmax merge, then a real ring of two
    processes whose acc / l equals attention over the whole sequence."""
    _verdicts("ring", [fn])[0]()


# ----------------------------------------------------------------------------------------------------------
# One launch, any number of answers


_EXERCISES = {
    "split": (_split_job, _judge_split, lambda: _SPLIT_RULE,
              f"the rows and bias of each rank's heads for 1 to 4 ranks, a ValueError when world_size does not "
              f"divide num_heads, and in {WORLD} processes the heads summed by all_reduce equal "
              f"nn.MultiheadAttention (to {ATOL:g})."),
    "ring": (_ring_job, _judge_ring, lambda: _RING_RULE,
             f"every step of every rank for 1 to 4 ranks (uneven blocks, padding, causal) merges its block as the "
             f"online softmax does, and a real ring of {WORLD} processes gives attention over the whole sequence "
             f"(to {ATOL:g})."),
}


def _gathered(fn, exercise: str, cases: list, real: dict):
    """In grading's learner process (``boundary.Remote.apply``): :func:`_gather` of the learner's own function there,
    where its code may run, as plain data (an exception as ``boundary.exception_data``) for the checker."""
    return _as_data(_gather(exercise, [fn], cases, real, _EXERCISES[exercise][2]())[0])


def _as_data(value):
    if isinstance(value, BaseException):
        return {"raised": boundary.exception_data(value)}
    if type(value) in (tuple, list):
        return type(value)(_as_data(item) for item in value)
    if type(value) is dict:
        return {key: _as_data(item) for key, item in value.items()}
    return value


def _from_data(value):
    """What :func:`_gathered` sent, with its exceptions rebuilt (the built-in, torch or package type, else a
    ``boundary.LearnerError`` of the same name)."""
    if type(value) is dict and set(value) == {"raised"}:
        return boundary.rebuilt(value["raised"])
    if type(value) in (tuple, list):
        return type(value)(_from_data(item) for item in value)
    if type(value) is dict:
        return {key: _from_data(item) for key, item in value.items()}
    return value


def _verdicts(exercise: str, answers: list) -> list:
    """Run every answer in one launch of the worker processes; for each, a function of nothing that judges it (prints
    the verdict, or raises ExerciseError), as the exercise's checker does. The checkers call it with one answer;
    tests/mutants/ch11.py with a whole catalogue, to launch once. In grading the answer is a ``boundary.Remote``:
    its learner process launches the workers (:func:`_gathered`), and only their plain-data results come here."""
    job, judge, rule, message = _EXERCISES[exercise]
    cases, real, want = job()
    callables = [answer for answer in answers if callable(answer)]
    if callables and all(isinstance(answer, boundary.Remote) for answer in callables):
        results = iter([_from_data(answer.apply(f"{__name__}:_gathered", exercise, cases, real))
                        for answer in callables])
    else:
        results = iter(_gather(exercise, callables, cases, real, rule()) if callables else [])

    def verdict(answer, result):
        def run():
            if result is None:
                raise ExerciseError(f"the checker takes your function itself, e.g. check_{_NAMES[exercise]}"
                                    f"({_NAMES[exercise]}), without parentheses after its name; it got a "
                                    f"{type(answer).__name__}.")
            for rank, from_rank in enumerate(result["ranks"]):
                if from_rank.get("printed"):
                    text = from_rank["printed"]
                    cut = f"\n[... {len(text) - 2000} more characters]" if len(text) > 2000 else ""
                    print(f"Printed by your function in worker rank {rank}:\n{text[:2000].rstrip()}{cut}")
            judge(result, cases, real, want)
            passed(message)
        return run
    return [verdict(answer, next(results) if callable(answer) else None) for answer in answers]


_NAMES = {"split": "split_in_proj", "ring": "ring_step"}
