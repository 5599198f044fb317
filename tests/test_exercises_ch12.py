"""The exercise checkers of chapter 12: their private references are the package's (the block-diagonal mask, the
gather through a block table, the scheduler's plan, its choice of victims, the prefix cache's block keys), right answers
pass, and the stub is named. Every mutant of tests/mutants/ch12.py is run by tests/test_mutation.py."""
import functools
import hashlib
import random

import pytest
import torch

from attention_course.exercises import ExerciseError, ch12
from attention_course.serving import PagedKVCache, Request, Scheduler, block_diagonal_mask, gather_blocks

from attention_course.serving import block_hash, block_keys, choose_victims


def test_block_reference_is_the_package_mask():
    for case in ch12.BLOCK_MASK.cases:
        assert torch.equal(ch12._block(*case.args), block_diagonal_mask(*case.args))


def test_gather_reference_is_the_package_gather():
    for case in ch12.GATHER.cases:
        assert torch.equal(ch12._gather(*case.args), gather_blocks(*case.args))


def test_plan_reference_is_the_scheduler_plan():
    """The scheduler plans decode tokens first, then prompt chunks cut to the budget: the checker's rule."""
    cache = PagedKVCache(num_blocks=20, block_size=4, num_kv_heads=1, head_dim=2)
    scheduler = Scheduler(cache, max_batch_tokens=8, chunk=8)
    for rid, prompt in (("a", [1] * 5), ("b", [2]), ("c", [3] * 4)):
        scheduler.submit(Request(rid, prompt, 3))
    scheduler.update(batch := scheduler.schedule(), torch.zeros(len(batch.tokens), 4))  # a: 5, b: 1, c: 2 of 4
    running = [(r.rid, len(r.prompt) - r.fed) for r in scheduler.running]
    planned = scheduler.schedule()
    sizes = [(rid, int(planned.cu[i + 1] - planned.cu[i])) for i, rid in enumerate(planned.requests)]
    assert sizes == ch12._plan(running, 8)


def _outcome(fn, *args):
    """What a call gives: its value, or its exception's type (the messages are each one's own)."""
    try:
        return fn(*args)
    except Exception as err:  # noqa: BLE001 - the type is compared
        return type(err)


def _random_victims(rng):
    running = [(rng.choice("abcdefgh") + str(i), rng.randint(0, 4)) for i in range(rng.randint(1, 6))]
    return running, rng.choice(running)[0], rng.randint(0, 4), rng.randint(0, 9)


def test_victims_reference_is_the_schedulers_choice():
    """The checker's rule is the scheduler's, on the checker's cases (its ValueErrors too) and on 500 drawn ones."""
    rng = random.Random(0)
    for args in [c.args for c in ch12.CHOOSE_VICTIMS.cases] + [_random_victims(rng) for _ in range(500)]:
        assert _outcome(ch12._victims, *args) == _outcome(choose_victims, *args), args


def test_keys_reference_is_the_prefix_caches():
    """The checker's block_hash and chain are the prefix cache's: on the checker's cases and on drawn tokens (ids past
    one byte, negative ones, none), with parents None, a digest and ones it refuses (b"", a list), errors alike."""
    rng = random.Random(0)
    for tokens, b in [c.args for c in ch12.BLOCK_KEYS.cases] + [
            ([rng.randint(-2 ** 40, 2 ** 40) for _ in range(rng.randint(0, 30))], rng.randint(1, 6)) for _ in range(200)]:
        assert ch12._keys(tokens, b) == block_keys(tokens, b), (tokens, b)
        for parent in (None, hashlib.sha256(repr(tokens).encode()).digest(), b"", tokens[:2]):
            for piece in (tokens, tokens[:b]):
                assert _outcome(ch12._hash, parent, piece) == _outcome(block_hash, parent, piece), (parent, piece)


def test_calling_the_packages_block_keys_is_refused():
    with pytest.raises(ExerciseError, match="WITHOUT the ready-made function"):
        ch12.check_block_keys(lambda tokens, block_size: block_keys(tokens, block_size))


def test_the_hash_is_the_plans():
    """sha256 of the parent's digest (b"" for none), then each token id as 8 little-endian signed bytes."""
    assert ch12._hash(None, [1, -1]) == hashlib.sha256(b"\x01" + b"\x00" * 7 + b"\xff" * 8).digest()
    assert ch12._hash(b"p" * 32, [2]) == hashlib.sha256(b"p" * 32 + b"\x02" + b"\x00" * 7).digest()
    first = ch12._hash(None, [5, 1])
    assert ch12._keys([5, 1, 7, 2, 9], 2) == [first, ch12._hash(first, [7, 2])]  # the 9: a partial block, no key


@pytest.mark.parametrize("checker", [ch12.check_block_mask, ch12.check_gather, ch12.check_plan_step,
                                     ch12.check_choose_victims, ch12.check_block_keys])
def test_the_stub_is_named(checker):
    def stub(*args):
        raise NotImplementedError()
    with pytest.raises(ExerciseError, match="stub"):
        checker(stub)


