"""Reading LoRA adapters (engines/pytorch/lora_weights.py): PEFT folders and GGUF LoRA files into per-layer pairs with
PEFT's and llama.cpp's scales, and the refusals that name the fix."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import save_file

from engines.interface import ModelFileError
from engines.pytorch.lora_weights import read_adapter

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTER = 16, 4, 2, 4, 24
SHAPES = [
    {
        "q_proj": (HEADS * HEAD_DIM, HIDDEN),
        "k_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "v_proj": (KV_HEADS * HEAD_DIM, HIDDEN),
        "o_proj": (HIDDEN, HEADS * HEAD_DIM),
        "gate_proj": (INTER, HIDDEN),
        "up_proj": (INTER, HIDDEN),
        "down_proj": (HIDDEN, INTER),
    }
] * 2
CONFIG = {"num_attention_heads": HEADS, "num_key_value_heads": KV_HEADS}


def _key(layer: int, module: str, half: str) -> str:
    block = "mlp" if module in ("gate_proj", "up_proj", "down_proj") else "self_attn"
    return f"base_model.model.model.layers.{layer}.{block}.{module}.lora_{half}.weight"


def _peft_folder(
    path: Path,
    modules: dict[tuple[int, str], int],
    config: dict | None = None,
    extra: dict[str, torch.Tensor] | None = None,
) -> dict[str, torch.Tensor]:
    """A PEFT adapter folder as `save_pretrained` writes it: (layer, module) -> rank."""
    gen = torch.Generator().manual_seed(0)
    tensors = {}
    for (layer, module), r in modules.items():
        out_features, in_features = SHAPES[layer][module]
        tensors[_key(layer, module, "A")] = torch.randn(r, in_features, generator=gen)
        tensors[_key(layer, module, "B")] = torch.randn(out_features, r, generator=gen)
    tensors.update(extra or {})
    path.mkdir()
    save_file(tensors, path / "adapter_model.safetensors")
    (path / "adapter_config.json").write_text(
        json.dumps({"peft_type": "LORA", "r": 8, "lora_alpha": 16, "bias": "none", **(config or {})})
    )
    return tensors


def test_peft_pairs_and_scales(tmp_path: Path) -> None:
    tensors = _peft_folder(
        tmp_path / "a", {(0, "q_proj"): 8, (1, "down_proj"): 8, (1, "v_proj"): 4}, {"alpha_pattern": {"v_proj": 2}}
    )
    adapter = read_adapter(tmp_path / "a", SHAPES, torch.float32, CONFIG)
    assert set(adapter.layers[0]) == {"q_proj"} and set(adapter.layers[1]) == {"down_proj", "v_proj"}
    assert torch.equal(adapter.layers[0]["q_proj"].a, tensors[_key(0, "q_proj", "A")])
    assert torch.equal(adapter.layers[1]["down_proj"].b, tensors[_key(1, "down_proj", "B")])
    assert adapter.layers[0]["q_proj"].scale == 16 / 8
    assert adapter.layers[1]["v_proj"].scale == 2 / 4  # alpha_pattern, r from the tensors (rank_pattern's)
    assert adapter.rank == 8
    _peft_folder(tmp_path / "rs", {(0, "o_proj"): 4}, {"use_rslora": True})
    assert read_adapter(tmp_path / "rs", SHAPES, torch.float32, CONFIG).layers[0]["o_proj"].scale == 16 / math.sqrt(4)
    assert read_adapter(tmp_path / "rs", SHAPES, torch.bfloat16, CONFIG).layers[0]["o_proj"].a.dtype == torch.bfloat16


@pytest.mark.parametrize(
    ("config", "extra", "says"),
    [
        ({"use_dora": True}, None, "DoRA"),
        ({"bias": "lora_only"}, None, "biases"),
        ({"modules_to_save": ["lm_head"]}, None, "modules saved whole"),
        ({"peft_type": "IA3"}, None, "only LoRA"),
        (None, {"base_model.model.lm_head.lora_A.weight": torch.zeros(8, HIDDEN)}, "lm_head"),
        (None, {_key(0, "k_proj", "A"): torch.zeros(8, HIDDEN)}, "lora_A but not the other half"),
        (None, {_key(0, "k_proj", "B"): torch.zeros(8, 8)}, "lora_B but not the other half"),
        (
            None,
            {_key(0, "k_proj", "A"): torch.zeros(8, HIDDEN + 1), _key(0, "k_proj", "B"): torch.zeros(8, 8)},
            "another base model",
        ),
        (None, {_key(5, "k_proj", "A"): torch.zeros(8, HIDDEN), _key(5, "k_proj", "B"): torch.zeros(8, 8)}, "layer 5"),
    ],
)
def test_peft_refusals_name_the_fix(tmp_path: Path, config: dict | None, extra: dict | None, says: str) -> None:
    _peft_folder(tmp_path / "a", {(0, "q_proj"): 8}, config, extra)
    with pytest.raises(ModelFileError, match=says):
        read_adapter(tmp_path / "a", SHAPES, torch.float32, CONFIG)


def test_not_an_adapter(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelFileError, match=r"adapter_config\.json"):
        read_adapter(tmp_path / "empty", SHAPES, torch.float32, CONFIG)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "adapter_config.json").write_text('{"peft_type": "LORA"}')
    (tmp_path / "bin" / "adapter_model.bin").write_bytes(b"pickle")
    with pytest.raises(ModelFileError, match="pickle"):
        read_adapter(tmp_path / "bin", SHAPES, torch.float32, CONFIG)
    (tmp_path / "x.txt").write_text("x")
    with pytest.raises(ModelFileError, match="PEFT adapter folder"):
        read_adapter(tmp_path / "x.txt", SHAPES, torch.float32, CONFIG)


def _llama_cpp_permute(rows: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's reordering of q's and k's rows (LlamaModel.permute)."""
    return rows.reshape(heads, 2, rows.shape[0] // heads // 2, *rows.shape[1:]).swapaxes(1, 2).reshape(rows.shape)


def test_gguf_lora_file(tmp_path: Path) -> None:
    """A file as llama.cpp's convert_lora_to_gguf.py writes it (general.type adapter, adapter.lora.alpha, blk.N.*
    .weight.lora_a/b with q's and k's B rows in llama.cpp's rotary order): the pairs in transformers' order, scale
    alpha / r."""
    import gguf

    rng = np.random.default_rng(0)
    r, alpha = 4, 8.0
    a_q, b_q = rng.standard_normal((r, HIDDEN)).astype(np.float32), rng.standard_normal((16, r)).astype(np.float32)
    a_k, b_k = rng.standard_normal((r, HIDDEN)).astype(np.float32), rng.standard_normal((8, r)).astype(np.float32)
    a_d, b_d = rng.standard_normal((r, INTER)).astype(np.float32), rng.standard_normal((HIDDEN, r)).astype(np.float32)
    writer = gguf.GGUFWriter(tmp_path / "a.gguf", "llama")
    writer.add_type(gguf.GGUFType.ADAPTER)
    writer.add_string(gguf.Keys.Adapter.TYPE, "lora")
    writer.add_float32(gguf.Keys.Adapter.LORA_ALPHA, alpha)
    writer.add_tensor("blk.1.attn_q.weight.lora_a", a_q)
    writer.add_tensor("blk.1.attn_q.weight.lora_b", _llama_cpp_permute(b_q, HEADS))
    writer.add_tensor("blk.1.attn_k.weight.lora_a", a_k)
    writer.add_tensor("blk.1.attn_k.weight.lora_b", _llama_cpp_permute(b_k, KV_HEADS))
    writer.add_tensor("blk.0.ffn_down.weight.lora_a", a_d)
    writer.add_tensor("blk.0.ffn_down.weight.lora_b", b_d)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    adapter = read_adapter(tmp_path / "a.gguf", SHAPES, torch.float32, CONFIG)
    assert set(adapter.layers[0]) == {"down_proj"} and set(adapter.layers[1]) == {"q_proj", "k_proj"}
    q = adapter.layers[1]["q_proj"]
    assert np.array_equal(q.a.numpy(), a_q) and np.array_equal(q.b.numpy(), b_q) and q.scale == alpha / r
    assert np.array_equal(adapter.layers[1]["k_proj"].b.numpy(), b_k)
    assert np.array_equal(adapter.layers[0]["down_proj"].b.numpy(), b_d)


def test_a_gguf_model_is_not_an_adapter(tmp_path: Path) -> None:
    import gguf

    writer = gguf.GGUFWriter(tmp_path / "m.gguf", "llama")
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((16, HIDDEN), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ModelFileError, match="convert_lora_to_gguf"):
        read_adapter(tmp_path / "m.gguf", SHAPES, torch.float32, CONFIG)
