"""attention_course/distributed/trial.py: a learner's function sent by value to worker processes (ship.py), run there
on an exercise's cases and for real, and what it did replayed here for the diagnosis mechanism. The real runs'
local simulation is the code the workers run, without the messages; the checkers that use all this are tested in
tests/test_exercises_ch11.py and tests/mutants/ch11.py."""
import functools
import math
import multiprocessing
import pickle
import threading

import pytest
import torch
import torch.nn.functional as F

from attention_course.distributed import launch, ship, trial
from attention_course.exercises import ExerciseError
from attention_course.exercises.diagnose import Case, Exercise, check

DT = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


# ---------------------------------------------------------------------------------------------------------
# Sending a function to the workers (in this process: pack, then unpack as a worker does)


def roundtrip(fn):
    parcel = pickle.loads(pickle.dumps(ship.pack(fn)))  # what crosses to the worker is data alone
    return ship.unpack(parcel), parcel


NOTEBOOK_CELL = '''
import math
SCALE = 3.0

def helper(x):
    return x * SCALE

def answer(x, power=2):
    return helper(x) ** power + math.pi * len([t for t in range(2)])

def recursive(n):
    return 1 if n == 0 else n * recursive(n - 1)
'''


def test_a_function_from_a_notebook_cell_is_rebuilt_with_what_it_uses():
    """A cell's functions live in module __main__ with no source file: they go as code, with their globals (a
    helper, a constant, a module), their defaults, and recursion."""
    cell = {"__name__": "__main__"}
    exec(compile(NOTEBOOK_CELL, "<cell>", "exec"), cell)
    rebuilt, parcel = roundtrip(cell["answer"])
    assert rebuilt(torch.tensor(2.0)).item() == pytest.approx(36 + 2 * math.pi)
    assert rebuilt is not cell["answer"] and rebuilt.__globals__ is not cell
    assert roundtrip(cell["recursive"])[0](5) == 120
    assert set(parcel["spaces"][0]) == {"helper", "SCALE", "math"}  # only what the code names


def test_closures_lambdas_and_wrappers_are_rebuilt():
    offset = torch.tensor(1.5)

    def inner(x):
        return x + offset

    @functools.wraps(inner)
    def wrapper(*args):  # a guard around the learner's function (grading wraps each one so)
        raise AssertionError("the wrapper is not what is sent")

    assert roundtrip(inner)[0](torch.tensor(1.0)).item() == 2.5
    assert roundtrip(wrapper)[0](torch.tensor(1.0)).item() == 2.5
    assert roundtrip(lambda x, k=2: torch.cat([x] * k))[0](torch.ones(1)).tolist() == [1.0, 1.0]
    assert roundtrip(torch.cat)[0] is torch.cat  # a library function: by reference
    assert roundtrip(trial.empty_state)[0] is trial.empty_state


LOCK = threading.Lock()


def recorded(record: dict, calls=(), what="your f") -> trial.Recorded:
    return trial.Recorded({"calls": [], "real": [], "printed": [], "absent": {}, **record}, list(calls), what)


def test_a_global_that_cannot_be_sent_is_named():
    def uses_lock():
        with LOCK:
            return 1
    rebuilt, parcel = roundtrip(uses_lock)
    with pytest.raises(NameError):
        rebuilt()
    assert ship.absent_names(parcel) == {"LOCK": "lock"}
    message = str(recorded({"absent": {"LOCK": "lock"}}).error(NameError("name 'LOCK' is not defined")))
    assert "uses `LOCK`, a lock from the notebook, which cannot be sent to the worker processes" in message
    message = str(recorded({}).error(NameError("name 'helper' is not defined")))
    assert "define or import `helper` in the cell of your function" in message


