"""A GridReport as JSON, Markdown and one self-contained HTML file (images as data URIs, the curves as
inline SVG, no script, nothing fetched: it opens offline and can be mailed)."""

from __future__ import annotations

from html import escape

from orchestrator.grids.evaluations import flow_only
from orchestrator.results.reports.effects import (
    effects_html,
    effects_markdown,
    forest_plots,
    per_seed_markdown,
    seeds_words,
    timestep_markdown,
)
from orchestrator.results.reports.model import ArmReport, GridReport, SampleRow
from orchestrator.version import DISTRIBUTION

PALETTE = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#7f7f7f", "#17becf")


def _num(x: float | None, digits: int = 3) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


# Why a stored record's lists can be left out: written before ingest checked them, or imported.
LEFT_OUT_WHY = "a per-sample or per-timestep list not in the shape the node protocol declares"
def evaluation_words(report: GridReport) -> str:
    """Which evaluations the effects use ("" where only the training records'): the images' metrics' and each
    that generated samples for the distribution metrics (read where it has at least the training pass's)."""
    words = []
    if (e := report.evaluation) is not None:
        words.append(f"The effects use evaluation {e.id}: each run's {e.step} checkpoint evaluated again on "
                     f"{e.images} held-out images (the same per-image noise for every run), not the training-time "
                     "evaluation.")  # fmt: skip
        if e.measures is not None and flow_only(e.measures):
            words.append(f"Evaluation {e.id} measured the flow loss alone (the metric the grid decides on, no LPIPS "
                         "sampling): the LPIPS metrics are the training-time evaluation's.")  # fmt: skip
    for d in report.distribution_evaluations:
        words.append(f"The distribution metrics at each run's {d.step} checkpoint come from evaluation {d.id} "
                     f"({d.samples} generated samples, sample i from the same prompt and noise in every run) where "
                     "it generated at least as many as the training pass.")  # fmt: skip
    return " ".join(words)


def to_json(report: GridReport) -> str:
    return report.model_dump_json(indent=1)


def to_markdown(report: GridReport) -> str:
    """Numbers and sentences; the pictures are in the HTML (and at the API URLs listed)."""
    s = report.summary
    out = [f"# Report: grid {report.grid_id} {report.name!r} ({report.state})", "",
           f"Control arm: {report.control}. Generated {report.generated_at:%Y-%m-%d %H:%M} UTC "
           f"by {DISTRIBUTION} {report.version}.", ""]  # fmt: skip
    out += ["## Effects", "", *([report.deciding, ""] if report.deciding else []), *effects_markdown(report), "",
            seeds_words(report) + " Forest plots in report.html.", ""]
    out += [words, ""] if (words := evaluation_words(report)) else []
    out += ["## Summary", "", *[f"- {w}" for w in s.words], ""]
    if report.unreadable_records:
        out += [f"Records left out of the statistics ({LEFT_OUT_WHY}):", "",
                *[f"- {r}" for r in report.unreadable_records], ""]  # fmt: skip
    out += [f"| rank | arm | best {s.primary_metric} | at step | final | state | decision |", "|---" * 7 + "|"]
    out += [f"| {r.rank} | {r.arm} | {_num(r.best_value)} | {r.best_step} | {_num(r.final_value)} | {r.state} | "
            f"{r.decision or '-'} |" for r in s.ranking]  # fmt: skip
    for a in report.arms:
        out += ["", f"## {_run_label(report, a)}" + (f": {a.description}" if a.description else ""), ""]
        if a.parent:
            changed = ", ".join(f"{k}={v}" for k, v in a.changes.items()) or "nothing (same spec)"
            out.append(f"Parent {a.parent}; changes: {changed}.")
        out.append(
            f"Best {_num(a.best_value)} at step {a.best_step}; final {_num(a.final_value)} at step {a.final_step}."
        )
        d = a.detector
        if d.stopped:
            saved = f"; saved {_num(d.gpu_hours_saved, 1)} GPU-hours" if d.gpu_hours_saved is not None else ""
            money = f" ({_num(d.money_saved, 2)})" if d.money_saved is not None else ""
            kept = f"kept step {d.kept_step}{saved}{money}"
            out.append(f"Detector: **{d.decision} at step {d.step}**: {d.reason}; {kept}.")
        else:
            out.append(f"Detector: {d.decision or 'no decision'}" + (f" at step {d.step}" if d.step else "") + ".")
        if a.own_metrics:
            out.append(f"Its own metrics at step {a.final_step}: " + ", ".join(f"{n} {_num(a.series[n][-1], 4)}"
                                                                              for n in a.own_metrics) + ".")
        t = a.throughput
        out.append(f"Throughput: {_num(t.samples_per_sec, 2)} samples/s, {_num(t.tokens_per_sec, 0)} tokens/s; "
                   f"{_num(t.gpu_hours, 2)} GPU-hours" + (f", cost {_num(t.money, 2)}" if t.money is not None else "")
                   + (f" on {t.gpu_name}" if t.gpu_name else "") + ".")  # fmt: skip
        for f in a.fallbacks:
            out.append(f"- fallback: {f}")
        if a.samples is not None:
            links = ", ".join(f"[{i.kind} {i.index}]({i.url})" for i in a.samples.images)
            out += ["", f"Samples at step {a.samples.step} (pictures in report.html): {links}"]
    out += _appendix_markdown(report)
    return "\n".join(out) + "\n"


