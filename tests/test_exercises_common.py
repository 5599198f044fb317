"""The helpers every chapter's checker shares: the verdict line, the learner's exception told with a hint."""
import pytest
import torch

from attention_course.exercises import ExerciseError, passed, raised, same_error


def test_passed_wraps_to_the_page_width(capsys):
    passed("word " * 40)
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("Correct: ") and all(len(line) <= 79 for line in lines) and len(lines) > 1


def test_a_learners_exception_is_named():
    assert str(raised(ZeroDivisionError("division by zero"), "your function")) == \
        "your function raised ZeroDivisionError: division by zero. A division by a size or count that is 0 in this case."


def test_a_device_mismatch_is_explained():
    """On a GPU runtime a learner's tensor made on `device` meets the checker's CPU tensors."""
    err = RuntimeError("Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!")
    assert "checker's tensors are on the CPU" in str(raised(err, "your function"))


def test_view_after_transpose_is_explained():
    x = torch.zeros(2, 3, 4).transpose(1, 2)
    with pytest.raises(RuntimeError) as err:
        x.view(2, 12)
    assert "call .contiguous() before .view, or use .reshape" in str(raised(err.value, "your function"))


def test_the_stub_is_named():
    assert "still the exercise's stub" in str(raised(NotImplementedError(), "your function"))
    assert isinstance(raised(NotImplementedError(), "x"), ExerciseError)


def test_same_error_compares_type_and_sizes():
    def broadcast(a, b):
        try:
            a + b
        except RuntimeError as err:
            return err

    assert same_error(broadcast(torch.zeros(2, 5), torch.zeros(5, 2)), broadcast(torch.zeros(5, 2), torch.zeros(2, 5)))
    assert not same_error(broadcast(torch.zeros(2, 5), torch.zeros(5, 2)), broadcast(torch.zeros(3), torch.zeros(4)))
    assert not same_error(RuntimeError("size 2"), ValueError("size 2"))
    assert same_error(IndexError("list index out of range"), IndexError("index 5 is out of bounds for dimension 0"))
    assert not same_error(RuntimeError("view size is not compatible"), RuntimeError("expanded size (3) must match"))
