// The grid page: fetches /api/dashboard/grids/{id}, draws every chart with uPlot, polls while runs are live.
// Arm colours come from the Okabe-Ito palette (distinguishable with common colour-vision deficiencies)
// and are fixed by the arm's position in the grid, so an arm has the same colour in every chart.
"use strict";

(function () {
  const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#B8A400"];
  // States and decisions from orchestrator/vocabulary.py, rendered into the page.
  const VOCAB = JSON.parse(document.getElementById("vocabulary").textContent);
  const QUALITY = [
    { key: "recon_lpips", title: "Reconstruction LPIPS", primary: true },
    { key: "text_lpips", title: "Text-only LPIPS" },
    { key: "text_manip_delta", title: "Text-manipulation delta" },
    // Needs no downloaded weights: judges where LPIPS is the random stand-in (the detector's "auto").
    { key: "val_flow_loss", title: "Held-out flow loss", yLabel: "velocity MSE" },
  ];
  const FLOW = "val_flow_loss";
  const SPEED = [
    { key: "iter_per_sec", title: "Iterations / s" },
    { key: "samples_per_sec", title: "Samples / s" },
  ];

  const root = document.getElementById("grid");
  const gridId = root.dataset.gridId;
  const pollMs = 1000 * parseFloat(root.dataset.pollSeconds || "3");
  const hidden = new Set();  // arms the user switched off (click an arm in the table)
  let data = null;
  let charts = [];
  let pollTimer = null;
  let selectedStep = null;  // the gallery's step, drawn as a line on the charts whose x is the step

  // --- small DOM helpers (textContent everywhere: arm names and reasons are user data) ---
  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === null || v === undefined || v === false) continue;
      if (k === "class") node.className = v;
      else if (k === "style") node.style.cssText = v;
      else if (k.startsWith("data-")) node.setAttribute(k, String(v));
      else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
      else node.setAttribute(k, String(v));
    }
    for (const c of children.flat()) {
      if (c === null || c === undefined || c === false) continue;
      node.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return node;
  }

  // One colour per arm (its replicates share it), one dash pattern per training seed.
  const DASHES = [undefined, [7, 4], [2, 3], [10, 3, 2, 3]];
  const armIndex = (run) => run.arm_index ?? run.position;
  const colour = (run) => PALETTE[armIndex(run) % PALETTE.length];
  const dash = (run) => DASHES[((run.seed || 0) + (armIndex(run) >= PALETTE.length ? 1 : 0)) % DASHES.length];
  const label = (run) => run.label || run.arm;
  function alpha(hex, a) {
    const n = parseInt(hex.slice(1), 16);
    return `rgba(${(n >> 16) & 255},${(n >> 8) & 255},${n & 255},${a})`;
  }
  function fmt(v, digits) {
    if (v === null || v === undefined || Number.isNaN(v)) return "—";
    if (digits !== undefined) return v.toFixed(digits);
    const a = Math.abs(v);
    if (a !== 0 && (a < 0.001 || a >= 1e5)) return v.toExponential(2);
    if (Number.isInteger(v)) return String(v);
    const t = v.toPrecision(4);
    return t.includes(".") && !t.includes("e") ? t.replace(/\.?0+$/, "") : t;
  }
  const pct = (v) => (v === null || v === undefined ? "—" : `${(100 * v).toFixed(v < 0.1 ? 1 : 0)}%`);
  const signed = (v) => (v === null || v === undefined ? "—" : (v > 0 ? "+" : "") + v.toFixed(4));
  const stopped = (run) => run.stopped;  // the server's verdict: a decision that stops a run, at a step
  const valueAt = (run, key, step) => {
    const s = run.series;
    const i = s.step.indexOf(step);
    return i >= 0 && s[key] ? s[key][i] : null;
  };
  function fallbackText(f) {
    if (typeof f === "string") return f;
    if (f && typeof f === "object") {
      const what = f.what || f.name || f.kind || f.field;
      const why = f.why || f.reason || f.detail || f.message;
      if (what || why) return [what, why].filter(Boolean).join(": ");
    }
    return JSON.stringify(f);
  }

  // --- series tables -> one aligned uPlot data array ---
  // A "table" is {run, xs, ys, lo, hi, after}: one line (+ optional band) of one arm.
  function lineTables(run, xKey, yKey, seKey, seScale) {
    const s = run.series;
    if (!s[yKey] || !s[xKey]) return [];
    const pts = [];
    for (let i = 0; i < s.step.length; i++) {
      const x = s[xKey][i], y = s[yKey][i];
      if (x === null || x === undefined || y === null || y === undefined) continue;
      const se = seKey && s[seKey] ? s[seKey][i] : null;
      pts.push({ step: s.step[i], x, y, se });
    }
    pts.sort((a, b) => a.x - b.x);
    // A stopped arm whose curve goes on (an imported study ran to the end): the part after the
    // detector's stop is drawn faded and dashed, as what the stop would have saved.
    const cut = stopped(run) ? run.decision_step : null;
    const parts = cut === null ? [[pts, false]] : [[pts.filter((p) => p.step <= cut), false], [pts.filter((p) => p.step >= cut), true]];
    return parts
      .filter(([p]) => p.length > 0)
      .map(([p, after]) => {
        const hasSe = p.some((q) => q.se !== null && q.se !== undefined);
        return {
          run, after,
          xs: p.map((q) => q.x),
          ys: p.map((q) => q.y),
          steps: p.map((q) => q.step),
          hi: hasSe ? p.map((q) => (q.se === null ? null : q.y + seScale * q.se)) : null,
          lo: hasSe ? p.map((q) => (q.se === null ? null : q.y - seScale * q.se)) : null,
        };
      });
  }

  function pairedTables(run, key) {
    const p = run.paired && run.paired[key];
    if (!p || p.step.length === 0) return [];
    const hasSe = p.se.some((v) => v !== null);
    return [{
      run, after: false, xs: p.step, ys: p.diff, steps: p.step,
      hi: hasSe ? p.diff.map((d, i) => (p.se[i] === null ? null : d + 2 * p.se[i])) : null,
      lo: hasSe ? p.diff.map((d, i) => (p.se[i] === null ? null : d - 2 * p.se[i])) : null,
      seMethod: p.se_method,
    }];
  }

  function align(tables) {
    const xs = Array.from(new Set(tables.flatMap((t) => t.xs))).sort((a, b) => a - b);
    const index = new Map(xs.map((x, i) => [x, i]));
    const column = (t, ys) => {
      const out = new Array(xs.length).fill(null);
      t.xs.forEach((x, i) => { out[index.get(x)] = ys[i]; });
      return out;
    };
    const cols = [xs];
    const series = [{}];
    const bands = [];
    for (const t of tables) {
      const c = colour(t.run);
      if (t.hi) {
        cols.push(column(t, t.hi), column(t, t.lo));
        const hiIdx = cols.length - 2;
        series.push({ stroke: "transparent", points: { show: false }, spanGaps: true, label: `${label(t.run)} +se` });
        series.push({ stroke: "transparent", points: { show: false }, spanGaps: true, label: `${label(t.run)} -se` });
        bands.push({ series: [hiIdx, hiIdx + 1], fill: alpha(c, t.after ? 0.06 : 0.16) });
      }
      cols.push(column(t, t.ys));
      series.push({
        label: label(t.run),
        stroke: t.after ? alpha(c, 0.45) : c,
        width: t.after ? 1.5 : 2,
        dash: t.after ? [5, 4] : dash(t.run),
        spanGaps: true,
        points: { show: true, size: t.after ? 4 : 5, fill: t.after ? alpha(c, 0.45) : c, stroke: t.after ? alpha(c, 0.45) : c },
        _arm: t.run.arm, _main: !t.after,
        _steps: column(t, t.steps),  // the checkpoint step of each point, for a click to pick (x may be GPU-hours)
      });
    }
    return { cols, series, bands };
  }

  // --- markers: DOM elements over the plot area (queryable, with the reason as text) ---
  function placeMarkers(u, markers) {
    let layer = u.over.querySelector(".markers");
    if (!layer) {
      layer = el("div", { class: "markers" });
      u.over.append(layer);
    }
    layer.replaceChildren();
    const w = u.over.clientWidth, h = u.over.clientHeight;
    for (const m of markers) {
      const left = u.valToPos(m.x, "x");
      if (!(left >= -1 && left <= w + 1)) continue;
      const attrs = { "data-kind": m.kind, "data-arm": m.run.arm, "data-step": m.step, title: m.title, style: `left:${left}px;--c:${colour(m.run)}` };
      if (m.kind === "stop" || m.kind === "stop-line") {
        attrs["data-decision"] = m.run.decision;
        attrs["data-reason"] = m.run.decision_reason || "";
        const mk = el("div", { ...attrs, class: `marker ${m.kind}` });
        if (m.kind === "stop" && m.y !== null && m.y !== undefined) {
          const top = u.valToPos(m.y, "y");
          mk.append(el("span", { class: "x", style: `top:${top}px` }, "✕"));
          mk.append(el("span", { class: "label", style: `top:${Math.min(Math.max(top - 30, 2), h - 20)}px` },
            `${m.run.arm} stopped @${m.step}: ${m.run.decision}`));
        }
        layer.append(mk);
      } else if (m.y !== null && m.y !== undefined) {
        const top = u.valToPos(m.y, "y");
        if (top < -1 || top > h + 1) continue;
        attrs.style += `;top:${top}px`;
        layer.append(el("div", { ...attrs, class: "marker best" }, "★"));
      }
    }
  }

  // The gallery's step: a thin line on the charts whose x axis is the step.
  function placeSelected(u, xIsStep) {
    let line = u.over.querySelector(".marker.selected");
    if (!line) {
      line = el("div", { class: "marker selected" });
      u.over.append(line);
    }
    const left = selectedStep === null || !xIsStep ? null : u.valToPos(selectedStep, "x");
    line.hidden = !(left !== null && left >= -1 && left <= u.over.clientWidth + 1);
    if (!line.hidden) line.style.left = `${left}px`;
    line.dataset.step = selectedStep ?? "";
  }

  // A click (not the end of a drag-zoom) on a chart: the step of the point nearest the pointer.
  function clickedStep(u) {
    const i = u.cursor.idx;
    if (i === null || i === undefined) return null;
    let best = null, dist = Infinity;
    u.series.forEach((s, k) => {
      if (k === 0 || !s._steps || !s.show || u.data[k][i] === null || s._steps[i] === null) return;
      const d = Math.abs(u.valToPos(u.data[k][i], "y") - u.cursor.top);
      if (d < dist) { dist = d; best = s._steps[i]; }
    });
    return best;
  }

  function refLine(u, y, label) {
    const pos = u.valToPos(y, "y", true);
    const { left, top, width, height } = u.bbox;
    if (pos < top || pos > top + height) return;
    const ctx = u.ctx;
    ctx.save();
    ctx.strokeStyle = "#666";
    ctx.setLineDash([4, 4]);
    ctx.lineWidth = devicePixelRatio;
    ctx.beginPath();
    ctx.moveTo(left, pos);
    ctx.lineTo(left + width, pos);
    ctx.stroke();
    if (label) {
      ctx.fillStyle = "#555";
      ctx.font = `${11 * devicePixelRatio}px system-ui, sans-serif`;
      ctx.textAlign = "right";
      ctx.fillText(label, left + width - 4 * devicePixelRatio, pos - 4 * devicePixelRatio);
    }
    ctx.restore();
  }

  function chartCard(container, spec) {
    const { title, note, tables, xLabel, yLabel, markers = [], refs = [], key, axis, fmtY = fmt } = spec;
    const visible = tables.filter((t) => !hidden.has(t.run.arm));
    const arms = Array.from(new Map(tables.map((t) => [t.run.arm, t.run])).values());
    const legend = el("ul", { class: "legend" }, arms.map((r) =>
      el("li", { "data-arm": r.arm, class: hidden.has(r.arm) ? "off" : null, style: `--c:${colour(r)}` },
        el("i", { class: "sw" }), r.arm)));
    const readout = el("div", { class: "readout" }, "\u00a0");
    const plot = el("div", { class: "plot" });
    const card = el("figure", { class: "chart", "data-key": key, "data-axis": axis, "data-arms": arms.map((r) => r.arm).join(",") },
      el("figcaption", {}, el("strong", {}, title), note ? el("span", { class: "note" }, note) : null), legend, plot, readout);
    container.append(card);
    if (visible.length === 0) {
      plot.append(el("p", { class: "nodata" }, tables.length ? "all arms hidden" : "no data stored for this metric"));
      return null;
    }
    const { cols, series, bands } = align(visible);
    const width = Math.max(280, card.clientWidth - 16);
    const opts = {
      width, height: 230,
      legend: { show: false },
      cursor: { drag: { x: true, y: false }, points: { size: 7 } },
      series,
      bands,
      scales: { x: { time: false }, y: { range: spec.yRange } },
      axes: [
        { label: xLabel, labelSize: 18, size: 34, stroke: "#333", grid: { stroke: "#eee" }, ticks: { stroke: "#ccc" } },
        { label: yLabel, labelSize: 18, size: 58, stroke: "#333", grid: { stroke: "#eee" }, ticks: { stroke: "#ccc" }, values: (u, vals) => vals.map((v) => fmtY(v)) },
      ],
      hooks: {
        draw: [(u) => {
          refs.forEach((r) => refLine(u, r.y, r.label));
          placeMarkers(u, markers.filter((m) => !hidden.has(m.run.arm)));
          placeSelected(u, axis !== "hours" && axis !== "t");
          // Which arms have a drawn line: read by the browser test next to the canvas pixels.
          card.dataset.bands = String(bands.length);
          card.dataset.drawn = Array.from(new Set(u.series.filter((s, i) => i > 0 && s._main && s.show && u.data[i].some((v) => v !== null)).map((s) => s._arm))).join(",");
        }],
        setCursor: [(u) => {
          const i = u.cursor.idx;
          if (i === null || i === undefined) { readout.textContent = "\u00a0"; return; }
          const parts = [`${xLabel} ${fmt(u.data[0][i])}`];
          u.series.forEach((s, k) => { if (k > 0 && s._arm && u.data[k][i] !== null) parts.push(`${s._arm}${s._main ? "" : " (after stop)"} ${fmtY(u.data[k][i])}`); });
          readout.textContent = parts.join("   ");
        }],
      },
    };
    const chart = new uPlot(opts, cols, plot);
    chart._xIsStep = axis !== "hours" && axis !== "t";
    let down = null;
    chart.over.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
    chart.over.addEventListener("click", (e) => {
      if (down && Math.hypot(e.clientX - down[0], e.clientY - down[1]) > 4) return;  // a drag-zoom
      const step = clickedStep(chart);
      if (step !== null) gallery.select(step);
    });
    card.dataset.clickable = "true";
    return chart;
  }

  function rangeWithZero(u, min, max) {
    const lo = Math.min(min, 0), hi = Math.max(max, 0);
    const pad = (hi - lo) * 0.08 || 0.01;
    return [lo - pad, hi + pad];
  }

  // --- page sections ---
  function badge(state, extra) {
    return el("span", { class: `badge state-${state}`, "data-state": state }, extra || state);
  }

  function renderHeader(d) {
    document.getElementById("grid-name").textContent = d.name;
    const st = document.getElementById("grid-state");
    st.className = `badge state-${d.state}`;
    st.textContent = d.state;
    const hours = d.runs.map((r) => lastOf(r.series.gpu_hours)).filter((v) => v !== null);
    const total = hours.length ? hours.reduce((a, b) => a + b, 0) : null;
    document.getElementById("grid-meta").textContent =
      `${d.runs.length} arms · control ${d.control ?? "—"} · ${d.source}` + (total !== null ? ` · ${total.toFixed(1)} GPU-hours` : "");
    document.getElementById("control-name").textContent = d.control ? `(${d.control})` : "";
    const live = document.getElementById("live");
    live.hidden = !d.live;
    live.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  }

  function lastOf(arr) {
    if (!arr) return null;
    for (let i = arr.length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i];
    return null;
  }

  function renderBanners(d) {
    const box = document.getElementById("banners");
    box.replaceChildren();
    for (const r of d.runs) {
      if (stopped(r)) {
        box.append(el("div", { class: "banner stop", "data-arm": r.arm, style: `--c:${colour(r)}` },
          el("strong", {}, `${r.arm} stopped at step ${r.decision_step} (${r.decision}). `),
          r.decision_reason || "",
          r.best_step !== null ? ` Best checkpoint kept: step ${r.best_step}, ${judgeTitle(r)} ${fmt(r.best_value, 4)}.` : ""));
      }
      if (r.standin_steps.length) {
        box.append(el("div", { class: "banner standin", "data-arm": r.arm },
          el("strong", {}, `${r.arm}: stand-in LPIPS. `),
          `${r.standin_steps.length} checkpoint(s) were scored with a random (untrained) LPIPS backbone: these values are not comparable with real LPIPS.`,
          r.judge_metric === FLOW ? " The detector judges this arm on the held-out flow loss (val_flow_loss) instead: it needs no downloaded weights." : ""));
      }
      if (r.fallbacks.length) {
        box.append(el("div", { class: "banner fallback", "data-arm": r.arm },
          el("strong", {}, `${r.arm} fallbacks: `), r.fallbacks.map(fallbackText).join("; ")));
      }
      if (r.storage && r.storage.alarm) {
        const st = r.storage;
        box.append(el("div", { class: "banner failed storage", "data-arm": r.arm },
          el("strong", {}, `${r.arm}: checkpoints not stored for ${fmt(st.minutes_unstored, 0)} min. `),
          st.stored_step !== null ? `Newest checkpoint in storage: step ${st.stored_step}. ` : "No checkpoint in storage yet. ",
          st.failed_attempts ? `${st.failed_attempts} failed upload(s); last: ${st.last_error}. ` : "",
          `A lost node would lose what came after (${st.url}).`));
      }
      // The GPU waiting for batches (orchestrator/results/data_feed.py decides and words the fix).
      if (r.data.waiting) {
        box.append(el("div", { class: "banner data-wait", "data-arm": r.arm },
          el("strong", {}, `${r.arm} waits for data ${pct(r.data.wait_fraction)} of its time. `),
          `Fix: ${r.data.fix}.`));
      }
      if (r.state === VOCAB.run_state.failed && r.error) {
        box.append(el("div", { class: "banner failed", "data-arm": r.arm }, el("strong", {}, `${r.arm} failed: `), r.error));
      }
    }
  }

  function judgeTitle(r) {
    const q = QUALITY.find((x) => x.key === r.judge_metric);
    return q ? q.title : "recon LPIPS";
  }

  function renderArms(d) {
    const body = document.querySelector("#arms tbody");
    body.replaceChildren();
    for (const r of d.runs) {
      const s = r.series;
      const notes = [];
      if (r.standin_steps.length) notes.push(el("span", { class: "tag standin", title: "LPIPS from a random stand-in backbone" }, "stand-in LPIPS"));
      for (const f of r.fallbacks) notes.push(el("span", { class: "tag fallback", title: fallbackText(f) }, "fallback: " + fallbackText(f)));
      // Detector warnings (e.g. a secondary metric worsening): flagged, but the arm was not stopped for them.
      for (const w of r.warnings) notes.push(el("span", { class: "tag warning", title: `detector warning (not a stop): ${w}` }, `⚠ ${w.split(/[;(]/)[0].trim()}`));
      if (r.stop_requested && !stopped(r)) notes.push(el("span", { class: "tag" }, "stop requested"));
      if (r.retries) notes.push(el("span", { class: "tag" }, `${r.retries} retries`));
      if (r.nodes.length > 1) notes.push(el("span", { class: "tag", title: "resumed on another node from stored checkpoints" }, `nodes: ${r.nodes.join(" → ")}`));
      if (r.storage && r.storage.alarm) notes.push(el("span", { class: "tag alarm", title: r.storage.last_error || "" }, `checkpoints unstored ${fmt(r.storage.minutes_unstored, 0)} min`));
      if (r.data.waiting) notes.push(el("span", { class: "tag alarm data-wait", title: `fix: ${r.data.fix}` }, `waits for data ${pct(r.data.wait_fraction)}`));
      if (r.data.skipped_images > 0) notes.push(el("span", { class: "tag fallback skipped", title: `files that failed to decode, skipped: ${r.data.skipped_files.join(", ")}` }, `${r.data.skipped_images} images skipped`));
      if (r.gpu_name) notes.push(el("span", { class: "tag plain" }, r.gpu_name));
      const detector = r.decision && r.decision !== VOCAB.decision.continue
        ? el("span", {}, badge(stopped(r) ? VOCAB.run_state.stopped : r.decision, r.decision), r.decision_step !== null ? ` @${r.decision_step} ` : " ",
            el("span", { class: "reason", title: r.decision_reason || "" }, r.decision_reason || ""))
        : el("span", { class: "muted" }, r.decision === VOCAB.decision.continue ? r.decision : "—");
      const row = el("tr", { "data-arm": r.arm, class: hidden.has(r.arm) ? "off" : null, title: "click to show/hide this arm in the charts",
        onclick: () => { hidden.has(r.arm) ? hidden.delete(r.arm) : hidden.add(r.arm); render(data); } },
        el("td", {}, el("i", { class: "sw", style: `--c:${colour(r)}` }), el("strong", {}, label(r)), r.description ? el("span", { class: "desc", title: r.description }, r.description) : null),
        el("td", {}, badge(r.state)),
        el("td", { class: "num" }, fmt(lastOf(s.step))),
        el("td", { class: "num judged", title: r.judge_metric || "" }, fmt(lastOf(s[r.judge_metric || "recon_lpips"] || []), 4)),
        el("td", { class: "nowrap" }, r.best_step !== null ? `${fmt(r.best_value, 4)} @${r.best_step}` : "—"),
        el("td", {}, detector),
        el("td", { class: "num" }, fmt(lastOf(s.gpu_hours), 1)),
        el("td", { class: "num" }, fmt(lastOf(s.iter_per_sec))),
        el("td", { class: `num data-wait${r.data.waiting ? " alarm" : ""}` }, pct(r.data.wait_fraction)),
        el("td", { class: "num micro", title: r.data.loader_workers !== null ? `${r.data.loader_workers} loader workers` : null },
          r.data.micro_batch !== null ? `${r.data.micro_batch} × ${r.data.grad_accum ?? 1}` : "—"),
        el("td", {}, notes));
      body.append(row);
    }
  }

  function renderLineage(d) {
    const body = document.querySelector("#lineage tbody");
    body.replaceChildren();
    const byArm = new Map(d.runs.filter((r) => !r.seed).map((r) => [r.arm, r]));
    for (const row of d.lineage) {
      const entries = Object.entries(row.changes);
      const changes = entries.length
        ? el("ul", { class: "changes" }, entries.map(([k, v]) => el("li", {}, el("code", {}, k), " = ", el("code", {}, JSON.stringify(v)))))
        : el("span", { class: "muted" }, row.note || "no field differs");
      const run = byArm.get(row.arm);
      body.append(el("tr", { "data-arm": row.arm },
        el("td", {}, el("i", { class: "sw", style: `--c:${run ? colour(run) : "#999"}` }), el("strong", {}, row.arm), row.description ? el("span", { class: "desc" }, row.description) : null),
        el("td", {}, row.parent ? `${row.parent}${row.parent_source === "arms/" ? " (from arms/)" : ""}` : "—"),
        el("td", {}, changes, entries.length && row.note ? el("div", { class: "muted" }, row.note) : null)));
    }
  }

  function qualityMarkers(d, q, xKey) {
    const out = [];
    for (const r of d.runs) {
      const xAt = (step) => (xKey === "step" ? step : valueAt(r, xKey, step));
      // ★ and ✕ on the metric the detector judges this arm on; a line on the others
      const judged = r.judge_metric ? r.judge_metric === q.key : q.primary;
      if (judged && r.best_step !== null) {
        const y = r.best_value ?? valueAt(r, q.key, r.best_step);
        out.push({ kind: "best", run: r, step: r.best_step, x: xAt(r.best_step), y, title: `${r.arm} best checkpoint: step ${r.best_step}, ${q.title} ${fmt(y, 4)}` });
      }
      if (stopped(r)) {
        out.push({ kind: judged ? "stop" : "stop-line", run: r, step: r.decision_step, x: xAt(r.decision_step), y: valueAt(r, q.key, r.decision_step),
          title: `${r.arm} stopped at step ${r.decision_step} (${r.decision}): ${r.decision_reason || ""}` });
      }
    }
    return out.filter((m) => m.x !== null && m.x !== undefined);
  }

  function standinNote(d) {
    const arms = d.runs.filter((r) => r.standin_steps.length).map((r) => r.arm);
    return arms.length ? `⚠ stand-in LPIPS backbone: ${arms.join(", ")}` : null;
  }

  function judgeNote(d) {
    const arms = d.runs.filter((r) => r.judge_metric === FLOW).map((r) => r.arm);
    return arms.length ? `the detector's judge for ${arms.join(", ")} (their LPIPS is the stand-in)` : null;
  }

  // val_flow_loss per timestep, one line per arm at the gallery's step (else its newest checkpoint with them),
  // drawn when the reader opens it.
  function renderByT(d) {
    const box = document.getElementById("flow-by-t");
    const row = document.getElementById("row-by-t");
    row.replaceChildren();
    const runs = d.runs.filter((r) => r.flow_by_t && r.flow_by_t.step.length);
    box.hidden = runs.length === 0;
    if (!box.open || runs.length === 0) return;
    const tables = runs.map((r) => {
      const f = r.flow_by_t;
      let i = f.step.length - 1;
      while (selectedStep !== null && i > 0 && f.step[i] > selectedStep) i--;
      return { run: r, after: false, xs: f.t, ys: f.by_t[i], steps: f.t.map(() => f.step[i]), hi: null, lo: null };
    });
    const at = tables.map((t) => `${t.run.arm} @${t.steps[0]}`).join(", ");
    charts.push(chartCard(row, { key: "val_flow_loss_by_t", axis: "t", title: "Held-out flow loss by timestep",
      note: at, xLabel: "t (0 data, 1 noise)", yLabel: "velocity MSE", tables }));
  }

  function renderCharts(d) {
    charts.forEach((c) => c && c.destroy());
    charts = [];
    const rows = { step: "row-step", hours: "row-hours", paired: "row-paired", speed: "row-speed" };
    for (const id of Object.values(rows)) document.getElementById(id).replaceChildren();
    const note = standinNote(d);
    for (const [axis, xKey, xLabel] of [["step", "step", "step"], ["hours", "gpu_hours", "GPU-hours"]]) {
      for (const q of QUALITY) {
        charts.push(chartCard(document.getElementById(rows[axis]), {
          key: q.key, axis, title: `${q.title}${axis === "hours" ? " vs GPU-hours" : ""}`,
          note: q.key === FLOW ? judgeNote(d) : q.key !== "text_manip_delta" ? note : null,
          xLabel, yLabel: q.yLabel || (q.key === "text_manip_delta" ? "LPIPS delta" : "LPIPS"),
          tables: d.runs.flatMap((r) => lineTables(r, xKey, q.key, `${q.key}_se`, 1)),
          markers: qualityMarkers(d, q, xKey),
          refs: q.key !== "text_manip_delta" && q.key !== FLOW ? [{ y: 1.0, label: "LPIPS 1.0 (trivial baseline)" }] : [],
        }));
      }
    }
    // A command arm's own metrics (its script's names), one chart each, by step.
    const own = Array.from(new Set(d.runs.flatMap((r) => r.own_metrics || [])));
    for (const name of own) {
      charts.push(chartCard(document.getElementById(rows.step), {
        key: `own_${name}`, axis: "step", title: name, note: "reported by the arm's own trainer", xLabel: "step", yLabel: name,
        tables: d.runs.filter((r) => (r.own_metrics || []).includes(name)).flatMap((r) => lineTables(r, "step", name, null, 1)),
        markers: d.runs.filter(stopped).map((r) => ({ kind: "stop-line", run: r, step: r.decision_step, x: r.decision_step, y: null,
          title: `${r.arm} stopped at step ${r.decision_step}` })),
      }));
    }
    renderByT(d);
    const others = d.runs.filter((r) => r.paired);
    for (const q of QUALITY) {
      const tables = others.flatMap((r) => pairedTables(r, q.key));
      const methods = new Set(tables.map((t) => t.seMethod));
      const seNote = methods.has("paired") ? "±2 SE of per-sample paired differences"
        : methods.has("independent") ? "±2 SE from the two arms' SEs (independent: conservative)"
        : "no SE stored: no bands";
      charts.push(chartCard(document.getElementById(rows.paired), {
        key: `paired_${q.key}`, axis: "paired", title: `Δ ${q.title} vs ${d.control}`, note: seNote,
        xLabel: "step", yLabel: "Δ", tables, fmtY: (v) => signed(v).replace(/0+$/, "").replace(/\.$/, ""),
        yRange: rangeWithZero, refs: [{ y: 0, label: `= ${d.control}` }],
        markers: others.filter(stopped).map((r) => ({ kind: "stop-line", run: r, step: r.decision_step, x: r.decision_step, y: null,
          title: `${r.arm} stopped at step ${r.decision_step} (${r.decision}): ${r.decision_reason || ""}` })),
      }));
    }
    for (const s of SPEED) {
      charts.push(chartCard(document.getElementById(rows.speed), {
        key: s.key, axis: "step", title: s.title, xLabel: "step", yLabel: s.key === "iter_per_sec" ? "it/s" : "samples/s",
        tables: d.runs.flatMap((r) => lineTables(r, "step", s.key, null, 1)),
        markers: d.runs.filter(stopped).map((r) => ({ kind: "stop-line", run: r, step: r.decision_step, x: r.decision_step, y: null,
          title: `${r.arm} stopped at step ${r.decision_step}` })),
      }));
    }
  }

  // The effects table: each arm against its parent and the control across the grid's training seeds; with
  // one seed an interval covers evaluation noise only, and says so instead of "distinguishable".
  function renderEffects(d) {
    const body = document.querySelector("#effects tbody");
    body.replaceChildren();
    document.getElementById("effects-seeds").textContent = d.seeds > 1
      ? `${d.seeds} training seeds per arm: mean of the per-seed paired differences, t-interval over the seeds`
      : "one training seed per arm: intervals cover evaluation noise only (submit with seeds: 3 to measure training noise)";
    document.getElementById("effects-empty").hidden = d.effects.length > 0;
    for (const e of d.effects) {
      const interval = e.low !== null && e.high !== null ? ` [${signed(e.low)}, ${signed(e.high)}]` : "";
      const spread = e.seed_sd !== null ? `seed SD ${fmt(e.seed_sd, 4)}` : (e.eval_se !== null ? `eval SE ${fmt(e.eval_se, 4)}` : "—");
      const reading = e.standin ? "stand-in" : e.reading;
      body.append(el("tr", { "data-arm": e.arm, "data-metric": e.metric, "data-k": e.k },
        el("td", {}, e.arm), el("td", {}, e.words), el("td", {}, `${e.against} ${e.other_arm}`),
        el("td", { class: "num" }, `${signed(e.diff)}${interval}`),
        el("td", { class: `reading ${reading.split(":")[0].replace(/ /g, "-")}` }, reading),
        el("td", { class: "num" }, e.k), el("td", { class: "num" }, spread)));
    }
  }

  function render(d) {
    renderHeader(d);
    renderBanners(d);
    renderEffects(d);
    renderArms(d);
    renderCharts(d);
    gallery.update(d);
    renderLineage(d);
    root.dataset.version = d.version;
    root.dataset.ready = "true";
  }

  async function load() {
    const since = data ? `?since=${encodeURIComponent(data.version)}` : "";
    try {
      const resp = await fetch(`/api/dashboard/grids/${gridId}${since}`, { cache: "no-store" });
      if (!resp.ok) throw new Error(`${resp.status} ${resp.statusText}`);
      const d = await resp.json();
      if (!d.unchanged) {
        data = d;
        render(d);
      } else {
        document.getElementById("live").textContent = `live · checked ${new Date().toLocaleTimeString()}`;
      }
      root.dataset.error = "";
    } catch (err) {
      root.dataset.error = String(err);
      const live = document.getElementById("live");
      live.hidden = false;
      live.textContent = `connection lost (${err.message}); retrying`;
    }
    clearTimeout(pollTimer);
    if (!data || data.live || root.dataset.error) pollTimer = setTimeout(load, pollMs);
  }

  const gallery = window.AblateGallery({
    el, colour, hidden,
    onStep: (step) => {
      selectedStep = step;
      charts.forEach((c) => c && placeSelected(c, c._xIsStep));
      if (data && document.getElementById("flow-by-t").open) renderCharts(data);  // its lines are at this step
    },
  });

  document.getElementById("flow-by-t").addEventListener("toggle", () => data && renderCharts(data));

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => data && renderCharts(data), 150);
  });
  load();
})();
