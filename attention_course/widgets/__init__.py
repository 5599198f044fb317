"""Interactive pictures for the chapters, as anywidget widgets.

Each widget is one anywidget model: its controls and its picture are drawn in the browser by a small ES module
(``*.js`` beside this file) from the widget's traits alone. So the picture redraws when a control moves in
Jupyter and Colab, and also on the static website, where no kernel runs. The Python side computes the same
numbers with torch (``widget.state``) for tests and for cells that assert on them, and ``widget.figure()`` draws
a static matplotlib picture of the current settings.

>>> w = MaskBroadcastWidget(lengths=(5, 3, 2), causal=True)   # display(w) in a notebook
>>> w.state["combined_mask"][2][0]                             # sentence 2, query 0: pads and future blocked
[False, True, True, True, True]
"""
from .head_reshape import HeadReshapeWidget
from .mask_broadcast import MaskBroadcastWidget

__all__ = ["HeadReshapeWidget", "MaskBroadcastWidget"]
