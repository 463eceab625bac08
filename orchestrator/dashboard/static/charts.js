// The grid page's drawing kit: a DOM builder (textContent everywhere), arm colours and dashes, number
// formats, series tables aligned for uPlot, and one chart card (legend, readout, markers, the gallery's
// step as a line, a click that selects a step). grid.js owns the data and the page; it makes one kit with
// the arms the user hid, the selected step and what a click selects.
"use strict";

window.AblateCharts = function (page) {
  const { hidden } = page;
  // Okabe-Ito: distinguishable with common colour-vision deficiencies; fixed by the arm's position in the
  // grid, so an arm has the same colour in every chart.
  const PALETTE = ["#0072B2", "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9", "#000000", "#B8A400"];

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
  // A "table" is {run, xs, ys, lo, hi, after, width?}: one line (+ optional band) of one arm.
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
        width: t.width ?? (t.after ? 1.5 : 2),  // a table may set its own (a plan's slots are bars)
        dash: t.after ? [5, 4] : dash(t.run),
        spanGaps: true,
        points: { show: !t.width, size: t.after ? 4 : 5, fill: t.after ? alpha(c, 0.45) : c, stroke: t.after ? alpha(c, 0.45) : c },
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
    const left = page.selectedStep() === null || !xIsStep ? null : u.valToPos(page.selectedStep(), "x");
    line.hidden = !(left !== null && left >= -1 && left <= u.over.clientWidth + 1);
    if (!line.hidden) line.style.left = `${left}px`;
    line.dataset.step = page.selectedStep() ?? "";
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

  const STEP_AXES = new Set(["step", "paired"]);  // charts whose x is the step: the gallery's step shows there

  function chartCard(container, spec) {
    // afterWord: what a faded (non-main) line is in the readout: the part after a stop, or a plan's slot.
    const { title, note, tables, xLabel, yLabel, markers = [], refs = [], key, axis, fmtY = fmt, afterWord = "after stop" } = spec;
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
      width, height: spec.height || 230,
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
          placeSelected(u, STEP_AXES.has(axis));
          // Which arms have a drawn line: read by the browser test next to the canvas pixels.
          card.dataset.bands = String(bands.length);
          card.dataset.drawn = Array.from(new Set(u.series.filter((s, i) => i > 0 && s._main && s.show && u.data[i].some((v) => v !== null)).map((s) => s._arm))).join(",");
        }],
        setCursor: [(u) => {
          const i = u.cursor.idx;
          if (i === null || i === undefined) { readout.textContent = "\u00a0"; return; }
          const parts = [`${xLabel} ${fmt(u.data[0][i])}`];
          u.series.forEach((s, k) => { if (k > 0 && s._arm && u.data[k][i] !== null) parts.push(`${s._arm}${s._main ? "" : ` (${afterWord})`} ${fmtY(u.data[k][i])}`); });
          readout.textContent = parts.join("   ");
        }],
      },
    };
    const chart = new uPlot(opts, cols, plot);
    chart._xIsStep = STEP_AXES.has(axis);
    let down = null;
    chart.over.addEventListener("mousedown", (e) => { down = [e.clientX, e.clientY]; });
    chart.over.addEventListener("click", (e) => {
      if (down && Math.hypot(e.clientX - down[0], e.clientY - down[1]) > 4) return;  // a drag-zoom
      const step = clickedStep(chart);
      if (step !== null) page.onSelect(step);
    });
    card.dataset.clickable = "true";
    return chart;
  }

  function rangeWithZero(u, min, max) {
    const lo = Math.min(min, 0), hi = Math.max(max, 0);
    const pad = (hi - lo) * 0.08 || 0.01;
    return [lo - pad, hi + pad];
  }

  return { el, armIndex, colour, dash, label, alpha, fmt, pct, signed, stopped, valueAt, fallbackText, lineTables, pairedTables, align, placeMarkers, placeSelected, clickedStep, refLine, chartCard, rangeWithZero };
};
