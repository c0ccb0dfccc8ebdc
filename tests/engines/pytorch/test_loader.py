"""A GGUF file's vocabulary that transformers cannot make a tokenizer of is the file's ModelFileError, whatever
transformers or tokenizers raise reading it (found by bench/fuzz_gguf.py's gguf-loader target)."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.interface import ModelFileError
from engines.pytorch.loader import _gguf_tokenizer


def _vocabulary_file(path: Path, merges: list[str], bos: int) -> Path:
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("tokenizer.ggml.model", "gpt2")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "ab"])
    writer.add_array("tokenizer.ggml.token_type", [1, 1, 1])
    writer.add_array("tokenizer.ggml.merges", merges)
    writer.add_uint32("tokenizer.ggml.bos_token_id", bos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


@pytest.mark.parametrize("model_type", ["llama", "gpt_oss"])  # AutoTokenizer; the backend alone (gpt-oss)
def test_a_vocabulary_transformers_reads(tmp_path: Path, model_type: str) -> None:
    tokenizer = _gguf_tokenizer(_vocabulary_file(tmp_path / "ok.gguf", ["a b"], 0), model_type)
    assert tokenizer.convert_ids_to_tokens([2]) == ["ab"]


@pytest.mark.parametrize(
    ("merges", "bos", "raised"),
    [
        (["a c"], 0, "Exception: Error while initializing BPE"),  # tokenizers' bare Exception
        (["a b"], 99, "IndexError"),  # a special token past the vocabulary
    ],
)
@pytest.mark.parametrize("model_type", ["llama", "gpt_oss"])
def test_a_vocabulary_it_cannot_read(tmp_path: Path, merges: list[str], bos: int, raised: str, model_type: str) -> None:
    with pytest.raises(ModelFileError, match=rf"bad\.gguf: transformers cannot make a tokenizer .*\({raised}"):
        _gguf_tokenizer(_vocabulary_file(tmp_path / "bad.gguf", merges, bos), model_type)
