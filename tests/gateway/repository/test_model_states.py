"""Model folder states and the reasons a failed load gives the network (`gateway/repository/model_states.py`)."""

from __future__ import annotations

import struct
from pathlib import Path

from gateway.errors import ConfigError
from gateway.repository.model_states import MAX_REASON_CHARS, ModelStates
from gateway.repository.registry import ModelRegistry


def states(tmp_path: Path) -> ModelStates:
    return ModelStates(tmp_path / "repo", ModelRegistry())


def test_a_reason_is_the_failure_on_one_line_with_relative_paths(tmp_path: Path) -> None:
    s = states(tmp_path)
    root = (tmp_path / "repo").resolve()
    config = ConfigError(f"{root}/llm/config.yaml: field 'dtype': 'float8' is not one of float32, bfloat16")
    assert s.reason(config) == "llm/config.yaml: field 'dtype': 'float8' is not one of float32, bfloat16"
    crash = ValueError(f"cannot reshape tensor 'blk.0.attn_q.weight' of\n  {root}/llm/model.gguf: truncated")
    assert s.reason(crash) == "ValueError: cannot reshape tensor 'blk.0.attn_q.weight' of llm/model.gguf: truncated"
    try:
        struct.unpack_from("<Q", b"\0\0")
    except struct.error as exc:
        assert s.reason(exc).startswith("struct.error: unpack_from requires a buffer")  # a library's own type
    assert s.reason(KeyError()) == "KeyError"  # no message: the type still says something
    assert len(s.reason(RuntimeError("x" * 5000))) == MAX_REASON_CHARS


def test_a_failed_load_keeps_a_serving_copy_ready(tmp_path: Path) -> None:
    s = states(tmp_path)
    assert s.failed("new", False, OSError("disk full")) == "OSError: disk full"
    assert (s.get("new").state, s.get("new").reason) == ("UNAVAILABLE", "OSError: disk full")
    s.failed("old", True, ConfigError("bad field"))
    assert (s.get("old").state, s.get("old").reason) == ("READY", "reload failed, serving the previous copy: bad field")
    assert s.get("never").state == ""
