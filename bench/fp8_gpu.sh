#!/usr/bin/env bash
# Issue 27, one GPU call: (1) stop/resume of B at seed size with the trainer's defaults, with a control
# (the uninterrupted run twice), then (2) arm I against arm G at small size, the two arms as two processes
# on the one GPU, each stopped gracefully before the call's time runs out, then the paired report.
# Wheels: carry/whl/*.whl as bench/trainer_gpu.sh. Usage: bash bench/fp8_gpu.sh 2>&1 | tee $OUT/call3.log
# Dry run on a CPU machine: SIZE=tiny CHECK_SIZE=tiny DEVICE=cpu STEPS=6 EVERY=2 BATCH=8 CHECK_BATCH=16 bash bench/fp8_gpu.sh
set -uo pipefail
T0=$(date +%s)
DEADLINE=${DEADLINE:-585}
CHECK_S=${CHECK_S:-230}
SIZE=${SIZE:-small}
CHECK_SIZE=${CHECK_SIZE:-seed}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-1000}
EVERY=${EVERY:-250}
BATCH=${BATCH:-64}
CHECK_BATCH=${CHECK_BATCH:-64}
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
stage() { echo "=== $(date -u +%H:%M:%S) [$(($(date +%s) - T0)) s] $*"; }
if [ -d carry/whl ]; then
  site=/tmp/ablate-site
  mkdir -p "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$site" carry/whl/*.whl
  export PYTHONPATH="$site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 ABLATE_OFFLINE=1
out=${OUT:-/tmp/fp8-gpu-out}
work=$(mktemp -d /tmp/fp8-gpu-XXXX)
mkdir -p "$out"
nvidia-smi -L 2>/dev/null
python3 -c "import torch, torchao; print('torch', torch.__version__, 'torchao', torchao.__version__)"

stage "stop/resume of B at $CHECK_SIZE, batch $CHECK_BATCH, with the control (at most $CHECK_S s)"
timeout "$CHECK_S" python3 bench/trainer_cuda_check.py --arms B --size "$CHECK_SIZE" --steps 4 \
  --batch-size "$CHECK_BATCH" --device "$DEVICE" --control 2>&1 | grep -v "Warning\|warn(" | tee "$out/cuda_check_control.log"

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
stage done
