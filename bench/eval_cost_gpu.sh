#!/usr/bin/env bash
# Issue 62 on the GPU machine: the carried wheels and Ray as bench/quad_node.sh installs them
# (bench/carried_env.sh), then bench/eval_cost.py (what an evaluation job costs at seed size).
# Usage: bash bench/eval_cost_gpu.sh [eval_cost.py args]   (results go to $OUT when set)
set -euo pipefail
source bench/carried_env.sh
stage "eval_cost.py"
python3 bench/eval_cost.py --out "$out" "$@"
