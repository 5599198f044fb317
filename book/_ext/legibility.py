"""Sphinx extension (``local_extensions`` in _config.yml): the figures' text sizes, recorded for the site's tests.

Before any notebook runs, it sets ``ATTENTION_COURSE_RECORD_TEXT_SIZES=1`` in the build's environment, which the
kernels it starts inherit: there ``attention_course.plots`` (imported by every chapter's setup cell, through the
package) calls ``record_text_sizes()``, and every matplotlib figure a chapter shows is stored as a PNG that carries
the smallest font size drawn in it (points) and its dpi in two tEXt chunks. tests/test_site.py reads them to check
that the smallest text of every figure is legible at the width the page shows it. The pictures are unchanged, and a
learner's own kernel never sees the variable.
"""
from __future__ import annotations

import os

RECORD_ENV = "ATTENTION_COURSE_RECORD_TEXT_SIZES"  # the same name as attention_course.plots.RECORD_ENV


def setup(app):
    os.environ[RECORD_ENV] = "1"
    return {"parallel_read_safe": True, "parallel_write_safe": True}
