"""The Helm chart's optional `inferencePool` section (Gateway API Inference Extension): rendered with helm and
checked against the released CRD schemas (InferencePool inference.networking.k8s.io/v1 from GIE v1.5.0, HTTPRoute
gateway.networking.k8s.io/v1 from Gateway API v1.6.1; vendored in tests/deploy/crds/) and for the links between
the objects (pool -> engine pods and port, pool -> picker Service, route -> pool), and the picker's metric names
against what the server exports (tests/e2e/test_model_server_protocol.py checks the server side live).

Needs helm (HELM, PATH, or the one `bash deploy/validate.sh --install` puts in /tmp/switchyard-deploy-tools).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.deploy.crd_schemas import validate
from tests.deploy.test_deployment_files import KNOWN_METRICS, containers_of, load_docs

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "deploy" / "helm" / "switchyard"
TOOLS_HELM = Path(os.environ.get("TOOLS_DIR", "/tmp/switchyard-deploy-tools")) / "layer" / "helm" / "helm"


def helm() -> str:
    found = os.environ.get("HELM") or shutil.which("helm") or (str(TOOLS_HELM) if TOOLS_HELM.is_file() else None)
    if not found:
        pytest.skip("helm is not installed (set HELM, or run `bash deploy/validate.sh --install`)")
    return found


def render(*sets: str) -> dict[str, list[dict]]:
    argv = [helm(), "template", "sy", str(CHART), "--namespace", "llm"]
    for s in sets:
        argv += ["--set", s]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    by_kind: dict[str, list[dict]] = {}
    for doc in load_docs(out.stdout):
        by_kind.setdefault(doc["kind"], []).append(doc)
    return by_kind


@pytest.fixture(scope="module")
def pool_manifests() -> dict[str, list[dict]]:
    return render("inferencePool.enabled=true")


def named(docs: list[dict], name: str) -> dict:
    return next(d for d in docs if d["metadata"]["name"] == name)


def test_off_by_default() -> None:
    kinds = render()
    assert not {"InferencePool", "HTTPRoute", "Role"} & kinds.keys()


def test_custom_resources_match_the_released_crd_schemas(pool_manifests: dict[str, list[dict]]) -> None:
    for kind in ("InferencePool", "HTTPRoute"):
        assert len(pool_manifests[kind]) == 1
        validate(pool_manifests[kind][0])


def test_a_misspelt_field_fails_the_schema_check(pool_manifests: dict[str, list[dict]]) -> None:
    pool = yaml.safe_load(yaml.safe_dump(pool_manifests["InferencePool"][0]))
    pool["spec"]["targetPort"] = pool["spec"].pop("targetPorts")
    with pytest.raises(AssertionError, match="targetPort"):
        validate(pool)


def test_the_kubernetes_objects_match_the_kubernetes_schemas(
    pool_manifests: dict[str, list[dict]], tmp_path: Path
) -> None:
    tools = Path(os.environ.get("TOOLS_DIR", "/tmp/switchyard-deploy-tools")) / "venv" / "bin" / "kubernetes-validate"
    validator = (
        os.environ.get("KUBERNETES_VALIDATE")
        or shutil.which("kubernetes-validate")
        or (str(tools) if tools.is_file() else None)
    )
    if not validator:
        pytest.skip("kubernetes-validate is not installed (set KUBERNETES_VALIDATE)")
    native = [d for kind, docs in pool_manifests.items() if kind not in ("InferencePool", "HTTPRoute") for d in docs]
    path = tmp_path / "pool.yaml"
    path.write_text(yaml.safe_dump_all(native), encoding="utf-8")
    out = subprocess.run(
        [validator, "--strict", "--quiet", str(path)], capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_pool_selects_the_engine_pods_on_their_http_port(pool_manifests: dict[str, list[dict]]) -> None:
    pool = pool_manifests["InferencePool"][0]["spec"]
    engine = named(pool_manifests["Deployment"], "sy-switchyard-engine")
    pod_labels = engine["spec"]["template"]["metadata"]["labels"]
    assert pool["selector"]["matchLabels"].items() <= pod_labels.items()
    assert pool["selector"]["matchLabels"]["app.kubernetes.io/component"] == "engine"
    ports = {p["name"]: p["containerPort"] for p in containers_of(engine)[0]["ports"]}
    assert pool["targetPorts"] == [{"number": ports["http"]}]  # OpenAI routes and /metrics, scraped by the picker


def test_the_picker_is_wired_to_the_pool(pool_manifests: dict[str, list[dict]]) -> None:
    pool = pool_manifests["InferencePool"][0]
    ref = pool["spec"]["endpointPickerRef"]
    service = named(pool_manifests["Service"], ref["name"])
    assert ref["port"]["number"] in [p["port"] for p in service["spec"]["ports"]]
    assert ref["failureMode"] in ("FailOpen", "FailClose")
    picker = named(pool_manifests["Deployment"], ref["name"])
    assert service["spec"]["selector"].items() <= picker["spec"]["template"]["metadata"]["labels"].items()
    container = containers_of(picker)[0]
    args = container["args"]
    flag = {args[i]: args[i + 1] for i in range(len(args) - 1) if args[i].startswith("--")}
    assert flag["--pool-name"] == pool["metadata"]["name"] and flag["--pool-namespace"] == "llm"
    assert flag["--pool-group"] == "inference.networking.k8s.io"
    assert container["image"].startswith("registry.k8s.io/gateway-api-inference-extension/epp:")
    # The picker may read the pool and the pods.
    rules = named(pool_manifests["Role"], ref["name"])["rules"]
    assert {"pods", "inferencepools"} <= {r for rule in rules for r in rule["resources"]}
    binding = named(pool_manifests["RoleBinding"], ref["name"])
    assert binding["subjects"][0]["name"] == picker["spec"]["template"]["spec"]["serviceAccountName"]


def test_the_picker_reads_switchyards_metric_names(pool_manifests: dict[str, list[dict]]) -> None:
    picker = named(pool_manifests["Deployment"], "sy-switchyard-epp")
    args = containers_of(picker)[0]["args"]
    config_path = Path(args[args.index("--config-file") + 1])
    config_map = named(pool_manifests["ConfigMap"], "sy-switchyard-epp")
    config = yaml.safe_load(config_map["data"][config_path.name])
    assert config["kind"] == "EndpointPickerConfig"
    plugins = {p["type"]: p.get("parameters", {}) for p in config["plugins"]}
    extractor = plugins["core-metrics-extractor"]
    engine = next(e for e in extractor["engineConfigs"] if e["name"] == extractor["defaultEngine"])
    names = {engine["queuedRequestsSpec"], engine["runningRequestsSpec"], engine["kvUsageSpec"]}
    assert names == {
        "switchyard_num_requests_waiting",
        "switchyard_num_requests_running",
        "switchyard_kv_cache_usage_ratio",
    }
    assert names <= KNOWN_METRICS
    assert plugins["metrics-data-source"]["path"] == "/metrics"
    scorers = {p["pluginRef"] for p in config["schedulingProfiles"][0]["plugins"]}
    assert scorers == {"queue-scorer", "kv-cache-utilization-scorer", "prefix-cache-scorer"} <= plugins.keys()


def test_the_route_sends_the_gateways_traffic_to_the_pool(pool_manifests: dict[str, list[dict]]) -> None:
    route = pool_manifests["HTTPRoute"][0]["spec"]
    assert route["parentRefs"] == [
        {"group": "gateway.networking.k8s.io", "kind": "Gateway", "name": "inference-gateway"}
    ]
    (backend,) = route["rules"][0]["backendRefs"]
    assert (backend["group"], backend["kind"], backend["name"]) == (
        "inference.networking.k8s.io",
        "InferencePool",
        pool_manifests["InferencePool"][0]["metadata"]["name"],
    )


def test_several_pickers_elect_a_leader_and_the_route_can_be_left_out() -> None:
    kinds = render(
        "inferencePool.enabled=true", "inferencePool.endpointPicker.replicas=2", "inferencePool.httpRoute.enabled=false"
    )
    picker = named(kinds["Deployment"], "sy-switchyard-epp")
    assert "--ha-enable-leader-election" in containers_of(picker)[0]["args"]
    assert "leases" in {r for rule in named(kinds["Role"], "sy-switchyard-epp")["rules"] for r in rule["resources"]}
    assert "HTTPRoute" not in kinds
