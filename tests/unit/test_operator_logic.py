"""Pure parts of the operator: conditions, promotion rollback rule, worker status parsing, RBAC coverage."""

from __future__ import annotations

import pathlib

import kubernetes_validate
import pytest
import yaml
from typer.testing import CliRunner

from llmfleet.api.contracts import PROMOTION_ANNOTATION
from llmfleet.kube.client import label_selector, plural_of
from llmfleet.operator import rbac
from llmfleet.operator.builders import build_inferenceservice, build_trainingjob
from llmfleet.operator.config import Capabilities, OperatorConfig
from llmfleet.operator.promotion import (
    Promotion,
    evaluate,
    from_annotations,
    pool_metrics,
    pool_model,
    pool_model_patch,
)
from llmfleet.operator.status import invalid_spec_outcome, set_conditions
from llmfleet.operator.tj_status import job_failed, job_succeeded
from llmfleet.operator.worker_status import status_fields


def test_conditions_keep_transition_time_until_status_changes() -> None:
    first = set_conditions(None, {"Ready": (False, "ReplicasNotReady", "0/2")}, 1, "t1")
    same = set_conditions(first, {"Ready": (False, "ReplicasNotReady", "1/2")}, 2, "t2")
    assert same[0]["lastTransitionTime"] == "t1" and same[0]["message"] == "1/2" and same[0]["observedGeneration"] == 2
    flipped = set_conditions(same, {"Ready": (True, "AllReplicasReady", "")}, 2, "t3")
    assert flipped[0]["status"] == "True" and flipped[0]["lastTransitionTime"] == "t3"
    both = set_conditions(flipped, {"Degraded": (False, "AsExpected", "")}, 2, "t4")
    assert [c["type"] for c in both] == ["Ready", "Degraded"] and both[0] == flipped[0]


def test_invalid_spec_event_only_on_change() -> None:
    out = invalid_spec_outcome({}, "spec.vllm: blockSize must be one of ...", 3, "t", "InferenceService")
    ready = out.status["conditions"][0]
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert out.status["phase"] == "Invalid" and out.status["observedGeneration"] == 3
    assert [e.reason for e in out.events] == ["InvalidSpec"]
    again = invalid_spec_outcome(out.status, "spec.vllm: blockSize must be one of ...", 3, "t2", "InferenceService")
    assert again.events == []


def _promo(**kw: object) -> Promotion:
    return Promotion(training_job="t", pool="student", model="/new", previous="/old", **kw)  # type: ignore[arg-type]


def _dep(model: str, gen: int, seen: int, replicas: int, updated: int, ready: int) -> dict[str, object]:
    return {
        "metadata": {"generation": gen, "annotations": {"llmfleet.io/model": model}},
        "spec": {"replicas": replicas},
        "status": {"observedGeneration": seen, "replicas": replicas, "updatedReplicas": updated, "readyReplicas": ready},
    }


def test_promotion_rollout_and_rollback_rules() -> None:
    p = _promo(baseline_ttft_ms=300.0, baseline_error_rate=0.01)
    assert evaluate(p, 500, None, _dep("/new", 2, 2, 3, 1, 3))[0] == "RollingOut"
    assert evaluate(p, 500, None, _dep("/new", 2, 1, 3, 3, 3))[0] == "RollingOut"  # not observed yet
    assert evaluate(p, 500, None, _dep("/old", 2, 2, 3, 3, 3))[0] == "RollingOut"  # old template
    assert evaluate(p, 500, None, _dep("/new", 2, 2, 3, 3, 3))[0] == "Succeeded"
    fresh_bad = {"pools": [{"name": "student", "ttftP95Ms": 900.0, "stale": False}], "stale": False}
    assert evaluate(p, 500, fresh_bad, _dep("/new", 2, 2, 3, 1, 3))[0] == "RolledBack"
    stale_pool = {"pools": [{"name": "student", "ttftP95Ms": 900.0, "stale": True}], "stale": False}
    assert evaluate(p, 500, stale_pool, _dep("/new", 2, 2, 3, 1, 3))[0] == "RollingOut"
    # Already violating before the rollout: latency alone does not blame the new model.
    assert evaluate(_promo(baseline_ttft_ms=800.0), 500, fresh_bad, None)[0] == "RollingOut"
    errors = {"pools": [{"name": "student", "errorRate": 0.2, "stale": False}], "stale": False}
    assert evaluate(p, 500, errors, None)[0] == "RolledBack"
    stuck = _dep("/new", 2, 2, 3, 1, 2)
    stuck["status"]["conditions"] = [{"type": "Progressing", "reason": "ProgressDeadlineExceeded"}]  # type: ignore[index]
    assert evaluate(p, 500, None, stuck)[0] == "RolledBack"
    assert evaluate(_promo(state="Succeeded"), 500, fresh_bad, None)[0] == "Succeeded"


