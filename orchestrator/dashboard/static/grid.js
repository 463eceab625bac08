// The grid page: fetches /api/dashboard/grids/{id}, draws every section and chart (charts.js, with uPlot),
// polls while runs are live, and keeps the gallery (gallery.js) at the selected step.
"use strict";

(function () {
  // States and decisions from orchestrator/vocabulary.py, rendered into the page.
  const VOCAB = JSON.parse(document.getElementById("vocabulary").textContent);
  const QUALITY = [
    { key: "recon_lpips", title: "Reconstruction LPIPS", primary: true },
    { key: "text_lpips", title: "Text-only LPIPS" },
    { key: "text_manip_delta", title: "Text-manipulation delta" },
    // Needs no downloaded weights: its headline (timesteps weighted by fixed inverse variances) judges where
    // LPIPS is the random stand-in (the detector's "auto"); the plain mean beside it.
    { key: "val_flow_ivw", title: "Held-out flow loss (headline: timesteps weighted)", yLabel: "weighted MSE" },
    { key: "val_flow_loss", title: "Held-out flow loss (plain mean)", yLabel: "velocity MSE" },
  ];
  // Distribution metrics (eval.distribution): charted where a run measured them, each naming its extractor.
  const DISTRIBUTION = [
    { key: "cmmd", title: "CMMD", yLabel: "MMD² ×1000", dist: true },
    { key: "dino_mmd", title: "DINO-MMD", yLabel: "MMD² ×1000", dist: true },
    { key: "fd_dinov2", title: "FD-DINOv2", yLabel: "Fréchet distance", dist: true },
  ];
  const measured = (d) => QUALITY.concat(DISTRIBUTION.filter((q) => d.runs.some((r) => r.series && r.series[q.key])));
  const extractorNote = (d, key) => {
    const labels = Array.from(new Set(d.runs.map((r) => (r.extractors || {})[key]).filter(Boolean)));
    const standin = labels.some((l) => l.includes("stand-in"));
    return `${labels.join(", ")}${standin ? ": stand-in extractor: descriptive" : ""}`;
  };
  const FLOW = "val_flow_ivw";
  const STANDIN_KEYS = new Set(["recon_lpips", "text_lpips", "text_manip_delta"]);  // what a stand-in LPIPS scores
  const FIRST_HEIGHT = 180;  // the first screen's two charts: lower, so the effects under them show too
  const FIRST_AND_FOLDED = ["row-judged", "row-standin-step", "row-standin-hours", "row-standin-paired"];
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

  const { el, armIndex, colour, dash, label, alpha, fmt, pct, signed, stopped, valueAt, fallbackText, lineTables, pairedTables, align, placeMarkers, placeSelected, clickedStep, refLine, chartCard, rangeWithZero } = window.AblateCharts({
    hidden, selectedStep: () => selectedStep, onSelect: (step) => gallery.select(step),
  });
  const nightPlan = window.AblatePlan({ el, chartCard, fmt });
  const notices = window.AblateNotices({ el, colour, fmt, pct, stopped, fallbackText, vocab: VOCAB, judgeTitle });
  const effects = window.AblateEffects({ el, fmt, signed, WEIGHTS_HOW: notices.WEIGHTS_HOW });

  // --- page sections ---
  function badge(state, extra) {
    return el("span", { class: `badge state-${state}`, "data-state": state }, extra || state);
  }

  // GPU-hours with enough digits that a CPU demo's hundredths do not read "0.0".
  function hoursText(h) {
    return h >= 10 ? h.toFixed(1) : String(Number(h.toPrecision(2)));
  }

  // Runs on logical GPUs of the CPU record no GPU-hours: the charts against GPU-hours would be empty.
  function noGpuHours(d) {
    const hours = d.runs.map((r) => lastOf(r.series.gpu_hours)).filter((v) => v !== null);
    return hours.length > 0 && hours.every((h) => h === 0);
  }

  function renderHeader(d) {
    document.getElementById("grid-name").textContent = d.name;
    const st = document.getElementById("grid-state");
    st.className = `badge state-${d.state}`;
    st.textContent = d.state;
    const hours = d.runs.map((r) => lastOf(r.series.gpu_hours)).filter((v) => v !== null);
    const total = hours.length ? hours.reduce((a, b) => a + b, 0) : null;
    // How many runs are in each state: the grid's state at a glance, beside its one word.
    const counts = new Map();
    for (const r of d.runs) counts.set(r.state, (counts.get(r.state) || 0) + 1);
    st.title = Array.from(counts, ([state, n]) => `${n} ${state}`).join(", ");
    // Arms and runs apart: a grid of 2 arms x 3 seeds is 6 runs, not "6 arms".
    const perArm = new Map();
    for (const r of d.runs) perArm.set(r.arm, (perArm.get(r.arm) || 0) + 1);
    const seeds = new Set(perArm.values());
    const arms = plural(perArm.size, "arm");
    const size = d.runs.length === perArm.size ? arms
      : `${arms} x ${seeds.size === 1 ? plural([...seeds][0], "seed") : "up to " + plural(Math.max(...seeds), "seed")} = ${plural(d.runs.length, "run")}`;
    document.getElementById("grid-meta").textContent = `${size} (${st.title}) · control ${d.control ?? "—"} · ${d.source}` +
      (total !== null ? ` · ${hoursText(total)} GPU-hours` : "");
    document.getElementById("control-name").textContent = d.control ? `(${d.control})` : "";
    const live = document.getElementById("live");
    live.hidden = !d.live;
    live.textContent = `live · updated ${new Date().toLocaleTimeString()}`;
  }

  // "1 seed", "3 seeds": the header counts read as words.
  function plural(n, word) {
    return `${n} ${word}${n === 1 ? "" : "s"}`;
  }

  function lastOf(arr) {
    if (!arr) return null;
    for (let i = arr.length - 1; i >= 0; i--) if (arr[i] !== null) return arr[i];
    return null;
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
      // Fallbacks folded into one tag (their words are in the warnings above and in its title).
      const fallbacks = r.fallbacks.filter((f) => !notices.isLpipsFallback(r, f)).map(fallbackText);
      if (fallbacks.length) notes.push(el("span", { class: "tag fallback", title: fallbacks.join("\n") }, `${fallbacks.length} fallback${fallbacks.length > 1 ? "s" : ""}`));
      // Detector warnings (e.g. a secondary metric worsening): flagged, but the arm was not stopped for them.
      for (const w of r.warnings) notes.push(el("span", { class: "tag warning", title: `detector warning (not a stop): ${w}` }, `⚠ ${w.split(/[;(]/)[0].trim()}`));
      if (r.stop_requested && !stopped(r)) notes.push(el("span", { class: "tag" }, "stop requested"));
      if (r.retries) notes.push(el("span", { class: "tag" }, `${r.retries} retries`));
      if (r.nodes.length > 1) notes.push(el("span", { class: "tag", title: "resumed on another node from stored checkpoints" }, `nodes: ${r.nodes.join(" → ")}`));
      if (r.storage && r.storage.alarm) notes.push(el("span", { class: "tag alarm", title: r.storage.last_error || "" }, `checkpoints unstored ${fmt(r.storage.minutes_unstored, 0)} min`));
      if (r.data.waiting) notes.push(el("span", { class: "tag alarm data-wait", title: `fix: ${r.data.fix}` }, `waits for data ${pct(r.data.wait_fraction)}`));
      if (r.data.skipped_images > 0) notes.push(el("span", { class: "tag fallback skipped", title: `files that failed to decode, skipped: ${r.data.skipped_files.join(", ")}` }, `${r.data.skipped_images} images skipped`));
      for (const j of r.evaluations_skipped || []) notes.push(el("span", { class: "tag warning evaluation-skipped", "data-evaluation": j.evaluation, title: j.reason }, `evaluation ${j.evaluation} skipped: ${j.reason.split(/[:;(]/)[0].trim()}`));
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
        el("td", { class: "notes" }, notes));
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
    charts.push(nightPlan.render(d, document.getElementById("row-plan"), document.getElementById("plan")));
    const rows = { step: "row-step", hours: "row-hours", paired: "row-paired", speed: "row-speed" };
    for (const id of [...Object.values(rows), ...FIRST_AND_FOLDED]) document.getElementById(id).replaceChildren();
    const note = standinNote(d);
    const fold = document.getElementById("standin-charts");
    fold.hidden = note === null;
    if (note !== null) {
      fold.querySelector("summary").textContent = `Stand-in LPIPS charts, folded (${note.replace("⚠ ", "")}): ` +
        `a random LPIPS backbone (no real weights here) cannot tell arms apart; ${notices.WEIGHTS_HOW}.`;
    }
    // Where a chart goes: the judged metric by step leads the page; a stand-in LPIPS chart waits folded
    // (drawn once opened: a closed <details> has no width to draw in); the rest in their rows.
    const place = (key, axis) => {
      if ((axis === "step" || axis === "paired") && key === d.judge) return document.getElementById("row-judged");
      if (note !== null && STANDIN_KEYS.has(key)) return fold.open ? document.getElementById(`row-standin-${axis}`) : null;
      return document.getElementById(rows[axis]);
    };
    if (noGpuHours(d)) {
      document.getElementById(rows.hours).append(el("p", { class: "nodata", id: "no-gpu-hours" },
        "No charts against GPU-hours: the runs recorded 0 GPU-hours (they trained on the CPU, on logical GPUs); " +
        "the charts by step show the same curves."));
    }
    for (const [axis, xKey, xLabel] of [["step", "step", "step"], ...(noGpuHours(d) ? [] : [["hours", "gpu_hours", "GPU-hours"]])]) {
      for (const q of measured(d)) {
        if (place(q.key, axis) === null) continue;
        charts.push(chartCard(place(q.key, axis), {
          key: q.key, axis, height: q.key === d.judge && axis === "step" ? FIRST_HEIGHT : undefined, title: `${q.title}${axis === "hours" ? " vs GPU-hours" : ""}`,
          note: q.dist ? extractorNote(d, q.key) : q.key === FLOW ? judgeNote(d) : q.key.endsWith("lpips") ? note : null,
          xLabel, yLabel: q.yLabel || (q.key === "text_manip_delta" ? "LPIPS delta" : "LPIPS"),
          tables: d.runs.flatMap((r) => lineTables(r, xKey, q.key, `${q.key}_se`, 1)),
          markers: qualityMarkers(d, q, xKey),
          refs: q.key.endsWith("lpips") ? [{ y: 1.0, label: "LPIPS 1.0 (trivial baseline)" }] : [],
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
    for (const q of measured(d)) {
      if (place(q.key, "paired") === null) continue;
      const tables = others.flatMap((r) => pairedTables(r, q.key));
      const methods = new Set(tables.map((t) => t.seMethod));
      const seNote = methods.has("paired") ? "±2 SE of per-sample paired differences"
        : methods.has("independent") ? "±2 SE from the two arms' SEs (independent: conservative)"
        : "no SE stored: no bands";
      charts.push(chartCard(place(q.key, "paired"), {
        key: `paired_${q.key}`, axis: "paired", height: q.key === d.judge ? FIRST_HEIGHT : undefined, title: `Δ ${q.title} vs ${d.control}`, note: seNote,
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

  function render(d) {
    renderHeader(d);
    notices.render(d, document.getElementById("banners"));
    effects.render(d);
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

  for (const id of ["flow-by-t", "standin-charts"]) document.getElementById(id).addEventListener("toggle", () => data && renderCharts(data));

  let resizeTimer = null;
  window.addEventListener("resize", () => {
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(() => data && renderCharts(data), 150);
  });
  load();
})();
