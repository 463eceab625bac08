// The grid page's gallery: every arm's sample images side by side at one checkpoint step (or each arm at
// its own best or last checkpoint). grid.js owns the data and calls update() after each poll that
// changed something, and select() when a point of a curve is clicked. Images come from
// GET /api/runs/{id}/samples/{step}/{file}; which exist comes with the grid (run.samples: the steps that
// have images and the fixed set each holds, orchestrator/results/samples.py SampleIndex).
"use strict";

window.AblateGallery = function (opts) {
  const { el, colour, hidden, onStep } = opts;
  // Labels of the kinds of image, from orchestrator/results/samples.py KIND_LABELS (rendered into the page).
  const LABELS = JSON.parse(document.getElementById("sample-kinds").textContent);
  const TERMINAL = new Set(JSON.parse(document.getElementById("vocabulary").textContent).terminal_run_states);
  const root = document.getElementById("gallery");
  const controls = root.querySelector(".gallery-controls");
  const slider = document.getElementById("gallery-step");
  const ticks = document.getElementById("gallery-ticks");
  const label = document.getElementById("gallery-label");
  const empty = document.getElementById("gallery-empty");
  const arms = document.getElementById("gallery-arms");

  // What is shown: mode "step" (one step for every arm) or "best"/"final" (each arm its own). `follow`:
  // the newest step is shown and stays so as a live grid's checkpoints arrive, until the user picks one.
  const state = { mode: "step", step: null, follow: true };
  let data = null;
  let steps = [];  // every step at which some arm has images, ascending
  let drawn = "";  // what the columns show now: rebuilt only when it changes (no flicker while polling)

  const url = (run, step, file) => `/api/runs/${run.id}/samples/${step}/${encodeURIComponent(file)}`;
  const lastOf = (arr) => (arr.length ? arr[arr.length - 1] : null);
  const terminal = (run) => TERMINAL.has(run.state);

  function nearest(step) {
    // The sample step closest to `step` (the earlier on a tie): a curve point may be a checkpoint
    // recorded without images (an imported curve, an older run).
    let best = null;
    for (const s of steps) if (best === null || Math.abs(s - step) < Math.abs(best - step)) best = s;
    return best;
  }

  function stepFor(run) {
    const own = run.samples.steps;
    if (state.mode === "best") return own.includes(run.best_step) ? run.best_step : null;
    if (state.mode === "final") return lastOf(own);
    return own.includes(state.step) ? state.step : null;
  }

  function marks(run, step) {
    const out = [];
    if (step === run.best_step) out.push(el("span", { class: "mark best", title: `${run.arm}'s best checkpoint (recon LPIPS)` }, "★ best"));
    if (step === lastOf(run.series.step)) {
      out.push(terminal(run)
        ? el("span", { class: "mark final", title: `${run.arm}'s final checkpoint` }, "final")
        : el("span", { class: "mark latest", title: `${run.arm} is still training: its newest checkpoint` }, "latest"));
    }
    if (run.stopped && step === run.decision_step) out.push(el("span", { class: "mark stop", title: run.decision_reason || "" }, `✕ ${run.decision}`));
    return out;
  }

  function image(run, step, f, caption) {
    const kind = LABELS[f.kind] || f.kind;
    return el("figure", { class: `sample kind-${f.kind}` },
      el("img", { src: url(run, step, f.file), alt: `${run.arm} ${kind} ${f.index}: ${f.caption}`, title: `${kind}\n${f.caption}`,
        "data-kind": f.kind, "data-index": f.index, "data-step": step, width: 128, height: 128, decoding: "async",
        onerror: (e) => e.target.closest("figure").classList.add("missing") }),
      el("figcaption", {}, caption));
  }

  function groups(run, step) {
    // Pairs by index: the target beside its reconstruction, a caption's sample beside its edit's.
    const files = run.samples.files;
    const byKind = (k) => files.filter((f) => f.kind === k);
    const find = (k, i) => files.find((f) => f.kind === k && f.index === i);
    const out = [];
    const recon = byKind("recon");
    if (recon.length) {
      out.push(el("div", { class: "group", "data-group": "recon" }, el("h3", {}, "reconstruction beside its target"),
        el("div", { class: "pairs" }, recon.map((f) => {
          const t = find("target", f.index);
          return el("div", { class: "pair", title: f.caption }, t ? image(run, step, t, "target") : null, image(run, step, f, "recon"));
        }))));
    }
    const text = byKind("text");
    if (text.length) {
      out.push(el("div", { class: "group", "data-group": "text" }, el("h3", {}, "text only (caption alone)"),
        el("div", { class: "singles" }, text.map((f) => image(run, step, f, f.caption)))));
    }
    const caps = byKind("caption");
    if (caps.length) {
      out.push(el("div", { class: "group", "data-group": "manipulation" }, el("h3", {}, "caption → edited caption (same noise)"),
        el("div", { class: "pairs" }, caps.map((f) => {
          const e = find("edit", f.index);
          return el("div", { class: "pair", title: e ? `${f.caption} → ${e.caption}` : f.caption },
            image(run, step, f, f.caption), e ? image(run, step, e, e.caption) : null);
        }))));
    }
    const own = byKind("own");  // a command arm's PNGs from its samples/step_N/, captioned with their file names
    if (own.length) {
      out.push(el("div", { class: "group", "data-group": "own" }, el("h3", {}, "the trainer's own images"),
        el("div", { class: "singles" }, own.map((f) => image(run, step, f, f.caption)))));
    }
    return out;
  }

  function column(run) {
    const step = stepFor(run);
    const own = run.samples.steps;
    const head = el("header", {}, el("i", { class: "sw", style: `--c:${colour(run)}` }), el("strong", {}, run.arm),
      step !== null ? el("span", { class: "at" }, `step ${step}`) : null, step !== null ? marks(run, step) : null);
    let body;
    if (step !== null) body = groups(run, step);
    else if (!own.length) body = [el("p", { class: "none" }, "no sample images stored")];
    else {
      const why = state.mode === "best" ? `none at its best step ${run.best_step ?? "—"}` : `none at step ${state.step}`;
      const stop = run.stopped && state.step > run.decision_step ? `; stopped at step ${run.decision_step}` : "";
      body = [el("p", { class: "none" }, `${why}${stop} (images at steps ${own[0]}–${lastOf(own)})`)];
    }
    return el("div", { class: "gallery-arm", "data-arm": run.arm, "data-step": step ?? "", style: `--c:${colour(run)}` }, head, body);
  }

  function draw() {
    const runs = data.runs.filter((r) => !hidden.has(r.arm));
    const key = JSON.stringify([state, runs.map((r) => [r.arm, r.state, r.best_step, r.samples, lastOf(r.series.step)])]);
    root.dataset.mode = state.mode;
    root.dataset.step = state.mode === "step" && state.step !== null ? state.step : "";
    const i = steps.indexOf(state.step);
    slider.value = String(Math.max(i, 0));
    slider.disabled = steps.length < 2;
    label.textContent = state.mode === "step" ? `step ${state.step}` : state.mode === "best" ? "each arm's best" : "each arm's last";
    for (const b of controls.querySelectorAll("button[data-mode]")) b.classList.toggle("on", b.dataset.mode === state.mode);
    if (key === drawn) return;
    drawn = key;
    arms.style.setProperty("--n", String(Math.max(runs.length, 1)));
    arms.replaceChildren(...runs.map(column));
  }

  function show(mode, step, follow) {
    Object.assign(state, { mode, step, follow });
    draw();
    onStep(mode === "step" ? step : null);
  }

  function update(d) {
    data = d;
    steps = Array.from(new Set(d.runs.flatMap((r) => r.samples.steps))).sort((a, b) => a - b);
    controls.hidden = steps.length === 0;
    empty.hidden = steps.length > 0;
    empty.textContent = "No sample images stored for this grid: training saves them at every evaluation; imported curves have none.";
    if (!steps.length) { arms.replaceChildren(); drawn = ""; return; }
    slider.max = String(steps.length - 1);
    ticks.replaceChildren(...steps.map((s, i) => el("option", { value: i, label: String(s) })));
    if (state.mode === "step" && (state.follow || !steps.includes(state.step))) {
      state.step = state.follow ? lastOf(steps) : nearest(state.step);
    }
    draw();
    onStep(state.mode === "step" ? state.step : null);
  }

  function select(step) {
    if (!steps.length) return;
    const s = nearest(step);
    show("step", s, false);
    // Bring the images into view when the click came from a chart far from them.
    const box = root.getBoundingClientRect();
    if (box.top > innerHeight || box.bottom < 0) root.scrollIntoView({ block: "nearest" });
  }

  const move = (by) => {
    const i = state.mode === "step" ? steps.indexOf(state.step) : steps.length - 1;
    const j = Math.min(Math.max(i + by, 0), steps.length - 1);
    show("step", steps[j], j === steps.length - 1);
  };
  slider.addEventListener("input", () => {
    const j = parseInt(slider.value, 10);
    show("step", steps[j], j === steps.length - 1);
  });
  document.getElementById("gallery-prev").addEventListener("click", () => move(-1));
  document.getElementById("gallery-next").addEventListener("click", () => move(1));
  for (const b of controls.querySelectorAll("button[data-mode]")) {
    b.addEventListener("click", () => show(b.dataset.mode, state.step ?? lastOf(steps), false));
  }
  return { update, select, redraw: () => data && draw() };
};
