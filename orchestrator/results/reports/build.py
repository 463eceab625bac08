"""Build a grid's report from the DB: per arm its effect against its parent and the control, the
detector's outcome, throughput and cost, fallbacks and samples; a summary that ranks the arms.

Comparisons are made at the same step (the evaluation's samples pair up only within a step): at the
arm's best checkpoint and at its final one, against the other arm's checkpoint of that step, seed s of
an arm against seed s of its parent and of the control (effects.py aggregates them across seeds). Where
the two arms ran different seeds (a deciding grid adds seeds to the control for one comparison), the effect
is read over every seed of both instead (`every_seed`: the unpaired crossed interval), not over the paired
seeds alone.
"""

from __future__ import annotations

import base64
import statistics
from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from model.spec import STANDIN
from orchestrator.db.models import Grid, Metric, Node, Run, Sweep
from orchestrator.grids.arms import changes
from orchestrator.numbers import finite_or_none, is_finite, number
from orchestrator.results.deciding.decisions import deciding_words, with_decisions
from orchestrator.results.evaluated_rows import at_step, evaluated_points, with_evaluation
from orchestrator.results.evaluations import distribution_evaluations, evaluation_warnings, largest_evaluation
from orchestrator.results.judge import best_checkpoint, judge_metric, stored_policy, stored_spec
from orchestrator.results.own_metrics import is_command_run, own_evaluated, own_series
from orchestrator.results.record_lists import stored_list, unreadable_records
from orchestrator.results.reports.comparison import DIGITS, compare
from orchestrator.results.reports.costs import run_cost
from orchestrator.results.reports.effects import (
    RunComparisons,
    grid_effects,
    metric_words,
)
from orchestrator.results.reports.model import (
    ArmReport,
    Comparison,
    DetectorOutcome,
    Effect,
    GridReport,
    RankEntry,
    SampleImage,
    SampleRow,
    Summary,
    Throughput,
    TimestepEffect,
)
from orchestrator.results.reports.pairing import Pairing, every_seed, final_steps
from orchestrator.results.reports.stats import (
    DISTRIBUTION,
    LOWER_IS_BETTER,
    QUALITY,
    WEIGHTED_FLOW,
    Difference,
    across_seeds,
    flow_grid,
    timestep_differences,
    value_of,
)
from orchestrator.results.samples import StepSamples, run_samples, sample_png
from orchestrator.version import version_text
from orchestrator.vocabulary import DETECTOR_STOPS, TERMINAL_STATES
from worker.stored_file import StoredFileRefused

PRIMARY = "recon_lpips"  # the judge where the detector judges LPIPS (a real backbone)
COMPARED = (*QUALITY, WEIGHTED_FLOW, *DISTRIBUTION)
# Sample kinds shown in the report's rows (the manipulation pairs stay in the gallery).
REPORT_KINDS = ("target", "recon", "text", "own")  # own: a command arm's PNGs
# The most bytes of PNGs one report embeds, all runs together: a node sets its samples' sizes (each at most
# samples.MAX_SAMPLE_BYTES), and a report is read whole by a browser. Past it an image is named, not embedded.
MAX_REPORT_IMAGE_BYTES = 64 << 20



def _median(values: list[float | None]) -> float | None:
    finite = [v for v in values if is_finite(v)]
    return statistics.median(finite) if finite else None


def judge_of(runs: list[Run], metrics: dict[int, list[Metric]]) -> str:
    """The metric the table leads with: the one the detector judged most of the runs on (val_flow_loss
    where LPIPS is the random stand-in, unless a spec names one)."""
    judged = [judge_metric(r, any(m.lpips_backbone == STANDIN for m in metrics[r.id]))
              for r in runs if not is_command_run(r)]  # fmt: skip
    known = [m for m in judged if m in COMPARED]
    return max(dict.fromkeys(known), key=known.count) if known else PRIMARY


