"""The discrete-event loop: arrivals -> router -> replicas, autoscaler ticks, cold starts, metrics.

    from llmfleet.sim.engine import simulate, SimConfig, PoolSpec
    from llmfleet.sim.traces import load_mooncake
    res = simulate(load_mooncake(path), SimConfig(pools=[PoolSpec(replicas=8)]), router="least-request")
    res.summary["ttft"]["p99"], res.records, res.series

Events are (time, seq, kind, a, b) tuples on one heap; arrivals are read from the sorted request list
without entering the heap, except closed-loop requests (`Request.after`: a conversation's next turn), which
a _SEND event dispatches their think time after the request they follow finished or was rejected. Replicas plan a step when the previous one ends; `SimReplica.version` invalidates
step events that a truncated decode run made obsolete.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

from llmfleet.autoscaler.actuation import ObservedReplica as ScaleInReplica
from llmfleet.autoscaler.capacity import prompt_length_moments
from llmfleet.autoscaler.scalein import choose_victims
from llmfleet.router.burst import WINDOW_S as WAKE_MIN_WINDOW_S
from llmfleet.router.burst import follow_up_after
from llmfleet.sim.replica import SimReplica
from llmfleet.sim.report import replica_gpu_seconds, summarize
from llmfleet.sim.routers import make_router
from llmfleet.sim.types import (
    Autoscaler,
    Fleet,
    PoolSpec,
    RequestRecord,
    SimConfig,
    SimPoolSignals,
    SimResult,
    SimRouter,
)
from llmfleet.sim.workload import Request, Workload, gc_paused

__all__ = ["Autoscaler", "Fleet", "PoolSpec", "SimRouter", "SimConfig", "SimPoolSignals", "SimResult", "simulate"]

_STEP, _READY, _TICK, _SAMPLE, _SEND = 0, 1, 2, 3, 4


def _check_unchunked_budget(cfg: SimConfig, reqs: list[Request]) -> None:
    """Without chunked prefill a sequence must fit one step's token budget, or it would wait forever: vLLM
    refuses to start unless max_num_batched_tokens >= max_model_len. Same rule, against the workload."""
    longest = max((r.prompt_len + r.output_len for r in reqs), default=0)
    for p in cfg.pools:
        if not p.chunked_prefill and p.max_batched_tokens < longest:
            raise ValueError(f"pool {p.name}: chunked prefill is off, so max_batched_tokens ({p.max_batched_tokens}) "
                             f"must hold the longest sequence of the workload ({longest} tokens, prompt + output), "
                             "as vLLM requires max_num_batched_tokens >= max_model_len")


def check_inputs(workload: Workload, cfg: SimConfig) -> None:
    """Refuse what no engine or cluster would run, with one clear line (ValueError): pools without replicas to start
    from, bounds that contradict each other, requests with negative or non-finite arrival times or lengths < 1."""
    if not cfg.pools:
        raise ValueError("no pools to simulate")
    names = [p.name for p in cfg.pools]
    if len(set(names)) != len(names):
        raise ValueError(f"pool names must be unique: {', '.join(names)}")
    if cfg.context_overflow not in ("reject", "clip"):
        raise ValueError(f"context_overflow must be 'reject' or 'clip', got {cfg.context_overflow!r}")
    if not 0 <= cfg.autoscale_phase_s < cfg.autoscale_interval_s:
        raise ValueError(f"autoscale_phase_s must be >= 0 and below the interval ({cfg.autoscale_interval_s:g} s), "
                         f"got {cfg.autoscale_phase_s}")
    for p in cfg.pools:
        floor = 1 if p.role == "primary" else 0  # a student pool may start (and stay) at zero
        if p.replicas < floor:
            raise ValueError(f"pool {p.name}: replicas must be >= {floor}, got {p.replicas}")
        if not 0 <= p.min_replicas <= p.max_replicas or p.max_replicas < 1:
            raise ValueError(f"pool {p.name}: need 0 <= min_replicas <= max_replicas and max_replicas >= 1, got "
                             f"{p.min_replicas}..{p.max_replicas}")
        if p.cold_start_s < 0 or not math.isfinite(p.cold_start_s):
            raise ValueError(f"pool {p.name}: cold_start_s must be a finite number >= 0, got {p.cold_start_s}")
        if p.max_model_len is not None and p.max_model_len < 2:
            raise ValueError(f"pool {p.name}: max_model_len must be >= 2, got {p.max_model_len}")
    rids = {r.rid for r in workload.requests}
    for r in workload.requests:
        if r.after >= 0 and (r.after >= r.rid or r.after not in rids):
            raise ValueError(f"request {r.rid}: it follows request {r.after}, which must be an earlier request "
                             "(a smaller rid) of the workload")
        if r.after >= 0 and (not math.isfinite(r.think) or r.think < 0):
            raise ValueError(f"request {r.rid}: think time must be a finite number >= 0, got {r.think}")
        if not math.isfinite(r.arrival) or r.arrival < 0:
            raise ValueError(f"request {r.rid}: arrival time must be a finite number >= 0, got {r.arrival}")
        if r.prompt_len < 1 or r.output_len < 1:
            raise ValueError(f"request {r.rid}: prompt and output lengths must be >= 1 token, got "
                             f"{r.prompt_len} and {r.output_len}")


def clip_to_context(reqs: list[Request], context: int, block_size: int) -> int:
    """Cut requests longer than `context` (prompt + output): the output to context - 1, the prompt (its head kept,
    with its full-block keys) to what remains. Returns how many were cut."""
    cut = 0
    for r in reqs:
        if r.prompt_len + r.output_len <= context:
            continue
        cut += 1
        r.output_len = min(r.output_len, context - 1)
        r.prompt_len = min(r.prompt_len, context - r.output_len)
        r.keys = r.keys[: r.prompt_len // block_size]
        r.reset()
    return cut


def simulate(workload: Workload, cfg: SimConfig, router: SimRouter | str = "least-request",
             autoscaler: Autoscaler | None = None) -> SimResult:
    with gc_paused():  # see gc_paused: measured 5% of the CPU at 100k requests, growing with the heap
        return _simulate(workload, cfg, router, autoscaler)


def _simulate(workload: Workload, cfg: SimConfig, router: SimRouter | str,
              autoscaler: Autoscaler | None) -> SimResult:
    rt = make_router(router, cfg.seed) if isinstance(router, str) else router
    changed = rt.replica_changed if rt.watches_replicas else None
    bs = workload.block_size
    check_inputs(workload, cfg)
    reqs = workload.fresh().requests
    primary_spec = next((p for p in cfg.pools if p.role == "primary"), cfg.pools[0])
    clipped = clip_to_context(reqs, primary_spec.context_len(), bs) if cfg.context_overflow == "clip" else 0
    context = {p.name: p.context_len() for p in cfg.pools}
    _check_unchunked_budget(cfg, reqs)
    if cfg.scale_in not in ("cache-aware", "least-loaded"):
        raise ValueError(f"scale_in must be 'cache-aware' or 'least-loaded', got {cfg.scale_in!r}")
    fleet = Fleet(cfg, bs)
    rt.attach(fleet)
    heap: list[tuple[float, int, int, int, int]] = []
    seq = 0

    def push(t: float, kind: int, a: int = 0, b: int = 0) -> None:
        nonlocal seq
        seq += 1
        heapq.heappush(heap, (t, seq, kind, a, b))

    def push_step(r: SimReplica, end: float | None) -> None:
        r.version += 1
        if end is not None:
            push(end, _STEP, r.id, r.version)

    # closed-loop requests (`after`) are sent when the request they follow ends; the rest at their arrival
    stream = [r for r in reqs if r.after < 0]
    follower = {r.after: r for r in reqs if r.after >= 0}
    held: list[Request] = []  # followers sent (a _SEND event's index)
    t0 = stream[0].arrival if stream else 0.0
    for p in cfg.pools:
        for _ in range(p.replicas):
            fleet.make_routable(fleet.add(p.name, t0, t0))
    pending: list[Request] = []  # arrived while no replica could take them
    rejected: list[Request] = []
    too_long: set[int] = set()  # request ids rejected as longer than the chosen pool's context (the engine's 400)
    finished = 0
    window: list[Request] = []  # arrivals since the last autoscaler tick
    done_window: list[Request] = []
    series: list[dict[str, Any]] = []
    # The autoscaler runs every interval, and at once when the router wakes it (`rt.wake_due`); a _TICK event
    # carries its generation, so the regular tick a wake-up replaced is skipped.
    tick_gen, last_tick, wakes = 0, t0, autoscaler is not None and cfg.autoscale_on_burst
    # the next tick is a wake-up's, by a burst the detector counted at this rate: a decision that measures it diluted
    # brings the next one forward (follow_up_after)
    woken, wake_rate = False, 0.0
    if autoscaler:
        push(t0 + cfg.autoscale_phase_s + cfg.autoscale_interval_s, _TICK, tick_gen)
    push(t0, _SAMPLE)
    n = len(reqs)
    ns = len(stream)
    i = 0
    # Misses the run may have and still reach cfg.stop_below_attainment (None: never stop early).
    miss_budget = None if cfg.stop_below_attainment is None else math.floor((1 - cfg.stop_below_attainment) * n)
    missed = 0

    def ended(req: Request, now: float) -> None:
        """`req` finished or was rejected: send the request that follows it (a client's next turn)."""
        f = follower.get(req.rid)
        if f is not None:
            held.append(f)
            push(now + f.think, _SEND, len(held) - 1)

    def dispatch(req: Request, now: float) -> None:
        nonlocal missed
        rep = rt.route(req, fleet, now)
        if rep is None:
            pending.append(req)
            return
        if req.prompt_len + req.output_len > context[rep.pool]:
            too_long.add(req.rid)
            rejected.append(req)
            ended(req, now)
            return
        if -(-(req.prompt_len + req.output_len) // bs) > rep.total:
            missed += 1
            rejected.append(req)
            ended(req, now)
            return
        req.replica, req.pool = rep.id, rep.pool
        req.degraded = fleet.specs[rep.pool].role == "student"
        if req.adapter is not None:
            rep.use_adapter(req.adapter)
        rep.waiting.append(req)
        if not rep.plan:
            push_step(rep, rep.schedule(now))
        elif rep.run is not None:
            end = rep.truncate(now)
            if end is not None:
                push_step(rep, end)
        if len(rep.waiting) < rep.min_waiting:
            rep.min_waiting = len(rep.waiting)
        if changed is not None:
            changed(rep)

    def arrive(req: Request, now: float) -> None:
        """A request reaches the router: counted (the interval's arrivals, the burst detector) and routed; a burst it
        completes wakes the autoscaler."""
        nonlocal tick_gen, woken, wake_rate
        window.append(req)
        rt.on_arrival(req, now)
        dispatch(req, now)
        if rt.wake_due and wakes:
            rt.wake_due, tick_gen, woken, wake_rate = False, tick_gen + 1, True, rt.wake_rate
            push(max(now, last_tick + WAKE_MIN_WINDOW_S), _TICK, tick_gen)

    horizon = (stream[-1].arrival if stream else t0) + 86400.0  # requests still pending a day later stay pending

    def more(now: float) -> bool:
        return (i < ns or finished + len(rejected) < n) and now < horizon

    def stop_if_drained(rep: SimReplica, now: float) -> None:
        if rep.draining and not rep.running and not rep.waiting and rep.stopped_at is None:
            rep.stopped_at = now

    while True:
        na = stream[i].arrival if i < ns else math.inf
        if heap and heap[0][0] <= na:
            now, _, kind, a, b = heapq.heappop(heap)
            if kind == _STEP:
                rep = fleet.replicas[a]
                if b != rep.version:
                    continue
                done = rep.complete(now)
                if cfg.check_invariants:
                    rep.check_blocks()
                if rep.first_tokens:
                    for r in rep.first_tokens:
                        rt.on_first_token(r, now)
                        if now - r.arrival > cfg.ttft_slo_s:
                            missed += 1
                    rep.first_tokens.clear()
                for r in done:
                    finished += 1
                    done_window.append(r)
                    rt.on_complete(r, now)
                    ended(r, now)
                if miss_budget is not None and missed > miss_budget:
                    break  # it cannot reach stop_below_attainment any more
                push_step(rep, rep.schedule(now))
                if len(rep.waiting) < rep.min_waiting:
                    rep.min_waiting = len(rep.waiting)
                if changed is not None:
                    changed(rep)
                stop_if_drained(rep, now)
            elif kind == _READY:
                rep = fleet.replicas[a]
                if rep.stopped_at is None and not rep.draining:
                    fleet.make_routable(rep)
                    waiting, pending[:] = pending[:], []
                    for r in waiting:
                        dispatch(r, now)
            elif kind == _TICK and autoscaler is not None:
                if a != tick_gen:
                    continue
                follow = _autoscale(fleet, autoscaler, rt, cfg, now, now - last_tick, window, done_window, push,
                                    stop_if_drained, wake_rate if woken else None)
                window, done_window, last_tick, woken = [], [], now, False
                if more(now):
                    push(now + (follow if follow is not None else cfg.autoscale_interval_s), _TICK, tick_gen)
            elif kind == _SEND:
                req = held[a]
                req.arrival = now
                arrive(req, now)
            elif kind == _SAMPLE:
                series.append(_sample(fleet, now, len(pending)))
                if more(now):
                    push(now + cfg.series_interval_s, _SAMPLE)
        elif i < ns:
            req = stream[i]
            i += 1
            arrive(req, req.arrival)
        else:
            break
    end = max([r.finish for r in reqs if r.finish >= 0] + [t0])
    for rep in fleet.replicas:
        if rep.stopped_at is None:
            rep.stopped_at = end
    sent = {id(r) for r in held}
    pending += [r for r in follower.values() if id(r) not in sent]  # behind a request that never ran
    stopped = miss_budget is not None and missed > miss_budget
    if stopped:  # what had not finished when the run stopped: not arrived, waiting or running
        accounted = {id(r) for r in pending} | {id(r) for r in rejected}
        pending += [r for r in reqs if r.finish < 0 and id(r) not in accounted]
    lost = n - finished - len(rejected) - len(pending)
    if lost:
        raise RuntimeError(f"simulation lost {lost} requests (bug)")
    summary = summarize(reqs, fleet, cfg, t0, end, rejected, pending)
    summary["rejectedContext"] = len(too_long)
    if stopped:
        summary["stopped"] = True
    summary["clippedContext"] = clipped
    cfg_dict = {"pools": [{**asdict(p), "model": p.model if isinstance(p.model, str) else p.model.to_wire(),
                           "kvBlocks": fleet.pool_blocks[p.name], "hostKvBlocks": fleet.pool_host[p.name][0],
                           "gpusPerReplica": p.gpus_per_replica()}
                          for p in cfg.pools],
                "ttftSloS": cfg.ttft_slo_s, "tpotSloS": cfg.tpot_slo_s, "blockSize": bs, "seed": cfg.seed}
    rejected_ids = {r.rid for r in rejected}
    records = [RequestRecord(r.rid, r.arrival, r.prompt_len, r.output_len, r.pool, r.replica, r.degraded,
                             r.hit_tokens, (r.first_token - r.arrival) if r.first_token >= 0 else None,
                             (r.finish - r.arrival) if r.finish >= 0 else None, r.preemptions, r.tenant,
                             "context" if r.rid in too_long else "kv" if r.rid in rejected_ids else None)
               for r in reqs] if cfg.keep_records else []
    reps = [{"id": r.id, "pool": r.pool, "served": r.served, "busyS": round(r.busy_s, 3),
             "gpuS": round(gpu_s, 3), "promptTokens": r.prompt_tokens,
             "hitTokens": r.hit_tokens, "hostHitTokens": r.host_hit_tokens,
             # prefill tokens the replica computed, a preempted request's recomputation included
             "computedPromptTokens": r.computed_prompt, "preemptions": r.preemptions, "steps": r.steps}
            for r, gpu_s in zip(fleet.replicas, replica_gpu_seconds(fleet, end), strict=True)]
    return SimResult(workload.name, rt.name, records, series, reps, summary, cfg_dict)


def _sample(fleet: Fleet, now: float, pending: int) -> dict[str, Any]:
    out: dict[str, Any] = {"t": now, "pending": pending}
    for pool in fleet.specs:
        reps = [r for r in fleet.replicas if r.pool == pool and r.stopped_at is None]
        out[pool] = {"replicas": len(reps), "ready": len(fleet.routable[pool]),
                     "waiting": sum(len(r.waiting) for r in reps), "running": sum(len(r.running) for r in reps),
                     "kv": round(sum(r.kv_usage() for r in reps) / len(reps), 4) if reps else 0.0}
    return out


def _p95(xs: list[float]) -> float | None:
    if not xs:
        return None
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(math.ceil(0.95 * len(xs))) - 1)]


