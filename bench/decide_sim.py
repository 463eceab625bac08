"""Does a grid that decides hold its error rate, at the fixed design's power, for fewer GPU-hours? Simulated
studies of arms A-D with the lineage comparisons (B-A, C-B, C-A, D-C, D-A), each decided look by look
through the product's own rule, orchestrator/results/deciding/plan_look.py `plan_look` (bench/decide_looks.py):
every arm starts with min_seeds seeds scored on 64 images; each look reads every open comparison by the
report's crossed interval (orchestrator/results/reports/crossed.py), or unpaired where the arms' runs share no
seed effect (results/deciding/unpaired.py, as the decider), and does the work plan_look returns.

Each arm's value on seed s and image i is mean + seed_s + image_i + rest_si (normal, per arm), so a
comparison's table of paired differences has the difference's components: seed SD (each arm seed_sd/sqrt 2),
image SD (each arm's own response to an image) and rest SD; comparisons that share an arm are correlated as
in a real grid. Profiles: the weighted headline's components measured on H100s (seed 0.001, image 0.011,
rest 0.0018), mixed, seed-dominated, the plain mean's (0.0083, 0.044, 0.0106), and "correlated seeds":
seed s of every arm shares an effect of SD 0.0108 (initialisation and data order), each arm's own 0.0012
in the difference, as measured on a GPU. Arm D's seed SD 1x or 3x the others'. True means: A = B = 0 and
C = D = -effect (lower is better), so B-A and D-C are null and C-B, C-A, D-A differ by the effect.

Costs: training per seed A 6.66, B 3.15, C 3.16, D 3.23 GPU-h (seed-size rates on one H100); evaluation
10 s per 64 images on one run (`--image-seconds`: another price; a full evaluation at seed size measured
2.36 s an image, a deciding grid's flow-loss-only look far less), 256 held-out images.

    python bench/decide_sim.py              # 10,000 studies a cell, the table in docs/benchmarks.md
    python bench/decide_sim.py --quick      # 1,000 a cell; ends with the one line below

The last line reads `gpu_hours_vs_fixed3 G type_I T power P hours_vs_best_fixed H`: G the mean GPU-hours over
the headline's default cells as a fraction of the fixed 3 seeds x 64 images design's (largest); T the
cumulative rejection rate of the null comparisons by each look, its largest over every cell; P the default
spec's power at a true effect of 2 SE (lowest over the "equal power" profiles); H its GPU-hours averaged
over true effects of 0, 1 and 2 SE over the cheapest fixed k x n design that reaches P (bench/equal_power.py),
largest over those profiles.
The line before it names the cells whose null rate is above alpha + 2 SE, the bound each cell must hold.

`--earlier K0 --min-seeds 1` runs a grid that borrows (`decide.borrow_from`): each study also draws an
earlier grid of the same arms on K0 seeds and 64 images (`--earlier-spread S`: arm D's spread S there), read
as results/deciding/borrowed.py reads it. `--borrow DF` is the shortcut that fails: one measured seed
variance for every arm, as if from an earlier grid on DF df (docs/benchmarks.md, issue 50).
"""

from __future__ import annotations

import argparse
import math
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field, replace

import numpy as np

from bench.decide_looks import Runs, TableReading, grid_study, table_interval
from bench.equal_power import FIXED_SEEDS as FIXED_DESIGN_SEEDS
from bench.equal_power import SE_UNITS, equal_power, fixed_designs, se_unit
from orchestrator.grids.deciding import DecideSpec
from orchestrator.results.deciding.borrowed import (
    CHECK,
    SeedVariance,
    borrowed_reading,
    crossed_parts,
    difference_of,
    run_spread,
)
from orchestrator.results.deciding.sequential import (
    FUTILITY,
    SEED_DF_QUANTILE,
    Variance,
    decision_df,
    mean_variance,
)
from orchestrator.results.deciding.unpaired import unpaired_look