def test_a_forbidden_function_raises_in_a_worker_under_any_name(monkeypatch):
    """What the workers do with an exercise's forbidden functions: the module attribute and the function's own code
    raise (so an alias imported before still does), quoting the rule; the checker says it is not accepted."""
    import attention_course.masks as masks

    original, code = masks.padding_mask, masks.padding_mask.__code__
    monkeypatch.setattr(masks, "padding_mask", original)
    monkeypatch.setattr(original, "__code__", code)
    ship.forbid(["attention_course.masks.padding_mask"], "*without* the package's `padding_mask`")
    for fn in (masks.padding_mask, original):
        with pytest.raises(ship.Forbidden, match="may not be used in this exercise"):
            fn(torch.tensor([3]), 4)
    assert str(recorded({}).error(ship.Forbidden("x may not be used"))) == "your f is not accepted: x may not be used."


# ---------------------------------------------------------------------------------------------------------
# A record replayed


def test_a_record_replays_values_exceptions_and_inputs_changed():
    """Called with a recorded call's arguments (a fresh copy, as the mechanism makes), a record returns the value
    the worker saw, raises its exception, and changes the arguments the call changed."""
    x, y = torch.arange(3.0), torch.ones(2)
    calls = [((x, 1), 0, 1), ((y, 2), 0, 1), ((y, 3), 0, 1)]
    doubled = ship.plain((x * 2, [x]))
    rec = recorded({"calls": [(("ok", doubled), {0: ship.plain(x + 1)}), (("raised", ValueError("no")), {}),
                              (("ok", ship.plain(iter([]))), {})]}, calls)
    arg = x.clone()
    value = rec(arg, 1)
    assert torch.equal(value[0], x * 2) and type(value) is tuple and type(value[1]) is list
    assert torch.equal(arg, x + 1)  # changed in place, as in the worker
    with pytest.raises(ValueError, match="no"):
        rec(y.clone(), 2)
    assert repr(rec(y.clone(), 3)) == "a list_iterator"


def test_a_value_instead_of_a_function_is_told_without_a_launch():
    rec = trial.Recorded(None, [], "your split_in_proj", (torch.zeros(2), torch.zeros(1)))
    with pytest.raises(ExerciseError, match=r"check_split_in_proj\(split_in_proj\), without parentheses.*a tuple"):
        rec(1)


# ---------------------------------------------------------------------------------------------------------
# The real runs, simulated here: the code the workers run


def sdpa(q, k, v, pad, causal):
    N = q.shape[2]
    allowed = torch.ones(q.shape[0], 1, N, N, dtype=torch.bool)
    if causal:
        allowed = allowed & torch.ones(N, N, dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=allowed & ~pad[:, None, None, :])


def ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    src = (rank - step) % world_size
    if is_causal and src > rank:
        return state
    scores = q @ k.mT / math.sqrt(q.shape[-1])
    if is_causal and src == rank:
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), -math.inf)
    scores = scores.masked_fill(key_padding_mask[:, None, None, :], -math.inf)
    m, l, acc = state
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    shift = m_new.masked_fill(m_new == -math.inf, 0.0)
    p, c = torch.exp(scores - shift), torch.exp(m - shift)
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ v


@pytest.mark.parametrize("N, causal, lengths", [(7, True, (7, 5)), (8, False, (8, 3)), (5, True, (5, 5))])
def test_the_ring_simulated_here_is_attention_over_the_whole_sequence(N, causal, lengths):
    """Theorem 11.2 on the real run's code: the ranks' acc / l, each rank's steps chained, is SDPA."""
    q, k, v = randn(2, 2, N, 4, seed=1) * 1.5, randn(2, 2, N, 4, seed=2), randn(2, 2, N, 4, seed=3)
    pad = torch.arange(N)[None, :] >= torch.tensor(lengths)[:, None]
    real = trial.Real("ring", {"q": q, "k": k, "v": v, "pad": pad, "causal": causal})
    torch.testing.assert_close(real.simulate(ring_step), sdpa(q, k, v, pad, causal), atol=1e-12, rtol=0)


def split(weight, bias, h, r, P):
    E = weight.shape[1]
    d, n = E // h, h // P
    return weight.view(3, h, d, E)[:, r * n:(r + 1) * n].reshape(-1, E), bias.view(3, h, d)[:, r * n:(r + 1) * n].reshape(-1)


