"""The notebooks are sources: these tests keep them clean and consistent with the book's configuration.

(Executing them is the build's job: `make test` builds the book, which runs every notebook in a fresh kernel and
fails on an error; tests/test_built_pages.py reads what it made. `pytest notebooks/NN_name.ipynb` runs one with nbval.)
"""
import json
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
CONFIG = yaml.safe_load((ROOT / "_config.yml").read_text())


def load(path):
    return json.loads(path.read_text())


def toc_files():
    def walk(node):
        if isinstance(node, dict):
            if "file" in node:
                yield node["file"]
            for value in node.values():
                yield from walk(value)
        elif isinstance(node, list):
            for item in node:
                yield from walk(item)

    toc = yaml.safe_load((ROOT / "_toc.yml").read_text())
    return [toc["root"], *walk(toc)]


def test_there_are_notebooks():
    assert NOTEBOOKS, "no notebooks found under notebooks/"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_stored_without_outputs(path):
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "code":
            assert not cell["outputs"], f"{path.name} cell {i} has stored outputs: clear them before committing"
            assert cell["execution_count"] is None, f"{path.name} cell {i} has an execution count"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_every_cell_has_its_own_id(path):
    """nbformat 4.5 cell ids, unique and stable: without them nbformat warns (an error under the tests' filters, so
    nbval cannot collect the chapter), and nbgrader and JupyterLab make up random ones on every save."""
    nb = load(path)
    assert (nb["nbformat"], nb["nbformat_minor"]) >= (4, 5), f"{path.name}: nbformat {nb['nbformat']}.{nb['nbformat_minor']}"
    ids = [cell.get("id") for cell in nb["cells"]]
    missing = [i for i, cell_id in enumerate(ids) if not cell_id]
    assert not missing, f"{path.name}: cells {missing} have no id (give each one, e.g. 'ch12-07')"
    twice = sorted({cell_id for cell_id in ids if ids.count(cell_id) > 1})
    assert not twice, f"{path.name}: ids used by more than one cell: {twice}"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_no_hard_coded_cuda(path):
    source = "".join("".join(c["source"]) for c in load(path)["cells"])
    assert ".cuda(" not in source, f"{path.name}: use the device chosen in the setup cell, not .cuda()"
    assert "device=\"cuda\"" not in source and "device='cuda'" not in source


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_setup_cell(path):
    """First code cell: installs from the configured repository on Colab, picks the device once, seeds."""
    code = [c for c in load(path)["cells"] if c["cell_type"] == "code"]
    setup = "".join(code[0]["source"])
    repo = CONFIG["repository"]["url"]
    assert "google.colab" in setup
    urls = re.findall(r"https://github\.com/[\w.-]+/[\w.-]+", setup)
    assert urls == [repo], f"{path.name}: the Colab install must use {repo} (from _config.yml), found {urls}"
    assert re.search(r"%pip install .*git\+", setup), f"{path.name}: the Colab branch must %pip install the package"
    assert "pick_device(" in setup, f"{path.name}: the setup cell must choose the device with pick_device()"
    later = "".join("".join(c["source"]) for c in code[1:])
    assert "pick_device(" not in later, f"{path.name}: choose the device once, in the setup cell"


def test_every_notebook_is_in_the_toc_and_every_toc_entry_exists():
    listed = set(toc_files())
    for path in NOTEBOOKS:
        assert f"notebooks/{path.stem}" in listed, f"{path.name} is not in _toc.yml"
    for entry in listed:
        assert any((ROOT / f"{entry}{ext}").exists() for ext in (".md", ".ipynb")), f"_toc.yml lists {entry}, missing"


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_code_lines_fit_the_page(path):
    """The website shows about 80 characters of code before a horizontal scrollbar."""
    for i, cell in enumerate(load(path)["cells"]):
        if cell["cell_type"] == "code":
            for line in "".join(cell["source"]).splitlines():
                assert len(line) <= 79, f"{path.name} cell {i}: {len(line)} characters: {line!r}"


