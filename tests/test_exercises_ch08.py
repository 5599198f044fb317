"""The exercise checker of chapter 8: merging two online-softmax states accepts a right merge, names each mistake of
its catalogue and describes the others by what they did."""
import re

import pytest
import torch

from attention_course.exercises import ExerciseError
from attention_course.exercises.ch08 import _reference_merge, check_merge_partials, partial_state


def unscaled(m1, l1, acc1, m2, l2, acc2):  # adds sums taken under different maxima
    return torch.maximum(m1, m2), l1 + l2, acc1 + acc2


def nan_on_empty(m1, l1, acc1, m2, l2, acc2):  # exp(-inf - -inf) where both are -inf, or m1 - m with m = -inf
    m = torch.maximum(m1, m2)
    c1, c2 = torch.exp(m1 - m), torch.exp(m2 - m)
    return m, c1 * l1 + c2 * l2, c1 * acc1 + c2 * acc2


def wrong_max(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = _reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m1, l, acc


def scaled_both(m1, l1, acc1, m2, l2, acc2):  # acc / l right, but l and acc on another reference
    m, l, acc = _reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m, 2 * l, 2 * acc


def swapped(m1, l1, acc1, m2, l2, acc2):
    m, l, acc = _reference_merge(m1, l1, acc1, m2, l2, acc2)
    return m, l, acc.flip(-1)


def stub(*args):
    raise NotImplementedError()


def test_a_right_merge_passes(capsys):
    check_merge_partials(_reference_merge)
    assert capsys.readouterr().out.startswith("Correct")


@pytest.mark.parametrize(
    "fn, words",
    [
        (unscaled, "Rescale each one to the common maximum"),
        (nan_on_empty, "exp(-inf - -inf)"),
        (wrong_max, "m has -inf at 1 of 4 entries where the right answer is finite"),
        (scaled_both, "l is 2 times the right one"),
        (swapped, "acc differs at"),
        (stub, "still the exercise's stub"),
        (lambda *args: args[0], "expected a tuple of 3, (m, l, acc)"),
    ],
)
def test_each_mistake_is_named(fn, words):
    with pytest.raises(ExerciseError) as info:
        check_merge_partials(fn)
    assert words in str(info.value)


def test_partial_state_of_an_empty_block():
    m, l, acc = partial_state(torch.full((2, 3), float("-inf")), torch.ones(3, 4))
    assert (m == float("-inf")).all() and (l == 0).all() and (acc == 0).all()


def test_a_merge_outside_the_catalogue_has_its_acc_said_as_factors_of_acc1_and_acc2():
    """A wrong merge in no way the catalogue names has its acc said, for its first wrong query with keys in both
    blocks, as a acc1 + b acc2 with a and b named (block 2 rescaled to m1 here), next to the right factors."""
    def to_m1(m1, l1, a1, m2, l2, a2):
        m, s1 = torch.maximum(m1, m2), m1.masked_fill(m1 == float("-inf"), 0.0)
        return m, l1 + torch.exp(m2 - s1) * l2, a1 + torch.exp(m2 - s1) * a2
    with pytest.raises(ExerciseError, match=re.escape("its acc is (1) acc1 + (exp(m - m1) = exp(m2 - m1) = 95.85) acc2, "
                                                      "where the right one is (exp(m1 - m) = 0.01043) acc1 + (exp(m2 - "
                                                      "m) = 1) acc2")):
        check_merge_partials(to_m1)
