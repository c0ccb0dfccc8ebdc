"""GGUF blocks of every type the native engine reads, for tests: gguf-py's quantization of random weights, or random
valid block bytes for the K-quants (which gguf-py cannot quantize)."""

from __future__ import annotations

import numpy as np
import torch

from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks

K_QUANTS = ("Q4_K", "Q5_K", "Q6_K")


def make_blocks(qtype: str, n: int, k: int, seed: int = 0) -> GGUFBlocks:
    """[n, k] blocks of `qtype`: gguf-py's quantization of a random weight, or for the K-quants random bytes with
    finite float16 d and dmin (any such bytes are a valid block)."""
    rng = np.random.default_rng(seed)
    t = TYPES[qtype]
    if qtype in K_QUANTS:
        raw = rng.integers(0, 256, size=(n, k // 256, t.block_bytes), dtype=np.uint8)
        scales = (rng.standard_normal((n, k // 256, 2)) * 2e-3).astype(np.float16).view(np.uint8).reshape(n, -1, 4)
        if qtype == "Q6_K":
            raw[..., 208:210] = scales[..., :2]
        else:
            raw[..., 0:4] = scales
        raw = raw.reshape(n, -1)
    else:
        from gguf import GGMLQuantizationType
        from gguf.quants import quantize

        weight = (rng.standard_normal((n, k)) * 0.05).astype(np.float32)
        raw = np.ascontiguousarray(quantize(weight, GGMLQuantizationType[qtype])).view(np.uint8).reshape(n, -1)
    return GGUFBlocks(qtype, torch.from_numpy(raw.copy()))
