# An ablate GPU node's environment: CUDA runtime + cuDNN, CUDA torch, this project (its node agent and Ray).
# The controller reaches a node over SSH and bootstraps it (docs/operations.md); this image gives that
# bootstrap a ready environment (ABLATE_NODE_VENV=/opt/venv, ABLATE_NODE_INSTALL='[]').
#
# Build from the repository root:  docker build -f docker/worker.Dockerfile -t ablate-worker .
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
# A node's environment: the controller bootstraps a host running this image over SSH with
# ABLATE_NODE_VENV=/opt/venv and ABLATE_NODE_INSTALL='[]' (nothing to install), which writes the node
# agent's launcher and starts the node's own Ray (docs/operations.md). The image does not run sshd yet.
CMD ["python", "-m", "worker.agent", "--help"]
