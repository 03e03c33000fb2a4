"""vLLM's series as Ray exports them, renamed back to vLLM's own names for the replica's `/metrics`.

Ray Serve LLM records vLLM's metrics through Ray (`vllm.v1.metrics.ray_wrappers`), and Ray's metrics agent
exports them on a port of its own, not on the OpenAI server's: `vllm:num_requests_running` becomes
`ray_vllm_num_requests_running`, labelled with Ray's process (node, session, worker, version, the OpenTelemetry
scope) besides vLLM's own labels. The agent's page also has Ray's own ~2,500 lines (~900 KB with one replica).
The serving wrapper's `/metrics` for `engine: ray-serve` serves `vllm_series(page)`: vLLM's series under vLLM's
names, so the router, the autoscaler and Prometheus read one set of names whichever engine a pool runs.
"""

from __future__ import annotations

import re

# The port of Ray's metrics agent, chosen by the serving wrapper and read by the Ray Serve app (ray_app.py).
RAY_METRICS_PORT_ENV = "LLMFLEET_RAY_METRICS_PORT"
# How often Ray's workers export to the agent. Ray's default is 10 s; the router scrapes every second and the
# agent drops a gauge after two intervals without an export, so a finished replica's series go within 2 s.
RAY_METRICS_REPORT_INTERVAL_MS = 1000

_RAY_PREFIX = b"ray_vllm_"
_VLLM_PREFIX = b"vllm:"
# Labels Ray adds to every series of a worker process. `ReplicaId` stays: it is what tells a restarted Serve
# replica's series from the one it replaced while the agent still holds both.
RAY_PROCESS_LABELS = ("Component", "NodeAddress", "SessionName", "Version", "WorkerId",
                      "otel_scope_name", "otel_scope_schema_url", "otel_scope_version")
# One of them after a comma (a line's labels are given one in front): a literal first character lets the regex
# skip ahead, 2x faster on a real page than matching after "{" too.
_PROCESS_LABEL = re.compile(
    rb',(?:' + b"|".join(n.encode() for n in RAY_PROCESS_LABELS) + rb')="[^"\\]*(?:\\.[^"\\]*)*"')
_COMMENT = (b"# HELP " + _RAY_PREFIX, b"# TYPE " + _RAY_PREFIX)  # both keywords are 4 letters: 7 bytes before the name


def vllm_series(page: bytes) -> bytes:
    """The `ray_vllm_*` families of a Ray metrics page (Prometheus text format), named `vllm:*` as vLLM's own
    /metrics names them, without Ray's process labels; every other line left out. Pure."""
    out: list[bytes] = []
    for line in page.splitlines():
        if line.startswith(_RAY_PREFIX):
            name, brace, rest = line.partition(b"{")  # no "{" in a name: the first opens the labels
            if brace:
                labels = _PROCESS_LABEL.sub(b"", b"," + rest)  # `,a="x"} 1.0`, or `} 1.0` where none is left
                line = name + (b"{" + labels[1:] if labels.startswith(b",") else labels[1:])
            out.append(_VLLM_PREFIX + line[len(_RAY_PREFIX):])
        elif line.startswith(_COMMENT):
            out.append(line[:7] + _VLLM_PREFIX + line[7 + len(_RAY_PREFIX):])  # "# HELP " / "# TYPE " kept
    return b"".join(x + b"\n" for x in out)


__all__ = ["RAY_METRICS_PORT_ENV", "RAY_METRICS_REPORT_INTERVAL_MS", "RAY_PROCESS_LABELS", "vllm_series"]
