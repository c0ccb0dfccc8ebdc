"""The bandwidth floor's two parts (bench/bandwidth_floor.py): the bytes a decode token reads, of a mixture of
experts only the experts it uses, and a read of the engine's own buffer that sums every byte."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np

from bench.bandwidth_floor import Bandwidth, decode_bytes


def test_a_token_reads_its_share_of_the_experts(tmp_path: Path) -> None:
    path = tmp_path / "moe.gguf"
    writer = gguf.GGUFWriter(str(path), "qwen3moe")
    writer.add_expert_count(8)
    writer.add_expert_used_count(2)
    tensors = {
        "token_embd.weight": (50, 16),
        "blk.0.attn_q.weight": (16, 16),
        "blk.0.attn_norm.weight": (16,),
        "blk.0.ffn_gate_exps.weight": (8, 32, 16),
        "blk.0.ffn_down_exps.weight": (8, 16, 32),
        "output_norm.weight": (16,),
        "output.weight": (50, 16),
    }
    for name, shape in tensors.items():
        writer.add_tensor(name, np.zeros(shape, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    read = decode_bytes(path)
    experts = 2 * 8 * 32 * 16 * 4
    assert read["experts_all"] == experts and read["expert_share"] == 0.25
    assert read["layers"] == (16 * 16 + 16) * 4 + experts // 4
    assert read["lm_head"] == 50 * 16 * 4  # the untied output, not the embedding
    assert read["total"] == read["layers"] + read["lm_head"] + 16 * 4


def test_the_reader_sums_the_whole_engine_buffer() -> None:
    buf = Bandwidth(8 << 20)  # checks its checksum: a pass that skipped a byte would raise
    assert buf.nbytes == 8 << 20
    assert buf.read(threads=2, reps=2) > 0
