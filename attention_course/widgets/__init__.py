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

The words a widget draws and says are English or Chinese (``locale/zh_CN.po``), fixed when it is drawn: the
``language`` argument (``MaskBroadcastWidget(language="zh_CN")``), else $ATTENTION_COURSE_LANGUAGE, else the
notebook's metadata (the Chinese edition's notebooks say ``"attention_course": {"language": "zh_CN"}``; JupyterLab and
Notebook 7 tell the kernel the notebook's path in $JPY_SESSION_NAME), else the page's language (the website's Chinese
pages). Colab does not let the kernel read the notebook: there, ``%env ATTENTION_COURSE_LANGUAGE=zh_CN`` before the
widgets are made, or the argument. What Python raises or prints stays English.
"""
from .decode_cache import DecodeCacheWidget
from .head_reshape import HeadReshapeWidget
from .mask_broadcast import MaskBroadcastWidget

__all__ = ["DecodeCacheWidget", "HeadReshapeWidget", "MaskBroadcastWidget"]
