// The grid page's effects table: each arm against its parent and the control across the grid's training
// seeds. The judged metric's rows lead (the first screen shows them), the other real metrics follow, and
// the stand-in rows, which can carry no verdict, are folded under a line that says why (LPIPS apart from the
// distribution metrics, whose weights `ablate weights fetch` stages). One
// column list (COLUMNS) draws the header and every row of both tables: a new column is one entry.
"use strict";

window.AblateEffects = function (kit) {
  const { el, fmt, signed, WEIGHTS_HOW } = kit;

  const COLUMNS = [
    { key: "arm", title: "arm", cell: (e) => e.arm },
    { key: "metric", title: "metric", cell: (e) => e.words },
    { key: "vs", title: "vs", cell: (e) => `${e.against} ${e.other_arm}` },
    { key: "difference", title: "difference [95% CI]", num: true, cell: (e) =>
      `${signed(e.diff)}${e.low !== null && e.high !== null ? ` [${signed(e.low)}, ${signed(e.high)}]` : ""}` },
    { key: "reading", title: "reading", cls: (e) => `reading ${reading(e).split(":")[0].replace(/ /g, "-")}`, cell: reading },
    { key: "seeds", title: "seeds", num: true, cell: (e) => e.k },
    { key: "spread", title: "spread", num: true, cell: (e) =>
      (e.seed_sd !== null ? `seed SD ${fmt(e.seed_sd, 4)}` : (e.eval_se !== null ? `eval SE ${fmt(e.eval_se, 4)}` : "—")) },
    { key: "covers", title: "interval covers", cell: (e) => e.noise },
    // The noise budget: where the variance is, and what narrows it most for its cost.
    { key: "budget", title: "noise budget", cell: (e) => (e.budget ? e.budget.words : "—") },  // one seed: the reading says so
    { key: "narrow", title: "to narrow it", cell: (e) => (e.budget ? e.budget.narrowing.map((o) => o.words).join("; ") : "—") },
    // A deciding grid only (decide.js): the decision, its look, the alpha spent, k and n; then why.
    { key: "decision", title: "decision", when: (d) => Boolean(d.decide), cls: (e) => `decision ${e.decision || ""}`,
      cell: (e) => window.AblateDecide.words(e) },
    { key: "why", title: "why", when: (d) => Boolean(d.decide), cell: (e) => window.AblateDecide.why(e) },
  ];

  // As orchestrator/results/reports/effects.py reading_words: a deciding grid's undecided metric is descriptive.
  function reading(e) {
    if (e.standin) return "stand-in";
    return e.descriptive ? `descriptive: ${e.reading}` : e.reading;
  }

  function head(table, columns) {
    table.querySelector("thead").replaceChildren(el("tr", {}, columns.map((c) => el("th", { class: c.num ? "num" : c.key, "data-col": c.key }, c.title))));
  }

  function row(e, judge, columns) {
    return el("tr", { "data-arm": e.arm, "data-metric": e.metric, "data-k": e.k, class: e.metric === judge ? "judged" : null },
      columns.map((c) => {
        const text = String(c.cell(e));
        return el("td", { class: [c.num ? "num" : null, c.cls ? c.cls(e) : c.key].filter(Boolean).join(" "), title: text }, text);
      }));
  }

  // An evaluation that measured no LPIPS metric (a deciding grid's look on the flow loss): null is every one.
  function flowOnly(measures) {
    return Array.isArray(measures) && !measures.some((m) => ["recon_lpips", "text_lpips", "text_manip_delta"].includes(m));
  }

  function render(d) {
    // A run whose job of that evaluation was skipped (a diverged run's) is not on it: named, its own records stand.
    const skipped = d.evaluation ? d.runs.filter((r) => (r.evaluations_skipped || []).some((j) => j.evaluation === d.evaluation.id)).map((r) => r.label) : [];
    const evaluated = d.evaluation
      ? ` · on evaluation ${d.evaluation.id}: each run's ${d.evaluation.step} checkpoint on ${d.evaluation.images} held-out images` +
        (flowOnly(d.evaluation.measures) ? " (the flow loss alone, the metric the grid decides on: its LPIPS metrics are the training-time evaluation's)" : "") +
        (d.evaluation.in_training ? ` (${d.evaluation.in_training} of its runs scored inside their training jobs, with no evaluation start)` : "") +
        (skipped.length ? ` (skipped: ${skipped.join(", ")}, on its own records)` : "")
      : "";
    document.getElementById("effects-seeds").textContent = (d.seeds > 1
      ? `${d.seeds} training seeds per arm: mean of the per-seed paired differences; the interval covers what its row says (crossed: seeds and images)`
      : "one training seed per arm: intervals cover evaluation noise only (submit with seeds: 3 to measure training noise)") + evaluated;
    const judge = document.getElementById("effects-judge");
    judge.textContent = d.judge ? `judged: ${d.effects.find((e) => e.metric === d.judge)?.words || d.judge}` : "";
    const main = document.getElementById("effects");
    const columns = COLUMNS.filter((c) => !c.when || c.when(d));
    head(main, columns);
    // A deciding grid's decided metrics lead (shown even where a stand-in scored them: the decision is on
    // them), then the judged metric, then the others in the order the server gives them.
    const decided = d.decide ? d.effects.filter((e) => d.decide.metrics.includes(e.metric)) : [];
    const rest = d.effects.filter((e) => !decided.includes(e));
    const real = rest.filter((e) => !e.standin);
    const ordered = [...decided, ...real.filter((e) => e.metric === d.judge), ...real.filter((e) => e.metric !== d.judge)];
    main.querySelector("tbody").replaceChildren(...ordered.map((e) => row(e, d.judge, columns)));
    // Stand-in rows carry no verdict: folded, LPIPS's apart from the distribution metrics' (an extractor
    // label), each under a line that says how to get the real weights.
    const folds = [
      ["effects-standin", rest.filter((e) => e.standin && !e.extractor),
        (n) => `${n} stand-in LPIPS row(s) folded: scored with a random LPIPS backbone (no real weights here), they can carry no verdict; ${WEIGHTS_HOW}.`],
      ["effects-standin-distribution", rest.filter((e) => e.standin && e.extractor),
        (n) => `${n} stand-in distribution row(s) (CMMD, DINO-MMD, FD-DINOv2) folded: scored with a random stand-in extractor (no pinned weights on the nodes), they can carry no verdict; stage the weights with \`ablate weights fetch\`.`],
    ];
    for (const [id, rows, words] of folds) {
      const folded = document.getElementById(id);
      head(folded.querySelector("table"), columns);
      folded.querySelector("tbody").replaceChildren(...rows.map((e) => row(e, d.judge, columns)));
      folded.hidden = rows.length === 0;
      folded.querySelector("summary").textContent = words(rows.length);
    }
    main.hidden = ordered.length === 0;
    document.getElementById("effects-empty").hidden = d.effects.length > 0;
    window.AblateDecide.render(d, el);  // a deciding grid: what is still open and what runs for it
  }

  return { render, COLUMNS };
};
