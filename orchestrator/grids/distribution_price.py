"""What the distribution passes of a run (eval.distribution: CMMD, DINO-MMD, FD-DINOv2) cost on one GPU, estimated
from FLOPs, for the night planner where no run measured a pass yet (grids/projection.py prices a pass from the
`distribution_seconds` of earlier records where there are some). Torch-free: the submit path imports it.

A pass at a checkpoint generates `samples` images (sampler_steps Euler steps, twice the forward passes with
classifier-free guidance) and embeds them with each metric's extractor; the reference set's features are computed
once per grid and extractor, priced here once per run (a node without the checkpoint store computes its own).
"""

from __future__ import annotations

from model.spec import ArmSpec, estimate_params
from orchestrator.grids.replicates import REFERENCE_TOKENS_PER_S, tokens_per_image, tokens_per_s_of

# The network each metric embeds with during training: model/extractors/registry.py EXTRACTOR_FOR_METRIC (which
# imports torch through its package; a test holds the two equal). fid has no extractor there.
EXTRACTOR_OF_METRIC = {"cmmd": "clip-vit-l-14-336", "dino_mmd": "dinov2-vit-b-14", "fd_dinov2": "dinov2-vit-b-14"}
# FLOPs of one image's forward pass: 2 x parameters x tokens, a ViT's parameters 12 x width^2 x depth, its tokens
# (resolution / 14)^2 + 1 (model/extractors/registry.py: CLIP ViT-L/14 at 336 px, width 1024, depth 24; DINOv2
# ViT-B/14 at 224 px, width 768, depth 12); attention's share is small at these token counts and left out.
EXTRACTOR_FLOPS = {
    "clip-vit-l-14-336": 2 * 12 * 1024**2 * 24 * ((336 // 14) ** 2 + 1),  # 0.35 TFLOP
    "dinov2-vit-b-14": 2 * 12 * 768**2 * 12 * ((224 // 14) ** 2 + 1),  # 0.044 TFLOP
}
# The FLOP rate an extractor is assumed to run at: the trainer's own at seed size on an H100 (6 x parameters
# FLOPs per token at REFERENCE_TOKENS_PER_S, grids/replicates.py), about 0.29 PFLOP/s.
ACHIEVED_FLOPS = 6 * estimate_params(ArmSpec()) * REFERENCE_TOKENS_PER_S


def distribution_passes(spec: ArmSpec) -> int:
    """Checkpoints a run measures the distribution metrics at: each eval.distribution.every-th and the last (as
    the worker's pass decides: worker/distribution.py `due`); 0 where no metric is asked for."""
    dist = spec.eval.distribution
    if not dist.metrics:
        return 0
    every, steps = spec.schedule.checkpoint_every, spec.schedule.steps
    checkpoints = [*range(every, steps, every), steps]
    return sum(1 for step in checkpoints if step == steps or (step // every) % dist.every == 0)


def extractor_seconds_per_image(spec: ArmSpec) -> float:
    """One image through every extractor the metrics need (metrics sharing a network share its pass)."""
    networks = {EXTRACTOR_OF_METRIC[m] for m in spec.eval.distribution.metrics if m in EXTRACTOR_OF_METRIC}
    return sum(EXTRACTOR_FLOPS[n] for n in networks) / ACHIEVED_FLOPS


def sample_seconds(spec: ArmSpec) -> float:
    """One generated sample of a pass: its sampler's forward passes at a third of a training step's cost per
    token (as the planner prices an evaluation, grids/projection.py), then its extractors."""
    dist = spec.eval.distribution
    forwards = dist.sampler_steps * (2 if dist.guidance > 1 else 1)  # guidance: a conditional and an unconditional
    return forwards * tokens_per_image(spec) / 3 / tokens_per_s_of(spec) + extractor_seconds_per_image(spec)


def estimated_distribution_seconds(spec: ArmSpec) -> float:
    """A run's distribution passes in seconds, estimated: each pass's samples, and the reference's features once."""
    passes = distribution_passes(spec)
    if not passes:
        return 0.0
    reference = spec.data.held_out * extractor_seconds_per_image(spec)
    return passes * spec.eval.distribution.samples * sample_seconds(spec) + reference
