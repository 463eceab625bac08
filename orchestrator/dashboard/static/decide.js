// A deciding grid on the grid page (results/deciding/decisions.py): the effects table's decision words (each
// decided comparison's decision, its look, the alpha spent, k and n) and why (the look's reason), and a panel
// of the comparisons still open with what is being run for each, under the error rate the grid holds.
// effects.js calls them, with the page's data and its element helper.
"use strict";

// A small probability as orchestrator/numbers.py readable() writes it: "0.0123", and below 0.0001 "8.03 × 10⁻⁸".
function readable(value) {
  if (value === 0 || !Number.isFinite(value) || Math.abs(value) >= 1e-4) return String(Number(value.toPrecision(4)));
  const [mantissa, exponent] = value.toExponential(2).split("e");
  const sup = { "-": "⁻", 0: "⁰", 1: "¹", 2: "²", 3: "³", 4: "⁴", 5: "⁵", 6: "⁶", 7: "⁷", 8: "⁸", 9: "⁹" };
  return `${mantissa.replace(/\.?0+$/, "")} × 10${String(Number(exponent)).replace(/./g, (c) => sup[c])}`;
}

window.AblateDecide = {
  // The effect's decision words: "better · look 2 · α spent 0.0123 · k=3 n=256 · repeated CI [-0.031, -0.0042]",
  // or "—" off the decided metrics. The look's interval is the one the decision rests on; the row's own interval
  // (its seeds' fixed-sample one, without a borrowed seed variance) may read otherwise.
  words(e) {
    if (!e.decision) return "—";
    const signed = (x) => (x >= 0 ? "+" : "") + Number(x.toPrecision(4));
    const ci = e.decision_low != null && e.decision_high != null
      ? ` · repeated CI [${signed(e.decision_low)}, ${signed(e.decision_high)}]` : "";
    return `${e.decision} · look ${e.look} · α spent ${readable(Number(e.alpha_spent))} · k=${e.k} n=${e.n ?? "—"}${ci}`;
  },

  // Why the look decided so: "the interval lies inside +-0.01", "futile: conditional power 0.04 at the budget".
  why(e) {
    return e.decision ? e.decision_reason || "—" : "—";
  },

  render(d, el) {
    const panel = document.getElementById("deciding");
    panel.hidden = !d.decide;
    if (!d.decide) return;
    const s = d.decide;
    const where = s.final ? "decision ended" : `${s.open.length} open`;
    panel.querySelector(".hint").textContent =
      `${s.rate} at every look · ${s.looks} look(s) · ${s.decided} decided · ${s.undecided} undecided · ${where} · ${s.spend}`;
    const list = panel.querySelector(".open-comparisons");
    list.replaceChildren(...s.open.map((o) => el("li", { "data-look": o.look }, `${o.comparison}: look ${o.look}, running ${o.running}`)));
  },
};
