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
const numbers = (row) => (row.length === 1 ? `${row[0]}` : tr("{a} to {b}", { a: row[0], b: row.at(-1) }));  // consecutive
const rowsWords = (rows) => rows.map((row, l) => `t${l}: ${numbers(row)}`).join(tr("; "));

function describe(st) {
  const { B, L, D, h, d } = st.shape, total = B * h * L, mixed = st.mixed_rows.length;
  const args = { B, L, D, h, d, Bh: B * h, total, mixed };
  return trn("(B, L, D) = ({B}, {L}, {D}) split into h = {h} head of d = {d}: ",
             "(B, L, D) = ({B}, {L}, {D}) split into h = {h} heads of d = {d}: ", h, args) +
    tr("reshape to (B, L, h, d) = ({B}, {L}, {h}, {d}), transpose to (B, h, L, d) = ({B}, {h}, {L}, {d}), reshape to " +
       "(B·h, L, d) = ({Bh}, {L}, {d}), row n = b·h + head. ", args) +
    (mixed ? tr("Without the transpose, the direct reshape puts another token's or another head's features in {mixed} " +
                "of {total} rows.", args)
      : h === 1 ? tr("Without the transpose, the direct reshape agrees in all {total} rows: with one head there is " +
                     "nothing to mix.", args)
      : tr("Without the transpose, the direct reshape agrees in all {total} rows.", args));
}

function tables(st) {
  const { B, L, D, h, d } = st.shape;
  const features = range(d).map((e) => tr("feature {e}", { e }));
  const out = [table(
    tr("x (B, L, D) = ({B}, {L}, {D}): each token's {D} features; feature f goes to head f div d, d = {d}", { B, L, D, d }),
    [tr("token"), ...range(D).map((f) => `f${f} (h${Math.floor(f / d)})`)],
    st.x.flatMap((s, b) => s.map((row, l) => ({ head: `s${b} t${l}`, cells: row.map(String) }))))];
  out.push(`<p>${tr("Steps 2 and 3 hold these numbers regrouped: step 3's [b, head] is the right reshape's row b·h + head.")}</p>`);
  out.push(table(tr("Right: (B·h, L, d) = ({Bh}, {L}, {d}) after the transpose; row n = b·h + head", { Bh: B * h, L, d }),
    [tr("row, token"), ...features],
    st.flat.flatMap((rows, n) => rows.map((row, l) => ({
      head: tr("[{n}] s{b} head {k}, t{l}", { n, b: Math.floor(n / h), k: n % h, l }), cells: row.map(String) })))));
  const mixed = new Set(st.mixed_rows.map(([n, l]) => `${n},${l}`));
  out.push(table(tr("Wrong: x.reshape(B·h, L, d) with no transpose; the last column says whose features the row holds"),
    [tr("row, token"), ...features, tr("holds")],
    st.wrong.flatMap((rows, n) => rows.map((row, l) => ({
      head: tr("[{n}] should be s{b} head {k}, t{l}", { n, b: Math.floor(n / h), k: n % h, l }),
      cells: [...row.map(String), mixed.has(`${n},${l}`) ? tr("{source} (wrong)", { source: source(row[0], st.shape) })
        : tr("{source} (right)", { source: source(row[0], st.shape) })] })))));
  return out.join("");
}

