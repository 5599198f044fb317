"""The notebooks are sources: these tests keep them clean and consistent with the book's configuration.

(Executing them is nbval's job: `pytest` collects notebooks/*.ipynb with --nbval-lax.)
"""
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def load(path):
    return json.loads(path.read_text())


def toc_files():
    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"], *walk(toc)]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "code":
            assert not cell["outputs"], f"{path.name} cell {i} has stored outputs: clear them before committing"
            assert cell["execution_count"] is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_hard_coded_cuda(path):
    source = "".join("".join(c["source"]) for c in load(path)["cells"])
    assert ".cuda(" not in source, f"{path.name}: use the device chosen in the setup cell, not .cuda()"
    assert "device=\"cuda\"" not in source and "device='cuda'" not in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell(path):
    """First code cell: installs from the configured repository on Colab, picks the device once, seeds."""
    code = [c for c in load(path)["cells"] if c["cell_type"] == "code"]
    setup = "".join(code[0]["source"])
    repo = CONFIG["repository"]["url"]
    assert "google.colab" in setup
    urls = re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", setup)
    assert urls == [repo], f"{path.name}: the Colab install must use {repo} (from _config.yml), found {urls}"
    assert re.search(r"%pip install .*git\+", setup), f"{path.name}: the Colab branch must %pip install the package"
    assert "pick_device(" in setup, f"{path.name}: the setup cell must choose the device with pick_device()"
    later = "".join("".join(c["source"]) for c in code[1:])
    assert "pick_device(" not in later, f"{path.name}: choose the device once, in the setup cell"


def test_every_notebook_is_in_the_toc_and_every_toc_entry_exists():
    listed = set(toc_files())
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in listed, f"{path.name} is not in _toc.yml"
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml lists {entry}, missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page(path):
    """The website shows about 80 characters of code before a horizontal scrollbar."""
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "code":
            for line in "".join(cell["source"]).splitlines():
                assert len(line) <= 79, f"{path.name} cell {i}: {len(line)} characters: {line!r}"
