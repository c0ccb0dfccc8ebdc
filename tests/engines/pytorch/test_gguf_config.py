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


def _write(path, arch: str, keys: dict, tensors: dict):
    """A GGUF of architecture `arch`: metadata `<arch>.<key>` for each of `keys` (a list as an array; None: left
    out) and `tensors`."""
    import gguf

    writer = gguf.GGUFWriter(str(path), arch)
    for key, value in keys.items():
        name = f"{arch}.{key}"
        if value is None:
            continue
        if isinstance(value, list):
            writer.add_array(name, value)
        elif isinstance(value, float):
            writer.add_float32(name, value)
        elif isinstance(value, str):
            writer.add_string(name, value)
        else:
            writer.add_uint32(name, value)
    for name, values in tensors.items():
        writer.add_tensor(name, values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _llama_file(path, **fields):
    """A one-layer llama GGUF of 64 x 32 tokens whose `llama.*` metadata `fields` override the sizes."""
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
    tensors = {
        "token_embd.weight": np.zeros((32, 64), dtype=np.float32),
        "blk.0.attn_norm.weight": np.ones(64, dtype=np.float32),
    }
    return _write(path, "llama", {**sizes, **fields, "attention.layer_norm_rms_epsilon": 1e-5}, tensors)


# what llama.cpp's converter writes for tests/family_models.py's gpt_oss (its base class's keys and its own)
GPT_OSS_KEYS = {
    "block_count": 2,
    "context_length": 512,
    "embedding_length": 64,
    "feed_forward_length": 32,
    "attention.head_count": 4,
    "attention.head_count_kv": 2,
    "rope.scaling.type": "yarn",
    "rope.scaling.factor": 8.0,
    "rope.scaling.original_context_length": 64,
    "rope.scaling.yarn_beta_fast": 32.0,
    "rope.scaling.yarn_beta_slow": 1.0,
    "rope.freq_base": 150000.0,
    "attention.layer_norm_rms_epsilon": 1e-5,
    "expert_count": 4,
    "expert_used_count": 2,
    "attention.key_length": 32,
    "attention.value_length": 32,
    "attention.sliding_window": 12,
    "expert_feed_forward_length": 32,
}


def _gpt_oss_file(path, **fields):
    """A two-layer gpt-oss GGUF (32 tokens, 4 experts) whose `gpt-oss.*` metadata `fields` override GPT_OSS_KEYS."""
    tensors = {"token_embd.weight": np.zeros((32, 64), dtype=np.float32)}
    for i in range(2):
        tensors[f"blk.{i}.attn_norm.weight"] = np.ones(64, dtype=np.float32)
        tensors[f"blk.{i}.ffn_gate_exps.weight"] = np.zeros((4, 32, 64), dtype=np.float32)
    return _write(path, "gpt-oss", {**GPT_OSS_KEYS, **fields}, tensors)


def test_a_gpt_oss_config_is_made_of_its_metadata(tmp_path) -> None:
    """transformers' GGUF loader makes no config of a gpt-oss file: the engine makes it of the `gpt-oss.*` keys as
    llama.cpp reads them, and the family's own values where the file holds none (the clamped SwiGLU's, YaRN
    without truncation, every other layer sliding from the first)."""
    from engines.pytorch.gguf_config import gguf_config

    config = gguf_config(_gpt_oss_file(tmp_path / "m.gguf"))
    assert config.model_type == "gpt_oss" and config.architectures == ["GptOssForCausalLM"]
    sizes = ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim")
    assert [getattr(config, size) for size in sizes] == [2, 64, 4, 2, 32]
    moe = ("intermediate_size", "num_local_experts", "num_experts_per_tok", "vocab_size", "max_position_embeddings")
    assert [getattr(config, size) for size in moe] == [32, 4, 2, 32, 512]
    assert config.sliding_window == 12 and config.layer_types == ["sliding_attention", "full_attention"]
    yarn = {
        "rope_type": "yarn",
        "rope_theta": 150000.0,
        "factor": 8.0,
        "original_max_position_embeddings": 64,
        "beta_fast": 32.0,
        "beta_slow": 1.0,
        "truncate": False,
    }
    assert {key: config.rope_parameters.get(key) for key in yarn} == yarn
    assert (config.swiglu_alpha, config.swiglu_limit, config.tie_word_embeddings) == (1.702, 7.0, True)
    every = gguf_config(_gpt_oss_file(tmp_path / "full.gguf", **{"attention.sliding_window_pattern": 1}))
    assert every.layer_types == ["full_attention", "full_attention"]


@pytest.mark.parametrize(
    ("fields", "fault"),
    [
        ({"attention.sliding_window_pattern": [True, False]}, r"sliding_window_pattern is not a whole number"),
        ({"rope.scaling.type": "linear"}, r"RoPE scaling .*'linear'.* is not gpt-oss's YaRN"),
        ({"rope.scaling.yarn_ext_factor": 0.5}, r"yarn_ext_factor 0\.5\) is not gpt-oss's YaRN"),
        ({"attention.sliding_window": None}, r"no gpt-oss\.attention\.sliding_window, which llama\.cpp"),
        ({"block_count": 1_000_000}, r"1000000 layers .* tensors of 2"),  # before a layer type is made per layer
        ({"attention.head_count": 0}, r"num_attention_heads is 0"),
    ],
)
def test_gpt_oss_metadata_the_engine_does_not_read_is_refused(tmp_path, fields, fault) -> None:
    from engines.interface import ModelFileError
    from engines.pytorch.gguf_config import gguf_config

    with pytest.raises(ModelFileError, match=fault):
        gguf_config(_gpt_oss_file(tmp_path / "bad.gguf", **fields))


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
