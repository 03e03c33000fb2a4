"""The llmfleet router: OpenAI-compatible gateway with prefix-cache-aware routing and student-pool fallback.

Pure, importable without aiohttp: config (RouterConfig), plugins (the routing pipeline), prefix_index,
fallback, requests, dispatch (the routing core). The server (server.py, proxy.py, store_response.py, replicas.py,
kv_events.py) needs aiohttp. See docs/router.md.
"""
