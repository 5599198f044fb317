"""The exercise checkers of chapter 11: their private references are right (the tensor-parallel identity: a layer's
heads split over ranks and summed give the layer; the ring: every rank's merged steps give attention over the whole
sequence), a learner's function reaches the worker processes by value (a notebook cell's, a lambda, helpers,
closures), a hang ends in a message, and grading runs them where it runs: in the sandbox without a network. Every
mutant of tests/mutants/ch11.py is run by tests/test_mutation.py, in one launch per checker."""
import contextlib
import functools
import io
import math
import multiprocessing
import pickle
import signal
import sys
import threading
import time
from pathlib import Path

import pytest
import torch

from attention_course.distributed import ship
from attention_course.exercises import ExerciseError, ch11
from mutants.ch11 import RING_CELL, SETUP, SPLIT_CELL

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


# ---------------------------------------------------------------------------------------------------------
# The references, in this process


@pytest.mark.parametrize("E, h, P", [(8, 4, 1), (8, 4, 2), (12, 6, 3), (8, 4, 4)])
def test_heads_split_over_ranks_and_summed_give_the_layer(E, h, P):
    """The block-matrix identity behind tensor parallelism: with each rank's rows of in_proj (the reference split)
    and its columns of out_proj, the sum over ranks of their heads' output, plus the output bias once, is
    nn.MultiheadAttention's output."""
    torch.manual_seed(E + h + P)
    mha = torch.nn.MultiheadAttention(E, h, batch_first=True, dtype=DT)
    with torch.no_grad():
        mha.in_proj_bias.uniform_(-1, 1)
        mha.out_proj.bias.uniform_(-1, 1)
    x = randn(2, 5, E, seed=P)
    total = mha.out_proj.bias.detach().clone()
    n, d = h // P, E // h
    for rank in range(P):
        w, b = ch11._reference_split_in_proj(mha.in_proj_weight.detach(), mha.in_proj_bias.detach(), h, rank, P)
        cols = mha.out_proj.weight.detach()[:, rank * n * d:(rank + 1) * n * d]
        total = total + ch11._heads_output(x, w, b, cols, n)
    with torch.no_grad():
        torch.testing.assert_close(total, mha(x, x, x, need_weights=False)[0], atol=1e-12, rtol=0)


def test_the_ranks_rows_partition_in_proj():
    """Over the ranks, every row of in_proj_weight (and entry of the bias) is taken once, and each rank's rows are
    those of its own heads in W_q, W_k and W_v."""
    E, h, P = 12, 6, 3
    weight, bias = torch.arange(3 * E, dtype=DT)[:, None].expand(3 * E, E).clone(), torch.arange(3 * E, dtype=DT)
    taken = torch.cat([ch11._reference_split_in_proj(weight, bias, h, r, P)[1] for r in range(P)])
    assert sorted(taken.long().tolist()) == list(range(3 * E))
    rows = ch11._reference_split_in_proj(weight, bias, h, 1, P)[0][:, 0].long().tolist()
    assert rows == [4, 5, 6, 7, 16, 17, 18, 19, 28, 29, 30, 31]  # heads 2 and 3 (d = 2) of W_q, W_k, W_v
    with pytest.raises(ValueError):
        ch11._reference_split_in_proj(weight, bias, h, 0, 4)


def test_the_package_splits_as_the_checker_does():
    """The chapter's own helper, where the package has it, is a right answer (one convention throughout)."""
    distributed = pytest.importorskip("attention_course.distributed")
    split = getattr(distributed, "split_in_proj_by_heads", None)
    if split is None:
        pytest.skip("attention_course.distributed has no split_in_proj_by_heads")
    weight, bias = randn(24, 8, seed=3), randn(24, seed=4)
    for rank in range(2):
        got = split(weight, 4, rank, 2)
        want = ch11._reference_split_in_proj(weight, bias, 4, rank, 2)[0]
        torch.testing.assert_close(got if isinstance(got, torch.Tensor) else got[0], want, atol=0, rtol=0)


