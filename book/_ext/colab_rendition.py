"""Sphinx extension (``local_extensions`` in _config.yml): what a learner sees on Colab.

Colab renders plain Markdown, not MyST: an exercise, a theorem, a numbered equation or a solution dropdown of the
chapters would show there as raw directive syntax. So the build writes a *rendition* of every chapter notebook
beside the site, ``_build/html/_colab/<page>.ipynb`` (``_colab/notebooks/03_masks.ipynb``), with the same code cells
in the same order and the MyST turned into what Colab can show:

- ``{exercise}`` / ``{prf:theorem}`` ... : a heading or a bold line with the number the website gives it ("Exercise
  3.1 (title)", "Theorem 3.1 (title)"), then the text; ``{prf:proof}``: "Proof." ... "∎";
- the frontmatter that numbers the chapter in JupyterLab (book/_ext/lab_numbering.py): dropped;
- ``$$ ... $$ (label)``: the equation with its website number as ``\\tag{3.1}``; ``(label)=`` targets: dropped;
- ``{eq}``, ``{prf:ref}``, ``{ref}``, ``{numref}``: the number or title as plain text; ``{doc}`` and links to
  another chapter (``02_softmax.ipynb#anchor``): a link that opens that chapter's rendition in Colab;
- ``{solution-start}`` ... ``{solution-end}``: a heading "Solution to Exercise 3.1 (click to show)" whose section is
  stored collapsed, the body of ``{solution-start}`` (the solution's prose) as a Markdown cell under it, and each
  code cell in it a Colab form (``cellView: form``, first line ``#@title Solution (click to show)``) that hides its
  code until clicked; what follows ``{solution-end}`` (the test cell, the text) goes under a heading "Exercise 3.1
  (continued)" unless it opens with a heading, so that it is not folded away with the solution;
- admonitions and dropdowns: block quotes under a bold title; other directives: their text.

The numbers come from the Sphinx environment of this very build, so they are the website's. The Colab button of
each chapter page is pointed at its rendition as GitHub serves it from the branch the site is published to
(``colab_rendition_branch``, default ``gh-pages``; README, "Publishing the site"):
``https://colab.research.google.com/github/<org>/<repo>/blob/gh-pages/_colab/notebooks/03_masks.ipynb``.
"""
from __future__ import annotations

import copy
import json
import re
from pathlib import Path

RENDITION_DIR = "_colab"
SOLUTION_TITLE = "#@title Solution (click to show)"
DIRECTIVE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|:{3,})\{(?P<name>[^}\s]+)\}[ \t]*(?P<arg>.*?)\s*$")
OPTION = re.compile(r"^[ \t]*:(?P<key>[\w-]+):[ \t]*(?P<value>.*?)\s*$")
PLAIN_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")
ROLE = re.compile(r"\{(?P<role>[\w:-]+)\}`(?P<content>[^`]*)`")
LABELLED_MATH = re.compile(r"\$\$(?P<body>.+?)\$\$[ \t]*\((?P<label>[^()\s]+)\)", re.S)
TARGET_LINE = re.compile(r"^[ \t]*\([^()\s]+\)=[ \t]*\n?", re.M)
FRONTMATTER = re.compile(r"\A---[ \t]*\n.*?\n---[ \t]*(?:\n|\Z)", re.S)  # a notebook's, in its first cell
CHAPTER_LINK = re.compile(r"\]\(\s*(?P<name>\d\d_[A-Za-z0-9_]+)\.ipynb(?:#[^)\s]*)?\s*\)")
ADMONITIONS = {"note", "tip", "hint", "important", "warning", "caution", "attention", "danger", "error", "seealso",
               "admonition", "dropdown", "margin", "sidebar", "topic", "epigraph", "pull-quote"}
PROOF_TYPES = {"theorem", "lemma", "definition", "corollary", "proposition", "remark", "example", "algorithm",
               "axiom", "conjecture", "criterion", "observation", "property", "assumption", "notation"}
CODE_ROLES = {"code", "kbd", "file", "samp", "command", "literal"}
DROPPED = {"toctree", "tableofcontents", "glue", "bibliography", "index", "raw"}


class Context:
    """What a rendition needs from the book: numbers of labels, chapter titles and where the renditions are.

    ``refs``: label -> text ("Exercise 3.1", "Theorem 3.1", "(3.1)", or a section's title);
    ``titles``: notebook name (03_masks) -> its title; ``url``: notebook name -> the URL that opens its rendition;
    ``chapter``: this notebook's chapter number ("3"), or "" when it is not numbered.
    """

    def __init__(self, refs=None, titles=None, url=None, chapter=""):
        self.refs, self.titles, self.chapter = dict(refs or {}), dict(titles or {}), str(chapter)
        self.url = url or (lambda name: f"{name}.ipynb")


