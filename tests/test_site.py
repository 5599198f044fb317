"""The built website, as a reader sees it: a headless Chromium, driven by Playwright, with no internet.

The site (``_build/html``, or the folder in $ATTENTION_COURSE_SITE) is served on 127.0.0.1; every request to any
other host is refused. For every page in ``_toc.yml``, of the full and the Chinese editions (the checks here, run by
tests/test_accessibility.py's audit, which opens every page once: :func:`page_problems`, :func:`desktop_problems`,
:func:`phone_problems`, :func:`watch`): no console or page errors, no failed or refused requests, math typeset,
images loaded, internal links and anchors resolve, notebook pages' Colab and download buttons point at their notebook,
no horizontal overflow at a phone's width, no link or button outside the page (above its top, left of its left
edge: no scrolling reaches it) at a phone's width and at 1280 px; at 1280 px, legible at the size shown (every
figure's smallest text at >= 9 CSS px, from the font sizes the build records in its PNG; no code, output line or table
wider than its box).
Here: the site search and the widgets, which must redraw when a control moves (no kernel) and stay accessible in
light and dark mode (named pictures, drawn text at >= 4.5:1, a focus ring at >= 3:1), a solution's prose (the body
of {solution-start}) in its dropdown, the Colab renditions. Screenshots of a page with a problem (of every page with
ATTENTION_COURSE_SCREENSHOTS=1, `make test SCREENSHOTS=1`), at desktop and phone widths, and a report
(``report.json``: requests refused) go to ``_build/screenshots/``.

The browser is Chromium: $CHROMIUM, or chromium / chromium-browser / google-chrome, or Playwright's own download;
without one these tests skip and say how to get one. `make test` builds the site first; run alone, they need `make book`.
"""
import functools
import html
import json
import os
import re
import shutil
import socket
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest
import yaml
from prerequisites import chromium as find_chromium  # $CHROMIUM, or chromium / chromium-browser / google-chrome

ROOT = Path(__file__).resolve().parents[1]
SITE = Path(os.environ.get("ATTENTION_COURSE_SITE", ROOT / "_build" / "html")).resolve()
SCREENSHOTS = ROOT / "_build" / "screenshots"  # this checkout's, wherever the site tested is
EVERY_SCREENSHOT = os.environ.get("ATTENTION_COURSE_SCREENSHOTS") == "1"  # `make test SCREENSHOTS=1`
# The book the site was built from: the folder holding _build/ when it has a _toc.yml (a scratch book), else this repo.
BOOK = SITE.parents[1] if (SITE.parents[1] / "_toc.yml").exists() else ROOT
CONFIG = yaml.safe_load((BOOK / "_config.yml").read_text())
PHONE = {"width": 390, "height": 844}
DESKTOP = {"width": 1280, "height": 900}
TIMEOUT_MS = 60_000  # generous: the machine running the tests may be busy
RENDITIONS = "_colab"  # the site's folder of Colab renditions (book/_ext/colab_rendition.py)

HOW_TO_GET_A_BROWSER = (
    "no Chromium found for the browser tests ($CHROMIUM, chromium, chromium-browser, google-chrome). Install one "
    "(Debian/Ubuntu: `sudo apt-get install chromium`; elsewhere any Chromium or Chrome) or point the CHROMIUM "
    "environment variable at its executable. "
    "(`playwright install chromium` also works where its download is reachable.)"
)
# No request leaves the machine: every one to a host that is not a loopback address goes to a proxy that refuses it
# (OFFLINE: a port of 127.0.0.1 bound by this process and never listened on; Chromium sends loopback requests past a
# proxy, unless told otherwise). The tests see each request as it is made (a listener, :func:`watch`), and flag
# one to any host but the site's. (Routing every request through Playwright instead, to refuse it there, cost a CPU
# second per page loaded: each request stopped, sent to Python and back.)
OFFLINE = socket.socket()
OFFLINE.bind(("127.0.0.1", 0))
CHROMIUM_ARGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
    f"--proxy-server=http://127.0.0.1:{OFFLINE.getsockname()[1]}",
]
WIDGETS = {  # DOM marker (data-ac-widget) -> the anywidget id its embedded state carries
    "mask-broadcast": "attention_course.widgets.mask_broadcast.MaskBroadcastWidget",
    "head-reshape": "attention_course.widgets.head_reshape.HeadReshapeWidget",
    "decode-cache": "attention_course.widgets.decode_cache.DecodeCacheWidget",
}


def toc_pages() -> list[str]:
    """The toc's files in reading order, without extension (book/intro, notebooks/01_scores, ...)."""
    text = (BOOK / "_toc.yml").read_text()
    files = [yaml.safe_load(text)["root"], *re.findall(r"^\s*(?:-\s*)?file:\s*(\S+)", text, re.M)]  # not "# - file:"
    return [re.sub(r"\.(md|ipynb)$", "", f) for f in files]


PAGES = toc_pages()
ZH = "zh/"  # the Chinese edition's folder in the site (book/_ext/i18n.py); its pages are checked as the English ones
EDITION_PAGES = PAGES + [ZH + page for page in PAGES]


def page_html(page: str) -> str:
    path = SITE / f"{page}.html"
    return path.read_text() if path.exists() else ""


def page_title(page: str) -> str:
    match = re.search(r"<title>(.*?)</title>", page_html(page), re.S)
    return html.unescape(match.group(1)) if match else ""


# ------------------------------------------------------------------------------------------------ fixtures
_SHARED = {"users": 0}  # one Playwright per test process: a second sync_playwright() inside the first one fails


def shared_browser():
    """Generator for session fixtures (here and in test_widgets.py): a headless Chromium, or a skip saying how to get one."""
    if not _SHARED["users"]:
        sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is missing: pip install -e '.[dev]'")
        executable = find_chromium()  # None: try Playwright's own download, if `playwright install` made one
        playwright = sync_api.sync_playwright().start()
        try:
            chromium = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS, timeout=TIMEOUT_MS)
        except sync_api.Error as error:
            playwright.stop()
            if executable is None and "Executable doesn't exist" in str(error):
                # `make test` looked for Chromium first: where it found none and was told to go on without
                # (ALLOW_MISSING=1), these tests were skipped before they started; here, it is a failure
                (pytest.fail if "ATTENTION_COURSE_MISSING" in os.environ else pytest.skip)(HOW_TO_GET_A_BROWSER)
            raise
        _SHARED.update(playwright=playwright, browser=chromium)
    _SHARED["users"] += 1
    try:
        yield _SHARED["browser"]
    finally:
        _SHARED["users"] -= 1
        if not _SHARED["users"]:
            _SHARED["browser"].close()
            _SHARED["playwright"].stop()


