"""The built website against WCAG 2.1 AA, in a headless Chromium driven by Playwright (see tests/test_site.py).

axe-core (pinned in book/_ext/offline_site.py and fetched by the build into book/_vendor/tests/, never served on the
site) runs its rules tagged wcag2a, wcag2aa, wcag21a and wcag21aa on every page of ``_toc.yml``, on every edition (the
full site, ``_build/html`` or $ATTENTION_COURSE_SITE, the student edition beside it in ``_build/student/html``, and
the Chinese edition of each in its ``zh/``): the full site in light and dark mode and at 1280 px (desktop) and 390 px
(phone; there the colour rules on the pages that show every kind of element the others show outside their article,
whose colours do not depend on the width: :data:`COLOUR_RULES`; in dark mode only those pages, and the colour rules
alone, since the mode changes colours alone: :data:`STATES`, :data:`BY_MODE`), the colours of code on the pages that
show every colour of code (:func:`code_colour_pages`); the other editions, whose layout, templates and stylesheets
are the full site's and whose content differs (no solutions, Chinese text), in light mode at 1280 px, without the rule
that judges colours alone (:data:`COLOUR_RULES`, half of axe's time): their colours come from the same stylesheets,
byte for byte (asserted), checked on the full site in both modes, once per key of what decides an element's contrast
(:data:`COLOURS_OF`). axe's rule on links in text is replaced by a stricter check, on every page of every edition: each
link in running text is underlined (:data:`LINKS_NOT_UNDERLINED`). No violation allowed. Each page
opens in light mode (stored as the theme's colour-mode button stores it) at 1280 px, then goes to dark mode (the
colour-mode button, clicked), to 390 px, and back to light mode, axe running at each step (see STATES); at 390 px,
outside the pages that show every kind of element the others show outside their article, only the rule that judges
the layout (:data:`LAYOUT_RULES`; the others judge elements, and no rule set by width hides, shows or names one in an
article: :data:`WIDTH_LAYOUT`). Every formula must carry the MathML screen readers read.
Plus the focus indicator of the site's controls: each control reached with Tab (and Shift+Tab from the end) shows one
with a contrast of at least 3:1 against what surrounds it, in both modes.

One browser; two tabs per edition, sharing the pages, reused from page to page, axe injected into each page; one
runs axe while the other gets ready. Every run writes the violations it found, per rule and page, to
``_build/accessibility.json``.
"""
import json
import re
import sys
import time
from collections import Counter, defaultdict

import pytest
from test_site import (DESKTOP, DESKTOPS, EVERY_SCREENSHOT, PAGES, PHONE, ROOT, SITE, TIMEOUT_MS, contrast,
                       desktop_problems, page_problems, phone_problems, screenshot, serve, settle, shared_browser, slug,
                       watch)

sys.path.insert(0, str(ROOT / "book" / "_ext"))
from offline_site import AXE, NPM_INTEGRITY, NPM_PINS  # noqa: E402

TAGS = ["wcag2a", "wcag2aa", "wcag21a", "wcag21aa"]
# The rule that judges the colours the stylesheets give (text against its background), half of axe's time: run on the
# full site only, in each mode; the other editions serve the same stylesheets.
# At the phone's width they run on PHONE_COLOUR_PAGES, which show every kind of element the others show outside their
# article (asserted: a chapter, a page of prose, a formula and code in the page's contents), for
# what that width shows and the desktop's does not (the header's buttons, the drawers): the article's colours do not
# depend on the width, since the only colours the stylesheets set by width are those of WIDTH_COLOURS (asserted),
# none of them in an article. (axe judges a colour against the grid of the whole page: a run on the page outside the
# article costs nearly as much as a run on all of it.)
COLOUR_RULES = ["color-contrast"]
# axe's link-in-text-block (a link in running text told apart from it by more than colour: a style of its own, or a
# contrast of 3:1 with the text) is replaced by a stricter check of our own, LINKS_NOT_UNDERLINED: every such link is
# underlined. Underlines come from the stylesheets alone, set neither by width nor by colour mode (MODE_PROPERTIES,
# WIDTH_COLOURS): one run per page, in light mode at 1280 px, on every edition. The rule took a third of axe's time on
# the full edition (it lays out each block around a link); the check takes milliseconds.
LINK_RULE = "link-in-text-block"
# Running text: neither a heading (its permalink, #) nor a navigation list (nav), whose entries are links alone.
RUNNING_TEXT = "p, li, dd, dt, td, th, blockquote, figcaption, caption"
LINKS_NOT_UNDERLINED = """() => [...document.querySelectorAll('a[href]')].filter((a) => {
  const text = a.textContent.trim();
  if (!text || !a.getClientRects().length || a.closest('nav')
      || getComputedStyle(a).textDecorationLine.includes('underline')) return false;
  let block = a.parentElement;
  while (block && getComputedStyle(block).display.startsWith('inline')) block = block.parentElement;
  return block !== null && block.matches('""" + RUNNING_TEXT + """')
    && block.textContent.replace(/\\s+/g, '').length > text.replace(/\\s+/g, '').length;
}).map((a) => `${a.closest('[id]')?.id ?? ''} ${a.outerHTML.slice(0, 120)}`)"""
PHONE_COLOUR_PAGES = ["notebooks/02_softmax", "notebooks/03_masks", "book/intro"]
# At the phone's width, outside PHONE_COLOUR_PAGES (where every rule runs, for the header's buttons and the drawers),
# the rules whose verdict depends on the layout alone: what scrolls, and so needs a tab stop, depends on the width.
# The others judge elements (names, roles, attributes, what is hidden from whom), and no rule set by width hides,
# shows, names or colours an element an article holds: what the stylesheets set by width there is WIDTH_LAYOUT
# (asserted), so those rules find at 390 px what they found at 1280 px. (color-contrast: COLOUR_RULES, above.)
LAYOUT_RULES = ["scrollable-region-focusable"]
WIDTH_LAYOUT = {"padding", "padding-left", "padding-right", "padding-top", "padding-bottom", "margin", "max-width",
                "font-size", "overflow-wrap", "white-space"}
