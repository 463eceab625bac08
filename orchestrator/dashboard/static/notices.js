// The grid page's first lines: each detector stop on a line of its own (decision, step, reason, the
// checkpoint kept), then every warning grouped: one line per distinct message naming the arms it applies
// to, its per-arm details one click away (<details>). grid.js calls it with the page's data and its
// chart kit (charts.js).
"use strict";

window.AblateNotices = function (kit) {
  const { el, colour, fmt, pct, stopped, fallbackText, vocab, judgeTitle } = kit;
  // Where real LPIPS weights come from (model/perceptual.py, orchestrator/cli/demo.py).
  const WEIGHTS_HOW = "for real LPIPS set ABLATE_LPIPS_WEIGHTS=alexnet.pth (AlexNet's weights) or run once online (torchvision caches them)";

  // A stand-in's fallback line is what the stand-in notice already says: read there, not twice.
  const isLpipsFallback = (r, f) => r.standin_steps.length > 0 && fallbackText(f).startsWith("lpips backbone:");

  function stopLine(r) {
    return el("div", { class: "banner stop", "data-arm": r.arm, style: `--c:${colour(r)}` },
      el("strong", {}, `${r.arm} stopped at step ${r.decision_step} (${r.decision}). `),
      el("span", { class: "why" }, r.decision_reason ? `${r.decision_reason.replace(/\.$/, "")}.` : ""),
      r.best_step !== null
        ? el("span", { class: "kept", title: r.best_checkpoint || "" },
          ` Best checkpoint kept: step ${r.best_step}, ${judgeTitle(r)} ${fmt(r.best_value, 4)}`,
          r.best_checkpoint ? el("code", {}, ` ${r.best_checkpoint}`) : null, ".")
        : null);
  }

  // Every warning of every arm as {kind, key, title, message, arm, detail}: grouped by (kind, key).
  function warningsOf(d) {
    const out = [];
    for (const r of d.runs) {
      if (r.standin_steps.length) {
        const judge = r.judge_metric === "val_flow_ivw"
          ? "the detector judges the held-out flow loss (val_flow_ivw)" : `the detector still judges ${judgeTitle(r)}`;
        out.push({ kind: "standin", key: r.judge_metric, title: "Stand-in LPIPS",
          message: `no LPIPS weights here (set ABLATE_LPIPS_WEIGHTS=alexnet.pth or run once online); ${judge}.`,
          arm: r.arm, detail: `${r.standin_steps.length} checkpoint(s) scored with the random (untrained) LPIPS backbone, which cannot tell arms apart.` });
      }
      for (const f of r.fallbacks) {
        if (isLpipsFallback(r, f)) continue;
        const text = fallbackText(f);
        out.push({ kind: "fallback", key: text, title: "Fallback", message: text, arm: r.arm, detail: text });
      }
      if (r.storage && r.storage.alarm) {
        const st = r.storage;
        out.push({ kind: "storage failed", key: "storage", title: "Checkpoints not stored",
          message: "newer checkpoints have not reached checkpoint storage; a lost node would lose what came after.", arm: r.arm,
          detail: `checkpoints not stored for ${fmt(st.minutes_unstored, 0)} min. ` +
            (st.stored_step !== null ? `Newest checkpoint in storage: step ${st.stored_step}. ` : "No checkpoint in storage yet. ") +
            (st.failed_attempts ? `${st.failed_attempts} failed upload(s); last: ${st.last_error}. ` : "") + `(${st.url})` });
      }
      // The GPU waiting for batches (orchestrator/results/data_feed.py decides and words the fix).
      if (r.data.waiting) {
        out.push({ kind: "data-wait", key: r.data.fix, title: "Waiting for data", message: `Fix: ${r.data.fix}.`, arm: r.arm,
          detail: `waits for data ${pct(r.data.wait_fraction)} of its time.` });
      }
      // An evaluation job skipped (a diverged run's checkpoint measures NaN): the run was not measured.
      for (const j of r.evaluations_skipped || []) {
        out.push({ kind: "evaluation-skipped", key: String(j.evaluation), title: `Evaluation ${j.evaluation} skipped`,
          message: `not measured on its ${j.images} images at step ${j.step}; the effects use the arm's own records.`,
          arm: r.arm, detail: j.reason });
      }
      if (r.state === vocab.run_state.failed && r.error) {
        const first = r.error.split("\n")[0];
        out.push({ kind: "failed", key: first, title: "Failed", message: first, arm: r.arm, detail: r.error });
      }
    }
    return out;
  }

  function group(warnings) {
    const groups = new Map();
    for (const w of warnings) {
      const id = `${w.kind}\u0000${w.key}`;
      if (!groups.has(id)) groups.set(id, { ...w, arms: [], details: [] });
      const g = groups.get(id);
      if (!g.arms.includes(w.arm)) g.arms.push(w.arm);
      g.details.push([w.arm, w.detail]);
    }
    return Array.from(groups.values());
  }

  function warningLine(g) {
    return el("details", { class: `notice ${g.kind}`, "data-kind": g.kind.split(" ")[0], "data-arms": g.arms.join(","), "data-key": `${g.kind}|${g.key}` },
      el("summary", { title: g.message }, el("strong", {}, `${g.title} (${g.arms.join(", ")}): `), g.message),
      el("ul", {}, g.details.map(([arm, text]) => el("li", { "data-arm": arm }, el("strong", {}, `${arm}: `), text))));
  }

  function render(d, box) {
    // A live grid redraws on each new checkpoint: the lines the reader opened stay open.
    const opened = new Set(Array.from(box.querySelectorAll("details[open]"), (x) => x.dataset.key));
    box.replaceChildren();
    for (const r of d.runs) if (stopped(r)) box.append(stopLine(r));
    for (const g of group(warningsOf(d))) {
      const line = warningLine(g);
      line.open = opened.has(line.dataset.key);
      box.append(line);
    }
    // Stored records whose per-sample or per-timestep lists are not in the protocol's shape: named, left out.
    if (d.unreadable_records && d.unreadable_records.length) {
      box.append(el("details", { class: "notice failed unreadable", "data-kind": "unreadable", "data-key": "unreadable", open: opened.has("unreadable") },
        el("summary", {}, el("strong", {}, "Records left out of the curves and effects: "), `${d.unreadable_records.length} record(s)`),
        el("ul", {}, d.unreadable_records.map((t) => el("li", {}, t)))));
    }
  }

  return { render, isLpipsFallback, WEIGHTS_HOW };
};
