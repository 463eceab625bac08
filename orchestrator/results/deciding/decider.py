"""The decision pass of deciding grids: a listener of the launcher (runs/launcher.py `LoopListener`, wired
in orchestrator/loop.py before the report writer) that, on each housekeeping pass, looks at every deciding
grid whose current wave has ended (every run and every evaluation of the grid in a terminal state).

A look is results/deciding/plan_look.py `plan_look` (pure; the simulations in bench/ call it too): this
module gathers its state (`look_state`) and queues the work it returns (`queue_work`). A comparison is first
evaluated on every image the split allows where that costs little beside a seed (a run on one GPU is already
evaluated on them inside its training job: runs/in_training.py; a run that was not, by a catch-up job), then
seeds are bought to
planned counts (2, 3, 4, 5, 6, 8). At a look: every comparison's effect on the decided metrics (the report's own
code: build.py `grid_effects_now`, with the largest completed evaluation in place of the runs' final rows), the decision
at this look from the group-sequential maths (results/deciding/sequential.py), and for each comparison still open
the action the chooser gives: one more seed of both arms (grids/deciding.py `add_seed`: new queued runs,
the next seed index, the same split) or an evaluation on more held-out images (grids/evaluations.py). An
arm no open comparison needs gets no more seeds; work stops when every comparison is decided or at its
budget (max_seeds, max_images). A comparison closed undecided (for futility, or at its budget) stays closed:
it is never judged, or paid for, again in that grid.

The grid's spend is bounded whatever its nodes answer: no look queues work past decide.max_gpu_hours (the
runs' and evaluation jobs' measured GPU-hours and the next action's price), past max_looks looks or
max_evaluations evaluations; an images action that would ask for no more images than the grid's largest
evaluation asked for is no action, and where that evaluation measured fewer images than it asked (images of
the split that cannot be read) the images budget is the readable count, said in an event and the look's
reason (results/deciding/budget.py). A grid whose decide.borrow_from names earlier grids reads a comparison
whose two arms they ran with the seed variance of their difference there (deciding/borrowing.py,
deciding/borrowed.py: the paired differences' where those grids matched the arms' seeds, else the arms'
own summed): pooled with its own seeds', or alone on one seed; the look's reason says which.

A look is stored (`decision_looks`, unique per grid and wave) in the same commit as the runs or the
evaluation it queued and its events, so a controller that restarts mid-decision finds either the whole
look or none of it: no look is lost and none is taken twice.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping, Sequence

from sqlalchemy import exists, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from model.spec import ArmSpec
from orchestrator.db.models import DecisionLook, Evaluation, EvaluationResult, Event, Grid, Metric
from orchestrator.db.session import session_scope
from orchestrator.grids.deciding import DecideSpec, add_seed, arm_seeds, decide_of, image_share, measures_of
from orchestrator.grids.evaluations import (
    EvaluationCreate,
    create_evaluation,
    evaluated_runs,
    flow_only,
    held_out_size,
    measured_by,
)
from orchestrator.grids.projection import START_S
from orchestrator.results.deciding import sequential
from orchestrator.results.deciding.borrowed import (
    SPREAD_FLOOR,
    BorrowedReading,
    RefusedBorrow,
    SeedVariance,
    borrowed_reading,
    crossed_parts,
    floor_refusal,
)
from orchestrator.results.deciding.borrowing import earlier_spreads, own_runs
from orchestrator.results.deciding.budget import (
    budget_of,
    evaluation_hours,
    evaluation_jobs,
    evaluations_of,
    over_budget,
    readable_images,
    run_hours,
    spent_gpu_hours,
)
from orchestrator.results.deciding.decisions import (
    ComparisonLook,
    grid_comparison_alpha,
    grid_looks,
    look_comparisons,
)
from orchestrator.results.deciding.plan_look import LookState, Reading, Work, judge, plan_look, plan_work
from orchestrator.results.deciding.unpaired import unpaired_look
from orchestrator.results.evaluations import distribution_evaluations, largest_evaluation
from orchestrator.results.pass_listener import PassListener
from orchestrator.results.reports.build import grid_effects_now
from orchestrator.results.reports.model import Effect
from orchestrator.settings import Settings
from orchestrator.vocabulary import TERMINAL_STATES, EvaluationState, RunDecision

log = logging.getLogger("ablate.decide")
EVALUATION_DONE = (EvaluationState.completed, EvaluationState.failed)
FLOW_ONLY_WORDS = ": the flow loss alone, the metric the grid decides on; no LPIPS sampling"


def wave_ended(session: Session, grid: Grid) -> bool:
    """Every run and every evaluation of the grid has ended (a grid with no runs has no wave)."""
    if not grid.runs or any(r.state not in TERMINAL_STATES for r in grid.runs):
        return False
    active = exists().where(Evaluation.grid_id == grid.id, Evaluation.state.not_in(EVALUATION_DONE))
    return not session.scalar(select(active))


def due_looks(session: Session) -> list[int]:
    """Deciding grids whose wave has ended and whose last look did not end the decision."""
    final = exists().where(DecisionLook.grid_id == Grid.id, DecisionLook.final)
    deciding = session.scalars(select(Grid).where(Grid.decide.is_not(None), ~final).order_by(Grid.id))
    return [grid.id for grid in deciding if wave_ended(session, grid)]


def decision_pending(session: Session, grid: Grid) -> bool:
    """A deciding grid whose decision has not ended: its report waits for the final look."""
    if not grid.decide:
        return False
    return not session.scalar(select(exists().where(DecisionLook.grid_id == grid.id, DecisionLook.final)))


def current_effects(session: Session, grid: Grid) -> list[Effect]:
    """The grid's effects now, as the report computes them (the largest completed evaluation included)."""
    runs = list(grid.runs)
    metrics: dict[int, list[Metric]] = {r.id: [] for r in runs}
    rows = select(Metric).where(Metric.run_id.in_(list(metrics))).order_by(Metric.run_id, Metric.step)
    for m in session.scalars(rows):
        metrics[m.run_id].append(m)
    _, evaluated = largest_evaluation(session, grid)
    return grid_effects_now(grid, metrics, evaluated, distribution_evaluations(session, grid)[1])[1]


