"""llmfleet.io/v1alpha1 API: pydantic models that are the single source of the CRD schemas."""

from llmfleet.api.common import Condition, ObjectMeta, Resources
from llmfleet.api.contracts import API_VERSION, GROUP, VERSION
from llmfleet.api.inferenceservice import (
    PRIMARY_POOL,
    InferenceService,
    InferenceServiceSpec,
    InferenceServiceStatus,
    PoolView,
)
from llmfleet.api.loader import ManifestError, load_file, load_manifest, load_manifests, parse_resource
from llmfleet.api.trainingjob import TrainingJob, TrainingJobSpec, TrainingJobStatus

Resource = TrainingJob | InferenceService

__all__ = [
    "API_VERSION", "GROUP", "VERSION", "PRIMARY_POOL", "Condition", "InferenceService", "InferenceServiceSpec",
    "InferenceServiceStatus", "ManifestError", "ObjectMeta", "PoolView", "Resource", "Resources", "TrainingJob",
    "TrainingJobSpec", "TrainingJobStatus", "load_file", "load_manifest", "load_manifests", "parse_resource",
]