def test_a_wrong_type_is_named():
    with pytest.raises(ExerciseError, match="is None: nothing returned"):
        ch12.check_plan_step(lambda running, budget: None)
    with pytest.raises(ExerciseError, match="is a list, expected a torch.Tensor"):
        ch12.check_gather(lambda pool, table, length: table)


def test_a_gather_outside_the_catalogue_is_told_which_slots_it_read():
    """A gather that reads the wrong slots, in no way the catalogue names, is told token by token which block and slot
    of the pool it read, next to those the table gives; a token no slot holds (heads from different slots) is said."""
    def block_from_heads(pool, table, length):  # b read as the heads' number (1 here), clamped inside the table
        return torch.stack([pool[table[min(t // pool.shape[1], len(table) - 1)], :, t % pool.shape[2]]
                            for t in range(length)], 1)
    with pytest.raises(ExerciseError) as err:
        ch12.check_gather(block_from_heads)
    assert ("Its token 1 is the pool's block 3, slot 1, where the table says block table[1 // 2] = 4, slot 1 % 2 = 1; "
            "token 2 is the pool's block 0, slot 0") in str(err.value), str(err.value)
    with pytest.raises(ExerciseError, match="Its token 0 is no slot of the pool"):
        ch12.check_gather(lambda pool, table, length: ch12._gather(pool, table, length).flip(0).flip(-1))


def test_a_block_mask_outside_the_catalogue_is_told_its_first_wrong_pair_in_sequences():
    """A wrong mask in no way the catalogue names is told its first wrong pair as sequences and their tokens (a key of
    another sequence seen, a key of its own hidden), and a size that misses N by how much."""
    def positions_only(cu):  # causal on each row's place inside its sequence, no test of the sequence
        rows = torch.arange(int(cu[-1]))
        pos = rows - cu[torch.searchsorted(cu, rows, right=True) - 1]
        return pos[None, :] > pos[:, None]
    with pytest.raises(ExerciseError, match=r"Its row 0 \(sequence 0, its token 0\) sees key 2 \(sequence 1, its token "
                                            r"0\), another sequence's\."):
        ch12.check_block_mask(positions_only)
    with pytest.raises(ExerciseError, match=r"It is 3 by 3: 1 row short of N = cu_seqlens\[-1\] = 4\."):
        ch12.check_block_mask(lambda cu: ch12._block(cu)[1:, 1:])


def test_a_plan_outside_the_catalogue_is_told_what_it_did_in_the_steps_terms():
    """A plan that names requests by their index, and one that stops at the first prompt that does not fit whole, are
    told so in the step's terms."""
    def by_index(running, budget):
        return [(i, 1) for i, (_, n) in enumerate(running) if n == 0][:budget]
    with pytest.raises(ExerciseError, match="It names a request 0, which is no rid of `running`"):
        ch12.check_plan_step(by_index)

    def whole_or_stop(running, budget):
        plan, left = [(rid, 1) for rid, n in running if n == 0][:budget], budget
        left -= len(plan)
        for rid, n in running:
            if n and n > left:
                break
            if n:
                plan, left = plan + [(rid, n)], left - n
        return plan
    with pytest.raises(ExerciseError, match=r"It gives prompt 'p' nothing with 5 of the budget left: a prompt that does "
                                            r"not fit whole gets a chunk"):
        ch12.check_plan_step(whole_or_stop)


def test_a_plan_is_told_the_first_share_it_gives_otherwise_than_the_rule():
    """A chunk one token short of min(remaining, budget left): the request, its share and the rule's, in numbers."""
    def one_short(running, budget):
        plan = [(rid, 1) for rid, n in running if n == 0][:budget]
        left = budget - len(plan)
        for rid, n in running:
            share = min(n, left) - (n > left)
            if n and share > 0:
                plan, left = plan + [(rid, share)], left - share
        return plan
    with pytest.raises(ExerciseError, match=r"It gives 'p' 4 tokens, where the rule gives it min\(remaining 10, budget "
                                            r"left 5\) = 5\."):
        ch12.check_plan_step(one_short)


def plan(running, budget, cap=None, decodes_off=True, first_only=False):
    """A plan by the rule, but for one slip: chunks capped, the decodes' tokens not taken off, one prompt alone."""
    out = [(rid, 1) for rid, n in running if n == 0][:budget]
    left = budget - len(out) if decodes_off else budget
    for rid, n in [(rid, n) for rid, n in running if n][:1 if first_only else None]:
        share = min(n, left, cap or n)
        out, left = (out + [(rid, share)], left - share) if share > 0 else (out, left)
    return out


@pytest.mark.parametrize("answer, words", [
    # a cap written in (the chapter's chunk of 8): a case with a prompt and a budget left above 8 shows it
    (functools.partial(plan, cap=8), r"It gives 'p' 8 tokens, where the rule gives it min\(remaining 100, budget left "
                                     r"63\) = 63\."),
    (functools.partial(plan, decodes_off=False),
     r"its 6 is min\(remaining 10, the budget 6\): the decodes' tokens not taken off first\."),
    # a prompt that fits whole left out: not told that it needs a chunk
    (functools.partial(plan, first_only=True),
     r"It gives prompt 'c' nothing with 15 of the budget left: its 5 tokens fit: every prompt is served in turn"),
])
def test_a_plan_is_told_its_share_in_the_rules_numbers(answer, words):
    with pytest.raises(ExerciseError, match=words):
        ch12.check_plan_step(answer)


def test_a_mask_written_in_is_told_it_is_the_same_whatever_the_input():
    fixed = ch12._block(torch.tensor([0, 3, 4, 8]))  # the chapter's lengths 3, 1, 4
    with pytest.raises(ExerciseError, match=r"it returns the same result on all \d+ cases it gets wrong, whatever their "
                                            r"inputs"):
        ch12.check_block_mask(lambda cu: fixed.clone())


def test_a_choice_outside_the_catalogue_is_told_its_first_victim_against_the_rule():
    """A choice that passes over a request holding no block (it frees nothing) is told the victim it took where the
    rule takes another; one that stops a request short of the need is told the blocks it leaves and who is next."""
    def skips_empty(running, asking, available, need):
        if asking not in dict(running) or min([available, need, *dict(running).values()]) < 0:
            raise ValueError("no")
        out = []
        for rid, blocks in reversed(running):
            if available >= need:
                break
            if blocks or rid == asking:
                out.append(rid)
            if rid == asking:
                break
            available += blocks
        return out
    with pytest.raises(ExerciseError, match=r"It preempts 'a' where the rule preempts 'b', the most recently admitted "
                                            r"still running\."):
        ch12.check_choose_victims(skips_empty)

    def stops_short(running, asking, available, need):
        return ch12._victims(running, asking, available, need - 1)
    with pytest.raises(ExerciseError, match=r"It stops with \d+ blocks? available for a need of \d+: not enough; the "
                                            r"next to preempt is"):
        ch12.check_choose_victims(stops_short)


def test_a_chain_outside_the_catalogue_is_told_its_first_wrong_key_as_a_call():
    """Keys are digests: a wrong one is found again as block_hash of a parent and a slice of the tokens, beside the
    chain's call; a key of no such call is said; the count of keys against the full blocks; digests shown short."""
    def first_parent(tokens, b):  # every block's parent is the first block's key
        keys = []
        for s in range(0, len(tokens) // b * b, b):
            keys.append(ch12._hash(keys[0] if keys else None, tokens[s:s + b]))
        return keys
    with pytest.raises(ExerciseError) as err:
        ch12.check_block_keys(first_parent)
    assert "Its key 2 is block_hash(key 0, tokens[2:3]), where the chain gives block_hash(key 1, tokens[2:3])." in \
        str(err.value), str(err.value)
    assert "<digest " in str(err.value) and "\\x" not in str(err.value)

    def of_text(tokens, b):
        return [hashlib.sha256(str(tokens[:e]).encode()).digest() for e in range(b, len(tokens) + 1, b)]
    with pytest.raises(ExerciseError, match="Its key 0 is no block_hash of None or a key of the chain"):
        ch12.check_block_keys(of_text)

    def alone_and_partial(tokens, b):
        return [ch12._hash(None, tokens[s:s + b]) for s in range(0, len(tokens), b)]
    with pytest.raises(ExerciseError, match=r"It returns 1 key, where 3 tokens in blocks of 4 make 0 full blocks and a "
                                            r"partial one of 3 tokens, which has no key\."):
        ch12.check_block_keys(alone_and_partial)


def test_an_exception_from_a_misread_argument_is_told_its_likeliest_cause():
    """A ValueError on an allowed call (asking looked for among the pairs); block_hash's refusals: a slice of tokens
    passed as the parent (ValueError), a list of a tensor's items as the tokens (TypeError)."""
    def among_pairs(running, asking, available, need):
        if asking not in running:
            raise ValueError("not running")
        return ch12._victims(running, asking, available, need)
    with pytest.raises(ExerciseError, match=r"compared with the pairs of `running`, not with their rids"):
        ch12.check_choose_victims(among_pairs)

    def tokens_as_parent(tokens, b):
        return [ch12._hash(tokens[s - b:s] if s else None, tokens[s:s + b]) for s in range(0, len(tokens) - b + 1, b)]
    with pytest.raises(ExerciseError, match="the parent is the previous block's KEY"):
        ch12.check_block_keys(tokens_as_parent)

    def items_of_a_tensor(tokens, b):
        keys, x = [], torch.tensor(tokens, dtype=torch.long)
        for s in range(0, len(tokens) - b + 1, b):
            keys.append(ch12._hash(keys[-1] if keys else None, list(x[s:s + b])))
        return keys
    with pytest.raises(ExerciseError, match=r"a list of a tensor's items \(take \.tolist\(\)\)"):
        ch12.check_block_keys(items_of_a_tensor)
