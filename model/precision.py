"""Numeric precision of a run: bf16 autocast, torchao float8 training on chosen linears, regional compile.

FP8 (arm I) goes through `torchao.float8.convert_to_float8_training`: weights stay in high
precision, the chosen linears cast inputs, weights and output gradients to float8 with dynamic
scaling (tensorwise or rowwise recipe). A linear converts only when its name matches one of
`precision.fp8_modules` (fnmatch) AND both of its dims are divisible by 16 (the float8 GEMM's
requirement). Everything else runs under bf16 autocast. The report says which linears went FP8,
which stayed bf16 and why, so a run never silently differs from its spec.

Arm I asks whether FP8 training matches bf16, so by default every filtered linear trains in FP8 even
where it is slower: on CUDA each candidate shape is timed against bf16 at the run's token count and
the ratio recorded (`fp8_timings`, `autotune`), never acted on. FP8 is not always faster (torchao
tensorwise measured 0.69-1.00x of bf16 per block linear on an H200, docs/benchmarks.md: the dynamic
scaling casts cost more than small-K GEMMs save); `precision.fp8_autotune: true` opts into keeping
in FP8 only the shapes reaching `precision.fp8_min_speedup`, the others bf16 with their ratio.

On CPU the float8 linears are emulated (torchao `emulate=True`: the FP8 casts and scales, matmuls in
high precision) and the rest runs fp32: CPU `torch._scaled_mm` took seconds per small GEMM and CPU bf16
autocast is slower than fp32. Both are recorded in the report's fallbacks.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fnmatch
import os
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from model.spec import PrecisionSpec

CPU_FP8_EMULATED = (
    "fp8 on CPU: float8 emulated (torchao emulate=True: FP8 casts and scales, matmuls in fp32), other ops fp32"
)


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
    autotune: str | None = None  # what chose the FP8 set and how fast it was ("all 72 ...", "kept 4 of 4 ...")
    emulated: bool = False  # float8 emulated (CPU): FP8 numerics, no float8 kernels
    fp8_timings: list[dict] = field(default_factory=list)  # per shape: dims, tokens, bf16_ms, fp8_ms, speedup


@contextlib.contextmanager
def deterministic_algorithms(on: bool):
    """precision.deterministic for the duration of a run, then the process's settings as they were (tests
    train many runs in one process). Off: nothing is touched. An op with no deterministic kernel raises
    at its first call, naming the op (torch's message), rather than silently varying."""
    if not on:
        yield
        return
    import torch._inductor.config as inductor_config

    # PyTorch sizes cuBLAS's workspace from this at the process's first GEMM: set before the run's first
    # GEMM, it covers a fresh process (a Ray worker, `ablate train`); one that ran GEMMs before keeps the
    # workspace it sized then, which torch does not detect.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    saved = (torch.are_deterministic_algorithms_enabled(), torch.is_deterministic_algorithms_warn_only_enabled(),
             torch.backends.cudnn.benchmark, inductor_config.deterministic)
    torch.use_deterministic_algorithms(True)
    torch.backends.cudnn.benchmark = False
    inductor_config.deterministic = True  # no on-device benchmarking that could pick other kernels
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(saved[0], warn_only=saved[1])
        torch.backends.cudnn.benchmark = saved[2]
        inductor_config.deterministic = saved[3]


def _device(device: torch.device | str) -> torch.device:
    return device if isinstance(device, torch.device) else torch.device(device)


def autocast_ctx(
    precision: PrecisionSpec, device: torch.device | str, sdpa: str = "default"
) -> contextlib.AbstractContextManager:
    """bf16 autocast for bf16 runs and fp8 runs on CUDA (their non-FP8 ops run bf16); nothing for fp32
    and for fp8 on CPU (emulated float8 linears, the rest fp32: CPU bf16 autocast is slower than fp32).

    sdpa="cudnn" puts cuDNN attention first in SDPA's backend priority on CUDA (the others stay as
    fallbacks). At seed shapes on an H200 it measured the same as PyTorch's default order
    (79.8 vs 79.5 ms/step, docs/benchmarks.md), so "default" is the default.
    """
    stack = contextlib.ExitStack()
    if precision.mode == "bf16" or (precision.mode == "fp8" and _device(device).type != "cpu"):
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


