"""What a deciding grid may cost, answered at submit (the API's and the CLI's `decide_cost`): the worst case,
every comparison open to its budget (grids/deciding.py), and the expected GPU-hours of simulated grids taken
through the rule grids run (expected.py)."""

from __future__ import annotations

from pydantic import BaseModel

from model.spec import ArmSpec
from orchestrator.grids import deciding
from orchestrator.grids.deciding import DecideSpec, family_size, submitted_pairs, with_budget
from orchestrator.grids.projection import project
from orchestrator.results.deciding.decisions import comparison_alpha_of, rate_words
from orchestrator.results.deciding.expected import expected_gpu_hours


class DecideCost(BaseModel):
    """What a deciding grid may cost, projected at submit: the worst case, every comparison open to the
    budget (grids/deciding.py worst_case_gpu_hours: its arms at max_seeds, their evaluations included), the
    default of decide.max_gpu_hours; and the expected GPU-hours: the mean of simulated grids taken look by look
    through the rule grids run (results/deciding/expected.py: plan_look.py `plan_look`), with the measured
    headline's noise and no true effect (the longest case), runs priced as the worst case prices them and
    each evaluation with one worker's start (runs/evaluation_batch.py) but those on the split's images of runs on
    one GPU, done inside their training jobs (runs/in_training.py); None where a command arm cannot be
    projected. `budget`: the decide as stored, its caps filled in."""

    worst_case_gpu_hours: float | None
    expected_gpu_hours: float | None
    words: str
    budget: DecideSpec | None = None


def budget_words(budget: DecideSpec) -> str:
    """The caps no look goes past, in words."""
    hours = f"{budget.max_gpu_hours:,.4g} GPU-hours" if budget.max_gpu_hours is not None else "no GPU-hours cap"
    return (f"no look queues work past {hours} (decide.max_gpu_hours), {budget.max_looks} looks or "
            f"{budget.max_evaluations} evaluations")  # fmt: skip


def run_hours(spec: ArmSpec) -> float | None:
    """One run as the worst case prices it (grids/deciding.py worst_case_gpu_hours): its training and its
    fixed cost (start, checkpoint evaluations); None for a command arm."""
    run = project(spec, deciding.ESTIMATE)
    return run.hours + run.fixed_hours if run.hours is not None else None


def decide_cost(arms: list[tuple[str, ArmSpec]], control: str | None, decide: DecideSpec) -> DecideCost:
    hours = {label: run_hours(spec) for label, spec in arms}
    pairs = submitted_pairs(arms, control)
    budget = with_budget(decide, arms, control)
    images, max_images = deciding.images_range([spec for _, spec in arms], decide)
    m = family_size(arms, control, decide)
    head = (f"deciding: {len(arms)} arms, {len(pairs)} comparisons, {decide.min_seeds} to {decide.max_seeds} "
            f"seeds at {rate_words(decide, m)}")  # fmt: skip
    if any(h is None for h in hours.values()) or not pairs:
        return DecideCost(worst_case_gpu_hours=None, expected_gpu_hours=None, budget=budget,
                          words=f"{head}: GPU-hours not projected (command arms, or no comparison); "
                                f"{budget_words(budget)}")  # fmt: skip
    known = {a: float(h) for a, h in hours.items() if h is not None}
    worst = deciding.worst_case_gpu_hours(arms, control, decide)
    # The simulation's time grows with comparisons x studies: about 2,000 of them (under a second), so a
    # submit of many arms answers as fast as A-D's (400 studies); fewer studies only widen its noise.
    studies = min(400, max(40, 2000 // len(pairs)))
    specs, measured = dict(arms), deciding.measures_of(decide)
    starts = {a: deciding.evaluation_job_hours(spec, 0, measured) for a, spec in specs.items()}  # no images

    def evaluation(arm: str, n: int) -> float:  # one run's evaluation pass, its worker's start apart
        return deciding.evaluation_job_hours(specs[arm], n, measured) - starts[arm]

    # Each comparison judged at its own alpha, as a grid's looks judge it (decider.py look_state).
    judged = budget.model_copy(update={"alpha": comparison_alpha_of(decide, m)})
    # Runs on one GPU are scored on the split inside their training jobs: no evaluation start (runs/in_training.py).
    in_training = all(spec.command is None and spec.gpu_count() == 1 for spec in specs.values())
    expected = expected_gpu_hours(judged, known, pairs, images=images, max_images=max_images, evaluation=evaluation,
                                  start=max(starts.values()), in_training=in_training, studies=studies)  # fmt: skip
    words = (f"{head}: worst case {worst:,.4g} GPU-hours (every comparison open to the budget, its evaluations "
             f"included), expected {expected:,.4g} (its evaluations included; projected at an H100's measured "
             f"rate); {budget_words(budget)}")  # fmt: skip
    return DecideCost(worst_case_gpu_hours=worst, expected_gpu_hours=expected, words=words, budget=budget)