def price_per_gpu_hour(session: Session, grid: Grid) -> float | None:
    """A sweep's price per GPU-hour (its nodes' price per hour over their GPUs); None outside a sweep."""
    sweep = session.scalar(select(Sweep).where(Sweep.grid_id == grid.id).order_by(Sweep.id.desc()).limit(1))
    if sweep is None or not sweep.price_per_hour:
        return None
    nodes = session.scalars(select(Node).where(Node.name.in_(sweep.nodes or []))).all()
    gpus = sum(len(n.gpus or []) for n in nodes)
    return sweep.price_per_hour / gpus if gpus else None


class _ImageBudget:
    """The bytes of PNGs a report may still embed."""

    def __init__(self, left: int) -> None:
        self.left = left


def _sample_row(run: Run, samples: list[StepSamples], step: int | None, options: dict[str, Any],
                budget: _ImageBudget) -> SampleRow | None:  # fmt: skip
    """The run's report-kind images at `step` (the newest step with samples at or before it), embedded
    while the budget lasts; a stored file the controller will not read is named with the reason."""
    steps = [s for s in samples if step is not None and s.step <= step]
    if not steps:
        return None
    chosen = steps[-1]
    images = []
    for f in chosen.files:
        if f.kind not in REPORT_KINDS:
            continue
        uri = refused = None
        try:
            data = sample_png(run, chosen.step, f.file, options)
        except StoredFileRefused as exc:
            data, refused = None, str(exc)
        if data is not None and len(data) > budget.left:
            data, refused = None, f"over the report's {MAX_REPORT_IMAGE_BYTES} bytes of embedded images"
        if data is not None:
            budget.left -= len(data)
            uri = f"data:image/png;base64,{base64.b64encode(data).decode()}"
        images.append(SampleImage(kind=f.kind, index=f.index, caption=f.caption, url=f.url, data_uri=uri,
                                  refused=refused))  # fmt: skip
    return SampleRow(arm=run.arm, step=chosen.step, images=images)


def _detector(run: Run, ms: list[Metric], best: Metric | None, price: float | None, judge: str) -> DetectorOutcome:
    spec = stored_spec(run.spec)
    planned = spec.schedule.steps if spec is not None else None
    stopped = run.decision in DETECTOR_STOPS and run.decision_step is not None
    saved = None
    if stopped and planned is not None and run.decision_step:
        at_stop = [m.gpu_hours for m in ms if m.step <= run.decision_step and is_finite(m.gpu_hours)]
        if at_stop and max(at_stop) > 0:
            saved = max(at_stop) / run.decision_step * max(planned - run.decision_step, 0)
    return DetectorOutcome(
        decision=run.decision,
        step=run.decision_step,
        reason=run.decision_reason,
        stopped=stopped,
        kept_step=best.step if best is not None else None,
        kept_value=finite_or_none(value_of(best, judge)) if best is not None else None,
        kept_checkpoint=run.best_checkpoint,
        planned_steps=planned,
        gpu_hours_saved=saved,
        money_saved=saved * price if saved is not None and price is not None else None,
    )


def _throughput(run: Run, ms: list[Metric], price: float | None) -> Throughput:
    hours = max((m.gpu_hours for m in ms if is_finite(m.gpu_hours)), default=None)
    return Throughput(
        iter_per_sec=_median([m.iter_per_sec for m in ms]),
        samples_per_sec=_median([m.samples_per_sec for m in ms]),
        tokens_per_sec=_median([m.tokens_per_sec for m in ms]),
        gpu_hours=hours,
        money=hours * price if hours is not None and price is not None else None,
        price_per_gpu_hour=price,
        gpu_name=run.gpu_name,
    )


def run_comparisons(
    run: Run, other: Run, against: str, metrics: dict[int, list[Metric]], points: Iterable[tuple[str, Metric | None]]
) -> list[Comparison]:
    """`run` against `other` on every compared metric at each (at, checkpoint) of `points`: ablate's, and a
    command arm's own metrics measured on held-out items (own_metrics.own_evaluated)."""
    steps = {m.step: m for m in metrics[other.id]}
    out = []
    for at, point in points:
        if point is None:
            continue
        own = own_evaluated(point) if is_command_run(run) else []
        for q in (*COMPARED, *own):
            lower = None if q in COMPARED else own_lower_is_better(run, q)
            out.append(compare(run.arm, point, other.arm, steps.get(point.step), q, against, at, lower))
    return out


