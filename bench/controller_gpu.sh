#!/usr/bin/env bash
# Issue 27 item 4 on the GPU machine: install the carried wheels and Ray, then bench/controller_gpu.py.
#   carry/whl/*.whl        fastapi, sqlalchemy, pydantic, typer, paramiko (+ cryptography, pynacl, bcrypt),
#                          ... (py3.12; the list and how to build it: bench/quad_node.sh)
#   carry/ray-2.60.0.txz   the ray wheel unpacked without ray/jars, rllib, data, serve, tune, train, llm and
#                          the dashboard's web build, as an xz tar (the plain wheel is over 64 MiB)
# Usage: bash bench/controller_gpu.sh [controller_gpu.py args]   (the report goes to $OUT when set)
set -euo pipefail
site=/tmp/ablate-site
mkdir -p "$site"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$site" carry/whl/*.whl
python3 -c "import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])" carry/ray-2.60.0.txz "$site"
# Ray's workers inherit the driver's environment, so the project and the carried packages reach them.
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1 ABLATE_OFFLINE=1
nvidia-smi -L
python3 -c "import torch, ray, pydantic, paramiko; print('torch', torch.__version__, 'ray', ray.__version__, 'gpus', torch.cuda.device_count())"
out="${OUT:-/tmp}"
python3 bench/controller_gpu.py --out "$out/controller_gpu.md" "$@"
