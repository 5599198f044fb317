"""``make student``: the student edition in ``_build/student/``.

1. ``notebooks/``: every chapter as nbgrader's ``generate_assignment`` makes it, after the prose of the gated
   solutions is cut (nbgrader replaces the answers in code cells with ``# YOUR CODE HERE`` /
   ``raise NotImplementedError()``; it knows nothing of sphinx-exercise's gates, so the prose is cut here).
2. ``html/``: the website without solutions (``student_edition`` in book/_ext/exercise_tools.py: solutions,
   including the code cells of gated solutions, are in neither the pages nor the search index); ``_sources/`` and the download button serve the
   student notebooks; no Colab button (it would open the full notebook from the repository).

Run it with the project's virtual environment: ``.venv/bin/python -m instructor.student`` (nbgrader is called from
``.venv-grader/``, which ``make`` creates).
"""
from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import yaml

from .exercises import ROOT, chapters, load, nbgrader_source, save

OUT = ROOT / "_build" / "student"
MADE_HERE = ".made-by-instructor.student"  # in every --out this command made: only such a folder is emptied again
NBGRADER = ROOT / ".venv-grader" / "bin" / "nbgrader"
CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"


def nbgrader(course: Path, *args: str) -> None:
    """Run an nbgrader command in ``course`` with this course's config (its venv's bin/ on PATH: nbgrader calls
    alembic)."""
    env = {"PATH": f"{NBGRADER.parent}:/usr/bin:/bin"}
    command = [str(NBGRADER), *args, f"--CourseDirectory.root={course}"]
    subprocess.run(command, check=True, env=env, cwd=course)


def release(course: Path, target: Path, paths: list[Path] | None = None) -> list[Path]:
    """Student notebooks of every chapter (or of ``paths``) into ``target``, one nbgrader assignment each."""
    paths = chapters() if paths is None else paths
    shutil.rmtree(course, ignore_errors=True)
    course.mkdir(parents=True)
    shutil.copy(CONFIG, course / "nbgrader_config.py")
    for path in paths:
        folder = course / "source" / path.stem
        folder.mkdir(parents=True)
        save(nbgrader_source(path), folder / path.name)
    # one nbgrader process for every assignment (its start and the gradebook's set-up cost seconds each time):
    # the assignment id "*" matches every folder of source/, and each is generated as it would be alone
    nbgrader(course, "generate_assignment", "*" if len(paths) > 1 else paths[0].stem, "--force", "--log-level=WARN")
    target.mkdir(parents=True, exist_ok=True)
    released = []
    for path in paths:
        shutil.copy(course / "release" / path.stem / path.name, target / path.name)
        released.append(target / path.name)
    return released


def student_config(out: Path) -> Path:
    """_config.yml with solutions hidden, no Colab button and no source links to the full notebooks."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["title"] = f"{config['title']} (student edition)"
    config.setdefault("launch_buttons", {})["colab_url"] = ""
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx["student_edition"] = True  # book/_ext/exercise_tools.py removes every solution
    # this file lives elsewhere, so the paths it holds (relative to the repository) become absolute
    extensions = config["sphinx"].get("local_extensions", {})
    config["sphinx"]["local_extensions"] = {name: str(ROOT / path) for name, path in extensions.items()}
    sphinx["html_static_path"] = [str(ROOT / path) for path in sphinx.get("html_static_path", [])]
    # the executed notebooks (with solutions) are cached by the full build; reuse them instead of running again
    config.setdefault("execute", {})["cache"] = str(ROOT / "_build" / ".jupyter_cache")
    path = out / "_config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build_site(html: Path, notebooks: list[Path]) -> None:
    """The student website into ``html``. Sphinx works in _build/.student-build (its executed notebooks hold the
    solutions); only the pages come out."""
    work = ROOT / "_build" / ".student-build"
    work.mkdir(parents=True, exist_ok=True)
    config = student_config(work)
    shutil.rmtree(work / "_build" / "html", ignore_errors=True)  # nothing left over from an earlier build
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    subprocess.run([str(jupyter_book), "build", str(ROOT), "--config", str(config), "--path-output", str(work),
                    "-W", "-n", "--keep-going"], check=True)
    shutil.rmtree(html, ignore_errors=True)
    # reports/ holds the tracebacks of failed cells, solutions included: never part of the edition
    shutil.copytree(work / "_build" / "html", html, ignore=shutil.ignore_patterns("reports"))
    sources = html / "_sources" / "notebooks"
    for path in notebooks:  # the download button serves _sources/: the student notebook, not the full one
        shutil.copy(path, sources / path.name)


def clear(out: Path) -> None:
    """Empty ``out`` for a new edition: the default (in _build/), a folder this command made (it holds MADE_HERE), or
    an empty or new one; any other folder is refused, never deleted (``--out ~`` must not empty a home)."""
    if out.resolve() != OUT.resolve() and out.exists() and any(out.iterdir()) and not (out / MADE_HERE).exists():
        raise SystemExit(f"--out {out}: not a folder this command made (no {MADE_HERE} in it), and not empty: "
                         f"give a new or empty folder")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    (out / MADE_HERE).write_text("made by python -m instructor.student: emptied when it makes a new edition here\n")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m instructor.student", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-site", dest="site", action="store_false", help="the notebooks only")
    parser.add_argument("--site-only", dest="notebooks", action="store_false",
                        help="the website only, from the student notebooks an earlier --no-site released (make student "
                             "builds it while the Chinese one is built)")
    args = parser.parse_args(argv)
    if args.notebooks:
        clear(args.out)
        notebooks = release(ROOT / "_build" / ".student-course", args.out / "notebooks")
    else:
        if args.out.resolve() != OUT.resolve() and not (args.out / MADE_HERE).exists():
            raise SystemExit(f"--site-only --out {args.out}: not a folder this command made (no {MADE_HERE} in it)")
        notebooks = [args.out / "notebooks" / path.name for path in chapters()]
        missing = [str(path) for path in notebooks if not path.exists()]
        if missing:
            raise SystemExit(f"--site-only: no student notebooks {missing[:3]}: run with --no-site first")
    if args.site:
        build_site(args.out / "html", notebooks)
    print(f"student notebooks in {args.out / 'notebooks'}" + (f", website in {args.out / 'html'}" if args.site else ""))


if __name__ == "__main__":
    main()