ARTICLE = "article.bd-article"
WIDTH_COLOURS = {".navbar-expand-sm .offcanvas", ".navbar-expand-md .offcanvas", ".navbar-expand-lg .offcanvas",
                 ".navbar-expand-xl .offcanvas", ".offcanvas-sm", ".offcanvas-sm .offcanvas-body", ".offcanvas-md",
                 ".offcanvas-md .offcanvas-body", ".offcanvas-lg", ".offcanvas-lg .offcanvas-body", ".offcanvas-xl",
                 ".offcanvas-xl .offcanvas-body", ".bd-sidebar-secondary", "label.margin-toggle",
                 ".bd-sidebar-primary.pst-sidebar-hidden", ".bd-sidebar-secondary.hide:not(:hover) .onthispage:after",
                 ".bd-sidebar-secondary.hide:not(:hover) nav.page-toc",
                 "input#pst-primary-sidebar-checkbox:checked~.bd-container .bd-sidebar-primary"}
# The Chinese edition of each (book/_ext/i18n.py) lies in its zh/ folder.
EDITIONS = {"full": SITE, "student": SITE.parent / "student" / "html", "zh": SITE / "zh",
            "zh-student": SITE.parent / "student" / "html" / "zh"}
# The editions whose pages also get the reader's checks (tests/test_site.py's page_problems and phone_problems: links,
# math, images, buttons, layout), in the same visit; the wider desktop's layout on the full edition's pages alone (the
# Chinese pages share their layout). The student editions differ from these by what they leave out.
READER = {"full": "", "zh": "zh/"}
MODES = ["light", "dark"]
WIDTHS = {"desktop": DESKTOP, "phone": PHONE}
# Each page is shown in each mode and at each width, in this order: one change at a time, the width changed twice
# (to the phone's, then to the wider desktop's for the reader's checks; a resize costs twice a change of mode). But in
# dark mode at the phone's width, only PHONE_COLOUR_PAGES: the colour mode changes colours alone (asserted: what the stylesheets set by
# mode), with one exception, the theme's .only-dark and .only-light images (BY_MODE); so the rules that do not judge
# colours find in dark mode what they find in light mode, and run there only on a page that shows such an image.
STATES = [("light", "desktop"), ("dark", "desktop"), ("dark", "phone"), ("light", "phone")]
DARK_PHONE = ("dark", "phone")
# What the theme shows in one colour mode and hides in the other (its images, a logo per mode): a page with one is
# judged by every rule in dark mode too; on any other, dark mode changes colours alone, and only the colour rules
# (COLOUR_RULES) run there.
BY_MODE = ".only-dark, .only-light"
# What the stylesheets may set by colour mode (html[data-theme=...]): colours, and what never hides, shows or names an
# element. Custom properties (--*) only when they hold a colour (MODE_VARIABLE), or are myst-nb's --light and --dark
# switches (empty or initial: they pick one of two colours in var() fallbacks).
MODE_PROPERTIES = {"color", "background", "background-color", "border-color", "border-bottom-color", "box-shadow",
                   "text-shadow", "filter", "fill", "color-scheme", "font-style", "font-weight", "line-height",
                   "padding", "padding-left", "padding-right", "border-radius"}
MODE_VARIABLE = re.compile(r"(#[0-9a-f]{3,8}|rgba?\(|hsla?\(|var\(--|transparent|inherit|none|\b(white|black)\b)", re.I)
# Code: thousands of highlighted tokens on a chapter, half of what color-contrast judges there. Their colours come
# from (the box the block is in, the block's kind, the token's class) alone, CODE_COLOURS: color-contrast judges the
# code of the pages that show every such triple first (code_colour_pages), and leaves out the code of the others.
REPORT = SITE.parent / "accessibility.json"
TARGETS_SHOWN = 3  # selectors of offending elements printed per rule and page
# Violations of the theme that cannot be fixed from this repository: rule -> (upstream issue, the exact number of
# offending elements over all pages of one edition, mode and width). Counted exactly, so a test fails if one spreads
# (or is fixed: then its entry goes). Empty: every violation axe found here was fixed in the course's own files.
KNOWN: dict[str, tuple[str, int]] = {}
RESULTS: dict[str, dict] = {}  # "edition/mode/width" -> {page: [violation, ...]}: the report, and conftest's summary

