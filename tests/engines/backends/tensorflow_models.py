"""The example SavedModel (examples/tensorflow_scorer) written into a test repository, with a config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from examples.tensorflow_scorer.make_model import build, save


def write(repo: Path, name: str = "tf_scorer", config: str | None = None) -> Any:
    """The SavedModel at <repo>/<name>/1/model.savedmodel (config: max_batch_size 16 and the dynamic batcher unless
    given); returns the tf.Module, whose `serve` gives the expected outputs."""
    module = build()
    folder = repo / name
    (folder / "1").mkdir(parents=True, exist_ok=True)
    save(module, folder / "1")
    (folder / "config.pbtxt").write_text(
        config
        or (
            f'name: "{name}"\nplatform: "tensorflow_savedmodel"\nmax_batch_size: 16\n'
            "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
        )
    )
    return module
