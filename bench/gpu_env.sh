# Sourced by the bench/*_gpu.sh scripts on the GPU machine: the carried wheels, the environment, timing.
#   WHEELS (default .gpu-whl, else carry/whl): *.whl installed into a private site (that machine has torch
#   but not pydantic, sqlalchemy, torchao, lpips; nothing can be fetched there). Build it here with
#   `pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp --platform
#   manylinux_2_28_x86_64 --platform manylinux2014_x86_64 --platform any -d .gpu-whl NAME==VERSION ...`
#   (pydantic, pydantic-core, annotated-types, typing-inspection, typing-extensions, sqlalchemy, greenlet,
#   torchao, lpips, pydantic-settings, python-dotenv, croniter at the versions of this venv) and name it
#   in the device call's carry. Its alt/ subfolder (another torchao, say) is left for the script.
# Defines: T0, DEADLINE (seconds the call may use), left (seconds left), stage (a timed banner), out ($OUT).
T0=$(date +%s)
DEADLINE=${DEADLINE:-585}
left() { echo $((DEADLINE - ($(date +%s) - T0))); }
stage() { echo "=== $(date -u +%H:%M:%S) [$(($(date +%s) - T0)) s] $*"; }
WHEELS=${WHEELS:-$( [ -d .gpu-whl ] && echo .gpu-whl || echo carry/whl )}
if [ -d "$WHEELS" ]; then
  site=/tmp/ablate-site
  mkdir -p "$site"
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$site" "$WHEELS"/*.whl
  export PYTHONPATH="$site:$PWD"
else
  export PYTHONPATH="$PWD"
fi
export PYTHONUNBUFFERED=1 ABLATE_OFFLINE=1
# Never NVLink multicast on shared hosts.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
out=${OUT:-/tmp/ablate-gpu-out}
mkdir -p "$out"
nvidia-smi -L 2>/dev/null
python3 -c "import torch, torchao, pydantic; print('torch', torch.__version__, 'torchao', torchao.__version__, 'pydantic', pydantic.VERSION)"
