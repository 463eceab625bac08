#!/usr/bin/env bash
# Issue 40 on the GPUs, one call: the photograph folder, then arms A, C and A-lr10 x 3 training seeds
# (bench/verdict_seeds.py), spread round-robin over the machine's GPUs, every run stopped at the deadline;
# the records come back as one tarball (the report is built where sqlalchemy is: --report).
# Usage (device call, carry .gpu-whl): OUT=$OUT bash bench/verdict_gpu.sh 2>&1 | tee $OUT/call.log
# Dry run on a CPU machine: DEVICE=cpu SIZE=tiny STEPS=4 EVERY=2 BATCH=4 OUT=/tmp/vd bash bench/verdict_gpu.sh
set -uo pipefail
source bench/gpu_env.sh
DEVICE=${DEVICE:-cuda}
STEPS=${STEPS:-1000}
EVERY=${EVERY:-250}
BATCH=${BATCH:-32}
SIZE=${SIZE:-small}
work=$(mktemp -d /tmp/verdict-XXXX)
export TORCHINDUCTOR_CACHE_DIR=${TORCHINDUCTOR_CACHE_DIR:-/tmp/inductor}  # one cache: the seeds of an arm share kernels
stage "photographs"
python3 bench/verdict_seeds.py --photos "$work/photos" || exit 1
gpus=$(python3 -c 'import torch; print(max(torch.cuda.device_count(), 1))')
budget=$(($(left) - 45))
stage "A, C, A-lr10 x 3 seeds at small size, $STEPS steps, batch $BATCH, on $gpus GPU(s), stopped after $budget s"
i=0
for seed in 0 1 2; do
  for arm in A C A-lr10; do
    CUDA_VISIBLE_DEVICES=$((i % gpus)) python3 bench/verdict_seeds.py --arm "$arm" --seed "$seed" --data "$work/photos" \
      --size "$SIZE" --steps "$STEPS" --every "$EVERY" --batch "$BATCH" --device "$DEVICE" --deadline-s "$budget" \
      --out "$work/records" --work "$work/runs" > "$work/${arm}_s$seed.log" 2>&1 &
    i=$((i + 1))
  done
done
wait
for f in "$work"/*.log; do echo "--- $f"; grep -E '^(A|C|A-lr10) [0-9] \{' "$f" | tail -2; grep -iE 'error|Traceback' "$f" | head -5; done
stage "records"
tar -C "$work" -czf "$out/verdict_records.tgz" records $(cd "$work" && ls *.log)
stage done
