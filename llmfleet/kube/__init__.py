"""Cluster access: the one place llmfleet talks to the Kubernetes API server from.

The floor right above `llmfleet.api` (contracts): the operator, the autoscaler and the router may import it;
it imports nothing from llmfleet but `llmfleet.api`.
"""