# ------------------------------------------------------------------------------------------------------------------
# Conventions that keep a notebook readable outside the website (JupyterLab with jupyterlab-myst, Colab):
#   (a) a solution stays folded in JupyterLab: its prose is the BODY of the {solution-start} directive (jupyterlab-myst
#       folds only the start cell's own directive into the dropdown: a markdown cell between {solution-start} and
#       {solution-end}, or text after the start directive in its cell, stays in plain view), and every code cell
#       between them has metadata jupyter.source_hidden = true and jupyter.outputs_hidden = true (JupyterLab and
#       Notebook 7 fold its code and its output away);
#   (b) references stay inside their notebook: no {doc} role, and {eq} / {prf:ref} / {ref} / {numref} only to labels
#       the same notebook defines (one notebook is rendered alone there); another chapter is reached by a relative
#       link `NN_name.ipynb` or `NN_name.ipynb#anchor` to a notebook that exists, whose anchor it defines;
#   (c) nbval's markers are cell tags (nbval-check-output, ...), not `# NBVAL_...` comments a reader sees;
#   (d) JupyterLab gives exercises, theorems and equations the website's numbers (numbering_problems).
# Each rule is a function from notebook(s) to a list of problems, checked on the chapters and on hand-made notebooks.
# A whole {solution-start} directive (fence line, options, body up to the closing fence) or {solution-end}.
SOLUTION_MARK = re.compile(r"^[ \t]*(?P<fence>`{3,}|:{3,})\{solution-(?P<kind>start|end)\}[^\n]*(?:\n|$)"
                           r"(?P<body>.*?)^[ \t]*(?P=fence)[ \t]*$", re.M | re.S)
LABEL_DEFINITIONS = [
    re.compile(r"^\s*:label:\s*(\S+)", re.M),  # directive option: exercises, theorems, figures, math
    re.compile(r"^\s*\(([^()\s]+)\)=\s*$", re.M),  # a target line: (label)=
    re.compile(r"\$\$\s*\(([^()\s]+)\)\s*$", re.M),  # a numbered equation: $$ ... $$ (label)
]
REFERENCE = re.compile(r"\{(prf:ref|ref|numref|eq|doc)\}`([^`]*)`")
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
CHAPTER_LINK = re.compile(r"^(\d\d_[A-Za-z0-9_]+)\.ipynb(?:#([A-Za-z0-9_.:-]+))?$")
NBVAL_TAGS = {"nbval-ignore-output", "nbval-check-output", "nbval-raises-exception", "nbval-skip", "raises-exception"}


def markdown_of(notebook) -> str:
    return "\n\n".join("".join(c["source"]) for c in notebook["cells"] if c["cell_type"] == "markdown")


def heading_slugs(notebook) -> set:
    """The anchors MyST gives headings (myst_heading_anchors style: lower case, words joined by '-')."""
    slugs = set()
    for line in markdown_of(notebook).splitlines():
        match = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if match:
            text = re.sub(r"[^\w\s-]", "", match.group(1).lower()).strip()
            slugs.add(re.sub(r"[\s]+", "-", text))
    return slugs


def labels_of(notebook) -> set:
    text = markdown_of(notebook)
    return {label for pattern in LABEL_DEFINITIONS for label in pattern.findall(text)}


def anchors_of(notebook) -> set:
    """What `NN_name.ipynb#anchor` may point at: a label (equations also as equation-label) or a heading."""
    labels = labels_of(notebook)
    return labels | {f"equation-{label}" for label in labels} | heading_slugs(notebook)


def hidden_solution_problems(notebook) -> list[str]:
    """(a) Solution prose outside the start directive's body, and solution code cells not folded away."""
    problems, inside, opened_at = [], False, None
    leak = ("stays in plain view in JupyterLab: move it into the body of the {{solution-start}} directive of cell "
            "{at} (or into a comment of the code)")
    for i, cell in enumerate(notebook["cells"]):
        source = "".join(cell["source"])
        if cell["cell_type"] == "markdown":
            position = 0
            for match in SOLUTION_MARK.finditer(source):
                between = source[position:match.start()]
                if inside and between.strip():
                    problems.append(f"cell {i}: solution prose {between.strip()[:40]!r} " + leak.format(at=opened_at))
                if match["kind"] == "start" and inside:
                    problems.append(f"cell {i}: a {{solution-start}} inside the solution opened in cell {opened_at}")
                if match["kind"] == "end" and not inside:
                    problems.append(f"cell {i}: a {{solution-end}} with no {{solution-start}} before it")
                inside, opened_at = match["kind"] == "start", i if match["kind"] == "start" else opened_at
                position = match.end()
            rest = source[position:]
            if inside and rest.strip():
                problems.append(f"cell {i}: solution prose {rest.strip()[:40]!r} " + leak.format(at=opened_at))
        elif cell["cell_type"] == "code" and inside:
            folded = cell.get("metadata", {}).get("jupyter", {})
            first = source.splitlines()[0] if source else ""
            for key in ("source_hidden", "outputs_hidden"):
                if folded.get(key) is not True:
                    problems.append(f"cell {i} (solution code, {first!r}): metadata jupyter.{key} is not true")
    if inside:
        problems.append(f"the solution opened in cell {opened_at} has no {{solution-end}}")
    return problems


