"""Shared fixtures: a torch MultiheadAttention and ours holding the same (random, non-zero-bias) weights."""
import json
import os
import re
import sys
from pathlib import Path

os.environ.setdefault("MPLBACKEND", "Agg")  # plots draw off-screen in tests
# pytest-xdist runs a worker per core: torch in each (and in every process a test starts: kernels, nbgrader, check
# servers) gets one thread. With a thread per core in each worker, the cores are oversubscribed: the torch-heavy tests
# ran 30% slower (measured on 2 cores: 88 s against 62 s). Set before torch is imported; an explicit value is kept.
if int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1")) > 1:
    os.environ.setdefault("OMP_NUM_THREADS", "1")

import pytest  # noqa: E402


# torch is imported where it is used, not here: pytest-xdist's controller loads this file too, and runs no test (torch
# and the package were 3.5 s of its start, before any worker started).
def make_pair(embed_dim=8, num_heads=2, dtype=None, seed=0, **kwargs):
    """(torch's layer with batch_first=True, ours) with the same weights (float64 unless ``dtype``); every bias random
    and non-zero, since torch starts biases at zero and a missing bias would go unnoticed."""
    import torch
    from torch import nn

    from attention_course import MultiheadAttention

    dtype = torch.float64 if dtype is None else dtype
    torch.manual_seed(seed)
    ref = nn.MultiheadAttention(embed_dim, num_heads, batch_first=True, dtype=dtype, **kwargs)
    with torch.no_grad():
        for name, p in ref.named_parameters():
            if "bias" in name:
                p.uniform_(-1.0, 1.0)
    ours = MultiheadAttention.from_torch(ref)
    return ref, ours


@pytest.fixture(scope="session")
def pair():
    """A factory: ``pair(embed_dim, num_heads, dtype=..., seed=..., **kwargs) -> (torch_layer, our_layer)``."""
    return make_pair


def gathered() -> dict:
    """The tables printed at the end of a run, by the modules that fill them (imported lazily: a worker that ran
    none of their tests has them empty)."""
    from mutants import RESULTS

    tables = {"mutation": RESULTS}
    accessibility = sys.modules.get("test_accessibility")
    if accessibility is not None:
        tables["accessibility"] = accessibility.RESULTS
    return tables


# The order in which pytest-xdist hands out files (--dist loadfile, --no-loadscope-reorder): the longest first, so
# that none starts last and runs alone. The seconds each file took in the last full run are kept in DURATIONS; a
# fresh clone (CI's) has none and starts from FIRST, measured on a 2-core machine: every file of 10 s or more, since
# the files it leaves out come after it in alphabetical order (a long one among them ran last, alone). After a timed
# run, a file not timed yet (a new one) counts as the slowest.
DURATIONS = Path(__file__).resolve().parents[1] / "_build" / "test-durations.json"
FIRST = ["tests/test_accessibility.py", "tests/test_grading_class.py", "tests/test_verdict.py",
         "tests/test_nothing_outside.py", "tests/test_accessibility_editions.py", "tests/test_distributed.py",
         "tests/test_catalogues.py", "tests/test_mutation.py", "tests/test_zh.py", "tests/test_site.py",
         "tests/test_widgets.py", "tests/test_dropin.py", "tests/test_exercises_ch07.py", "tests/test_alt_text.py",
         "tests/test_instructor.py", "tests/test_trial.py", "tests/test_grading.py", "tests/test_boundary.py",
         "tests/test_parity.py", "tests/test_tiled.py"]
SECONDS: dict[str, float] = {}  # file -> seconds its tests took in this run (the controller's count)
# Files whose tests share what a process computes once: each catalogue's outcomes of every mistake on every case (the
# memo of attention_course/exercises/diagnose.py's Exercise.expected, kept on the chapter's module-level exercises).
# The layer catalogues of chapters 6 and 7 (52 and 78 mistakes times 19 and 24 cases, each a layer built and called,
# in two conventions) cost 26 CPU-s to fill (66 s of test_mutation's first two layer tests, with coverage, on a busy
# machine), and every one of these files fills them at its first check of a layer; handed out apart, two workers
# filled them twice. They are handed out together, one unit of work
# (pytest_xdist_make_scheduler below), and run in one process one after the other: the second and later files find
# the memo full. Each test still runs its own answers through its checker; only the catalogue's own outcomes, the
# same in every process, are not computed again.
TOGETHER = ("tests/test_catalogues.py", "tests/test_exercises_ch04_06.py", "tests/test_exercises_ch07.py",
            "tests/test_mutation.py")


def unit(path: str) -> str:
    """The unit of work a file is handed out in (--dist loadfile): the file, or TOGETHER's first."""
    return TOGETHER[0] if path in TOGETHER else path


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile (make test), with TOGETHER's files one unit; any other --dist as pytest-xdist makes it."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class Together(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return unit(super()._split_scope(nodeid))
    return Together(config, log)


