"""A GGUF file's weights for the native engine, read tensor by tensor: block weights as the file's blocks, the rest
(norms, biases, weights of types the kernels do not read) as the float32 tensors transformers' GGUF loader makes.

Why: transformers' loader dequantizes every tensor to float32 at once (4 bytes a weight: 28 GB for a 7B model whose
Q4_K_M file is 4 GB), so loading through it needs several times the memory the engine then holds. Here no float32
copy of a block weight is ever made whole: each block tensor is checked against gguf-py's dequantization (what
transformers computes) a few rows at a time, and the module paths and row orders are transformers' own
(`get_gguf_hf_weights_map` and the architecture's tensor processor, which reverses llama.cpp's q/k row
interleaving). The result is saved beside the file's cached config (`cache_file`), so later starts read neither the
GGUF's metadata (gguf's reader parses the whole vocabulary: 8 s for SmolLM2) nor check again.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from engines.interface import ModelFileError
from engines.pytorch import block_panels, host_memory
from engines.pytorch.expert_blocks import (
    EXPERTS,
    PROJECTIONS,
    ExpertBlocks,
    blocks_of,
    expert_block_path,
    expert_shapes,
    expert_tensor,
    experts_module_part,
    transformers_experts,
)
from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks, WeightBlocks, file_view
from engines.pytorch.gguf_file import open_reader

log = logging.getLogger("switchyard.engines.pytorch")

CACHE_FORMAT = "gguf-weights-1"  # the cache file's layout: blocks by module path (type in the metadata), floats
CHECK_ROWS = 64  # rows of each block tensor checked against gguf-py's dequantization as the file is read
FLOAT = "float"  # the cache file's type for a float32 tensor
# the types read as blocks when the cache file was written: a file cached before the kernels read one of its types
# (MXFP4 experts kept as float32) is read again, so that they become blocks
BLOCK_TYPES = ",".join(TYPES)


@dataclass(frozen=True)
class GGUFWeights:
    """`blocks`: GGUF blocks by module path ("model.layers.3.mlp.up_proj", "lm_head", "model.embed_tokens"; a tied
    lm_head and embedding share one), rows in transformers' order. `tensors`: float32 tensors by parameter name
    ("model.norm.weight"), every other tensor of the file that the model has. `mapped`: the addresses of the block
    tensors that are views of the cache file's mapping (`drop_pages`). `panels`: where their packed panels are saved
    between starts (panel_cache.py), beside the cache file; None where they were not read from one."""

    blocks: dict[str, GGUFBlocks | ExpertBlocks]
    tensors: dict[str, torch.Tensor]
    mapped: frozenset[int] = frozenset()
    panels: Path | None = None

    def drop_pages(self, blocks: Iterable[WeightBlocks]) -> None:
        """Call once `blocks` (some of `self.blocks`) are packed: the cache file's pages under them leave the
        resident set (read again from the file if anything reads them later), so that loading holds the packed
        weights and the file's pages of about one weight at a time, not of the whole file as well."""
        for found in blocks:
            for part in found.parts:
                if part.raw.data_ptr() in self.mapped:
                    host_memory.drop_file_pages(part.raw)


def _row_order(processor: Any, name: str, n: int) -> np.ndarray | None:
    """The order transformers' tensor processor gives the rows of tensor `name` ([n, k]), or None where it does more
    than reorder rows (then the tensor is loaded as transformers loads it)."""
    index = np.arange(n, dtype=np.int64).reshape(n, 1)
    result = processor.process(weights=index, name=name, tensor_key_mapping={}, parsed_parameters={})
    order = np.asarray(result.weights).reshape(-1)
    if result.name != name or order.shape != (n,) or not np.array_equal(np.sort(order), np.arange(n)):
        return None
    return order


