"""attention_course.distributed: launch (results, errors, timeouts, no orphans), ring attention against
F.scaled_dot_product_attention for 1-4 ranks (uneven blocks, padding, causal, zigzag), its balance and memory, and the
head-parallel layer against the unsplit one (forward, gradients, bytes communicated).

Each launch starts processes that import torch (seconds on a small machine), so one launch of 4 workers (`battery`)
runs every multi-rank case and returns the results; the tests compare them here. Checks that need a process group
but not several ranks run in this process, in a group of one (`group_of_one`)."""
import ast
import json
import mmap
import os
import pickle
import shutil
import subprocess
import sys
import tempfile
import time
import types
from pathlib import Path

import pytest
from conftest import torch_gate
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.testing import assert_close

from attention_course import MultiheadAttention
from attention_course import distributed as D

EXACT = dict(atol=1e-12, rtol=0)
WORLD = 4


# ----------------------------------------------------------------------------------------------- the cases


def ring_cases(dtype=torch.float64):
    """Whole q, k, v (B, h, L, d), dv != d, for lengths divisible by 1-4 ranks or not, and shorter than 2P (empty
    zigzag pieces); every mask: none, padding (sentence 1 all pads), causal, both; both layouts."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for L in (12, 11, 5):
        q, k = (torch.randn(2, 2, L, 4, generator=gen, dtype=dtype) for _ in range(2))
        v = torch.randn(2, 2, L, 3, generator=gen, dtype=dtype)
        pad = torch.zeros(2, L, dtype=torch.bool)
        pad[0, L - 2:] = True
        pad[1] = True  # a sentence of pads only: its queries attend to nothing and get zeros
        for masks in ({}, {"key_padding_mask": pad}, {"is_causal": True}, {"key_padding_mask": pad, "is_causal": True}):
            for layout in D.LAYOUTS:
                cases.append(dict(q=q, k=k, v=v, layout=layout, **masks))
    return cases


def balance_cases():
    """Causal, L = 64 over 4 ranks: contiguous blocks, then the zigzag."""
    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 1, 64, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    return [dict(q=q, k=k, v=v, is_causal=True, layout=layout) for layout in D.LAYOUTS]


def reference(case):
    """F.scaled_dot_product_attention over the whole sequence; rows with no key to attend to: zeros."""
    q, k, v, L = case["q"], case["k"], case["v"], case["q"].shape[2]
    allow = torch.ones(L, L, dtype=torch.bool)
    if case.get("is_causal"):
        allow = allow.tril()
    if case.get("key_padding_mask") is not None:
        allow = allow & ~case["key_padding_mask"][:, None, None, :]  # (B, 1, L, L)
    allow = allow.expand(q.shape[0], 1, L, L)
    empty = ~allow.any(-1, keepdim=True)  # (B, 1, L, 1)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=allow | empty)
    return out.masked_fill(empty, 0.0), empty


def long_input(L=256):
    """A longer sequence for the layer of tp_layers, so that the bytes of the all-reduce dwarf gloo's headers."""
    gen = torch.Generator().manual_seed(3)
    x, grad = (torch.randn(2, L, 16, generator=gen, dtype=torch.float64) for _ in range(2))
    pad = torch.zeros(2, L, dtype=torch.bool)
    pad[0, L - 7:] = True
    return x, grad, pad


def tp_layers():
    """The course's layer (packed in_proj_weight, random biases) and torch's for cross-attention with kdim, vdim
    != E (separate q/k/v weights), sequence-first."""
    torch.manual_seed(0)
    ours = MultiheadAttention(16, 4, dtype=torch.float64)
    theirs = nn.MultiheadAttention(16, 4, kdim=6, vdim=6, dtype=torch.float64)
    with torch.no_grad():
        for layer in (ours, theirs):
            layer.in_proj_bias.uniform_(-1, 1)
            layer.out_proj.bias.uniform_(-1, 1)
    gen = torch.Generator().manual_seed(2)
    x = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    grad = torch.randn(2, 5, 16, generator=gen, dtype=torch.float64)
    memory = torch.randn(7, 2, 6, generator=gen, dtype=torch.float64)  # (S, B, kdim): sequence-first
    pad = torch.zeros(2, 5, dtype=torch.bool)
    pad[1, 3:] = True
    return ours, theirs, x, grad, memory, pad


# ----------------------------------------------------------------------------------------------- the workers


def _errors(rank, world_size, fn):
    """fn's exception message, or None."""
    try:
        fn()
    except (ValueError, RuntimeError) as err:
        return f"{type(err).__name__}: {err}"
    return None