def run_ring(step, case):
    """acc / l of every rank of a simulated ring, concatenated along the sequence."""
    what, q, k, v, pad, P, causal = case
    blocks = [ch11._blocks(t, P, dim) for t, dim in ((q, 2), (k, 2), (v, 2), (pad, 1))]
    outs = []
    for r in range(P):
        state = ch11._empty_state(blocks[0][r])
        for s in range(P):
            src = (r - s) % P
            state = step(state, blocks[0][r], blocks[1][src], blocks[2][src], blocks[3][src], s, r, P, causal)
        outs.append(state[2] / state[1])
    return torch.cat(outs, dim=2)


def test_the_ring_of_reference_steps_is_attention_over_the_whole_sequence():
    """The theorem the ring checker rests on (chapter 8's merge, applied around the ring): for every case, 1 to 4
    ranks, uneven blocks, padding, causal, the ranks' acc / l put together is SDPA over the whole sequence."""
    cases, real, want = ch11._ring_job()
    for case in cases:
        what, q, k, v, pad, P, causal = case
        want_case = ch11._full_attention(q, k, v, pad, causal)
        torch.testing.assert_close(run_ring(ch11._reference_ring_step, case), want_case, atol=1e-12, rtol=0, msg=what)
    q, k, v, pad = real["q"], real["k"], real["v"], real["pad"]
    assert torch.isfinite(want).all()
    torch.testing.assert_close(run_ring(ch11._reference_ring_step, ("real", q, k, v, pad, ch11.WORLD, True)), want,
                               atol=1e-12, rtol=0)


def test_every_ring_mistake_changes_the_result_of_some_case():
    """No mistake of the catalogue is invisible to the cases (else the checker could not see it)."""
    cases, _, _ = ch11._ring_job()
    for switches, message in ch11._RING_MISTAKES:
        step = functools.partial(ch11._ring_step, **switches)
        assert any(not ch11.close(run_ring(step, case), run_ring(ch11._reference_ring_step, case), 1e-8)
                   for case in cases), message


def test_a_gap_is_said_in_one_sentence():
    """The message for a state that has -inf where the merge has numbers names the entries once: a hidden diagonal
    (triu(0) for triu(1)) leaves query 0 of the own block with no key, m = -inf in 1 row of 3, for 2 x 2 heads."""
    q, k, v = randn(2, 2, 3, 4, seed=5), randn(2, 2, 3, 4, seed=6), randn(2, 2, 3, 4, seed=7)
    args = (ch11._empty_state(q), q, k, v, None, 0, 0, 1, True)
    got = ch11._ring_step(*args, causal="diagonal hidden")
    want = ch11._reference_ring_step(*args)
    assert ch11._gap("m", got[0], want[0]) == "your m has -inf at 4 of 12 entries where the merge's m is finite"
    out = got[2] / got[1]  # 0 / 0 in those rows
    assert ch11._gap("acc / l", out, want[2] / want[1], "the attention over the whole sequence") == (
        "your acc / l has NaN at 16 of 48 entries where the attention over the whole sequence is finite")
    assert ch11._gap("l", got[1] + 1, got[1]) == "your l is off the merge's l by up to 1"


def test_a_causal_ring_is_unbalanced():
    """Under is_causal, rank r has r + 1 blocks to merge and skips the rest: what the chapter's zigzag balances."""
    P = 4
    merged = [sum((r - s) % P <= r for s in range(P)) for r in range(P)]
    assert merged == [1, 2, 3, 4]


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
    assert roundtrip(ch11._reference_split_in_proj)[0] is ch11._reference_split_in_proj


LOCK = threading.Lock()


def test_a_global_that_cannot_be_sent_is_named():
    def uses_lock():
        with LOCK:
            return 1
    rebuilt, parcel = roundtrip(uses_lock)
    with pytest.raises(NameError):
        rebuilt()
    assert ship.absent_names(parcel) == {"LOCK": "lock"}
    message = str(ch11._learner_error(NameError("name 'LOCK' is not defined"), "here", {"LOCK": "lock"}))
    assert "cannot be sent to the worker processes" in message