def test_promotion_judges_the_promoted_pools_own_metrics() -> None:
    """A model promoted to a student pool is judged on that pool's latency and errors, not the primary's."""
    p = _promo(baseline_ttft_ms=300.0, baseline_tpot_ms=20.0, baseline_error_rate=0.01)
    rolling = _dep("/new", 2, 2, 3, 1, 3)

    def status(primary: dict[str, object], student: dict[str, object]) -> dict[str, object]:
        return {"ttftP95Ms": primary.get("ttftP95Ms"), "errorRate": primary.get("errorRate"), "stale": False,
                "pools": [{"name": "primary", "stale": False, **primary}, {"name": "student", "stale": False, **student}]}

    # The primary burns (latency and errors): not the student's doing.
    assert evaluate(p, 500, status({"ttftP95Ms": 2000.0, "errorRate": 0.5}, {"ttftP95Ms": 200.0, "errorRate": 0.0}),
                    rolling, slo_tpot_ms=50)[0] == "RollingOut"
    # Latency trigger: the student's TTFT, then its TPOT, over the SLO.
    state, msg = evaluate(p, 500, status({}, {"ttftP95Ms": 900.0}), rolling, slo_tpot_ms=50)
    assert state == "RolledBack" and "pool student: TTFT p95 900 ms" in msg
    state, msg = evaluate(p, 500, status({}, {"ttftP95Ms": 200.0, "tpotP95Ms": 80.0}), rolling, slo_tpot_ms=50)
    assert state == "RolledBack" and "TPOT p95 80 ms" in msg
    # Error trigger: the router's failed tries on the student's replicas, above baseline + margin.
    state, msg = evaluate(p, 500, status({}, {"errorRate": 0.07}), rolling, slo_tpot_ms=50)
    assert state == "RolledBack" and "error rate 7.0%" in msg
    assert evaluate(p, 500, status({}, {"errorRate": 0.05}), rolling, slo_tpot_ms=50)[0] == "RollingOut"
    # A promotion to the primary reads the primary's entry (or the top level of an older status).
    to_primary = Promotion(training_job="t", pool="primary", model="/new", previous="/old", baseline_error_rate=0.0)
    assert evaluate(to_primary, 500, status({"errorRate": 0.3}, {}), rolling)[0] == "RolledBack"
    assert evaluate(to_primary, 500, {"errorRate": 0.3, "stale": False}, rolling)[0] == "RolledBack"
    assert pool_metrics({"ttftP95Ms": 1.0, "pools": []}, "student") is None


def test_promotion_annotation_and_pool_patches() -> None:
    p = _promo(started_at="now")
    assert from_annotations({PROMOTION_ANNOTATION: p.to_annotation()}) == p
    assert from_annotations({PROMOTION_ANNOTATION: "{not json"}) is None
    body = {"metadata": {"resourceVersion": "7"},
            "spec": {"model": {"path": "/p"}, "fallback": {"pools": [{"name": "student", "model": {"path": "/s"}}]}}}
    assert pool_model(body, "primary") == "/p" and pool_model(body, "student") == "/s"
    assert pool_model(body, "nope") is None
    patch = pool_model_patch(body, "student", "/new")
    assert patch == {"metadata": {"resourceVersion": "7"},
                     "spec": {"fallback": {"pools": [{"name": "student", "model": {"path": "/new"}}]}}}
    assert body["spec"]["fallback"]["pools"][0]["model"]["path"] == "/s"  # not mutated
    assert pool_model_patch(body, "primary", "/x") == {"spec": {"model": {"path": "/x"}}}


def test_worker_status_fields() -> None:
    doc = {"step": 12, "loss": 2, "tokensPerSecond": 1e5, "mfu": 0.4, "hfu": 0.5, "lastCheckpoint": "/c/12",
           "stragglers": [3], "done": False, "extra": "ignored"}
    assert status_fields(doc) == {"step": 12, "loss": 2.0, "tokensPerSecond": 1e5, "mfu": 0.4, "hfu": 0.5,
                                  "lastCheckpoint": "/c/12", "stragglers": [3]}
    assert status_fields({"step": "12", "loss": None, "mfu": True, "stragglers": ["x"]}) == {}


def test_job_outcome() -> None:
    assert job_failed({"status": {"failed": 1}})
    assert job_failed({"status": {"conditions": [{"type": "Failed", "status": "True"}]}})
    assert not job_failed({"status": {"active": 2}})
    assert job_succeeded({"spec": {"completions": 2}, "status": {"succeeded": 2}})
    assert not job_succeeded({"spec": {"completions": 2}, "status": {"succeeded": 1}})


