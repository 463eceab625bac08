# The ablate controller: REST API, dashboard, launcher and the sweep runner (`ablate serve`). No Ray and
# no GPUs here: every node runs its own Ray and is reached over SSH alone (docs/security.md).
#
# Build from the repository root (docs/operations.md, "Images", has the commands as tested):
#   docker build -f docker/controller.Dockerfile -t ablate-controller .
#   podman build -f docker/controller.Dockerfile -t ablate-controller .
#
# BASE: any Debian or Ubuntu image whose `python3` has the venv module. The default is the real one; the
# image test (tests/images/) passes a base it makes with debootstrap, since no registry is reachable there.
ARG BASE=python:3.12-slim-bookworm
FROM ${BASE}

# The controller never trains: CPU torch, from PyTorch's CPU index (an unpinned torch from PyPI is a
# multi-GB CUDA build). TORCH_PIP_ARGS replaces the index (e.g. `--find-links /wheels` for a local wheel).
ARG TORCH=torch==2.13.0
ARG TORCH_PIP_ARGS="--index-url https://download.pytorch.org/whl/cpu"
# Options for every pip install: a mirror (`--index-url`), a proxy's CA bundle (`--cert`).
ARG PIP_ARGS=""

# openssh-client: ssh-keyscan / ssh-keygen for trusting node host keys (docs/operations.md).
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-client tini \
    && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv $VIRTUAL_ENV
# A cache mount keeps pip's downloads out of the image and shared between builds.
RUN --mount=type=cache,target=/root/.cache/pip pip install $PIP_ARGS $TORCH_PIP_ARGS "$TORCH"

# Dependencies before the source, so an edit to the code rebuilds only the last layers: with only
# pyproject.toml present, `pip install .` installs the requirements and an empty package. No build
# isolation (an isolated build would not see PIP_ARGS): the build requirements (pyproject.toml) first.
WORKDIR /src
COPY pyproject.toml README.md ./
RUN --mount=type=cache,target=/root/.cache/pip pip install $PIP_ARGS "setuptools>=69" "setuptools-scm>=8" \
    && pip install $PIP_ARGS --no-build-isolation "$TORCH" .
COPY orchestrator ./orchestrator
COPY worker ./worker
COPY model ./model
COPY arms ./arms
COPY migrations ./migrations
# The version the image reports (`ablate --version`, /healthz): the build context has no .git, so it is
# given as setuptools-scm would say it: `--build-arg ABLATE_VERSION=$(python -m setuptools_scm)`; unset: 0.0.
# Declared here, so a new version rebuilds only this layer.
ARG ABLATE_VERSION=0.0
RUN SETUPTOOLS_SCM_PRETEND_VERSION_FOR_ABLATE_DIT="$ABLATE_VERSION" \
    pip install --no-deps --no-build-isolation --force-reinstall . && pip check
# The provider SDKs after the check: installed without their declared requirements, which conflict with ours
# (pyproject.toml lists what they import); `pip check` would flag exactly those pins.
RUN --mount=type=cache,target=/root/.cache/pip pip install $PIP_ARGS --no-deps vastai==1.9.1 runpod==1.12.0

# State (SQLite if no Postgres is configured, checkpoints, the generated API token, sweep results).
ENV ABLATE_HOME_DIR=/var/lib/ablate ABLATE_HOST=0.0.0.0 ABLATE_PORT=8000
# Nodes' keys and known-hosts files are mounted read-only at /ssh (docker/compose.yaml); POST /api/nodes
# may name files there and nowhere else.
ENV ABLATE_SSH_KEY_DIRS='["/ssh"]'
VOLUME /var/lib/ablate
WORKDIR /var/lib/ablate
EXPOSE 8000

# This image has no GPUs, so its own machine trains nothing: arms go to the registered and rented nodes.
ENV ABLATE_LOCAL_NODE=false
ENTRYPOINT ["tini", "--"]
CMD ["ablate", "serve"]
