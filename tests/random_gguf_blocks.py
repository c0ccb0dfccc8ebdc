"""GGUF blocks of every type the native engine reads, for tests: gguf-py's quantization of random weights, or random
valid block bytes for the K-quants (which gguf-py cannot quantize); and a small llama GGUF file of random weights."""

from __future__ import annotations

from pathlib import Path

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


def random_llama_gguf(
    target: Path,
    source: Path,
    *,
    untied: bool = True,
    hidden: int = 64,
    layers: int = 2,
    vocab: int = 2048,
    seed: int = 0,
) -> Path:
    """A small llama GGUF of random weights with the first `vocab` tokens of `source`'s byte-level BPE tokenizer (a
    GGUF's vocabulary, the merges among them, its metadata): 4 query heads over 2 key/value heads, projections in
    Q4_1 and Q5_0, the embedding in Q4_0 and, `untied`, an output (lm_head) of its own in Q8_0; norms F32. Written
    with gguf-py, as a converter would."""
    import gguf
    from gguf.quants import quantize

    rng = np.random.default_rng(seed)
    reader = gguf.GGUFReader(str(source))
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()[:vocab]
    known = set(tokens)
    merges = [
        m
        for m in reader.fields["tokenizer.ggml.merges"].contents()
        if m.replace(" ", "") in known and all(part in known for part in m.split(" "))
    ]
    lists = {
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.merges": merges,
        "tokenizer.ggml.token_type": reader.fields["tokenizer.ggml.token_type"].contents()[:vocab],
    }
    ffn, heads, kv_heads = 2 * hidden, 4, 2
    sizes = {
        "llama.block_count": layers,
        "llama.embedding_length": hidden,
        "llama.feed_forward_length": ffn,
        "llama.attention.head_count": heads,
        "llama.attention.head_count_kv": kv_heads,
        "llama.rope.dimension_count": hidden // heads,
        "llama.vocab_size": vocab,
        "llama.context_length": 2048,
    }
    writer = gguf.GGUFWriter(str(target), "llama")
    for field in reader.fields.values():
        if field.name == gguf.Keys.General.ARCHITECTURE or field.name.startswith("GGUF."):
            continue
        if field.name.startswith("general.") and field.name not in (gguf.Keys.General.QUANTIZATION_VERSION,):
            continue
        value = lists[field.name] if field.name in lists else sizes.get(field.name, field.contents())
        sub_type = field.types[-1] if field.types[0] == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, field.types[0], sub_type=sub_type)

    def add(name: str, rows: int, cols: int, qtype: str, scale: float) -> None:
        weight = (rng.standard_normal((rows, cols)) * scale).astype(np.float32)
        kind = gguf.GGMLQuantizationType[qtype]
        writer.add_tensor(name, quantize(weight, kind), raw_dtype=kind)

    def norm(name: str) -> None:
        writer.add_tensor(name, (1 + 0.1 * rng.standard_normal(hidden)).astype(np.float32))

    head_dim = hidden // heads
    add("token_embd.weight", vocab, hidden, "Q4_0", 1.0)
    for i in range(layers):
        norm(f"blk.{i}.attn_norm.weight")
        add(f"blk.{i}.attn_q.weight", hidden, hidden, "Q4_1", hidden**-0.5)
        add(f"blk.{i}.attn_k.weight", kv_heads * head_dim, hidden, "Q4_1", hidden**-0.5)
        add(f"blk.{i}.attn_v.weight", kv_heads * head_dim, hidden, "Q5_0", hidden**-0.5)
        add(f"blk.{i}.attn_output.weight", hidden, hidden, "Q4_1", hidden**-0.5)
        norm(f"blk.{i}.ffn_norm.weight")
        add(f"blk.{i}.ffn_gate.weight", ffn, hidden, "Q4_1", hidden**-0.5)
        add(f"blk.{i}.ffn_up.weight", ffn, hidden, "Q4_1", hidden**-0.5)
        add(f"blk.{i}.ffn_down.weight", hidden, ffn, "Q5_0", ffn**-0.5)
    norm("output_norm.weight")
    if untied:
        add("output.weight", vocab, hidden, "Q8_0", 0.5)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return target
