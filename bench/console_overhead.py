"""Does an open web console slow the API down? TTFT p50 at concurrency 8, with and without a console polling
its charts, side by side in one run against one server.

One Switchyard server serves the default repository. Rounds alternate in ABBA order between "off" (no console
open) and "on" (a headless Chromium shows the console's Live metrics tab, refreshing every `--refresh` seconds,
plus the overview poll every 5 s). Each round sends its own random 128-token prompts (fresh, so the prefix cache
cannot serve them; `ignore_eos`, greedy, `--output-len` tokens each) at concurrency 8 with bench/loadgen.py and
records TTFT p50, output tok/s and how many times the console read /ui/api/stats during the round. Medians over
rounds and the on/off ratio are printed.

    python bench/console_overhead.py [--rounds 4] [--prompts 32] [--output-len 64] [--refresh 1]
        [--client browser|http]

`--client http` replaces the browser with a thread making the page's requests (stats every --refresh s, the
overview every 5 s): the server's share of the cost without a browser's CPU on the same machine (on 2 shared
cores the browser itself competes with the server; in use it runs on the viewer's machine).
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gateway_server import free_port, stop, wait_ready  # noqa: E402
from bench.loadgen import random_prompts, run_load  # noqa: E402

MODEL = "smollm2-135m-instruct"
VOCAB = 49152
CONCURRENCY = 8
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


@contextmanager
def server() -> Iterator[str]:
    port = free_port()
    log = open(Path(tempfile.gettempdir()) / f"console-overhead-{port}.log", "w")  # noqa: SIM115
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gateway",
            "serve",
            "--model-repository",
            "model_repository",
            "--http-port",
            str(port),
            "--grpc-port",
            "0",
            "--metrics-port",
            "0",
        ],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url + "/health", proc, Path(log.name))
        yield url
    finally:
        stop(proc)
        log.close()


class BrowserConsole:
    """A headless Chromium on the console's Live metrics tab."""

    def __init__(self, url: str, refresh_s: float) -> None:
        from playwright.sync_api import sync_playwright

        chromium = shutil.which("chromium") or "/usr/bin/chromium"
        self._pw = sync_playwright().start()
        self._profile = tempfile.mkdtemp(prefix="console-bench-profile-")
        self._context = self._pw.chromium.launch_persistent_context(
            self._profile,
            executable_path=chromium,
            headless=True,
            args=CHROMIUM_FLAGS,
            viewport={"width": 1366, "height": 900},
        )
        self.page = self._context.new_page()
        self.page.goto(url + "/")
        self.page.get_by_role("tab", name="Live metrics").click()
        self.page.locator("#metrics-interval").select_option(str(int(refresh_s * 1000)))
        self.page.wait_for_function("() => Number(document.querySelector('#chart-requests').dataset.points) >= 1")

    def reset_count(self) -> None:
        self.page.evaluate("() => performance.clearResourceTimings()")

    def count(self) -> int:
        return self.page.evaluate(
            "() => performance.getEntriesByType('resource').filter(e => e.name.includes('/ui/api/stats')).length"
        )

    def close(self) -> None:
        self._context.close()
        self._pw.stop()
        shutil.rmtree(self._profile, ignore_errors=True)


class HttpConsole:
    """The page's polls without a browser: /ui/api/stats every refresh_s, /ui/api/overview every 5 s."""

    def __init__(self, url: str, refresh_s: float) -> None:
        self._client = httpx.Client(base_url=url, timeout=30)
        self._refresh = refresh_s
        self._stop = threading.Event()
        self._polls = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        last_overview = 0.0
        while not self._stop.is_set():
            self._client.get("/ui/api/stats").raise_for_status()
            self._polls += 1
            if time.monotonic() - last_overview >= 5:
                self._client.get("/ui/api/overview").raise_for_status()
                last_overview = time.monotonic()
            self._stop.wait(self._refresh)

    def reset_count(self) -> None:
        self._polls = 0

    def count(self) -> int:
        return self._polls

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._client.close()


def measure(url: str, prompts: list[list[int]], output_len: int) -> dict[str, float]:
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its own event loop, apart from Playwright's
        run = pool.submit(asyncio.run, run_load(url, MODEL, prompts, output_len, CONCURRENCY)).result()
    return run.summary()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=4, help="rounds per side, ABBA order (default 4)")
    parser.add_argument("--prompts", type=int, default=32, help="requests per round (default 32)")
    parser.add_argument("--output-len", type=int, default=64, help="tokens per answer (default 64)")
    parser.add_argument(
        "--refresh",
        type=float,
        default=1.0,
        choices=[1.0, 2.0, 5.0],
        help="the console's chart refresh in seconds (the page offers 1, 2, 5; default 1)",
    )
    parser.add_argument(
        "--client",
        choices=["browser", "http"],
        default="browser",
        help="browser: headless Chromium on the console; http: the page's polls without a browser",
    )
    args = parser.parse_args()
    order = ["off", "on", "on", "off"] * ((args.rounds + 1) // 2)
    order = order[: 2 * args.rounds]
    rows: dict[str, list[dict[str, float]]] = {"off": [], "on": []}
    with server() as url:
        print(
            f"server {url}; c={CONCURRENCY}, {args.prompts} prompts x 128 in / {args.output_len} out; "
            f"console refresh {args.refresh:g} s via {args.client}; {os.cpu_count()} CPUs"
        )
        measure(url, random_prompts(CONCURRENCY, 128, VOCAB, seed=1), 8)  # warm-up
        with httpx.Client(base_url=url) as client:  # what one poll costs an idle server, against a trivial route
            for path in ("/version", "/ui/api/stats", "/ui/api/overview"):
                times = []
                for _ in range(50):
                    start = time.perf_counter()
                    client.get(path).raise_for_status()
                    times.append(time.perf_counter() - start)
                print(f"GET {path} on the idle server: median {statistics.median(times) * 1000:.2f} ms round trip")
        for i, side in enumerate(order):
            # fresh prompts each round: a repeated prompt would be served from the prefix cache
            prompts = random_prompts(args.prompts, 128, VOCAB, seed=100 + i)
            console = None
            if side == "on":
                console = (BrowserConsole if args.client == "browser" else HttpConsole)(url, args.refresh)
                console.reset_count()
            try:
                summary = measure(url, prompts, args.output_len)
                polls = console.count() if console else 0
            finally:
                if console:
                    console.close()
            summary["polls"] = polls
            rows[side].append(summary)
            print(
                f"round {i + 1:2d} console {side:3s}: TTFT p50 {summary['ttft_p50_ms']:7.1f} ms  "
                f"p99 {summary['ttft_p99_ms']:7.1f} ms  {summary['output_tok_s']:6.1f} tok/s  stats polls {polls}"
            )
    med = {side: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for side, rs in rows.items()}
    print(
        f"\nmedian TTFT p50: off {med['off']['ttft_p50_ms']:.1f} ms, on {med['on']['ttft_p50_ms']:.1f} ms "
        f"(on/off {med['on']['ttft_p50_ms'] / med['off']['ttft_p50_ms']:.3f}); output tok/s: off "
        f"{med['off']['output_tok_s']:.1f}, on {med['on']['output_tok_s']:.1f} "
        f"(on/off {med['on']['output_tok_s'] / med['off']['output_tok_s']:.3f})"
    )


if __name__ == "__main__":
    main()
