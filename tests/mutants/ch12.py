"""Chapter 12's checkers under mutation: the block-diagonal mask from cu_seqlens, gathering a request's keys through
its block table, planning one step of continuous batching, choosing whom to preempt and a prefix cache's block keys."""
import itertools

import torch

from attention_course.exercises import ch12
from mutants import Catalogue, Mutant

from attention_course.serving import block_hash  # what a learner's cell calls


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


# ---------------------------------------------------------------------------------------------------------
# check_choose_victims


def _validate(running, asking, available, need):
    if asking not in [rid for rid, _ in running]:
        raise ValueError(f"{asking!r} is not running")
    if available < 0 or need < 0 or any(blocks < 0 for _, blocks in running):
        raise ValueError("negative count")


def victims_loop(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    for rid, blocks in reversed(running):
        if available >= need:
            break
        victims.append(rid)
        if rid == asking:
            break
        available += blocks
    return victims


def victims_available_forgotten(running, asking, available, need):
    """Looks at available once, then counts the freed blocks from 0."""
    _validate(running, asking, available, need)
    if available >= need:
        return []
    victims, freed = [], 0
    for rid, blocks in reversed(running):
        if freed >= need:
            break
        victims.append(rid)
        if rid == asking:
            break
        freed += blocks
    return victims


def victims_pop_a_copy(running, asking, available, need):
    """vLLM's style: pop the tail of a copy of the running list."""
    _validate(running, asking, available, need)
    left, victims = list(running), []
    while available < need:
        rid, blocks = left.pop()
        victims.append(rid)
        if rid == asking:
            break
        available += blocks
    return victims


def victims_by_index(running, asking, available, need):
    _validate(running, asking, available, need)
    i, victims = len(running) - 1, []
    while available < need and not (victims and victims[-1] == asking):
        victims.append(running[i][0])
        available += running[i][1]
        i -= 1
    return victims


def victims_oldest_first(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    for rid, blocks in running:
        if available >= need:
            break
        victims.append(rid)
        if rid == asking:
            break
        available += blocks
    return victims


def victims_never_self(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    for rid, blocks in reversed(running):
        if available >= need:
            break
        if rid != asking:
            victims.append(rid)
            available += blocks
    return victims


def victims_no_stop(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    for rid, blocks in reversed(running):
        if available >= need:
            break
        victims.append(rid)
        available += blocks
    return victims


def victims_strict(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    for rid, blocks in reversed(running):
        if available > need:
            break
        victims.append(rid)
        if rid == asking:
            break
        available += blocks
    return victims


def victims_unchecked(running, asking, available, need):
    victims = []
    for rid, blocks in reversed(running):
        if available >= need:
            break
        victims.append(rid)
        if rid == asking:
            break
        available += blocks
    return victims


def victims_popping(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    while available < need:
        rid, blocks = running.pop()
        victims.append(rid)
        if rid == asking:
            break
        available += blocks
    return victims


def victims_not_freed(running, asking, available, need):
    _validate(running, asking, available, need)
    victims = []
    for rid, _ in reversed(running):
        if available >= need:
            break
        victims.append(rid)
        if rid == asking:
            break
    return victims


# ---------------------------------------------------------------------------------------------------------
# check_block_keys


def keys_loop(tokens, block_size):
    keys, parent = [], None
    for start in range(0, len(tokens) - block_size + 1, block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


def keys_accumulate(tokens, block_size):
    blocks = [tokens[i * block_size:(i + 1) * block_size] for i in range(len(tokens) // block_size)]
    return list(itertools.accumulate(blocks[1:], block_hash, initial=block_hash(None, blocks[0]))) if blocks else []


def keys_while(tokens, block_size):
    keys = []
    while len(tokens) >= block_size:
        keys.append(block_hash(keys[-1] if keys else None, tokens[:block_size]))
        tokens = tokens[block_size:]
    return keys


def keys_alone(tokens, block_size):
    return [block_hash(None, tokens[s:s + block_size]) for s in range(0, len(tokens) - block_size + 1, block_size)]


def keys_partial(tokens, block_size):
    keys, parent = [], None
    for start in range(0, len(tokens), block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


def keys_prefix(tokens, block_size):
    return [block_hash(None, tokens[:end]) for end in range(block_size, len(tokens) + 1, block_size)]


def keys_windows(tokens, block_size):
    keys, parent = [], None
    for start in range(len(tokens) - block_size + 1):
        parent = block_hash(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


def keys_short_range(tokens, block_size):
    keys, parent = [], None
    for start in range(0, len(tokens) - block_size, block_size):
        parent = block_hash(parent, tokens[start:start + block_size])
        keys.append(parent)
    return keys


def keys_last_only(tokens, block_size):
    return keys_loop(tokens, block_size)[-1] if len(tokens) >= block_size else None


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
    ]),    Catalogue(ch12.check_choose_victims, {"loop from the end": victims_loop, "pop a copy": victims_pop_a_copy,
                                          "index": victims_by_index}, [
        Mutant("stub", stub, "NotImplementedError"),
        Mutant("oldest first", victims_oldest_first, "OLDEST first"),
        Mutant("never itself", victims_never_self, "never preempts the ASKING"),
        Mutant("no stop at itself", victims_no_stop, "PAST THE ASKING"),
        Mutant("strict", victims_strict, "equal is ENOUGH"),
        Mutant("unchecked", victims_unchecked, ("raise", "ValueError")),
        Mutant("pops running", victims_popping, ("POPS", "running")),
        Mutant("freed not counted", victims_not_freed, "FREES"),
        Mutant("available forgotten", victims_available_forgotten, "looks at `available` once"),
    ]),
    Catalogue(ch12.check_block_keys, {"loop": keys_loop, "accumulate": keys_accumulate, "while": keys_while}, [
        Mutant("stub", stub, "NotImplementedError"),
        Mutant("unchained", keys_alone, "each block ALONE"),
        Mutant("partial block", keys_partial, "PARTIAL"),
        Mutant("prefix whole", keys_prefix, "WHOLE PREFIX"),
        Mutant("windows", keys_windows, "EVERY POSITION"),
        Mutant("last full block dropped", keys_short_range, "LAST FULL BLOCK"),
        Mutant("last key only", keys_last_only, "LAST KEY"),
    ]),
]
