"""Student-pool fallback policy (table-driven)."""

from __future__ import annotations

import pytest

from llmfleet.router.config import FallbackConfig, SLOConfig
from llmfleet.router.fallback import (
    FallbackPolicy,
    FallbackSignals,
    pool_prefill_wait_ms,
    predicted_queue_delay_ms,
)
from llmfleet.router.prefill_price import pool_prefill_speedup

P_OK = FallbackSignals("primary", routable_replicas=2, waiting=0, running=4, mean_e2e_ms=500)
P_QUEUED = FallbackSignals("primary", routable_replicas=2, waiting=40, running=8, mean_e2e_ms=500)
P_DOWN = FallbackSignals("primary", routable_replicas=0)
S_OK = FallbackSignals("small", routable_replicas=1)
S_DOWN = FallbackSignals("small", routable_replicas=0)
CFG = FallbackConfig(max_queue_delay_ms=1000, long_context_tokens=2000, sheddable_classes=["batch"],
                     max_degraded_fraction=0.5)


@pytest.mark.parametrize(
    "primary, students, kw, expected",
    [
        (P_OK, [S_OK], {}, ("primary", False, "primary")),
        (P_DOWN, [S_OK], {}, ("small", True, "unavailable")),
        (P_DOWN, [S_DOWN], {}, ("primary", False, "primary")),  # nothing better: primary answers 503 itself
        (P_OK, [S_OK], {"request_class": "batch"}, ("small", True, "sheddable")),
        (P_OK, [S_OK], {"request_class": "interactive"}, ("primary", False, "primary")),
        (P_OK, [S_OK], {"input_tokens": 5000}, ("small", True, "long-context")),
        (P_OK, [S_DOWN], {"input_tokens": 5000}, ("primary", False, "primary")),
        (P_QUEUED, [S_OK], {}, ("small", True, "queue-delay")),
        (P_OK, [S_OK], {"requested_pool": "small"}, ("small", False, "requested")),
    ],
)
def test_decide_table(primary: FallbackSignals, students: list[FallbackSignals], kw: dict, expected: tuple) -> None:
    d = FallbackPolicy(CFG, SLOConfig()).decide(100.0, primary, students, **kw)
    assert (d.pool, d.degraded, d.reason) == expected


def test_disabled() -> None:
    d = FallbackPolicy(FallbackConfig(enabled=False), SLOConfig()).decide(0, P_DOWN, [S_OK])
    assert (d.pool, d.degraded) == ("primary", False)


def test_slo_burn_rate_needs_enough_samples_and_expires() -> None:
    pol = FallbackPolicy(FallbackConfig(slo_burn_rate=2.0, min_requests_for_burn=10, max_degraded_fraction=1.0),
                         SLOConfig(ttft_p95_ms=100, window_seconds=60))
    for i in range(9):
        pol.observe_primary(float(i), ttft_ms=500, tpot_ms=10, e2e_ms=600)
    assert pol.decide(9.0, P_OK, [S_OK]).reason == "primary"  # 9 < min samples
    pol.observe_primary(9.0, ttft_ms=50, tpot_ms=10, e2e_ms=60)
    assert pol.slo_tracker.burn_rate(9.0) == pytest.approx(0.9 / 0.05)
    assert pol.decide(9.5, P_OK, [S_OK]).reason == "slo-burn"
    assert pol.decide(200.0, P_OK, [S_OK]).reason == "primary"  # window expired


def test_tpot_and_e2e_violations_count() -> None:
    pol = FallbackPolicy(FallbackConfig(min_requests_for_burn=1), SLOConfig(tpot_p95_ms=10, e2e_p99_ms=100))
    pol.observe_primary(0, None, 20, 50)
    pol.observe_primary(0, None, 5, 500)
    pol.observe_primary(0, None, 5, 50)
    assert pol.slo_tracker.burn_rate(0) == pytest.approx(2 / 3 / 0.05)


def test_degraded_fraction_cap_per_tenant() -> None:
    pol = FallbackPolicy(FallbackConfig(long_context_tokens=10, max_degraded_fraction=0.25), SLOConfig(),
                         tenant_caps={"vip": 0.0})
    outcomes = []
    for i in range(8):
        d = pol.decide(float(i), P_OK, [S_OK], tenant="t", input_tokens=100)
        pol.record(float(i), "t", d, input_tokens=100)
        outcomes.append(d.degraded)
    # The first request of an empty window may go; after that the window never holds more than 25 %.
    assert outcomes == [True, False, False, False, False, False, False, True]
    assert pol.tenants.fraction("t", 7.0) == 0.25
    d = pol.decide(9.0, P_OK, [S_OK], tenant="vip", input_tokens=100)
    assert (d.pool, d.reason) == ("primary", "capped:long-context")
    d = pol.decide(9.0, P_OK, [S_OK], tenant="vip", request_class=None, input_tokens=1)
    assert d.reason == "primary"


