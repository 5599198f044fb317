// DecodeCacheWidget's picture, computed here from the traits alone (the static site has no kernel).
// decode_cache.py computes the same state with torch; keep the two in step.
// Polarity: true = may NOT attend (an ignore mask, as in attention_course.masks).

const ITEMSIZE = { float64: 8, float32: 4, float16: 2, bfloat16: 2 };  // bytes of one element (torch's itemsize)
const MAX_HEADS = 8, MAX_STEPS = 16;

const divisorsOf = (n) => range(n).map((i) => i + 1).filter((k) => n % k === 0);
// The KV head count kept when h changes: the largest divisor of h not above it (decode_cache.py suggests the same).
const fitKvHeads = (h, hkv) => Math.max(...divisorsOf(h).filter((k) => k <= hkv));

function computeState({ step: t, steps: T, num_heads: h, num_kv_heads: hkv, window: W, head_dim: d, dtype, prompt: P }) {
  const keys = range(t + 1);  // (S,): the cache's positions once the new token's key is in, S = t + 1
  const ignore = keys.map((j) => j > t || (W !== null && t - j >= W));  // (S,): the new query's row
  const rolling = W === null ? keys : keys.slice(-W);  // what a rolling cache keeps: its last W entries
  const perPosition = 2 * hkv * d * ITEMSIZE[dtype];  // K and V of one position, one layer, batch of one
  const fresh = t < P ? keys : [t];  // computed at this step: the prefill's one pass, or this token alone
  return {
    prompt: P,
    new_positions: fresh,
    reused_positions: keys.filter((j) => !fresh.includes(j)),  // read from the cache, not recomputed
    computed_at: keys.map((j) => (j < P ? "prefill" : `step ${j}`)),
    key_positions: keys,
    kv_head_of_query: range(h).map((j) => Math.floor(j / (h / hkv))),  // repeat_interleave: j // n_rep
    ignore_mask: range(h).map(() => ignore.slice()),  // (h, S): every query head the same row
    read_positions: keys.filter((j) => !ignore[j]),
    rolling_positions: rolling,
    cache_entries: t + 1,
    rolling_entries: rolling.length,
    bytes_per_position: perPosition,
    cache_bytes: perPosition * (t + 1),
    rolling_bytes: perPosition * rolling.length,
    mha_cache_bytes: 2 * h * d * ITEMSIZE[dtype] * (t + 1),
    entries_by_step: range(T).map((s) => [s + 1, W === null ? s + 1 : Math.min(s + 1, W)]),
  };
}

// ---- colours: a hue per KV head (light, so the ink reads on it); a key outside the window: grey AND hatched
const kvFill = (g) => hsl((g * 137.5 + 15) % 360, 62, 88);  // kv_fill in decode_cache.py
const OUTSIDE = hex("#6e7781");
const HATCH_INK = css(textOn(OUTSIDE));

// Diagonal hatching over every cell drawn with class ac-out in the grid markup `svg` (three lines a cell, in the
// ink textOn() picks for the grey, so the pattern reads at >= 3:1 like the other widgets' crosses).
function hatch(svg) {
  return svg.replace(/<rect class="ac-out" x="([\d.]+)" y="([\d.]+)" width="([\d.]+)"[^>]*\/>/g, (rect, ...xys) => {
    const [x, y, s] = xys.slice(0, 3).map(Number);
    const lines = [[0, s / 2, s / 2, 0], [0, s, s, 0], [s / 2, s, s, s / 2]];
    const path = lines.map(([a, b, c, e]) => `M${x + a} ${y + b}L${x + c} ${y + e}`).join("");
    return `${rect}<path class="ac-x ac-hatch" style="stroke: ${HATCH_INK}" d="${path}"/>`;
  });
}

// ---- the picture in words: every grid's label, the live summary, the summary lines and the tables
const bytes = (n) => trn("{count} byte", "{count} bytes", n, { count: n.toLocaleString("en-US") });
const positionsWord = (ps) => trn("position {list}", "positions {list}", ps.length, { list: spans(ps) });
const queriesOf = (g, nRep) => range(nRep).map((i) => g * nRep + i);
const cap = (text) => text[0].toUpperCase() + text.slice(1);
const headsWord = (js) => trn("query head {list}", "query heads {list}", js.length, { list: spans(js) });
const queryHeads = (n) => trn("{n} query head", "{n} query heads", n);
const kvHeadsWord = (n) => trn("{n} KV head", "{n} KV heads", n);

