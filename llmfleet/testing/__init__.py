"""Test doubles shared by the test suite and the benchmarks: a fake OpenAI/vLLM backend (`fake_backend`, also
`python -m llmfleet.testing.fake_backend`) and a threaded fake OpenAI server with request-log helpers for the
feature store (`fake_openai`).

Its floor is just below cli: it may import any other package; nothing in llmfleet imports it but the tests
and benchmarks (tests/unit/test_import_rules.py, docs/architecture.md)."""