def test_sheddable_not_capped() -> None:
    pol = FallbackPolicy(FallbackConfig(sheddable_classes=["bg"], max_degraded_fraction=0.0), SLOConfig())
    assert pol.decide(0, P_OK, [S_OK], request_class="bg").degraded


@pytest.mark.parametrize(
    "pool, ms",
    [
        (FallbackSignals("p", 2, waiting=0, running=4, mean_e2e_ms=100), 0.0),
        (FallbackSignals("p", 2, waiting=10, running=5, mean_e2e_ms=100), 200.0),
        (FallbackSignals("p", 2, waiting=10, running=0, mean_e2e_ms=100), 500.0),
        (FallbackSignals("p", 0), float("inf")),
        (FallbackSignals("p", 1, waiting=3), 0.0),
        # the prefill queue is the bottleneck: the batch has slots, the compute does not
        (FallbackSignals("p", 1, waiting=25, running=40, mean_e2e_ms=400, prefill_wait_ms=1800), 1800.0),
        (FallbackSignals("p", 1, waiting=0, running=4, mean_e2e_ms=400, prefill_wait_ms=700), 700.0),
        (FallbackSignals("p", 2, waiting=10, running=0, mean_e2e_ms=100, prefill_wait_ms=50), 500.0),
    ],
)
def test_predicted_queue_delay(pool: FallbackSignals, ms: float) -> None:
    assert predicted_queue_delay_ms(pool) == ms


P_COLD = FallbackSignals("primary", routable_replicas=0, scales_from_zero=True)


@pytest.mark.parametrize(
    "cfg, kw, expected",
    [
        # A primary scaling from zero is not down: the request waits for it (the router holds it) ...
        (FallbackConfig(), {}, ("primary", False, "cold-start")),
        # ... unless a rule of the policy sends it to a student: its class, its length, or the predicted
        # queueing delay, which is infinite at zero replicas (capped per tenant like every capped rule).
        (CFG, {"request_class": "batch"}, ("small", True, "sheddable")),
        (FallbackConfig(long_context_tokens=100), {"input_tokens": 500}, ("small", True, "long-context")),
        (FallbackConfig(max_queue_delay_ms=1000), {}, ("small", True, "queue-delay")),
    ],
)
def test_scale_from_zero_waits_unless_the_policy_degrades(cfg: FallbackConfig, kw: dict, expected: tuple) -> None:
    d = FallbackPolicy(cfg, SLOConfig()).decide(100.0, P_COLD, [S_OK], **kw)
    assert (d.pool, d.degraded, d.reason) == expected


def test_scale_from_zero_degrades_only_up_to_the_tenant_cap() -> None:
    policy = FallbackPolicy(FallbackConfig(max_queue_delay_ms=1000, max_degraded_fraction=0.25), SLOConfig())
    picks = []
    for i in range(8):
        d = policy.decide(float(i), P_COLD, [S_OK])
        policy.record(float(i), "default", d, input_tokens=0)
        picks.append(d.pool)
    assert picks.count("small") == 2 and picks.count("primary") == 6  # the rest wait for the cold start


def test_requests_without_a_first_token_count_as_queued() -> None:
    """With chunked prefill an engine admits a burst into its running batch: its waiting gauge stays 0 while the
    router still has the prompts open without a first byte; those are queued, not generating."""
    from llmfleet.router.plugins.base import AwaitingFirstByte, ReplicaState

    r = ReplicaState(id="http://r", pool="p", running=30.0, waiting=0.0)
    counted = [AwaitingFirstByte(r) for _ in range(25)]
    assert (r.queued, r.generating) == (25.0, 5.0)
    counted[0].release()
    counted[0].release()  # idempotent: a first byte and then the end of the same request
    assert r.awaiting_first_byte == 24
    AwaitingFirstByte(None).release()  # a non-streamed request is not counted
    assert r.awaiting_first_byte == 24
    r2 = ReplicaState(id="http://r2", pool="p", running=4.0, waiting=6.0)  # the engine's own queue is the larger
    assert (r2.queued, r2.generating) == (6.0, 4.0)
    busy = ReplicaState(id="http://r3", pool="p", prefill_tokens=8000.0, prefill_busy_until=12.5)
    assert busy.prefill_wait_s(10.0) == 2.5 and busy.prefill_wait_s(13.0) == 0.0
    assert ReplicaState(id="http://r4", pool="p", prefill_busy_until=12.5).prefill_wait_s(10.0) == 0.0


# A student pool with a queue of its own: 30 requests without a first token, 10 past it, 2 s end-to-end latency.
S_QUEUED = FallbackSignals("small", routable_replicas=1, waiting=30, running=10, mean_e2e_ms=2000)  # 6 s