def _images_now(session: Session, grid: Grid) -> tuple[int | None, int]:
    """(the images the effects use now: the largest completed evaluation's, else None: the training
    records'; the held-out split's size, the most an evaluation may ask for)."""
    info, _ = largest_evaluation(session, grid)
    runs = evaluated_runs(grid)
    return (info.images if info is not None else None), min((held_out_size(r) for r in runs), default=0)


def components_of(e: Effect) -> sequential.Variance:
    """The per-observation variance components of the effect's differences, read back from its crossed
    noise budget (shares of the mean's variance se^2); an interval that is not crossed is all seed. The seed
    component is the one the budget's words print and price a seed at (`seeds_priced`: its median given the
    seeds' mean square and that it is not negative, crossed.py Components.priced_share), never the clipped
    zero a small 1- or 2-df mean square gives, so one more seed never looks worthless to the chooser
    (bench/chooser_cost.py) and the chooser's seed is the budget's: seed/k is seeds_priced of the mean's
    variance with the images, rest and reference parts as measured."""
    var, k, n = (e.se or 0.0) ** 2, e.k, e.n or 1
    if e.budget is None:
        return sequential.Variance(seed=var * k, image=0.0, rest=0.0)
    b = e.budget
    seed = b.seeds * var * k
    others = (b.images + b.rest + b.reference) * var  # the mean's variance but the seeds'
    if b.seeds_priced is not None and b.seeds_priced < 1 and others > 0:
        seed = k * others * b.seeds_priced / (1 - b.seeds_priced)
    return sequential.Variance(seed=seed, image=b.images * var * n, rest=b.rest * var * k * n)