def test_rbac_covers_every_child_and_has_no_wildcards() -> None:
    from llmfleet.operator.reconcile_isvc import PRUNED_KINDS
    from llmfleet.router.config import DISCOVERY_RULES

    for rule in rbac.OPERATOR_RULES:
        for key in ("apiGroups", "resources", "verbs"):
            assert "*" not in rule[key]
    kubernetes_validate.validate(rbac.cluster_role(), "1.33.0", strict=True)
    from llmfleet.api import InferenceService, TrainingJob

    isvc = InferenceService.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "InferenceService",
        "metadata": {"name": "a", "uid": "u"},
        "spec": {"model": {"path": "/m"}, "resources": {"gpus": 1}, "featureStore": {"generationSchedule": "@daily"}},
    })
    tj = TrainingJob.model_validate({
        "apiVersion": "llmfleet.io/v1alpha1", "kind": "TrainingJob", "metadata": {"name": "b", "uid": "u"},
        "spec": {"model": {}, "data": {"path": "/d"}, "workers": {"count": 2}},
    })
    full = OperatorConfig(capabilities=Capabilities(True, True))
    children = build_inferenceservice(isvc, full) + build_trainingjob(tj, full)
    for m in children:  # server-side apply: patch, and create for a new object
        group = m["apiVersion"].rpartition("/")[0]
        plural, _ = plural_of(m["apiVersion"], m["kind"])
        for verb in ("create", "patch"):
            assert rbac.allows(group, plural, verb), (m["kind"], verb)
    for api_version, kind in PRUNED_KINDS:  # listed and deleted by the prune
        plural, _ = plural_of(api_version, kind)
        for verb in ("list", "delete"):
            assert rbac.allows(api_version.rpartition("/")[0], plural, verb), (kind, verb)
    # The router Role may only be granted if the operator holds it (escalation prevention); it is exactly
    # the router's discovery rules (the router only lists EndpointSlices).
    role = next(m for m in children if m["kind"] == "Role")
    assert role["rules"] == [dict(r) for r in DISCOVERY_RULES]
    for rule in role["rules"]:
        for verb in rule["verbs"]:
            assert rbac.allows(rule["apiGroups"][0], rule["resources"][0], verb)
    for verb in ("get", "list", "watch", "patch"):
        assert rbac.allows("llmfleet.io", "inferenceservices", verb)
    # kopf watches the children whose changes reconcile their owner.
    assert rbac.allows("apps", "deployments", "watch") and rbac.allows("batch", "jobs", "watch")
    assert rbac.allows("llmfleet.io", "trainingjobs/status", "patch")
    assert rbac.allows("kopf.dev", "clusterkopfpeerings", "patch")
    # The autoscaler (in the operator process) lists and labels pods; worker status comes over HTTP.
    assert rbac.allows("", "pods", "list") and rbac.allows("", "pods", "patch")
    assert not rbac.allows("", "pods", "get") and not rbac.allows("", "pods", "delete")
    # Every write is a patch (kopf and llmfleet's client never PUT).
    assert not any("update" in r["verbs"] for r in rbac.OPERATOR_RULES)


def test_plurals_come_from_lightkube_and_our_crds() -> None:
    assert plural_of("apps/v1", "Deployment") == ("deployments", True)
    assert plural_of("v1", "Namespace") == ("namespaces", False)
    assert plural_of("policy/v1", "PodDisruptionBudget") == ("poddisruptionbudgets", True)
    assert plural_of("llmfleet.io/v1alpha1", "InferenceService") == ("inferenceservices", True)
    assert plural_of("monitoring.coreos.com/v1", "PodMonitor") == ("podmonitors", True)
    with pytest.raises(ValueError, match="unknown kind"):
        plural_of("v9", "Nope")
    with pytest.raises(ValueError, match="unknown kind"):
        plural_of("example.com/v1", "Widget")  # a CRD nobody declared


def test_label_selector() -> None:
    from lightkube.core.selector import build_selector

    text = "app=x,tier!=db,llmfleet.io/pool==primary,has,!gone"
    assert build_selector(label_selector(text)) == "app=x,tier!=db,llmfleet.io/pool=primary,has,!gone"
    assert label_selector("") == {}
    with pytest.raises(ValueError, match="equality"):
        label_selector("env in (a,b)")


def test_kubernetes_validate_catches_bad_manifests() -> None:
    """Guard for the builder tests: the validator really rejects an invalid object."""
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(
            {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "x"}, "spec": {"replicas": "two"}},
            "1.33.0", strict=True,
        )


