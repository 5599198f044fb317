"""Checkers for chapter 13, FlashAttention as a Triton kernel. The learner writes small ``@triton.jit`` functions; a
course kernel here takes them as constexpr arguments and calls them inside its loop over tiles:
1. ``online_step(m, l, acc, s, v)`` (``ex-ch13-step``): one tile of scores folded into a query tile's running state.
2. ``key_end(i, n_keys, L, BLOCK_M, CAUSAL)`` and ``visible(rows, keys, n_keys, CAUSAL)`` (``ex-ch13-mask``): where a
   query tile's loop over keys stops, and which keys of a tile each query may see.
3. ``probabilities(s, lse)`` and ``score_grad(p, dp, do, o)`` (``ex-ch13-backward``): P recomputed, and dS.

The kernels run the learner's functions (in Triton's interpreter where there is no CUDA GPU) on float64 tiles of 16
or 32, one head, d = 16. The catalogue's mistakes are the same functions written in torch, run tile for tile by a
torch copy of the kernel's loop (``_forward_torch``, ``_backward_torch``): what the kernel gives with that mistake,
without the interpreter's cost."""
from __future__ import annotations  # (tl.constexpr is read by Triton, not by Python: none without Triton)

import numpy as np
import torch

from .. import boundary
from ..kernels.flash import MISSING, _kernels, interpreted
from . import ExerciseError
from .diagnose import Case, Exercise, Mistake, check

try:
    _kernels()  # where no CUDA GPU is: TRITON_INTERPRET=1, set before Triton is imported (again) below
    import triton
    import triton.language as tl
except ModuleNotFoundError as error:  # no Triton (macOS, Windows): the catalogue stands, a check says what to install
    if error.name != "triton":
        raise
    triton = None

jit = triton.jit if triton is not None else lambda fn: fn  # (without Triton: plain functions, never called)

NEG = float("-inf")
D = 16  # features per head in every case: one tile wide

# The course's pieces (answers of exercises 1 and 2), in the forward kernel where the learner's are not under test.

@jit
def _online_step(m, l, acc, s, v):  # noqa: E741
    m_new = tl.maximum(m, tl.max(s, 1))
    shift = tl.where(m_new == float("-inf"), 0.0, m_new)  # a row with no key yet: exp(-inf - 0) = 0, not NaN
    p = tl.exp(s - shift[:, None])
    alpha = tl.exp(m - shift)
    return m_new, l * alpha + tl.sum(p, 1), acc * alpha[:, None] + tl.dot(p, v, input_precision="ieee")

@jit
def _key_end(i, n_keys, L, BLOCK_M: tl.constexpr, CAUSAL: tl.constexpr):
    end = n_keys
    if CAUSAL:  # no key after the tile's last query, (i + 1) * BLOCK_M - 1 or L - 1
        end = tl.minimum(end, tl.minimum((i + 1) * BLOCK_M, L))
    return end

@jit
def _visible(rows, keys, n_keys, CAUSAL: tl.constexpr):
    seen = (keys[None, :] < n_keys) & (rows[:, None] >= 0)  # (BLOCK_M, BLOCK_N)
    if CAUSAL:
        seen = seen & (keys[None, :] <= rows[:, None])
    return seen

# The kernels: chapter 13's (attention_course/kernels/forward.py, backward.py), one head, the pieces as arguments.

