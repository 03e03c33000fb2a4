# syntax=docker/dockerfile:1.7
# The llmfleet router (OpenAI-compatible gateway) and autoscaler, with the feature-store client.
# No torch (checked at build time): semantic lookups with a local embedding model need the `embeddings` extra,
# which pulls torch: --build-arg EXTRAS=router,autoscaler,store,embeddings (and drop the check).
# Build from the repository root: docker build -f docker/router.Dockerfile -t ghcr.io/llmfleet/llmfleet:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm
ARG EXTRAS=router,autoscaler,store
ARG FORBID=torch,vllm

FROM ${PYTHON_IMAGE} AS wheels
ARG EXTRAS
WORKDIR /src
COPY docker/constraints.txt /constraints.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
RUN pip install --no-cache-dir pip==25.3 \
 && pip wheel --no-cache-dir -c /constraints.txt --wheel-dir /wheels ".[${EXTRAS}]"

FROM ${PYTHON_IMAGE} AS runtime
ARG EXTRAS
ARG FORBID
ARG UID=10001
RUN groupadd --gid ${UID} llmfleet \
 && useradd --uid ${UID} --gid ${UID} --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet
# (versions come from the wheels built above with -c constraints.txt; --no-index installs nothing else)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "llmfleet[${EXTRAS}]" \
 && python -c "import importlib.util as u, sys; bad = [m for m in sys.argv[1].split(',') if m and u.find_spec(m)]; \
sys.exit(f'forbidden in this image: {bad}' if bad else 0)" "${FORBID}" \
 && llmfleet --help >/dev/null && llmfleet router --help >/dev/null && llmfleet autoscaler --help >/dev/null
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet
USER ${UID}:${UID}
EXPOSE 8080
ENTRYPOINT ["llmfleet"]
CMD ["router", "--help"]
