"""The helpers every chapter's checker shares."""
import pytest
import torch

from attention_course.exercises import ExerciseError, call, max_diff, passed, require_tensor


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