def _run_label(report: GridReport, a: ArmReport) -> str:
    return f"{a.arm}, seed {a.seed}" if report.seeds > 1 else a.arm


def _appendix_markdown(report: GridReport) -> list[str]:
    """Each seed's own interval, and val_flow_loss's effect at each timestep."""
    out = []
    seeds = per_seed_markdown(report)
    if seeds:
        out += ["", "## Appendix: each seed's interval (evaluation noise only)", "", *seeds]
    steps = timestep_markdown(report.timestep_effects)
    if steps:
        out += ["", "## Appendix: held-out flow loss at each timestep", "",
                "Arm / comparator mean loss at each t, averaged over seeds; * where the across-seed interval of "
                "the paired difference at that t excludes zero.", "", *steps]  # fmt: skip
    return out


def curves_svg(arms: list[ArmReport], metric: str, width: int = 720, height: int = 300) -> str:
    """The primary metric per arm over steps, best checkpoints as dots and detector stops as crosses."""
    points = [(s, v) for a in arms for s, v in zip(a.series["step"], a.series[metric], strict=True) if v is not None]
    if not points:
        return "<p>(no checkpoints yet)</p>"
    x0, x1 = min(p[0] for p in points), max(p[0] for p in points)
    y0, y1 = min(p[1] for p in points), max(p[1] for p in points)
    x1, y1 = (x1 if x1 > x0 else x0 + 1), (y1 if y1 > y0 else y0 + 1e-3)
    # Room for the labels: y values on the left, arm names on the right, steps below (centred on their
    # tick, so the first and last stay inside the picture).
    pad, left, right = 48, 56, 64

    def xy(s: float, v: float) -> tuple[float, float]:
        x = left + (s - x0) / (x1 - x0) * (width - left - right)
        return x, height - pad - (v - y0) / (y1 - y0) * (height - 2 * pad)

    ticks = "".join(
        f'<text x="{xy(s, y0)[0]:.1f}" y="{height - pad + 16}" font-size="10" text-anchor="middle">{s:g}</text>'
        for s in sorted({x0 + (x1 - x0) * i / 4 for i in range(5)})
    )
    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" role="img" '
             f'aria-label="{escape(metric)} per arm">',
             f'<rect width="{width}" height="{height}" fill="white"/>',
             f'<text x="{pad}" y="16" font-size="12">{escape(metric)} (lower is better) by step</text>',
             f'<text x="4" y="{pad}" font-size="10">{y1:.3f}</text>',
             f'<text x="4" y="{height - pad}" font-size="10">{y0:.3f}</text>',
             ticks,
             f'<text x="{width / 2:.0f}" y="{height - 8}" font-size="10" text-anchor="middle">step</text>']  # fmt: skip
    for i, a in enumerate(arms):
        colour = PALETTE[i % len(PALETTE)]
        pts = [xy(s, v) for s, v in zip(a.series["step"], a.series[metric], strict=True) if v is not None]
        if not pts:
            continue
        path = " ".join(f"{x:.1f},{y:.1f}" for x, y in pts)
        parts.append(f'<polyline fill="none" stroke="{colour}" stroke-width="2" points="{path}"/>')
        end = f'x="{width - right + 4}" y="{pts[-1][1]:.1f}"'
        parts.append(f'<text {end} font-size="11" fill="{colour}">{escape(a.arm)}</text>')
        if a.best_step is not None and a.best_value is not None:
            bx, by = xy(a.best_step, a.best_value)
            parts.append(f'<circle cx="{bx:.1f}" cy="{by:.1f}" r="4" fill="{colour}"><title>{escape(a.arm)} best '
                         f"{a.best_value:.3f} @ {a.best_step}</title></circle>")  # fmt: skip
        if a.detector.stopped and a.detector.step is not None:
            sx = xy(a.detector.step, y0)[0]
            title = f"<title>{escape(a.arm)} stopped @ {a.detector.step}</title>"
            parts.append(f'<line x1="{sx:.1f}" x2="{sx:.1f}" y1="{pad}" y2="{height - pad}" stroke="{colour}" '
                         f'stroke-dasharray="4 3">{title}</line>')  # fmt: skip
    parts.append("</svg>")
    return "".join(parts)


