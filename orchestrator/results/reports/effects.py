"""The report's lead: the effects table (one row per arm and metric: the difference against the parent
and against the control at the final checkpoint, across the grid's training seeds, its 95% interval,
the seeds it covers and what that interval can tell) and one forest plot per comparator (inline SVG, no
script); its appendix: each seed's own interval and val_flow_loss's effect at each timestep.

An effect over k seeds is the mean of the per-seed paired differences (seed s of the arm against seed s
of the comparator, same held-out images and noise). Its interval covers the training seeds and the
evaluation images together where every seed pairs image by image (crossed.py: the seeds x images table's
variance components), and each such row carries its noise budget: the shares of seeds, images and the
rest, and what one more seed per arm or four times the images would narrow it to, at the runs' own
measured cost. One seed measures one draw of the effect: its interval covers evaluation noise only, so it
is never read "distinguishable" (Bouthillier et al. 2021, "Accounting for variance in machine learning
benchmarks"; Miller 2024, "Adding error bars to evals").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from html import escape

from orchestrator.numbers import readable
from orchestrator.results.reports.costs import RunCost
from orchestrator.results.reports.crossed import Components, budget_words
from orchestrator.results.reports.model import (
    STANDIN_VERDICT,
    Comparison,
    Effect,
    EffectReading,
    GridReport,
    Narrowing,
    NoiseBudget,
    SeedDiff,
    TimestepEffect,
)
from orchestrator.results.reports.stats import WEIGHTED_FLOW, Difference, SeedEffect, across_seeds, t_quantile

METRIC_WORDS = {WEIGHTED_FLOW: "held-out flow loss (weighted headline)",
                "val_flow_loss": "held-out flow loss (plain mean)",
                "recon_lpips": "recon LPIPS", "text_lpips": "text LPIPS",
                "text_manip_delta": "text-manipulation delta",
                "cmmd": "CMMD", "dino_mmd": "DINO-MMD", "fd_dinov2": "FD-DINOv2"}  # fmt: skip
LPIPS_METRICS = ("recon_lpips", "text_lpips", "text_manip_delta")


def metric_words(metric: str) -> str:
    """A metric in words; a command arm's own metric by its script's name."""
    return METRIC_WORDS.get(metric, metric)
AT = "final"  # the arm's final checkpoint, the other arm at the same step
COMPARATORS = ("parent", "control")
ONE_SEED: EffectReading = "one seed: training noise not measured"


def effect_reading(k: int, low: float | None, high: float | None) -> EffectReading:
    """What an effect's interval can say: with one seed nothing beyond "training noise not measured"."""
    if low is None or high is None:
        return "no interval"
    if k < 2:
        return ONE_SEED
    return "within noise" if low <= 0 <= high else "distinguishable across seeds"


def noise_words(e: SeedEffect) -> str:
    """What the interval covers, row by row (the table's "interval covers")."""
    df = f"t on {e.df:.1f} df" if e.df is not None else "normal"
    if e.interval == "crossed":
        refs = e.components.references if e.components is not None else 0
        ref = f", and the reference images (R={refs})" if refs else ""
        return f"training seeds (k={e.k}) and evaluation images (n={e.n}), crossed{ref}; {df}"
    if e.interval == "independent":
        return (f"training seeds (k={e.k}) and evaluation images, independent SEs (no per-image values paired "
                f"on every seed): conservative; {df}")  # fmt: skip
    if e.interval == "seeds only":
        return f"training seeds only (k={e.k}, {df}): the evaluation images' noise is not measured"
    return "evaluation images and noise only (one training seed)"


FOUR_X = 4  # the images option: evaluate on this many times the images


def _mean(values: Iterable[float | None]) -> float | None:
    kept = [v for v in values if v is not None]
    return sum(kept) / len(kept) if kept else None


