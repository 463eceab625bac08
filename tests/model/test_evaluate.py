"""Evaluation: seeded per-sample noise, metric wiring (identity tokens, text edits), RNG hygiene."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from model.data import build_dataset
from model.evaluate import NO_EDITS_NOTE, evaluate, mean_se, sample_noise
from model.flow import FlowMatching
from model.nanodit import DiTOutput, NanoDiT
from model.perceptual import load_lpips
from model.spec import ArmSpec
from model.text import build_text_encoder

SPEC = ArmSpec.model_validate(
    {
        "model": {"size": "tiny"},
        "data": {"num_images": 64, "held_out": 8},
        "eval": {"num_samples": 6, "sampler_steps": 3, "lpips_backbone": "random_standin"},
    }
)


@pytest.fixture(scope="module")
def setup():
    dataset = build_dataset(SPEC)
    text = build_text_encoder(SPEC, dataset)
    lpips = load_lpips(SPEC.eval)
    flow = FlowMatching(SPEC.flow, SPEC.model.dims().patch)
    return dataset, text, lpips, flow


class Stub(nn.Module):
    """x-prediction stub: predicts the identity image when given one, else something from the text."""

    def __init__(self, use_text: bool) -> None:
        super().__init__()
        self.use_text = use_text
        self.scale = nn.Parameter(torch.ones(()))

    def forward(self, x_t, t, text, text_mask=None, identity=None, repa_block=None) -> DiTOutput:
        if identity is not None:
            return DiTOutput(out=identity * self.scale)
        level = text.mean(dim=(1, 2)).view(-1, 1, 1, 1) * 50 if self.use_text else 0.0
        return DiTOutput(out=torch.zeros_like(x_t) + 0.5 + level)


def test_noise_is_per_sample() -> None:
    batch = sample_noise(7, 0, [0, 1, 2, 3], (3, 8, 8))
    assert torch.equal(sample_noise(7, 0, [3], (3, 8, 8))[0], batch[3])
    assert not torch.equal(batch[0], batch[1])
    assert not torch.equal(sample_noise(7, 1, [0], (3, 8, 8))[0], batch[0])  # other stream
    assert not torch.equal(sample_noise(8, 0, [0], (3, 8, 8))[0], batch[0])  # other seed


def test_mean_se() -> None:
    mean, se, n = mean_se(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    assert (mean, n) == (2.5, 4)
    assert se == pytest.approx(torch.tensor([1.0, 2.0, 3.0, 4.0]).std().item() / 2)
    assert mean_se(torch.tensor([1.0]))[1] is None


def test_metrics_wiring(setup) -> None:
    dataset, text, lpips, flow = setup
    out = evaluate(Stub(use_text=True), text, flow, dataset, SPEC.eval, lpips, "cpu")
    # Recon generates with the target's identity: the stub returns it, so the sample is the target.
    assert out["recon_lpips"] == pytest.approx(0.0, abs=1e-6)
    assert out["text_lpips"] > 0.05  # a flat grey image is far from the shapes
    assert out["text_manip_delta"] > 0  # the edited caption changes the stub's output
    assert out["recon_lpips_n"] == out["text_lpips_n"] == out["text_manip_delta_n"] == 6
    assert out["text_lpips_se"] > 0 and math.isfinite(out["text_lpips_se"])
    assert out["lpips_backbone"] == "random_standin" and out["text_manip_note"] is None
    assert len(out["text_lpips_samples"]) == 6  # per sample, in held-out order: the dashboard pairs them
    assert sum(out["text_lpips_samples"]) / 6 == pytest.approx(out["text_lpips"])
    blind = evaluate(Stub(use_text=False), text, flow, dataset, SPEC.eval, lpips, "cpu")
    assert blind["text_manip_delta"] == pytest.approx(0.0, abs=1e-7)


def test_metrics_are_a_function_of_the_weights(setup) -> None:
    dataset, text, lpips, flow = setup
    torch.manual_seed(0)
    model = NanoDiT(SPEC, text.dim)
    with torch.no_grad():  # the zero-initialised output layer would make every sample identical
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.train()
    rng = torch.get_rng_state()
    a = evaluate(model, text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=4)
    assert torch.equal(torch.get_rng_state(), rng)  # training's RNG stream is untouched
    assert model.training and text.training  # modes restored
    torch.manual_seed(123)  # a different global RNG state must not matter
    b = evaluate(model, text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=6)
    for key in ("recon_lpips", "text_lpips", "text_manip_delta"):
        # abs: the delta is a difference of two LPIPS values of about 1e-6 here, so batch-size-dependent
        # summation order moves its last digits (3e-11 apart, once, in a full run): not a weights change
        assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-9), key
    assert a["recon_lpips"] != a["text_lpips"]


def test_dataset_without_edits_skips_text_manip_delta(tmp_path: Path) -> None:
    """An imagefolder whose captions admit no edit: the delta is None with a note, the rest is measured."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(tmp_path / f"img{i}.png")
    lines = [json.dumps({"file": f"img{i}.png", "caption": f"a thing number {i}"}) for i in range(4)]
    (tmp_path / "captions.jsonl").write_text("\n".join(lines))
    spec = SPEC.model_copy(
        update={
            "data": SPEC.data.model_copy(update={"dataset": "imagefolder", "path": str(tmp_path), "held_out": 2}),
            "eval": SPEC.eval.model_copy(update={"num_samples": 2}),
        }
    )
    dataset = build_dataset(spec)
    assert not dataset.supports_edits
    text = build_text_encoder(spec, dataset)
    out = evaluate(Stub(use_text=True), text, FlowMatching(spec.flow, spec.model.dims().patch), dataset, spec.eval,
                   load_lpips(spec.eval), "cpu")  # fmt: skip
    assert out["text_manip_delta"] is None and out["text_manip_delta_se"] is None and out["text_manip_delta_n"] is None
    assert out["text_manip_note"] == NO_EDITS_NOTE
    assert out["recon_lpips"] == pytest.approx(0.0, abs=1e-6) and out["text_lpips"] > 0 and out["text_lpips_n"] == 2