def action_costs(e: Effect, jobs: Sequence[tuple[float, int]] = (), share: float = 1.0) -> sequential.Costs:
    """What one more seed of each arm, one image on one run and one run's evaluation job start cost in
    GPU-hours, from the effect's noise budget (the runs' own measured rates: costs.py). Unmeasured: a seed
    1 h, and an evaluation pass of the n images 5% of a run, so the chooser still compares the two by their
    variance. A job's start: the grid's completed evaluation `jobs` (evaluation_jobs), each less its images
    at that rate, on average; before any has run, a start without compile (grids/projection.py START_S).
    On a short run the start, not the images, is most of what an evaluation costs. `share`: an image of the
    grid's evaluations against one of training's (grids/deciding.py image_share: the flow loss alone costs
    its 8 passes of the sampler's and its)."""
    options = {o.action: o for o in (e.budget.narrowing if e.budget is not None else [])}
    seed = options["seed"].cost / 2 if "seed" in options and options["seed"].cost else 1.0
    images = options.get("images")
    if images is not None and images.cost and e.n:  # GPU-minutes of 4n images on 2k runs
        image = images.cost / 60 / (sequential.IMAGE_STEP * e.n * 2 * e.k)
    else:
        image = 0.05 * seed / max(e.n or 1, 1)
    image *= share
    starts = [max(gpu_s / 3600 - job_images * image, 0.0) for gpu_s, job_images in jobs]
    job = sum(starts) / len(starts) if starts else START_S[False] / 3600
    return sequential.Costs(seed_a=seed, seed_b=seed, image=image, image_job=job)


def borrowed_inputs(e: Effect) -> tuple[SeedVariance | None, SeedVariance] | None:
    """The effect's own seed part (None on one seed) and its images' part, as borrowed_reading reads them: k >= 2
    from the crossed table's components, one seed from that seed's paired interval (its SE over its n - 1 df).
    None where neither applies (k >= 2 not crossed, one seed with no interval)."""
    n = e.n or 1
    if e.k >= 2 and e.budget is not None:
        v = components_of(e)
        return crossed_parts(v.seed, v.image, v.rest, e.k, n)
    if e.k == 1 and e.se is not None and e.se > 0 and math.isfinite(e.se) and n > 1:
        return None, SeedVariance(e.se**2, n - 1)
    return None


def borrowed_look(e: Effect, earlier: SeedVariance, check: float) -> tuple[BorrowedReading, sequential.Variance] | None:
    """The comparison read with its arms' seed variance from earlier grids (results/deciding/borrowed.py), and the
    variance components that project it (the information fraction, the chooser). None where borrowed_inputs
    has none, on one seed where the borrowed variance is refused (not_borrowed says why), or where the
    reading has no spread."""
    inputs = borrowed_inputs(e)
    if inputs is None:
        return None
    own, images = inputs
    try:
        r = borrowed_reading(own, images, e.k, earlier, check, floor=SPREAD_FLOOR)
    except RefusedBorrow:
        return None
    if not (r.se > 0 and math.isfinite(r.se)):
        return None
    return r, sequential.Variance(seed=r.seeds.variance.value, image=images.value * (e.n or 1), rest=0.0)


def not_borrowed(e: Effect, earlier: SeedVariance | None) -> str:
    """Why the comparison's earlier seed variance was refused (its records' nodes, or its floor), for the
    look's reason; "" where there was none or it was not refused."""
    if earlier is None:
        return ""
    inputs = borrowed_inputs(e)
    refusal = floor_refusal(earlier, inputs[1]) if inputs is not None else earlier.refused
    return f"; seed variance not borrowed: {refusal}" if refusal else ""


