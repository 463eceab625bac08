#!/usr/bin/env bash
# Issue 27, item 1 on one GPU, one call: `ablate train A` and `ablate train B` at seed size with the
# trainer's defaults (micro-batch auto, compile on CUDA, CUDA graphs' fallback under accumulation), then
# the GPU-busy share of B (and A) at the micro-batch they chose (bench/launch_bound.py), then stop and
# resume bit-identical with those defaults (bench/trainer_cuda_check.py). Each stage runs only while the
# call's time lasts (DEADLINE seconds from start); everything it measured is already in $OUT.
#
# Wheels: as bench/gpu_env.sh says (name .gpu-whl in the call's carry).
# Usage on the GPU machine:   bash bench/trainer_gpu.sh 2>&1 | tee $OUT/call1.log
# Dry run on a CPU machine:   SIZE=tiny DEVICE=cpu STEPS=4 CHECK_BATCH=16 MICRO="8 8" bash bench/trainer_gpu.sh
set -uo pipefail
source bench/gpu_env.sh
SIZE=${SIZE:-seed}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-8}
CHECK_BATCH=${CHECK_BATCH:-64}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
# AlexNet weights for LPIPS: none on this machine unless the hub cache has them (then no --lpips-standin).
ls ~/.cache/torch/hub/checkpoints 2>/dev/null
lpips_flag=--lpips-standin
ls ~/.cache/torch/hub/checkpoints/alexnet-owt-*.pth >/dev/null 2>&1 && lpips_flag=""

work=$(mktemp -d /tmp/trainer-gpu-XXXX)
for arm in A B; do
  stage "ablate train $arm --size $SIZE --steps $STEPS --device $DEVICE $lpips_flag"
  timeout "$(left)" python3 -m orchestrator.cli train "$arm" --size "$SIZE" --steps "$STEPS" --device "$DEVICE" \
    $lpips_flag --out "$work/train-$arm"
  echo "exit $?"
  cp "$work/train-$arm/metrics.jsonl" "$out/metrics_$arm.jsonl" 2>/dev/null
done

stage "summary from the runs' own records"
python3 - "$out" <<'EOF'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
rows = {}
for arm in "AB":
    p = out / f"metrics_{arm}.jsonl"
    if not p.exists():
        continue
    r = json.loads(p.read_text().splitlines()[-1])
    keys = ("step", "tokens_per_sec", "iter_per_sec", "micro_batch", "grad_accum", "micro_batch_how", "compiled",
            "compile_s", "peak_memory_gb", "data_wait_fraction", "loader_workers", "eval_time_s", "wall_time_s",
            "device_name", "gpu_uuid", "fallbacks")
    rows[arm] = {k: r.get(k) for k in keys}
    print(arm, json.dumps(rows[arm]))
if rows.get("A", {}).get("tokens_per_sec") and rows.get("B", {}).get("tokens_per_sec"):
    print(f"B / A tokens/s: {rows['B']['tokens_per_sec'] / rows['A']['tokens_per_sec']:.3f}x")
(out / "summary.json").write_text(json.dumps(rows, indent=1, default=str))
EOF

micro_of() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])['micro_batch'])" "$1" 2>/dev/null; }
MICRO=${MICRO:-"$(micro_of "$out/metrics_B.jsonl") $(micro_of "$out/metrics_A.jsonl")"}
stage "launch-bound B then A at micro-batches [$MICRO], then stop/resume check of B, in one process (compile caches shared)"
timeout "$(left)" python3 - "$SIZE" "$DEVICE" "$CHECK_BATCH" "$out" $MICRO <<'EOF'
import sys
size, device, check_batch, out, *micro = sys.argv[1:]
sys.argv = ["launch_bound", "--arms", "B", "--size", size, "--device", device, "--micro", micro[0],
            "--batch-mult", "2", "--out", f"{out}/launch_bound.jsonl"]
from bench import launch_bound, trainer_cuda_check
launch_bound.main()
print("=== stop/resume check of B", flush=True)
sys.argv = ["trainer_cuda_check", "--arms", "B", "--size", size, "--steps", "4", "--batch-size", check_batch,
            "--device", device]
trainer_cuda_check.main()
print("=== launch-bound A", flush=True)
sys.argv = ["launch_bound", "--arms", "A", "--size", size, "--device", device, "--micro", micro[-1],
            "--batch-mult", "2", "--out", f"{out}/launch_bound.jsonl"]
launch_bound.main()
EOF
echo "exit $?"
stage done
