# An ablate GPU worker: CUDA runtime + cuDNN, CUDA torch, this project; joins the controller's Ray
# cluster and trains arms on its GPUs (one arm per GPU).
#
# Build from the repository root:  docker build -f docker/worker.Dockerfile -t ablate-worker .
# Run on a GPU host (NVIDIA Container Toolkit installed):
#   docker run --gpus all --network host --shm-size 16g -v /var/lib/ablate:/var/lib/ablate \
#     ablate-worker ray start --address=CONTROLLER:6379 --block
# Ubuntu 24.04's Python is 3.12, the controller image's too: Ray needs one Python minor version per cluster.
FROM nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04

ARG TORCH_VERSION=2.13.0
ARG TORCHVISION_VERSION=0.28.0
ARG CUDA_INDEX=cu128

RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv python3-dev build-essential tini \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN python3 -m venv $VIRTUAL_ENV
# CUDA torch from the matching PyTorch index first; the project install below keeps it pinned.
RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
        --index-url https://download.pytorch.org/whl/${CUDA_INDEX}

WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY worker ./worker
COPY model ./model
COPY arms ./arms
COPY migrations ./migrations
RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" . && pip check

# Checkpoints land under the same absolute path as on the controller, so sweeps can copy them back.
ENV ABLATE_STORAGE_DIR=/var/lib/ablate
WORKDIR /var/lib/ablate
ENTRYPOINT ["tini", "--"]
# Override the address: `... ablate-worker ray start --address=CONTROLLER:6379 --block`. The head has
# token auth on: pass RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH (a mounted 0600 copy of ray_token).
CMD ["sh", "-c", "ray start --address=${RAY_HEAD:?set RAY_HEAD=controller-host:6379} --disable-usage-stats --block"]