def noise_budget(comp: Components, df: float | None, arms: Sequence[RunCost]) -> NoiseBudget:
    """The shares of a crossed effect's variance, and the two ways to narrow it with their projected
    half-widths (t on today's df) and costs: +1 seed per arm (one run of each side) or an evaluation of
    every seed's runs on 4x the images (priced per image from the runs' own evaluation passes)."""
    seed, image, rest = comp.shares()
    q = t_quantile(df)
    on_gpu = all(c.on_gpu for c in arms)
    where = "GPU" if on_gpu else "CPU"
    per_run_hours = _mean(c.hours for c in arms)
    seed_cost = 2 * per_run_hours if per_run_hours is not None else None  # one more run of each arm
    per_image_min = _mean(c.eval_minutes / c.n if c.eval_minutes is not None and c.n else None for c in arms)
    images_cost = (per_image_min * FOUR_X * comp.n * 2 * comp.k) if per_image_min is not None else None
    seed_half = q * math.sqrt(comp.variance(k=comp.k + 1))
    images_half = q * math.sqrt(comp.variance(n=FOUR_X * comp.n))

    def cost(value: float | None, unit: str) -> str:
        return f"about {value:.2g} {where}-{unit}" if value is not None else f"{where}-{unit} not measured"

    options = [
        Narrowing(action="seed", half_width=seed_half, cost=seed_cost, unit=f"{where}-h",
                  words=f"+1 seed per arm: ±{seed_half:.4f}, {cost(seed_cost, 'h')}"),
        Narrowing(action="images", half_width=images_half, cost=images_cost, unit=f"{where}-min",
                  words=f"evaluate on {FOUR_X}x the images ({FOUR_X * comp.n}): ±{images_half:.4f}, "
                        f"{cost(images_cost, 'min')}"),
    ]  # fmt: skip
    return NoiseBudget(seeds=seed, images=image, rest=rest, words=budget_words(comp), narrowing=options,
                       seeds_priced=comp.priced_share(), reference=comp.reference_share())


def metric_order(judge: str) -> list[str]:
    """The judged metric first; where it is the flow loss, its weighted headline leads and the plain mean
    (the detector's per-run value) follows; LPIPS last."""
    order = [judge] + [m for m in METRIC_WORDS if m != judge]
    if judge == "val_flow_loss":
        order.remove(WEIGHTED_FLOW)
        order.insert(0, WEIGHTED_FLOW)
    return order


@dataclass(frozen=True)
class RunComparisons:
    """What grid_effects reads of a run (an ArmReport has the same fields)."""

    arm: str
    seed: int
    comparisons: list[Comparison]
    standin_steps: list[int]


