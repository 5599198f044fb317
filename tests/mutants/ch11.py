"""Chapter 11's checkers under mutation: the rows of a packed in_proj_weight for one rank's heads, and one step of
ring attention.

Each checker runs the learner's function in worker processes (one launch per call, ~2 s of starting Python and
torch). So that a catalogue costs one launch and not one per answer, its checker here is :func:`batched`: on its
first call it runs every answer of the catalogue (correct and mutant) in one launch, through the same code as the
checker (``ch11._verdicts``: every answer sent to the workers by value, run there on every case, the real
all_reduce or ring included), then judges each answer from what came back, as the checker does."""
import functools
import threading

import torch
import torch.distributed as dist

from attention_course.exercises import ch11
from mutants import Catalogue, Mutant


def stub(*args):
    raise NotImplementedError()


def no_return(*args):
    pass


# Right answers as a notebook cell holds them: defined by exec in a namespace of their own (module __main__, no
# source file), as in a kernel or in grading's check server.
SPLIT_CELL = '''
def split_in_proj(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    if num_heads % world_size:
        raise ValueError("world_size must divide num_heads")
    E = in_proj_weight.shape[1]
    d, n = E // num_heads, num_heads // world_size
    heads = slice(rank * n, (rank + 1) * n)
    weight = in_proj_weight.view(3, num_heads, d, E)[:, heads].reshape(-1, E)
    return weight, in_proj_bias.view(3, num_heads, d)[:, heads].reshape(-1)
'''

RING_CELL = '''
def ring_step(state, q, k, v, key_padding_mask, step, rank, world_size,
              is_causal):
    m, l, acc = state
    src = (rank - step) % world_size
    if is_causal and src > rank:
        return state
    scores = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    if is_causal and src == rank:
        future = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], float("-inf"))
    m_new = torch.maximum(m, scores.amax(-1, keepdim=True))
    shift = m_new.masked_fill(m_new == float("-inf"), 0.0)
    p, old = torch.exp(scores - shift), torch.exp(m - shift)
    return m_new, old * l + p.sum(-1, keepdim=True), old * acc + p @ v
'''

SETUP = "import math\nimport torch\nimport torch.distributed as dist\n"


def from_a_cell(code: str, name: str):
    namespace = {"__name__": "__main__"}
    exec(compile(SETUP + code, "<cell>", "exec"), namespace)
    return namespace[name]


def batched(check, exercise: str, answers: list):
    """``check`` as the mutation tests call it, one answer at a time, with every answer of ``answers`` run in one
    launch on the first call."""
    verdicts = {}

    @functools.wraps(check)
    def checker(answer):
        if id(answer) not in verdicts:
            if not any(answer is known for known in answers):
                return check(answer)
            verdicts.update({id(a): v for a, v in zip(answers, ch11._verdicts(exercise, answers))})
        return verdicts[id(answer)]()
    return checker


def catalogue(check, exercise: str, correct: dict, mutants: list) -> Catalogue:
    answers = [*correct.values(), *(m.answer for m in mutants)]
    return Catalogue(batched(check, exercise, answers), correct, mutants)


# ---------------------------------------------------------------------------------------------------------
# check_split_in_proj


def divisible(num_heads, world_size):
    if num_heads % world_size:
        raise ValueError(f"world_size {world_size} must divide num_heads {num_heads}")


