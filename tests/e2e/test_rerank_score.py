"""POST /v1/rerank (through the real cohere v2 client, which calls /v2/rerank) and /v1/score, served by the
default repository's embedding model."""

from __future__ import annotations

import cohere
import httpx
import numpy as np
import pytest

EMBEDDER = "all-minilm-l6-v2"
QUERY = "What is the capital of France?"
DOCUMENTS = ["Berlin is the capital of Germany.", "Paris is the capital of France.", "Bananas are yellow."]


@pytest.fixture(scope="module")
def cohere_client(base_url: str) -> cohere.ClientV2:
    return cohere.ClientV2(base_url=base_url, api_key="unused", timeout=120)


def _cosine(base_url: str, a: str, b: str) -> float:
    data = httpx.post(f"{base_url}/v1/embeddings", json={"model": EMBEDDER, "input": [a, b]}, timeout=60).json()
    u, v = (np.array(d["embedding"], dtype=np.float64) for d in data["data"])
    return float(u @ v / (np.linalg.norm(u) * np.linalg.norm(v)))


def test_cohere_rerank_orders_by_cosine_similarity(cohere_client: cohere.ClientV2, base_url: str) -> None:
    ranked = cohere_client.rerank(model=EMBEDDER, query=QUERY, documents=DOCUMENTS, top_n=2)
    assert [r.index for r in ranked.results] == [1, 0]
    for r in ranked.results:  # the score is the cosine similarity of the two embeddings
        assert r.relevance_score == pytest.approx(_cosine(base_url, QUERY, DOCUMENTS[r.index]), abs=1e-5)
    everything = cohere_client.rerank(model=EMBEDDER, query=QUERY, documents=DOCUMENTS)
    scores = [r.relevance_score for r in everything.results]
    assert len(scores) == 3 and scores == sorted(scores, reverse=True)


def test_v1_rerank_returns_documents_and_usage(base_url: str) -> None:
    body = {"model": EMBEDDER, "query": QUERY, "documents": [{"text": d} for d in DOCUMENTS], "top_n": 1}
    data = httpx.post(f"{base_url}/v1/rerank", json=body, timeout=60).json()
    assert data["results"][0]["index"] == 1 and data["results"][0]["document"] == {"text": DOCUMENTS[1]}
    assert data["usage"]["total_tokens"] > 0
    bare = httpx.post(f"{base_url}/v1/rerank", json={**body, "return_documents": False}, timeout=60).json()
    assert "document" not in bare["results"][0]


def test_score_pairs_one_to_many_and_many_to_many(base_url: str) -> None:
    one = httpx.post(
        f"{base_url}/v1/score", json={"model": EMBEDDER, "text_1": QUERY, "text_2": DOCUMENTS}, timeout=60
    ).json()
    assert [d["index"] for d in one["data"]] == [0, 1, 2] and one["object"] == "list"
    assert one["data"][1]["score"] == pytest.approx(_cosine(base_url, QUERY, DOCUMENTS[1]), abs=1e-5)
    pairs = httpx.post(
        f"{base_url}/v1/score", json={"model": EMBEDDER, "text_1": DOCUMENTS, "text_2": DOCUMENTS}, timeout=60
    ).json()
    assert all(d["score"] == pytest.approx(1.0, abs=1e-5) for d in pairs["data"])  # each text with itself
    single = httpx.post(
        f"{base_url}/v1/score", json={"model": EMBEDDER, "text_1": "a cat", "text_2": "a kitten"}, timeout=60
    ).json()
    assert len(single["data"]) == 1 and 0 < single["data"][0]["score"] < 1


def test_bad_inputs_are_400_in_openai_shape(base_url: str) -> None:
    cases = [
        ("/v1/rerank", {"query": QUERY, "documents": DOCUMENTS}, "model"),
        ("/v1/rerank", {"model": EMBEDDER, "documents": DOCUMENTS}, "query"),
        ("/v1/rerank", {"model": EMBEDDER, "query": QUERY, "documents": "one"}, "documents"),
        ("/v1/rerank", {"model": EMBEDDER, "query": QUERY, "documents": []}, "documents"),
        ("/v1/rerank", {"model": EMBEDDER, "query": QUERY, "documents": ["x", ""]}, "documents"),
        ("/v1/rerank", {"model": EMBEDDER, "query": QUERY, "documents": ["x"] * 1001}, "documents"),
        ("/v1/rerank", {"model": EMBEDDER, "query": QUERY, "documents": ["x" * 100_001]}, "documents"),
        ("/v1/rerank", {"model": EMBEDDER, "query": QUERY, "documents": DOCUMENTS, "top_n": 0}, "top_n"),
        ("/v2/rerank", {"model": "smollm2-135m-instruct", "query": QUERY, "documents": DOCUMENTS}, "model"),
        ("/v1/score", {"model": EMBEDDER, "text_1": ["a", "b"], "text_2": ["a", "b", "c"]}, "text_1"),
        ("/v1/score", {"model": EMBEDDER, "text_1": 3, "text_2": "a"}, "text_1"),
        ("/v1/score", {"model": EMBEDDER, "text_1": "a"}, "text_2"),
        ("/v1/score", {"model": EMBEDDER, "text_1": [], "text_2": "a"}, "text_1"),
    ]
    for path, body, param in cases:
        resp = httpx.post(f"{base_url}{path}", json=body, timeout=60)
        assert resp.status_code == 400, (path, body, resp.text[:300])
        error = resp.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == param, (path, error)
    assert (
        httpx.post(f"{base_url}/v1/rerank", json={"model": "nope", "query": "q", "documents": ["d"]}).status_code == 404
    )
