"""KV sessions: time to first token of a conversation's second turn against its cold first turn (~1k tokens).

Turn 1 sends a long history (cold: nothing cached). Turn 2 sends that history plus the answer and a new
question, with the same `X-Session-ID`: its pinned blocks are reused, so only the new tokens are prefilled. Filler
traffic between the turns tries to push the conversation out of the prefix cache; the session keeps it.

    python bench/session_bench.py [--rounds 5]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.serve_bench import MODEL, start_switchyard, stop  # noqa: E402

HISTORY = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(90))  # ~1k tokens


def ttft(client: httpx.Client, prompt: str, session: str | None) -> tuple[float, str]:
    headers = {"X-Session-ID": session} if session else {}
    body = {"model": MODEL, "prompt": prompt, "max_tokens": 8, "temperature": 0, "stream": True}
    start = time.perf_counter()
    first, text = None, ""
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if line.startswith("data: {") and '"text":"' in line and first is None:
                first = time.perf_counter() - start
            if line.startswith("data: {"):
                import json

                chunk = json.loads(line[6:])
                text += "".join(c.get("text", "") for c in chunk.get("choices", []))
    return first or 0.0, text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_switchyard("float32", Path(tmp))
        try:
            cold, warm = [], []
            with httpx.Client(base_url=url, timeout=600) as client:
                for r in range(args.rounds):
                    history = f"Conversation {r}. {HISTORY}\nQuestion: what is 7 squared?\nAnswer:"
                    t1, answer = ttft(client, history, f"bench-{r}")
                    for f in range(4):  # unrelated traffic between the turns
                        ttft(client, f"Filler {r}-{f}. " + HISTORY[::-1][:2000], None)
                    t2, _ = ttft(client, history + answer + "\nQuestion: and 8 squared?\nAnswer:", f"bench-{r}")
                    cold.append(t1)
                    warm.append(t2)
                    client.delete(f"/v1/sessions/bench-{r}")
        finally:
            stop(proc)
    c, w = statistics.median(cold), statistics.median(warm)
    print("| turn | TTFT p50 (ms) |\n|---|---|")
    print(f"| first (cold, ~1k tokens) | {c * 1000:.0f} |\n| second (session) | {w * 1000:.0f} |")
    print(f"| **ratio cold/warm** | {c / w:.1f}x |")


if __name__ == "__main__":
    main()
