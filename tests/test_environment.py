"""The environment `make` built is the locked one: every package of locks/dev.txt (for this Python and platform) is
installed at its locked version, and nothing else is but torch (pinned apart, TORCH in the Makefile) and the course.

The targets test-latest and test-oldest build environments from the ranges instead (ATTENTION_COURSE_ENV says
which); there this test has nothing to check and says so.
"""
import os
import re
import sysconfig
from importlib import metadata
from pathlib import Path

import pytest
from packaging.markers import Marker

ROOT = Path(__file__).resolve().parents[1]
LINE = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([^\s;\\]+)\s*(?:;\s*([^\\]+?))?\s*\\?$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(path: Path) -> dict[str, str]:
    """{package: version} of a lock file, for this interpreter and platform (its markers evaluated)."""
    versions = {}
    for line in path.read_text().splitlines():
        match = LINE.match(line)
        if match and (match.group(3) is None or Marker(match.group(3)).evaluate()):
            versions[canonical(match.group(1))] = match.group(2)
    return versions


def test_a_lock_line_is_read_with_its_marker():
    assert LINE.match("numpy==2.4.6 ; python_full_version == '3.11.*' \\").groups() == (
        "numpy", "2.4.6", "python_full_version == '3.11.*'")
    assert LINE.match("uv==0.13.9 \\").groups() == ("uv", "0.13.9", None)


@pytest.mark.skipif(os.environ.get("ATTENTION_COURSE_ENV", "locked") != "locked",
                    reason="an environment built from the ranges or Colab's versions (make test-latest / "
                           "test-oldest / test-colab), not the lock")
def test_the_installed_packages_are_the_locked_ones():
    lock = locked(ROOT / "locks" / "dev.txt")
    # the environment's own site-packages: not sys.path, where a test that imported setuptools has put its vendored
    # packages (importlib-metadata, packaging, ... at setuptools' versions)
    site = sorted({sysconfig.get_paths()[key] for key in ("purelib", "platlib")})
    installed = {canonical(d.metadata["Name"]): d.version for d in metadata.distributions(path=site)}
    wrong = {name: (installed.get(name), version) for name, version in lock.items() if installed.get(name) != version}
    assert not wrong, f"installed (left) is not locked (right): {wrong}; run `rm -rf .venv && make venv`"
    extra = set(installed) - set(lock) - {"torch", "attention-course", "pip"}
    # torch's own dependencies come with it when TORCH is not the CPU wheel (CUDA libraries): not the lock's business
    extra = {name for name in extra if not re.match(r"nvidia-|cuda-|triton$", name)}
    assert not extra, f"installed but not in locks/dev.txt: {sorted(extra)}"


# Imported by every kernel, test worker, graded submission and distributed worker: without byte-code (a sandboxed
# submission cannot write it) each process compiles them from source again, 2 s for sympy alone
# (torch.testing.assert_close imports it). `make venv` compiles nothing: the book's kernels write the byte-code of
# what they import (make unsets PYTHONDONTWRITEBYTECODE), before any test or graded submission runs.
COMPILED = ["torch", "torch.distributed.tensor", "sympy", "sympy.polys.rings", "mpmath", "networkx", "jinja2",
            "numpy", "matplotlib.pyplot", "transformers", "ipykernel.kernelapp"]
BOOK = ROOT / "_build" / "html" / "index.html"
INSTALLED = ROOT / ".venv" / ".installed"


@pytest.mark.skipif(os.environ.get("ATTENTION_COURSE_ENV", "locked") != "locked",
                    reason="an environment built from the ranges or Colab's versions (make test-latest / "
                           "test-oldest / test-colab), not the lock")
@pytest.mark.skipif(not (BOOK.exists() and INSTALLED.exists() and BOOK.stat().st_mtime > INSTALLED.stat().st_mtime),
                    reason="the book was not built with this environment (`make book` writes the byte-code)")
@pytest.mark.parametrize("module", COMPILED)
def test_the_modules_every_process_imports_have_their_byte_code(module):
    from importlib.util import cache_from_source, find_spec
    origin = find_spec(module).origin
    assert Path(cache_from_source(origin)).exists(), (
        f"{origin} has no byte-code: every process compiles it again; was PYTHONDONTWRITEBYTECODE set in `make book`?")


def test_the_torch_make_installs_runs_every_chapter():
    """make test-oldest and make test-colab run torch 2.11, on which a gated chapter (11) only stops: its cells run at
    their floor in `make test` alone, with the Makefile's TORCH. It must satisfy every chapter's gate."""
    from conftest import torch_gate

    from attention_course.device import _release

    pinned = re.search(r"^TORCH\s*\?=\s*torch==(\S+)", (ROOT / "Makefile").read_text(), re.M).group(1)
    gates = [torch_gate(path) for path in sorted((ROOT / "notebooks").glob("*.ipynb"))]
    assert any(gates)
    for gate in filter(None, gates):
        assert _release(pinned) >= _release(gate[0]), f"TORCH is torch=={pinned}: chapter {gate[1]} needs {gate[0]}"


def test_the_locks_leave_out_the_iri_checker_that_slows_every_nbformat_import():
    """rfc3987-syntax builds some thirty parsers on import (2 to 3 s of every nbgrader run); jsonschema does without
    it, and no Jupyter schema checks the format it is for (the Makefile's LOCK_FLAGS)."""
    for lock in ("dev.txt", "grader.txt"):
        names = {canonical(m.group(1)) for m in map(LINE.match, (ROOT / "locks" / lock).read_text().splitlines()) if m}
        assert names and not names & {"rfc3987-syntax", "lark"}, f"locks/{lock} lists rfc3987-syntax or lark again"


def test_the_book_reads_none_of_the_environments_make_creates():
    """The environments live in the book's folder: the build must not read their packages' notebooks and pages (after
    `make test-oldest`, matplotlib's own test notebooks in .venv-oldest/ failed `make book`)."""
    yaml = pytest.importorskip("yaml")
    Matcher = pytest.importorskip("sphinx.util.matching", reason="the book's tools (make test-latest: a reader's "
                                  "environment)").Matcher
    makefile = (ROOT / "Makefile").read_text()
    made = {".venv", *re.findall(r"^GRADER\s*:=\s*(\S+)", makefile, re.M)}
    made |= {f".venv-{target.split('-')[1]}" for target in re.findall(r"^(test-\w+):", makefile, re.M)}
    assert made >= {".venv", ".venv-grader", ".venv-latest", ".venv-oldest"}, made
    excluded = Matcher(yaml.safe_load((ROOT / "_config.yml").read_text())["exclude_patterns"])
    assert all(excluded(folder) for folder in made), [folder for folder in made if not excluded(folder)]
    ignored = (ROOT / ".gitignore").read_text().split()
    assert all(any(Matcher([p.rstrip("/")])(folder) for p in ignored) for folder in made), "git should ignore them too"


def test_a_test_worker_runs_torch_on_one_thread():
    """conftest.py: under pytest-xdist (a worker per core) torch gets one thread in each worker and in the processes
    the tests start (they inherit OMP_NUM_THREADS), unless OMP_NUM_THREADS was set before the run."""
    import subprocess
    import sys

    import torch

    if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) < 2:
        pytest.skip("only under pytest-xdist with several workers (make test, make check)")
    wanted = int(os.environ["OMP_NUM_THREADS"])
    child = subprocess.run([sys.executable, "-c", "import torch; print(torch.get_num_threads())"], check=True,
                           capture_output=True, text=True, timeout=120).stdout
    assert torch.get_num_threads() == wanted == int(child), (torch.get_num_threads(), wanted, child)
