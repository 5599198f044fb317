/* The search page's ranking by section (book/_ext/search_sections.py): Sphinx puts this file into language_data.js,
 * which the search page loads after searchtools.js and before searchindex.js. A page must hold every term of the
 * query, as in Sphinx's own search; its sections are ranked, and each result links to its section. (The leading
 * semicolon: the stemmer before this in language_data.js ends without one.) */
;(() => {
  if (typeof Search === "undefined") return;
  const TITLE = 4;   // a term in the section's heading, times the share of the heading the query covers
  const PAGE = 1;    // a term in the page's title (the chapter a query names), for each of its sections
  const BOLD = 2;    // a term the section sets in bold: where the book introduces it (search_sections.py)
  const K1 = 1.2, B = 0.5;  // BM25's constants: a count saturates; a long section's counts weigh less
  const HAN = /\p{Script=Han}/u;
  const SUB = 0.5;  // a subsection's words, in the section around it
  const SECONDARY = 0.5;  // a chapter's exercises and summary (search_sections.py)
  const PER_PAGE = 3;  // the best sections of a page shown (each result shown fetches its page for the summary)
  const has = (object, key) => object !== undefined && Object.prototype.hasOwnProperty.call(object, key);
  const pageTerms = Search.performTermsSearch;
  // A word the book writes otherwise: "multihead" (as in nn.MultiheadAttention) is the book's multi-head, whose
  // hyphen the index splits
  const SYNONYMS = { multihead: ["multi", "head"] };

  // TeX as the page shows it (√d, not \(\sqrt{d}\)), in the summaries; search_sections.py's untex, the same rules
  const TEX_WORDS = { infty: "∞", top: "⊤", times: "×", cdot: "·", le: "≤", leq: "≤", ge: "≥", geq: "≥", neq: "≠",
                      to: "→", in: "∈", ldots: "…", dots: "…", approx: "≈", lfloor: "⌊", rfloor: "⌋", bmod: "mod",
                      mid: "|", sum: "Σ" };
  const untex = (text) => (!text.includes("\\") ? text : text
    .replace(/\\[()[\]]/g, "")
    .replace(/\\(?:text|mathrm|mathbf|operatorname)\s*\{([^{}]*)\}/g, "$1")
    .replace(/\\sqrt\s*(?:\{([^{}]*)\}|(\w))/g, (_, group, letter) => "√" + (group || letter))
    .replace(/\\([A-Za-z]+)/g, (_, name) => (has(TEX_WORDS, name) ? TEX_WORDS[name] : name))
    .replace(/\\[,;!: ]/g, " ").replace(/[{}]/g, ""));
  const toText = Search.htmlToText;  // a page's text: only its math (\( \), \[ \]) is TeX
  Search.htmlToText = (htmlText, anchor) => toText(htmlText, anchor)
    .replace(/\\\(([\s\S]*?)\\\)|\\\[([\s\S]*?)\\\]/g, (_, inline, display) => untex(inline ?? display));

  // The sections holding `word` (or, for a word of 3 letters or more that no section holds, a word containing it,
  // as Sphinx matches partial terms): {section: count in its text}, and the set of sections with it in their heading.
  const postings = (word, index) => {
    const text = new Map(), title = new Set(), bold = new Set();
    const add = (term, weight) => {
      const list = index.terms[term] || [];
      for (let i = 0; i < list.length; i += 2) text.set(list[i], (text.get(list[i]) || 0) + list[i + 1] * weight);
      (index.titleterms[term] || []).forEach((s) => title.add(s));
      ((index.bold || {})[term] || []).forEach((s) => bold.add(s));
    };
    if (has(index.terms, word) || has(index.titleterms, word) || word.length < 3) add(word, 1);
    else {
      const escaped = new RegExp(word.replace(/[.*+\-?^${}()|[\]\\]/g, "\\$&"));
      Object.keys(index.terms).forEach((term) => { if (escaped.test(term)) add(term, 0.5); });
    }
    return { text, title, bold };
  };

  Search.performTermsSearch = (searchTerms, excludedTerms) => {
    const index = Search._index.sections;
    if (!index || !searchTerms.size) return pageTerms(searchTerms, excludedTerms);
    const { docnames, filenames, titles, titleterms } = Search._index;
    const sections = index.sections;
    const words = [...new Set([...searchTerms].flatMap((word) => SYNONYMS[word] || [word]))];
    const found = words.map((word) => postings(word, index));
    const fileOf = (s) => sections[s][0];
    // every term somewhere on the page; no excluded term on it
    const pagesWith = (p) => new Set([...p.text.keys(), ...p.title].map(fileOf));
    let pages = null;
    // a term of Chinese and Latin words (掩蔽softmax: i18n.py's splitQuery adds it beside its words) ranks, and
    // asks no page to hold it
    const whole = (word) => HAN.test(word) && /[a-z]/.test(word);
    for (const [i, p] of found.entries()) {
      if (whole(words[i])) continue;
      const these = pagesWith(p);
      pages = pages === null ? these : new Set([...pages].filter((f) => these.has(f)));
    }
    for (const word of excludedTerms) pagesWith(postings(word, index)).forEach((f) => pages.delete(f));
    if (!pages.size) return [];
    // BM25 over sections: rarer terms weigh more; a count saturates, and counts less in a longer section
    const n = sections.length, lengths = index.lengths, secondary = new Set(index.secondary);
    const average = lengths.reduce((a, b) => a + b, 0) / Math.max(1, n);
    const weight = found.map((p) => {
      const df = new Set([...p.text.keys(), ...p.title]).size;
      return Math.log(1 + (n - df + 0.5) / (df + 0.5));
    });
    // A section is read with its subsections: their counts and lengths are added to it, at half weight (a page's
    // top, whose subsections are the whole page, keeps its own)
    const withSub = (own) => {
      const all = own.slice();
      for (let s = n - 1; s >= 0; s--) {
        const up = sections[s][3];
        if (up >= 0 && sections[up][1]) all[up] += SUB * all[s];
      }
      return all;
    };
    const lengthsAll = withSub(lengths);
    const counts = found.map((p) => withSub(Array.from({ length: n }, (_, s) => p.text.get(s) || 0)));
    const saturated = (count, s) => count * (K1 + 1) / (count + K1 * (1 - B + B * lengthsAll[s] / average));
    const inPageTitle = words.map((w) => new Set([].concat(titleterms[w] ?? [])));
    const results = [];
    sections.forEach(([file, anchor, title], s) => {
      if (!pages.has(file)) return;
      // the share of the heading's letters the query's terms cover, counted in their own script ("分页缓存（paged
      // cache）" is all 分页缓存 to a Chinese query)
      let covered = 0, letters = 0;
      words.forEach((w, i) => { if (found[i].title.has(s)) covered += w.length; });
      const han = words.some((w) => HAN.test(w)), latin = words.some((w) => !HAN.test(w));
      for (const c of title.replace(/\s+/g, "")) letters += (HAN.test(c) ? han : latin) ? 1 : 0;
      const share = Math.min(1, covered / Math.max(1, letters));
      let score = 0;
      words.forEach((w, i) => {
        const count = counts[i][s];
        score += weight[i] * (saturated(count, s) + (found[i].title.has(s) ? TITLE * (0.5 + share) : 0)
                              + (inPageTitle[i].has(file) ? PAGE : 0) + (found[i].bold.has(s) ? BOLD : 0));
      });
      if (!score) return;
      if (secondary.has(s)) score *= SECONDARY;
      const page = titles[file];
      const shown = untex(!anchor || title === page ? page : `${page} > ${title}`);
      results.push([docnames[file], shown, anchor ? "#" + anchor : "", null, Math.round(100 * score), filenames[file]]);
    });
    const shownOf = new Map();
    return results.sort((a, b) => b[4] - a[4]).filter(([doc]) => {
      shownOf.set(doc, (shownOf.get(doc) || 0) + 1);
      return shownOf.get(doc) <= PER_PAGE;
    });
  };
})();
