"""alembic revision scripts."""