def view_and_slice(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    divisible(num_heads, world_size)
    E = in_proj_weight.shape[1]
    d, n = E // num_heads, num_heads // world_size
    rows = in_proj_weight.view(3, num_heads, d, E)[:, rank * n:(rank + 1) * n]
    return rows.reshape(-1, E), in_proj_bias.view(3, num_heads, d)[:, rank * n:(rank + 1) * n].reshape(-1)


def chunk_each_third(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    """W_q, W_k, W_v apart, each cut into world_size contiguous chunks (whole heads, since P divides h)."""
    divisible(num_heads, world_size)
    pick = lambda t: torch.cat([part.chunk(world_size)[rank] for part in t.chunk(3)])  # noqa: E731
    return pick(in_proj_weight), pick(in_proj_bias)


def row_indices(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    if num_heads % world_size != 0:
        raise ValueError("the heads must split evenly over the ranks")
    E = in_proj_weight.shape[1]
    share = E // world_size
    rows = torch.tensor([part * E + rank * share + i for part in range(3) for i in range(share)])
    return in_proj_weight.index_select(0, rows), in_proj_bias[rows]


def from_the_process_group(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    """Reads the rank and world size from torch.distributed, as code inside a process group may."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    divisible(num_heads, world_size)
    E = in_proj_weight.shape[1]
    share = E // world_size
    return (torch.cat([in_proj_weight.narrow(0, part * E + rank * share, share) for part in range(3)]),
            torch.cat([in_proj_bias.narrow(0, part * E + rank * share, share) for part in range(3)]))


def _my_rows(t, num_heads, rank, world_size):
    """A helper of the learner's: the rank's heads of each third of t, packed."""
    first = t.shape[0] // 3 // num_heads * (num_heads // world_size) * rank
    size = t.shape[0] // 3 // world_size
    return torch.cat([third[first:first + size] for third in t.tensor_split(3)])


def with_a_helper(in_proj_weight, in_proj_bias, num_heads, rank, world_size):
    divisible(num_heads, world_size)
    return (_my_rows(in_proj_weight, num_heads, rank, world_size),
            _my_rows(in_proj_bias, num_heads, rank, world_size))


def split(**switches):
    def answer(w, b, h, r, P):
        divisible(h, P)
        return ch11._split(w, b, h, r, P, **switches)
    return answer


def no_check(w, b, h, r, P):
    E = w.shape[1]
    d, n = E // h, h // P
    return w.view(3, h, d, E)[:, r * n:(r + 1) * n].reshape(-1, E), b.view(3, h, d)[:, r * n:(r + 1) * n].reshape(-1)


def asserted(w, b, h, r, P):
    assert h % P == 0, "world_size must divide num_heads"
    return no_check(w, b, h, r, P)


def zeroes_the_input(w, b, h, r, P):
    out = [t.clone() for t in view_and_slice(w, b, h, r, P)]
    w.zero_()
    return tuple(out)


def columns(w, b, h, r, P):
    divisible(h, P)
    return w.chunk(P, dim=1)[r], view_and_slice(w, b, h, r, P)[1]


def four_d(w, b, h, r, P):
    divisible(h, P)
    E = w.shape[1]
    d, n = E // h, h // P
    return w.view(3, h, d, E)[:, r * n:(r + 1) * n], view_and_slice(w, b, h, r, P)[1]


def only_q(w, b, h, r, P):
    divisible(h, P)
    E = w.shape[1]
    return w[:E].chunk(P)[r], b[:E].chunk(P)[r]


def three_parts(w, b, h, r, P):
    divisible(h, P)
    weight, bias = view_and_slice(w, b, h, r, P)
    return (*weight.chunk(3),)


def packaged(w, b, h, r, P):
    from attention_course.distributed import split_in_proj_by_heads

    return split_in_proj_by_heads(w, h, r, P), split_in_proj_by_heads(b, h, r, P)


LOCK = threading.Lock()  # not picklable: it cannot reach the workers


def uses_a_lock(w, b, h, r, P):
    with LOCK:
        return view_and_slice(w, b, h, r, P)


SPLIT = catalogue(
    ch11.check_split_in_proj, "split",
    correct={
        "the reference": ch11._split,
        "view(3, h, d, E) and a slice of heads": view_and_slice,
        "each third chunked by ranks": chunk_each_third,
        "index_select of the row numbers": row_indices,
        "rank and world size from torch.distributed, narrow": from_the_process_group,
        "a helper function of the learner's": with_a_helper,
        "a notebook cell's": from_a_cell(SPLIT_CELL, "split_in_proj"),
    },
    mutants=[
        Mutant("packed rows cut into P chunks", split(layout="chunks"), (r"CONTIGUOUS CHUNKS", r"mixes up W_q")),
        Mutant("Megatron's per-head layout", split(layout="per head"), (r"reads the rows HEAD BY HEAD", r"Megatron")),
        Mutant("strided heads", split(heads="strided"), (r"STRIDED", r"CONTIGUOUS heads")),
        Mutant("the mirror rank's heads", split(heads="mirror"), (r"ANOTHER RANK", r"other end"),
               family="another rank"),
        Mutant("the next rank's heads", split(heads="next"), (r"ANOTHER RANK", r"off-by-one"),
               family="another rank"),
        Mutant("rows ordered per head", split(out="per head"), (r"ORDERED PER HEAD",)),
        Mutant("blocks ordered k, q, v", split(order=(1, 0, 2)), (r"order k, q, v", r"PACKED ORDER")),
        Mutant("one head per rank", split(heads="one"), (r"ONE HEAD", r"n = num_heads // world_size")),
        Mutant("bias forgotten", split(bias_mode="none"), (r"bias is FORGOTTEN",)),
        Mutant("bias not split", split(bias_mode="whole"), (r"bias is NOT SPLIT",)),
        Mutant("bias cut in chunks", split(bias_mode="chunks"), (r"NOT LIKE THE ROWS",)),
        Mutant("not split at all", lambda w, b, h, r, P: (w, b), (r"rows are NOT SPLIT",)),
        Mutant("columns split", columns, (r"splits the COLUMNS", r"input features")),
        Mutant("transposed", lambda w, b, h, r, P: (view_and_slice(w, b, h, r, P)[0].T,
                                                    view_and_slice(w, b, h, r, P)[1]), (r"axes in another order", r"transpose")),
        Mutant("only W_q's rows", only_q, (r"ONE OF q, k, v",)),
        Mutant("4-D, never packed", four_d, (r"has shape \(3, 2, 1, 4\)", r"entries arranged in another shape", r"reshape")),
        Mutant("no divisibility check", no_check, (r"NO DIVISIBILITY CHECK",)),
        Mutant("an assert instead of ValueError", asserted, (r"raised AssertionError", r"python -O")),
        Mutant("input changed in place", zeroes_the_input, (r"modified its input `in_proj_weight` in place",)),
        Mutant("float32 rows", lambda *a: tuple(t.float() for t in view_and_slice(*a)),
               (r"right values in float32, expected float64",)),
        Mutant("three tensors q, k, v", three_parts, (r"returns 3 tensors", r"PACKED")),
        Mutant("the weight alone", lambda *a: view_and_slice(*a)[0], (r"returns one tensor", r"\(weight, bias\)")),
        Mutant("the package's split_in_proj_by_heads", packaged, (r"not accepted", r"may not be used",
                                                                   r"split_in_proj_by_heads")),
        Mutant("a global that cannot be sent", uses_a_lock, (r"LOCK", r"cannot be sent to the worker")),
        Mutant("no return statement", no_return, (r"nothing returned \(a `return` missing\?\)",)),
        Mutant("the stub", stub, (r"stub",)),
        Mutant("the function's result, not the function", (torch.zeros(12, 8), torch.zeros(12)),
               (r"without parentheses", r"got a tuple")),
    ],
)

# ---------------------------------------------------------------------------------------------------------
# check_ring_step

NEG = float("-inf")


def block_state(scores, v):
    """Chapter 8's state of one block: (m, l, acc), a row with every key hidden giving (-inf, 0, 0)."""
    m = scores.amax(-1, keepdim=True)
    p = torch.exp(scores - m.nan_to_num(neginf=0.0))
    return m, p.sum(-1, keepdim=True), p @ v


def merge(a, b):
    """Chapter 8's merge of two states."""
    m = torch.maximum(a[0], b[0])
    safe = m.nan_to_num(neginf=0.0)
    ca, cb = torch.exp(a[0] - safe), torch.exp(b[0] - safe)
    return m, ca * a[1] + cb * b[1], ca * a[2] + cb * b[2]


def through_chapter_8(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """The block's own state, merged into the running one with chapter 8's rule: two helpers of the learner's."""
    src = (rank - step) % world_size
    hide = torch.zeros(q.shape[2], k.shape[2], dtype=torch.bool)
    if is_causal and src > rank:
        return state
    if is_causal and src == rank:
        hide = torch.ones_like(hide).triu(1)
    if key_padding_mask is not None:
        hide = hide | key_padding_mask[:, None, None, :]
    scores = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    return merge(state, block_state(scores.masked_fill(hide, NEG), v))


def in_place(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """The running state updated in place (it is the caller's to give away), the rank from torch.distributed."""
    rank, world_size = dist.get_rank(), dist.get_world_size()
    m, l, acc = state
    src = (rank - step) % world_size
    if is_causal and src > rank:
        return m, l, acc
    s = torch.matmul(q, k.mT) / q.size(-1) ** 0.5
    if is_causal and src == rank:
        s = s + torch.full(s.shape[-2:], NEG, dtype=s.dtype).triu(1)
    if key_padding_mask is not None:
        s = s.masked_fill(key_padding_mask.view(k.shape[0], 1, 1, -1), NEG)
    m_new = torch.max(m, s.max(-1, keepdim=True).values)
    shift = m_new.clone()
    shift[shift == NEG] = 0.0
    old = (m - shift).exp()
    p = (s - shift).exp()
    l.mul_(old).add_(p.sum(-1, keepdim=True))
    acc.mul_(old).add_(p @ v)
    m.copy_(m_new)
    return m, l, acc


def ring(**switches):
    return lambda *args: ch11._ring_step(*args, **switches)


def scales_k_in_place(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    k.mul_(q.shape[-1] ** -0.5)  # scale once, on the block: but the block goes on to the next rank
    m, l, acc = state
    d = q.shape[-1]
    return ch11._ring_step(state, q * d ** 0.5, k, v, key_padding_mask, step, rank, world_size, is_causal)


def keeps_no_dim(state, *args):
    m, l, acc = ch11._ring_step(state, *args)
    return m.squeeze(-1), l, acc


def none_when_skipped(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    if is_causal and (rank - step) % world_size > rank:
        return None
    return ch11._ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)


def weights_not_values(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    m, l, acc = ch11._ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)
    return m, l, acc[..., :1] * torch.ones(*acc.shape[:-1], k.shape[2], dtype=acc.dtype)


def drops_the_old_state(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """Each block merged into an empty state: what came before is lost."""
    if is_causal and (rank - step) % world_size > rank:
        return state
    return ch11._ring_step(ch11.empty_state(q), q, k, v, key_padding_mask, step, rank, world_size, is_causal)


def keeps_the_old_m(state, *args):
    m_new, l, acc = ch11._ring_step(state, *args)
    return state[0], l, acc


def block_maximum(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """m_new from the block alone, l and acc made consistently with it."""
    m, l, acc = state
    src = (rank - step) % world_size
    if is_causal and src > rank:
        return state
    scores = q @ k.mT / q.shape[-1] ** 0.5
    if is_causal and src == rank:
        scores = scores.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), NEG)
    if key_padding_mask is not None:
        scores = scores.masked_fill(key_padding_mask[:, None, None, :], NEG)
    m_new = scores.amax(-1, keepdim=True)
    shift = m_new.nan_to_num(neginf=0.0)
    c = torch.exp(m - shift)
    p = torch.exp(scores - shift)
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ v


def k_not_transposed(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """q @ k instead of q @ k^T: an error wherever L_k != d."""
    q @ k  # noqa: B018 - the mistake: raises for blocks whose length is not d
    return ch11._ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)


def mask_not_broadcast(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """The padding mask (B, L_k) put on the scores (B, h, L_q, L_k) as it is."""
    if key_padding_mask is not None:
        (q @ k.mT).masked_fill(key_padding_mask, NEG)
    return ch11._ring_step(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal)


def padding_minus_1e9(state, q, k, v, key_padding_mask, step, rank, world_size, is_causal):
    """-1e9 added at the padded keys instead of -inf: a block all padding is then seen, as a row of equal scores."""
    m, l, acc = state
    src = (rank - step) % world_size
    if is_causal and src > rank:
        return state
    s = q @ k.mT / q.shape[-1] ** 0.5
    if is_causal and src == rank:
        s = s.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).triu(1), NEG)
    if key_padding_mask is not None:
        s = s + torch.where(key_padding_mask, -1e9, 0.0)[:, None, None, :]
    m_new = torch.maximum(m, s.amax(-1, keepdim=True))
    shift = m_new.masked_fill(m_new == NEG, 0.0)
    c = torch.exp(m - shift)
    p = torch.exp(s - shift)
    return m_new, c * l + p.sum(-1, keepdim=True), c * acc + p @ v


RING = catalogue(
    ch11.check_ring_step, "ring",
    correct={
        "the reference": ch11._ring_step,
        "a notebook cell's (masked_fill)": from_a_cell(RING_CELL, "ring_step"),
        "chapter 8's block state and merge, as helpers": through_chapter_8,
        "the state updated in place, the rank from torch.distributed": in_place,
    },
    mutants=[
        Mutant("no rescaling", ring(rescale="neither"), (r"NEITHER l NOR acc",)),
        Mutant("acc not rescaled", ring(rescale="l only"), (r"leaves acc UNSCALED",)),
        Mutant("l not rescaled", ring(rescale="acc only"), (r"leaves l UNSCALED",)),
        Mutant("inverted rescaling", ring(rescale="inverted"), (r"INVERTED", r"exp\(m_new - m_old\)")),
        Mutant("acc normalised at each step", ring(acc_mode="normalised"), (r"NORMALISES acc at each step",)),
        Mutant("no 1/sqrt(d)", ring(scale="none"), (r"NOT SCALE the scores",)),
        Mutant("divided by d", ring(scale="d"), (r"SQUARE ROOT",)),
        Mutant("no -inf guard", ring(guard=False), (r"NaN", r"every key of a block is padding")),
        Mutant("padding ignored", ring(padding="ignored"), (r"IGNORES THE PADDING",)),
        Mutant("padding inverted", ring(padding="inverted"), (r"WRONG WAY ROUND:",)),
        Mutant("block index (rank + step)", ring(direction="forward"), (r"WRONG WAY ROUND THE RING",)),
        Mutant("future blocks attended", ring(causal="no skip"), (r"attends a block AFTER THE RANK'S OWN",)),
        Mutant("triangle on every block", ring(causal="triangle everywhere"), (r"TRIANGLE on every block",)),
        Mutant("the past hidden in the own block", ring(causal="past hidden"), (r"hides the PAST",)),
        Mutant("-1e9 for the padded keys", padding_minus_1e9, (r"m differs", r"expected -inf, got -1e\+09")),
        Mutant("own block unmasked", ring(causal="own block open"), (r"does not mask the rank's OWN BLOCK",)),
        Mutant("is_causal ignored", ring(causal="ignored"), (r"IGNORES is_causal",)),
        Mutant("positions from equal blocks", ring(causal="positions"), (r"ONE LENGTH", r"tensor_split")),
        Mutant("k scaled in place", scales_k_in_place, (r"modified its input `k` in place",)),
        Mutant("m without keepdim", keeps_no_dim, (r"keepdim=True",)),
        Mutant("state in the order (m, acc, l)", lambda *a: [ch11._ring_step(*a)[i] for i in (0, 2, 1)],
               (r"ORDER \(m, l, acc\)",)),
        Mutant("the block's output returned", lambda *a: ch11._ring_step(*a)[2],
               (r"returns one tensor", r"new STATE")),
        Mutant("None for a skipped block", none_when_skipped, (r"returns None", r"return the state unchanged")),
        Mutant("weights not multiplied by v", weights_not_values, (r"acc has shape \(2, 2, 2, 2\), expected \(2, 2, 2, 4\)",)),
        Mutant("float32 state", lambda *a: tuple(t.float() for t in ch11._ring_step(*a)),
               (r"right values in float32, expected float64",)),
        Mutant("no return statement", no_return, (r"nothing returned \(a `return` missing\?\)",)),
        Mutant("the stub", stub, (r"stub",)),
        Mutant("the old state dropped", drops_the_old_state, (r"DROPS THE OLD STATE",)),
        Mutant("m not updated", keeps_the_old_m, (r"m is NOT UPDATED",)),
        Mutant("m of the block alone", block_maximum, (r"RUNNING MAXIMUM",)),
        Mutant("k not transposed", k_not_transposed, (r"raised RuntimeError", r"q @ k.transpose\(-2, -1\)")),
        Mutant("mask (B, L_k) on the scores", mask_not_broadcast, (r"\): your ring_step raised RuntimeError", r"broadcasting cannot line up",
                                                                    r"view\(B, 1, 1, S\)")),
    ],
)

CATALOGUES = [SPLIT, RING]
