"""DiT-core training throughput, the measurements: one configuration's training step (`run_arm`), the
reference DiT (`run_ref`), the optimizer step alone (`muon_micro`) and each linear in float8 against bf16
(`linear_micro`), with the timers and FLOP count they share. bench/dit_throughput.py chooses what to
measure and writes the tables."""

from __future__ import annotations

import gc
import json
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.nanodit import STUDY_TEXT_DIM, NanoDiT  # noqa: E402
from model.optim import OptimizerStep, build_optimizers  # noqa: E402
from model.precision import apply_precision, autocast_ctx  # noqa: E402
from model.repa import RepaProjector, repa_loss  # noqa: E402
from orchestrator.grids.arms import resolve  # noqa: E402

GEMM_BOUND = {"model": {"hidden": 1152, "depth": 28, "heads": 16, "patch": 16}, "data": {"resolution": 512}}
LINEARS = ["attn.qkv", "attn.proj", "mlp.fc1", "mlp.fc2", "cross.q", "cross.proj"]


def sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def timed(fn, warmup: int, iters: int) -> float:
    """Median seconds per call of fn(), timed with CUDA events (host clock on CPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(iters):
        if torch.cuda.is_available():
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]


def gpu_busy_ms(fn, n: int):
    """Mean summed CUDA kernel time per call of fn() (ms), and the profile: what the GPU did, without
    the host-side gaps that wall time includes when a step is launch-bound."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(n):
            fn()
        sync()
    events = prof.key_averages()
    # Kernels only: GPU-side user annotations (Optimizer.step#Muon.step spans the whole launch-bound
    # optimizer step, idle gaps included) would count twice. The 2026-11-21 run predates this filter.
    total_us = sum(
        e.self_device_time_total
        for e in events
        if e.device_type == DeviceType.CUDA
        and not getattr(e, "is_user_annotation", False)
        and not e.key.startswith("Optimizer.")
    )
    return total_us / n / 1e3, prof


def bf16_peak(n: int) -> float:
    """TFLOP/s of an n^3 bf16 matmul on random data: the ceiling the % column refers to."""
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    return 2 * n**3 / timed(lambda: a @ b, 5, 20) / 1e12