function draw(st) {
  const { B, L, D, h, d } = st.shape;
  const colour = (v) => {
    const o = origin(v, st.shape);
    return { cls: "ac-el", fill: fill(o.t, o.k, h), text: v,
             title: tr("{v}: sentence {b}, token {l}, head {k}", { v, b: o.b, l: o.l, k: o.k }) };
  };
  const tokens = range(L).map((l) => `t${l}`);
  const cell = 22;
  const block = (rows, opt = {}) => grid(L, rows[0].length, (i, j) => colour(rows[i][j]),
                                         { size: cell, font: 9, rowLabels: tokens, ...opt });
  const headLabels = range(D).map((f) => (f % d === 0 ? `h${f / d}` : ""));
  const headRanges = range(h).map((k) => tr("h{k}: features {list}", { k, list: numbers(range(d).map((e) => k * d + e)) }))
    .join(tr("; "));
  const out = [];
  out.push(`<div class="ac-panel"><h4>1. x = arange(1, B·L·D + 1).reshape(B, L, D) = (${B}, ${L}, ${D})</h4>`,
    `<div class="ac-multiples">`, ...st.x.map((s, b) => fig(block(s, { colLabels: range(D).map(String),
      label: tr("x[{b}], sentence {b}: {L} tokens by {D} features; {rows}.", { b, L, D, rows: rowsWords(s) }) }), `s${b}`)),
    `</div></div>`);
  out.push(`<div class="ac-panel"><h4>${trn("2. .reshape(B, L, h, d) = ({B}, {L}, {h}, {d}): each token's {D} features " +
                                            "cut into {h} head of {d}",
                                            "2. .reshape(B, L, h, d) = ({B}, {L}, {h}, {d}): each token's {D} features " +
                                            "cut into {h} heads of {d}", h, { B, L, h, d, D })}</h4>`,
    `<div class="ac-multiples">`, ...st.x.map((s, b) => fig(block(s, { group: d, colLabels: headLabels,
      label: trn("x[{b}] cut into {h} head of {d} features, the same numbers: {ranges} of every token.",
                 "x[{b}] cut into {h} heads of {d} features, the same numbers: {ranges} of every token.", h,
                 { b, h, d, ranges: headRanges }) }),
      `s${b}`)),
    `</div></div>`);
  out.push(`<div class="ac-panel"><h4>${tr("3. .transpose(1, 2) → (B, h, L, d) = ({B}, {h}, {L}, {d}): heads before tokens",
                                           { B, h, L, d })}</h4>`,
    `<div class="ac-multiples">`,
    ...st.transposed.flatMap((s, b) => s.map((rows, k) => fig(block(rows, {
      label: tr("[{b}, {k}], sentence {b} head {k}: {L} tokens by {d} features; {rows}.",
                { b, k, L, d, rows: rowsWords(rows) }) }),
      tr("[{b}, {k}]: s{b} head {k}", { b, k })))),
    `</div></div>`);
  const mixed = new Set(st.mixed_rows.map(([n, l]) => `${n},${l}`));
  out.push(`<div class="ac-compare">`,
    `<div class="ac-panel ac-col"><h4>${tr("4. Right: .reshape(B·h, L, d) = ({Bh}, {L}, {d}) after the transpose; " +
                                           "row n = b·h + head", { Bh: B * h, L, d })}</h4>`,
    `<div class="ac-multiples">`,
    ...st.flat.map((rows, n) => fig(block(rows, {
      label: tr("[{n}] = s{b} head {k}, every row its own token's head {k} features: {rows}.",
                { n, b: Math.floor(n / h), k: n % h, rows: rowsWords(rows) }) }),
      tr("[{n}] = s{b} head {k}", { n, b: Math.floor(n / h), k: n % h }))),
    `</div></div>`,
    `<div class="ac-panel ac-col ac-wrong"><h4>${tr("Wrong: x.reshape(B·h, L, d) directly, no transpose")}</h4>`,
    `<div class="ac-multiples">`,
    ...st.wrong.map((rows, n) => {
      const bad = range(L).filter((l) => mixed.has(`${n},${l}`)).length, args = { n, b: Math.floor(n / h), k: n % h };
      const holds = rows.map((row, l) => (mixed.has(`${n},${l}`)
        ? tr("t{l} holds {list}, {source}, wrong", { l, list: numbers(row), source: source(row[0], st.shape) })
        : tr("t{l} holds {list}, {source}", { l, list: numbers(row), source: source(row[0], st.shape) }))).join(tr("; "));
      return fig(block(rows, {
        outline: (l) => mixed.has(`${n},${l}`), right: (l) => source(rows[l][0], st.shape), rightWidth: 58,
        rightCls: (l) => (mixed.has(`${n},${l}`) ? "ac-lab ac-bad" : "ac-lab"),
        label: tr("[{n}] should be s{b} head {k}; {holds}. {verdict}.", { ...args, holds,
          verdict: bad ? tr("{bad} of {L} rows wrong", { bad, L }) : tr("All {L} rows right", { L }) }) }),
        tr("[{n}] should be s{b} head {k}", args));
    }),
    `</div></div></div>`);
  const total = B * h * L;
  out.push(`<div class="ac-legend ${st.mixed_rows.length ? "ac-bad" : ""}">`,
    st.mixed_rows.length
      ? tr("{n} of {total} rows of the direct reshape (red boxes) hold another token's or another head's features: " +
           "the label says whose.", { n: st.mixed_rows.length, total })
      : h === 1 ? tr("All {total} rows agree: with one head there is nothing to mix.", { total })
      : tr("All {total} rows agree: nothing is mixed.", { total }),
    `</div>`);
  // The colour key: the colours drawn above, one per (token, head), so the legend cannot say other than the picture.
  const tokenNames = range(B * L).map((t) => `s${Math.floor(t / L)} t${t % L}`);
  out.push(`<div class="ac-legend ac-key">`,
    grid(B * L, h, (t, k) => ({ cls: "ac-el ac-keycell", fill: fill(t, k, h),
                                title: tr("sentence {b}, token {l}, head {k}: numbers {first} to {last}",
                                          { b: Math.floor(t / L), l: t % L, k, first: t * D + k * d + 1,
                                            last: t * D + (k + 1) * d }) }),
         { size: 16, font: 10, rowLabels: tokenNames, labelWidth: 40, colLabels: range(h).map((k) => `h${k}`),
           xTitle: tr("head"), yTitle: tr("token"),
           label: tr("Colour key: a row per token ({first} to {last}), a column per head (h0 to h{k}); the hue marks " +
                     "the token, the shade the head.", { first: tokenNames[0], last: tokenNames.at(-1), k: h - 1 }) }),
    `<div class="ac-key-text">${tr("Colour of a number = where it came from. <b>Hue: its token</b> — sentence s, " +
                                   "position t; each of the batch's {n} tokens has its own hue. <b>Shade: its head</b> " +
                                   "— the group of d = {d} features it falls in", { n: B * L, d })}` +
    (h === 1 ? tr(" (one head: one shade)") : tr(", lightest for h0, darkest for h{k}", { k: h - 1 })) +
    `${tr(". Hover a number for its sentence, token and head, or open the tables below.")}</div></div>`);
  return out.join("");
}