def own_lower_is_better(run: Run, metric: str) -> bool:
    """A command arm's own metric: lower is better unless its detector judges it with metric_mode max."""
    policy = stored_policy(run)
    return not (policy.metric == metric and policy.metric_mode == "max")


def grid_effects_now(grid: Grid, metrics: dict[int, list[Metric]], evaluated: dict[int, Any] | None = None,
                     distribution: dict[int, list[Any]] | None = None) -> tuple[str, list[Effect]]:  # fmt: skip
    """The judged metric and the effects table of `grid` at each run's final checkpoint, without the
    report's samples (the dashboard polls this); `evaluated`: the largest completed evaluation's row per
    run id (results/evaluations.py), which stands for the checkpoint it measured, as in the report;
    `distribution`: per run id, the rows of the evaluations that generated samples for distribution metrics
    (evaluations.py distribution_evaluations)."""
    runs = list(grid.runs)
    judge = judge_of(runs, metrics)
    pairing = Pairing(grid)
    compared = with_evaluation(metrics, evaluated or {}, distribution)
    rows = []
    for r in runs:
        ms = metrics.get(r.id, [])
        final = at_step(compared.get(r.id, []), (evaluated or {}).get(r.id, ms[-1] if ms else None))
        comparisons = [c for against, other in pairing.comparators(r)
                       for c in run_comparisons(r, other, against, compared, (("final", final),))]  # fmt: skip
        standin = sorted({m.step for m in ms if m.lpips_backbone == STANDIN})
        rows.append(RunComparisons(arm=r.arm, seed=r.seed, comparisons=comparisons, standin_steps=standin))
    costs = {(r.arm, r.seed): run_cost(r, metrics.get(r.id, [])) for r in runs}
    steps = final_steps(runs, metrics, evaluated or {})
    return judge, every_seed(grid_effects(rows, judge, costs), pairing, compared, steps, costs)


