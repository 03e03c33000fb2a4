# syntax=docker/dockerfile:1.7
# Serving worker for NVIDIA GPUs: vLLM's official image (CUDA, vLLM and its torch as vLLM ships them) plus
# llmfleet's serving wrapper. The operator sets the command: python -m llmfleet.workers.serve --engine vllm -- <vLLM args>.
# Build from the repository root: docker build -f docker/serve.Dockerfile -t ghcr.io/llmfleet/llmfleet-serve:0.1.0 .
# VLLM_VERSION must lie in the `serve` extra's range (pyproject.toml); pip checks it below.
ARG VLLM_VERSION=0.32.0
ARG VLLM_IMAGE=vllm/vllm-openai:v${VLLM_VERSION}

FROM ${VLLM_IMAGE} AS runtime
ARG VLLM_VERSION
ARG UID=10001
WORKDIR /src
COPY docker/constraints.txt /tmp/constraints-dev.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
# Constraints: everything the base image ships stays at its version (installing llmfleet never changes vLLM's
# environment); packages it lacks take docker/constraints.txt's versions.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN python3 -m pip freeze --all | grep -v -E '^(-e |.* @ )' | sed -E 's/\+[A-Za-z0-9.]+$//' > /tmp/constraints.txt \
 && awk -F'==' 'NR==FNR { have[tolower($1)] = 1; next } /^[A-Za-z0-9]/ && !(tolower($1) in have)' \
      /tmp/constraints.txt /tmp/constraints-dev.txt > /tmp/constraints-more.txt \
 && python3 -m pip install --no-cache-dir -c /tmp/constraints.txt -c /tmp/constraints-more.txt \
      ".[serve]" "vllm==${VLLM_VERSION}" \
 && python3 -c "import llmfleet.workers.serve.worker, vllm" \
 && (command -v python >/dev/null || ln -s "$(command -v python3)" /usr/local/bin/python) \
 && groupadd --gid "${UID}" llmfleet \
 && useradd --uid "${UID}" --gid "${UID}" --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet \
 && rm -rf /src /tmp/constraints*.txt
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet VLLM_NO_USAGE_STATS=1
USER ${UID}:${UID}
WORKDIR /home/llmfleet
EXPOSE 8000
# vLLM's image starts `vllm serve`; here the operator's command runs the wrapper, which starts vLLM.
ENTRYPOINT []
CMD ["python", "-m", "llmfleet.workers.serve", "--help"]
