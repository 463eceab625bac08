"""The distribution pass on a node: which checkpoints it runs at, its extractors, and the reference features,
computed once per data split and extractor and reused by every run and evaluation after.

- Cadence (eval.distribution.every = k): each k-th checkpoint and always the last. The best checkpoint is
  only known at the end: the controller then evaluates it where this pass skipped it
  (orchestrator/results/best_distribution.py).
- Extractors: model/extractors `load_extractor(..., stand_in="auto")`: the pinned weights where this node
  has them or can copy them from the checkpoint store (`ablate weights fetch`), else a labelled stand-in;
  the label goes on every value (`<metric>_extractor`) and the reason into the run's fallbacks.
- Reference: the grid's held-out split (data.held_out images, at least the samples), embedded once. Its
  features are kept under `<node dir>/references/<key>.pt` and, with a checkpoint store, in
  `<store root>/references/<key>.pt` (worker/references.py: the store's copy is read only where the controller
  pinned the key, and used only when it is the pinned features). The key (worker/reference_keys.py)
  hashes the extractor's label and the data section, so every arm and seed of a grid (and any grid on the same
  split) scores against the same features.
Every measured record carries `distribution_seconds` (the pass's wall time: the planner prices a pass from
it), `distribution_sha256` (label -> the features' sha256: the controller checks it against its pin) and
`distribution_reference` (the same in words, with where the features came from).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from model.distribution_pass import distribution_metrics, embed, generate_samples, to_signed
from model.spec import ArmSpec
from worker.reference_keys import reference_key
from worker.references import ReferenceCache

EMBED_BATCH = 32
REASON_CHARS = 300  # a fallback reason's first line is kept to this many characters, cut at a word


def first_line_clipped(text: str, limit: int = REASON_CHARS) -> str:
    """The text's first line, whole where it fits in `limit` characters, else cut at the last word that fits
    and ended with an ellipsis (a word cut in two reads as a different word)."""
    line = (text.splitlines() or [""])[0]
    if len(line) <= limit:
        return line
    head = line[: limit - 1]
    cut = head.rsplit(" ", 1)[0] if " " in head else head
    return cut.rstrip(" ,;:") + "…"


def store_root(storage: dict[str, Any] | None) -> dict[str, Any] | None:
    """The checkpoint store's root (where `ablate weights fetch` stages weights) from a run's StoreConfig."""
    if not storage:
        return None
    return {"url": storage["url"].rstrip("/").rsplit("/", 1)[0], "options": storage.get("options") or {}}


class DistributionPass:
    """The pass for one arm on one device: `due` says when, `measure` gives the record's fields."""

    def __init__(self, spec: ArmSpec, device: torch.device | str, node_dir: Path,
                 storage: dict[str, Any] | None = None, *, samples: int | None = None,
                 metrics: list[str] | None = None, final: bool = False,
                 pins: dict[str, str] | None = None) -> None:  # fmt: skip
        dist = spec.eval.distribution
        self.spec, self.device = spec, torch.device(device)
        self.metrics = list(metrics if metrics is not None else dist.metrics)
        self.samples = samples or dist.samples
        self.every = dist.every
        self.root = store_root(storage)
        self.cache = ReferenceCache(node_dir, self.root, pins)  # pins: the job's EvaluationArgs.reference_pins
        self.final = final  # after the night: the final extractors (DINOv2 ViT-L/14)
        self._extractors: dict[str, Any] | None = None

    def due(self, step: int, last: bool) -> bool:
        if not self.metrics:
            return False
        return last or (step // self.spec.schedule.checkpoint_every) % self.every == 0

    def extractors(self) -> dict[str, Any]:
        """metric -> its extractor, loaded once (metrics sharing a network share one)."""
        if self._extractors is None:
            from model.extractors import EXTRACTOR_FOR_METRIC, FINAL_EXTRACTOR_FOR_METRIC, load_extractor

            names = FINAL_EXTRACTOR_FOR_METRIC if self.final else EXTRACTOR_FOR_METRIC
            loaded: dict[str, Any] = {}
            for name in {names[m] for m in self.metrics}:
                loaded[name] = load_extractor(
                    name, stand_in="auto", device=self.device,
                    store_url=self.root["url"] if self.root else None,
                    store_options=self.root["options"] if self.root else None,
                )  # fmt: skip
            self._extractors = {m: loaded[names[m]] for m in self.metrics}
        return self._extractors

    def fallbacks(self) -> list[str]:
        """A line per stand-in extractor: why the real weights were not used (the run's fallbacks)."""
        seen = {ex.label: ex for ex in self.extractors().values() if ex.stand_in}
        return [f"{label}: {first_line_clipped(ex.reason or '')}" for label, ex in seen.items()]

    def measure(self, model: nn.Module, text_encoder: nn.Module, flow: Any, dataset: Any,
                autocast: Callable[[], Any] = contextlib.nullcontext) -> dict[str, Any]:  # fmt: skip
        """The pass's record fields (model/distribution_pass.py's, per metric) and its wall seconds. `model` and
        `text_encoder` are put in eval mode for the call and restored; the global RNG is left untouched."""
        t0 = time.perf_counter()
        extractors = self.extractors()
        was = (model.training, text_encoder.training)
        model.eval()
        text_encoder.eval()
        cuda = [self.device.index or 0] if self.device.type == "cuda" else []
        try:
            with torch.random.fork_rng(devices=cuda):
                generated = generate_samples(
                    model, text_encoder, flow, dataset, self.samples, self.spec.eval.distribution.sampler_steps,
                    self.spec.eval.seed, self.device, EMBED_BATCH, autocast,
                )  # fmt: skip
        finally:
            model.train(was[0])
            text_encoder.train(was[1])
        references, shas, where = {}, {}, {}
        held = None
        for metric, ex in extractors.items():

            def compute(ex: Any = ex) -> torch.Tensor:
                nonlocal held
                if held is None:
                    held = to_signed(dataset, dataset.held_out(self.spec.data.held_out)[0])
                return embed(ex, held, EMBED_BATCH)

            features, sha, source = self.cache.get(reference_key(ex.label, self.spec), compute)
            references[metric], shas[ex.label], where[ex.label] = features, sha, source
        out = distribution_metrics(generated, self.metrics, extractors, references, EMBED_BATCH)
        m = self.spec.data.held_out
        out["distribution_sha256"] = dict(shas)
        out["distribution_reference"] = "; ".join(f"{label}: sha256 {sha[:16]}, m={m} held-out images ({where[label]})"
                                                  for label, sha in shas.items())  # fmt: skip
        if self.cache.notes:
            out["distribution_notes"] = list(dict.fromkeys(self.cache.notes))
            self.cache.notes.clear()
        out["distribution_seconds"] = time.perf_counter() - t0
        return out
