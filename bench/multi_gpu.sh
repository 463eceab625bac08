#!/usr/bin/env bash
# Issue 42 on a 2-GPU machine (nvidia-h100-x2), one call: arm A at small size trained by the trainer on one
# GPU and data-parallel on two at the same global batch (loss, val_flow_loss, tokens/s, speed-up), then the
# compile cache of a seed-size arm A in a fresh process, cold and from the stored cache. Each stage runs
# only while the call's time lasts (DEADLINE seconds from start); what it measured is already in $OUT.
#
# Wheels: as bench/gpu_env.sh says (name .gpu-whl in the call's carry). No Ray: the ranks start without it.
# Usage on the GPU machine:   bash bench/multi_gpu.sh 2>&1 | tee $OUT/multi_gpu.log
#   ARM, SIZE (ddp), BATCH, STEPS, EVERY, GPUS, CSIZE (compile), MICRO (compile), WHAT="ddp compile"
# Dry run on a CPU machine:   DEVICE=cpu SIZE=tiny BATCH=8 STEPS=12 EVERY=6 WHAT=ddp bash bench/multi_gpu.sh
set -uo pipefail
source bench/gpu_env.sh
ARM=${ARM:-A}
SIZE=${SIZE:-small}
BATCH=${BATCH:-64}
STEPS=${STEPS:-60}
EVERY=${EVERY:-30}
GPUS=${GPUS:-2}
CSIZE=${CSIZE:-seed}
MICRO=${MICRO:-4}
DEVICE=${DEVICE:-cuda}
WHAT=${WHAT:-"ddp compile"}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
for what in $WHAT; do
  size=$SIZE
  [ "$what" = compile ] && size=$CSIZE
  stage "bench/multi_gpu.py $what --arm $ARM --size $size"
  timeout "$(left)" python3 bench/multi_gpu.py "$what" --arm "$ARM" --size "$size" --batch "$BATCH" --steps "$STEPS" \
    --every "$EVERY" --gpus "$GPUS" --micro "$MICRO" --device "$DEVICE" --out "$out"
  echo "exit $?"
done
stage done
