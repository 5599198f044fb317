// Helpers shared by the widgets' ES modules; _base.esm() puts this file in front of each module.

const range = (n) => Array.from({ length: n }, (_, i) => i);

// ---- language. Every word a widget draws or says goes through tr() or trn(): the English text is the message id,
// and CATALOGS (put in front of this file by _base.esm(), from locale/<language>.po) holds its translations, by
// language. {name} in a message is filled from args. The language is the model's `language` trait where Python set
// it (an argument, $ATTENTION_COURSE_LANGUAGE, the notebook's metadata), else the page's: <html lang="zh-CN"> on the
// Chinese site, whose widget states come from the English run. LANG is set by each widget before it draws (a page
// may hold widgets in two languages).
let LANG = "en";
function chooseLanguage(model, el) {
  // (a view may be drawn before it is put in the page: then the page's own language)
  const asked = model.get("language") || el.parentElement?.closest("[lang]")?.getAttribute("lang")
    || document.documentElement.getAttribute("lang") || "en";
  const lang = /^zh/i.test(asked) ? "zh_CN" : "en";
  el.setAttribute("lang", lang === "en" ? "en" : "zh-CN");  // screen readers read the widget in its language
  return lang;
}
// fn, run with LANG = lang (a redraw, a handler that writes text)
const speaking = (lang, fn) => (...args) => { LANG = lang; return fn(...args); };
const fillIn = (text, args) => text.replace(/\{(\w+)\}/g, (all, key) => (key in args ? String(args[key]) : all));
function tr(msgid, args = {}) {
  return fillIn((LANG !== "en" && CATALOGS[LANG]?.[msgid]) || msgid, args);
}
// A message with a count n (args.n): English has a singular and a plural, Chinese one form.
function trn(singular, plural, n, args = {}) {
  const forms = LANG !== "en" && CATALOGS[LANG]?.[singular];
  return fillIn(forms ? forms[0] : n === 1 ? singular : plural, { n, ...args });
}
// The width of a line of text at font size px, about: a Chinese character is a square, a Latin glyph 0.6 of one.
const textWidth = (text, px) => [...String(text)].reduce((w, c) => w + (/[\u2e80-\u9fff\uff00-\uffef]/.test(c) ? 1 : 0.6), 0) * px;