ARMS = ("A", "B", "C", "D")
COMPARISONS = (("B", "A"), ("C", "B"), ("C", "A"), ("D", "C"), ("D", "A"))
NULL = (("B", "A"), ("D", "C"))
SEED_HOURS = {"A": 6.66, "B": 3.15, "C": 3.16, "D": 3.23}
IMAGE_HOURS = 10.0 / 64 / 3600  # one image evaluated on one run (--image-seconds: another price)
FIXED_SEEDS, FIXED_IMAGES = 3, 64
PROFILES = {"headline": (0.001, 0.011, 0.0018), "mixed": (0.002, 0.011, 0.004),
            "seed-dominated": (0.006, 0.0015, 0.006), "plain mean": (0.0083, 0.044, 0.0106)}  # fmt: skip
# Seed s of every arm shares its initialisation and data order: a seed effect common to every arm (SD per arm)
# on top of each arm's own. Measured on a GPU (tiny, 100 steps, A and C): per-seed differences SD 0.0012,
# the arms' own seed SDs summed in variance 0.0154 (so about 0.0108 shared per arm).
SHARED_SEED_SD = {"correlated seeds": 0.0108}
PROFILES["correlated seeds"] = (0.0012, 0.011, 0.0018)
EQUAL_POWER_PROFILES = ("headline", "mixed", "seed-dominated", "correlated seeds")
DEFAULT = DecideSpec()  # the product's default spec: what a user gets who sets nothing
EFFECTS = (0.0075, 0.002)
ALPHA = 0.05


@dataclass(frozen=True)
class Design:
    min_seeds: int = DEFAULT.min_seeds
    max_seeds: int = DEFAULT.max_seeds
    images: int = 64  # what every run is evaluated on first
    max_images: int = 256
    futility: float = FUTILITY if DEFAULT.futility is None else DEFAULT.futility
    seed_df_quantile: float = SEED_DF_QUANTILE
    borrow_df: float = 0.0  # --borrow: > 0 borrows the measured 1x seed variance, on this many df (below)
    earlier_seeds: int = 0  # --earlier: > 0 reads each arm's seed variance pooled with an earlier grid's of it
    earlier_spread: float | None = None  # arm D's seed SD in that earlier grid (None: as in this one)
    check: float = CHECK  # the per-arm check's level (borrowed.py)
    image_hours: float = IMAGE_HOURS  # one image evaluated on one run, for the grid and every fixed design


@dataclass(frozen=True)
class Cell:
    profile: str
    spread: float  # arm D's seed SD over the others'
    effect: float
    variant: str = "default"  # the spec the cell runs (VARIANTS)


@dataclass
class Tally:
    studies: int = 0
    null_by_look: dict[int, int] = field(default_factory=dict)  # first rejection of a null comparison, by look
    null_fixed: int = 0
    power: dict[str, int] = field(default_factory=dict)
    power_fixed: dict[str, int] = field(default_factory=dict)
    hours: float = 0.0
    seeds_added: int = 0  # arm-seeds past two a arm (negative where arms stayed at one)
    # The fixed design's t statistics (mean / SE), for its power at a level that holds alpha (below)
    null_t: list[float] = field(default_factory=list)
    effect_t: dict[str, list[float]] = field(default_factory=dict)
    equal_power: bool = False  # also tally every fixed k x n design (bench/equal_power.py)
    fixed_calls: dict[tuple[int, int], int] = field(default_factory=dict)  # correct calls of the differing pairs


def merged(a: Tally, b: Tally) -> Tally:
    def plus(x: dict, y: dict) -> dict:
        return {key: x.get(key, 0) + y.get(key, 0) for key in {*x, *y}}

    return Tally(a.studies + b.studies, plus(a.null_by_look, b.null_by_look), a.null_fixed + b.null_fixed,
                 plus(a.power, b.power), plus(a.power_fixed, b.power_fixed), a.hours + b.hours,
                 a.seeds_added + b.seeds_added, a.null_t + b.null_t,
                 {key: a.effect_t.get(key, []) + b.effect_t.get(key, []) for key in {*a.effect_t, *b.effect_t}},
                 a.equal_power, plus(a.fixed_calls, b.fixed_calls))  # fmt: skip