def _checked_blocks(tensor: Any) -> GGUFBlocks | None:
    """The tensor's blocks (the file's rows and bytes), if the kernels read its type and our dequantization equals
    gguf-py's on CHECK_ROWS rows spread over the tensor, first and last among them (the tests compare whole tensors
    of every type: a full check here would cost minutes for a 7B model's first start)."""
    from gguf import dequantize

    spec = TYPES.get(tensor.tensor_type.name)
    if spec is None or len(tensor.shape) != 2:
        return None
    k, n = (int(d) for d in tensor.shape)  # GGUF lists the fastest dimension first
    if k % spec.record_k:
        return None
    data = tensor.data.reshape(n, -1).view(np.uint8)
    blocks = GGUFBlocks(spec.name, file_view(data))  # no copy: the cache file is written of the mapping
    rows = np.unique(np.linspace(0, n - 1, min(n, CHECK_ROWS)).round().astype(np.int64))
    ours = blocks.rows(torch.from_numpy(rows)).dequantize()
    theirs = dequantize(np.ascontiguousarray(data[rows]), tensor.tensor_type).reshape(ours.shape)
    if not torch.equal(ours, torch.from_numpy(np.ascontiguousarray(theirs, dtype=np.float32))):
        log.warning("native engine: %s's %s blocks do not expand to gguf-py's weights; float32", tensor.name, spec.name)
        return None
    return blocks


def _hf_names(model: Any, architecture: str) -> dict[str, str] | None:
    """transformers' parameter name of each GGUF tensor name ("blk.3.ffn_up.weight": "model.layers.3.mlp.up_proj.
    weight"), mapped as transformers' `get_gguf_hf_weights_map` maps a llama-family model (which builds gguf-py's
    name table once per submodule: 10 s for SmolLM2); None for an architecture gguf-py does not know."""
    from gguf import MODEL_ARCH_NAMES, get_tensor_name_map

    arch = next((key for key, value in MODEL_ARCH_NAMES.items() if value == architecture), None)
    if arch is None:
        return None
    table = get_tensor_name_map(arch, model.config.num_hidden_layers)
    names = {}
    for hf_name in model.state_dict(keep_vars=True):
        stem, _, suffix = hf_name.rpartition(".")
        gguf_name = table.get_name(stem) if suffix in ("weight", "bias") else table.get_name(hf_name)
        if gguf_name is None:
            continue
        if suffix in ("weight", "bias"):
            names[f"{gguf_name}.{suffix}"] = hf_name
        else:  # a bare parameter: llama.cpp's converter names its tensor `.weight` (gpt-oss's `sinks`)
            names[gguf_name] = names[f"{gguf_name}.weight"] = hf_name
    return names


def _unplaced(gguf: Path, name: str) -> None:
    """A tensor of the file the model has no place for: an error for a layer's tensor (a bias or a norm the config
    does not describe would be dropped, and the answers wrong), else left out as transformers leaves it out
    (rope_freqs: gguf_config.py read it)."""
    if name.startswith("blk."):
        raise ModelFileError(
            f"{gguf.name}: tensor {name} has no place in the model its metadata describes (a "
            f"weight the native engine's model of this architecture does not have); serve the "
            f"model's HF folder instead, or use backend: vllm"
        )


def _check_shape(gguf: Path, tensor: Any, param: str, expected: torch.Size | None) -> None:
    """The file's tensor has the shape the config gives its parameter (before gguf-py or a kernel reads it)."""
    if expected is None:
        return
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest dimension first
    # the same shape, or (where a tensor processor reshapes, as for stacked experts) at least as many values
    if (tuple(expected) != shape) if len(expected) == len(shape) else (int(np.prod(shape)) != expected.numel()):
        raise ModelFileError(
            f"{gguf.name}: tensor {tensor.name} is {list(shape)} but the file's metadata (heads, head size, widths, "
            f"vocabulary) makes {param} {list(expected)}: the metadata and the tensors disagree; download or convert "
            f"the file again"
        )


def _expert_shape(gguf: Path, tensor: Any, path: str, modules: dict[str, Any]) -> None:
    """A layer's expert tensor (`path`: expert_block_path's) has the shape the config gives it: as the file holds
    the parameters of transformers' experts module of the layer (expert_blocks.expert_shapes: gate and up [E, I, H],
    down [E, H, I]; gpt-oss's biases [E, I], [E, I], [E, H]). One the module has no place for is _unplaced."""
    stem, part = experts_module_part(path)
    module = modules.get(stem)
    want = expert_shapes(module).get(part) if hasattr(module, "gate_up_proj") else None
    if want is None:
        _unplaced(gguf, tensor.name)
        return
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists the fastest dimension first
    if shape != want:
        dims = "experts, rows, columns" if len(want) == 3 else "experts, values"
        raise ModelFileError(
            f"{gguf.name}: tensor {tensor.name} is {list(shape)} ({dims}) but the file's metadata (expert count, "
            f"widths) makes it {list(want)}: the metadata and the tensors disagree; download or convert the file again"
        )


