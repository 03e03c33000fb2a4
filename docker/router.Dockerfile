# syntax=docker/dockerfile:1.7
# The llmfleet router (OpenAI-compatible gateway) and autoscaler, with the feature-store client.
# Build from the repository root: docker build -f docker/router.Dockerfile -t ghcr.io/llmfleet/llmfleet:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY docker/constraints.txt /constraints.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
RUN pip install --no-cache-dir pip==25.3 \
 && pip wheel --no-cache-dir -c /constraints.txt --wheel-dir /wheels ".[router,autoscaler,store]"

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
RUN groupadd --gid ${UID} llmfleet \
 && useradd --uid ${UID} --gid ${UID} --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "llmfleet[router,autoscaler,store]" \
 && llmfleet --help >/dev/null
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet
USER ${UID}:${UID}
EXPOSE 8080
ENTRYPOINT ["llmfleet"]
CMD ["router", "--help"]
