"""The diagnosis mechanism on a toy exercise: a mistake is named only when the answer agrees with it on every case;
anything else is described by what it did (the pattern of its differences, its dtype, its shape, the inputs it
changed, the exception it raised and on which case)."""
import math

import pytest
import torch
from hypothesis import example, given, settings, strategies as st

from attention_course.exercises import ExerciseError
from attention_course.exercises.diagnose import Case, Exercise, Mistake, Outcome, check, describe, only_where


def scaled(x, n):
    """The toy exercise: x / sqrt(n), shape and dtype of x."""
    return x / n ** 0.5


def cases():
    gen = torch.Generator().manual_seed(0)
    return [Case(f"x of shape {s}, n = {n}", (torch.randn(*s, generator=gen, dtype=torch.float64), n))
            for s, n in (((3, 3), 4), ((2, 5, 5), 9), ((4,), 16))]


SQRT = Mistake("no root", "divides by n, not its square root.", lambda x, n: x / n)
TOY = Exercise(what="your scaled", reference=scaled, cases=cases(),
               mistakes=[SQRT, Mistake("none", "does not divide at all.", lambda x, n: x.clone())],
               passed="divided by the root.")


def message(answer, exercise=TOY) -> str:
    with pytest.raises(ExerciseError) as err:
        check(exercise, answer)
    return str(err.value)


def test_the_reference_passes_and_a_mistake_is_named(capsys):
    check(TOY, scaled)
    assert capsys.readouterr().out.startswith("Correct: divided")
    assert message(lambda x, n: x / n).endswith(SQRT.says)


def test_a_mistake_is_not_named_when_the_answer_differs_from_it_on_one_case():
    """Right on the vectors, the mistake elsewhere: not the mistake, which also divides the vectors by n."""
    text = message(lambda x, n: x / n if x.ndim > 1 else x / n ** 0.5)
    assert SQRT.says not in text and "0.5 times the right one at every entry" in text


def test_the_smallest_case_that_shows_it_is_shown():
    assert message(lambda x, n: x / n).startswith("x of shape (4,), n = 16:")  # 4 entries before 9 and 50
    assert message(lambda x, n: x / n if x.ndim > 1 else x / n ** 0.5).startswith("x of shape (3, 3), n = 4:")


