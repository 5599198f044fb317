"""What both widgets share: their front-end files and range checks with a learner-friendly message."""
from pathlib import Path

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
