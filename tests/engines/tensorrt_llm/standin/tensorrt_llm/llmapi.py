"""`tensorrt_llm.llmapi` stand-in: the KV cache options object."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(kw_only=True)
class KvCacheConfig:
    free_gpu_memory_fraction: float | None = None
    enable_block_reuse: bool = True