# axe.run started in the page, left running while the other tab gets ready (two renderers, two cores), and its
# result collected later. It starts from a timer, after this call has returned: axe.run does most of its work before
# its first await, which would keep the caller, and so the other tab, waiting.
# color-contrast with ignorePseudo: by default axe gives up on text with a sizeable ::before or ::after behind it
# ("needs review", never a violation) after checking every ancestor's pseudo-elements, two thirds of its time here;
# this way it computes the contrast of that text as of any other: a stricter check, three times faster.
# What decides the contrast color-contrast finds for an element's text: its colour, size, weight and shadow; every
# ancestor up to the first opaque background (its tag, classes, background colour and image, positioning: what is
# painted behind the text); and any ancestor's opacity, filter or blending. Elements of one key have one contrast:
# color-contrast judges the first of each key (in each mode and at each width, over every page), not the thousands of
# paragraphs, list items and code tokens that repeat it. COLOURS_OF makes the function that gives a node's key, for one
# axe run (the colours of a mode): each element's part of its descendants' keys is read from its style once, not once
# per descendant (a chapter holds some 11,000 elements with text, 15 levels deep).
COLOURS_OF = """() => {
  const memo = new WeakMap();  // element -> [its own and its ancestors' part, as a node's ancestor: while behind the
                               // text (no opaque background below it), and once behind an opaque one]
  const join = (a, b) => (a && b ? `${a} | ${b}` : a || b);
  const chain = (e) => {
    if (!e) return ['', ''];
    let found = memo.get(e);
    if (found) return found;
    const s = getComputedStyle(e), up = chain(e.parentElement);
    const effect = s.opacity !== '1' || s.filter !== 'none' || s.mixBlendMode !== 'normal'
      ? `${e.localName} ${s.opacity} ${s.filter} ${s.mixBlendMode}` : '';
    const box = `${e.localName}.${e.getAttribute('class') ?? ''} ${s.backgroundColor} ${s.backgroundImage} ${s.position}`;
    const opaque = /^rgb\\(/.test(s.backgroundColor) || /, 1\\)$/.test(s.backgroundColor);
    found = [join(join(box, effect), opaque ? up[1] : up[0]), join(effect, up[1])];
    memo.set(e, found);
    return found;
  };
  return (node) => {
    const own = getComputedStyle(node);
    return join([own.color, own.fontSize, own.fontWeight, own.textShadow].join(' | '), chain(node)[0]);
  };
}"""
# (axe.configure replaces a check's options whole: the defaults are carried over, or the check fails on every node
# and says "needs review".)
# skipCode: color-contrast leaves out the text of code blocks (div.highlight), whose colours CODE_COLOURS shows
# elsewhere (the rule's own test of which elements it judges, wrapped). only: these rules alone (else: every rule of
# the tags, but skip and LINK_RULE, which LINKS_NOT_UNDERLINED replaces). seen: null, or the COLOURS_OF keys that
# color-contrast judged already (on the pages before, in this mode and at this width): it judges the first element of
# each key only, and leaves the keys it judged in window.axeJudged.
START_AXE = """([tags, skip, skipCode, only, seen]) => {
  const defaults = axe._audit.checks['color-contrast'].options;
  axe.configure({ checks: [{ id: 'color-contrast', options: { ...defaults, ignorePseudo: true } }] });
  const contrast = axe._audit.rules.find((rule) => rule.id === 'color-contrast');
  contrast.ownMatches ??= contrast.matches;
  const coloursOf = (""" + COLOURS_OF + """)();
  const judged = new Set(seen ?? []);
  window.axeJudged = [];
  // the key first: axe's own test of an element (visible? text? ...) is the costly part, and an element of a key
  // judged already is left out whatever it says. Before the key, what that test asks first of all: a text node of
  // the element's own that is not blank, or a form field (the flattened tree's children are the DOM's but for a
  // shadow host or a slot: those go to the test)
  const ownText = (node) => /^(INPUT|SELECT|TEXTAREA|SLOT)$/.test(node.tagName) || node.shadowRoot
    || [...node.childNodes].some((c) => c.nodeType === 3 && /\\S/.test(c.nodeValue));
  contrast.matches = function (node, ...rest) {
    if (skipCode && node.closest('div.highlight')) return false;
    if (!seen) return this.ownMatches(node, ...rest);
    if (!ownText(node)) return false;
    const key = coloursOf(node);
    if (judged.has(key) || !this.ownMatches(node, ...rest)) return false;
    judged.add(key);
    window.axeJudged.push(key);
    return true;
  };
  const off = [...skip, '""" + LINK_RULE + """'];
  const rules = Object.fromEntries(off.map((rule) => [rule, { enabled: false }]));
  window.axeResult = new Promise((start) => setTimeout(start, 0))
    .then(() => axe.run(document, { runOnly: only ? { type: 'rule', values: only } : { type: 'tag', values: tags },
      rules, resultTypes: ['violations'] }))
    .then((result) => result.violations.map((v) => ({ rule: v.id, impact: v.impact, help: v.help,
      targets: v.nodes.map((n) => n.target.join(' ')) })));
}"""
STILL = "document.getAnimations().every((a) => a.playState !== 'running')"
# The theme's transitions (the colours of some hundred elements fading for 150 ms at a change of colour mode, a focus
# ring or a button fading in for up to 300 ms) are jumped to their end (Animation.finish()), not waited out: the
# styles the checks then read are those the transitions end on, as after waiting, without the wait and the frames in
# between (half a second of each change of mode). One without an end (none on the site) is waited for as before.
FINISH = """() => { for (const a of document.getAnimations()) {
  if (a.playState === 'running' && a.effect && a.effect.getComputedTiming().endTime < Infinity) a.finish(); } }"""
# The theme answers a resize 300 ms later (debounced): it gives every code block or output that now scrolls a tab
# stop (tabindex=0), so that a keyboard can scroll it. Wait for the frame that fires the resize event, then for a
# timer set after the theme's, which fires after it.
AFTER_RESIZE = """async () => {
  await new Promise((done) => requestAnimationFrame(done));
  await new Promise((done) => setTimeout(done, 350));
}"""
# Formulas a screen reader would not read: MathJax's CHTML output draws glyphs with CSS, and speaks through the
# MathML it keeps beside them, visually hidden (mjx-assistive-mml).
MUTE_MATH = """() => [...document.querySelectorAll('mjx-container')].filter((m) => !m.querySelector(':scope > mjx-assistive-mml > math'))
  .map((m) => m.textContent.slice(0, 40))"""


@pytest.fixture(scope="session")
def browser():
    yield from shared_browser()


@pytest.fixture(scope="session")
def axe_source():
    if not AXE.exists():
        pytest.fail(f"no {AXE}: the build fetches it (book/_ext/offline_site.py); run `make book` first")
    return AXE.read_text()


@pytest.fixture(scope="session")
def served():
    """edition -> the root URL it is served at (each edition served once, when first asked for)."""
    servers, urls = [], {}

    def url(edition):
        folder = EDITIONS[edition]
        if not (folder / "index.html").exists():
            if edition in ("full", "zh"):
                pytest.fail(f"no built site in {folder}: run `make book` first")
            pytest.skip(f"no student edition in {folder}: run `make student` first")
        if edition.startswith("zh"):  # within its English edition's site: its links lead there too
            return url(edition.removeprefix("zh-") if edition != "zh" else "full") + "zh/"
        if edition not in urls:
            server, host = serve(folder)
            servers.append(server)
            urls[edition] = f"http://{host}/"
        return urls[edition]

    yield url
    for server in servers:
        server.shutdown()


def open_tab(browser, mode, viewport):
    """A tab of a fresh context in which the reader chose ``mode`` (what the theme's switch keeps in localStorage)."""
    context = browser.new_context(viewport=viewport)
    context.set_default_timeout(TIMEOUT_MS)
    context.add_init_script(f"localStorage.setItem('mode', '{mode}'); localStorage.setItem('theme', '{mode}');")
    return context.new_page()


def show(tab, url, mode):
    """Load ``url``, wait for math, widgets and transitions, and check the colour mode took."""
    tab.goto(url, wait_until="load")
    settle(tab)
    still(tab)
    theme = tab.evaluate("document.documentElement.dataset.theme")
    assert theme == mode, f"{url}: html[data-theme={theme}], the reader chose {mode}"


