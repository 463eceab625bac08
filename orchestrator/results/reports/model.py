"""The report of one grid as typed records (rendered by orchestrator/results/reports/render.py)."""

from __future__ import annotations

from datetime import datetime
from typing import Literal

from pydantic import BaseModel, Field

# A stand-in extractor's distribution metric (random weights) is never called better or worse.
STANDIN_VERDICT = "stand-in extractor: descriptive"
Verdict = Literal["better", "worse", "no clear difference", "no interval", "stand-in extractor: descriptive"]


class Comparison(BaseModel):
    """One arm against another (its parent or the control) on one metric at one of its checkpoints."""

    metric: str
    against: Literal["parent", "control"]
    other_arm: str
    at: Literal["best", "final"]  # the arm's best or final checkpoint; the other arm at the same step
    step: int
    value: float | None = None
    other_value: float | None = None
    diff: float | None = None  # value - other_value
    se: float | None = None
    low: float | None = None  # 95% interval of diff
    high: float | None = None
    pairing: Literal["paired", "independent"] | None = None
    n: int | None = None
    verdict: Verdict | None = None  # None: not available (see words)
    extractor: str | None = None  # a distribution metric's extractor label (it says stand-in where it is one)
    # The per-image differences (paired): one row of the effect's seeds x images table; not serialised.
    samples: list[float] | None = Field(default=None, exclude=True)
    # An MMD's per-reference-image differences: the reference's part of the effect's variance; not serialised.
    reference: list[float] | None = Field(default=None, exclude=True)
    words: str


class DetectorOutcome(BaseModel):
    decision: str | None  # a RunDecision, None before any checkpoint was judged
    step: int | None
    reason: str | None
    stopped: bool  # stopped by the detector (collapse | diverged | stalled)
    kept_step: int | None  # the checkpoint kept (best)
    kept_value: float | None
    kept_checkpoint: str | None
    planned_steps: int | None
    gpu_hours_saved: float | None  # the steps it did not run, at its own rate
    money_saved: float | None


class Throughput(BaseModel):
    """Medians over the run's checkpoints (steady state: the worker excludes warm-up and eval time)."""

    iter_per_sec: float | None
    samples_per_sec: float | None
    tokens_per_sec: float | None
    gpu_hours: float | None
    money: float | None  # a sweep's price per GPU-hour x GPU-hours; None outside a sweep
    price_per_gpu_hour: float | None
    gpu_name: str | None


class SampleImage(BaseModel):
    kind: str
    index: int
    caption: str
    url: str  # the API path
    data_uri: str | None  # the PNG embedded (None where neither the run folder nor storage holds it)
    refused: str | None = None  # why it is not embedded though stored (a link, not a PNG, over the budget)


class SampleRow(BaseModel):
    arm: str
    step: int
    images: list[SampleImage]


class ArmReport(BaseModel):
    """One run: an arm at one training seed (a grid with seeds N has N per arm)."""

    arm: str
    seed: int = 0
    run_id: int
    description: str | None
    parent: str | None
    changes: dict[str, object]  # dotted field -> value against its parent
    state: str
    best_step: int | None
    best_value: float | None
    final_step: int | None
    final_value: float | None
    series: dict[str, list[float | None]]  # step and the primary metric, for the plot (and own_metrics)
    own_metrics: list[str] = []  # a command arm's own metrics, by its script's names, in `series`
    comparisons: list[Comparison]  # against the parent's and the control's run of the same seed
    detector: DetectorOutcome
    throughput: Throughput
    fallbacks: list[str]  # what the run did instead of what was asked, stand-in metrics included
    standin_steps: list[int]  # checkpoints whose LPIPS came from a random (stand-in) backbone
    samples: SampleRow | None  # at its best checkpoint
    control_samples: SampleRow | None  # the control's at the same step (else its best)


class SeedDiff(BaseModel):
    """One seed's paired difference (evaluation noise only): the effect's per-seed view."""

    seed: int
    diff: float
    low: float | None
    high: float | None
    n: int | None


class Narrowing(BaseModel):
    """One way to narrow an effect's interval, projected from its variance components and priced from the
    runs' own measured rates."""

    action: Literal["seed", "images"]  # +1 seed per arm | evaluate on 4x the images (no training)
    half_width: float  # the 95% interval's projected half-width (t on today's df)
    cost: float | None  # GPU-hours (seed) or GPU-minutes (images); None where no rate was measured
    unit: str  # "GPU-h" | "GPU-min" (or "CPU-h" | "CPU-min" where the runs ran on CPU)
    words: str


class NoiseBudget(BaseModel):
    """Where a crossed effect's variance comes from (shares of the grand mean's variance) and what would
    narrow it most per GPU-hour."""

    seeds: float
    images: float
    rest: float  # the seed x image interaction and evaluation noise
    words: str  # "seeds 45%, up to 70% · images 53% · rest 2%": seeds at seeds_priced, images and rest beside it
    narrowing: list[Narrowing]
    # The seed share the words print and a deciding grid's chooser prices a seed at (crossed.py
    # Components.priced_share): above zero however small the seeds' mean square came out. The three shares
    # above are as measured (seeds clipped at zero), what decider.components_of reads the components back
    # from. None in reports from before it.
    seeds_priced: float | None = None
    reference: float = 0.0  # the reference images' share (an MMD's effect): no seed or image narrows it


