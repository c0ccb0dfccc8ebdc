"""The `fil` backend (Triton's Forest Inference Library backend) on the CPU: XGBoost, LightGBM, scikit-learn and
Treelite tree ensembles, run by each framework's own predictor so that outputs equal the library's own `predict` /
`predict_proba` (FIL's GPU kernels are not used; `pip install 'switchyard[fil]'` brings the libraries).

Parameters (Triton FIL's names, string values):

* `model_type`: `xgboost` (legacy binary, `xgboost.model`), `xgboost_json` (`xgboost.json`), `xgboost_ubj`
  (`xgboost.ubj`), `lightgbm` (text, `model.txt`), `treelite_checkpoint` (`checkpoint.tl`) or `sklearn_pkl`
  (a pickled scikit-learn estimator, `model.pkl`; only with `allow_pickle: "true"`, because loading a pickle runs
  whatever code it names). `default_model_filename` overrides the file name.
* `output_class`: `true` for classifiers. Then the output is the class index (as a float, FIL's convention), or,
  with `predict_proba: true`, one probability per class (`[1 - p, p]` for a binary model, as `predict_proba`).
* `threshold`: a binary classifier's decision threshold on p (class 1 when p > threshold; default 0.5, which is
  what the libraries' `predict` does).
* `cpu_nthread`: the most threads one prediction uses (default: every CPU the process may use); a call uses one
  thread per 512 rows up to that, since starting threads costs more than a small batch takes. A row's result does
  not depend on the thread count. (scikit-learn estimators keep their own `n_jobs`.)
* FIL's GPU tuning settings (`storage_type`, `algo`, `threads_per_tree`, `blocks_per_sm`, `transfer_threshold`,
  `use_experimental_optimizations`, `layout`, `align_bytes`) and `xgboost_allow_unknown_field` do not change
  outputs and have no meaning for these predictors: accepted and not used.

One input (FIL's `input__0`, FP32 `[num_features]`) and one output (`output__0`); a config may omit them and they
are filled in from the model (Triton's auto-complete). The model needs `max_batch_size > 0`: rows are batched on
the first dimension, so the dynamic batcher hands the predictor one matrix for many requests.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from typing import Any

import numpy as np

from engines.backends.batching import concat_requests, model_file, split_outputs
from engines.interface import TensorBackend
from engines.types import TensorModelSpec, TensorSpec

log = logging.getLogger("switchyard.fil")

#: model_type -> Triton FIL's default file name.
MODEL_FILES = {
    "xgboost": "xgboost.model",
    "xgboost_json": "xgboost.json",
    "xgboost_ubj": "xgboost.ubj",
    "lightgbm": "model.txt",
    "treelite_checkpoint": "checkpoint.tl",
    "sklearn_pkl": "model.pkl",
}
#: FIL settings that tune its GPU kernels or its own parser: no effect on these predictors.
NO_EFFECT = frozenset(
    {
        "storage_type",
        "algo",
        "threads_per_tree",
        "blocks_per_sm",
        "transfer_threshold",
        "use_experimental_optimizations",
        "layout",
        "align_bytes",
        "xgboost_allow_unknown_field",
    }
)
KNOWN = NO_EFFECT | {"model_type", "output_class", "predict_proba", "threshold", "cpu_nthread", "allow_pickle"}

Predict = Callable[[np.ndarray, int], np.ndarray]  # (rows, threads) -> the library's prediction
#: Rows per predictor thread: below this a call runs on one thread, because starting OpenMP threads costs more than
#: a small batch takes (XGBoost, 200 trees, one row: 0.6 ms on one thread, 5 ms on two on a busy 2-core machine).
ROWS_PER_THREAD = 512


def _flag(spec: TensorModelSpec, key: str) -> bool:
    value = spec.parameters.get(key, "false").strip().lower()
    if value not in ("true", "false", "1", "0", "yes", "no"):
        raise ValueError(f'parameter {key!r} must be "true" or "false", not {value[:20]!r}')
    return value in ("true", "1", "yes")


def _as_2d(scores: Any) -> np.ndarray:
    """A predictor's output as [rows, columns] (1-D outputs get one column)."""
    array = np.asarray(scores)
    return array.reshape(array.shape[0], -1)