def still(tab):
    """Once no animation runs: those with an end jumped to it (FINISH), any other waited for."""
    tab.evaluate(FINISH)
    tab.wait_for_function(STILL)


def choose_mode(tab, mode):
    """Click the theme's colour-mode button (it cycles auto, dark, light) until the page shows ``mode``."""
    for _ in range(3):
        if tab.evaluate("document.documentElement.dataset.theme") == mode:
            break
        tab.evaluate("document.querySelector('.theme-switch-button').click()")
    still(tab)
    assert tab.evaluate("document.documentElement.dataset.theme") == mode, f"the colour-mode button never gave {mode}"


def summary(found: dict[str, list]) -> tuple[Counter, list[tuple[str, str]]]:
    """Offending elements per rule over all pages, and (rule, a line per rule and page: impact, count, targets)."""
    per_rule, lines = Counter(), []
    for page, violations in found.items():
        for v in violations:
            per_rule[v["rule"]] += len(v["targets"])
            lines.append((v["rule"], f"{page}: {v['rule']} ({v['impact']}, {len(v['targets'])} element(s)): "
                                     f"{v['help']}; " + ", ".join(v["targets"][:TARGETS_SHOWN])))
    return per_rule, lines


def write_report():
    """_build/accessibility.json: per rule, the offending elements summed over the runs so far, and the distinct
    ones (an element counted once per edition and page, whatever the mode and width); then every violation."""
    per_rule, distinct = Counter(), defaultdict(set)
    for run, found in RESULTS.items():
        per_rule += summary(found)[0]
        for page, violations in found.items():
            for v in violations:
                distinct[v["rule"]] |= {(run.split("/")[0], page, target) for target in v["targets"]}
    REPORT.write_text(json.dumps({"axe": NPM_PINS["axe-core"], "tags": TAGS, "per_rule": dict(per_rule),
                                  "distinct_per_rule": {rule: len(d) for rule, d in distinct.items()},
                                  "runs": RESULTS}, indent=1))


def test_axe_is_pinned_and_not_served():
    assert NPM_PINS["axe-core"] == "4.14.1" and NPM_INTEGRITY["axe-core"].startswith("sha512-")
    assert set(NPM_INTEGRITY) == set(NPM_PINS), "every npm pin needs its integrity hash (and no hash without a pin)"
    served = [str(path) for edition in EDITIONS.values() for path in edition.glob("_static/**/axe*.js")]
    assert not served, f"axe-core is for the tests only, yet the site serves {served}"


def code_colours(path) -> set[tuple[str, str, str]]:
    """(the box a code block is in, the block's kind, a token's class) for every token of every code block of a page:
    what decides the colours of its code. The box: the classes of the nearest admonition, dropdown or card around the
    block ("" for none); the kind: its container's classes (a cell's input, an output stream, an error, ...)."""
    import lxml.html

    found = set()
    for block in lxml.html.parse(str(path)).xpath('//div[contains(concat(" ", @class, " "), " highlight ")]'):
        classes = (block.getparent().get("class") or "").split()
        kind = " ".join(c for c in classes if c not in ("docutils", "container", "notranslate")
                        and not c.startswith("highlight-"))
        box = next((" ".join(sorted(a.get("class").split())) for a in block.iterancestors()
                    if {"admonition", "dropdown", "sd-card", "toggle"} & set((a.get("class") or "").split())), "")
        found |= {(box, kind, token.get("class") or "") for token in block.iter("span")} | {(box, kind, "")}
    return found


def code_colour_pages(folder, pages) -> list[str]:
    """The pages whose code color-contrast judges: the page that shows the most (box, kind, token) triples, then the
    one that adds the most, until every triple any page shows is shown (ties: the toc's order)."""
    left = {page: code_colours(folder / f"{page}.html") for page in pages}
    chosen, shown = [], set()
    while any(triples - shown for triples in left.values()):
        page = max(left, key=lambda page: len(left[page] - shown))
        chosen.append(page)
        shown |= left.pop(page)
    return chosen


def audit(tab, url, pages, found, problems, axe_source, states, skip=(), code_pages=None, reader=None, judged=None):
    """Generator: each page of ``pages`` loaded once in ``tab`` (light mode, desktop width), then shown in every mode
    and width as a reader would get there (the colour-mode button, a narrower window), axe run on each; in dark mode
    at the phone's width only PHONE_COLOUR_PAGES (DARK_PHONE). Code left out of color-contrast on pages outside
    ``code_pages`` (None: on none). It yields while axe runs, so that the other tab can work meanwhile;
    ``found[(mode, width)][page]``: the violations. ``reader``: (the site's root URL, the edition's folder in it) for
    the reader's checks (READER) in the same visit, at 1280 px, at the phone's width and (the full edition) at the
    wider desktop's; what ``tab`` met (console errors, failed or refused requests, tests/test_site.py's ``watch``),
    ``tab.met``, is a problem of every edition. ``judged``: None, or {(mode, width): the COLOURS_OF keys judged}, shared
    by the tabs: color-contrast judges each key once per mode and width."""
    for page in pages:
        if tab.viewport_size != DESKTOP:  # the last page left at another width: leave it first, or it is laid out
            tab.goto("about:blank")       # again at 1280 px for nothing (half a CPU second)
            tab.set_viewport_size(DESKTOP)
        tab.met.clear()
        show(tab, f"{url}{page}.html", MODES[0])
        mute = tab.evaluate(MUTE_MATH)
        if mute:
            problems.append(f"{page}: {len(mute)} formula(s) without assistive MathML: {mute[:TARGETS_SHOWN]}")
        bare = tab.evaluate(LINKS_NOT_UNDERLINED)
        if bare:
            problems.append(f"{page}: {len(bare)} link(s) in running text without an underline (WCAG 1.4.1: told "
                            f"apart by colour alone): {bare[:TARGETS_SHOWN]}")
        seen = page_problems(tab, reader[0], reader[1] + page) if reader else []
        tab.add_script_tag(content=axe_source)
        assert tab.evaluate("axe.version") == NPM_PINS["axe-core"]
        skip_code = code_pages is not None and page not in code_pages
        by_mode = tab.evaluate(f"document.querySelector('{BY_MODE}') !== null")
        for mode, width in states:
            if (mode, width) == DARK_PHONE and page not in PHONE_COLOUR_PAGES:
                continue
            choose_mode(tab, mode)
            resize(tab, WIDTHS[width])
            if reader and (mode, width) == (MODES[0], "phone"):
                seen += phone_problems(tab)
            # at the phone's width, the article shows the elements it shows at the desktop's, in the same colours
            # (WIDTH_COLOURS, WIDTH_LAYOUT): outside PHONE_COLOUR_PAGES, the rules that judge the layout alone
            phone = width == "phone" and page not in PHONE_COLOUR_PAGES
            # in dark mode, the colours alone changed (MODE_PROPERTIES): the colour rules, unless the page shows an
            # element by colour mode (BY_MODE)
            only = LAYOUT_RULES if phone else COLOUR_RULES if mode != MODES[0] and not by_mode else None
            before = sorted(judged[mode, width]) if judged is not None else None
            tab.evaluate(START_AXE, [TAGS, list(skip), skip_code, only, before])
            yield
            found[(mode, width)][page] = tab.evaluate("window.axeResult")
            if judged is not None:
                judged[mode, width].update(tab.evaluate("window.axeJudged"))
        if reader and (MODES[0], "phone") not in states:
            resize(tab, PHONE)
            seen += phone_problems(tab)
        if reader and not reader[1]:  # the wider desktop: layout, whatever the mode (it changes colours alone)
            resize(tab, DESKTOPS[1])
            seen += desktop_problems(tab, DESKTOPS[1])
        seen = tab.met + seen
        if reader and (seen or EVERY_SCREENSHOT):
            choose_mode(tab, MODES[0])
            for viewport, name in ((DESKTOP, slug(reader[1] + page)), (PHONE, f"{slug(reader[1] + page)}-phone")):
                resize(tab, viewport)
                screenshot(tab, name)
        problems += [f"{reader[1] if reader else ''}{page}.html: {problem}" for problem in seen]


