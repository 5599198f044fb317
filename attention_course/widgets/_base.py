"""What both widgets share: their front-end files, range checks with a learner-friendly message, and ``update``."""
from pathlib import Path

import anywidget
import traitlets

HERE = Path(__file__).parent
CSS = (HERE / "widgets.css").read_text()


def esm(name: str) -> str:
    """The ES module ``name`` beside this file, after the helpers of ``_common.js`` (read once, at import)."""
    return (HERE / "_common.js").read_text() + "\n" + (HERE / name).read_text()


def check_range(value: int, name: str, low: int, high: int, hint: str = "") -> int:
    """``value`` if it is an int in [low, high], else a TraitError saying what was expected."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise traitlets.TraitError(f"{name} must be an integer from {low} to {high}, got {value!r}. {hint}".rstrip())
    return value


def call(settings: dict) -> str:
    """``w.update(a=1, b=[2, 3])``: the call a hint tells the learner to make."""
    return "w.update(" + ", ".join(f"{name}={value!r}" for name, value in settings.items()) + ")"


class CourseWidget(anywidget.AnyWidget):
    """An anywidget whose settings (the traits named in ``SETTINGS``) change together with :meth:`update`."""

    SETTINGS: tuple[str, ...] = ()

    def update(self, **settings) -> None:
        """Change several settings at once, e.g. ``w.update(batch_size=2, lengths=[4, 1])``; the picture redraws.

        The values are checked together, after all are in place: a combination that is valid only as a whole
        (a new batch size with its lengths, a new D with its h) is accepted, and a bad one raises a TraitError
        that names the valid choices and leaves every setting as it was. The changes reach the picture as one
        message, so it never draws a half-changed state.

        Use this, not ``w.set_state(...)``: ``set_state`` is how ipywidgets applies a message *from* the browser,
        so on ipywidgets 7 (Colab, classic Notebook) it changes the Python side without redrawing the picture.
        """
        unknown = [name for name in settings if name not in self.SETTINGS]
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.update() got {', '.join(map(repr, unknown))}, which it does not have; "
                f"its settings are {', '.join(self.SETTINGS)}."
            )
        # hold_trait_notifications: each trait's check runs at the end, on the new values together (and every value
        # is rolled back if one fails); hold_sync: what changed, observers' changes included, goes out in one message.
        with self.hold_sync(), self.hold_trait_notifications():
            for name, value in settings.items():
                setattr(self, name, value)
