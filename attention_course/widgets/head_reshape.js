// HeadReshapeWidget's picture, computed here from the traits alone (the static site has no kernel).
// head_reshape.py computes the same tensors with torch; keep the two in step.

function computeState({ batch_size: B, seq_len: L, embed_dim: D, num_heads: h }) {
  const d = D / h;
  const x = range(B).map((b) => range(L).map((l) => range(D).map((f) => 1 + (b * L + l) * D + f))); // (B, L, D)
  const split = x.map((s) => s.map((tok) => range(h).map((k) => tok.slice(k * d, (k + 1) * d)))); // (B, L, h, d)
  const transposed = split.map((s) => range(h).map((k) => s.map((tok) => tok[k]))); // (B, h, L, d)
  const flat = transposed.flat(); // (B*h, L, d), row b*h + head
  const wrong = range(B * h).map((n) => range(L).map((l) => range(d).map((e) => 1 + (n * L + l) * d + e))); // memory order
  const mixed = [];
  flat.forEach((block, n) => block.forEach((row, l) => {
    if (row.some((v, e) => v !== wrong[n][l][e])) mixed.push([n, l]);
  }));
  return { shape: { B, L, D, h, d }, x, split, transposed, flat, wrong, mixed_rows: mixed };
}

const divisors = (D) => range(D).map((i) => i + 1).filter((k) => D % k === 0);

// The head count nearest h that divides D, the smaller on a tie (head_reshape.nearest_divisor in Python).
const nearestDivisor = (D, h) => divisors(D).reduce((best, k) => (Math.abs(k - h) < Math.abs(best - h) ? k : best));

// The fill of a number from token t (of the whole batch: t = b·L + l) and head k: hue = token, shade = head.
function fill(t, k, h) {
  return hsl((t * 137.5 + 15) % 360, 62, h === 1 ? 78 : 88 - (30 * k) / (h - 1));
}

// Where the number v of arange(1, B*L*D + 1) came from: sentence, token, head.
function origin(v, { L, D, d }) {
  const t = Math.floor((v - 1) / D), f = (v - 1) % D;
  return { t, b: Math.floor(t / L), l: t % L, k: Math.floor(f / d) };
}

// ---- the picture in words: every grid's label, the live summary, and the tables
const source = (v, shape) => { const o = origin(v, shape); return `s${o.b} t${o.l} h${o.k}`; };
const numbers = (row) => (row.length === 1 ? `${row[0]}` : `${row[0]} to ${row.at(-1)}`);  // a row: consecutive numbers
const rowsWords = (rows) => rows.map((row, l) => `t${l}: ${numbers(row)}`).join("; ");

function describe(st) {
  const { B, L, D, h, d } = st.shape, total = B * h * L, mixed = st.mixed_rows.length;
  return `(B, L, D) = (${B}, ${L}, ${D}) split into h = ${h} ${h === 1 ? "head" : "heads"} of d = ${d}: reshape to ` +
    `(B, L, h, d) = (${B}, ${L}, ${h}, ${d}), transpose to (B, h, L, d) = (${B}, ${h}, ${L}, ${d}), reshape to ` +
    `(B·h, L, d) = (${B * h}, ${L}, ${d}), row n = b·h + head. Without the transpose, the direct reshape ` +
    (mixed ? `puts another token's or another head's features in ${mixed} of ${total} rows.`
           : `agrees in all ${total} rows${h === 1 ? ": with one head there is nothing to mix" : ""}.`);
}

function tables(st) {
  const { B, L, D, h, d } = st.shape;
  const features = range(d).map((e) => `feature ${e}`);
  const out = [table(
    `x (B, L, D) = (${B}, ${L}, ${D}): each token's ${D} features; feature f goes to head f div d, d = ${d}`,
    ["token", ...range(D).map((f) => `f${f} (h${Math.floor(f / d)})`)],
    st.x.flatMap((s, b) => s.map((row, l) => ({ head: `s${b} t${l}`, cells: row.map(String) }))))];
  out.push(`<p>Steps 2 and 3 hold these numbers regrouped: step 3's [b, head] is the right reshape's row b·h + head.</p>`);
  out.push(table(`Right: (B·h, L, d) = (${B * h}, ${L}, ${d}) after the transpose; row n = b·h + head`,
    ["row, token", ...features],
    st.flat.flatMap((rows, n) => rows.map((row, l) => ({ head: `[${n}] s${Math.floor(n / h)} head ${n % h}, t${l}`,
                                                         cells: row.map(String) })))));
  const mixed = new Set(st.mixed_rows.map(([n, l]) => `${n},${l}`));
  out.push(table(`Wrong: x.reshape(B·h, L, d) with no transpose; the last column says whose features the row holds`,
    ["row, token", ...features, "holds"],
    st.wrong.flatMap((rows, n) => rows.map((row, l) => ({
      head: `[${n}] should be s${Math.floor(n / h)} head ${n % h}, t${l}`,
      cells: [...row.map(String), `${source(row[0], st.shape)} (${mixed.has(`${n},${l}`) ? "wrong" : "right"})`] })))));
  return out.join("");
}