def resize(tab, viewport):
    """Show the page at ``viewport``, once the theme has answered the resize and the sidebars have folded away."""
    if tab.viewport_size != viewport:
        tab.set_viewport_size(viewport)
        tab.evaluate(AFTER_RESIZE)
        still(tab)


PLANTED = """<!DOCTYPE html><html lang="en"><head><title>Planted</title></head><body><main>
<h1>Planted violations</h1>
<p style="color: #999; background: #fff">Grey on white, 2.8:1.</p>
<p style="color: #999; background: #fff">Grey on white again: the same colours, judged once where keys are kept.</p>
<div style="background: #ecf3ff"><p>A <a href="#x" style="color: #176de8">link on a tint</a>, 4.29:1.</p></div>
<button aria-label="Search">Search <kbd>Ctrl</kbd>+<kbd>K</kbd></button>
<svg role="img" width="20" height="20"><rect width="20" height="20"/></svg>
<div class="highlight" style="background: #fff"><pre><span style="color: #aaa">faint_code = 1</span></pre></div>
<p>Told apart by colour alone: <a id="bare" href="#y" style="text-decoration: none">a bare link</a> in a sentence.</p>
<ul><li><a href="#z" style="text-decoration: none">A link alone in its item</a></li></ul>
</main></body></html>"""


def test_axe_finds_planted_violations(browser, axe_source):
    """axe, configured as the tests configure it, finds the violations this site had, and LINKS_NOT_UNDERLINED a link
    told apart from its sentence by colour alone: a test that can fail."""
    tab = open_tab(browser, MODES[0], DESKTOP)
    try:
        tab.set_content(PLANTED)
        tab.add_script_tag(content=axe_source)
        found = {}
        for skip_code, only in ((False, None), (True, None), (False, COLOUR_RULES)):
            tab.evaluate(START_AXE, [TAGS, [], skip_code, only, None])
            found[skip_code, bool(only)] = {v["rule"]: len(v["targets"]) for v in tab.evaluate("window.axeResult")}
        bare = tab.evaluate(LINKS_NOT_UNDERLINED)
        keyed = []
        for seen in ([], None):  # COLOURS_OF keys: none judged before, then those the first run judged
            tab.evaluate(START_AXE, [TAGS, [], False, COLOUR_RULES, seen if seen is not None else keyed[0]])
            keyed.append(tab.evaluate("window.axeJudged"))
            found["keyed", len(keyed)] = {v["rule"]: len(v["targets"]) for v in tab.evaluate("window.axeResult")}
    finally:
        tab.context.close()
    assert found[False, False] == {"color-contrast": 4, "label-content-name-mismatch": 1, "svg-img-alt": 1}, found
    assert found[True, False] == dict(found[False, False], **{"color-contrast": 3}), "skipCode: the faint code left out"
    assert found[False, True] == {"color-contrast": 4}, "only: the colour rules alone (as in dark mode)"
    # one element of each key judged: the second grey paragraph is the first's key; a second page of the same keys
    # has nothing left to judge
    assert found["keyed", 1] == {"color-contrast": 3} and len(keyed[0]) == len(set(keyed[0])), (found, keyed)
    assert found["keyed", 2] == {} and keyed[1] == [], (found, keyed)
    # LINK_RULE's replacement: the bare link in a sentence, not the underlined ones nor the one alone in its item
    assert len(bare) == 1 and 'id="bare"' in bare[0], bare


def test_the_pages_whose_code_is_judged_show_every_colour_of_code(tmp_path):
    page = """<html><body><article><div class="cell_input docutils container"><div class="highlight"><pre>
<span class="k">def</span> <span class="nf">f</span>():</pre></div></div>{more}</article></body></html>"""
    output = """<div class="admonition solution"><div class="output stream highlight-myst-ansi notranslate">
<div class="highlight"><pre><span class="-Color -Color-Red">warning</span></pre></div></div></div>"""
    for name, more in (("a", ""), ("b", output), ("c", "")):
        (tmp_path / f"{name}.html").write_text(page.format(more=more))
    assert code_colours(tmp_path / "b.html") == {
        ("", "cell_input", ""), ("", "cell_input", "k"), ("", "cell_input", "nf"),
        ("admonition solution", "output stream", ""), ("admonition solution", "output stream", "-Color -Color-Red")}
    assert code_colour_pages(tmp_path, ["a", "b", "c"]) == ["b"]
    assert code_colour_pages(tmp_path, ["a", "c"]) == ["a"]
    full = EDITIONS["full"]
    if (full / "index.html").exists():
        chosen = code_colour_pages(full, PAGES)
        every = set().union(*(code_colours(full / f"{page}.html") for page in PAGES))
        assert every and set().union(*(code_colours(full / f"{page}.html") for page in chosen)) == every
        assert len(chosen) < len(PAGES), f"every page's code is judged: {chosen}"


