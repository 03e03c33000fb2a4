"""Pure builders: one module per kind, CR -> list of manifests (dicts). No API calls."""

from llmfleet.operator.builders.inferenceservice import ServiceSpecError, build_inferenceservice
from llmfleet.operator.builders.trainingjob import build_trainingjob

__all__ = ["ServiceSpecError", "build_inferenceservice", "build_trainingjob"]
