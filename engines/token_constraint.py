"""The guided-decoding contract, on its own so that `types.py` (which carries it in `SamplingParams`) and
`interface.py` (the engines' contracts) both import it without importing each other."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any


class TokenConstraint(ABC):
    """Restricts which token may come next, for one sequence (guided decoding): a compiled `GuidedSpec`.

    The engine asks for the mask right before sampling (on its worker thread); the scheduler reports each
    sampled token with `accept` (on the event loop) before the next step. A finished constraint allows only
    end-of-sequence tokens, so generation stops with finish_reason "stop".
    """

    @abstractmethod
    def allowed_mask(self, vocab_size: int) -> Any | None:
        """A bool torch tensor [vocab_size], True where allowed; None if every token is allowed now."""

    @abstractmethod
    def accept(self, token_id: int) -> None:
        """Advance past a sampled token."""
