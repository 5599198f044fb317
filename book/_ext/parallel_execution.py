"""The notebooks a build is about to read are executed first, several at a time, into myst-nb's execution cache.

myst-nb (execution mode "cache") executes each notebook when Sphinx reads it, one after the other. Before Sphinx
reads, this extension takes the notebooks it will read whose code the cache does not hold, executes them in a pool
of processes (one per core; longest first, by the cache's record of their last run, or FIRST's order where there is
none; torch on one thread in each),
each in a fresh kernel in the notebook's folder with the build's timeout, exactly as myst-nb would
(``single_nb_execution``), and stores each successful run in the cache. myst-nb then finds every one of them there.
A run that failed is not stored: myst-nb executes that notebook again when it reads it and reports the failure as it
always does (and book/_ext/failed_runs.py keeps it from being served). Nothing changes for a notebook the cache
already holds, or with another execution mode.
"""
from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from sphinx.util import logging

LOGGER = logging.getLogger(__name__)
# The order a fresh clone (CI's) runs the notebooks in, where the cache holds no record of their runs: the longest
# first, as measured there on 2 cores (72351d6: 27.1, 25.7, 22.8, 21.0, 18.9, 15.0, 13.1, 9.4, 8.7, 6.5, 6.0, 5.3 s).
# By file size alone, chapter 8 (its benchmarks: the longest, in a small file) started seventh and chapter 9 eleventh,
# and one kernel ran alone for the last 9 to 10 s; in this order two run to the end (simulated on the runs measured:
# 93.8 -> 90.4 s, 109.9 -> 106.5 s; half their sum is 89.8 and 105.3 s). Only the order changes.
# Chapter 13 (17 s alone here, not measured on CI yet) goes among the longest.
FIRST = ["08_speed", "10_decoding", "11_distributed", "07_bug_clinic", "12_serving", "13_kernels", "09_capstone",
         "06_multihead", "02_softmax", "03_masks", "04_self_attention", "05_heads", "01_scores"]


def one_thread():
    """A pool process's kernels run torch on one thread: a kernel per core, each with a thread per core, oversubscribed
    the cores (the notebooks took 118 s on 2 cores, 103 s this way). An explicit OMP_NUM_THREADS is kept."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def execute(path: str, notebook, timeout: int, allow_errors: bool):
    """In a pool process: (path, the executed notebook or None, seconds, the error's traceback or None)."""
    from jupyter_cache.executors.utils import single_nb_execution

    result = single_nb_execution(notebook, cwd=str(Path(path).parent), allow_errors=allow_errors, timeout=timeout,
                                 meta_override=True)
    if result.err is not None:
        return path, None, result.time, result.exc_string
    return path, notebook, result.time, None


def pending(app, env, docnames):
    """(path, notebook as myst-nb reads it) of each document to read that is a notebook the cache has not run."""
    from jupyter_cache import get_cache
    from myst_nb.core.read import create_nb_reader

    cache = get_cache(env.mystnb_config.execution_cache_path or ".jupyter_cache")
    found = []
    for docname in docnames:
        path = str(env.doc2path(docname))
        if not path.endswith(".ipynb"):
            continue
        reader = create_nb_reader(path, env.myst_config, env.mystnb_config, Path(path).read_text(encoding="utf8"))
        notebook = reader.read(Path(path).read_text(encoding="utf8"))
        if env.mystnb_config.metadata_key in notebook.metadata:
            continue  # a notebook with its own execution settings: myst-nb's to run
        try:
            cache.match_cache_notebook(notebook)
        except KeyError:
            found.append((path, notebook))
    return cache, found


def last_seconds(cache) -> dict[str, float]:
    """The seconds each notebook's last cached run took, by path (a fresh clone has none)."""
    seconds = {}
    for record in cache.list_cache_records():
        if record.uri and "execution_seconds" in (record.data or {}):
            seconds[record.uri] = record.data["execution_seconds"]
    return seconds


def execute_ahead(app, env, docnames):
    config = env.mystnb_config
    if config.execution_mode != "cache":
        return
    cache, found = pending(app, env, docnames)
    if len(found) < 2:
        return  # myst-nb runs a single notebook as fast
    from jupyter_cache.base import CacheBundleIn

    seconds = last_seconds(cache)
    # longest first: by the cache's record; a notebook without one (never run, never cached: a fresh clone's) counts as
    # longest, and among those FIRST's order holds (a notebook it does not name first), then the larger file first
    rank = {stem: i for i, stem in enumerate(FIRST)}
    found.sort(key=lambda item: (-seconds.get(item[0], float("inf")), rank.get(Path(item[0]).stem, -1),
                                 -Path(item[0]).stat().st_size))
    workers = min(len(found), len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count())
    LOGGER.info("executing %d notebooks, %d at a time: %s", len(found), workers,
                ", ".join(Path(path).stem for path, _ in found))
    start = time.perf_counter()
    # spawn: a fresh interpreter per worker (Sphinx's process holds threads and open files a fork would copy)
    with ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=one_thread) as pool:
        runs = [pool.submit(execute, path, notebook, config.execution_timeout, config.execution_allow_errors)
                for path, notebook in found]
        for run in as_completed(runs):
            path, notebook, took, error = run.result()
            if error is not None:
                LOGGER.info("%s failed (%.1f s); it runs again as it is read", Path(path).name, took)
                continue
            cache.cache_notebook_bundle(CacheBundleIn(notebook, path, data={"execution_seconds": took}),
                                        check_validity=False, overwrite=True)
            LOGGER.info("%s executed in %.1f s", Path(path).name, took)
    LOGGER.info("notebooks executed in %.1f s", time.perf_counter() - start)


def setup(app):
    app.setup_extension("myst_nb")
    app.connect("env-before-read-docs", execute_ahead)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