def forward_flops(spec, batch: int, text_len: int, teacher_dim: int) -> float:
    """Matmul FLOPs of one forward pass (2 per multiply-add), TREAD-aware."""
    d = spec.model.dims()
    D, p, r = d.hidden, d.patch, spec.model.mlp_ratio
    T = (spec.resolution() // p) ** 2
    L = 1 + text_len + spec.model.identity_tokens
    last = spec.tread.last_block if spec.tread.last_block is not None else d.depth - 2
    f = 2 * T * 3 * p * p * D * 2  # x_embed + id_embed
    f += 2 * T * D * 3 * p * p  # final linear
    f += 2 * L * D * D + 2 * L * D * 2 * D * d.depth  # text_proj + cross kv of every block
    for i in range(d.depth):
        routed = spec.tread.enabled and spec.tread.first_block <= i <= last
        n = max(1, round(T * (1 - spec.tread.rate))) if routed else T
        f += 2 * n * D * (3 * D + D + D + D + 2 * r * D)  # qkv, proj, cross q, cross proj, fc1+fc2
        f += 4 * n * n * D + 4 * n * L * D  # self- and cross-attention scores and values
        if spec.repa.enabled and i == (spec.repa.block if spec.repa.block is not None else d.depth // 2):
            f += 2 * n * D * teacher_dim
    return batch * f


def run_arm(
    label: str,
    arm: str,
    compiled: bool,
    args,
    overrides: dict | None = None,
    fp8_modules=None,
    batch: int | None = None,
    sdpa: str | None = None,
    opt_compile: bool = False,
    adamw_foreach: bool = False,
) -> dict:
    """One training configuration: build, (convert, compile), time full optimizer steps.

    opt_compile: the optimizer step through `OptimizerStep(compile=True)` (Muon compiled);
    adamw_foreach: AdamW as foreach instead of fused (the pre-fused baseline).
    """
    torch._dynamo.reset()
    gc.collect()  # free the previous configuration's model and optimizer state
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    over = {"model": {"size": args.size}, "precision": {"compile": compiled}}
    for key, val in (overrides or {}).items():
        over[key] = {**over.get(key, {}), **val}
    if fp8_modules is not None:
        over["precision"]["fp8_modules"] = fp8_modules
    spec = resolve(arm, over)
    dev = torch.device(args.device)
    torch.manual_seed(0)
    model = NanoDiT(spec, STUDY_TEXT_DIM).to(dev).train()
    report = apply_precision(model, spec.precision, dev)
    B, L = batch or args.batch, args.text_tokens
    res = spec.resolution()
    grid = res // spec.model.dims().patch
    teacher_dim = 768
    projector = RepaProjector(spec.model.dims().hidden, teacher_dim).to(dev) if spec.repa.enabled else None
    extra = list(projector.named_parameters(prefix="repa")) if projector else []
    optimizers = build_optimizers(model, spec, extra)
    if adamw_foreach:
        optimizers = [
            torch.optim.AdamW(
                [{"params": pg["params"], "weight_decay": pg["weight_decay"]} for pg in o.param_groups],
                lr=o.defaults["lr"],
                betas=o.defaults["betas"],
                eps=o.defaults["eps"],
                foreach=True,
            )
            if isinstance(o, torch.optim.AdamW)
            else o
            for o in optimizers
        ]
    opt_step = OptimizerStep(optimizers, opt_compile, dev, mode=args.opt_mode)
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(B, 3, res, res, device=dev, generator=g)
    target = torch.randn(B, 3, res, res, device=dev, generator=g)
    text = torch.randn(B, L, STUDY_TEXT_DIM, device=dev, generator=g)
    teacher = torch.randn(B, grid * grid, teacher_dim, device=dev, generator=g)
    t = torch.rand(B, device=dev, generator=g)
    repa_block = spec.repa.block if spec.repa.block is not None else spec.model.dims().depth // 2

    sdpa = sdpa or args.sdpa
    cuda = dev.type == "cuda"
    graphs = cuda and spec.precision.compile and spec.precision.compile_mode == "reduce-overhead"

    def step(marks: list | None = None) -> None:
        if graphs:  # a new training iteration: the previous replay's outputs may be overwritten
            torch.compiler.cudagraph_mark_step_begin()
        for opt in optimizers:
            opt.zero_grad(set_to_none=True)
        with autocast_ctx(spec.precision, dev, sdpa=sdpa):
            res_ = model(x, t, text, identity=x, repa_block=repa_block if projector else None)
            loss = F.mse_loss(res_.out.float(), target)
            if projector is not None:
                loss = loss + spec.repa.weight * repa_loss(res_.hidden, res_.kept, teacher, projector)
        loss.backward()
        if marks is not None:
            marks[1].record()
        opt_step()

    t0 = time.perf_counter()
    step()  # first step: compile, autotune
    sync()
    first_s = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    for _ in range(args.warmup):
        step()
    totals, fbs, opts = [], [], []
    for _ in range(args.iters):
        if cuda:
            marks = [torch.cuda.Event(enable_timing=True) for _ in range(3)]
            marks[0].record()
            step(marks)
            marks[2].record()
            marks[2].synchronize()
            fbs.append(marks[0].elapsed_time(marks[1]) / 1e3)
            opts.append(marks[1].elapsed_time(marks[2]) / 1e3)
            totals.append(marks[0].elapsed_time(marks[2]) / 1e3)
        else:
            t1 = time.perf_counter()
            step()
            totals.append(time.perf_counter() - t1)

    def med(v: list[float]) -> float:
        return sorted(v)[len(v) // 2] if v else float("nan")

    step_s = med(totals)
    busy_ms = None
    if cuda:
        busy_ms, prof = gpu_busy_ms(step, 3)
        if label in args.profile:
            text_ = prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=18, max_name_column_width=70)
            (args.out / f"profile_{arm}.txt").write_text(text_)
            print(text_, flush=True)
    tokens = B * grid * grid
    flops = 3 * forward_flops(spec, B, L, teacher_dim)
    row = {
        "label": label,
        "arm": arm,
        "mode": (f"compiled {spec.precision.compile_scope} {spec.precision.compile_mode}" if report.compiled
                 else "eager"),
        "precision": spec.precision.mode + (f"/{spec.precision.fp8_recipe}" if spec.precision.mode == "fp8" else ""),
        "hidden": spec.model.dims().hidden,
        "tokens": grid * grid,
        "batch": B,
        "sdpa": sdpa if cuda else None,
        "step_ms": round(step_s * 1e3, 2),
        "fwd_bwd_ms": round(med(fbs) * 1e3, 2) if fbs else None,
        "opt_ms": round(med(opts) * 1e3, 2) if opts else None,
        "gpu_busy_ms": round(busy_ms, 2) if busy_ms else None,
        "tokens_per_s": round(tokens / step_s),
        "tflops": round(flops / step_s / 1e12, 1),
        "pct_peak": round(100 * flops / step_s / 1e12 / args.peak, 1) if args.peak else None,
        "peak_mem_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if dev.type == "cuda" else None,
        "first_step_s": round(first_s, 1),
        "fp8_linears": len(report.fp8_linears),
        "fallbacks": report.fallbacks + ([opt_step.fallback] if opt_step.fallback else []),
        "opt_compiled": opt_step.compiled,
        "adamw": "foreach" if adamw_foreach else ("fused" if cuda else "default"),
    }
    return row


def run_ref(args, label: str = "reference (plain DiT, whole-model compile)") -> dict:
    """bench/ref_dit.py's plain DiT at the same shapes: whole-model compile, bf16 autocast, fused AdamW."""
    from bench.ref_dit import RefDiT

    torch._dynamo.reset()
    gc.collect()
    torch.cuda.empty_cache()
    spec = resolve("A", {"model": {"size": args.size}})
    d = spec.model.dims()
    dev = torch.device(args.device)
    T = (spec.resolution() // d.patch) ** 2
    L = 1 + args.text_tokens + spec.model.identity_tokens  # NanoDiT's cross-attention length
    torch.manual_seed(0)
    model = RefDiT(d.hidden, d.depth, d.heads, d.patch, T, STUDY_TEXT_DIM, spec.model.mlp_ratio).to(dev)
    cuda = dev.type == "cuda"
    if cuda:
        model.compile(dynamic=False)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, fused=cuda)
    B = args.batch
    g = torch.Generator(device=dev).manual_seed(0)
    x = torch.randn(B, T, 3 * d.patch**2, device=dev, generator=g)
    target = torch.randn_like(x)
    text = torch.randn(B, L, STUDY_TEXT_DIM, device=dev, generator=g)
    t = torch.rand(B, device=dev, generator=g)

    def step() -> None:
        opt.zero_grad(set_to_none=True)
        with torch.autocast(dev.type, dtype=torch.bfloat16, enabled=cuda):
            loss = F.mse_loss(model(x, t, text).float(), target)
        loss.backward()
        opt.step()

    t0 = time.perf_counter()
    step()
    sync()
    first_s = time.perf_counter() - t0
    step_s = timed(step, args.warmup, args.iters)
    busy_ms = gpu_busy_ms(step, 3)[0] if cuda else None
    return {
        "label": label,
        "arm": "ref",
        "mode": "compiled (model)",
        "precision": "bf16",
        "batch": B,
        "tokens": T,
        "step_ms": round(step_s * 1e3, 2),
        "gpu_busy_ms": round(busy_ms, 2) if busy_ms else None,
        "tokens_per_s": round(B * T / step_s),
        "first_step_s": round(first_s, 1),
        "params_m": round(sum(p.numel() for p in model.parameters()) / 1e6, 1),
    }


def muon_micro(args) -> list[dict]:
    """The Muon step alone over NanoDiT's hidden weights (random gradients): torch.optim.Muon against
    BatchedMuon, eager and compiled (OptimizerStep, as the trainer runs it). Newton-Schulz FLOPs counted."""
    from model.optim import BatchedMuon, OptimizerStep, hidden_weight_names

    out = []
    spec = resolve("C", {"model": {"size": args.size}})
    dev = torch.device(args.device)
    model = NanoDiT(spec, STUDY_TEXT_DIM).to(dev)
    names = set(hidden_weight_names(model))
    params = [p for n, p in model.named_parameters() if n in names]
    flop = 0
    for p in params:
        m, n = sorted(p.shape)
        flop += spec.optimizer.muon.ns_steps * (4 * m * m * n + 2 * m**3)
    runs = (("torch.optim.Muon", False, None), ("BatchedMuon", False, None), ("BatchedMuon", True, None),
            ("BatchedMuon", True, "reduce-overhead"))  # fmt: skip
    for impl, compiled, mode in runs:
        torch._dynamo.reset()
        cls = torch.optim.Muon if impl == "torch.optim.Muon" else BatchedMuon
        opt = cls(params, lr=1e-3, weight_decay=0.03, adjust_lr_fn="match_rms_adamw")
        for p in params:
            p.grad = torch.randn_like(p)
        stepper = OptimizerStep([opt], compiled, dev, mode=mode)
        t0 = time.perf_counter()
        stepper()
        stepper()
        sync()
        first = time.perf_counter() - t0
        ms = timed(stepper, 3, 20) * 1e3
        busy = gpu_busy_ms(stepper, 5)[0] if dev.type == "cuda" else 0.0
        row = {"muon": impl, "compiled": compiled, "mode": mode, "matrices": len(params),
               "params_m": round(sum(p.numel() for p in params) / 1e6, 1), "step_ms": round(ms, 2),
               "gpu_busy_ms": round(busy, 2), "ns_tflop": round(flop / 1e12, 2),
               "ns_tflops_per_s": round(flop / ms / 1e9, 1), "first_s": round(first, 1)}  # fmt: skip
        print(json.dumps(row), flush=True)
        out.append(row)
        for p in params:
            opt.state.pop(p, None)
    return out


def linear_micro(args) -> list[dict]:
    """Per-linear forward+backward time, bf16 vs float8 tensorwise, compiled, at the real shapes.

    Each case is LayerNorm -> Linear under bf16 autocast (the input cast can fuse into the norm, as in
    the block). cross.q and cross.proj have attn.proj's shape (D x D), so they share its result.
    """
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    out = []
    dev = torch.device(args.device)
    hidden = 64 if args.size == "tiny" else 768
    tags = (("seed/routed", hidden, args.batch * 2048), ("gemm-bound", hidden * 3 // 2, 8 * 1024))
    if args.size == "tiny":
        tags = (("seed/routed", 64, 256), ("gemm-bound", 96, 256))
    for tag, D, M in tags:
        for name, (k, n) in {
            "attn.qkv": (D, 3 * D),
            "attn.proj": (D, D),
            "mlp.fc1": (D, 4 * D),
            "mlp.fc2": (4 * D, D),
        }.items():
            times = {}
            for recipe in ("bf16", "tensorwise"):
                torch._dynamo.reset()
                torch.manual_seed(0)
                net = torch.nn.Sequential(
                    torch.nn.LayerNorm(k, elementwise_affine=False), torch.nn.Linear(k, n, bias=False)
                ).to(dev)
                if recipe != "bf16":
                    convert_to_float8_training(net, config=Float8LinearConfig.from_recipe_name(recipe))
                net = torch.compile(net, dynamic=False)
                xin = torch.randn(M, k, device=dev, requires_grad=True)
                gout = torch.randn(M, n, device=dev, dtype=torch.bfloat16)

                def fb(net=net, xin=xin, gout=gout) -> None:
                    with torch.autocast(dev.type, dtype=torch.bfloat16):
                        y = net(xin)
                    y.backward(gout)

                wall = timed(fb, 3, args.iters * 2)
                # kernel time: the micro step is launch-bound on the host, the GPU time is what scales
                times[recipe] = gpu_busy_ms(fb, 10)[0] / 1e3 if dev.type == "cuda" else wall
                times[recipe + "_wall"] = wall
            for same in [name] + (["cross.q", "cross.proj"] if name == "attn.proj" else []):
                row = {
                    "shape": tag,
                    "linear": same,
                    "M": M,
                    "K": k,
                    "N": n,
                    "bf16_us": round(times["bf16"] * 1e6, 1),
                    "fp8_us": round(times["tensorwise"] * 1e6, 1),
                    "tensorwise_speedup": round(times["bf16"] / times["tensorwise"], 3),
                }
                print(json.dumps(row), flush=True)
                out.append(row)
    return out
