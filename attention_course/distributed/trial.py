"""A learner's function run in worker processes on an exercise's cases, and what it did there replayed here: how
chapter 11's checkers (:mod:`attention_course.exercises.ch11`) judge code that must run across processes.

:func:`verdicts` sends each function by value (:mod:`.ship`) to :data:`WORLD` worker processes joined by
``torch.distributed`` (:func:`~.processes.launch`: one launch for any number of functions). There it is called on
every case, each with the rank and world size the case simulates answering ``dist.get_rank()`` and
``dist.get_world_size()``, and once for real (a :class:`Real` case), where the ranks talk: the heads of a layer
summed by ``all_reduce``, or key/value blocks passed around a ring with ``isend``/``irecv``. What comes back is a
:class:`Recorded`: called with the arguments of one of those cases it replays what the function did there (the
same values, the same exception, the same arguments changed), so that
:func:`attention_course.exercises.diagnose.check` judges it as it judges any answer, against the reference and the
catalogue's mistakes run in this process. :func:`run` is those exercises' run adapter: a :class:`Real` case is
replayed for a record and simulated here (:meth:`Real.simulate`, the same code without the messages) for any
other function.

In grading, the learner's function is a :class:`~attention_course.boundary.Remote`: the launch happens in its
learner process (:func:`gathered`) and only plain data comes back, judged where no learner code ran.

The functions marked ``# pragma: no cover (worker)`` run only in worker processes, where the tests' line coverage
does not follow; tests/test_trial.py runs every one of them.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import io
import math
from dataclasses import dataclass

import torch

from .. import boundary
from ..exercises import ExerciseError
from ..exercises.diagnose import Case, check
from . import ship

WORLD = 2  # processes per launch; every case runs inside it
TIMEOUT = 60.0  # seconds the workers may run the learner's code (after they started)


@dataclass(eq=False)
class Real:
    """The argument of the case run for real in the :data:`WORLD` processes: ``kind`` "heads" or "ring", ``data``
    its tensors (see :func:`_heads_rank` and :func:`_ring_rank`)."""
    kind: str
    data: dict

    def simulate(self, fn):
        """What ``fn`` gives in the real run, computed in this process (for the reference and the mistakes)."""
        return _combined(REAL[self.kind][1](fn, WORLD, self.data), self.kind)


class Last(Case):
    """A case shown after every other: the real run, whose message is about the steps chained."""

    @property
    def size(self) -> float:
        return math.inf


def run(answer, *args):
    """The run adapter of an exercise judged from records: a :class:`Real` case simulated for a function of this
    process, any case replayed for a :class:`Recorded`."""
    if isinstance(args[0], Real) and not isinstance(answer, Recorded):
        return args[0].simulate(answer)
    return answer(*args)


# ----------------------------------------------------------------------------------------------------------
# In the workers


def _worker(rank: int, world_size: int, job: dict):  # pragma: no cover (worker)
    """Every answer of the job on this rank's share of the simulated calls, then on the real case."""
    ship.install_pretence()
    ship.forbid(*job["forbidden"])
    real, results = job["real"], []
    for parcel in job["answers"]:
        try:
            fn = ship.unpack(parcel)
        except Exception as err:  # noqa: BLE001
            fn = functools.partial(_unloadable, err)
        printed = io.StringIO()  # a worker's own output reaches no notebook: it comes back with the results
        with contextlib.redirect_stdout(printed):
            calls = {i: _call(fn, *call) for i, call in enumerate(job["calls"]) if i % world_size == rank}
            done = _sendable(REAL[real.kind][0](fn, rank, world_size, real.data)) if real is not None else None
        results.append({"calls": calls, "real": done, "printed": printed.getvalue()})
    return results


def _unloadable(err: Exception, *args):
    raise RuntimeError(f"the function could not be rebuilt in the worker process: {type(err).__name__}: {err}")


