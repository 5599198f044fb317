// Helpers shared by the widgets' ES modules; _base.esm() puts this file in front of each module.

const range = (n) => Array.from({ length: n }, (_, i) => i);

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
  const shown = make("output", {});
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

const esc = (text) => String(text).replace(/[&<>"]/g, (c) => `&#${c.charCodeAt(0)};`);

// SVG markup of a rows x cols grid. cell(i, j) -> { cls, text, textCls, cross, title, style }.
// Options: size (px), font (px), rowLabels / colLabels (arrays), xTitle / yTitle (what the columns / rows are: a
// line above the grid, a line up its left side), group (a gap after every `group` columns), right(i) -> text after
// row i, rightCls(i), shadeRow(i) -> true to grey the row out, outline(i) -> true for a red box.
// A cell's title is its tooltip, on the whole cell: the square and the text drawn on it.
function grid(rows, cols, cell, opt = {}) {
  const s = opt.size ?? 16, font = opt.font ?? Math.round(s * 0.42), gap = opt.group ? 5 : 0, axis = 11;
  const side = opt.yTitle ? axis + 3 : 0;
  const left = side + (opt.rowLabels ? (opt.labelWidth ?? 22) : 0);
  const top = (opt.xTitle ? axis + 3 : 0) + (opt.colLabels ? 14 : 0);
  const x = (j) => left + j * s + (opt.group ? Math.floor(j / opt.group) * gap : 0);
  const yTitleLength = opt.yTitle ? opt.yTitle.length * axis * 0.6 : 0;  // about: the font's average glyph width
  const width = Math.max(x(cols - 1) + s + (opt.right ? (opt.rightWidth ?? 40) : 0),
                         opt.xTitle ? left + opt.xTitle.length * axis * 0.6 : 0) + 1;
  const height = Math.max(top + rows * s, top + yTitleLength) + 1;
  const out = [`<svg class="ac-grid" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img"` +
               ` style="font-size:${font}px">`];
  if (opt.xTitle) out.push(
    `<text class="ac-axis" x="${left}" y="${axis}" style="font-size:${axis}px">${esc(opt.xTitle)}</text>`);
  if (opt.yTitle) out.push(
    `<text class="ac-axis" transform="translate(${axis}, ${top}) rotate(-90)" text-anchor="end"` +
    ` style="font-size:${axis}px">${esc(opt.yTitle)}</text>`);
  if (opt.colLabels) range(cols).forEach((j) =>
    out.push(`<text class="ac-lab" x="${x(j) + s / 2}" y="${top - 4}" text-anchor="middle">${esc(opt.colLabels[j])}</text>`));
  for (const i of range(rows)) {
    const y = top + i * s;
    if (opt.rowLabels) out.push(
      `<text class="ac-lab" x="${left - 4}" y="${y + s / 2}" text-anchor="end" dominant-baseline="central">${esc(opt.rowLabels[i])}</text>`);
    for (const j of range(cols)) {
      const c = cell(i, j);
      out.push(`<g class="ac-cell">${c.title ? `<title>${esc(c.title)}</title>` : ""}` +
               `<rect class="${c.cls ?? ""}" x="${x(j)}" y="${y}" width="${s}" height="${s}"` +
               `${c.style ? ` style="${c.style}"` : ""}/>`);
      if (c.cross) {
        const a = s * 0.22;
        out.push(`<path class="ac-x" d="M${x(j) + a} ${y + a}L${x(j) + s - a} ${y + s - a}M${x(j) + s - a} ${y + a}L${x(j) + a} ${y + s - a}"/>`);
      }
      if (c.text !== undefined) out.push(
        `<text class="${c.textCls ?? "ac-num"}" x="${x(j) + s / 2}" y="${y + s / 2}" text-anchor="middle" dominant-baseline="central">${esc(c.text)}</text>`);
      out.push("</g>");
    }
    const end = x(cols - 1) + s;
    if (opt.shadeRow && opt.shadeRow(i)) out.push(`<rect class="ac-shade" x="${left}" y="${y}" width="${end - left}" height="${s}"/>`);
    if (opt.outline && opt.outline(i)) out.push(`<rect class="ac-outline" x="${left + 1}" y="${y + 1}" width="${end - left - 2}" height="${s - 2}"/>`);
    if (opt.right) out.push(`<text class="${opt.rightCls ? opt.rightCls(i) : "ac-lab"}" x="${end + 4}" y="${y + s / 2}" dominant-baseline="central">${esc(opt.right(i))}</text>`);
  }
  out.push("</svg>");
  return out.join("");
}

// A captioned picture: <figure><svg/><figcaption/></figure>, as markup.
const fig = (svg, caption) => `<figure class="ac-fig">${svg}<figcaption>${caption}</figcaption></figure>`;
