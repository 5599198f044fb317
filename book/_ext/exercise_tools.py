"""Sphinx extension (``_config.yml``'s ``local_extensions``): the exercises' nbgrader marks, as readers see them.

1. ``### BEGIN SOLUTION`` / ``### END SOLUTION`` lines mark, for nbgrader, the part of a solution cell that the
   student edition replaces with a stub. They mean nothing to a reader of the website: they are dropped from the
   code shown (the notebooks keep them).
2. With ``student_edition: true`` (``make student``), every solution is removed after sphinx-exercise has merged
   the gated ones (so the code cells between ``{solution-start}`` and ``{solution-end}`` go with them), and the
   outputs of the graded test cells are dropped: they were computed with the solutions and would only say
   "Correct" to a student whose notebook still holds the stub. (sphinx-exercise's own ``hide_solutions`` drops
   only the start of a gated solution: its code cells stay on the page and the build fails on the orphaned end.)
3. A gated solution's prose is the body of its ``{solution-start}`` directive (it folds in JupyterLab too):
   ``SolutionBodyIntoGate`` keeps it in the dropdown, which sphinx-exercise's merge of gated solutions would drop.
4. The directive ``exercise-list`` writes the table of every exercise (chapter, label, auto-checked, points),
   read from the notebooks by ``instructor/exercises.py``: the instructor guide never lists them by hand. In a
   translated build (book/_ext/i18n.py) its words are the page's language's (``LIST_WORDS``) and the exercises'
   titles their translations, from the chapters' catalogs.
"""
from __future__ import annotations

import sys
from pathlib import Path

from docutils import nodes
from sphinx.transforms import SphinxTransform
from sphinx.util.docutils import SphinxDirective
from sphinx_exercise.nodes import solution_node, solution_start_node

ROOT = Path(__file__).resolve().parents[2]
MARKS = ("### BEGIN SOLUTION", "### END SOLUTION")


def drop_marks(app, doctree) -> None:
    for cell in doctree.findall(lambda n: isinstance(n, nodes.container) and n.get("nb_element") == "cell_code"):
        meta = cell.get("cell_metadata", {}).get("nbgrader", {})
        for block in cell.findall(nodes.literal_block):
            text = block.astext()
            if any(mark in text for mark in MARKS):
                kept = [line for line in text.splitlines() if line.strip() not in MARKS]
                block.children = [nodes.Text("\n".join(kept))]
        if meta.get("grade") and app.config.student_edition:
            for output in list(cell.findall(lambda n: isinstance(n, nodes.container)
                                            and n.get("nb_element") == "cell_code_output")):
                output.parent.remove(output)


class SolutionBodyIntoGate(SphinxTransform):
    """The body of a ``{solution-start}`` directive (the solution's prose) opens the solution on the page.

    sphinx-exercise 1.2 parses that body but its merge of gated solutions (MergeGatedSolutions, priority 10) keeps
    only what stands between start and end, and drops it. So, just before the merge, the body moves out of the
    start node to stand right after it: the merge then puts it first in the dropdown, before the code cells.
    """

    default_priority = 9

    def apply(self):
        for start in list(self.document.findall(solution_start_node)):
            for section in [child for child in start.children if isinstance(child, nodes.section)]:
                start.remove(section)
                at = start.parent.index(start) + 1
                for offset, child in enumerate(list(section.children)):
                    start.parent.insert(at + offset, child)


class RemoveSolutions(SphinxTransform):
    """The student edition: no solution node, gated ones included (after sphinx-exercise's merge, priority 10)."""

    default_priority = 50

    def apply(self):
        if self.config.student_edition:
            for node in list(self.document.findall(solution_node)):
                node.parent.remove(node)


class ExerciseList(SphinxDirective):
    """A table of every exercise of the book, from the notebooks."""

    def run(self):
        if str(ROOT) not in sys.path:
            sys.path.insert(0, str(ROOT))
        from instructor.exercises import catalogue, chapters

        language = self.config.language or "en"
        words = {**LIST_WORDS["en"], **LIST_WORDS.get(language, {})}
        titles = {}  # chapter -> its catalog: an exercise's title, translated, in a translated build
        for path in chapters():
            self.env.note_dependency(str(path))
            if language != "en":
                if str(ROOT / "book" / "_ext") not in sys.path:
                    sys.path.insert(0, str(ROOT / "book" / "_ext"))
                from translate_notebooks import catalog_for

                po = ROOT / "book" / "locale" / language / "LC_MESSAGES" / "notebooks" / f"{path.stem}.po"
                if po.exists():
                    self.env.note_dependency(str(po))
                titles[path.stem] = catalog_for(f"notebooks/{path.stem}", language)
        header = [words[w] for w in ("chapter", "label", "exercise", "auto-checked", "points")]
        rows = [[ex.chapter, ex.label, titles.get(ex.chapter, {}).get(ex.title, ex.title),
                 words["yes"] if ex.checked else words["no (by hand)"], f"{ex.max_points:g}"]
                for ex in catalogue()]
        return [table(header, rows)]


# The words of the table, in each language the book is built in (an exercise's title comes from its chapter's
# catalog, book/locale). The table is made by the directive, not read from the page: no catalog holds these words.
LIST_WORDS = {
    "en": {"chapter": "chapter", "label": "label", "exercise": "exercise", "auto-checked": "auto-checked",
           "points": "points", "yes": "yes", "no (by hand)": "no (by hand)"},
    "zh_CN": {"chapter": "章", "label": "标签", "exercise": "练习", "auto-checked": "自动检查",
              "points": "分值", "yes": "是", "no (by hand)": "否（手工评分）"},
}


def table(header: list[str], rows: list[list[str]]) -> nodes.table:
    """A docutils table: a header row, then the rows (the label column in code font)."""
    group = nodes.tgroup(cols=len(header))
    group += [nodes.colspec(colwidth=1) for _ in header]

    def row(cells, code_column=None):
        entries = nodes.row()
        for i, text in enumerate(cells):
            paragraph = nodes.paragraph()
            paragraph += nodes.literal(text=text) if i == code_column else nodes.Text(text)
            entries += nodes.entry("", paragraph)
        return entries

    group += nodes.thead("", row(header))
    group += nodes.tbody("", *(row(cells, code_column=1) for cells in rows))
    return nodes.table("", group, classes=["exercise-list"])


def setup(app):
    app.add_config_value("student_edition", False, "env")
    app.add_transform(SolutionBodyIntoGate)
    app.add_transform(RemoveSolutions)
    app.connect("doctree-read", drop_marks)  # after the transforms
    app.add_directive("exercise-list", ExerciseList)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
