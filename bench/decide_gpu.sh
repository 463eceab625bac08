#!/usr/bin/env bash
# Issue 50 item 6 on the GPU machine: the carried wheels and Ray exactly as bench/quad_node.sh installs them
# (.carry/whl/*.whl and .carry/ray-2.60.0-nojars.tgz; its header lists them), then bench/decide_gpu.py.
# Usage: bash bench/decide_gpu.sh [decide_gpu.py args]   (results go to $OUT when set)
set -euo pipefail
WHEELS=.carry/whl
source bench/gpu_env.sh
tar xzf .carry/ray-2.60.0-nojars.tgz -C "$site"
python3 -c "import torch, ray, lpips; print('ray', ray.__version__, 'gpus', torch.cuda.device_count())"
stage "decide_gpu.py"
python3 bench/decide_gpu.py --out "$out/decide_gpu.md" "$@"
