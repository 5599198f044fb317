"""Sphinx extension (loaded by _config.yml's ``local_extensions``): the site needs nothing from another host.

1. Vendoring. MathJax, require.js and the Jupyter widget manager (``embed-amd.js`` with its fonts) are fetched
   from the npm registry at the exact versions pinned in ``NPM_PINS`` (``npm pack``: the tarballs only, checked by
   npm against the registry's integrity hashes and here against the sha512 hashes in ``NPM_INTEGRITY``, no
   node_modules), and anywidget's front-end module is copied from the installed ``anywidget`` package, whose
   version made the widget state the pages embed. They are unpacked into ``book/_vendor/site/`` (``book/_vendor/``
   is git-ignored by a ``.gitignore`` of its own) on the first build, and again whenever a pin changes;
   ``_config.yml`` serves that folder as ``_static/`` and points ``mathjax_path`` and ``nb_ipywidgets_js`` at it.
   The same fetch puts axe-core, which only the tests use (tests/test_accessibility.py), in
   ``book/_vendor/tests/axe-core/axe.min.js``: beside the served folder, never on the site. Beside it,
   ``static/`` (served as ``_static/`` too) holds what we wrote: ``widgets/config.js`` tells require.js where
   anywidget and the manager's fonts are, and ``attention-course.css`` holds site-wide style fixes. A rebuild with
   no changed page copies both folders anyway (Sphinx alone would not).
2. Sphinx 7 writes an inline script added with ``app.add_js_file(None, body=...)`` twice (the builder's copy has
   the name None, the registry's ""), so sphinx-thebe's ``const THEBE_JS_URL`` is declared twice and every
   page logs a SyntaxError. Fixed upstream in sphinx-doc/sphinx#13402 (Sphinx 8); here None becomes "" too.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from sphinx.errors import ExtensionError

NPM_PINS = {"mathjax": "3.2.2", "requirejs": "2.3.7", "@jupyter-widgets/html-manager": "1.0.15",
            "axe-core": "4.14.1"}
# The sha512 of each pinned tarball, as the registry states it (`npm view <name>@<version> dist.integrity`): a
# tarball that differs is refused, whatever the registry says that day.
NPM_INTEGRITY = {
    "mathjax": "sha512-Bt+SSVU8eBG27zChVewOicYs7Xsdt40qm4+UpHyX7k0/O9NliPc+x77k1/FEsPsjKPZGJvtRZM1vO+geW0OhGw==",
    "requirejs": "sha512-DouTG8T1WanGok6Qjg2SXuCMzszOo0eHeH9hDZ5Y4x8Je+9JB38HdTLT4/VA8OaUhBa0JPVHJ0pyBkM1z+pDsw==",
    "@jupyter-widgets/html-manager":
        "sha512-5thBIV6ymNgmPVOHvzx+gGy8ZSKmSazhtGw4/c4xJDVzRhG9PTeQsRjF3FUTopvFi//SABeNz1yp47bCrJ3CQA==",
    "axe-core": "sha512-FHfa+lmNjQZfJz1q8wKqIDwC6DExcHt/pkjNQb09a3NPjCKg2rhu5qb2S4r76ASyFNNtuFooJpZe37OgudVGtQ==",
}
# What each package gives: (path inside the npm package, path inside book/_vendor/). Under site/: served as
# _static/; under tests/: for the tests alone.
FILES = {
    "mathjax": [
        ("package/es5/tex-mml-chtml.js", "site/mathjax/tex-mml-chtml.js"),
        ("package/es5/input", "site/mathjax/input"),  # TeX extensions, loaded on demand
        ("package/es5/output/chtml", "site/mathjax/output/chtml"),  # the fonts
        ("package/es5/ui", "site/mathjax/ui"),  # the right-click menu
        ("package/es5/a11y", "site/mathjax/a11y"),  # accessibility, chosen in that menu
        ("package/es5/sre", "site/mathjax/sre"),  # speech rules for a11y
        ("package/es5/adaptors", "site/mathjax/adaptors"),
        ("package/LICENSE", "site/mathjax/LICENSE"),
    ],
    "requirejs": [("package/require.js", "site/widgets/require.js")],
    "@jupyter-widgets/html-manager": [("package/dist", "site/widgets")],  # embed-amd.js and the fonts beside it
    "axe-core": [("package/axe.min.js", "tests/axe-core/axe.min.js"), ("package/LICENSE", "tests/axe-core/LICENSE")],
}
SKIP = shutil.ignore_patterns("embed.js", "*.map", "libembed-amd.js")  # html-manager's other bundles
HERE = Path(__file__).resolve().parent
VENDOR = HERE.parent / "_vendor"
SERVED = VENDOR / "site"  # _config.yml's html_static_path
AXE = VENDOR / "tests" / "axe-core" / "axe.min.js"  # tests/test_accessibility.py


def _wanted() -> dict:
    import anywidget

    return {"npm": NPM_PINS, "anywidget": anywidget.__version__}


def _fetch(target: Path, scratch: Path) -> None:
    """Fill ``target`` with the pinned assets, downloading the npm tarballs into ``scratch``."""
    npm = shutil.which("npm")
    if npm is None:
        raise ExtensionError(
            "offline_site: npm is needed once, to fetch the site's offline assets (MathJax, require.js, the widget "
            f"manager) and the tests' axe-core, pinned in {__file__}, from the npm registry. Install Node.js and npm "
            "(Debian/Ubuntu: `apt-get install npm`), then build again; the files are kept in book/_vendor/ afterwards."
        )
    specs = [f"{name}@{version}" for name, version in NPM_PINS.items()]
    run = subprocess.run([npm, "pack", *specs, "--pack-destination", str(scratch), "--json", "--silent"],
                         capture_output=True, text=True)
    if run.returncode:
        raise ExtensionError(f"offline_site: `npm pack {' '.join(specs)}` failed:\n{run.stderr[-2000:]}")
    tarballs = {entry["name"]: scratch / entry["filename"] for entry in json.loads(run.stdout)}
    for name, tarball in tarballs.items():
        digest = "sha512-" + base64.b64encode(hashlib.sha512(tarball.read_bytes()).digest()).decode()
        if digest != NPM_INTEGRITY.get(name):
            raise ExtensionError(f"offline_site: {name}@{NPM_PINS[name]} from the registry has the integrity {digest}, "
                                 f"not the {NPM_INTEGRITY.get(name)} pinned in {__file__}: refused.")
    for name, files in FILES.items():
        unpacked = scratch / name.replace("/", "_")
        with tarfile.open(tarballs[name]) as tar:
            tar.extractall(unpacked, filter="data")
        for source, destination in files:
            source, destination = unpacked / source, target / destination
            destination.parent.mkdir(parents=True, exist_ok=True)
            if source.is_dir():
                shutil.copytree(source, destination, dirs_exist_ok=True, ignore=SKIP)
            else:
                shutil.copy2(source, destination)
    import anywidget

    shutil.copy2(Path(anywidget.__file__).parent / "nbextension" / "index.js",
                 target / "site" / "widgets" / "anywidget.js")


def vendor(app, config) -> None:
    """Make book/_vendor/ hold exactly the pinned assets (a no-op when it already does)."""
    stamp, wanted = VENDOR / "PINS.json", _wanted()
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return
    build = HERE.parent.parent / "_build"  # git-ignored, on the same file system as book/
    build.mkdir(exist_ok=True)
    with tempfile.TemporaryDirectory(dir=build, prefix="vendor-") as scratch:
        target = Path(scratch) / "_vendor"
        (Path(scratch) / "npm").mkdir()
        _fetch(target, Path(scratch) / "npm")
        (target / ".gitignore").write_text("# fetched by book/_ext/offline_site.py at build time\n*\n")
        (target / "PINS.json").write_text(json.dumps(wanted, indent=1))
        shutil.copy2(target / "PINS.json", target / "site" / "PINS.json")  # the served copy: see refresh_output
        old = Path(scratch) / "old"
        if VENDOR.exists():
            VENDOR.rename(old)  # concurrent builds: each swaps in a complete folder
        try:
            os.rename(target, VENDOR)
        except OSError:  # another build got there first
            if not (stamp.exists() and json.loads(stamp.read_text()) == wanted):
                raise


def refresh_output(app, exception) -> None:
    """Copy our static folders into the site's _static/: Sphinx skips static files when no page changed."""
    if exception or getattr(app.builder, "format", None) != "html":
        return
    static = Path(app.outdir) / "_static"
    if not (static / "PINS.json").exists() or (static / "PINS.json").read_text() != (SERVED / "PINS.json").read_text():
        shutil.copytree(SERVED, static, dirs_exist_ok=True)
    shutil.copytree(HERE / "static", static, dirs_exist_ok=True)


def inline_scripts_once(app) -> None:
    add_js_file = getattr(app.builder, "add_js_file", None)
    if add_js_file is None:  # not an HTML builder
        return

    def add_js_file_named(filename, **kwargs):
        return add_js_file(filename or "", **kwargs)  # None and "" are the same inline script

    app.builder.add_js_file = add_js_file_named


def setup(app):
    app.connect("config-inited", vendor)
    app.add_css_file("attention-course.css")
    app.connect("builder-inited", inline_scripts_once)
    app.connect("build-finished", refresh_output)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
