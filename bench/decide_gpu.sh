#!/usr/bin/env bash
# Issue 50 item 6 / issue 56 item 11 on the GPU machine: the carried wheels and Ray as bench/quad_node.sh installs
# them (bench/carried_env.sh: once a call), then bench/decide_gpu.py.
# Usage: bash bench/decide_gpu.sh [decide_gpu.py args]   (results go to $OUT when set)
set -euo pipefail
source bench/carried_env.sh
python3 -c "import torch, ray, lpips; print('ray', ray.__version__, 'gpus', torch.cuda.device_count())"
stage "decide_gpu.py"
python3 bench/decide_gpu.py --out "$out/decide_gpu.md" "$@"
