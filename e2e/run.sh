#!/usr/bin/env bash
# End-to-end test of llmfleet on kind: one script, named phases, run in this order.
#
#   create_cluster    kind cluster from e2e/kind.yaml (pinned node image)
#   build_images      docker build the operator, router, serve-cpu (e2e target: tiny model) and train images
#   load_images       kind load them into the node
#   install_chart     helm install charts/llmfleet with ci/kind-values.yaml; wait for the operator
#   serve_ready       apply e2e/manifests/inferenceservice.yaml; poll until the InferenceService is Ready
#   chat              chat completions through the router with the openai client
#   scale             kubectl scale the InferenceService; the pool's Deployment and pods follow
#   kill_replica      delete a replica pod under load; no request fails (router/client retry)
#   serve_gc          delete the InferenceService; its children are garbage-collected
#   train             a tiny TrainingJob runs to Succeeded with a checkpoint on its PVC
#   train_gc          delete the TrainingJob; its children are garbage-collected
#
# The serving and training phases are tests in tests/e2e/test_e2e_kind.py (pytest -m e2e): the serving
# phases share one namespace (one InferenceService), training has its own; each run uses fresh namespaces.
#
# Environment:
#   E2E_USE_EXISTING_CLUSTER=1  use the current kube context: no kind create/load/delete (images must be
#                               pullable by that cluster: set IMAGE_REGISTRY/IMAGE_TAG and push them first)
#   E2E_KEEP_CLUSTER=1          keep the kind cluster afterwards (default: delete it on success)
#   E2E_PHASES="chat scale"     run only these phases (the cluster must already be set up for them)
#   E2E_ARTIFACTS=DIR           where logs go on failure (default: e2e/.artifacts)
#   IMAGE_REGISTRY, IMAGE_TAG   image names (default ghcr.io/llmfleet, e2e)
# Needs: docker, kind (v0.30.0 tested), helm and kubectl (make tools), python with the dev extras (.venv).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
export PATH="$ROOT/.tools/bin:$ROOT/.venv/bin:$PATH"

CLUSTER_NAME="${E2E_CLUSTER_NAME:-llmfleet-e2e}"
KIND_CONFIG="$ROOT/e2e/kind.yaml"
IMAGE_REGISTRY="${IMAGE_REGISTRY:-ghcr.io/llmfleet}"
IMAGE_TAG="${IMAGE_TAG:-e2e}"
# kind-values.yaml names ghcr.io/llmfleet/...:e2e; other names are passed with --set below.
RELEASE="llmfleet"
OPERATOR_NS="llmfleet-system"
ARTIFACTS="${E2E_ARTIFACTS:-$ROOT/e2e/.artifacts}"
USE_EXISTING="${E2E_USE_EXISTING_CLUSTER:-0}"
KEEP_CLUSTER="${E2E_KEEP_CLUSTER:-0}"
ALL_PHASES=(create_cluster build_images load_images install_chart serve_ready chat scale kill_replica serve_gc
  train train_gc)
read -r -a PHASES <<<"${E2E_PHASES:-${ALL_PHASES[*]}}"
CURRENT_PHASE="setup"

log() { printf '\033[1m==> [%s] %s\033[0m\n' "$(date -u +%H:%M:%S)" "$*" >&2; }
die() { printf 'e2e: %s\n' "$*" >&2; exit 1; }

image() { printf '%s/%s:%s' "$IMAGE_REGISTRY" "$1" "$IMAGE_TAG"; }

# Poll a command until it succeeds or the timeout (seconds) passes: never sleep-and-hope.
wait_for() {
  local timeout="$1" what="$2"
  shift 2
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout}s waiting for: $what"
    sleep 2
  done
}

require() {
  local tool
  for tool in "$@"; do
    command -v "$tool" >/dev/null 2>&1 || die "$tool not found on PATH (helm/kubectl: make tools; kind: https://kind.sigs.k8s.io)"
  done
}

# On failure: operator logs, objects and events of every e2e namespace, and the node logs from kind.
collect_logs() {
  mkdir -p "$ARTIFACTS"
  log "collecting logs into $ARTIFACTS (failed in phase: $CURRENT_PHASE)"
  local operator_pods="app.kubernetes.io/instance=$RELEASE,app.kubernetes.io/component=operator"
  kubectl -n "$OPERATOR_NS" logs -l "$operator_pods" --all-containers --prefix --tail=-1 \
    >"$ARTIFACTS/operator.log" 2>&1 || true
  kubectl -n "$OPERATOR_NS" logs -l "$operator_pods" --all-containers --prefix --previous \
    >"$ARTIFACTS/operator-previous.log" 2>&1 || true
  kubectl -n "$OPERATOR_NS" describe pods -l "$operator_pods" >"$ARTIFACTS/operator-pods.txt" 2>&1 || true
  kubectl get inferenceservices,trainingjobs,deployments,jobs,pods,services,configmaps,pvc -A -o wide \
    -l app.kubernetes.io/part-of=llmfleet >"$ARTIFACTS/objects.txt" 2>&1 || true
  kubectl get inferenceservices,trainingjobs -A -o yaml >"$ARTIFACTS/custom-resources.yaml" 2>&1 || true
  kubectl get events -A --sort-by=.lastTimestamp >"$ARTIFACTS/events.txt" 2>&1 || true
  local ns
  for ns in $(kubectl get namespaces -l llmfleet.io/e2e=true -o name 2>/dev/null | cut -d/ -f2); do
    kubectl -n "$ns" describe pods >"$ARTIFACTS/pods-$ns.txt" 2>&1 || true
    kubectl -n "$ns" logs -l app.kubernetes.io/managed-by=llmfleet --all-containers --prefix --tail=500 \
      >"$ARTIFACTS/workloads-$ns.log" 2>&1 || true
  done
  if [[ "$USE_EXISTING" != 1 ]]; then
    kind export logs "$ARTIFACTS/kind" --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  fi
}

