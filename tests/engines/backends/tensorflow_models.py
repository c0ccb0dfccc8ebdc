"""A small TensorFlow SavedModel made here (seeded weights, no download): FEATURES [-1, 4] FP32 and TAG [-1, 1] BYTES
in, SCORES [-1, 3] (softmax of a dense layer) and ECHO (TAG upper-cased) out, signature `serving_default`."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build() -> Any:
    import tensorflow as tf

    class Scorer(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[1, 2]))
            self.b = tf.Variable(tf.constant([0.1, -0.2, 0.05]))

        @tf.function(input_signature=[tf.TensorSpec([None, 4], tf.float32, name="FEATURES"),
                                      tf.TensorSpec([None, 1], tf.string, name="TAG")])
        def serve(self, FEATURES: Any, TAG: Any) -> dict[str, Any]:  # noqa: N803 - the v2 tensor names
            return {"SCORES": tf.nn.softmax(FEATURES @ self.w + self.b), "ECHO": tf.strings.upper(TAG)}

    return Scorer()


def write(repo: Path, name: str = "tf_scorer", config: str | None = None) -> Any:
    """The SavedModel at <repo>/<name>/1/model.savedmodel with a config (auto-completed unless `config`)."""
    import tensorflow as tf

    module = build()
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    tf.saved_model.save(module, str(folder / "1" / "model.savedmodel"), signatures={"serving_default": module.serve})
    (folder / "config.pbtxt").write_text(config or (
        f'name: "{name}"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 16\n'
        "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"))
    return module
