# syntax=docker/dockerfile:1
# One image for every Gregor role; the command picks the role (gregor-broker, gregor-controller,
# gregor-coordinator, gregor-gateway, or the `gregor` CLI). etcd runs from its own image in the chart.
#
#   docker build -t gregor:0.1.0 .
#   docker run --rm gregor:0.1.0 gregor-broker --help
#
# The build stage runs `make setup` itself (the very commands CI runs on every fresh clone: pinned
# deps, `make proto`, the maturin build of the native module), then turns the result into wheels.

ARG RUST_IMAGE=rust:1.95-slim-bookworm
ARG PYTHON_IMAGE=python:3.12-slim-bookworm

FROM ${RUST_IMAGE} AS build
# make + a C compiler (zstd's C sources) + Python for maturin and grpc_tools; the module is abi3
# (py311+), so the wheel built with Debian's Python 3.11 runs on the runtime stage's 3.12.
RUN apt-get update \
 && apt-get install -y --no-install-recommends make gcc libc6-dev python3 python3-venv \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Same targets as a developer's `make setup`; then the project wheel (with the generated stubs)
# next to the native wheel maturin left in native/target/wheels.
RUN make setup PYTHON=python3 \
 && .venv/bin/pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && cp native/target/wheels/*.whl /wheels/

FROM ${PYTHON_IMAGE} AS runtime
ARG VERSION=0.1.0
ARG REVISION=unknown
ARG CREATED=unknown
LABEL org.opencontainers.image.title="gregor" \
      org.opencontainers.image.description="Kafka's replicated, partitioned commit log as gRPC microservices" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.created="${CREATED}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="https://example.invalid/gregor"
# tini is PID 1: it forwards SIGTERM to the role (whose handler runs controlled shutdown) and reaps zombies.
RUN apt-get update \
 && apt-get install -y --no-install-recommends tini \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 gregor \
 && useradd --system --uid 10001 --gid gregor --home-dir /var/lib/gregor --shell /usr/sbin/nologin gregor \
 && mkdir -p /var/lib/gregor \
 && chown gregor:gregor /var/lib/gregor
COPY --from=build /wheels /tmp/wheels
# The project wheel pulls its dependencies at the versions pinned in pyproject.toml.
RUN pip install --no-cache-dir --disable-pip-version-check /tmp/wheels/*.whl \
 && rm -rf /tmp/wheels
# Read-only root filesystem: no .pyc writes at run time, logs to stderr unbuffered.
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
USER 10001:10001
WORKDIR /var/lib/gregor
EXPOSE 9092 9093
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["gregor", "--help"]