@jit
def _forward(Q, K, V, ALLOWED, LENGTHS, O, LSE, TILES, L, S, n_tiles, scale, BLOCK_D: tl.constexpr,
             BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr, STEP: tl.constexpr,
             END: tl.constexpr, VISIBLE: tl.constexpr):
    i, b = tl.program_id(0), tl.program_id(1)
    rows = i * BLOCK_M + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
    dims = tl.arange(0, BLOCK_D)
    at = (b * L + rows[:, None]) * BLOCK_D + dims[None, :]  # Q and O: (B, L, D)
    q = tl.load(Q + at, mask=rows[:, None] < L, other=0.0)
    n_keys = tl.load(LENGTHS + b)
    pattern = ALLOWED + (b * L + rows[:, None]) * S  # (B, L, S): the case's own mask, 1 outside it
    m = tl.full((BLOCK_M,), float("-inf"), tl.float64)
    l = tl.zeros((BLOCK_M,), tl.float64)  # noqa: E741
    acc = tl.zeros((BLOCK_M, BLOCK_D), tl.float64)
    loaded = i * 0
    end = END(i, n_keys, L, BLOCK_M, CAUSAL)
    for start in range(0, end, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        kv = (b * S + keys[:, None]) * BLOCK_D + dims[None, :]
        k = tl.load(K + kv, mask=keys[:, None] < S, other=0.0)
        v = tl.load(V + kv, mask=keys[:, None] < S, other=0.0)
        allowed = tl.load(pattern + keys[None, :], mask=(rows[:, None] < L) & (keys[None, :] < S), other=1)
        s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale  # (BLOCK_M, BLOCK_N)
        s = tl.where(VISIBLE(rows, keys, n_keys, CAUSAL) & (allowed != 0), s, float("-inf"))
        m, l, acc = STEP(m, l, acc, s, v)  # noqa: E741
        loaded += 1
    seen = l > 0
    tl.store(O + at, acc / tl.where(seen, l, 1.0)[:, None], mask=rows[:, None] < L)
    tl.store(LSE + b * L + rows, tl.where(seen, m + tl.log(tl.where(seen, l, 1.0)), 0.0), mask=rows < L)
    tl.store(TILES + b * n_tiles + i, loaded)

@jit
def _backward(Q, K, V, DO, O, LSE, ALLOWED, DQ, DK, DV, L, S, scale, BLOCK_D: tl.constexpr, BLOCK_M: tl.constexpr,
              BLOCK_N: tl.constexpr, PROB: tl.constexpr, GRAD: tl.constexpr):
    """One program per sentence, each tile of P recomputed once (the interpreter's time is the checker's): dK and dV
    summed over the query tiles, dQ added into DQ (zeros to start) as each key tile passes. The chapter's kernels
    split this in two, dK/dV and dQ, so that programs run in parallel without adding into one place; the tiles and
    the formulas are the same."""
    b = tl.program_id(0)
    dims = tl.arange(0, BLOCK_D)
    for j in range(0, S, BLOCK_N):
        keys = j + tl.arange(0, BLOCK_N)  # (BLOCK_N,)
        kv = (b * S + keys[:, None]) * BLOCK_D + dims[None, :]
        k = tl.load(K + kv, mask=keys[:, None] < S, other=0.0)
        v = tl.load(V + kv, mask=keys[:, None] < S, other=0.0)
        dk = tl.zeros((BLOCK_N, BLOCK_D), tl.float64)
        dv = tl.zeros((BLOCK_N, BLOCK_D), tl.float64)
        for i in range(0, L, BLOCK_M):
            rows = i + tl.arange(0, BLOCK_M)  # (BLOCK_M,)
            at, here = (b * L + rows[:, None]) * BLOCK_D + dims[None, :], rows[:, None] < L
            q, do, o = tl.load(Q + at, mask=here, other=0.0), tl.load(DO + at, mask=here, other=0.0), \
                tl.load(O + at, mask=here, other=0.0)
            lse = tl.load(LSE + b * L + rows, mask=rows < L, other=0.0)
            inside = here & (keys[None, :] < S)
            allowed = tl.load(ALLOWED + (b * L + rows[:, None]) * S + keys[None, :], mask=inside, other=0)
            s = tl.dot(q, tl.trans(k), input_precision="ieee") * scale
            p = PROB(tl.where(inside & (allowed != 0), s, float("-inf")), lse)  # (BLOCK_M, BLOCK_N)
            ds = GRAD(p, tl.dot(do, tl.trans(v), input_precision="ieee"), do, o)
            dv += tl.dot(tl.trans(p), do, input_precision="ieee")
            dk += tl.dot(tl.trans(ds), q, input_precision="ieee")
            tl.atomic_add(DQ + at, tl.dot(ds, k, input_precision="ieee") * scale, mask=here)
        tl.store(DK + kv, dk * scale, mask=keys[:, None] < S)
        tl.store(DV + kv, dv, mask=keys[:, None] < S)

# Running a learner's functions in a kernel, or the catalogue's torch functions in the torch copy of its loop.

def _course(fn):
    """Marks a catalogue's entry (the reference, a mistake): run in torch on the case's inputs, not in a kernel."""
    fn.course = True
    return fn

def _runner(kernel_run, names: tuple):
    """Exercise.run: a catalogue's entry is called on the case; the learner's functions go to ``kernel_run``, here,
    or in grading (``boundary.Remote`` functions) in the learner's process: :func:`in_learner`."""
    def run(answer, *args):
        if getattr(answer, "course", False):
            return answer(*args)
        pieces = answer if isinstance(answer, tuple) else (answer,)
        if any(isinstance(piece, boundary.Remote) for piece in pieces):
            return _remote(pieces, kernel_run.__name__, names, args)
        jitted = (triton.runtime.JITFunction, getattr(triton.runtime.interpreter, "InterpretedFunction", ()))
        for piece, name in zip(pieces, names):
            what = "your " + name  # (joined here: "your " alone is no message's words)
            if piece is _ABSENT:
                raise ExerciseError(f"{what} is not beside your {names[0]}: grading looks it up among the names of "
                                    f"the cells that define {names[0]}. Define both at the top level of your "
                                    f"solution cell, each with @triton.jit.")
            if type(piece).__name__ in ("JITFunction", "InterpretedFunction") and not isinstance(piece, jitted):
                raise ExerciseError(f"{what} was made by the @triton.jit of a Triton imported BEFORE the course "
                                    f"set up Triton's interpreter (for a machine without a GPU), and Triton has been "
                                    f"imported again since: the kernel cannot call it. Run `import triton` and "
                                    f"`import triton.language as tl` again, then the cell that defines {name}, then "
                                    f"this one.")
            if not isinstance(piece, jitted):
                raise ExerciseError(f"{what} is {'a plain Python function' if callable(piece) else repr(piece)}"
                                    f", not a Triton function: the course kernel calls it on tiles, inside the kernel. "
                                    f"Put @triton.jit on the line above `def {name}(...)`, run that cell, then this "
                                    f"one again.")
        return kernel_run(*pieces, *args)
    _RUNS[kernel_run.__name__] = run
    return run

_RUNS = {}  # the name of a kernel's run -> Exercise.run: what in_learner runs in the learner's process
_ABSENT = object()  # a second function in_learner did not find beside the first

def _remote(pieces: tuple, kernel: str, names: tuple, args: tuple):
    """The learner's functions are ``boundary.Remote``s (grading): a Remote cannot reach a kernel, so the kernel
    runs in the learner's process (:func:`in_learner`, by ``Remote.apply``) and sends back plain tensors, which
    the checker judges here as it judges a local answer's. Its exceptions come back as their types (ExerciseError
    with the same message)."""
    first, others = pieces[0], pieces[1:]
    if not all(isinstance(p, boundary.Remote) and p.learner is first.learner for p in pieces):
        what = "your " + " and ".join(names)  # (joined here: "your " alone is no message's words)
        raise ExerciseError(f"{what} must be defined in your notebook's cells: grading runs them together, in the "
                            f"process that runs your code.")
    return tuple(first.apply(f"{__name__}:in_learner", kernel, [p.name for p in others], *args))

def in_learner(first, kernel: str, others: list, *args):
    """In grading's learner process (``boundary.Remote.apply``): the kernel's run on the learner's ``first``
    function and the functions named ``others``, its outputs as plain tensors.

    ``apply`` hands over one function; the others (key_end's ``visible``, probabilities' ``score_grad``) are looked
    up by name in ``first``'s globals (for a ``@triton.jit`` function, its ``.fn``'s: JITFunction and the
    interpreter's InterpretedFunction keep the decorated Python function there). That is sound: the learner process
    runs the definitions of every solution cell with one dict as globals (boundary's ``exec``), so a function
    defined at a cell's top level has that dict as ``__globals__``, the namespace in which ``Remote`` finds a
    function by the same name; the name is the one the check cell passed, the server's ``Remote.name``. And it
    trusts nothing: the lookup runs where the learner's code runs, so all it can decide is which of the learner's
    own functions the kernel calls; what comes back is plain data, judged in the server. A name not found there (a
    first function that is no Python function, or defined elsewhere) is said so, after the first is checked.

    With a GPU the kernel runs on CUDA, which a process forked after its parent used CUDA cannot (the check server
    runs the chapter's cells, then forks): that is said, not blamed on the learner's code."""
    if not interpreted() and torch.cuda._is_in_bad_fork():
        raise ExerciseError("not checked: grading runs your pieces in a process forked from one that used the GPU, "
                            "and CUDA cannot be used there. (For the instructor: grade chapter 13 with "
                            "CUDA_VISIBLE_DEVICES='' so that its kernel runs in Triton's interpreter.)")
    namespace = getattr(getattr(first, "fn", first), "__globals__", None)
    namespace = namespace if isinstance(namespace, dict) else {}
    pieces = (first, *(namespace.get(name, _ABSENT) for name in others))
    return _RUNS[kernel](pieces if others else first, *args)

def _check(exercise: Exercise, answer) -> None:
    if triton is None:
        raise ModuleNotFoundError(MISSING, name="triton")
    check(exercise, answer)

def _cause(err: Exception) -> Exception:
    """The learner's own error inside Triton's: the interpreter's wrapping removed, or the compiler's last line."""
    while isinstance(err, triton.runtime.errors.TritonError) and err.__cause__ is not None:
        err = err.__cause__
    if isinstance(err, triton.runtime.errors.TritonError):  # the compiler's: the source shown, the error last
        if "raise NotImplementedError()" in str(err):  # the stub, which the compiler refuses to compile
            return NotImplementedError()
        lines = str(err).strip().splitlines()
        return RuntimeError(lines[-1] if lines else type(err).__name__)
    return err

def _launch(kernel, grid, *args, **meta) -> list:
    """Runs ``kernel`` (on the GPU where there is one); returns its arguments, the outputs written, on the CPU."""
    device = "cpu" if interpreted() else "cuda"
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in args]
    try:
        with np.errstate(all="ignore"):  # a NaN the answer makes is reported, not warned about
            kernel[grid](*args, **meta)
    except Exception as err:  # noqa: BLE001 - the learner's error, reported as check reports any
        raise _cause(err) from None
    return [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]

