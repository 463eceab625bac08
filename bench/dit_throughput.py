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
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from dit_measure import GEMM_BOUND, bf16_peak, linear_micro, muon_micro, run_arm, run_ref  # noqa: E402

ROWS: list[dict] = []


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