def mode_properties(css: str) -> dict[str, set[str]]:
    """Property -> the selectors that set it in a rule that applies in one colour mode (html[data-theme=...])."""
    found = {}
    css = re.sub(r"/\*.*?\*/", "", css, flags=re.S)
    for selectors, body in re.findall(r"([^{}]*data-theme[^{}]*)\{([^{}]*)\}", css):
        for declaration in body.split(";"):
            name, _, value = declaration.partition(":")
            if name.strip():
                variable = name.strip().startswith("--")
                colour = MODE_VARIABLE.search(value) or value.strip() in ("", "initial")
                key = name.strip() if not variable or colour else "--?"
                found.setdefault(key, set()).add(" ".join(selectors.split()))
    return found


def test_the_colour_mode_changes_colours_alone():
    """Why dark mode at the phone's width is audited on PHONE_COLOUR_PAGES alone, and dark mode by the colour rules
    alone: what the stylesheets set by colour mode is a colour or something that neither hides, shows nor names an
    element (MODE_PROPERTIES), but for the theme's .only-light and .only-dark images (display, BY_MODE), on whose
    pages every rule runs in dark mode."""
    found = {}
    for path in (EDITIONS["full"] / "_static").rglob("*.css"):
        for name, selectors in mode_properties(path.read_text(errors="replace")).items():
            found.setdefault(name, set()).update(selectors)
    assert found.get("color") and found.get("background-color"), "no colour set by mode: is the theme still there?"
    display = found.pop("display", set())
    assert all(re.search(r"\.only-(dark|light)", sel) for sel in display), f"shown or hidden by mode: {display}"
    other = {name: sorted(sel)[:3] for name, sel in found.items() if name not in MODE_PROPERTIES and name[:2] != "--"}
    assert not other, f"set by colour mode, not yet judged at the phone's width in dark mode: {other}"
    assert "--?" not in found, f"custom properties set by mode that hold no colour: {sorted(found['--?'])[:3]}"
    assert mode_properties("html[data-theme=dark] .x { color: red; display: none } .y { display: none }") == \
        {"color": {"html[data-theme=dark] .x"}, "display": {"html[data-theme=dark] .x"}}


@pytest.mark.parametrize("edition", [edition for edition in EDITIONS if edition != "full"])
def test_the_editions_serve_the_full_sites_stylesheets(edition):
    """Why the colour rules run on the full site alone: every edition's stylesheets are the full site's."""
    full, other = EDITIONS["full"] / "_static", EDITIONS[edition] / "_static"
    if not (EDITIONS[edition] / "index.html").exists():
        (pytest.fail if edition == "zh" else pytest.skip)(f"no {edition} edition in {EDITIONS[edition]}: run `make "
                                                          f"{'book' if edition == 'zh' else 'student'}` first")
    sheets = sorted(path.relative_to(full) for path in full.rglob("*.css"))
    assert sheets and sheets == sorted(path.relative_to(other) for path in other.rglob("*.css"))
    differ = [str(sheet) for sheet in sheets if (full / sheet).read_bytes() != (other / sheet).read_bytes()]
    assert not differ, f"the {edition} edition's stylesheets differ from the full site's: {differ}"


def width_properties(css: str) -> dict[str, set[str]]:
    """Selector -> the properties set by the rules inside an @media query on the width."""
    found, start = {}, 0
    while (media := re.compile(r"@media[^{]*width[^{]*\{").search(css, start)) is not None:
        depth, end = 1, media.end()
        while depth and end < len(css):
            depth += {"{": 1, "}": -1}.get(css[end], 0)
            end += 1
        for selectors, body in re.findall(r"([^{}]+)\{([^{}]*)\}", css[media.end():end - 1]):
            names = {d.partition(":")[0].strip() for d in body.split(";") if ":" in d}
            for selector in selectors.split(","):
                found.setdefault(" ".join(selector.split()), set()).update(names)
        start = end
    return found


def width_colours(css: str) -> set[str]:
    """Selectors of the rules that set a colour (color, background, opacity) inside an @media query on the width."""
    colours = {"color", "background", "background-color", "opacity"}
    return {selector for selector, names in width_properties(css).items() if names & colours}


def test_the_articles_colours_do_not_depend_on_the_width():
    """Why the colour rules judge the article at the desktop's width alone: the colours the stylesheets set by width
    are WIDTH_COLOURS' (the drawers, the page's sidebar, a margin note's toggle), and no article holds one."""
    full = EDITIONS["full"]
    sheets = (full / "_static").rglob("*.css")
    found = set().union(*(width_colours(path.read_text(errors="replace")) for path in sheets))
    assert found and found <= WIDTH_COLOURS, f"colours set by width, not yet judged at the phone's width: " \
                                             f"{sorted(found - WIDTH_COLOURS)}"
    assert width_colours("@media (max-width: 9px) { .a, .b x { color: red } .c { margin: 0 } }") == {".a", ".b x"}
    # the classes of the elements they colour (each selector's last compound)
    classes = {word for selector in WIDTH_COLOURS for word in re.findall(r"\.([\w-]+)", selector.split()[-1])}
    outside = {}  # page -> the classes used outside its article
    for page in PAGES:
        text = (full / f"{page}.html").read_text()
        article = re.search(r'<article class="bd-article".*?</article>', text, re.S)
        assert article, f"{page}: no {ARTICLE}"
        inside = {name for name in classes if re.search(rf'class="[^"]*\b{name}\b', article.group(0))}
        assert not inside, f"{page}: its article holds {inside}, whose colours change with the width"
        rest = text[:article.start()] + text[article.end():]
        outside[page] = {name for value in re.findall(r'class="([^"]*)"', rest) for name in value.split()}
    # and what lies outside the article at the phone's width is judged on a page of each template
    shown = set().union(*(outside[page] for page in PHONE_COLOUR_PAGES))
    new = {page: sorted(names - shown) for page, names in outside.items() if names - shown}
    assert not new, f"classes outside the article that PHONE_COLOUR_PAGES do not show: {new}"


