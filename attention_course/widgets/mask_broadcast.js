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
const small = (size, first, label) => (first ? { size, label, xTitle: "keys", yTitle: "queries" } : { size, label });

// ---- the picture in words: every grid's label, the live summary, and the tables
const padKeys = (st, b) => range(st.key_padding_mask[b].length).filter((j) => st.key_padding_mask[b][j]);
const keysWord = (keys) => (keys.length === 1 ? `key ${keys[0]}` : `keys ${spans(keys)}`);
const countBlocked = (m) => m.flat().filter(Boolean).length;
const why = (pad, future) => (pad ? "pad" : future ? "future" : "");
const maskWord = (pad, future) => (pad || future ? `True (${why(pad, future)})` : "False");

function padLabel(p, st) {
  const { batch_size: B, max_len: L } = p;
  return `Key padding mask (B, S) = (${B}, ${L}), True = pad, may not attend: ` + range(B).map((b) => {
    const pads = padKeys(st, b);
    const which = pads.length ? `${keysWord(pads)} ${pads.length === 1 ? "is a pad" : "are pads"}` : "no pads";
    return `s${b}, length ${p.lengths[b]}: ${which}`;
  }).join("; ") + ".";
}

function sentenceLabel(p, st, b, what) {
  const L = p.max_len, pads = padKeys(st, b), cells = `${countBlocked(st.combined_mask[b])} of ${L * L} cells blocked`;
  const padded = pads.length ? `${keysWord(pads)} blocked in every query row (pads)` : "no pads";
  if (what === "broadcast") {
    const blocked = countBlocked(st.broadcast_mask[b]);
    return `s${b} broadcast to (L, S) = (${L}, ${L}): every query row the same copy of its padding row, ${padded}; ` +
           `${blocked} of ${L * L} cells blocked.`;
  }
  const causal = p.causal ? ", and each query's later keys (causal)" : "";
  return `s${b} ${what}, (L, S) = (${L}, ${L}): ${padded}${causal}; ${cells}.`;
}

function describe(p, st) {
  const { batch_size: B, max_len: L, num_heads: h, example: ex } = p, n = p.lengths[ex];
  return `Batch of ${plural(B, "sentence")} of ${B === 1 ? "length" : "lengths"} ${listing(p.lengths.map(String))}, ` +
    `padded to L = S = ${L}: the key padding mask (B, 1, S) broadcast to (B, L, S) = (${B}, ${L}, ${L})` +
    (p.causal ? ", combined with the causal mask" : "; causal off") +
    (p.show_heads ? `; ${plural(h, "head")}: (B·h, L, S) = (${B * h}, ${L}, ${L})` : "") +
    `. Showing sentence ${ex} (of 0 to ${B - 1}): ${plural(n, "token")} and ${plural(L - n, "pad")}.`;
}

