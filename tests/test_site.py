"""The built website, as a reader sees it: a headless Chromium, driven by Playwright, with no internet.

(Placeholder: the browser helpers; the site tests follow.)
"""
import os
import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

HOW_TO_GET_A_BROWSER = (
    "no Chromium found for the browser tests. Install one (Debian/Ubuntu: `sudo apt-get install chromium`; "
    "elsewhere any Chromium or Chrome) or point the CHROMIUM environment variable at its executable. "
    "(`playwright install chromium` also works where its download is reachable.)"
)
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
]


def find_chromium() -> str | None:
    """$CHROMIUM, else the first of chromium, chromium-browser, google-chrome on PATH or in /usr/bin."""
    if os.environ.get("CHROMIUM"):
        return os.environ["CHROMIUM"]
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name) or (f"/usr/bin/{name}" if os.path.exists(f"/usr/bin/{name}") else None)
        if path:
            return path
    return None


@pytest.fixture(scope="session")
def browser():
    """A headless Chromium for the whole session, or a skip that says how to get one."""
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed: pip install -e '.[dev]'")
    executable = find_chromium()
    if executable is None:
        pytest.skip(HOW_TO_GET_A_BROWSER)
    with sync_api.sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=60_000)
        yield chromium
        chromium.close()
