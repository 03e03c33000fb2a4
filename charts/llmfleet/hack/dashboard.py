#!/usr/bin/env python3
"""Build charts/llmfleet/dashboards/llmfleet.json, the Grafana dashboard the chart ships (dashboard.enabled).

The panels are declared here as (title, unit, [(PromQL, legend)]) so the PromQL stays readable; the test
tests/unit/test_chart_dashboard.py checks every metric name against what the code exports.
Run `python charts/llmfleet/hack/dashboard.py` after editing (`--check` fails when the JSON is stale).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parents[1] / "dashboards" / "llmfleet.json"
NS = 'namespace=~"$namespace"'
RATE = "$__rate_interval"


def q(quantile: float, metric: str, by: str = "pool") -> str:
    return f"histogram_quantile({quantile}, sum by (le, {by}) (rate({metric}{{{NS}}}[{RATE}])))"


Panel = tuple[str, str, list[tuple[str, str]]]

ROWS: list[tuple[str, list[Panel]]] = [
    (
        "Serving: pools behind the router",
        [
            (
                "Healthy replicas per pool",
                "short",
                [
                    (f"sum by (pool) (llmfleet_router_replica_up{{{NS}}})", "{{pool}}"),
                    (f"sum by (pool) (llmfleet_router_replica_draining{{{NS}}})", "{{pool}} draining"),
                ],
            ),
            (
                "Requests per second per pool",
                "reqps",
                [
                    (f"sum by (pool) (rate(llmfleet_router_requests_total{{{NS}}}[{RATE}]))", "{{pool}}"),
                    (
                        f'sum by (status) (rate(llmfleet_router_requests_total{{{NS},status!~"2.."}}[{RATE}]))',
                        "non-2xx {{status}}",
                    ),
                ],
            ),
            (
                "TTFT quantiles vs SLO",
                "s",
                [
                    (q(0.5, "llmfleet_router_ttft_seconds_bucket"), "p50 {{pool}}"),
                    (q(0.95, "llmfleet_router_ttft_seconds_bucket"), "p95 {{pool}}"),
                    (q(0.99, "llmfleet_router_ttft_seconds_bucket"), "p99 {{pool}}"),
                    ("vector($ttft_slo_ms / 1000)", "SLO p95"),
                ],
            ),
            (
                "TPOT quantiles vs SLO",
                "s",
                [
                    (q(0.5, "llmfleet_router_tpot_seconds_bucket"), "p50 {{pool}}"),
                    (q(0.95, "llmfleet_router_tpot_seconds_bucket"), "p95 {{pool}}"),
                    (q(0.99, "llmfleet_router_tpot_seconds_bucket"), "p99 {{pool}}"),
                    ("vector($tpot_slo_ms / 1000)", "SLO p95"),
                ],
            ),
            (
                "End-to-end latency",
                "s",
                [
                    (q(0.5, "llmfleet_router_e2e_seconds_bucket"), "p50 {{pool}}"),
                    (q(0.99, "llmfleet_router_e2e_seconds_bucket"), "p99 {{pool}}"),
                ],
            ),
            (
                "Degraded fraction (served by student pools)",
                "percentunit",
                [
                    (
                        f"sum(rate(llmfleet_router_degraded_requests_total{{{NS}}}[{RATE}])) / "
                        f"clamp_min(sum(rate(llmfleet_router_requests_total{{{NS}}}[{RATE}])), 1e-9)",
                        "degraded",
                    ),
                    (
                        f"sum by (pool, reason) (rate(llmfleet_router_fallbacks_total{{{NS}}}[{RATE}]))",
                        "fallback {{pool}} {{reason}}",
                    ),
                ],
            ),
            (
                "Router retries and rejections",
                "reqps",
                [
                    (
                        f"sum by (pool) (rate(llmfleet_router_retries_total{{{NS}}}[{RATE}]))",
                        "retries {{pool}}",
                    ),
                    (
                        f"sum by (reason) (rate(llmfleet_router_rejected_total{{{NS}}}[{RATE}]))",
                        "rejected {{reason}}",
                    ),
                ],
            ),
        ],
    ),
    (
        "Engines: vLLM caches and queues (per served model)",
        [
            (
                "Prefix-cache hit rate",
                "percentunit",
                [
                    (
                        f"sum by (model_name) (rate(vllm:prefix_cache_hits_total{{{NS}}}[{RATE}])) / "
                        f"clamp_min(sum by (model_name) (rate(vllm:prefix_cache_queries_total{{{NS}}}[{RATE}])), 1)",
                        "engine {{model_name}}",
                    ),
                    (
                        f'sum by (pool) (rate(llmfleet_router_prefix_blocks_total{{{NS},matched="true"}}[{RATE}])) / '
                        f"clamp_min(sum by (pool) (rate(llmfleet_router_prefix_blocks_total{{{NS}}}[{RATE}])), 1)",
                        "router-predicted {{pool}}",
                    ),
                ],
            ),
            (
                "KV-cache utilization",
                "percentunit",
                [
                    (f"avg by (model_name) (vllm:kv_cache_usage_perc{{{NS}}})", "mean {{model_name}}"),
                    (f"max by (model_name) (vllm:kv_cache_usage_perc{{{NS}}})", "max {{model_name}}"),
                ],
            ),
            (
                "Running and waiting requests",
                "short",
                [
                    (f"sum by (model_name) (vllm:num_requests_running{{{NS}}})", "running {{model_name}}"),
                    (f"sum by (model_name) (vllm:num_requests_waiting{{{NS}}})", "waiting {{model_name}}"),
                ],
            ),
            (
                "Engine TTFT p95",
                "s",
                [
                    (q(0.95, "vllm:time_to_first_token_seconds_bucket", by="model_name"), "{{model_name}}"),
                ],
            ),
        ],
    ),
    (
        "Training: TrainingJobs (rank 0)",
        [
            ("Loss", "none", [(f'llmfleet_train_loss{{{NS},rank="0"}}', "{{namespace}}/{{pod}}")]),
            (
                "Tokens per second",
                "short",
                [
                    (f'llmfleet_train_tokens_per_second{{{NS},rank="0"}}', "{{namespace}}/{{pod}}"),
                ],
            ),
            (
                "MFU and HFU",
                "percentunit",
                [
                    (f'llmfleet_train_mfu{{{NS},rank="0"}}', "MFU {{namespace}}/{{pod}}"),
                    (f'llmfleet_train_hfu{{{NS},rank="0"}}', "HFU {{namespace}}/{{pod}}"),
                ],
            ),
            (
                "Step time per rank and stragglers",
                "s",
                [
                    (f"llmfleet_train_step_seconds{{{NS}}}", "rank {{rank}} {{pod}}"),
                    (f'llmfleet_train_stragglers{{{NS},rank="0"}}', "stragglers {{namespace}}"),
                ],
            ),
        ],
    ),
]


def build() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    pid = 0
    y = 0
    for row_title, row_panels in ROWS:
        pid += 1
        panels.append(
            {
                "id": pid,
                "type": "row",
                "title": row_title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        for i, (title, unit, targets) in enumerate(row_panels):
            pid += 1
            panels.append(
                {
                    "id": pid,
                    "type": "timeseries",
                    "title": title,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2), "y": y + 8 * (i // 2)},
                    "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                    "options": {"legend": {"displayMode": "list", "placement": "bottom"}},
                    "targets": [
                        {
                            "refId": chr(ord("A") + j),
                            "expr": expr,
                            "legendFormat": legend,
                            "datasource": {"type": "prometheus", "uid": "${datasource}"},
                        }
                        for j, (expr, legend) in enumerate(targets)
                    ],
                }
            )
        y += 8 * ((len(row_panels) + 1) // 2)
    return {
        "title": "llmfleet",
        "uid": "llmfleet-overview",
        "description": "llmfleet pools, SLOs, caches, fallback and training (generated by charts/llmfleet/hack/dashboard.py).",
        "tags": ["llmfleet", "llm", "vllm"],
        "schemaVersion": 39,
        "version": 1,
        "editable": True,
        "time": {"from": "now-1h", "to": "now"},
        "refresh": "30s",
        "templating": {
            "list": [
                {"name": "datasource", "label": "Prometheus", "type": "datasource", "query": "prometheus"},
                {
                    "name": "namespace",
                    "label": "Namespace",
                    "type": "query",
                    "multi": True,
                    "includeAll": True,
                    "datasource": {"type": "prometheus", "uid": "${datasource}"},
                    "query": "label_values(llmfleet_router_requests_total, namespace)",
                    "refresh": 2,
                    "current": {"text": "All", "value": "$__all"},
                    "allValue": ".*",
                },
                {
                    "name": "ttft_slo_ms",
                    "label": "TTFT SLO (ms)",
                    "type": "textbox",
                    "query": "1000",
                    "current": {"text": "1000", "value": "1000"},
                },
                {
                    "name": "tpot_slo_ms",
                    "label": "TPOT SLO (ms)",
                    "type": "textbox",
                    "query": "100",
                    "current": {"text": "100", "value": "100"},
                },
            ]
        },
        "panels": panels,
    }


def render() -> str:
    return json.dumps(build(), indent=2) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="exit 1 when the JSON is stale")
    args = parser.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.exists() or OUT.read_text() != text:
            print(f"{OUT} is stale: run python charts/llmfleet/hack/dashboard.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
