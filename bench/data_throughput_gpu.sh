#!/usr/bin/env bash
# On the GPU machine (torch, no registry): install from whl/ only what is missing, then run the bench.
set -uo pipefail
site=/tmp/ablate-site; mkdir -p "$site"
need=()
for spec in pydantic:pydantic- pydantic_core:pydantic_core- annotated_types:annotated_types- \
    typing_inspection:typing_inspection- typing_extensions:typing_extensions- PIL:pillow- tqdm:tqdm- \
    torchvision:torchvision- lpips:lpips-; do
  mod=${spec%%:*}; whl=${spec##*:}
  python3 -c "import $mod" 2>/dev/null || need+=(whl/${whl}*.whl)
done
python3 -c "import pydantic, sys; sys.exit(int(pydantic.VERSION[0]) < 2)" 2>/dev/null || need+=(whl/pydantic-*.whl whl/pydantic_core-*.whl)
echo "installing: ${need[*]:-nothing}"
[ ${#need[@]} -gt 0 ] && python3 -m pip install -q --no-index --no-deps --no-compile --target "$site" "${need[@]}"
export PYTHONPATH="$site:$PWD" PYTHONUNBUFFERED=1
nvidia-smi -L; nproc; ls /proc/driver/nvidia/gpus 2>/dev/null | wc -l
python3 -c "import torch, pydantic; print('torch', torch.__version__, 'pydantic', pydantic.VERSION)"
python3 bench/data_throughput.py "$@"