function windowWords(p, st) {
  const out = st.key_positions.filter((j) => st.ignore_mask[0][j]);
  if (p.window === null) return tr("No window: it reads every cached key, and the cache grows by one entry a step.");
  const args = { W: p.window, read: positionsWord(st.read_positions), out: positionsWord(out) };
  return out.length ? trn("Sliding window W = {W}: it reads {read}; {out} is outside the window, and a rolling cache of " +
                          "{W} entries has dropped it.",
                          "Sliding window W = {W}: it reads {read}; {out} are outside the window, and a rolling cache " +
                          "of {W} entries has dropped them.", out.length, args)
    : tr("Sliding window W = {W}: it reads {read}, the whole cache: nothing is outside the window yet.", args);
}

function sharingWords(p) {
  const { num_heads: h, num_kv_heads: hkv } = p, nRep = h / hkv;
  const kind = hkv === 1 ? tr("multi-query attention") : hkv === h ? tr("multi-head attention, no sharing")
    : tr("grouped-query attention");
  if (hkv === h) return tr("{heads} with a KV head each ({kind}).", { heads: queryHeads(h), kind });
  return tr("{heads} share {kv}, {r} each ({kind}): {who}.", { heads: queryHeads(h), kv: kvHeadsWord(hkv), r: nRep, kind,
    who: clauses(range(hkv).map((g) => trn("{heads} reads KV head {g}", "{heads} read KV head {g}", nRep,
                                           { heads: headsWord(queriesOf(g, nRep)), g }))) });
}

function computeWords(p, st) {
  const P = p.prompt, t = p.step;
  if (t < P) return trn("Prefill: the {n} prompt token ({which}) goes through in one pass, which computes its key and " +
                        "value; query {t} reads {reads}.",
                        "Prefill: the {n} prompt tokens ({which}) go through in one pass, which computes the keys " +
                        "and values of all of them at once; query {t} reads {reads}.", P,
                        { which: positionsWord(range(P)), t, reads: positionsWord(st.key_positions) });
  const args = { t, reused: positionsWord(st.reused_positions), P: spans(range(P)) };
  const when = P === 1 ? tr("position 0 at step 0, each later one at its own step")
    : tr("positions {P} at the prefill, each later one at its own step", args);
  return trn("Decode step: only position {t}'s key and value are computed now; {reused} is reused from the cache, not " +
             "recomputed ({when}).",
             "Decode step: only position {t}'s key and value are computed now; {reused} are reused from the cache, not " +
             "recomputed ({when}).", st.reused_positions.length, { ...args, when });
}

function describe(p, st) {
  const t = p.step;
  const gap = LANG === "en" ? " " : "";  // Chinese sentences end in 。 and are joined with no space
  return [trn("Step t = {t} (of 0 to {last}): the new token at position {t} has added its key and value, so the cache " +
             "holds {n} position per KV head ({which}).",
             "Step t = {t} (of 0 to {last}): the new token at position {t} has added its key and value, so the cache " +
             "holds {n} positions per KV head ({which}).", t + 1,
             { t, last: p.steps - 1, which: positionsWord(st.key_positions) }),
    computeWords(p, st), sharingWords(p), windowWords(p, st),
    (p.window === null ? tr("Cache per layer: {bytes}.", { bytes: bytes(st.cache_bytes) })
      : tr("Cache per layer: {bytes}; rolling cache: {rolling}.", { bytes: bytes(st.cache_bytes),
                                                                    rolling: bytes(st.rolling_bytes) }))].join(gap);
}

function summary(p, st) {
  const { num_heads: h, num_kv_heads: hkv, head_dim: d, dtype } = p, size = ITEMSIZE[dtype], S = st.cache_entries;
  const formula = (heads, n) => `2 · ${heads} · ${d} · ${n} · ${size} = ${bytes(2 * heads * d * n * size)}`;
  return [
    `<div>${tr("<b>Cache entries held:</b> {S} per KV head ({which}), for each of the {kv}: {keys} keys and as many values.",
               { S, which: positionsWord(st.key_positions), kv: kvHeadsWord(hkv), keys: hkv * S })}` +
    (p.window === null ? tr(" No window: every step adds one.")
      : tr(" <b>A rolling cache</b> of W = {W} keeps {n} ({which}), and never more than {W}.",
           { W: p.window, n: st.rolling_entries, which: positionsWord(st.rolling_positions) })) + `</div>`,
    `<div>${trn("<b>Bytes per layer</b>, batch of one, head_dim d = {d}, {dtype} ({n} byte): K and V = " +
                "2 · h_kv · d · S · bytes = {formula}",
                "<b>Bytes per layer</b>, batch of one, head_dim d = {d}, {dtype} ({n} bytes): K and V = " +
                "2 · h_kv · d · S · bytes = {formula}", size, { d, dtype, formula: formula(hkv, S) })}` +
    (p.window === null ? "" : tr("; rolling: {formula}", { formula: formula(hkv, st.rolling_entries) })) +
    (hkv < h ? tr(". Without sharing ({h} KV heads): {formula}, {r} times as much.", { h, formula: formula(h, S), r: h / hkv })
      : ".") + `</div>`,
  ].join("");
}

