"""``make student``: the student edition in ``_build/student/``.

1. ``notebooks/``: every chapter as nbgrader's ``generate_assignment`` makes it, after the prose of the gated
   solutions is cut (nbgrader replaces the answers in code cells with ``# YOUR CODE HERE`` /
   ``raise NotImplementedError()``; it knows nothing of sphinx-exercise's gates, so the prose is cut here).
2. ``html/``: the website built with sphinx-exercise's ``hide_solutions`` (solutions, including the code cells of
   gated solutions, are not in the pages nor in the search index); ``_sources/`` and the download button serve the
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

from .exercises import ROOT, chapters, load, save, strip_solution_prose

OUT = ROOT / "_build" / "student"
NBGRADER = ROOT / ".venv-grader" / "bin" / "nbgrader"
CONFIG = Path(__file__).resolve().parent / "nbgrader_config.py"


def nbgrader(course: Path, *args: str) -> None:
    """Run an nbgrader command in ``course`` with this course's config (its venv's bin/ on PATH: nbgrader calls
    alembic)."""
    env = {"PATH": f"{NBGRADER.parent}:/usr/bin:/bin"}
    command = [str(NBGRADER), *args, f"--CourseDirectory.root={course}"]
    subprocess.run(command, check=True, env=env, cwd=course)


def release(course: Path, target: Path) -> list[Path]:
    """Student notebooks of every chapter into ``target`` (one nbgrader assignment per chapter)."""
    shutil.rmtree(course, ignore_errors=True)
    course.mkdir(parents=True)
    shutil.copy(CONFIG, course / "nbgrader_config.py")
    for path in chapters():
        folder = course / "source" / path.stem
        folder.mkdir(parents=True)
        save(strip_solution_prose(load(path)), folder / path.name)
        nbgrader(course, "generate_assignment", path.stem, "--force", "--log-level=WARN")
    target.mkdir(parents=True, exist_ok=True)
    released = []
    for path in chapters():
        shutil.copy(course / "release" / path.stem / path.name, target / path.name)
        released.append(target / path.name)
    return released


def student_config(out: Path) -> Path:
    """_config.yml with solutions hidden, no Colab button and no source links to the full notebooks."""
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["title"] = f"{config['title']} (student edition)"
    config.setdefault("launch_buttons", {})["colab_url"] = ""
    sphinx = config.setdefault("sphinx", {}).setdefault("config", {})
    sphinx["hide_solutions"] = True
    # the executed notebooks (with solutions) are cached by the full build; reuse them instead of running again
    config.setdefault("execute", {})["cache"] = str(ROOT / "_build" / ".jupyter_cache")
    path = out / "_config.yml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


def build_site(out: Path, notebooks: list[Path]) -> None:
    config = student_config(out)
    jupyter_book = Path(sys.executable).parent / "jupyter-book"
    subprocess.run([str(jupyter_book), "build", str(ROOT), "--config", str(config), "--path-output", str(out),
                    "-W", "-n", "--keep-going"], check=True)
    sources = out / "_build" / "html" / "_sources" / "notebooks"
    for path in notebooks:  # the download button serves _sources/: the student notebook, not the full one
        shutil.copy(path, sources / path.name)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m instructor.student", description=__doc__.split("\n")[0])
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--no-site", dest="site", action="store_false", help="the notebooks only")
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    notebooks = release(args.out / "course", args.out / "notebooks")
    if args.site:
        build_site(args.out, notebooks)
        html = args.out / "html"
        shutil.rmtree(html, ignore_errors=True)
        shutil.move(args.out / "_build" / "html", html)
    print(f"student notebooks in {args.out / 'notebooks'}" + (f", website in {args.out / 'html'}" if args.site else ""))


if __name__ == "__main__":
    main()
