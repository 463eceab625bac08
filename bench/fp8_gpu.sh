#!/usr/bin/env bash
# Issue 27 on one GPU, one call, the stages named in STAGES (default "check quality"):
#   check    stop/resume of B at CHECK_SIZE with the trainer's defaults, with the control (the uninterrupted
#            run twice), then the same with precision.deterministic (bench/trainer_cuda_check.py)
#   quality  arm I against arm G at SIZE, the two arms as two processes on the one GPU, each stopped
#            gracefully before the call's time runs out, then the paired report (bench/fp8_quality.py)
#   recipes  the FP8 recipes at seed and GEMM-bound shapes with this torchao and with the one in
#            $WHEELS/alt (bench/dit_throughput.py --night 4), each in its own process
# Wheels: as bench/gpu_env.sh says. Usage: STAGES=quality bash bench/fp8_gpu.sh 2>&1 | tee $OUT/call.log
# Dry run on a CPU machine:
#   SIZE=tiny CHECK_SIZE=tiny DEVICE=cpu STEPS=6 EVERY=2 BATCH=8 CHECK_BATCH=16 bash bench/fp8_gpu.sh
set -uo pipefail
source bench/gpu_env.sh
STAGES=${STAGES:-check quality}
CHECK_S=${CHECK_S:-230}
SIZE=${SIZE:-small}
CHECK_SIZE=${CHECK_SIZE:-seed}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-2000}
EVERY=${EVERY:-250}
BATCH=${BATCH:-64}
CHECK_BATCH=${CHECK_BATCH:-64}
work=$(mktemp -d /tmp/fp8-gpu-XXXX)
quiet() { grep -v "Warning\|warn(" ; }

if [[ " $STAGES " == *" check "* ]]; then
  for mode in default deterministic; do
    flag=""; [ "$mode" = deterministic ] && flag="--deterministic"
    stage "stop/resume of B at $CHECK_SIZE, batch $CHECK_BATCH, $mode, with the control (at most $CHECK_S s)"
    timeout "$CHECK_S" python3 bench/trainer_cuda_check.py --arms B --size "$CHECK_SIZE" --steps 4 \
      --batch-size "$CHECK_BATCH" --device "$DEVICE" --control $flag 2>&1 | quiet | tee "$out/cuda_check_$mode.log"
  done
fi

if [[ " $STAGES " == *" recipes "* ]]; then
  stage "FP8 recipes with $(python3 -c 'import torchao; print(torchao.__version__)') (at most $(($(left) / 2)) s)"
  timeout $(($(left) / 2)) python3 bench/dit_throughput.py --night 4 --budget-s $(($(left) / 2 - 60)) \
    --out "$out/recipes_new" 2>&1 | quiet | tee "$out/recipes_new.log"
  if ls "$WHEELS"/alt/*.whl >/dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/ablate-alt "$WHEELS"/alt/*.whl
    stage "FP8 recipes with $(PYTHONPATH=/tmp/ablate-alt:$PYTHONPATH python3 -c 'import torchao; print(torchao.__version__)')"
    PYTHONPATH=/tmp/ablate-alt:$PYTHONPATH timeout $(($(left) - 10)) python3 bench/dit_throughput.py --night 4 \
      --skip bf16 --budget-s $(($(left) - 70)) --out "$out/recipes_alt" 2>&1 | quiet | tee "$out/recipes_alt.log"
  fi
fi

if [[ " $STAGES " == *" quality "* ]]; then
  budget=$(($(left) - 45))
  stage "I and G at $SIZE, $STEPS steps, eval every $EVERY, batch $BATCH, each stopped after $budget s if not done"
  for arm in G I; do
    python3 bench/fp8_quality.py --arm "$arm" --size "$SIZE" --steps "$STEPS" --every "$EVERY" --batch "$BATCH" \
      --device "$DEVICE" --deadline-s "$budget" --out "$out" --work "$work" > "$out/fp8_$arm.log" 2>&1 &
  done
  wait
  grep -h '^[GI] {' "$out/fp8_G.log" "$out/fp8_I.log"
  stage report
  python3 bench/fp8_quality.py --report --out "$out"
fi
stage done
