"""/api/embed and the legacy /api/embeddings over the embedding models' batchers (gateway/tensor/embedding.py), the
path /v1/embeddings takes.

/api/embed returns L2-normalised vectors, as Ollama does; `dimensions` keeps the first N values and normalises them
again (more than the model's width: the whole vector). `truncate` (default true) cuts texts to the model's window
(`max_length` of its config); with `truncate: false` a text that reaches the window is refused with Ollama's 400.
The backend reports the tokens it read after cutting, so a text of exactly the window's length is refused too. An
empty input answers no vectors, as on Ollama. /api/embeddings returns the model's vector as it is.
"""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.errors import InvalidRequestError
from gateway.ollama.lookup import embeds, unsupported
from gateway.repository.loaded_model import LoadedModel, LoadedTensorModel
from gateway.tensor.embedding import embed

MAX_INPUTS = 2048
MAX_TEXT_CHARS = 100_000


def _texts(raw: str | list[str] | None) -> list[str]:
    texts = [] if raw is None or raw == "" else [raw] if isinstance(raw, str) else list(raw)
    if len(texts) > MAX_INPUTS:
        raise InvalidRequestError(f"input: at most {MAX_INPUTS} texts per request", param="input")
    for text in texts:
        if not text:
            raise InvalidRequestError("input: texts must not be empty", param="input")
        if len(text) > MAX_TEXT_CHARS:
            raise InvalidRequestError(f"input: each text must be at most {MAX_TEXT_CHARS} characters", param="input")
    return texts


def _normalized(vector: np.ndarray) -> np.ndarray:
    vector = np.asarray(vector, dtype=np.float32)
    if not np.isfinite(vector).all():
        raise InvalidRequestError("embedding contains NaN or Inf values")
    return vector / max(float(np.linalg.norm(vector)), 1e-12)


def embedder(model: LoadedModel, name: str) -> LoadedTensorModel:
    if not isinstance(model, LoadedTensorModel) or not embeds(model):
        raise unsupported(name, "embeddings")
    return model


async def embed_texts(
    model: LoadedTensorModel, raw: str | list[str] | None, truncate: bool, dimensions: int | None
) -> tuple[list[np.ndarray], int]:
    """/api/embed's vectors and the tokens read."""
    if dimensions is not None and dimensions < 0:
        raise InvalidRequestError("dimensions must be a positive number of values", param="dimensions")
    texts = _texts(raw)
    if not texts:
        return [], 0
    if truncate:
        vectors, tokens = await embed(model.tensor, list(texts))
    else:  # one request per text, to read each text's tokens (the batcher still runs them together)
        results = await asyncio.gather(*(embed(model.tensor, [text]) for text in texts))
        window = model.max_model_len
        if window and any(count >= window for _, count in results):
            raise InvalidRequestError("the input length exceeds the context length", param="input")
        vectors, tokens = [v for vs, _ in results for v in vs], sum(count for _, count in results)
    out = []
    for vector in vectors:
        vector = _normalized(vector)
        if dimensions and dimensions < vector.shape[0]:
            vector = _normalized(vector[:dimensions])
        out.append(vector)
    return out, tokens


async def embed_prompt(model: LoadedTensorModel, prompt: str) -> np.ndarray | list[float]:
    """/api/embeddings' vector (none for an empty prompt)."""
    if not prompt:
        return []
    _texts(prompt)
    vectors, _ = await embed(model.tensor, [prompt])
    return np.asarray(vectors[0], dtype=np.float32)
