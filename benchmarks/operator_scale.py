"""Operator scale: N InferenceServices and N TrainingJobs created at once against the Kubernetes emulator.

The emulator (tests/kubeemu.py) runs in its own process; the operator (kopf + llmfleet handlers, the same
code as `llmfleet operator`) runs in this process in its own thread and event loop, while the main thread
creates the CRs and polls the emulator's object counts.

Reported: time from the first create until every child exists, reconcile errors, operator RSS (this process:
operator plus the small driver), operator CPU, the API requests the emulator served to the operator (all its
clients, kopf's included; the driver's own are subtracted), and the time inside one reconcile excluding API
round trips (p50/p99).
Targets: all children within 60 s, no errors, RSS < 300 MB, p99 < 50 ms.

    python benchmarks/operator_scale.py [--count 500] [--namespaces 10] [--timeout 300] [--profile-operator FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import datetime
import json
import os
import pathlib
import platform
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import aiohttp

ROOT = pathlib.Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "operator_scale.json"


def isvc(name: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"path": "/models/llama", "servedName": name},
            "replicas": 2, "minReplicas": 1, "maxReplicas": 4,
            "resources": {"gpus": 1, "gpuType": "H200"},
            "fallback": {"pools": [{"name": "student", "model": {"path": "/models/small"}, "replicas": 1,
                                    "resources": {"gpus": 1}}]},
        },
    }


def tj(name: str, ns: str) -> dict[str, Any]:
    return {
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob",
        "metadata": {"name": name, "namespace": ns},
        "spec": {
            "model": {"layers": 2, "hidden": 64, "heads": 4, "seqLen": 256},
            "data": {"path": "/data"},
            "optimization": {"globalBatchTokens": 4096},
            "workers": {"count": 2, "gpusPerWorker": 8},
        },
    }


# Children per CR for the specs above (primary + one student pool; TrainingJob without optional APIs).
EXPECTED_PER_ISVC = {
    "apps/v1/deployments": 3, "v1/services": 3, "policy/v1/poddisruptionbudgets": 2, "v1/configmaps": 1,
    "v1/serviceaccounts": 1, "rbac.authorization.k8s.io/v1/roles": 1, "rbac.authorization.k8s.io/v1/rolebindings": 1,
}
EXPECTED_PER_TJ = {"v1/configmaps": 1, "v1/services": 1, "batch/v1/jobs": 1}


def rss_mb() -> tuple[float, float]:
    """(current, peak) resident set size of this process in MiB."""
    fields = {}
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        fields[key] = value.strip()
    return int(fields["VmRSS"].split()[0]) / 1024, int(fields["VmHWM"].split()[0]) / 1024


def emulator_cpu_seconds(pid: int) -> float:
    """User + system CPU seconds of the emulator process so far."""
    fields = pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))]


def start_emulator(profile: str | None = None) -> tuple[subprocess.Popen[str], str]:
    prefix = [sys.executable] + (["-m", "cProfile", "-o", profile] if profile else [])
    proc = subprocess.Popen(
        [*prefix, str(ROOT / "tests" / "kubeemu.py"), "--crds", str(ROOT / "crds"), "--history-limit", "2"],
        stdout=subprocess.PIPE, text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise SystemExit("operator_scale: the emulator did not start")
    return proc, json.loads(line)["url"]


def start_operator(url: str, profile: str | None = None) -> tuple[threading.Thread, threading.Event, Any]:
    import kopf

    from llmfleet.operator.config import OperatorConfig
    from llmfleet.operator.handlers import Runtime
    from llmfleet.operator.run import RunOptions, run_async

    kopf.configure(verbose=False, log_format=kopf.LogFormat.JSON)
    import logging

    logging.getLogger().setLevel(logging.WARNING)
    runtime = Runtime(config=OperatorConfig.from_env(), connection=kopf.ConnectionInfo(server=url))
    opts = RunOptions(standalone=True, metrics_port=None, liveness_port=None, autoscaler=False, runtime=runtime)
    stop, ready = threading.Event(), threading.Event()

    def serve() -> None:
        if profile is None:
            asyncio.run(run_async(opts, stop_flag=stop, ready_flag=ready))
            return
        profiler = cProfile.Profile()  # the operator's thread only (the driver runs in the main thread)
        try:
            profiler.runcall(asyncio.run, run_async(opts, stop_flag=stop, ready_flag=ready))
        finally:
            profiler.dump_stats(profile)

    thread = threading.Thread(target=serve, name="operator", daemon=True)
    thread.start()
    if not ready.wait(60):
        raise SystemExit("operator_scale: the operator did not start")
    return thread, stop, runtime


async def drive(url: str, count: int, namespaces: int, timeout: float) -> dict[str, Any]:
    expected: dict[str, int] = {}
    for key, n in EXPECTED_PER_ISVC.items():
        expected[key] = expected.get(key, 0) + n * count
    for key, n in EXPECTED_PER_TJ.items():
        expected[key] = expected.get(key, 0) + n * count
    sem = asyncio.Semaphore(64)
    own_requests = 0  # the driver's requests the emulator counts (not /_kubeemu/ ones)
    async with aiohttp.ClientSession() as session:

        async def create(plural: str, body: dict[str, Any]) -> None:
            ns = body["metadata"]["namespace"]
            async with sem, session.post(f"{url}/apis/llmfleet.io/v1alpha1/namespaces/{ns}/{plural}", json=body) as r:
                if r.status != 201:
                    raise SystemExit(f"operator_scale: create failed: HTTP {r.status} {await r.text()}")

        started = time.perf_counter()
        creates = []
        for i in range(count):
            ns = f"team-{i % namespaces}"
            creates.append(create("inferenceservices", isvc(f"svc-{i}", ns)))
            creates.append(create("trainingjobs", tj(f"job-{i}", ns)))
        await asyncio.gather(*creates)
        own_requests += len(creates)
        created_s = time.perf_counter() - started
        counts: dict[str, int] = {}
        while True:
            async with session.get(f"{url}/_kubeemu/counts") as r:
                counts = await r.json()
            if all(counts.get(k, 0) >= v for k, v in expected.items()):
                break
            if time.perf_counter() - started > timeout:
                break
            await asyncio.sleep(0.25)
        all_applied_s = time.perf_counter() - started
        # Wait for the status of every CR too (the reconcile finished, not just its applies).
        statuses_s = None
        while time.perf_counter() - started < timeout:
            pending = 0
            for plural in ("inferenceservices", "trainingjobs"):
                own_requests += 1
                async with session.get(f"{url}/apis/llmfleet.io/v1alpha1/{plural}") as r:
                    items = (await r.json())["items"]
                pending += sum(1 for o in items if (o.get("status") or {}).get("observedGeneration") is None)
            if pending == 0:
                statuses_s = time.perf_counter() - started
                break
            await asyncio.sleep(0.5)
        async with session.get(f"{url}/_kubeemu/requests") as r:
            served = await r.json()
    complete = all(counts.get(k, 0) >= v for k, v in expected.items())
    return {
        "created_s": created_s,
        "all_children_s": all_applied_s if complete else None,
        "all_status_s": statuses_s,
        "children_expected": sum(expected.values()),
        "children_found": sum(counts.get(k, 0) for k in expected),
        "complete": complete,
        "api_requests": sum(served.values()) - own_requests,
        "api_requests_by_method": {k: served[k] for k in sorted(served)},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--count", type=int, default=500, help="InferenceServices and TrainingJobs (each)")
    parser.add_argument("--namespaces", type=int, default=10, help="namespaces to spread them over")
    parser.add_argument("--timeout", type=float, default=300.0, help="give up after this many seconds")
    parser.add_argument("--profile-emulator", metavar="FILE", help="run the emulator under cProfile, stats to FILE")
    parser.add_argument("--profile-operator", metavar="FILE", help="run the operator under cProfile, stats to FILE")
    args = parser.parse_args()

    load_start = os.getloadavg()[0]
    emu, url = start_emulator(args.profile_emulator)
    try:
        thread, stop, runtime = start_operator(url, args.profile_operator)
        from llmfleet.operator import metrics

        rss_before, _ = rss_mb()
        result = asyncio.run(drive(url, args.count, args.namespaces, args.timeout))
        rss_now, rss_peak = rss_mb()
        samples = list(metrics.SAMPLES)
        compute = [s[1] for s in samples]
        local = [s[2] for s in samples]
        total = [s[3] for s in samples]
        cpu_operator = time.process_time()
        client = runtime.client
        client_requests = client.requests if client is not None else 0
        applies_skipped = client.applied_cache().hits if client is not None else 0
        cpu_emulator = emulator_cpu_seconds(emu.pid)
        counted = [m for fam in metrics.RECONCILES.collect() for m in fam.samples if m.name.endswith("_total")]
        errors = sum(m.value for m in counted if m.labels.get("result") == "error")
        by_trigger: dict[str, int] = {}
        for m in counted:
            by_trigger[m.labels["trigger"]] = by_trigger.get(m.labels["trigger"], 0) + int(m.value)
        stop.set()
        thread.join(30)
    finally:
        emu.send_signal(signal.SIGINT)  # the emulator exits cleanly on SIGINT (cProfile writes its stats)
        try:
            emu.wait(30)
        except subprocess.TimeoutExpired:
            emu.kill()

    row = {
        **result,
        "count_each": args.count,
        "reconciles": len(samples),
        "reconciles_by_trigger": dict(sorted(by_trigger.items())),
        "reconcile_errors": int(errors),
        "reconcile_compute_p50_ms": percentile(compute, 0.50) * 1000,
        "reconcile_compute_p99_ms": percentile(compute, 0.99) * 1000,
        "reconcile_no_api_p50_ms": percentile(local, 0.50) * 1000,
        "reconcile_no_api_p99_ms": percentile(local, 0.99) * 1000,
        "reconcile_total_p50_ms": percentile(total, 0.50) * 1000,
        "reconcile_total_p99_ms": percentile(total, 0.99) * 1000,
        "rss_start_mb": rss_before,
        "rss_end_mb": rss_now,
        "rss_peak_mb": rss_peak,
        "operator_cpu_s": cpu_operator,
        "emulator_cpu_s": cpu_emulator,
        "kube_client_requests": client_requests,
        "applies_skipped_unchanged": applies_skipped,
    }
    targets = {
        "all_children_s <= 60": result["all_children_s"] is not None and result["all_children_s"] <= 60,
        "reconcile_errors == 0": row["reconcile_errors"] == 0,
        "rss_peak_mb < 300": rss_peak < 300,
        "reconcile_compute_p99_ms < 50": row["reconcile_compute_p99_ms"] < 50,
    }
    print(f"load average (1 min): {load_start:.1f} at start, {os.getloadavg()[0]:.1f} at end, {os.cpu_count()} CPUs")
    print(f"{'metric':<28} {'value':>12}")
    for key in ("count_each", "children_expected", "children_found", "created_s", "all_children_s", "all_status_s",
                "reconciles", "reconcile_errors", "reconcile_compute_p50_ms", "reconcile_compute_p99_ms",
                "reconcile_no_api_p50_ms", "reconcile_no_api_p99_ms", "reconcile_total_p50_ms",
                "reconcile_total_p99_ms", "rss_start_mb", "rss_peak_mb", "operator_cpu_s", "emulator_cpu_s",
                "api_requests", "kube_client_requests", "applies_skipped_unchanged"):
        value = row[key]
        print(f"{key:<28} {value:>12.2f}" if isinstance(value, float) else f"{key:<28} {value!s:>12}")
    for name, ok in targets.items():
        print(f"target {name:<40} {'met' if ok else 'NOT met'}")
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    RESULTS.write_text(json.dumps({
        "benchmark": "operator_scale",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": "python benchmarks/operator_scale.py " + " ".join(sys.argv[1:]),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                    "load_average_1m": {"start": load_start, "end": os.getloadavg()[0]},
                    "note": "shared dev machine (other jobs running); the emulator runs in a separate "
                            "process, the operator and the driver in this one"},
        "results": row,
        "targets": targets,
    }, indent=2) + "\n")
    print(f"wrote {RESULTS.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
