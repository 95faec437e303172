# AGMARL-DKS: every service image, one build target each. Build from the repository root:
#   docker build -f Dockerfile --target inference -t agmarl/inference:0.1.0 .
# Targets: state-collector, graph-builder, inference, adaptive-engine, reward-calculator, trainer (docker-compose.yml
# builds each with its target). Without --target, Docker builds the last stage, the trainer.
#
#   base -+- deps-serving -- serving -- state-collector, graph-builder, inference, adaptive-engine, reward-calculator
#         +- deps-training -- training -- trainer
#   source (the project's files) is copied into serving and into training, each installing it on its own dependencies.
# Checked as a file, per target, by tests/deploy/test_compose.py and tests/deploy/test_wheel.py (no Docker engine).

# What every image shares: the interpreter, the unprivileged user, the metrics port and how Docker probes and stops it.
FROM python:3.11-slim AS base

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

RUN useradd --system --uid 10001 --home-dir /nonexistent --shell /usr/sbin/nologin agmarl

ENV AGMARL_METRICS_HOST=0.0.0.0 \
    AGMARL_METRICS_PORT=9100

# 9100: Prometheus /metrics
EXPOSE 9100

# Liveness, as Kubernetes probes it: /healthz answers 503 (and this fails) when the event loop stalls, a handler
# is stuck, or NATS has been unreachable past AGMARL_NATS_GRACE_SECONDS (libs/common/agmarl_common/runtime/health.py).
HEALTHCHECK --interval=15s --timeout=5s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/healthz' % os.environ.get('AGMARL_METRICS_PORT', '9100'), timeout=4)"]

STOPSIGNAL SIGTERM

# Dependencies first, so a code change does not reinstall them; one stage per requirements file.
FROM base AS deps-serving
COPY requirements.txt constraints.txt ./
# requirements.txt has no torch: the serving images run numpy and ONNX Runtime only.
RUN pip install -r requirements.txt -c constraints.txt

FROM base AS deps-training
COPY requirements.txt requirements-train.txt constraints.txt ./
# The CPU wheel of torch: the PyTorch CPU index is searched too, and its 2.13.0+cpu build
# satisfies the torch==2.13.0 pin while pulling no CUDA libraries.
RUN pip install -r requirements-train.txt -c constraints.txt \
        --extra-index-url https://download.pytorch.org/whl/cpu

# The project's files, no image of its own: setup.py finds every package under libs/common, cli/ and services/,
# and ships the model folders under models/ (default, the experts) as package data.
FROM scratch AS source
WORKDIR /app
COPY pyproject.toml setup.py ./
COPY libs/ libs/
COPY services/ services/
COPY cli/ cli/
COPY models/ models/

# The project installed on each set of dependencies, without touching the pins; then the user it runs as.
FROM deps-serving AS serving
COPY --from=source /app/ ./
RUN pip install --no-deps .
USER 10001:10001

FROM deps-training AS training
COPY --from=source /app/ ./
RUN pip install --no-deps .
# The trainer's work files (the experience buffer's mirror, its runs, fetched and published models): /app is
# root's and read-only to the user; docker-compose.yml and the Kubernetes manifests mount a volume here.
RUN mkdir -p /var/lib/agmarl && chown 10001:10001 /var/lib/agmarl
USER 10001:10001

# The services: what each one adds is its name and its command.
FROM serving AS state-collector
ENV OTEL_SERVICE_NAME=state-collector
CMD ["python", "-m", "agmarl_state_collector"]

FROM serving AS graph-builder
ENV OTEL_SERVICE_NAME=graph-builder
CMD ["python", "-m", "agmarl_graph_builder"]

FROM serving AS inference
ENV OTEL_SERVICE_NAME=inference \
    AGMARL_HTTP_HOST=0.0.0.0 \
    AGMARL_HTTP_PORT=8080
# 8080: kube-scheduler extender (POST /filter /prioritize /bind, GET /healthz /readyz)
EXPOSE 8080
CMD ["python", "-m", "agmarl_inference"]

FROM serving AS adaptive-engine
ENV OTEL_SERVICE_NAME=adaptive-engine
CMD ["python", "-m", "agmarl_adaptive_engine"]

FROM serving AS reward-calculator
ENV OTEL_SERVICE_NAME=reward-calculator
CMD ["python", "-m", "agmarl_reward_calculator"]

FROM training AS trainer
# The training configs, read from the working directory (agmarl_trainer.app.CONFIG_DIR is /app/configs/train).
COPY configs/ configs/
ENV OTEL_SERVICE_NAME=trainer \
    AGMARL_STATE_DIR=/var/lib/agmarl
CMD ["python", "-m", "agmarl_trainer"]