@pytest.mark.parametrize("answer, words", [
    (lambda x, n: scaled(x, n).float(), "holds the right values in float32, expected float64"),
    (lambda x, n: scaled(x, n) + 0.25, "plus the same 0.25 at every entry"),
    (lambda x, n: scaled(x, n) * 3 ** 0.5, r"1.732 times the right one at every entry (√3)"),
    (lambda x, n: scaled(x, n).mT if x.ndim > 1 else scaled(x, n), "transpose of the right one"),
    (lambda x, n: scaled(x, n).flip(0), "along axis 0 in another order"),
    (lambda x, n: scaled(x, n)[None], "an axis of size 1 too many"),
    (lambda x, n: scaled(x, n).sum(), "one number, a reduction over every axis"),
    (lambda x, n: scaled(x, n).expand(2, *x.shape), "the expected axes and more, of size 2"),
    (lambda x, n: scaled(x, n)[0] if x.ndim > 1 else scaled(x, n), "an axis of size"),
    (lambda x, n: scaled(x, n).sort(-1) if x.ndim == 1 else scaled(x, n).max(-1, keepdim=True),
     "a pair of tensors (values, indices)"),
    (lambda x, n: scaled(x, n).argsort(), "integers where values are expected"),
    (lambda x, n: scaled(x, n).clone().fill_(-torch.inf), "has -inf at"),
    (lambda x, n: scaled(x, n).float().double(), "FLOAT32 PRECISION"),
    (lambda x, n: scaled(x, n).mT.contiguous().view(x.shape[::-1]) if x.ndim == 3 else scaled(x, n),
     "another order"),
    (lambda x, n: None, "is None: nothing returned"),
    (lambda x, n: x.div_(n ** 0.5), "modified its input `x` in place"),
    (lambda x, n: scaled(x, n).masked_fill(torch.eye(x.shape[-1], dtype=torch.bool), 0.0) if x.ndim > 1
     else scaled(x, n), "on the diagonal"),
    (lambda x, n: scaled(x, n).clone().index_fill_(-2, torch.tensor([0]), 1.0) if x.ndim == 2 else scaled(x, n),
     "whole rows [0]"),
    (lambda x, n: scaled(x, n).masked_fill(x > 1e9, float("nan")) + float("nan") * (x.ndim == 1), "has NaN at 4"),
    (lambda x, n: scaled(x, n) + torch.arange(x.shape[-1]) * (x.ndim > 1),
     "is the right one plus the same vector [0, 1, 2] at every position (along the last axis, of size 3): a bias"),
    (lambda x, n: scaled(x, n).index_fill(0, torch.tensor([1]), 0.0) if x.ndim == 3 else scaled(x, n),
     "all of them at index 1 of axis 0"),
    (lambda x, n: torch.ones(3, 3, dtype=torch.float64),
     "it returns the same result on all 3 cases it gets wrong, whatever their inputs: is that result written in"),
    (lambda x, n: scaled(x, n) * n, "16 times the right one at every entry, 16 (n = 16)"),
    (lambda x, n: scaled(x, n).view(2, 2) if x.ndim == 1 else scaled(x, n),
     "axis 0 of the right one (4) cut in two, 2 by 2: a torch.stack where a torch.cat belongs"),
    (lambda x, n: scaled(x, n)[..., :-1], "It holds the right one's first 3 along axis 0, not its last 1."),
    (lambda x, n: scaled(x, n)[..., 2:], "It holds the right one's last 2 along axis 0, not its first 2."),
    (lambda x, n: torch.cat([scaled(x, n), x[..., :1]], -1), "It holds the right one along axis 0, and 1 more after it."),
])
def test_what_is_not_in_the_catalogue_is_described_by_what_it_did(answer, words):
    text = message(answer)
    assert words in text, text
    assert not any(m.says in text for m in TOY.mistakes)


def test_an_exception_is_reported_with_its_case_and_a_cause():
    text = message(lambda x, n: x / n ** 0.5 if x.ndim < 3 else [1, 2][n])
    assert text.startswith("x of shape (2, 5, 5), n = 9: your scaled raised IndexError: list index out of range")
    assert "An index past the end of a Python list" in text


def test_an_exercises_own_hint_comes_before_the_generic_one():
    """The exercise knows its shapes: its cause of a broadcast error replaces torch's generic hint."""
    ex = Exercise(what="your scaled", reference=scaled, cases=cases(), mistakes=[], passed="ok",
                  hints=((r"must match the size", "n is one number: divide by its root, not by a tensor."),))
    text = message(lambda x, n: x / torch.ones(7), ex)
    assert "Likeliest cause here: n is one number" in text and "broadcasting cannot line up" not in text
    assert "broadcasting cannot line up" in message(lambda x, n: x / torch.ones(7))


def test_a_tuple_is_shown_where_its_first_differing_item_can_show_a_pattern():
    """One entry is an offset and a factor at once: the case shown and the kinds compared are those where the item
    that differs has 4 entries or more, as for a tensor result."""
    one = Case("x of shape (1,), n = 4", (torch.ones(1, dtype=torch.float64), 4))
    ex = Exercise(what="your pair", reference=lambda x, n: (x.sum(), scaled(x, n)), cases=[one, *cases()], mistakes=[],
                  passed="ok", parts=("total", "scaled"))
    text = message(lambda x, n: (x.sum(), 2 * scaled(x, n)), ex)
    assert text.startswith("x of shape (4,), n = 16: your pair's scaled is 2 times the right one"), text


