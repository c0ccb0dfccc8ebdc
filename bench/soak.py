"""A soak run: mixed traffic against a real server for `--minutes`, every request accounted for.

`--clients` threads each draw request kinds from a fixed mix: chat and completions (streamed and not, n > 1,
tools, json_schema), embeddings, rerank, Responses (stored, and in the background, polled until done), KServe v2
infer over HTTP (tritonclient.http) and gRPC (tritonclient.grpc), KV sessions created, continued and deleted, and
streams the client drops after their first chunks. In the middle of the run (and every `--reload-every` minutes
after) the LLM is reloaded through the repository API. Reported, and checked:
- requests by kind and outcome: `ok`, `refused` (a documented status: 429 or 503 with Retry-After), `dropped` (the
  client's own disconnects), and the two that must stay 0: `unexpected` (any other status, a 5xx, a wrong body, a
  connection error) and `lost` (no answer within `REQUEST_TIMEOUT`, or a background response never done);
- the server's RSS, open file descriptors and threads every second: growth after warm-up (the first third of the
  run, or until `SETTLE` s after the first reload is done, at most two thirds in) at most `GROWTH` (5%);
- the LLM's KV blocks back to their idle count once the traffic stops and the sessions are deleted;
- the server's counters equal to the client's: `switchyard_http_requests_total` by status against every HTTP
  request the client made, `nv_inference_request_success` of the KServe model against its HTTP and gRPC
  infers.

    python bench/soak.py --minutes 60          # starts a server over the default repository's models
    python bench/soak.py --minutes 10 --clients 8 --json soak.json

tests/e2e/test_reliability.py runs `soak` for half a minute against its own server.
"""

from __future__ import annotations

import argparse
import json
import random
import re
import shutil
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

LLM = "smollm2-135m-instruct"
EMBEDDER = "all-minilm-l6-v2"
TENSOR = "circle_pipeline"
MODELS = (LLM, EMBEDDER, "circle_classifier", "circle_forest", "circle_preprocess", "circle_postprocess", TENSOR)
GROWTH = 0.05
LARGE_MAPPING = 256 << 20  # the engine's KV pools and packed weights: mappings of their own (see `sample`)
GROWING = ("rss_mib", "heap_mib", "large_mib", "fds", "threads")  # reported
CHECKED = ("heap_mib", "large_mib", "fds", "threads")  # held to GROWTH
REQUEST_TIMEOUT = 120.0
# After a reload the old copy's memory is handed back (malloc_trim) and traffic faults the new copy's working
# memory in over its first minute: a baseline taken before that reads the refill as growth.
SETTLE = 60.0
DOCUMENTED = (429, 503)  # refusals a client is told to retry (Retry-After)
DONE = ("completed", "incomplete")  # a response's ends that are answers (incomplete: cut by max_output_tokens)
MAX_TOKENS = 8
WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}
CITY_SCHEMA = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 12}},
    "required": ["city"],
    "additionalProperties": False,
}


def soak_repository(target: Path) -> Path:
    """A repository of the default repository's LLM, embedding model and KServe pipeline (its parts included)."""
    target.mkdir(parents=True, exist_ok=True)
    for name in MODELS:
        shutil.copytree(ROOT / "model_repository" / name, target / name)
    return target


@dataclass(frozen=True)
class Server:
    """Where the server under test is: its HTTP and gRPC addresses, the admin key its repository API takes, and
    its process id (read in /proc)."""

    base_url: str
    grpc_url: str
    admin_key: str
    pid: int


@dataclass
class Sample:
    at: float
    rss_mib: float  # the whole resident set
    fds: int
    threads: int
    heap_mib: float  # resident outside the anonymous mappings of LARGE_MAPPING and more (see `sample`)
    large_mib: float  # mapped in those mappings: a model copy's KV pool that outlived its reload shows here
    arenas: int | None = None  # glibc malloc arenas, the main one included (`malloc_arenas`); None: not readable


