# Sourced by bench/decide_gpu.sh and bench/distribution_gpu.sh on the GPU machine: .carry/'s wheels and Ray
# (.carry/whl/*.whl and .carry/ray-2.60.0-nojars.tgz; bench/quad_node.sh's header lists them) installed into
# /tmp/ablate-site through bench/gpu_env.sh, once a call: a script after the first reuses that site.
# The Ray tarball also leaves out ray/rllib, ray/llm, ray/data and ray/serve (imported only on demand; none
# used here), so that it, the wheels and the tree stay under the device call's 64 MiB.
# Defines out ($OUT, else /tmp/ablate-gpu-out) and stage (a timed banner).
if [ -f /tmp/ablate-site/.carried ]; then
  export PYTHONPATH="/tmp/ablate-site:$PWD" PYTHONUNBUFFERED=1 ABLATE_OFFLINE=1
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1  # never NVLink multicast
  out=${OUT:-/tmp/ablate-gpu-out}
  mkdir -p "$out"
  stage() { echo "=== $(date -u +%H:%M:%S) $*"; }
else
  WHEELS=.carry/whl
  source bench/gpu_env.sh
  tar xzf .carry/ray-2.60.0-nojars.tgz -C "$site"
  touch "$site/.carried"
fi
