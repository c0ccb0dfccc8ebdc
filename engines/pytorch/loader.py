"""Load weights and tokenizer from an HF folder or a GGUF file, caching what a GGUF file takes long to read.

transformers dequantizes GGUF on every load (tens of seconds for a small model), and all of it to float32 at once.
`resolve_hf_folder` saves its result as safetensors in a cache folder keyed by the file's identity (what the float32
and bfloat16 paths, vLLM and the tests load), so later starts take about a second. The native engine's block path
(`load_gguf_blocks`) never builds that float32 model: transformers' model of the file is built on the meta device
from the file's config, its float tensors filled from the file and its block weights left to the GGUF blocks, so
loading needs about the memory the engine then holds.

Both read the file's config through `gguf_config` (what transformers' GGUF loader leaves out, read from the file as
llama.cpp reads it) after `gguf_file.read_layout` has checked the file, so a bad file is one `ModelFileError` naming
it, the tensor at fault and the fix.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from engines.gguf_cache import cache_entry, publish
from engines.interface import ModelFileError
from engines.pytorch.expert_blocks import ExpertBlocks, expert_parameters, experts_module_part, transformers_experts
from engines.pytorch.gguf_config import CONFIG_MADE_HERE, TRANSFORMERS_ARCH, gguf_config
from engines.pytorch.gguf_file import read_layout
from engines.pytorch.gguf_weights import GGUFWeights
from engines.pytorch.models import check_supported

log = logging.getLogger("switchyard.engines.pytorch")

WEIGHTS_CACHE = "weights-1.safetensors"  # gguf_weights.read_weights's cache file, beside the config folder
# bump when what is read from a GGUF file changes (gguf_config.py), so that folders cached the old way are not used
GGUF_READ_VERSION = 5
TORCH_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# families whose GGUF weights transformers' GGUF loader cannot load, read here instead: Mixtral (written as a dense
# `llama`), gpt-oss (its tensor processor expects other expert tensor names, and leaves the sinks out)
NOT_LOADED_BY_TRANSFORMERS = ("mixtral", "gpt_oss")


def default_cache_dir() -> Path:
    """Where the engine caches when its caller names no folder (the engine used on its own: tests, benchmarks). The
    server always names one: `ServerConfig.cache_dir`, which reads `--cache-dir` and `SWITCHYARD_CACHE_DIR`."""
    return Path.home() / ".cache" / "switchyard"


def _cached(gguf: Path, cache_dir: Path | None) -> Path:
    """Where what is read from `gguf` is cached: this path, plus `.config`, plus the weights' suffix."""
    return cache_entry((cache_dir or default_cache_dir()) / "gguf", gguf, f"-{GGUF_READ_VERSION}")