function tables(p, st) {
  const { batch_size: B, max_len: L, example: ex } = p, keys = range(L).map((j) => `key ${j}`);
  const queryName = (b, i) => (st.query_is_pad[b][i] ? `pad ${i}` : `q${i}`);
  const out = [table(`Key padding mask (B, S) = (${B}, ${L}): True = pad, may not attend`, ["sentence", "length", ...keys],
    range(B).map((b) => ({ head: `s${b}`, cells: [String(p.lengths[b]),
                                                   ...st.key_padding_mask[b].map((pad) => maskWord(pad, false))] })))];
  for (const b of range(B)) out.push(table(
    `Sentence ${b}: its mask (L, S) = (${L}, ${L}), ` +
    `${p.causal ? "padding OR causal" : "its padding row broadcast to every query"}` +
    `${p.show_heads ? "; every head gets this copy" : ""}. True = may not attend`, ["query", ...keys],
    range(L).map((i) => ({ head: queryName(b, i),
                           cells: range(L).map((j) => maskWord(st.key_padding_mask[b][j],
                                                               p.causal && st.causal_mask[i][j])) }))));
  const blocked = st.combined_mask[ex];
  const rowHead = (i) => (st.query_is_pad[ex][i] ? `pad ${i} (ignored downstream)` : `q${i}`);
  out.push(table(`Sentence ${ex}: scores after masked_fill(mask, −∞)`, ["query", ...keys],
    range(L).map((i) => ({ head: rowHead(i), cells: range(L).map((j) => (blocked[i][j]
      ? `−∞ (${why(st.key_padding_mask[ex][j], true)})` : st.scores[ex][i][j].toFixed(1))) }))));
  out.push(table(`Sentence ${ex}: weights, the softmax of each query's row over the keys it may attend`,
    ["query", ...keys, "sum"],
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
  out.push(`<div class="ac-panel"><h4>1. Key padding mask (B, S) = (${B}, ${L}): a row per sentence, a column per key;` +
           ` viewed as (B, 1, S)</h4>`,
    grid(B, L, (b, j) => {
      const pad = st.key_padding_mask[b][j], cls = pad ? "ac-pad" : "ac-ok";
      return { cls, fill: FILLS[cls], text: pad ? "T" : "F", title: `sentence ${b}, key ${j}: ${pad ? "pad" : "token"}` };
    }, { size: 22, rowLabels: range(B).map((b) => `s${b}`), colLabels: pos, right: (b) => `len ${p.lengths[b]}`,
         rightWidth: 40, xTitle: "keys (S)", yTitle: "sentences", label: padLabel(p, st) }),
    `</div>`);
  // 2. broadcast over the query rows
  out.push(`<div class="ac-panel"><h4>2. Broadcast over queries: (B, 1, S) → (B, L, S) = (${B}, ${L}, ${L}), every query row a copy</h4>`,
    `<div class="ac-multiples">`,
    ...range(B).map((b) => fig(grid(L, L, (i, j) => maskCell(st.broadcast_mask[b][i][j], false),
                                    small(13, b === 0, sentenceLabel(p, st, b, "broadcast"))), `s${b}`)),
    `</div></div>`);
  // 3. causal and combined
  if (p.causal) {
    out.push(`<div class="ac-panel"><h4>3. Combined = padding OR causal, (B, L, S)</h4><div class="ac-multiples">`,
      fig(grid(L, L, (i, j) => maskCell(false, st.causal_mask[i][j]), small(13, true,
        `Causal mask (L, S) = (${L}, ${L}): query i may not attend the keys after i; ` +
        `${countBlocked(st.causal_mask)} of ${L * L} cells blocked.`)), "causal (L, S)"),
      `<span class="ac-op">OR</span>`,
      ...range(B).map((b) => fig(grid(L, L, (i, j) => maskCell(st.broadcast_mask[b][i][j], st.causal_mask[i][j]),
                                      small(13, false, sentenceLabel(p, st, b, "combined"))), `s${b} combined`)),
      `</div></div>`);
  } else {
    out.push(`<div class="ac-panel ac-note"><h4>3. Combined mask</h4>Causal is off: the combined mask is the broadcast padding mask.</div>`);
  }
  // 4. one copy per head (left out where heads are not introduced yet: show_heads false)
  if (p.show_heads) out.push(`<div class="ac-panel"><h4>4. One copy per head: (B, h, L, S) = (${B}, ${h}, ${L}, ${L}) → ` +
           `(B·h, L, S) = (${B * h}, ${L}, ${L}), row b·h + head</h4><div class="ac-multiples">`,
    ...range(B * h).map((n) => {
      const b = Math.floor(n / h);
      return fig(grid(L, L, (i, j) => maskCell(st.broadcast_mask[b][i][j], st.causal_mask[i][j]), small(10, n === 0,
        `[${n}] = s${b} head ${n % h}: a copy of s${b}'s ${p.causal ? "combined" : "broadcast"} mask, ` +
        `${countBlocked(st.combined_mask[b])} of ${L * L} cells blocked.`)), `[${n}] s${b} head ${n % h}`);
    }),
    `</div></div>`);
  // 5. scores and weights of one sentence
  const blocked = st.combined_mask[ex], padQuery = (i) => st.query_is_pad[ex][i];
  const qLabels = range(L).map((i) => (padQuery(i) ? `pad ${i}` : `q${i}`));
  const pads = padKeys(st, ex), padQueries = range(L).filter(padQuery);
  const maskedWords = `${countBlocked(blocked)} of ${L * L} cells masked` +
    (pads.length ? `: ${keysWord(pads)} (pads)` : "") + (p.causal ? `${pads.length ? "," : ":"} each query's later keys` : "") +
    (padQueries.length ? `; pad ${padQueries.length === 1 ? "query" : "queries"} ${spans(padQueries)} greyed out: ` +
                         "computed, ignored downstream" : "");
  out.push(`<div class="ac-panel"><h4>${p.show_heads ? 5 : 4}. Sentence ${ex} (length ${p.lengths[ex]}): scores, then softmax over the keys it may attend</h4>`,
    `<div class="ac-multiples">`,
    fig(grid(L, L, (i, j) => blocked[i][j]
               ? { cls: st.key_padding_mask[ex][j] ? "ac-pad" : "ac-fut", text: "−∞", masked: true,
                   fill: FILLS[st.key_padding_mask[ex][j] ? "ac-pad" : "ac-fut"] }
               : { cls: "ac-ok", fill: FILLS["ac-ok"], text: st.scores[ex][i][j].toFixed(1) },
             { size: 30, font: 10, rowLabels: qLabels, labelWidth: 36, colLabels: pos.map((j) => `k${j}`), shadeRow: padQuery,
               xTitle: "keys", yTitle: "queries",
               label: `Scores of sentence ${ex}, ${L} queries by ${L} keys, after masked_fill(mask, −∞); ${maskedWords}. ` +
                      "Every value is in the tables below the picture." }),
        "scores, masked_fill(mask, −∞)"),
    fig(grid(L, L, (i, j) => {
          const w = st.weights[ex][i][j];
          return blocked[i][j] ? maskCell(st.key_padding_mask[ex][j], true)
            : { cls: "ac-w", fill: weightFill(w), text: w.toFixed(2) };
        }, { size: 30, font: 10, rowLabels: qLabels, labelWidth: 36, colLabels: pos.map((j) => `k${j}`), shadeRow: padQuery,
             xTitle: "keys", yTitle: "queries",
             right: (i) => `Σ ${st.weights[ex][i].reduce((a, b) => a + b, 0).toFixed(2)}`, rightWidth: 40,
             label: `Weights of sentence ${ex}: each query's softmax over the keys it may attend, so every row sums to 1 ` +
                    `and the masked cells get 0; ${maskedWords}. The largest weight of each query: ` +
                    range(L).map((i) => {
                      const row = st.weights[ex][i], j = row.indexOf(Math.max(...row));
                      return `${qLabels[i]} on k${j}, ${row[j].toFixed(2)}`;
                    }).join("; ") + ". Every value is in the tables below the picture." }),
        "weights: masked cells get 0"),
    `</div></div>`);
  out.push(`<div class="ac-legend">`,
    `<span><i class="ac-sw ac-ok"></i>F: may attend (kept)</span>`,
    `<span><i class="ac-sw ac-pad">×</i>T: padding, may NOT attend</span>`,
    `<span><i class="ac-sw ac-fut">×</i>T: future key (causal)</span>`,
    `<span><i class="ac-sw ac-shade-sw"></i>pad query row: computed, ignored downstream</span>`,
    `<div>Polarity: <b>True = may NOT attend</b>, as in nn.MultiheadAttention's key_padding_mask and attn_mask.` +
    ` Self-attention: the keys are the sentence's own tokens, so S = L.</div>`,
    `</div>`);
  return out.join("");
}

function render({ model, el }) {
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
    batch_size: slider("batch size B", "batch_size", setBatch),
    max_len: slider("max length L", "max_len", setMaxLen),
    num_heads: slider("heads h", "num_heads", (v) => commit(model, { num_heads: v })),
    causal: checkbox("causal", "causal", (v) => commit(model, { causal: v })),
    example: slider("show sentence", "example", (v) => commit(model, { example: v })),
  };
  const lengthRow = make("div", { class: "ac-controls ac-lengths" });
  const picture = make("div", { class: "ac-picture" });
  const numbers = tablesBox("Show the masks, scores and weights as tables");
  const status = liveRegion();
  el.replaceChildren(make("div", { class: "ac-controls" }, ...Object.values(controls)), lengthRow, picture, numbers,
                     status);

  const redraw = () => {
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
      lengthRow.replaceChildren(...range(p.batch_size).map((b) => slider(`length s${b}`, `length${b}`, (n) => setLength(b, n))));
    }
    [...lengthRow.children].forEach((node, b) => node.update(p.lengths[b], 1, p.max_len));
    const st = computeState(p);
    picture.innerHTML = draw(p, st);
    numbers.show(tables(p, st));
    status.say(describe(p, st));
    el.dataset.state = JSON.stringify(st);
  };
  watch(model, ["batch_size", "max_len", "lengths", "causal", "num_heads", "example", "show_heads"], redraw);
}

export default { render };