@dataclass
class SoakReport:
    seconds: float = 0.0
    outcomes: dict[str, dict[str, int]] = field(default_factory=dict)  # kind -> outcome -> count
    failures: list[str] = field(default_factory=list)  # the first unexpected and lost requests, said
    samples: list[Sample] = field(default_factory=list)
    warmup_end: float = 0.0
    reloads: int = 0
    kv_blocks: tuple[float, float] = (0.0, 0.0)  # idle before, after
    http_counts: tuple[dict[str, int], dict[str, int]] = ({}, {})  # client, server (by status)
    infer_counts: tuple[int, int] = (0, 0)  # client, server (successful KServe infers)

    def total(self, outcome: str) -> int:
        return sum(kinds.get(outcome, 0) for kinds in self.outcomes.values())

    def growth(self) -> dict[str, float]:
        """Each resource at the end against its median over the seconds right after warm-up."""
        base = [s for s in self.samples if self.warmup_end <= s.at <= self.warmup_end + 10] or self.samples[:1]
        last = self.samples[-1]
        return {
            name: getattr(last, name) / max(statistics.median(getattr(s, name) for s in base), 1e-9) - 1
            for name in GROWING
        }

    def problems(self) -> list[str]:
        """What breaks the soak's promises (empty when it held)."""
        found = [f"{self.total(kind)} {kind} request(s)" for kind in ("unexpected", "lost") if self.total(kind)]
        found += [
            f"{name} grew {value:.1%} after warm-up"
            for name, value in self.growth().items()
            if name in CHECKED and value > GROWTH
        ]
        if self.kv_blocks[1] != self.kv_blocks[0]:
            found.append(f"KV blocks in use {self.kv_blocks[1]:g} at the end, {self.kv_blocks[0]:g} idle before")
        if self.http_counts[0] != self.http_counts[1]:
            found.append(f"HTTP requests by status: client {self.http_counts[0]}, server {self.http_counts[1]}")
        if self.infer_counts[0] != self.infer_counts[1]:
            found.append(f"KServe infers: client {self.infer_counts[0]}, server {self.infer_counts[1]}")
        return found

    def summary(self) -> str:
        total = sum(sum(k.values()) for k in self.outcomes.values())
        lines = [f"{self.seconds:.0f} s, {total} requests, {self.reloads} reload(s)"]
        for kind, counts in sorted(self.outcomes.items()):
            lines.append(f"  {kind}: " + ", ".join(f"{k} {v}" for k, v in sorted(counts.items())))
        if self.samples:
            first = next((s for s in self.samples if s.at >= self.warmup_end), self.samples[0])
            last = self.samples[-1]
            lines.append(
                f"  after warm-up -> end: RSS {first.rss_mib:.0f} -> {last.rss_mib:.0f} MiB (outside the KV "
                f"pools and weights {first.heap_mib:.0f} -> {last.heap_mib:.0f}), fds {first.fds} "
                f"-> {last.fds}, threads {first.threads} -> {last.threads}, malloc arenas {first.arenas} -> "
                f"{last.arenas}; growth " + ", ".join(f"{k} {v:+.1%}" for k, v in self.growth().items())
            )
        lines.append(f"  KV blocks in use: {self.kv_blocks[0]:g} idle before, {self.kv_blocks[1]:g} at the end")
        lines.append(
            f"  HTTP by status: client {self.http_counts[0]}, server {self.http_counts[1]}; KServe infers: "
            f"client {self.infer_counts[0]}, server {self.infer_counts[1]}"
        )
        lines += [f"  failure: {f}" for f in self.failures]
        return "\n".join(lines)


# ---------------------------------------------------------------- the server's side


