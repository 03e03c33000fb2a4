# syntax=docker/dockerfile:1.7
# The llmfleet operator: kopf handlers, pure builders and the autoscaler timers it hosts.
# No torch, no vLLM (checked at build time).
# Build from the repository root: docker build -f docker/operator.Dockerfile -t ghcr.io/llmfleet/llmfleet-operator:0.1.0 .
ARG PYTHON_IMAGE=python:3.11.14-slim-bookworm

FROM ${PYTHON_IMAGE} AS wheels
WORKDIR /src
COPY docker/constraints.txt /constraints.txt
COPY pyproject.toml README.md ./
COPY llmfleet ./llmfleet
RUN pip install --no-cache-dir pip==25.3 \
 && pip wheel --no-cache-dir -c /constraints.txt --wheel-dir /wheels ".[operator,autoscaler]"

FROM ${PYTHON_IMAGE} AS runtime
ARG UID=10001
RUN groupadd --gid ${UID} llmfleet \
 && useradd --uid ${UID} --gid ${UID} --home-dir /home/llmfleet --create-home --shell /usr/sbin/nologin llmfleet
# (versions come from the wheels built above with -c constraints.txt; --no-index installs nothing else)
# hadolint ignore=DL3013
RUN --mount=type=bind,from=wheels,source=/wheels,target=/wheels \
    pip install --no-cache-dir --no-index --find-links /wheels "llmfleet[operator,autoscaler]" \
 && python -c "import importlib.util as u, sys; sys.exit(1 if u.find_spec('torch') or u.find_spec('vllm') else 0)" \
 && llmfleet --help >/dev/null && llmfleet operator --help >/dev/null \
 && python -c "import llmfleet.operator.run, llmfleet.operator.handlers, llmfleet.autoscaler.kopf_handlers"
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/home/llmfleet
USER ${UID}:${UID}
EXPOSE 8080 8081
ENTRYPOINT ["llmfleet"]
CMD ["operator", "--all-namespaces"]