def _images(row: SampleRow | None, label: str) -> str:
    if row is None or not row.images:
        return f"<p class=muted>{escape(label)}: no samples stored</p>"
    cells = []
    for img in row.images:
        title = escape(f"{img.kind} {img.index}: {img.caption}")
        pic = (f'<img src="{img.data_uri}" alt="{title}" title="{title}">' if img.data_uri else
               f"<span title=\"{escape(img.refused)}\">refused</span>" if img.refused else "<span>missing</span>")
        cells.append(f"<figure>{pic}<figcaption>{escape(img.kind)} {img.index}</figcaption></figure>")
    return f"<div class=row><b>{escape(label)} @ {row.step}</b>{''.join(cells)}</div>"


CSS = """body{font:14px system-ui,sans-serif;max-width:1100px;margin:2em auto;color:#222}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:2px 8px;text-align:right}
.row{display:flex;gap:6px;align-items:flex-end;flex-wrap:wrap;margin:4px 0}figure{margin:0;text-align:center}
img{width:96px;height:96px;image-rendering:pixelated;border:1px solid #ccc}figcaption{font-size:10px}
.effects td{text-align:left}.distinguishable-across-seeds{color:#1a7f37;font-weight:bold}.one-seed{color:#777}
.forest{display:block;margin:6px 0}
.better{color:#1a7f37}.worse{color:#b91c1c}.muted{color:#777}.stop{color:#b91c1c;font-weight:bold}"""