def test_a_forbidden_function_raises_in_a_worker_under_any_name(monkeypatch):
    """What _worker does with an exercise's forbidden functions: the module attribute and the function's own code
    raise (so an alias imported before still does), quoting the rule."""
    import attention_course.masks as masks

    original, code = masks.padding_mask, masks.padding_mask.__code__
    monkeypatch.setattr(masks, "padding_mask", original)
    monkeypatch.setattr(original, "__code__", code)
    ship.forbid(["attention_course.masks.padding_mask"], "*without* the package's `padding_mask`")
    for fn in (masks.padding_mask, original):
        with pytest.raises(ship.Forbidden, match="may not be used in this exercise"):
            fn(torch.tensor([3]), 4)
    message = str(ch11._learner_error(ship.Forbidden("x may not be used"), "here", {}))
    assert "not accepted" in message


# ---------------------------------------------------------------------------------------------------------
# The checkers, in worker processes


@pytest.mark.slow
def test_a_hang_ends_in_a_message_and_leaves_no_process(monkeypatch):
    monkeypatch.setattr(ch11, "TIMEOUT", 2.0)

    def sleeps(*args):
        time.sleep(60)

    start = time.monotonic()
    with pytest.raises(ExerciseError, match="did not return in the worker processes within 2 s"):
        ch11.check_split_in_proj(sleeps)
    assert time.monotonic() - start < 50
    assert multiprocessing.active_children() == []




@pytest.mark.slow
@pytest.mark.needs("bwrap")
def test_grading_reruns_both_checks_in_its_sandbox():
    """instructor/verdict.py's check server, in the bubblewrap sandbox with no network (--unshare-net): the solution
    cells' definitions run in the student's process (attention_course.boundary), which starts the worker processes
    (they meet on 127.0.0.1, the sandbox's own loopback) and sends their results back as plain data; the check runs
    in the server. A right split passes; a ring step that forgets to rescale is named, though its cell also replaces
    the checker's judge, where its code runs (in a default argument, evaluated at definition): the judge that decides
    is the server's. Bare (make grade --no-sandbox), the same server: tests/test_nothing_outside.py, in a namespace
    of its own beside a process and a file that must outlive it."""
    rerun_both_checks(sandboxed=True)


def rerun_both_checks(sandboxed: bool) -> None:
    sys.path.insert(0, str(ROOT))
    from instructor import verdict

    module = "attention_course.exercises.ch11"
    checks = {
        "ex-ch11-split-in-proj": {"check": "check_split_in_proj(split_in_proj)", "module": module,
                                  "checkers": ["check_split_in_proj"], "arguments": ["split_in_proj"],
                                  "forbidden": [], "rule": ""},
        "ex-ch11-ring-step": {"check": "check_ring_step(ring_step)", "module": module, "checkers": ["check_ring_step"],
                              "arguments": ["ring_step"], "forbidden": [], "rule": ""},
    }
    plan = verdict.Plan("11_distributed", [SETUP], checks, {label: 1 for label in checks})
    server = verdict.Server(plan, [], 4 * 2**30, sandboxed=sandboxed)
    unscaled = RING_CELL.replace("old * l", "l").replace("old * acc", "acc") + (
        "import attention_course.exercises.ch11 as grader\n"
        "def _quiet(_=grader._EXERCISES.update(ring=(grader._ring_job, lambda *args: None, lambda: ([], ''),\n"
        "                                             'Correct!'))):\n"
        "    pass\n")
    try:
        server.start()
        found = server.check("student", [("ex-ch11-split-in-proj", SPLIT_CELL), ("ex-ch11-ring-step", unscaled)],
                             120)
    finally:
        folder = server.folder
        server.stop()
    assert not folder.exists() and not folder.with_suffix(".log").exists()  # nothing left in /tmp
    assert server.setup_errors == []
    assert found["ex-ch11-split-in-proj"]["passed"] is True, found
    assert found["ex-ch11-split-in-proj"]["message"].startswith("Correct"), found
    assert found["ex-ch11-ring-step"]["passed"] is False, found
    assert "NEITHER l NOR acc IS RESCALED" in found["ex-ch11-ring-step"]["message"], found


