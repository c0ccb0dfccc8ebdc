"""A GGUF file's 3-D expert tensors read per expert in place, written as llama.cpp's converter writes them (gguf-py:
the experts stacked, quantized as one [E, N, K] array), against the weights and transformers' tensor processor."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.pytorch.expert_blocks import expert_counts, expert_tensor, layer_experts

E, FF, H, K_USED = 4, 32, 64, 2


def _write(
    path: Path,
    arch: str = "qwen3moe",
    qtype: str = "Q8_0",
    *,
    shapes: dict | None = None,
    skip: tuple[str, ...] = (),
    used: int = K_USED,
    width: int | None = FF,
) -> dict[str, np.ndarray]:
    """A GGUF of one layer's experts and router as the converter writes them; returns the float32 weights."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch)
    writer.add_block_count(2)
    writer.add_expert_count(E)
    writer.add_expert_used_count(used)
    if width is not None:
        writer.add_expert_feed_forward_length(width)
    weights = {}
    shapes = shapes or {"ffn_gate_exps": (E, FF, H), "ffn_up_exps": (E, FF, H), "ffn_down_exps": (E, H, FF)}
    for name, shape in shapes.items():
        if name in skip:
            continue
        w = (rng.standard_normal(shape) * 0.1).astype(np.float32)
        weights[name] = w
        kind = gguf.GGMLQuantizationType[qtype]
        data = w if qtype == "F32" else quantize(w, kind)
        writer.add_tensor(f"blk.0.{name}.weight", data, raw_dtype=kind)
    router = (rng.standard_normal((E, H)) * 0.1).astype(np.float32)
    writer.add_tensor("blk.0.ffn_gate_inp.weight", router)  # F32, as the converter keeps it
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def _reader(path: Path):
    from gguf import GGUFReader

    return GGUFReader(str(path))


@pytest.mark.parametrize(
    ("arch", "qtype"), [("qwen3moe", "Q8_0"), ("llama", "Q4_0"), ("qwen3moe", "Q5_1"), ("qwen3moe", "MXFP4")]
)
def test_experts_are_views_of_the_file_equal_to_gguf_pys_weights(arch: str, qtype: str, tmp_path: Path) -> None:
    """Mixtral's files are `llama` with experts; Qwen3-MoE's `qwen3moe`. Expert e of each tensor is its e-th
    [N, K] slice, read from the file's mapping without a copy, and expands to what gguf-py's dequantization of
    the whole tensor gives for it."""
    from gguf import GGMLQuantizationType, dequantize

    weights = _write(tmp_path / "m.gguf", arch, qtype)
    reader = _reader(tmp_path / "m.gguf")
    counts = expert_counts(reader)
    assert counts == (E, K_USED, FF)
    experts = layer_experts(reader, 0, counts, H, "m.gguf")
    assert experts is not None and layer_experts(reader, 1, counts, H) is None  # layer 1 has no experts
    for name, blocks in zip(("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps"), experts, strict=True):
        tensor = next(t for t in reader.tensors if t.name == f"blk.0.{name}.weight")
        whole = dequantize(tensor.data, GGMLQuantizationType[qtype])  # [E, N, K]
        assert blocks.shape == whole.shape == weights[name].shape
        assert blocks.qtype == qtype
        mapped = np.asarray(tensor.data).ctypes.data
        for e in range(E):
            one = blocks.expert(e)
            assert one.raw.data_ptr() == mapped + e * one.raw.shape[0] * one.raw.shape[1]  # in place
            assert torch.equal(one.dequantize(), torch.from_numpy(np.ascontiguousarray(whole[e])))
        step = 0.15 if qtype == "MXFP4" else 0.05  # MXFP4 rounds by up to a quarter of its block's largest weight
        np.testing.assert_allclose(whole, weights[name], atol=step)  # the file holds those weights (4-bit steps)