def reference_problems(name: str, notebooks: dict) -> list[str]:
    """(b) {doc} roles, references to labels this notebook does not define, and broken links to other chapters.

    ``notebooks`` maps a file name (01_scores.ipynb) to its notebook; ``name`` is the one checked.
    """
    notebook, problems = notebooks[name], []
    own = labels_of(notebook)
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "markdown":
            continue
        source = "".join(cell["source"])
        for role, content in REFERENCE.findall(source):
            target = re.search(r"<([^<>]+)>\s*$", content)
            target = (target.group(1) if target else content).strip()
            if role == "doc":
                problems.append(f"cell {i}: {{doc}}`{content}`: link the chapter as [title]({target.split('/')[-1]}"
                                ".ipynb) instead (a notebook front end cannot resolve {doc})")
            elif target not in own:
                where = [other for other, nb in notebooks.items() if other != name and target in labels_of(nb)]
                fix = (f"defined in {where[0]}: link it as [text]({where[0]}#{target})" if where
                       else "defined in no notebook")
                problems.append(f"cell {i}: {{{role}}}`{content}`: the label {target!r} is {fix}")
        for href in LINK.findall(source):
            if re.match(r"^[a-z][a-z0-9+.-]*:", href) or href.startswith("#"):
                continue  # another site (https:, mailto:) or an anchor of this page
            match = CHAPTER_LINK.match(href)
            if not match:
                problems.append(f"cell {i}: link {href!r}: link another chapter as NN_name.ipynb or NN_name.ipynb#anchor")
            elif f"{match.group(1)}.ipynb" not in notebooks:
                problems.append(f"cell {i}: link {href!r}: there is no notebook {match.group(1)}.ipynb")
            elif match.group(2) and match.group(2) not in anchors_of(notebooks[f"{match.group(1)}.ipynb"]):
                problems.append(f"cell {i}: link {href!r}: {match.group(1)}.ipynb defines no anchor {match.group(2)!r}")
    return problems


def nbval_marker_problems(notebook) -> list[str]:
    """(c) `# NBVAL_...` comments in code cells, and nbval tags with a typo (nbval would ignore them)."""
    problems = []
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] != "code":
            continue
        for line in "".join(cell["source"]).splitlines():
            if "NBVAL_" in line:
                tag = re.search(r"NBVAL_(\w+)", line).group(1).lower().replace("_", "-")
                problems.append(f"cell {i}: {line.strip()!r}: use the cell tag 'nbval-{tag}' instead")
        for tag in cell.get("metadata", {}).get("tags", []):
            if tag.startswith("nbval") and tag not in NBVAL_TAGS:
                problems.append(f"cell {i}: unknown nbval tag {tag!r} (known: {sorted(NBVAL_TAGS)})")
    return problems