// A DOM element: make("label", { class: "x" }, "text", child, ...)
function make(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

// The keys a focused slider answers: a step down or up, or to an end.
const SLIDER_KEYS = { ArrowLeft: -1, ArrowDown: -1, ArrowRight: 1, ArrowUp: 1, Home: -Infinity, End: Infinity };

// A labelled range input showing its value; onInput(int) is called while it moves.
// Its keys stay with it: in JupyterLab 4 and Notebook 7 the notebook's shortcuts listen on the document and take the
// arrow keys to move between cells. Notebook 7 listens in the capture phase, before any listener here can run, so
// only data-lm-suppress-shortcuts (Lumino, their command system, then leaves keys typed in this input alone) helps
// there; JupyterLab 4 listens as the key bubbles up, and the keydown listener below stops it (and so does any other
// page that listens above the widget). The listener also takes the step itself, once, and sends "input".
function slider(label, name, onInput) {
  const input = make("input", { type: "range", name, step: "1", "data-lm-suppress-shortcuts": "true" });
  // the value, shown beside the slider; hidden from screen readers, which hear it from the slider itself (an
  // <output> is a live region: it would say every value twice)
  const shown = make("output", { "aria-hidden": "true" });
  input.addEventListener("input", () => onInput(Number(input.value)));
  input.addEventListener("keydown", (event) => {
    const step = SLIDER_KEYS[event.key];
    if (step === undefined || event.ctrlKey || event.metaKey || event.altKey) return;
    event.stopPropagation();
    event.preventDefault();  // the step is taken here, once, whatever the browser's default would have been
    const value = Math.min(Math.max(Number(input.value) + step, Number(input.min)), Number(input.max));
    if (value === Number(input.value)) return;
    input.value = String(value);
    input.dispatchEvent(new Event("input", { bubbles: true }));
  });
  const node = make("label", { class: "ac-control" }, make("span", {}, label), input, shown);
  node.update = (value, min, max) => {
    input.min = String(min);
    input.max = String(max);
    input.disabled = min === max;
    if (Number(input.value) !== value) input.value = String(value);
    shown.textContent = String(value);
  };
  return node;
}

function checkbox(label, name, onChange) {
  const input = make("input", { type: "checkbox", name });
  input.addEventListener("change", () => onChange(input.checked));
  const node = make("label", { class: "ac-control" }, input, make("span", {}, label));
  node.update = (checked) => { input.checked = checked; };
  return node;
}

// A group of buttons, one per choice (an integer), named by its visible label; onPick(value) on a click, Enter or
// Space. node.update(values, pressed) makes the buttons only when the choices change, so the one just pressed keeps
// the keyboard focus; when they do change, a focused button's value, if still offered, keeps it.
function choices(label, name, onPick) {
  const title = make("span", { id: uid(`ac-${name}`) }, label);
  const group = make("span", { class: "ac-choices", role: "group", "aria-labelledby": title.id });
  const button = (value) => {
    const node = make("button", { type: "button", name, value: String(value) }, String(value));
    node.addEventListener("click", () => onPick(value));
    return node;
  };
  const node = make("span", { class: "ac-control" }, title, group);
  node.update = (values, pressed) => {
    if ([...group.children].map((b) => Number(b.value)).join() !== values.join()) {
      const active = group.ownerDocument.activeElement, had = group.contains(active) ? active.value : null;
      group.replaceChildren(...values.map(button));
      if (had !== null) (group.querySelector(`button[value="${had}"]`) ?? group.firstElementChild).focus();
    }
    for (const b of group.children) b.setAttribute("aria-pressed", String(Number(b.value) === pressed));
  };
  return node;
}

// Set several traits at once (one message to the kernel, if there is one; none on the static site).
function commit(model, changes) {
  for (const [key, value] of Object.entries(changes)) model.set(key, value);
  model.save_changes();
}

// Redraw at most once per burst of trait changes.
function batched(fn) {
  let pending = false;
  return () => {
    if (pending) return;
    pending = true;
    queueMicrotask(() => { pending = false; fn(); });
  };
}

// Draw now, and again after every burst of changes to the traits `names`.
function watch(model, names, redraw) {
  const schedule = batched(redraw);
  for (const k of names) model.on(`change:${k}`, schedule);
  redraw();
}

const esc = (text) => String(text).replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);

// An id for aria-labelledby, unique on the page (a page may show several widgets, or one widget twice).
const uid = (prefix) => `${prefix}-${Math.random().toString(36).slice(2, 10)}`;

// ---- colours. A colour is [r, g, b] (0-255). Every fill drawn with text on it is computed here, so the text
// colour can be chosen for it: WCAG's contrast ratio, at least 4.5:1 for every label in every state.
const hex = (text) => [1, 3, 5].map((i) => parseInt(text.slice(i, i + 2), 16));
const css = (rgb) => `rgb(${rgb.map((c) => Math.round(c)).join(", ")})`;
const mix = (top, alpha, below) => top.map((c, i) => c * alpha + below[i] * (1 - alpha));  // top at alpha over below
function hsl(h, s, l) {  // CSS hsl(): h in degrees, s and l in percent
  s /= 100; l /= 100;
  const f = (n) => {
    const k = (n + h / 30) % 12;
    return l - s * Math.min(l, 1 - l) * Math.max(-1, Math.min(k - 3, 9 - k, 1));
  };
  return [f(0), f(8), f(4)].map((c) => c * 255);
}
function luminance(rgb) {
  const [r, g, b] = rgb.map((c) => c / 255).map((c) => (c <= 0.04045 ? c / 12.92 : ((c + 0.055) / 1.055) ** 2.4));
  return 0.2126 * r + 0.7152 * g + 0.0722 * b;
}
const contrastRatio = (a, b) => {
  const [high, low] = [luminance(a), luminance(b)].sort((x, y) => y - x);
  return (high + 0.05) / (low + 0.05);
};
const INK = hex("#1f2328"), WHITE = [255, 255, 255], BLACK = [0, 0, 0];
// The text colour for a fill: the widget's ink where it reaches 4.5:1, else white, else black. One of white and
// black always reaches 4.58:1, whatever the fill.
const textOn = (fill) => [INK, WHITE, BLACK].find((c) => contrastRatio(c, fill) >= 4.5)
  ?? (contrastRatio(WHITE, fill) > contrastRatio(BLACK, fill) ? WHITE : BLACK);
