"""pick_device and seed_everything (attention_course.device, owned by the lead)."""
import random

import pytest
import torch

from attention_course import pick_device, seed_everything
from attention_course.device import DEVICE_ENV


@pytest.fixture
def no_gpu(monkeypatch):
    monkeypatch.delenv(DEVICE_ENV, raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)


def test_seed_everything_repeats_torch_and_python():
    seed_everything(3)
    first = torch.rand(3), random.random()
    seed_everything(3)
    assert torch.equal(torch.rand(3), first[0]) and random.random() == first[1]


def test_pick_device_without_gpu_is_cpu_and_seeds(no_gpu, capsys):
    device = pick_device(seed=5)
    assert device == torch.device("cpu")
    assert "running on cpu" in capsys.readouterr().out
    after_pick = torch.rand(2)
    torch.manual_seed(5)
    assert torch.equal(torch.rand(2), after_pick)


def test_pick_device_quiet(no_gpu, capsys):
    pick_device(verbose=False)
    assert capsys.readouterr().out == ""


def test_pick_device_prefers_a_gpu(no_gpu, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device(verbose=False).type == "cuda"


def test_environment_variable_forces_a_device(no_gpu, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, " cpu ")
    assert pick_device(verbose=False) == torch.device("cpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert pick_device(verbose=False) == torch.device("cpu")


def test_environment_variable_asking_for_a_missing_gpu(no_gpu, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "cuda")
    with pytest.raises(ValueError, match=f"{DEVICE_ENV}='cuda' asks for a GPU.*set it to 'cpu'"):
        pick_device()


def test_environment_variable_misspelt(no_gpu, monkeypatch):
    monkeypatch.setenv(DEVICE_ENV, "gpu")
    with pytest.raises(ValueError, match=DEVICE_ENV):
        pick_device()


def test_seed_everything_repeats_numpy():
    np = pytest.importorskip("numpy")
    seed_everything(0)
    first = np.random.rand()
    seed_everything(0)
    assert np.random.rand() == first


@pytest.mark.parametrize("wanted, phrase", [("mps", "not 'mps'"), ("cuda:3", "asks for a GPU")])
def test_environment_variable_other_devices(no_gpu, monkeypatch, wanted, phrase):
    monkeypatch.setenv(DEVICE_ENV, wanted)
    with pytest.raises(ValueError, match=phrase):
        pick_device()


def test_environment_variable_asking_for_a_gpu_beyond_the_count(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setenv(DEVICE_ENV, "cuda:3")
    with pytest.raises(ValueError, match="only 1 GPU"):
        pick_device()
