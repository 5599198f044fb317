// MaskBroadcastWidget's picture, computed here from the traits alone (the static site has no kernel).
// mask_broadcast.py computes the same state with torch; keep the two in step.
// Polarity: true = may NOT attend (nn.MultiheadAttention's key_padding_mask / attn_mask).

const DEFAULT_LENGTHS = [5, 3, 2, 4];

function fitLengths(lengths, B, L) {
  return range(B).map((b) => Math.min(Math.max(lengths[b] ?? DEFAULT_LENGTHS[b], 1), L));
}

function softmaxRow(scores, blocked) {
  const top = Math.max(...scores.filter((_, j) => !blocked[j]));
  const e = scores.map((s, j) => (blocked[j] ? 0 : Math.exp(s - top)));
  const total = e.reduce((a, b) => a + b, 0);
  return e.map((v) => (total > 0 ? v / total : 0));
}

function computeState({ batch_size: B, max_len: L, lengths, causal, num_heads: h }) {
  const keyPadding = range(B).map((b) => range(L).map((j) => j >= lengths[b])); // (B, L)
  const broadcast = keyPadding.map((row) => range(L).map(() => row.slice())); // (B, L, L)
  const future = range(L).map((i) => range(L).map((j) => causal && j > i)); // (L, L)
  const combined = broadcast.map((m) => m.map((row, i) => row.map((pad, j) => pad || future[i][j]))); // (B, L, L)
  const perHead = combined.flatMap((m) => range(h).map(() => m)); // (B*h, L, L), row b*h + head
  const scores = range(B).map((b) => range(L).map((i) => range(L).map((j) => (((3 * i + 5 * j + 2 * b) % 7) - 3) / 2)));
  const weights = scores.map((m, b) => m.map((row, i) => softmaxRow(row, combined[b][i])));
  return { lengths, key_padding_mask: keyPadding, broadcast_mask: broadcast, causal_mask: future,
           combined_mask: combined, per_head_mask: perHead, scores, weights, query_is_pad: keyPadding };
}

const maskCell = (padded, future) => {
  const cls = padded ? "ac-pad" : future ? "ac-fut" : "ac-ok";
  return { cls, fill: FILLS[cls], cross: padded || future, masked: padded || future };
};
const BLUE = [33, 102, 172];  // a weight w is drawn in this blue at opacity 0.08 + 0.92 w, over white
const weightFill = (w) => mix(BLUE, Number((0.08 + 0.92 * w).toFixed(3)), WHITE);
// Every small (L, S) grid: its rows are the queries, its columns the keys; the first of a panel says so.
const small = (size, first, label) => (first ? { size, label, xTitle: tr("keys"), yTitle: tr("queries") } : { size, label });

// ---- the picture in words: every grid's label, the live summary, and the tables
const padKeys = (st, b) => range(st.key_padding_mask[b].length).filter((j) => st.key_padding_mask[b][j]);
const keysWord = (keys) => trn("key {list}", "keys {list}", keys.length, { list: spans(keys) });
const countBlocked = (m) => m.flat().filter(Boolean).length;
const why = (pad, future) => (pad ? tr("pad") : future ? tr("future") : "");
const maskWord = (pad, future) => (pad || future ? `True (${why(pad, future)})` : "False");
const ofCells = (n, L) => tr("{n} of {all} cells blocked", { n, all: L * L });

function padLabel(p, st) {
  const { batch_size: B, max_len: L } = p;
  return tr("Key padding mask (B, S) = ({B}, {L}), True = pad, may not attend: {rows}.", { B, L, rows: range(B).map((b) => {
    const pads = padKeys(st, b), args = { b, length: p.lengths[b], keys: keysWord(pads) };
    return pads.length ? trn("s{b}, length {length}: {keys} is a pad", "s{b}, length {length}: {keys} are pads",
                             pads.length, args)
      : tr("s{b}, length {length}: no pads", args);
  }).join(tr("; ")) });
}