def _gguf_tokenizer(gguf: Path, model_type: str) -> Any:
    """The file's tokenizer (its tokenizer.* metadata: vocabulary, merges, special tokens, chat template) as
    transformers makes it. AutoTokenizer makes the file's config first, to choose the tokenizer's class; where it
    cannot (gpt-oss: gguf_config.py makes that config) the tokenizers backend, the class of gpt-oss's own tokenizer,
    reads the file alone."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    make = PreTrainedTokenizerFast if model_type in CONFIG_MADE_HERE else AutoTokenizer
    try:
        return make.from_pretrained(gguf.parent, gguf_file=gguf.name)
    except Exception as exc:  # noqa: BLE001 - the file's vocabulary, read by transformers and tokenizers, may raise
        # anything: an IndexError for a special token id past the vocabulary, tokenizers' bare Exception for a merge
        # of tokens it does not hold
        raise ModelFileError(
            f"{gguf.name}: transformers cannot make a tokenizer of its tokenizer.* metadata "
            f"({type(exc).__name__}: {str(exc)[:300]}); serve the model's HF folder instead, or "
            "use backend: vllm"
        ) from None


def file_tokenizer(gguf: Path) -> Any:
    """The tokenizer of `gguf` alone, as a start reads it (for what needs no model of the file: a benchmark's
    prompts)."""
    arch = read_layout(gguf).architecture
    return _gguf_tokenizer(gguf, TRANSFORMERS_ARCH.get(arch, arch))


def _convert_gguf(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM

    log.info("converting %s to safetensors (first start only; cached in %s)", gguf.name, target.parent)
    config = gguf_config(gguf)
    check_supported(config.model_type, getattr(config, "architectures", None))
    tokenizer = _gguf_tokenizer(gguf, config.model_type)
    if config.model_type in NOT_LOADED_BY_TRANSFORMERS:
        model = _dequantized_model(gguf, config)
    else:
        model = AutoModelForCausalLM.from_pretrained(
            gguf.parent, gguf_file=gguf.name, config=config, dtype=torch.float32
        )
    # The dequantized model is plain float weights; drop the GGUF marker so transformers lets us save it.
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    publish(target, (model, tokenizer), "config.json")


def _dequantized_model(gguf: Path, config: Any) -> Any:
    """transformers' float32 model of `config` holding `gguf`'s weights as gguf_weights.py reads them (the same
    module paths, row orders and float32 values as transformers' GGUF loader), every block weight dequantized."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from engines.pytorch.gguf_weights import read_weights

    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    weights = read_weights(gguf, model)
    found = dict(weights.tensors)
    experts: dict[str, dict[str, torch.Tensor]] = {}  # block experts by experts module, then part
    for path, blocks in weights.blocks.items():
        if isinstance(blocks, ExpertBlocks):
            stem, part = experts_module_part(path)
            experts.setdefault(stem, {})[part] = blocks.dequantize()
        else:
            found[f"{path}.weight"] = blocks.dequantize()
    for stem, parts in experts.items():
        made = transformers_experts(model.get_submodule(stem), parts)
        found.update({f"{stem}.{name}": value for name, value in made.items()})
    _fill(model, gguf, found)
    return model


def _fill(model: Any, gguf: Path, tensors: dict[str, torch.Tensor], in_blocks: frozenset[str] = frozenset()) -> None:
    """Set `model`'s parameters (on the meta device) to `tensors` by name; a ModelFileError where one stays unset
    and is not among `in_blocks` (the parameters the engine reads as GGUF blocks instead)."""
    for name, tensor in tensors.items():
        path, attr = name.rsplit(".", 1)
        setattr(model.get_submodule(path), attr, torch.nn.Parameter(tensor, requires_grad=False))
    head, table = model.get_output_embeddings(), model.get_input_embeddings()
    if getattr(model.config, "tie_word_embeddings", False) and head.weight.is_meta and not table.weight.is_meta:
        head.weight = table.weight  # a tied table
    missing = [n for n, p in model.named_parameters(remove_duplicate=False) if p.is_meta and n not in in_blocks]
    if missing:
        raise ModelFileError(
            f"{gguf.name} has no tensor for the model's {missing[0]} (and {len(missing) - 1} more "
            "weights) that its config describes; the file is incomplete: "
            "download or convert it again"
        )
    model.eval()


def resolve_hf_folder(source: Path, gguf_file: str | None = None, cache_dir: Path | None = None) -> Path:
    """Return an HF folder for `source`: the folder itself, or the cached conversion of a GGUF file."""
    gguf = source / gguf_file if gguf_file else source
    if gguf.is_file() and gguf.suffix == ".gguf":
        target = _cached(gguf, cache_dir)
        if not (target / "config.json").exists():
            _convert_gguf(gguf, target)
        return target
    if (source / "config.json").is_file():
        return source
    raise FileNotFoundError("no config.json (HF folder) or .gguf file found at the model source")


def _gguf_config_and_tokenizer(gguf: Path, target: Path) -> tuple[Any, Any]:
    """The file's transformers config and tokenizer, from `target`: a folder of them (no weights) made on the first
    start. Where the folder cannot be written (a full or read-only cache disk) they are used as read, uncached."""
    from transformers import AutoConfig, AutoTokenizer

    if not (target / "config.json").exists():
        config = gguf_config(gguf)
        tokenizer = _gguf_tokenizer(gguf, config.model_type)
        try:
            publish(target, (config, tokenizer), "config.json")
        except OSError as exc:
            log.warning("could not cache %s's config and tokenizer (%s); using them uncached", gguf.name, exc)
            return config, tokenizer
    return AutoConfig.from_pretrained(target), AutoTokenizer.from_pretrained(target)


def load_gguf_blocks(gguf: Path, cache_dir: Path | None = None) -> tuple[Any, Any, GGUFWeights] | None:
    """(model, tokenizer, weights) of a GGUF file for the native engine's block path, in float32: the model's
    float tensors are the file's (as transformers loads them), its block weights stay on the meta device and are
    `weights.blocks` (gguf_weights.py). None, saying why in the log, where gguf-py cannot name the file's tensors
    (then load the float32 model through `resolve_hf_folder`). Raises ModelFileError for a bad file, and for one
    that lacks a weight of the model its config describes."""
    from accelerate import init_empty_weights
    from transformers import AutoModelForCausalLM

    from engines.pytorch.gguf_weights import read_weights

    cached = _cached(gguf, cache_dir)
    config, tokenizer = _gguf_config_and_tokenizer(gguf, cached.with_name(f"{cached.name}.config"))
    check_supported(config.model_type, getattr(config, "architectures", None))  # before any weight is read
    # parameters on the meta device; buffers (rotary tables, Gemma's embedding scale) are computed at build, not
    # loaded, so they are built for real
    with init_empty_weights(include_buffers=False):
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    try:
        weights = read_weights(gguf, model, cached.with_name(f"{cached.name}.{WEIGHTS_CACHE}"))
    except ModelFileError:
        raise
    except ValueError as exc:  # gguf-py does not know the architecture: transformers' own loader may
        log.warning("native engine: %s; loading transformers' float32 model of it", exc)
        return None
    in_blocks = frozenset({f"{path}.weight" for path in weights.blocks} | expert_parameters(weights.blocks))
    _fill(model, gguf, weights.tensors, in_blocks)
    return model, tokenizer, weights


def load_hf(folder: Path, dtype: str) -> tuple[Any, Any]:
    """Load (model, tokenizer) from an HF folder on the CPU, in eval mode."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=TORCH_DTYPES[dtype])
    model.eval()
    return model, tokenizer