def grid_effects(arms: Sequence[RunComparisons], judge: str,
                 costs: Mapping[tuple[str, int], RunCost] | None = None) -> list[Effect]:  # fmt: skip
    """The effects across seeds, from each run's per-seed comparisons at its final checkpoint; `costs`,
    by (arm, seed), price the noise budget's options."""
    costs = costs or {}
    groups: dict[tuple[str, str, str], list[tuple[RunComparisons, int]]] = {}
    for a in arms:
        for i, c in enumerate(a.comparisons):
            if c.at == AT and c.diff is not None:
                groups.setdefault((a.arm, c.metric, c.against), []).append((a, i))
    order = metric_order(judge)
    order += list(dict.fromkeys(metric for _, metric, _ in groups if metric not in order))  # a command arm's own
    effects = []
    arm_order = list(dict.fromkeys(a.arm for a in arms))
    for arm in arm_order:
        for metric in order:
            for against in COMPARATORS:
                found = sorted(groups.get((arm, metric, against), []), key=lambda x: x[0].seed)
                if not found:
                    continue
                comps = [(a.seed, a.comparisons[i], a) for a, i in found]
                diffs = [Difference(c.diff, c.se, c.low, c.high, c.pairing or "independent", c.n,  # type: ignore[arg-type]
                                    samples=tuple(c.samples) if c.samples is not None else None,
                                    reference=tuple(c.reference) if c.reference is not None else None)
                         for _, c, _ in comps]  # fmt: skip
                seff = across_seeds(diffs)
                if seff is None:
                    continue
                first = comps[0][1]
                standin = metric in LPIPS_METRICS and any(c.step in a.standin_steps for _, c, a in comps)
                extractor = next((c.extractor for _, c, _ in comps if c.verdict == STANDIN_VERDICT), first.extractor)
                standin = standin or any(c.verdict == STANDIN_VERDICT for _, c, _ in comps)
                budget = None
                if seff.components is not None:
                    sides = [costs[key] for s, c, _ in comps for key in ((arm, s), (c.other_arm, s)) if key in costs]
                    budget = noise_budget(seff.components, seff.df, sides)
                effects.append(Effect(
                    arm=arm, metric=metric, against=against, other_arm=first.other_arm, step=first.step,
                    diff=seff.diff, low=seff.low, high=seff.high, k=seff.k, seed_sd=seff.seed_sd,
                    eval_se=seff.eval_se, noise=noise_words(seff), interval=seff.interval, se=seff.se, df=seff.df,
                    n=seff.n, budget=budget, reading=effect_reading(seff.k, seff.low, seff.high), standin=standin,
                    extractor=extractor,
                    per_seed=[SeedDiff(seed=s, diff=c.diff, low=c.low, high=c.high, n=c.n)  # type: ignore[arg-type]
                              for s, c, _ in comps],
                ))  # fmt: skip
    return effects


def _signed(v: float | None, digits: int = 4) -> str:
    return "-" if v is None else f"{v:+.{digits}f}"


def effect_cell(e: Effect) -> str:
    interval = f" [{_signed(e.low)}, {_signed(e.high)}]" if e.low is not None and e.high is not None else ""
    return f"{e.other_arm}: {_signed(e.diff)}{interval}"


def _metric_label(e: Effect) -> str:
    if e.extractor is not None:  # a distribution metric names its extractor; a stand-in's is descriptive
        return f"{metric_words(e.metric)} ({e.extractor}{': ' + STANDIN_VERDICT if e.standin else ''})"
    return metric_words(e.metric) + (" (random stand-in: no verdict)" if e.standin else "")


def _spread(e: Effect) -> str:
    if e.seed_sd is None:
        return f"eval SE {e.eval_se:.4f}" if e.eval_se is not None else "-"
    ev = f" vs eval SE {e.eval_se:.4f}" if e.eval_se is not None else ""
    return f"seed SD {e.seed_sd:.4f}{ev}"


HEADER = ("arm", "metric", "vs", "step", "difference [95% CI]", "reading", "seeds", "n", "spread", "interval covers",
          "noise budget", "to narrow it")  # fmt: skip


def budget_cells(e: Effect) -> tuple[str, str]:
    """The noise budget's shares and its options, as two cells ("-" where the interval is not crossed)."""
    if e.budget is None:  # one seed: the reading and "interval covers" already say so, once is enough
        return "-", "-"
    return e.budget.words, "; ".join(o.words for o in e.budget.narrowing)


def _n(e: Effect) -> str:
    return "/".join(str(n) for n in sorted({s.n for s in e.per_seed if s.n})) or "-"


def decision_words(e: Effect) -> str:
    """A deciding grid's decision on this effect, the look's repeated interval it rests on, and why, e.g.
    "better (look 2, alpha spent 0.0123, k=3, n=256; repeated CI [-0.031, -0.0042]): the interval excludes
    zero at look 2"; "-" where the grid does not decide this metric. The interval is said because the row's
    own (its seeds' fixed-sample interval, without a borrowed seed variance) may include zero beside a call."""
    if e.decision is None:
        return "-"
    spent = f", alpha spent {readable(e.alpha_spent)}" if e.alpha_spent is not None else ""
    ci = ""
    if e.decision_low is not None and e.decision_high is not None:
        ci = f"; repeated CI [{e.decision_low:+.4g}, {e.decision_high:+.4g}]"
    why = f": {e.decision_reason}" if e.decision_reason else ""
    return f"{e.decision} (look {e.look}{spent}, k={e.k}, n={e.n or '-'}{ci}){why}"


