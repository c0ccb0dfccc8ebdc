"""Llama 3's RoPE parameters come back exactly from the `rope_freqs` tensor llama.cpp's converter writes, for the
shapes of the Llama 3.x releases and for tiny test models; a tensor that is not Llama 3's scaling is not fitted."""

from __future__ import annotations

import numpy as np
import pytest

from engines.pytorch.gguf_config import _fit_llama3, llama3_factors


@pytest.mark.parametrize(
    ("base", "dim", "factor", "original"),
    [
        (500000.0, 128, 8.0, 8192),  # Llama 3.1 8B / 70B / 405B
        (500000.0, 64, 32.0, 8192),  # Llama 3.2 1B
        (500000.0, 128, 32.0, 8192),  # Llama 3.2 3B
        (500000.0, 16, 8.0, 32),  # tests/family_models.py's llama3_rope
        (10000.0, 64, 8.0, 256),
        (10000.0, 64, 4.0, 2048),
    ],
)
def test_parameters_recovered_from_the_converters_tensor(base: float, dim: int, factor: float, original: int) -> None:
    factors = llama3_factors(base, dim, factor, 1.0, 4.0, original)
    found = _fit_llama3(factors, base, dim)
    assert found is not None
    assert np.array_equal(
        llama3_factors(
            base,
            dim,
            found["factor"],
            found["low_freq_factor"],
            found["high_freq_factor"],
            found["original_max_position_embeddings"],
        ),
        factors,
    )
    if ((factors > 1) & (factors < factor)).any():  # a smoothed frequency pins the original context down
        assert found == {
            "factor": factor,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": original,
        }


def test_other_tensors_are_not_fitted() -> None:
    factors = llama3_factors(500000.0, 128, 8.0, 1.0, 4.0, 8192)
    assert _fit_llama3(factors * 1.001, 500000.0, 128) is None  # not the converter's values
    assert _fit_llama3(np.ones(64, dtype=np.float32), 500000.0, 128) is None  # no scaling
    assert _fit_llama3(factors[:32], 500000.0, 128) is None  # the wrong head size
    assert _fit_llama3(llama3_factors(500000.0, 128, 8.0, 2.0, 3.0, 8192), 500000.0, 128) is None  # other factors


def _llama_file(path, **fields):
    """A one-layer llama GGUF of 64 x 32 tokens whose `llama.*` metadata `fields` override the sizes."""
    import gguf

    sizes = {
        "block_count": 1,
        "embedding_length": 64,
        "feed_forward_length": 128,
        "attention.head_count": 4,
        "attention.head_count_kv": 2,
        "context_length": 256,
        "rope.dimension_count": 16,
        "vocab_size": 32,
    }
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, value in {**sizes, **fields}.items():
        if isinstance(value, float):
            writer.add_float32(f"llama.{key}", value)
        elif isinstance(value, str):
            writer.add_string(f"llama.{key}", value)
        else:
            writer.add_uint32(f"llama.{key}", value)
    writer.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5)
    writer.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    writer.add_tensor("blk.0.attn_norm.weight", np.ones(64, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_sizes_as_the_file_holds_them_are_read(tmp_path) -> None:
    from engines.pytorch.gguf_config import gguf_config

    config = gguf_config(_llama_file(tmp_path / "ok.gguf"))
    assert (config.num_hidden_layers, config.hidden_size, config.num_key_value_heads) == (1, 64, 2)


@pytest.mark.parametrize(
    ("fields", "fault"),
    [
        ({"block_count": 1_000_000}, r"1000000 layers .* tensors of 1"),  # would build a million layers
        ({"embedding_length": 1 << 31}, r"hidden_size .* 2147483648 .* token_embd\.weight"),  # a rotary table of GBs
        ({"attention.head_count": 0}, r"cannot make a config of it \(ZeroDivisionError"),  # in transformers' config
        ({"attention.head_count_kv": 3}, r"3 key/value heads for 4 query heads"),  # the kernels' head groups
        ({"block_count": "two"}, r"cannot make a config of it .*num_hidden_layers"),  # huggingface_hub's own error
        ({"attention.head_count_kv": 0}, r"num_key_value_heads is 0"),
        ({"expert_count": float("inf"), "expert_used_count": 2}, r"expert"),  # int(inf): OverflowError
    ],
)
def test_sizes_the_tensors_do_not_justify_are_refused(tmp_path, fields, fault) -> None:
    """Sizes read from the metadata build the model (on the meta device) and its real buffers (rotary tables):
    each is checked against the tensors before anything is built from it."""
    from engines.interface import ModelFileError
    from engines.pytorch.gguf_config import gguf_config

    with pytest.raises(ModelFileError, match=fault):
        gguf_config(_llama_file(tmp_path / "bad.gguf", **fields))
