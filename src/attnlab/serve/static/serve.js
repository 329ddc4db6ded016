"use strict";
// attnlab serve's page: every number comes from the server's JSON API (the library's own
// capture, step panel, sampler and generate); this script only asks and shows. Token texts are
// always set as text (textContent), never as HTML.
(function () {
  const $ = (id) => document.getElementById(id);
  const gridFrame = $("grid-frame"), matrixFrame = $("matrix-frame");
  // the sequence shown: the text's tokens, or ids with the generated ones after prompt
  const state = { ids: null, prompt: null, tokens: [], layer: null, head: null, query: null, queryChosen: false, info: null };
  let viewSeq = 0, nextSeq = 0, stepsSeq = 0, cardSeq = 0, typing = null;
  const stats = { views: 0, nexts: 0, steps: 0, cards: 0, generated: 0 };

  async function call(path, body) {
    const r = await fetch(path, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const type = r.headers.get("content-type") || "";
    if (!r.ok) {
      let msg = r.status + " " + r.statusText;
      if (type.includes("json")) { const e = await r.json(); msg = e.error || msg; }
      throw new Error(msg);
    }
    return type.includes("json") ? r.json() : r.blob();
  }
  function showError(e) { $("error").hidden = !e; $("error").textContent = e ? String(e.message || e) : ""; }
  function status(text) { $("status").textContent = text; }

  // the request's tokens: the text typed, or the ids with their generated tail
  function sequence() {
    if (seq2seq()) {  // the source text, and the target: ids decoded here, typed text, or the model's own
      const target = $("target").value;
      return state.ids ? { text: $("text").value, target_ids: state.ids } : target ? { text: $("text").value, target } : { text: $("text").value };
    }
    return state.ids ? { ids: state.ids, prompt_length: state.prompt } : { text: $("text").value };
  }
  function seq2seq() { return !!state.info && state.info.kind === "seq2seq"; }
  function chosen() { return state.layer === null ? {} : { layer: state.layer, head: state.head }; }
  function sampling() {
    const t = Number($("temperature").value), k = Number($("top-k").value), p = Number($("top-p").value);
    $("temperature-value").textContent = t.toFixed(2);
    $("top-k-value").textContent = k === 0 ? "off" : String(k);
    $("top-p-value").textContent = p >= 1 ? "off" : p.toFixed(2);
    return { temperature: t, top_k: k === 0 ? null : k, top_p: p >= 1 ? null : p };
  }
  function visible(label) { return JSON.stringify(label).slice(1, -1); }

  // ------------------------------------------------------------------ attention
  async function refresh() {
    const seq = ++viewSeq;
    status("running the model…");
    let v;
    try { v = await call("/api/view", { ...sequence(), ...chosen() }); } catch (e) { if (seq === viewSeq) { showError(e); status(""); } return; }
    if (seq !== viewSeq) return;
    showError(null);
    if (seq2seq()) {  // the encoder-decoder: its viewer shows the encoder, decoder and cross-attention
      state.tokens = v.target_tokens; state.ids = state.ids ? v.target_ids : null;
      gridFrame.srcdoc = v.html; matrixFrame.srcdoc = v.html;
      showSequence({ tokens: v.target_tokens, prompt_length: state.ids ? state.prompt : null });
      stats.views++;
      status(v.source_tokens.length + " source tokens · " + v.target_tokens.length + " target tokens · output " + JSON.stringify(v.output));
      nextToken();
      return;
    }
    state.tokens = v.tokens; state.ids = state.ids ? v.ids : null;
    state.layer = v.start.layer; state.head = v.start.head;
    gridFrame.srcdoc = v.html; matrixFrame.srcdoc = v.html;
    fillQueries(v.tokens);
    showSequence(v);
    stats.views++;
    status(v.tokens.length + " tokens · " + (state.info ? state.info.layers.length + " layers" : ""));
    nextToken(); steps(); card();
  }
  function fillQueries(tokens) {
    // the last token until a query is chosen (then it is kept while it exists)
    const box = $("query"), keep = state.queryChosen && state.query < tokens.length ? state.query : tokens.length - 1;
    box.textContent = "";
    tokens.forEach((t, i) => { const o = document.createElement("option"); o.value = String(i); o.textContent = i + " " + visible(t); box.appendChild(o); });
    state.query = keep; box.value = String(keep);
  }
  function showSequence(v) {
    const row = $("generated-row"), out = $("generated");
    row.hidden = v.prompt_length === null || v.prompt_length === undefined;
    out.textContent = "";
    if (row.hidden) return;
    v.tokens.forEach((t, i) => {
      const s = document.createElement("span"); s.textContent = t;
      if (i >= v.prompt_length) { s.className = "gen"; s.title = "generated token " + (i - v.prompt_length + 1); }
      out.appendChild(s);
    });
  }
  // the frames: the grid frame always shows the grid; a tile clicked there picks the head that
  // the matrix frame shows; a head picked in the matrix frame is followed too
  function viewer(frame) { return frame.contentWindow && frame.contentWindow.attnlabViewer; }
  gridFrame.addEventListener("load", () => {
    const v = viewer(gridFrame); if (!v) return;
    v.select({ view: "grid" });
    gridFrame.contentWindow.addEventListener("attnlab:update", () => {
      const c = v.chosen;
      if (c.view === "grid") return;
      choose(c.layer, c.head);
      v.select({ view: "grid" });
    });
  });
  matrixFrame.addEventListener("load", () => {
    const v = viewer(matrixFrame); if (!v) return;
    matrixFrame.contentWindow.addEventListener("attnlab:update", () => { const c = v.chosen; choose(c.layer, c.head); });
  });
  function choose(layer, head) {
    if (head < 0 || (layer === state.layer && head === state.head)) return;
    state.layer = layer; state.head = head;
    const m = viewer(matrixFrame);
    if (seq2seq()) { if (m) m.select({ layer, head, view: "matrix" }); return; }
    if (m && (m.chosen.layer !== layer || m.chosen.head !== head)) m.select({ layer, head, view: m.chosen.view === "grid" ? "matrix" : m.chosen.view });
    steps(); card();
  }

  // ------------------------------------------------------------------ step by step
  async function steps() {
    if (state.layer === null) return;
    const seq = ++stepsSeq;
    let s;
    try { s = await call("/api/steps", { ...sequence(), layer: state.layer, head: state.head, query: state.query }); } catch (e) { if (seq === stepsSeq) showError(e); return; }
    if (seq !== stepsSeq) return;
    $("steps-where").textContent = "— " + s.layer + " · head " + s.head + " · query " + s.query + " " + JSON.stringify(s.tokens[s.query]);
    $("steps-formula").textContent = "S = q·kⱼ / √" + s.d_head + " (masked: −∞) → A = softmax(S) → z = Σⱼ Aⱼ vⱼ  (" + s.d_head + " numbers per head; x has " + s.d_model + ")";
    const table = $("steps-table"); table.textContent = "";
    const head = table.insertRow(); ["key", "token", "score S", "weight A", ""].forEach((h) => { const th = document.createElement("th"); th.textContent = h; head.appendChild(th); });
    s.tokens.forEach((t, j) => {
      const r = table.insertRow();
      const cells = [String(j), visible(t), s.scores[j] === null ? "−∞" : s.scores[j].toFixed(3), s.visible[j] ? s.weights[j].toFixed(4) : "masked"];
      cells.forEach((c, i) => { const td = r.insertCell(); td.textContent = c; if (i === 1) td.className = "tok"; if (!s.visible[j]) td.classList.add("masked"); });
      const td = r.insertCell(), bar = document.createElement("div"); bar.className = "bar"; bar.style.width = Math.round(120 * s.weights[j]) + "px"; td.appendChild(bar);
    });
    $("steps-image").hidden = true; $("steps-draw").disabled = false;
    stats.steps++;
  }
  $("query").addEventListener("change", (e) => { state.query = Number(e.target.value); state.queryChosen = true; steps(); card(); });
  // the seven panels of `attnlab plot steps`, drawn by the server on demand (seconds of CPU)
  $("steps-draw").addEventListener("click", async () => {
    if (state.layer === null) return;
    const seq = stepsSeq;
    $("steps-draw").disabled = true; status("drawing the panels…");
    let s;
    try { s = await call("/api/steps", { ...sequence(), layer: state.layer, head: state.head, query: state.query, figure: true }); } catch (e) { showError(e); return; }
    status("");
    if (seq !== stepsSeq) return;
    $("steps-image").src = s.image; $("steps-image").hidden = false; $("steps-image").title = s.title;
  });

  // ------------------------------------------------------------------ the head's card
  // every number is the server's (role scores, diagnose, qk_spectrum, the viewer's mixing and
  // lens); the page only lays them out
  function num(v, digits) { return v === null || v === undefined ? "—" : v.toFixed(digits); }
  function table(id, header, rows) {
    const t = $(id); t.textContent = "";
    if (header) { const h = t.insertRow(); header.forEach((c, i) => { const th = document.createElement("th"); th.textContent = c; if (i === 0) th.className = "tok"; h.appendChild(th); }); }
    for (const cells of rows) {
      const r = t.insertRow();
      cells.forEach((c, i) => {
        const td = r.insertCell();
        if (c instanceof Node) td.appendChild(c); else td.textContent = c;
        if (i === 0) td.className = "tok";
      });
    }
  }
  function bar(value, scale) {
    const b = document.createElement("div"); b.className = "bar";
    b.style.width = Math.max(0, Math.round(80 * (scale > 0 && value ? value / scale : 0))) + "px"; return b;
  }
  function spectrum(values) {
    const box = document.createElement("div"), top = values[0] || 1; box.className = "spectrum";
    box.title = values.map((v) => num(v, 3)).join(" ");
    for (const v of values) { const d = document.createElement("div"); d.style.height = Math.max(1, Math.round(40 * (v || 0) / top)) + "px"; box.appendChild(d); }
    return box;
  }
  async function card() {
    if (state.layer === null) return;
    const seq = ++cardSeq;
    let c;
    // the mixing and the lens run the model again (seconds on a pretrained model): asked for when ticked
    const parts = ["roles", "health", "spectrum"];
    if ($("card-mixing-on").checked) parts.push("mixing");
    if ($("card-lens-on").checked) parts.push("lens");
    try { c = await call("/api/card", { ...sequence(), layer: state.layer, head: state.head, query: state.query, parts }); } catch (e) { if (seq === cardSeq) showError(e); return; }
    if (seq !== cardSeq) return;
    $("card-where").textContent = "— " + c.layer + " · head " + c.head + " · query " + c.query + " " + JSON.stringify(c.tokens[c.query]);
    if (c.roles) {
      $("roles-note").textContent = "(inspect --roles: " + c.roles.batch + " × " + c.roles.seq_len + " random tokens repeated once, " + c.roles.convention + ")";
      table("card-roles", null, ["previous", "duplicate", "induction", "copying"].map((r) => [r, num(c.roles[r], 3), bar(c.roles[r], 1)]));
    } else { $("roles-note").textContent = "(measured on decoder-only models)"; table("card-roles", null, []); }
    const h = c.health;
    table("card-health", null, [
      ["entropy (nats)", num(h.entropy_mean, 3) + "  [" + num(h.entropy_min, 2) + ", " + num(h.entropy_max, 2) + "]"],
      ["sink share (weight on token 0)", num(h.first_token_share, 3)],
      ["largest weight, mean", num(h.max_weight_mean, 3)],
      ["status", h.status],
    ]);
    const sp = c.spectrum;
    table("card-spectrum", ["circuit", "eff. rank", "rank", "σ"], [
      ["QK", num(sp.qk_effective_rank, 2), sp.qk_rank + "/" + sp.d_head, spectrum(sp.qk)],
      ["OV", num(sp.ov_effective_rank, 2), sp.ov_rank + "/" + sp.d_head, spectrum(sp.ov)],
    ]);
    table("card-mixing", null, []); table("card-lens", null, []);
    if (c.mixing) mixingTable(c);
    if (c.lens) lensTable(c);
    stats.cards++;
  }
  function mixingTable(c) {
    const methods = c.mixing, scale = methods.map((m) => Math.max(...m.row.map((v) => Math.abs(v || 0))));
    table("card-mixing", ["key", ...methods.map((m) => m.label)], c.tokens.map((t, j) => [j + " " + visible(t), ...methods.map((m, i) => { const d = document.createElement("span"); d.append(num(m.row[j], 3), " ", bar(Math.abs(m.row[j] || 0), scale[i])); return d; })]));
    $("card-mixing").title = methods.map((m) => m.label + ": " + m.meaning + " — " + m.note).join("\n");
  }
  function lensTable(c) {
    table("card-lens", ["layer", "top token", "p", "KL (bits)"], c.lens.rows.slice().reverse().map((r) => {
      const best = r.top[0], tok = document.createElement("span");
      tok.textContent = JSON.stringify(best.token); tok.title = r.top.map((t) => JSON.stringify(t.token) + " " + (100 * t.probability).toFixed(1) + "%").join("\n");
      return [r.layer, tok, (100 * best.probability).toFixed(1) + "%", num(r.kl_bits, 2)];
    }));
    $("card-lens").title = c.lens.meaning;
  }
  for (const id of ["card-mixing-on", "card-lens-on"]) $(id).addEventListener("change", () => card());

  // ------------------------------------------------------------------ next token
  async function nextToken() {
    const seq = ++nextSeq;
    let n;
    try { n = await call("/api/next", { ...sequence(), ...sampling(), top: 12 }); } catch (e) { if (seq === nextSeq) showError(e); return; }
    if (seq !== nextSeq) return;
    const bars = $("bars"); bars.textContent = "";
    const best = n.tokens.length ? n.tokens[0].probability : 1;
    for (const t of n.tokens) {
      const row = document.createElement("div"); row.className = "bar-row";
      const tok = document.createElement("span"); tok.className = "bar-token"; tok.textContent = JSON.stringify(t.token); tok.title = "id " + t.id + " · raw softmax " + t.raw.toFixed(4);
      const cell = document.createElement("div"), bar = document.createElement("div"); bar.className = "bar"; bar.style.width = (100 * t.probability / best) + "%"; cell.appendChild(bar);
      const p = document.createElement("span"); p.className = "bar-p"; p.textContent = (100 * t.probability).toFixed(1) + "%";
      row.append(tok, cell, p); bars.appendChild(row);
    }
    $("next-note").textContent = n.kept + " tokens kept by the filters · entropy " + n.entropy.toFixed(3) + " nats";
    stats.nexts++;
  }
  for (const id of ["temperature", "top-k", "top-p"]) $(id).addEventListener("input", () => nextToken());

  // ------------------------------------------------------------------ generate, share
  async function generate(n) {
    const seed = Number($("seed").value);
    let g;
    if (seq2seq()) {  // greedy decoding, as attnlab translate decodes
      const before = state.ids ? state.prompt : null;
      try { g = await call("/api/generate", { ...sequence(), n }); } catch (e) { showError(e); return; }
      state.ids = g.target_ids; state.prompt = before === null ? g.target_ids.length - g.new.length : before;
      stats.generated += g.new.length;
      refresh(); return;
    }
    try { g = await call("/api/generate", { ...sequence(), ...sampling(), n, seed }); } catch (e) { showError(e); return; }
    state.ids = g.ids; state.prompt = g.prompt_length;
    if (n === 1) $("seed").value = String(seed + 1); // the next draw, deterministic too
    stats.generated += g.new.length;
    refresh();
  }
  $("generate-one").addEventListener("click", () => generate(1));
  $("generate-n").addEventListener("click", () => generate(Number($("n").value)));
  $("restart").addEventListener("click", () => { state.ids = null; state.prompt = null; refresh(); });
  $("share").addEventListener("click", async () => {
    let blob;
    try { blob = await call("/api/share", { ...sequence(), ...chosen() }); } catch (e) { showError(e); return; }
    const a = document.createElement("a"); a.href = URL.createObjectURL(blob); a.download = "attnlab-view.html";
    document.body.appendChild(a); a.click(); a.remove();
  });
  $("target").addEventListener("input", () => {
    state.ids = null; state.prompt = null;
    clearTimeout(typing); typing = setTimeout(refresh, 300);
  });
  $("text").addEventListener("input", () => {
    state.ids = null; state.prompt = null;
    clearTimeout(typing); typing = setTimeout(refresh, 300);
  });

  // a small API for tests: what was drawn and asked
  window.attnlabServe = { state, stats };
  sampling();
  fetch("/api/info").then((r) => r.json()).then((info) => {
    state.info = info; $("title").textContent = "attnlab serve · " + info.title;
    document.title = "attnlab serve · " + info.title;
    if (seq2seq()) {  // source and target boxes; no step panel or card (a GPT's), greedy decoding
      $("target-row").hidden = false; $("steps-pane").hidden = true; $("card-pane").hidden = true;
      for (const id of ["temperature", "top-k", "top-p"]) $(id).closest(".row").hidden = false;
      $("seed").closest("label").hidden = true; $("share").hidden = true;
      $("text").value = ""; status("type a source text");
      return;
    }
    refresh();
  }).catch(showError);
})();
