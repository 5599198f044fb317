"""The exercise checkers of chapter 11: their cases cover every size the statements leave free, their references
are right (the tensor-parallel identity and the ring are tested on the real runs' code in tests/test_trial.py), and
grading runs them where it runs: in the sandbox without a network. Every mutant of tests/mutants/ch11.py is run by
tests/test_mutation.py, in one launch per checker; every mistake of the catalogues by tests/test_catalogues.py."""
import contextlib
import io
import signal
import sys
from pathlib import Path

import pytest
import torch

from attention_course.distributed import trial
from attention_course.exercises import ExerciseError, ch11
from mutants.ch11 import RING_CELL, SETUP, SPLIT_CELL

ROOT = Path(__file__).resolve().parents[1]
DT = torch.float64


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=DT)


# ---------------------------------------------------------------------------------------------------------
# The cases and the references, in this process


def test_the_split_cases_cover_every_free_size_and_every_rank():
    """D, num_heads and world_size vary (d = 1 and d = D, one rank, one head per rank, world_size > num_heads),
    every rank of each world is a case, and the worlds that do not divide the heads ask for ValueError."""
    worlds, cases = {}, ch11.SPLIT.cases[:-1] + ch11.REFUSE.cases
    assert type(ch11.SPLIT.cases[-1].args[0]) is trial.Real and ch11.SPLIT.cases[-1].size == float("inf")
    for case in cases:
        w, b, h, r, P = case.args
        worlds.setdefault((w.shape[1], h, P), []).append(r)
    assert {E // h for E, h, P in worlds} >= {1, 2, 4, 6} and {P for _, _, P in worlds} == {1, 2, 3, 4}
    assert all(ranks == list(range(P)) for (E, h, P), ranks in worlds.items() if h % P == 0)
    assert {(h, P) for E, h, P in worlds if h % P} == {(6, 4), (2, 4), (3, 4)}  # (3, 4): P divides neither h nor D
    assert all(case.args[2] % case.args[4] for case in ch11.REFUSE.cases)
    for case in ch11.REFUSE.cases:
        with pytest.raises(ValueError):
            ch11._split(*case.args)


def test_the_ranks_rows_partition_in_proj():
    """Over the ranks, every row of in_proj_weight (and entry of the bias) is taken once, and each rank's rows are
    those of its own heads in W_q, W_k and W_v."""
    E, h, P = 12, 6, 3
    weight, bias = torch.arange(3 * E, dtype=DT)[:, None].expand(3 * E, E).clone(), torch.arange(3 * E, dtype=DT)
    taken = torch.cat([ch11._split(weight, bias, h, r, P)[1] for r in range(P)])
    assert sorted(taken.long().tolist()) == list(range(3 * E))
    rows = ch11._split(weight, bias, h, 1, P)[0][:, 0].long().tolist()
    assert rows == [4, 5, 6, 7, 16, 17, 18, 19, 28, 29, 30, 31]  # heads 2 and 3 (d = 2) of W_q, W_k, W_v


def test_the_package_splits_as_the_checker_does():
    """The chapter's own helper is a right answer (one convention throughout)."""
    from attention_course.distributed import split_in_proj_by_heads

    weight, bias = randn(24, 8, seed=3), randn(24, seed=4)
    for rank in range(2):
        torch.testing.assert_close(split_in_proj_by_heads(weight, 4, rank, 2), ch11._split(weight, bias, 4, rank, 2)[0],
                                   atol=0, rtol=0)


def test_the_ring_cases_are_every_step_of_every_rank_from_the_references_state():
    """Worlds of 1 to 4, uneven blocks, padding (a block all padding met first), causal, 1 to 3 heads of sizes 2 to 4;
    each rank's steps in turn, each case's state the reference's after the steps before it, and a rank's last state
    gives SDPA of its queries over the whole sequence (Theorem 11.2 on the cases themselves)."""
    import torch.nn.functional as F

    cases, i, seen = [c.args for c in ch11._ring_cases()[:-1]], 0, set()
    assert len(cases) == len(ch11.RING.cases) - 1
    while i < len(cases):
        state, q, k, v, pad, s, r, P, causal = cases[i]
        steps, i = cases[i:i + P], i + P
        seen |= {(P, causal, pad is not None, q.shape[1], q.shape[3])}
        assert [a[5:8] for a in steps] == [(s, r, P) for s in range(P)]
        assert all(torch.equal(a, b) for a, b in zip(state, trial.empty_state(q)))
        for a, b in zip(steps, steps[1:]):
            assert all(torch.equal(x, y) for x, y in zip(ch11._ring_step(*a), b[0]))
        m, l, acc = ch11._ring_step(*steps[-1])
        held = sorted(steps, key=lambda a: (r - a[5]) % P)  # by block: 0, 1, ..., P - 1
        keys, values = torch.cat([a[2] for a in held], 2), torch.cat([a[3] for a in held], 2)
        start = sum(a[2].shape[2] for a in held[:r])  # the position of this rank's first query
        allowed = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool)
        if causal:
            allowed = torch.arange(keys.shape[2])[None, :] <= start + torch.arange(q.shape[2])[:, None]
        if pad is not None:
            allowed = allowed & ~torch.cat([a[4] for a in held], 1)[:, None, None, :]
        torch.testing.assert_close(acc / l, F.scaled_dot_product_attention(q, keys, values, attn_mask=allowed),
                                   atol=1e-12, rtol=0)
    assert {P for P, *_ in seen} == {1, 2, 3, 4} and {(3, True, True), (2, False, True)} <= {x[:3] for x in seen}
    assert {x[3:] for x in seen} >= {(1, 2), (3, 3), (2, 4), (1, 4)}
    assert any(s == 0 and bool(pad.all(-1).any()) for _, _, _, _, pad, s, *_ in cases if pad is not None)
    assert type(ch11.RING.cases[-1].args[0]) is trial.Real and ch11.RING.cases[-1].size == float("inf")


