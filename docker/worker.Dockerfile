# An ablate GPU node: sshd, CUDA torch and this project (its node agent and Ray) in /opt/venv. The
# controller reaches a container of this image as it reaches any node, over SSH with a pinned host key;
# bootstrap finds /etc/ablate-node, checks the installed version and skips the install
# (docs/operations.md, "Images").
#
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t ablate-worker .
#   podman build -f docker/worker.Dockerfile -t ablate-worker .
# Run (the controller's public key; GPUs through the NVIDIA container toolkit):
#   docker run -d --gpus all -p 2222:22 -e ABLATE_SSH_AUTHORIZED_KEY="$(cat id_ed25519.pub)" ablate-worker
#
# BASE: any Debian or Ubuntu image whose `python3` has the venv module. No CUDA base is needed: torch's
# Linux wheels on PyPI carry their CUDA libraries, and the driver comes from the host.
ARG BASE=python:3.12-slim-bookworm

# The node without ablate: sshd and Python, what a provider's stock image gives (`--target node`; the
# rented-night benchmark installs onto it at fire time to measure what this image saves).
FROM ${BASE} AS node
# openssh-server: the controller's only way in. The package's host keys are deleted: each container makes
# its own at start (docker/node-entrypoint.sh), or every instance of the image would share one.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssh-server tini procps \
    && rm -rf /var/lib/apt/lists/* /etc/ssh/ssh_host_*
COPY docker/node-entrypoint.sh /usr/local/bin/ablate-node-entrypoint
WORKDIR /root
EXPOSE 22
ENTRYPOINT ["tini", "--", "ablate-node-entrypoint"]

FROM node AS worker
# torch from the package index, as everywhere else. TORCH_PIP_ARGS adds sources (the image test passes
# `--find-links /wheels` with a CPU wheel, to keep CI small).
ARG TORCH=torch==2.13.0
ARG TORCH_PIP_ARGS=""
# Options for every pip install: a mirror (`--index-url`), a proxy's CA bundle (`--cert`).
ARG PIP_ARGS=""

ENV VIRTUAL_ENV=/opt/venv PATH=/opt/venv/bin:$PATH PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python3 -m venv $VIRTUAL_ENV
RUN --mount=type=cache,target=/root/.cache/pip pip install $PIP_ARGS $TORCH_PIP_ARGS "$TORCH"

# Dependencies before the source (see controller.Dockerfile).
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
    pip install --no-deps --no-build-isolation --force-reinstall . && pip check \
    && echo "$VIRTUAL_ENV" > /etc/ablate-node

# Checkpoints land under the same absolute path as on the controller, so sweeps can copy them back.
ENV ABLATE_HOME_DIR=/var/lib/ablate
WORKDIR /root