function render({ model, el }) {
  LANG = chooseLanguage(model, el);
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
    batch_size: slider(tr("batch size B"), "batch_size", (v) => commit(model, { batch_size: v })),
    seq_len: slider(tr("length L"), "seq_len", (v) => commit(model, { seq_len: v })),
    embed_dim: slider(tr("embedding D"), "embed_dim", setD),
  };
  const heads = choices(tr("heads h (divides D)"), "num_heads", (k) => commit(model, { num_heads: k }));
  const notice = make("output", { class: "ac-notice", role: "status", "aria-live": "polite" });
  const picture = make("div", { class: "ac-picture" });
  const numbersBox = tablesBox(tr("Show the numbers as tables"));
  const status = liveRegion();
  el.replaceChildren(make("div", { class: "ac-controls" }, ...Object.values(controls), heads, notice),
                     picture, numbersBox, status);

  const redraw = speaking(LANG, () => {
    const p = get();
    if (moved && (moved.D !== p.embed_dim || moved.h !== p.num_heads)) moved = null;
    notice.textContent = moved
      ? tr("h = {from} does not divide D = {D}: h is now {h}, the nearest head count that does.", moved)
      : "";
    controls.batch_size.update(p.batch_size, 1, 3);
    controls.seq_len.update(p.seq_len, 1, 6);
    controls.embed_dim.update(p.embed_dim, 2, 12);
    heads.update(divisors(p.embed_dim), p.num_heads);  // only a new D brings new buttons
    if (p.embed_dim % p.num_heads !== 0) {  // only reachable by setting the traits from outside, one at a time
      const message = tr("D = {D} is not divisible by h = {h}: choose h among {choices}.",
                         { D: p.embed_dim, h: p.num_heads, choices: divisors(p.embed_dim).join(tr(", ")) });
      picture.innerHTML = `<div class="ac-legend ac-bad">${message} ` +
        `${tr("From Python, change both at once: {call}.", { call: `w.update(embed_dim=${p.embed_dim}, ` +
                                                                   `num_heads=${nearestDivisor(p.embed_dim, p.num_heads)})` })}</div>`;
      numbersBox.show("");
      status.say(message);
      return;
    }
    const st = computeState(p);
    picture.innerHTML = draw(st);
    numbersBox.show(tables(st));
    status.say(describe(st));
    el.dataset.state = JSON.stringify(st);
  });
  watch(model, names, redraw);
}

export default { render };
