"""Gateway tax of the `openai` backend (an upstream used as it is): llama.cpp's `llama-server` talked to directly,
against Switchyard's passthrough model in front of the same llama-server, same run, same prompts.

Targets (issue 37): through the gateway, >= 0.97x llama-server's output tok/s at c=8 and <= +5 ms TTFT p50 at c=1.
Paired and interleaved: every round sends the same prompts through both arms, one arm after the other, the order
alternating between rounds (AB, BA, ...), so the engine's drift falls on both arms alike. The body is the one
llama_bench's llama-server arm sends (`/v1/completions`, greedy, `ignore_eos`, its prompt cache off), passed
through the gateway unchanged; llama-server gets `--parallel` = the highest level.

    python bench/passthrough_bench.py [--levels 1,8] [--rounds 4] [--prompts 16] [--output-len 64] [--threads 2]
    python bench/passthrough_bench.py --smoke        # one short round at c=1 and c=2: does it run at all
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_server import Started, serve, stop  # noqa: E402
from bench.llamacpp_bench import (  # noqa: E402
    MODEL,
    PARAGRAPHS,
    Round,
    llama_server_body,
    run_http,
    shipped_gguf,
    start_llama_server,
    summarize,
)
from bench.llamacpp_env import SERVER_MISSING, find_llama_server  # noqa: E402

DIRECT, GATEWAY = "llama-server", "switchyard passthrough"


def start_gateway(upstream: Started, workdir: Path, log: Path, max_num_seqs: int) -> Started:
    """Switchyard serving MODEL as an `openai` passthrough to `upstream`, under the same name."""
    folder = workdir / "repo" / MODEL
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(
        f"backend: openai\nmax_model_len: 2048\nscheduler: {{max_num_seqs: {max_num_seqs}}}\n"
        f"openai:\n  base_url: {upstream.url}/v1\n  model: {MODEL}\n"
    )
    return serve(folder.parent, log=log, timeout=1800)


def prompts(count: int, round_: int, level: int) -> list[str]:
    """Prompts unique to the round and level (a number first), so no cache of either arm applies."""
    return [f"{level}.{round_}.{i}. {PARAGRAPHS[(round_ * count + i) % len(PARAGRAPHS)]}" for i in range(count)]


def measure(direct: str, gateway: str, level: int, rounds: int, count: int, output_len: int) -> dict[str, dict]:
    """Per arm: tok/s over each round's wall time and TTFT p50, pooled over the rounds; plus the paired ratios."""
    runs: dict[str, list[Round]] = {DIRECT: [], GATEWAY: []}
    for r in range(rounds):
        bodies = [llama_server_body(p, output_len) for p in prompts(max(count, 2 * level), r, level)]
        arms = [(DIRECT, direct), (GATEWAY, gateway)]
        for arm, url in arms if r % 2 == 0 else arms[::-1]:
            runs[arm].append(run_http(url, bodies, level))
    result: dict[str, dict] = {}
    for arm, rs in runs.items():
        pooled = Round([s for run in rs for s in run.samples], sum(run.wall for run in rs))
        result[arm] = summarize(pooled)
    ratios = [
        summarize(g)["output_tok_s"] / summarize(d)["output_tok_s"]
        for d, g in zip(runs[DIRECT], runs[GATEWAY], strict=True)
    ]
    result["paired"] = {
        "tok_s_ratio_median": statistics.median(ratios),
        "ttft_p50_delta_ms": result[GATEWAY]["ttft_p50_ms"] - result[DIRECT]["ttft_p50_ms"],
    }
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--llama-server",
        type=Path,
        help="llama-server binary (default: $SWITCHYARD_LLAMA_SERVER, "
        "then the one `bench/llamacpp_env.py --server` built)",
    )
    parser.add_argument("--levels", default="1,8", help="concurrency levels (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=4, help="rounds, arms in AB / BA order (default: %(default)s)")
    parser.add_argument(
        "--prompts",
        type=int,
        default=16,
        help="prompts per arm and round; at level c, max(this, 2c) (default: %(default)s)",
    )
    parser.add_argument("--output-len", type=int, default=64, help="output tokens (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="llama-server's threads (default: %(default)s)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--smoke", action="store_true", help="one round of 2 prompts of 8 tokens at c=1 and c=2")
    args = parser.parse_args()
    if args.smoke:
        args.levels, args.rounds, args.prompts, args.output_len = "1,2", 1, 2, 8
    binary = args.llama_server or find_llama_server()
    if binary is None:
        sys.exit(SERVER_MISSING)
    levels = [int(c) for c in args.levels.split(",")]
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="passthrough-bench-") as tmp:
        work = Path(tmp)
        upstream = start_llama_server(binary, shipped_gguf(), args.threads, max(levels), work / "llama-server.log")
        try:
            gateway = start_gateway(upstream, work, work / "switchyard.log", max(levels))
            try:
                for level in levels:
                    print(f"c={level} ...", flush=True)
                    results[f"c={level}"] = measure(
                        upstream.url, gateway.url, level, args.rounds, args.prompts, args.output_len
                    )
            finally:
                stop(gateway.proc)
        finally:
            stop(upstream.proc)
    print(f"{'level':6} {'arm':24} {'tok/s':>8} {'TTFT p50 ms':>12}")
    for level, arms in results.items():
        for arm in (DIRECT, GATEWAY):
            print(f"{level:6} {arm:24} {arms[arm]['output_tok_s']:8.1f} {arms[arm]['ttft_p50_ms']:12.1f}")
        paired = arms["paired"]
        print(
            f"{level:6} {'gateway / direct':24} {paired['tok_s_ratio_median']:7.3f}x "
            f"{paired['ttft_p50_delta_ms']:+11.1f}"
        )
    print("targets: >= 0.97x tok/s at c=8, <= +5 ms TTFT p50 at c=1")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
