#!/usr/bin/env bash
# Issue 8 on the GPU machine: install what the project needs from wheels brought along in .carry/
# (that machine has torch but no ray, torchao or lpips, and no package registry), then run the grid.
#   .carry/whl/*.whl                 torchao, lpips, fastapi, sqlalchemy, alembic, pydantic, ... (py3.12)
#   .carry/ray-2.60.0-nojars.tgz     the ray wheel unpacked without ray/jars/ (the wheel is over 64 MiB)
# Build .carry/ on a machine with a registry (python 3.12 wheels for the node):
#   pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .carry/whl \
#     torchao==0.17.0 lpips fastapi starlette uvicorn sqlalchemy alembic mako pydantic pydantic-core \
#     pydantic-settings python-dotenv annotated-types annotated-doc typing-inspection typing-extensions \
#     typer opentelemetry-api jsonschema referencing rpds-py jsonschema-specifications croniter pytz greenlet
#   pip download --no-deps ... ray==2.60.0; unzip it, delete ray/jars/, tar czf .carry/ray-2.60.0-nojars.tgz
# Usage: bash bench/quad_node.sh [quad_node.py args]   (results go to $OUT when set)
set -euo pipefail
site=/tmp/ablate-site
mkdir -p "$site"
python3 -m pip install -q --upgrade --no-index --no-deps --no-compile --no-cache-dir --target "$site" .carry/whl/*.whl
tar xzf .carry/ray-2.60.0-nojars.tgz -C "$site"
# Ray's workers inherit the driver's environment, so the project and the carried packages reach them.
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
# Never NVLink multicast on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi -L
python3 -c "import torch, ray, torchao, lpips; print('torch', torch.__version__, 'ray', ray.__version__, 'torchao', torchao.__version__, 'gpus', torch.cuda.device_count())"
out="${OUT:-/tmp}"
python3 bench/quad_node.py --out "$out/quad_node.md" "$@"
