"use strict";
(function () {
  const DATA = JSON.parse(document.getElementById("attnlab-data").textContent);
  const HEAD_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
    "#7f7f7f", "#bcbd22", "#17becf", "#393b79", "#637939", "#8c6d31", "#843c39", "#7b4173", "#3182bd"];
  // viridis anchors, interpolated into a 256-entry lookup table
  const ANCHORS = [[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]];
  const LUT = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * (ANCHORS.length - 1), k = Math.min(Math.floor(t), ANCHORS.length - 2), f = t - k;
    for (let c = 0; c < 3; c++) LUT[i * 3 + c] = ANCHORS[k][c] + f * (ANCHORS[k + 1][c] - ANCHORS[k][c]);
  }
  // signed values (effective weights A·F): RdBu reversed, blue < 0 < red, white at 0
  const DIV_ANCHORS = [[5, 48, 97], [33, 102, 172], [67, 147, 195], [146, 197, 222], [209, 229, 240],
    [247, 247, 247], [253, 219, 199], [244, 165, 130], [214, 96, 77], [178, 24, 43], [103, 0, 31]];
  const DIV_LUT = new Uint8ClampedArray(256 * 3);
  for (let i = 0; i < 256; i++) {
    const t = (i / 255) * (DIV_ANCHORS.length - 1), k = Math.min(Math.floor(t), DIV_ANCHORS.length - 2), f = t - k;
    for (let c = 0; c < 3; c++) DIV_LUT[i * 3 + c] = DIV_ANCHORS[k][c] + f * (DIV_ANCHORS[k + 1][c] - DIV_ANCHORS[k][c]);
  }
  const MASK_RGB = [230, 190, 190];
  const STEPS = Array.isArray(DATA.steps) && DATA.steps.length ? DATA.steps : null;
  // a language model's prompt followed by generated tokens: positions >= PROMPT are generated
  const PROMPT = typeof DATA.prompt_length === "number" ? DATA.prompt_length : null;
  const GEN_COLOR = "#bc4c00", TEXT_COLOR = "#1f2328";
  // each generated token's probability, entropy and alternatives (generate(return_scores=True))
  const SCORES = PROMPT !== null && Array.isArray(DATA.token_scores) ? DATA.token_scores : null;
  // mode: for a layer with projected keys (Linformer), "weights" (T × k over the E·K rows) or
  // "effective" (A·F, T × T over the tokens the rows mix; signed)
  // the page opens where Python chose (viewer_start.most_informative_head), else on the first head
  const START = DATA.start && DATA.groups[DATA.start.group] ? DATA.start : { group: 0, layer: 0, head: 0, reason: "" };
  // the method switch (attnlab view --mixing): what Python's attnlab.inspect.mixing computed,
  // per head or one matrix per layer; "weights" is the page's own data
  const METHODS = new Map((DATA.methods || []).map((m) => [m.name, m]));
  const state = { group: START.group, layer: START.layer, head: START.head, view: "matrix", mode: "weights", showMask: false, threshold: 0.02,
    focus: -1, step: STEPS ? STEPS.length - 1 : 0, method: "weights" };
  const cache = new Map();
  const canvas = document.getElementById("canvas");
  const ctx = canvas.getContext("2d");
  const tip = document.getElementById("tip");
  // the lens panel (attnlab view --lens): layers × positions, Python's numbers (viewer_lens.js)
  const LENS = attnlabLensPanel(DATA, LUT, tip);
  let geom = null; // how the current drawing maps positions to pixels
  let renders = 0;
  let legend = null; // what the colour bar shows now

  function decode(b64, Type) {
    const bin = atob(b64), bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    return new Type(bytes.buffer);
  }
  // the method a layer shows: the one switched on when the layer has its matrices, else null
  // (its weights)
  function methodOf(L) {
    return state.method !== "weights" && L.mixing && L.mixing[state.method] ? METHODS.get(state.method) : null;
  }
  function current(layer) {
    if (layer === undefined) layer = state.layer;
    const g = DATA.groups[state.group], L = g.layers[layer];
    const projected = !!g.projected_from;
    const mix = projected ? null : methodOf(L);
    const effective = !mix && projected && state.mode === "effective" && !!L.effective;
    const signed = mix ? !!mix.signed : effective;
    const key = state.group + ":" + layer + (mix ? ":" + mix.name : effective ? ":effective" : "");
    if (!cache.has(key)) {
      const mask = L.mask ? decode(L.mask, Uint8Array) : null;
      cache.set(key, mix ? { w: decode(L.mixing[mix.name].values, Float32Array), m: mask, nh: L.mixing[mix.name].heads }
        : effective ? { w: decode(L.effective, Float32Array), m: null, nh: L.heads }
        : { w: decode(L.weights, Float32Array), m: mask, nh: L.heads });
    }
    // the columns: key tokens, the k projected rows, or (effective) the tokens the rows mix
    const kname = effective ? g.projected_from : g.key;
    const tq = DATA.sequences[g.query].length, tk = DATA.sequences[kname].length;
    // with steps the weights are (S, H, T_q, T_k): this step's block starts at step · H · T_q · T_k
    const offset = STEPS && !mix ? state.step * L.heads * tq * tk : 0;
    return Object.assign({ g, L, layer, tq, tk, offset, projected, signed, mode: mix ? mix.name : effective ? "effective" : "weights",
      method: mix ? mix.name : "weights", mix, q: DATA.sequences[g.query], k: DATA.sequences[kname], qname: g.query, kname }, cache.get(key));
  }
  // generated tokens (after the prompt) of a sequence, and the position where they start
  function generated(name, i) { return PROMPT !== null && name === "tokens" && i >= PROMPT; }
  function boundary(name, n) { return PROMPT !== null && name === "tokens" && PROMPT > 0 && PROMPT < n ? PROMPT : -1; }
  // special tokens ([CLS], [SEP], <s>): their labels in another colour, named on hover
  const SPECIAL = DATA.special || {};
  const SPECIAL_COLOR = "#0550ae";
  function special(name, i) { return Array.isArray(SPECIAL[name]) && SPECIAL[name].includes(i); }
  function labelColor(name, i) { return generated(name, i) ? GEN_COLOR : special(name, i) ? SPECIAL_COLOR : TEXT_COLOR; }
  function scoreOf(name, i) { return SCORES && generated(name, i) ? SCORES[i - PROMPT] || null : null; }
  function percent(p) { return p >= 0.995 ? "100%" : p < 0.01 ? "<1%" : Math.round(p * 100) + "%"; }
  function label(name, t, i, n) {
    const s = scoreOf(name, i);
    return (generated(name, i) ? "▸" : "") + truncate(t, n) + (s ? " " + percent(s.probability) : "");
  }
  // a generated token's line on hover: its probability, the entropy and the alternatives
  function scoreText(name, i) {
    const s = scoreOf(name, i);
    if (!s) return special(name, i) ? " · special token" : "";
    const alts = s.alternatives.map((a) => JSON.stringify(a.token) + " " + a.probability.toFixed(4)).join(", ");
    return "\ngenerated with p = " + s.probability.toFixed(4) + " · entropy " + s.entropy.toFixed(3) + " nats" +
      (s.cumulative_logprob !== null && s.cumulative_logprob !== undefined ? " · beam log p " + s.cumulative_logprob.toFixed(3) : "") +
      "\nalternatives: " + alts;
  }
  // a layer with projected keys has no token-to-token lines: its columns are not tokens; a
  // method's scores are no weights to draw lines by
  function noLines(g) { return !!g.projected_from || !!methodOf(g.layers[state.layer]); }
  function viewOf(g) {
    if (state.view === "lens") return LENS.available ? "lens" : "matrix";
    return noLines(g) && state.view === "lines" ? "matrix" : state.view;
  }
  // a per-layer method (nh = 1) has one matrix, whichever head is asked for
  function weight(c, h, i, j) { return c.w[c.offset + ((c.nh === 1 ? 0 : h) * c.tq + i) * c.tk + j]; }
  function stepText() { return STEPS ? "training step " + STEPS[state.step] : ""; }
  function allowed(c, i, j) { return !c.m || c.m[i * c.tk + j] === 1; }

  function buttons(id, items, active, onClick, cls) {
    const box = document.getElementById(id);
    box.textContent = "";
    items.forEach((item) => {
      const b = document.createElement("button");
      b.textContent = item.label;
      b.className = cls + (item.value === active ? " active" : "");
      b.dataset.value = item.value;
      if (item.color) b.style.borderLeftColor = item.color;
      if (item.title) b.title = item.title;
      if (item.disabled) b.disabled = true;
      b.addEventListener("click", () => onClick(item.value));
      box.appendChild(b);
    });
  }
  function controls() {
    buttons("groups", DATA.groups.map((g, i) => ({ label: g.name, value: i })), state.group,
      (v) => { state.group = v; state.layer = Math.min(state.layer, DATA.groups[v].layers.length - 1); update(); }, "group-btn");
    const g = DATA.groups[state.group];
    buttons("layers", g.layers.map((L, i) => ({ label: String(i), value: i })), state.layer,
      (v) => { state.layer = v; update(); }, "layer-btn");
    const H = g.layers[state.layer].heads;
    if (state.head >= H) state.head = 0;
    const heads = [{ label: "all", value: -1 }];
    for (let h = 0; h < H; h++) heads.push({ label: String(h), value: h, color: HEAD_COLORS[h % HEAD_COLORS.length] });
    buttons("heads", heads, state.head, (v) => { state.head = v; update(); }, "head-btn");
    const projected = !!g.projected_from;
    methodControls(g);
    document.querySelectorAll(".view-btn").forEach((b) => {
      b.classList.toggle("active", b.dataset.view === viewOf(g));
      if (b.dataset.view === "lens") { b.hidden = !LENS.available; return; }
      if (b.dataset.view !== "lines") return;
      const off = noLines(g);
      b.disabled = off;
      b.title = !off ? "" : projected ? "no lines: this layer's columns are projected rows (mixes of all positions), not tokens"
        : "no lines: the lines show attention weights; a method's scores are drawn as a matrix or a grid";
    });
    document.getElementById("mode-row").hidden = !projected;
    document.getElementById("note-row").hidden = !(projected && g.note);
    document.getElementById("note").textContent = projected && g.note ? g.note : "";
    const hasEffective = projected && !!g.layers[state.layer].effective;
    document.querySelectorAll(".mode-btn").forEach((b) => {
      b.classList.toggle("active", b.dataset.mode === (hasEffective ? state.mode : "weights"));
      if (b.dataset.mode === "effective") b.disabled = !hasEffective;
    });
    document.getElementById("layers").title = g.layers[state.layer].name;
    // the lens panel has no attention group, layer, head or method to choose
    const lensOn = viewOf(g) === "lens";
    ["groups", "layers", "heads"].forEach((id) => { document.getElementById(id).parentElement.hidden = lensOn; });
    if (lensOn) ["mode-row", "note-row", "method-row"].forEach((id) => { document.getElementById(id).hidden = true; });
    document.getElementById("show-mask").parentElement.hidden = lensOn;
    document.getElementById("threshold").parentElement.hidden = lensOn;
    if (START.reason) document.getElementById("start-row").hidden = lensOn;
  }
  // the method switch: weights, then each method Python computed; a method without matrices in
  // this group (an encoder-decoder's decoder) is greyed out, and the note says what is shown
  function methodControls(g) {
    document.getElementById("method-row").hidden = METHODS.size === 0;
    if (METHODS.size === 0) return;
    const has = (name) => g.layers.some((L) => L.mixing && L.mixing[name]);
    const items = [{ label: "weights", value: "weights", title: "attention weight α_ij" }];
    METHODS.forEach((m) => items.push({ label: m.label, value: m.name, title: m.meaning, disabled: !has(m.name) }));
    buttons("methods", items, state.method, (v) => { state.method = v; tip.hidden = true; update(); }, "method-btn");
    const m = METHODS.get(state.method);
    let note = "";
    if (m && !has(m.name)) {
      const where = DATA.groups.filter((o) => o.layers.some((L) => L.mixing && L.mixing[m.name])).map((o) => o.name);
      note = m.label + " was computed for the " + where.join(", ") + " only: this group shows its attention weights";
    } else if (m) note = m.label + ": " + m.note;
    document.getElementById("method-note").textContent = note;
  }
  // each redraw is announced, so a page framing this one (attnlab serve) follows the head chosen
  function update() { controls(); draw(); window.dispatchEvent(new CustomEvent("attnlab:update")); }

  function setSize(w, h) {
    const dpr = window.devicePixelRatio || 1;
    canvas.width = Math.ceil(w * dpr); canvas.height = Math.ceil(h * dpr);
    canvas.style.width = w + "px"; canvas.style.height = h + "px";
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    ctx.clearRect(0, 0, w, h);
  }
  function truncate(s, n) { return s.length > n ? s.slice(0, n - 1) + "…" : s; }

  // ---------------------------------------------------------------- matrix view
  function heatImage(c, h) {
    let vmax = 0;
    for (let i = 0; i < c.tq; i++) {
      for (let j = 0; j < c.tk; j++) vmax = Math.max(vmax, c.signed ? Math.abs(weight(c, h, i, j)) : weight(c, h, i, j));
    }
    vmax = vmax > 0 ? vmax : 1;
    const img = new ImageData(c.tk, c.tq), px = img.data;
    for (let i = 0; i < c.tq; i++) {
      for (let j = 0; j < c.tk; j++) {
        const o = (i * c.tk + j) * 4;
        if (state.showMask && !allowed(c, i, j)) {
          px[o] = MASK_RGB[0]; px[o + 1] = MASK_RGB[1]; px[o + 2] = MASK_RGB[2];
        } else if (c.signed) {
          // sign · √(|value| / max |value|), mapped onto blue (−) · white (0) · red (+)
          const w = weight(c, h, i, j), s = Math.sign(w) * Math.sqrt(Math.min(1, Math.abs(w) / vmax));
          const v = Math.max(0, Math.min(255, Math.round((s + 1) / 2 * 255)));
          px[o] = DIV_LUT[v * 3]; px[o + 1] = DIV_LUT[v * 3 + 1]; px[o + 2] = DIV_LUT[v * 3 + 2];
        } else {
          const v = Math.max(0, Math.min(255, Math.round(Math.sqrt(weight(c, h, i, j) / vmax) * 255)));
          px[o] = LUT[v * 3]; px[o + 1] = LUT[v * 3 + 1]; px[o + 2] = LUT[v * 3 + 2];
        }
        px[o + 3] = 255;
      }
    }
    const off = document.createElement("canvas");
    off.width = c.tk; off.height = c.tq;
    off.getContext("2d").putImageData(img, 0, 0);
    return { off, vmax };
  }
  function drawMatrix(c) {
    const avail = Math.max(240, document.getElementById("stage").clientWidth - 40);
    const heads = c.nh === 1 ? [Math.max(0, state.head)] : state.head < 0 ? [...Array(c.L.heads).keys()] : [state.head];
    const cols = heads.length === 1 ? 1 : Math.min(heads.length, 4);
    const rows = Math.ceil(heads.length / cols);
    const n = Math.max(c.tq, c.tk);
    const labels = heads.length === 1 && n <= 80;
    const margin = labels ? 90 : 22;
    const panel = Math.min(heads.length === 1 ? 900 : 420, Math.floor((avail - cols * margin) / cols));
    const cell = Math.min(36, panel / n);
    const pw = cell * c.tk, ph = cell * c.tq;
    setSize(cols * (pw + margin) + 10, rows * (ph + margin + 8) + 10);
    ctx.imageSmoothingEnabled = false;
    const panels = [], vmaxes = [];
    heads.forEach((h, idx) => {
      const x0 = (idx % cols) * (pw + margin) + margin, y0 = Math.floor(idx / cols) * (ph + margin + 8) + margin;
      const { off, vmax } = heatImage(c, h);
      vmaxes.push(vmax);
      ctx.drawImage(off, x0, y0, pw, ph);
      ctx.strokeStyle = heads.length > 1 ? HEAD_COLORS[h % HEAD_COLORS.length] : "#8c959f";
      ctx.lineWidth = heads.length > 1 ? 2 : 1;
      ctx.strokeRect(x0 - 0.5, y0 - 0.5, pw + 1, ph + 1);
      ctx.fillStyle = "#1f2328"; ctx.font = "12px system-ui, sans-serif";
      if (!labels) ctx.fillText(c.nh === 1 && c.L.heads > 1 ? "all heads (one matrix per layer)" : "head " + h, x0, y0 - 6);
      if (labels) {
        ctx.font = Math.min(12, Math.max(8, cell - 2)) + "px system-ui, sans-serif";
        ctx.textAlign = "right"; ctx.textBaseline = "middle";
        c.q.forEach((t, i) => { ctx.fillStyle = labelColor(c.qname, i); ctx.fillText(label(c.qname, t, i, 12), x0 - 4, y0 + (i + 0.5) * cell); });
        c.k.forEach((t, j) => {
          ctx.save(); ctx.translate(x0 + (j + 0.5) * cell, y0 - 4); ctx.rotate(-Math.PI / 2);
          ctx.fillStyle = labelColor(c.kname, j);
          ctx.textAlign = "left"; ctx.fillText(label(c.kname, t, j, 12), 0, 0); ctx.restore();
        });
        ctx.textAlign = "left"; ctx.textBaseline = "alphabetic"; ctx.fillStyle = TEXT_COLOR;
      }
      promptLine(c, x0, y0, cell);
      panels.push({ h, x0, y0, pw, ph });
    });
    geom = { view: "matrix", cell, panels };
    drawLegend(c, vmaxes);
  }
  // a dashed line between the prompt and the generated tokens, on rows and on columns
  function promptLine(c, x0, y0, cell) {
    const bi = boundary(c.qname, c.tq), bj = boundary(c.kname, c.tk);
    if (bi < 0 && bj < 0) return;
    ctx.save(); ctx.strokeStyle = GEN_COLOR; ctx.lineWidth = 1.5; ctx.setLineDash([4, 3]);
    ctx.beginPath();
    if (bi >= 0) { ctx.moveTo(x0, y0 + bi * cell); ctx.lineTo(x0 + c.tk * cell, y0 + bi * cell); }
    if (bj >= 0) { ctx.moveTo(x0 + bj * cell, y0); ctx.lineTo(x0 + bj * cell, y0 + c.tq * cell); }
    ctx.stroke(); ctx.restore();
  }

  // ---------------------------------------------------------------- layers × heads grid
  function drawGrid() {
    const g = DATA.groups[state.group], nl = g.layers.length;
    const first = current(0);
    // a per-layer method: one column (its matrix is the same for every head)
    const nh = Math.max(...g.layers.map((L, l) => current(l).nh));
    const n = Math.max(first.tq, first.tk);
    const left = 84, top = 50, gap = 10;
    const avail = Math.max(400, document.getElementById("stage").clientWidth - 40);
    // room for the token labels: right of the last column (queries), below the last row (keys)
    // the tiles keep the weights' size whatever the method, so the switch keeps the layout
    const tile0 = Math.min(240, Math.floor((avail - left - 110) / Math.max(...g.layers.map((L) => L.heads))) - gap);
    const cell = Math.max(1, tile0 / n);
    const tokenLabels = cell >= 5;
    const right = tokenLabels ? 110 : 10, bottom = tokenLabels ? 100 : 10;
    const pw = cell * first.tk, ph = cell * first.tq;
    // at least as wide as the line naming the axes (one column of a per-layer method)
    setSize(Math.max(left + nh * (pw + gap) + right, 420), top + nl * (ph + gap) + bottom);
    ctx.imageSmoothingEnabled = false;
    const panels = [], vmaxes = [], labels = { layers: [], heads: [], queries: [], keys: [], axes: [] };
    ctx.fillStyle = TEXT_COLOR; ctx.font = "12px system-ui, sans-serif"; ctx.textBaseline = "middle";
    ctx.textAlign = "center";
    ctx.fillText(nh === 1 && first.L.heads > 1 ? "one matrix per layer" : "head →", left + (nh * (pw + gap)) / 2, 26);
    for (let h = 0; h < nh; h++) {
      const t = nh === 1 && first.L.heads > 1 ? "all heads" : String(h);
      ctx.fillText(t, left + h * (pw + gap) + pw / 2, top - 10);
      labels.heads.push(t);
    }
    ctx.textAlign = "right";
    ctx.save(); ctx.translate(10, top + (nl * (ph + gap)) / 2); ctx.rotate(-Math.PI / 2);
    ctx.textAlign = "center"; ctx.fillText("layer →", 0, 0); ctx.restore();
    for (let l = 0; l < nl; l++) {
      const c = current(l), y0 = top + l * (ph + gap);
      const t = "layer " + l;
      ctx.fillStyle = l === state.layer ? "#0969da" : TEXT_COLOR; ctx.textAlign = "right";
      ctx.fillText(t, left - 6, y0 + ph / 2);
      labels.layers.push(t);
      for (let h = 0; h < c.nh; h++) {
        const x0 = left + h * (pw + gap);
        const { off, vmax } = heatImage(c, h);
        vmaxes.push(vmax);
        ctx.drawImage(off, x0, y0, pw, ph);
        const chosen = l === state.layer && (c.nh === 1 || h === state.head);
        ctx.strokeStyle = chosen ? "#0969da" : "#8c959f"; ctx.lineWidth = chosen ? 2 : 1;
        ctx.strokeRect(x0 - 0.5, y0 - 0.5, pw + 1, ph + 1);
        promptLine(c, x0, y0, cell);
        panels.push({ layer: l, h, nh: c.nh, x0, y0, pw, ph });
      }
    }
    if (tokenLabels) {
      const fs = Math.min(11, Math.max(7, cell - 1));
      ctx.font = fs + "px system-ui, sans-serif"; ctx.textAlign = "left"; ctx.textBaseline = "middle";
      const xq = left + (nh - 1) * (pw + gap) + pw + 4, yk = top + (nl - 1) * (ph + gap) + ph + 4;
      for (let l = 0; l < nl; l++) {
        const y0 = top + l * (ph + gap);
        first.q.forEach((t, i) => { ctx.fillStyle = labelColor(first.qname, i); ctx.fillText(label(first.qname, t, i, 14), xq, y0 + (i + 0.5) * cell); });
      }
      first.q.forEach((t, i) => labels.queries.push(t));
      for (let h = 0; h < nh; h++) {
        const x0 = left + h * (pw + gap);
        first.k.forEach((t, j) => {
          ctx.save(); ctx.translate(x0 + (j + 0.5) * cell, yk); ctx.rotate(Math.PI / 2);
          ctx.fillStyle = labelColor(first.kname, j); ctx.fillText(label(first.kname, t, j, 14), 0, 0); ctx.restore();
        });
      }
      first.k.forEach((t) => labels.keys.push(t));
    }
    // what the axes of every tile are: rows are the queries, columns the keys
    const side = (name) => (name === "tokens" ? "" : name + " ");
    const rowsAxis = "rows: " + side(first.qname) + "queries ↓", colsAxis = "columns: " + side(first.kname) + "keys →";
    ctx.font = "italic 11px system-ui, sans-serif"; ctx.fillStyle = "#656d76"; ctx.textBaseline = "middle";
    ctx.textAlign = "left"; ctx.fillText("each tile: " + rowsAxis + "   ·   " + colsAxis, left, 9);
    labels.axes.push(rowsAxis, colsAxis);
    ctx.textAlign = "left"; ctx.textBaseline = "alphabetic"; ctx.fillStyle = TEXT_COLOR;
    geom = { view: "grid", cell, panels, labels };
    drawLegend(first, vmaxes);
  }

  // ---------------------------------------------------------------- colour scale
  // The bar maps position t ∈ [0, 1] to the colour of weight t² · max (the drawing uses
  // √(weight / max)); signed values map t ∈ [−1, 1] to sign(t) · t² · max. One head: its max in
  // numbers; several heads (each scaled to its own max): the largest of them, and a note.
  function fmt(v) { const a = Math.abs(v); return a === 0 ? "0" : a >= 0.01 ? v.toFixed(3) : v.toExponential(1); }
  function drawLegend(c, vmaxes) {
    const signed = c.signed;
    const el = document.getElementById("legend"), g = el.getContext("2d");
    document.getElementById("legend-row").hidden = false;
    const W = 260, H = 34, barH = 12, x0 = 10, bw = W - 20;
    const dpr = window.devicePixelRatio || 1;
    el.width = Math.ceil(W * dpr); el.height = Math.ceil(H * dpr);
    el.style.width = W + "px"; el.style.height = H + "px";
    g.setTransform(dpr, 0, 0, dpr, 0, 0); g.clearRect(0, 0, W, H);
    for (let x = 0; x < bw; x++) {
      const v = Math.round((x / (bw - 1)) * 255), lut = signed ? DIV_LUT : LUT;
      g.fillStyle = "rgb(" + lut[v * 3] + "," + lut[v * 3 + 1] + "," + lut[v * 3 + 2] + ")";
      g.fillRect(x0 + x, 2, 1, barH);
    }
    g.strokeStyle = "#8c959f"; g.strokeRect(x0 - 0.5, 1.5, bw + 1, barH + 1);
    const max = vmaxes.length ? Math.max(...vmaxes) : 1, one = vmaxes.length === 1;
    // tick positions on the bar (0 … 1) and the values they stand for
    const ticks = signed ? [[0, -max], [0.25, -max / 4], [0.5, 0], [0.75, max / 4], [1, max]]
      : [[0, 0], [0.5, max / 4], [1, max]];
    const text = (v) => one ? fmt(v) : v === 0 ? "0" : (v < 0 ? "−" : "") + (Math.abs(v) === max ? "max" : "max/4");
    g.fillStyle = TEXT_COLOR; g.font = "10px system-ui, sans-serif"; g.textBaseline = "top";
    ticks.forEach(([t, v], k) => {
      const x = x0 + t * (bw - 1);
      g.fillRect(x, 2 + barH, 1, 3);
      g.textAlign = k === 0 ? "left" : k === ticks.length - 1 ? "right" : "center";
      g.fillText(text(v), k === 0 ? x - 2 : k === ticks.length - 1 ? x + 2 : x, barH + 6);
    });
    // what one number means: the method's label (Python's), or the weights
    const label = c.mix ? c.mix.meaning : signed ? "effective weight A·F" : "attention weight α_ij";
    const what = label + (signed ? " (signed; colour ∝ sign · √|value|)" : c.mix ? " (colour ∝ √value)" : " (colour ∝ √weight)");
    const whose = c.nh === 1 && c.L.heads > 1 ? "the layer's" : "the head's", each = c.nh === 1 && c.L.heads > 1 ? "each layer" : "each head";
    const note = one ? what + (signed ? ", " + fmt(-max) + " … " + fmt(max) + " (" + whose + " max |value|)" : ", 0 … " + fmt(max) + " (" + whose + " max)")
      : what + ", " + each + " scaled to its own max (largest " + fmt(max) + ")";
    document.getElementById("legend-note").textContent = note;
    legend = { signed, label, method: c.method, min: signed ? -max : 0, max, perHead: !one, ticks: ticks.map(([t, v]) => ({ at: t, value: v, text: text(v) })), note };
  }

  // ---------------------------------------------------------------- lines view
  function drawLines(c) {
    const n = Math.max(c.tq, c.tk);
    const rh = n <= 40 ? 20 : n <= 200 ? 14 : 10;
    const xl = 150, xr = 470, top = 16;
    setSize(620, n * rh + 2 * top);
    const heads = state.head < 0 ? [...Array(c.L.heads).keys()] : [state.head];
    ctx.lineWidth = heads.length > 1 ? 1.5 : 2;
    for (const h of heads) {
      ctx.strokeStyle = HEAD_COLORS[h % HEAD_COLORS.length];
      for (let i = 0; i < c.tq; i++) {
        if (state.focus >= 0 && state.focus !== i) continue;
        for (let j = 0; j < c.tk; j++) {
          if (!allowed(c, i, j)) continue;
          const v = weight(c, h, i, j);
          if (v < state.threshold && state.focus < 0) continue;
          ctx.globalAlpha = Math.min(1, v / heads.length * (heads.length > 1 ? 2 : 1));
          ctx.beginPath(); ctx.moveTo(xl + 6, top + (i + 0.5) * rh); ctx.lineTo(xr - 6, top + (j + 0.5) * rh); ctx.stroke();
        }
      }
    }
    ctx.globalAlpha = 1;
    ctx.font = Math.min(13, rh - 2) + "px system-ui, sans-serif"; ctx.textBaseline = "middle";
    ctx.textAlign = "right";
    c.q.forEach((t, i) => { ctx.fillStyle = i === state.focus ? "#0969da" : labelColor(c.qname, i); ctx.fillText(label(c.qname, t, i, 18), xl, top + (i + 0.5) * rh); });
    ctx.textAlign = "left";
    c.k.forEach((t, j) => {
      ctx.fillStyle = state.showMask && state.focus >= 0 && !allowed(c, state.focus, j) ? "#c0c0c0" : labelColor(c.kname, j);
      ctx.fillText(label(c.kname, t, j, 18), xr, top + (j + 0.5) * rh);
    });
    ctx.textBaseline = "alphabetic";
    geom = { view: "lines", rh, xl, xr, top };
    document.getElementById("legend-row").hidden = true; // line opacity is the weight, no colour scale
    legend = null;
  }

  function draw() {
    const c = current();
    const view = viewOf(c.g);
    canvas.style.display = view === "lens" ? "none" : "";
    if (view === "lens") {
      geom = null; legend = null; tip.hidden = true;
      document.getElementById("legend-row").hidden = true; // the panel has its own colour bar
      LENS.draw();
      renders++;
      document.getElementById("info").textContent = "what each layer would predict at each position (" +
        LENS.api.lenses.map((l) => l.label).join(", ") + ", computed by attnlab.inspect.logit_lens)";
      return;
    }
    LENS.hide();
    if (view === "grid") drawGrid(); else if (view === "matrix") drawMatrix(c); else drawLines(c);
    renders++;
    const shape = c.signed ? c.tq + " × " + c.tk + " effective A·F (queries × tokens)"
      : c.projected ? c.tq + " × " + c.tk + " (queries × projected E·K rows)" : c.tq + " × " + c.tk;
    const colour = view === "lines" ? ""
      : c.signed ? " · colour sign·√(|value| / max |value| of the " + (c.nh === 1 ? "layer" : "head") + "): blue < 0 < red"
      : c.mix ? " · colour √(value / max of the " + (c.nh === 1 && c.L.heads > 1 ? "layer" : "head") + ")"
      : " · colour √(weight / max of the head)";
    const gen = PROMPT !== null && c.g.query === "tokens" ? " · " + PROMPT + " prompt + " + (c.tq - PROMPT) + " generated tokens (▸, orange" + (SCORES ? "; % the probability each was generated with" : "") + ")" : "";
    const where = (c.mix ? c.mix.label + " · " : "") +
      (view === "grid" ? c.g.name + ": " + c.g.layers.length + " layers × " + (c.nh === 1 && c.L.heads > 1 ? "one matrix" : "heads") + " (click a tile to open it)" : c.L.name);
    document.getElementById("info").textContent = where + " · " + shape + gen + (STEPS ? " · " + stepText() : "") + colour;
  }

  // ---------------------------------------------------------------- hover
  function hit(ev) {
    const r = canvas.getBoundingClientRect(), x = ev.clientX - r.left, y = ev.clientY - r.top;
    const c = current();
    if (!geom) return null;
    if (geom.view === "grid") {
      for (const p of geom.panels) {
        if (x >= p.x0 && x < p.x0 + p.pw && y >= p.y0 && y < p.y0 + p.ph) {
          const cl = current(p.layer);
          const i = Math.min(cl.tq - 1, Math.floor((y - p.y0) / geom.cell));
          const j = Math.min(cl.tk - 1, Math.floor((x - p.x0) / geom.cell));
          return { c: cl, h: p.h, i, j, layer: p.layer };
        }
      }
      return null;
    }
    if (geom.view === "matrix") {
      for (const p of geom.panels) {
        if (x >= p.x0 && x < p.x0 + p.pw && y >= p.y0 && y < p.y0 + p.ph) {
          const i = Math.min(c.tq - 1, Math.floor((y - p.y0) / geom.cell));
          const j = Math.min(c.tk - 1, Math.floor((x - p.x0) / geom.cell));
          return { c, h: p.h, i, j };
        }
      }
      return null;
    }
    const i = Math.floor((y - geom.top) / geom.rh);
    if (x < geom.xl + 10 && i >= 0 && i < c.tq) return { c, i, query: true };
    return null;
  }
  canvas.addEventListener("mousemove", (ev) => {
    const t = hit(ev);
    if (geom && geom.view === "lines") {
      const f = t ? t.i : -1;
      if (f !== state.focus) { state.focus = f; draw(); }
      if (t) {
        const heads = state.head < 0 ? [...Array(t.c.L.heads).keys()] : [state.head];
        const lines = [t.c.q[t.i] + " (query " + t.i + ")" + scoreText(t.c.qname, t.i)];
        for (const h of heads) {
          const best = [...Array(t.c.tk).keys()].sort((a, b) => weight(t.c, h, t.i, b) - weight(t.c, h, t.i, a)).slice(0, 3);
          lines.push("head " + h + ": " + best.map((j) => t.c.k[j] + "=" + weight(t.c, h, t.i, j).toFixed(4)).join("  "));
        }
        showTip(ev, lines.join("\n"), null);
      } else tip.hidden = true;
      return;
    }
    if (!t) { tip.hidden = true; return; }
    const v = weight(t.c, t.h, t.i, t.j);
    const masked = !allowed(t.c, t.i, t.j);
    const who = (STEPS ? stepText() + "\n" : "") + (t.layer !== undefined ? "layer " + t.layer + "  " : "") +
      "head " + t.h + "  query " + t.i + " " + JSON.stringify(t.c.q[t.i]) + (generated(t.c.qname, t.i) ? " (generated)" : "");
    let text;
    if (t.c.mix) {
      text = who.replace("head " + t.h, t.c.nh === 1 && t.c.L.heads > 1 ? "all heads" : "head " + t.h) + " → key " + t.j + " " + JSON.stringify(t.c.k[t.j]) +
        "\n" + t.c.mix.label + " = " + v.toFixed(6) + "  (" + t.c.mix.meaning + ")" + (masked ? "  (masked)" : "");
    } else if (t.c.signed) {
      text = who + " → token " + t.j + " " + JSON.stringify(t.c.k[t.j]) + " through F" +
        "\neffective weight (A·F) = " + v.toFixed(6) + "  (may be negative)";
    } else if (t.c.projected) {
      text = who + " → " + t.c.k[t.j] + " (a mix of all positions, not a token)\nweight = " + v.toFixed(6);
    } else {
      text = who + " → key " + t.j + " " + JSON.stringify(t.c.k[t.j]) + "\nweight = " + v.toFixed(6) + (masked ? "  (masked)" : "");
    }
    showTip(ev, text + scoreText(t.c.qname, t.i), { v, ...t });
  });
  canvas.addEventListener("click", (ev) => {
    if (!geom || geom.view !== "grid") return;
    const t = hit(ev);
    if (!t) return;
    state.layer = t.layer; if (t.c.nh > 1) state.head = t.h; state.view = "matrix"; tip.hidden = true;
    update();
  });
  canvas.addEventListener("mouseleave", () => {
    tip.hidden = true;
    if (state.focus >= 0) { state.focus = -1; draw(); }
  });
  function showTip(ev, text, t) {
    tip.textContent = text; tip.hidden = false;
    tip.style.left = ev.clientX + 14 + "px"; tip.style.top = ev.clientY + 14 + "px";
    if (t) {
      tip.dataset.value = String(t.v); tip.dataset.head = t.h; tip.dataset.query = t.i; tip.dataset.key = t.j;
      tip.dataset.mode = t.c.mode; tip.dataset.method = t.c.method;
      if (STEPS) tip.dataset.step = String(STEPS[state.step]);
    }
  }

  document.querySelectorAll(".view-btn").forEach((b) => b.addEventListener("click", () => { state.view = b.dataset.view; state.focus = -1; update(); }));
  document.querySelectorAll(".mode-btn").forEach((b) => b.addEventListener("click", () => { state.mode = b.dataset.mode; tip.hidden = true; update(); }));
  document.getElementById("show-mask").addEventListener("change", (e) => { state.showMask = e.target.checked; draw(); });
  document.getElementById("threshold").addEventListener("change", (e) => { state.threshold = Number(e.target.value) || 0; draw(); });
  window.addEventListener("resize", () => draw());
  if (STEPS) {
    const slider = document.getElementById("step"), label = document.getElementById("step-label");
    document.getElementById("step-row").hidden = false;
    slider.max = String(STEPS.length - 1);
    slider.value = String(state.step);
    label.textContent = stepText();
    slider.addEventListener("input", () => {
      state.step = Number(slider.value);
      label.textContent = stepText();
      tip.hidden = true;
      draw();
    });
  }

  // a small API for scripts and tests: where a matrix cell is on screen, how often we drew
  window.attnlabViewer = {
    state,
    steps: STEPS,
    get renders() { return renders; },
    // the colour bar now shown (min, max, ticks), or null in the lines view
    get legend() { return legend; },
    // where the page opened, as Python chose it, and why
    start: START,
    // the generated tokens' probabilities, entropies and alternatives, as Python sent them
    tokenScores: SCORES,
    // what the canvas shows now: "matrix" or "lines", and "weights" or "effective"
    get drawn() { const c = current(); return { view: geom ? geom.view : null, mode: c.mode, rows: c.tq, cols: c.tk, columns: c.k }; },
    // the method switch: the method drawn ("weights" where the layer has none of the chosen
    // one), whether it is one matrix per layer, and how many tiles or panels are drawn
    get method() {
      const c = current();
      return { view: geom ? geom.view : null, chosen: state.method, method: c.method, perLayer: c.nh === 1 && c.L.heads > 1,
        tiles: geom && geom.panels ? geom.panels.length : 0 };
    },
    // the lens panel: the lens shown, the colouring, the pinned cell; null without lenses
    lens: LENS.api,
    // the methods of the switch, as Python sent them
    methods: [...METHODS.values()],
    // which layer and head are chosen, where the prompt ends, and the grid's axis labels
    get chosen() {
      const c = current();
      return { view: geom ? geom.view : null, rows: c.tq, layer: state.layer, head: state.head, method: c.method,
        layerName: c.L.name, promptLength: PROMPT, labels: geom && geom.labels ? geom.labels : null };
    },
    cellCenter(i, j, head) {
      if (!geom || geom.view !== "matrix") return null;
      const p = geom.panels.find((q) => head === undefined || q.h === head) || geom.panels[0];
      const r = canvas.getBoundingClientRect();
      return { x: r.left + p.x0 + (j + 0.5) * geom.cell, y: r.top + p.y0 + (i + 0.5) * geom.cell };
    },
    // choose the layer, head and view from a script (attnlab serve's page drives its frames so);
    // a layer or head that does not exist is left as it was
    select(sel) {
      const g = DATA.groups[state.group];
      if (Number.isInteger(sel.layer) && sel.layer >= 0 && sel.layer < g.layers.length) state.layer = sel.layer;
      if (Number.isInteger(sel.head) && sel.head >= -1 && sel.head < g.layers[state.layer].heads) state.head = sel.head;
      if (["matrix", "lines", "grid"].includes(sel.view)) state.view = sel.view;
      state.focus = -1; tip.hidden = true;
      update();
    },
    // the centre of one tile of the layers × heads grid
    tileCenter(layer, head) {
      if (!geom || geom.view !== "grid") return null;
      const p = geom.panels.find((q) => q.layer === layer && q.h === head);
      if (!p) return null;
      const r = canvas.getBoundingClientRect();
      return { x: r.left + p.x0 + p.pw / 2, y: r.top + p.y0 + p.ph / 2 };
    },
  };
  if (START.reason) {
    const g = DATA.groups[START.group];
    document.getElementById("start-row").hidden = false;
    document.getElementById("start").textContent = g.name + " · layer " + START.layer + " (" +
      g.layers[START.layer].name + ") · head " + START.head + " — " + START.reason;
  }
  update();
})();
