"""Prompt-lookup (n-gram) drafting: propose the tokens that followed the latest earlier occurrence of a sequence's
last n tokens, in its prompt or output (vLLM's `ngram` method, llama.cpp's prompt lookup). No second model.

Text that quotes its context (a summary or an edit of a given text, an answer from a pasted document, code that
repeats its identifiers) repeats long runs of earlier tokens; there the proposal is often right for several tokens.
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """One sequence's n-grams (n from `min_n` to `max_n`), each mapped to where the token after its latest
    occurrence sits. Built incrementally: each new token adds one entry per n, so a proposal costs O(max_n) dict
    lookups whatever the length, never a scan of the sequence."""

    def __init__(self, min_n: int, max_n: int) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min ({min_n}) <= max ({max_n})")
        self.min_n, self.max_n = min_n, max_n
        self._after: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in range(min_n, max_n + 1)}
        self._next = 1  # the next position p whose preceding n-grams are to be indexed (p = 1 .. len - 1)

    def _extend(self, tokens: Sequence[int]) -> None:
        """Index the n-grams that end just before positions self._next .. len(tokens) - 1: only n-grams with a
        token after them can propose anything. Later occurrences replace earlier ones (the latest wins)."""
        for p in range(self._next, len(tokens)):
            for n, table in self._after.items():
                if p >= n:
                    table[tuple(tokens[p - n : p])] = p
        self._next = max(self._next, len(tokens))

    def propose(self, tokens: Sequence[int], k: int) -> list[int]:
        """Up to `k` tokens: those after the latest earlier occurrence of the longest suffix of `tokens` (from max_n
        down to min_n tokens) seen before; empty when no suffix has occurred. `tokens` only ever grows between
        calls (prompt + output of one sequence)."""
        self._extend(tokens)
        end = len(tokens)
        if k <= 0:
            return []
        for n in range(min(self.max_n, end), self.min_n - 1, -1):
            at = self._after[n].get(tuple(tokens[end - n :]))
            if at is not None:
                return list(tokens[at : at + k])
        return []