def _lab_numbering():
    import importlib.util

    spec = importlib.util.spec_from_file_location("lab_numbering", ROOT / "book" / "_ext" / "lab_numbering.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


LAB_NUMBERING = _lab_numbering()
DISPLAY_MATH = re.compile(r"\$\$(?P<body>.+?)\$\$(?P<label>[ \t]*\([^()\s]+\))?", re.S)


def numbering_problems(notebook, chapter: str) -> list[str]:
    """(d) JupyterLab numbers as the website does: the first Markdown cell opens with the frontmatter that numbers
    exercises, equations and theorems "chapter.n" (book/_ext/lab_numbering.py), and every display equation has a
    label (JupyterLab numbers them all, the website only labelled ones)."""
    problems = []
    first = next((c for c in notebook["cells"] if c["cell_type"] == "markdown"), None)
    block = LAB_NUMBERING.split_frontmatter("".join(first["source"]))[0] if first else ""
    if block != LAB_NUMBERING.frontmatter(chapter):
        found = f"it has {block!r}" if block else "it has none"
        problems.append(f"the first Markdown cell must open with the frontmatter numbering chapter {chapter} in "
                        f"JupyterLab ({found}): run `python book/_ext/lab_numbering.py`")
    for i, cell in enumerate(notebook["cells"]):
        if cell["cell_type"] == "markdown":
            for match in DISPLAY_MATH.finditer("".join(cell["source"])):
                if not match["label"]:
                    problems.append(f"cell {i}: the display equation {' '.join(match['body'].split())[:40]!r} has "
                                    "no label: JupyterLab numbers it, the website does not; add one: $$ ... $$ (eq-...)")
    return problems


CHAPTERS = {path.name: load(path) for path in NOTEBOOKS}
NUMBERS = {f"{entry.split('/')[-1]}.ipynb": number for entry, number in LAB_NUMBERING.chapter_numbers(ROOT).items()}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_jupyterlab_numbers_as_the_website(path):
    assert path.name in NUMBERS, f"{path.name} is in no numbered part of _toc.yml"
    problems = numbering_problems(CHAPTERS[path.name], NUMBERS[path.name])
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_solution_code_is_hidden(path):
    problems = hidden_solution_problems(CHAPTERS[path.name])
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_references_stay_inside_the_notebook(path):
    problems = reference_problems(path.name, CHAPTERS)
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.name)
def test_nbval_markers_are_cell_tags(path):
    problems = nbval_marker_problems(CHAPTERS[path.name])
    assert not problems, f"{path.name}:\n" + "\n".join(problems)


# ------------------------------------------------------------------------- the rules on hand-made notebooks
def md(text):
    return {"cell_type": "markdown", "metadata": {}, "source": text.splitlines(keepends=True)}


def code(text, hidden=False, tags=()):
    metadata = {"jupyter": {"source_hidden": True, "outputs_hidden": True}} if hidden else {}
    if tags:
        metadata["tags"] = list(tags)
    return {"cell_type": "code", "metadata": metadata, "source": text.splitlines(keepends=True), "outputs": [],
            "execution_count": None}


def notebook(*cells):
    return {"cells": list(cells), "metadata": {}, "nbformat": 4, "nbformat_minor": 5}


SOLUTION = ("```{solution-start} ex-one\n:class: dropdown\n```\n", "```{solution-end}\n```\n")
# The prose in the start directive's body: backticks, math, a list, a nested code block (a longer fence outside).
SOLUTION_WITH_BODY = ("````{solution-start} ex-one\n:class: dropdown\n\nFill with `-inf`, then:\n\n- $e^{-\\infty} = 0$;"
                      "\n- the cell below checks it.\n\n```python\nx = 1\n```\n````\n")
GOOD_ONE = notebook(
    md("# One\n\n(sec-one)=\n## Scores\n\n$$\ns = q^\\top k\n$$ (eq-one)\n\n```{exercise} Do it\n:label: ex-one\n\nGo.\n```"),
    code("x = 1"),
    md("Text before the solution.\n\n" + SOLUTION_WITH_BODY),
    code("def answer():\n    return 1", hidden=True),
    code("answer()", hidden=True, tags=["nbval-check-output"]),
    md(SOLUTION[1] + "\nSee {eq}`eq-one`, {ref}`sec-one`, {prf:ref}`the exercise <ex-one>`, [two](02_two.ipynb),"
       " [its law](02_two.ipynb#thm-two), [its equation](02_two.ipynb#equation-eq-two), [the top](02_two.ipynb#two)"
       " and [PyTorch](https://pytorch.org)."),
)
GOOD_TWO = notebook(md("# Two\n\n```{prf:theorem} A law\n:label: thm-two\n\nTrue.\n```\n\n$$\na\n$$ (eq-two)"))


def test_rules_pass_a_good_notebook():
    chapters = {"01_one.ipynb": GOOD_ONE, "02_two.ipynb": GOOD_TWO}
    assert labels_of(GOOD_ONE) == {"sec-one", "eq-one", "ex-one"}
    assert hidden_solution_problems(GOOD_ONE) == []
    assert reference_problems("01_one.ipynb", chapters) == []
    assert reference_problems("02_two.ipynb", chapters) == []
    assert nbval_marker_problems(GOOD_ONE) == []


