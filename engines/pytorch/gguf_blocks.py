"""Projection weights kept as a GGUF file's Q4_1 (and Q8_0) blocks, for the GEMM kernel to expand in registers.

A Q4_1 tensor stores each run of 32 weights as 4-bit q with a float16 scale d and offset m; transformers loads it
as float32 d * q + m. d * q is exact in float32 (11 x 4 significant bits), so the kernel's FMA rounds d * q + m
once, as transformers' multiply-then-add does: the very same float32 weights, from 1.25 bytes each (a byte per q
plus d and m per 32) instead of 4. Decode steps of a few rows are bound by how fast each core streams weights from
memory (one core reads 6-10 GB/s here), so they read these. Q8_0 (the tied embedding, i.e. the lm_head) fits the
same layout. Only tensors whose expansion equals the loaded float32 weight bit for bit are taken; anything else
stays float32.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

log = logging.getLogger("switchyard.engines.pytorch")

Q41_BLOCK = 32  # weights per block (along the input dimension)
_BYTES = 20  # float16 d, float16 m, 16 bytes of two 4-bit q each


@dataclass(frozen=True)
class Q41:
    """A [N, K] weight as Q4_1 blocks: the float32 weight is scale * q + offset, block by block along K."""

    scale: torch.Tensor  # [N, K / 32] float32 (from float16: exact)
    offset: torch.Tensor  # [N, K / 32] float32
    q: torch.Tensor  # [N, K] uint8: 0..15 (Q4_1), or Q8_0's q + 128 with offset -128 scale

    def dequantize(self) -> torch.Tensor:
        n, k = self.q.shape
        blocks = self.q.view(n, k // Q41_BLOCK, Q41_BLOCK).float()
        return (self.scale[..., None] * blocks + self.offset[..., None]).view(n, k)

    @staticmethod
    def cat(parts: list[Q41]) -> Q41:
        """The rows of several weights, one after the other (q, k and v as one projection)."""
        return Q41(*(torch.cat([getattr(p, f) for p in parts]) for f in ("scale", "offset", "q")))

    def rows(self, index: torch.Tensor) -> Q41:
        return Q41(self.scale[index], self.offset[index], self.q[index])


def _raw_blocks(tensor: Any, block_bytes: int) -> torch.Tensor:
    """A GGUF tensor's bytes as [N, K / 32, block_bytes] (GGUF lists the fastest dimension first)."""
    k, n = (int(d) for d in tensor.shape)
    return torch.from_numpy(tensor.data.reshape(-1).view("uint8").copy()).view(n, k // Q41_BLOCK, block_bytes)


def _float16(raw: torch.Tensor) -> torch.Tensor:
    """Two bytes per block as a float16 value per block, widened to float32 (exact): [N, K / 32]."""
    return raw.contiguous().view(torch.float16).float().view(raw.shape[0], -1)


def _from_q8_0(tensor: Any) -> Q41:
    """Q8_0 blocks (float16 d, 32 int8 q: the weight is d * q) in the Q4_1 layout: q + 128 as a byte and offset
    -128 d. d * (q + 128) is exact (11 x 8 significant bits) and so is adding -128 d (the sum is d * q, which
    float32 holds exactly), so the kernel's one rounding gives d * q bit for bit."""
    raw = _raw_blocks(tensor, 34)
    scale = _float16(raw[..., 0:2])
    q = (raw[..., 2:].contiguous().view(torch.int8).to(torch.int16) + 128).to(torch.uint8).reshape(raw.shape[0], -1)
    return Q41(scale, scale * -128.0, q)


def _from_gguf(tensor: Any) -> Q41:
    raw = _raw_blocks(tensor, _BYTES)
    packed = raw[..., 4:]  # value i of a block in the low nibble of byte i, value 16 + i in its high nibble
    q = torch.cat((packed & 15, packed >> 4), dim=-1).reshape(raw.shape[0], -1)
    return Q41(_float16(raw[..., 0:2]), _float16(raw[..., 2:4]), q)


# GGUF tensor names of a llama-family layer's projections -> transformers' module paths
_PROJECTIONS = {
    "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def _unpermute(n: int, heads: int) -> torch.Tensor:
    """The row order transformers gives q and k of a llama GGUF (llama.cpp interleaves each head's rotary halves)."""
    return torch.arange(n).reshape(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)


def _blocks_in_file(gguf: Path, num_layers: int) -> dict[str, Q41]:
    """Every Q4_1 projection of the file by module path, q and k rows as the file stores them."""
    try:
        from gguf import GGMLQuantizationType, GGUFReader
    except ImportError:
        return {}
    try:
        tensors = {t.name: t for t in GGUFReader(str(gguf)).tensors}
    except (OSError, ValueError) as exc:
        log.warning("native engine: cannot read %s's blocks (%s); float32 weights", gguf.name, exc)
        return {}
    found = {}
    head = tensors.get("output.weight") or tensors.get("token_embd.weight")  # the latter when the two are tied
    if head is not None and head.tensor_type == GGMLQuantizationType.Q8_0:
        found["lm_head"] = _from_q8_0(head)
    for i in range(num_layers):
        for gguf_name, path in _PROJECTIONS.items():
            tensor = tensors.get(f"blk.{i}.{gguf_name}.weight")
            if tensor is not None and tensor.tensor_type == GGMLQuantizationType.Q4_1 and int(tensor.shape[0]) % Q41_BLOCK == 0:
                found[f"model.layers.{i}.{path}"] = _from_gguf(tensor)
    return found


def _cached(gguf: Path, num_layers: int, cache_file: Path | None) -> dict[str, Q41]:
    """The file's blocks, from `cache_file` when an earlier start saved them there (gguf's reader parses the whole
    tokenizer vocabulary first: 8 s for SmolLM2, against 0.2 s for the saved blocks)."""
    from safetensors.torch import load_file, save_file

    if cache_file is not None and cache_file.is_file():
        flat = load_file(cache_file)
        return {key[: -len(".q")]: Q41(flat[key[:-2] + ".scale"], flat[key[:-2] + ".offset"], flat[key])
                for key in flat if key.endswith(".q")}
    found = _blocks_in_file(gguf, num_layers)
    if cache_file is not None and found:
        tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
        save_file({f"{path}.{field}": getattr(b, field).contiguous() for path, b in found.items()
                   for field in ("scale", "offset", "q")}, tmp)
        tmp.replace(cache_file)
    return found


def read_blocks(gguf: Path, model: Any, cache_file: Path | None = None) -> dict[str, Q41]:
    """The Q4_1 blocks of `model`'s projections in the GGUF file it was loaded from, by module path
    ("model.layers.3.mlp.up_proj"), for those that expand exactly to the weight the model holds. `cache_file`:
    where to keep them between starts."""
    config = model.config
    heads = {"attn_q": config.num_attention_heads,
             "attn_k": getattr(config, "num_key_value_heads", None) or config.num_attention_heads}
    paths = {path: gguf_name for gguf_name, path in _PROJECTIONS.items()}
    found: dict[str, Q41] = {}
    for full_path, blocks in _cached(gguf, len(model.model.layers), cache_file).items():
        weight = model.get_submodule(full_path).weight.detach()
        if weight.dtype != torch.float32 or blocks.q.shape != weight.shape:
            continue
        gguf_name = paths.get(full_path.split(".", 3)[-1], "")
        if gguf_name in heads and not torch.equal(blocks.dequantize(), weight):
            blocks = blocks.rows(_unpermute(weight.shape[0], heads[gguf_name]))
        if torch.equal(blocks.dequantize(), weight):
            found[full_path] = blocks
    return found