def forked_check(check, answer) -> str:
    """``check(answer)`` in a fork of this process, as grading's check server runs each check: its message."""
    import os

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: one thread, as the check server sets before it forks (OpenMP does not survive a fork)
        os.close(read)
        signal.alarm(120)
        torch.set_num_threads(1)
        try:
            with contextlib.redirect_stdout(io.StringIO()) as out:
                check(answer)
            message = out.getvalue()
        except BaseException as err:  # noqa: BLE001
            message = f"{type(err).__name__}: {err}"
        os.write(write, message.encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        message = pipe.read()
    os.waitpid(pid, 0)
    return message


@pytest.mark.slow
def test_a_check_runs_in_a_fork_of_a_process_that_launched():
    """Grading's check server launches in its setup (the chapter's cells), then forks a child per check: the check
    runs there, with a fork server of the child's own."""
    from attention_course.distributed import launch

    assert launch(2, ch11._verdicts.__globals__["_worker"], {"exercise": "split", "answers": [], "cases": [],
                                                            "real": None, "forbidden": [], "rule": ""}) == [[], []]
    message = forked_check(ch11.check_split_in_proj, ch11._reference_split_in_proj)
    assert message.startswith("Correct"), message


@pytest.mark.slow
def test_a_right_ring_step_from_a_cell_passes(capsys):
    """The ring checker on its own path (one launch, one answer), given a function written in a cell."""
    cell = {"__name__": "__main__"}
    exec(compile(SETUP + RING_CELL, "<cell>", "exec"), cell)
    ch11.check_ring_step(cell["ring_step"])
    out = capsys.readouterr().out
    assert out.startswith("Correct") and all(len(line) <= 79 for line in out.splitlines())


@pytest.mark.slow
def test_a_hidden_diagonal_is_named(capsys):
    """triu(0) for triu(1) in a cell's ring_step: the checker says that each query's own key is hidden."""
    cell = {"__name__": "__main__"}
    assert RING_CELL.count(".triu(1)") == 1
    exec(compile(SETUP + RING_CELL.replace(".triu(1)", ".triu(0)"), "<cell>", "exec"), cell)
    with pytest.raises(ExerciseError) as err:
        ch11.check_ring_step(cell["ring_step"])
    message = str(err.value)
    assert "rank 0, step 0 (its own block" in message, message
    assert "each query's OWN KEY is hidden (causal)" in message and "triu(1), not triu(0)" in message, message


def test_the_spec_names_every_exercise():
    for name in ("split_in_proj(in_proj_weight, in_proj_bias, num_heads, rank, world_size)",
                 "ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)",
                 "ex-ch11-split-in-proj", "ex-ch11-ring-step"):
        assert name in ch11.__doc__, name


@pytest.mark.slow
def test_what_the_learners_function_prints_in_the_workers_is_shown(capsys):
    """A worker's standard output reaches no notebook: it comes back with the results and is printed before the
    verdict (a print is how a learner looks inside a function)."""
    def chatty(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
        if (num_heads, rank, world_size) == (4, 1, 2):
            print("rank 1 of 2 sees", tuple(in_proj_weight.shape))
        return ch11._reference_split_in_proj(in_proj_weight, in_proj_bias, num_heads, rank, world_size)

    ch11.check_split_in_proj(chatty)
    out = capsys.readouterr().out
    assert "Printed by your function in worker rank 0:\nrank 1 of 2 sees (24, 8)" in out  # its simulated case
    assert "Printed by your function in worker rank 1:\nrank 1 of 2 sees (24, 8)" in out  # the real run
    assert out.index("Printed") < out.index("Correct")
