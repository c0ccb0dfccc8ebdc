"""The grammar runtime: one sequence's position in a compiled grammar (llguidance), as the `TokenConstraint` the
engine's sampler asks for its allowed-token mask on the step thread.

Compiling grammars (schema checks, limits, the per-model cache, request errors) is the gateway's
(`gateway/llm/grammar_compiler.py`); what runs inside a step is here, beside the contract it implements, so the
engine layer holds the code its sampler calls. llguidance is only named for types: an engine that enforces specs
itself never loads it.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import numpy as np
import torch

from engines.token_constraint import TokenConstraint

if TYPE_CHECKING:
    import llguidance

log = logging.getLogger("switchyard.guided")


def short_error(error: str) -> str:
    """llguidance's error text, first line, in words a client can act on."""
    first = error.strip().splitlines()[0][:300] if error.strip() else "unknown error"
    if first == "NoExtensionBias":
        return "no JSON value satisfies it (e.g. a $ref that only refers to itself)"
    return first


class GrammarConstraint(TokenConstraint):
    """One sequence's position in a grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: list[int]) -> None:
        self._matcher = matcher
        self._eos = eos_token_ids
        self._failed = False

    def allowed_mask(self, vocab_size: int) -> torch.Tensor:
        raw = self._matcher.compute_logit_bias()  # one byte per token: 0 = banned, 200 = allowed
        # numpy for the conversion: a few microseconds, where each small torch op costs tens on a busy CPU
        mask = np.frombuffer(raw, dtype=np.uint8)[:vocab_size] != 0
        if mask.shape[0] < vocab_size:
            mask = np.concatenate([mask, np.zeros(vocab_size - mask.shape[0], dtype=bool)])
        if not mask.any():  # never leave the sampler with nothing to pick: end the sequence instead
            mask[[t for t in self._eos if t < vocab_size]] = True
        return torch.from_numpy(mask)

    def accept(self, token_id: int) -> None:
        # Called from the scheduler's loop: never raise. A rejected token (an engine that ignored the mask) puts
        # the matcher in its error state, where it allows only end-of-sequence.
        if not self._matcher.consume_token(token_id) and not self._failed:
            self._failed = True
            log.debug("guided decoding: token %d rejected (%s)", token_id, short_error(self._matcher.get_error()))

    @property
    def is_accepting(self) -> bool:
        return self._matcher.is_accepting()


class CompiledGrammar:
    """A compiled grammar; `constraint()` makes a fresh per-sequence copy."""

    def __init__(self, matcher: llguidance.LLMatcher, eos_token_ids: list[int]) -> None:
        self._matcher = matcher
        self._eos = eos_token_ids

    def constraint(self) -> GrammarConstraint:
        return GrammarConstraint(self._matcher.deep_copy(), self._eos)