def test_visible_solution_code_is_caught():
    bad = notebook(md(SOLUTION[0]), code("def answer():\n    return 1"), md(SOLUTION[1]), code("answer()"))
    problems = hidden_solution_problems(bad)
    assert len(problems) == 2 and all("cell 1" in p and "def answer" in p for p in problems)
    assert "source_hidden" in problems[0] and "outputs_hidden" in problems[1]
    shown_output = code("answer()", hidden=True)
    del shown_output["metadata"]["jupyter"]["outputs_hidden"]
    problems = hidden_solution_problems(notebook(md(SOLUTION[0]), shown_output, md(SOLUTION[1])))
    assert len(problems) == 1 and "cell 1" in problems[0] and "jupyter.outputs_hidden is not true" in problems[0]
    unclosed = notebook(md(SOLUTION[0]), code("x", hidden=True))
    assert "has no {solution-end}" in hidden_solution_problems(unclosed)[0]
    assert "no {solution-start}" in hidden_solution_problems(notebook(md(SOLUTION[1])))[0]


@pytest.mark.parametrize("cells, where, prose", [
    # the old layout: the explanation in a cell of its own after the start directive
    ([md(SOLUTION[0]), md("Fill with `-inf` first."), code("x", hidden=True), md(SOLUTION[1])], "cell 1", "Fill"),
    # text after the start directive, in its own cell
    ([md(SOLUTION[0] + "\nFill with `-inf` first."), code("x", hidden=True), md(SOLUTION[1])], "cell 0", "Fill"),
    # a comment on the result after the code, before the end
    ([md(SOLUTION_WITH_BODY), code("x", hidden=True), md("As the output shows.\n\n" + SOLUTION[1])], "cell 2", "As"),
    ([md(SOLUTION_WITH_BODY), code("x", hidden=True), md("As the output shows."), md(SOLUTION[1])], "cell 2", "As"),
])
def test_solution_prose_outside_the_dropdown_is_caught(cells, where, prose):
    """JupyterLab folds only the start directive: prose anywhere else between the gates is in plain view."""
    problems = hidden_solution_problems(notebook(*cells))
    assert len(problems) == 1, problems
    assert problems[0].startswith(f"{where}: solution prose {prose!r}"[:-1]) and "body of the {solution-start}" in problems[0]


def test_a_converted_solution_passes_and_its_old_layout_is_caught():
    """tests/fixtures/solution_in_body.ipynb: chapter 3's Ex. 3.2 with its prose in the start directive's body. Put
    back as the chapter had it (the prose in a cell of its own, code with source_hidden only), it leaks."""
    fixture = load(ROOT / "tests" / "fixtures" / "solution_in_body.ipynb")
    assert hidden_solution_problems(fixture) == []
    old = json.loads(json.dumps(fixture))
    start = old["cells"][3]
    match = SOLUTION_MARK.search("".join(start["source"]))
    prose = match["body"].split("\n\n", 2)[1]  # the first paragraph, after the blank line that ends the options
    start["source"] = ["```{solution-start} ex-ch3-masked-softmax\n", ":class: dropdown\n", "```"]
    old["cells"].insert(4, md(prose))
    del old["cells"][5]["metadata"]["jupyter"]["outputs_hidden"]
    problems = hidden_solution_problems(old)
    assert len(problems) == 2, problems
    assert problems[0].startswith("cell 4: solution prose 'Fill with") and "jupyter.outputs_hidden" in problems[1]


def test_prose_after_the_end_and_before_the_start_is_no_solution():
    cells = [md("Before.\n\n" + SOLUTION_WITH_BODY), code("x", hidden=True), md(SOLUTION[1] + "\nAfter, in view.")]
    assert hidden_solution_problems(notebook(*cells)) == []
    both = md(SOLUTION[0] + SOLUTION[1] + "\nNothing was inside.")  # start and end in one cell
    assert hidden_solution_problems(notebook(both)) == []