@pytest.mark.parametrize(
    "primary, kw, expected",
    [
        # P_QUEUED: 40 waiting x 500 ms / 8 running = 2.5 s; the student's own queue would take 6 s
        (P_QUEUED, {}, ("primary", False, "student-busier:queue-delay")),
        # ... its prefill queue is what the student is busy with (priced at its own replicas' rate)
        (P_QUEUED, {"student": FallbackSignals("small", 1, prefill_wait_ms=2600)},
         ("primary", False, "student-busier:queue-delay")),
        (P_QUEUED, {"student": FallbackSignals("small", 1, prefill_wait_ms=2400)}, ("small", True, "queue-delay")),
        # load does not matter for rules about the request itself
        (P_OK, {"input_tokens": 5000}, ("small", True, "long-context")),
        (P_OK, {"request_class": "batch"}, ("small", True, "sheddable")),
    ],
)
def test_load_rules_degrade_only_to_a_student_predicted_sooner(primary: FallbackSignals, kw: dict,
                                                               expected: tuple) -> None:
    student = kw.pop("student", S_QUEUED)
    d = FallbackPolicy(CFG, SLOConfig()).decide(100.0, primary, [student], **kw)
    assert (d.pool, d.degraded, d.reason) == expected



def test_a_students_prefill_queue_reads_at_its_own_speed() -> None:
    """A Llama-3.2-1B student on an H200 is priced like its 8B primary (the capped default) but prefills ~6x as
    fast: its least-loaded replica's queue, 6 s at that price, is about 1 s of its own time, sooner than the
    primary's 2.5 s, so the load rule degrades instead of keeping the request on the busier primary."""
    speedup = pool_prefill_speedup("llama-3.2-1b", "H200")
    waits = [9.0, 6.0]  # its replicas' prefill_wait_s
    assert pool_prefill_wait_ms(waits) == 6000.0 and pool_prefill_wait_ms([], speedup) == 0.0
    assert pool_prefill_wait_ms(waits, speedup) == pytest.approx(6000.0 / speedup)
    pol = FallbackPolicy(CFG, SLOConfig())
    priced_alike = FallbackSignals("small", 2, prefill_wait_ms=pool_prefill_wait_ms(waits))
    own_speed = FallbackSignals("small", 2, prefill_wait_ms=pool_prefill_wait_ms(waits, speedup))
    assert pol.decide(100.0, P_QUEUED, [priced_alike]).reason == "student-busier:queue-delay"
    assert pol.decide(100.0, P_QUEUED, [own_speed]).reason == "queue-delay"

def test_slo_burn_compares_the_pools_too() -> None:
    pol = FallbackPolicy(FallbackConfig(slo_burn_rate=2.0, min_requests_for_burn=1, max_degraded_fraction=1.0),
                         SLOConfig(ttft_p95_ms=100))
    pol.observe_primary(0.0, ttft_ms=500, tpot_ms=10, e2e_ms=600)
    assert pol.decide(1.0, P_QUEUED, [S_QUEUED]).reason == "student-busier:slo-burn"
    assert pol.decide(1.0, P_QUEUED, [S_OK]).reason == "slo-burn"


def test_the_student_pool_predicted_soonest_is_picked() -> None:
    busy = FallbackSignals("a", 1, prefill_wait_ms=900)
    idle = FallbackSignals("b", 1, prefill_wait_ms=100)
    down = FallbackSignals("c", 0)
    pol = FallbackPolicy(CFG, SLOConfig())
    assert pol.decide(0.0, P_QUEUED, [down, busy, idle]).pool == "b"
    assert pol.decide(0.0, P_DOWN, [busy, idle]).pool == "b"  # also when the primary is down
    assert pol.decide(0.0, P_QUEUED, [FallbackSignals("a", 1), FallbackSignals("b", 1)]).pool == "a"  # tie: order


def test_a_student_pools_own_latency_prices_its_queue() -> None:
    """The student's Little's-law delay uses its own recent end-to-end latency (fed by `observe_student`), not the
    primary's: without any it counts only its prefill queue."""
    student = FallbackSignals("small", 1, waiting=20, running=10)
    pol = FallbackPolicy(CFG, SLOConfig(window_seconds=60))
    assert pol.decide(0.0, P_QUEUED, [student]).degraded  # no student latency seen yet: 0 ms
    for i in range(3):
        pol.observe_student("small", float(i), None, None, e2e_ms=1500.0)  # 20 x 1.5 s / 10 = 3 s > 2.5 s
    assert pol.decide(3.0, P_QUEUED, [student]).reason == "student-busier:queue-delay"
    assert pol.slo_tracker.count(3.0) == 0  # the student's latencies are not the primary's burn
    assert not pol.decide(100.0, P_QUEUED, [student]).reason.startswith("student-busier")  # window expired



