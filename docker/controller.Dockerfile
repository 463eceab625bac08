# The ablate controller: REST API + dashboard, the Ray head, and (as a second service) the sweep runner.
# CPU-only torch: the controller never trains; GPU work runs in Ray workers (worker.Dockerfile or
# rented nodes that join over SSH).
#
# Build from the repository root:  docker build -f docker/controller.Dockerfile -t ablate-controller .
# (docker/controller.Dockerfile.dockerignore keeps .venv, .git and local state out of the context.)
# Python 3.12 to match the worker image and Ubuntu 24.04 rented nodes: Ray needs the same Python
# minor version on every node of a cluster (bootstrap checks it).
ARG PYTHON_VERSION=3.12
FROM python:${PYTHON_VERSION}-slim-bookworm

ARG TORCH_VERSION=2.13.0
ARG TORCHVISION_VERSION=0.28.0

# openssh-client: ssh-keyscan / ssh-keygen for trusting node host keys (docs/operations.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client tini \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PIP_NO_CACHE_DIR=1 PYTHONUNBUFFERED=1
RUN python -m venv $VIRTUAL_ENV
# torch first, from the CPU index: an unpinned torch from PyPI pulls a multi-GB CUDA build.
RUN pip install "torch==${TORCH_VERSION}" "torchvision==${TORCHVISION_VERSION}" \
        --index-url https://download.pytorch.org/whl/cpu

WORKDIR /src
COPY pyproject.toml README.md ./
COPY orchestrator ./orchestrator
COPY worker ./worker
COPY model ./model
COPY arms ./arms
COPY migrations ./migrations
RUN pip install "torch==${TORCH_VERSION}" . && pip check
# The provider SDKs after the check: installed without their declared requirements, which conflict with ours
# (pyproject.toml lists what they import); `pip check` would flag exactly those pins.
RUN pip install --no-deps vastai==1.9.1 runpod==1.12.0

# State (SQLite if no Postgres is configured, checkpoints, the generated API token, sweep results).
ENV ABLATE_STORAGE_DIR=/var/lib/ablate ABLATE_HOST=0.0.0.0 ABLATE_PORT=8000
VOLUME /var/lib/ablate
WORKDIR /var/lib/ablate
EXPOSE 8000

# No Ray here: every node runs its own, and the controller reaches each over SSH alone (docs/security.md).
# This image has no GPUs, so its own machine trains nothing (ABLATE_LOCAL_NODE=false): arms go to the
# registered and rented nodes.
ENV ABLATE_LOCAL_NODE=false
ENTRYPOINT ["tini", "--"]
CMD ["ablate", "serve"]
