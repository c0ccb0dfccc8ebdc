"""POST /v1/embeddings on the default all-MiniLM-L6-v2 model with the openai SDK, raw HTTP and LangChain."""

from __future__ import annotations

import base64
import concurrent.futures

import httpx
import numpy as np
import openai
import pytest

from tests.conftest import DEFAULT_MODEL, ServerProcess

EMBED = "all-minilm-l6-v2"
# sentence-transformers 6.2 `encode(["hello world"], normalize_embeddings=True)[0, :6]`
HELLO_GOLDEN = [-0.03447727, 0.0310232, 0.00673498, 0.02610899, -0.03936202, -0.16030248]


@pytest.fixture(scope="module")
def client(server: ServerProcess) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def http(server: ServerProcess):
    with httpx.Client(base_url=server.base_url, timeout=120) as c:
        yield c


def assert_openai_error(resp: httpx.Response, status: int, param: str | None = None) -> dict:
    assert resp.status_code == status, resp.text
    err = resp.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["message"]
    if param is not None:
        assert err["param"] == param, err
    return err


def test_sdk_single_and_batch(client: openai.OpenAI) -> None:
    one = client.embeddings.create(model=EMBED, input="hello world")  # the SDK asks for base64 and decodes it
    vector = np.array(one.data[0].embedding)
    assert vector.shape == (384,) and one.model == EMBED
    np.testing.assert_allclose(vector[:6], HELLO_GOLDEN, atol=1e-5)
    assert abs(np.linalg.norm(vector) - 1) < 1e-5
    assert one.usage.prompt_tokens == 4 and one.usage.total_tokens == 4
    many = client.embeddings.create(model=EMBED, input=["a cat", "hello world", "a dog", "hello world"])
    assert [d.index for d in many.data] == [0, 1, 2, 3]
    np.testing.assert_allclose(many.data[1].embedding, one.data[0].embedding, atol=1e-5)
    np.testing.assert_allclose(many.data[3].embedding, many.data[1].embedding, atol=1e-6)
    cat, dog = np.array(many.data[0].embedding), np.array(many.data[2].embedding)
    assert cat @ dog > cat @ vector  # semantically closer


def test_float_base64_and_dimensions(http: httpx.Client) -> None:
    as_float = http.post(
        "/v1/embeddings", json={"model": EMBED, "input": "hello world", "encoding_format": "float"}
    ).json()
    floats = np.array(as_float["data"][0]["embedding"], dtype=np.float32)
    assert as_float["object"] == "list" and as_float["data"][0]["object"] == "embedding"
    as_b64 = http.post(
        "/v1/embeddings", json={"model": EMBED, "input": "hello world", "encoding_format": "base64"}
    ).json()
    decoded = np.frombuffer(base64.b64decode(as_b64["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, floats)
    short = http.post(
        "/v1/embeddings", json={"model": EMBED, "input": "hello world", "dimensions": 64, "encoding_format": "float"}
    ).json()
    cut = np.array(short["data"][0]["embedding"])
    assert cut.shape == (64,) and abs(np.linalg.norm(cut) - 1) < 1e-5
    np.testing.assert_allclose(cut, floats[:64] / np.linalg.norm(floats[:64]), atol=1e-6)
    assert_openai_error(
        http.post("/v1/embeddings", json={"model": EMBED, "input": "x", "dimensions": 385}), 400, "dimensions"
    )


def test_token_id_input(client: openai.OpenAI) -> None:
    text = client.embeddings.create(model=EMBED, input="hello world").data[0].embedding
    ids = client.embeddings.create(model=EMBED, input=[101, 7592, 2088, 102])  # [CLS] hello world [SEP]
    np.testing.assert_allclose(ids.data[0].embedding, text, atol=1e-5)
    assert ids.usage.prompt_tokens == 4
    both = client.embeddings.create(model=EMBED, input=[[101, 7592, 2088, 102], [101, 102]])
    assert len(both.data) == 2 and both.usage.prompt_tokens == 6


@pytest.mark.parametrize(
    ("body", "status", "param"),
    [
        ({"model": EMBED, "input": ""}, 400, "input"),
        ({"model": EMBED, "input": []}, 400, "input"),
        ({"model": EMBED, "input": ["ok", ""]}, 400, "input"),
        ({"model": EMBED, "input": ["a", 1]}, 400, "input"),
        ({"model": EMBED, "input": [[101, -1]]}, 400, "input"),
        ({"model": EMBED, "input": [[101, 10**6]]}, 400, "input"),
        ({"model": EMBED, "input": ["x"] * 2049}, 400, "input"),
        ({"model": EMBED, "input": "x", "encoding_format": "binary"}, 400, "encoding_format"),
        ({"model": EMBED, "input": "x", "dimensions": 0}, 400, "dimensions"),
        ({"model": EMBED}, 400, "input"),
        ({"model": "nope", "input": "x"}, 404, "model"),
        ({"model": DEFAULT_MODEL, "input": "x"}, 400, "model"),
    ],
)
def test_bad_requests(http: httpx.Client, body: dict, status: int, param: str) -> None:
    assert_openai_error(http.post("/v1/embeddings", json=body), status, param)


def test_embedding_model_refuses_chat(http: httpx.Client) -> None:
    body = {"model": EMBED, "messages": [{"role": "user", "content": "hi"}]}
    assert_openai_error(http.post("/v1/chat/completions", json=body), 400, "model")
    assert_openai_error(http.post("/v1/completions", json={"model": EMBED, "prompt": "hi"}), 400, "model")


def test_models_list_includes_the_embedding_model(client: openai.OpenAI, http: httpx.Client) -> None:
    ids = [m.id for m in client.models.list().data]
    assert EMBED in ids and DEFAULT_MODEL in ids
    card = http.get(f"/v1/models/{EMBED}").json()
    assert card["id"] == EMBED and card["max_model_len"] == 256 and card["owned_by"] == "switchyard"


def test_concurrent_clients_are_batched(server: ServerProcess, http: httpx.Client) -> None:
    stats_url = f"/v2/models/{EMBED}/stats"
    before = http.get(stats_url).json()["model_stats"][0]
    texts = [f"sentence number {i} about batching" for i in range(24)]

    def embed(text: str) -> list[float]:
        with httpx.Client(base_url=server.base_url, timeout=120) as c:
            body = c.post("/v1/embeddings", json={"model": EMBED, "input": text, "encoding_format": "float"}).json()
            return body["data"][0]["embedding"]

    with concurrent.futures.ThreadPoolExecutor(12) as pool:
        vectors = list(pool.map(embed, texts))
    after = http.get(stats_url).json()["model_stats"][0]
    requests = after["inference_count"] - before["inference_count"]
    executions = after["execution_count"] - before["execution_count"]
    assert requests == 24 and executions < requests, (requests, executions)
    alone = np.array(embed(texts[5]))
    np.testing.assert_allclose(vectors[5], alone, atol=1e-5)  # each client got its own row back


def test_langchain_openai_embeddings(server: ServerProcess) -> None:
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(
        model=EMBED, base_url=server.base_url + "/v1", api_key="unused", check_embedding_ctx_length=False
    )
    docs = emb.embed_documents(["hello world", "another document"])
    query = emb.embed_query("hello world")
    assert len(docs) == 2 and len(query) == 384
    np.testing.assert_allclose(docs[0], query, atol=1e-5)
