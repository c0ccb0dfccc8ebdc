"""Relevance as the cosine similarity of bi-encoder embeddings.

The texts go to the embedding model through its dynamic batcher (the same path as /v1/embeddings, so they share
batches with other clients' requests); each pair's score is the cosine of the angle between the two vectors, in
[-1, 1]. A bi-encoder embeds query and document apart, so this ranks less sharply than a cross-encoder reading the
pair together, but it serves rerank and score from the embedding model every deployment already has.
"""

from __future__ import annotations

import numpy as np

from gateway.errors import InvalidRequestError
from gateway.repository.loaded_model import LoadedModel
from gateway.rerank.protocol import MAX_TEXT_CHARS
from gateway.tensor.embedding import embed, embedding_model


def _check(texts: list[str], param: str) -> None:
    for i, text in enumerate(texts):
        if not text:
            raise InvalidRequestError(f"{param}.{i} must not be empty", param=param)
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidRequestError(f"{param}.{i} is longer than {MAX_TEXT_CHARS} characters", param=param)


async def similarities(
    model: LoadedModel, left: list[str], right: list[str], params: tuple[str, str]
) -> tuple[list[float], int]:
    """Cosine similarity of left[i] and right[i] (`left` may hold one text, paired with each of `right`), and the
    tokens the model read. Texts used twice are embedded once."""
    _check(left, params[0])
    _check(right, params[1])
    tensor = embedding_model(model)
    unique = list(dict.fromkeys([*left, *right]))
    vectors, tokens = await embed(tensor, list(unique))
    by_text = {text: np.asarray(v, dtype=np.float64) for text, v in zip(unique, vectors, strict=True)}
    pairs = zip(left * len(right) if len(left) == 1 else left, right, strict=True)
    scores = []
    for a, b in pairs:
        u, v = by_text[a], by_text[b]
        norms = float(np.linalg.norm(u) * np.linalg.norm(v))
        scores.append(float(u @ v / norms) if norms > 0 else 0.0)
    return scores, tokens
