"""The helpers every chapter's checker shares."""
import pytest
import torch

from attention_course.exercises import ExerciseError, call, describe_diff, max_diff, passed, require_tensor, same_error


def test_passed_wraps_to_the_page_width(capsys):
    passed("word " * 40)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Correct: ") and all(len(line) <= 79 for line in lines) and len(lines) > 1


def test_call_names_the_learners_exception():
    with pytest.raises(ExerciseError, match=r"your function raised ZeroDivisionError: division by zero$"):
        call(lambda: 1 / 0, what="your function")


def test_call_explains_a_device_mismatch():
    """On a GPU runtime a learner's tensor made on `device` meets the checker's CPU tensors."""
    def on_the_notebooks_device():
        raise RuntimeError("Expected all tensors to be on the same device, but found at least two devices, "
                           "cuda:0 and cpu!")
    with pytest.raises(ExerciseError, match=r"checker's tensors are on the CPU.*device=x\.device"):
        call(on_the_notebooks_device, what="your function")


def test_answers_are_compared_on_the_cpu():
    answer = require_tensor(torch.ones(2), "the mask", "your function")
    assert answer.device.type == "cpu"
    assert max_diff(torch.tensor([1.0, float("nan")]), torch.tensor([1.0, 2.0])) == float("inf")
    with pytest.raises(ExerciseError, match="must return a torch.Tensor"):
        require_tensor([1, 2], "the mask", "your function")


def test_call_explains_view_after_transpose():
    x = torch.zeros(2, 3, 4).transpose(1, 2)
    with pytest.raises(ExerciseError, match=r"raised RuntimeError: view size.*call \.contiguous\(\) before \.view, or "
                                            r"use \.reshape"):
        call(lambda: x.view(2, 12), what="your function")


def test_differences_with_inf_and_nan_are_described_not_measured():
    inf, nan = float("inf"), float("nan")
    assert max_diff(torch.tensor([inf, -inf, 1.0]), torch.tensor([inf, -inf, 1.0])) == 0.0  # inf equals inf
    assert max_diff(torch.tensor([inf]), torch.tensor([0.0])) == inf  # not the largest float, 1.8e308
    assert describe_diff(torch.tensor([1.0, 2.5]), torch.tensor([1.0, 2.0])) == "differ by up to 0.5"
    assert describe_diff(torch.tensor([nan, -inf, inf, 1.0]), torch.zeros(4), ref="the answer's") == \
        "have NaN, inf and -inf at 3 of 4 entries where the answer's are finite"
    assert describe_diff(torch.tensor([nan]), torch.tensor([nan])) == "differ by up to 0"


def test_same_error_compares_type_and_sizes():
    def broadcast(a, b):
        try:
            a + b
        except RuntimeError as err:
            return err

    assert same_error(broadcast(torch.zeros(2, 5), torch.zeros(5, 2)), broadcast(torch.zeros(5, 2), torch.zeros(2, 5)))
    assert not same_error(broadcast(torch.zeros(2, 5), torch.zeros(5, 2)), broadcast(torch.zeros(3), torch.zeros(4)))
    assert not same_error(RuntimeError("size 2"), ValueError("size 2"))