def in_article(selector: str, held: tuple[set, set, set], anywhere: set[str]) -> bool:
    """Whether ``selector`` may select an element an article holds (``held``: the tags, classes and ids found in the
    articles, the article's own among them; ``anywhere``: every class of the pages): its last compound's tag, classes
    and ids are held by some article, and so are those of a compound it must be a child or sibling of (>, +, ~); an
    ancestor's classes (a space) are found on some page. Pseudo-classes and attributes are not read: it may, where
    they would not."""
    tags, classes, ids = held
    compounds = re.findall(r"([>+~]?)\s*([^\s>+~]+)", selector)

    def fits(compound: str, have_classes: set[str]) -> bool:
        tag = re.match(r"[a-zA-Z][\w-]*", compound)
        return ((tag is None or tag.group(0).lower() in tags) and set(re.findall(r"\.([\w-]+)", compound)) <= have_classes
                and set(re.findall(r"#([\w-]+)", re.sub(r"\(.*?\)", "", compound))) <= ids)

    inside = True  # the compound in hand must be held by the article (the last, and what it is a child or sibling of)
    for combinator, compound in reversed(compounds):
        if not fits(compound, classes if inside else anywhere):
            return False
        inside = inside and combinator in (">", "+", "~")
    return True


def test_the_articles_elements_do_not_depend_on_the_width():
    """Why every rule but LAYOUT_RULES judges the article at the desktop's width alone: what the stylesheets set by
    width on anything an article holds (any page) is WIDTH_LAYOUT, spacing and the size and wrapping of text; nothing
    that hides, shows or names an element (display, visibility, content, ...) nor colours it."""
    full = EDITIONS["full"]
    tags, classes, ids, anywhere = set(), set(), set(), set()
    for page in PAGES:
        text = (full / f"{page}.html").read_text()
        article = re.search(r'<article class="bd-article".*?</article>', text, re.S)
        assert article, f"{page}: no {ARTICLE}"
        tags |= {t.lower() for t in re.findall(r"<([a-zA-Z][\w-]*)", article.group(0))}
        classes |= {name for value in re.findall(r'class="([^"]*)"', article.group(0)) for name in value.split()}
        ids |= set(re.findall(r'id="([^"]*)"', article.group(0)))
        anywhere |= {name for value in re.findall(r'class="([^"]*)"', text) for name in value.split()}
    assert {"p", "pre", "h1", "img"} <= tags and {"highlight", "admonition"} <= classes, "not an article as expected"
    found = {}
    for path in (full / "_static").rglob("*.css"):
        css = re.sub(r"/\*.*?\*/", "", path.read_text(errors="replace"), flags=re.S)
        for selector, names in width_properties(css).items():
            if in_article(selector, (tags, classes, ids), anywhere):
                found.setdefault(selector, set()).update(names)
    assert found, "nothing set by width on an article's elements: is the theme still there?"
    other = {selector: sorted(names - WIDTH_LAYOUT) for selector, names in found.items() if names - WIDTH_LAYOUT}
    assert not other, f"set by width on what an article holds, beyond WIDTH_LAYOUT (not judged at the phone's width " \
                      f"outside PHONE_COLOUR_PAGES): {other}"
    assert width_properties("@media (max-width: 9px) { .a, b x { display: none; margin: 0 } }") == \
        {".a": {"display", "margin"}, "b x": {"display", "margin"}}
    held = ({"article", "div", "p"}, {"bd-article", "x"}, {"s1"})
    assert in_article(".bd-main .bd-content p", held, {"bd-main", "bd-content"}) and in_article("#s1 > p.x", held, set())
    assert in_article("article.bd-article > :not(svg)", held, set()) and in_article(".x:hover", held, set())
    assert not in_article(".bd-main > p", held, {"bd-main"}) and not in_article("#top", held, set())
    assert not in_article(".cols-1 > *", held, set()) and not in_article("nav.bd-links", held, {"bd-links"})


def test_every_page(browser, served, axe_source):
    """The full edition (every_page); the others in tests/test_accessibility_editions.py, a file of their own: each file's tests run
    in one process, and each half of the audit takes as long as the rest of a process's share of the tests."""
    every_page(browser, served, axe_source, "full")


def every_page(browser, served, axe_source, edition, pages=PAGES):
    """axe's WCAG 2.0/2.1 A and AA rules on every page of the toc (``pages``), in each colour mode and at each width: nothing
    beyond KNOWN (counted exactly). Every formula carries its MathML for screen readers (assistive MathML). No page
    meets a console error or a failed request; on the full and Chinese editions, the reader's checks
    (tests/test_site.py: READER) pass, in the same visit.

    Two tabs share the pages, each reused from page to page; axe runs in one while the other gets ready."""
    url, start = served(edition), time.perf_counter()
    tabs = [open_tab(browser, MODES[0], DESKTOP) for _ in range(2)]
    host = url.split("/")[2]
    for tab in tabs:
        tab.met = watch(tab, host)
    reader = (served("full"), READER[edition]) if edition in READER else None
    # the others: the full edition's layout and stylesheets, other content
    states, skip = (STATES, []) if edition == "full" else (STATES[:1], COLOUR_RULES)
    code_pages = code_colour_pages(EDITIONS[edition], PAGES) if edition == "full" else None
    found, problems = {state: {} for state in states}, []
    judged = {state: set() for state in states} if edition == "full" else None  # the others judge no colour
    walks = [audit(tab, url, pages[i::len(tabs)], found, problems, axe_source, states, skip, code_pages, reader, judged)
             for i, tab in enumerate(tabs)]
    try:
        while walks:
            for walk in list(walks):
                if next(walk, "done") == "done":
                    walks.remove(walk)
    finally:
        for tab in tabs:
            tab.context.close()
    report = problems[:]
    for (mode, width), violations in found.items():
        violations = {page: violations[page] for page in pages if violations.get(page)}
        RESULTS[f"{edition}/{mode}/{width}"] = violations
        per_rule, lines = summary(violations)
        wrong = [line for rule, line in lines if rule not in KNOWN]
        for rule, (issue, expected) in KNOWN.items():
            if per_rule[rule] != expected:
                wrong.append(f"{rule}: {per_rule[rule]} element(s), {expected} expected (the theme's, {issue})")
        if wrong:
            report.append(f"{mode} mode, {width}: {sum(per_rule.values())} element(s) in violation, per rule "
                          f"{dict(per_rule)}\n" + "\n".join(wrong))
    write_report()
    seconds = time.perf_counter() - start
    assert not report, (f"{edition} edition ({len(pages)} pages, {len(states)} modes and widths each, {seconds:.0f} s):\n"
                        + "\n".join(report))


