"""Precision: the FP8 module filter converts exactly the intended linears; FP8 trains on CPU; refusals."""

import pytest
import torch
from torch import nn
from torchao.float8.float8_linear import Float8Linear

from model.nanodit import NanoDiT
from model.precision import CPU_FP8_EMULATED, PrecisionError, apply_precision, autocast_ctx, fp8_decision
from orchestrator.grids.arms import resolve

TEXT_DIM = 32
DEFAULT = ["*.attn.qkv", "*.attn.proj", "*.mlp.fc1", "*.mlp.fc2"]


def fp8_spec(autotune: bool = False, **model):
    precision = {"fp8_modules": DEFAULT, "fp8_autotune": autotune}
    return resolve("I", {"model": {"size": "tiny", **model}, "precision": precision})


def build(spec) -> NanoDiT:
    torch.manual_seed(0)
    return NanoDiT(spec, TEXT_DIM)


def test_filter_converts_exactly_the_block_projections():
    spec = fp8_spec()
    model = build(spec)
    report = apply_precision(model, spec.precision, "cpu")
    converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    expected = sorted(
        f"blocks.{i}.{leaf}" for i in range(4) for leaf in ("attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2")
    )
    assert converted == expected == sorted(report.fp8_linears)
    assert report.autotune == "skipped: not CUDA" and report.fp8_timings == []  # no speed claim on CPU
    # everything else stays a plain nn.Linear and the report says why
    assert "blocks.0.cross.q" in report.bf16_linears and "x_embed" in report.bf16_linears
    assert report.why_bf16["blocks.0.cross.kv"] == "not matched by precision.fp8_modules"
    assert set(report.fp8_linears).isdisjoint(report.bf16_linears)
    n_linear = sum(isinstance(m, nn.Linear) for m in model.modules())
    assert len(report.fp8_linears) + len(report.bf16_linears) == n_linear


def test_dims_not_divisible_by_16_stay_bf16():
    spec = fp8_spec(hidden=72, heads=4)  # 72 % 16 = 8
    model = build(spec)
    report = apply_precision(model, spec.precision, "cpu")
    assert report.fp8_linears == []
    assert report.why_bf16["blocks.0.attn.qkv"] == "dims 72x216 not divisible by 16"
    assert any("selects no linear" in f for f in report.fallbacks)  # recorded, not silent
    assert fp8_decision("x", nn.Linear(64, 64), ["*"]) is None
    assert fp8_decision("x", nn.Conv2d(3, 16, 1), ["*"]) == "not an nn.Linear"


def test_fp8_forward_backward_on_cpu():
    spec = fp8_spec()
    model = build(spec)
    with torch.no_grad():  # move off the zero init so gradients reach every layer
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(1)) * 0.05)
    apply_precision(model, spec.precision, "cpu")
    x = torch.randn(2, 3, 32, 32)
    with autocast_ctx(spec.precision, "cpu"):
        out = model(x, torch.rand(2), torch.randn(2, 16, TEXT_DIM), identity=x).out
    loss = out.float().square().mean()
    loss.backward()
    assert torch.isfinite(loss)
    grad = model.blocks[0].mlp.fc1.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0
    assert model.blocks[0].mlp.fc1.weight.dtype == torch.float32  # weights stay high precision


def test_mxfp8_refused_below_sm100():
    spec = resolve("I", {"model": {"size": "tiny"}, "precision": {"fp8_recipe": "mxfp8"}})
    with pytest.raises(PrecisionError, match=r"mxfp8.*sm100\+.*use precision.fp8_recipe: tensorwise or rowwise"):
        apply_precision(build(spec), spec.precision, "cpu")


