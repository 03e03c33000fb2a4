"""Small standard-library helpers with no llmfleet imports (the bottom floor, next to llmfleet.api)."""
