"""Replicates: an arm trained at several training seeds on one fixed held-out split, and what they cost.

A grid's `seeds: N` runs every arm N times. Replicate s trains with data.seed = the arm's data.seed + s
(initialisation, data order, flow noise and timesteps, TREAD routing) and evaluates on the split of the
arm's own data.seed (data.split_seed), so every arm and seed of a grid is scored on the same images with
the same evaluation noise, and seed s of one arm pairs with seed s of another.
"""

from __future__ import annotations

from dataclasses import dataclass

from model.spec import ArmSpec, estimate_params
from orchestrator.numbers import estimate

MAX_SEEDS = 16
SHOWN_IN_SECONDS_BELOW = 0.01  # GPU-hours: under 36 s the cost is also given in GPU-seconds
SEED_ENV = "ABLATE_SEED"  # a command arm's replicate index; using it is the researcher's script's job

# The projection's rate: arm A at seed size trained 218.8k image tokens/s on one H100 (docs/benchmarks.md,
# the quad night); other sizes are scaled by parameters (6 x params FLOPs per token). Small models run
# below that efficiency, so a small arm's projection is optimistic: a planning number, not a promise.
REFERENCE_TOKENS_PER_S = 218.8e3


def replicate_spec(spec: ArmSpec, seed: int) -> ArmSpec:
    """The spec of replicate `seed` (0-based) of an arm: only the training seed moves; the held-out split
    stays the one the arm named (its split_seed, else its data.seed)."""
    if spec.command is not None:
        env = {**spec.command.env, SEED_ENV: str(seed)}
        return spec.model_copy(update={"command": spec.command.model_copy(update={"env": env})})
    data = spec.data.model_copy(update={"seed": spec.data.seed + seed, "split_seed": spec.data.dataset_seed()})
    return spec.model_copy(update={"data": data})


def projected_gpu_hours(spec: ArmSpec) -> float | None:
    """A rough GPU-hour projection of one run of a built-in arm (None for a command arm: its model is
    the researcher's)."""
    if spec.command is not None:
        return None
    tokens_per_step = spec.schedule.batch_size * tokens_per_image(spec)
    return spec.schedule.steps * tokens_per_step * block_share(spec) / tokens_per_s_of(spec) / 3600


def tokens_per_image(spec: ArmSpec) -> int:
    return (spec.resolution() // spec.model.dims().patch) ** 2


def tokens_per_s_of(spec: ArmSpec) -> float:
    """The training rate the projection assumes for this arm on one GPU: the reference rate scaled by
    parameters."""
    reference = estimate_params(ArmSpec())  # the defaults: arm A at seed size
    return REFERENCE_TOKENS_PER_S * reference / max(estimate_params(spec), 1)


def block_share(spec: ArmSpec) -> float:
    """The share of the blocks' token work a step does: TREAD routes `rate` of the tokens past blocks
    first..last (seed size, B: 1 - 0.5 x 16/18 = 0.56). Linear in tokens, so attention's quadratic saving
    is left out: arm C measured 2.08x A's tokens/s, the estimate says 1.8x."""
    if not spec.tread.enabled:
        return 1.0
    depth = spec.model.dims().depth
    last = spec.tread.last_block if spec.tread.last_block is not None else depth - 2
    return 1 - spec.tread.rate * (last - spec.tread.first_block + 1) / depth


@dataclass(frozen=True)
class GridCost:
    arms: int
    seeds: int
    runs: int
    gpu_hours: float | None  # None when some arm cannot be projected (a command arm)
    projected: float  # the GPU-hours of the arms that can be projected

    def text(self) -> str:
        """E.g. "5 arms x 3 seeds = 15 runs, about 41.2 GPU-hours (H100, projected)"."""
        # A tiny grid's hours are a fraction of a minute: its seconds too, which read at a glance.
        seconds = ""
        if 0 < self.projected < SHOWN_IN_SECONDS_BELOW:
            seconds = f", {estimate(self.projected * 3600)} GPU-seconds"
        hours = f"about {estimate(self.projected)} GPU-hours{seconds} (projected at an H100's measured rate"
        hours += ", command arms not included)" if self.gpu_hours is None else ")"
        return f"{counted(self.arms, 'arm')} x {counted(self.seeds, 'seed')} = {counted(self.runs, 'run')}, {hours}"


def counted(n: int, noun: str) -> str:
    """ "1 seed", "3 seeds": the count and its noun, singular for one."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def grid_cost(specs: list[ArmSpec], seeds: int) -> GridCost:
    hours = [projected_gpu_hours(s) for s in specs]
    known = sum(h for h in hours if h is not None) * seeds
    total = None if any(h is None for h in hours) else known
    return GridCost(arms=len(specs), seeds=seeds, runs=len(specs) * seeds, gpu_hours=total, projected=known)