def test_a_causal_ring_is_unbalanced():
    """Under is_causal, rank r has r + 1 blocks to merge and skips the rest: what the chapter's zigzag balances."""
    P = 4
    merged = [sum((r - s) % P <= r for s in range(P)) for r in range(P)]
    assert merged == [1, 2, 3, 4]


# ---------------------------------------------------------------------------------------------------------
# The checkers, in worker processes


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
        "import attention_course.distributed.trial as grader\n"
        "def _quiet(_=setattr(grader, 'check', lambda *args: print('Correct!'))):\n"
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
    assert "NEITHER l NOR acc" in found["ex-ch11-ring-step"]["message"], found


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

    assert launch(2, trial._worker, {"answers": [], "calls": [], "real": None, "forbidden": ([], "")}) == [[], []]
    message = forked_check(ch11.check_split_in_proj, ch11._split)
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
    assert "rank 2, step 0 (its own block" in message, message
    assert "hides each query's OWN KEY (causal)" in message and "triu(1), not triu(0)" in message, message


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
        return ch11._split(in_proj_weight, in_proj_bias, num_heads, rank, world_size)

    ch11.check_split_in_proj(chatty)
    out = capsys.readouterr().out
    assert out.count("rank 1 of 2 sees (24, 8)") == 2  # its simulated case, and the real run:
    assert out.endswith("rank 1 of 2 sees (24, 8)\n" + out[out.index("Correct"):])  # rank 1's, printed last
    assert out.index("Printed") < out.index("Correct")


def test_a_wrong_shard_is_told_which_rows_it_holds():
    """A wrong split_in_proj is told which rows of in_proj_weight its weight holds (W_v's missing here), against the
    rank's own (what the checker adds to the shape it reports); nothing where the rows are right."""
    case = next(c for c in ch11.SPLIT.cases if c.name == "4 heads of size 1 over 2 ranks, rank 0")
    w, b, h, r, P = case.args
    no_v = (w.view(3, h, -1, w.shape[1])[:2, :2].reshape(-1, w.shape[1]), b.view(3, h, -1)[:2, :2].reshape(-1))
    assert ch11._rows(no_v, *case.args) == ("Its weight holds the rows [q0, q1, k0, k1] of in_proj_weight (k2: W_k's "
                                           "row 2), where rank 0's are [q0, q1, k0, k1, v0, v1].")
    assert ch11._rows(ch11._split(*case.args), *case.args) == ""  # the right rows (a wrong bias): nothing to add