def header(effects: list[Effect]) -> tuple[str, ...]:
    """The table's columns: a deciding grid's table has its decisions last."""
    return (*HEADER, "decision") if any(e.decision is not None for e in effects) else HEADER


def reading_words(e: Effect) -> str:
    """The reading cell: "stand-in" where a stand-in scored it; a deciding grid's undecided metric's reading
    marked "descriptive: ..." (no call at the grid's error rate)."""
    if e.standin:
        return "stand-in"
    return f"descriptive: {e.reading}" if e.descriptive else e.reading


def _rows(effects: list[Effect]) -> list[list[str]]:
    decides = any(e.decision is not None for e in effects)
    return [[e.arm, _metric_label(e), e.against, str(e.step), effect_cell(e), reading_words(e), str(e.k), _n(e),
             _spread(e), e.noise, *budget_cells(e),
             *([decision_words(e)] if decides else [])]
            for e in effects]  # fmt: skip


NO_EFFECTS = "No arm has a metric measured on it and on its parent or the control yet."


def effects_markdown(report: GridReport) -> list[str]:
    if not report.effects:
        return [NO_EFFECTS]
    columns = header(report.effects)
    out = ["| " + " | ".join(columns) + " |", "|---" * len(columns) + "|"]
    out += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in _rows(report.effects)]
    return out


def effects_html(report: GridReport) -> str:
    if not report.effects:
        return f"<p class=muted>{NO_EFFECTS}</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in header(report.effects))
    body = []
    for e, cells in zip(report.effects, _rows(report.effects), strict=True):
        reading = cells[5]
        cells = [escape(x) for x in cells]
        cells[5] = f'<span class="{escape(reading.split(":")[0].replace(" ", "-"))}">{escape(reading)}</span>'
        body.append(f'<tr data-metric="{escape(e.metric)}" data-k="{e.k}">' + "".join(f"<td>{x}</td>" for x in cells)
                    + "</tr>")  # fmt: skip
    return f'<table class=effects><tr>{head}</tr>{"".join(body)}</table>'


def seeds_words(report: GridReport) -> str:
    """The sentence under the table: what its intervals cover."""
    if report.seeds < 2:
        return ("One training seed per arm: each interval covers evaluation noise only, and retraining with "
                "another seed can move an effect by more than that interval, so no difference here is read "
                "as distinguishable. Submit the grid with `seeds: 3` (or more) to measure training noise.")  # fmt: skip
    return (f"{report.seeds} training seeds per arm on one held-out split: each difference is the mean of the "
            "per-seed paired differences. Where every seed is paired image by image, its 95% interval covers the "
            "training seeds and the evaluation images together (a seeds x images crossed interval: the held-out "
            "images are a sample of the images the arms will meet, so which ones were drawn is noise too); the "
            "column \"interval covers\" says what each row's covers. The noise budget says which noise "
            "dominates and what narrows it: more images cost an evaluation pass (POST "
            ".../evaluations, `ablate evaluate`), a seed a training run. Distinguishable across seeds: that "
            "interval excludes zero.")


def per_seed_markdown(report: GridReport) -> list[str]:
    """The appendix: each seed's own paired interval (evaluation noise only)."""
    rows = [e for e in report.effects if e.k > 1]
    if not rows:
        return []
    out = ["| arm | metric | vs | seed | difference [95% CI, evaluation only] | n |", "|---" * 6 + "|"]
    for e in rows:
        for s in e.per_seed:
            interval = f" [{_signed(s.low)}, {_signed(s.high)}]" if s.low is not None else ""
            out.append(f"| {e.arm} | {metric_words(e.metric)} | {e.other_arm} | {s.seed} | {_signed(s.diff)}{interval} "
                       f"| {s.n or '-'} |")  # fmt: skip
    return out


