"""Numeric precision of a run: bf16 autocast, torchao float8 training on chosen linears, regional compile.

FP8 (arm I) goes through `torchao.float8.convert_to_float8_training`: weights stay in high
precision, the chosen linears cast inputs, weights and output gradients to float8 with dynamic
scaling (tensorwise or rowwise recipe). A linear converts only when its name matches one of
`precision.fp8_modules` (fnmatch) AND both of its dims are divisible by 16 (the float8 GEMM's
requirement). Everything else runs under bf16 autocast. The report says which linears went FP8,
which stayed bf16 and why, so a run never silently differs from its spec.
"""

from __future__ import annotations

import contextlib
import fnmatch
from dataclasses import asdict, dataclass, field

import torch
from torch import nn

from model.spec import PrecisionSpec


class PrecisionError(ValueError):
    """A precision setting this device or environment cannot honour (one clear line)."""


@dataclass
class PrecisionReport:
    mode: str
    recipe: str | None = None
    fp8_linears: list[str] = field(default_factory=list)
    bf16_linears: list[str] = field(default_factory=list)
    why_bf16: dict[str, str] = field(default_factory=dict)  # linear name -> why it stayed bf16
    fallbacks: list[str] = field(default_factory=list)
    compiled: bool = False

    def as_dict(self) -> dict:
        return asdict(self)


def _device(device: torch.device | str) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def autocast_ctx(
    precision: PrecisionSpec, device: torch.device | str, sdpa: str = "default"
) -> contextlib.AbstractContextManager:
    """bf16 autocast for bf16 and fp8 runs (fp8 runs keep their non-FP8 ops in bf16); nothing for fp32.

    sdpa="cudnn" puts cuDNN attention first in SDPA's backend priority on CUDA (the others stay as
    fallbacks). At seed shapes on an H200 it measured the same as PyTorch's default order
    (79.8 vs 79.5 ms/step, docs/benchmarks.md), so "default" is the default.
    """
    stack = contextlib.ExitStack()
    if precision.mode != "fp32":
        stack.enter_context(torch.autocast(device_type=_device(device).type, dtype=torch.bfloat16))
    if sdpa == "cudnn" and _device(device).type == "cuda":
        from torch.nn.attention import SDPBackend, sdpa_kernel

        order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]
        stack.enter_context(sdpa_kernel([*order, SDPBackend.MATH], set_priority=True))
    return stack


def fp8_decision(name: str, module: nn.Module, patterns: list[str]) -> str | None:
    """None when `module` should run in FP8, else the reason it stays bf16."""
    if not isinstance(module, nn.Linear):
        return "not an nn.Linear"
    if not any(fnmatch.fnmatchcase(name, pat) for pat in patterns):
        return "not matched by precision.fp8_modules"
    if module.in_features % 16 or module.out_features % 16:
        return f"dims {module.in_features}x{module.out_features} not divisible by 16"
    return None


def check_fp8_device(precision: PrecisionSpec, device: torch.device | str) -> None:
    """Refuse FP8 recipes the device cannot run, with the fix in the message."""
    dev = _device(device)
    cap = torch.cuda.get_device_capability(dev) if dev.type == "cuda" else None
    where = f"sm{cap[0]}{cap[1]} ({torch.cuda.get_device_name(dev)})" if cap else dev.type
    if precision.fp8_recipe == "mxfp8":
        if cap is None or cap < (10, 0):
            raise PrecisionError(
                f"precision.fp8_recipe 'mxfp8' needs an sm100+ (Blackwell) GPU, this device is {where}; "
                "use precision.fp8_recipe: tensorwise or rowwise"
            )
    elif cap is not None and cap < (8, 9):
        raise PrecisionError(
            f"precision.mode 'fp8' needs an sm89+ GPU (Ada/Hopper) for float8 GEMMs, this device is {where}; "
            "use precision.mode: bf16"
        )


def convert_fp8(model: nn.Module, precision: PrecisionSpec, report: PrecisionReport) -> None:
    """Swap the filtered linears for torchao float8 linears in place, recording the decision per linear."""
    try:
        if precision.fp8_recipe == "mxfp8":
            from torchao.prototype.moe_training.config import MXFP8TrainingOpConfig, MXFP8TrainingRecipe
            from torchao.quantization import quantize_
        else:
            from torchao.float8 import Float8LinearConfig, convert_to_float8_training
    except ImportError as exc:
        raise PrecisionError(f"precision.mode 'fp8' needs torchao>=0.17 ({exc}); pip install torchao") from exc

    decisions = {
        name: fp8_decision(name, mod, precision.fp8_modules)
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear)
    }
    report.fp8_linears = [n for n, why in decisions.items() if why is None]
    report.bf16_linears = [n for n, why in decisions.items() if why is not None]
    report.why_bf16 = {n: why for n, why in decisions.items() if why is not None}

    def keep(mod: nn.Module, fqn: str) -> bool:
        return decisions.get(fqn, "unknown") is None

    if precision.fp8_recipe == "mxfp8":
        # Untested here (no sm100 GPU): torchao's MXFP8 training op config, same filter.
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL), filter_fn=keep)
    else:
        convert_to_float8_training(
            model, module_filter_fn=keep, config=Float8LinearConfig.from_recipe_name(precision.fp8_recipe)
        )


def apply_precision(model: nn.Module, precision: PrecisionSpec, device: torch.device | str) -> PrecisionReport:
    """Convert `model` (already on `device`) for its precision spec; compile each block if asked.

    Raises PrecisionError for a recipe the device cannot run (mxfp8 below sm100, fp8 below sm89) or a
    missing torchao. Compile problems found here are recorded in `fallbacks`, never silent.
    """
    report = PrecisionReport(mode=precision.mode)
    if precision.mode == "fp8":
        report.recipe = precision.fp8_recipe
        check_fp8_device(precision, device)
        convert_fp8(model, precision, report)
        if not report.fp8_linears:
            report.fallbacks.append(
                "precision.mode fp8 but precision.fp8_modules selects no linear: every linear runs bf16"
            )
    else:
        report.bf16_linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        report.why_bf16 = dict.fromkeys(report.bf16_linears, f"precision.mode is {precision.mode}")
    if precision.compile:
        blocks = getattr(model, "blocks", None)
        if blocks is None:
            report.fallbacks.append("compile skipped: model has no .blocks to compile regionally")
        elif _device(device).type == "cuda" and not _has_triton():
            report.fallbacks.append("compile unavailable: triton is not installed; running eager")
        else:
            # Regional compile: one graph per distinct block input shape, reused by every block
            # (parameters are graph inputs), so compile time does not grow with depth.
            for block in blocks:
                block.compile(dynamic=False)
            report.compiled = True
    return report


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return has_triton()