def held_power(t: Tally, key: str) -> float:
    """The fixed design's power at a level that holds alpha: its critical |t| set so that exactly alpha of
    this cell's null comparisons are called (size-adjusted power), where its own 95% interval calls more."""
    cut = float(np.quantile(np.abs(t.null_t), 1 - ALPHA)) if t.null_t else math.inf
    ts = np.asarray(t.effect_t.get(key, []))
    return float((ts < -cut).mean()) if ts.size else 0.0


def fixed_hours(image_hours: float = IMAGE_HOURS) -> float:
    return sum(FIXED_SEEDS * (SEED_HOURS[a] + FIXED_IMAGES * image_hours) for a in ARMS)


def draw(rng: np.random.Generator, cell: Cell, design: Design) -> dict[str, np.ndarray]:
    """Each arm's seeds x images values (max_seeds x max_images)."""
    seed_sd, image_sd, rest_sd = PROFILES[cell.profile]
    k, n = max(design.max_seeds, max(FIXED_DESIGN_SEEDS)), design.max_images
    # seed s alike in every arm (drawn only where the profile has it, so the other profiles' draws stay as they were)
    shared = rng.normal(0, SHARED_SEED_SD[cell.profile], (k, 1)) if cell.profile in SHARED_SEED_SD else 0.0
    out = {}
    for arm in ARMS:
        mean = -cell.effect if arm in ("C", "D") else 0.0
        s_sd = seed_sd / math.sqrt(2) * (cell.spread if arm == "D" else 1.0)
        out[arm] = (mean + shared + rng.normal(0, s_sd, (k, 1)) + rng.normal(0, image_sd / math.sqrt(2), (1, n))
                    + rng.normal(0, rest_sd / math.sqrt(2), (k, n)))  # fmt: skip
    return out


def earlier_grid(rng: np.random.Generator, cell: Cell, design: Design) -> dict[str, SeedVariance]:
    """Each arm's seed variance as an earlier grid of it measured it: design.earlier_seeds seeds on 64 images,
    drawn from the same model (arm D's seed SD design.earlier_spread times the others' where set: an arm
    whose seeds spread more now than they did then)."""
    spread = cell.spread if design.earlier_spread is None else design.earlier_spread
    values = draw(rng, Cell(cell.profile, spread, cell.effect), Design(max_seeds=design.earlier_seeds, max_images=64))
    out = {}
    for arm, x in values.items():
        v = run_spread(x[: design.earlier_seeds].mean(axis=1).tolist())  # each earlier run's value
        assert v is not None
        out[arm] = v
    return out


def correct(pair: tuple[str, str], low: float, high: float) -> bool:
    """Called in the right direction: C and D are better (lower) than A and B."""
    return high < 0 if pair in (("C", "B"), ("C", "A"), ("D", "A")) else False


@dataclass(frozen=True)
class Reading:
    mean: float
    se: float
    df: float
    variance: Variance  # what the fraction and the action are projected from