def test_bf16_report_and_fp32_autocast():
    spec = resolve("A", {"model": {"size": "tiny"}})
    report = apply_precision(build(spec), spec.precision, "cpu")
    assert report.fp8_linears == [] and report.compiled is False and report.fallbacks == []
    assert set(report.why_bf16.values()) == {"precision.mode is bf16"}
    with autocast_ctx(spec.precision, "cpu"):
        assert torch.get_autocast_dtype("cpu") == torch.bfloat16 and torch.is_autocast_enabled("cpu")
    fp32 = resolve("A", {"model": {"size": "tiny"}, "precision": {"mode": "fp32"}})
    with autocast_ctx(fp32.precision, "cpu"):
        assert not torch.is_autocast_enabled("cpu")


def fake_timer(speedups: dict[tuple[int, int], float], calls: list):
    """Deterministic stand-in for the CUDA timer: bf16 takes 1 ms, fp8 1/speedup ms per shape."""

    def time_linear(in_f, out_f, tokens, precision, device):
        calls.append((in_f, out_f, tokens))
        return 1.0, 1.0 / speedups[(in_f, out_f)]

    return time_linear


def test_autotune_keeps_only_the_gaining_shape():
    spec = fp8_spec(autotune=True)  # tiny: hidden 64, mlp 256
    model, calls = build(spec), []
    timer = fake_timer({(64, 192): 0.78, (64, 64): 1.0, (64, 256): 1.5, (256, 64): 1.01}, calls)
    report = apply_precision(model, spec.precision, "cpu", tokens=128, time_linear=timer)
    assert sorted(calls) == [(64, 64, 128), (64, 192, 128), (64, 256, 128), (256, 64, 128)]  # once per shape
    converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == sorted(report.fp8_linears) == [f"blocks.{i}.mlp.fc1" for i in range(4)]
    assert report.why_bf16["blocks.2.attn.qkv"] == "fp8 0.78x of bf16 at (128, 64->192)"
    assert report.why_bf16["blocks.0.mlp.fc2"] == "fp8 1.01x of bf16 at (128, 256->64)"  # under 1.02
    assert report.why_bf16["blocks.0.cross.q"] == "not matched by precision.fp8_modules"
    assert report.fallbacks == [
        "fp8 autotune kept 4 of 16 candidate linears in FP8 (shapes under 1.02x stay bf16 at 128 tokens)",
        CPU_FP8_EMULATED,
    ]
    fc1 = next(t for t in report.fp8_timings if t["out_features"] == 256)
    assert fc1 == {"in_features": 64, "out_features": 256, "tokens": 128, "bf16_ms": 1.0,
                   "fp8_ms": 0.6667, "speedup": 1.5, "linears": 4, "fp8": True}  # fmt: skip
    assert report.autotune.startswith("kept 4 of 16 candidate linears in FP8 (1 of 4 shapes >= 1.02x")


def test_autotune_with_no_gain_runs_bf16_and_says_so():
    spec = fp8_spec(autotune=True)
    model = build(spec)
    timer = fake_timer(dict.fromkeys([(64, 192), (64, 64), (64, 256), (256, 64)], 0.8), [])
    report = apply_precision(model, spec.precision, "cpu", tokens=4096, time_linear=timer)
    assert report.fp8_linears == [] and not any(isinstance(m, Float8Linear) for m in model.modules())
    assert report.fallbacks == [
        "fp8 autotune kept 0 of 16 candidate linears in FP8 (no shape gained at 4096 tokens): running bf16"
    ]


def test_fp8_by_default_even_when_slower_and_the_speed_is_recorded():
    """Arm I's default: every filtered linear trains FP8; the measured ratio is recorded, not acted on."""
    spec, calls = resolve("I", {"model": {"size": "tiny"}}), []
    assert spec.precision.fp8_autotune is False
    model = build(spec)
    timer = fake_timer({(64, 192): 0.8, (64, 64): 0.7, (64, 256): 1.1, (256, 64): 0.9}, calls)
    report = apply_precision(model, spec.precision, "cpu", tokens=4096, time_linear=timer)
    assert len(calls) == 4 and len(report.fp8_linears) == 16
    assert sum(isinstance(m, Float8Linear) for m in model.modules()) == 16
    assert all(t["fp8"] for t in report.fp8_timings)
    assert {(t["out_features"], t["speedup"]) for t in report.fp8_timings} == {(192, 0.8), (64, 0.9), (256, 1.1)} | {
        (64, 0.7)
    }
    assert report.autotune == (
        "off (precision.fp8_autotune false): all 16 candidate linears in FP8; fp8 fwd+bwd vs bf16 at 4096 tokens: "
        "64->192 0.80x, 64->64 0.70x, 64->256 1.10x, 256->64 0.90x"
    )
    assert report.fallbacks == [CPU_FP8_EMULATED]  # slower FP8 is not a fallback: it is what the arm asks