def to_html(report: GridReport) -> str:
    s = report.summary
    h = [f"<!doctype html><html><head><meta charset=utf-8><title>ablate report: grid {report.grid_id}</title>",
         f"<style>{CSS}</style></head><body>",
         f"<h1>Grid {report.grid_id}: {escape(report.name)} <small class=muted>({escape(report.state)})</small></h1>",
         f"<p>Control arm {escape(str(report.control))}; generated {report.generated_at:%Y-%m-%d %H:%M} UTC by "
         f"{escape(DISTRIBUTION + ' ' + report.version)}.</p>",
         "<h2>Effects</h2>", f"<p class=deciding>{escape(report.deciding)}</p>" if report.deciding else "",
         effects_html(report),
         f"<p class=muted>{escape(seeds_words(report))}</p>",
         f"<p class=muted>{escape(words)}</p>" if (words := evaluation_words(report)) else "",
         *forest_plots(report),
         "<h2>Summary</h2><ul>", *[f"<li>{escape(w)}</li>" for w in s.words], "</ul>",
         *([f"<p class=worse>Records left out of the statistics ({escape(LEFT_OUT_WHY)}):</p><ul>",
            *[f"<li>{escape(r)}</li>" for r in report.unreadable_records], "</ul>"]
           if report.unreadable_records else []),
         f"<table><tr><th>rank</th><th>arm</th><th>best {escape(s.primary_metric)}</th><th>at step</th><th>final</th>"
         "<th>state</th><th>decision</th></tr>"]  # fmt: skip
    h += [f"<tr><td>{r.rank}</td><td>{escape(r.arm)}</td><td>{_num(r.best_value)}</td><td>{r.best_step}</td>"
          f"<td>{_num(r.final_value)}</td><td>{escape(r.state)}</td><td>{escape(r.decision or '-')}</td></tr>"
          for r in s.ranking]  # fmt: skip
    h += ["</table>", curves_svg(report.arms, s.primary_metric)]
    for name in dict.fromkeys(n for a in report.arms for n in a.own_metrics):  # command arms' own, by name
        h.append(curves_svg([a for a in report.arms if name in a.own_metrics], name))
    for a in report.arms:
        h.append(f"<h2>{escape(_run_label(report, a))}" + (f": {escape(a.description)}" if a.description else "")
                 + "</h2>")
        if a.parent:
            changed = ", ".join(f"{k}={v}" for k, v in a.changes.items()) or "nothing (same spec)"
            h.append(f"<p>Parent {escape(a.parent)}; changes: <code>{escape(changed)}</code></p>")
        h.append(f"<p>Best {_num(a.best_value)} at step {a.best_step}; final {_num(a.final_value)} at step "
                 f"{a.final_step}; {escape(a.state)}.</p>")  # fmt: skip
        d = a.detector
        if d.stopped:
            saved = f"; saved {_num(d.gpu_hours_saved, 1)} GPU-hours" if d.gpu_hours_saved is not None else ""
            money = f" ({_num(d.money_saved, 2)})" if d.money_saved is not None else ""
            h.append(f"<p class=stop>Detector: {escape(str(d.decision))} at step {d.step}: {escape(d.reason or '')}; "
                     f"kept step {d.kept_step}{saved}{money}</p>")  # fmt: skip
        else:
            h.append(f"<p>Detector: {escape(d.decision or 'no decision')}</p>")
        t = a.throughput
        h.append(f"<p>Throughput {_num(t.samples_per_sec, 2)} samples/s, {_num(t.tokens_per_sec, 0)} tokens/s; "
                 f"{_num(t.gpu_hours, 2)} GPU-hours" + (f", cost {_num(t.money, 2)}" if t.money is not None else "")
                 + (f" on {escape(t.gpu_name)}" if t.gpu_name else "") + "</p>")  # fmt: skip
        if a.fallbacks:
            h.append("<ul>" + "".join(f"<li class=worse>fallback: {escape(f)}</li>" for f in a.fallbacks) + "</ul>")
        h.append(_images(a.samples, f"{a.arm} best"))
        if report.control is not None and report.control != a.arm:
            h.append(_images(a.control_samples, f"{report.control} (control)"))
    appendix = _appendix_markdown(report)
    if appendix:
        h.append("<h2>Appendix</h2><pre>" + escape("\n".join(appendix)) + "</pre>")
    h.append("</body></html>")
    return "\n".join(h)


RENDERERS = {"json": to_json, "md": to_markdown, "html": to_html}
MEDIA_TYPES = {"json": "application/json", "md": "text/markdown; charset=utf-8", "html": "text/html; charset=utf-8"}