on_exit() {
  local rc=$?
  if ((rc != 0)); then
    collect_logs
    log "FAILED in phase $CURRENT_PHASE (rc=$rc); logs in $ARTIFACTS"
  fi
  if [[ "$USE_EXISTING" != 1 && "$KEEP_CLUSTER" != 1 && $rc == 0 ]]; then
    log "deleting kind cluster $CLUSTER_NAME (E2E_KEEP_CLUSTER=1 keeps it)"
    kind delete cluster --name "$CLUSTER_NAME" >/dev/null 2>&1 || true
  elif [[ "$USE_EXISTING" != 1 ]]; then
    log "kind cluster $CLUSTER_NAME kept: kind delete cluster --name $CLUSTER_NAME"
  fi
  exit "$rc"
}
trap on_exit EXIT

# The serving and training phases: one pytest node id each (tests/e2e/test_e2e_kind.py).
run_pytest_phase() {
  LLMFLEET_E2E=1 LLMFLEET_E2E_RUN_ID="$RUN_ID" python -m pytest -q -ra -p no:cacheprovider -m e2e \
    --timeout=1200 "tests/e2e/test_e2e_kind.py::$1"
}

phase_create_cluster() {
  if [[ "$USE_EXISTING" == 1 ]]; then
    log "using the current kube context: $(kubectl config current-context)"
    return
  fi
  require kind docker
  if kind get clusters 2>/dev/null | grep -qx "$CLUSTER_NAME"; then
    log "kind cluster $CLUSTER_NAME exists; reusing it"
  else
    kind create cluster --name "$CLUSTER_NAME" --config "$KIND_CONFIG" --wait 180s
  fi
  kubectl config use-context "kind-$CLUSTER_NAME" >/dev/null
  wait_for 180 "node Ready" kubectl wait --for=condition=Ready nodes --all --timeout=5s
}

phase_build_images() {
  if [[ "${E2E_SKIP_BUILD:-0}" == 1 ]]; then
    log "E2E_SKIP_BUILD=1: using the images already built"
    return
  fi
  require docker
  # CPU variants everywhere: kind nodes have no GPU. The e2e targets bake in the tiny model and the data.
  docker build -f docker/operator.Dockerfile -t "$(image llmfleet-operator)" .
  docker build -f docker/router.Dockerfile -t "$(image llmfleet)" .
  docker build -f docker/serve-cpu.Dockerfile --target e2e -t "$(image llmfleet-serve-cpu)" .
  docker build -f docker/train.Dockerfile --target e2e \
    --build-arg TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu -t "$(image llmfleet-train)" .
}

phase_load_images() {
  if [[ "$USE_EXISTING" == 1 ]]; then
    log "existing cluster: images must be pullable from $IMAGE_REGISTRY (not kind-loaded)"
    return
  fi
  local name
  for name in llmfleet-operator llmfleet llmfleet-serve-cpu llmfleet-train; do
    kind load docker-image "$(image "$name")" --name "$CLUSTER_NAME"
  done
}

phase_install_chart() {
  local pull_policy=Never
  [[ "$USE_EXISTING" == 1 ]] && pull_policy=IfNotPresent
  helm upgrade --install "$RELEASE" charts/llmfleet --namespace "$OPERATOR_NS" --create-namespace \
    -f charts/llmfleet/ci/kind-values.yaml \
    --set image.repository="$IMAGE_REGISTRY/llmfleet-operator" --set image.tag="$IMAGE_TAG" \
    --set image.pullPolicy="$pull_policy" \
    --set images.router.repository="$IMAGE_REGISTRY/llmfleet" --set images.router.tag="$IMAGE_TAG" \
    --set images.serve.repository="$IMAGE_REGISTRY/llmfleet-serve-cpu" --set images.serve.tag="$IMAGE_TAG" \
    --set images.train.repository="$IMAGE_REGISTRY/llmfleet-train" --set images.train.tag="$IMAGE_TAG" \
    --wait --timeout 5m
  wait_for 120 "CRDs established" kubectl wait --for=condition=Established \
    crd/inferenceservices.llmfleet.io crd/trainingjobs.llmfleet.io --timeout=5s
  kubectl -n "$OPERATOR_NS" rollout status "statefulset/$RELEASE" --timeout=180s
}

phase_serve_ready() { run_pytest_phase test_serve_ready; }
phase_chat() { run_pytest_phase test_chat_completions_through_router; }
phase_scale() { run_pytest_phase test_scale_pools_follow; }
phase_kill_replica() { run_pytest_phase test_kill_replica_no_failed_requests; }
phase_serve_gc() { run_pytest_phase test_serve_delete_garbage_collects; }
phase_train() { run_pytest_phase test_training_succeeds_with_checkpoint; }
phase_train_gc() { run_pytest_phase test_training_delete_garbage_collects; }

main() {
  require helm kubectl python
  # Namespaces of this run are derived from RUN_ID: phases run as separate pytest calls share them.
  RUN_ID="${LLMFLEET_E2E_RUN_ID:-$(date -u +%H%M%S)}"
  export RUN_ID
  local phase start
  for phase in "${PHASES[@]}"; do
    declare -F "phase_$phase" >/dev/null || die "unknown phase '$phase' (phases: ${ALL_PHASES[*]})"
  done
  for phase in "${PHASES[@]}"; do
    CURRENT_PHASE="$phase"
    start=$SECONDS
    log "phase $phase"
    "phase_$phase"
    log "phase $phase done in $((SECONDS - start))s"
  done
  CURRENT_PHASE="done"
  log "e2e passed: ${PHASES[*]}"
}

main "$@"