def test_fp8_on_cpu_is_emulated_and_fp32():
    spec = fp8_spec()
    model = build(spec)
    report = apply_precision(model, spec.precision, "cpu")
    assert report.emulated and CPU_FP8_EMULATED in report.fallbacks
    assert all(m.config.emulate for m in model.modules() if isinstance(m, Float8Linear))
    with autocast_ctx(spec.precision, "cpu"):
        assert not torch.is_autocast_enabled("cpu")


def test_saved_fp8_set_is_reused_without_timing():
    """A resumed run passes its checkpoint's FP8 set: exactly those convert, nothing is re-timed."""
    spec = fp8_spec()
    saved = [f"blocks.{i}.mlp.fc1" for i in range(4)] + ["blocks.1.attn.proj"]
    model, calls = build(spec), []
    timer = fake_timer(dict.fromkeys([(64, 192), (64, 64), (64, 256), (256, 64)], 2.0), calls)  # all would gain
    report = apply_precision(model, spec.precision, "cpu", tokens=128, time_linear=timer, fp8_linears=saved)
    assert calls == [] and report.fp8_timings == []
    converted = sorted(n for n, m in model.named_modules() if isinstance(m, Float8Linear))
    assert converted == sorted(report.fp8_linears) == sorted(saved)
    assert report.autotune == "reused from checkpoint: 5 of 16 candidate linears in FP8"
    assert report.why_bf16["blocks.0.attn.qkv"] == "not in the FP8 set reused from checkpoint"
    assert report.why_bf16["blocks.0.cross.q"] == "not matched by precision.fp8_modules"
    assert report.fallbacks == [
        "fp8 set reused from checkpoint: 5 of 16 candidate linears in FP8 (as the first start's autotune chose)",
        CPU_FP8_EMULATED,
    ]
    # An empty saved set (the autotune kept nothing) stays empty rather than falling back to the filter.
    empty = apply_precision(build(spec), spec.precision, "cpu", tokens=128, time_linear=timer, fp8_linears=[])
    assert calls == [] and empty.fp8_linears == []
    # A name the filter rejects means the checkpoint is not this model's: refused, naming it.
    with pytest.raises(PrecisionError, match=r"'blocks.0.cross.q' \(not matched by precision.fp8_modules\)"):
        apply_precision(build(spec), spec.precision, "cpu", fp8_linears=["blocks.0.cross.q"])
    with pytest.raises(PrecisionError, match=r"'blocks.9.mlp.fc1' \(no such nn.Linear in the model\)"):
        apply_precision(build(spec), spec.precision, "cpu", fp8_linears=["blocks.9.mlp.fc1"])


def test_cuda_graphs_refuse_grad_accumulation():
    needs = r"compile_mode 'reduce-overhead' needs one micro-batch per step \(got micro-batch 4 of 8\)"
    with pytest.raises(ValueError, match=needs):
        resolve("B", {"precision": {"compile_mode": "reduce-overhead"}, "schedule": {"batch_size": 8, "grad_accum": 2}})
    ok = resolve("B", {"precision": {"compile_mode": "reduce-overhead"}, "schedule": {"batch_size": 8}})
    assert ok.precision.compile_mode == "reduce-overhead" and ok.precision.compile_scope == "model"