def test_float32_rounding_is_judged_entry_by_entry():
    """A gap of 1 on entries of size 1 is no rounding, even beside an entry of 1e30."""
    x = torch.tensor([1e30, 1.1, -2.3, 0.7, 3.3], dtype=torch.float64)
    ex = Exercise(what="your copy", reference=lambda x: x.clone(), cases=[Case("x", (x,))], mistakes=[], passed="ok")
    assert "FLOAT32" not in message(lambda x: x + (x.abs() < 1e29), ex)
    assert "FLOAT32 PRECISION" in message(lambda x: torch.where(x.abs() < 1e29, x.float().double(), x), ex)
    eps = message(lambda x: torch.where(x.abs() < 1e29, x / (1 + 1e-9), x), ex)  # one factor: a constant, no rounding
    assert "FLOAT32" not in eps and "a small constant added where it divides (an epsilon in a sum, +1e-09?)" in eps
    assert "FLOAT32" not in message(lambda x: x.masked_fill(x > 1e29, 0.0), Exercise(
        what="your copy", reference=lambda x: x.masked_fill(x > 1e29, -torch.inf), cases=[Case("x", (x,))],
        mistakes=[], passed="ok"))  # 0 where -inf is expected: no rounding


def test_a_strong_pattern_is_claimed_only_where_every_wrong_case_shows_it():
    """A factor on one case, other numbers elsewhere: the entries that differ, not a factor."""
    text = message(lambda x, n: x * 2 if x.ndim == 1 else x + torch.linspace(0, 1, x.numel()).view(x.shape))
    assert "times the right one" not in text and "differs at" in text


def test_a_stub_is_named_as_the_stub():
    def stub(x, n):
        raise NotImplementedError()
    assert "still the exercise's stub" in message(stub)


def test_lists_are_described_by_their_items():
    ex = Exercise(what="your order", reference=lambda xs: sorted(xs), cases=[Case("xs = [3, 1, 2]", ([3, 1, 2],))],
                  mistakes=[], passed="ok")
    assert "the right items in another order" in message(lambda xs: sorted(xs, reverse=True), ex)
    assert "leaves out [3]" in message(lambda xs: sorted(xs)[:2], ex)
    assert "has [4] too many" in message(lambda xs: sorted(xs) + [4], ex)
    assert "modified its input `xs` in place" in message(lambda xs: xs.sort() or list(xs), ex)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 6), st.integers(2, 6), st.floats(-5, 5).filter(lambda c: abs(c) > 1e-3), st.integers(0, 2 ** 16))
@example(2, 5, 2.0, 339)  # a right value of 6.8e-07, too small for a ratio: the factor still holds there
def test_an_offset_or_a_factor_is_found_whatever_the_tensor(rows, cols, c, seed):
    want = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    cases = [Case("c", ())]
    offset = describe(TOY, cases, [Outcome(want + c)], [Outcome(want)], [0])
    assert f"plus the same {c:.4g}" in offset
    if abs(c - 1) > 1e-3:
        assert f"{c:.4g} times the right one" in describe(TOY, cases, [Outcome(want * c)], [Outcome(want)], [0])