def reading_of(e: Effect, decide: DecideSpec, earlier: SeedVariance | None = None,
               jobs: Sequence[tuple[float, int]] = (), share: float = 1.0,
               runs: Mapping[str, Mapping[int, float]] | None = None) -> Reading:  # fmt: skip
    """The comparison as a look reads it (plan_look.py `Reading`): with its arms' seed variance from earlier
    grids (decide.borrow_from), pooled with its own seeds' (or alone, on one seed), where there is one;
    else unpaired where the grid's `runs` (each arm's values by seed) show no seed effect shared across
    arms (unpaired.py: each arm's own spread, up to twice the df); else crossed, on the maths' decision df
    (the seed mean square at its upper bound, so a draw of seeds that happens to agree does not also buy
    many df), or the report's own df. `jobs`: the grid's evaluation jobs so far, pricing the images action
    (action_costs, at `share` of training's image)."""
    common = dict(arm=e.arm, against=e.against, other_arm=e.other_arm, metric=e.metric, diff=e.diff, low=e.low,
                  high=e.high, k=e.k, n=e.n, standin=e.standin, costs=action_costs(e, jobs, share))  # fmt: skip
    borrowed = borrowed_look(e, earlier, decide.check) if earlier is not None and not e.standin else None
    if borrowed is not None:
        r, v = borrowed
        return Reading(**common, se=r.se, df=r.df, variance=v, note=f"; seed variance: {r.seeds.note}")  # type: ignore[arg-type]
    if e.se is None or not e.se > 0 or e.k < 2:  # no interval across seeds
        return Reading(**common, se=None, df=None, variance=None, note=not_borrowed(e, earlier))  # type: ignore[arg-type]
    inputs = borrowed_inputs(e) if runs is not None and not e.standin and e.k >= 2 else None
    apart = unpaired_look(runs, e.arm, e.other_arm, e.k, e.n or 1, inputs[1]) if runs and inputs else None
    if apart is not None:
        r, v = apart
        return Reading(**common, se=r.se, df=r.df, variance=v, note=r.note)  # type: ignore[arg-type]
    v = components_of(e)
    df = sequential.decision_df(v, e.k, e.n or 1) if e.budget is not None else e.df
    return Reading(**common, se=e.se, df=df, variance=v)  # type: ignore[arg-type]


def judge_comparison(e: Effect, decide: DecideSpec, look: int, max_images: int, at_seeds: bool, at_images: bool,
                     previous: ComparisonLook | None, earlier: SeedVariance | None = None,
                     jobs: Sequence[tuple[float, int]] = ()) -> ComparisonLook:  # fmt: skip
    """One comparison at this look, read from its effect (reading_of) and judged as plan_look judges it
    (plan_look.py `judge`)."""
    return judge(reading_of(e, decide, earlier, jobs), decide, look, max_images, at_seeds, at_images, previous)


def _image_share(grid: Grid, measures: Sequence[str]) -> float:
    """An image of the grid's look evaluations against one of its training evaluations (image_share, at its
    first run's spec; 1 where that no longer validates)."""
    try:
        return image_share(ArmSpec.model_validate(grid.runs[0].spec), measures) if grid.runs else 1.0
    except ValueError:
        return 1.0


def look_state(session: Session, grid: Grid) -> LookState:
    """What the grid's next look knows (plan_look.py `LookState`), gathered from the database."""
    decide = budget_of(grid)
    # Each comparison judged at its own alpha: decide.alpha, or familywise its share alpha/m (decisions.py).
    judged = decide.model_copy(update={"alpha": grid_comparison_alpha(grid, decide)})
    looks = grid_looks(session, grid.id)
    wave = len(looks)
    images, split = _images_now(session, grid)
    max_images = max(min(decide.max_images or split, split), 1)  # 1: nothing to evaluate (command arms)
    failed = session.scalar(select(exists().where(Evaluation.grid_id == grid.id,
                                                  Evaluation.state == EvaluationState.failed)))  # fmt: skip
    # The arms' seed variances from the earlier grids it names, per decided metric (each grid read once).
    earlier = earlier_spreads(session, grid, list(decide.margin)) if decide.borrow_from else None
    measures = measures_of(decide)
    jobs = evaluation_jobs(session, grid, measures)  # the starts of evaluations measuring the same
    share = _image_share(grid, measures)
    effects = [e for e in current_effects(session, grid) if e.metric in decide.margin]
    # The grid's own runs by arm and seed, where it borrows nothing: a comparison may read them unpaired.
    own = own_runs(session, grid, list(decide.margin)) if not decide.borrow_from else {}
    readings = []
    for e in effects:
        borrowed = earlier.difference(e.metric, e.arm, e.other_arm) if earlier is not None else None
        readings.append(reading_of(e, judged, borrowed, jobs, share, own.get(e.metric)))
    readable, short = readable_images(images, max((e.n or 0 for e in effects), default=0), max_images)
    first = {r.arm: r for r in grid.runs if r.seed == 0}
    start = evaluation_hours(session, grid, 0)
    return LookState(
        readings=readings, decide=judged, look=wave + 1, seeds=arm_seeds(grid), images_asked=images,
        max_images=max_images, readable=readable, short=short, spent=spent_gpu_hours(session, grid),
        seed_hours={a: run_hours(session, r) for a, r in first.items()}, evaluation_start=start,
        evaluation_image=evaluation_hours(session, grid, 1) - start, evaluations=evaluations_of(session, grid),
        previous={c.key(): c for c in look_comparisons(looks[-1] if looks else None)},
        stopped=any(r.decision == RunDecision.USER for r in grid.runs),  # the user stopped it: add nothing
        last_look=wave + 1 >= (decide.max_looks or 1),  # the last look the grid may take: judged as the last
        failed=bool(failed),
    )  # fmt: skip