def _call(fn, args: tuple, rank: int, world_size: int):  # pragma: no cover (worker)
    """(outcome, {argument index: its value after the call, where the call changed it}) of one simulated call."""
    given = copy.deepcopy(args)
    ship.pretend(rank, world_size)
    try:
        outcome = ship.call(fn, *given)
    finally:
        ship.pretend(None, None)
    return outcome, {i: ship.plain(after) for i, (before, after) in enumerate(zip(args, given))
                     if not _same(before, after)}


def _sendable(outcome):  # pragma: no cover (worker)
    kind, value = outcome
    return (kind, ship.sendable_error(value)) if kind == "raised" else (kind, value)


def _same(a, b) -> bool:
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, (tuple, list)) and isinstance(b, (tuple, list)):
        return len(a) == len(b) and all(map(_same, a, b))
    if isinstance(a, Real) or isinstance(b, Real):
        return isinstance(a, Real) and isinstance(b, Real) and a.kind == b.kind
    return type(a) is type(b) and a == b


# The real runs. Each kind: (one rank's run in a worker, every rank's run simulated here, the combined result).
# A rank's result is ("out", tensor), ("raised", exception), or ("ok", ship.plain of a value that is not a state).


def _heads_output(x, weight, bias, out_weight, n):
    """The output projection's share of n heads, from their packed rows (3 n d, E): what one rank adds up."""
    import torch.nn.functional as F

    B, L, _ = x.shape
    d = weight.shape[0] // (3 * n)
    q, k, v = (t.reshape(B, L, n, d).transpose(1, 2) for t in (x @ weight.mT + bias).chunk(3, -1))
    heads = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(B, L, n * d)
    return heads @ out_weight.T  # (B, L, E): out_weight is the columns of out_proj.weight that these heads meet


def layer(E: int, h: int, gen: torch.Generator) -> dict:
    """The real run's data for the heads: an input x and the weights and biases of a layer of h heads (packed
    in_proj_weight and in_proj_bias, out_proj's weight and bias, as nn.MultiheadAttention holds them)."""
    def randn(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen, dtype=torch.float64) * scale
    return {"x": randn(2, 5, E), "num_heads": h, "in_proj_weight": randn(3 * E, E, scale=E ** -0.5),
            "in_proj_bias": randn(3 * E), "out_weight": randn(E, E, scale=E ** -0.5), "out_bias": randn(E)}