def read(diff: np.ndarray, design: Design, prior_seed: float, pair: tuple[str, str] | None = None,
         runs: Runs | None = None) -> Reading:  # fmt: skip
    """A comparison's k x n differences read for a decision: the report's crossed interval with decision_df,
    or unpaired where the arms' `runs` share no seed effect, as the decider reads them (unpaired.py); with
    --borrow, the seed variance pooled with a prior (an earlier grid's measurement of these arms, on
    design.borrow_df df), which also reads one seed (k = 1: the report has no interval)."""
    k, n = diff.shape
    if design.borrow_df <= 0:
        ci = table_interval(diff)
        comp = ci.components
        images = crossed_parts(comp.seed, comp.image, comp.rest, k, n)[1]
        apart = unpaired_look(runs, *pair, k, n, images) if runs and pair else None
        if apart is not None:
            return Reading(ci.mean, apart[0].se, apart[0].df, apart[1])
        return Reading(ci.mean, ci.se, decision_df(comp, k, n, design.seed_df_quantile),
                       Variance(comp.seed, comp.image, comp.rest))  # fmt: skip
    df0 = design.borrow_df
    if k == 1:
        row = diff[0]
        v = Variance(prior_seed, float(row.var(ddof=1)), 0.0)  # the rest folds into the images' spread
        seed_df = df0
    else:
        ci = table_interval(diff)
        comp = ci.components
        pooled = (df0 * prior_seed + (k - 1) * comp.seed) / (df0 + k - 1)
        v, seed_df = Variance(pooled, comp.image, comp.rest), df0 + k - 1
    var = mean_variance(v, k, n)
    terms = [(v.seed / k, seed_df), (v.image / n, n - 1), (v.rest / (k * n), max((k - 1) * (n - 1), 1))]
    spread = sum(x * x / d for x, d in terms)
    return Reading(float(diff.mean()), math.sqrt(var), var * var / spread if spread > 0 else math.inf, v)


def read_borrowed(diff: np.ndarray, pair: tuple[str, str], earlier: dict[str, SeedVariance], design: Design) -> Reading:
    """The comparison's k x n differences read as a grid that borrows reads them (results/deciding/borrowed.py):
    the table's own seed mean square pooled with the earlier grid's per-arm variances (k = 1: those alone)."""
    return borrowed_of(diff, difference_of(earlier[pair[0]], earlier[pair[1]]), design)


def borrowed_of(diff: np.ndarray, seeds: SeedVariance, design: Design, floor: float = 0.0) -> Reading:
    """The k x n differences read with `seeds`, the difference's borrowed seed variance, as
    results/deciding/borrowed.py `borrowed_reading` does (its RefusedBorrow raised where `floor` refuses it)."""
    k, n = diff.shape
    own: SeedVariance | None
    if k == 1:
        own, images = None, SeedVariance(float(diff[0].var(ddof=1)) / n, n - 1)
    else:
        comp = table_interval(diff).components
        own, images = crossed_parts(comp.seed, comp.image, comp.rest, k, n)
    r = borrowed_reading(own, images, k, seeds, design.check, design.seed_df_quantile, floor=floor)
    return Reading(float(diff.mean()), r.se, r.df, Variance(r.seeds.variance.value, images.value * n, 0.0))


def decide_spec(design: Design, alpha: float = ALPHA) -> DecideSpec:
    """The DecideSpec a grid of the design runs (its comparison's alpha, the simulation's split)."""
    return DecideSpec(alpha=alpha, min_seeds=design.min_seeds, max_seeds=design.max_seeds,
                      max_images=design.max_images, futility=design.futility)  # fmt: skip


def reader(design: Design, prior_seed: float, earlier: dict[str, SeedVariance] | None):  # noqa: ANN201
    """The study's `read` for grid_study: the report's crossed interval (read), or as a grid that borrows."""

    def read_pair(diff: np.ndarray, pair: tuple[str, str], runs: Runs | None = None) -> TableReading:
        if earlier is None and design.borrow_df <= 0 and diff.shape[0] < 2:  # one seed, nothing borrowed
            return TableReading(float(diff.mean()), None, None, None)
        r = read_borrowed(diff, pair, earlier, design) if earlier else read(diff, design, prior_seed, pair, runs)
        return TableReading(r.mean, r.se, r.df, r.variance)

    return read_pair


