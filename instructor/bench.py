"""``make grade-bench [STUDENTS=200] [JOBS=n]``: grade a generated class of chapter-3 submissions, and time it.

The class is made from the student edition's chapter 3 (``make student``): a fifth correct, in three styles; the
rest with the chapter's classic mistakes, stubs, a crash, and solutions that run past a cell's time limit, the mix a
real class hands in. Grading is ``make grade`` itself (instructor/grade.py, in the sandbox, ``--jobs``), run once;
printed: the total time (everything included: setting up the course, every notebook, the checks re-run, feedback
and tables), notebooks per minute, and the median time of one notebook's run and of its re-run checks, from
``timings.csv``. A command, not a test: timings depend on the machine and on what else it is doing.
"""
from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from .exercises import ROOT, load, nbgrader

PAD, SOFT = "ex-ch3-padding-mask", "ex-ch3-masked-softmax"
PADS = {
    "arange": "def batch_padding_mask(lengths, max_len):\n"
              "    return (torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None])[:, None, :]\n",
    "loop": "def batch_padding_mask(lengths, max_len):\n"
            "    return torch.stack([torch.arange(max_len) >= n for n in lengths]).unsqueeze(1)\n",
    "off by one": "def batch_padding_mask(lengths, max_len):\n"
                  "    return (torch.arange(max_len)[None, :] > torch.tensor(lengths)[:, None])[:, None, :]\n",
    "inverted": "def batch_padding_mask(lengths, max_len):\n"
                "    return (torch.arange(max_len)[None, :] < torch.tensor(lengths)[:, None])[:, None, :]\n",
    "no query axis": "def batch_padding_mask(lengths, max_len):\n"
                     "    return torch.arange(max_len)[None, :] >= torch.tensor(lengths)[:, None]\n",
    "endless": "def batch_padding_mask(lengths, max_len):\n    while True:\n        pass\n",
}
SOFTS = {
    "masked_fill": "def my_masked_softmax(scores, mask):\n"
                   "    w = torch.softmax(scores.masked_fill(mask, float('-inf')), -1)\n"
                   "    return w.masked_fill(mask.all(-1, keepdim=True), 0.0)\n",
    "where": "def my_masked_softmax(scores, mask):\n"
             "    w = torch.where(mask, -float('inf'), scores).softmax(-1)\n"
             "    return torch.nan_to_num(w, nan=0.0)\n",
    "after": "def my_masked_softmax(scores, mask):\n    return torch.softmax(scores, -1).masked_fill(mask, 0.0)\n",
    "finite fill": "def my_masked_softmax(scores, mask):\n"
                   "    return torch.softmax(scores.masked_fill(mask, -1e4), -1)\n",
    "nan rows": "def my_masked_softmax(scores, mask):\n"
                "    return torch.softmax(scores.masked_fill(mask, float('-inf')), -1)\n",
}
MIX = [("arange", "masked_fill"), ("loop", "where"), ("off by one", "masked_fill"), ("arange", "after"),
       ("inverted", "finite fill"), ("no query axis", "nan rows"), ("arange", "where"), (None, None),
       ("loop", "after"), ("off by one", "nan rows"), ("arange", "finite fill"), (None, "masked_fill"),
       ("arange", "masked_fill"), ("endless", "where"), ("inverted", "after"), ("loop", "masked_fill"),
       ("no query axis", None), ("off by one", "where"), ("arange", "nan rows"), ("crash", "masked_fill")]


def make_class(folder: Path, students: int) -> None:
    released = load(ROOT / "_build" / "student" / "notebooks" / "03_masks.ipynb")
    for number in range(students):
        pad, soft = MIX[number % len(MIX)]
        answers = {PAD: "import os\nos._exit(1)\n" if pad == "crash" else PADS.get(pad), SOFT: SOFTS.get(soft)}
        nb = json.loads(json.dumps(released))
        for cell in nb["cells"]:
            code = answers.get(nbgrader(cell).get("grade_id"))
            if code is not None:
                cell["source"] = code
        (folder / f"student{number:04d}").mkdir(parents=True)
        (folder / f"student{number:04d}" / "03_masks.ipynb").write_text(json.dumps(nb))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m instructor.bench", description=__doc__.split("\n")[0])
    parser.add_argument("--students", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--keep", type=Path, help="grade into this folder and keep it (default: a temporary one)")
    args = parser.parse_args(argv)
    if not (ROOT / "_build" / "student" / "notebooks" / "03_masks.ipynb").exists():
        raise SystemExit("make student first: the class is made from the student edition's chapter 3")
    with tempfile.TemporaryDirectory(prefix="grade-bench-") as scratch:
        root = args.keep or Path(scratch)
        make_class(root / "submissions", args.students)
        start = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "instructor.grade", str(root / "submissions"), "--out",
                              str(root / "grades"), "--jobs", str(args.jobs), "--cell-timeout", "10"], cwd=ROOT)
        total = time.monotonic() - start
        if run.returncode:
            raise SystemExit(f"grading failed (exit status {run.returncode})")
        with (root / "grades" / "timings.csv").open() as f:
            rows = list(csv.DictReader(f))
    notebooks = [float(row["notebook_seconds"]) for row in rows]
    checks = [float(row["checks_seconds"]) for row in rows]
    print(f"\n{args.students} chapter-3 submissions, {args.jobs} jobs, {os.cpu_count()} cores: "
          f"{total / 60:.1f} min in all ({total:.0f} s), {len(rows) / total * 60:.1f} notebooks per minute; "
          f"one notebook: median {statistics.median(notebooks):.1f} s to run it (nbgrader, sandboxed), "
          f"{statistics.median(checks):.2f} s to re-run its checks")


if __name__ == "__main__":
    main()