def test_an_answer_that_returns_where_the_statement_asks_for_an_exception_is_told_so():
    """The reference raises (a size the statement refuses): returning there is said so, with the shapes returned."""
    def halves(x):
        if len(x) % 2:
            raise ValueError("the length must be even")
        return x[: len(x) // 2], x[len(x) // 2:]

    ex = Exercise(what="your halves", reference=halves, cases=[Case(f"length {n}", (torch.arange(n * 1.0),))
                                                                  for n in (4, 3)], mistakes=[], passed="ok")
    text = message(lambda x: (x[: len(x) // 2], x[len(x) // 2:]), ex)
    assert text == ("length 3: your halves returned (a tensor of shape (1,), a tensor of shape (2,)), where it should "
                    "raise ValueError (the length must be even)."), text


def test_an_answer_of_zeros_is_said_to_be_zeros():
    assert "is 0 at every entry where the right one is not" in message(lambda x, n: x * 0)


def test_a_column_has_no_diagonal_and_minus_inf_is_named_with_its_sign():
    """A running maximum (L, 1) wrong in row 0 is not "on the diagonal"; -inf where numbers belong is said -inf."""
    ex = Exercise(what="your m", reference=lambda x: x.amax(-1, keepdim=True), cases=[Case("x", (torch.eye(3),))],
                  mistakes=[], passed="ok")
    text = message(lambda x: x.amax(-1, keepdim=True) - torch.tensor([[1.0], [0.0], [0.0]]), ex)
    assert "diagonal" not in text and "differs at 1 of 3 entries, e.g. at [0, 0]" in text, text
    text = message(lambda x: torch.full((3, 1), -math.inf), ex)
    assert "has -inf at 3 of 3 entries where the right answer is finite." in text, text


def test_an_exception_does_not_hide_the_values_the_answer_gets_wrong_elsewhere():
    text = message(lambda x, n: [1, 2][n] if x.ndim == 3 else 3 * x / n ** 0.5)
    assert text.startswith("x of shape (4,), n = 16: your scaled's result is 3 times the right one")
    assert "And on x of shape (2, 5, 5), n = 9, your scaled raised IndexError" in text
    text = message(lambda x, n: [1, 2][n] if x.ndim == 1 else 3 * x / n ** 0.5)
    assert text.startswith("x of shape (4,), n = 16: your scaled raised IndexError")
    assert "And on x of shape (3, 3), n = 4, your scaled's result is 3 times the right one" in text


def test_a_size_that_tells_the_right_cases_from_the_wrong_is_said():
    """Right only where n = 4: a 4 written into the answer; wrong only where n = 9."""
    gen = torch.Generator().manual_seed(1)
    ex = Exercise(what="your scaled", reference=scaled, mistakes=[], passed="ok",
                  cases=[Case(f"x of shape {s}, n = {n}", (torch.randn(*s, generator=gen, dtype=torch.float64), n))
                         for s, n in (((3, 3), 4), ((2, 4), 4), ((2, 5), 9), ((3, 4), 9), ((4,), 16))])
    assert message(lambda x, n: x / 2, ex).endswith(
        "It is right on every case with n = 4 and on no other: is 4 written into it as a number, where it should "
        "come from the inputs?")
    assert message(lambda x, n: x / 3 ** (n == 9) / n ** 0.5, ex).endswith(
        "It is wrong on every case with n = 9 and on no other.")
    assert "on no other" not in message(lambda x, n: x / n, ex)  # wrong everywhere: no size tells
    ones = Exercise(what="your scaled", reference=scaled, mistakes=[], passed="ok", cases=[
        Case(f"x of shape {tuple(x.shape)}, n = {n}", (x, n)) for x, n in ((torch.ones(2, 2), 1), (torch.ones(3), 1),
                                                                          (torch.ones(2, 3), 4), (torch.ones(4), 9))])
    assert "on no other" not in message(lambda x, n: x / n, ones)  # right where n = 1 only: no 1 written in


def halved(x, n):
    if x.ndim == 1:
        raise ValueError("no vectors")
    return x / n ** 0.5 / 2


VECTOR = Mistake("halved", "halves the result, and fails on a vector.", halved)
TOY_VECTORS = Exercise(what="your scaled", reference=scaled, cases=cases(), mistakes=[SQRT, VECTOR],
                       passed="divided by the root.")


def test_a_mistake_made_wherever_the_answer_returns_is_named_beside_its_exception_elsewhere():
    """Named where the mistake fails too where the answer raises: else the answer is another mistake, described."""
    text = message(lambda x, n: [1, 2][n] if x.ndim == 1 else x / n ** 0.5 / 2 + 0.0, TOY_VECTORS)
    assert text.startswith("x of shape (4,), n = 16: your scaled raised IndexError")
    assert text.endswith(f"And on x of shape (3, 3), n = 4, your scaled {VECTOR.says}")
    text = message(lambda x, n: [1, 2][n] if x.ndim == 1 else x / n)  # SQRT divides vectors: it never raises
    assert SQRT.says not in text and "0.5 times the right one at every entry" in text


def test_an_input_changed_in_place_is_said_even_where_the_case_shown_raised():
    text = message(lambda x, n: [1, 2][n] if x.ndim == 1 else x.div_(n ** 0.5))
    assert text.startswith("x of shape (4,), n = 16: your scaled raised IndexError")
    assert "And on x of shape (3, 3), n = 4, your scaled modified its input `x` in place" in text


def test_a_factor_of_its_own_on_each_row_and_blocks_each_transposed_are_said():
    rows = message(lambda x, n: scaled(x, n) * torch.arange(1.0, x.shape[-2] + 1, dtype=x.dtype)[:, None]
                   if x.ndim > 1 else scaled(x, n))
    assert "each row (last axis) times a factor of its own, from 1 to 3" in rows
    gen = torch.Generator().manual_seed(2)
    ex = Exercise(what="your stack", reference=lambda w: w.clone(), mistakes=[], passed="ok",
                  cases=[Case(f"D={c}", (torch.randn(3 * c, c, generator=gen, dtype=torch.float64),)) for c in (2, 3)])
    assert "holds each (2, 2) block of the right one transposed" in message(
        lambda w: w.view(3, *w.shape[1:] * 2).mT.reshape(w.shape), ex)


def test_axes_in_another_order_are_told_from_sizes_listed_in_another_order():
    gen = torch.Generator().manual_seed(3)
    ex = Exercise(what="your scaled", reference=scaled, mistakes=[], passed="ok", cases=[
        Case(f"x of shape {s}", (torch.randn(*s, generator=gen, dtype=torch.float64), 4)) for s in ((2, 3), (3, 5))])
    assert "the right one with its axes in another order (a transpose" in message(lambda x, n: scaled(x, n).mT, ex)
    assert "the sizes listed in another order (a view or reshape" in message(
        lambda x, n: scaled(x, n).reshape(x.shape[::-1]), ex)


def heads(x, h):
    """The toy exercise with a view: (B, L, D) -> (B, L, h, D / h), then through a (D, D) product."""
    return (x @ torch.eye(x.shape[-1], dtype=x.dtype)).view(*x.shape[:2], h, x.shape[-1] // h)


HEADS = Exercise(what="your split", reference=heads, mistakes=[], passed="ok", cases=[
    Case(f"x of shape {s}, h = {h}", (torch.randn(*s, generator=torch.Generator().manual_seed(4), dtype=torch.float64),
                                      h), sizes=dict(B=s[0], L=s[1], D=s[2])) for s, h in (((2, 3, 8), 2), ((1, 5, 9), 3))])


def test_an_exception_is_set_against_the_reference_on_the_same_case_its_sizes_named():
    view = message(lambda x, h: x.view(*x.shape[:2], 2, x.shape[-1] // 2), HEADS)  # h = 2 written in
    assert view.startswith("x of shape (1, 5, 9), h = 3: your split raised RuntimeError: shape '[1, 5, 2, 4]'")
    assert "the right answer views a tensor of 45 entries as (1, 5, 3, 3): axis 2 should be 3 (h = 3), not 2; " \
           "axis 3 should be 3 (h = 3), not 4." in view and "Print x.shape" not in view  # not the stock hint
    product = message(lambda x, h: heads(x[..., :-1] @ torch.eye(x.shape[-1], dtype=x.dtype), h), HEADS)
    assert "the right answer multiplies (5, 9) by (9, 9) there: the left matrix's columns should be 9 (D = 9), not 8." \
        in product, product


def test_a_broadcast_keeps_its_usual_causes_and_names_its_sizes():
    text = message(lambda x, h: heads(x, h) + x[:, :, None, :], HEADS)  # (B, L, h, d) + (B, L, 1, D)
    assert "must match the size of tensor b" in text and "matched from the RIGHT" in text, text


def test_a_shape_with_its_axes_in_another_order_is_one_kind_with_a_transpose():
    """Weights returned (B, S, L): turned where L = S (same shape) and where not (sizes in another order): one kind,
    so the transpose is claimed, and said with the permutation where the shape shows it."""
    gen = torch.Generator().manual_seed(5)
    ex = Exercise(what="your weights", reference=lambda w: w.clone(), mistakes=[], passed="ok", cases=[
        Case(f"L={s[1]}, S={s[2]}", (torch.randn(*s, generator=gen, dtype=torch.float64),)) for s in ((2, 3, 3), (2, 3, 4))])
    text = message(lambda w: w.mT.clone(), ex)
    assert "is the transpose of the right one" in text or "the right one's .permute(0, 2, 1)" in text, text
    square = Exercise(what="your acc", reference=lambda w: w.clone(), mistakes=[], passed="ok",
                      cases=[Case("L=3, d=2", (torch.ones(3, 2, dtype=torch.float64),))])
    below = message(lambda w: w.clone().index_put_((torch.tensor([2]), torch.tensor([0])), torch.tensor(5.0,
                                                                                                 dtype=w.dtype)), square)
    assert "diagonal" not in below, below  # (L, d) has no diagonal: a region of (L, L) only


def test_two_sizes_equal_exactly_on_the_right_cases_are_said():
    gen = torch.Generator().manual_seed(6)
    ex = Exercise(what="your scores", reference=lambda q, k: q @ k.mT, mistakes=[], passed="ok", cases=[
        Case(f"L={L}, S={S}", (torch.randn(L, 2, generator=gen, dtype=torch.float64),
                               torch.randn(S, 2, generator=gen, dtype=torch.float64)), sizes=dict(L=L, S=S))
        for L, S in ((2, 2), (3, 3), (2, 4), (4, 3))])
    text = message(lambda q, k: q @ k.mT + (len(q) != len(k)), ex)  # right where the two lengths agree
    assert text.endswith("It is right on every case with L = S and wrong on every case with L ≠ S: is L used where S "
                         "belongs, or S where L does?"), text


def test_a_part_of_the_case_names_that_tells_the_wrong_cases_from_the_right_ones_is_said():
    """Where no size does, a part of the cases' names (commas inside parentheses kept) shared by exactly the wrong
    cases is said; a part some right case shares too, or a single wrong case, says nothing."""
    cases = [Case(n, ()) for n in ("B=1, attn_mask None", "B=2, attn_mask (B*h, L, S)", "B=3, attn_mask (L, S)",
                                   "B=4, attn_mask (B*h, L, S)")]
    assert only_where(cases, [1, 3]) == " It is wrong on every case with attn_mask (B*h, L, S) and right on every other."
    assert only_where(cases, [1, 2]) == ""  # (B*h, L, S) and (L, S): no one part
    assert only_where(cases, [1]) == ""


def blend(a, b, n):
    """A toy with two inputs of one kind: a + 2 b, then a power of n."""
    return (a + 2 * b) ** n


BLEND = Exercise(what="your blend", reference=blend, passed="blended.", mistakes=[], cases=[
    Case(f"a, b of shape {s}, n = {n}", (torch.randn(*s, dtype=torch.float64, generator=torch.Generator().manual_seed(n)),
                                         torch.randn(*s, dtype=torch.float64), n)) for s, n in (((2, 3), 1), ((4,), 2))])


def test_inputs_exchanged_or_read_twice_are_named_where_no_catalogue_entry_is():
    """Outside the catalogue, the reference on two of its inputs swapped, or one read for the other, is tried: named
    when the answer agrees with it on every case, and not when it agrees on some cases only."""
    assert message(lambda a, b, n: blend(b, a, n), BLEND).endswith("with `a` and `b` EXCHANGED: it reads a where b "
                                                                    "belongs, and b where a does.")
    assert message(lambda a, b, n: blend(a, a, n), BLEND).endswith("with `a` passed for `b` too: it reads a where b "
                                                                    "belongs.")
    assert "EXCHANGED" not in message(lambda a, b, n: blend(b, a, n) if a.ndim > 1 else blend(a, b, n) + 1, BLEND)
    assert "passed for" not in message(lambda a, b, n: blend(a, b, 1), BLEND)  # n is the only int: nothing to swap


def test_an_input_returned_as_it_was_given_is_said():
    assert "It equals the input `b`, as given." in message(lambda a, b, n: b.clone(), BLEND)