def sample(pid: int, at: float) -> Sample:
    """The server's resources now. The native engine's KV pools and packed weights are anonymous mappings of their
    own, each far larger than a malloc arena (64 MiB); a KV pool is faulted in block by block as the prefix cache
    first uses it, so the whole RSS keeps growing for as long as traffic reaches blocks it never touched (up to the
    pool's size, by design). A leak shows outside those mappings (the heap, the arenas, smaller mappings), and a
    model copy that outlives its reload as more of them (`large_mib`)."""
    proc = Path(f"/proc/{pid}")
    status = dict(line.split(":", 1) for line in (proc / "status").read_text().splitlines() if ":" in line)
    rss_kib = int(status["VmRSS"].split()[0])
    mapped_kib, resident_kib = large_mappings(pid)
    return Sample(
        at,
        rss_kib / 1024,
        len(list((proc / "fd").iterdir())),
        int(status["Threads"]),
        (rss_kib - resident_kib) / 1024,
        mapped_kib / 1024,
        malloc_arenas(pid),
    )


def large_mappings(pid: int) -> tuple[int, int]:
    """KiB mapped and KiB resident in the anonymous mappings of at least LARGE_MAPPING bytes (/proc/PID/smaps)."""
    mapped = resident = 0
    large = False
    for line in Path(f"/proc/{pid}/smaps").read_text().splitlines():
        head = line.split(maxsplit=6)
        if "-" in head[0] and not head[0].endswith(":"):  # a mapping's first line; anonymous: no path after 5 fields
            start, end = (int(x, 16) for x in head[0].split("-"))
            large = len(head) == 5 and end - start >= LARGE_MAPPING
            mapped += (end - start) // 1024 if large else 0
        elif large and head[0] == "Rss:":
            resident += int(head[1])
    return mapped, resident


ARENA_HEAP = 64 << 20  # a glibc thread arena's heaps: mappings of this size, aligned to it


