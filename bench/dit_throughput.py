"""DiT-core training throughput on one GPU (issue 3, item 11). Results go in docs/benchmarks.md.

Measures, at seed size (768/18/12/p16, 1024 px -> 4096 tokens), batch 4, 128 text tokens + 16
identity tokens: step time (forward + backward + optimizer), tokens/s, model TFLOP/s and % of the
bf16 peak measured here (an 8192^3 bf16 matmul), peak memory; for arms A, B, C, G, H, I eager and
compiled (regional compile of each block). Then FP8 (arm I) against bf16 (arm G) at seed shapes
and at a GEMM-bound shape (hidden 1152, depth 28, 1024 tokens, batch 8), and a per-linear
microbenchmark (bf16 vs float8 tensorwise/rowwise, forward + backward, compiled, at the real
shapes) from which an "I-tuned" filter keeps only the linears that gain. Stage "optim": the
optimizer step alone varied (fused vs foreach AdamW on A; compiled vs eager optimizer step on C, G).

The REPA arms (G, H, I) use a fixed random tensor as teacher features: the teacher is frozen and
its features can be cached, so its forward is not part of the DiT core. The flow-matching target is
a random tensor too (its cost is a few elementwise ops). Model FLOPs count every matmul (linears,
attention's QK^T and AV) of the tokens actually computed (TREAD-routed blocks see fewer), x3 for
forward + backward.

    python bench/dit_throughput.py --out results/            # everything (~8 min on an H200)
    python bench/dit_throughput.py --quick --size tiny       # CPU smoke test of the script itself
    python bench/dit_throughput.py --skip micro,seed,gemm,others,eager --budget-s 250   # optimizer step only
    python bench/dit_throughput.py --night 1 --profile B,C   # issue 13: reference, A-D, G, I recipes, one run
    python bench/dit_throughput.py --night 2                 # issue 13: Muon alone, GEMM-bound FP8, scopes
    python bench/dit_throughput.py --night 4 [--skip bf16]   # issue 27: FP8 recipes, seed and GEMM-bound
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from model.nanodit import STUDY_TEXT_DIM, NanoDiT  # noqa: E402
from model.optim import OptimizerStep, build_optimizers  # noqa: E402
from model.precision import apply_precision, autocast_ctx  # noqa: E402
from model.repa import RepaProjector, repa_loss  # noqa: E402
from orchestrator.grids.arms import resolve  # noqa: E402

ROWS: list[dict] = []
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


def tuned_filter(micro: list[dict], shape: str, recipe: str, threshold: float) -> list[str]:
    """fnmatch patterns for the linears whose float8 speedup at `shape` beats `threshold`."""
    return [f"*.{r['linear']}" for r in micro if r["shape"] == shape and r[f"{recipe}_speedup"] >= threshold]


def table(rows: list[dict]) -> str:
    cols = [
        "label",
        "mode",
        "opt_compiled",
        "adamw",
        "precision",
        "sdpa",
        "batch",
        "tokens",
        "step_ms",
        "fwd_bwd_ms",
        "opt_ms",
        "gpu_busy_ms",
        "tokens_per_s",
        "tflops",
        "pct_peak",
        "peak_mem_gb",
        "fp8_linears",
        "first_step_s",
    ]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join(str(r.get(c, "")) for c in cols) + " |")
    return "\n".join(lines)


def night(args, add, results: dict, save) -> None:
    """Issue 13's tables, each in one process so ratios compare rows of one run on one GPU.

    Every arm row is the trainer's configuration: whole-model compile, the compiled optimizer step for
    Muon (BatchedMuon), fused AdamW, FP8 on every filtered linear for I (no autotune).
    """
    seed = {"opt_compile": True}
    if args.night == 1:
        try:
            ROWS.append(run_ref(args))
        except Exception as exc:
            traceback.print_exc()
            ROWS.append({"label": "reference", "error": f"{type(exc).__name__}: {exc}"})
        print(json.dumps(ROWS[-1]), flush=True)
        add("A", "A", True, **seed)
        add("B", "B", True, **seed)
        add("C", "C", True, **seed)
        add("G", "G", True, **seed)
        add("G with AdamW", "G", True, overrides={"optimizer": {"name": "adamw"}}, **seed)
        add("I tensorwise", "I", True, **seed)
        add("I rowwise", "I", True, overrides={"precision": {"fp8_recipe": "rowwise"}}, **seed)
        add("D", "D", True, **seed)
        add("B (blocks compile)", "B", True, overrides={"precision": {"compile_scope": "blocks"}}, **seed)
    elif args.night == 2:  # as run on 2026-11-22 (cpp-wrapper failed in Inductor: since removed)
        ro = {"precision": {"compile_mode": "reduce-overhead"}}
        add("B cudagraphs", "B", True, overrides=ro, **seed)
        add("G with AdamW cudagraphs", "G", True, overrides={**ro, "optimizer": {"name": "adamw"}}, **seed)
        add("A cudagraphs", "A", True, overrides=ro, **seed)
        results["muon"] = muon_micro(args)
        save()
    elif args.night == 4:  # issue 27: FP8 recipes of this torchao (run again under another: --skip bf16)
        bf16 = "bf16" not in args.skip.split(",")

        def cg(shape: dict, recipe: str | None = None) -> dict:
            precision = {"compile_mode": "reduce-overhead", **({"fp8_recipe": recipe} if recipe else {})}
            return {"overrides": {**shape, "precision": precision}, "batch": 8 if shape else args.batch, **seed}

        # Most telling first (a row takes about 2 min with its compile): the GEMM-bound pair, then seed shapes.
        if bf16:
            add("gemm-bound G cudagraphs", "G", True, **cg(GEMM_BOUND))
        add("gemm-bound I tensorwise cudagraphs", "I", True, **cg(GEMM_BOUND, "tensorwise"))
        add("I tensorwise cudagraphs", "I", True, **cg({}, "tensorwise"))
        if bf16:
            add("G cudagraphs", "G", True, **cg({}))
        add("I rowwise cudagraphs", "I", True, **cg({}, "rowwise"))
        add("gemm-bound I rowwise cudagraphs", "I", True, **cg(GEMM_BOUND, "rowwise"))
    else:  # the model as CUDA graphs, the optimizer step compiled without: Muon arms, FP8 recipes
        ro = {"precision": {"compile_mode": "reduce-overhead"}}
        add("C cudagraphs", "C", True, overrides=ro, **seed)
        add("B cudagraphs", "B", True, overrides=ro, **seed)
        add("G cudagraphs", "G", True, overrides=ro, **seed)
        add("G with AdamW cudagraphs", "G", True, overrides={**ro, "optimizer": {"name": "adamw"}}, **seed)
        add("I tensorwise cudagraphs", "I", True, overrides=ro, **seed)
        gemm = {**GEMM_BOUND, **ro}
        add("gemm-bound G", "G", True, overrides=gemm, batch=8, **seed)
        add("gemm-bound I tensorwise", "I", True, overrides=gemm, batch=8, **seed)
        add("I rowwise_with_gw_hp cudagraphs", "I", True,
            overrides={"precision": {"compile_mode": "reduce-overhead", "fp8_recipe": "rowwise_with_gw_hp"}},
            **seed)  # fmt: skip
    print(table(ROWS))
    by = {r["label"]: r for r in ROWS if "error" not in r}

    def ratio(a: str, b: str, key: str = "step_ms") -> None:
        if a in by and b in by and by[a].get(key) and by[b].get(key):
            r = by[a][key] / by[b][key]
            results.setdefault("ratios", {})[f"{a} / {b} ({key})"] = round(r, 3)
            print(f"{a} / {b} ({key}): {r:.3f}", flush=True)

    ratio("B", "A")
    ratio("A", "reference (plain DiT, whole-model compile)")
    ratio("C", "B")
    ratio("G", "G with AdamW")
    ratio("I tensorwise", "G")
    ratio("I rowwise", "G")
    ratio("I rowwise_with_gw_hp", "G")
    ratio("gemm-bound I tensorwise", "gemm-bound G")
    ratio("B cudagraphs", "A cudagraphs")
    ratio("B cudagraphs", "A")
    ratio("C cudagraphs", "B cudagraphs")
    ratio("G cudagraphs", "G with AdamW cudagraphs")
    ratio("I tensorwise cudagraphs", "G cudagraphs")
    ratio("I rowwise_with_gw_hp cudagraphs", "G cudagraphs")
    ratio("gemm-bound I rowwise", "gemm-bound G")
    ratio("I rowwise cudagraphs", "G cudagraphs")
    ratio("gemm-bound I tensorwise cudagraphs", "gemm-bound G cudagraphs")
    ratio("gemm-bound I rowwise cudagraphs", "gemm-bound G cudagraphs")
    save()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", default="seed")
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--text-tokens", type=int, default=128)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "bench_out")))
    ap.add_argument("--quick", action="store_true", help="CPU smoke test: arms A and I, eager only")
    ap.add_argument("--threshold", type=float, default=1.05, help="I-tuned keeps linears faster than this in fp8")
    ap.add_argument("--skip", default="",
                    help="comma list of stages to skip: micro,seed,gemm,others,eager; bf16 (night 4)")
    ap.add_argument("--sdpa", default="cudnn", choices=["cudnn", "default"], help="SDPA backend priority")
    ap.add_argument("--profile", default="G (profiled),I (profiled)", help="comma list of row labels to profile")
    ap.add_argument("--opt-mode", default=None, help="torch.compile mode of the optimizer step (stage optim)")
    ap.add_argument("--budget-s", type=float, default=1e9, help="start no new configuration after this many seconds")
    ap.add_argument("--night", type=int, default=0,
                    help="issue 13 tables: 1 (arms in one run), 2 (Muon, GEMM-bound), 3; 4: issue 27's FP8 recipes")
    args = ap.parse_args()
    args.profile = set(args.profile.split(","))
    args.out.mkdir(parents=True, exist_ok=True)
    torch._dynamo.config.cache_size_limit = 64
    skip = set(filter(None, args.skip.split(",")))
    env = {
        "torch": torch.__version__,
        "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
        "date": time.strftime("%Y-%m-%d"),
        "argv": sys.argv,
    }
    try:
        import torchao

        env["torchao"] = torchao.__version__
    except ImportError:
        env["torchao"] = None
    args.peak = bf16_peak(8192) if args.device == "cuda" else None
    env["bf16_peak_tflops"] = round(args.peak, 1) if args.peak else None
    print(json.dumps(env), flush=True)
    results = {"env": env, "rows": ROWS, "micro": []}

    def save() -> None:
        (args.out / "dit_throughput.json").write_text(json.dumps(results, indent=1))

    start = time.perf_counter()

    def add(label, arm, compiled, **kw) -> None:
        if time.perf_counter() - start > args.budget_s:
            print(f"skipped (over --budget-s): {label} {'compiled' if compiled else 'eager'}", flush=True)
            return
        try:
            row = run_arm(label, arm, compiled, args, **kw)
        except Exception as exc:
            traceback.print_exc()
            row = {"label": label, "mode": "compiled" if compiled else "eager", "error": f"{type(exc).__name__}: {exc}"}
        ROWS.append(row)
        print(json.dumps(row), flush=True)
        save()

    if args.night:
        night(args, add, results, save)
        return
    if args.quick:
        for arm in ("A", "I"):
            add(arm, arm, False)
        print(table(ROWS))
        return
    if "optim" not in skip:
        add("A fused AdamW", "A", True)
        add("A foreach AdamW", "A", True, adamw_foreach=True)
        add("C opt compiled", "C", True, opt_compile=True)
        add("G opt compiled", "G", True, opt_compile=True)
        add("C opt eager", "C", True)
        add("G opt eager", "G", True)
    if "micro" not in skip:
        results["micro"] = linear_micro(args)
        save()
    tuned = {s: tuned_filter(results["micro"], s, "tensorwise", args.threshold) for s in ("seed/routed", "gemm-bound")}
    results["tuned_filters"] = tuned
    print("tuned filters:", json.dumps(tuned), flush=True)
    if "seed" not in skip:
        add("A (sdpa default)", "A", True, sdpa="default")
        add("A", "A", True)
        add("G (profiled)", "G", True)
        add("I (profiled)", "I", True)
        if tuned["seed/routed"]:
            add(f"I-tuned {tuned['seed/routed']}", "I", True, fp8_modules=tuned["seed/routed"])
    if "gemm" not in skip:
        add("gemm-bound G", "G", True, overrides=GEMM_BOUND, batch=8)
        add("gemm-bound I", "I", True, overrides=GEMM_BOUND, batch=8)
        if tuned["gemm-bound"]:
            add(
                f"gemm-bound I-tuned {tuned['gemm-bound']}",
                "I",
                True,
                overrides=GEMM_BOUND,
                fp8_modules=tuned["gemm-bound"],
                batch=8,
            )
    if "others" not in skip:
        for arm in ("B", "C", "H"):
            add(arm, arm, True)
    if "eager" not in skip:
        for arm in ("A", "B", "C", "G", "H", "I"):
            add(arm, arm, False)
    print(table(ROWS))
    by = {(r["label"], r.get("mode")): r for r in ROWS if "error" not in r}
    for r in ROWS:
        if "error" in r or r.get("precision", "").startswith("bf16") or r["mode"] != "compiled":
            continue
        base = by.get(("gemm-bound G" if "gemm" in r["label"] else "G (profiled)", "compiled"))
        if base:
            ratios = {k: round(base[k] / r[k], 3) for k in ("step_ms", "fwd_bwd_ms", "gpu_busy_ms") if r.get(k)}
            print(f"{r['label']} over {base['label']} (bf16): {json.dumps(ratios)}")
    save()


if __name__ == "__main__":
    main()
