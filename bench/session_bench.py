"""KV sessions: time to first token of a conversation's second turn, with a session and without one (control).

Each round runs two conversations, one per arm, on the same server, the arms taking turns:

* **session**: turn 1 sends a long history (~1.5k tokens, cold: nothing cached) with `X-Session-ID`; then filler
  traffic; then turn 2 (the history, the answer and a new question) with the same session id. The session's pinned
  blocks are reused, so only the new tokens are prefilled.
* **control**: the same traffic without a session id. Only the prefix cache could keep the history.

The KV pool is small (`--kv-tokens`, default 4096) and the filler traffic between the turns fills it more than
twice over, so the prefix cache evicts an unpinned history: the control arm's second turn recomputes it and the
ratio of the arms is what sessions add over prefix caching (with a pool large enough to keep everything, both arms
would hit the cache). The server's `cached_tokens` of each second turn are printed to show which arm was served
from cache.

    python bench/session_bench.py [--rounds 5] [--kv-tokens 4096] [--fillers N]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import stop  # noqa: E402
from bench.serve_bench import MODEL, start_switchyard  # noqa: E402

HISTORY = " ".join(f"Fact {i}: the number {i} squared is {i * i}." for i in range(90))  # ~1.5k tokens
FILLER = HISTORY[::-1][:2000]  # ~1k tokens that share no prefix with the history


def ttft(client: httpx.Client, prompt: str, session: str | None) -> tuple[float, str, int]:
    """(time to first token, the answer, cached prompt tokens) of one streamed completion."""
    headers = {"X-Session-ID": session} if session else {}
    body = {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": 8,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first, text, cached = None, "", 0
    with client.stream("POST", "/v1/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: {"):
                continue
            chunk = json.loads(line[6:])
            piece = "".join(c.get("text", "") for c in chunk.get("choices", []))
            if piece and first is None:
                first = time.perf_counter() - start
            text += piece
            details = (chunk.get("usage") or {}).get("prompt_tokens_details") or {}
            cached = details.get("cached_tokens") or cached
    return first or 0.0, text, cached


def conversation(client: httpx.Client, name: str, session: str | None, fillers: int) -> tuple[float, float, int]:
    """(first turn TTFT, second turn TTFT, cached tokens of the second turn)."""
    history = f"Conversation {name}. {HISTORY}\nQuestion: what is 7 squared?\nAnswer:"
    t1, answer, _ = ttft(client, history, session)
    for f in range(fillers):  # unrelated traffic between the turns, more than the pool holds
        ttft(client, f"Filler {name}-{f}. {FILLER}", None)
    t2, _, cached = ttft(client, history + answer + "\nQuestion: and 8 squared?\nAnswer:", session)
    if session:
        client.delete(f"/v1/sessions/{session}")
    return t1, t2, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--kv-tokens", type=int, default=4096, help="KV pool of the server, in tokens")
    parser.add_argument("--fillers", type=int, help="filler requests between the turns (default: 2x the pool)")
    args = parser.parse_args()
    fillers = args.fillers if args.fillers is not None else max(2, 2 * args.kv_tokens // 1000)
    # sessions may pin half the pool (the default quarter would not hold a ~1.5k-token conversation in a small pool)
    kv = {"max_tokens": args.kv_tokens, "session_max_tokens": args.kv_tokens // 2}
    arms: dict[str, dict[str, list[float]]] = {
        a: {"cold": [], "warm": [], "cached": []} for a in ("session", "control")
    }
    with tempfile.TemporaryDirectory() as tmp:
        proc, url = start_switchyard("float32", Path(tmp), kv_options=kv)
        try:
            with httpx.Client(base_url=url, timeout=600) as client:
                for r in range(args.rounds):
                    order = ("session", "control") if r % 2 == 0 else ("control", "session")
                    for arm in order:
                        session = f"bench-{r}" if arm == "session" else None
                        t1, t2, cached = conversation(client, f"{r}-{arm}", session, fillers)
                        arms[arm]["cold"].append(t1)
                        arms[arm]["warm"].append(t2)
                        arms[arm]["cached"].append(cached)
                        print(
                            f"round {r + 1} {arm}: first {t1 * 1000:.0f} ms, second {t2 * 1000:.0f} ms, "
                            f"cached {cached}",
                            flush=True,
                        )
        finally:
            stop(proc)
    med = {arm: {k: statistics.median(v) for k, v in d.items()} for arm, d in arms.items()}
    print(
        f"\nKV pool {args.kv_tokens} tokens, {fillers} filler requests (~1k tokens each) between the turns, "
        f"medians of {args.rounds} rounds"
    )
    print("| arm | first turn TTFT (ms) | second turn TTFT (ms) | second turn cached tokens | first / second |")
    print("|---|---|---|---|---|")
    for arm, m in med.items():
        print(
            f"| {arm} | {m['cold'] * 1000:.0f} | {m['warm'] * 1000:.0f} | {m['cached']:.0f} | "
            f"{m['cold'] / m['warm']:.1f}x |"
        )
    print(f"| **second turn, control / session** | | {med['control']['warm'] / med['session']['warm']:.1f}x | | |")


if __name__ == "__main__":
    main()