function sentenceLabel(p, st, b, what) {
  const L = p.max_len, pads = padKeys(st, b);
  const padded = pads.length ? tr("{keys} blocked in every query row (pads)", { keys: keysWord(pads) }) : tr("no pads");
  if (what === "broadcast") {
    return tr("s{b} broadcast to (L, S) = ({L}, {L}): every query row the same copy of its padding row, {padded}; " +
              "{cells}.", { b, L, padded, cells: ofCells(countBlocked(st.broadcast_mask[b]), L) });
  }
  const args = { b, L, padded, cells: ofCells(countBlocked(st.combined_mask[b]), L) };
  return p.causal ? tr("s{b} combined, (L, S) = ({L}, {L}): {padded}, and each query's later keys (causal); {cells}.", args)
    : tr("s{b} combined, (L, S) = ({L}, {L}): {padded}; {cells}.", args);
}

function describe(p, st) {
  const { batch_size: B, max_len: L, num_heads: h, example: ex } = p, n = p.lengths[ex];
  const args = { B, L, h, Bh: B * h, ex, last: B - 1, lengths: listing(p.lengths.map(String)),
                 tokens: trn("{n} token", "{n} tokens", n), pads: trn("{n} pad", "{n} pads", L - n) };
  return trn("Batch of {n} sentence of length {lengths}, padded to L = S = {L}: the key padding mask (B, 1, S) " +
             "broadcast to (B, L, S) = ({B}, {L}, {L})",
             "Batch of {n} sentences of lengths {lengths}, padded to L = S = {L}: the key padding mask (B, 1, S) " +
             "broadcast to (B, L, S) = ({B}, {L}, {L})", B, args) +
    (p.causal ? tr(", combined with the causal mask") : tr("; causal off")) +
    (p.show_heads ? trn("; {n} head: (B·h, L, S) = ({Bh}, {L}, {L})", "; {n} heads: (B·h, L, S) = ({Bh}, {L}, {L})", h,
                        args) : "") +
    tr(". Showing sentence {ex} (of 0 to {last}): {tokens} and {pads}.", args);
}

function tables(p, st) {
  const { batch_size: B, max_len: L, example: ex } = p, keys = range(L).map((j) => tr("key {j}", { j }));
  const queryName = (b, i) => (st.query_is_pad[b][i] ? tr("pad {i}", { i }) : `q${i}`);
  const out = [table(tr("Key padding mask (B, S) = ({B}, {L}): True = pad, may not attend", { B, L }),
    [tr("sentence"), tr("length"), ...keys],
    range(B).map((b) => ({ head: `s${b}`, cells: [String(p.lengths[b]),
                                                   ...st.key_padding_mask[b].map((pad) => maskWord(pad, false))] })))];
  const what = p.causal ? tr("padding OR causal") : tr("its padding row broadcast to every query");
  for (const b of range(B)) out.push(table(
    (p.show_heads ? tr("Sentence {b}: its mask (L, S) = ({L}, {L}), {what}; every head gets this copy. True = may not attend",
                       { b, L, what })
      : tr("Sentence {b}: its mask (L, S) = ({L}, {L}), {what}. True = may not attend", { b, L, what })),
    [tr("query"), ...keys],
    range(L).map((i) => ({ head: queryName(b, i),
                           cells: range(L).map((j) => maskWord(st.key_padding_mask[b][j],
                                                               p.causal && st.causal_mask[i][j])) }))));
  const blocked = st.combined_mask[ex];
  const rowHead = (i) => (st.query_is_pad[ex][i] ? tr("pad {i} (ignored downstream)", { i }) : `q${i}`);
  out.push(table(tr("Sentence {ex}: scores after masked_fill(mask, −∞)", { ex }), [tr("query"), ...keys],
    range(L).map((i) => ({ head: rowHead(i), cells: range(L).map((j) => (blocked[i][j]
      ? `−∞ (${why(st.key_padding_mask[ex][j], true)})` : st.scores[ex][i][j].toFixed(1))) }))));
  out.push(table(tr("Sentence {ex}: weights, the softmax of each query's row over the keys it may attend", { ex }),
    [tr("query"), ...keys, tr("sum")],
    range(L).map((i) => ({ head: rowHead(i), cells: [...range(L).map((j) => (blocked[i][j]
      ? `0 (${why(st.key_padding_mask[ex][j], true)})` : st.weights[ex][i][j].toFixed(2))),
      st.weights[ex][i].reduce((a, c) => a + c, 0).toFixed(2)] }))));
  return out.join("");
}