def take_look(session: Session, grid: Grid) -> DecisionLook:
    """The look after the grid's current wave, with the work it queues (flushed; the caller commits): its
    state gathered (look_state), planned (plan_look.py `plan_look`), its work queued (queue_work)."""
    state = look_state(session, grid)
    plan = plan_look(state)
    comparisons, wave = plan.comparisons, state.look - 1
    actions = queue_work(session, grid, plan.work)
    look = DecisionLook(grid_id=grid.id, wave=wave, comparisons=[c.model_dump(mode="json") for c in comparisons],
                        actions=actions, final=not actions)  # fmt: skip
    session.add(look)
    open_ = [c for c in comparisons if c.decision == "open"]
    words = ", ".join(f"{c.arm} vs {c.other_arm} {c.decision}" for c in comparisons) or "no comparison measured"
    session.add(Event(grid_id=grid.id, kind="decide.look", message=f"look {wave + 1}: {words}",
                      data={"wave": wave, "open": len(open_), "final": not actions}))  # fmt: skip
    if state.short:
        session.add(Event(grid_id=grid.id, kind="decide.images_budget", message=state.short.removeprefix("; "),
                          data={"wave": wave, "images": state.readable, "asked": state.images_asked}))  # fmt: skip
    if plan.refusal is not None and not actions:
        session.add(Event(grid_id=grid.id, kind="decide.budget", message=plan.refusal, data={"wave": wave}))
    for a in actions:
        session.add(Event(grid_id=grid.id, kind="decide.action", message=a["words"], data=a))
    session.flush()
    return look


def queue_work(session: Session, grid: Grid, work: Work) -> list[dict]:
    """Queue a look's work (plan_look.py `Work`): an evaluation of every run on its images, or each arm's new
    seeds up to its count; returns the actions as stored."""
    if work.images is not None:
        measures = measures_of(decide_of(grid))
        evaluation = create_evaluation(session, grid, EvaluationCreate(images=work.images), measures=measures)
        words = (f"evaluate every run on {work.images} held-out images (evaluation {evaluation.id}"
                 f"{FLOW_ONLY_WORDS if flow_only(measures) else ''})")  # fmt: skip
        return [{"action": "images", "images": work.images, "evaluation": evaluation.id, "words": words,
                 "measures": list(measures)}]  # fmt: skip
    runs = []
    while missing := [a for a, k in work.seeds.items() if arm_seeds(grid).get(a, 0) < k]:
        runs += add_seed(grid, missing)
    if not runs:
        return []
    session.flush()
    many = len(runs) > len(work.seeds)
    words = ("seeds up to " if many else "one more seed of ") + ", ".join(f"{r.arm} (seed {r.seed})" for r in runs)
    return [{"action": "seed", "arms": list(work.seeds), "runs": [r.id for r in runs], "words": words}]


def queue_actions(session: Session, grid: Grid, comparisons: Sequence[ComparisonLook], decide: DecideSpec,
                  max_images: int, images: int | None) -> tuple[list[dict], str | None]:  # fmt: skip
    """Queue the work judged comparisons ask for (plan_look.py `plan_work` on the grid's seeds, spend and
    prices, then queue_work). Returns the actions as stored, and which cap refused the work, if one did."""
    first = {r.arm: r for r in grid.runs if r.seed == 0}
    start = evaluation_hours(session, grid, 0)
    state = LookState(readings=(), decide=decide, look=0, seeds=arm_seeds(grid), images_asked=images,
                      max_images=max_images, readable=max_images, spent=spent_gpu_hours(session, grid),
                      seed_hours={a: run_hours(session, r) for a, r in first.items()}, evaluation_start=start,
                      evaluation_image=evaluation_hours(session, grid, 1) - start,
                      evaluations=evaluations_of(session, grid))  # fmt: skip
    work, refusal = plan_work(comparisons, state)
    return queue_work(session, grid, work), refusal