def build_report(session: Session, grid: Grid, storage_options: dict[str, Any] | None = None) -> GridReport:
    """The report of `grid` as it stands now (a live grid gives a partial one). storage_options: fsspec
    options for reading sample images from checkpoint storage (settings.checkpoint_options)."""
    options = dict(storage_options or {})
    runs = list(grid.runs)
    metrics: dict[int, list[Metric]] = {r.id: [] for r in runs}
    if runs:
        rows = session.scalars(
            select(Metric).where(Metric.run_id.in_(list(metrics))).order_by(Metric.run_id, Metric.step)
        )
        for m in rows:
            metrics[m.run_id].append(m)
    samples = {r.id: run_samples(session, r) for r in runs}
    judge = judge_of(runs, metrics)
    pairing = Pairing(grid)
    # The largest completed evaluation (more images, no retraining): its rows stand for the checkpoints it measured.
    evaluation, evaluated = largest_evaluation(session, grid)
    distribution, distribution_rows = distribution_evaluations(session, grid)  # on their checkpoints
    not_used = evaluation_warnings(session, grid)  # a stranger's evaluation of a run: named on it, not used
    compared = with_evaluation(metrics, evaluated, distribution_rows)
    budget = _ImageBudget(MAX_REPORT_IMAGE_BYTES)
    price = price_per_gpu_hour(session, grid)
    arms = []
    pairs: list[tuple[Run, str, Run]] = []  # (run, against, comparator run) for the timestep appendix
    for r in runs:
        ms = metrics[r.id]
        best = best_checkpoint(r, ms, judge)
        final = ms[-1] if ms else None
        control, parent = pairing.control(r.seed), pairing.parent(r)
        parent_name = (r.spec or {}).get("parent")
        comparisons: list[Comparison] = []
        for against, other in pairing.comparators(r):
            pairs.append((r, against, other))
            points = evaluated_points(compared[r.id], best, evaluated.get(r.id, final))
            comparisons += run_comparisons(r, other, against, compared, points)
        mine, theirs = stored_spec(r.spec), stored_spec(parent.spec) if parent is not None else None
        standin = sorted({m.step for m in ms if m.lpips_backbone == STANDIN})
        fallbacks = [str(f) for f in (r.fallbacks or [])] + not_used.get(r.id, [])
        if standin and not any(STANDIN in f for f in fallbacks):
            fallbacks.append(f"lpips backbone: {STANDIN} at steps {standin} (not comparable with real LPIPS)")
        best_step = best.step if best is not None else None
        own = own_series(ms) if is_command_run(r) else {}
        ctrl_samples = None
        if control is not None and control.id != r.id:
            ctrl_samples = _sample_row(control, samples[control.id], best_step, options, budget)
        arms.append(
            ArmReport(
                arm=r.arm,
                seed=r.seed,
                run_id=r.id,
                description=(r.spec or {}).get("description"),
                parent=parent_name if isinstance(parent_name, str) else None,
                changes=changes(mine, theirs) if mine is not None and theirs is not None else {},
                state=r.state,
                best_step=best_step,
                best_value=finite_or_none(value_of(best, judge)) if best is not None else None,
                final_step=final.step if final is not None else None,
                final_value=finite_or_none(value_of(final, judge)) if final is not None else None,
                series={"step": [float(m.step) for m in ms], judge: [finite_or_none(value_of(m, judge)) for m in ms],
                        **own},
                own_metrics=list(own),
                comparisons=comparisons,
                detector=_detector(r, ms, best, price, judge),
                throughput=_throughput(r, ms, price),
                fallbacks=fallbacks,
                standin_steps=standin,
                samples=_sample_row(r, samples[r.id], best_step, options, budget),
                control_samples=ctrl_samples,
            )
        )
    done = all(r.state in TERMINAL_STATES for r in runs) and bool(runs)
    control = pairing.control(0)
    left_out = unreadable_records([(f"run {r.id} ({r.arm}, seed {r.seed})", m.step, m.extra)
                                   for r in runs for m in metrics[r.id]])  # fmt: skip
    costs = {(r.arm, r.seed): run_cost(r, metrics[r.id]) for r in runs}
    steps = final_steps(runs, metrics, evaluated)
    effects = with_decisions(session, grid, every_seed(grid_effects(arms, judge, costs), pairing, compared, steps,
                                                       costs))  # a deciding grid's decisions
    return GridReport(
        grid_id=grid.id,
        name=grid.name,
        source=grid.source,
        control=control.arm if control is not None else None,
        state="finished" if done else "in progress",
        generated_at=datetime.now(UTC),
        version=version_text(),
        seeds=grid.seeds,
        judge=judge,
        summary=summarize(arms, effects, judge, grid.seeds),
        effects=effects,
        timestep_effects=timestep_effects(pairs, compared),
        evaluation=evaluation,
        distribution_evaluations=distribution,
        deciding=deciding_words(session, grid),
        arms=arms,
        unreadable_records=left_out,
    )