# The package's line coverage (`make test`) is measured by the tests that run the package in their own process. The
# files below test something else: the site's accessibility in a browser, the built pages and catalogs, the
# environment, the student edition and a graded class (the package runs there in other processes, where nothing is
# measured). Their own
# Python (parsing pages, driving Chromium and nbgrader) ran up to 45% slower under the coverage tracer, which sees
# every call: test_zh.py alone took 31 CPU-s more. Their tests run with coverage paused (pytest-cov's no_cover
# marker); so do the tests marked no_cover in their own file (torch's compiler, exporter and tracer: the package's
# lines they reach, eager tests reach too). A file that draws the figures or calls the package in process
# (test_alt_text.py, test_figure_text.py, test_site.py, test_verdict.py, ...) stays measured.
NOT_MEASURED = {"tests/test_accessibility.py", "tests/test_accessibility_editions.py", "tests/test_built_pages.py",
                "tests/test_claims.py", "tests/test_environment.py", "tests/test_grading_class.py",
                "tests/test_instructor.py", "tests/test_intro.py", "tests/test_notebooks.py", "tests/test_zh.py"}


# What `make` cannot install (tests/prerequisites.py). A test needs a piece by its marker (@pytest.mark.needs("bwrap")),
# by asking for the browser (chromium), or by reading the built site (npm: without it `make test ALLOW_MISSING=1`
# builds no site). `make test` looks first and stops when a piece is missing; with ALLOW_MISSING=1 it says which are
# (ATTENTION_COURSE_MISSING), and their tests are skipped here and listed at the end of the run. Run alone (plain
# pytest), the tests look for themselves.
NEEDS_SITE = {"tests/test_site.py", "tests/test_accessibility.py", "tests/test_accessibility_editions.py",
              "tests/test_built_pages.py", "tests/test_zh.py", "tests/test_widgets.py", "tests/test_alt_text.py",
              "tests/test_instructor.py", "tests/test_grading_class.py"}
NOT_TESTED = "not tested here: needs "  # the start of such a skip's reason
MISSING_SKIPS: dict[str, int] = {}  # piece -> tests skipped for it (the controller's count)


def missing_pieces() -> dict[str, str]:
    """{piece: why} for the pieces missing here: as `make test` found them, or looked for now."""
    import prerequisites

    if "ATTENTION_COURSE_MISSING" in os.environ:
        names = os.environ["ATTENTION_COURSE_MISSING"].split()
        return {name: "missing (make test ALLOW_MISSING=1)" for name in names if name in prerequisites.PIECES}
    return prerequisites.missing("test")


def needed(item) -> list[str]:
    pieces = [mark.args[0] for mark in item.iter_markers("needs")]
    if "browser" in getattr(item, "fixturenames", ()):
        pieces.append("chromium")
    if item.nodeid.split("::")[0] in NEEDS_SITE:
        pieces.append("npm")
    return pieces


# A chapter that needs a newer torch than the rest checks it in its first cell (require_torch("2.13", chapter="11")) and
# stops there on an older one, with the command that fixes it. Run by nbval on such a torch (make test-colab, make
# test-oldest), its cells are skipped as expected; tests/test_distributed.py checks the stop itself.
GATE = re.compile(r'^require_torch\("([0-9.]+)", chapter="(\w+)"\)', re.M)  # a call of its own line, not a comment


def torch_gate(notebook: Path) -> tuple[str, str] | None:
    """(the torch a notebook's first code cell requires, the chapter it names), or None."""
    try:
        cells = json.loads(notebook.read_text())["cells"]
    except (OSError, ValueError, KeyError):
        return None
    first = next(("".join(c["source"]) for c in cells if c["cell_type"] == "code"), "")
    found = GATE.search(first)
    return found.groups() if found else None


def expected_stop(notebook: Path) -> str | None:
    """Why a notebook's cells are skipped here: its gate is above the running torch; else None."""
    gate = torch_gate(notebook)
    if gate is None:
        return None
    import torch

    from attention_course.device import _release

    if _release(torch.__version__) >= _release(gate[0]):
        return None
    return (f"expected: {notebook.name} needs torch {gate[0]} and stops in its first cell on this torch "
            f"{torch.__version__}, with the command that fixes it (tests/test_distributed.py checks that stop)")


def pytest_collection_modifyitems(session, config, items):
    import prerequisites

    missing = missing_pieces()
    stops: dict[str, str | None] = {}
    for item in items:
        path = item.nodeid.split("::")[0]
        if path in NOT_MEASURED:
            item.add_marker(pytest.mark.no_cover)
        if path.endswith(".ipynb"):
            if path not in stops:
                stops[path] = expected_stop(Path(str(item.path)))
            if stops[path]:
                item.add_marker(pytest.mark.skip(reason=stops[path]))
                continue
        for piece in needed(item):
            if piece in missing:
                item.add_marker(pytest.mark.skip(reason=f"{NOT_TESTED}{piece} ({missing[piece]}; install: "
                                                         f"{prerequisites.PIECES[piece][3]})"))
                break
    try:
        last = json.loads(DURATIONS.read_text())
        slow = max(last.values(), default=0.0)
        together = sum  # a unit of several files (TOGETHER) takes their seconds together
    except (OSError, ValueError):
        last, slow = {path: float(len(FIRST) - i) for i, path in enumerate(FIRST)}, 0.0
        together = max  # ... or its first file's place in FIRST
    weight: dict[str, list[float]] = {}
    for path in {item.nodeid.split("::")[0] for item in items}:
        weight.setdefault(unit(path), []).append(last.get(path, slow))
    # stable: a unit's files, and a file's tests, keep their own order
    first = {item: unit(item.nodeid.split("::")[0]) for item in items}
    items.sort(key=lambda item: (-together(weight[first[item]]), first[item]))


