"""What share of a night do the distribution passes (eval.distribution) take, priced as the night planner prices
them (orchestrator/grids/projection.py: measured seconds per generated sample where there are some, else the FLOP
estimate of orchestrator/grids/distribution_price.py)?

The night: arms A-D of arms/ at seed size (1024 px, 4096 tokens an image), 5000 steps, one seed each, their own
checkpoint cadence (schedule.checkpoint_every), every run's training, start and evaluations at the planner's
FLOP estimate (an H100's measured rate); the pass's metrics default to cmmd, dino_mmd and fd_dinov2 (CLIP
ViT-L/14-336 and DINOv2 ViT-B/14), data.held_out raised to the samples (the reference set holds as many). The
share is the passes' GPU-hours over the night's, per arm and for the grid; the default (samples, every) must keep
the grid's share at or below 5%.

    python bench/distribution_cost.py                       # FLOP-based: nothing measured yet
    python bench/distribution_cost.py --per-sample-s 0.31   # a GPU's measured seconds per generated sample
    python bench/distribution_cost.py --samples 512 --every 2

The last line reads `distribution share <the grid's share> at samples <n>, every <k> (<source>)`.
"""

from __future__ import annotations

import argparse

from model.spec import ArmSpec, DistributionSpec
from orchestrator.grids.arms import resolve
from orchestrator.grids.distribution_price import distribution_passes, sample_seconds
from orchestrator.grids.projection import Rates, distribution_key, project

ARMS = ("A", "B", "C", "D")
METRICS = ["cmmd", "dino_mmd", "fd_dinov2"]
STEPS = 5000
BUDGET = 0.05  # the issue's bound on the passes' share of the night
CANDIDATES = [(n, k) for n in (256, 512, 1000, 2000) for k in (1, 2, 5)]


def night_arms(samples: int, every: int) -> list[ArmSpec]:
    """A-D at seed size with the pass on: `samples` per pass at each `every`-th checkpoint."""
    out = []
    for arm in ARMS:
        spec = resolve(arm, {"schedule": {"steps": STEPS}})
        dist = DistributionSpec(metrics=METRICS, samples=samples, every=every,
                                sampler_steps=spec.eval.distribution.sampler_steps)  # fmt: skip
        data = spec.data.model_copy(update={"held_out": max(spec.data.held_out, samples)})
        out.append(spec.model_copy(update={"eval": spec.eval.model_copy(update={"distribution": dist}), "data": data}))
    return out


def shares(samples: int, every: int, per_sample_s: float | None) -> tuple[float, list[tuple[str, float, float, int]]]:
    """(the grid's share, per arm (arm, its pass hours, its whole run's hours, its passes))."""
    specs = night_arms(samples, every)
    rates = Rates(None, {}, distribution_s={distribution_key(s): per_sample_s for s in specs} if per_sample_s else {})
    rows = []
    for arm, spec in zip(ARMS, specs, strict=True):
        p = project(spec, rates)
        rows.append((arm, p.distribution_hours, (p.hours or 0.0) + p.fixed_hours, distribution_passes(spec)))
    return sum(r[1] for r in rows) / sum(r[2] for r in rows), rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=None, help="samples a pass (default: the spec's)")
    parser.add_argument("--every", type=int, default=None, help="each k-th checkpoint (default: the spec's)")
    parser.add_argument("--per-sample-s", type=float, default=None,
                        help="measured GPU-seconds per generated sample of a pass (default: the FLOP estimate)")
    args = parser.parse_args()
    default = DistributionSpec()
    samples, every = args.samples or default.samples, args.every or default.every
    source = f"measured {args.per_sample_s:g} s a sample" if args.per_sample_s else "FLOP estimate"
    one = night_arms(samples, every)[0]
    print(f"seed size, {STEPS} steps, checkpoint_every {one.schedule.checkpoint_every}, batch "
          f"{one.schedule.batch_size}; pass: {', '.join(METRICS)}, {one.eval.distribution.sampler_steps} sampler "
          f"steps; {source}")  # fmt: skip
    print(f"seconds a generated sample (estimate): {sample_seconds(one):.3f}; a pass at 2,000 samples "
          f"{2000 * sample_seconds(one):.0f} s, at 10,000 {10000 * sample_seconds(one):.0f} s")
    print(f"{'samples':>8} {'every':>5} {'passes':>6} {'pass h (A)':>10} {'grid share':>10}")
    for n, k in CANDIDATES:
        share, rows = shares(n, k, args.per_sample_s)
        mark = "" if share <= BUDGET else "  > 5%"
        print(f"{n:>8} {k:>5} {rows[0][3]:>6} {rows[0][1] / max(rows[0][3], 1):>10.3f} {share:>10.1%}{mark}")
    share, rows = shares(samples, every, args.per_sample_s)
    print("per arm at the defaults:")
    for arm, pass_h, total_h, passes in rows:
        print(f"  {arm}: {passes} passes {pass_h:.3f} h of {total_h:.2f} h ({pass_h / total_h:.1%})")
    print(f"distribution share {share:.1%} at samples {samples}, every {every} ({source})")


if __name__ == "__main__":
    main()
