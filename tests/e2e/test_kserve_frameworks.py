"""tritonclient (HTTP and gRPC) against a real server over a repository with a forest model of each kind, a
TensorFlow SavedModel (when TensorFlow is installed) and two models sharing a rate limiter resource."""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.conftest import ServerProcess, free_port

pytest.importorskip("xgboost")
pytest.importorskip("lightgbm")
pytest.importorskip("treelite")
from tests.engines.backends import forest_models as fm  # noqa: E402

HAS_TF = importlib.util.find_spec("tensorflow") is not None
X, _, _ = fm.data(rows=64, seed=3)

SLEEPER = """
import time

import numpy as np


class TritonPythonModel:
    def execute(self, requests):
        out = []
        for r in requests:
            start = time.monotonic()
            time.sleep(0.03)
            out.append({"SPAN": np.array([start, time.monotonic()], dtype=np.float64)})
        return out
"""


def _limited(repo: Path, name: str, priority: int) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "1" / "model.py").write_text(SLEEPER)
    (repo / name / "config.pbtxt").write_text(
        f'backend: "python"\nmax_batch_size: 0\n'
        'input [ { name: "X" data_type: TYPE_INT32 dims: [ 1 ] } ]\n'
        'output [ { name: "SPAN" data_type: TYPE_FP64 dims: [ 2 ] } ]\n'
        f'instance_group [ {{ count: 1 kind: KIND_CPU rate_limiter {{ resources [ {{ name: "R" global: true '
        f"count: 1 }} ] priority: {priority} }} }} ]\n"
    )


@pytest.fixture(scope="module")
def frameworks(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, dict]]:
    repo = tmp_path_factory.mktemp("frameworks")
    models = {
        "xgb": fm.write_xgboost(repo, "xgb", "ubj", predict_proba=True, width=2),
        "lgbm": fm.write_lightgbm(repo, "lgbm"),
        "skl": fm.write_sklearn(repo, "skl"),
        "tl": fm.write_treelite(repo, "tl", predict_proba=True, width=2),
    }
    if HAS_TF:
        from tests.engines.backends import tensorflow_models

        models["tf"] = tensorflow_models.write(repo, "tf")
    _limited(repo, "limited_fast", 1)
    _limited(repo, "limited_slow", 2)
    grpc_port = free_port()
    proc = ServerProcess(repo, "--grpc-port", str(grpc_port), "--rate-limit", "execution_count")
    proc.grpc_port = grpc_port  # type: ignore[attr-defined]
    try:
        yield proc, models
    finally:
        proc.stop()


def _expected(models: dict, name: str) -> np.ndarray:
    import treelite

    if name == "xgb":
        return models["xgb"].predict_proba(X)
    if name == "lgbm":
        return models["lgbm"].predict(X).astype(np.float32)[:, None]
    if name == "skl":
        return models["skl"].predict(X).astype(np.float32)[:, None]
    return treelite.gtil.predict(models["tl"], X).reshape(len(X), -1).astype(np.float32)


@pytest.mark.parametrize("name", ["xgb", "lgbm", "skl", "tl"])
def test_forests_equal_the_framework_over_http_and_grpc(frameworks: tuple[ServerProcess, dict], name: str) -> None:
    server, models = frameworks
    expected = _expected(models, name)
    http = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")  # type: ignore[attr-defined]
    try:
        for module, client in ((httpclient, http), (grpcclient, grpc)):
            tensor = module.InferInput("input__0", list(X.shape), "FP32")
            tensor.set_data_from_numpy(X)
            got = client.infer(name, [tensor]).as_numpy("output__0")
            assert got.dtype == np.float32 and np.array_equal(got, expected), module.__name__
        assert http.get_model_metadata(name)["platform"] == "fil"
    finally:
        http.close()
        grpc.close()


@pytest.mark.tensorflow
@pytest.mark.skipif(not HAS_TF, reason="needs tensorflow-cpu (pip install 'switchyard[tensorflow]')")
def test_savedmodel_over_http_and_grpc(frameworks: tuple[ServerProcess, dict]) -> None:
    import tensorflow as tf

    server, models = frameworks
    tags = np.array([[b"a"], [b"b"]], dtype=object)
    features = X[:2, :4].copy()
    expected = models["tf"].serve(FEATURES=tf.constant(features), TAG=tf.constant(tags))["SCORES"].numpy()
    http = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"))
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")  # type: ignore[attr-defined]
    try:
        for module, client in ((httpclient, http), (grpcclient, grpc)):
            a = module.InferInput("FEATURES", [2, 4], "FP32")
            a.set_data_from_numpy(features)
            b = module.InferInput("TAG", [2, 1], "BYTES")
            b.set_data_from_numpy(tags)
            result = client.infer("tf", [a, b])
            np.testing.assert_allclose(result.as_numpy("SCORES"), expected, rtol=1e-5, atol=1e-6)
            assert result.as_numpy("ECHO").ravel().tolist() == [b"A", b"B"]
        assert http.get_model_metadata("tf")["platform"] == "tensorflow_savedmodel"
    finally:
        http.close()
        grpc.close()


def test_rate_limiter_shares_a_resource_by_priority(frameworks: tuple[ServerProcess, dict]) -> None:
    """24 requests to each model at once: never two executions together, the priority-1 model gets about two of
    every three turns while both wait, and every request succeeds."""
    server, _ = frameworks
    client = httpclient.InferenceServerClient(server.base_url.removeprefix("http://"), concurrency=48)
    try:
        pending = []
        for i in range(24):
            for name in ("limited_fast", "limited_slow"):
                x = httpclient.InferInput("X", [1], "INT32")
                x.set_data_from_numpy(np.array([i], dtype=np.int32))
                pending.append((name, client.async_infer(name, [x])))
        spans = sorted((tuple(req.get_result().as_numpy("SPAN")), name) for name, req in pending)
    finally:
        client.close()
    assert len(spans) == 48  # no request failed
    for (earlier, _), (later, _) in zip(spans, spans[1:], strict=False):
        assert later[0] >= earlier[1] - 1e-6, "two executions held the resource together"
    contended = [name for _, name in spans[:30]]
    assert 17 <= contended.count("limited_fast") <= 23, contended
    waited = [
        line
        for line in httpx.get(f"{server.base_url}/metrics").text.splitlines()
        if line.startswith('switchyard_rate_limiter_wait_duration_us_total{model="limited_slow"')
    ]
    assert waited and float(waited[0].split()[-1]) > 0
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")  # type: ignore[attr-defined]
    try:
        limiter = grpc.get_model_config("limited_slow").config.instance_group[0].rate_limiter
        assert (
            limiter.priority,
            limiter.resources[0].name,
            getattr(limiter.resources[0], "global"),
            limiter.resources[0].count,
        ) == (2, "R", True, 1)
    finally:
        grpc.close()