def layer_data(E=8, h=4):
    torch.manual_seed(E + h)
    mha = torch.nn.MultiheadAttention(E, h, batch_first=True, dtype=DT)
    with torch.no_grad():
        mha.in_proj_bias.uniform_(-1, 1)
        mha.out_proj.bias.uniform_(-1, 1)
    x = randn(2, 5, E, seed=h)
    with torch.no_grad():
        want = mha(x, x, x, need_weights=False)[0]
    return want, {"x": x, "num_heads": h, "in_proj_weight": mha.in_proj_weight.detach(), "in_proj_bias":
                  mha.in_proj_bias.detach(), "out_weight": mha.out_proj.weight.detach(),
                  "out_bias": mha.out_proj.bias.detach()}


@pytest.mark.parametrize("E, h, P", [(8, 4, 1), (8, 4, 2), (12, 6, 3), (8, 4, 4)])
def test_heads_split_over_ranks_and_summed_give_the_layer(E, h, P):
    """Theorem 11.1 on the real run's code: each rank's rows of in_proj and its columns of out_proj, the ranks'
    parts summed, plus the output bias once, give nn.MultiheadAttention's output."""
    want, data = layer_data(E, h)
    for outcome in trial._heads_here(split, P, data):
        torch.testing.assert_close(outcome[1], want, atol=1e-12, rtol=0)


def test_a_rank_that_raises_or_returns_no_state_decides_the_real_run():
    want, data = layer_data()
    with pytest.raises(ValueError, match="rank 1"):
        trial.Real("heads", data).simulate(lambda w, b, h, r, P: split(w, b, h, r, P) if r == 0 else
                                           int("rank 1"))
    q = randn(1, 1, 4, 2)
    ring = trial.Real("ring", {"q": q, "k": q, "v": q, "pad": torch.zeros(1, 4, dtype=torch.bool), "causal": False})
    assert ring.simulate(lambda state, *args: None) is None


def times_rank(x, rank, world_size):
    import torch.distributed as dist

    return x * dist.get_rank() / dist.get_world_size()


# A toy exercise judged from records: x * rank / world_size on every rank of worlds of 1 and 3.
TOY = Exercise(what="your toy", reference=lambda x, rank, world_size: x * rank / world_size,
               cases=[Case(f"rank {r} of {P}", (torch.arange(4.0), r, P)) for P in (1, 3) for r in range(P)],
               mistakes=[], passed="every rank.", run=trial.run)


@pytest.mark.slow
def test_the_workers_record_every_call_with_the_rank_simulated(capsys):
    """One launch for two answers: the simulated rank and world size answer dist.get_rank() and get_world_size(),
    what a function prints comes back, and the verdicts are the mechanism's; no process is left."""
    def chatty(x, rank, world_size):
        print("rank", rank)
        return x * 0

    right, wrong = trial.verdicts([TOY], [times_rank, chatty], (1, 2))
    right()
    assert capsys.readouterr().out.startswith("Correct: every rank.")
    with pytest.raises(ExerciseError, match="rank 1 of 3: your toy's result"):
        wrong()
    assert "Printed by your function in worker rank 0:\nrank 0" in capsys.readouterr().out
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_a_hang_ends_in_a_message_and_leaves_no_process(monkeypatch):
    import time

    monkeypatch.setattr(trial, "TIMEOUT", 2.0)

    def sleeps(*args):
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(ExerciseError, match="did not return in the worker processes within 2 s"):
        trial.verdicts([TOY], [sleeps], (1, 2))[0]()
    assert time.monotonic() - start < 50
    assert multiprocessing.active_children() == []


@pytest.mark.slow
def test_the_workers_alone_launch_and_return_nothing_for_no_answer():
    assert launch(2, trial._worker, {"answers": [], "calls": [], "real": None, "forbidden": ([], "")}) == [[], []]
    check(TOY, lambda x, rank, world_size: x * rank / world_size)