function tables(p, st) {
  const t = p.step, cols = st.key_positions.map((j) => tr("key {j}", { j }));
  const out = [table(tr("Step {t}: what each query head of the new token reads (the key positions in the cache)", { t }),
    [tr("query head"), tr("reads KV head"), ...cols],
    range(p.num_heads).map((j) => ({
      head: `q${j}`, cells: [`kv${st.kv_head_of_query[j]}`,
                             ...st.ignore_mask[j].map((no) => (no ? tr("not read (outside the window)") : tr("read")))] })))];
  const rolling = p.window !== null;
  out.push(table(tr("Cache size after each step, one layer, batch of one: {bytes} a position (K and V, {kv}, d = {d}, " +
                    "{dtype})", { bytes: bytes(st.bytes_per_position), kv: kvHeadsWord(p.num_kv_heads), d: p.head_dim,
                                  dtype: p.dtype }),
    [tr("step"), tr("full cache: entries"), tr("full cache: bytes"),
     ...(rolling ? [tr("rolling cache (W = {W}): entries", { W: p.window }), tr("rolling cache: bytes")] : [])],
    st.entries_by_step.map(([full, held], s) => ({
      head: s === t ? tr("{s} (shown)", { s }) : `${s}`,
      cells: [String(full), bytes(full * st.bytes_per_position),
              ...(rolling ? [String(held), bytes(held * st.bytes_per_position)] : [])] }))));
  return out.join("");
}

function draw(p, st) {
  const { step: t, num_heads: h, num_kv_heads: hkv } = p, nRep = h / hkv, S = t + 1;
  const outside = (j) => st.ignore_mask[0][j];
  const positions = st.key_positions.map(String);
  const made = (j) => (st.new_positions.includes(j) ? (p.step < p.prompt ? tr("computed now, in the prefill's pass")
    : tr("computed now")) : j < p.prompt ? tr("reused from the cache (computed in the prefill), not recomputed")
    : tr("reused from the cache (computed at step {j}), not recomputed", { j }));
  const cell = (g, j, who) => (outside(j)
    ? { cls: "ac-out", fill: OUTSIDE,
        title: tr("{who}, position {j}: outside the window, not read; a rolling cache has dropped it", { who, j }) }
    : { cls: st.new_positions.includes(j) ? "ac-kv ac-new" : "ac-kv", fill: kvFill(g),
        text: st.new_positions.includes(j) ? `${j}*` : String(j),
        title: tr("{who}, position {j}: read; {made}", { who, j, made: made(j) }) });
  const notRead = st.key_positions.filter(outside);
  const readWords = st.read_positions.length < S
    ? tr("{read}, not {out} (hatched: outside the window)", { read: positionsWord(st.read_positions),
                                                              out: positionsWord(notRead) })
    : S === 1 ? tr("position 0, the whole cache") : tr("all {S} positions", { S });
  const out = [];
  out.push(`<div class="ac-panel"><h4>${tr("1. The cache after step t = {t}: the new token (position {t}) has added " +
                                           "its key and value; keys (B, h_kv, S, d) = (1, {hkv}, {S}, {d})",
                                           { t, hkv, S, d: p.head_dim })}</h4>`,
    hatch(grid(hkv, S, (g, j) => cell(g, j, tr("KV head {g}", { g })), {
      size: 22, font: 9, rowLabels: range(hkv).map((g) => `kv${g}`), colLabels: positions,
      right: (g) => `→ q${g * nRep}${nRep > 1 ? `–q${(g + 1) * nRep - 1}` : ""}`, rightWidth: 60,
      xTitle: tr("key positions"), yTitle: tr("KV heads"),
      label: tr("The cache's keys after step {t}: {kv} (rows) by {S} (columns). The new query reads {reads}.",
                { t, kv: kvHeadsWord(hkv), S: trn("{n} key position, {list}", "{n} key positions, {list}", S,
                                                 { list: spans(st.key_positions) }), reads: readWords }) })),
    `</div>`);
  out.push(`<div class="ac-panel"><h4>${tr("2. What the new query reads, head by head: {heads} over {kv}, query head j " +
                                           "reads KV head j div {r}", { heads: queryHeads(h), kv: kvHeadsWord(hkv), r: nRep })}` +
           `</h4><div class="ac-multiples">`,
    ...range(hkv).map((g) => {
      const heads = queriesOf(g, nRep);
      return fig(hatch(grid(nRep, S, (i, j) => cell(g, j, tr("query head {j} (KV head {g})", { j: heads[i], g })), {
        size: 22, font: 9, rowLabels: heads.map((j) => `q${j}`), colLabels: positions,
        xTitle: tr("KV head {g}'s keys", { g }), yTitle: tr("query heads"),
        label: trn("{heads} (rows) reads the keys of KV head {g} (columns, {which}): {reads}.",
                   "{heads} (rows) each read the keys of KV head {g} (columns, {which}): {reads}.", nRep,
                   { heads: cap(headsWord(heads)), g, which: positionsWord(st.key_positions), reads: readWords }) })),
        tr("KV head {g}: {heads}", { g, heads: headsWord(heads) }));
    }),
    `</div></div>`);
  out.push(`<div class="ac-legend ac-summary"><div>${tr("<b>Computed at this step:</b> {what}",
                                                        { what: computeWords(p, st) })}</div>`,
           summary(p, st), `</div>`);
  out.push(`<div class="ac-legend">`,
    ...range(hkv).map((g) => `<span><i class="ac-sw" style="background: ${css(kvFill(g))}"></i>` +
                             `${tr("KV head {g}'s keys, read by {heads}", { g, heads: headsWord(queriesOf(g, nRep)) })}</span>`),
    p.window === null ? ""
      : `<span><i class="ac-sw ac-out"></i>${tr("grey and hatched: outside the window, not read (a rolling cache has " +
                                                "dropped it)")}</span>`,
    `<div>${tr("The number in a cell is the key's position; a star (*) marks a key computed at this step, the others " +
               "are reused from the cache. Polarity of the masks: <b>True = may NOT attend</b>.")}</div>`,
    `</div>`);
  return out.join("");
}