def malloc_arenas(pid: int) -> int | None:
    """glibc's malloc arenas in `pid`, its main arena included (`--malloc-arenas` caps them), or None where its
    memory cannot be read (another user's process, no /proc). Each other arena lives in heaps of ARENA_HEAP bytes
    aligned to that size, whose first bytes are glibc's `heap_info`: the arena's address, then the previous heap
    of the same arena; an arena's first heap has no previous one and holds the arena right after that header."""
    arenas = 1
    try:
        with open(f"/proc/{pid}/mem", "rb") as mem:
            for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
                head = line.split()
                start, end = (int(x, 16) for x in head[0].split("-"))
                if len(head) != 5 or head[1] != "rw-p" or end - start >= LARGE_MAPPING:
                    continue  # a heap is anonymous and at most ARENA_HEAP (merged full heaps aside)
                for at in range(-(-start // ARENA_HEAP) * ARENA_HEAP, end, ARENA_HEAP):
                    mem.seek(at)
                    arena, previous = struct.unpack("<QQ", mem.read(16))
                    arenas += at < arena < at + 64 and previous == 0
    except OSError:
        return None
    return arenas


def scrape(base_url: str) -> tuple[dict[str, int], int, float]:
    """The server's HTTP requests by status (every route but /metrics), its KServe model's successful infers, and
    the LLM's KV blocks held by anything but sessions."""
    text = httpx.get(f"{base_url}/metrics", timeout=30).text
    by_status: Counter[str] = Counter()
    for endpoint, status, value in re.findall(
        r'^switchyard_http_requests_total\{endpoint="([^"]*)",method="[^"]*",status="(\d+)"\} (\S+)$', text, re.M
    ):
        if endpoint != "/metrics":
            by_status[status] += int(float(value))

    def one(name: str, model: str) -> float:
        found = re.findall(rf'^{name}\{{model="{model}"(?:,version="[^"]*")?\}} (\S+)$', text, re.M)
        return sum(float(v) for v in found)

    blocks = one("switchyard_kv_cache_blocks_used", LLM) - one("switchyard_kv_session_pinned_blocks", LLM)
    return dict(by_status), int(one("nv_inference_request_success", TENSOR)), blocks


# ---------------------------------------------------------------- the client's side


class Refused(Exception):
    """A documented refusal (429, 503 with Retry-After)."""


class Tally:
    """Every request's outcome and every HTTP status the client saw, from all client threads."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.outcomes: dict[str, Counter[str]] = {}
        self.http: Counter[str] = Counter()
        self.infers = 0
        self.failures: list[str] = []

    def status(self, code: int) -> None:
        with self.lock:
            self.http[str(code)] += 1

    def outcome(self, kind: str, outcome: str, detail: str = "") -> None:
        with self.lock:
            self.outcomes.setdefault(kind, Counter())[outcome] += 1
            if outcome == "ok" and kind.startswith("kserve"):
                self.infers += 1
            if outcome in ("unexpected", "lost") and len(self.failures) < 20:
                self.failures.append(f"{kind}: {outcome}: {detail[:400]}")


class Client:
    """One client thread's connections: httpx (every response's status tallied) and its own tritonclients."""

    def __init__(self, server: Server, tally: Tally, seed: int) -> None:
        import tritonclient.grpc as grpcclient
        import tritonclient.http as httpclient
        from openai import OpenAI

        self.server, self.tally, self.rng = server, tally, random.Random(seed)
        self.http = httpx.Client(
            base_url=server.base_url,
            timeout=REQUEST_TIMEOUT,
            event_hooks={"response": [lambda r: tally.status(r.status_code)]},
        )
        self.openai = OpenAI(base_url=f"{server.base_url}/v1", api_key="none", http_client=self.http, max_retries=0)
        self.triton_http = httpclient.InferenceServerClient(
            server.base_url.removeprefix("http://"), network_timeout=REQUEST_TIMEOUT
        )
        self.triton_grpc = grpcclient.InferenceServerClient(server.grpc_url)
        self.sessions = 0

    def close(self) -> None:
        self.http.close()
        self.triton_http.close()
        self.triton_grpc.close()

    def prompt(self) -> str:
        return self.rng.choice(
            (
                "Name a colour.",
                "Count to five.",
                "What is 2 + 2?",
                "Say hello in French.",
                "Write a word that rhymes with cat.",
                "Name a planet.",
            )
        )

    def chat(self, **extra: Any) -> Any:
        return self.openai.chat.completions.create(
            model=LLM, messages=[{"role": "user", "content": self.prompt()}], max_tokens=MAX_TOKENS, **extra
        )

    # each kind: raises on a wrong answer; returns "ok" or "dropped"
    def chat_n(self) -> str:
        out = self.chat(n=2, temperature=0.8, seed=self.rng.randrange(1000))
        assert len(out.choices) == 2 and all(c.message.content is not None for c in out.choices), out
        return "ok"

    def chat_stream(self) -> str:
        chunks = list(self.chat(stream=True, stream_options={"include_usage": True}))
        assert chunks and chunks[-1].usage is not None and chunks[-1].usage.completion_tokens > 0, chunks[-1:]
        return "ok"

    def completion(self) -> str:
        out = self.openai.completions.create(model=LLM, prompt=self.prompt(), max_tokens=MAX_TOKENS)
        assert out.choices[0].text is not None and out.usage.completion_tokens > 0, out
        return "ok"

    def completion_stream(self) -> str:
        chunks = list(
            self.openai.completions.create(model=LLM, prompt=self.prompt(), max_tokens=MAX_TOKENS, stream=True, n=2)
        )
        assert {c.choices[0].index for c in chunks if c.choices} == {0, 1}, chunks[-1:]
        return "ok"

    def chat_tools(self) -> str:
        out = self.openai.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": "What is the weather in Paris?"}],
            max_tokens=48,
            tools=[WEATHER_TOOL],
            tool_choice="required",
        )
        choice = out.choices[0]
        if choice.finish_reason != "length":
            call = choice.message.tool_calls[0]
            assert call.function.name == "get_weather" and "city" in json.loads(call.function.arguments), choice
        return "ok"

    def chat_json(self) -> str:
        out = self.openai.chat.completions.create(
            model=LLM,
            messages=[{"role": "user", "content": "Name a city, as JSON."}],
            max_tokens=32,
            response_format={
                "type": "json_schema",
                "json_schema": {"name": "city", "schema": CITY_SCHEMA, "strict": True},
            },
        )
        choice = out.choices[0]
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content)["city"], str), choice
        return "ok"

    def embeddings(self) -> str:
        out = self.openai.embeddings.create(model=EMBEDDER, input=[self.prompt(), "a second text"])
        assert len(out.data) == 2 and len(out.data[0].embedding) == 384, out
        return "ok"

    def rerank(self) -> str:
        response = self.http.post(
            "/v1/rerank",
            json={
                "model": EMBEDDER,
                "query": "capital of France",
                "documents": ["Paris is in France.", "Bananas are yellow."],
            },
        )
        _check(response)
        assert len(response.json()["results"]) == 2, response.text
        return "ok"

    def responses_stored(self) -> str:
        created = self.openai.responses.create(model=LLM, input=self.prompt(), max_output_tokens=MAX_TOKENS, store=True)
        again = self.openai.responses.retrieve(created.id)
        assert again.id == created.id and again.status == created.status and again.status in DONE, again
        return "ok"

    def responses_background(self) -> str:
        created = self.openai.responses.create(
            model=LLM, input=self.prompt(), max_output_tokens=MAX_TOKENS, store=True, background=True
        )
        deadline = time.monotonic() + REQUEST_TIMEOUT
        while time.monotonic() < deadline:
            found = self.openai.responses.retrieve(created.id)
            if found.status in DONE:
                return "ok"
            assert found.status in ("queued", "in_progress"), found
            time.sleep(0.2)
        raise TimeoutError(f"background response {created.id} not done in {REQUEST_TIMEOUT} s")

    def _tensor_input(self, module: Any) -> Any:
        import numpy as np

        x, y = self.rng.uniform(-1, 1), self.rng.uniform(-1, 1)
        tensor = module.InferInput("TEXT", [1, 1], "BYTES")
        tensor.set_data_from_numpy(np.array([[f"{x:.3f}, {y:.3f}".encode()]], dtype=object))
        return tensor

    def kserve_http(self) -> str:
        import tritonclient.http as httpclient
        from tritonclient.utils import InferenceServerException

        try:
            result = self.triton_http.infer(TENSOR, [self._tensor_input(httpclient)])
        except InferenceServerException as exc:
            self.tally.status(int(exc.status() or 0))
            raise
        self.tally.status(200)
        assert result.as_numpy("LABEL").shape == (1, 1), result.get_response()
        return "ok"

    def kserve_grpc(self) -> str:
        import tritonclient.grpc as grpcclient

        result = self.triton_grpc.infer(TENSOR, [self._tensor_input(grpcclient)], client_timeout=REQUEST_TIMEOUT)
        assert result.as_numpy("LABEL").shape == (1, 1), result.get_response()
        return "ok"

    def session(self) -> str:
        self.sessions += 1
        created = self.http.post("/v1/sessions")
        _check(created)
        sid = created.json()["id"]
        messages = [{"role": "user", "content": self.prompt()}]
        for _ in range(2):
            out = self.openai.chat.completions.create(
                model=LLM, messages=messages, max_tokens=MAX_TOKENS, extra_headers={"X-Session-ID": sid}
            )
            messages += [
                {"role": "assistant", "content": out.choices[0].message.content or ""},
                {"role": "user", "content": "And another?"},
            ]
        deleted = self.http.delete(f"/v1/sessions/{sid}")
        if deleted.status_code != 404:  # 404: the session had ended (a reload, the pool needed its blocks)
            _check(deleted)
        return "ok"

    def disconnect(self) -> str:
        body = {
            "model": LLM,
            "messages": [{"role": "user", "content": "Tell me a long story."}],
            "max_tokens": 64,
            "stream": True,
        }
        with self.http.stream("POST", "/v1/chat/completions", json=body) as response:
            _check(response)
            lines = response.iter_lines()
            for _ in range(3):
                next(lines)
        return "dropped"


def _check(response: httpx.Response) -> None:
    if response.status_code in DOCUMENTED and "retry-after" in response.headers:
        raise Refused(f"{response.status_code}")
    if response.status_code >= 300:
        response.read()
        raise AssertionError(
            f"{response.request.method} {response.request.url.path}: {response.status_code} {response.text[:300]}"
        )


MIX: dict[str, int] = {  # kind -> weight
    "chat_n": 3,
    "chat_stream": 3,
    "completion": 2,
    "completion_stream": 2,
    "chat_tools": 1,
    "chat_json": 1,
    "embeddings": 3,
    "rerank": 2,
    "responses_stored": 1,
    "responses_background": 1,
    "kserve_http": 3,
    "kserve_grpc": 3,
    "session": 1,
    "disconnect": 1,
}


def _classify(exc: BaseException) -> str:
    """A request's exception as an outcome: a documented refusal, a lost request, or an unexpected one."""
    import openai
    from tritonclient.utils import InferenceServerException

    if isinstance(exc, Refused):
        return "refused"
    if isinstance(exc, openai.APIStatusError):
        documented = exc.status_code in DOCUMENTED and "retry-after" in exc.response.headers
        return "refused" if documented else "unexpected"
    if isinstance(exc, (httpx.TimeoutException, openai.APITimeoutError, TimeoutError)):
        return "lost"
    if isinstance(exc, InferenceServerException):
        status = str(exc.status() or "")
        if status in ("429", "503", "StatusCode.UNAVAILABLE", "StatusCode.RESOURCE_EXHAUSTED"):
            return "refused"
        return "lost" if "DEADLINE_EXCEEDED" in status else "unexpected"
    return "unexpected"


def _client_loop(server: Server, tally: Tally, seed: int, stop: threading.Event) -> None:
    client = Client(server, tally, seed)
    kinds, weights = list(MIX), list(MIX.values())
    try:
        while not stop.is_set():
            kind = client.rng.choices(kinds, weights)[0]
            try:
                outcome = getattr(client, kind)()
                tally.outcome(kind, outcome)
            except Exception as exc:  # noqa: BLE001 - every failure is classified and counted
                outcome = _classify(exc)
                tally.outcome(kind, outcome, f"{type(exc).__name__}: {exc}")
    finally:
        client.close()


def reload_llm(server: Server, tally: Tally, done: list[float], started: float) -> None:
    """The LLM loaded again through the repository API (Triton's load of a loaded model: a reload); appends the
    run's second it ended at to `done`."""
    with httpx.Client(
        base_url=server.base_url, timeout=600, event_hooks={"response": [lambda r: tally.status(r.status_code)]}
    ) as http:
        try:
            _check(
                http.post(f"/v2/repository/models/{LLM}/load", headers={"authorization": f"Bearer {server.admin_key}"})
            )
            tally.outcome("reload", "ok")
        except Exception as exc:  # noqa: BLE001 - counted like every request
            tally.outcome("reload", _classify(exc), f"{type(exc).__name__}: {exc}")
    done.append(time.monotonic() - started)


def soak(
    server: Server,
    seconds: float,
    clients: int = 6,
    reload_every: float | None = None,
    on_sample: Callable[[Sample], None] | None = None,
) -> SoakReport:
    """Drive the mix at `server` for `seconds` from `clients` threads; reload the LLM at a third of the run (and
    every `reload_every` seconds after); return the report (`problems()` says what broke). Warm-up ends a third
    into the run, or `SETTLE` s after the first reload is done (at most two thirds in) if that is later."""
    tally = Tally()
    report = SoakReport()
    http_before, infers_before, _ = scrape(server.base_url)
    report.kv_blocks = (_idle_blocks(server.base_url), 0.0)
    stop = threading.Event()
    threads = [
        threading.Thread(target=_client_loop, args=(server, tally, seed, stop), daemon=True) for seed in range(clients)
    ]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    reloads = [seconds / 3]
    while reload_every and reloads[-1] + reload_every < seconds:
        reloads.append(reloads[-1] + reload_every)
    reloaded: list[float] = []
    reloader: threading.Thread | None = None
    while (now := time.monotonic() - started) < seconds:
        if reloads and now >= reloads[0]:
            reloads.pop(0)
            report.reloads += 1
            reloader = threading.Thread(target=reload_llm, args=(server, tally, reloaded, started), daemon=True)
            reloader.start()
        found = sample(server.pid, now)
        report.samples.append(found)
        if on_sample:
            on_sample(found)
        time.sleep(1.0)
    stop.set()
    for thread in [*threads, *([reloader] if reloader else [])]:
        thread.join(REQUEST_TIMEOUT + 30)
        if thread.is_alive():
            tally.outcome("client", "lost", "a client thread still waits on its request")
    report.seconds = time.monotonic() - started
    report.warmup_end = max(seconds / 3, min(reloaded[0] + SETTLE, seconds * 2 / 3) if reloaded else 0.0)
    report.kv_blocks = (report.kv_blocks[0], _idle_blocks(server.base_url))
    report.samples.append(sample(server.pid, time.monotonic() - started))
    http_after, infers_after, _ = scrape(server.base_url)
    server_http = {k: v - http_before.get(k, 0) for k, v in http_after.items() if v != http_before.get(k, 0)}
    report.http_counts = (dict(sorted(tally.http.items())), dict(sorted(server_http.items())))
    report.infer_counts = (tally.infers, infers_after - infers_before)
    report.outcomes = {kind: dict(counts) for kind, counts in sorted(tally.outcomes.items())}
    report.failures = list(tally.failures)
    return report


def _idle_blocks(base_url: str, timeout: float = 60.0) -> float:
    """The LLM's KV blocks held by anything but sessions, once no request runs or waits (or after `timeout`)."""
    deadline = time.monotonic() + timeout
    while True:
        text = httpx.get(f"{base_url}/metrics", timeout=30).text
        busy = sum(
            float(v)
            for v in re.findall(rf'^switchyard_num_requests_(?:running|waiting)\{{model="{LLM}"\}} (\S+)$', text, re.M)
        )
        if busy == 0 or time.monotonic() > deadline:
            return scrape(base_url)[2]
        time.sleep(0.2)


# ---------------------------------------------------------------- the command

ADMIN_KEY = "soak-admin-key-0123456789"


def start_server(workdir: Path) -> tuple[subprocess.Popen[bytes], Server]:
    """A server over `soak_repository`, in explicit model control with an admin key (the reload's)."""
    from bench.gateway_server import free_port, serve

    repo = soak_repository(workdir / "repo")
    key_file = workdir / "admin-key"
    key_file.write_text(ADMIN_KEY + "\n")
    grpc_port = free_port()
    server = serve(
        repo,
        "--admin-key-file",
        str(key_file),
        "--model-control-mode",
        "explicit",
        "--load-model",
        "*",
        "--responses-store",
        str(workdir / "r.sqlite3"),
        "--files-dir",  # its own, so a test run beside the soak does not wait on the soak's files lock
        str(workdir / "files"),
        grpc_port=grpc_port,
    )
    return server.proc, Server(server.url, f"127.0.0.1:{grpc_port}", ADMIN_KEY, server.proc.pid)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=6)
    parser.add_argument("--reload-every", type=float, default=10.0, help="minutes between reloads after the first")
    parser.add_argument("--json", type=Path, help="write the report here")
    args = parser.parse_args(argv)
    from bench.gateway_server import stop

    with tempfile.TemporaryDirectory(prefix="switchyard-soak-") as tmp:
        proc, server = start_server(Path(tmp))
        try:
            minute = [0]

            def progress(found: Sample) -> None:
                if found.at >= minute[0] * 60:
                    minute[0] += 1
                    print(
                        f"{found.at / 60:5.1f} min: RSS {found.rss_mib:.0f} MiB (outside the large mappings "
                        f"{found.heap_mib:.0f}), fds {found.fds}, "
                        f"threads {found.threads}, malloc arenas {found.arenas}",
                        flush=True,
                    )

            report = soak(server, args.minutes * 60, args.clients, args.reload_every * 60, progress)
        finally:
            stop(proc)
    print(report.summary())
    problems = report.problems()
    print("problems: " + ("; ".join(problems) if problems else "none"))
    if args.json:
        args.json.write_text(json.dumps(asdict(report), indent=1))
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
