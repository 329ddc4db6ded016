// (after viewer.js, in the same script: its "use strict" holds here; the declaration is hoisted)
// The lens panel (attnlab.viz.viewer_lens): what each layer would predict at each position, as
// Python's attnlab.inspect.logit_lens computed it (top k and KL to the output). The page computes
// nothing: it lays the numbers out as a table, the output row at the top, and colours each cell.
function attnlabLensPanel(DATA, LUT, tip) {
  const LENSES = Array.isArray(DATA.lenses) ? DATA.lenses : [];
  const state = { lens: 0, colour: "prob", pinned: null };
  const panel = document.getElementById("lens-panel");
  if (!LENSES.length) return { available: false, draw() {}, hide() {}, api: null };

  function rgb(v) { // v in [0, 1] → viridis
    const i = Math.max(0, Math.min(255, Math.round(v * 255)));
    return [LUT[i * 3], LUT[i * 3 + 1], LUT[i * 3 + 2]];
  }
  function css(c) { return "rgb(" + c[0] + "," + c[1] + "," + c[2] + ")"; }
  function light(c) { return (0.299 * c[0] + 0.587 * c[1] + 0.114 * c[2]) / 255 > 0.55; }
  // a token as a cell shows it: white space alone made visible (as attnlab plot lens does)
  function shown(t) { return t.trim() === "" ? t.replace(/ /g, "␣").replace(/\n/g, "↵").replace(/\t/g, "⇥") : t; }
  function truncate(s, n) { return s.length > n ? s.slice(0, n - 1) + "…" : s; }
  function pct(p) { return p >= 0.995 ? "100%" : p < 0.01 ? "<1%" : Math.round(p * 100) + "%"; }
  function rowName(L, r) {
    const n = L.layers.length, x = L.layers[r];
    return r === n - 1 ? "output (after " + x + ")" : x === "embed" ? "embed" : "after " + x;
  }
  function maxKL(L) { let m = 0; L.kl_bits.forEach((row) => row.forEach((v) => { m = Math.max(m, v); })); return m > 0 ? m : 1; }
  // the colour of a cell: its top probability, or 1 − KL / max KL (bright: as the output)
  function colourOf(L, r, t, kmax) {
    return state.colour === "kl" ? rgb(1 - Math.min(1, L.kl_bits[r][t] / kmax)) : rgb(L.top_probs[r][t][0]);
  }
  function topk(L, r, t) {
    return L.top_ids[r][t].map((id, k) => JSON.stringify(L.tokens[String(id)]) + " " + L.top_probs[r][t][k].toFixed(4));
  }
  function describe(L, r, t) {
    return L.label + " · " + rowName(L, r) + " · position " + t + " " + JSON.stringify(L.positions[t]) +
      "\nKL to the output: " + L.kl_bits[r][t].toFixed(4) + " bits\ntop " + L.top_ids[r][t].length + ": " + topk(L, r, t).join(", ");
  }

  function buttonsRow(label, items, active, onClick) {
    const row = document.createElement("div");
    row.className = "row";
    const span = document.createElement("span");
    span.className = "label"; span.textContent = label;
    const box = document.createElement("div");
    box.className = "buttons";
    items.forEach((it) => {
      const b = document.createElement("button");
      b.textContent = it.label; b.dataset.value = it.value; b.className = "lens-btn" + (it.value === active ? " active" : "");
      if (it.title) b.title = it.title;
      b.addEventListener("click", () => onClick(it.value));
      box.appendChild(b);
    });
    row.append(span, box);
    return row;
  }

  function draw() {
    panel.hidden = false;
    panel.textContent = "";
    const L = LENSES[state.lens], kmax = maxKL(L);
    panel.appendChild(buttonsRow("lens", LENSES.map((l, i) => ({ label: l.label, value: i, title: l.meaning })), state.lens,
      (v) => { state.lens = v; state.pinned = null; draw(); }));
    const colours = [{ label: "top probability", value: "prob", title: "colour ∝ the top token's probability, 0 … 1" },
      { label: "KL to the output", value: "kl", title: "colour: KL(output ‖ this layer) in bits; bright = 0 (as the output)" }];
    const crow = buttonsRow("colour", colours, state.colour, (v) => { state.colour = v; draw(); });
    const bar = document.createElement("span");
    bar.id = "lens-bar";
    bar.style.background = "linear-gradient(to right, " + [0, 0.25, 0.5, 0.75, 1].map((v) => css(rgb(v))).join(", ") + ")";
    const note = document.createElement("span");
    note.id = "lens-note";
    note.textContent = state.colour === "kl" ? "KL(output ‖ layer): " + kmax.toFixed(2) + " bits … 0 (dark … bright)"
      : "probability of the top token: 0 … 1 (dark … bright)";
    crow.append(bar, note);
    panel.appendChild(crow);
    const meaning = document.createElement("div");
    meaning.className = "lens-meaning";
    meaning.textContent = L.label + ": " + L.meaning + ". Each cell: the most probable next token after reading the column's token, and its probability; hover for the top " +
      L.top_ids[0][0].length + ", click to keep them below.";
    panel.appendChild(meaning);
    const table = document.createElement("table");
    table.id = "lens-table";
    const head = table.createTHead().insertRow();
    const corner = document.createElement("th");
    corner.textContent = "layer ↓ · position →";
    head.appendChild(corner);
    L.positions.forEach((p, t) => {
      const th = document.createElement("th");
      th.textContent = t + " " + truncate(shown(p), 12); th.title = JSON.stringify(p);
      head.appendChild(th);
    });
    const body = table.createTBody();
    for (let r = L.layers.length - 1; r >= 0; r--) { // the output at the top, the embeddings last
      const tr = body.insertRow();
      const th = document.createElement("th");
      th.textContent = rowName(L, r);
      tr.appendChild(th);
      L.positions.forEach((_, t) => {
        const td = tr.insertCell(), c = colourOf(L, r, t, kmax);
        td.dataset.row = String(r); td.dataset.pos = String(t);
        td.style.background = css(c); td.style.color = light(c) ? "#1f2328" : "#fff";
        const tok = document.createElement("div");
        tok.className = "lens-tok"; tok.textContent = truncate(shown(L.tokens[String(L.top_ids[r][t][0])]), 10);
        const p = document.createElement("div");
        p.className = "lens-p"; p.textContent = pct(L.top_probs[r][t][0]);
        td.append(tok, p);
        if (state.pinned && state.pinned[0] === r && state.pinned[1] === t) td.classList.add("pinned");
      });
    }
    table.addEventListener("mousemove", (ev) => {
      const td = ev.target.closest("td");
      if (!td) { tip.hidden = true; return; }
      tip.textContent = describe(L, Number(td.dataset.row), Number(td.dataset.pos));
      tip.hidden = false;
      // beside the cursor, kept inside the window (the top k can be wider than what is left)
      const w = tip.offsetWidth, h = tip.offsetHeight;
      const x = ev.clientX + 14 + w > window.innerWidth ? Math.max(0, ev.clientX - 14 - w) : ev.clientX + 14;
      const y = ev.clientY + 14 + h > window.innerHeight ? Math.max(0, ev.clientY - 14 - h) : ev.clientY + 14;
      tip.style.left = x + "px"; tip.style.top = y + "px";
    });
    table.addEventListener("mouseleave", () => { tip.hidden = true; });
    table.addEventListener("click", (ev) => {
      const td = ev.target.closest("td");
      if (!td) return;
      state.pinned = [Number(td.dataset.row), Number(td.dataset.pos)];
      draw();
    });
    const wrap = document.createElement("div");
    wrap.id = "lens-wrap";
    wrap.appendChild(table);
    panel.appendChild(wrap);
    const detail = document.createElement("div");
    detail.id = "lens-detail";
    detail.textContent = state.pinned ? describe(L, state.pinned[0], state.pinned[1]) : "click a cell to keep its top " + L.top_ids[0][0].length + " here";
    panel.appendChild(detail);
  }
  function hide() { panel.hidden = true; }
  return {
    available: true, draw, hide,
    // for scripts and tests: the lens shown, the colouring, the pinned cell, the lenses as sent
    api: { get lens() { return LENSES[state.lens].lens; }, get colour() { return state.colour; },
      get pinned() { return state.pinned; }, lenses: LENSES, rowName: (r) => rowName(LENSES[state.lens], r) },
  };
}
