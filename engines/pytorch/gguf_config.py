"""The transformers config of a GGUF file, with what transformers' GGUF loader leaves out read from the file as
llama.cpp reads it.

transformers maps a fixed list of metadata keys per architecture (integrations/ggml.py). For the families the native
engine serves, that list loses:
- the head size of qwen2 and qwen3 (`<arch>.attention.key_length`): a Qwen3 whose head size is not hidden / heads
  (Qwen3-0.6B's 128 over 1024 / 16) is built with the wrong q/k/v widths;
- Llama 3's RoPE scaling: llama.cpp's converter writes it as a `rope_freqs` tensor (a divisor of each rotary
  frequency), not as metadata, so transformers comes back with `rope_type: default`. The tensor is the converter's
  function of (rope_theta, head size, factor, low/high frequency factors, original context); the parameters are
  recovered from it and checked by computing the tensor again, bit for bit, so that the rotary tables are the ones
  transformers computes for the original folder;
- linear RoPE scaling (`<arch>.rope.scaling.type` / `.factor`; Gemma 3's global layers): transformers reads neither;
- Gemma 2 / 3's query scale (`query_pre_attn_scalar`): not in the file; llama.cpp takes the head size, or hidden /
  heads for the 27B models (known by their layer count), where transformers' config class defaults to 256;
- bias presence: a llama, mistral or qwen3 file with q/k/v/o or MLP biases (`attention_bias`, `mlp_bias`), which
  transformers would build without them and whose bias tensors it would drop without a word;
- gpt-oss's config as a whole: transformers lists the architecture but cannot make its config of the file (its YaRN
  keys are misread), so it is made here of the `gpt-oss.*` metadata (`_gpt_oss_config`).
Rope theta, norm epsilon and tied embeddings (no `output.weight`) transformers reads itself. A Mistral's sliding
window is not in the file at all: llama.cpp's converter writes Mistral as a llama and drops it (so llama.cpp itself
attends over the whole context).
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from engines.interface import ModelFileError
from engines.pytorch.expert_blocks import moe_config
from engines.pytorch.gguf_file import REFETCH, GGUFLayout, read_layout

log = logging.getLogger("switchyard.engines.pytorch")

ROPE_FREQS = "rope_freqs.weight"
# Llama 3.x's own values; the converter's defaults too (conversion/llama.py)
LLAMA3_FREQ_FACTORS = (1.0, 4.0)  # low_freq_factor, high_freq_factor
GEMMA_27B_LAYERS = {"gemma2": 46, "gemma3": 62}  # how llama.cpp tells the 27B models (hidden / heads scale)
ATTENTION_BIAS = re.compile(r"blk\.\d+\.attn_(q|k|v|output)\.bias")
MLP_BIAS = re.compile(r"blk\.\d+\.ffn_(gate|up|down)\.bias")
# llama.cpp's names of architectures transformers' GGUF loader lists under its own (it renames them as it reads)
TRANSFORMERS_ARCH = {"qwen3moe": "qwen3_moe", "qwen2moe": "qwen2_moe", "gpt-oss": "gpt_oss"}
GPT_OSS = "gpt-oss"
# model types whose config is made here of the file's metadata, not by transformers (it misreads gpt-oss's YaRN keys)
CONFIG_MADE_HERE = ("gpt_oss",)
# llama.cpp's openai-moe model: without `attention.sliding_window_pattern`, layer i slides where i % 2 < 2 - 1 (the
# first, the third ...), as GptOssConfig's default layer_types have it
GPT_OSS_SWA_PATTERN = 2
GPT_OSS_ROPE_BASE = 10000.0  # llama.cpp's rope.freq_base where a file has none (the converter always writes it)
# YaRN's optional keys (`<arch>.rope.scaling.*`) and transformers' rope_parameters names for them
YARN_KEYS = (("yarn_beta_fast", "beta_fast"), ("yarn_beta_slow", "beta_slow"), ("yarn_attn_factor", "attention_factor"))


MAX_HEAD_DIM = 4096  # values in one attention head: far above any model's


def gguf_config(gguf: Path) -> Any:
    """transformers' config of `gguf` (AutoConfig's), completed from the file (see the module's docstring).
    Raises ModelFileError for a file transformers cannot make a config of, naming the file and the fix."""
    from transformers import AutoConfig
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    layout = read_layout(gguf)
    arch = layout.architecture
    if TRANSFORMERS_ARCH.get(arch, arch) not in GGUF_SUPPORTED_ARCHITECTURES:
        raise ModelFileError(
            f"{gguf.name}: architecture '{arch or '(none)'}' is not one transformers' GGUF loader reads (the "
            f"native engine takes a GGUF file's config and tokenizer from it; it reads "
            f"{', '.join(sorted(GGUF_SUPPORTED_ARCHITECTURES))}); serve the model's HF folder instead, or use "
            f"backend: vllm"
        )
    try:
        if TRANSFORMERS_ARCH.get(arch, arch) in CONFIG_MADE_HERE:
            config = _gpt_oss_config(layout)
        else:
            config = AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except ModelFileError:
        raise
    except Exception as exc:  # noqa: BLE001 - its metadata, read by transformers, may raise anything (a 0 heads)
        raise ModelFileError(
            f"{gguf.name}: transformers cannot make a config of it ({type(exc).__name__}: "
            f"{str(exc)[:300]}); serve the model's HF "
            "folder instead, or use backend: vllm"
        ) from None
    try:  # experts' width and counts; a llama file with experts is a Mixtral (expert_blocks.py)
        config = moe_config(config, layout.field)
    except (ValueError, TypeError, OverflowError) as exc:  # counts that are no whole numbers (a string, inf)
        raise ModelFileError(
            f"{gguf.name}: its expert counts ({arch}.expert_count, expert_used_count) are not usable ({exc}); {REFETCH}"
        ) from None
    _check_sizes(layout, config)
    found = {
        **_head_size(layout, config),
        **_biases(layout, config),
        **_linear_rope(layout, config),
        **_rope_scaling(layout, config),
    }
    for key, value in found.items():
        setattr(config, key, value)
    found.update(_gemma_query_scale(layout, config))
    for key, value in found.items():
        setattr(config, key, value)
    if found:
        log.info("native engine: read from %s beyond transformers' GGUF loader: %s", gguf.name, found)
    return config


# the sizes a model is built from (transformers' names); each must be a whole number >= 1 where the config has it
SIZES = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "max_position_embeddings",
    "num_local_experts",
    "num_experts",
    "num_experts_per_tok",
    "moe_intermediate_size",
)
LAYER = re.compile(r"blk\.(\d+)\.")
EXPERTS = re.compile(r"blk\.\d+\.ffn_\w+_exps\.weight")


def _check_sizes(layout: GGUFLayout, config: Any) -> None:
    """The metadata's sizes against the tensors, before anything is built from them: the model's layers and
    modules (a million layers would take hours to build, on the meta device too), its real buffers (rotary tables
    of the head size) and the kernels' head groups. Each size is a whole number >= 1; the layers, the width, the
    heads and the experts are what the tensors hold."""
    name, arch = layout.path.name, layout.architecture
    for size in SIZES:
        value = getattr(config, size, None)
        if value is not None and (type(value) is not int or value < 1):
            raise ModelFileError(
                f"{name}: {size} is {value!r} (from its {arch}.* metadata), not a whole number of at least 1; {REFETCH}"
            )
    _check_layers(layout, config.num_hidden_layers)
    embedding = layout.tensors.get("token_embd.weight")
    if embedding is not None and len(embedding.shape) == 2 and embedding.shape[1] != config.hidden_size:
        raise ModelFileError(
            f"{name}: hidden_size is {config.hidden_size} ({arch}.embedding_length) but "
            f"token_embd.weight is {embedding.shape[1]} wide: the metadata and the tensors disagree; "
            f"{REFETCH}"
        )
    head_dim = getattr(config, "head_dim", None)
    # a head may be wider than hidden_size / heads, even than hidden_size (Qwen3's small shapes): bound it by what
    # any model uses (256 for Gemma, 576 for MLA) with room, so a forged size cannot size a huge rotary table
    if head_dim is not None and (type(head_dim) is not int or not 0 < head_dim <= MAX_HEAD_DIM):
        raise ModelFileError(
            f"{name}: a head of {head_dim!r} values (from its {arch}.* metadata; at most {MAX_HEAD_DIM}); {REFETCH}"
        )
    heads, kv_heads = (
        config.num_attention_heads,
        getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
    )
    if kv_heads > heads or heads % kv_heads:
        raise ModelFileError(
            f"{name}: {kv_heads} key/value heads for {heads} query heads ({arch}.attention."
            f"head_count_kv, head_count): each key/value head must serve a whole group; {REFETCH}"
        )
    experts = getattr(config, "num_local_experts", None) or getattr(config, "num_experts", None)
    held = max((t.shape[0] for n, t in layout.tensors.items() if EXPERTS.fullmatch(n) and len(t.shape) == 3), default=0)
    if experts and experts > held:
        raise ModelFileError(
            f"{name}: its metadata's {experts} experts ({arch}.expert_count) are more than its "
            f"expert tensors hold ({held}); {REFETCH}"
        )


def _check_layers(layout: GGUFLayout, layers: int) -> None:
    """The metadata's `layers` (block_count) are no more than the file has tensors of."""
    held = {int(m.group(1)) for t in layout.tensors if (m := LAYER.match(t))}
    if layers > len(held):
        raise ModelFileError(
            f"{layout.path.name}: its metadata's {layers} layers ({layout.architecture}.block_count) are more "
            f"than the file has tensors of {len(held)}: the metadata and the tensors disagree; {REFETCH}"
        )


def _gpt_oss_config(layout: GGUFLayout) -> Any:
    """gpt-oss's config of its `gpt-oss.*` metadata, as llama.cpp's converter writes it (conversion/gpt_oss.py and
    its base class's keys) and llama.cpp reads it (src/models/openai-moe.cpp). transformers' GGUF loader lists the
    architecture but makes no config of it: it reads the YaRN keys' field headers as their values and fails (a
    TypeError; its AutoTokenizer too, which makes that config first). What the file does not hold is the family's
    own: the clamped SwiGLU's alpha and limit (GptOssConfig's defaults, 1.702 and 7.0, llama.cpp's constants), and
    which layers slide: every other one from the first (llama.cpp's pattern of 2, GptOssConfig's default), or as a
    whole-number `attention.sliding_window_pattern` says. A ModelFileError names a key llama.cpp needs that the
    file lacks, or one the engine does not read."""
    from transformers import GptOssConfig

    name, field = layout.path.name, layout.field

    def needed(key: str) -> Any:
        value = field(key)
        if value is None:
            raise ModelFileError(
                f"{name}: its metadata has no {GPT_OSS}.{key}, which llama.cpp's converter writes and llama.cpp "
                f"needs; {REFETCH}"
            )
        return value

    layers, hidden, heads = needed("block_count"), needed("embedding_length"), needed("attention.head_count")
    if type(layers) is int:  # before the config makes a layer type per layer
        _check_layers(layout, layers)
    pattern = field("attention.sliding_window_pattern", GPT_OSS_SWA_PATTERN)
    if f"{GPT_OSS}.attention.sliding_window_pattern" in layout.array_lengths or type(pattern) is not int or pattern < 0:
        raise ModelFileError(
            f"{name}: its {GPT_OSS}.attention.sliding_window_pattern is not a whole number of layers (a list of "
            "layers is not read from GGUF files by the native engine); serve the model's HF folder instead, or use "
            "backend: vllm"
        )
    embedding = layout.tensors.get("token_embd.weight")
    if embedding is None or len(embedding.shape) != 2:
        raise ModelFileError(f"{name}: it has no 2-D token_embd.weight, the model's embedding; {REFETCH}")
    slides = [pattern == 0 or i % pattern < pattern - 1 for i in range(layers)]
    return GptOssConfig(
        vocab_size=embedding.shape[0],
        hidden_size=hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=field("attention.head_count_kv", heads),
        head_dim=field("attention.key_length") or hidden // heads,
        intermediate_size=field("expert_feed_forward_length") or needed("feed_forward_length"),
        num_local_experts=needed("expert_count"),
        num_experts_per_tok=needed("expert_used_count"),
        sliding_window=needed("attention.sliding_window"),
        layer_types=["sliding_attention" if s else "full_attention" for s in slides],
        max_position_embeddings=needed("context_length"),
        rms_norm_eps=float(needed("attention.layer_norm_rms_epsilon")),
        rope_parameters=_gpt_oss_rope(layout, needed),
        tie_word_embeddings="output.weight" not in layout.tensors,
        architectures=["GptOssForCausalLM"],
    )


def _gpt_oss_rope(layout: GGUFLayout, needed: Callable[[str], Any]) -> dict[str, Any]:
    """gpt-oss's rope_parameters: the file's base and YaRN (factor, original context, betas and attention factor
    where written) under transformers' names, and `truncate: false`, as gpt-oss's own configs have it: the rotary
    tables are transformers' for the original folder (llama.cpp's own YaRN floors and ceils the blended range of
    frequencies, transformers' `truncate: true`)."""
    rope: dict[str, Any] = {"rope_theta": float(layout.field("rope.freq_base", GPT_OSS_ROPE_BASE))}
    kind = layout.field("rope.scaling.type")
    if kind in (None, "none"):
        return {"rope_type": "default", **rope}
    if kind != "yarn" or layout.field("rope.scaling.yarn_ext_factor", 1.0) != 1.0:
        raise ModelFileError(
            f"{layout.path.name}: its RoPE scaling ({GPT_OSS}.rope.scaling.type '{kind}', yarn_ext_factor "
            f"{layout.field('rope.scaling.yarn_ext_factor')}) is not gpt-oss's YaRN, the only scaling the native "
            "engine reads from a gpt-oss GGUF file; serve the model's HF folder instead, or use backend: vllm"
        )
    rope.update(
        rope_type="yarn",
        factor=float(needed("rope.scaling.factor")),
        original_max_position_embeddings=int(needed("rope.scaling.original_context_length")),
        truncate=False,
    )
    for key, ours in YARN_KEYS:
        value = layout.field(f"rope.scaling.{key}")
        if value is not None:
            rope[ours] = float(value)
    return rope


def _head_size(layout: GGUFLayout, config: Any) -> dict[str, Any]:
    key, value = layout.field("attention.key_length"), layout.field("attention.value_length")
    if key is None:
        return {}
    if type(key) is not int or not 0 < key <= config.hidden_size:  # the rotary tables are built of it
        raise ModelFileError(
            f"{layout.path.name}: a head of {key!r} values ({layout.architecture}.attention."
            f"key_length) in a model {config.hidden_size} wide; {REFETCH}"
        )
    if value is not None and value != key:
        raise ModelFileError(
            f"{layout.path.name}: keys of {key} and values of {value} values a head "
            f"({layout.architecture}.attention.key_length/value_length); the native engine's "
            "attention needs them equal: use backend: vllm"
        )
    default = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return {"head_dim": int(key)} if key != default or getattr(config, "head_dim", None) is None else {}


def _gemma_query_scale(layout: GGUFLayout, config: Any) -> dict[str, Any]:
    """Gemma's query_pre_attn_scalar as llama.cpp sets it (src/models/gemma2.cpp, gemma3.cpp)."""
    layers_27b = GEMMA_27B_LAYERS.get(layout.architecture)
    if layers_27b is None:
        return {}
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    scalar = config.hidden_size // config.num_attention_heads if config.num_hidden_layers == layers_27b else head_dim
    return {"query_pre_attn_scalar": scalar} if scalar != getattr(config, "query_pre_attn_scalar", None) else {}


def _biases(layout: GGUFLayout, config: Any) -> dict[str, Any]:
    found = {}
    for attr, pattern in (("attention_bias", ATTENTION_BIAS), ("mlp_bias", MLP_BIAS)):
        present = any(pattern.fullmatch(name) for name in layout.tensors)
        if present and hasattr(config, attr) and not getattr(config, attr):
            found[attr] = True
    return found


def _linear_rope(layout: GGUFLayout, config: Any) -> dict[str, Any]:
    """Linear RoPE scaling from the metadata; on a config with rope parameters per layer type (Gemma 3) it is the
    global layers', as llama.cpp applies it (the sliding layers keep `rope.freq_base_swa`, unscaled)."""
    kind = layout.field("rope.scaling.type")
    rope = dict(getattr(config, "rope_parameters", None) or {})
    if kind in (None, "none") or rope.get("rope_type") == kind:  # none, or read already (gpt-oss's YaRN)
        return {}
    factor = layout.field("rope.scaling.factor")
    if kind != "linear" or not factor:
        raise ModelFileError(
            f"{layout.path.name}: RoPE scaling '{kind}' ({layout.architecture}.rope.scaling.*) is "
            "not read from GGUF files by the native engine (linear and Llama 3's are); serve the "
            "model's HF folder instead, or use backend: vllm"
        )
    scaled = {"rope_type": "linear", "factor": float(factor)}
    if "full_attention" in rope:
        rope["full_attention"] = {**rope["full_attention"], **scaled}
    else:
        rope.update(scaled)
    return {"rope_parameters": rope}


def llama3_factors(base: float, dim: int, factor: float, low: float, high: float, original: int) -> np.ndarray:
    """llama.cpp's converter's `rope_freqs` for Llama 3's RoPE scaling: the divisor of each rotary frequency,
    computed as it computes it (float32 frequencies and arithmetic, conversion/llama.py)."""
    import torch

    freqs = 1.0 / (base ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    low_wavelen, high_wavelen = original / low, original / high
    out = []
    for freq in freqs:
        wavelen = 2 * math.pi / freq
        if wavelen < high_wavelen:
            out.append(1)
        elif wavelen > low_wavelen:
            out.append(factor)
        else:
            smooth = (original / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def _rope_scaling(layout: GGUFLayout, config: Any) -> dict[str, Any]:
    """Llama 3's rope_parameters recovered from the file's `rope_freqs` tensor (none without one)."""
    if ROPE_FREQS not in layout.tensors:
        return {}
    factors = layout.read_f32(ROPE_FREQS)
    rope = dict(getattr(config, "rope_parameters", None) or {})
    base = float(rope.get("rope_theta", getattr(config, "rope_theta", 10000.0)))
    dim = int(
        layout.field("rope.dimension_count")
        or getattr(config, "head_dim", None)
        or config.hidden_size // config.num_attention_heads
    )
    params = _fit_llama3(factors, base, dim)
    if params is None:
        raise ModelFileError(
            f"{layout.path.name}: its {ROPE_FREQS} tensor (a divisor per rotary frequency, from {factors.min():g} "
            f"to {factors.max():g}) is not Llama 3's RoPE scaling with low/high frequency factors "
            f"{LLAMA3_FREQ_FACTORS}, the only scaling the native engine reads from a GGUF file; serve the "
            "model's HF folder instead (its config.json says the scaling), or use backend: vllm"
        )
    return {"rope_parameters": {**rope, "rope_type": "llama3", "rope_theta": base, **params}}


def _fit_llama3(factors: np.ndarray, base: float, dim: int) -> dict[str, Any] | None:
    """Llama 3's parameters that make the converter write `factors`, or None where none do. The factor is the
    largest divisor; the original context follows from a smoothed frequency (or, without one, any context between
    the last unscaled and the first fully scaled wavelength gives the same tables)."""
    if factors.shape != (dim // 2,) or not np.all(factors >= 1):
        return None
    factor = float(factors.max())
    if factor == 1.0:
        return None
    low, high = LLAMA3_FREQ_FACTORS
    wavelens = 2 * math.pi * base ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
    smoothed = (factors > 1) & (factors < factor)
    if smoothed.any():
        i = int(np.argmax(smoothed))
        smooth = (1 / float(factors[i]) - 1 / factor) / (1 - 1 / factor)
        candidates = [round(wavelens[i] * (smooth * (high - low) + low))]
    else:
        above = wavelens[factors == 1].max(initial=0.0) * high  # original / high must exceed these
        below = wavelens[factors == factor].min(initial=math.inf) * low  # original / low must stay under these
        power = 2 ** math.ceil(math.log2(max(above, 1.0)))
        candidates = [power, math.floor(above) + 1] if power < below else [math.floor(above) + 1]
    for original in candidates:
        for guess in (original, original - 1, original + 1):
            if np.array_equal(llama3_factors(base, dim, factor, low, high, guess), factors):
                return {
                    "factor": factor,
                    "low_freq_factor": low,
                    "high_freq_factor": high,
                    "original_max_position_embeddings": int(guess),
                }
    return None
