"""Writes a small TensorFlow SavedModel (seeded weights, nothing downloaded) into this model folder, so the folder
can be served as a Triton `tensorflow_savedmodel` model:

    pip install 'switchyard[tensorflow]'
    python examples/tensorflow_scorer/make_model.py    # writes examples/tensorflow_scorer/1/model.savedmodel
    mkdir -p my_repository && cp -r examples/tensorflow_scorer my_repository/
    switchyard serve --model-repository my_repository

Signature `serving_default`: FEATURES [-1, 4] FP32 and TAG [-1, 1] BYTES in; SCORES [-1, 3] (softmax of a dense
layer) and ECHO (TAG upper-cased) out. config.pbtxt names only the platform: inputs, outputs and max_batch_size are
filled in from the signature (Triton's auto-complete).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any


def build() -> Any:
    """The model as a tf.Module with its serving function `serve`."""
    import tensorflow as tf

    class Scorer(tf.Module):
        def __init__(self) -> None:
            super().__init__()
            self.w = tf.Variable(tf.random.stateless_normal([4, 3], seed=[1, 2]))
            self.b = tf.Variable(tf.constant([0.1, -0.2, 0.05]))

        @tf.function(
            input_signature=[
                tf.TensorSpec([None, 4], tf.float32, name="FEATURES"),
                tf.TensorSpec([None, 1], tf.string, name="TAG"),
            ]
        )
        def serve(self, FEATURES: Any, TAG: Any) -> dict[str, Any]:  # noqa: N803 - the v2 tensor names
            return {"SCORES": tf.nn.softmax(FEATURES @ self.w + self.b), "ECHO": tf.strings.upper(TAG)}

    return Scorer()


def save(module: Any, version_dir: Path) -> None:
    import tensorflow as tf

    tf.saved_model.save(module, str(version_dir / "model.savedmodel"), signatures={"serving_default": module.serve})


def main() -> None:
    folder = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parent
    (folder / "1").mkdir(parents=True, exist_ok=True)
    save(build(), folder / "1")
    print(f"wrote {folder / '1' / 'model.savedmodel'}")


if __name__ == "__main__":
    main()
