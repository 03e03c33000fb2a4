"""Feature store: prompt features, embeddings and precomputed responses (SQLAlchemy 2 + alembic).

Online lookups for the router live in `llmfleet.store.lookup`; offline generation in
`llmfleet.store.generation`; the CronJob builder for the operator in `llmfleet.operator.builders.featurestore`.
Nothing here imports torch at import time: the embedding model is loaded lazily.
"""