def battery(rank, world_size, cases32):
    """Every multi-rank case, in one launch of 4 ranks: ring attention in groups of 1-4 ranks, balance, validation
    across ranks, the head-parallel layer on meshes of 4 and 2."""
    from torch.distributed.device_mesh import init_device_mesh

    out = {"rank": rank, "pid": os.getpid(), "ring": {}}
    for P in (1, 2, 3, 4):
        group = None if P == world_size else dist.new_group(list(range(P)))  # every rank takes part in new_group
        if rank < P:
            results = []
            for case in ring_cases():
                cut = ((lambda x, dim: torch.tensor_split(x, P, dim)[rank]) if case["layout"] == "contiguous"
                       else (lambda x, dim: D.zigzag_split(x, P, dim)[rank]))
                mask = case.get("key_padding_mask")
                with torch.no_grad():
                    results.append(D.ring_attention(
                        cut(case["q"], 2), cut(case["k"], 2), cut(case["v"], 2), group=group,
                        key_padding_mask=None if mask is None else cut(mask, 1), is_causal=case.get("is_causal", False),
                        layout=case["layout"]))
            out["ring"][P] = results
    out["float32"] = D.ring_worker(rank, world_size, cases32)
    out["balance"] = D.ring_worker(rank, world_size, balance_cases())
    # Wrong calls, made the same way by every rank (so that none waits for the others).
    q = torch.zeros(1, 1, 11, 2)
    blocks = torch.tensor_split(q, world_size, dim=2)
    reverse = blocks[world_size - 1 - rank]  # rank order reversed: lengths [2, 3, 3, 3] for [3, 3, 3, 2]
    mine = blocks[rank]
    with torch.no_grad():
        out["errors"] = [
            _errors(rank, world_size, lambda: D.ring_attention(reverse, reverse, reverse)),
            _errors(rank, world_size, lambda: D.ring_attention(mine, mine, mine, is_causal=rank == 2)),
            _errors(rank, world_size, lambda: D.ring_attention(
                mine, mine, mine, key_padding_mask=torch.zeros(1, mine.shape[2], dtype=torch.bool) if rank else None)),
            _errors(rank, world_size, lambda: D.ring_attention(reverse, reverse, reverse, layout="zigzag")),
        ]
    # Heads over ranks: 4 ranks, then pairs of ranks (the "tp" dimension of a 2 x 2 mesh).
    ours, theirs, x, grad, memory, pad = tp_layers()
    out["tp"] = {}
    for name, mesh in (("4", init_device_mesh("cpu", (4,))),
                       ("2", init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))["tp"])):
        layer = D.parallelize_attention(ours, mesh)
        xs = x.clone().requires_grad_()
        y, weights = layer(xs, xs, xs, key_padding_mask=pad, is_causal=True)
        y.backward(grad)
        cross = D.parallelize_attention(theirs, mesh)
        xq = x.transpose(0, 1).clone().requires_grad_()  # (L, B, E)
        z, _ = cross(xq, memory, memory, key_padding_mask=torch.zeros(2, 7, dtype=torch.bool))
        z.backward(grad.transpose(0, 1))
        out["tp"][name] = dict(y=y.detach(), weights=weights, x_grad=xs.grad, grads=layer.gathered(grads=True),
                               params=layer.gathered(), z=z.detach(), xq_grad=xq.grad,
                               cross_grads=cross.gathered(grads=True))
    out["worker"] = D.head_parallel_worker(rank, world_size, ours, *long_input(), True)
    six = MultiheadAttention(12, 6)
    out["six_heads"] = _errors(rank, world_size, lambda: D.parallelize_attention(six, init_device_mesh("cpu", (4,))))
    return out


def record_pid_then(rank, world_size, folder, what):
    """Write this worker's pid to folder/<rank>, then: raise on rank 1 while rank 0 waits for it ("raise"), wait
    forever ("hang"), or end the process without a word ("die")."""
    with open(os.path.join(folder, str(rank)), "w") as f:
        f.write(str(os.getpid()))
    if what == "raise" and rank == 1:
        deadline = time.monotonic() + 60  # rank 0 in fn first (it may start later on a busy machine)
        while not os.path.exists(os.path.join(folder, "0")) and time.monotonic() < deadline:
            time.sleep(0.05)
        raise KeyError("no such head")
    if what == "raise":
        dist.recv(torch.zeros(1), src=1)  # waits for a message rank 1 never sends
    if what == "hang":
        time.sleep(600)
    if what == "die":
        os._exit(3)


def square(rank, world_size, x):
    t = torch.tensor([float(rank + 1)]) * x
    dist.all_reduce(t)
    return rank, t.item(), os.getpid()


# ----------------------------------------------------------------------------------------------- launch


@pytest.fixture(scope="module")
def battery_results():
    start = time.perf_counter()
    results = D.launch(WORLD, battery, ring_cases(torch.float32)[:8])
    print(f"\nbattery of {WORLD} workers: {time.perf_counter() - start:.1f} s")
    return results


def pids(folder, n):
    return [int(open(os.path.join(folder, str(r))).read()) for r in range(n)]


def all_dead(folder, n):
    """Every worker's process is gone (or a zombie: ended, waiting for a parent that may never reap it)."""
    for pid in pids(folder, n):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                    continue
        except OSError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            continue
        return False
    return True


@pytest.mark.slow
def test_launch_returns_results_in_rank_order(battery_results):
    assert [r["rank"] for r in battery_results] == [0, 1, 2, 3]
    pids = {r["pid"] for r in battery_results}
    assert len(pids) == WORLD and os.getpid() not in pids  # a process each
    assert [r["ring"][4][8].shape[2] for r in battery_results] == [3, 3, 3, 2]  # rank r holds block r of L = 11