def _burst(pol: FallbackPolicy, prompts: list[int], primary: FallbackSignals = P_QUEUED) -> list[tuple[int, str]]:
    """One request per prompt length, 0.1 s apart, each through `dispatch.pick_pool` as the router and the simulator
    send it (which records its prompt length in the tenant's window)."""
    from llmfleet.router.dispatch import pick_pool

    return [(n, pick_pool(pol, i / 10, primary, [S_OK], tenant="default", input_tokens=n, request_class=None).reason)
            for i, n in enumerate(prompts)]


def test_a_binding_cap_degrades_the_longest_prompts() -> None:
    """The queue-delay rule wants every request of a burst degraded and the cap allows half: once the window holds
    enough requests to rank them, the longest half go to the student and the shorter stay on the primary, so the
    primary keeps the least prefill work for the share it must take."""
    pol = FallbackPolicy(FallbackConfig(max_queue_delay_ms=1000, max_degraded_fraction=0.5, min_requests_for_burn=10),
                         SLOConfig())
    prompts = [100 * (1 + (7 * i) % 20) for i in range(60)]  # 100..2,000 tokens, shuffled
    out = _burst(pol, prompts)
    # the first 10: too few requests to rank, the cap alone decides in arrival order
    assert {why.split(":")[0] for _, why in out[:10]} == {"queue-delay", "capped"}
    last = out[40:]  # the window (60 s) still holds the arrival-order start: judged once it is outweighed
    degraded = [n for n, why in last if why == "queue-delay"]
    kept_shorter = [n for n, why in last if why == "shorter:queue-delay"]
    on_primary = [n for n, why in last if why != "queue-delay"]
    assert kept_shorter and min(degraded) > max(kept_shorter)
    assert sum(degraded) / len(degraded) > 2 * sum(on_primary) / len(on_primary)  # arrival order: about equal
    assert pol.tenants.fraction("default", 5.9) <= 0.5


def test_the_longest_first_order_applies_only_while_the_cap_binds() -> None:
    pol = FallbackPolicy(FallbackConfig(max_queue_delay_ms=1000, max_degraded_fraction=0.5, min_requests_for_burn=10),
                         SLOConfig())
    _burst(pol, [1000] * 30, primary=P_OK)  # the primary keeps up: no load rule fires for 30 requests
    # a short prompt after them is degraded: the rule wants 1 of 31 degraded, far under the cap
    assert _burst(pol, [10], primary=P_QUEUED)[0][1] == "queue-delay"
    # equal prompts rank together at the top: a burst of them is degraded up to the cap in arrival order
    pol = FallbackPolicy(FallbackConfig(max_queue_delay_ms=1000, max_degraded_fraction=0.5, min_requests_for_burn=10),
                         SLOConfig())
    assert {why for _, why in _burst(pol, [500] * 40)} == {"queue-delay", "capped:queue-delay"}
    # a cap of 1 never binds: every request the rule wants goes
    pol = FallbackPolicy(FallbackConfig(max_queue_delay_ms=1000, max_degraded_fraction=1.0, min_requests_for_burn=10),
                         SLOConfig())
    assert {why for _, why in _burst(pol, list(range(100, 4100, 100)))} == {"queue-delay"}


def test_the_tenant_window_keeps_its_counts_and_order_as_requests_come_and_go() -> None:
    """The window's running counts and sorted prompt lengths equal a count over the requests still in it, as
    requests arrive and age out (its questions are bisections, not passes over the window)."""
    import random

    from llmfleet.router.fallback import TenantWindow

    rng = random.Random(7)
    win, kept = TenantWindow(window_seconds=10.0), []
    t = 0.0
    for _ in range(2000):
        t += rng.expovariate(20.0)
        n, degraded, loaded = rng.choice([0, 100, 100, 2000, 50_000]), rng.random() < 0.4, rng.random() < 0.6
        win.record("a", t, degraded, n, loaded)
        kept = [e for e in [*kept, (t, degraded, n, loaded)] if e[0] >= t - 10.0]
        if rng.random() < 0.1:
            probe = rng.choice([0, 99, 100, 2000, 10**6])
            assert win.fraction("a", t) == pytest.approx(sum(e[1] for e in kept) / len(kept))
            assert win.fraction_if_degraded("a", t) == pytest.approx((sum(e[1] for e in kept) + 1) / (len(kept) + 1))
            size, wanted, no_longer = win.load_rank("a", t, probe)
            assert size == len(kept)
            assert wanted == pytest.approx((sum(e[3] for e in kept) + 1) / (len(kept) + 1))
            assert no_longer == pytest.approx(sum(e[2] <= probe for e in kept) / len(kept))
    assert win.load_rank("a", t + 100.0, 10) == (0, 1.0, 1.0)  # everything aged out
    assert win.fraction("b", t) == 0.0 and win.fraction_if_degraded("b", t) == 0.0  # a tenant never seen