function draw(st) {
  const { B, L, D, h, d } = st.shape;
  const colour = (v) => {
    const o = origin(v, st.shape);
    return { cls: "ac-el", fill: fill(o.t, o.k, h), text: v, title: `${v}: sentence ${o.b}, token ${o.l}, head ${o.k}` };
  };
  const tokens = range(L).map((l) => `t${l}`);
  const cell = 22;
  const block = (rows, opt = {}) => grid(L, rows[0].length, (i, j) => colour(rows[i][j]),
                                         { size: cell, font: 9, rowLabels: tokens, ...opt });
  const headLabels = range(D).map((f) => (f % d === 0 ? `h${f / d}` : ""));
  const headRanges = range(h).map((k) => `h${k}: features ${numbers(range(d).map((e) => k * d + e))}`).join("; ");
  const out = [];
  out.push(`<div class="ac-panel"><h4>1. x = arange(1, B·L·D + 1).reshape(B, L, D) = (${B}, ${L}, ${D})</h4>`,
    `<div class="ac-multiples">`, ...st.x.map((s, b) => fig(block(s, { colLabels: range(D).map(String),
      label: `x[${b}], sentence ${b}: ${L} tokens by ${D} features; ${rowsWords(s)}.` }), `s${b}`)),
    `</div></div>`);
  out.push(`<div class="ac-panel"><h4>2. .reshape(B, L, h, d) = (${B}, ${L}, ${h}, ${d}): each token's ${D} features cut into ${h} head${h > 1 ? "s" : ""} of ${d}</h4>`,
    `<div class="ac-multiples">`, ...st.x.map((s, b) => fig(block(s, { group: d, colLabels: headLabels,
      label: `x[${b}] cut into ${h} ${h === 1 ? "head" : "heads"} of ${d} features, the same numbers: ` +
             `${headRanges} of every token.` }),
      `s${b}`)),
    `</div></div>`);
  out.push(`<div class="ac-panel"><h4>3. .transpose(1, 2) → (B, h, L, d) = (${B}, ${h}, ${L}, ${d}): heads before tokens</h4>`,
    `<div class="ac-multiples">`,
    ...st.transposed.flatMap((s, b) => s.map((rows, k) => fig(block(rows, {
      label: `[${b}, ${k}], sentence ${b} head ${k}: ${L} tokens by ${d} features; ${rowsWords(rows)}.` }),
      `[${b}, ${k}]: s${b} head ${k}`))),
    `</div></div>`);
  const mixed = new Set(st.mixed_rows.map(([n, l]) => `${n},${l}`));
  out.push(`<div class="ac-compare">`,
    `<div class="ac-panel ac-col"><h4>4. Right: .reshape(B·h, L, d) = (${B * h}, ${L}, ${d}) after the transpose; row n = b·h + head</h4>`,
    `<div class="ac-multiples">`,
    ...st.flat.map((rows, n) => fig(block(rows, {
      label: `[${n}] = s${Math.floor(n / h)} head ${n % h}, every row its own token's head ${n % h} features: ` +
             `${rowsWords(rows)}.` }), `[${n}] = s${Math.floor(n / h)} head ${n % h}`)),
    `</div></div>`,
    `<div class="ac-panel ac-col ac-wrong"><h4>Wrong: x.reshape(B·h, L, d) directly, no transpose</h4>`,
    `<div class="ac-multiples">`,
    ...st.wrong.map((rows, n) => {
      const bad = range(L).filter((l) => mixed.has(`${n},${l}`)).length;
      return fig(block(rows, {
        outline: (l) => mixed.has(`${n},${l}`), right: (l) => source(rows[l][0], st.shape), rightWidth: 58,
        rightCls: (l) => (mixed.has(`${n},${l}`) ? "ac-lab ac-bad" : "ac-lab"),
        label: `[${n}] should be s${Math.floor(n / h)} head ${n % h}; ` +
               rows.map((row, l) => `t${l} holds ${numbers(row)}, ${source(row[0], st.shape)}` +
                                    `${mixed.has(`${n},${l}`) ? ", wrong" : ""}`).join("; ") +
               `. ${bad ? `${bad} of ${L} rows wrong` : `All ${L} rows right`}.` }),
        `[${n}] should be s${Math.floor(n / h)} head ${n % h}`);
    }),
    `</div></div></div>`);
  const total = B * h * L;
  out.push(`<div class="ac-legend ${st.mixed_rows.length ? "ac-bad" : ""}">`,
    st.mixed_rows.length
      ? `${st.mixed_rows.length} of ${total} rows of the direct reshape (red boxes) hold another token's or another head's features: the label says whose.`
      : `All ${total} rows agree: ${h === 1 ? "with one head there is nothing to mix" : "nothing is mixed"}.`,
    `</div>`);
  // The colour key: the colours drawn above, one per (token, head), so the legend cannot say other than the picture.
  const tokenNames = range(B * L).map((t) => `s${Math.floor(t / L)} t${t % L}`);
  out.push(`<div class="ac-legend ac-key">`,
    grid(B * L, h, (t, k) => ({ cls: "ac-el ac-keycell", fill: fill(t, k, h),
                                title: `sentence ${Math.floor(t / L)}, token ${t % L}, head ${k}: ` +
                                       `numbers ${t * D + k * d + 1} to ${t * D + (k + 1) * d}` }),
         { size: 16, font: 10, rowLabels: tokenNames, labelWidth: 40, colLabels: range(h).map((k) => `h${k}`),
           xTitle: "head", yTitle: "token",
           label: `Colour key: a row per token (${tokenNames[0]} to ${tokenNames.at(-1)}), a column per head ` +
                  `(h0 to h${h - 1}); the hue marks the token, the shade the head.` }),
    `<div class="ac-key-text">Colour of a number = where it came from. <b>Hue: its token</b> — sentence s, position t;` +
    ` each of the batch's ${B * L} tokens has its own hue. <b>Shade: its head</b> — the group of d = ${d} features` +
    ` it falls in${h === 1 ? " (one head: one shade)" : `, lightest for h0, darkest for h${h - 1}`}.` +
    ` Hover a number for its sentence, token and head, or open the tables below.</div></div>`);
  return out.join("");
}

