"""Serving an aiohttp app on a loopback port for a test: fake engines, agents and metrics pages."""

from __future__ import annotations

from aiohttp import web


async def serve_app(app: web.Application) -> tuple[web.AppRunner, str]:
    """Start `app` on 127.0.0.1 (a free port); (its runner, to clean up; its base URL)."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    return runner, f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"  # type: ignore[union-attr]