# ---------------------------------------------------------------------------------------------- inline markup
def _target(content: str) -> tuple[str | None, str]:
    """`text <target>` -> (text, target); `target` -> (None, target)."""
    match = re.match(r"^(?P<text>.*?)\s*<(?P<target>[^<>]+)>\s*$", content, re.S)
    return (match["text"], match["target"].strip()) if match else (None, content.strip())


def _role(match, ctx: Context) -> str:
    role, (text, target) = match["role"], _target(match["content"])
    if role == "eq":
        return ctx.refs.get(target, f"({target})")
    if role in ("prf:ref", "ref", "numref"):
        number = ctx.refs.get(target, target)
        if text and "%s" in text:
            return text.replace("%s", re.sub(r"^[^\d(]*", "", number))
        return text or number
    if role == "doc":
        name = target.split("/")[-1].removesuffix(".ipynb")
        return f"[{text or ctx.titles.get(name, name)}]({ctx.url(name)})"
    if role == "math":
        return f"${target}$"
    if role in CODE_ROLES:
        return f"`{text or target}`"
    return text or target  # {term}, {abbr}, {sub}, {sup}, ...


def _inline(text: str, ctx: Context) -> str:
    """Roles, numbered equations, targets and chapter links, everywhere but in code blocks."""
    def outside_code(part: str) -> str:
        def tagged(m):
            number = ctx.refs.get(m["label"], "").strip("()")
            body = m["body"].rstrip()
            if not number:
                return f"$${body}\n$$"
            if re.search(r"\\begin\{(align|equation|gather|multline)\*?\}|\\tag", body):
                return f"$${body}\n$$\n\n({number})"  # \tag would clash with the environment's own numbering
            return f"$${body}\n\\tag{{{number}}}\n$$"

        part = LABELLED_MATH.sub(tagged, part)
        part = TARGET_LINE.sub("", part)
        part = ROLE.sub(lambda m: _role(m, ctx), part)
        return CHAPTER_LINK.sub(lambda m: f"]({ctx.url(m['name'])})", part)

    out, chunk, fence = [], [], None
    for line in text.splitlines(keepends=True):
        opening = PLAIN_FENCE.match(line)
        if fence is None and opening and not DIRECTIVE.match(line):
            out.append(outside_code("".join(chunk)))
            chunk, fence = [line], opening.group(1)
        elif fence is not None:
            chunk.append(line)
            if re.match(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}\s*$", line):
                out.append("".join(chunk))
                chunk, fence = [], None
        else:
            chunk.append(line)
    out.append("".join(chunk) if fence is not None else outside_code("".join(chunk)))
    return "".join(out)


# ---------------------------------------------------------------------------------------------- directives
def _split_options(lines: list[str]) -> tuple[dict, list[str]]:
    options, i = {}, 0
    if lines and lines[0].strip() == "---":  # a YAML block of options
        end = next((k for k in range(1, len(lines)) if lines[k].strip() == "---"), None)
        if end is not None:
            for line in lines[1:end]:
                key, _, value = line.partition(":")
                options[key.strip()] = value.strip()
            i = end + 1
    while i < len(lines) and OPTION.match(lines[i]):
        m = OPTION.match(lines[i])
        options[m["key"]] = m["value"]
        i += 1
    return options, lines[i:]


def _quote(text: str) -> str:
    return "\n".join(f"> {line}" if line.strip() else ">" for line in text.strip("\n").splitlines())


def _title(kind: str, label: str | None, arg: str, ctx: Context) -> str:
    number = ctx.refs.get(label or "", kind.capitalize())
    return f"{number} ({arg})" if arg else number


def _directive(name: str, arg: str, options: dict, body: str, ctx: Context, level: int) -> str:
    """One directive (its body already rendered) as Markdown."""
    label = options.get("label")
    kind = name.split(":")[-1]
    if name in ("exercise", "exercise-start"):
        return f"{'#' * level} {_title('exercise', label, arg, ctx)}\n\n{body}".rstrip() + "\n"
    if name == "exercise-end":
        return ""
    if name == "prf:proof":
        return f"**Proof.** {body.strip()} ∎\n"
    if name.startswith("prf:") and kind in PROOF_TYPES:
        return f"**{_title(kind, label, arg, ctx)}.** {body.strip()}\n"
    if name == "math":
        number = ctx.refs.get(label or "", "").strip("()")
        return f"$$\n{body.strip()}\n" + (f"\\tag{{{number}}}\n" if number else "") + "$$\n"
    if name in ("code", "code-block", "sourcecode", "code-cell"):
        return f"```{arg}\n{body.rstrip()}\n```\n"
    if name in ("figure", "image"):
        return f"![{body.strip() or options.get('alt', '')}]({arg})\n"
    if name in DROPPED:
        return ""
    if name in ADMONITIONS:
        heading = arg or {"seealso": "See also", "admonition": "Note", "dropdown": "Details"}.get(name, name.capitalize())
        return _quote(f"**{heading}**\n\n{body}") + "\n"
    return _quote(f"**{arg or name}**\n\n{body}") + "\n"  # an unknown directive: its text, set apart