// The cells' fills; the legend's swatches (widgets.css, .ac-sw) and mask_broadcast.py's figure() use the same.
// Kept and masked cells differ in lightness, not only in hue: each masked fill has a contrast of at least 3:1 with
// the kept fill, and carries a cross or text as well (tests/test_widgets.py checks both).
const FILLS = { "ac-ok": hex("#eef5fc"), "ac-pad": hex("#6e7781"), "ac-fut": hex("#bc4c00") };
// A greyed-out row (a pad query: computed, ignored downstream): its cells' fills mixed with this grey, and their text
// coloured for the mixed fill, so greying never takes the text below 4.5:1.
const SHADE = hex("#8c959f"), SHADE_ALPHA = 0.3;

// ---- words
// [2, 3, 4] -> "2 to 4"; [1, 3, 4, 5] -> "1 and 3 to 5"; [] -> "none"
function spans(numbers) {
  const runs = [];
  for (const n of numbers) {
    const last = runs[runs.length - 1];
    if (last && n === last[1] + 1) last[1] = n; else runs.push([n, n]);
  }
  return runs.length ? listing(runs.map(([a, b]) => (a === b ? `${a}` : b === a + 1 ? tr("{a} and {b}", { a, b })
    : tr("{a} to {b}", { a, b })))) : tr("none");
}
// ["a", "b", "c"] -> "a, b and c"
const listing = (items) => (items.length < 2 ? items.join("")
  : tr("{items} and {last}", { items: items.slice(0, -1).join(tr(", ")), last: items.at(-1) }));
// Clauses listed: "a, b and c" in English as well; in Chinese each clause apart ("a；b；c"), not joined by 和.
const clauses = (items) => (items.length < 2 ? items.join("")
  : tr("{clauses} and {last}", { last: items.at(-1), clauses: items.slice(0, -1)
    .map((clause, i, head) => (i < head.length - 1 ? tr("{clause}, ", { clause }) : clause)).join("") }));

// A status line that screen readers read out, politely, when its text changes; not shown (the picture shows it).
function liveRegion() {
  const node = make("p", { class: "ac-sr", "aria-live": "polite", "aria-atomic": "true" });
  node.say = (text) => { if (node.textContent !== text) node.textContent = text; };
  return node;
}

// An HTML table, as markup: caption, a header row (columns[0] heads the row headers), one row per entry of rows:
// { head, cells: [text, ...] }. The picture's numbers, for readers who cannot see it or point at its cells.
function table(caption, columns, rows) {
  const th = (text, scope) => `<th scope="${scope}">${esc(text)}</th>`;
  return `<table class="ac-table"><caption>${esc(caption)}</caption>` +
    `<thead><tr>${columns.map((c) => th(c, "col")).join("")}</tr></thead><tbody>` +
    rows.map((r) => `<tr>${th(r.head, "row")}${r.cells.map((c) => `<td>${esc(c)}</td>`).join("")}</tr>`).join("") +
    `</tbody></table>`;
}

// The tables of a picture, folded away under a button-like summary (a keyboard reaches it with Tab and opens it
// with Enter or Space); node.show(markup) fills it, keeping it open or closed as the reader left it. Tables wider
// than the page scroll sideways in their box, which the keyboard can focus (then the arrow keys scroll it).
function tablesBox(summary) {
  const title = make("summary", { id: uid("ac-tables") }, summary);
  const body = make("div", { class: "ac-tables-body", tabindex: "0", role: "group", "aria-labelledby": title.id });
  const node = make("details", { class: "ac-tables" }, title, body);
  node.show = (markup) => { body.innerHTML = markup; };
  return node;
}

