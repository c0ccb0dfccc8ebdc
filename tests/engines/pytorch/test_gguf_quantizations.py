"""Every common GGUF quantization of SmolLM2 is served from its blocks, holds no float32 copy of them, and answers
as transformers does on the same file.

The files are made from the shipped Q4_1 file by bench/gguf_files.py (cached per identity of that file): gguf-py's
Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, F16 and BF16, and llama.cpp's own Q4_K_M, Q4_K_S, Q5_K_M and Q6_K mixes (skipped, with
the reason, where llama-cpp-python is not installed). transformers' reference is its GGUF loader's float32 model of
each file (`from_pretrained(folder, gguf_file=...)`, as the engine's loader saved it).

Each file costs about a minute on 2 cores (made, converted by transformers, loaded twice), so by default the suite
runs the files that between them hold every block type the kernels read: Q4_0, Q5_1, BF16, and the Q4_K_M and
Q5_K_M mixes (Q4_K, Q5_K, Q6_K, Q5_0, Q8_0). The shipped file is Q4_1 with a Q8_0 lm_head, tested throughout the
suite, and test_gguf_blocks_kernels.py checks every type's kernel bit for bit. `SWITCHYARD_TEST_GGUF_TYPES=all`
runs all eleven files (or a comma-separated list of types).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoModelForCausalLM

from bench.gguf_files import ALL_TYPES, QuantizerMissing, quantized, tensor_types
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.loader import load_gguf_blocks, resolve_hf_folder
from engines.pytorch.step_layout import order_rows
from engines.pytorch.weight_memory import float_weights, runner_weights
from engines.types import SamplingParams, SequenceStep

PROMPTS = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "Explain photosynthesis in two sentences. " * 4,
    "How do I reverse a list in Python?",
]
DEFAULT_TYPES = ("Q4_0", "Q5_1", "BF16", "Q4_K_M", "Q5_K_M")
_chosen = os.environ.get("SWITCHYARD_TEST_GGUF_TYPES", "")
TYPES = ALL_TYPES if _chosen == "all" else tuple(t for t in _chosen.split(",") if t) or DEFAULT_TYPES
NEW_TOKENS = 24
BLOCK = 16
PROJECTIONS = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


@pytest.fixture(scope="module", params=TYPES)
def gguf(request: pytest.FixtureRequest) -> Path:
    try:
        return quantized(request.param)
    except QuantizerMissing as exc:
        pytest.skip(f"no {request.param} file: {exc}")


@pytest.fixture(scope="module")
def engine(gguf: Path) -> Iterator[PyTorchEngine]:
    yield PyTorchEngine(gguf, dtype="float32", kv_cache_tokens=1024, block_size=BLOCK)


@pytest.fixture(scope="module")
def reference(gguf: Path, engine: PyTorchEngine) -> Any:
    """transformers' float32 model of the file (its GGUF loader's, converted once and cached)."""
    return AutoModelForCausalLM.from_pretrained(resolve_hf_folder(gguf), dtype=torch.float32).eval()


def _types(blocks: Any) -> list[str]:
    return [p.qtype for p in blocks.parts]


def test_every_projection_and_the_lm_head_is_read_from_blocks(gguf: Path, reference: Any) -> None:
    file_types = tensor_types(gguf)
    blocks = load_gguf_blocks(gguf)[2].blocks  # what the engine's build read (from its cache file)
    layers = reference.config.num_hidden_layers
    wanted = {
        f"model.layers.{i}.{path}": f"blk.{i}.{name}.weight"
        for i in range(layers)
        for name, path in PROJECTIONS.items()
    }
    wanted["lm_head"] = "output.weight" if "output.weight" in file_types else "token_embd.weight"
    missing = sorted(set(wanted) - set(blocks))
    assert not missing, f"{len(missing)} weights fall back to float32, e.g. {missing[:3]}"
    for path, tensor in wanted.items():  # each in the file's own type
        assert _types(blocks[path]) == [file_types[tensor]], path


def test_the_engine_holds_no_float_copy_of_a_weight(engine: PyTorchEngine) -> None:
    """Blocks only: the projections, the lm_head and the embedding (rows dequantized as they are looked up)."""
    held = runner_weights(engine._runner)
    floats = float_weights(held)
    assert not floats, f"{len(floats)} float weights held, e.g. {floats[:3]}"
    runner = engine._runner
    assert runner.embed_tokens is None
    if runner.lm_head.reads_blocks:  # the tied table held once: its rows come from the lm_head's panels
        assert runner._embed_from_head and runner._embed_blocks is None


def test_embedding_rows_equal_transformers(engine: PyTorchEngine, reference: Any) -> None:
    ids = [0, 1, 2, 17, 576, 4095, 30000, engine.info.vocab_size - 1, 17]
    step = SequenceStep("e", ids, 0, [0], True, SamplingParams(), ids, len(ids), 0)
    hidden = engine._runner.embed(order_rows([step]))[0]
    assert torch.equal(hidden, reference.model.embed_tokens(torch.tensor(ids)))


def _greedy(engine: PyTorchEngine, prompts: list[list[int]], tokens: int) -> list[list[int]]:
    """Greedy continuations, the prompts batched: one prefill step of all of them, then decode steps of all."""
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    per_seq = (max(map(len, prompts)) + tokens + BLOCK - 1) // BLOCK
    history = [list(p) for p in prompts]
    new = [list(p) for p in prompts]
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(tokens):
        steps = [
            SequenceStep(
                f"s{i}",
                new[i],
                len(history[i]) - len(new[i]),
                list(range(i * per_seq, (i + 1) * per_seq)),
                True,
                params,
                list(history[i]),
                len(prompts[i]),
                len(out[i]),
            )
            for i in range(len(prompts))
        ]
        result = engine.execute(steps)
        for i in range(len(prompts)):
            token = result.token_ids[f"s{i}"]
            out[i].append(token)
            history[i].append(token)
            new[i] = [token]
    return out


def test_greedy_equals_transformers(engine: PyTorchEngine, reference: Any) -> None:
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in PROMPTS]
    ours = _greedy(engine, prompts, NEW_TOKENS)
    for ids, got in zip(prompts, ours, strict=True):
        ref = reference.generate(torch.tensor([ids]), max_new_tokens=NEW_TOKENS, do_sample=False)[
            0, len(ids) :
        ].tolist()
        # transformers stops at EOS; the loop above does not, so compare over the reference's length
        assert got[: len(ref)] == ref, engine.tokenizer.decode(ref)
