"""transformers' greedy answer to a prompt: what the native engine's answers are compared with, token for token.

It is the answer to a request with `ignore_eos` (the tests' requests): an end-of-sequence token is taken like any
other and generation goes on, nothing is masked. Beside the tokens: each one's logprob (the engine's must be within
1e-4) and each step's margin between the reference's top two logits (a tie there is the only excuse for another
token).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class Reference:
    tokens: list[int]
    logprobs: list[float]
    margins: list[float]


def greedy_reference(model: Any, ids: list[int], new_tokens: int) -> Reference:
    """`model`'s (a transformers causal LM) greedy `new_tokens` after prompt `ids`."""
    out = model.generate(
        torch.tensor([ids]),
        max_new_tokens=new_tokens,
        do_sample=False,
        output_logits=True,
        return_dict_in_generate=True,
        eos_token_id=None,
        pad_token_id=0,
    )
    tokens = out.sequences[0, len(ids) :].tolist()
    logits = torch.stack(out.logits)[:, 0].float()
    logprobs = torch.log_softmax(logits, dim=-1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
    top = logits.topk(2, dim=-1).values
    return Reference(tokens, logprobs, (top[:, 0] - top[:, 1]).tolist())