// SVG markup of a rows x cols grid, named for screen readers by opt.label (what it shows, in words: required).
// cell(i, j) -> { cls, fill, text, cross, title, masked }: fill is a colour ([r, g, b]); the text and the cross on it
// get the colour textOn() picks for it. Options: size (px), font (px), rowLabels / colLabels (arrays), xTitle / yTitle
// (what the columns / rows are: a line above the grid, a line up its left side), group (a gap after every `group`
// columns), right(i) -> text after row i, rightCls(i), outline(i) -> true for a red box, shadeRow(i) -> true to grey
// the row out: its cells' fills mixed with SHADE, except masked cells (masked: true), which keep the fill and cross
// that say why they are masked.
// A cell's title is its tooltip, on the whole cell: the square and the text drawn on it.
function grid(rows, cols, cell, opt = {}) {
  if (!opt.label) throw new Error("grid(): every picture needs opt.label, its text alternative");  // a programming error, never shown
  const s = opt.size ?? 16, font = opt.font ?? Math.round(s * 0.42), gap = opt.group ? 5 : 0, axis = 11;
  const side = opt.yTitle ? axis + 3 : 0;
  const left = side + (opt.rowLabels ? Math.max(opt.labelWidth ?? 22, ...opt.rowLabels.map((r) => textWidth(r, font) + 5)) : 0);
  const top = (opt.xTitle ? axis + 3 : 0) + (opt.colLabels ? 14 : 0);
  const x = (j) => left + j * s + (opt.group ? Math.floor(j / opt.group) * gap : 0);
  const yTitleLength = opt.yTitle ? textWidth(opt.yTitle, axis) : 0;
  const rightWidth = opt.right ? Math.max(opt.rightWidth ?? 40, ...range(rows).map((i) => textWidth(opt.right(i), font) + 6))
    : 0;
  const width = Math.max(x(cols - 1) + s + rightWidth,
                         opt.xTitle ? left + textWidth(opt.xTitle, axis) : 0) + 1;
  const height = Math.max(top + rows * s, top + yTitleLength) + 1;
  const out = [`<svg class="ac-grid" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img"` +
               ` aria-label="${esc(opt.label)}" style="font-size:${font}px">`];
  if (opt.xTitle) out.push(
    `<text class="ac-axis" x="${left}" y="${axis}" style="font-size:${axis}px">${esc(opt.xTitle)}</text>`);
  if (opt.yTitle) out.push(
    `<text class="ac-axis" transform="translate(${axis}, ${top}) rotate(-90)" text-anchor="end"` +
    ` style="font-size:${axis}px">${esc(opt.yTitle)}</text>`);
  if (opt.colLabels) range(cols).forEach((j) =>
    out.push(`<text class="ac-lab" x="${x(j) + s / 2}" y="${top - 4}" text-anchor="middle">${esc(opt.colLabels[j])}</text>`));
  for (const i of range(rows)) {
    const y = top + i * s, shaded = Boolean(opt.shadeRow && opt.shadeRow(i));
    if (opt.rowLabels) out.push(
      `<text class="ac-lab" x="${left - 4}" y="${y + s / 2}" text-anchor="end" dominant-baseline="central">${esc(opt.rowLabels[i])}</text>`);
    for (const j of range(cols)) {
      const c = cell(i, j);
      const greyed = shaded && !c.masked;
      const fill = (greyed ? mix(SHADE, SHADE_ALPHA, c.fill) : c.fill).map(Math.round);  // as drawn: whole numbers
      const ink = css(textOn(fill));
      out.push(`<g class="ac-cell">${c.title ? `<title>${esc(c.title)}</title>` : ""}` +
               `<rect class="${c.cls ?? ""}${shaded ? " ac-shaded" : ""}" x="${x(j)}" y="${y}" width="${s}" height="${s}"` +
               ` style="fill: ${css(fill)}"/>`);
      if (c.cross) {
        const a = s * 0.22;
        out.push(`<path class="ac-x" style="stroke: ${ink}" d="M${x(j) + a} ${y + a}L${x(j) + s - a} ${y + s - a}` +
                 `M${x(j) + s - a} ${y + a}L${x(j) + a} ${y + s - a}"/>`);
      }
      if (c.text !== undefined) out.push(
        `<text class="ac-num" style="fill: ${ink}" x="${x(j) + s / 2}" y="${y + s / 2}" text-anchor="middle"` +
        ` dominant-baseline="central">${esc(c.text)}</text>`);
      out.push("</g>");
    }
    const end = x(cols - 1) + s;
    if (opt.outline && opt.outline(i)) out.push(`<rect class="ac-outline" x="${left + 1}" y="${y + 1}" width="${end - left - 2}" height="${s - 2}"/>`);
    if (opt.right) out.push(`<text class="${opt.rightCls ? opt.rightCls(i) : "ac-lab"}" x="${end + 4}" y="${y + s / 2}" dominant-baseline="central">${esc(opt.right(i))}</text>`);
  }
  out.push("</svg>");
  return out.join("");
}

// A captioned picture: <figure><svg/><figcaption/></figure>, as markup.
const fig = (svg, caption) => `<figure class="ac-fig">${svg}<figcaption>${caption}</figcaption></figure>`;
