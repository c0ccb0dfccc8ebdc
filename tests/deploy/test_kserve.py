"""deploy/kserve/: the Switchyard ServingRuntime / ClusterServingRuntime and the InferenceService examples,
validated offline against KServe v0.20.0's CRD schemas (vendored in tests/deploy/crds/) and for what KServe
relies on: the runtime's command is one `switchyard serve` accepts, reading the repository KServe mounts at
/mnt/models and serving on the container port KServe routes to; the examples select that runtime and protocol."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway.cli import build_parser, read_settings
from gateway.config import build_config
from tests.deploy.crd_schemas import validate
from tests.deploy.test_deployment_files import LIVE_PATH, READY_PATH, dockerfile_instructions, load_yaml

ROOT = Path(__file__).resolve().parents[2]
KSERVE = ROOT / "deploy" / "kserve"
MOUNT = "/mnt/models"  # where KServe's storage initializer puts storageUri


def docs() -> dict[str, dict]:
    out = {}
    for path in sorted(KSERVE.glob("*.yaml")):
        (doc,) = [d for d in yaml.safe_load_all(path.read_text(encoding="utf-8")) if d]
        out[path.name] = doc
    return out


@pytest.mark.parametrize("name", sorted(p.name for p in KSERVE.glob("*.yaml")))
def test_matches_the_released_crd_schema(name: str) -> None:
    validate(docs()[name])


def test_the_runtime_runs_switchyard_on_kserves_port_and_mount() -> None:
    runtime = docs()["clusterservingruntime.yaml"]["spec"]
    (container,) = runtime["containers"]
    assert container["name"] == "kserve-container"
    argv = container["args"]
    assert argv[:2] == ["switchyard", "serve"]
    # The image has no ENTRYPOINT, so args replace its CMD whole.
    assert not [i for i, _ in dockerfile_instructions(ROOT / "deploy" / "docker" / "Dockerfile") if i == "ENTRYPOINT"]
    sources, values = read_settings(build_parser().parse_args(argv[1:]), {})  # the real CLI accepts every flag
    args = build_config(sources, **values)
    assert str(args.model_repository) == MOUNT and args.host == "0.0.0.0"
    assert [p["containerPort"] for p in container["ports"]] == [args.http_port]
    probe = container["readinessProbe"]["httpGet"]
    assert probe["port"] == args.http_port and probe["path"] in (READY_PATH, LIVE_PATH)
    assert runtime["annotations"]["prometheus.kserve.io/port"] == str(args.http_port)
    # A read-only root file system needs the weight cache on a volume.
    cache = next(e["value"] for e in container["env"] if e["name"] == "SWITCHYARD_CACHE_DIR")
    assert cache in {m["mountPath"] for m in container["volumeMounts"]}
    assert {m["name"] for m in container["volumeMounts"]} <= {v["name"] for v in runtime["volumes"]}
    values = load_yaml(ROOT / "deploy" / "helm" / "switchyard" / "values.yaml")["image"]
    assert container["image"] == f"{values['repository']}:{values['tag']}"


def test_the_namespaced_runtime_is_the_cluster_runtime() -> None:
    both = docs()
    assert both["servingruntime.yaml"]["kind"] == "ServingRuntime"
    assert both["servingruntime.yaml"]["spec"] == both["clusterservingruntime.yaml"]["spec"]
    assert both["servingruntime.yaml"]["metadata"] == both["clusterservingruntime.yaml"]["metadata"]


@pytest.mark.parametrize(
    ("name", "protocol"), [("inferenceservice-llm.yaml", None), ("inferenceservice-v2-tensor.yaml", "v2")]
)
def test_the_examples_select_the_runtime(name: str, protocol: str | None) -> None:
    runtime = docs()["clusterservingruntime.yaml"]
    model = docs()[name]["spec"]["predictor"]["model"]
    assert model["runtime"] == runtime["metadata"]["name"]
    assert model["modelFormat"]["name"] in {f["name"] for f in runtime["spec"]["supportedModelFormats"]}
    assert model.get("protocolVersion") == protocol
    if protocol:
        assert protocol in runtime["spec"]["protocolVersions"]
    assert model["storageUri"].startswith(("pvc://", "s3://", "gs://", "oci://", "https://"))
