"""Interactive pictures for the chapters, as anywidget widgets.

Each widget is one anywidget model: its controls and its picture are drawn in the browser by a small ES module
(``*.js`` beside this file) from the widget's traits alone. So the picture redraws when a control moves in
Jupyter and Colab, and also on the static website, where no kernel runs. The Python side computes the same
numbers with torch (``widget.state``) for tests and for cells that assert on them, and ``widget.figure()`` draws
a static matplotlib picture of the current settings.

>>> w = MaskBroadcastWidget(lengths=(5, 3, 2), causal=True)   # display(w) in a notebook
>>> w.state["combined_mask"][2][0]                             # sentence 2, query 0: pads and future blocked
[False, True, True, True, True]
>>> w.update(batch_size=2, lengths=[4, 1])                     # several settings at once: one redraw

Change settings with ``w.update(...)`` (or one trait at a time, ``w.causal = False``), not ``w.set_state(...)``:
that is ipywidgets' handler for messages from the browser, and on ipywidgets 7 (Colab) it never redraws.
"""
from .decode_cache import DecodeCacheWidget
from .head_reshape import HeadReshapeWidget
from .mask_broadcast import MaskBroadcastWidget

__all__ = ["DecodeCacheWidget", "HeadReshapeWidget", "MaskBroadcastWidget"]