@pytest.mark.parametrize("text, expected", [
    ("As in {doc}`02_two`.", "[title](02_two.ipynb)"),
    ("By {prf:ref}`thm-two`.", "defined in 02_two.ipynb: link it as [text](02_two.ipynb#thm-two)"),
    ("By {prf:ref}`the law <thm-two>`.", "defined in 02_two.ipynb"),
    ("See {eq}`eq-two`.", "defined in 02_two.ipynb"),
    ("See {numref}`fig-nowhere`.", "defined in no notebook"),
    ("See [two](../notebooks/02_two.ipynb).", "link another chapter as NN_name.ipynb"),
    ("See [two](02_two.html).", "link another chapter as NN_name.ipynb"),
    ("See [three](03_three.ipynb).", "no notebook 03_three.ipynb"),
    ("See [two](02_two.ipynb#eq-nowhere).", "defines no anchor 'eq-nowhere'"),
])
def test_references_across_notebooks_are_caught(text, expected):
    chapters = {"01_one.ipynb": notebook(md(text)), "02_two.ipynb": GOOD_TWO}
    problems = reference_problems("01_one.ipynb", chapters)
    assert len(problems) == 1 and expected in problems[0], problems


def test_nbval_comments_and_misspelt_tags_are_caught():
    bad = notebook(code("# NBVAL_CHECK_OUTPUT\nprint(1)"), code("x = 2", tags=["nbval-check-outputs"]))
    problems = nbval_marker_problems(bad)
    assert len(problems) == 2
    assert "cell 0" in problems[0] and "'nbval-check-output'" in problems[0]
    assert "cell 1" in problems[1] and "unknown nbval tag 'nbval-check-outputs'" in problems[1]


def test_jupyterlab_loads_jupyterlab_myst():
    """The MyST renderer the requirements install is one the installed JupyterLab accepts (not marked X)."""
    import shutil
    import subprocess
    import sys

    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent)) or shutil.which("jupyter")
    if jupyter is None:
        pytest.skip("no jupyter command: pip install -e .")
    listing = subprocess.run([jupyter, "labextension", "list"], capture_output=True, text=True, timeout=120)
    text = re.sub(r"\x1b\[[0-9;]*m", "", listing.stdout + listing.stderr)
    line = next((ln for ln in text.splitlines() if "jupyterlab-myst" in ln and " v" in ln), None)
    assert line is not None, f"jupyterlab-myst is not installed as a JupyterLab extension:\n{text}"
    assert "enabled" in line and line.split("enabled", 1)[1].strip().startswith("OK"), (
        f"JupyterLab does not load jupyterlab-myst (see requirements.txt):\n{text}")


def test_numbering_rule_and_its_writer(tmp_path):
    """The frontmatter is required, with the chapter's own number; unlabelled display equations are caught;
    lab_numbering.py writes the block from _toc.yml, and the site's reader cuts it."""
    title = md("# Three\n\n$$\na\n$$ (eq-a)\n\nand\n\n$$\nb = c\n$$")
    problems = numbering_problems(notebook(title), "3")
    assert len(problems) == 2 and "it has none" in problems[0] and "lab_numbering.py" in problems[0]
    assert problems[1].startswith("cell 0: the display equation 'b = c' has no label")
    good = notebook(md(LAB_NUMBERING.frontmatter("3") + "# Three\n\n$$\na\n$$ (eq-a)"))
    assert numbering_problems(good, "3") == []
    assert "numbering chapter 4" in numbering_problems(good, "4")[0]  # the number of another chapter
    assert "exercise:\n    enumerator: 3.%s" in LAB_NUMBERING.frontmatter("3")
    (tmp_path / "notebooks").mkdir()
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: intro\nparts:\n  - caption: C\n    numbered: true\n"
                                       "    chapters:\n      - file: notebooks/01_a\n      - file: notebooks/02_b\n"
                                       "  - caption: D\n    chapters:\n      - file: guide\n")
    for name in ("01_a", "02_b"):
        (tmp_path / "notebooks" / f"{name}.ipynb").write_text(json.dumps(notebook(md("# A"), code("x = 1"))))
    assert len(LAB_NUMBERING.write(tmp_path)) == 2 and LAB_NUMBERING.write(tmp_path) == []  # and once only
    second = load(tmp_path / "notebooks" / "02_b.ipynb")
    assert numbering_problems(second, "2") == [] and "".join(second["cells"][0]["source"]).endswith("---\n# A")

    class App:  # what cut_frontmatter uses of Sphinx
        env = type("Env", (), {"doc2path": lambda self, name: f"{name}.ipynb"})()

    source = [json.dumps(second)]
    LAB_NUMBERING.cut_frontmatter(App(), "notebooks/02_b", source)
    assert json.loads(source[0])["cells"][0]["source"] == "# A"