def test_cli_help_and_bad_flags() -> None:
    from llmfleet.cli.main import app

    runner = CliRunner()
    result = runner.invoke(app, ["operator", "--help"])
    assert result.exit_code == 0
    for flag in ("--namespace", "--all-namespaces", "--metrics-port", "--liveness-port", "--peering", "--standalone"):
        assert flag in result.output
    bad = runner.invoke(app, ["operator", "-n", "ml", "--all-namespaces"])
    assert bad.exit_code == 2 and "mutually exclusive" in bad.output
    too_high = runner.invoke(app, ["operator", "--priority", str(2**40)])  # kopf's priority stays 64-bit
    assert too_high.exit_code == 2 and "--priority" in too_high.output


INVALID = sorted((pathlib.Path(__file__).resolve().parents[2] / "examples" / "invalid").glob("*.yaml"))


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.name)
async def test_invalid_examples_become_invalid_spec_status(path: pathlib.Path) -> None:
    """The reconcile reports InvalidSpec with the field path and touches no child (no client call)."""
    from llmfleet.operator.reconcile_isvc import reconcile_inferenceservice
    from llmfleet.operator.reconcile_tj import reconcile_trainingjob

    body = yaml.safe_load(path.read_text())
    body.setdefault("metadata", {}).update({"uid": "u", "generation": 4})
    reconcile = reconcile_inferenceservice if body["kind"] == "InferenceService" else reconcile_trainingjob
    out = await reconcile(body, None, OperatorConfig(), "t")  # type: ignore[operator, arg-type]
    ready = out.status["conditions"][0]
    assert out.status["phase"] == "Invalid" and out.status["observedGeneration"] == 4
    assert (ready["type"], ready["status"], ready["reason"]) == ("Ready", "False", "InvalidSpec")
    assert ready["message"].split(":")[0].startswith(("spec", "metadata")), ready["message"]
    assert [e.reason for e in out.events] == ["InvalidSpec"]


@pytest.mark.parametrize("kind", ["InferenceService", "TrainingJob"])
@pytest.mark.parametrize(("spec", "status"), [("string", None), ([1, 2], None), ({}, "not-a-status")])
async def test_malformed_bodies_become_invalid_spec_status(kind: str, spec: object, status: object) -> None:
    """Bodies no schema would admit today (written before a CRD upgrade) are a condition, not an exception,
    also with cluster-wide defaults to merge into the spec."""
    from llmfleet.operator.reconcile_isvc import reconcile_inferenceservice
    from llmfleet.operator.reconcile_tj import reconcile_trainingjob

    body = {"apiVersion": "llmfleet.io/v1alpha1", "kind": kind, "spec": spec, "status": status,
            "metadata": {"name": "x", "namespace": "ml", "uid": "u", "generation": 2}}
    config = OperatorConfig(spec_defaults={"router": {"replicas": 2}})
    reconcile = reconcile_inferenceservice if kind == "InferenceService" else reconcile_trainingjob
    out = await reconcile(body, None, config, "t")  # type: ignore[operator, arg-type]
    ready = out.status["conditions"][0]
    assert out.status["phase"] == "Invalid"
    assert ready["reason"] == "InvalidSpec" and ready["message"].startswith("spec"), ready["message"]


def test_promotion_helpers_read_a_malformed_target_as_having_no_pools() -> None:
    from llmfleet.operator.promotion import adapter_patch, pool_names

    target = {"metadata": {"name": "chat", "resourceVersion": "1"}, "spec": "string"}
    assert pool_model(target, "primary") is None and pool_model(target, "student") is None
    assert pool_model_patch(target, "student", "/m") is None and adapter_patch(target, "a", "/a") is None
    assert pool_names(target) == ["primary"]
    odd = {"metadata": {"name": "chat"}, "spec": {"model": "x", "fallback": {"pools": ["x", {"name": "s"}]}}}
    assert pool_model(odd, "primary") is None and pool_names(odd) == ["primary", "s"]


def test_kopf_priority_keeps_the_order_and_breaks_ties_by_identity() -> None:
    from llmfleet.operator.config import PRIORITY_MAX, PRIORITY_MIN
    from llmfleet.operator.run import kopf_priority

    ids = [f"llmfleet-{i}.ns-{j}" for i in range(20) for j in range(5)]
    for low, high in ((0, 1), (-1, 0), (PRIORITY_MIN, PRIORITY_MAX), (9, 10)):
        assert max(kopf_priority(low, i) for i in ids) < min(kopf_priority(high, i) for i in ids)
    assert len({kopf_priority(0, i) for i in ids}) == len(ids)  # equal --priority: never equal for kopf
    assert kopf_priority(3, "a") == kopf_priority(3, "a")  # deterministic: the same identity, the same place
    assert -(2**63) <= kopf_priority(PRIORITY_MIN, "x") and kopf_priority(PRIORITY_MAX, "x") < 2**63
    with pytest.raises(ValueError, match="--priority must be between"):
        kopf_priority(PRIORITY_MAX + 1, "x")
