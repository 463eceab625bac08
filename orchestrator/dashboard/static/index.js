// The grid list: rendered on the server; re-fetched every few seconds while any grid is live.
"use strict";

(function () {
  const table = document.getElementById("grids");
  const pollMs = 1000 * parseFloat(table.dataset.pollSeconds || "3");
  // States and decisions from orchestrator/vocabulary.py, rendered into the page.
  const VOCAB = JSON.parse(document.getElementById("vocabulary").textContent);
  const LIVE = new Set(VOCAB.live_grid_states);

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) if (v !== null && v !== undefined) node.setAttribute(k, String(v));
    for (const c of children.flat()) if (c !== null && c !== undefined) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    return node;
  }
  const when = (iso) => (iso ? new Date(iso).toLocaleString() : "—");

  function localiseTimes() {
    table.querySelectorAll("td.time").forEach((td) => { if (td.dataset.time) td.textContent = when(td.dataset.time); });
  }

  function render(rows) {
    const body = table.querySelector("tbody");
    body.replaceChildren(...rows.map((g) => el("tr", { "data-grid-id": g.id, "data-state": g.state },
      el("td", {}, g.id),
      el("td", {}, el("a", { href: `/grids/${g.id}` }, g.name)),
      el("td", {}, el("span", { class: `badge state-${g.state}` }, g.state)),
      el("td", { class: "arms" }, g.arms.map((a) => el("span", { class: `chip state-${a.state}`, title: `${a.arm}: ${a.state}${a.decision && a.decision !== VOCAB.decision.continue ? ` (${a.decision})` : ""}` }, a.arm))),
      el("td", { class: "time", "data-time": g.started_at || "" }, when(g.started_at)),
      el("td", { class: "num" }, g.gpu_hours === null ? "—" : g.gpu_hours.toFixed(1)),
      el("td", {}, g.source))));
  }

  // Every few seconds while a grid is live; otherwise now and then, to notice newly submitted grids.
  async function poll() {
    let live = false;
    try {
      const page = new URLSearchParams({ limit: table.dataset.limit, offset: table.dataset.offset });
      const resp = await fetch(`/api/dashboard/grids?${page}`, { cache: "no-store" });
      if (resp.ok) {
        const rows = await resp.json();
        if (rows.length) render(rows);
        live = rows.some((g) => LIVE.has(g.state));
        const pill = document.getElementById("live");
        pill.hidden = !live;
        pill.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
      }
    } finally {
      setTimeout(poll, live ? pollMs : pollMs * 5);
    }
  }

  localiseTimes();
  const liveNow = Array.from(table.querySelectorAll("tbody tr")).some((tr) => LIVE.has(tr.dataset.state));
  setTimeout(poll, liveNow ? pollMs : pollMs * 5);
})();
