"""Sphinx extension (``local_extensions`` in _config.yml): two of the theme's controls, named as they read.

WCAG 2.5.3 (Label in Name) wants a control's accessible name to contain the text it shows, so that a reader who
speaks to the computer can say what they see. pydata-sphinx-theme 0.17 breaks it twice, and ``templates/`` holds
our versions of its two templates (found before the theme's own, which sit later in ``templates_path``):

- ``search-button-field.html``, the sidebar's search button, shows "Search Ctrl+K" but was named "Search" by an
  ``aria-label``; without it the button is named by what it shows, and ``aria-keyshortcuts`` states the shortcut.
- ``theme-switcher.html``, the colour-mode button, is named "Color mode" and shows an icon, but Font Awesome turns
  each icon's ``title`` ("Light", "Dark", ...) into an SVG ``<title>``, text inside the button that is not in its
  name; the icons lose their titles (the button keeps its name and its "Color mode" tooltip).

The theme's colours and focus rings that fell short are fixed in ``static/attention-course.css``;
tests/test_accessibility.py runs axe-core on every page of both editions.
"""
from __future__ import annotations

from pathlib import Path

TEMPLATES = Path(__file__).resolve().parent / "templates"


def templates_first(app, config) -> None:
    if str(TEMPLATES) not in config.templates_path:
        config.templates_path.insert(0, str(TEMPLATES))


def setup(app):
    app.connect("config-inited", templates_first)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
