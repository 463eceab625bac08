"""The report's lead: the effects table (one row per arm and metric: the difference against the parent
and against the control at the arm's final checkpoint, its 95% interval, n, and whether the interval
excludes zero) and a forest plot per metric (inline SVG, no script)."""

from __future__ import annotations

from dataclasses import dataclass
from html import escape

from orchestrator.runs.reports.model import ArmReport, Comparison

METRIC_WORDS = {"recon_lpips": "recon LPIPS", "text_lpips": "text LPIPS", "text_manip_delta": "text-manipulation delta",
                "val_flow_loss": "held-out flow loss"}  # fmt: skip
AT = "final"  # the arm's final checkpoint, the other arm at the same step


@dataclass(frozen=True)
class EffectRow:
    arm: str
    metric: str
    parent: Comparison | None
    control: Comparison | None


def effect_rows(arms: list[ArmReport]) -> list[EffectRow]:
    """Rows for the metrics measured on an arm and at least one of the arms it is compared with."""
    rows = []
    for a in arms:
        for metric in METRIC_WORDS:
            found = {c.against: c for c in a.comparisons if c.metric == metric and c.at == AT and c.diff is not None}
            if found:
                rows.append(EffectRow(a.arm, metric, found.get("parent"), found.get("control")))
    return rows


def reading(c: Comparison | None) -> str:
    """distinguishable (the 95% interval excludes zero) | within noise | no interval (nothing stored to
    build one from) | "" (no such comparison)."""
    if c is None:
        return ""
    if c.low is None or c.high is None:
        return "no interval"
    return "within noise" if c.low <= 0 <= c.high else "distinguishable"


def cell(c: Comparison | None) -> str:
    if c is None:
        return "-"
    interval = f" [{c.low:+.4f}, {c.high:+.4f}]" if c.low is not None and c.high is not None else ""
    return f"{c.other_arm}: {c.diff:+.4f}{interval}"  # type: ignore[operator]


def n_of(row: EffectRow) -> str:
    ns = {c.n for c in (row.parent, row.control) if c is not None and c.n}
    return "/".join(str(n) for n in sorted(ns)) or "-"


HEADER = ("arm", "metric", "step", "vs parent [95% CI]", "reading", "vs control [95% CI]", "reading", "n")


def effects_markdown(arms: list[ArmReport]) -> list[str]:
    rows = effect_rows(arms)
    if not rows:
        return ["No arm has a metric measured on it and on its parent or the control yet."]
    out = ["| " + " | ".join(HEADER) + " |", "|---" * len(HEADER) + "|"]
    for r in rows:
        step = (r.parent or r.control).step  # type: ignore[union-attr]
        out.append(f"| {r.arm} | {METRIC_WORDS[r.metric]} | {step} | {cell(r.parent)} | {reading(r.parent)} | "
                   f"{cell(r.control)} | {reading(r.control)} | {n_of(r)} |")  # fmt: skip
    return out


def effects_html(arms: list[ArmReport]) -> str:
    rows = effect_rows(arms)
    if not rows:
        return "<p class=muted>No arm has a metric measured on it and on its parent or the control yet.</p>"
    head = "".join(f"<th>{escape(h)}</th>" for h in HEADER)
    body = []
    for r in rows:
        step = (r.parent or r.control).step  # type: ignore[union-attr]
        cells = [escape(r.arm), escape(METRIC_WORDS[r.metric]), str(step)]
        for c in (r.parent, r.control):
            cells += [escape(cell(c)), f'<span class="{reading(c).replace(" ", "-")}">{escape(reading(c))}</span>']
        cells.append(escape(n_of(r)))
        body.append("<tr>" + "".join(f"<td>{x}</td>" for x in cells) + "</tr>")
    return f'<table class=effects><tr>{head}</tr>{"".join(body)}</table>'


def forest_svg(arms: list[ArmReport], metric: str, width: int = 720, row_h: int = 22) -> str:
    """Each arm against the control on `metric` at its final checkpoint: the difference as a dot, its 95%
    interval as a bar, zero as a line (the arm is its parent's comparison where the parent is the control)."""
    items = []
    for a in arms:
        c = next((c for c in a.comparisons if c.metric == metric and c.at == AT and c.diff is not None
                  and (c.against == "control" or c.other_arm == a.parent)), None)  # fmt: skip
        if c is not None:
            items.append((a.arm, c))
    if not items:
        return ""
    values = [0.0] + [v for _, c in items for v in (c.diff, c.low, c.high) if v is not None]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    lo, hi = lo - 0.05 * span, hi + 0.05 * span
    left, right, top = 140, 24, 30
    height = top + row_h * len(items) + 34

    def x(v: float) -> float:
        return left + (v - lo) / (hi - lo) * (width - left - right)

    title = f"{METRIC_WORDS[metric]}: arm − control at the final checkpoint, 95% interval"
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class=forest data-metric="{escape(metric)}" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{escape(title)}">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="8" y="16" font-size="12">{escape(title)}</text>',
             f'<line x1="{x(0):.1f}" x2="{x(0):.1f}" y1="{top - 6}" y2="{height - 28}" stroke="#888"/>',
             f'<text x="{x(0):.1f}" y="{height - 14}" font-size="10" text-anchor="middle">0</text>',
             f'<text x="{left}" y="{height - 2}" font-size="10">{lo:+.4f}</text>',
             f'<text x="{width - right}" y="{height - 2}" font-size="10" '
             f'text-anchor="end">{hi:+.4f}</text>']  # fmt: skip
    for i, (arm, c) in enumerate(items):
        y = top + row_h * i + row_h / 2
        label = f"{arm} vs {c.other_arm}"
        parts.append(f'<text x="8" y="{y + 4:.1f}" font-size="11">{escape(label)}</text>')
        if c.low is not None and c.high is not None:
            parts.append(f'<line x1="{x(c.low):.1f}" x2="{x(c.high):.1f}" y1="{y:.1f}" y2="{y:.1f}" '
                         f'stroke="#1f77b4" stroke-width="2"/>')  # fmt: skip
        tip = f"{label}: {c.diff:+.4f}" + (f" [{c.low:+.4f}, {c.high:+.4f}]" if c.low is not None else " (no interval)")
        parts.append(f'<circle cx="{x(c.diff):.1f}" cy="{y:.1f}" r="4" fill="#1f77b4"><title>{escape(tip)}</title>'  # type: ignore[arg-type]
                     "</circle>")  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)
