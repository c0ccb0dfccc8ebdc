"""Turns sampled token ids into text deltas and finish decisions, for engines that give us raw tokens.

Detokenization is incremental (vLLM's prefix/read offsets) so a multi-byte character is never split across
deltas. Stop strings are cut from the output; while streaming, text that could be the start of a stop string is
held back until it is known not to be one.
"""

from __future__ import annotations

from engines.interface import Tokenizer
from engines.types import SamplingParams

_CONTEXT_TOKENS = 5  # prompt tokens used as decoding context, so the first output token keeps its leading space


class OutputProcessor:
    def __init__(
        self, tokenizer: Tokenizer, prompt_ids: list[int], params: SamplingParams, eos_token_ids: list[int]
    ) -> None:
        self._tok = tokenizer
        self._params = params
        self._eos = set() if params.ignore_eos else set(eos_token_ids)
        self._stop_ids = set(params.stop_token_ids)
        self._ids = list(prompt_ids[-_CONTEXT_TOKENS:])
        self._prefix_offset = 0
        self._read_offset = len(self._ids)
        self._pending = ""  # decoded but not yet released (possible stop-string prefix)
        self._hold = max((len(s) for s in params.stop), default=1) - 1
        self.num_tokens = 0
        self.finish_reason: str | None = None

    def _decode_delta(self, token: int) -> str:
        skip = self._params.skip_special_tokens
        self._ids.append(token)
        prefix = self._tok.decode(self._ids[self._prefix_offset : self._read_offset], skip_special_tokens=skip)
        full = self._tok.decode(self._ids[self._prefix_offset :], skip_special_tokens=skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            self._prefix_offset, self._read_offset = self._read_offset, len(self._ids)
            return full[len(prefix) :]
        return ""

    def add_token(self, token: int, max_total_reached: bool = False) -> str:
        """Account for one sampled token; return the text that may be released now."""
        self.num_tokens += 1
        params = self._params
        if token in self._eos or token in self._stop_ids:
            self.finish_reason = "stop"
            if token in self._stop_ids and not params.skip_special_tokens:
                self._pending += self._decode_delta(token)
            return self._flush()
        self._pending += self._decode_delta(token)
        for stop in params.stop:
            at = self._pending.find(stop)
            if at != -1:
                self._pending = (
                    self._pending[: at + len(stop)] if params.include_stop_str_in_output else self._pending[:at]
                )
                self.finish_reason = "stop"
                return self._flush()
        if self.num_tokens >= params.max_tokens or max_total_reached:
            self.finish_reason = "length"
            return self._flush()
        if self._hold == 0:
            return self._flush()
        release = self._pending[: max(0, len(self._pending) - self._hold)]
        self._pending = self._pending[len(release) :]
        return release

    def _flush(self) -> str:
        out, self._pending = self._pending, ""
        return out
