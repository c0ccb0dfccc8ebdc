"""The embedding contract on tensor models, shared by /v1/embeddings and rerank: a model embeds when it has a BYTES
input `TEXT` and an FP32 output `EMBEDDING` (the transformers backend's embed task, or any python model written
that way); token-id input also needs an INT64 input `INPUT_IDS`, and usage counts come from an optional INT32 output
`TOKEN_COUNT`. Requests go through the model's dynamic batcher, so different clients share backend calls."""

from __future__ import annotations

import asyncio

import numpy as np

from gateway.errors import InvalidRequestError
from gateway.repository.loaded_model import LoadedModel, LoadedTensorModel
from gateway.tensor.model import TensorModel
from gateway.tensor.tensors import InputTensor


def can_embed(tensor: TensorModel) -> bool:
    """Whether the latest version has the embedding contract's tensors."""
    entry = tensor.version()
    inputs = {s.name: s.datatype for s in entry.inputs}
    outputs = {s.name: s.datatype for s in entry.outputs}
    return inputs.get("TEXT") == "BYTES" and outputs.get("EMBEDDING") == "FP32"


def embedding_model(model: LoadedModel) -> TensorModel:
    """The model's runtime if it can embed; 400 otherwise."""
    if isinstance(model, LoadedTensorModel) and can_embed(model.tensor):
        return model.tensor
    raise InvalidRequestError(f"The model '{model.name}' does not produce embeddings.", param="model")


def lowest_priority(tensor: TensorModel) -> int | None:
    """The dynamic batcher's last priority level, where work that must not delay others waits; None without
    levels."""
    batching = tensor.config.dynamic_batching
    return batching.priority_levels if batching is not None and batching.priority_levels else None


def embedding_width(tensor: TensorModel) -> int | None:
    """The declared length of a vector, when the config fixes it."""
    width = next((s.dims[-1] for s in tensor.version().outputs if s.name == "EMBEDDING" and s.dims), None)
    return width if width is not None and width > 0 else None


async def embed(
    tensor: TensorModel, items: list[str | list[int]], priority: int | None = None
) -> tuple[list[np.ndarray], int]:
    """One batcher request per run of texts (at most max_batch_size rows) and per token list, all at once; returns
    a vector per item and the tokens the model read. `priority`: the batcher's priority level (None: the model's
    default)."""
    limit = max(1, tensor.config.max_batch_size)
    batched = tensor.config.max_batch_size > 0
    input_names = {s.name for s in tensor.version().inputs}
    groups: list[list[int]] = []
    for index, item in enumerate(items):
        last = groups[-1] if groups else None
        if isinstance(item, str) and last and isinstance(items[last[0]], str) and len(last) < limit:
            last.append(index)
        else:
            groups.append([index])
    if any(isinstance(i, list) for i in items) and "INPUT_IDS" not in input_names:
        raise InvalidRequestError("this model does not accept token ids; send text", param="input")

    parameters = {"priority": priority} if priority is not None else None

    async def run(group: list[int]) -> dict[str, np.ndarray]:
        first = items[group[0]]
        if isinstance(first, str):
            array = np.array([[items[i].encode("utf-8")] for i in group], dtype=object)  # type: ignore[union-attr]
            tensor_in = InputTensor("TEXT", "BYTES", array if batched else array.reshape(-1))
        else:
            ids = np.array([first], dtype=np.int64)
            tensor_in = InputTensor("INPUT_IDS", "INT64", ids if batched else ids.reshape(-1))
        _, outputs = await tensor.infer([tensor_in], parameters=parameters)
        return {o.name: o.array for o in outputs}

    results = await asyncio.gather(*(run(g) for g in groups))
    vectors: list[np.ndarray] = [np.empty(0)] * len(items)
    tokens = 0
    for group, result in zip(groups, results, strict=True):
        embeddings = np.asarray(result["EMBEDDING"], dtype=np.float32).reshape(len(group), -1)
        for row, index in enumerate(group):
            vectors[index] = embeddings[row]
        if "TOKEN_COUNT" in result:
            tokens += int(np.asarray(result["TOKEN_COUNT"]).sum())
    return vectors, tokens