def timestep_effects(pairs: list[tuple[Run, str, Run]], metrics: dict[int, list[Metric]]) -> list[TimestepEffect]:
    """val_flow_loss at each timestep, each arm against its parent and the control at their final
    checkpoint, across seeds (the per-seed paired difference at t, aggregated like the table's effects)."""
    groups: dict[tuple[str, str, str], list[tuple[list[Difference], list[float], list[float]]]] = {}
    t: list[float] = []
    for run, against, other in pairs:
        mine, theirs = metrics[run.id], {m.step: m for m in metrics[other.id]}
        if not mine or mine[-1].step not in theirs:
            continue
        a, b = mine[-1], theirs[mine[-1].step]
        diffs = timestep_differences(a, b)
        if diffs is None:
            continue
        t = stored_list(a.extra, "val_flow_loss_t") or t
        means_a = [sum(col) / len(col) for col in zip(*flow_grid(a) or [], strict=True)]
        means_b = [sum(col) / len(col) for col in zip(*flow_grid(b) or [], strict=True)]
        groups.setdefault((run.arm, against, other.arm), []).append((diffs, means_a, means_b))
    out = []
    for (arm, against, other_arm), seeds in groups.items():
        width = min(len(d) for d, _, _ in seeds)
        per_t = [e for i in range(width) if (e := across_seeds([d[i] for d, _, _ in seeds])) is not None]
        ratio = [sum(ma[i] / mb[i] for _, ma, mb in seeds if mb[i] > 0) / len(seeds) for i in range(width)]
        out.append(TimestepEffect(
            arm=arm, against=against, other_arm=other_arm, t=t[:width] or [(i + 0.5) / width for i in range(width)],
            ratio=[finite_or_none(x) for x in ratio], diff=[e.diff for e in per_t], low=[e.low for e in per_t],
            high=[e.high for e in per_t],
            k=len(seeds),
        ))  # fmt: skip
    return out


def summarize(arms: list[ArmReport], effects: list[Effect], judge: str = PRIMARY, seeds: int = 1) -> Summary:
    """Rank runs on the judged metric's best value, name the stopped ones, and say what the effects table's
    intervals can tell (effects.py): across seeds with several, evaluation noise only with one."""
    sign = 1 if LOWER_IS_BETTER.get(judge, True) else -1
    scored = sorted(arms, key=lambda a: (a.best_value is None, sign * (a.best_value or 0.0)))
    label = (lambda a: f"{a.arm} s{a.seed}") if seeds > 1 else (lambda a: a.arm)
    ranking = [
        RankEntry(rank=i + 1, arm=label(a), best_value=a.best_value, best_step=a.best_step, final_value=a.final_value,
                  state=a.state, decision=a.detector.decision)
        for i, a in enumerate(scored)
    ]  # fmt: skip
    stopped = [
        f"{label(a)}: {a.detector.decision} at step {a.detector.step} ({a.detector.reason}); "
        f"kept step {a.detector.kept_step}"
        for a in arms
        if a.detector.stopped
    ]
    made = [e for e in effects if not e.standin]
    with_interval = [e for e in made if e.low is not None]
    excluding = [e for e in with_interval if e.reading == "distinguishable across seeds"]
    words = []
    if ranking and ranking[0].best_value is not None:
        top = ranking[0]
        best = number(top.best_value, DIGITS)
        words.append(f"Best on {metric_words(judge)}: {top.arm} ({best} at step {top.best_step}).")
    standin = list(dict.fromkeys(a.arm for a in arms if a.standin_steps))
    if standin:
        words.append(f"LPIPS of {', '.join(standin)} is the random stand-in backbone, which cannot tell arms apart: "
                     "judge them on the held-out flow loss (val_flow_loss), which needs no downloaded weights "
                     "and is what the detector judged them on unless their spec named a metric.")  # fmt: skip
    words.append(f"Stopped by the detector: {', '.join(s.split(':')[0] for s in stopped)}." if stopped
                 else "No arm was stopped by the detector.")  # fmt: skip
    if seeds < 2:
        words.append(f"{len(made)} effects from one training seed per arm: their intervals cover evaluation noise "
                     "only, so none is read as distinguishable (retraining moves an effect by more than that); "
                     "run the grid with seeds >= 3 to measure training noise.")  # fmt: skip
    else:
        words.append(
            f"{len(made)} effects across {seeds} training seeds, {len(with_interval)} with a 95% interval"
            + (f", {len(excluding)} distinguishable across seeds: about {0.05 * len(with_interval):.1f} would be by "
               "chance alone, so read one interval among many with care." if with_interval else
               ": no per-sample values or standard errors are stored.")
        )  # fmt: skip
    return Summary(
        primary_metric=judge,
        ranking=ranking,
        stopped=stopped,
        comparisons=len(made),
        with_interval=len(with_interval),
        excluding_zero=len(excluding),
        words=words,
    )