# (in_features, out_features, tokens, precision, device) -> (bf16 ms, fp8 ms) per forward + backward
LinearTimer = Callable[[int, int, int, PrecisionSpec, torch.device], tuple[float, float]]


def cuda_time_linear(
    in_f: int, out_f: int, tokens: int, precision: PrecisionSpec, device: torch.device, warmup: int = 3, iters: int = 10
) -> tuple[float, float]:
    """Milliseconds per forward + backward of LayerNorm -> Linear(in_f, out_f) on `tokens` rows: (bf16, float8).

    bf16 autocast, the run's float8 recipe, compiled when precision.compile is on (the input cast then
    fuses with the norm, as inside a compiled block). CUDA-event time of `iters` calls after `warmup`.
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    x = torch.randn(tokens, in_f, device=device, requires_grad=True)
    grad = torch.randn(tokens, out_f, device=device, dtype=torch.bfloat16)

    def one(fp8: bool) -> float:
        mod = nn.Sequential(nn.LayerNorm(in_f, elementwise_affine=False), nn.Linear(in_f, out_f, bias=False))
        mod = mod.to(device)
        if fp8:
            convert_to_float8_training(mod, config=Float8LinearConfig.from_recipe_name(precision.fp8_recipe))
        fn = torch.compile(mod, dynamic=False) if precision.compile and _has_triton() else mod

        def step() -> None:
            with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
                y = fn(x)
            y.backward(grad.to(y.dtype))

        for _ in range(warmup):
            step()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            step()
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / iters

    # Two compiled graphs per shape share Sequential.forward's cache: lift the recompile limit for the sweep.
    with torch._dynamo.config.patch(recompile_limit=64):
        return one(False), one(True)


def _autotune_skip(precision: PrecisionSpec, device: torch.device, tokens: int | None, injected: bool) -> str | None:
    if precision.fp8_recipe == "mxfp8":
        return "skipped: mxfp8 is not timed"
    if device.type != "cuda" and not injected:
        return "skipped: not CUDA"  # no speed claim possible; the filter alone decides
    if tokens is None:
        return "skipped: tokens per micro-batch not given"
    return None


def autotune_fp8(
    linears: dict[str, nn.Linear],
    precision: PrecisionSpec,
    tokens: int,
    device: torch.device,
    report: PrecisionReport,
    time_linear: LinearTimer,
    select: bool = True,
) -> dict[str, str]:
    """Time each distinct (in, out) shape once; return {linear: why it stays bf16} for shapes that do not gain.

    select=False (fp8_autotune off): only measure and record; every candidate stays FP8, slower or not.
    """
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, mod in linears.items():
        shapes.setdefault((mod.in_features, mod.out_features), []).append(name)
    slower: dict[str, str] = {}
    for (k, n), names in shapes.items():
        bf16_ms, fp8_ms = time_linear(k, n, tokens, precision, device)
        speedup = bf16_ms / fp8_ms
        keep = speedup >= precision.fp8_min_speedup or not select
        report.fp8_timings.append(
            {"in_features": k, "out_features": n, "tokens": tokens, "bf16_ms": round(bf16_ms, 4),
             "fp8_ms": round(fp8_ms, 4), "speedup": round(speedup, 3), "linears": len(names), "fp8": keep}
        )  # fmt: skip
        if not keep:
            slower.update(dict.fromkeys(names, f"fp8 {speedup:.2f}x of bf16 at ({tokens}, {k}->{n})"))
    if not select:
        ratios = ", ".join(f"{t['in_features']}->{t['out_features']} {t['speedup']:.2f}x" for t in report.fp8_timings)
        report.autotune = (
            f"off (precision.fp8_autotune false): all {len(linears)} candidate linears in FP8; "
            f"fp8 fwd+bwd vs bf16 at {tokens} tokens: {ratios}"
        )
        return {}
    kept, gaining = len(linears) - len(slower), sum(t["fp8"] for t in report.fp8_timings)
    report.autotune = (
        f"kept {kept} of {len(linears)} candidate linears in FP8 ({gaining} of {len(shapes)} shapes "
        f">= {precision.fp8_min_speedup:g}x at {tokens} tokens)"
    )
    if slower:
        why = "no shape gained" if not kept else f"shapes under {precision.fp8_min_speedup:g}x stay bf16"
        report.fallbacks.append(
            f"fp8 autotune kept {kept} of {len(linears)} candidate linears in FP8 ({why} at {tokens} tokens)"
            + (": running bf16" if not kept else "")
        )
    return slower


def reuse_fp8_set(decisions: dict[str, str | None], fp8_linears: list[str], report: PrecisionReport) -> None:
    """Restrict `decisions` to a saved FP8 set (a resumed run keeps its first start's numerics, no re-timing).

    Every saved name must still pass the module filter; anything else means the checkpoint belongs to
    another model or filter, and converting a different set would silently change the numerics.
    """
    chosen = set(fp8_linears)
    bad = sorted(n for n in chosen if decisions.get(n, "no such nn.Linear in the model") is not None)
    if bad:
        why = decisions.get(bad[0], "no such nn.Linear in the model")
        raise PrecisionError(
            f"saved FP8 linear set does not fit this model: {bad[0]!r} ({why}); "
            "resume with the spec that wrote the checkpoint, or start a new output directory"
        )
    candidates = [n for n, why in decisions.items() if why is None]
    for name in candidates:
        if name not in chosen:
            decisions[name] = "not in the FP8 set reused from checkpoint"
    report.autotune = f"reused from checkpoint: {len(chosen)} of {len(candidates)} candidate linears in FP8"
    if len(chosen) < len(candidates):
        report.fallbacks.append(
            f"fp8 set reused from checkpoint: {len(chosen)} of {len(candidates)} candidate linears in FP8 "
            "(as the first start's autotune chose)"
        )


def convert_fp8(
    model: nn.Module,
    precision: PrecisionSpec,
    report: PrecisionReport,
    device: torch.device | str = "cpu",
    tokens: int | None = None,
    time_linear: LinearTimer | None = None,
    fp8_linears: list[str] | None = None,
) -> None:
    """Swap the filtered (and, on CUDA, autotuned) linears for torchao float8 linears in place.

    Records the decision per linear in `report`; see `apply_precision` for `tokens`, `time_linear` and
    `fp8_linears`.
    """
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
    candidates = {n: model.get_submodule(n) for n, why in decisions.items() if why is None}
    dev = _device(device)
    report.autotune = _autotune_skip(precision, dev, tokens, time_linear is not None)
    if not candidates:
        report.autotune = report.autotune or "skipped: no candidate linear"
        report.fallbacks.append(
            "precision.mode fp8 but precision.fp8_modules selects no linear: every linear runs bf16"
        )
    if fp8_linears is not None:
        reuse_fp8_set(decisions, fp8_linears, report)
    elif report.autotune is None:  # set whenever there is nothing to time (no candidates, not CUDA, ...)
        assert tokens is not None
        timer = time_linear or cuda_time_linear
        try:
            decisions.update(autotune_fp8(candidates, precision, tokens, dev, report, timer, precision.fp8_autotune))
        except RuntimeError as exc:  # CUDA / compile trouble while timing: recorded, the filter alone decides
            report.autotune = f"failed: {str(exc).splitlines()[0][:200]}"
            report.fallbacks.append(f"fp8 timing failed ({report.autotune}): FP8 linears not timed")
    elif dev.type == "cuda" and tokens is None:
        report.fallbacks.append("fp8 timing skipped: tokens per micro-batch not given, FP8 linears not timed")
    report.fp8_linears = [n for n, why in decisions.items() if why is None]
    report.bf16_linears = [n for n, why in decisions.items() if why is not None]
    report.why_bf16 = {n: why for n, why in decisions.items() if why is not None}

    def keep(mod: nn.Module, fqn: str) -> bool:
        return decisions.get(fqn, "unknown") is None

    if precision.fp8_recipe == "mxfp8":
        # Untested here (no sm100 GPU): torchao's MXFP8 training op config, same filter.
        quantize_(model, MXFP8TrainingOpConfig.from_recipe(MXFP8TrainingRecipe.MXFP8_RCEIL), filter_fn=keep)
    else:
        config = Float8LinearConfig.from_recipe_name(precision.fp8_recipe)
        if dev.type == "cpu":
            config = dataclasses.replace(config, emulate=True)
            report.emulated = True
            if report.fp8_linears:
                report.fallbacks.append(CPU_FP8_EMULATED)
        convert_to_float8_training(model, module_filter_fn=keep, config=config)


def apply_precision(
    model: nn.Module,
    precision: PrecisionSpec,
    device: torch.device | str,
    tokens: int | None = None,
    time_linear: LinearTimer | None = None,
    fp8_linears: list[str] | None = None,
) -> PrecisionReport:
    """Convert `model` (already on `device`) for its precision spec; compile each block if asked.

    tokens: rows one linear sees per micro-batch forward (micro-batch x image tokens); the FP8 autotune
    times each candidate shape at that size. time_linear: the timer (default `cuda_time_linear`); passing
    one runs the autotune on any device (tests check the selection with fake timings).
    fp8_linears: a saved FP8 set (a checkpoint's report.fp8_linears): exactly these linears convert and
    nothing is timed, so a resumed run does not re-pick the set from fresh, noisy timings. Ignored unless
    precision.mode is fp8.

    Raises PrecisionError for a recipe the device cannot run (mxfp8 below sm100, fp8 below sm89), a
    saved set naming a linear the filter rejects, or a missing torchao. Compile problems found here are
    recorded in `fallbacks`, never silent.
    """
    report = PrecisionReport(mode=precision.mode)
    if precision.mode == "fp8":
        report.recipe = precision.fp8_recipe
        check_fp8_device(precision, device)
        convert_fp8(model, precision, report, device, tokens, time_linear, fp8_linears)
    else:
        report.bf16_linears = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)]
        report.why_bf16 = dict.fromkeys(report.bf16_linears, f"precision.mode is {precision.mode}")
    if precision.compile:
        blocks = getattr(model, "blocks", None)
        if _device(device).type == "cuda" and not _has_triton():
            report.fallbacks.append("compile unavailable: triton is not installed; running eager")
        elif precision.compile_scope == "model":
            # One graph for the whole forward: Inductor fuses across blocks (norm + modulate + FP8 cast
            # into one kernel, residual adds into the next block's norm), and TREAD's gather/scatter run
            # at static shapes inside it instead of between per-block compiled calls.
            model.compile(dynamic=False, **compile_kwargs(precision))
            report.compiled = True
        elif blocks is None:
            report.fallbacks.append("compile skipped: model has no .blocks to compile regionally")
        else:
            # Regional compile: one graph per distinct block input shape, reused by every block
            # (parameters are graph inputs), so compile time does not grow with depth.
            for block in blocks:
                block.compile(dynamic=False, **compile_kwargs(precision))
            report.compiled = True
    return report


def compile_kwargs(precision: PrecisionSpec) -> dict:
    """torch.compile keyword arguments of the model for `precision.compile_mode`.

    The optimizer step is never captured: BatchedMuon's step is GPU-bound already (12.5 ms either way at
    seed size, docs/benchmarks.md), and a second CUDA graph tree over the same gradients made replays
    overwrite tensors still in use.
    """
    return {"mode": "reduce-overhead"} if precision.compile_mode == "reduce-overhead" else {}


def _has_triton() -> bool:
    try:
        from torch.utils._triton import has_triton
    except ImportError:
        return False
    return has_triton()
