"""The widgets' words: found in their ES modules, read from their catalogs (``locale/<language>.po``).

Every word a widget draws or says is a message: the English text in a call ``tr("...", args)`` or
``trn("singular", "plural", n, args)`` of an ES module (``{name}`` in it is filled from args). :func:`messages` finds
those calls with a small JavaScript tokenizer, so a message is found however the call is laid out (string literals
joined by ``+``, over several lines); :func:`loose_words` finds the literal text outside them, the words that would be
shown untranslated. :func:`read_po` reads a catalog without polib (the package needs nothing beyond its
requirements).

    python -m attention_course.widgets._messages     prints the messages as a .pot template (msgmerge it into
                                                     locale/zh_CN.po to see what is new)
"""
from __future__ import annotations

import functools
import json
import re
from pathlib import Path

HERE = Path(__file__).parent
MODULES = ("_common.js", "mask_broadcast.js", "head_reshape.js", "decode_cache.js")
LOCALE = HERE / "locale"
LANGUAGES = ("en", "zh_CN")  # English is the messages themselves

# After these tokens a "/" starts a regular expression, not a division (the usual rule of JavaScript tokenizers).
_REGEX_AFTER = set("(,=:[!&|?{};+-*%<>~^") | {"return", "typeof", "=>", ""}
_PUNCT = re.compile(r"=>|\.\.\.|\?\?|\?\.|[-+*/%=<>!&|^~?:;,.()\[\]{}]")


def tokens(src: str) -> list[tuple[str, object]]:
    """JavaScript source as tokens: ("name", text), ("punct", text), ("num", text), ("str", value), and
    ("tpl", [text, ...]) for a template literal, its text around the ${...} holes, whose code is tokenized as well
    (its tokens follow the template's, between ("hole", "{") and ("hole", "}"))."""
    out: list[tuple[str, object]] = []
    i, n = 0, len(src)

    def last() -> str:
        for kind, text in reversed(out):
            if kind in ("name", "punct"):
                return text
            if kind != "hole":
                return ")"  # a value: a "/" after it divides
        return ""

    depth = [0]  # brace depth of the code being read; one entry per template hole we are inside

    while i < n:
        c = src[i]
        if c.isspace():
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j
        elif src.startswith("/*", i):
            i = src.index("*/", i) + 2
        elif c in "\"'":
            j, value = i + 1, []
            while src[j] != c:
                if src[j] == "\\":
                    value.append(json.loads(f'"{src[j:j + 2]}"') if src[j + 1] in '"\\/bfnrt' else src[j + 1])
                    j += 2
                else:
                    value.append(src[j])
                    j += 1
            out.append(("str", "".join(value)))
            i = j + 1
        elif c == "`":
            i = _template(src, i + 1, out, depth)
        elif c == "}" and len(depth) > 1 and depth[-1] == 0:
            depth.pop()
            out.append(("hole", "}"))
            i = _template(src, i + 1, out, depth)
        elif c == "/" and last() in _REGEX_AFTER:
            j, in_class = i + 1, False
            while in_class or src[j] != "/":
                in_class = (in_class or src[j] == "[") and src[j] != "]"
                j += 2 if src[j] == "\\" else 1
            j += 1
            while j < n and src[j].isalpha():
                j += 1
            out.append(("regex", src[i:j]))
            i = j
        elif c.isalpha() or c in "_$":
            m = re.compile(r"[\w$]+").match(src, i)
            out.append(("name", m.group()))
            i = m.end()
        elif c.isdigit():
            m = re.compile(r"[\d.]+(?:e[-+]?\d+)?").match(src, i)
            out.append(("num", m.group()))
            i = m.end()
        else:
            m = _PUNCT.match(src, i)
            text = m.group() if m else c
            if text == "{":
                depth[-1] += 1
            elif text == "}":
                depth[-1] -= 1
            out.append(("punct", text))
            i += len(text)
    return out


def _template(src: str, i: int, out: list, depth: list) -> int:
    """Read a template literal's text from i to its end or its next hole; returns where reading goes on."""
    j, text = i, []
    while src[j] != "`" and not src.startswith("${", j):
        if src[j] == "\\":
            text.append(src[j + 1])
            j += 2
        else:
            text.append(src[j])
            j += 1
    out.append(("tpl", "".join(text)))
    if src[j] == "`":
        return j + 1
    out.append(("hole", "{"))
    depth.append(0)
    return j + 2