def _xgboost(path: str) -> tuple[Predict, int]:
    import xgboost

    booster = xgboost.Booster()
    booster.load_model(path)
    current = [0]

    def predict(x: np.ndarray, threads: int) -> np.ndarray:
        if threads != current[0]:
            booster.set_param({"nthread": threads})
            current[0] = threads
        # What XGBClassifier/XGBRegressor.predict* call: in-place prediction with NaN as missing.
        return booster.inplace_predict(x, missing=np.nan, validate_features=False)

    return predict, booster.num_features()


def _lightgbm(path: str) -> tuple[Predict, int]:
    import lightgbm

    booster = lightgbm.Booster(model_file=path)
    return (lambda x, threads: booster.predict(x, num_threads=threads)), booster.num_feature()


def _treelite(path: str) -> tuple[Predict, int]:
    import treelite

    model = treelite.Model.deserialize(path)

    def predict(x: np.ndarray, threads: int) -> np.ndarray:
        out = treelite.gtil.predict(model, x, nthread=threads)  # [rows, targets, classes]
        return out.reshape(out.shape[0], -1)

    return predict, model.num_feature


def _sklearn(path: str) -> tuple[Predict, int]:
    import joblib  # scikit-learn's own loader; reads plain pickles too

    estimator = joblib.load(path)
    if not hasattr(estimator, "predict"):
        raise ValueError(f"the pickle holds a {type(estimator).__name__}, not a scikit-learn estimator")
    features = getattr(estimator, "n_features_in_", None)
    if features is None:
        raise ValueError("the pickled estimator is not fitted (it has no n_features_in_)")
    method = estimator.predict_proba if hasattr(estimator, "predict_proba") else estimator.predict

    # The estimator keeps its own n_jobs: a forest's parallel sum over trees may round differently per thread count.
    return (lambda x, threads: method(x)), int(features)


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


_LOADERS: dict[str, Callable[[str], tuple[Predict, int]]] = {
    "xgboost": _xgboost,
    "xgboost_json": _xgboost,
    "xgboost_ubj": _xgboost,
    "lightgbm": _lightgbm,
    "treelite_checkpoint": _treelite,
    "sklearn_pkl": _sklearn,
}


