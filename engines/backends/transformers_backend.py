"""The `transformers` backend: sentence embeddings (or sequence classification) from a Hugging Face folder.

The tokenizer lives inside the backend, so clients send text. Tensors (the config may omit them; these are
filled in):

- input `TEXT` (BYTES, dims [1]): one UTF-8 text per row;
- optional input `INPUT_IDS` (INT64, dims [-1]): token ids instead of text (used as given, no special tokens added);
- output `EMBEDDING` (FP32, dims [hidden]) for `task: embed`, or `LOGITS` (FP32, dims [labels]) for `task: classify`;
- output `TOKEN_COUNT` (INT32, dims [1]): tokens the model read for the row (for usage accounting).

Parameters: `task` (embed | classify, default embed), `pooling` (mean | cls; default from the sentence-transformers
`1_Pooling/config.json`, else mean), `normalize` (true | false, default true: L2 normalisation as
sentence-transformers' Normalize module), `max_length` (tokens per text; longer texts are truncated, as
sentence-transformers does; default its `max_seq_length`, else the tokenizer's limit, at most 512), `dtype`
(float32 | bfloat16). All rows of all requests in a batch go through one padded forward pass, on the model's share of
the CPU (`cpu_threads`: torch threads set on the batch's thread, engines/torch_threads.py).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from engines.cpu_budget import cpu_budget
from engines.interface import TensorBackend
from engines.torch_threads import TorchThreads
from engines.types import TensorModelSpec, TensorSpec


class _Texts(list):
    """The TEXT rows of one request, tokenized later together with the rest of the batch."""


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


class TransformersBackend(TensorBackend):
    def __init__(self) -> None:
        self._model: Any = None
        self._tokenizer: Any = None
        self._spec: TensorModelSpec | None = None
        self._task = "embed"
        self._pooling = "mean"
        self._normalize = True
        self._max_length = 512
        self._described: dict[str, Any] = {}
        self.threads = TorchThreads(1)

    def load(self, spec: TensorModelSpec) -> None:
        import torch
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        folder = Path(spec.source or spec.version_dir)
        if not (folder / "config.json").is_file():
            raise ValueError(f"model '{spec.name}': no Hugging Face model (config.json) in its source folder")
        params = spec.parameters
        self._task = params.get("task", "embed")
        if self._task not in ("embed", "classify"):
            raise ValueError(f"parameter task={self._task!r}: use 'embed' or 'classify'")
        pooling_cfg = _read_json(folder / "1_Pooling" / "config.json")
        self._pooling = params.get("pooling", "cls" if pooling_cfg.get("pooling_mode_cls_token") else "mean")
        if self._pooling not in ("mean", "cls"):
            raise ValueError(f"parameter pooling={self._pooling!r}: use 'mean' or 'cls'")
        self._normalize = params.get("normalize", "true").lower() in ("true", "1", "yes")
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}.get(params.get("dtype", "float32"))
        if dtype is None:
            raise ValueError("parameter dtype: use 'float32' or 'bfloat16'")
        self._tokenizer = AutoTokenizer.from_pretrained(folder)
        auto = AutoModelForSequenceClassification if self._task == "classify" else AutoModel
        self._model = auto.from_pretrained(folder, dtype=dtype).eval()
        config = self._model.config
        limit = min(
            getattr(config, "max_position_embeddings", 512) or 512, self._tokenizer.model_max_length or 512, 512
        )
        default_len = _read_json(folder / "sentence_bert_config.json").get("max_seq_length", limit)
        self._max_length = min(int(params.get("max_length", default_len)), limit)
        self._spec = spec
        self.threads = TorchThreads(spec.cpu_threads or cpu_budget().threads)
        width = config.num_labels if self._task == "classify" else config.hidden_size
        out_name = "LOGITS" if self._task == "classify" else "EMBEDDING"
        self._described = {
            "inputs": [TensorSpec("TEXT", "BYTES", [1]), TensorSpec("INPUT_IDS", "INT64", [-1], optional=True)],
            "outputs": [TensorSpec(out_name, "FP32", [width]), TensorSpec("TOKEN_COUNT", "INT32", [1])],
            "max_model_len": self._max_length,
            "vocab_size": len(self._tokenizer),
            "embedding_dim": width,
        }
        # TEXT becomes optional when INPUT_IDS may replace it.
        self._described["inputs"][0].optional = True

    def describe(self) -> dict[str, Any]:
        return self._described

    def _parse(self, request: dict[str, Any]) -> list[list[int]] | _Texts:
        """One request's rows: token ids (INPUT_IDS, checked and truncated) or texts (TEXT) still to tokenize."""
        vocab = self._described["vocab_size"]
        if "INPUT_IDS" in request:
            ids = np.asarray(request["INPUT_IDS"])
            ids = ids.reshape(1, -1) if ids.ndim == 1 else ids.reshape(ids.shape[0], -1)
            if ids.size and (ids.min() < 0 or ids.max() >= vocab):
                raise ValueError(f"token ids must be in [0, {vocab})")
            if ids.shape[1] == 0:
                raise ValueError("INPUT_IDS rows must not be empty")
            return [row[: self._max_length].tolist() for row in ids]
        if "TEXT" not in request:
            raise ValueError("send either TEXT or INPUT_IDS")
        texts = _Texts()
        for item in np.asarray(request["TEXT"], dtype=object).ravel():
            raw = item if isinstance(item, (bytes, bytearray)) else str(item).encode("utf-8")
            try:
                texts.append(bytes(raw).decode("utf-8"))
            except UnicodeDecodeError:
                raise ValueError("TEXT must be UTF-8") from None
        return texts

    def execute(self, requests: list[dict[str, Any]]) -> list[Any]:
        assert self._spec is not None
        parsed: list[list[list[int]] | _Texts | Exception] = []
        for request in requests:
            try:
                parsed.append(self._parse(request))
            except ValueError as exc:
                parsed.append(exc)
        # every text of the batch in one tokenizer call rather than one call per request
        texts = [text for item in parsed if isinstance(item, _Texts) for text in item]
        encoded = iter(
            self._tokenizer(texts, truncation=True, max_length=self._max_length)["input_ids"] if texts else []
        )
        per_request = [[list(next(encoded)) for _ in item] if isinstance(item, _Texts) else item for item in parsed]
        rows = [row for item in per_request if not isinstance(item, Exception) for row in item]
        vectors = self._forward(rows) if rows else np.zeros((0, self._described["embedding_dim"]), np.float32)
        out_name = self._described["outputs"][0].name
        results: list[Any] = []
        offset = 0
        for item in per_request:
            if isinstance(item, Exception):
                results.append(item)
                continue
            n = len(item)
            counts = np.array([[len(r)] for r in item], dtype=np.int32)
            vecs = vectors[offset : offset + n]
            offset += n
            if self._spec.max_batch_size == 0:
                vecs, counts = vecs.reshape(n, -1), counts.reshape(n, 1)
            results.append({out_name: vecs, "TOKEN_COUNT": counts})
        return results

    def _forward(self, rows: list[list[int]]) -> np.ndarray:
        import torch

        batch = self._tokenizer.pad({"input_ids": rows}, padding=True, return_tensors="pt")
        self.threads.enter()  # its share of the CPU, on this batch thread (engines/torch_threads.py)
        with torch.inference_mode():
            out = self._model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"])
            if self._task == "classify":
                return out.logits.float().numpy()
            hidden = out.last_hidden_state.float()
            if self._pooling == "cls":
                pooled = hidden[:, 0]
            else:
                mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            if self._normalize:
                pooled = torch.nn.functional.normalize(pooled, p=2, dim=1)
            return pooled.numpy()

    def unload(self) -> None:
        self._model = None
        self._tokenizer = None
