#!/usr/bin/env bash
# Issue 8 / 24 on the GPU machine: install what the project needs from wheels brought along in .carry/
# (that machine has torch but no ray, torchao or lpips, and no package registry), then run the grid.
#   .carry/whl/*.whl                 python 3.12 wheels of: torchao lpips fastapi starlette uvicorn sqlalchemy
#                                    greenlet alembic mako pydantic pydantic-core pydantic-settings python-dotenv
#                                    annotated-types annotated-doc typing-inspection typing-extensions croniter
#                                    opentelemetry-api jsonschema referencing rpds-py jsonschema-specifications
#                                    (at this venv's versions: `pip freeze`; no paramiko: a file:// or s3://
#                                    store needs none). Download command: bench/gpu_env.sh's header.
#   .carry/ray-2.60.0-nojars.tgz     the ray wheel unpacked without ray/jars/ (the wheel is over 64 MiB)
#   pip download --no-deps ... ray==2.60.0; unzip it, delete ray/jars/, tar czf .carry/ray-2.60.0-nojars.tgz
# Usage: bash bench/quad_node.sh [quad_node.py args]   (results go to $OUT when set)
set -euo pipefail
WHEELS=.carry/whl
source bench/gpu_env.sh
tar xzf .carry/ray-2.60.0-nojars.tgz -C "$site"
# Ray's workers inherit the driver's environment (PYTHONPATH from gpu_env.sh), so the project reaches them.
python3 -c "import torch, ray, lpips; print('ray', ray.__version__, 'gpus', torch.cuda.device_count())"
python3 bench/quad_node.py --out "$out/quad_node.md" "$@"
