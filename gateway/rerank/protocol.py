"""Request models for POST /v1/rerank (Cohere's and Jina's shape, as vLLM and llama.cpp accept it) and
POST /v1/score (vLLM's shape). Unknown fields are accepted and logged."""

from __future__ import annotations

from pydantic import Field, StrictBool, StrictStr

from gateway.openai.protocol import _Lenient

MAX_DOCUMENTS = 1000  # Cohere's limit per request
MAX_TEXT_CHARS = 100_000  # as /v1/embeddings


class DocumentObject(_Lenient):
    text: StrictStr


class RerankRequest(_Lenient):
    model: StrictStr = Field(min_length=1, max_length=256)
    query: StrictStr = Field(min_length=1, max_length=MAX_TEXT_CHARS)
    documents: list[StrictStr | DocumentObject] = Field(min_length=1, max_length=MAX_DOCUMENTS)
    top_n: int | None = Field(None, ge=1)
    return_documents: StrictBool = True  # vLLM's and Jina's default; Cohere's v2 clients ignore the field


Texts = StrictStr | list[StrictStr]


class ScoreRequest(_Lenient):
    model: StrictStr = Field(min_length=1, max_length=256)
    text_1: Texts = Field(max_length=MAX_DOCUMENTS)
    text_2: Texts = Field(max_length=MAX_DOCUMENTS)
