"""A `Tokenizer` for tests without a model: one token per letter, 'a' = 1 ... 'z' = 26, 0 is end-of-sequence."""

from __future__ import annotations

from collections.abc import Sequence

from engines.interface import Tokenizer

EOS = 0


class CharTokenizer(Tokenizer):
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) - ord("a") + 1 for c in text]

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return "".join(chr(ord("a") + t - 1) for t in token_ids if t != EOS)

    def convert_ids_to_tokens(self, token_ids: Sequence[int]) -> list[str]:
        return [self.decode([t]) for t in token_ids]

    def apply_chat_template(self, messages, tools=None, add_generation_prompt=True, **kw):  # type: ignore[no-untyped-def]
        return self.encode("".join(m["content"] for m in messages))

    @property
    def vocab_size(self) -> int:
        return 27

    @property
    def all_special_ids(self) -> list[int]:
        return [EOS]