function render({ model, el }) {
  LANG = chooseLanguage(model, el);
  el.classList.add("ac-widget");
  el.dataset.acWidget = "decode-cache";
  const names = ["step", "steps", "num_heads", "num_kv_heads", "window", "head_dim", "dtype", "prompt"];
  const get = () => Object.fromEntries(names.map((k) => [k, model.get(k) ?? null]));
  let lastWindow = null;  // the window the checkbox brings back
  let moved = null;  // a KV head count the h slider had to change, said while h and h_kv stay as it left them
  const setStep = (t) => commit(model, { step: Math.min(Math.max(t, 0), get().steps - 1) });
  // The window and prompt last asked for: a shorter generation clamps them (and says so), a longer one brings them back.
  let asked = { window: model.get("window") ?? null, prompt: model.get("prompt") ?? 1 };
  const setSteps = (T) => {
    const p = get();
    if (p.window !== null && p.window !== Math.min(asked.window ?? Infinity, p.steps)) asked.window = p.window;  // set elsewhere
    commit(model, { step: Math.min(p.step, T - 1), window: p.window === null ? null : Math.min(asked.window ?? p.window, T),
                    prompt: Math.min(Math.max(asked.prompt, 1), T), steps: T });
  };
  const setHeads = (h) => {
    const before = get().num_kv_heads, hkv = fitKvHeads(h, before);
    moved = hkv === before ? null : { h, from: before, hkv };
    commit(model, { num_heads: h, num_kv_heads: hkv });
  };
  const setWindowOn = (on) => {
    const p = get();
    if (!on) lastWindow = p.window;
    asked.window = on ? lastWindow ?? Math.ceil(p.steps / 2) : null;
    commit(model, { window: on ? Math.min(asked.window, p.steps) : null });
  };
  const stepButton = (by, text, arrow) => {
    const parts = by < 0 ? [make("span", { "aria-hidden": "true" }, arrow), ` ${text}`]
      : [`${text} `, make("span", { "aria-hidden": "true" }, arrow)];
    const button = make("button", { type: "button", name: "step", value: by < 0 ? "previous" : "next" }, ...parts);
    button.addEventListener("click", () => setStep(get().step + by));  // a disabled button is never clicked
    return button;
  };
  const previous = stepButton(-1, tr("previous step"), "◀"), next = stepButton(1, tr("next step"), "▶");
  const controls = {
    step: slider(tr("step t"), "step", setStep),
    steps: slider(tr("steps T"), "steps", setSteps),
    num_heads: slider(tr("query heads h"), "num_heads", setHeads),
    window_on: checkbox(tr("sliding window"), "window_on", setWindowOn),
    window: slider(tr("window W"), "window", (W) => { asked.window = W; commit(model, { window: W }); }),
    prompt: slider(tr("prompt P"), "prompt", (P) => { asked.prompt = P; commit(model, { prompt: P }); }),
  };
  const kvHeads = choices(tr("KV heads h_kv (divides h)"), "num_kv_heads", (k) => {
    moved = null;
    commit(model, { num_kv_heads: k });
  });
  const notice = make("output", { class: "ac-notice", role: "status", "aria-live": "polite" });
  const picture = make("div", { class: "ac-picture" });
  const numbers = tablesBox(tr("Show what each head reads, and the cache size step by step, as tables"));
  const status = liveRegion();
  el.replaceChildren(
    make("div", { class: "ac-controls" }, make("span", { class: "ac-choices ac-stepper" }, previous, controls.step, next),
         controls.steps, controls.prompt),
    make("div", { class: "ac-controls" }, controls.num_heads, kvHeads, controls.window_on, controls.window, notice),
    picture, numbers, status);

  const redraw = speaking(LANG, () => {
    // Settings made consistent first (trait changes may arrive one message at a time): never draw a step past the
    // last, a window longer than the generation, or a KV head count that does not divide h.
    const p = get();
    p.steps = Math.min(Math.max(p.steps, 1), MAX_STEPS);
    p.step = Math.min(Math.max(p.step, 0), p.steps - 1);
    p.window = p.window === null ? null : Math.min(Math.max(p.window, 1), p.steps);
    p.num_heads = Math.min(Math.max(p.num_heads, 1), MAX_HEADS);
    p.num_kv_heads = fitKvHeads(p.num_heads, p.num_kv_heads);
    if (!(p.dtype in ITEMSIZE)) p.dtype = "float32";
    p.prompt = Math.min(Math.max(p.prompt ?? 1, 1), p.steps);
    const clamped = [["window", p.window], ["prompt", p.prompt]]
      .filter(([name, shown]) => asked[name] !== null && shown !== null && asked[name] > shown)
      .map(([name, shown]) => trn("{name} {asked} is longer than the {n} token generated: it shows as {shown} until " +
                                  "steps is {asked} or more again",
                                  "{name} {asked} is longer than the {n} tokens generated: it shows as {shown} until " +
                                  "steps is {asked} or more again", p.steps,
                                  { name: name === "window" ? tr("window") : tr("prompt"), asked: asked[name], shown }));
    if (moved && (moved.h !== p.num_heads || moved.hkv !== p.num_kv_heads)) moved = null;
    notice.textContent = [moved ? tr("h_kv = {from} does not divide h = {h}: h_kv is now {hkv}, the largest KV head " +
                                     "count below it that does.", moved) : "", ...clamped].filter(Boolean).join(tr("; "));
    controls.step.update(p.step, 0, p.steps - 1);
    // A step button that cannot act is disabled (a screen reader says "unavailable"); if it held the keyboard's
    // focus, the focus moves to the other one, which can act, so it is not lost to the page.
    const focused = [previous, next].find((b) => b === el.ownerDocument.activeElement);
    previous.disabled = p.step === 0;
    next.disabled = p.step === p.steps - 1;
    if (focused?.disabled) (focused === previous ? next : previous).focus();
    controls.steps.update(p.steps, 1, MAX_STEPS);
    controls.num_heads.update(p.num_heads, 1, MAX_HEADS);
    controls.window_on.update(p.window !== null);
    controls.window.style.display = p.window === null ? "none" : "";
    controls.window.update(p.window ?? 1, 1, p.steps);
    controls.prompt.update(p.prompt, 1, p.steps);
    kvHeads.update(divisorsOf(p.num_heads), p.num_kv_heads);  // only a new h brings new buttons
    const st = computeState(p);
    picture.innerHTML = draw(p, st);
    numbers.show(tables(p, st));
    status.say(describe(p, st));
    el.dataset.state = JSON.stringify(st);
  });
  watch(model, names, redraw);
}

export default { render };
