"""What `make book` and `make test` need that `make` cannot install, looked for before anything is built or run.

    python3 tests/prerequisites.py book|test [--allow-missing]   say what is missing, with the command that
                                                                 installs it; exit 2 unless --allow-missing
    python3 tests/prerequisites.py --names [book|test]           the missing pieces' names, on one line

Standard library only, any Python 3: it runs before the project's environment exists. tests/conftest.py imports it
to skip, and list at the end of the run, the tests that need a piece that is missing (``make test ALLOW_MISSING=1``).
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def chromium() -> str | None:
    """$CHROMIUM, else the first of chromium, chromium-browser, google-chrome on PATH or in /usr/bin."""
    if os.environ.get("CHROMIUM"):
        return shutil.which(os.environ["CHROMIUM"])  # None when it names no executable
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            return path
    return None


def _bwrap() -> str | None:
    """Whether bwrap runs the sandbox grading builds (instructor/sandbox.py, standard library only)."""
    sys.path.insert(0, str(ROOT))
    from instructor import sandbox

    return sandbox.available()


def _font() -> str | None:
    if shutil.which("fc-list") is None:
        return "no fontconfig (fc-list) to ask"
    run = subprocess.run(["fc-list", ":lang=zh", "family"], capture_output=True, text=True)
    return None if run.stdout.strip() else "no font with Chinese characters"


def _npm() -> str | None:
    if shutil.which("npm") or (ROOT / "book" / "_vendor" / "PINS.json").exists():
        return None  # fetched once into book/_vendor/; npm is needed again only when the pins change
    return "not installed (and book/_vendor/ not fetched yet)"


def _chromium() -> str | None:
    if chromium():
        return None
    return f"$CHROMIUM names no executable ({os.environ['CHROMIUM']})" if os.environ.get("CHROMIUM") else "not found"


# name: (probe, who needs it, what installs it)
PIECES = {
    "npm": (_npm, ("book", "test"), "the build fetches the site's offline assets (MathJax, the widget manager) and "
            "the tests' axe-core with it, once", "sudo apt-get install npm"),
    "chromium": (_chromium, ("test",), "the browser tests (every page as a reader sees it, accessibility, widgets)",
                 "sudo apt-get install chromium   (or point CHROMIUM at another Chromium or Chrome: "
                 "make test CHROMIUM=/path/to/chrome)"),
    "font": (_font, ("book", "test"), "the Chinese edition's figures (matplotlib draws their words with it: "
             "book/_ext/zh_figures.py) and the Chinese pages in the browser: without a font with Chinese characters "
             "they are drawn as empty boxes", "sudo apt-get install fonts-wqy-microhei   (or fonts-noto-cjk)"),
    "bwrap": (_bwrap, ("test",), "the grading tests: submissions and check servers run in bubblewrap's sandbox",
              "sudo apt-get install bubblewrap"),
}


def missing(command: str = "test") -> dict[str, str]:
    """{piece: why} for each piece ``command`` needs that is not here."""
    found = {}
    for name, (probe, commands, _, _) in PIECES.items():
        if command in commands:
            why = probe()
            if why:
                found[name] = why
    return found


def explain(found: dict[str, str]) -> str:
    lines = []
    for name, why in found.items():
        _, _, used, install = PIECES[name]
        lines.append(f"  {name}: {why}.\n      needed by {used}.\n      install: {install}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--names"]:
        print(" ".join(missing(argv[1] if len(argv) > 1 else "test")))
        return 0
    command = argv[0] if argv and argv[0] in ("book", "test") else "test"
    found = missing(command)
    if not found:
        return 0
    text = explain(found)
    if "--allow-missing" in argv:
        print(f"make {command} ALLOW_MISSING=1: running what it can without\n{text}\n"
              f"The tests that need a missing piece are skipped, and listed at the end of the run.", flush=True)
        return 0
    print(f"make {command} needs what make cannot install, and this machine lacks it:\n{text}\n"
          f"Install it and run make {command} again"
          + (", or run what can run without it: make test ALLOW_MISSING=1 (the tests that need a missing piece "
             "are skipped and listed at the end)." if command == "test" else "."), file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