# The focus indicator of the element with focus: its outline, else the outermost ring of its box-shadow, against the
# first opaque background behind it (transparent layers composited over it). Colours as [r, g, b, a].
FOCUS = """async () => {
  (""" + FINISH + """)();  // the ring may fade in (a transition): its end
  await Promise.all(document.getAnimations().map((a) => a.finished));
  const e = document.activeElement;
  if (!e || e === document.body) return null;
  const rgba = (c) => { const m = c.match(/rgba?\\(([^)]+)\\)/); if (!m) return null;
    const v = m[1].split(/[ ,/]+/).filter(Boolean).map(Number); return [v[0], v[1], v[2], v.length > 3 ? v[3] : 1]; };
  const s = getComputedStyle(e);
  let ring = null, how = '';
  if (s.outlineStyle !== 'none' && parseFloat(s.outlineWidth) >= 1) { ring = rgba(s.outlineColor); how = 'outline'; }
  else if (s.boxShadow && s.boxShadow !== 'none') {
    const rings = s.boxShadow.split(/,(?![^(]*\\))/).filter((r) => !r.includes('inset'));
    if (rings.length) { ring = rgba(rings[rings.length - 1]); how = 'box-shadow'; }
  }
  const layers = [];
  for (let a = e.parentElement; a; a = a.parentElement) {
    const c = rgba(getComputedStyle(a).backgroundColor);
    if (c && c[3] > 0) { layers.push(c); if (c[3] >= 1) break; }
  }
  const parts = { '.toc-entry': 'page-toc', '.prev-next-area': 'prev-next', '.bd-sidebar-primary': 'sidebar',
                  '.bd-header-article': 'header' };
  const where = Object.keys(parts).find((selector) => e.closest(selector));
  const name = e.tagName.toLowerCase() + [...e.classList].slice(0, 3).map((c) => '.' + c).join('')
    + (where ? ' in ' + parts[where] : '')
    + ' "' + (e.getAttribute('aria-label') || e.textContent || '').replace(/\\s+/g, ' ').trim().slice(0, 30) + '"';
  return { name, ring, how, layers, raw: `${s.outline}; ${s.boxShadow}`,
           widget: !!e.closest('.ac-widget, .widget-subarea'), visible: e.getClientRects().length > 0 };
}"""
FOCUS_PAGE = "notebooks/03_masks"  # a chapter: header buttons, both sidebars, exercises, solutions, a widget
TAB_STOPS = 40  # Tab from the top: the sidebar, the header's buttons, the chapter's first links and copy buttons
BACK_STOPS = 25  # Shift+Tab from the end: the links to the previous and next pages, the page's table of contents


def composite(layers):
    """The colour seen through ``layers`` (nearest first, the last opaque, or white behind them all)."""
    r, g, b = 255.0, 255.0, 255.0
    for cr, cg, cb, a in reversed(layers):
        r, g, b = cr * a + r * (1 - a), cg * a + g * (1 - a), cb * a + b * (1 - a)
    return r, g, b


def test_contrast_formula():
    assert contrast((0, 0, 0), (255, 255, 255)) == pytest.approx(21)
    assert contrast((0x17, 0x6d, 0xe8), (0xec, 0xf3, 0xff)) == pytest.approx(4.29, abs=0.01)  # axe's figure
    assert composite([(0, 0, 0, 0.5), (255, 255, 255, 1)]) == (127.5, 127.5, 127.5)


def focus_problems(tab, key: str, stops: int, seen: list) -> list[str]:
    """Press ``key`` ``stops`` times; each element that takes the focus (its name added to ``seen``) must show a
    focus indicator at >= 3:1 against the background around it."""
    problems = []
    for _ in range(stops):
        tab.keyboard.press(key)
        focus = tab.evaluate(FOCUS)
        if focus is None or focus["widget"] or not focus["visible"]:
            continue
        seen.append(focus["name"])
        if focus["ring"] is None:
            problems.append(f"{focus['name']}: no focus indicator (outline, box-shadow: {focus['raw']})")
            continue
        around = composite(focus["layers"])
        ring = composite([focus["ring"], *focus["layers"]])
        ratio = contrast(ring, around)
        if ratio < 3:
            problems.append(f"{focus['name']}: its {focus['how']} {tuple(round(c) for c in ring)} is {ratio:.2f}:1 "
                            f"against {tuple(round(c) for c in around)}")
    return problems


@pytest.mark.parametrize("mode", MODES)
def test_focus_is_visible(browser, served, mode):
    """Tab from the top of a chapter page, and Shift+Tab from its end: each control that takes the focus shows a
    ring at >= 3:1 against its background. (The widgets' own controls are tested with the widgets.)"""
    url = served("full")
    tab = open_tab(browser, mode, DESKTOP)
    seen = []
    try:
        show(tab, f"{url}{FOCUS_PAGE}.html", mode)
        problems = focus_problems(tab, "Tab", TAB_STOPS, seen)
        show(tab, f"{url}{FOCUS_PAGE}.html", mode)
        problems += focus_problems(tab, "Shift+Tab", BACK_STOPS, seen)
    finally:
        tab.context.close()
    names = set(seen)
    for control in ('"Search', '"Color mode', '"Launch interactive content', '"Download this page', 'in page-toc',
                    "in prev-next", '"Copy to clipboard', "a.reference.internal \"", '"Toggle hidden content'):
        assert any(control in name for name in names), f"{control} never took the focus: {sorted(names)}"
    assert not problems, f"{mode} mode, {FOCUS_PAGE}:\n" + "\n".join(dict.fromkeys(problems))