def test_the_experts_are_what_transformers_gguf_loader_makes_of_them(tmp_path: Path) -> None:
    """transformers' qwen3moe tensor processor puts gate and up into the halves of gate_up_proj [E, 2 FF, H] and
    down into down_proj: expert e's gate / up / down are our expert e's weights."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS

    _write(tmp_path / "m.gguf")
    reader = _reader(tmp_path / "m.gguf")
    experts = layer_experts(reader, 0, expert_counts(reader), H)
    processor = TENSOR_PROCESSORS["qwen3moe"](config={})
    names = {
        "blk.0.ffn_gate_exps": "model.layers.0.mlp.experts.gate_up_proj",
        "blk.0.ffn_up_exps": "model.layers.0.mlp.experts.gate_up_proj",
        "blk.0.ffn_down_exps": "model.layers.0.mlp.experts.down_proj",
    }
    parsed: dict = {"tensors": {}}
    for tensor in reader.tensors:
        if "_exps" in tensor.name:
            processor.process(
                weights=dequantize(tensor.data, tensor.tensor_type),
                name=tensor.name,
                tensor_key_mapping=names,
                parsed_parameters=parsed,
            )
    gate_up, down = parsed["tensors"][names["blk.0.ffn_gate_exps"]], parsed["tensors"][names["blk.0.ffn_down_exps"]]
    assert gate_up.shape == (E, 2 * FF, H) and down.shape == (E, H, FF)
    for e in range(E):
        assert torch.equal(gate_up[e, :FF], experts.gate.expert(e).dequantize())
        assert torch.equal(gate_up[e, FF:], experts.up.expert(e).dequantize())
        assert torch.equal(down[e], experts.down.expert(e).dequantize())


def test_a_shape_that_disagrees_with_the_metadata_names_the_tensor(tmp_path: Path) -> None:
    _write(
        tmp_path / "m.gguf",
        shapes={"ffn_gate_exps": (E, FF, H), "ffn_up_exps": (E, FF, H), "ffn_down_exps": (E - 1, H, FF)},
    )
    reader = _reader(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match=r"blk\.0\.ffn_down_exps\.weight in m\.gguf is \[3, 64, 32\].*\[4, 64, 32\]"):
        layer_experts(reader, 0, expert_counts(reader), H, "m.gguf")


def test_a_missing_expert_tensor_is_named(tmp_path: Path) -> None:
    _write(tmp_path / "m.gguf", skip=("ffn_up_exps",))
    reader = _reader(tmp_path / "m.gguf")
    with pytest.raises(ValueError, match=r"m\.gguf has no blk\.0\.ffn_up_exps\.weight"):
        layer_experts(reader, 0, expert_counts(reader), H, "m.gguf")


def test_metadata(tmp_path: Path) -> None:
    _write(tmp_path / "mixtral.gguf", "llama", width=None)  # Mixtral's width is its feed_forward_length
    reader = _reader(tmp_path / "mixtral.gguf")
    assert expert_counts(reader) == (E, K_USED, None)
    assert layer_experts(reader, 0, expert_counts(reader), H).down.shape == (E, H, FF)  # the width from the shapes
    _write(tmp_path / "bad.gguf", used=E + 1)
    with pytest.raises(ValueError, match="expert_used_count is 5 for 4 experts"):
        expert_counts(_reader(tmp_path / "bad.gguf"))


def test_types_the_kernels_do_not_read_are_left_to_transformers(tmp_path: Path) -> None:
    _write(tmp_path / "m.gguf", qtype="F32")
    reader = _reader(tmp_path / "m.gguf")
    assert layer_experts(reader, 0, expert_counts(reader), H) is None
    router = next(t for t in reader.tensors if t.name == "blk.0.ffn_gate_inp.weight")
    with pytest.raises(ValueError, match=r"ffn_gate_inp\.weight in the GGUF file has shape .* 3 dimensions"):
        expert_tensor(router)


def test_where_a_loader_keeps_expert_blocks_and_what_they_stand_for() -> None:
    from engines.pytorch.expert_blocks import (
        ExpertBlocks,
        LayerExperts,
        blocks_of,
        expert_block_path,
        expert_parameters,
        experts_module_part,
    )
    from engines.pytorch.gguf_blocks import GGUFBlocks

    assert expert_block_path("blk.12.ffn_up_exps.weight") == "model.layers.12.mlp.experts.up_proj"
    assert expert_block_path("blk.1.ffn_gate_inp.weight") is None and expert_block_path("blk.1.ffn_up.weight") is None
    bias = expert_block_path("blk.3.ffn_down_exps.bias")  # gpt-oss's
    assert experts_module_part(bias) == ("model.layers.3.mlp.experts", "down_proj.bias")
    paths = [expert_block_path(f"blk.3.ffn_{p}_exps.weight") for p in ("gate", "up", "down")]
    assert experts_module_part(paths[0]) == ("model.layers.3.mlp.experts", "gate_proj")
    assert expert_parameters([*paths, bias, "model.layers.3.mlp.gate_proj"]) == {
        "model.layers.3.mlp.experts.gate_up_proj",
        "model.layers.3.mlp.experts.down_proj",
    }
    experts = blocks_of("Q8_0", torch.zeros(2, 3, 34, dtype=torch.uint8))
    assert isinstance(experts, ExpertBlocks)
    assert isinstance(blocks_of("Q8_0", torch.zeros(3, 34, dtype=torch.uint8)), GGUFBlocks)
    own = {"gate_proj": experts, "up_proj": experts, "down_proj": experts, "gate": None}  # layer_blocks' keys
    held = LayerExperts.held(own)
    assert held is not None and all(part is experts for part in held)
    assert LayerExperts.held({**own, "down_proj": GGUFBlocks("Q8_0", torch.zeros(3, 34, dtype=torch.uint8))}) is None


def test_moe_config_completes_what_transformers_gguf_loader_leaves_out() -> None:
    """Qwen3-MoE's expert width; a llama file with experts becomes Mixtral (transformers would build a dense
    Llama and leave its MLP random); dense files are left as they are."""
    from transformers import LlamaConfig, Qwen3MoeConfig

    from engines.pytorch.expert_blocks import moe_config

    qwen = moe_config(
        Qwen3MoeConfig(), {"expert_count": 8, "expert_used_count": 2, "expert_feed_forward_length": 32}.get
    )
    assert (qwen.moe_intermediate_size, qwen.num_experts, qwen.num_experts_per_tok) == (32, 8, 2)
    llama = LlamaConfig(
        hidden_size=64,
        intermediate_size=96,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=2,
        rms_norm_eps=1e-5,
    )
    mixtral = moe_config(llama, {"expert_count": 6, "expert_used_count": 2}.get)
    assert mixtral.model_type == "mixtral" and mixtral.architectures == ["MixtralForCausalLM"]
    assert (mixtral.num_local_experts, mixtral.num_experts_per_tok, mixtral.intermediate_size) == (6, 2, 96)
    assert (mixtral.num_key_value_heads, mixtral.rms_norm_eps, mixtral.sliding_window) == (2, 1e-5, None)
    assert moe_config(llama, {}.get) is llama
    with pytest.raises(ValueError, match="expert_used_count is 7 for 6 experts"):
        moe_config(llama, {"expert_count": 6, "expert_used_count": 7}.get)