def _float_experts(
    gguf: Path, blocks: dict[str, Any], found: dict[str, np.ndarray], modules: dict[str, Any]
) -> dict[str, torch.Tensor]:
    """transformers' expert parameters of the float expert tensors `found` (by expert_block_path: weights, and
    gpt-oss's biases), laid out as each layer's experts module in `modules` holds them
    (expert_blocks.transformers_experts: Qwen3-MoE's and Mixtral's gate and up as the two halves of `gate_up_proj`
    [E, 2 I, H], gpt-oss's interleaved in [E, H, 2 I]). A layer's expert weights are all blocks or all float
    (models/moe.py, models/gpt_oss.py): where some of a layer's are float, its block ones are taken out of `blocks`
    and dequantized too. Biases are float in any case."""
    by_module: dict[str, dict[str, torch.Tensor]] = {}
    for path, values in found.items():
        stem, part = experts_module_part(path)
        by_module.setdefault(stem, {})[part] = torch.as_tensor(np.array(values, dtype=np.float32))
    float_weights = {stem for stem, parts in by_module.items() if any(p in parts for p in PROJECTIONS)}
    for stem in {experts_module_part(path)[0] for path in blocks if f"{EXPERTS}." in path}:
        if stem not in float_weights and not all(f"{stem}.{p}" in blocks for p in PROJECTIONS):
            raise ModelFileError(
                f"{gguf.name}: {stem} lacks some of its gate, up and down expert tensors; the "
                "file is incomplete: download or convert it again"
            )
    tensors: dict[str, torch.Tensor] = {}
    for stem, parts in by_module.items():
        for part in PROJECTIONS if stem in float_weights else ():
            held = blocks.pop(f"{stem}.{part}", None)
            if held is not None:
                parts[part] = held.dequantize()
            elif part not in parts:
                raise ModelFileError(
                    f"{gguf.name}: {stem} has no {part} expert tensor beside its others; the file "
                    "is incomplete: download or convert it again"
                )
        if ("gate_proj.bias" in parts) != ("up_proj.bias" in parts):
            missing = "up_proj.bias" if "gate_proj.bias" in parts else "gate_proj.bias"
            raise ModelFileError(
                f"{gguf.name}: {stem} has no {missing} expert tensor beside its others; the file "
                "is incomplete: download or convert it again"
            )
        made = transformers_experts(modules.get(stem), parts)
        tensors.update({f"{stem}.{name}": value for name, value in made.items()})
    return tensors


def _from_file(gguf: Path, model: Any) -> GGUFWeights:
    """Read every tensor of `gguf` that `model` (transformers' model of the file, its weights may be on the meta
    device) has: as blocks where it is a 2-D weight of a Linear or Embedding the kernels can read, or a layer's 3-D
    expert tensor of such a type (expert_blocks.py: `ExpertBlocks` under `mlp.experts.{gate,up,down}_proj`), else
    float32 (float experts and gpt-oss's expert biases as the parameters of transformers' experts module)."""
    from gguf import dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor, read_field

    reader = open_reader(gguf)  # checked against the file first: a bad file is a ModelFileError
    architecture = read_field(reader, "general.architecture")[0]
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=model.config.to_dict())
    names = _hf_names(model, architecture)
    if names is None:
        raise ValueError(f"gguf-py does not know the architecture '{architecture}' of {gguf.name}")
    modules = dict(model.named_modules())
    params = dict(model.named_parameters(remove_duplicate=False))
    blocks: dict[str, GGUFBlocks | ExpertBlocks] = {}
    tensors: dict[str, torch.Tensor] = {}
    float_experts: dict[str, np.ndarray] = {}
    for tensor in reader.tensors:
        experts_path = expert_block_path(tensor.name)
        if experts_path is not None:  # a layer's experts: blocks per expert where the kernels read the type
            _expert_shape(gguf, tensor, experts_path, modules)
            is_weight = not experts_path.endswith(".bias")
            found_experts = expert_tensor(tensor, gguf.name) if is_weight else None  # a view of the reader's mapping
            if found_experts is not None:
                blocks[experts_path] = found_experts
            else:
                float_experts[experts_path] = dequantize(tensor.data, tensor.tensor_type)
            continue
        param = names.get(tensor.name)
        if param is None:
            _unplaced(gguf, tensor.name)
            continue
        _check_shape(gguf, tensor, param, params[param].shape if param in params else None)
        path, attr = param.rsplit(".", 1)
        module = modules.get(path)
        found = None
        if attr == "weight" and isinstance(module, (torch.nn.Linear, torch.nn.Embedding)):
            found = _checked_blocks(tensor)
            order = _row_order(processor, tensor.name, found.shape[0]) if found is not None else None
            if order is None:
                found = None
            elif not np.array_equal(order, np.arange(len(order))):
                found = found.rows(torch.from_numpy(order))
        if found is not None:
            blocks[path] = found
            continue
        weights = dequantize(tensor.data, tensor.tensor_type)  # as transformers' load_gguf_checkpoint does
        weights = processor.process(
            weights=weights, name=tensor.name, tensor_key_mapping=names, parsed_parameters={}
        ).weights
        tensors[param] = torch.from_numpy(np.copy(weights)).to(torch.float32)
    tensors.update(_float_experts(gguf, blocks, float_experts, modules))
    if (
        getattr(model.config, "tie_word_embeddings", False)
        and "lm_head" not in blocks
        and "lm_head.weight" not in tensors
        and "model.embed_tokens" in blocks
    ):
        blocks["lm_head"] = blocks["model.embed_tokens"]  # tied: the file has only the table
    return GGUFWeights(blocks, tensors)


