"""Colab's runtime, for `make test-colab` (README, "Versions"): the versions Colab publishes (locks/colab.txt), and a
check of what a chapter's setup cell downloads there.

    python tests/colab.py python locks/colab.txt                   the Python of that runtime ("3.13")
    python tests/colab.py environment FREEZE locks/colab.txt        the environment (pip list --format=freeze) holds
                                                                    every version the file pins
    python tests/colab.py installed REPORT locks/colab.txt          the setup cell's pip install, from pip's --report:
                                                                    what it downloads; fails if it replaced any
                                                                    version the file pins (a torch, a transformers)

Standard library only: it runs with make's Python, before any environment of the course exists.
"""
import json
import re
import sys
from pathlib import Path


def canonical(name: str) -> str:
    """A distribution's name as pip compares names (PEP 503): case and runs of -_. do not matter."""
    return re.sub(r"[-_.]+", "-", name).lower()


def pinned(path) -> tuple[str, dict[str, str]]:
    """(python, {name: version}) from a versions file: ``# python: 3.13`` and lines ``name==version``."""
    python, pins = None, {}
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        found = re.fullmatch(r"#\s*python:\s*(\d+\.\d+)\s*", line)
        if found:
            python = found.group(1)
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        name, sep, version = line.partition("==")
        if not sep or not name.strip() or not version.strip():
            raise ValueError(f"{path}, line {number}: expected name==version, got {line!r}")
        pins[canonical(name.strip())] = version.strip()
    if python is None:
        raise ValueError(f"{path}: no '# python: X.Y' line (the Python of the runtime)")
    return python, pins


def replaced(report: dict, pins: dict[str, str]) -> tuple[list[str], list[str]]:
    """(what pip's report installs, what of it replaces a pinned version): each as 'name version'."""
    installs, clashes = [], []
    for entry in report.get("install", []):
        name, version = entry["metadata"]["name"], entry["metadata"]["version"]
        installs.append(f"{name} {version}")
        if canonical(name) in pins:
            clashes.append(f"{name} {pins[canonical(name)]} -> {version}")
    return installs, clashes


def missing(freeze: str, pins: dict[str, str]) -> list[str]:
    """The pins a freeze (lines name==version) does not hold: 'name version (found: ...)'."""
    found = {}
    for line in freeze.splitlines():
        name, sep, version = line.strip().partition("==")
        if sep:
            found[canonical(name)] = version
    return [f"{name} {version} (found: {found.get(name, 'none')})" for name, version in sorted(pins.items())
            if found.get(name) != version]


def main(argv: list[str]) -> int:
    if len(argv) == 2 and argv[0] == "python":
        print(pinned(argv[1])[0])
        return 0
    if len(argv) == 3 and argv[0] == "environment":
        _, pins = pinned(argv[2])
        wrong = missing(Path(argv[1]).read_text(), pins)
        if wrong:
            print(f"The environment does not hold what {argv[2]} pins: {'; '.join(wrong)}.")
            return 1
        print(f"The environment holds every version {argv[2]} pins ({len(pins)} distributions).")
        return 0
    if len(argv) == 3 and argv[0] == "installed":
        _, pins = pinned(argv[2])
        installs, clashes = replaced(json.loads(Path(argv[1]).read_text()), pins)
        print(f"The setup cell's pip install installs {len(installs)} distributions: {', '.join(installs)}.")
        if clashes:
            print(f"It replaced what Colab ships ({argv[2]}): {'; '.join(clashes)}. A requirement's floor is above "
                  f"Colab's version: lower it to at most Colab's (requirements.txt), or make the chapter that needs "
                  f"more say so in its first cell.")
            return 1
        print(f"It kept every version of {argv[2]} ({len(pins)} distributions, torch {pins.get('torch', '?')} and "
              f"transformers {pins.get('transformers', '?')} among them).")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