GRADING_LIKE = """
import os, shutil, sys, threading
from multiprocessing import util
from attention_course import distributed as D
from test_distributed import square

def a_thread():  # a second thread, as a kernel has: workers then start from a fork server
    threading.Thread(target=threading.Event().wait, daemon=True).start()

if __name__ == "__main__":
    a_thread()
    assert [r[1] for r in D.launch(1, square, 3)] == [3.0]
    for student in range(2):  # a child per student, the parent's scratch emptied in between
        pid = os.fork()
        if pid == 0:
            try:
                if student == 0:  # a kernel's child: its own fork server; the next, a server's one-thread child: forks
                    a_thread()
                ok = [r[1] for r in D.launch(2, square, 4)] == [12.0, 12.0]  # (1 + 2) * 4
            except BaseException as error:  # noqa: BLE001
                print(repr(error), file=sys.stderr)
                ok = False
            os._exit(0 if ok else 1)
        assert os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 0, student
        shutil.rmtree(util.get_temp_dir(), ignore_errors=True)
    print("both children launched")
"""


@pytest.fixture
def scratch():
    """A short folder for a script's temporary files (TMPDIR): a script killed, or a child that ends with os._exit,
    leaves multiprocessing's pymp-* folder behind (its socket), here rather than in /tmp. Short: a socket's path must
    stay under 108 bytes."""
    folder = tempfile.mkdtemp(prefix="mp-")
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


@pytest.mark.slow
def test_a_forked_child_of_a_process_that_launched_can_launch(tmp_path, scratch):
    """As grading does: a check server launches, then forks a child per student, which launches too, while the
    server's scratch folder (where multiprocessing keeps its sockets) is emptied between students. The first child
    runs a second thread, so its workers come from a fork server of its own (the parent's is reset in it); the
    second runs one, as a check server's child does, and forks them."""
    script = tmp_path / "grading_like.py"
    script.write_text(GRADING_LIKE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path]), "TMPDIR": scratch}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and "both children launched" in run.stdout, run.stderr[-3000:]


def parent_pid(rank, world_size):
    return os.getppid()


STARTS = """
import os, sys, threading
from attention_course import distributed as D
from test_distributed import parent_pid

if __name__ == "__main__":
    alone = D.launch(2, parent_pid)  # one thread here: the workers are forks of this process
    threading.Thread(target=threading.Event().wait, daemon=True).start()
    # two: forks of a fork server (launched so in tests/test_distributed.py's other tests, from the test runner's
    # threads, and in GRADING_LIKE)
    print(alone == [os.getpid()] * 2, D.processes._context().get_start_method() == "forkserver")
"""


@pytest.mark.slow
def test_workers_fork_from_a_caller_of_one_thread_and_from_a_server_otherwise(tmp_path):
    """launch forks its workers from the caller where it runs one thread (a script, a grading server's child: no
    fork server to start, seconds each time), and from a fork server where a fork could copy another thread's
    lock (a kernel)."""
    script = tmp_path / "starts.py"
    script.write_text(STARTS)
    env = {**os.environ, "OMP_NUM_THREADS": "1",
           "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent), *sys.path])}
    run = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, env=env)
    assert run.returncode == 0 and run.stdout.split() == ["True", "True"], run.stdout + run.stderr[-3000:]


def test_the_start_method_follows_the_callers_threads(monkeypatch):
    """In process (the subprocess test above is not measured): one thread, fork, with PRELOAD imported first; several,
    the fork server; /proc unreadable, not known to run one thread."""
    P = D.processes
    monkeypatch.setattr(P, "_one_thread", lambda: True)
    assert P._context().get_start_method() == "fork" and all(module in sys.modules for module in P.PRELOAD)
    monkeypatch.setattr(P, "_one_thread", lambda: False)
    assert P._context().get_start_method() == "forkserver"
    monkeypatch.undo()

    def unreadable(path):
        raise PermissionError(path)

    monkeypatch.setattr(os, "listdir", unreadable)
    assert P._one_thread() is False


@pytest.mark.slow
def test_a_worker_error_names_its_rank_and_traceback_and_stops_the_others(tmp_path):
    with pytest.raises(D.WorkerError, match=r"worker rank 1 of 2 failed: KeyError: 'no such head'") as info:
        D.launch(2, record_pid_then, str(tmp_path), "raise")
    assert info.value.rank == 1 and info.value.world_size == 2
    assert "record_pid_then" in info.value.worker_traceback and 'raise KeyError("no such head")' in str(info.value)
    assert all_dead(tmp_path, 2)  # rank 0, which waited for rank 1, was stopped and reaped


@pytest.mark.slow
def test_a_timeout_stops_every_worker(tmp_path):
    start = time.perf_counter()
    with pytest.raises(TimeoutError, match=r"rank\(s\) \[0\] of 1 had not finished 1 s after .* collective"):
        D.launch(1, record_pid_then, str(tmp_path), "hang", timeout=1)
    assert time.perf_counter() - start < 60
    assert all_dead(tmp_path, 1)


@pytest.mark.slow
def test_a_worker_that_dies_without_a_word(tmp_path):
    with pytest.raises(D.WorkerError, match=r"rank 0 of 1 failed: the process died without reporting \(exit code 3\)"):
        D.launch(1, record_pid_then, str(tmp_path), "die")
    assert all_dead(tmp_path, 1)


