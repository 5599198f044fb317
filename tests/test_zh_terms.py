"""One term per concept in the Chinese edition: the variants the glossary settled against never appear in a msgstr.

Reads the catalogs only (no build). Each concept has the term of book/locale/glossary.md and the spellings a
translator might write instead; a variant is searched for in the prose of every translation, with inline code,
math, roles and link targets taken out (so `torch.bool` or `-> bool` in code is not prose). Single characters that
are a legitimate term of another concept (块 for a block, 段, 池 for the cache's pool), or a word of another
sense (平铺: `repeat` tiles the heads), are never a variant here:
each variant is a string that means the settled concept and nothing else in this book.
"""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CATALOGS = sorted((ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES").rglob("*.po"))
# the widgets' words (attention_course/widgets/*.js), shipped with the package: the same terms
CATALOGS.append(ROOT / "attention_course" / "widgets" / "locale" / "zh_CN.po")

# concept -> (the term, forbidden variants as regular expressions)
TERMS = {
    "parity check": ("对照检查", [r"一致性检验", r"一致性测试", r"一致性检查", r"对照断言", r"奇偶校验", r"等价性检验"]),
    "the package": ("课程包", [r"(?<![基样版文根资成脚剧书日账课])本包(?![含括])", r"本软件包", r"课程软件包"]),
    "key/value heads": ("键值头", [r"键/值头", r"键-值头", r"键和值头", r"键与值头"]),
    "running max / running sum": ("累计最大值 / 累计和", [r"运行最大值", r"运行归一化因子", r"运行总和", r"运行和 ?§",
                                                   r"运行中的 ?softmax", r"滑动最大值", r"运行状态"]),
    "interleaved (RoPE pairs)": ("交错（配对）", [r"相邻配对", r"相邻成对"]),
    "hidden state": ("隐藏状态", [r"隐状态", r"隐含状态", r"隐层状态"]),
    "bool": ("布尔", [r"(?<![\w.])[Bb]ool(?:ean)?(?!\w)", r"布林"]),
    "hatching": ("阴影线", [r"斜线", r"花纹", r"网纹", r"斜纹", r"剖面线"]),
    "pooling": ("池化", [r"汇聚(?!点)"]),
    "attention sink": ("汇聚点", [r"注意力沉降", r"注意力下沉", r"注意力槽", r"(?<!聚)汇点", r"池化点"]),
    "pad (a pad position or token)": ("填充位", [r"填充词元", r"填充标记", r"填充令牌", r"填充符"]),
    "chunk (of tokens fed at one step)": ("片段", [r"预填充块", r"预填充段", r"由多个词元组成的一块"]),
    "tile (a block of queries against a block of keys)": ("分块", [r"(?<!分)块（tiles?）", r"瓦片", r"图块"]),
    "property test": ("属性测试", [r"性质测试", r"特性测试"]),
    "pad position": ("填充位", [r"填充位置"]),
    "float (in prose, not a dtype's name)": ("浮点", [r"(?<![\w.])float(?![\w])"]),
    "eval mode": ("评估模式", [r"eval ?模式", r"评价模式", r"推断模式"]),
    "dtype (in prose)": ("数据类型", [r"(?<![\w.])dtype(?![\w])"]),
    # the package's MultiheadAttention set against PyTorch's or a model's: 课程的层 alone reads as "a layer of courses"
    "the course's layer": ("本课程的层", [r"(?<!本)课程的层", r"(?<!本)课程的 ?§ ?层?(?:和|与|放回|替换)"]),
    # a citation: Vaswani 等人，2017; Dao 等人（2022, ...); Kwon 等人，SOSP 2023
    "et al.": ("等人", [r"[A-Za-z] 等[，（] ?(?:[A-Z]{2,6} )?\d{4}"]),
    # the value written into masked scores (-inf, -1e9) is 填入: 填充 is padding. Caught where the value (math or
    # code, §) is the object, "用 § 填充", "而不是 § 来填充", "（例如 §）来填充", or where the masked scores are. A bare
    # 填充 for a fill ("之前的一次填充") cannot be told from padding by a pattern: the final read found those by eye.
    "fill (of masked scores)": ("填入", [r"(?:(?:用|以|而不是) ?§[）)]? ?来?|§[）)] ?来)填充(?![位掩键查行])",
                                             r"填充被掩蔽"]),
}

# Inline code, math, roles, link targets and the widgets' placeholders ({dtype}) are markup, not prose: each becomes
# one marker '§'.
MARKUP = re.compile(r"\{[\w:-]+\}`[^`]*`|\{\w+\}|``[^`]*``|`[^`]*`|\$\$.*?\$\$|\$[^$]*\$|\]\([^)]*\)|<[^>]*>", re.S)


# The words of a formula, \text{...} (and its kin), are translated with the prose (tests/test_zh.py): they stay in it.
MATH_TEXT = re.compile(r"\\(?:text|textrm|textit|textbf|mbox)\{([^{}]*)\}")


def prose(msgstr: str) -> str:
    def marker(markup):
        words = MATH_TEXT.findall(markup.group()) if markup.group().startswith("$") else []
        return "§" + "".join(f"{w}§" for w in words)
    return MARKUP.sub(marker, msgstr)


def messages():
    import polib

    for path in CATALOGS:
        for entry in polib.pofile(str(path)):
            if entry.msgid_plural:  # a message with a count (the widgets'): its forms, read as one translation
                entry.msgstr = " ".join(entry.msgstr_plural.values())
            if not entry.obsolete and entry.msgstr and entry.msgid:
                yield path.relative_to(ROOT).as_posix(), entry


def test_the_figures_catalog_is_read_too():
    """The words drawn in the figures (figures.po, book/_ext/zh_figures.py) follow the glossary as the prose does."""
    figures = ROOT / "book" / "locale" / "zh_CN" / "LC_MESSAGES" / "figures.po"
    assert figures in CATALOGS
    assert any(file == "book/locale/zh_CN/LC_MESSAGES/figures.po" and "阴影线" in entry.msgstr
               for file, entry in messages()), "the figures' hatching is drawn as 阴影线"


def test_the_widgets_catalog_is_read():
    read = [entry for file, entry in messages() if file == "attention_course/widgets/locale/zh_CN.po"]
    assert len(read) > 200 and any(entry.msgid_plural for entry in read)


def test_the_rule_spares_code_and_legitimate_neighbours():
    bool_rule = TERMS["bool"][1][0]
    assert not re.search(bool_rule, prose("`torch.bool` 掩码，`(b, h) -> bool`")), "code is not prose"
    assert re.search(bool_rule, prose("bool 掩码")), "a bool in prose is found"
    float_rule = TERMS["float (in prose, not a dtype's name)"][1][0]
    assert not re.search(float_rule, prose("`float32` 张量，float16 的精度")), "a dtype's name is not the word float"
    assert re.search(float_rule, prose("float 掩码")), "a float in prose is found"
    assert not re.search(TERMS["dtype (in prose)"][1][0], prose("{dtype} 的字节数")), "a widget's placeholder is code"
    package = TERMS["the package"][1][0]
    assert not re.search(package, "基本包括三个部分") and re.search(package, "本包的 §")
    assert not re.search(TERMS["pooling"][1][0], "注意力汇聚点（attention sink）")
    assert not re.search(TERMS["attention sink"][1][3], "汇聚点")
    assert re.search(TERMS["running max / running sum"][1][3], prose("经过重新缩放的运行和 $a$"))
    for concept, (term, variants) in TERMS.items():
        assert not any(re.search(v, term) for v in variants), f"{concept}: a variant matches the term {term!r} itself"


def test_the_final_read_s_rules_find_the_old_text_and_not_the_new():
    """Each rule added after the final read finds a sentence as it stood and spares it as it now stands."""
    def finds(concept, text):
        return any(re.search(v, prose(text)) for v in TERMS[concept][1])

    cases = {
        "the course's layer": [
            ("课程的层算出的结果与模型算出的一致", "本课程的层算出的结果与模型算出的一致"),
            (r"$$\underbrace{x}_{\text{课程的层，}\ \mathrm{out\_proj}}$$", r"$$\underbrace{x}_{\text{本课程的层，}\ \mathrm{out\_proj}}$$"),
            ("把课程的 `MultiheadAttention` 放回 BERT", "把本课程的 `MultiheadAttention` 放回 BERT"),
        ],
        "et al.": [
            ("*Attention Is All You Need*（Vaswani 等，2017）", "*Attention Is All You Need*（Vaswani 等人，2017）"),
            ("Dao 等（2022，*FlashAttention*）", "Dao 等人（2022，*FlashAttention*）"),
            ("PagedAttention（Kwon 等，SOSP 2023）", "PagedAttention（Kwon 等人，SOSP 2023）"),
        ],
        "fill (of masked scores)": [
            ("因此课程包用 $-\\infty$ 填充，并显式处理全被掩蔽的行", "因此课程包填入的是 $-\\infty$，并显式处理全被掩蔽的行"),
            ("而不是 $-\\infty$ 来填充被掩蔽的分数", "在被掩蔽的分数中填入一个很大的负数，而不是 $-\\infty$"),
            ('**修复：** 用 `float("-inf")` 填充，', '**修复：** 填入 `float("-inf")`，'),
            ("改用一个很大的有限数（常见的是 `-1e9`）来填充，", "改为填入一个很大的有限数（常见的是 `-1e9`），"),
        ],
    }
    for concept, pairs in cases.items():
        for old, new in pairs:
            assert finds(concept, old), f"{concept}: the old text {old!r} is not found"
            assert not finds(concept, new), f"{concept}: the new text {new!r} is found"
    # padding is still 填充, a citation's 等 of a list is not et al., code and the other 课程 words are spared
    assert not finds("fill (of masked scores)", "用 `<pad>` 词元把较短的句子填充到最长句子的长度，用填充位补齐")
    assert not finds("fill (of masked scores)", "在左侧填充到 $L = 4$，并把填充掩码与因果掩码组合起来")
    assert not finds("et al.", "PyTorch、JAX 等，都在 2023 年之前")
    assert not finds("the course's layer", "在每台机器上检出课程的同一个提交；课程的组织方式")


@pytest.mark.parametrize("concept", sorted(TERMS))
def test_one_term_per_concept(concept):
    term, variants = TERMS[concept]
    found = [f"{file}: {variant!r} in the message {entry.msgid[:70]!r}: {hit.group()!r}"
             for file, entry in messages() for variant in variants
             for hit in [re.search(variant, prose(entry.msgstr))] if hit]
    assert not found, f"{concept} is {term!r} (book/locale/glossary.md), written otherwise:\n" + "\n".join(found)


# The English verbs of a mask, one Chinese verb each (book/locale/glossary.md): "masked" is 掩蔽, "blocked" (a key, a
# cell) is 屏蔽, "hide" 遮住. A message whose English says one of them alone writes that one's verb and not another's
# (掩蔽 beside a "blocked" may be the verb "masks", which this rule cannot tell from the noun: only 遮住 is a slip there).
MASK_VERBS = {
    "masked": (re.compile(r"\bmasked\b", re.I), "掩蔽", re.compile("屏蔽|遮住")),
    "blocked": (re.compile(r"\b(?:un)?block(?:ed|s|ing)?\b", re.I), "屏蔽", re.compile("遮住")),
}
ENGLISH_VERBS = re.compile(r"\b(masked)\b|\b(?:un)?(block)(?:ed|s|ing)?\b|\b(hid)(?:e|es|den|ing)\b", re.I)
FAMILY = {"masked": "masked", "block": "blocked", "hid": "hide"}


def mask_verb_slips(english: str, chinese: str) -> list[str]:
    said = {FAMILY["".join(groups).lower()] for groups in ENGLISH_VERBS.findall(prose(english))}
    return [f"{word!r} is {verb}, not {hit.group()!r}" for word, (pattern, verb, others) in MASK_VERBS.items()
            if pattern.search(prose(english)) and said <= {word} for hit in [others.search(prose(chinese))] if hit]


def test_the_mask_verb_rule_finds_a_slip_and_spares_the_rest():
    assert mask_verb_slips("{n} of {all} cells masked", "{all} 个格子中 {n} 个被屏蔽")
    assert mask_verb_slips("blocked cells grey", "被遮住的单元格为灰色")
    assert not mask_verb_slips("{n} of {all} cells masked", "{all} 个格子中 {n} 个被掩蔽")
    assert not mask_verb_slips("{keys} blocked in every query row", "{keys} 在每个查询行中被屏蔽")
    assert not mask_verb_slips("$-\\infty$ added hides a key; a blocked score", "遮住一个键；被屏蔽的分数")
    assert not mask_verb_slips("`masked_fill` fills", "`masked_fill` 填入屏蔽值"), "code is not prose"


def test_one_chinese_verb_for_each_english_verb_of_a_mask():
    found = [f"{file}: {slip} in the message {entry.msgid[:70]!r}" for file, entry in messages()
             for slip in mask_verb_slips(entry.msgid + " " + (entry.msgid_plural or ""), entry.msgstr)]
    assert not found, "\n".join(found)
