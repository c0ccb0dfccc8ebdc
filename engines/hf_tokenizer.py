"""`Tokenizer` over a Hugging Face tokenizer; shared by every engine that loads HF/GGUF weights."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from engines.interface import Tokenizer


class HFTokenizer(Tokenizer):
    def __init__(self, hf_tokenizer: Any) -> None:
        self._tok = hf_tokenizer
        self._special = list(hf_tokenizer.all_special_ids)

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