@pytest.fixture(scope="session")
def browser():
    yield from shared_browser()


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def serve(folder: Path):
    """``folder`` served on 127.0.0.1 by a thread: (the server, to shut down; its "host:port")."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=str(folder)))
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"127.0.0.1:{server.server_address[1]}"


@pytest.fixture(scope="session")
def site(browser):
    """The site served on 127.0.0.1 and a browser context that blocks (and counts) requests to any other host.

    Yields a dict: ``url`` (the site's root URL), ``context``, ``blocked`` (URLs refused).
    """
    if not (SITE / "index.html").exists():
        pytest.fail(f"no built site in {SITE}: run `make book` first (or set ATTENTION_COURSE_SITE to a built site).")
    server, host = serve(SITE)
    state = {"url": f"http://{host}/", "blocked": []}
    context = browser.new_context(viewport=DESKTOP)
    context.set_default_timeout(TIMEOUT_MS)
    context.on("request", lambda request: elsewhere(request.url, host) and state["blocked"].append(request.url))
    state["context"] = context
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)  # emptied once per run by conftest's pytest_sessionstart
    yield state
    context.close()
    server.shutdown()
    report = {"site": str(SITE), "requests_blocked": len(state["blocked"]), "blocked": state["blocked"]}
    worker = os.environ.get("PYTEST_XDIST_WORKER")  # under pytest-xdist, a report per worker
    (SCREENSHOTS / f"report{'-' + worker if worker else ''}.json").write_text(json.dumps(report, indent=1))


def settle(tab):
    """Wait until MathJax has typeset the page and the widget manager has drawn every widget view."""
    tab.evaluate("async () => { if (window.MathJax?.startup?.promise) await window.MathJax.startup.promise; }")
    views = tab.locator('script[type="application/vnd.jupyter.widget-view+json"]').count()
    if views:
        tab.wait_for_function(f"document.querySelectorAll('.widget-subarea > *').length >= {views}")


class Visit:
    """A browser tab on one page of the site, recording every error and failed or blocked request."""

    def __init__(self, site, path):
        self.site, self.path, self.problems = site, path, []
        self.tab = site["context"].new_page()
        tab = self.tab
        tab.on("console", lambda m: m.type == "error" and self.problems.append(f"console error: {m.text}"))
        tab.on("pageerror", lambda error: self.problems.append(f"page error: {error}"))
        tab.on("requestfailed", lambda r: self.problems.append(f"request failed ({r.failure}): {r.url}"))
        tab.on("response", lambda r: r.status >= 400 and self.problems.append(f"HTTP {r.status}: {r.url}"))
        tab.goto(site["url"] + path, wait_until="load")
        self.settle()

    def settle(self):
        settle(self.tab)

    def resize(self, viewport):
        """Show the page at another size, once the theme's transitions (the sidebars folding away) have ended."""
        self.tab.set_viewport_size(viewport)
        self.tab.wait_for_function("document.getAnimations().every((a) => a.playState !== 'running')")

    def close(self):
        self.tab.close()
        return self.problems

    def drain(self) -> list[str]:
        """The problems the tab met since the last call (console errors, failed requests); the tab stays open."""
        problems, self.problems[:] = self.problems[:], []
        return problems


@pytest.fixture
def visit(site):
    visits = []

    def open_page(path):
        visits.append(Visit(site, path))
        return visits[-1]

    yield open_page
    for v in visits:
        if not v.tab.is_closed():
            v.tab.close()


# ------------------------------------------------------------------------------------------------ checks
UNTYPESET_MATH = """() => {
  const pending = [...document.querySelectorAll('.math')].filter((m) => !m.querySelector('mjx-container'));
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT, {
    acceptNode: (n) => n.parentElement.closest('pre, code, script, style, mjx-container, .highlight, textarea')
      ? NodeFilter.FILTER_REJECT : NodeFilter.FILTER_ACCEPT });
  const raw = [];
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const m = n.textContent.match(/\\$[^$\\s][^$]*\\$|\\\\\\(|\\\\\\[|\\\\begin\\{/);
    if (m) raw.push(n.textContent.trim().slice(0, 80));
  }
  return { pending: pending.map((m) => m.textContent.slice(0, 60)), raw };
}"""

BROKEN_IMAGES = """async () => {
  const images = [...document.images];
  images.forEach((img) => { img.loading = 'eager'; });
  await Promise.allSettled(images.map((img) => img.decode()));
  return images.filter((img) => !(img.complete && img.naturalWidth > 0)).map((img) => img.src);
}"""

LINKS = "() => [...document.querySelectorAll('a[href]')].map((a) => a.href)"

OVERFLOW = """(width) => {
  const clipped = (e) => {  // fixed, or inside something that scrolls or clips: not what makes the page wide
    for (let a = e; a && a !== document.body; a = a.parentElement) {
      const style = getComputedStyle(a);
      if (style.position === 'fixed' || (a !== e && style.overflowX !== 'visible')) return true;
    }
    return false;
  };
  return {
    scroll: document.documentElement.scrollWidth,
    culprits: [...document.querySelectorAll('body *')]
      .filter((e) => e.getBoundingClientRect().right > width + 1 && !clipped(e))
      .slice(0, 5).map((e) => e.tagName.toLowerCase() + [...e.classList].map((c) => '.' + c).join('')),
  };
}"""


# Controls no reader can reach by scrolling: a visible link, button or field whose box starts above the page's top or
# left of its left edge (a scrolling box's own content, which scrolling that box reaches, and the skip link, shown on
# focus, apart). The language switch once sat half above the top of every page, stacked over the theme's buttons.
OFF_PAGE = """() => [...document.querySelectorAll('a[href], button, input, select, textarea, summary, [tabindex]')]
  .filter((e) => { const r = e.getBoundingClientRect(), s = getComputedStyle(e);
                   return r.width > 1 && r.height > 1 && s.visibility !== 'hidden' && e.checkVisibility()
                     && !e.closest('.skip-link'); })
  .filter((e) => {
    for (let a = e.parentElement; a && a !== document.body; a = a.parentElement) {
      if (['auto', 'scroll'].includes(getComputedStyle(a).overflowY)) return false;  // reached by scrolling it
    }
    const r = e.getBoundingClientRect();
    return r.top + window.scrollY < -1 || r.left + window.scrollX < -1; })
  .map((e) => { const r = e.getBoundingClientRect();
    return `${e.tagName.toLowerCase()}${[...e.classList].map((c) => '.' + c).join('')} "${(e.innerText || e.getAttribute('aria-label') || e.title || '').trim().slice(0, 30)}" at (${Math.round(r.left + window.scrollX)}, ${Math.round(r.top + window.scrollY)})`; })"""


# Visible search boxes: the sidebar's search field, a header bar's, a bare <input type=search>. Zero-size or hidden
# ones (the theme's mobile copies, the search dialog's field before it opens) do not count.
SEARCH_BOXES = """() => [...document.querySelectorAll('input[type=search], .search-button-field, form.bd-search')]
  .filter((e) => !e.closest('.search-button__wrapper') || e.closest('.search-button__wrapper.show'))
  .filter((e) => { const r = e.getBoundingClientRect(), s = getComputedStyle(e);
                   return r.width > 0 && r.height > 0 && s.visibility !== 'hidden' && s.display !== 'none'; })
  .map((e) => e.tagName.toLowerCase() + [...e.classList].map((c) => '.' + c).join('')
              + ' in ' + (e.closest('[id], header, nav, aside')?.id || e.closest('header, nav, aside')?.tagName || '?'))"""

# Display math and tables wider than the text column they sit in. MathJax's display math is an
# mjx-container[display] (inside a div.math); a table scrolls inside its wrapper, so both are measured against the
# article's text column. Each offender: its text, so that a failure names the equation or table.
WIDER_THAN_TEXT = """(slack) => {
  const column = document.querySelector('article.bd-article') || document.querySelector('main') || document.body;
  const limit = column.getBoundingClientRect().right + slack;
  const describe = (e) => {
    const id = e.closest('[id]')?.id || '';
    const label = (e.closest('div.math') || e).querySelector('.eqno')?.textContent?.replace('#', '').trim() || '';
    const text = (e.getAttribute('aria-label') || e.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 60);
    return `${e.tagName.toLowerCase()}${label ? ' ' + label : ''}${id ? ' #' + id : ''}: ${text}`;
  };
  const wide = [];
  for (const e of document.querySelectorAll('mjx-container[display], div.math, table')) {
    if (e.closest('.cell_output, .output')) continue;  // program output scrolls in its own box
    const box = e.getBoundingClientRect();
    const container = e.parentElement;
    // an equation wider than its own box is cut at the right edge (MathJax's container scrolls, with no visible bar)
    const cut = e.tagName === 'MJX-CONTAINER' && e.scrollWidth > e.clientWidth + slack;
    const tooWide = cut || e.scrollWidth > container.clientWidth + slack || box.right > limit;
    if (tooWide) wide.push(`${describe(e)} (${Math.round(Math.max(e.scrollWidth, box.width))} px in ` +
                          `${container.clientWidth} px)`);
  }
  return wide;
}"""

# Testing machinery that must not reach a reader: nbval's markers (# NBVAL_CHECK_OUTPUT comments in shown code,
# nbval-* tags printed as text). Class names (tag_nbval-...) are not text and do not count.
HARNESS_MARKERS = """() => {
  const text = document.body.innerText;
  return [...text.matchAll(/.{0,30}(NBVAL_\\w*|nbval-[\\w-]*).{0,30}/g)].map((m) => m[0].trim());
}"""

# The column a chapter's text sits in, at desktop widths: the site has one search box there.
DESKTOPS = [DESKTOP, {"width": 1600, "height": 1000}]

# Legible at the size shown (at 1280 px wide; see desktop_problems and figure_problems):
# - figures: every image in a cell's output, as shown (its PNG file, natural width, displayed width);
# - clipped: a <pre> (code, output), a table or a cell's output box in the article whose content is wider than its
#   box (scrollWidth > clientWidth: the reader must scroll, or never sees the end);
# - printed tables: output lines laid out in columns (two spaces or more between words, or '|') wider than their box
#   once printed as they are (outputs wrap on the site, book/_ext/static/attention-course.css, which would hide a
#   table's overflow by breaking its rows).
LEGIBILITY = """() => {
  const article = document.querySelector('article.bd-article') || document.body;
  const where = (e) => (e.closest('section:has(> h1, > h2, > h3, > h4, > h5, > h6)')
    ?.querySelector(':scope > h1, :scope > h2, :scope > h3, :scope > h4, :scope > h5, :scope > h6')?.textContent || '')
    .replace(/#$/, '').replace(/\\s+/g, ' ').trim().slice(0, 50);
  const shownWidth = (img) => {  // in a folded dropdown: the width its box would give it
    let box = img.parentElement;
    while (box && !box.clientWidth) box = box.parentElement;
    return img.getBoundingClientRect().width || Math.min(img.naturalWidth, box ? box.clientWidth : img.naturalWidth);
  };
  const figures = [...article.querySelectorAll('.cell_output img')].map((img) => ({
    src: decodeURIComponent(new URL(img.src).pathname), natural: img.naturalWidth, shown: shownWidth(img),
    where: where(img) }));
  const clipped = [];
  for (const e of article.querySelectorAll('pre, table, .cell_output')) {
    // a table may also stand wider than the box it sits in (which then scrolls); borders are not content
    const [width, box] = e.tagName === 'TABLE' && e.getBoundingClientRect().width > e.parentElement.clientWidth + 1
      ? [e.getBoundingClientRect().width, e.parentElement.clientWidth] : [e.scrollWidth, e.clientWidth];
    if (width > box + 1) clipped.push(`${e.tagName.toLowerCase()} in "${where(e)}" (${Math.round(width)} px in ${box} ` +
      `px): ${e.textContent.trim().split('\\n')[0].slice(0, 60)}`);
  }
  const tables = [];
  const canvas = document.createElement('canvas').getContext('2d');
  for (const pre of article.querySelectorAll('.cell_output pre')) {
    const style = getComputedStyle(pre);
    canvas.font = `${style.fontSize} ${style.fontFamily}`;
    const room = pre.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const wide = pre.textContent.split('\\n').filter((line) => /\\S {2,}\\S|[|│]/.test(line))
      .map((line) => [canvas.measureText(line).width, line]).filter(([width]) => width > room + 1);
    if (wide.length) {
      const [width, line] = wide.reduce((a, b) => (b[0] > a[0] ? b : a));
      tables.push(`printed table in "${where(pre)}": ${wide.length} line(s) wider than its ${Math.round(room)} px, ` +
                  `the widest ${line.length} characters (${Math.round(width)} px): ${line.trim().slice(0, 50)}`);
    }
  }
  return { figures, clipped, tables };
}"""
MIN_TEXT_CSS_PX = 9  # the smallest text a figure may show, in CSS pixels


def text_css_px(points: float, dpi: float, natural_width: float, shown_width: float) -> float:
    """CSS pixels of text drawn at ``points`` in a PNG of ``dpi`` that is ``natural_width`` pixels wide and shown
    ``shown_width`` CSS pixels wide: dpi / 72 PNG pixels per point, scaled as the page scales the picture."""
    return points * dpi / 72 * shown_width / natural_width


def figure_problems(figures: list[dict], site: Path) -> list[str]:
    """Figures whose smallest text is under MIN_TEXT_CSS_PX as shown. ``figures``: dicts with ``src`` (the PNG's
    path on the site), ``natural`` and ``shown`` (its width in PNG pixels and as displayed) and ``where`` (its
    section's title). The font sizes come from the PNG's own tEXt chunks, written when a chapter shows a figure
    (attention_course.plots.record_text_sizes, switched on by book/_ext/legibility.py for the build's kernels): the
    smallest font size matplotlib drew in it, in points, and its dpi."""
    from attention_course.plots import DPI_KEY, TEXT_PT_KEY, png_text

    problems = []
    for n, figure in enumerate(figures, 1):
        name = f"figure {n} ({figure['where']}, {Path(figure['src']).name[:12]})"
        if not figure["natural"]:
            continue  # did not load: test_page says so
        record = png_text((site / figure["src"].lstrip("/")).read_bytes())
        if TEXT_PT_KEY not in record:
            problems.append(f"{name}: no text size recorded in the PNG: was the site built with "
                            "book/_ext/legibility.py (a figure drawn by matplotlib in a chapter)?")
            continue
        if record[TEXT_PT_KEY] == "none":
            continue  # no text in it
        points, dpi = float(record[TEXT_PT_KEY]), float(record[DPI_KEY])
        size = text_css_px(points, dpi, figure["natural"], figure["shown"])
        if size < MIN_TEXT_CSS_PX:
            needed = MIN_TEXT_CSS_PX * 72 / dpi * figure["natural"] / figure["shown"]
            problems.append(
                f"{name}: its smallest text, {points:g} pt at {dpi:g} dpi, shows at {size:.1f} CSS px "
                f"(< {MIN_TEXT_CSS_PX}): the PNG is {figure['natural']} px wide, shown at {figure['shown']:.0f} px; "
                f"draw that text at >= {needed:.1f} pt, or the figure narrower")
    return problems


@functools.lru_cache(maxsize=None)
@functools.lru_cache(maxsize=None)  # a page's ids, read once per run (many links lead to the same pages)
def ids_in(path: Path) -> frozenset:
    text = path.read_text(errors="replace") if path.exists() else ""
    return frozenset(html.unescape(i) for i in re.findall(r'\sid="([^"]+)"', text))


def link_problems(tab, site_url: str, here: str) -> list[str]:
    """Internal links whose file is missing from the site, or whose #anchor is not an id on the target page."""
    problems, here_ids = [], None
    for href in sorted(set(tab.evaluate(LINKS))):
        if not href.startswith(site_url):
            continue  # another host (GitHub, Colab) or mailto: a link, never requested
        parts = urlsplit(href)
        path = unquote(parts.path).lstrip("/") or "index.html"
        target = SITE / path
        if target.is_dir():
            target = target / "index.html"
        if not target.is_file():
            problems.append(f"broken link: {href}")
        elif parts.fragment and target.suffix == ".html":
            anchor = unquote(parts.fragment)
            if target == SITE / here:
                here_ids = here_ids or set(tab.evaluate("() => [...document.querySelectorAll('[id]')].map((e) => e.id)"))
                found = anchor in here_ids
            else:
                found = anchor in ids_in(target)
            if not found:
                problems.append(f"broken anchor: {href}")
    return problems


def colab_rendition_url(page: str, edition: str = "") -> str:
    """Where the Colab button of a chapter opens its rendition: on GitHub, in the branch the site is published to
    (the Chinese edition's, ``edition`` "zh/", in that folder of the site)."""
    repo = CONFIG["repository"]
    branch = CONFIG["sphinx"]["config"].get("colab_rendition_branch", "gh-pages")
    org_repo = urlsplit(repo["url"]).path.strip("/")
    return f"{CONFIG['launch_buttons']['colab_url']}/github/{org_repo}/blob/{branch}/{edition}{RENDITIONS}/{page}.ipynb"


def edition_of(page: str) -> tuple[str, str]:
    """("zh/", "notebooks/03_masks") for a page of the Chinese edition, ("", page) for an English one."""
    return (ZH, page[len(ZH):]) if page.startswith(ZH) else ("", page)


def notebook_button_problems(tab, page: str) -> list[str]:
    """A notebook page's Colab button opens its Colab rendition (published with the site); download serves the source
    (in the Chinese edition, the source translated: the same code cells)."""
    edition, page = edition_of(page)
    source = BOOK / f"{page}.ipynb"
    if not source.exists():
        return []
    colab = colab_rendition_url(page, edition)
    problems = []
    hrefs = tab.evaluate("() => [...document.querySelectorAll('a[href*=\"colab.research.google.com\"]')].map(a => a.href)")
    if not hrefs or any(h != colab for h in hrefs):
        problems.append(f"Colab button: expected {colab}, found {hrefs}")
    if not (SITE / edition / RENDITIONS / f"{page}.ipynb").is_file():
        problems.append(f"Colab button: its notebook {edition}{RENDITIONS}/{page}.ipynb is missing from the site {SITE}")
    downloads = tab.evaluate("() => [...document.querySelectorAll('a.btn-download-source-button')].map(a => a.href)")
    if len(downloads) != 1 or not downloads[0].endswith(f"{edition}_sources/{page}.ipynb"):
        problems.append(f"download button: expected one link to {edition}_sources/{page}.ipynb, found {downloads}")
    else:
        served = SITE / edition / "_sources" / f"{page}.ipynb"
        # the Chinese notebook: its Markdown and alt texts translated, the code the same
        kept = (lambda cells: [c["source"] for c in cells if c["cell_type"] == "code"]) if edition else (lambda cells: cells)
        if not served.exists() or (kept(json.loads(served.read_text())["cells"])
                                   != kept(json.loads(source.read_text())["cells"])):
            problems.append(f"download button: {served} is not the notebook {source}")
    return problems


# ------------------------------------------------------------------------------------------------ tests
def slug(page: str) -> str:
    return page.replace("/", "__")


def elsewhere(url: str, host: str) -> bool:
    """A request over the network (http, https, ws, wss) to any host but ``host`` (refused: CHROMIUM_ARGS)."""
    parts = urlsplit(url)
    return parts.scheme in ("http", "https", "ws", "wss") and parts.netloc != host


# The reader's checks of every page run where the page is open anyway: tests/test_accessibility.py's audit opens
# each page of the full and Chinese editions once, and runs these (page_problems, desktop_problems, phone_problems)
# beside axe: loading and typesetting a page is most of what checking it costs.
def watch(tab, host: str) -> list[str]:
    """The problems ``tab`` meets, as it meets them: console and page errors, failed requests, HTTP errors, and requests
    to any host but ``host`` (refused: the site must work offline). The caller empties the list between pages."""
    problems = []
    tab.on("request", lambda r: elsewhere(r.url, host) and problems.append(f"request to another host, refused: {r.url}"))
    tab.on("console", lambda m: m.type == "error" and problems.append(f"console error: {m.text}"))
    tab.on("pageerror", lambda error: problems.append(f"page error: {error}"))
    tab.on("requestfailed", lambda r: elsewhere(r.url, host) or problems.append(f"request failed ({r.failure}): {r.url}"))
    tab.on("response", lambda r: r.status >= 400 and problems.append(f"HTTP {r.status}: {r.url}"))
    return problems


def page_problems(tab, site_url: str, page: str) -> list[str]:
    """``page`` (a toc page, zh/... in the Chinese edition), open in ``tab`` at 1280 px on the site served at
    ``site_url``: math typeset and no raw TeX, images loaded, links and anchors resolve, the notebook buttons, no
    harness marker, no control outside the page, and the layout at 1280 px (desktop_problems)."""
    math = tab.evaluate(UNTYPESET_MATH)
    problems = [f"math not typeset: {m!r}" for m in math["pending"]]
    problems += [f"raw TeX left in the text: {m!r}" for m in math["raw"]]
    problems += [f"image did not load: {src}" for src in tab.evaluate(BROKEN_IMAGES)]
    problems += link_problems(tab, site_url, f"{page}.html")
    problems += notebook_button_problems(tab, page)
    problems += [f"harness marker visible in the page text: {m!r}" for m in tab.evaluate(HARNESS_MARKERS)]
    problems += [f"a control outside the page at {DESKTOP['width']} px: {c}" for c in tab.evaluate(OFF_PAGE)]
    return problems + desktop_problems(tab, DESKTOP)


def phone_problems(tab) -> list[str]:
    """At a phone's width (the tab shown at PHONE): no horizontal overflow, no control outside the page."""
    overflow = tab.evaluate(OVERFLOW, PHONE["width"])
    problems = [f"a control outside the page at {PHONE['width']} px: {c}" for c in tab.evaluate(OFF_PAGE)]
    if overflow["scroll"] > PHONE["width"]:
        problems.append(f"{overflow['scroll']} px wide at a {PHONE['width']} px phone width; widest: {overflow['culprits']}")
    return problems


def screenshot(tab, name: str) -> None:
    """A full-page picture in the screenshots folder (JPEG: long pages encode several times faster than PNG): of a page
    with a problem, or of every page when asked for (`make test SCREENSHOTS=1`)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    tab.screenshot(path=str(SCREENSHOTS / f"{name}.jpg"), full_page=True, type="jpeg", quality=80)


def desktop_problems(tab, viewport) -> list[str]:
    """At a desktop width (the tab shown at ``viewport``): exactly one visible search box, and no equation or table
    wider than the text column.

    At 1280 px, also legible at the size shown: every figure's smallest text renders at >= MIN_TEXT_CSS_PX CSS px
    (figure_problems: from the font sizes the PNG records, its pixel width and its displayed width), no code, output
    line or table is wider than its box (LEGIBILITY)."""
    problems = []
    boxes = tab.evaluate(SEARCH_BOXES)
    if len(boxes) != 1:
        problems.append(f"{len(boxes)} visible search boxes at {viewport['width']} px, expected 1: {boxes}")
    problems += [f"wider than the text column at {viewport['width']} px: {w}" for w in tab.evaluate(WIDER_THAN_TEXT, 2)]
    if viewport == DESKTOP:
        tab.evaluate(BROKEN_IMAGES)  # every image loaded (natural widths known)
        shown = tab.evaluate(LEGIBILITY)
        problems += [f"illegible at {DESKTOP['width']} px: {p}" for p in figure_problems(shown["figures"], SITE)]
        problems += [f"wider than its box at {DESKTOP['width']} px: {w}" for w in shown["clipped"] + shown["tables"]]
    return problems


def test_a_request_to_another_host_is_refused_and_named(browser, tmp_path):
    """The offline check can fail: a page that loads an image from a named host and a script from an address is
    told of both, and neither loads (the proxy of CHROMIUM_ARGS refuses them before any network)."""
    (tmp_path / "index.html").write_text(
        '<!DOCTYPE html><html lang="en"><head><title>Elsewhere</title>'
        '<script src="http://192.0.2.1/cdn.js"></script></head><body>'
        '<img alt="remote" src="https://cdn.example.com/logo.png"><img alt="local" src="data:image/gif;base64,'
        'R0lGODlhAQABAAAAACH5BAEKAAEALAAAAAABAAEAAAICTAEAOw=="></body></html>')
    server, host = serve(tmp_path)
    tab = browser.new_page()
    try:
        met = watch(tab, host)
        tab.goto(f"http://{host}/index.html", wait_until="load")
        loaded = tab.evaluate("[...document.images].map((i) => i.naturalWidth > 0)")
    finally:
        tab.close()
        server.shutdown()
    assert sorted(problem for problem in met if "another host" in problem) == [
        "request to another host, refused: http://192.0.2.1/cdn.js",
        "request to another host, refused: https://cdn.example.com/logo.png"]
    assert loaded == [False, True]  # the remote image was refused, the inline one shown


GLYPHS = """(chars) => {
  const canvas = document.createElement('canvas');
  canvas.width = canvas.height = 48;
  const g = canvas.getContext('2d');
  return chars.map((c) => {
    g.clearRect(0, 0, 48, 48);
    g.font = '36px sans-serif';
    g.fillText(c, 4, 40);
    return Array.from(g.getImageData(0, 0, 48, 48).data).join(',');
  });
}"""


@pytest.mark.needs("font")
def test_chinese_characters_are_drawn_as_characters_not_boxes(browser):
    """On a Chinese page the browser finds a font with Chinese characters: five different characters of the
    glossary draw five different pictures (without such a font each is the same empty box)."""
    tab = browser.new_page()
    try:
        tab.set_content('<!DOCTYPE html><html lang="zh-CN"><head><title>字</title></head><body></body></html>')
        pictures = tab.evaluate(GLYPHS, ["注", "意", "力", "键", "值"])
    finally:
        tab.close()
    assert len(set(pictures)) == 5, "Chinese characters are drawn alike: no font with Chinese characters here"


def test_toc_pages_exist():
    missing = [page for page in EDITION_PAGES if not (SITE / f"{page}.html").exists()]
    assert not missing, f"pages in _toc.yml missing from the site {SITE}: {missing} (rebuild with `make book`)"


def test_search_finds_the_masks_chapter(site, visit):
    masks = [page for page in PAGES if "mask" in page_title(page).lower()]
    if not masks:
        pytest.skip("no page in _toc.yml has 'mask' in its title yet (the masks chapter, notebooks/03_masks, lands later)")
    v = visit("search.html?q=padding+mask")
    v.tab.wait_for_selector("#search-results .search-summary")
    hits = v.tab.evaluate("() => [...document.querySelectorAll('#search-results ul.search li a')].map(a => a.href)")
    hit_pages = {unquote(urlsplit(h).path).lstrip("/").removesuffix(".html") for h in hits}
    assert hit_pages & set(masks), f"searching 'padding mask' found {sorted(hit_pages)}, not the masks chapter {masks}"
    assert not v.close()


@pytest.mark.parametrize("query", ["掩码", "填充 掩码", "填充掩码"])
def test_chinese_search_finds_the_masks_chapter(site, visit, query):
    """The Chinese edition's search (jieba's words in the index; a query without spaces cut into the index's words
    in the browser, book/_ext/i18n.py) finds chapter 3 for 掩码 (mask) and 填充掩码 (padding mask)."""
    if not (SITE / ZH / "search.html").exists():
        pytest.fail(f"no Chinese edition in {SITE / ZH}: `make book` builds it")
    v = visit(f"{ZH}search.html?q={query}")
    v.tab.wait_for_selector("#search-results .search-summary")
    hits = v.tab.evaluate("() => [...document.querySelectorAll('#search-results ul.search li a')].map(a => a.href)")
    hit_pages = {unquote(urlsplit(h).path).lstrip("/").removesuffix(".html") for h in hits}
    assert f"{ZH}notebooks/03_masks" in hit_pages, f"searching {query!r} found {sorted(hit_pages)}"
    assert not v.close()


# ------------------------------------------------------------------------------------------------ widgets, accessible
def contrast(a, b) -> float:
    """The WCAG 2 contrast ratio of two sRGB colours given as (r, g, b) in 0..255, as a browser reports them (the
    package's ``contrast_ratio``, which the figures use)."""
    def unit(rgb):
        return tuple(min(max(x / 255, 0.0), 1.0) for x in rgb)
    from attention_course.plots import contrast_ratio  # here: pytest-xdist's controller imports this file (for
    #                                                   SCREENSHOTS), and the package imports torch

    return contrast_ratio(unit(a), unit(b))


# Every label and cross drawn in the widgets' pictures (SVG) under `root`, with the colour it is drawn in and the colour
# behind it, as the reader sees them: the rects under its centre composited in document order over the card's
# background (fill, fill-opacity, opacity), and whatever is drawn after it over it too (a translucent shade laid over
# a row tints its text as well as its cells). From the browser's computed styles, so CSS and inline fills count alike.
DRAWN_MARKS = """(root) => {
  const rgba = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const over = (top, alpha, below) => below.map((c, i) => top[i] * alpha + c * (1 - alpha));
  const marks = [];
  for (const svg of root.querySelectorAll('.ac-widget svg')) {
    let card = [255, 255, 255];
    for (let e = svg.parentElement; e; e = e.parentElement) {
      const c = rgba(getComputedStyle(e).backgroundColor);
      if (c && c[3] > 0) { card = over(c, c[3], card); break; }
    }
    const shapes = [...svg.querySelectorAll('rect')].map((r) => {
      const s = getComputedStyle(r), fill = rgba(s.fill);
      return { node: r, box: r.getBoundingClientRect(), fill,
               alpha: fill ? fill[3] * Number(s.fillOpacity) * Number(s.opacity) : 0 };
    }).filter((r) => r.alpha > 0);
    for (const mark of svg.querySelectorAll('text, path.ac-x')) {
      const text = mark.tagName.toLowerCase() === 'text';
      if (text && !mark.textContent.trim()) continue;
      const b = mark.getBoundingClientRect(), x = b.x + b.width / 2, y = b.y + b.height / 2;
      const s = getComputedStyle(mark), paint = rgba(text ? s.fill : s.stroke);
      const alpha = paint[3] * Number(text ? s.fillOpacity : s.strokeOpacity) * Number(s.opacity);
      // the first shape drawn after the mark (shapes are in document order): found by bisection
      let after = 0, end = shapes.length;
      while (after < end) {
        const mid = (after + end) >> 1;
        if (mark.compareDocumentPosition(shapes[mid].node) & Node.DOCUMENT_POSITION_FOLLOWING) end = mid;
        else after = mid + 1;
      }
      let bg = card, fg = null;
      shapes.forEach((r, i) => {
        if (i === after) fg = over(paint, alpha, bg);
        if (x < r.box.left || x > r.box.right || y < r.box.top || y > r.box.bottom) return;
        bg = over(r.fill, r.alpha, bg);
        if (fg !== null) fg = over(r.fill, r.alpha, fg);
      });
      if (fg === null) fg = over(paint, alpha, bg);
      const cell = mark.closest('g.ac-cell');
      marks.push({ kind: text ? 'text' : 'cross', text: mark.textContent, fg, bg, px: parseFloat(s.fontSize),
                   bold: Number(s.fontWeight) >= 700, greyed: Boolean(cell && cell.querySelector('rect.ac-shaded')),
                   picture: svg.getAttribute('aria-label') || '' });
    }
  }
  return marks;
}"""


def low_contrast_marks(tab, root="document") -> tuple[list[str], list[dict]]:
    """(problems, marks) of the widgets' pictures under ``root`` (a JavaScript expression): every drawn label below
    4.5:1 (3:1 if large: >= 24 px, or >= 18.67 px bold) and every cross below 3:1 (a graphic), against what is behind
    it. ``marks``: what DRAWN_MARKS found."""
    # as one JSON string: Playwright's Python side rebuilds a returned object value by value, 5 times slower here
    # (thousands of marks: 0.8 s a call against 0.16 s)
    marks = json.loads(tab.evaluate(f"() => JSON.stringify(({DRAWN_MARKS})({root}))"))
    problems = []
    for m in marks:
        ratio = contrast(m["fg"], m["bg"])
        large = m["px"] >= 24 or (m["bold"] and m["px"] >= 18.66)
        needed = 3 if m["kind"] == "cross" or large else 4.5
        if ratio < needed:
            problems.append(f"{m['kind']} {m['text']!r}{' (greyed row)' if m['greyed'] else ''}: {ratio:.2f}:1 < "
                            f"{needed}:1, {[round(c) for c in m['fg']]} on {[round(c) for c in m['bg']]}, "
                            f"in {m['picture'][:60]!r}")
    return problems, marks


# The keyboard's focus: the focused element's outline, and the colours around it: outside the ring, the first
# ancestor's background that is not transparent; inside it, the same if the ring stands clear of the element
# (outline-offset > 0), else the element's own background.
FOCUS_RING = """() => {
  const e = document.activeElement, s = getComputedStyle(e);
  const rgba = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const p = m[1].split(/[\\s,\\/]+/).filter(Boolean).map(Number); return [p[0], p[1], p[2], p.length > 3 ? p[3] : 1]; };
  const behind = (start) => {
    for (let a = start; a; a = a.parentElement) {
      const c = rgba(getComputedStyle(a).backgroundColor);
      if (c && c[3] > 0) return c.slice(0, 3);
    }
    return [255, 255, 255];
  };
  const offset = parseFloat(s.outlineOffset) || 0;
  const what = e.tagName.toLowerCase() + (e.name ? `[name=${e.name}]` : '')
    + (e.tagName === 'BUTTON' && e.value ? `[value=${e.value}]` : '');
  return { what, inWidget: Boolean(e.closest('.ac-widget')), style: s.outlineStyle, width: parseFloat(s.outlineWidth),
           ring: rgba(s.outlineColor), outside: behind(e.parentElement),
           inside: offset > 0 ? behind(e.parentElement) : behind(e) };
}"""


def focus_ring_problems(tab, widget, mode: str) -> list[str]:
    """Tab through every control of ``widget`` (a locator): each shows a ring >= 2 px wide at >= 3:1 against both
    sides of it. The first control is focused directly, the rest by Tab, as a keyboard user moves (a disabled control,
    such as the decode widget's "previous step" at step 0, is not in the Tab order)."""
    controls = widget.locator(":is(input, button, summary, [tabindex]):visible:not(:disabled)")
    count = controls.count()
    problems = []
    controls.first.focus()
    for n in range(count):
        ring = tab.evaluate(FOCUS_RING)
        if not ring["inWidget"]:
            problems.append(f"{mode}: Tab {n} left the widget ({ring['what']})")
            break
        if ring["style"] in ("none", "hidden") or ring["width"] < 2:
            problems.append(f"{mode}: {ring['what']} has no focus ring ({ring['style']}, {ring['width']} px)")
        else:
            for side in ("outside", "inside"):  # a translucent ring: as drawn over that side's colour
                r, g, b, alpha = ring["ring"]
                ratio = contrast([c * alpha + under * (1 - alpha) for c, under in zip((r, g, b), ring[side])], ring[side])
                if ratio < 3:
                    problems.append(f"{mode}: {ring['what']}'s focus ring {ring['ring']} is {ratio:.2f}:1 against "
                                    f"{ring[side]} ({side} it)")
        tab.keyboard.press("Tab")
    return problems


def picture_words(view) -> dict:
    """What a screen reader gets of a widget's picture: each SVG's role and name, and the live summary."""
    return view.evaluate("""(el) => ({
      pictures: [...el.querySelectorAll('svg')].map((s) => [s.getAttribute('role'), s.getAttribute('aria-label') || '']),
      live: [...el.querySelectorAll('[aria-live=polite]:not(.ac-notice)')].map((n) => n.textContent),
    })""")


def pages_showing(widget: str) -> list[str]:
    return [page for page in PAGES if WIDGETS[widget] in page_html(page)]


def test_every_widget_of_the_package_is_tested_on_the_site():
    import attention_course.widgets as widgets

    exported = {f"{getattr(widgets, name).__module__}.{name}" for name in widgets.__all__}
    assert exported == set(WIDGETS.values())


@pytest.fixture(scope="module")
def widget_page(site):
    """page -> a Visit of it, shared by the two widget tests below: each page that shows a widget is loaded once,
    judged as it loads (test_widgets_are_accessible_on_the_site), then its controls moved
    (test_widget_redraws_without_a_kernel). Each test reads the problems the tab met while it ran (``Visit.drain``)."""
    opened = {}

    def get(page):
        if page not in opened or opened[page].tab.is_closed():
            opened[page] = Visit(site, f"{page}.html")
        return opened[page]

    yield get
    for v in opened.values():
        if not v.tab.is_closed():
            v.tab.close()


@pytest.mark.parametrize("widget", WIDGETS)
def test_widgets_are_accessible_on_the_site(widget_page, widget):
    """Every widget view on the site, in the theme's light and dark modes: each picture is an image with a name, the
    controls' group named by its visible label, every drawn label at >= 4.5:1 against its cell and every cross at
    >= 3:1 (greyed rows included), and a focus ring at >= 3:1 on every control, Tab after Tab."""
    pages = pages_showing(widget)
    assert pages, f"no page in _toc.yml displays the {widget} widget: a widget of the package is shown in a chapter"
    for page in pages:
        v = widget_page(page)
        shown = v.tab.evaluate("document.documentElement.dataset.theme")
        views = v.tab.locator(f".ac-widget[data-ac-widget={widget}]")
        views.first.wait_for()
        problems = []
        for mode in ("light", "dark"):
            v.tab.evaluate("(mode) => { document.documentElement.dataset.theme = mode; }", mode)
            for n in range(views.count()):
                words = picture_words(views.nth(n))
                problems += [f"view {n}: a picture without a role img and a name: {w}" for w in words["pictures"]
                             if w[0] != "img" or len(w[1].split()) < 5]
                for group in views.nth(n).locator("[role=group], [role=radiogroup]").all():
                    label = " ".join(v.tab.locator(f"#{i}").inner_text() for i in
                                     (group.get_attribute("aria-labelledby") or "").split())
                    if not label.strip():
                        problems.append(f"view {n}: a group with no visible label: {group.inner_text()!r}")
            low, marks = low_contrast_marks(v.tab)
            problems += [f"{mode}: {p}" for p in low]
            assert marks, f"{page}: no drawn text found in the {widget} pictures"
            problems += focus_ring_problems(v.tab, views.first, mode)
        v.tab.evaluate("(mode) => { document.documentElement.dataset.theme = mode; }", shown)
        problems += v.drain()
        assert not problems, f"{page}.html, {widget}:\n" + "\n".join(problems[:40])


@pytest.mark.parametrize("widget", WIDGETS)
def test_widget_redraws_without_a_kernel(widget_page, widget):
    pages = pages_showing(widget)
    assert pages, f"no page in _toc.yml displays the {widget} widget: a widget of the package is shown in a chapter"
    for page in pages:
        v = widget_page(page)
        view = v.tab.locator(f".ac-widget[data-ac-widget={widget}]").first
        view.wait_for()
        picture = view.locator(".ac-picture")
        before, state = picture.inner_html(), json.loads(view.get_attribute("data-state"))
        words = picture_words(view)
        if widget == "mask-broadcast" and view.locator("input[name=num_heads]").is_visible():
            heads = view.locator("input[name=num_heads]")
            h = 1 if heads.input_value() == "4" else int(heads.input_value()) + 1
            heads.fill(str(h))
            after = json.loads(view.get_attribute("data-state"))
            assert len(after["per_head_mask"]) == h * len(state["lengths"])
        elif widget == "mask-broadcast":  # chapter 3's widget, before heads exist (show_heads=False): the causal box
            view.locator("input[name=causal]").click()
            after = json.loads(view.get_attribute("data-state"))
            assert after != state, f"{page}: the widget's state did not change when 'causal' was clicked"
        elif widget == "head-reshape":
            other = view.locator("button[name=num_heads][aria-pressed=false]").first
            h = int(other.get_attribute("value"))
            other.click()
            after = json.loads(view.get_attribute("data-state"))
            assert after["shape"]["h"] == h
        else:  # decode-cache: a step back (or forward, from step 0); the cache holds positions 0 to t
            t = len(state["key_positions"]) - 1
            view.locator(f"button[name=step][value={'previous' if t else 'next'}]").click()
            after = json.loads(view.get_attribute("data-state"))
            assert after["key_positions"] == list(range(t if t else 2)), after["key_positions"]
        assert picture.inner_html() != before, f"{page}: the {widget} picture did not change when a control moved"
        # what a screen reader hears follows: the pictures' names and the live summary
        after_words = picture_words(view)
        assert after_words["pictures"] != words["pictures"], f"{page}: the {widget} pictures' names did not change"
        assert len(after_words["live"]) == 1 and after_words["live"] != words["live"], (words["live"], after_words["live"])
        view.screenshot(path=str(SCREENSHOTS / f"widget-{widget}.png"))
        assert not v.drain()


# ------------------------------------------------------------------------------------------------ Colab renditions
NOTEBOOK_PAGES = [page for page in PAGES if (BOOK / f"{page}.ipynb").exists()]
RAW_MYST = re.compile(r"[`:]{3,}\{[\w:-]+\}|^\s*:label:|^\s*:class:|\{(eq|prf:ref|prf:[a-z]+|ref|numref|doc|solution"
                      r"-start|solution-end|exercise)\}|^\s*\([^()\s]+\)=\s*$|\$\$\s*\([^()\s]+\)", re.M)
SOLUTION_TITLE = "#@title Solution (click to show)"


def _cells(notebook, kind):
    return [c for c in notebook["cells"] if c["cell_type"] == kind]


@pytest.mark.parametrize("page", NOTEBOOK_PAGES)
def test_colab_rendition(page):
    """What Colab shows: no MyST syntax left, the notebook's code cells in order, solution code in forms."""
    path = SITE / RENDITIONS / f"{page}.ipynb"
    assert path.is_file(), f"no Colab rendition {path}: rebuild the site (book/_ext/colab_rendition.py writes it)"
    rendition, source = json.loads(path.read_text()), json.loads((BOOK / f"{page}.ipynb").read_text())
    problems = []
    for i, cell in enumerate(_cells(rendition, "markdown")):
        for match in RAW_MYST.finditer("".join(cell["source"])):
            problems.append(f"markdown cell {i}: MyST left: {match.group(0).strip()!r}")
    solution_codes, inside = [], False
    for cell in source["cells"]:  # the source's solution code cells, by the same marks
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            for mark in re.findall(r"\{solution-(start|end)\}", text):
                inside = mark == "start"
        elif cell["cell_type"] == "code":
            solution_codes.append(inside)
    code_out, code_in = _cells(rendition, "code"), _cells(source, "code")
    if len(code_out) != len(code_in):
        problems.append(f"{len(code_out)} code cells, the notebook has {len(code_in)}")
    for k, (out, original, is_solution) in enumerate(zip(code_out, code_in, solution_codes)):
        text, wanted = "".join(out["source"]), "".join(original["source"])
        if is_solution:
            if out["metadata"].get("cellView") != "form" or not text.startswith(SOLUTION_TITLE + "\n"):
                problems.append(f"code cell {k} (a solution) is not a Colab form titled {SOLUTION_TITLE!r}")
            text = text.removeprefix(SOLUTION_TITLE + "\n")
        elif out["metadata"].get("cellView") == "form":
            problems.append(f"code cell {k} is folded away as a form but is no solution")
        if text != wanted:
            problems.append(f"code cell {k} differs from the notebook's: {text[:60]!r} vs {wanted[:60]!r}")
    if code_out and "".join(code_out[0]["source"]) != "".join(code_in[0]["source"]):
        problems.append("the setup cell (first code cell) was changed")
    headings = [c for c in _cells(rendition, "markdown") if "".join(c["source"]).lstrip("#").lstrip().startswith("Solution")]
    if len(headings) != sum(1 for c in _cells(source, "markdown") for _ in re.findall(r"\{solution-start\}", "".join(c["source"]))):
        problems.append(f"{len(headings)} solution headings, one per {{solution-start}} expected")
    collapsed = set(rendition["metadata"].get("colab", {}).get("collapsed_sections", []))
    problems += [f"solution heading {h['id']} is not stored collapsed" for h in headings if h["id"] not in collapsed]
    folded_at = None  # the level of the collapsed heading whose section we are in: Colab hides it up to the next
    for k, cell in enumerate(rendition["cells"]):  # heading as deep or deeper
        opening = re.match(r"(#{1,6}) ", "".join(cell["source"])) if cell["cell_type"] == "markdown" else None
        if opening and (folded_at is None or len(opening.group(1)) <= folded_at):
            folded_at = len(opening.group(1)) if cell["id"] in collapsed else None
        elif folded_at and cell["cell_type"] == "code" and cell["metadata"].get("cellView") != "form":
            problems.append(f"cell {k} ({''.join(cell['source'])[:40]!r}) is no solution but folded away with one")
    assert not problems, f"{RENDITIONS}/{page}.ipynb:\n" + "\n".join(problems)


def test_colab_rendition_numbers_match_the_site():
    """Equations, exercises and theorems carry in the rendition the numbers the website shows."""
    for page in NOTEBOOK_PAGES:
        shown = set(re.findall(r'<span class="eqno">\((\d+\.\d+)\)', page_html(page)))
        shown |= {f"{kind} {n}" for kind, n in
                  re.findall(r'<span class="caption-number">(Exercise|Theorem|Lemma|Definition) (\d+\.\d+) ', page_html(page))}
        text = "\n".join("".join(c["source"]) for c in
                         json.loads((SITE / RENDITIONS / f"{page}.ipynb").read_text())["cells"])
        missing = [n for n in shown if (f"\\tag{{{n}}}" if n[0].isdigit() else n) not in text]
        assert not missing, f"{RENDITIONS}/{page}.ipynb lacks the site's numbers {sorted(missing)}"


def test_rendition_of_a_hand_made_notebook():
    """The converter alone (book/_ext/colab_rendition.py), on MyST of every kind the chapters use."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("colab_rendition", ROOT / "book" / "_ext" / "colab_rendition.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    md = lambda text: {"cell_type": "markdown", "id": f"m{len(text)}", "metadata": {}, "source": text}  # noqa: E731
    code = lambda text: {"cell_type": "code", "id": f"c{len(text)}", "metadata": {}, "source": text,  # noqa: E731
                         "outputs": [], "execution_count": None}
    source = {"metadata": {}, "nbformat": 4, "nbformat_minor": 5, "cells": [
        md("# Scores\n\n(sec-a)=\n## Exercises\n\n$$\na = b\n$$ (eq-a)\n\n```{prf:theorem} Law\n:label: thm-a\n\n"
           "True by {eq}`eq-a`.\n```\n\n```{prf:proof}\nClear.\n```\n\n:::{note}\nMind {prf:ref}`the law <thm-a>`.\n:::"),
        code("import sys  # setup"),
        md("```{exercise} Do it\n:label: ex-a\n\nSee [softmax](02_softmax.ipynb#eq-b) and {doc}`02_softmax`.\n```"),
        md("```{solution-start} ex-a\n:class: dropdown\n```\n\nAs {prf:ref}`thm-a` says."),
        code("def answer():\n    return 1"),
        md("```{solution-end}\n```\n\n## Summary\n\n{ref}`sec-a`, {eq}`eq-a`.")]}
    ctx = module.Context({"eq-a": "(1.1)", "thm-a": "Theorem 1.1", "ex-a": "Exercise 1.1", "sec-a": "Exercises"},
                         {"02_softmax": "From scores"}, lambda name: f"https://colab.example/{name}.ipynb", "1")
    out = module.render_notebook(source, ctx)
    text = "\n---\n".join("".join(c["source"]) for c in out["cells"])
    for expected in ["# 1. Scores", "$$\na = b\n\\tag{1.1}\n$$", "**Theorem 1.1 (Law).** True by (1.1).",
                     "**Proof.** Clear. ∎", "> **Note**\n>\n> Mind the law.", "### Exercise 1.1 (Do it)",
                     "[softmax](https://colab.example/02_softmax.ipynb)",
                     "[From scores](https://colab.example/02_softmax.ipynb)",
                     "### Solution to Exercise 1.1 (click to show)", "As Theorem 1.1 says.", "Exercises, (1.1)."]:
        assert expected in text, f"{expected!r} not in the rendition:\n{text}"
    assert not RAW_MYST.search(text), RAW_MYST.search(text)
    assert "(continued)" not in text  # the text after the solution opens with a heading of its own
    codes = [c for c in out["cells"] if c["cell_type"] == "code"]
    assert ["".join(c["source"]) for c in codes] == ["import sys  # setup", f"{SOLUTION_TITLE}\ndef answer():\n    return 1"]
    assert codes[1]["metadata"]["cellView"] == "form" and "cellView" not in codes[0]["metadata"]
    heading = next(c for c in out["cells"] if "".join(c["source"]).startswith("### Solution"))
    assert out["metadata"]["colab"]["collapsed_sections"] == [heading["id"]]
    assert RAW_MYST.search("```{exercise} x\n:label: y\n```") and RAW_MYST.search("see {eq}`a`")


# ------------------------------------------------------------------------------------------------ legibility, alone
def planted_figure(folder: Path, name: str, width_in: float, points: float, dpi: int = 100, record=True) -> str:
    """A PNG as a chapter would show it: ``width_in`` inches wide at ``dpi``, its smallest text ``points`` tall."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from IPython.core.pylabtools import print_figure

    from attention_course.plots import DPI_KEY, TEXT_PT_KEY, with_png_text

    fig, ax = plt.subplots(figsize=(width_in, 2), dpi=dpi)
    ax.set_title("a title", fontsize=14)
    ax.set_xlabel("the smallest label", fontsize=points)
    png = print_figure(fig, fmt="png", bbox_inches=None)
    plt.close(fig)
    if record:
        png = with_png_text(png, {TEXT_PT_KEY: f"{points:g}", DPI_KEY: str(dpi)})
    (folder / "_images").mkdir(exist_ok=True)
    (folder / "_images" / name).write_bytes(png)
    return f"/_images/{name}"


def test_text_css_px():
    assert text_css_px(9, 72, 500, 500) == 9  # 72 dpi: a point is a pixel
    assert text_css_px(10, 100, 1396, 688) == pytest.approx(6.85, abs=0.01)  # chapter 2's training figure, before
    assert text_css_px(8, 100, 600, 600) == pytest.approx(11.11, abs=0.01)  # shown at its own size


def test_a_planted_oversized_figure_fails(tmp_path):
    """1396 px wide (13.96 in at 100 dpi) shown at 688 px: its 8 pt labels come out at 5.5 CSS px."""
    wide = planted_figure(tmp_path, "wide.png", 13.96, 8)
    fits = planted_figure(tmp_path, "fits.png", 6.5, 8)  # 650 px: shown at its own size, 11.1 px
    bare = planted_figure(tmp_path, "bare.png", 6.5, 8, record=False)
    figures = [{"src": src, "natural": natural, "shown": min(natural, 688), "where": "2.6. Training"}
               for src, natural in ((wide, 1396), (fits, 650), (bare, 650))]
    problems = figure_problems(figures, tmp_path)
    assert len(problems) == 2, problems
    assert problems[0].startswith("figure 1 (2.6. Training, wide.png)") and "8 pt at 100 dpi, shows at 5.5 CSS px" in problems[0]
    assert "draw that text at >= 13.1 pt" in problems[0]
    assert problems[1].startswith("figure 3") and "no text size recorded" in problems[1]
    assert figure_problems(figures[1:2], tmp_path) == []


def test_an_equation_cut_at_its_right_edge_is_found(browser):
    """The check of desktop_problems, on a planted page: a display equation whose content is wider than its box
    (MathJax's container scrolls it, with no bar a reader sees: equation (12.1) was cut so at 1280 px) is named; one
    that fits is not."""
    tab = browser.new_page(viewport=DESKTOP)
    try:
        tab.set_content(
            '<article class="bd-article" style="width: 600px"><div class="math">'
            '<mjx-container display="true" style="display: block; overflow-x: auto; width: 500px">'
            '<span style="display: inline-block; width: 540px">cut</span></mjx-container></div>'
            '<div class="math"><mjx-container display="true" style="display: block; overflow-x: auto; width: 500px">'
            '<span style="display: inline-block; width: 480px">fits</span></mjx-container></div></article>')
        wide = tab.evaluate(WIDER_THAN_TEXT, 2)
    finally:
        tab.close()
    assert len(wide) == 1 and "cut" in wide[0] and "540 px in" in wide[0], wide


# ------------------------------------------------------------------------------------------------ a solution's body
FIXTURE = ROOT / "tests" / "fixtures" / "solution_in_body.ipynb"  # chapter 3's Ex. 3.2, its prose in the body
FIXTURE_PROSE = "Fill with"  # the first words of that body


def fixture_site(out: Path, student: bool):
    """The fixture built by Sphinx (a process of its own, started now) with the book's MyST extensions,
    sphinx-exercise and book/_ext/exercise_tools.py, not executed: a function that waits for it and returns the
    page's HTML."""
    import shutil
    import subprocess
    import sys as _sys

    src = out / "src"
    src.mkdir(parents=True)
    shutil.copy(FIXTURE, src / "index.ipynb")
    (src / "conf.py").write_text(
        f"import sys\nsys.path.insert(0, {str(ROOT / 'book' / '_ext')!r})\n"
        "extensions = ['myst_nb', 'sphinx_exercise', 'exercise_tools']\nnb_execution_mode = 'off'\n"
        f"myst_enable_extensions = {CONFIG['parse']['myst_enable_extensions']!r}\nstudent_edition = {student}\n")
    build = subprocess.Popen([_sys.executable, "-m", "sphinx", "-b", "html", "-W", "-q", "-E", str(src), str(out / "html")],
                             stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def page() -> str:
        log = build.communicate(timeout=300)[0]
        assert build.returncode == 0, log
        return (out / "html" / "index.html").read_text()

    return page


def test_a_solution_body_folds_on_the_site_and_leaves_the_student_edition(tmp_path):
    """The start directive's body opens the dropdown, before the solution's code; the student edition has neither."""
    from bs4 import BeautifulSoup

    full, student = fixture_site(tmp_path / "full", student=False), fixture_site(tmp_path / "student", student=True)
    page = BeautifulSoup(full(), "html.parser")
    solution = page.select_one("div.solution.dropdown")
    assert solution is not None, "no solution dropdown on the page"
    content = solution.select_one("#solution-content")
    blocks = [child for child in content.children if getattr(child, "name", None)]
    assert blocks[0].name == "p" and blocks[0].get_text().startswith(FIXTURE_PROSE), blocks[:2]
    assert blocks[1].name == "ul" and "$0 / 0$" not in blocks[1].get_text() and "0 / 0" in blocks[1].get_text()
    assert "cell" in blocks[2].get("class", []) and "my_masked_softmax" in blocks[2].get_text()
    outside = page.get_text().replace(solution.get_text(), "")
    assert FIXTURE_PROSE not in outside and "def my_masked_softmax" not in outside
    student = student()
    assert FIXTURE_PROSE not in student and "def my_masked_softmax" not in student and "Masked softmax" in student


def test_a_solution_body_in_the_colab_rendition():
    """Colab: the body is a Markdown cell right under the collapsed "Solution to ..." heading, before the code form."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("colab_rendition", ROOT / "book" / "_ext" / "colab_rendition.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    ctx = module.Context({"ex-ch3-masked-softmax": "Exercise 3.2"}, chapter="3")
    out = module.render_notebook(json.loads(FIXTURE.read_text()), ctx)
    texts = ["".join(c["source"]) for c in out["cells"]]
    at = texts.index("## Solution to Exercise 3.2 (click to show)")
    assert out["cells"][at]["id"] in out["metadata"]["colab"]["collapsed_sections"]
    body = texts[at + 1]
    assert body.startswith(FIXTURE_PROSE) and "`-inf`" in body and "$0 / 0$" in body
    assert "solution-start" not in body and ":class:" not in body and not RAW_MYST.search(body)
    assert out["cells"][at + 2]["metadata"]["cellView"] == "form"
    assert texts[at + 2].startswith(SOLUTION_TITLE + "\ndef my_masked_softmax")
    assert texts[at + 3:at + 5] == ["## Exercise 3.2 (continued)", "A query whose keys are all masked gets a row of zeros:"]
    assert out["cells"][at + 3]["id"] not in out["metadata"]["colab"]["collapsed_sections"]  # not folded away


@pytest.mark.parametrize("page", NOTEBOOK_PAGES)
def test_solution_bodies_are_in_their_dropdowns(page):
    """On the built site: the prose in each {solution-start}'s body stands in that solution's dropdown."""
    import lxml.html

    import sys as _sys
    _sys.path.insert(0, str(ROOT))
    from instructor.exercises import START

    source = json.loads((BOOK / f"{page}.ipynb").read_text())
    bodies = [m["body"] for c in _cells(source, "markdown") for m in START.finditer("".join(c["source"]))]
    html_text = page_html(page)
    shown = len(re.findall(r'<div class="solution[ "]', html_text))
    assert shown == len(bodies), f"{shown} solutions on the page, {len(bodies)} in the notebook"
    if not any(body.strip() for body in bodies):
        return
    # lxml's parser (C) reads a chapter's page in 50 ms, BeautifulSoup's html.parser in 1.5 s
    dropdowns = lxml.html.fromstring(html_text).xpath('//div[contains(concat(" ", @class, " "), " solution ")]')
    for n, (body, dropdown) in enumerate(zip(bodies, dropdowns), 1):
        words = re.findall(r"[A-Za-z]{4,}", re.sub(r"\$[^$]*\$|`[^`]*`|\]\([^)]*\)", " ", body))[:6]  # no math, code, URLs
        text = " ".join(dropdown.text_content().split())
        missing = [w for w in words if w not in text]
        assert not missing, f"{page} solution {n}: its body's words {missing} are not in its dropdown"