def _padded(x: torch.Tensor, axis: int, block: int, value=0) -> torch.Tensor:
    shape = list(x.shape)
    shape[axis] = -x.shape[axis] % block
    return torch.cat([x, torch.full(shape, value, dtype=x.dtype)], axis)

def _forward_torch(step, end, visible, q, k, v, allowed, lengths, causal, bm, bn):
    """The forward kernel's loop in torch, tile for tile: (O, lse, tiles loaded per program)."""
    B, L, _ = q.shape
    S, n = k.shape[1], -(-L // bm)
    q, allowed = _padded(q, 1, bm), _padded(allowed, 1, bm, True)  # (the kernel reads 1 outside the case's)
    o, lse, tiles = q.new_zeros(q.shape), q.new_zeros(q.shape[:2]), torch.zeros(B, n, dtype=torch.int32)
    for b in range(B):
        for i in range(n):
            rows = torch.arange(i * bm, (i + 1) * bm)
            m, l, acc = torch.full((bm,), NEG, dtype=q.dtype), q.new_zeros(bm), q.new_zeros(bm, D)  # noqa: E741
            for start in range(0, int(end(i, int(lengths[b]), L, bm, causal)), bn):
                keys = torch.arange(start, start + bn)
                k_, v_ = (torch.where((keys < S)[:, None], x[b, keys.clamp(max=S - 1)], 0.0) for x in (k, v))
                s = q[b, rows] @ k_.T * D ** -0.5  # (bm, bn)
                seen = visible(rows, keys, int(lengths[b]), causal) & \
                    allowed[b, rows][:, keys.clamp(max=S - 1)].where((keys < S)[None, :], True)
                m, l, acc = step(m, l, acc, s.masked_fill(~seen, NEG), v_)  # noqa: E741
                tiles[b, i] += 1
            seen = l > 0
            o[b, rows] = acc / torch.where(seen, l, 1.0)[:, None]
            lse[b, rows] = torch.where(seen, m + torch.log(torch.where(seen, l, 1.0)), 0.0)
    return o[:, :L], lse[:, :L], tiles

def _forward_kernel(step, end, visible, q, k, v, allowed, lengths, causal, bm, bn):
    B, L, _ = q.shape
    n = -(-L // bm)
    out = _launch(_forward, (n, B), q, k, v, allowed.to(torch.int8), lengths.to(torch.int32), torch.empty_like(q),
                  q.new_empty(B, L), torch.empty(B, n, dtype=torch.int32), L, k.shape[1], n, D ** -0.5, BLOCK_D=D,
                  BLOCK_M=bm, BLOCK_N=bn, CAUSAL=causal, STEP=step, END=end, VISIBLE=visible)
    return tuple(out[5:8])

def _exact(q, k, v, allowed):
    """(O, lse) of attention over the allowed keys; a row that sees none: 0 and 0."""
    s = (q @ k.mT * D ** -0.5).masked_fill(~allowed, NEG)
    lse = torch.logsumexp(s, -1)
    empty = lse == NEG
    return (torch.softmax(s, -1) @ v).nan_to_num(0.0).masked_fill(empty[..., None], 0.0), lse.masked_fill(empty, 0.0)

def _backward_torch(prob, grad, q, k, v, do, allowed, bm, bn):
    """The backward kernels' tiles in torch: (dQ, dK, dV)."""
    B, L, _ = q.shape
    S = k.shape[1]
    o, lse = _exact(q, k, v, allowed)
    q, do, o, lse = (_padded(x, 1, bm) for x in (q, do, o, lse))
    k, v, allowed = _padded(k, 1, bn), _padded(v, 1, bn), _padded(_padded(allowed, 1, bm, False), 2, bn, False)
    dq, dk, dv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
    for b in range(B):
        for i in range(0, q.shape[1], bm):
            for j in range(0, k.shape[1], bn):
                r, c = slice(i, i + bm), slice(j, j + bn)
                s = (q[b, r] @ k[b, c].T * D ** -0.5).masked_fill(~allowed[b, r, c], NEG)
                p = prob(s, lse[b, r])
                ds = grad(p, do[b, r] @ v[b, c].T, do[b, r], o[b, r])
                dv[b, c] += p.T @ do[b, r]
                dk[b, c] += ds.T @ q[b, r] * D ** -0.5
                dq[b, r] += ds @ k[b, c] * D ** -0.5
    return dq[:, :L], dk[:, :S], dv[:, :S]

def _backward_kernel(prob, grad, q, k, v, do, allowed, bm, bn):
    B, L, _ = q.shape
    S = k.shape[1]
    o, lse = _exact(q, k, v, allowed)
    return tuple(_launch(_backward, (B,), q, k, v, do, o, lse, allowed.to(torch.int8), torch.zeros_like(q),
                         torch.empty_like(k), torch.empty_like(v), L, S, D ** -0.5, BLOCK_D=D, BLOCK_M=bm, BLOCK_N=bn,
                         PROB=prob, GRAD=grad)[7:10])

# The cases: float64, one head, d = 16; several key tiles per row, the maximum growing in later ones.

def _qkv(B, L, S, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(B, n, D, generator=gen, dtype=torch.float64) for n in (L, S, S))
    k = k * torch.linspace(0.7, 2.0, S, dtype=torch.float64)[:, None]  # later keys score higher: the maximum grows
    return q, k, v

def _allowed(B, L, S, causal=False, left=(), empty=()):
    """(B, L, S) bool: the keys each query may see; ``left``: keys hidden at the start of each sentence (left
    padding); ``empty``: (b, row) that see no key at all."""
    allowed = torch.ones(B, L, S, dtype=torch.bool)
    if causal:
        allowed &= torch.ones(L, S, dtype=torch.bool).tril()
    for b, n in enumerate(left):
        allowed[b, :, :n] = False
    for b, row in empty:
        allowed[b, row] = False
    return allowed

def _step_case(name, B, L, S, bm, bn, seed=0, shifted=(), **pattern):
    """``shifted``: (b, query, offset), a query whose scores all lie ``offset`` away from the others' (+1000: a
    maximum over the whole tile, not per row, leaves the others' exp(s - m) at 0; -1000: so does a maximum of 0)."""
    q, k, v = _qkv(B, L, S, seed)
    k[..., -1] = 1.0  # the last feature adds q[..., -1] / 4 to each query's scores: a row's offset
    for b, row, offset in shifted:
        q[b, row, -1] = 4 * offset
    allowed = _allowed(B, L, S, **pattern)
    first = allowed[..., :bn].any(-1)
    marks = {}
    for words, rows in (("that see no key at all", ~allowed.any(-1)),
                        ("that see no key in the first tile", ~first & allowed.any(-1))):
        if rows.any():
            marks |= {f"at the rows {words}": rows, f"at the rows {words} (O)": rows[..., None].expand(B, L, D)}
    return Case(f"{name}, L = {L}, S = {S}, tiles {bm} x {bn}", (q, k, v, allowed, bm, bn), marks)

HINTS = (
    (r"make_shape_compatible|incompatible dimensions", "two tiles whose shapes do not line up. Triton lines shapes up "
     "from the RIGHT, as torch does: a vector of one value per row, (BLOCK_M,), meets a (BLOCK_M, n) tile as x[:, "
     "None]; one per key, (BLOCK_N,), as x[None, :]. A square tile hides a slip here; a tile of 32 by 16 does not."),
    (r"equal reduction dimensions|tl\.dot|dot\(", "tl.dot(a, b) multiplies (M, K) by (K, N), each side at least 16: a "
     "tl.trans missing or extra, or a vector where a tile belongs."),
    (r"same dtype|fp32 and fp64|fp64 and fp32", "the checker's tiles are float64 (so that it can compare to 1e-7; the "
     "chapter's kernel runs float32): convert with x.to(v.dtype), the dtype of the tiles given, never to a named "
     "one such as tl.float32."),
    (r"unpack|to tensor|tuple", "the kernel takes back exactly what the statement returns: a tuple of that many "
     "tensors, in that order."),
)

# 1. online_step.

def _step(m, l, acc, s, v, carry=True, guard=True, way=1, old=False, scale_l=True,  # noqa: E741
          scale_acc=True, added=1, divide=None, kept=False, rows=True, stand_in=False):
    """The fold of one tile, in torch; each switch off it is a classic mistake."""
    top = s.amax(1) if rows else s.amax()
    m_new = torch.maximum(m, top) if carry else top
    shift = torch.where(m_new == NEG, 0.0, m_new) if guard else m_new
    before = torch.where(m == NEG, 0.0, m) if old == "guarded" else m
    p = torch.exp(s - (before if old else shift)[:, None])
    alpha = torch.exp(m - shift) if way == 1 else torch.exp(shift - m)
    if way == "guarded":
        alpha = torch.where(m == NEG, 0.0, alpha)
    l_new = (l * alpha if scale_l else l) + p.sum(1)
    acc = (acc * alpha[:, None] if scale_acc else acc) + added * p @ v
    if divide is not None:
        acc = acc / (torch.where(l_new > 0, l_new, 1.0) if divide == "guarded" else l_new)[:, None]
    return (m if kept else shift if stand_in else m_new), l_new, acc

def _end(i, n_keys, L, bm, causal, skip=0, lengths=True, last=True, short=0):
    """key_end in torch; ``skip``: tiles past the diagonal's; ``lengths``: whether n_keys bounds it; ``last``:
    whether L does; ``short``: keys left out at the end."""
    n_keys -= short
    return min(n_keys if lengths else 10 ** 9, (i + 1 + skip) * bm, L if last else 10 ** 9) if causal else n_keys

def _sees(rows, keys, n_keys, causal, compare=torch.le, padding=True, causal_used=True):
    """visible in torch: (bm, bn) bool; ``padding``: True, False, or "le" (key n_keys seen too)."""
    seen = (keys[None, :] <= n_keys) if padding == "le" else (keys[None, :] < n_keys) if padding else \
        torch.ones(1, len(keys), dtype=torch.bool)
    return seen & compare(keys[None, :], rows[:, None]) if causal and causal_used else seen.expand(len(rows), -1)

def _folded(step):
    """The forward kernel with ``step`` (torch) for online_step: (O, lse)."""
    @_course
    def forward(q, k, v, allowed, block_m, block_n):
        lengths = torch.full((q.shape[0],), k.shape[1])
        return _forward_torch(step, _end, _sees, q, k, v, allowed, lengths, False, block_m, block_n)[:2]
    return forward

def _step_kernel(step, q, k, v, allowed, block_m, block_n):
    lengths = torch.full((q.shape[0],), k.shape[1])
    return _forward_kernel(step, _key_end, _visible, q, k, v, allowed, lengths, False, block_m, block_n)[:2]

_s = lambda **switches: _folded(lambda *a: _step(*a, **switches))  # noqa: E731 - the reference with switches
RESCALE = "multiply l and acc by alpha = exp(m - m_new) before adding this tile's p"
STEP = Exercise(
    what="your online_step",
    reference=_folded(_step),
    cases=[_step_case("one query tile, the maximum growing", 1, 16, 48, 16, 16),
           _step_case("causal: later tiles hidden, query 20 scoring far above the rest", 1, 48, 48, 16, 16, seed=1,
                      causal=True, shifted=[(0, 20, 1000)]),
           _step_case("left padding: rows that see nothing in their first tile, query 5 of sentence 1 scoring far "
                      "below the rest", 2, 32, 48, 16, 16, seed=2, left=(0, 20), shifted=[(1, 5, -1000)]),
           _step_case("causal, rows that see no key at all", 2, 40, 40, 32, 16, seed=3, causal=True,
                      empty=((0, 5), (1, 0))),
           _step_case("left padding, a ragged last tile", 1, 20, 45, 16, 32, seed=4, left=(17,))],
    mistakes=[
        Mistake("acc not rescaled", f"adds this tile's p @ v to acc WITHOUT RESCALING acc, summed under an older, "
                f"smaller maximum; l is rescaled, acc is not: {RESCALE}.", _s(scale_acc=False)),
        Mistake("l not rescaled", f"adds this tile's sum of p to l WITHOUT RESCALING l, summed under an older, smaller "
                f"maximum; acc is rescaled, l is not: {RESCALE}.", _s(scale_l=False)),
        Mistake("max not carried", "takes m_new = the maximum of this tile's scores alone, forgetting the maximum of "
                "the tiles before: m_new = tl.maximum(m, tl.max(s, 1)).", _s(carry=False)),
        Mistake("m not updated", "returns the old m, not m_new: the next tile rescales from the wrong maximum, and the "
                "log-sum-exp m + log(l) is off. Return (m_new, l, acc).", _s(kept=True)),
        *[Mistake(f"wrong way round{g}", "takes the factor the WRONG WAY ROUND, exp(m_new - m) >= 1 (inf in a row's "
                  "first tile, where m = -inf): the old sums shrink to the new maximum, alpha = exp(m - m_new) <= 1.",
                  _s(way=way)) for g, way in (("", -1), (" (0 where m is -inf)", "guarded"))],
        Mistake("tile maximum", "takes the maximum over the WHOLE TILE, tl.max(s) without an axis: one number for "
                "every row, so a row whose scores lie far below another row's has exp(s - m) = 0 (below exp(-745)) "
                "and loses its keys. The maximum is per row: tl.max(s, 1).", _s(rows=False)),
        Mistake("stand-in returned", "returns the stand-in 0 as m for a row that has seen no key yet: m must stay "
                "-inf there, 0 belongs only inside the exponentials. A row whose first keys score far below 0 (here "
                "-1000) then gets exp(s - 0) = 0 and loses them. Return m_new, -inf and all.", _s(stand_in=True)),
        Mistake("no guard", "gives NaN in rows that have seen no key yet (m_new = -inf): exp(s - m_new) (or exp(m - "
                "m_new)) there is exp(-inf - -inf) = NaN. Subtract a stand-in, 0 where m_new is -inf: shift = "
                "tl.where(m_new == float('-inf'), 0.0, m_new), p = tl.exp(s - shift[:, None]), alpha = tl.exp(m - "
                "shift).",
                _s(guard=False)),
        *[Mistake(f"old maximum{g}", "takes p = exp(s - m) against the OLD maximum m (inf, or NaN, in a row's first "
                  "tile, where m = -inf): p and alpha are both taken against m_new, the maximum with this tile.",
                  _s(old=old)) for g, old in (("", True), (" (0 where m is -inf)", "guarded"))],
        Mistake("p not added", "rescales acc but never adds this tile's p @ v to it: acc = acc * alpha[:, None] + "
                "tl.dot(p, v).", _s(added=0)),
        Mistake("p added twice", "adds this tile's p @ v to acc TWICE: once, acc = acc * alpha[:, None] + tl.dot(p, "
                "v).", _s(added=2)),
        *[Mistake(f"divided inside{g}", "divides acc by l INSIDE the loop: acc is a sum, divided once, after the last "
                  "tile (the kernel does it: O = acc / l). Return acc * alpha[:, None] + tl.dot(p, v), undivided.",
                  _s(divide=divide)) for g, divide in (("", "plain"), (" (guarded)", "guarded"))],
    ],
    passed="the output and the log-sum-exp of the whole forward kernel: several key tiles per row, the maximum "
           "growing in later tiles, causal rows that see nothing in a tile, left padding, rows that see no key at all.",
    run=_runner(_step_kernel, ("online_step",)), parts=("O", "lse"), atol=1e-7, exchange=False, hints=HINTS,
)

def check_online_step(online_step) -> None:
    """Check ``online_step(m, l, acc, s, v) -> (m, l, acc)``, a @triton.jit function, in the forward kernel."""
    _check(STEP, online_step)

# 2. key_end and visible.

def _mask_case(name, B, L, S, bm, bn, causal, lengths=None, seed=0):
    q, k, v = _qkv(B, L, S, seed)
    lengths = torch.tensor(lengths if lengths is not None else [S] * B)
    return Case(f"{name}, L = {L}, S = {S}, tiles {bm} x {bn}", (q, k, v, lengths, causal, bm, bn))

def _masked(end=_end, sees=_sees):
    """The forward kernel with ``end`` and ``sees`` (torch) for key_end and visible: (O, lse, tiles loaded)."""
    @_course
    def forward(q, k, v, lengths, causal, block_m, block_n):
        allowed = torch.ones(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool)
        return _forward_torch(_step, end, sees, q, k, v, allowed, lengths, causal, block_m, block_n)
    return forward

def _mask_kernel(end, visible, q, k, v, lengths, causal, block_m, block_n):
    allowed = torch.ones(q.shape[0], q.shape[1], k.shape[1], dtype=torch.bool)
    return _forward_kernel(_online_step, end, visible, q, k, v, allowed, lengths, causal, block_m, block_n)

_e = lambda **switches: _masked(lambda *a: _end(*a, **switches))  # noqa: E731
_v = lambda **switches: _masked(sees=lambda *a: _sees(*a, **switches))  # noqa: E731
MASK = Exercise(
    what="your key_end and visible",
    reference=_masked(),
    cases=[_mask_case("causal, L = S", 1, 48, 48, 16, 16, True),
           _mask_case("causal, tiles of 32 queries", 1, 48, 48, 32, 16, True, seed=1),
           _mask_case("not causal, a ragged S", 1, 20, 40, 16, 16, False, seed=2),
           _mask_case("padded sentences of 13 and 40 keys, causal", 2, 40, 40, 16, 16, True, [13, 40], seed=3),
           _mask_case("padded sentences of 20 and 5 keys", 2, 24, 40, 16, 16, False, [20, 5], seed=4),
           _mask_case("causal, S < L", 1, 48, 40, 16, 32, True, seed=5),
           _mask_case("causal, S > L, L ending inside a tile", 1, 40, 77, 32, 16, True, seed=6),
           _mask_case("padded sentences of 17 and 40 keys", 2, 24, 40, 16, 16, False, [17, 40], seed=7)],
    mistakes=[
        Mistake("one tile short", "stop the causal loop ONE TILE EARLY, at i * BLOCK_M: the tile that holds the "
                "diagonal is never loaded, so each query misses the keys of its own tile. End at (i + 1) * BLOCK_M.",
                _e(skip=-1)),
        Mistake("one tile too many", "load ONE TILE TOO MANY in the causal loop, up to (i + 2) * BLOCK_M: the output "
                "is right (the mask hides the extra keys) but each program loads a tile wholly above the diagonal. "
                "End at the smallest of n_keys, (i + 1) * BLOCK_M and L.", _e(skip=1)),
        Mistake("no causal skip", "load EVERY key tile, causal or not: the output is right (the mask hides the "
                "keys past the diagonal) but the tiles wholly above the diagonal are loaded for nothing. Causal: end "
                "at the smallest of n_keys, (i + 1) * BLOCK_M and L.", _masked(lambda i, n, L, bm, causal: n)),
        Mistake("causal end always", "stop the loop at (i + 1) * BLOCK_M even when CAUSAL is off: without the causal "
                "mask each query sees every key up to n_keys. Only `if CAUSAL:` may the end come early.",
                _masked(lambda i, n, L, bm, causal: min(n, (i + 1) * bm, L))),
        Mistake("end ignoring n_keys", "stop the causal loop at (i + 1) * BLOCK_M without tl.minimum with n_keys: the "
                "output is right (the mask hides them) but the tiles past a sentence's last key are loaded. End at "
                "tl.minimum(n_keys, tl.minimum((i + 1) * BLOCK_M, L)).", _e(lengths=False)),
        Mistake("end ignoring L", "stop the causal loop at (i + 1) * BLOCK_M without L: where the sequence ends "
                "inside the tile and there are more keys than queries, the tiles after its last query, which no "
                "query may see, are loaded (the output is right). End at tl.minimum(n_keys, tl.minimum((i + 1) * "
                "BLOCK_M, L)).", _e(last=False)),
        Mistake("one key short", "stop the loop ONE KEY SHORT, at n_keys - 1: a sentence's last key is never "
                "loaded when it starts a tile of its own (keys run 0 to n_keys - 1, so the loop ends at n_keys).",
                _e(short=1)),
        Mistake("last tile unmasked", "leave keys from n_keys on visible (the last tile's mask forgotten): the "
                "padding of a short sentence, and past a ragged S, is attended to. Visible needs keys[None, :] < "
                "n_keys as well.", _v(padding=False)),
        Mistake("key n_keys visible", "let key n_keys be seen, keys <= n_keys: keys run 0 to n_keys - 1, so "
                "visible needs keys[None, :] < n_keys.", _v(padding="le")),
        Mistake("diagonal hidden", "hide the diagonal, keys < rows: a query may see its own key, keys[None, :] <= "
                "rows[:, None].", _v(compare=torch.lt)),
        Mistake("wrong way round", "compare keys and rows the WRONG WAY ROUND, keys >= rows: a query sees the keys "
                "at and AFTER it; causal is keys[None, :] <= rows[:, None].", _v(compare=torch.ge)),
        Mistake("mask ignoring CAUSAL", "mask for padding only, ignoring CAUSAL: inside the diagonal tile a query "
                "sees the keys after it. If CAUSAL, keys[None, :] <= rows[:, None] as well.",
                _v(causal_used=False)),
        Mistake("padding dropped when causal", "drop the padding mask when CAUSAL: a short sentence's queries see "
                "its padding up to the diagonal. Both apply: keys < n_keys, and if CAUSAL keys <= rows.",
                _masked(sees=lambda r, k, n, causal: _sees(r, k, n, causal, padding=not causal))),
    ],
    passed="the output, the log-sum-exp and the number of key tiles each program loads: no tile wholly above the "
           "diagonal, none past a sentence's last key or the sequence's last query, the diagonal tile and a ragged "
           "last tile masked, tiles of 16 and 32.",
    run=_runner(_mask_kernel, ("key_end", "visible")),
    parts=("O", "lse", "tile count"), atol=1e-7, exchange=False,
    hints=HINTS,
)

def check_tile_mask(key_end, visible) -> None:
    """Check ``key_end(i, n_keys, L, BLOCK_M, CAUSAL)`` and ``visible(rows, keys, n_keys, CAUSAL)``, @triton.jit
    functions, in the forward kernel: its output, and the tiles it loads."""
    _check(MASK, (key_end, visible))

# 3. probabilities and score_grad.

def _back_case(name, B, L, S, bm, bn, seed=0, shifted=(), **pattern):
    """``shifted``: (b, query, offset) as in _step_case: a row of scores near +1000, whose exp overflows."""
    q, k, v = _qkv(B, L, S, seed)
    k[..., -1] = 1.0
    for b, row, offset in shifted:
        q[b, row, -1] = 4 * offset
    do = torch.randn(B, L, D, generator=torch.Generator().manual_seed(seed + 50), dtype=torch.float64)
    return Case(f"{name}, L = {L}, S = {S}, tiles {bm} x {bn}", (q, k, v, do, _allowed(B, L, S, **pattern), bm, bn))

def _prob(s, lse, how="lse"):
    """probabilities in torch; ``how``: what is subtracted."""
    if how == "row" and s.shape[0] != s.shape[1]:  # Triton's words for lse[None, :] against a (BM, BN) tile
        raise ValueError(f"Cannot make_shape_compatible: incompatible dimensions at index 1: {s.shape[1]} and "
                         f"{s.shape[0]}")
    return torch.exp(s - {"lse": lse[:, None], "row": lse[None, :], "max": s.amax(1, keepdim=True), "none": 0.0,
                          "plus": -lse[:, None]}[how])

def _grad(p, dp, do, o, how="D"):
    """score_grad in torch; ``how``: which D, or how dS is made of it."""
    d = {"tile": (p * dp).sum(1), "dO": do.sum(1), "none": torch.zeros_like(do[:, 0]),
         "all": (do * o).sum().expand(len(do))}.get(how, (do * o).sum(1))
    return {"sign": p * (d[:, None] - dp), "no p": dp - d[:, None]}.get(how, p * (dp - d[:, None]))

def _b(prob="lse", grad="D"):
    """The backward kernels with a torch probabilities and score_grad: (dQ, dK, dV)."""
    @_course
    def backward(q, k, v, do, allowed, block_m, block_n):
        return _backward_torch(lambda s, lse: _prob(s, lse, prob), lambda *a: _grad(*a, how=grad), q, k, v, do,
                               allowed, block_m, block_n)
    return backward

def _which(got, *args) -> str:
    """Which of the two functions a wrong result points to: dV = P^T dO depends on probabilities alone."""
    if torch.allclose(got[2], _b()(*args)[2], atol=1e-7, rtol=0):
        return "Its dv is right, and dV = P^T dO uses probabilities alone: look at score_grad."
    return "Its dv is wrong, and dV = P^T dO uses probabilities alone: look at probabilities first."

TILE_D = ("rowsum(dO * O) equals rowsum(P * dP) over the WHOLE ROW of keys (the chapter proves it), but score_grad "
          "sees one tile of them: compute D from do and o, tl.sum(do * o, 1)[:, None].")
BACKWARD = Exercise(
    what="your probabilities and score_grad",
    reference=_b(),
    cases=[_back_case("several key tiles per row", 1, 16, 48, 16, 16),
           _back_case("causal", 1, 48, 48, 16, 16, seed=1, causal=True),
           _back_case("padded sentences, tiles of 16 by 32", 2, 32, 45, 16, 32, seed=2, left=(0, 20)),
           _back_case("causal, tiles of 32 by 16", 1, 40, 40, 32, 16, seed=3, causal=True),
           _back_case("a query scoring near +1000", 1, 16, 32, 16, 16, seed=4, shifted=((0, 5, 1000),))],
    mistakes=[
        Mistake("lse along the keys", "subtract lse[None, :], ALONG THE KEYS: each row has its own log-sum-exp, "
                "subtracted along that row, tl.exp(s - lse[:, None]). (Square tiles hide it: 16 by 16 runs, "
                "16 by 32 does not.)", _b(prob="row")),
        Mistake("tile maximum", "recompute P against the TILE's own maximum, not the row's log-sum-exp: P = exp(s - "
                "lse[:, None]) is the softmax of the whole row, already normalised; one tile cannot normalise it.",
                _b(prob="max")),
        Mistake("no lse", "take P = exp(s), WITHOUT THE LOG-SUM-EXP: the probabilities are exp(s - lse), each row's "
                "lse[:, None] subtracted.", _b(prob="none")),
        Mistake("lse added", "ADD the log-sum-exp, exp(s + lse): it is subtracted, tl.exp(s - lse[:, None]).",
                _b(prob="plus")),
        Mistake("D left out", "take dS = P * dP, leaving out D: the softmax's gradient is dS = P * (dP - D), D = "
                "rowsum(dO * O).", _b(grad="none")),
        Mistake("D from the tile", f"take D = rowsum(P * dP) over THIS TILE only: {TILE_D}", _b(grad="tile")),
        Mistake("D = rowsum(dO)", "take D = rowsum(dO), without O: D = rowsum(dO * O), tl.sum(do * o, 1).",
                _b(grad="dO")),
        Mistake("D of the tile", "take D = tl.sum(do * o) WITHOUT AN AXIS, one number for the whole tile: D is one "
                "number per row (query), tl.sum(do * o, 1)[:, None].", _b(grad="all")),
        Mistake("sign flipped", "have dS's SIGN FLIPPED, P * (D - dP): dS = P * (dP - D).", _b(grad="sign")),
        Mistake("P left out", "leave P out of dS, dP - D: dS = P * (dP - D) (0 where a key is hidden, as P is).",
                _b(grad="no p")),
    ],
    passed="dQ, dK and dV of the whole backward pass: several key tiles per row, causal and padded rows, a row of "
           "scores near +1000, tiles of 16 by 16, 16 by 32 and 32 by 16.",
    run=_runner(_backward_kernel, ("probabilities", "score_grad")), parts=("dq", "dk", "dv"), atol=1e-7,
    exchange=False, hints=HINTS, notes=lambda got, *args: _which(got, *args),
)

def check_backward_step(probabilities, score_grad) -> None:
    """Check ``probabilities(s, lse)`` and ``score_grad(p, dp, do, o)``, @triton.jit functions, in the backward
    kernels: dQ, dK and dV."""
    _check(BACKWARD, (probabilities, score_grad))

EXERCISES = [STEP, MASK, BACKWARD]
