"""SLO-driven, cache-aware autoscaler: pure policy (policy.py), signals, actuation, arbitration. See docs/autoscaler.md."""
