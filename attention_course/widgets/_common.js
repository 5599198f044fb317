// Helpers shared by the widgets' ES modules; _base.esm() puts this file in front of each module.

const range = (n) => Array.from({ length: n }, (_, i) => i);

// A DOM element: make("label", { class: "x" }, "text", child, ...)
function make(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  node.append(...children);
  return node;
}

// A labelled range input showing its value; onInput(int) is called while it moves.
function slider(label, name, onInput) {
  const input = make("input", { type: "range", name, step: "1" });
  const shown = make("output", {});
  input.addEventListener("input", () => onInput(Number(input.value)));
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

// SVG markup of a rows x cols grid. cell(i, j) -> { cls, text, cross, title, style }.
// Options: size (px), font (px), rowLabels / colLabels (arrays), group (a gap after every `group` columns),
// right(i) -> text after row i, rightCls(i), shadeRow(i) -> true to grey the row out, outline(i) -> true for a red box.
function grid(rows, cols, cell, opt = {}) {
  const s = opt.size ?? 16, font = opt.font ?? Math.round(s * 0.42), gap = opt.group ? 5 : 0;
  const left = opt.rowLabels ? (opt.labelWidth ?? 22) : 0, top = opt.colLabels ? 14 : 0;
  const x = (j) => left + j * s + (opt.group ? Math.floor(j / opt.group) * gap : 0);
  const width = x(cols - 1) + s + (opt.right ? (opt.rightWidth ?? 40) : 0) + 1, height = top + rows * s + 1;
  const out = [`<svg class="ac-grid" width="${width}" height="${height}" viewBox="0 0 ${width} ${height}" role="img"` +
               ` style="font-size:${font}px">`];
  if (opt.colLabels) range(cols).forEach((j) =>
    out.push(`<text class="ac-lab" x="${x(j) + s / 2}" y="${top - 4}" text-anchor="middle">${esc(opt.colLabels[j])}</text>`));
  for (const i of range(rows)) {
    const y = top + i * s;
    if (opt.rowLabels) out.push(
      `<text class="ac-lab" x="${left - 4}" y="${y + s / 2}" text-anchor="end" dominant-baseline="central">${esc(opt.rowLabels[i])}</text>`);
    for (const j of range(cols)) {
      const c = cell(i, j);
      out.push(`<g class="ac-cell"><rect class="${c.cls ?? ""}" x="${x(j)}" y="${y}" width="${s}" height="${s}"` +
               `${c.style ? ` style="${c.style}"` : ""}>${c.title ? `<title>${esc(c.title)}</title>` : ""}</rect>`);
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