def _string_at(toks: list, k: int) -> tuple[str | None, int]:
    """The string literal at toks[k], or several joined by +: (its value, the index after it); (None, k) if none."""
    if toks[k][0] != "str":
        return None, k
    parts = [toks[k][1]]
    k += 1
    while toks[k] == ("punct", "+") and toks[k + 1][0] == "str":
        parts.append(toks[k + 1][1])
        k += 2
    return "".join(parts), k


def calls(src: str) -> tuple[list[tuple[str, str | None]], set[int]]:
    """(every message of ``src``: (msgid, msgid_plural or None), the indices of the tokens that are their text)."""
    toks = tokens(src) + [("end", "")] * 3
    found, used = [], set()
    for k, (kind, text) in enumerate(toks):
        if kind != "name" or text not in ("tr", "trn"):
            continue
        if toks[k + 1] == ("punct", "(") and toks[k - 1] != ("name", "function"):  # a call, not the definition
            singular, after = _string_at(toks, k + 2)
            if singular is None:
                raise ValueError(f"{text}() called with no string literal first, after {toks[k - 3:k]}: its message "
                                 "cannot be found")
            plural = None
            if text == "trn":
                if toks[after] != ("punct", ","):
                    raise ValueError(f"trn({singular!r}) has no plural")
                plural, end = _string_at(toks, after + 1)
                if plural is None:
                    raise ValueError(f"trn({singular!r}): its plural is not a string literal")
                after = end
            used.update(range(k + 2, after))
            found.append((singular, plural))
    return found, used


@functools.lru_cache(maxsize=None)  # each module is read once, whichever widgets ask (_base.esm at import)
def _module_messages(name: str) -> tuple[tuple[str, str | None], ...]:
    return tuple(calls((HERE / name).read_text())[0])


def messages(names=MODULES) -> list[tuple[str, str | None]]:
    """Every message of the ES modules ``names``, each once, in the order of first use."""
    seen: dict[tuple[str, str | None], None] = {}
    for name in names:
        for message in _module_messages(name):
            seen.setdefault(message)
    return list(seen)


# Text a module writes that is never read as words: markup, CSS classes, attribute and event names, trait names.
_MARKUP = re.compile(r"<[^>]*>|\{\w+\}|&#?\w+;")


def loose_words(src: str) -> list[str]:
    """The words (two letters or more) of every string and template text of ``src`` outside tr()/trn() messages,
    markup taken out: what a module could show untranslated."""
    toks = tokens(src)
    _, used = calls(src)
    words = []
    for k, (kind, text) in enumerate(toks):
        if kind in ("str", "tpl") and k not in used and toks[k - 2:k] != [("name", "Error"), ("punct", "(")]:
            words += re.findall(r"[A-Za-z][\w.-]*[A-Za-z0-9]", _MARKUP.sub(" ", text))
    return words


def read_po(path: Path) -> dict[str, object]:
    """msgid -> msgstr of a .po file (a list of msgstr[n] for a message with a plural): translated, not fuzzy."""
    catalog: dict[str, object] = {}
    for block in re.split(r"\n[ \t]*\n", Path(path).read_text(encoding="utf-8")):
        fields: dict[str, str] = {}
        key, fuzzy = None, False
        for line in block.strip().splitlines():
            if line.startswith("#,"):
                fuzzy = fuzzy or "fuzzy" in line
            elif line.startswith("#"):
                continue
            elif line.startswith('"'):
                fields[key] += json.loads(line)
            else:
                key, _, text = line.partition(" ")
                fields[key] = json.loads(text)
        msgid = fields.get("msgid")
        if not msgid or fuzzy:
            continue
        if "msgid_plural" in fields:
            forms = [fields[k] for k in sorted(k for k in fields if k.startswith("msgstr["))]
            if forms and all(forms):
                catalog[msgid] = forms
        elif fields.get("msgstr"):
            catalog[msgid] = fields["msgstr"]
    return catalog


def catalogs() -> dict[str, dict[str, object]]:
    """language -> its catalog, for every language but English."""
    return {lang: read_po(LOCALE / f"{lang}.po") for lang in LANGUAGES if lang != "en"}


def _quote(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def pot() -> str:
    """The messages as a .pot template."""
    out = ['msgid ""', 'msgstr ""', '"Content-Type: text/plain; charset=UTF-8\\n"', ""]
    for singular, plural in messages():
        out.append(f"msgid {_quote(singular)}")
        if plural is None:
            out += ['msgstr ""', ""]
        else:
            out += [f"msgid_plural {_quote(plural)}", 'msgstr[0] ""', 'msgstr[1] ""', ""]
    return "\n".join(out)


if __name__ == "__main__":
    print(pot())