function draw(p, st) {
  const { batch_size: B, max_len: L, num_heads: h, example: ex } = p;
  const out = [];
  const pos = range(L).map(String);
  // 1. the key padding mask, one row per sentence; S = L: the keys are the sentence's own tokens
  out.push(`<div class="ac-panel"><h4>${tr("1. Key padding mask (B, S) = ({B}, {L}): a row per sentence, a column " +
                                           "per key; viewed as (B, 1, S)", { B, L })}</h4>`,
    grid(B, L, (b, j) => {
      const pad = st.key_padding_mask[b][j], cls = pad ? "ac-pad" : "ac-ok";
      return { cls, fill: FILLS[cls], text: pad ? "T" : "F",
               title: pad ? tr("sentence {b}, key {j}: pad", { b, j }) : tr("sentence {b}, key {j}: token", { b, j }) };
    }, { size: 22, rowLabels: range(B).map((b) => `s${b}`), colLabels: pos,
         right: (b) => tr("len {n}", { n: p.lengths[b] }), rightWidth: 40, xTitle: tr("keys (S)"),
         yTitle: tr("sentences"), label: padLabel(p, st) }),
    `</div>`);
  // 2. broadcast over the query rows
  out.push(`<div class="ac-panel"><h4>${tr("2. Broadcast over queries: (B, 1, S) → (B, L, S) = ({B}, {L}, {L}), " +
                                           "every query row a copy", { B, L })}</h4>`,
    `<div class="ac-multiples">`,
    ...range(B).map((b) => fig(grid(L, L, (i, j) => maskCell(st.broadcast_mask[b][i][j], false),
                                    small(13, b === 0, sentenceLabel(p, st, b, "broadcast"))), `s${b}`)),
    `</div></div>`);
  // 3. causal and combined
  if (p.causal) {
    out.push(`<div class="ac-panel"><h4>${tr("3. Combined = padding OR causal, (B, L, S)")}</h4><div class="ac-multiples">`,
      fig(grid(L, L, (i, j) => maskCell(false, st.causal_mask[i][j]), small(13, true,
        tr("Causal mask (L, S) = ({L}, {L}): query i may not attend the keys after i; {cells}.",
           { L, cells: ofCells(countBlocked(st.causal_mask), L) }))), tr("causal (L, S)")),
      `<span class="ac-op">${tr("OR")}</span>`,
      ...range(B).map((b) => fig(grid(L, L, (i, j) => maskCell(st.broadcast_mask[b][i][j], st.causal_mask[i][j]),
                                      small(13, false, sentenceLabel(p, st, b, "combined"))),
                                 tr("s{b} combined", { b }))),
      `</div></div>`);
  } else {
    out.push(`<div class="ac-panel ac-note"><h4>${tr("3. Combined mask")}</h4>` +
             `${tr("Causal is off: the combined mask is the broadcast padding mask.")}</div>`);
  }
  // 4. one copy per head (left out where heads are not introduced yet: show_heads false)
  if (p.show_heads) out.push(`<div class="ac-panel"><h4>${tr("4. One copy per head: (B, h, L, S) = ({B}, {h}, {L}, {L}) → " +
           "(B·h, L, S) = ({Bh}, {L}, {L}), row b·h + head", { B, h, L, Bh: B * h })}</h4><div class="ac-multiples">`,
    ...range(B * h).map((n) => {
      const b = Math.floor(n / h), args = { n, b, k: n % h, cells: ofCells(countBlocked(st.combined_mask[b]), L) };
      return fig(grid(L, L, (i, j) => maskCell(st.broadcast_mask[b][i][j], st.causal_mask[i][j]), small(10, n === 0,
        p.causal ? tr("[{n}] = s{b} head {k}: a copy of s{b}'s combined mask, {cells}.", args)
          : tr("[{n}] = s{b} head {k}: a copy of s{b}'s broadcast mask, {cells}.", args))),
        tr("[{n}] s{b} head {k}", args));
    }),
    `</div></div>`);
  // 5. scores and weights of one sentence
  const blocked = st.combined_mask[ex], padQuery = (i) => st.query_is_pad[ex][i];
  const qLabels = range(L).map((i) => (padQuery(i) ? tr("pad {i}", { i }) : `q${i}`));
  const pads = padKeys(st, ex), padQueries = range(L).filter(padQuery);
  const masked = [pads.length ? tr("{keys} (pads)", { keys: keysWord(pads) }) : "",
                  p.causal ? tr("each query's later keys") : ""].filter(Boolean);
  const maskedWords = (masked.length ? tr("{n} of {all} cells masked: {which}", { n: countBlocked(blocked), all: L * L,
                                                                                 which: masked.join(tr(", ")) })
                       : tr("{n} of {all} cells masked", { n: countBlocked(blocked), all: L * L })) +
    (padQueries.length ? trn("; pad query {list} greyed out: computed, ignored downstream",
                             "; pad queries {list} greyed out: computed, ignored downstream", padQueries.length,
                             { list: spans(padQueries) }) : "");
  const top = range(L).map((i) => {
    const row = st.weights[ex][i], j = row.indexOf(Math.max(...row));
    return tr("{q} on k{j}, {w}", { q: qLabels[i], j, w: row[j].toFixed(2) });
  }).join(tr("; "));
  out.push(`<div class="ac-panel"><h4>${tr("{number}. Sentence {ex} (length {length}): scores, then softmax over the " +
                                           "keys it may attend", { number: p.show_heads ? 5 : 4, ex,
                                                                   length: p.lengths[ex] })}</h4>`,
    `<div class="ac-multiples">`,
    fig(grid(L, L, (i, j) => blocked[i][j]
               ? { cls: st.key_padding_mask[ex][j] ? "ac-pad" : "ac-fut", text: "−∞", masked: true,
                   fill: FILLS[st.key_padding_mask[ex][j] ? "ac-pad" : "ac-fut"] }
               : { cls: "ac-ok", fill: FILLS["ac-ok"], text: st.scores[ex][i][j].toFixed(1) },
             { size: 30, font: 10, rowLabels: qLabels, labelWidth: 36, colLabels: pos.map((j) => `k${j}`), shadeRow: padQuery,
               xTitle: tr("keys"), yTitle: tr("queries"),
               label: tr("Scores of sentence {ex}, {L} queries by {L} keys, after masked_fill(mask, −∞); {masked}. " +
                         "Every value is in the tables below the picture.", { ex, L, masked: maskedWords }) }),
        tr("scores, masked_fill(mask, −∞)")),
    fig(grid(L, L, (i, j) => {
          const w = st.weights[ex][i][j];
          return blocked[i][j] ? maskCell(st.key_padding_mask[ex][j], true)
            : { cls: "ac-w", fill: weightFill(w), text: w.toFixed(2) };
        }, { size: 30, font: 10, rowLabels: qLabels, labelWidth: 36, colLabels: pos.map((j) => `k${j}`), shadeRow: padQuery,
             xTitle: tr("keys"), yTitle: tr("queries"),
             right: (i) => `Σ ${st.weights[ex][i].reduce((a, b) => a + b, 0).toFixed(2)}`, rightWidth: 40,
             label: tr("Weights of sentence {ex}: each query's softmax over the keys it may attend, so every row sums " +
                       "to 1 and the masked cells get 0; {masked}. The largest weight of each query: {top}. Every value " +
                       "is in the tables below the picture.", { ex, masked: maskedWords, top }) }),
        tr("weights: masked cells get 0")),
    `</div></div>`);
  out.push(`<div class="ac-legend">`,
    `<span><i class="ac-sw ac-ok"></i>${tr("F: may attend (kept)")}</span>`,
    `<span><i class="ac-sw ac-pad">×</i>${tr("T: padding, may NOT attend")}</span>`,
    `<span><i class="ac-sw ac-fut">×</i>${tr("T: future key (causal)")}</span>`,
    `<span><i class="ac-sw ac-shade-sw"></i>${tr("pad query row: computed, ignored downstream")}</span>`,
    `<div>${tr("Polarity: <b>True = may NOT attend</b>, as in nn.MultiheadAttention's key_padding_mask and " +
               "attn_mask. Self-attention: the keys are the sentence's own tokens, so S = L.")}</div>`,
    `</div>`);
  return out.join("");
}