def whole_run(config) -> bool:
    """Every test, in parallel: ``make test`` (not one file, not ``make check``)."""
    return config.getoption("dist", "no") != "no" and config.args_source == pytest.Config.ArgsSource.TESTPATHS


def pytest_runtest_logreport(report):
    path = report.nodeid.split("::")[0]
    SECONDS[path] = SECONDS.get(path, 0.0) + report.duration
    if report.skipped and isinstance(report.longrepr, tuple) and str(report.longrepr[2]).startswith(
            "Skipped: " + NOT_TESTED):
        piece = str(report.longrepr[2])[len("Skipped: " + NOT_TESTED):].split()[0]
        MISSING_SKIPS[piece] = MISSING_SKIPS.get(piece, 0) + 1


def not_tested(terminalreporter) -> None:
    """The run's last lines when it tested less than everything: which pieces were missing, how many tests that
    left out, and what installs each."""
    import prerequisites

    if not MISSING_SKIPS:
        return
    terminalreporter.section("NOT TESTED: this run skipped what needs a missing piece", sep="!")
    for piece, count in sorted(MISSING_SKIPS.items()):
        _, _, used, install = prerequisites.PIECES[piece]
        terminalreporter.write_line(f"{piece}: {count} tests not run ({used}); install: {install}")


def pytest_sessionstart(session):
    """Screenshots of an earlier run go, once, before any worker takes new ones (pages may have left the toc)."""
    if not hasattr(session.config, "workerinput"):
        from test_site import SCREENSHOTS

        for old in [*SCREENSHOTS.glob("*.jpg"), *SCREENSHOTS.glob("report*.json")]:  # what test_site wrote there
            old.unlink(missing_ok=True)


def pytest_sessionfinish(session, exitstatus):
    """Under pytest-xdist, a worker hands its tables to the controller, which prints them. The controller of a whole
    run (every file collected) keeps each file's seconds for the next run's order."""
    if hasattr(session.config, "workeroutput"):
        session.config.workeroutput["tables"] = json.dumps(gathered())
    elif whole_run(session.config) and SECONDS:
        DURATIONS.parent.mkdir(exist_ok=True)
        DURATIONS.write_text(json.dumps(dict(sorted(SECONDS.items(), key=lambda kv: -kv[1])), indent=1) + "\n")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error):
    tables = json.loads(getattr(node, "workeroutput", {}).get("tables", "{}"))
    if tables.get("accessibility"):
        import test_accessibility

        test_accessibility.RESULTS.update(tables["accessibility"])
        test_accessibility.write_report()  # every worker's runs in one report
    from mutants import RESULTS

    for checker, verdicts in tables.get("mutation", {}).items():
        RESULTS.setdefault(checker, {}).update(verdicts)


def pytest_terminal_summary(terminalreporter):
    """The checkers' mutation scores (tests/test_mutation.py), and what axe found (tests/test_accessibility.py)."""
    accessibility = sys.modules.get("test_accessibility")
    if accessibility is not None and accessibility.RESULTS:
        terminalreporter.section("accessibility: elements in violation of axe's WCAG 2.1 A/AA rules")
        for run, found in sorted(accessibility.RESULTS.items()):
            per_rule = accessibility.summary(found)[0]
            terminalreporter.write_line(f"{run:24} {sum(per_rule.values()):5d}  {dict(per_rule) or ''}")
        terminalreporter.write_line(f"(details: {accessibility.REPORT})")
    mutation_scores(terminalreporter)
    not_tested(terminalreporter)


def mutation_scores(terminalreporter):
    """Per checker (tests/test_mutation.py): mutants rejected and mutants named."""
    from mutants import RESULTS

    if not RESULTS:
        return
    write = terminalreporter.write_line
    terminalreporter.section("mutation scores of the exercise checkers")
    write(f"{'checker':42} {'mutants':>7} {'rejected':>8} {'named':>6}  score")
    totals = [0, 0, 0]
    for checker, verdicts in sorted(RESULTS.items()):
        n = len(verdicts)
        rejected = sum(v.startswith("rejected") or v == "named" for v in verdicts.values())
        good = sum(v == "named" for v in verdicts.values())
        totals = [totals[0] + n, totals[1] + rejected, totals[2] + good]
        write(f"{checker:42} {n:7d} {rejected:8d} {good:6d}  {good / n:5.0%}")
        for mutant, verdict in verdicts.items():
            if verdict != "named":
                write(f"    {verdict}: {mutant}")
    n, rejected, good = totals
    write(f"{'all checkers':42} {n:7d} {rejected:8d} {good:6d}  {good / max(n, 1):5.0%}")