@pytest.mark.slow
def test_workers_end_when_their_caller_is_killed(tmp_path, scratch):
    """A caller killed while its workers wait (a notebook kernel restarted during a launch) leaves no orphan."""
    import signal
    import subprocess

    script = (f"import test_distributed as T\nfrom attention_course import distributed as D\n"
              f"if __name__ == '__main__':\n    D.launch(2, T.record_pid_then, {str(tmp_path)!r}, 'hang')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(__file__), *sys.path]), TMPDIR=scratch)
    caller = subprocess.Popen([sys.executable, "-c", script], env=env, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while len(os.listdir(tmp_path)) < 2 or any(not open(p).read() for p in tmp_path.iterdir()):
            assert caller.poll() is None and time.monotonic() < deadline, "the workers did not start"
            time.sleep(0.2)
    finally:
        caller.send_signal(signal.SIGKILL)
        caller.wait()
    deadline = time.monotonic() + 20
    while not all_dead(tmp_path, 2) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert all_dead(tmp_path, 2)


def notebook_function(rank, world_size):
    return rank


@pytest.mark.parametrize("make, where", [
    (lambda: (lambda rank, world_size: rank), "a lambda"),
    (lambda: types.FunctionType(notebook_function.__code__, {}, "local"), None),
])
def test_launch_says_what_to_do_with_a_function_workers_cannot_import(make, where, monkeypatch):
    fn = make()
    if where is None:  # a function of a notebook: module __main__, which has no file
        fn.__module__, where = "__main__", "defined in a notebook cell"
        monkeypatch.setitem(sys.modules, "__main__", types.ModuleType("__main__"))
    with pytest.raises(ValueError, match=f"{where}.*%%writefile my_workers.py"):
        D.launch(2, fn)


@pytest.mark.parametrize("args, kwargs, error, match", [
    ((0, square), {}, ValueError, "world_size"),
    ((2, "square"), {}, TypeError, r"fn must be a function fn\(rank, world_size, \*args\), got str"),
    ((2, square, lambda: 0), {}, TypeError, "arguments of launch must be picklable"),
    ((1, square, 1.0), {"timeout": 0}, ValueError, "timeout must be a positive number"),
])
def test_launch_validation(args, kwargs, error, match):
    with pytest.raises(error, match=match):
        D.launch(*args, **kwargs)


def test_worker_body_reports_results_and_errors_through_its_pipe():
    """The code each worker runs, run here (a process group of one), so that its paths are seen by coverage."""
    import multiprocessing

    store = dist.TCPStore("127.0.0.1", 0, 2, is_master=True, wait_for_workers=False)
    for args, kind in (((square, (3.0,)), "ok"), ((record_pid_then, ("/nonexistent", "x")), "error")):
        here, there = multiprocessing.Pipe()
        here.send(store.port)  # what launch sends each worker once the store is up
        D.processes._worker(0, 1, 30.0, pickle.dumps((dict(os.environ), *args)), there)
        assert here.recv() == ("ready",)
        message = here.recv()
        assert message[0] == kind
        if kind == "ok":
            assert pickle.loads(message[1])[:2] == (0, 3.0)
        else:
            assert "FileNotFoundError" in message[1] and "record_pid_then" in message[2]
    assert not dist.is_initialized()


# ----------------------------------------------------------------------------------------------- ring attention


@pytest.mark.slow
@pytest.mark.parametrize("P", [1, 2, 3, 4])
def test_ring_equals_sdpa_for_1_to_4_ranks(battery_results, P):
    """float64, lengths 12, 11 and 5, every mask, both layouts: the blocks joined are full attention."""
    for i, case in enumerate(ring_cases()):
        blocks = [battery_results[r]["ring"][P][i] for r in range(P)]
        got = torch.cat(blocks, dim=2) if case["layout"] == "contiguous" else D.zigzag_merge(blocks)
        want, empty = reference(case)
        assert_close(got, want, **EXACT, msg=lambda m: f"P={P}, case {i}: {m}")
        if case.get("key_padding_mask") is not None:
            assert empty[1].all() and (got[1] == 0).all()  # the sentence of pads: zeros, not NaN


@pytest.mark.slow
def test_ring_blocks_as_tensor_split_cuts_them(battery_results):
    lengths = [battery_results[r]["ring"][4][8].shape[2] for r in range(WORLD)]  # L = 11, contiguous
    assert lengths == [3, 3, 3, 2] == [b.shape[2] for b in torch.zeros(1, 1, 11).tensor_split(4, dim=2)]
    # L = 5 in the zigzag: the 8 pieces of tensor_split hold 1, 1, 1, 1, 1, 0, 0, 0 positions; rank r holds r and 7 - r
    assert [battery_results[r]["ring"][4][-1].shape[2] for r in range(WORLD)] == [1, 1, 1, 2]


@pytest.mark.slow
def test_ring_in_float32(battery_results):
    for i, case in enumerate(ring_cases(torch.float32)[:8]):
        blocks = [battery_results[r]["float32"][i][0] for r in range(WORLD)]
        got = torch.cat(blocks, dim=2) if case["layout"] == "contiguous" else D.zigzag_merge(blocks)
        assert got.dtype == torch.float32
        assert_close(got, reference(case)[0], atol=2e-6, rtol=0)


@pytest.mark.slow
def test_zigzag_balances_the_causal_ring(battery_results):
    """L = 64 over 4 ranks, causal: contiguous blocks give rank r r+1 tiles of 16 x 16 scores (rank 0 idles 3 steps
    of 4); the zigzag gives every rank 9 tiles of 8 x 8 (its early piece attends r+1 pieces, its late one 8-r)."""
    stats = {layout: [battery_results[r]["balance"][i][1] for r in range(WORLD)] for i, layout in enumerate(D.LAYOUTS)}
    contiguous, zigzag = stats["contiguous"], stats["zigzag"]
    assert [s.tiles for s in contiguous] == [1, 2, 3, 4] and [s.skipped for s in contiguous] == [3, 2, 1, 0]
    assert [s.scores for s in contiguous] == [256, 512, 768, 1024]
    assert [s.tiles for s in zigzag] == [9] * 4 and [s.skipped for s in zigzag] == [7] * 4
    assert [s.scores for s in zigzag] == [576] * 4
    busiest = lambda ss: max(s.flops for s in ss) / (sum(s.flops for s in ss) / len(ss))  # noqa: E731
    assert busiest(contiguous) == 1.6 and busiest(zigzag) == 1.0
    assert all(s.flops == 2 * s.scores * (4 + 4) for s in contiguous + zigzag)  # B = h = 1, d = dv = 4
    assert 64 * 65 // 2 < sum(s.scores for s in zigzag) < sum(s.scores for s in contiguous)  # diagonal tiles in full


@pytest.mark.slow
def test_ring_memory_and_messages_per_rank(battery_results):
    """Per rank, for L = 64 over 4 ranks, B = h = 1, d = dv = 4, float64: one score tile of (L/P)^2 at most, two
    key/value blocks of L/P positions (the one in use and the one arriving), and P-1 blocks sent."""
    stats = [battery_results[r]["balance"][0][1] for r in range(WORLD)]  # L = 64, causal, contiguous
    block = 1 * 1 * 16 * (4 + 4) * 8  # B h L/P (d + dv) bytes
    assert all(s.kv_bytes == 2 * block and s.sent_bytes == 3 * block for s in stats)
    assert max(s.score_bytes for s in stats) == 16 * 16 * 8  # one (L/P) x (L/P) tile, never L x L
    peaks = [battery_results[r]["balance"][0][2] for r in range(WORLD)]
    assert all(p is None or p >= 0 for p in peaks)


@pytest.mark.slow
def test_validation_across_ranks(battery_results):
    for rank, result in enumerate(battery_results):
        lengths, causal, mask, layout = result["errors"]
        assert "rank by rank the blocks hold [2, 3, 3, 3] positions" in lengths and "[3, 3, 3, 2]" in lengths
        assert "tensor_split(x, world_size, dim=2)[rank]" in lengths
        assert "the ranks disagree on is_causal: rank by rank [0, 0, 1, 0]" in causal
        assert "disagree on a key_padding_mask" in mask and "all or none" in mask
        assert "zigzag_split(x, world_size, dim=2)[rank]" in layout  # blocks cut contiguously, called as zigzag


# ----------------------------------------------------------------------------------------------- heads over ranks


def unsplit(ours, x, grad, pad):
    layer = MultiheadAttention.from_torch(ours.to_torch())
    xs = x.clone().requires_grad_()
    y, _ = layer(xs, xs, xs, key_padding_mask=pad, need_weights=False, is_causal=True)
    y.backward(grad)
    return layer, y.detach(), xs.grad


@pytest.mark.slow
@pytest.mark.parametrize("mesh", ["4", "2"])
def test_head_parallel_layer_equals_the_unsplit_one(battery_results, mesh):
    ours, theirs, x, grad, memory, pad = tp_layers()
    layer, y, x_grad = unsplit(ours, x, grad, pad)
    xq = x.transpose(0, 1).clone().requires_grad_()
    z, _ = theirs(xq, memory, memory, key_padding_mask=torch.zeros(2, 7, dtype=torch.bool), need_weights=False)
    z.backward(grad.transpose(0, 1))
    for result in battery_results:
        got = result["tp"][mesh]
        assert got["weights"] is None
        assert_close(got["y"], y, **EXACT)
        assert_close(got["x_grad"], x_grad, **EXACT)
        for name, p in layer.named_parameters():
            assert_close(got["params"][name], p.detach(), atol=0, rtol=0)
            assert_close(got["grads"][name], p.grad, atol=1e-12, rtol=1e-12)
        assert_close(got["z"], z.detach(), **EXACT)  # cross-attention, kdim = vdim = 6, sequence-first
        assert_close(got["xq_grad"], xq.grad, **EXACT)
        for name, p in theirs.named_parameters():
            assert_close(got["cross_grads"][name], p.grad, atol=1e-12, rtol=1e-12)


@pytest.mark.slow
def test_heads_by_hand_and_the_bytes_of_the_all_reduce(battery_results):
    ours = tp_layers()[0]
    x, grad, pad = long_input()
    _, y, x_grad = unsplit(ours, x, grad, pad)
    parts = [r["worker"]["part"] for r in battery_results]
    assert_close(sum(parts) + ours.out_proj.bias.detach(), y, **EXACT)  # the block-matrix sum
    assert (parts[0] - parts[1]).abs().max() > 0.1  # each rank's part is its own
    for result in battery_results:
        w = result["worker"]
        assert_close(w["by_hand"], y, **EXACT)
        assert_close(w["output"], y, **EXACT)
        assert_close(w["x_grad"], x_grad, **EXACT)
        assert w["collectives"] == {"forward": {"c10d_functional.all_reduce": 1},
                                    "backward": {"c10d_functional.all_reduce": 3}}
        assert w["formula"] == 2 * 3 / 4 * 2 * 256 * 16 * 8 == 98304  # 2 (P-1)/P B L E bytes
        if w["sent"]["forward"] is not None:  # Linux: what the process wrote to its sockets
            assert w["formula"] <= w["sent"]["forward"] < 1.03 * w["formula"]  # plus gloo's message headers
            assert 3 * w["formula"] <= w["sent"]["backward"] < 3.09 * w["formula"]


@pytest.mark.slow
def test_world_size_must_divide_the_heads(battery_results):
    assert all("4 ranks cannot share 6 heads equally" in r["six_heads"] and "Use [1, 2, 3, 6] ranks" in r["six_heads"]
               for r in battery_results)


# ----------------------------------------------------------------------------------------------- in one process


@pytest.fixture
def group_of_one():
    dist.init_process_group("gloo", rank=0, world_size=1, store=dist.HashStore())
    yield
    dist.destroy_process_group()


def test_ring_of_one_rank_and_the_workers_here(group_of_one):
    case = ring_cases()[7]  # L = 12, padding and causal, zigzag
    (out, stats, peak), = D.ring_worker(0, 1, [case])
    assert_close(out, reference(case)[0], **EXACT)
    assert stats.rank == 0 and stats.world_size == 1 and stats.sent_bytes == 0 and stats.wait_s == 0
    ours, _, x, grad, _, pad = tp_layers()
    _, y, x_grad = unsplit(ours, x, grad, pad)
    result = D.head_parallel_worker(0, 1, ours, x, grad, pad, True)
    assert_close(result["output"], y, **EXACT)
    assert_close(result["by_hand"], y, **EXACT)
    assert result["formula"] == 0 and result["collectives"]["forward"] == {}


def test_head_parallel_layer_on_one_rank_with_a_mask_per_head(group_of_one):
    from torch.distributed.device_mesh import init_device_mesh

    ours, theirs, x, _, memory, _ = tp_layers()
    per_head = torch.randn(2 * 4, 5, 5, dtype=torch.float64)  # (B*h, L, S), added to the scores
    layer = D.parallelize_attention(ours, init_device_mesh("cpu", (1,)))
    assert_close(layer(x, x, x, attn_mask=per_head)[0], ours(x, x, x, attn_mask=per_head, need_weights=False)[0],
                 **EXACT)
    cross = D.parallelize_attention(theirs, init_device_mesh("cpu", (1,)))
    xq = x.transpose(0, 1)  # (L, B, E): torch's layer is sequence-first
    assert_close(cross(xq, memory, memory)[0], theirs(xq, memory, memory, need_weights=False)[0], **EXACT)
    assert set(cross.gathered()) == {"q_proj_weight", "k_proj_weight", "v_proj_weight", "in_proj_bias",
                                     "out_proj.weight", "out_proj.bias"}
    with pytest.raises(ValueError, match="the mesh must be 1-D.*mesh\\[name\\]"):
        D.parallelize_attention(ours, init_device_mesh("cpu", (1, 1)))
    with pytest.raises(ValueError, match="packed in_proj_weight"):
        D.head_parallel_by_hand(theirs, x)


def test_ring_validation_on_one_rank(group_of_one):
    q = torch.zeros(2, 3, 5, 4)
    needs_grad = q.clone().requires_grad_()
    cases = [
        (lambda: D.ring_attention(q[0], q[0], q[0]), ValueError, r"\(B, h, L_r, d\).*split_heads"),
        (lambda: D.ring_attention(q, q[:, :, :4], q[:, :, :4]), ValueError, "q holds 5 positions but k and v hold 4"),
        (lambda: D.ring_attention(needs_grad, q, q), RuntimeError, "forward pass only.*torch.no_grad"),
        (lambda: D.ring_attention(q, q, q, layout="ring"), ValueError, r"layout must be one of \('contiguous'"),
        (lambda: D.ring_attention(q, q, q, key_padding_mask=torch.zeros(2, 4, dtype=torch.bool)), ValueError,
         r"\(B, L_r\) = \(2, 5\).*got torch.bool \(2, 4\).*tensor_split\(mask, world_size, dim=1\)"),
        (lambda: D.ring_attention(q, q, q, key_padding_mask=torch.zeros(2, 5)), ValueError, "must be a bool tensor"),
        (lambda: D.ring_attention(q, q, q[..., :1, :]), ValueError, "same number of keys"),
    ]
    for call, error, match in cases:
        with pytest.raises(error, match=match):
            call()


def test_ring_outside_a_process_group():
    q = torch.zeros(1, 1, 4, 2)
    with pytest.raises(RuntimeError, match=r"inside a process group.*launch\(world_size, fn\).*init_process_group"):
        D.ring_attention(q, q, q)


def test_zigzag_split_merge_and_block_ranges():
    x = torch.arange(11).view(1, 1, 11)
    blocks = D.zigzag_split(x, 2, dim=2)  # pieces of tensor_split(x, 4): 3, 3, 3, 2
    assert [b.flatten().tolist() for b in blocks] == [[0, 1, 2, 9, 10], [3, 4, 5, 6, 7, 8]]
    assert torch.equal(D.zigzag_merge(blocks), x)
    assert D.block_ranges(11, 2, "zigzag") == [[(0, 3), (9, 11)], [(3, 6), (6, 9)]]
    assert D.block_ranges(11, 3) == [[(0, 4)], [(4, 8)], [(8, 11)]]
    with pytest.raises(ValueError, match="pass the blocks of zigzag_split, in rank order"):
        D.zigzag_merge(blocks[::-1])
    with pytest.raises(ValueError, match="layout must be one of"):
        D.block_ranges(11, 2, "stripes")


def test_split_in_proj_by_heads():
    """Rank r's rows: heads r h/P .. (r+1) h/P of W_q, then of W_k, then of W_v; the ranks' rows together are all."""
    E, h, P = 8, 4, 2
    W = torch.arange(3 * E).repeat_interleave(1).view(3 * E, 1).expand(3 * E, E)
    rows = [D.split_in_proj_by_heads(W, h, r, P)[:, 0].tolist() for r in range(P)]
    assert rows == [[0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19], [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23]]
    assert D.split_in_proj_by_heads(torch.arange(24.0), h, 1, P).tolist() == rows[1]  # a bias splits the same way
    assert sorted(sum(rows, [])) == list(range(3 * E))
    for args, match in [((torch.zeros(8, 8), 4, 0, 2), r"packed \(3E, E\)"), ((W, 4, 0, 3), "must divide num_heads"),
                        ((W, 4, 2, 2), r"rank must be in 0..1")]:
        with pytest.raises(ValueError, match=match):
            D.split_in_proj_by_heads(*args)


def test_head_split_rules_and_byte_formulas():
    assert D.check_head_split(8, 4) == 2 and D.check_head_split(8, 2, num_kv_heads=2) == 4
    with pytest.raises(ValueError, match="world size must divide num_kv_heads too"):
        D.check_head_split(8, 4, num_kv_heads=2)
    assert D.allreduce_bytes(1000, 1) == 0 and D.allreduce_bytes(1000, 2) == 1000 and D.allreduce_bytes(1000, 4) == 1500
    assert D.tp_bytes_per_layer(2, 10, 64, 4, torch.float32) == 1.5 * 2 * 10 * 64 * 4
    with pytest.raises(TypeError, match="takes a MultiheadAttention"):
        D.parallelize_attention(nn.Linear(4, 4), None)


def test_peak_memory_and_bytes_sent_measure_this_process():
    if not os.path.exists("/proc/self/status"):
        pytest.skip("measured through /proc (Linux)")
    def touch(n):  # n bytes of fresh memory from the kernel, every page written, then given back: no allocator
        with mmap.mmap(-1, n) as pages:  # keeps it (torch's may: on 2.15 a tensor of 50 MB reused held memory)
            for i in range(0, n, mmap.PAGESIZE):
                pages[i] = 1
        return n

    total, peak = D.peak_memory_bytes(touch, 50_000_000)
    assert total == 50_000_000 and 45e6 < peak < 80e6, peak
    before = D.bytes_sent()
    with open(os.devnull, "wb", buffering=0) as f:
        f.write(b"x" * 1000)
    assert D.bytes_sent() - before >= 1000


# ----------------------------------------------------------------------------------------------- the package's layout


def test_the_subpackage_keeps_every_public_name_and_each_module_is_short():
    from attention_course.distributed import heads, processes, ring, ship, workers

    for name in D.__all__:
        assert getattr(D, name) is not None, name
    assert D.launch is processes.launch and D.ring_attention is ring.ring_attention
    assert D.split_in_proj_by_heads is heads.split_in_proj_by_heads and D.ring_worker is workers.ring_worker
    for module in (D, heads, processes, ring, ship, workers):
        code = [line for line in Path(module.__file__).read_text().splitlines()
                if line.strip() and not line.strip().startswith("#")]
        assert len(code) <= 400, f"{module.__name__}: {len(code)} lines"


# ----------------------------------------------------------------------------------------------- chapter 11's torch


def test_require_torch_passes_a_new_enough_torch_and_stops_an_old_one_with_the_command():
    from attention_course.device import TorchTooOld, _release, require_torch

    for version in ("2.13.0", "2.13.0+cpu", "2.13.0.dev20260101", "2.14.1", "3.0"):
        require_torch("2.13", chapter="11", version=version)
    for version in ("2.6.0+cu124", "2.12.1", "1.13"):
        with pytest.raises(TorchTooOld) as caught:
            require_torch("2.13", chapter="11", version=version)
        text = str(caught.value)
        assert text.startswith(f"Chapter 11 needs torch 2.13 or newer") and version in text
        assert 'pip install -U "torch>=2.13"' in text
        assert caught.value._render_traceback_() == [f"TorchTooOld: {text}"]  # no traceback in a notebook
    assert _release("2.6") == (2, 6, 0) and _release("2.12.1+cpu") == (2, 12, 1)
    with pytest.raises(ValueError, match="cannot read a version number"):
        require_torch("2.13", version="nightly")


def test_the_command_upgrades_torchvision_and_torchaudio_with_torch_where_they_are_installed(monkeypatch):
    """Colab ships both, each pinned to the torch it was built for: upgrading torch alone leaves them broken."""
    import importlib.util

    from attention_course.device import TorchTooOld, require_torch

    real = importlib.util.find_spec
    for installed, command in (((), 'pip install -U "torch>=2.13"'),
                               (("torchvision", "torchaudio"), 'pip install -U "torch>=2.13" torchvision torchaudio'),
                               (("torchaudio",), 'pip install -U "torch>=2.13" torchaudio')):
        monkeypatch.setattr(importlib.util, "find_spec", lambda name, *rest, installed=installed: (
            object() if name in installed else None if name in ("torchvision", "torchaudio") else real(name, *rest)))
        with pytest.raises(TorchTooOld) as caught:
            require_torch("2.13", chapter="11", version="2.11.0")
        assert f": run {command} (in a notebook, %{command}), then restart the kernel." in str(caught.value)


def test_chapter_11_checks_its_torch_before_anything_distributed():
    cells = json.loads((Path(__file__).parents[1] / "notebooks" / "11_distributed.ipynb").read_text())["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    gate = first.index('require_torch("2.13", chapter="11")')
    assert gate < first.index("attention_course.distributed") and gate < first.index("attention_course.exercises")


GATED = sorted(path for path in (Path(__file__).parents[1] / "notebooks").glob("*.ipynb") if torch_gate(path))


def test_chapter_11_is_gated_and_a_commented_gate_is_no_gate(tmp_path):
    assert [path.name for path in GATED] == ["11_distributed.ipynb"]
    assert torch_gate(GATED[0]) == ("2.13", "11")
    for source in ('# require_torch("2.13", chapter="11")', 'print(\'require_torch("2.13", chapter="11")\')'):
        (tmp_path / "nb.ipynb").write_text(json.dumps({"cells": [{"cell_type": "code", "source": [source]}]}))
        assert torch_gate(tmp_path / "nb.ipynb") is None


@pytest.mark.slow
@pytest.mark.parametrize("notebook", GATED, ids=lambda path: path.stem)
def test_a_gated_chapter_stops_in_its_first_cell_on_an_older_torch_with_the_command(notebook):
    """Its first cell, run in a fresh kernel on a torch older than its gate (this one, or this one said to be one
    minor release older where it is new enough): the cell stops with TorchTooOld, its message alone, and nothing
    after the check ran. On such a torch (make test-colab, make test-oldest) tests/conftest.py skips the chapter's
    cells as expected."""
    import torch
    from jupyter_client.manager import start_new_kernel

    from attention_course.device import _release

    minimum, chapter = torch_gate(notebook)
    cells = json.loads(notebook.read_text())["cells"]
    first = "".join(next(c for c in cells if c["cell_type"] == "code")["source"])
    older = _release(torch.__version__) < _release(minimum)
    major, minor = _release(minimum)[:2]
    shown = torch.__version__ if older else f"{major}.{minor - 1}.0"
    manager, client = start_new_kernel(kernel_name="python3", cwd=str(notebook.parent))
    try:
        if not older:
            client.execute_interactive(f"import torch; torch.__version__ = {shown!r}", timeout=120)
        errors, printed = [], []

        def hook(message):
            if message["msg_type"] == "error":
                errors.append(message["content"])
            elif message["msg_type"] == "stream":
                printed.append(message["content"]["text"])

        reply = client.execute_interactive(first, timeout=300, output_hook=hook)
        assert reply["content"]["status"] == "error" and len(errors) == 1, (reply["content"], printed)
        assert errors[0]["ename"] == "TorchTooOld"
        (line,) = errors[0]["traceback"]  # one line: no traceback above it
        assert line.startswith(f"TorchTooOld: Chapter {chapter} needs torch {minimum} or newer, and this Python "
                               f"runs torch {shown}: run ") and f'pip install -U "torch>={minimum}"' in line
        rest = first[first.index("\n", first.index("require_torch(")):]  # the lines after the check
        after = sorted({alias.asname or alias.name.split(".")[0] for node in ast.walk(ast.parse(rest))
                        if isinstance(node, (ast.Import, ast.ImportFrom)) for alias in node.names} - {"torch"})
        # read in the reply itself (a user expression), not from printed output, which may come after the reply
        reply = client.execute_interactive("", user_expressions={"bound": f"[n for n in {after!r} if n in globals()]"},
                                           timeout=60)
        assert after and reply["content"]["user_expressions"]["bound"]["data"]["text/plain"] == "[]"  # never ran
    finally:
        client.stop_channels()
        manager.shutdown_kernel(now=True)