function render({ model, el }) {
  LANG = chooseLanguage(model, el);
  el.classList.add("ac-widget");
  el.dataset.acWidget = "mask-broadcast";
  const get = () => Object.fromEntries(["batch_size", "max_len", "lengths", "causal", "num_heads", "example",
                                        "show_heads"].map((k) => [k, model.get(k)]));
  const setBatch = (B) => {  // the example first: it must index a sentence of the new batch
    const p = get();
    commit(model, { example: Math.min(p.example, B - 1), lengths: fitLengths(p.lengths, B, p.max_len), batch_size: B });
  };
  const setMaxLen = (L) => commit(model, { max_len: L, lengths: fitLengths(get().lengths, get().batch_size, L) });
  const setLength = (b, n) => {
    const lengths = get().lengths.slice();
    lengths[b] = n;
    commit(model, { lengths });
  };
  const controls = {
    batch_size: slider(tr("batch size B"), "batch_size", setBatch),
    max_len: slider(tr("max length L"), "max_len", setMaxLen),
    num_heads: slider(tr("heads h"), "num_heads", (v) => commit(model, { num_heads: v })),
    causal: checkbox(tr("causal"), "causal", (v) => commit(model, { causal: v })),
    example: slider(tr("show sentence"), "example", (v) => commit(model, { example: v })),
  };
  const lengthRow = make("div", { class: "ac-controls ac-lengths" });
  const picture = make("div", { class: "ac-picture" });
  const numbers = tablesBox(tr("Show the masks, scores and weights as tables"));
  const status = liveRegion();
  el.replaceChildren(make("div", { class: "ac-controls" }, ...Object.values(controls)), lengthRow, picture, numbers,
                     status);

  const redraw = speaking(LANG, () => {
    // Trait changes can arrive one message at a time (Python's w.batch_size = 1 sends batch_size before the
    // lengths and example it clamps): draw from settings made consistent first, never index a sentence not there.
    const p = get();
    p.lengths = fitLengths(p.lengths, p.batch_size, p.max_len);
    p.example = Math.min(Math.max(p.example, 0), p.batch_size - 1);
    controls.batch_size.update(p.batch_size, 1, 4);
    controls.max_len.update(p.max_len, 1, 8);
    controls.num_heads.update(p.num_heads, 1, 4);
    controls.num_heads.style.display = p.show_heads ? "" : "none";
    controls.causal.update(p.causal);
    controls.example.update(p.example, 0, p.batch_size - 1);
    if (lengthRow.children.length !== p.batch_size) {
      lengthRow.replaceChildren(...range(p.batch_size).map((b) => slider(tr("length s{b}", { b }), `length${b}`, (n) => setLength(b, n))));
    }
    [...lengthRow.children].forEach((node, b) => node.update(p.lengths[b], 1, p.max_len));
    const st = computeState(p);
    picture.innerHTML = draw(p, st);
    numbers.show(tables(p, st));
    status.say(describe(p, st));
    el.dataset.state = JSON.stringify(st);
  });
  watch(model, ["batch_size", "max_len", "lengths", "causal", "num_heads", "example", "show_heads"], redraw);
}

export default { render };
