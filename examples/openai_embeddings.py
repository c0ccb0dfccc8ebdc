"""Embeddings with the openai SDK, served by all-MiniLM-L6-v2 through the dynamic batcher.

    switchyard serve --model-repository model_repository      # in another terminal
    python examples/openai_embeddings.py

Prints the vector size (384), the cosine similarity of two related and two unrelated sentences, and a 128-dim
vector fetched as base64 (`dimensions` truncates and renormalises).
"""

import base64
import struct

from _common import API_KEY, BASE_URL
from openai import OpenAI

client = OpenAI(base_url=BASE_URL, api_key=API_KEY)
texts = ["A train leaves the station.", "The locomotive departs from the platform.", "I like green tea."]
vectors = [d.embedding for d in client.embeddings.create(model="all-minilm-l6-v2", input=texts).data]


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))  # the vectors are L2-normalised


print(f"dimensions: {len(vectors[0])}")
print(f"related: {cosine(vectors[0], vectors[1]):.2f}  unrelated: {cosine(vectors[0], vectors[2]):.2f}")
short = client.embeddings.create(model="all-minilm-l6-v2", input=texts[0], dimensions=128, encoding_format="base64")
raw = base64.b64decode(short.data[0].embedding)  # little-endian float32, as OpenAI sends it
truncated = struct.unpack(f"<{len(raw) // 4}f", raw)
print(
    f"truncated: {len(truncated)} dims, norm {sum(x * x for x in truncated) ** 0.5:.2f}, "
    f"usage {short.usage.prompt_tokens} tokens"
)
