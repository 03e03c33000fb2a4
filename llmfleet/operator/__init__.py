"""The llmfleet operator: kopf handlers that reconcile TrainingJob and InferenceService into Kubernetes objects.

Builders (`llmfleet.operator.builders`) are pure; `handlers` registers kopf handlers; `run` starts kopf.
"""