def _autoscale(fleet: Fleet, autoscaler: Autoscaler, router: SimRouter, cfg: SimConfig, now: float, iv: float,
               arrivals: list[Request], done: list[Request], push: Callable[..., None],
               stop_if_drained: Callable[[SimReplica, float], None], wake_rate: float | None = None) -> float | None:
    """One autoscaler decision on what happened over the last `iv` seconds (an interval, or less when the router's
    burst wake-up brought it forward). The rates are over those seconds (`window_s`), as the production scrapes'.
    `wake_rate`: the detector's rate when a burst wake-up brought this decision forward. Returns the seconds until a
    follow-up decision (`follow_up_after` its signals, as `autoscale_step`), None for the interval."""
    iv = max(iv, 1e-3)
    sigs = []
    for spec in cfg.pools:
        reps = [r for r in fleet.replicas if r.pool == spec.name and r.stopped_at is None and not r.draining]
        mine = [r for r in done if r.pool == spec.name]
        arr = arrivals if spec.role == "primary" else [r for r in arrivals if r.pool == spec.name]
        ttfts = [(r.first_token - r.arrival) * 1e3 for r in mine]
        tpots = [(r.finish - r.first_token) * 1e3 / (r.output_len - 1) for r in mine if r.output_len > 1]
        queued = [(r.admitted_at - r.arrival) * 1e3 for r in mine if r.admitted_at >= 0]
        moments = prompt_length_moments([r.prompt_len for r in arr])  # the router's power sums, per request
        prompt = sum(r.prompt_len for r in mine)
        # the shortest queue any replica ready for the whole interval had (saturation: >= 1 all along)
        whole = [r.min_waiting for r in fleet.routable[spec.name] if r.ready_at <= now - iv]
        running = sum(len(r.running) for r in reps)
        kv = sum(r.kv_usage() for r in reps)
        sigs.append(SimPoolSignals(
            pool=spec.name, role=spec.role, now=now, replicas=len(reps), ready_replicas=len(fleet.routable[spec.name]),
            arrival_rate=len(arr) / iv,
            mean_input_tokens=sum(r.prompt_len for r in arr) / len(arr) if arr else None,
            mean_output_tokens=sum(r.output_len for r in arr) / len(arr) if arr else None,
            input_tokens_moments=moments[1:] if moments else None,
            ttft_p95_ms=_p95(ttfts), tpot_p95_ms=_p95(tpots), queue_time_p95_ms=_p95(queued),
            queue_depth=float(sum(len(r.waiting) for r in reps)), running=float(running),
            kv_utilization=kv / len(reps) if reps else None,
            # running sequences over KV usage, both summed over the pool (PoolSignals.kv_full_sequences)
            kv_full_sequences=running / kv if kv > 0 else None,
            prefix_hit_rate=sum(r.hit_tokens for r in mine) / prompt if prompt else None,
            degraded_fraction=(sum(1 for r in arrivals if r.degraded) / len(arrivals)) if arrivals else None,
            # token-level work done in the interval (not the work of the requests that happened to finish in it)
            prefill_tokens_per_s=sum(r.computed_prompt - r.tick_marks[0] for r in reps) / iv,
            decode_tokens_per_s=sum(r.generated - r.tick_marks[1] for r in reps) / iv,
            min_queue_depth=float(min(whole)) if whole else None,
            window_s=iv,
        ))
    for r in fleet.replicas:
        if r.stopped_at is None:
            r.tick_marks, r.min_waiting = (r.computed_prompt, r.generated), len(r.waiting)
    desired = autoscaler(now, sigs)
    follow = follow_up_after(sigs, wake_rate) if wake_rate is not None else None
    for spec in cfg.pools:
        if spec.name not in desired:
            continue
        want = max(spec.min_replicas, min(spec.max_replicas, int(desired[spec.name])))
        live = [r for r in fleet.replicas if r.pool == spec.name and r.stopped_at is None and not r.draining]
        if want > len(live):
            for _ in range(want - len(live)):
                rep = fleet.add(spec.name, now, now + spec.cold_start_s)
                push(rep.ready_at, _READY, rep.id)
        elif want < len(live):
            # the production choice of victims (choose_victims), fed what the production router would report
            by_id = {str(r.id): r for r in live}
            views = [ScaleInReplica(pool=spec.name, name=k, ready=r.ready_at <= now) for k, r in by_id.items()]
            lost = router.blocks_lost_if_removed(live) if cfg.scale_in == "cache-aware" else None
            in_flight = {k: float(len(r.running) + len(r.waiting)) for k, r in by_id.items()}
            for view in choose_victims(views, len(live) - want, lost, in_flight):
                rep = by_id[view.name]
                rep.draining = True
                fleet.unroute(rep)
                stop_if_drained(rep, now)
    return follow