def timestep_markdown(effects: list[TimestepEffect]) -> list[str]:
    """The appendix: val_flow_loss's effect at each timestep (ratio of means; * where its interval excludes 0)."""
    if not effects:
        return []
    ts = effects[0].t
    out = ["| arm | vs | seeds | " + " | ".join(f"t={t:.3f}" for t in ts) + " |", "|---" * (3 + len(ts)) + "|"]
    for e in effects:
        cells = []
        for r, lo, hi in zip(e.ratio, e.low, e.high, strict=True):
            mark = "*" if lo is not None and hi is not None and not lo <= 0 <= hi else ""
            cells.append("-" if r is None else f"{r:.3f}{mark}")
        out.append(f"| {e.arm} | {e.other_arm} | {e.k} | " + " | ".join(cells) + " |")
    return out


def forest_svg(report: GridReport, metric: str, against: str, width: int = 720, row_h: int = 22) -> str:
    """Each arm against its `against` (parent or control) on `metric` at the final checkpoint, across seeds:
    the difference as a dot, its 95% interval as a bar (hollow dot: one seed, evaluation noise only), zero
    as a line. One plot per comparator, titled by what its rows are."""
    items = [e for e in report.effects if e.metric == metric and e.against == against]
    if not items:
        return ""
    values = [0.0] + [v for e in items for v in (e.diff, e.low, e.high) if v is not None]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    lo, hi = lo - 0.05 * span, hi + 0.05 * span
    left, right, top = 160, 24, 30
    height = top + row_h * len(items) + 34

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - right)

    who = "arm − its parent" if against == "parent" else f"arm − control ({report.control})"
    seeds = f"{report.seeds} seeds" if report.seeds > 1 else "one seed (evaluation noise only)"
    title = f"{metric_words(metric)}: {who} at the final checkpoint, 95% interval, {seeds}"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class=forest data-metric="{escape(metric)}" '
             f'data-against="{against}" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
             f'aria-label="{escape(title)}">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="8" y="16" font-size="12">{escape(title)}</text>',
             f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top - 6}" y2="{height - 28}" stroke="#888"/>',
             f'<text x="{x(0):.1f}" y="{height - 14}" font-size="10" text-anchor="middle">0</text>',
             f'<text x="{left}" y="{height - 2}" font-size="10">{lo:+.4f}</text>',
             f'<text x="{width - right}" y="{height - 2}" font-size="10" '
             f'text-anchor="end">{hi:+.4f}</text>']  # fmt: skip
    for i, e in enumerate(items):
        y = top + row_h * i + row_h / 2
        label = f"{e.arm} vs {e.other_arm} (k={e.k})"
        parts.append(f'<text x="8" y="{y + 4:.1f}" font-size="11">{escape(label)}</text>')
        if e.low is not None and e.high is not None:
            parts.append(f'<line x1="{x(e.low):.1f}" x2="{x(e.high):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                         f'stroke="#1f77b4" stroke-width="2"/>')  # fmt: skip
        tip = f"{label}: {effect_cell(e)}, {e.reading}"
        fill = "#1f77b4" if e.k > 1 else "white"
        parts.append(f'<circle cx="{x(e.diff):.1f}" cy="{y:.1f}" r="4" fill="{fill}" stroke="#1f77b4">'
                     f"<title>{escape(tip)}</title></circle>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def forest_plots(report: GridReport) -> list[str]:
    """Every forest plot of the report: per metric in the table's order, one per comparator."""
    order = metric_order(report.judge)
    order += list(dict.fromkeys(e.metric for e in report.effects if e.metric not in order))
    return [svg for m in order for against in COMPARATORS if (svg := forest_svg(report, m, against))]