function render({ model, el }) {
  el.classList.add("ac-widget");
  el.dataset.acWidget = "head-reshape";
  const names = ["batch_size", "seq_len", "embed_dim", "num_heads"];
  const get = () => Object.fromEntries(names.map((k) => [k, model.get(k)]));
  // A new D keeps h when h divides it; otherwise h moves to the nearest head count that does, and the widget says so
  // (shown while D and h stay as the slider left them).
  let moved = null;
  const setD = (D) => {
    const before = get().num_heads, h = D % before === 0 ? before : nearestDivisor(D, before);
    moved = h === before ? null : { D, from: before, h };
    commit(model, { embed_dim: D, num_heads: h });
  };
  const controls = {
    batch_size: slider("batch size B", "batch_size", (v) => commit(model, { batch_size: v })),
    seq_len: slider("length L", "seq_len", (v) => commit(model, { seq_len: v })),
    embed_dim: slider("embedding D", "embed_dim", setD),
  };
  const heads = choices("heads h (divides D)", "num_heads", (k) => commit(model, { num_heads: k }));
  const notice = make("output", { class: "ac-notice", role: "status", "aria-live": "polite" });
  const picture = make("div", { class: "ac-picture" });
  const numbersBox = tablesBox("Show the numbers as tables");
  const status = liveRegion();
  el.replaceChildren(make("div", { class: "ac-controls" }, ...Object.values(controls), heads, notice),
                     picture, numbersBox, status);

  const redraw = () => {
    const p = get();
    if (moved && (moved.D !== p.embed_dim || moved.h !== p.num_heads)) moved = null;
    notice.textContent = moved
      ? `h = ${moved.from} does not divide D = ${moved.D}: h is now ${moved.h}, the nearest head count that does.`
      : "";
    controls.batch_size.update(p.batch_size, 1, 3);
    controls.seq_len.update(p.seq_len, 1, 6);
    controls.embed_dim.update(p.embed_dim, 2, 12);
    heads.update(divisors(p.embed_dim), p.num_heads);  // only a new D brings new buttons
    if (p.embed_dim % p.num_heads !== 0) {  // only reachable by setting the traits from outside, one at a time
      const message = `D = ${p.embed_dim} is not divisible by h = ${p.num_heads}: ` +
                      `choose h among ${divisors(p.embed_dim).join(", ")}.`;
      picture.innerHTML = `<div class="ac-legend ac-bad">${message} From Python, change both at once: ` +
                          `w.update(embed_dim=${p.embed_dim}, num_heads=${nearestDivisor(p.embed_dim, p.num_heads)}).</div>`;
      numbersBox.show("");
      status.say(message);
      return;
    }
    const st = computeState(p);
    picture.innerHTML = draw(st);
    numbersBox.show(tables(st));
    status.say(describe(st));
    el.dataset.state = JSON.stringify(st);
  };
  watch(model, names, redraw);
}

export default { render };
