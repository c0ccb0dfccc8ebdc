"""`Tokenizer` over a Hugging Face tokenizer; shared by every engine that loads HF/GGUF weights."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from engines.interface import Tokenizer

# Normalizers that never remove text (Unicode composition can merge a few code points into one: hence the margin).
_KEEPING_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD", "Prepend", "Lowercase", "Sequence"}
_NORMALIZER_MARGIN = 4


def _keeps_text(normalizer: dict[str, Any] | None) -> bool:
    if normalizer is None:
        return True
    kind = normalizer.get("type")
    if kind == "Replace":
        return bool(normalizer.get("content"))
    if kind not in _KEEPING_NORMALIZERS:
        return False
    return all(_keeps_text(n) for n in normalizer.get("normalizers", []))


def max_chars_per_token(hf_tokenizer: Any) -> int | None:
    """The longest vocabulary entry, in characters (a byte-level token's string has one character per byte, so
    this bounds the text a token stands for), or None when the tokenizer may make any length of text into a few
    tokens (a normalizer that drops text, a token that strips the whitespace beside it) or is not a fast one."""
    backend = getattr(hf_tokenizer, "backend_tokenizer", None)
    if backend is None:
        return None
    added = getattr(hf_tokenizer, "added_tokens_decoder", {}) or {}
    if any(getattr(t, "lstrip", False) or getattr(t, "rstrip", False) for t in added.values()):
        return None  # such a token swallows the whitespace around it, however long
    longest = max((len(token) for token in hf_tokenizer.get_vocab()), default=0)
    if longest <= 0:
        return None
    if backend.normalizer is None:
        return longest
    if not _keeps_text(json.loads(backend.to_str()).get("normalizer")):
        return None
    return longest * _NORMALIZER_MARGIN


class HFTokenizer(Tokenizer):
    def __init__(self, hf_tokenizer: Any) -> None:
        self._tok = hf_tokenizer
        self._special = list(hf_tokenizer.all_special_ids)
        self._max_chars = max_chars_per_token(hf_tokenizer)

    @property
    def hf(self) -> Any:
        return self._tok

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        return list(self._tok.convert_ids_to_tokens(list(token_ids)))

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        **template_kwargs: Any,
    ) -> list[int]:
        # Render to text, then encode without adding special tokens: the template already holds them (vLLM does
        # the same, so prompt token counts agree with vLLM's).
        text = self._tok.apply_chat_template(
            messages, tools=tools, add_generation_prompt=add_generation_prompt, tokenize=False, **template_kwargs
        )
        return self.encode(text, add_special_tokens=False)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    @property
    def all_special_ids(self) -> list[int]:
        return self._special

    @property
    def max_chars_per_token(self) -> int | None:
        return self._max_chars
