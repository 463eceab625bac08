// The grid page's night plan: each run a lane, its planned slot drawn faded and dashed (the plan as
// submitted, or as the launcher last redrew it) and the run as it really went drawn solid over it, in
// hours from the plan's origin (its `drawn_at`, else the grid's creation). grid.js calls it with the
// page's data and its chart kit (charts.js).
"use strict";

window.AblatePlan = function (kit) {
  const { el, chartCard, fmt } = kit;
  const HOUR_MS = 3600 * 1000;

  // An ISO time in ms; a naive one is UTC, as the controller stores its times.
  const parseUtc = (iso) => Date.parse(/([zZ]|[+-]\d\d:\d\d)$/.test(iso) ? iso : `${iso}Z`);
  const hoursFrom = (origin, iso) => (parseUtc(iso) - origin) / HOUR_MS;

  function tables(d) {
    const plan = d.plan;
    const origin = parseUtc(plan.drawn_at || d.created_at);
    const lanes = d.runs.map((r) => r.id);
    const byName = new Map(d.runs.map((r) => [d.seeds > 1 ? `${r.arm}#${r.seed}` : r.arm, r]));
    const out = [];
    for (const slot of plan.slots) {
      const run = byName.get(slot.run);
      if (!run) continue;
      const y = lanes.indexOf(run.id);
      out.push({ run, after: true, width: 10, xs: [slot.start_h, slot.end_h], ys: [y, y], steps: [null, null], hi: null, lo: null });
    }
    const now = Date.now();
    for (const run of d.runs) {
      if (!run.started_at) continue;
      const y = lanes.indexOf(run.id);
      const end = run.finished_at ? hoursFrom(origin, run.finished_at) : (now - origin) / HOUR_MS;
      out.push({ run, after: false, width: 3, xs: [hoursFrom(origin, run.started_at), end], ys: [y, y], steps: [null, null], hi: null, lo: null });
    }
    // Equal x values within one table would collapse a bar to a point: keep the order, nudge the end.
    for (const t of out) if (!(t.xs[1] > t.xs[0])) t.xs[1] = t.xs[0] + 1e-6;
    return out;
  }

  function render(d, container, section) {
    container.replaceChildren();
    section.querySelectorAll(".plan-gpus").forEach((p) => p.remove());
    section.hidden = !d.plan;
    if (!d.plan) return null;
    const plan = d.plan;
    const lanes = d.runs.map((r) => r.label || r.arm);
    const note = `night ${fmt(plan.night_h, 2)} h; lower bound ${fmt(plan.lower_bound_h, 2)} h` +
      (plan.drawn_at ? ` · redrawn ${new Date(parseUtc(plan.drawn_at)).toLocaleTimeString()}` : " · as submitted") +
      ` · costs ${Array.from(new Set(Object.values(plan.sources))).join(", ")}`;
    section.querySelector(".hint").textContent =
      "dashed: the plan (each run's GPUs and slot); solid: the run as it went; hours from the plan's origin";
    const chart = chartCard(container, {
      key: "plan", axis: "plan", title: "Night plan", note, xLabel: "hours", yLabel: "run", tables: tables(d),
      afterWord: "planned", fmtY: (v) => (Number.isInteger(v) && v >= 0 && v < lanes.length ? lanes[v] : ""),
      yRange: () => [-0.5, lanes.length - 0.5],
    });
    const gpus = el("p", { class: "hint plan-gpus" },
      plan.slots.map((s) => `${s.run}: ${s.gpus} GPU${s.gpus > 1 ? "s" : ""} on ${s.node}`).join(" · "));
    section.append(gpus);
    return chart;
  }

  return { render };
};