def _render(text: str, ctx: Context, level: int) -> str:
    """Markdown with every fenced directive replaced (recursively), inline markup left for _inline."""
    lines, out, i = text.splitlines(keepends=True), [], 0
    while i < len(lines):
        m = DIRECTIVE.match(lines[i])
        if not m:
            out.append(lines[i])
            i += 1
            continue
        char, size = m["fence"][0], len(m["fence"])
        close = next((k for k in range(i + 1, len(lines))
                      if re.match(rf"^[ \t]*{re.escape(char)}{{{size},}}\s*$", lines[k])), len(lines))
        options, body = _split_options([ln.rstrip("\n") for ln in lines[i + 1:close]])
        rendered = _render("\n".join(body).strip("\n") + "\n", ctx, level + 1)
        out.append(_directive(m["name"], m["arg"], options, rendered, ctx, level))
        i = close + 1
    return "".join(out)


# ---------------------------------------------------------------------------------------------- notebooks
def _source(cell) -> str:
    return "".join(cell["source"]) if isinstance(cell["source"], list) else cell["source"]


def _cell(kind: str, text: str, cell_id: str, metadata=None) -> dict:
    cell = {"cell_type": kind, "id": cell_id, "metadata": {"id": cell_id, **(metadata or {})},
            "source": text.strip("\n").splitlines(keepends=True)}
    if kind == "code":
        cell.update(outputs=[], execution_count=None)
    return cell


# {solution-start} / {solution-end}, whole: the fence line, options, the body (the solution's prose, backticks and
# math included) up to the line that closes the fence.
SOLUTION_MARK = re.compile(r"^[ \t]*(?P<fence>`{3,}|:{3,})\{solution-(?P<kind>start|end)\}[ \t]*(?P<label>\S*)[^\n]*"
                           r"(?:\n|$)(?:[ \t]*:[\w-]+:[^\n]*\n)*(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*(?:\n|$)",
                           re.M | re.S)


def render_notebook(notebook: dict, ctx: Context) -> dict:
    """The Colab rendition of one chapter notebook (a new dict; ``notebook`` is left as it is)."""
    cells, collapsed, inside, level, first = [], [], False, 3, True
    solution, ended = None, None  # (heading level, "Exercise 3.1") of the solution open / just closed

    def reopen(text: str, cell_id: str) -> None:
        """Colab folds a collapsed heading's section up to the next heading as deep or deeper: what follows a
        solution (its test cell, the text) gets a heading of its own unless it opens with one."""
        nonlocal ended
        if ended is not None:
            depth, name = ended
            opening = re.match(r"(#{1,6}) ", text)
            if not (opening and len(opening.group(1)) <= depth):
                cells.append(_cell("markdown", f"{'#' * depth} {name} (continued)", f"{cell_id}-after-solution"))
        ended = None

    for n, cell in enumerate(notebook["cells"]):
        cell_id = str(cell.get("id") or f"cell-{n}")
        source = _source(cell)
        if cell["cell_type"] != "markdown":
            new = copy.deepcopy(cell)
            new["id"] = cell_id
            if cell["cell_type"] == "code":
                new.update(outputs=[], execution_count=None)
            if cell["cell_type"] == "code" and inside:
                new["metadata"] = {**new.get("metadata", {}), "cellView": "form"}
                new["source"] = f"{SOLUTION_TITLE}\n{source}".splitlines(keepends=True)
            reopen("", cell_id)
            cells.append(new)
            continue
        if first:  # JupyterLab's numbering (book/_ext/lab_numbering.py): Colab would show it as text
            source = FRONTMATTER.sub("", source, count=1)
        headings = [len(h) for h in re.findall(r"^(#{1,5}) ", source, re.M)]
        level = min(headings[-1] + 1, 6) if headings else level  # exercises sit one level below their section
        pieces, start = [], 0
        for m in SOLUTION_MARK.finditer(source):
            pieces += [("text", source[start:m.start()]), (m["kind"], m["label"])]
            if m["kind"] == "start":  # the body: the solution's prose, under the folded heading
                pieces.append(("text", m["body"]))
            start = m.end()
        pieces.append(("text", source[start:]))
        part = 0
        for what, value in pieces:
            part_id = cell_id if part == 0 else f"{cell_id}-{part}"
            if what == "text":
                text = _inline(_render(value, ctx, level), ctx).strip("\n")
                if first and text.startswith("# ") and ctx.chapter:
                    text = f"# {ctx.chapter}. {text[2:]}"
                if text:
                    reopen(text, part_id)
                    cells.append(_cell("markdown", text, part_id))
                    part += 1
                if first and text:
                    first = False
                    cells.append(_cell("markdown", COLAB_NOTE, f"{cell_id}-colab-note"))
            elif what == "start":
                solution = (level, _title("exercise", value, "", ctx))
                heading = f"{'#' * level} Solution to {solution[1]} (click to show)"
                cells.append(_cell("markdown", heading, part_id,
                                   {"jp-MarkdownHeadingCollapsed": True, "heading_collapsed": True}))
                collapsed.append(part_id)
                inside, part = True, part + 1
            else:
                inside, ended = False, solution
    metadata = copy.deepcopy(notebook.get("metadata", {}))
    metadata["colab"] = {"provenance": [], "toc_visible": True, "collapsed_sections": collapsed}
    return {"cells": cells, "metadata": metadata, "nbformat": 4, "nbformat_minor": max(notebook.get("nbformat_minor", 5), 5)}


