"""Command-line entry point (see llmfleet.cli.main)."""