def study(values: dict[str, np.ndarray], design: Design, tally: Tally, prior_seed: float = 0.0,
          earlier: dict[str, SeedVariance] | None = None) -> None:  # fmt: skip
    """One study: the grid decided look by look through the product's plan_look (bench/decide_looks.py), then
    the fixed designs on the same values."""
    seeds = dict.fromkeys(ARMS, design.min_seeds)
    if design.borrow_df > 0:  # one seed of each arm but the control, whose replicates stay at min_seeds
        seeds.update(dict.fromkeys(ARMS[1:], 1))
    out = grid_study(values, COMPARISONS, decide_spec(design), reader(design, prior_seed, earlier), SEED_HOURS,
                     design.image_hours, min_seeds=seeds, images=design.images,
                     max_images=design.max_images)  # fmt: skip
    for p in COMPARISONS:
        c = out.looks[p]
        if c.decision in ("better", "worse"):
            if p in NULL:
                tally.null_by_look[c.look] = tally.null_by_look.get(c.look, 0) + 1
            elif c.decision == "better":
                key = "-".join(p)
                tally.power[key] = tally.power.get(key, 0) + 1
    tally.hours += out.hours
    tally.seeds_added += sum(out.seeds[a] - 2 for a in ARMS)
    for p in COMPARISONS:  # the fixed design on the same study
        ci = table_interval(values[p[0]][:FIXED_SEEDS, :FIXED_IMAGES] - values[p[1]][:FIXED_SEEDS, :FIXED_IMAGES])
        t_stat = ci.mean / ci.se if ci.se > 0 else 0.0
        if p in NULL:
            tally.null_fixed += ci.low > 0 or ci.high < 0
            tally.null_t.append(t_stat)
            continue
        tally.effect_t.setdefault("-".join(p), []).append(t_stat)
        if correct(p, ci.low, ci.high):
            key = "-".join(p)
            tally.power_fixed[key] = tally.power_fixed.get(key, 0) + 1
    if tally.equal_power:  # every fixed k x n design's correct calls, for the comparison at equal power
        for k, n in fixed_designs():
            for p in COMPARISONS:
                if p in NULL:
                    continue
                ci = table_interval(values[p[0]][:k, :n] - values[p[1]][:k, :n])
                tally.fixed_calls[k, n] = tally.fixed_calls.get((k, n), 0) + correct(p, ci.low, ci.high)


def run_cell(args: tuple[Cell, Design, int, int]) -> tuple[Cell, Tally]:
    cell, design, studies, seed = args
    rng = np.random.default_rng(seed)
    tally = Tally(studies=studies, equal_power=cell.variant == "equal power")
    prior_seed = PROFILES[cell.profile][0] ** 2  # the measured (1x) seed variance of a difference
    for _ in range(studies):
        earlier = earlier_grid(rng, cell, design) if design.earlier_seeds > 0 else None
        study(draw(rng, cell, design), design, tally, prior_seed, earlier)
    return cell, tally


def variant(name: str, base: Design) -> Design:
    """The design a variant runs: the base (the product's default DecideSpec, or the command line's) as it is,
    or with one setting a user may change. Futility off where a setting is varied: futility only ever removes
    calls, so off is where the error rate is tested hardest."""
    if name in ("default", "equal power"):
        return base
    off = replace(base, futility=0.0)
    if name == "futility off":
        return off
    if name.startswith("max_seeds "):
        most = int(name.split()[1])
        return replace(off, max_seeds=most, min_seeds=min(off.min_seeds, most))
    if name == "borrowed":  # decide.borrow_from: an earlier 3-seed grid of each arm, one seed of its own first
        return replace(off, min_seeds=1, earlier_seeds=base.earlier_seeds or 3)
    raise ValueError(f"unknown variant {name!r}: one of {', '.join(VARIANTS)}")


VARIANTS = ("default", "equal power", "futility off", "max_seeds 2", "max_seeds 3", "max_seeds 16", "borrowed")


