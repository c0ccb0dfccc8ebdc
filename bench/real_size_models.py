"""Random-weight models with the exact shapes of the models users run, as GGUF files made by llama.cpp's own tools
(Q4_K_M; gpt-oss as MXFP4_MOE, the type its published files have): the files the real-size benchmarks load
(bench/llamacpp_bench.py --model NAME).

SmolLM2-135M fits in a server CPU's last-level cache; a 1B to 8B model does not, so only these show how a decode
step streams its weights from memory. Speed does not depend on the weights' values, so the weights are random
(normal, std 0.02; norms 1), with every tensor's exact shape:

    llama-1b   Llama-3.2-1B   16 layers, hidden 2048, MLP 8192, 32 / 8 heads of 64, tied embedding
    llama-3b   Llama-3.2-3B   28 layers, hidden 3072, MLP 8192, 24 / 8 heads of 128, tied embedding
    llama-8b   Llama-3.1-8B   32 layers, hidden 4096, MLP 14336, 32 / 8 heads of 128, untied lm_head
    qwen3-moe  Qwen3-30B-A3B's layer (128 experts of width 768, 8 a token, 32 / 4 heads of 128, hidden 2048,
               untied lm_head) in 12 layers instead of 48 (`--moe-layers`): 8.1 B weights, about 5 GB as Q4_K_M,
               which fits this machine's memory beside a second server; a token reads the same expert width and
               count as the 30B's
    gpt-oss    gpt-oss-20b's layer (32 experts of width 2880, 4 a token, 64 / 8 heads of 64, hidden 2880, attention
               sinks and biases, sliding and full layers in turn, YaRN, untied lm_head) in 8 layers instead of 24:
               7.7 B weights, about 5 GB as MXFP4_MOE (experts MXFP4, the rest Q8_0)

Every model keeps its own vocabulary size (128256 for Llama 3, 151936 for Qwen3: the embedding and lm_head are a
large part of a small model's bytes) with SmolLM2's tokenizer (49152 tokens, from the shipped GGUF file, chat
template included); llama.cpp's converter pads the vocabulary past it with unused `[PADn]` tokens, as it does for
any model whose embedding is larger than its tokenizer.

Each model is made once, in steps, in `--cache-dir` (default: $SWITCHYARD_CACHE_DIR/real-size):
  1. an HF folder: config.json, the tokenizer, and bfloat16 safetensors written a shard (about 1 GB) at a time, so
     no step holds the whole model (the 8B in float32 would be 32 GB);
  2. llama.cpp's `convert_hf_to_gguf.py` (from the llama-cpp-python sdist's vendor/llama.cpp, with its
     `conversion/` package and `gguf-py`; bench/llamacpp_env.py fetches it), run with this Python, to a BF16 GGUF;
  3. llama.cpp's quantizer (`llama_model_quantize` in the llama.cpp environment, bench/llamacpp_env.py) to
     Q4_K_M (gpt-oss: MXFP4_MOE).
The HF folder is deleted once the BF16 file is made, and the BF16 file once the quantized one is
(`--keep-intermediates` keeps both).
The converter runs as bench/gguf_convert.py runs it (the sentencepiece it imports for every Llama is installed for
it on first use). Needs disk for the HF folder plus the BF16 file (2 bytes a weight each) while a model is made.

    python bench/real_size_models.py [NAME ...] [--moe-layers N] [--cache-dir DIR] [--keep-intermediates]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.gguf_convert import convert_folder  # noqa: E402
from bench.llamacpp_env import quantize  # noqa: E402

# bump when the way a model is made changes, so that files made the old way are not used
MAKER_VERSION = 1
SHARD_BYTES = 1 << 30
STD = 0.02
SEED = 0
# SmolLM2's tokenizer: its ids of <|im_start|> (BOS in the GGUF) and <|im_end|> (EOS)
BOS, EOS = 1, 2

_LLAMA3_ROPE = {
    "rope_type": "llama3",
    "factor": 32.0,
    "high_freq_factor": 4.0,
    "low_freq_factor": 1.0,
    "original_max_position_embeddings": 8192,
}
_LLAMA = {
    "architectures": ["LlamaForCausalLM"],
    "model_type": "llama",
    "hidden_act": "silu",
    "attention_bias": False,
    "mlp_bias": False,
    "rms_norm_eps": 1e-5,
    "rope_theta": 500000.0,
    "max_position_embeddings": 131072,
    "vocab_size": 128256,
    "initializer_range": STD,
}
# The published configs' shapes (config.json of each model on the Hugging Face hub).
MODELS: dict[str, dict] = {
    "llama-1b": {
        **_LLAMA,
        "hidden_size": 2048,
        "intermediate_size": 8192,
        "num_hidden_layers": 16,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "tie_word_embeddings": True,
        "rope_scaling": _LLAMA3_ROPE,
    },
    "llama-3b": {
        **_LLAMA,
        "hidden_size": 3072,
        "intermediate_size": 8192,
        "num_hidden_layers": 28,
        "num_attention_heads": 24,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": True,
        "rope_scaling": _LLAMA3_ROPE,
    },
    "llama-8b": {
        **_LLAMA,
        "hidden_size": 4096,
        "intermediate_size": 14336,
        "num_hidden_layers": 32,
        "num_attention_heads": 32,
        "num_key_value_heads": 8,
        "head_dim": 128,
        "tie_word_embeddings": False,
        "rope_scaling": {**_LLAMA3_ROPE, "factor": 8.0},
    },
    "qwen3-moe": {
        "architectures": ["Qwen3MoeForCausalLM"],
        "model_type": "qwen3_moe",
        "hidden_act": "silu",
        "hidden_size": 2048,
        "intermediate_size": 6144,
        "moe_intermediate_size": 768,
        "num_experts": 128,
        "num_experts_per_tok": 8,
        "norm_topk_prob": True,
        "decoder_sparse_step": 1,
        "mlp_only_layers": [],
        "num_hidden_layers": 48,
        "num_attention_heads": 32,
        "num_key_value_heads": 4,
        "head_dim": 128,
        "attention_bias": False,
        "rms_norm_eps": 1e-6,
        "rope_theta": 1000000.0,
        "max_position_embeddings": 40960,
        "vocab_size": 151936,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.001,
        "output_router_logits": False,
        "initializer_range": STD,
    },
    "gpt-oss": {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "hidden_act": "silu",
        "hidden_size": 2880,
        "intermediate_size": 2880,
        "num_local_experts": 32,
        "num_experts_per_tok": 4,
        "num_hidden_layers": 24,
        "num_attention_heads": 64,
        "num_key_value_heads": 8,
        "head_dim": 64,
        "attention_bias": True,
        "sliding_window": 128,
        "rms_norm_eps": 1e-5,
        "rope_parameters": {
            "rope_type": "yarn",
            "rope_theta": 150000.0,
            "factor": 32.0,
            "beta_fast": 32.0,
            "beta_slow": 1.0,
            "truncate": False,
            "original_max_position_embeddings": 4096,
        },
        "max_position_embeddings": 131072,
        "swiglu_limit": 7.0,
        "vocab_size": 201088,
        "tie_word_embeddings": False,
        "router_aux_loss_coef": 0.9,
        "output_router_logits": False,
        "initializer_range": STD,
    },
}
# the MoE models' layers by default: a file of about 5 GB, so that the benchmark's three servers fit this machine's
# memory side by side
MOE_LAYERS = {"qwen3-moe": 12, "gpt-oss": 8}
QUANT = {"gpt-oss": "MXFP4_MOE"}  # the others: Q4_K_M


def config_of(name: str, moe_layers: int | None = None) -> dict:
    """The config.json of model `name` (an MoE scaled to `moe_layers` layers, default MOE_LAYERS), with SmolLM2's
    special tokens."""
    if name not in MODELS:
        raise ValueError(f"unknown model {name!r}; one of {', '.join(MODELS)}")
    config = {**MODELS[name], "bos_token_id": BOS, "eos_token_id": EOS, "torch_dtype": "bfloat16"}
    if name in MOE_LAYERS:
        config["num_hidden_layers"] = layers = moe_layers or MOE_LAYERS[name]
        if config["model_type"] == "gpt_oss":  # sliding and full attention in turn, as the published model
            config["layer_types"] = ["sliding_attention", "full_attention"] * (layers // 2) + ["sliding_attention"] * (
                layers % 2
            )
    return config


def tensor_shapes(config: dict) -> Iterator[tuple[str, tuple[int, ...]]]:
    """Every tensor of the model's checkpoint, in the hub's names and order (per-expert weights for the MoE, as the
    published Qwen3-MoE checkpoints have them)."""
    h, v = config["hidden_size"], config["vocab_size"]
    d, heads, kv = config["head_dim"], config["num_attention_heads"], config["num_key_value_heads"]
    gpt_oss = config["model_type"] == "gpt_oss"
    yield "model.embed_tokens.weight", (v, h)
    for i in range(config["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield p + "input_layernorm.weight", (h,)
        for name, rows, cols in (("q", heads * d, h), ("k", kv * d, h), ("v", kv * d, h), ("o", h, heads * d)):
            yield p + f"self_attn.{name}_proj.weight", (rows, cols)
            if gpt_oss:
                yield p + f"self_attn.{name}_proj.bias", (rows,)
        if gpt_oss:
            yield p + "self_attn.sinks", (heads,)
        if config["model_type"] == "qwen3_moe":
            yield p + "self_attn.q_norm.weight", (d,)
            yield p + "self_attn.k_norm.weight", (d,)
        yield p + "post_attention_layernorm.weight", (h,)
        if gpt_oss:  # transformers' layout: gate and up interleaved along the last dimension
            e, w = config["num_local_experts"], config["intermediate_size"]
            yield p + "mlp.router.weight", (e, h)
            yield p + "mlp.router.bias", (e,)
            yield p + "mlp.experts.gate_up_proj", (e, h, 2 * w)
            yield p + "mlp.experts.gate_up_proj_bias", (e, 2 * w)
            yield p + "mlp.experts.down_proj", (e, w, h)
            yield p + "mlp.experts.down_proj_bias", (e, h)
        elif config["model_type"] == "qwen3_moe":
            w = config["moe_intermediate_size"]
            yield p + "mlp.gate.weight", (config["num_experts"], h)
            for e in range(config["num_experts"]):
                yield p + f"mlp.experts.{e}.gate_proj.weight", (w, h)
                yield p + f"mlp.experts.{e}.up_proj.weight", (w, h)
                yield p + f"mlp.experts.{e}.down_proj.weight", (h, w)
        else:
            w = config["intermediate_size"]
            yield p + "mlp.gate_proj.weight", (w, h)
            yield p + "mlp.up_proj.weight", (w, h)
            yield p + "mlp.down_proj.weight", (h, w)
    yield "model.norm.weight", (h,)
    if not config["tie_word_embeddings"]:
        yield "lm_head.weight", (v, h)


def parameter_count(config: dict) -> int:
    count = 0
    for _, shape in tensor_shapes(config):
        n = 1
        for s in shape:
            n *= s
        count += n
    return count


def _random(shape: tuple[int, ...], generator) -> object:
    import torch

    if len(shape) == 1:
        return torch.ones(shape, dtype=torch.bfloat16)  # norms: the identity scale
    out = torch.empty(shape, dtype=torch.bfloat16)
    rows = max(1, (64 << 20) // (4 * shape[-1]))  # 64 MB of float32 at a time
    for start in range(0, shape[0], rows):
        part = out[start : start + rows]
        part.copy_(torch.randn(part.shape, generator=generator).mul_(STD))
    return out


def write_hf_folder(config: dict, folder: Path) -> Path:
    """`folder` with config.json, SmolLM2's tokenizer and the random bfloat16 weights in shards of about
    SHARD_BYTES, written one shard at a time (made under a temporary name, then renamed: a folder that exists is
    whole)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer

    from bench.gguf_files import shipped_gguf

    if (folder / "config.json").is_file():
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    shipped = shipped_gguf()
    AutoTokenizer.from_pretrained(shipped.parent, gguf_file=shipped.name).save_pretrained(partial)
    generator = torch.Generator().manual_seed(SEED)
    shapes = list(tensor_shapes(config))
    groups: list[list[tuple[str, tuple[int, ...]]]] = [[]]
    size = 0
    for name, shape in shapes:
        nbytes = 2 * int(torch.Size(shape).numel())
        if groups[-1] and size + nbytes > SHARD_BYTES:
            groups.append([])
            size = 0
        groups[-1].append((name, shape))
        size += nbytes
    weight_map, total = {}, 0
    for i, group in enumerate(groups):
        shard = f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors"
        tensors = {name: _random(shape, generator) for name, shape in group}
        total += sum(t.numel() * 2 for t in tensors.values())
        save_file(tensors, str(partial / shard), metadata={"format": "pt"})
        weight_map.update(dict.fromkeys(tensors, shard))
        del tensors
    (partial / "model.safetensors.index.json").write_text(
        json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=1)
    )
    (partial / "config.json").write_text(json.dumps(config, indent=1))  # last: marks the folder whole
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def convert(hf_folder: Path, target: Path, outtype: str = "BF16") -> Path:
    """llama.cpp's convert_hf_to_gguf.py of `hf_folder` to `target` (bench/gguf_convert.py runs it)."""
    if not target.is_file():
        convert_folder(hf_folder, target, outtype)
    return target


