#!/usr/bin/env bash
# The chaos pipeline in a kind cluster (machines with Docker): Chaos Mesh injects the faults while the
# chaos workload runs as a Job, then the checker Job prints the verdict. Needs kubectl, helm and a
# cluster made by `make kind-up image-load helm-install`. DRY_RUN=1 prints every command instead.
#
#   deploy/kind/chaos-kind.sh                 # the whole pipeline
#   DRY_RUN=1 deploy/kind/chaos-kind.sh       # what it would run
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
NAMESPACE=${NAMESPACE:-gregor}
HELM=${HELM:-helm}
KUBECTL=${KUBECTL:-kubectl}
# The release whose CRDs `make test` validates the experiments against (the Makefile's CHAOS_MESH_VERSION).
CHAOS_MESH_VERSION=${CHAOS_MESH_VERSION:-2.8.3}
# Seconds between experiments: each one heals (its duration) before the next starts.
FAULT_GAP_S=${FAULT_GAP_S:-30}

run() {
    if [ "${DRY_RUN:-0}" = 1 ]; then echo "+ $*"; else "$@"; fi
}


echo "== Chaos Mesh ${CHAOS_MESH_VERSION}"
run "$HELM" repo add chaos-mesh https://charts.chaos-mesh.org --force-update
run "$HELM" upgrade --install chaos-mesh chaos-mesh/chaos-mesh --namespace chaos-mesh --create-namespace \
    --version "$CHAOS_MESH_VERSION" --set chaosDaemon.runtime=containerd \
    --set chaosDaemon.socketPath=/run/containerd/containerd.sock --wait --timeout 10m

echo "== workload"
run "$KUBECTL" -n "$NAMESPACE" delete job gregor-chaos-workload gregor-chaos-check --ignore-not-found
run "$KUBECTL" apply -f "$here/chaos/jobs.yaml" --selector app.kubernetes.io/component!=chaos-check
run "$KUBECTL" -n "$NAMESPACE" wait --for=condition=Ready pod -l app.kubernetes.io/component=chaos-workload \
    --timeout 5m

echo "== faults"
for exp in "$here"/chaos/experiments/*.yaml; do
    run "$KUBECTL" apply -f "$exp"
    run sleep "$FAULT_GAP_S"
    run "$KUBECTL" delete -f "$exp" --ignore-not-found --wait
done

echo "== verdict"
run "$KUBECTL" -n "$NAMESPACE" wait --for=condition=complete job/gregor-chaos-workload --timeout 30m
run "$KUBECTL" apply -f "$here/chaos/jobs.yaml"
if run "$KUBECTL" -n "$NAMESPACE" wait --for=condition=complete job/gregor-chaos-check --timeout 10m; then
    run "$KUBECTL" -n "$NAMESPACE" logs job/gregor-chaos-check
else
    run "$KUBECTL" -n "$NAMESPACE" logs job/gregor-chaos-check || true
    echo "chaos check failed: the history shows an anomaly (see above)" >&2
    exit 1
fi