class ForestBackend(TensorBackend):
    def __init__(self) -> None:
        self._spec: TensorModelSpec | None = None
        self._predict: Predict | None = None
        self._input = "input__0"
        self._output = "output__0"
        self._classify = False
        self._proba = False
        self._threshold = 0.5
        self._dtype: Any = np.float32
        self._max_threads = 1
        self._described: dict[str, Any] = {}

    def load(self, spec: TensorModelSpec) -> None:
        params = spec.parameters
        unknown = sorted(set(params) - KNOWN)
        if unknown:
            log.warning(
                "model '%s': FIL parameter(s) %s are not known to Switchyard and are not used",
                spec.name,
                ", ".join(unknown),
            )
        model_type = params.get("model_type", "").strip()
        if model_type not in MODEL_FILES:
            raise ValueError(
                f"the fil backend needs parameter model_type, one of {', '.join(MODEL_FILES)}"
                f"{f' (got {model_type[:40]!r})' if model_type else ''}"
            )
        if model_type == "sklearn_pkl" and not _flag(spec, "allow_pickle"):
            raise ValueError(
                "model_type sklearn_pkl loads a Python pickle, which runs any code it names: set "
                'parameter allow_pickle to "true" only for a file you trust, or export the model to '
                "Treelite (treelite.sklearn.import_model(...).serialize('checkpoint.tl')) and use "
                "treelite_checkpoint"
            )
        if spec.max_batch_size <= 0:
            raise ValueError("the fil backend needs max_batch_size > 0 (rows are batched on the first dimension)")
        if len(spec.inputs) > 1 or len(spec.outputs) > 1:
            raise ValueError("the fil backend takes one input (input__0) and one output (output__0)")
        self._classify = _flag(spec, "output_class")
        self._proba = _flag(spec, "predict_proba")
        if self._proba and not self._classify:
            raise ValueError('predict_proba needs output_class "true" (it is for classifiers)')
        try:
            self._threshold = float(params.get("threshold", "0.5"))
            threads = int(params.get("cpu_nthread", "-1"))
        except ValueError:
            raise ValueError("parameters threshold (a number) and cpu_nthread (an integer) must be numbers") from None
        self._max_threads = threads if threads > 0 else _cpus()
        path = model_file(spec, MODEL_FILES[model_type])
        try:
            self._predict, features = _LOADERS[model_type](path)
        except ImportError as exc:
            raise ValueError(
                f"model_type {model_type} needs the Python package '{exc.name}'; "
                "install it with pip install 'switchyard[fil]'"
            ) from None
        except Exception as exc:  # the libraries raise their own error types for a bad file
            hint = (
                " (XGBoost 3.1 and later no longer read the legacy binary format: re-save the model with "
                "save_model('xgboost.json') and use model_type xgboost_json)"
                if model_type == "xgboost"
                else ""
            )
            raise ValueError(
                f"'{spec.name}/{spec.version}': {model_type} could not load {path.rsplit('/', 1)[-1]}"
                f"{hint}: {str(exc)[:300]}"
            ) from None
        self._spec = spec
        declared = spec.inputs[0] if spec.inputs else None
        if declared is not None:
            self._input = declared.name
            if declared.dims not in ([features], [-1]):
                raise ValueError(
                    f"input '{declared.name}' has dims {declared.dims}, but the model takes {features} "
                    f"features: set dims: [ {features} ]"
                )
            if declared.datatype not in ("FP32", "FP64"):
                raise ValueError(f"input '{declared.name}' must be TYPE_FP32 (or TYPE_FP64), not {declared.datatype}")
        if spec.outputs:
            self._output = spec.outputs[0].name
            if spec.outputs[0].datatype not in ("FP32", "FP64"):
                raise ValueError(
                    f"output '{self._output}' must be TYPE_FP32 (or TYPE_FP64), not {spec.outputs[0].datatype}"
                )
            self._dtype = np.float64 if spec.outputs[0].datatype == "FP64" else np.float32
        width = self._run(np.zeros((1, features), dtype=np.float32)).shape[1]
        if spec.outputs and spec.outputs[0].dims not in ([width], [-1]):
            raise ValueError(
                f"output '{self._output}' has dims {spec.outputs[0].dims}, but this model gives {width} "
                f"value(s) per row with these parameters: set dims: [ {width} ]"
            )
        self._described = {
            "inputs": [TensorSpec(self._input, declared.datatype if declared else "FP32", [features])],
            "outputs": [TensorSpec(self._output, spec.outputs[0].datatype if spec.outputs else "FP32", [width])],
        }

    def _run(self, features: np.ndarray) -> np.ndarray:
        """The library's prediction for a matrix of rows, shaped as the output: [rows, columns]."""
        assert self._predict is not None
        threads = max(1, min(self._max_threads, len(features) // ROWS_PER_THREAD))
        scores = _as_2d(self._predict(features, threads))
        if not self._classify:
            return scores
        # One column = the positive class's probability of a binary model; predict_proba gives both columns.
        proba = np.hstack([1 - scores, scores]) if scores.shape[1] == 1 else scores
        if self._proba:
            return proba
        if proba.shape[1] == 2:
            return (proba[:, 1:] > self._threshold).astype(np.float32)
        return np.argmax(proba, axis=1).astype(np.float32)[:, None]

    def describe(self) -> dict[str, Any]:
        return self._described

    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        assert self._spec is not None
        batch, sizes = concat_requests(self._spec, requests)
        result = self._run(batch[self._input]).astype(self._dtype, copy=False)  # the library's values, as declared
        return split_outputs(self._spec, {self._output: result}, sizes)

    def unload(self) -> None:
        self._predict = None
