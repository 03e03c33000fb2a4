"""llmfleet: a Kubernetes operator and control plane for LLM fleets."""

__version__ = "0.1.0"