EffectReading = Literal[
    "distinguishable across seeds", "within noise", "one seed: training noise not measured", "no interval"
]


class Effect(BaseModel):
    """An arm against its parent or the control on one metric at the final checkpoint, across the grid's
    training seeds: the mean of the per-seed paired differences with the 95% interval `interval` names
    (stats.SeedEffect: crossed seeds x images where every seed pairs image by image); with one seed, that
    seed's evaluation interval."""

    arm: str
    metric: str
    against: Literal["parent", "control"]
    other_arm: str
    step: int  # the final step (seed 0's; the seeds' final steps where they differ are in per_seed)
    diff: float
    low: float | None
    high: float | None
    k: int  # training seeds compared
    seed_sd: float | None  # SD of the per-seed differences: the training noise (k >= 2)
    eval_se: float | None  # mean per-seed evaluation SE: what a single seed's interval covers
    noise: str  # what the interval covers, in words
    interval: Literal["crossed", "independent", "seeds only", "one seed"] = "one seed"
    se: float | None = None
    df: float | None = None  # the t-interval's degrees of freedom (None: normal)
    n: int | None = None  # evaluation images (crossed: the same n on every seed)
    budget: NoiseBudget | None = None  # crossed only
    reading: EffectReading
    standin: bool = False  # a random stand-in LPIPS backbone or extractor: not a judgement of quality
    extractor: str | None = None  # a distribution metric's extractor label
    per_seed: list[SeedDiff]
    # A deciding grid's decided metrics (results/deciding/decisions.py): the decision at the latest look, that look
    # (1-based), the alpha spent up to it and why (the look's reason); None on every other effect.
    decision: Literal["better", "worse", "equivalent", "undecided", "open"] | None = None
    look: int | None = None
    alpha_spent: float | None = None
    decision_reason: str | None = None
    # The look's repeated confidence interval the decision rests on (a borrowed seed variance's included): not
    # the row's `low`/`high`, the grid's own seeds' fixed-sample interval, which may read otherwise.
    decision_low: float | None = None
    decision_high: float | None = None
    # A deciding grid's row: its reading (a fixed-sample interval) describes the data, no call at the grid's
    # error rate (its decision, on a decided metric, is): shown as "descriptive: ...".
    descriptive: bool = False


class TimestepEffect(BaseModel):
    """val_flow_loss's paired difference at each timestep, across seeds (the report's appendix)."""

    arm: str
    against: Literal["parent", "control"]
    other_arm: str
    t: list[float]
    ratio: list[float | None]  # arm / comparator mean loss at t, averaged over seeds
    diff: list[float]
    low: list[float | None]
    high: list[float | None]
    k: int


class RankEntry(BaseModel):
    rank: int
    arm: str
    best_value: float | None
    best_step: int | None
    final_value: float | None
    state: str
    decision: str | None


class Summary(BaseModel):
    primary_metric: str
    ranking: list[RankEntry]  # by best value of the primary metric, better first
    stopped: list[str]  # "B: collapse at step 4000 (...)"
    comparisons: int  # how many comparisons the report makes
    with_interval: int
    excluding_zero: int
    words: list[str]


class EvaluationUsed(BaseModel):
    """The evaluation whose rows the effects use (its checkpoints on more images, results/evaluations.py)."""

    id: int
    images: int
    step: str  # as asked: "final", "best" or a step number
    samples: int | None = None  # generated samples for the distribution metrics (None: none asked)
    # The per-image metrics it measured (grids/evaluations.py EVERY_METRIC, or the flow loss alone: a deciding
    # grid's look, whose effects then read the LPIPS metrics from the training records); None: every one.
    measures: list[str] | None = None
    in_training: int = 0  # of the runs' rows it gives, those scored inside the run's training job (runs/in_training.py)


class GridReport(BaseModel):
    grid_id: int
    name: str
    source: str
    control: str | None
    state: str
    generated_at: datetime
    version: str  # the code that wrote it (orchestrator/version.py), as `ablate --version` says it
    seeds: int = 1  # training seeds per arm
    judge: str = "recon_lpips"  # the metric the table leads with: what the detector judged
    summary: Summary
    effects: list[Effect] = []
    timestep_effects: list[TimestepEffect] = []
    evaluation: EvaluationUsed | None = None  # None: the effects use the training records' evaluations
    distribution_evaluations: list[EvaluationUsed] = []  # those that generated samples for distribution metrics
    deciding: str | None = None  # a deciding grid's header: its error rate and looks (results/deciding/decisions.py)
    arms: list[ArmReport]
    # stored records whose per-sample or per-timestep lists were left out, and why (results/record_lists.py)
    unreadable_records: list[str] = []