def cells(variants: tuple[str, ...], full: bool) -> list[Cell]:
    """The default spec on the headline (image-dominated), mixed and seed-dominated profiles, each with arm
    D's seeds at 1x and 3x the others' spread, at the large effect (and the headline's small one); each other
    variant on the headline and seed-dominated, 1x and 3x. `full` adds the plain mean and the small effect
    everywhere."""
    profiles = [p for p in PROFILES if (full or p != "plain mean") and p not in SHARED_SEED_SD]
    out = []
    for v in variants:
        if v == "equal power":  # true effects of 0, 1 and 2 SE of the fixed 3 x 64 design (bench/equal_power.py)
            out += [Cell(p, 1.0, x * se_unit(*PROFILES[p]), v) for p in EQUAL_POWER_PROFILES for x in SE_UNITS]
            continue
        ps = profiles if v == "default" or full else ["headline", "seed-dominated"]
        out += [Cell(p, s, EFFECTS[0], v) for p in ps for s in (1.0, 3.0)]
        out += [Cell(p, s, EFFECTS[1], v) for p in ps for s in (1.0, 3.0)
                if full or (v == "default" and p == "headline" and s == 1.0)]  # fmt: skip
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="1,000 studies a cell instead of 10,000")
    ap.add_argument("--studies", type=int, help="studies a cell (overrides --quick)")
    ap.add_argument("--workers", type=int, default=2, help="cells simulated in parallel")
    ap.add_argument("--max-seeds", type=int, default=Design.max_seeds)
    ap.add_argument("--min-seeds", type=int, default=Design.min_seeds)
    ap.add_argument("--images", type=int, default=Design.images, help="the images every run is evaluated on first")
    ap.add_argument("--earlier", type=int, default=0, metavar="K0", help="each arm's seed variance pooled "
                    "with an earlier grid's of it on K0 seeds (borrowed.py)")
    ap.add_argument("--earlier-spread", type=float, help="arm D's seed SD in that earlier grid (default: as now)")
    ap.add_argument("--check", type=float, default=CHECK, help="the per-arm check's level")
    ap.add_argument("--image-seconds", type=float, default=IMAGE_HOURS * 3600,
                    help="GPU-seconds of one image evaluated on one run (default 10/64; 2.36 measured at seed size "
                         "with the eval defaults' LPIPS sampling, docs/benchmarks.md)")
    ap.add_argument("--futility", type=float, default=Design.futility)
    ap.add_argument("--seed-df-quantile", type=float, default=Design.seed_df_quantile)
    ap.add_argument("--borrow", type=float, default=0.0, metavar="DF",
                    help="the stretch: one seed of B-D, the seed variance borrowed from an earlier grid on DF df")
    ap.add_argument("--variant", action="append", choices=VARIANTS,
                    help="run only this variant of the spec (repeatable; default: every one)")
    args = ap.parse_args()
    studies = args.studies or (1000 if args.quick else 10_000)
    base = Design(min_seeds=args.min_seeds, max_seeds=args.max_seeds, images=args.images, futility=args.futility,
                  seed_df_quantile=args.seed_df_quantile, borrow_df=args.borrow, earlier_seeds=args.earlier,
                  earlier_spread=args.earlier_spread, check=args.check, image_hours=args.image_seconds / 3600)
    variants = tuple(args.variant or VARIANTS)
    start = time.monotonic()
    chunk = 250  # studies a job: each (cell, chunk) has its own RNG seed, so the table is the same however many workers
    todo = cells(variants, full=not args.quick and args.studies is None)
    jobs = [(c, variant(c.variant, base), min(chunk, studies - lo), 50_000 + 1000 * i + lo // chunk)
            for i, c in enumerate(todo) for lo in range(0, studies, chunk)]  # fmt: skip
    with ProcessPoolExecutor(max_workers=args.workers) as pool:
        parts = list(pool.map(run_cell, jobs))
    by_cell: dict[Cell, Tally] = {}
    for cell, tally in parts:
        by_cell[cell] = merged(by_cell[cell], tally) if cell in by_cell else tally
    fixed = fixed_hours(base.image_hours)
    print(f"{studies} studies a cell; alpha {ALPHA} per comparison; fixed design: {FIXED_SEEDS} seeds x "
          f"{FIXED_IMAGES} images, {fixed:.1f} GPU-h; an image on a run "
          f"{base.image_hours * 3600:.3g} GPU-s")  # fmt: skip
    for v in variants:
        print(f"{v}: {variant(v, base)}")
    print("| spec | profile | D's seed SD | effect | type I by look (cumulative; fixed) | power C-B / C-A / D-A "
          "(fixed; fixed at a level holding alpha) | GPU-h vs fixed | seeds added per study |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    worst_type1, worst_ratio, worst_held, headline_hours = 0.0, math.inf, math.inf, []
    over = []  # cells whose null rate is above alpha + 2 SE (the done-when's bound, per cell)
    for cell, t in by_cell.items():
        nulls = len(NULL) * t.studies
        cumulative, run = [], 0
        for j in range(1, max(t.null_by_look, default=0) + 1):
            run += t.null_by_look.get(j, 0)
            cumulative.append(run / nulls)
        worst_type1 = max([worst_type1, *cumulative])
        if cumulative and cumulative[-1] > ALPHA + 2 * math.sqrt(ALPHA * (1 - ALPHA) / nulls):
            over.append(f"{cell.variant} {cell.profile} {cell.spread:g}x {cumulative[-1]:.4f}")
        powers = []
        for p in ("C-B", "C-A", "D-A"):
            seq, fix, held = t.power.get(p, 0) / t.studies, t.power_fixed.get(p, 0) / t.studies, held_power(t, p)
            powers.append(f"{seq:.3f} ({fix:.3f}; {held:.3f})")
            if cell.variant == "default":
                worst_ratio = min(worst_ratio, seq / fix if fix > 0 else math.inf)
                worst_held = min(worst_held, seq / held if held > 0 else math.inf)
        ratio = t.hours / t.studies / fixed
        if cell.profile == "headline" and cell.variant == "default":
            headline_hours.append(ratio)
        looks = " / ".join(f"{x:.4f}" for x in cumulative) or "0"
        print(f"| {cell.variant} | {cell.profile} | {cell.spread:g}x | {cell.effect} | {looks} "
              f"({t.null_fixed / nulls:.4f}) | {' / '.join(powers)} | {ratio:.3f} | "
              f"{t.seeds_added / t.studies:.2f} |", flush=True)  # fmt: skip
    print(f"({time.monotonic() - start:.0f} s; the default spec's power against the fixed design at a level "
          f"holding alpha: lowest ratio {worst_held:.3f})")  # fmt: skip
    hours = max(headline_hours, default=math.nan)
    powers, ratios = [], []
    print("| profile | power at 2 SE | cheapest fixed k x n at that power (its power, GPU-h) | GPU-h at 0 / 1 / 2 SE "
          "| hours_vs_best_fixed | against the fixed designs' hours interpolated to that power |")  # fmt: skip
    print("|---|---|---|---|---|---|")
    for profile in EQUAL_POWER_PROFILES:
        at = {c.effect / se_unit(*PROFILES[c.profile]): t for c, t in by_cell.items()
              if c.variant == "equal power" and c.profile == profile}  # fmt: skip
        if len(at) < len(SE_UNITS):
            continue
        big = at[max(at)]
        power = sum(big.power.values()) / (3 * big.studies)
        fixed_power = {d: calls / (3 * big.studies) for d, calls in big.fixed_calls.items()}
        e = equal_power(power, [at[x].hours / at[x].studies for x in sorted(at)], fixed_power, SEED_HOURS,
                        base.image_hours)  # fmt: skip
        powers.append(power)
        ratios.append(e.ratio)
        print(f"| {profile} | {power:.3f} | {e.words()} | {' / '.join(f'{h:.1f}' for h in e.hours)} | "
              f"{'' if e.reached else '<'}{e.ratio:.3f} | {e.interpolated:.3f} |")  # fmt: skip
    named = f": {'; '.join(over)}" if over else ""
    print(f"null rate above alpha + 2 SE in {len(over)} of {len(by_cell)} cells{named}")
    print(f"gpu_hours_vs_fixed3 {hours:.3f} type_I {worst_type1:.4f} power {min(powers, default=math.nan):.3f} "
          f"hours_vs_best_fixed {max(ratios, default=math.nan):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