def test_kept_images_are_the_generations_the_metrics_scored(setup) -> None:
    """keep_images returns the first held-out targets with their generations (across batches), and the
    first caption/edit pairs, in [0, 1]; the metrics are the same as without it."""
    from model.evaluate import SAMPLE_IMAGES, SAMPLE_PAIRS

    dataset, text, lpips, flow = setup
    out = evaluate(Stub(use_text=True), text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=3, keep_images=True)
    plain = evaluate(Stub(use_text=True), text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=3)
    assert out["recon_lpips"] == plain["recon_lpips"] and out["text_lpips_samples"] == plain["text_lpips_samples"]
    images = out["images"]
    held, captions = dataset.held_out(SAMPLE_IMAGES)
    assert [c for c, _ in images["target"]] == captions == [c for c, _ in images["recon"]]
    for i, (_, img) in enumerate(images["target"]):
        assert torch.allclose(img, dataset.to_unit(held[i]).clamp(0, 1))
        # the stub returns the identity image: the reconstruction is the target
        assert torch.allclose(images["recon"][i][1], img, atol=1e-5)
    assert len(images["text"]) == SAMPLE_IMAGES
    pairs = dataset.edit_pairs(SAMPLE_PAIRS)
    assert [c for c, _ in images["caption"]] == [a for a, _ in pairs]
    assert [c for c, _ in images["edit"]] == [b for _, b in pairs]
    assert not torch.equal(images["caption"][0][1], images["edit"][0][1])  # the edit steers the stub
    assert all(0 <= img.min() and img.max() <= 1 for kind in images.values() for _, img in kind)
    assert "images" not in plain


def test_val_flow_loss_is_stored_with_se_samples_and_per_time_means(setup) -> None:
    """val_flow_loss: one value per held-out image (its mean over the 8 times), their mean and SE, and
    the 8 per-time means, whose mean is the same number; a function of the weights alone."""
    from model.evaluate import VAL_TIMESTEPS

    dataset, text, lpips, flow = setup
    torch.manual_seed(0)
    model = NanoDiT(SPEC, text.dim)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    model.train()
    a = evaluate(model, text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=4)
    assert a["val_flow_loss_n"] == 6 and len(a["val_flow_loss_samples"]) == 6
    assert len(a["val_flow_loss_by_t"]) == VAL_TIMESTEPS == len(a["val_flow_loss_t"])
    assert sum(a["val_flow_loss_samples"]) / 6 == pytest.approx(a["val_flow_loss"])
    assert sum(a["val_flow_loss_by_t"]) / VAL_TIMESTEPS == pytest.approx(a["val_flow_loss"])
    assert a["val_flow_loss_se"] > 0 and "fp32" in a["val_flow_definition"]
    torch.manual_seed(99)
    b = evaluate(model, text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=6)
    assert b["val_flow_loss_samples"] == pytest.approx(a["val_flow_loss_samples"], rel=1e-5)
    assert model.training  # eval mode only for the call (no TREAD routing inside it)
    with torch.no_grad():  # other weights, same triples: another value
        model.final.linear.weight.add_(0.1)
    c = evaluate(model, text, flow, dataset, SPEC.eval, lpips, "cpu", batch_size=4)
    assert c["val_flow_loss"] != pytest.approx(a["val_flow_loss"], rel=1e-3)


def test_val_flow_loss_of_the_exact_velocity_is_zero(setup) -> None:
    """An oracle that knows each cell's (x0, noise) predicts the target exactly: the loss is 0, so the
    grid feeds the model exactly the seeded triples it claims."""
    from model.evaluate import STREAM_FLOW, VAL_TIMESTEPS, flow_loss_grid
    from model.flow import val_timesteps

    dataset, text, _, flow = setup
    images, captions = dataset.held_out(3)

    class Oracle(nn.Module):
        def forward(self, x_t, t, text, text_mask=None, identity=None, repa_block=None) -> DiTOutput:
            k = int(torch.searchsorted(val_timesteps(VAL_TIMESTEPS), t[:1]).item())
            keys = [i * VAL_TIMESTEPS + k for i in range(len(x_t))]
            eps = sample_noise(5, STREAM_FLOW, keys, tuple(x_t.shape[1:]))
            x0 = (x_t - t.view(-1, 1, 1, 1) * eps) / (1 - t.view(-1, 1, 1, 1))
            return DiTOutput(out=x0)

    grid = flow_loss_grid(Oracle(), text, flow, images, captions, seed=5, device="cpu", batch_size=3)
    assert grid.shape == (3, VAL_TIMESTEPS) and grid.max().item() < 1e-8
    grid = flow_loss_grid(Oracle(), text, flow, images, captions, seed=6, device="cpu", batch_size=3)
    assert grid.min().item() > 1e-3  # other noise than the oracle assumed
