# syntax=docker/dockerfile:1.7
# Training worker: torch (FSDP2) + llmfleet's trainer. The operator runs torchrun -m llmfleet.workers.train.
# TORCH_INDEX_URL picks the build: PyPI's default wheel has CUDA; e2e/run.sh uses the CPU index (smaller).
# Targets: `runtime` (default) and `e2e` (adds tokenized training data at /data for e2e/run.sh).
# Build from the repository root: docker build -f docker/train.Dockerfile -t ghcr.io/llmfleet/llmfleet-train:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG TORCH_INDEX_URL=https://pypi.org/simple

FROM ${PYTHON_IMAGE} AS wheels
ARG TORCH_INDEX_URL
WORKDIR /src
COPY docker/constraints.txt /constraints.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
RUN pip install --no-cache-dir pip==25.3 \
 && pip wheel --no-cache-dir --wheel-dir /wheels --index-url "${TORCH_INDEX_URL}" "torch==2.13.0" \
 && pip wheel --no-cache-dir -c /constraints.txt --wheel-dir /wheels --find-links /wheels ".[train]"

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
RUN groupadd --gid ${UID} llmfleet \
 && useradd --uid ${UID} --gid ${UID} --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet
# (versions come from the wheels built above with -c constraints.txt; --no-index installs nothing else)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "llmfleet[train]" \
 && python -c "import torch.distributed.fsdp, llmfleet.workers.train" \
 && command -v torchrun
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet
USER ${UID}:${UID}
WORKDIR /home/llmfleet
EXPOSE 9400
CMD ["llmfleet", "train", "--help"]

# e2e: token shards of the Python standard library's top-level modules (the corpus for tiny models) and the
# byte-level BPE (4096 tokens) trained on them, at /data/stdlib-tokens (tokenizer.json inside).
FROM runtime AS e2e
ARG UID=10001
USER root
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN mkdir -p /data /checkpoints \
 && python -c "import sysconfig; from llmfleet.workers.train.data import prepare; \
m = prepare([sysconfig.get_paths()['stdlib'] + '/*.py'], '/data/stdlib-tokens', tokenizer='bpe', vocab_size=4096); \
print(m['tokens'], 'tokens')" \
 && test -f /data/stdlib-tokens/tokenizer.json \
 && chown -R ${UID}:${UID} /data /checkpoints
USER ${UID}:${UID}