def default_cache() -> Path:
    from engines.pytorch.loader import default_cache_dir

    return default_cache_dir() / "real-size"


def model_file(
    name: str,
    cache_dir: Path | None = None,
    moe_layers: int | None = None,
    keep_intermediates: bool = False,
    threads: int = 2,
) -> Path:
    """The GGUF file of model `name` (Q4_K_M, or its QUANT), made (minutes) unless cached."""
    config = config_of(name, moe_layers)
    tag = f"{name}-{config['num_hidden_layers']}l" if name in MOE_LAYERS else name
    quant = QUANT.get(name, "Q4_K_M")
    folder = (cache_dir or default_cache()) / f"{tag}-v{MAKER_VERSION}"
    target = folder / f"{tag}.{quant}.gguf"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    bf16 = folder / f"{tag}.BF16.gguf"
    if not bf16.is_file():
        hf = write_hf_folder(config, folder / "hf")
        convert(hf, bf16)
        if not keep_intermediates:  # the disk of one copy: gpt-oss's folder and BF16 file are 15 GB each
            shutil.rmtree(hf)
    quantize(bf16, target, quant, threads=threads)
    if not keep_intermediates:
        bf16.unlink()
    return target


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "names",
        nargs="*",
        default=["llama-1b", "llama-3b"],
        help=f"models to make, of {', '.join(MODELS)} (default: llama-1b llama-3b)",
    )
    parser.add_argument(
        "--moe-layers",
        type=int,
        help="layers of an MoE shape (default: qwen3-moe 12, gpt-oss 8; the published models have 48 and 24)",
    )
    parser.add_argument(
        "--cache-dir", type=Path, help="where the models are kept (default: $SWITCHYARD_CACHE_DIR/real-size)"
    )
    parser.add_argument(
        "--keep-intermediates", action="store_true", help="keep the HF folder and the BF16 GGUF the file is made from"
    )
    parser.add_argument("--threads", type=int, default=min(2, os.cpu_count() or 1), help="quantizer threads")
    args = parser.parse_args()
    for name in args.names:
        config = config_of(name, args.moe_layers)
        start = time.monotonic()
        path = model_file(name, args.cache_dir, args.moe_layers, args.keep_intermediates, args.threads)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20  # GiB (ru_maxrss is in KiB)
        children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 2**20
        print(
            f"{name}: {parameter_count(config) / 1e9:.2f} B weights, {path.stat().st_size / 1e9:.2f} GB "
            f"({time.monotonic() - start:.0f} s; peak RSS {peak:.1f} GiB here, {children:.1f} GiB in a converter "
            f"or quantizer)  {path}",
            flush=True,
        )


if __name__ == "__main__":
    main()
