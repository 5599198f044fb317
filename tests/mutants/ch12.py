"""Chapter 12's checkers under mutation: the block-diagonal mask from cu_seqlens, gathering a request's keys through
its block table, and planning one step of continuous batching."""
import torch

from attention_course.exercises import ch12
from mutants import Catalogue, Mutant


def stub(*args):
    raise NotImplementedError()


# ---------------------------------------------------------------------------------------------------------
# check_block_mask


def mask_by_ids(cu):
    lengths = cu[1:] - cu[:-1]
    ids = torch.repeat_interleave(torch.arange(len(lengths)), lengths)
    rows = torch.arange(len(ids))
    return (ids[:, None] != ids[None, :]) | (rows[None, :] > rows[:, None])


def mask_by_blocks(cu):
    N = int(cu[-1])
    keep = torch.zeros(N, N, dtype=torch.bool)
    for a, b in zip(cu[:-1].tolist(), cu[1:].tolist()):
        keep[a:b, a:b] = torch.ones(b - a, b - a, dtype=torch.bool).tril()
    return ~keep


def _ids_shifted(cu):
    rows = torch.arange(int(cu[-1]))
    return (torch.searchsorted(cu, rows, right=False) - 1).clamp(min=0)


def _mask(ids, op):
    rows = torch.arange(len(ids))
    return (ids[:, None] != ids[None, :]) | op(rows[None, :], rows[:, None])


def allow_mask(cu):
    return ~mask_by_ids(cu)


def no_causal(cu):
    ids = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    return ids[:, None] != ids[None, :]


def no_blocks(cu):
    N = int(cu[-1])
    return torch.ones(N, N, dtype=torch.bool).triu(1)


def strict(cu):
    ids = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    return _mask(ids, torch.ge)


def past_hidden(cu):
    ids = torch.repeat_interleave(torch.arange(len(cu) - 1), cu[1:] - cu[:-1])
    return _mask(ids, torch.lt)


def boundary_shift(cu):
    return _mask(_ids_shifted(cu), torch.gt)


def float_mask(cu):
    return mask_by_ids(cu).float()


def padded_shape(cu):
    L = int((cu[1:] - cu[:-1]).max())
    return torch.zeros(len(cu) - 1, L, L, dtype=torch.bool)


# ---------------------------------------------------------------------------------------------------------
# check_gather


def gather_transpose(pool, table, length):
    return pool[torch.tensor(table)].transpose(0, 1).flatten(1, 2)[:, :length]


def gather_per_token(pool, table, length):
    b = pool.shape[2]
    return torch.stack([pool[table[t // b], :, t % b] for t in range(length)], dim=1)


def gather_sorted(pool, table, length):
    return gather_transpose(pool, sorted(table), length)


def gather_first(pool, table, length):
    return gather_transpose(pool, list(range(len(table))), length)


def gather_no_transpose(pool, table, length):
    h, d = pool.shape[1], pool.shape[3]
    return pool[torch.tensor(table)].reshape(h, -1, d)[:, :length]


def gather_uncut(pool, table, length):
    return pool[torch.tensor(table)].transpose(0, 1).flatten(1, 2)


def gather_off_by_one(pool, table, length):
    return gather_transpose(pool, table, length + 1)[:, 1:]


# ---------------------------------------------------------------------------------------------------------
# check_plan_step


def plan_loop(running, budget):
    out, left = [], budget
    for rid, remaining in running:
        if remaining == 0 and left > 0:
            out.append((rid, 1))
            left -= 1
    for rid, remaining in running:
        if remaining > 0 and left > 0:
            n = min(remaining, left)
            out.append((rid, n))
            left -= n
    return out


def plan_sorted(running, budget):
    order = sorted(running, key=lambda r: r[1] != 0)  # stable: decodes first, each group in its order
    out = []
    for rid, remaining in order:
        n = min(max(remaining, 1), budget - sum(n for _, n in out))
        if n > 0:
            out.append((rid, n))
    return out


def prefill_first(running, budget):
    return ch12._plan(running, budget, decodes="last")


def no_budget(running, budget):
    return [(rid, max(remaining, 1)) for rid, remaining in
            sorted(running, key=lambda r: r[1] != 0)]


def whole_prompts(running, budget):
    return ch12._plan(running, budget, chunks=False)


def with_zeros(running, budget):
    return ch12._plan(running, budget, zeros=True)


CATALOGUES = [
    Catalogue(ch12.check_block_mask, {"sequence ids": mask_by_ids, "blocks by hand": mask_by_blocks}, [
        Mutant("stub", stub, "NotImplementedError"),
        Mutant("allow mask", allow_mask, "SWAPPED"),
        Mutant("not causal", no_causal, "NOT CAUSAL"),
        Mutant("no blocks", no_blocks, "NO BLOCKS"),
        Mutant("diagonal hidden", strict, "DIAGONAL"),
        Mutant("past hidden", past_hidden, "hides the PAST"),
        Mutant("boundary shifted", boundary_shift, "BOUNDARY"),
        Mutant("float mask", float_mask, "expected bool"),
        Mutant("padded shape", padded_shape, r"has shape \(\d+, \d+, \d+\), expected \(\d+, \d+\)"),
    ]),
    Catalogue(ch12.check_gather, {"transpose and flatten": gather_transpose, "token by token": gather_per_token}, [
        Mutant("stub", stub, "NotImplementedError"),
        Mutant("pool order", gather_sorted, "POOL ORDER"),
        Mutant("table ignored", gather_first, "TABLE IS IGNORED"),
        Mutant("heads mixed", gather_no_transpose, "MIXES HEADS"),
        Mutant("not cut", gather_uncut, "NOT CUT"),
        Mutant("off by one", gather_off_by_one, "SHIFTED by one"),
    ]),
    Catalogue(ch12.check_plan_step, {"two loops": plan_loop, "sorted": plan_sorted}, [
        Mutant("stub", stub, "NotImplementedError"),
        Mutant("prefill first", prefill_first, "PREFILL chunks FIRST"),
        Mutant("budget ignored", no_budget, "IGNORES THE BUDGET"),
        Mutant("whole prompts only", whole_prompts, "NO CHUNKS"),
        Mutant("zero entries", with_zeros, "ZERO tokens"),
    ]),
]
