"""The console's live numbers: one snapshot of what /metrics exports, as JSON the page can chart.

The snapshot holds counters and cumulative histogram buckets as they are now, stamped with the server's clock;
the page derives rates (output tokens/s), windowed percentiles (TTFT, inter-token latency) and the windowed
prefix-cache hit rate from the difference between two snapshots, as Prometheus' `rate()` and
`histogram_quantile()` would. So the server keeps no per-viewer state and a snapshot costs what a scrape costs.
"""

from __future__ import annotations

import time
from typing import Any

from gateway.observability.request_metrics import Histogram
from gateway.repository.loaded_model import LoadedTensorModel
from gateway.repository.registry import ModelRegistry


def _buckets(histogram: Histogram) -> dict[str, Any]:
    buckets, total = histogram.cumulative()
    return {"le": [b for b, _ in buckets[:-1]], "cumulative": [n for _, n in buckets], "sum": total}


def snapshot(registry: ModelRegistry) -> dict[str, Any]:
    llms = []
    for model in registry.llms():
        s = model.scheduler.stats()
        r = s.requests
        llms.append(
            {
                "name": model.name,
                "running": s.running,
                "waiting": s.waiting,
                "kv_usage": s.kv_usage,
                "kv_blocks_used": s.kv_blocks_used,
                "kv_blocks_total": s.kv_blocks_total,
                "prefix_cache_queries": s.prefix_cache_queried_tokens,
                "prefix_cache_hits": s.prefix_cache_hit_tokens,
                "preemptions": s.preemptions,
                "sessions": s.sessions,
                "prompt_tokens": r.prompt_tokens,
                "generation_tokens": r.generation_tokens,
                "finished": sum(r.finished.values()),
                "ttft": _buckets(r.ttft),
                "itl": _buckets(r.inter_token),
            }
        )
    tensors: list[dict[str, Any]] = []
    for entry in registry.all_models():
        if not isinstance(entry, LoadedTensorModel):
            continue
        stats = [s for _, s, _ in entry.version_stats()]
        tensors.append(
            {
                "name": entry.name,
                "success": sum(s.success.count for s in stats),
                "failure": sum(sum(s.fail_reasons.values()) for s in stats),
                "inferences": sum(s.inference_count for s in stats),
            }
        )
    return {"time": time.monotonic(), "llms": llms, "tensors": tensors}