def _from_cache(cache_file: Path) -> GGUFWeights | None:
    """The weights saved in `cache_file`, or None where it is not a cache file of this format. Its tensors are
    views of the file's mapping."""
    from safetensors import safe_open

    with safe_open(str(cache_file), "pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != CACHE_FORMAT or meta.get("block_types") != BLOCK_TYPES:
            return None
        blocks, tensors = {}, {}
        for key in f.keys():
            if meta[key] == FLOAT:
                tensors[key] = f.get_tensor(key)
            else:
                blocks[key] = blocks_of(meta[key], f.get_tensor(key), key)
    if meta.get("tied") == "1":
        blocks["lm_head"] = blocks["model.embed_tokens"]
    mapped = frozenset(b.raw.data_ptr() for b in blocks.values())
    return GGUFWeights(blocks, tensors, mapped, cache_file.with_name(f"{cache_file.name}.panels-{block_panels.LAYOUT}"))


def _save(weights: GGUFWeights, cache_file: Path) -> None:
    """Write `weights` to `cache_file` (atomically: a concurrent start reads the old file or the new one)."""
    from safetensors.torch import save_file

    tied = weights.blocks.get("lm_head") is not None and weights.blocks.get("lm_head") is weights.blocks.get(
        "model.embed_tokens"
    )
    saved = {path: b.raw.contiguous() for path, b in weights.blocks.items() if not (tied and path == "lm_head")}
    types = {path: b.qtype for path, b in weights.blocks.items() if path in saved}
    saved.update(weights.tensors)
    types.update({name: FLOAT for name in weights.tensors})
    tmp = cache_file.with_name(f".{cache_file.name}.{os.getpid()}")
    try:
        meta = {"format": CACHE_FORMAT, "block_types": BLOCK_TYPES, "tied": "1" if tied else "0", **types}
        save_file(saved, tmp, metadata=meta)
        tmp.replace(cache_file)
    except BaseException:
        tmp.unlink(missing_ok=True)  # a full disk keeps no half-written file
        raise


def read_weights(gguf: Path, model: Any, cache_file: Path | None = None) -> GGUFWeights:
    """`gguf`'s weights for `model` (see the module's docstring); `cache_file`: where to keep them between starts.
    With a cache file the weights are always read from it, on the first start once it is written too (the copies
    made from the GGUF file are freed before anything is packed): views of its mapping, so take own copies of those
    kept whole, and `drop_pages` the ones packed."""
    if cache_file is None:
        return _from_file(gguf, model)
    cached = _from_cache(cache_file) if cache_file.is_file() else None
    if cached is None:
        from safetensors import SafetensorError

        weights = _from_file(gguf, model)
        try:
            _save(weights, cache_file)
        except (OSError, SafetensorError) as exc:  # a full or read-only cache disk: serve what was read, uncached
            log.warning(
                "could not cache %s's weights (%s); serving them as read, and reading the file again at the next start",
                gguf.name,
                exc,
            )
            return weights
        del weights  # freed before the cache's copies are read
        cached = _from_cache(cache_file)
        assert cached is not None, "the cache file was just written in CACHE_FORMAT"
    return cached
