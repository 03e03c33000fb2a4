"""alembic migrations of the feature store (a package so that wheels ship them)."""
