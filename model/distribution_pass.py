"""One distribution pass: generate eval.distribution.samples images from fixed prompts and noise, embed them
and score them against a reference set's features (CMMD, DINO-MMD, FD-DINOv2; model/distribution_stats.py).

Pairing: sample i is generated from held-out caption i with noise seeded by (eval.seed, STREAM_DISTRIBUTION, i)
on the CPU, so it is the same prompt and noise for every arm, seed, checkpoint and evaluation; the per-sample
MMD values (`<metric>_samples`) then pair across arms image by image, as val_flow_loss's do, and the report's
crossed seeds x images interval reads them unchanged. The reference images are one draw shared by every arm,
seed and sample, so their noise is in no per-sample list: each MMD also carries its per-reference-image values
(`<metric>_per_reference`, group means past MAX_REFERENCE_VALUES), whose paired difference's spread over the
reference images, / their count, is the reference part of an effect's variance. FD splits into jackknife
groups, not samples: its record carries the value, the jackknife SE and the estimated small-n bias, and no
per-sample list.

No classifier-free guidance: the trainer never drops captions, so the model has no unconditional path to guide
with (eval.distribution.guidance > 1 is refused at submit, model/spec.py). Pure model code: the caller hands in
the extractors and the reference features (worker/distribution.py loads and caches them).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import torch
from torch import Tensor, nn

from model.distribution_stats import (
    FD_GROUPS,
    fd_jackknife,
    frechet_reference,
    grouped_means,
    mmd_contributions,
    mmd_reference_contributions,
    reference,
)
from model.evaluate import generate, sample_noise
from model.flow import FlowMatching
from model.spec import MAX_REFERENCE_VALUES, REFERENCE_SUFFIX

STREAM_DISTRIBUTION = 3  # noise stream of the distribution pass's samples (model/evaluate.py's streams are 0-2)
MMD_METRICS = ("cmmd", "dino_mmd")  # per-sample values: paired across arms, enter the crossed interval


class Features(Protocol):
    """What the pass needs of an extractor (model/extractors Extractor)."""

    name: str
    label: str
    stand_in: bool

    def __call__(self, images: Tensor) -> Tensor: ...


def fd_groups(samples: int) -> int:
    """FD's jackknife groups: FD_GROUPS, fewer (2 samples a group) under 2 x FD_GROUPS samples."""
    return min(FD_GROUPS, samples // 2)


def to_signed(dataset: Any, images: Tensor) -> Tensor:
    """The dataset's pixel range -> [-1, 1], clamped (a generation can overshoot): what an extractor takes."""
    return dataset.to_unit(images.float()).clamp(0, 1) * 2 - 1


@torch.no_grad()
def embed(extractor: Features, images: Tensor, batch_size: int) -> Tensor:
    """(n, dim) float32 CPU features of (n, 3, H, W) images in [-1, 1], `batch_size` at a time."""
    chunks = range(0, len(images), batch_size)
    return torch.cat([extractor(images[lo : lo + batch_size]).float().cpu() for lo in chunks])


@torch.no_grad()
def generate_samples(model: nn.Module, text_encoder: nn.Module, flow: FlowMatching, dataset: Any, samples: int,
                     steps: int, seed: int, device: str | torch.device, batch_size: int = 32,
                     autocast: Callable[[], Any] = contextlib.nullcontext) -> Tensor:  # fmt: skip
    """(samples, 3, H, W) CPU images in [-1, 1]: sample i from held-out caption i (caption only) and its noise."""
    images, captions = dataset.held_out(samples)  # the prompts: held-out captions (their images are the reference)
    shape = tuple(images.shape[1:])
    out = []
    for lo in range(0, samples, batch_size):
        idx = list(range(lo, min(lo + batch_size, samples)))
        noise = sample_noise(seed, STREAM_DISTRIBUTION, idx, shape).to(device)
        text, mask = text_encoder([captions[i] for i in idx])
        made = generate(model, flow, noise, text.to(device), mask.to(device), None, steps, autocast)
        out.append(to_signed(dataset, made).cpu())
    return torch.cat(out)


def _mean_se(values: Tensor) -> tuple[float, float]:
    v = values.double()
    return float(v.mean()), float(v.std(unbiased=True) / math.sqrt(len(v)))


def score(metric: str, features: Tensor, ref_features: Tensor, label: str, normalise: bool = True) -> dict[str, Any]:
    """The record fields of `metric` for generated `features` against `ref_features` (both (n, d)):
    `<metric>`, `_se`, `_n`, `_extractor` and, for an MMD, `_samples` (the per-sample values, mean = value) and
    `_per_reference` (the per-reference-image values, grouped to at most MAX_REFERENCE_VALUES). `_se` is the
    generated samples' part alone: the reference is common to every checkpoint of a run, so a run's own curve
    does not see its noise; an effect between arms adds it (orchestrator/results/reports/stats.py).
    normalise=False: the MMDs take the features as they are (a known-truth simulation's, bench/distribution_sim.py)."""
    n = len(features)
    out: dict[str, Any] = {f"{metric}_n": n, f"{metric}_extractor": label}
    if metric in MMD_METRICS:
        ref = reference(ref_features, normalise=normalise)
        values = mmd_contributions(features, ref, normalise=normalise)  # x1000, the U-statistic's pseudo-values
        out[metric], out[f"{metric}_se"] = _mean_se(values)
        out[f"{metric}_samples"] = values.tolist()
        refs = mmd_reference_contributions(features, ref, normalise=normalise)
        out[f"{metric}{REFERENCE_SUFFIX}"] = grouped_means(refs, MAX_REFERENCE_VALUES).tolist()
    elif metric == "fd_dinov2":
        est = fd_jackknife(features, frechet_reference(ref_features, fd_groups(n)))
        out[metric], out[f"{metric}_se"] = est.value, est.se  # the plug-in value, as the field reports it
        out[f"{metric}_bias"] = est.bias  # its small-n bias (jackknife): value - bias removes the 1/n parts
    else:
        raise ValueError(f"no distribution metric {metric!r}")
    return out


def distribution_metrics(generated: Tensor, metrics: list[str], extractors: Mapping[str, Features],
                         references: Mapping[str, Tensor], batch_size: int = 32) -> dict[str, Any]:  # fmt: skip
    """Score `generated` (n, 3, H, W in [-1, 1]) on each metric; extractors[metric] embeds it and
    references[metric] holds that extractor's reference features (computed once, worker/distribution.py).
    Metrics that share an extractor embed the samples once."""
    embedded: dict[int, Tensor] = {}
    out: dict[str, Any] = {}
    for metric in metrics:
        ex = extractors[metric]
        if id(ex) not in embedded:
            embedded[id(ex)] = embed(ex, generated, batch_size)
        out |= score(metric, embedded[id(ex)], references[metric], ex.label)
    return out
