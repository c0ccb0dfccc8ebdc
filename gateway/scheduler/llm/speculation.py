"""When a sequence gets a speculative proposal, and how many tokens: the scheduler's half of speculative decoding.

The engine verifies a proposal in the same step as the rest of the batch (engines/types.py `SequenceStep`) and
keeps the output exact; what speculation decides here is only speed, by three rules:

* Only requests whose every token can be verified exactly are proposed for: not those with logprobs (a
  verification step reports none), a grammar constraint (its state advances token by token) or sampling with a
  seed (a seed must give the same text whatever else runs: speculation draws its random numbers differently and is
  switched on and off by the load).
* No proposals while more than `disable_by_batch_size` sequences run (vLLM's name): a verification step adds k rows
  per sequence, nearly free on a memory-bound step of a few rows, but a full batch is compute-bound already.
* A proposal is as long as its tokens have a fair chance: after each verification the fraction of the proposal
  that was accepted enters a moving average `a` (weight 1/4, starting at 3/4), and the next proposal has the
  largest j <= k tokens with a^j >= 0.2 (at least one): the j-th token is accepted only if all before it were, and
  each proposed token adds a row to the step.
* A sequence whose proposals keep failing stops getting them for a while: when `a` falls below `min_acceptance`
  the sequence is paused for 16 output tokens, then 32, 64 ... (at most 256) while it stays low (a fully accepted
  proposal resets the pause to 16), and starts again from the average's initial value. A sequence whose last
  n-gram occurred nowhere before gets no proposal and costs nothing.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from engines.types import SamplingParams
from gateway.scheduler.llm.ngram_draft import NgramIndex

EMA_WEIGHT = 0.25
EMA_START = 0.75
# A proposed token is worth its row while the chance that it is accepted is at least this: a verification row
# costs a tenth to a sixth of a one-token step (verification steps are replayed in one C call like decode steps)
WORTH = 0.2
PAUSE_FIRST, PAUSE_MAX = 16, 256


def verifiable(params: SamplingParams) -> bool:
    """Whether a request's tokens can be verified exactly (see the module docstring)."""
    return (
        params.logprobs is None
        and params.constraint is None
        and params.guided is None
        and (params.greedy or params.seed is None)
    )


@dataclass
class SequenceSpeculation:
    """One sequence's proposer and acceptance record."""

    index: NgramIndex
    acceptance: float = EMA_START
    paused_until: int = 0  # no proposals before this many output tokens
    pause: int = PAUSE_FIRST
    drafted: int = field(default=0)
    accepted: int = field(default=0)

    def propose(self, tokens: list[int], num_output: int, k: int) -> list[int]:
        if num_output < self.paused_until or k <= 0:
            return []
        return self.index.propose(tokens, min(k, self.length()))

    def length(self) -> int:
        """How many tokens the next proposal may have: the largest j with acceptance^j >= WORTH, at least one."""
        a = self.acceptance
        return 16 if a >= 1.0 else max(1, int(math.log(WORTH) / math.log(a))) if a > 0 else 1

    def record(self, proposed: int, accepted: int, num_output: int, min_acceptance: float) -> None:
        """Account for one verification; pause the sequence when its moving acceptance falls below the floor."""
        self.drafted += proposed
        self.accepted += accepted
        self.acceptance += EMA_WEIGHT * (accepted / proposed - self.acceptance)
        if self.acceptance < min_acceptance:
            self.paused_until = num_output + self.pause
            self.pause = min(2 * self.pause, PAUSE_MAX)
            self.acceptance = EMA_START
        elif accepted == proposed:
            self.pause = PAUSE_FIRST
