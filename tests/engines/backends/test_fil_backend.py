"""The fil backend on the CPU: each model_type loads from its Triton layout and gives exactly what the framework's
own predict / predict_proba give, batched or not; the config is auto-completed; pickles need an opt-in."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("xgboost")
pytest.importorskip("lightgbm")
pytest.importorskip("sklearn")
pytest.importorskip("treelite")

from gateway.errors import ConfigError  # noqa: E402
from gateway.repository.layout import find_model_dir  # noqa: E402
from gateway.repository.model_config import parse_model_config  # noqa: E402
from gateway.tensor.model import TensorModel  # noqa: E402
from tests.engines.backends import forest_models as fm  # noqa: E402

X, _, _ = fm.data(rows=300, seed=1)


def load(repo: Path, name: str) -> TensorModel:
    model_dir = find_model_dir(repo, name)
    assert model_dir is not None
    model = TensorModel(model_dir, parse_model_config(model_dir.config_path, name))  # type: ignore[arg-type]
    model.load()
    return model


def run(model: TensorModel, x: np.ndarray) -> np.ndarray:
    """One backend call over all rows, and the same rows as single-row requests batched together."""
    instance = model.versions[1].instances[0]
    whole = instance.execute([{"input__0": x}])[0]["output__0"]
    split = instance.execute([{"input__0": x[i : i + 1]} for i in range(len(x))])
    assert np.array_equal(np.vstack([s["output__0"] for s in split]), whole)  # batching changes no bit
    return whole


@pytest.mark.parametrize("fmt", ["json", "ubj", "model"])
def test_xgboost_binary_classifier(tmp_path: Path, fmt: str) -> None:
    clf = fm.write_xgboost(tmp_path, "proba", fmt, predict_proba=True, width=2)
    assert np.array_equal(run(load(tmp_path, "proba"), X), clf.predict_proba(X))
    fm.write_xgboost(tmp_path, "label", fmt)
    assert np.array_equal(run(load(tmp_path, "label"), X).ravel(), clf.predict(X).astype(np.float32))


def test_threshold_moves_the_decision(tmp_path: Path) -> None:
    clf = fm.write_xgboost(tmp_path, "strict", extra={"threshold": "0.8"})
    p = clf.predict_proba(X)[:, 1]
    assert np.array_equal(run(load(tmp_path, "strict"), X).ravel(), (p > 0.8).astype(np.float32))
    assert 0 < (p > 0.8).sum() < (p > 0.5).sum()


def test_lightgbm_multiclass(tmp_path: Path) -> None:
    clf = fm.write_lightgbm(tmp_path, "lgb_proba", predict_proba=True, width=3)
    assert np.array_equal(run(load(tmp_path, "lgb_proba"), X), clf.predict_proba(X).astype(np.float32))
    fm.write_lightgbm(tmp_path, "lgb_label")
    assert np.array_equal(run(load(tmp_path, "lgb_label"), X).ravel(), clf.predict(X).astype(np.float32))


def test_sklearn_pickle_needs_opt_in(tmp_path: Path) -> None:
    reg = fm.write_sklearn(tmp_path, "skl", allow_pickle=True)
    assert np.array_equal(run(load(tmp_path, "skl"), X).ravel(), reg.predict(X).astype(np.float32))
    fm.write_sklearn(tmp_path, "skl_closed", allow_pickle=False)
    with pytest.raises(ConfigError, match="allow_pickle"):
        load(tmp_path, "skl_closed")


def test_treelite_checkpoint(tmp_path: Path) -> None:
    import treelite

    tl = fm.write_treelite(tmp_path, "tl", predict_proba=True, width=2)
    expected = treelite.gtil.predict(tl, X).reshape(len(X), -1)
    assert np.array_equal(run(load(tmp_path, "tl"), X), expected.astype(np.float32))


def test_config_is_completed_from_the_model(tmp_path: Path) -> None:
    fm.write_lightgbm(tmp_path, "bare", predict_proba=True, declare=False)
    model = load(tmp_path, "bare")
    meta = model.metadata()
    assert meta["inputs"] == [{"name": "input__0", "datatype": "FP32", "shape": [-1, fm.FEATURES]}]
    assert meta["outputs"] == [{"name": "output__0", "datatype": "FP32", "shape": [-1, 3]}]


def test_dynamic_batcher_batches_rows(tmp_path: Path) -> None:
    clf = fm.write_xgboost(tmp_path, "batched", predict_proba=True, width=2)
    model = load(tmp_path, "batched")

    async def main() -> list:
        await model.start()
        try:
            batcher = model.versions[1].batcher
            return await asyncio.gather(*(batcher.infer({"input__0": X[i : i + 1]}) for i in range(64)))
        finally:
            await model.stop()

    results = asyncio.run(main())
    assert np.array_equal(np.vstack([r["output__0"] for r in results]), clf.predict_proba(X[:64]))
    assert model.versions[1].stats.execution_count < 64  # requests shared backend calls


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            'backend: "fil" max_batch_size: 8 parameters { key: "model_type" value: { string_value: "catboost" } }',
            "model_type",
        ),
        (
            'backend: "fil" max_batch_size: 8 parameters { key: "model_type" value: { string_value: "xgboost_json" } }',
            "xgboost.json",
        ),
        (
            'backend: "fil" max_batch_size: 0 parameters { key: "model_type" value: { string_value: "xgboost_json" } }',
            "max_batch_size",
        ),
    ],
)
def test_bad_configs_say_what_to_fix(tmp_path: Path, config: str, message: str) -> None:
    (tmp_path / "bad" / "1").mkdir(parents=True)
    (tmp_path / "bad" / "config.pbtxt").write_text(config)
    with pytest.raises(ConfigError, match=message):
        load(tmp_path, "bad")


def test_wrong_feature_count_is_refused(tmp_path: Path) -> None:
    fm.write_xgboost(tmp_path, "narrow")
    path = tmp_path / "narrow" / "config.pbtxt"
    path.write_text(path.read_text().replace(f"dims: [ {fm.FEATURES} ]", "dims: [ 3 ]"))
    with pytest.raises(ConfigError, match=f"set dims: \\[ {fm.FEATURES} \\]"):
        load(tmp_path, "narrow")


def test_corrupt_model_file_names_the_file(tmp_path: Path) -> None:
    fm.write_xgboost(tmp_path, "broken", "model")
    (tmp_path / "broken" / "1" / "xgboost.model").write_bytes(b"\x00not a model")
    with pytest.raises(ConfigError, match=r"could not load xgboost\.model .*legacy binary"):
        load(tmp_path, "broken")


async def test_a_load_request_cannot_turn_pickles_on(tmp_path: Path) -> None:
    from gateway.errors import InvalidRequestError
    from gateway.repository.model_control import ModelControl

    fm.write_sklearn(tmp_path, "skl_closed", allow_pickle=False)
    registry = ModelControl(tmp_path, control_mode="explicit")
    registry.prepare()
    override = {
        "backend": "fil",
        "max_batch_size": 8,
        "parameters": {"model_type": "sklearn_pkl", "allow_pickle": "true"},
    }
    with pytest.raises(InvalidRequestError, match="may not change parameter 'allow_pickle'"):
        await registry.load("skl_closed", override)
    assert registry.models.all_models() == []
    await registry.close()


def test_large_batches_use_threads_and_change_no_bit(tmp_path: Path) -> None:
    big, _, _ = fm.data(rows=3000, seed=7)
    clf = fm.write_xgboost(tmp_path, "xgb_big", predict_proba=True, width=2, extra={"cpu_nthread": "2"})
    lgb = fm.write_lightgbm(tmp_path, "lgb_big", predict_proba=True, width=3, extra={"cpu_nthread": "2"})
    for name, expected in (("xgb_big", clf.predict_proba(big)), ("lgb_big", lgb.predict_proba(big))):
        instance = load(tmp_path, name).versions[1].instances[0]
        assert np.array_equal(instance.execute([{"input__0": big}])[0]["output__0"], expected.astype(np.float32))