def _heads_rank(fn, rank: int, P: int, data: dict):
    """(outcome, share) of one rank: fn's rows of the layer, and its heads' part of the output (0 where unusable)."""
    x, h = data["x"], data["num_heads"]
    E, n, share = x.shape[-1], h // P, torch.zeros_like(x)
    try:
        got = fn(data["in_proj_weight"].clone(), data["in_proj_bias"].clone(), h, rank, P)
    except Exception as err:  # noqa: BLE001 - the rank still takes part in the all_reduce, with zeros
        return ("raised", err), share
    try:
        cols = data["out_weight"][:, rank * n * (E // h):(rank + 1) * n * (E // h)]
        part = _heads_output(x, *got, cols, n).detach()
        share = part.to(x.dtype) if part.shape == x.shape else share
    except Exception:  # noqa: BLE001 - rows of another shape: judged on the simulated calls
        pass
    return ("out", None), share


def _heads_process(fn, rank: int, P: int, data: dict):  # pragma: no cover (worker)
    import torch.distributed as dist

    outcome, share = _heads_rank(fn, rank, P, data)
    dist.all_reduce(share)  # sum over the ranks: every head's contribution
    return outcome if outcome[0] == "raised" else ("out", share + data["out_bias"])


def _heads_here(fn, P: int, data: dict):
    ranks = [_heads_rank(fn, rank, P, data) for rank in range(P)]
    total = sum(share for _, share in ranks) + data["out_bias"]
    return [outcome if outcome[0] == "raised" else ("out", total) for outcome, _ in ranks]


def blocks(t: torch.Tensor | None, P: int, dim: int) -> list:
    return [None] * P if t is None else list(torch.tensor_split(t, P, dim=dim))


def empty_state(q: torch.Tensor):
    B, h, L, d = q.shape
    return q.new_full((B, h, L, 1), float("-inf")), q.new_zeros(B, h, L, 1), q.new_zeros(B, h, L, d)


def sequence(B: int, h: int, N: int, d: int, lengths, gen: torch.Generator):
    """Queries, keys, values (B, h, N, d) and the padding mask (B, N) of sentences of ``lengths`` (or None)."""
    q, k, v = (torch.randn(B, h, N, d, generator=gen, dtype=torch.float64) * s for s in (1.5, 1.5, 1.0))
    return q, k, v, None if lengths is None else torch.arange(N)[None, :] >= torch.tensor(lengths)[:, None]


def _ring_rank(fn, rank: int, P: int, data: dict, passed):
    """One rank of the ring: its queries stay, the key/value block it holds is ``passed(step, kv, pads)()`` next
    (the transfer started before the learner's step runs, waited for after it); the learner's own state carried."""
    q, causal = blocks(data["q"], P, 2)[rank], data["causal"]
    kv = torch.stack([blocks(data["k"], P, 2)[rank], blocks(data["v"], P, 2)[rank]]).contiguous()
    pads = blocks(data["pad"], P, 1)[rank].to(torch.uint8).contiguous()
    state, failure = empty_state(q), None
    for step in range(P):
        wait = passed(step, kv, pads)
        if failure is None:  # after a failure the rank still passes the blocks on: no other rank waits forever
            try:
                raw = fn(state, q.clone(), kv[0], kv[1], pads.bool(), step, rank, P, causal)
                ok = isinstance(raw, (tuple, list)) and len(raw) == 3 and all(isinstance(t, torch.Tensor) for t in raw)
                state, failure = (tuple(raw), None) if ok else (state, ("ok", ship.plain(raw)))
            except Exception as err:  # noqa: BLE001
                failure = ("raised", err)
        kv, pads = wait()
    try:
        return failure or ("out", (state[2] / state[1]).detach().clone())
    except Exception as err:  # noqa: BLE001
        return ("raised", err)


def _ring_process(fn, rank: int, P: int, data: dict):  # pragma: no cover (worker)
    import torch.distributed as dist

    sizes = [t.shape[2] for t in blocks(data["k"], P, 2)]

    def passed(step, kv, pads):
        if step == P - 1:
            return lambda: (kv, pads)
        n = sizes[(rank - step - 1) % P]
        kv_next, pads_next = kv.new_empty(*kv.shape[:3], n, kv.shape[4]), pads.new_empty(pads.shape[0], n)
        nxt, prev = (rank + 1) % P, (rank - 1) % P
        requests = dist.batch_isend_irecv([dist.P2POp(dist.isend, kv, nxt), dist.P2POp(dist.irecv, kv_next, prev),
                                           dist.P2POp(dist.isend, pads, nxt), dist.P2POp(dist.irecv, pads_next, prev)])

        def wait():
            for request in requests:
                request.wait()
            return kv_next, pads_next
        return wait

    return _ring_rank(fn, rank, P, data, passed)


def _ring_here(fn, P: int, data: dict):
    def handed(rank):
        def passed(step, kv, pads):
            src = (rank - step - 1) % P
            kv = torch.stack([blocks(data["k"], P, 2)[src], blocks(data["v"], P, 2)[src]])
            return lambda: (kv, blocks(data["pad"], P, 1)[src].to(torch.uint8))
        return passed
    return [_ring_rank(fn, rank, P, data, handed(rank)) for rank in range(P)]


REAL = {"heads": (_heads_process, _heads_here, lambda outs: outs[0]),
        "ring": (_ring_process, _ring_here, lambda outs: torch.cat(outs, dim=2))}


def _combined(ranks: list, kind: str):
    """The real run's result from every rank's: the first exception raised, else the first value that is not a
    state, else the ranks' outputs combined (the layer's output; the ring's blocks in sequence order)."""
    for what, value in ranks:
        if what == "raised":
            raise value
    found = [_value(value) for what, value in ranks if what == "ok"]
    return found[0] if found else REAL[kind][2]([value for _, value in ranks])


# ----------------------------------------------------------------------------------------------------------
# Here: one launch, and the records replayed


def _gather(answers: list, calls: list, real: Real | None, forbidden: tuple) -> list:
    """One launch that runs every answer; for each, its calls' outcomes in order, every rank's real run and
    printed output, and the names its code uses that could not be sent. ExerciseError when the workers fail."""
    from .processes import WorkerError, launch

    parcels = [ship.pack(fn) for fn in answers]
    job = {"answers": parcels, "calls": calls, "real": real, "forbidden": forbidden}
    try:
        per_rank = launch(WORLD, _worker, job, timeout=TIMEOUT)
    except TimeoutError as err:
        raise ExerciseError(
            f"your function did not return in the worker processes within {TIMEOUT:g} s (an endless loop? a "
            f"collective such as dist.all_reduce or dist.barrier called on some ranks only? The exercise needs no "
            f"communication of its own: the checker moves the tensors). ({err})") from None
    except WorkerError as err:
        raise ExerciseError(f"the worker processes that run your function failed: {err}") from None
    found = []
    for i, parcel in enumerate(parcels):
        ranks = [per_rank[rank][i] for rank in range(WORLD)]
        done = {index: outcome for rank in ranks for index, outcome in rank["calls"].items()}
        found.append({"calls": [done[index] for index in range(len(calls))], "real": [r["real"] for r in ranks],
                      "printed": [r["printed"] for r in ranks], "absent": ship.absent_names(parcel)})
    return found


def gathered(fn, calls: list, real: Real | None, forbidden: tuple):
    """In grading's learner process (``boundary.Remote.apply``): :func:`_gather` of the learner's own function
    there, as plain data (exceptions as ``boundary.exception_data``)."""
    return _as_data(_gather([fn], calls, real, forbidden)[0])


def _as_data(value):
    if isinstance(value, BaseException):
        return {"raised": boundary.exception_data(value)}
    if type(value) in (tuple, list):
        return type(value)(_as_data(item) for item in value)
    if type(value) is dict:
        return {key: _as_data(item) for key, item in value.items()}
    return value


def _from_data(value):
    """What :func:`gathered` sent, its exceptions rebuilt (the built-in, torch or package type, else a
    ``boundary.LearnerError`` of the same name)."""
    if type(value) is dict and set(value) == {"raised"}:
        return boundary.rebuilt(value["raised"])
    if type(value) in (tuple, list):
        return type(value)(_from_data(item) for item in value)
    if type(value) is dict:
        return {key: _from_data(item) for key, item in value.items()}
    return value


class Other:
    """A returned value that is neither a tensor, a sequence nor None, shown by what it is."""

    def __init__(self, packed):
        self.text = ship.describe(packed)

    def __repr__(self) -> str:
        return self.text


def _value(packed):
    """A value of :func:`ship.plain` as the learner's function returned it."""
    kind = packed[0]
    if kind == "tensor":
        return packed[1]
    if kind == "sequence":
        items = [_value(item) for item in packed[2]]
        return items if packed[1] == "list" else tuple(items)
    return None if kind == "none" else Other(packed)


def _put(arg, after) -> None:
    """Change ``arg`` in place into ``after``, as the learner's call changed it in the worker."""
    if isinstance(arg, torch.Tensor) and isinstance(after, torch.Tensor):
        arg.set_(after.to(arg.dtype).clone())
    elif isinstance(arg, list):
        arg[:] = after if isinstance(after, (tuple, list)) else [after]
    elif isinstance(arg, tuple) and isinstance(after, (tuple, list)):
        for a, b in zip(arg, after):
            _put(a, b)


class Recorded:
    """The learner's function as the workers saw it: called with a case's arguments, it does what it did there."""

    def __init__(self, record: dict | None, calls: list, what: str, given=None):
        self.record, self.calls, self.what, self.given = record, calls, what, given

    def __call__(self, *args):
        if self.record is None:
            name = self.what.removeprefix("your ")
            raise ExerciseError(f"the checker takes your function itself, e.g. check_{name}({name}), without "
                                f"parentheses after its name; it got a {type(self.given).__name__}.")
        if isinstance(args[0], Real):
            raised = [value for kind, value in self.record["real"] if kind == "raised"]
            if raised:
                raise self.error(raised[0])
            return _combined(self.record["real"], args[0].kind)
        index = next(i for i, (given, _, _) in enumerate(self.calls) if _same(given, args))
        (kind, value), changed = self.record["calls"][index]
        for i, after in changed.items():
            _put(args[i], _value(after))
        if kind == "raised":
            raise self.error(value)
        return _value(value)

    def error(self, err: BaseException) -> BaseException:
        """The learner's exception; an ExerciseError where it comes from the shipping (a forbidden function, a
        global that could not be sent)."""
        if isinstance(err, ship.Forbidden):
            return ExerciseError(f"{self.what} is not accepted: {err}.")
        name = str(err).split("'")[1] if isinstance(err, NameError) and "'" in str(err) else None
        absent = self.record["absent"]
        if name in absent:
            return ExerciseError(
                f"{self.what} raised NameError: {err}. Your function uses `{name}`, a {absent[name]} from the "
                f"notebook, which cannot be sent to the worker processes: make it inside the function, or pass "
                f"what it holds as numbers.")
        if name is not None:
            return ExerciseError(
                f"{self.what} raised NameError: {err}. The worker processes receive your function with the modules, "
                f"functions and values it names; define or import `{name}` in the cell of your function.")
        return err

    def show(self) -> None:
        """Print what the function printed in the workers (a print is how a learner looks inside a function)."""
        for rank, text in enumerate(self.record["printed"] if self.record else []):
            if text:
                cut = f"\n[... {len(text) - 2000} more characters]" if len(text) > 2000 else ""
                print(f"Printed by your function in worker rank {rank}:\n{text[:2000].rstrip()}{cut}")


def verdicts(exercises: list, answers: list, ranks: tuple[int, int], forbidden: tuple = ((), "")) -> list:
    """For each answer, a function of nothing that judges it (prints what it printed and the verdict, or raises
    ExerciseError), every callable answer run in one launch on the cases of ``exercises``: judged by each in turn,
    the first that finds it wrong says why, the last prints the verdict (an exercise that asks for two independent
    things, rows and a refusal, names a mistake in one whatever the other). ``ranks``: the positions of the rank and
    the world size among a case's arguments; ``forbidden``: (dotted names, the exercise's words) of the functions
    the exercise forbids, made to raise in the workers, where grading's guard does not reach."""
    cases = [case for exercise in exercises for case in exercise.cases]
    calls = [(c.args, c.args[ranks[0]], c.args[ranks[1]]) for c in cases if not isinstance(c.args[0], Real)]
    real = next((c.args[0] for c in cases if isinstance(c.args[0], Real)), None)
    fns = [answer for answer in answers if callable(answer)]
    if fns and all(isinstance(fn, boundary.Remote) for fn in fns):
        records = iter([_from_data(fn.apply(f"{__name__}:gathered", calls, real, forbidden)) for fn in fns])
    else:
        records = iter(_gather(fns, calls, real, forbidden) if fns else [])

    def verdict(recorded):
        recorded.show()
        for exercise in exercises[:-1]:
            with contextlib.redirect_stdout(io.StringIO()):
                check(exercise, recorded)
        check(exercises[-1], recorded)
    what = exercises[0].what
    return [functools.partial(verdict, Recorded(next(records) if callable(a) else None, calls, what, a))
            for a in answers]
