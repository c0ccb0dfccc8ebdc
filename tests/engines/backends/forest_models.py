"""Small tree ensembles trained on synthetic data (seeded), written in each format the fil backend reads, with the
config Triton's FIL backend takes. Used by the fil tests and bench/forest_bench.py; nothing is downloaded."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np

FEATURES = 8


def data(rows: int = 2000, seed: int = 0) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Features (float32), a binary label, a 3-class label."""
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, FEATURES)).astype(np.float32)
    score = x[:, 0] * 1.5 - x[:, 1] + 0.5 * x[:, 2] * x[:, 3] + rng.normal(scale=0.3, size=rows)
    return x, (score > 0).astype(np.int64), np.digitize(score, [-1.0, 1.0])


def config(
    name: str,
    model_type: str,
    *,
    output_class: bool,
    predict_proba: bool = False,
    width: int = 1,
    max_batch_size: int = 4096,
    dynamic: bool = True,
    extra: dict[str, str] | None = None,
    declare: bool = True,
) -> str:
    params = {
        "model_type": model_type,
        "output_class": str(output_class).lower(),
        "predict_proba": str(predict_proba).lower(),
        **(extra or {}),
    }
    lines = [f'name: "{name}"', 'backend: "fil"', f"max_batch_size: {max_batch_size}"]
    if declare:
        lines += [
            f'input [ {{ name: "input__0" data_type: TYPE_FP32 dims: [ {FEATURES} ] }} ]',
            f'output [ {{ name: "output__0" data_type: TYPE_FP32 dims: [ {width} ] }} ]',
        ]
    entries = [f'  {{ key: "{k}" value: {{ string_value: "{v}" }} }}' for k, v in params.items()]
    lines += ["parameters [", ",\n".join(entries), "]", "instance_group [ { count: 1 kind: KIND_CPU } ]"]
    if dynamic:
        lines.append("dynamic_batching { max_queue_delay_microseconds: 2000 }")
    return "\n".join(lines) + "\n"


def _folder(repo: Path, name: str) -> Path:
    (repo / name / "1").mkdir(parents=True, exist_ok=True)
    return repo / name


def write_xgboost(repo: Path, name: str = "xgb_binary", fmt: str = "json", **kw: Any) -> Any:
    """A binary XGBClassifier saved as xgboost.json / .ubj / .model (model_type xgboost: what XGBoost 3 writes
    there is UBJSON; it reads no legacy binary any more); returns the fitted classifier."""
    import xgboost

    x, y, _ = data()
    model = xgboost.XGBClassifier(n_estimators=30, max_depth=4, learning_rate=0.3, random_state=0, n_jobs=1)
    model.fit(x, y)
    folder = _folder(repo, name)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Unknown file format: model" for the legacy name
        model.get_booster().save_model(str(folder / "1" / f"xgboost.{fmt}"))
    model_type = "xgboost" if fmt == "model" else f"xgboost_{fmt}"
    (folder / "config.pbtxt").write_text(config(name, model_type, **{"output_class": True, **kw}))
    return model


def write_lightgbm(repo: Path, name: str = "lgbm_multiclass", **kw: Any) -> Any:
    """A 3-class LGBMClassifier saved as model.txt; returns the fitted classifier."""
    import lightgbm

    x, _, y3 = data()
    model = lightgbm.LGBMClassifier(n_estimators=20, num_leaves=15, random_state=0, n_jobs=1, verbose=-1)
    model.fit(x, y3)
    folder = _folder(repo, name)
    model.booster_.save_model(str(folder / "1" / "model.txt"))
    (folder / "config.pbtxt").write_text(config(name, "lightgbm", **{"output_class": True, **kw}))
    return model


def write_sklearn(repo: Path, name: str = "skl_regressor", allow_pickle: bool = True, **kw: Any) -> Any:
    """A RandomForestRegressor pickled with joblib as model.pkl; returns it."""
    import joblib
    from sklearn.ensemble import RandomForestRegressor

    x, y, _ = data()
    model = RandomForestRegressor(n_estimators=15, max_depth=6, random_state=0, n_jobs=1).fit(x, x[:, 0] * 2 + y)
    folder = _folder(repo, name)
    joblib.dump(model, folder / "1" / "model.pkl")
    extra = {"allow_pickle": "true"} if allow_pickle else {}
    (folder / "config.pbtxt").write_text(config(name, "sklearn_pkl", **{"output_class": False, "extra": extra, **kw}))
    return model


def write_treelite(repo: Path, name: str = "tl_forest", **kw: Any) -> Any:
    """A RandomForestClassifier converted to a Treelite checkpoint (checkpoint.tl); returns the Treelite model."""
    import treelite
    from sklearn.ensemble import RandomForestClassifier

    x, y, _ = data()
    forest = RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0, n_jobs=1).fit(x, y)
    model = treelite.sklearn.import_model(forest)
    folder = _folder(repo, name)
    model.serialize(str(folder / "1" / "checkpoint.tl"))
    (folder / "config.pbtxt").write_text(config(name, "treelite_checkpoint", **{"output_class": True, **kw}))
    return model