COLAB_NOTE = ("> *Colab edition.* This copy of the chapter shows the book's exercises, theorems and numbered "
              "equations as plain Markdown, the way Colab can display them; solutions are folded away under "
              "\"Solution to ...\" (click to show). Run the first code cell first: it installs the course package.")


# ---------------------------------------------------------------------------------------------- the build
def _repo(app) -> tuple[str, str] | None:
    url = app.config.html_theme_options.get("repository_url", "")
    m = re.match(r"^https://github\.com/([^/]+)/([^/]+?)(?:\.git)?/?$", url)
    return (m.group(1), m.group(2)) if m else None


def rendition_url(app, docname: str) -> str | None:
    """Where Colab opens the rendition of ``docname`` (notebooks/03_masks), or None without a GitHub repository."""
    repo, colab = _repo(app), app.config.html_theme_options.get("launch_buttons", {}).get("colab_url", "")
    if not repo or not colab:
        return None
    org, name = repo
    return (f"{colab.rstrip('/')}/github/{org}/{name}/blob/{app.config.colab_rendition_branch}/"
            f"{RENDITION_DIR}/{docname}.ipynb")


def _notebook_docs(app) -> list[str]:
    return sorted(d for d in app.env.found_docs if str(app.env.doc2path(d)).endswith(".ipynb"))


def _context(app, docname: str) -> Context:
    env, refs = app.env, {}
    for numbers in env.toc_fignumbers.values():
        for figtype, ids in numbers.items():
            for node_id, number in ids.items():
                text = ".".join(map(str, number))
                if figtype == "displaymath":
                    refs[node_id.removeprefix("equation-")] = f"({text})"
                else:
                    refs.setdefault(node_id, f"{figtype.split(':')[-1].capitalize()} {text}")
    for label, (_doc, _id, title) in env.domaindata.get("std", {}).get("labels", {}).items():
        if title:
            refs.setdefault(label, title)
    titles = {d.split("/")[-1]: env.titles[d].astext() for d in _notebook_docs(app) if d in env.titles}
    folder = docname.rsplit("/", 1)[0] if "/" in docname else ""

    def url(name: str) -> str:
        return rendition_url(app, f"{folder}/{name}".lstrip("/")) or f"{name}.ipynb"

    chapter = ".".join(map(str, env.toc_secnumbers.get(docname, {}).get("", ())))
    return Context(refs, titles, url, chapter)


def write_renditions(app, exception) -> None:
    if exception or getattr(app.builder, "format", None) != "html":
        return
    if not app.config.html_theme_options.get("launch_buttons", {}).get("colab_url", ""):
        return  # no Colab button (the student edition): no renditions, which would carry the solutions
    for docname in _notebook_docs(app):
        source = json.loads(Path(app.env.doc2path(docname)).read_text())
        target = Path(app.outdir) / RENDITION_DIR / f"{docname}.ipynb"
        target.parent.mkdir(parents=True, exist_ok=True)
        rendition = render_notebook(source, _context(app, docname))
        target.write_text(json.dumps(rendition, indent=1, ensure_ascii=False) + "\n")


def point_colab_button(app, pagename, templatename, context, doctree) -> None:
    """The theme's Colab button opens the notebook source; point it at the rendition instead."""
    if pagename not in _notebook_docs(app):
        return
    url = rendition_url(app, pagename)
    colab = app.config.html_theme_options.get("launch_buttons", {}).get("colab_url", "")

    def walk(buttons):
        for button in buttons or []:
            if isinstance(button, dict):
                if colab and str(button.get("url", "")).startswith(colab) and url:
                    button["url"] = url
                walk(button.get("buttons"))

    walk(context.get("header_buttons"))


def setup(app):
    app.add_config_value("colab_rendition_branch", "gh-pages", "html")
    app.connect("html-page-context", point_colab_button, priority=900)  # after the theme's launch buttons (501)
    app.connect("build-finished", write_renditions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
