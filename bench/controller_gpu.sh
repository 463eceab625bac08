#!/usr/bin/env bash
# Issue 27 item 4 on the GPU machine: install the carried wheels and Ray, then bench/controller_gpu.py.
#   carry/whl/*.whl        the list in bench/quad_node.sh (py3.12; how to build it: bench/gpu_env.sh)
#   carry/ray-2.60.0.txz   the ray wheel unpacked without ray/jars, rllib, data, serve, tune, train, llm and
#                          the dashboard's web build, as an xz tar (the plain wheel is over 64 MiB)
# Usage: bash bench/controller_gpu.sh [controller_gpu.py args]   (the report goes to $OUT when set)
set -euo pipefail
WHEELS=carry/whl
source bench/gpu_env.sh
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" carry/ray-2.60.0.txz "$site"
# Ray's workers inherit the driver's environment (PYTHONPATH from gpu_env.sh), so the project reaches them.
python3 -c "import torch, ray; print('ray', ray.__version__, 'gpus', torch.cuda.device_count())"
python3 bench/controller_gpu.py --out "$out/controller_gpu.md" "$@"
