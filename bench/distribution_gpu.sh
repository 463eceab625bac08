#!/usr/bin/env bash
# Issue 58 item 6 on the GPU machine: the carried wheels (bench/carried_env.sh: once a call), then
# bench/distribution_gpu.py (transformers and safetensors, which model/extractors needs, are in the image).
# Usage: bash bench/distribution_gpu.sh [distribution_gpu.py args]   (results go to $OUT when set)
set -euo pipefail
source bench/carried_env.sh
python3 -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
stage "distribution_gpu.py"
python3 bench/distribution_gpu.py --jsonl "$out/distribution_gpu.jsonl" --out "$out/distribution_gpu.md" "$@"
