"""The Chinese edition's commands (book/locale/MAKEFILE-SNIPPET.txt calls them; book/_ext/i18n.py explains the design).

    python book/_ext/zh_edition.py build [--student] [--all]   the Chinese site, after the English one: Jupyter Book's own
        build with ``language = zh_CN``, the English build's execution cache (nothing is executed again unless a
        notebook's code changed since), -W -n --keep-going; into _build/zh/html (its doctrees and executed copies
        beside it, in _build/zh/), then copied to _build/html/zh/ where the English pages link to it.
        --student: the student edition (``student_edition = True``, no Colab button), into _build/zh/student/html,
        copied to _build/student/html/zh/. --all: write every page (as jupyter-book's --all). --no-publish: not
        copied; ``publish [--student]`` copies it later (make student builds it while the English student edition is
        built, which replaces _build/student/html whole).
    python book/_ext/zh_edition.py translations [--check]   extract the messages of every page (Sphinx's gettext
        builder into _build/gettext), update the catalogs of book/locale with sphinx-intl (a changed English sentence
        becomes a new, untranslated message, or a fuzzy one where gettext finds the old one close), and list per file
        what needs translating; and the figures' catalog from the English build's execution cache (figures.po,
        book/_ext/zh_figures.py). --check: only the list, exit status 1 when anything does.
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
BUILD = ROOT / "_build"
LOCALE = ROOT / "book" / "locale"
LANGUAGE = "zh_CN"
sys.path.insert(0, str(ROOT / "book" / "_ext"))


def sphinx(builder: str, out: Path, doctrees: Path, overrides: dict, config: Path = ROOT / "_config.yml",
           fresh: bool = False, force_all: bool = False) -> int:
    from jupyter_book.sphinx import build_sphinx

    overrides = {"external_toc_path": (ROOT / "_toc.yml").as_posix(), "nitpicky": True, "latex_individualpages": False,
                 "nb_execution_cache_path": str(BUILD / ".jupyter_cache"), **overrides}
    result = build_sphinx(ROOT, out, noconfig=True, path_config=str(config), confoverrides=overrides,
                          doctreedir=doctrees, builder=builder, warningiserror=True, keep_going=True,
                          freshenv=fresh, force_all=force_all)
    if isinstance(result, Exception):
        raise result
    return result


def edition(student: bool) -> tuple[Path, Path]:
    """Where the Chinese (student) edition is built, and where it is published, beside its English edition."""
    where = BUILD / "zh" / ("student" if student else "")
    return where / "html", BUILD / ("student" if student else "") / "html" / "zh"


def publish(student: bool) -> int:
    """The built Chinese (student) edition copied beside its English edition (its pages link there)."""
    out, published = edition(student)
    if not (out / "index.html").exists():
        print(f"no Chinese edition in {out}: build it first (zh_edition.py build{' --student' if student else ''})")
        return 1
    shutil.rmtree(published, ignore_errors=True)
    shutil.copytree(out, published, ignore=shutil.ignore_patterns("reports"))
    return 0


def build(student: bool, force_all: bool = False, published: bool = True) -> int:
    """The Chinese (student) edition into _build/zh/(student/)html, then, if ``published``, beside its English one
    (the English student edition's site must be built by then: make student builds both at once, then publishes)."""
    start = time.perf_counter()
    out, beside = edition(student)
    where = out.parent
    config = ROOT / "_config.yml"
    if student:  # the English student edition's configuration (instructor/student.py): no solutions, no Colab
        sys.path.insert(0, str(ROOT))
        from instructor.student import student_config

        where.mkdir(parents=True, exist_ok=True)
        config = student_config(where)
    status = sphinx("html", out, where / ".doctrees", {"language": LANGUAGE}, config, force_all=force_all)
    if status:
        shutil.rmtree(out, ignore_errors=True)
        print(f"The Chinese build failed: {out} removed.")
        return status
    if student:  # the download button serves the student notebooks (nbgrader's), translated
        from translate_notebooks import catalog_for, translate_notebook

        for path in sorted((BUILD / "student" / "notebooks").glob("*.ipynb")):
            notebook = json.loads(path.read_text())
            translated, _ = translate_notebook(notebook, catalog_for(f"notebooks/{path.stem}", LANGUAGE, LOCALE))
            (out / "_sources" / "notebooks" / path.name).write_text(
                json.dumps(translated, indent=1, ensure_ascii=False) + "\n")
    if not published:
        print(f"The Chinese edition is in {out} ({time.perf_counter() - start:.0f} s).")
        return 0
    status = publish(student)
    print(f"The Chinese edition is in {out}, and in {beside} beside the English one "
          f"({time.perf_counter() - start:.0f} s).")
    return status


# What a message holds that is not words to translate: inline code, math, roles with their targets, numbers, marks.
NOT_WORDS = re.compile(r"\{[\w:-]+\}`[^`]*`|``[^`]*``|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|[\W\d_]+", re.S)


def code_only(msgid: str) -> bool:
    """A message with nothing but code, math, numbers and punctuation ('`B`', '$QK^T$'): it reads the same in Chinese.
    So does an image's own message ('.. image:: /_build/jupyter_execute/<hash>.png'): a figure's file, named by a hash
    of its bytes, which change with every run of a figure of measured times (its alt text is a message of its own)."""
    return msgid.startswith(".. image:: ") or not re.search(r"[^\W\d_]", NOT_WORDS.sub(" ", msgid))


def fill_code_only(locale: Path = LOCALE) -> int:
    """Untranslated messages of code or math alone get themselves as translation (one translator's chore less)."""
    import polib

    filled = 0
    for path in sorted((Path(locale) / LANGUAGE / "LC_MESSAGES").rglob("*.po")):
        po, changed = polib.pofile(str(path), wrapwidth=0), False
        for entry in po:
            if not entry.obsolete and not entry.msgstr and code_only(entry.msgid):
                entry.msgstr, changed, filled = entry.msgid, True, filled + 1
        if changed:
            po.save()
    return filled


def counts(locale: Path = LOCALE) -> list[dict]:
    """Per catalog: messages, translated, untranslated, fuzzy, and the English words still to translate."""
    import polib

    rows = []
    for path in sorted((Path(locale) / LANGUAGE / "LC_MESSAGES").rglob("*.po")):
        po = polib.pofile(str(path))
        entries = [e for e in po if not e.obsolete]
        todo = [e for e in entries if not e.msgstr or "fuzzy" in e.flags]
        rows.append({"file": path.relative_to(locale).as_posix(), "messages": len(entries),
                     "words": sum(len(e.msgid.split()) for e in entries),
                     "translated": len(entries) - len(todo), "untranslated": sum(not e.msgstr for e in entries),
                     "fuzzy": sum(bool(e.msgstr) and "fuzzy" in e.flags for e in entries),
                     "words_to_do": sum(len(e.msgid.split()) for e in todo)})
    return rows


def table(rows: list[dict]) -> str:
    head = f"| {'catalog':52} | messages | words | translated | untranslated | fuzzy | words to do |"
    lines = [head, "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"]
    for r in rows:
        lines.append(f"| {r['file']:52} | {r['messages']:8} | {r['words']:5} | {r['translated']:10} | "
                     f"{r['untranslated']:12} | {r['fuzzy']:5} | {r['words_to_do']:11} |")
    total = {k: sum(r[k] for r in rows) for k in ("messages", "words", "translated", "untranslated", "fuzzy",
                                                  "words_to_do")}
    lines.append(f"| {'all':52} | {total['messages']:8} | {total['words']:5} | {total['translated']:10} | "
                 f"{total['untranslated']:12} | {total['fuzzy']:5} | {total['words_to_do']:11} |")
    return "\n".join(lines)


def translations(check: bool) -> int:
    if not check:
        start = time.perf_counter()
        pot = BUILD / "gettext"
        status = sphinx("gettext", pot, pot / ".doctrees", {}, fresh=True)  # every page read: every message
        if status:
            return status
        subprocess.run([sys.executable, "-m", "sphinx_intl", "update", "-p", str(pot), "-l", LANGUAGE,
                        "-d", str(LOCALE), "-w", "0"], check=True, stdout=subprocess.DEVNULL)
        filled = fill_code_only()
        if (BUILD / ".jupyter_cache").exists():  # the figures' words, from the English build's run (zh_figures.py)
            from zh_figures import CATALOG, extract

            added, gone = extract()
            print(f"{CATALOG.relative_to(ROOT)}: {added} new messages, {gone} obsolete")
        print(f"catalogs updated in {time.perf_counter() - start:.0f} s ({filled} messages of code or math alone "
              "copied as their own translation)")
    rows = counts()
    print(table(rows))
    todo = sum(r["untranslated"] + r["fuzzy"] for r in rows)
    if todo:
        print(f"\n{todo} messages need translating (untranslated or fuzzy): book/locale/TRANSLATING.md says how.")
    return 1 if (check and todo) else 0


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["build"]:
        sys.exit(build("--student" in args, "--all" in args, "--no-publish" not in args))
    if args[:1] == ["publish"]:
        sys.exit(publish("--student" in args))
    if args[:1] == ["translations"]:
        sys.exit(translations("--check" in args))
    sys.exit(__doc__)
