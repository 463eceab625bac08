#!/usr/bin/env bash
# Issue 33 on one GPU, one call: arm A and A with lr/10 at small size, 2000 steps, as two processes on the
# one GPU, then the paired report (bench/val_flow_loss.py). Wheels: as bench/gpu_env.sh says.
# Usage: bash bench/val_flow_gpu.sh 2>&1 | tee $OUT/call.log
# Dry run on a CPU machine: SIZE=tiny DEVICE=cpu STEPS=40 EVERY=20 BATCH=16 N=16 bash bench/val_flow_gpu.sh
set -uo pipefail
source bench/gpu_env.sh
SIZE=${SIZE:-small}
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-2000}
EVERY=${EVERY:-250}
BATCH=${BATCH:-64}
N=${N:-64}
work=$(mktemp -d /tmp/val-flow-XXXX)
budget=$(($(left) - 40))
stage "A and A-lr10 at $SIZE, $STEPS steps, eval every $EVERY on $N held-out images, batch $BATCH, stopped after $budget s"
for arm in A A-lr10; do
  python3 bench/val_flow_loss.py --arm "$arm" --size "$SIZE" --steps "$STEPS" --every "$EVERY" --batch "$BATCH" \
    --n "$N" --device "$DEVICE" --deadline-s "$budget" --out "$out" --work "$work" > "$out/flow_$arm.log" 2>&1 &
done
wait
grep -h '^A' "$out/flow_A.log" "$out/flow_A-lr10.log" | grep '{'
tail -3 "$out/flow_A.log"
stage report
python3 bench/val_flow_loss.py --report --out "$out" || echo "report: needs sqlalchemy and scipy; run it where they are"
stage done