def catch_up(session: Session, grid: Grid) -> Evaluation | None:
    """Where the effects use an evaluation (more images than the training records) that the wave's new
    seeds are not in, evaluate those runs alone on its images before the look: a seed scored on other images
    would leave the comparison's interval the conservative "independent" one, and the runs already scored
    keep their rows (results/evaluations.py largest_evaluation reads the two evaluations as one). None
    where every run was already asked for on those images (a run whose evaluation failed is not asked
    again: the look then takes the effects as they are)."""
    info, _ = largest_evaluation(session, grid)
    if info is None:
        return None
    asked = set(session.scalars(select(EvaluationResult.run_id).join(Evaluation).where(
        Evaluation.grid_id == grid.id, Evaluation.images == info.images)))  # fmt: skip
    missing = [r for r in evaluated_runs(grid) if r.id not in asked]
    if not missing:
        return None
    budget = budget_of(grid)
    cost = evaluation_hours(session, grid, info.images) * len(missing) / max(len(evaluated_runs(grid)), 1)
    refusal = over_budget(session, grid, budget, cost, True)
    if refusal is not None:  # the look takes the effects as they are
        words = f"no catch-up evaluation: {refusal}"
        if not session.scalar(select(exists().where(Event.grid_id == grid.id, Event.message == words))):
            session.add(Event(grid_id=grid.id, kind="decide.budget", message=words))
        return None
    measures = measured_by(session.get(Evaluation, info.id))  # what the runs already scored were measured on
    evaluation = create_evaluation(session, grid, EvaluationCreate(images=info.images), only=missing,
                                   measures=measures)  # fmt: skip
    words = (f"evaluate {', '.join(f'{r.arm} s{r.seed}' for r in missing)} on {info.images} held-out images "
             f"(evaluation {evaluation.id}) before the look: not yet scored on them; the other runs keep theirs")
    data = {"evaluation": evaluation.id, "images": info.images, "runs": [r.id for r in missing]}
    session.add(Event(grid_id=grid.id, kind="decide.catch_up", message=words, data=data))
    session.flush()
    return evaluation


def decide_due_grids(settings: Settings) -> list[int]:
    """Take the look of every deciding grid whose wave has ended; returns their ids. A look that another
    pass stored first (unique per grid and wave) is left as it is."""
    with session_scope(settings.database_url) as session:
        due = due_looks(session)
    looked = []
    for grid_id in due:
        try:
            with session_scope(settings.database_url) as session:
                grid = session.get(Grid, grid_id)
                if grid is None or not wave_ended(session, grid):
                    continue
                if catch_up(session, grid):  # the wave's new seeds first scored on the evaluation's images
                    continue
                take_look(session, grid)
            looked.append(grid_id)
        except IntegrityError:
            log.info("grid %s: this wave's look was already taken", grid_id)
        except Exception as exc:  # noqa: BLE001 - a look must never stop the launcher; the next pass tries again
            log.exception("look of grid %s failed", grid_id)
            look_failed(settings, grid_id, exc)
    return looked


def look_failed(settings: Settings, grid_id: int, exc: Exception) -> None:
    """The grid's events say that its look failed and why (the log alone is read by nobody), once per error
    text: a look that fails the same way at every pass does not flood the events."""
    message = f"the look failed and is tried again at the next pass: {type(exc).__name__}: {exc}"[:2000]
    try:
        with session_scope(settings.database_url) as session:
            said = select(exists().where(Event.grid_id == grid_id, Event.kind == "decide.look_failed",
                                         Event.message == message))  # fmt: skip
            if not session.scalar(said):
                session.add(Event(grid_id=grid_id, kind="decide.look_failed", message=message,
                                  data={"error": type(exc).__name__}))  # fmt: skip
    except Exception:  # noqa: BLE001 - the database itself may be what failed
        log.exception("grid %s: could not record the failed look", grid_id)


class Decider(PassListener):
    """The launcher's listener that takes a deciding grid's look when its wave ends, in the loop's
    housekeeping pass (a failed look never stops it)."""

    def housekeeping(self) -> None:
        decide_due_grids(self.settings)
