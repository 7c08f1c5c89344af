# syntax=docker/dockerfile:1
#
# The tunefleet image: one image for every container of the Helm chart (helm/tunefleet) and of
# the kustomize manifests (k8s/): the Prefect server, the Prefect Kubernetes workers, the hook
# Jobs (`tunefleet db upgrade`, `tunefleet deploy`) and the flow-run Jobs that tune shards.
#
# NOT BUILT IN CI: no Docker engine runs on the development machines or in CI, so this file has
# never been built or run here. It follows the README's install (`pip install '.[torch,kubernetes]'`,
# non-editable) and is reviewed by hand; tests/helm checks only that the chart's default image
# matches tunefleet.cluster.job_templates.DEFAULT_IMAGE.
#
#   docker build -t tunefleet:0.1.0 .
#   docker buildx build --platform linux/amd64,linux/arm64 -t REGISTRY/tunefleet:0.1.0 --push .
#   docker build --build-arg EXTRAS=torch,kubernetes,gpu -t REGISTRY/tunefleet:0.1.0-gpu .   # NVML energy counters
#
# No ENTRYPOINT on purpose: the Prefect Kubernetes worker starts a flow run by setting only the
# container's args (`prefect flow-run execute`), which an ENTRYPOINT would swallow. Every
# container of the chart names its command.

ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG EXTRAS=torch,kubernetes
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tunefleet
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tunefleet ./tunefleet
COPY tasks ./tasks
COPY flows ./flows
RUN /opt/tunefleet/bin/pip install ".[${EXTRAS}]"

FROM ${PYTHON_IMAGE}
# g++: TVM links each measured candidate into a shared library with the system C++ compiler
# (tvm.contrib.cc) before running it; tuning fails without one.
RUN apt-get update \
 && apt-get install -y --no-install-recommends g++ \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 10001 tunefleet \
 && useradd --uid 10001 --gid 10001 --home-dir /home/tunefleet --create-home --shell /usr/sbin/nologin tunefleet
COPY --from=build /opt/tunefleet /opt/tunefleet
ENV PATH=/opt/tunefleet/bin:$PATH \
    HOME=/home/tunefleet \
    TUNEFLEET_HOME=/home/tunefleet/.tunefleet \
    PREFECT_HOME=/home/tunefleet/.prefect \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /home/tunefleet
CMD ["tunefleet", "--help"]
