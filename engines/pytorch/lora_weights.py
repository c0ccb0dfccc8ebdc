"""LoRA adapters read from disk: a PEFT folder (`adapter_config.json` + `adapter_model.safetensors`) or a GGUF LoRA
file written by llama.cpp's `convert_lora_to_gguf.py`, into one neutral form: per layer and projection, the low-rank
pair (A [r, in], B [out, r]) and its scale, checked against the base model's shapes.

The scale is PEFT's: `lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`, with `rank_pattern` and
`alpha_pattern` overriding r and alpha per module as PEFT matches them. A GGUF LoRA file carries only `adapter.lora.
alpha`, and its scale is llama.cpp's, alpha / r (1 where alpha is 0). llama.cpp's converter reorders the rows of q's
and k's B for its rotary layout (as it does the base weights); they are put back in transformers' order here, as
transformers' GGUF loader does for the base model.

What the native engine cannot apply is refused with the reason and the fix: DoRA, trained biases, modules saved
whole (`modules_to_save`, new embedding rows), adapters of the embedding or lm_head, pickled weights.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engines.interface import ModelFileError

# transformers' module names the engine applies adapters to (a fused checkpoint's own names included: Phi-3)
TARGETS = ("q_proj", "k_proj", "v_proj", "qkv_proj", "o_proj", "gate_proj", "up_proj", "gate_up_proj", "down_proj")
_PEFT_KEY = re.compile(r"(?:^|\.)layers\.(\d+)\.(self_attn|mlp)\.(\w+?)\.lora_([AB])(?:\.[\w-]+)?\.weight$")
_GGUF_KEY = re.compile(r"^blk\.(\d+)\.(\w+)\.weight\.lora_([ab])$")
# llama.cpp's tensor names of the projections (gguf-py's MODEL_TENSOR names)
_GGUF_MODULES = {
    "attn_q": "q_proj",
    "attn_k": "k_proj",
    "attn_v": "v_proj",
    "attn_qkv": "qkv_proj",
    "attn_output": "o_proj",
    "ffn_gate": "gate_proj",
    "ffn_up": "up_proj",
    "ffn_down": "down_proj",
}


@dataclass
class LoRAPair:
    """One projection's low-rank update: y += (x @ a.T) @ b.T * scale."""

    a: torch.Tensor  # [r, in]
    b: torch.Tensor  # [out, r]
    scale: float


@dataclass
class SlotUpdate:
    """The updates of one projection the engine runs (a fused one: all its parts), as two matmuls: y += ((x @ a.T) @
    b.T) * scale. `a` stacks the parts' A; `b` holds each part's B in its output columns' rows and its rank's
    columns, zeros elsewhere (a zero adds nothing: x + 0 = x exactly); `scale` is each output column's part's scale
    (0 where no part updates the column)."""

    a: torch.Tensor  # [sum r, in]
    b: torch.Tensor  # [out, sum r]
    scale: torch.Tensor  # [out]


@dataclass
class LoRAWeights:
    """An adapter: its pairs per layer, by transformers' module name (`q_proj`, `down_proj`, ...), and the updates of
    the engine's projections made of them (`slots`, by (layer, projection); lora.py `prepare`)."""

    layers: list[dict[str, LoRAPair]]
    source: str  # the file or folder, for messages
    rank: int = 0  # the largest r
    nbytes: int = field(default=0)
    slots: dict[tuple[int, str], SlotUpdate] = field(default_factory=dict)


def read_adapter(
    path: Path, shapes: list[dict[str, tuple[int, int]]], dtype: torch.dtype, config: dict[str, Any]
) -> LoRAWeights:
    """The adapter at `path` (a PEFT folder or a .gguf file). `shapes`: per layer, each module's (out, in) that the
    engine can apply an update to; `config`: the base model's transformers config as a dict (GGUF row orders)."""
    if path.is_dir():
        pairs = _peft(path)
    elif path.is_file() and path.suffix == ".gguf":
        pairs = _gguf(path, config)
    else:
        raise ModelFileError(
            f"{path.name}: not a LoRA adapter; give a PEFT adapter folder (adapter_config.json and "
            "adapter_model.safetensors) or a GGUF LoRA file from llama.cpp's convert_lora_to_gguf.py"
        )
    if not pairs:
        raise ModelFileError(f"{path.name}: the adapter holds no LoRA weights")
    layers: list[dict[str, LoRAPair]] = [{} for _ in shapes]
    for (layer, module), pair in sorted(pairs.items()):
        _check(path, layer, module, pair, shapes)
        # own copies: safetensors' tensors are views of the file's mapping
        layers[layer][module] = LoRAPair(
            pair.a.to(dtype, copy=True).contiguous(), pair.b.to(dtype, copy=True).contiguous(), pair.scale
        )
    held = [t for layer in layers for p in layer.values() for t in (p.a, p.b)]
    return LoRAWeights(
        layers,
        str(path),
        max(p.a.shape[0] for layer in layers for p in layer.values()),
        sum(t.numel() * t.element_size() for t in held),
    )


def _check(path: Path, layer: int, module: str, pair: LoRAPair, shapes: list[dict[str, tuple[int, int]]]) -> None:
    if layer >= len(shapes):
        raise ModelFileError(
            f"{path.name}: it has weights for layer {layer}, the base model has {len(shapes)} "
            "layers; the adapter was trained for another base model"
        )
    if module not in shapes[layer]:
        served = ", ".join(m for m in TARGETS if m in shapes[layer])
        raise ModelFileError(
            f"{path.name}: layer {layer}'s {module} is not a projection the native engine applies "
            f"adapters to in this model ({served}); train the adapter on those modules"
        )
    out_features, in_features = shapes[layer][module]
    r = pair.a.shape[0]
    if pair.a.dim() != 2 or pair.b.dim() != 2 or pair.a.shape[1] != in_features or pair.b.shape != (out_features, r):
        raise ModelFileError(
            f"{path.name}: layer {layer}'s {module} update has A {tuple(pair.a.shape)} and B {tuple(pair.b.shape)}, "
            f"the base model's {module} maps {in_features} to {out_features} (A [r, {in_features}], B "
            f"[{out_features}, r]); the adapter was trained for another base model"
        )


# ------------------------------------------------------------------------------------------------ PEFT folders


def _peft_config(path: Path) -> dict[str, Any]:
    config_file = path / "adapter_config.json"
    try:
        config = json.loads(config_file.read_text())
    except FileNotFoundError:
        raise ModelFileError(
            f"{path.name}: no adapter_config.json; a PEFT adapter folder holds adapter_config.json "
            "and adapter_model.safetensors (PeftModel.save_pretrained writes both)"
        ) from None
    except (OSError, ValueError) as exc:
        raise ModelFileError(
            f"{path.name}/adapter_config.json cannot be read ({exc}); save the adapter again"
        ) from None
    if not isinstance(config, dict) or config.get("peft_type", "LORA") != "LORA":
        kind = config.get("peft_type") if isinstance(config, dict) else None
        raise ModelFileError(f"{path.name}: a PEFT adapter of type {kind!r}; only LoRA adapters are served")
    refused = [
        (config.get("use_dora"), "DoRA (use_dora)"),
        (config.get("fan_in_fan_out"), "fan_in_fan_out"),
        (config.get("bias", "none") != "none", f"trained biases (bias: {config.get('bias')})"),
        (config.get("modules_to_save"), f"modules saved whole ({config.get('modules_to_save')})"),
    ]
    for present, what in refused:
        if present:
            raise ModelFileError(
                f"{path.name}: the adapter uses {what}, which the native engine does not apply; "
                "merge it into the base model (PeftModel.merge_and_unload) and serve that instead"
            )
    return config


def _pattern_value(patterns: dict[str, Any], module_path: str, default: Any) -> Any:
    """PEFT's `rank_pattern` / `alpha_pattern` lookup: the first key that matches the end of the module's name."""
    for key, value in (patterns or {}).items():
        try:
            if re.match(rf"(.*\.)?({key})$", module_path):
                return value
        except re.error as exc:
            raise ModelFileError(
                f"adapter_config.json: pattern '{key[:80]}' is not a regular expression ({exc})"
            ) from None
    return default


def _peft(path: Path) -> dict[tuple[int, str], LoRAPair]:
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    config = _peft_config(path)
    weights_file = path / "adapter_model.safetensors"
    if not weights_file.is_file():
        hint = (
            " (adapter_model.bin is a pickle, which is never loaded: save with safe_serialization)"
            if (path / "adapter_model.bin").is_file()
            else ""
        )
        raise ModelFileError(f"{path.name}: no adapter_model.safetensors{hint}")
    try:
        tensors = load_file(weights_file)
    except (SafetensorError, OSError) as exc:
        raise ModelFileError(f"{path.name}/adapter_model.safetensors cannot be read ({exc}); save it again") from None
    halves: dict[tuple[int, str, str], torch.Tensor] = {}
    for key, tensor in tensors.items():
        match = _PEFT_KEY.search(key)
        if match is None:
            raise ModelFileError(
                f"{path.name}: tensor '{key}' is not a LoRA pair of a decoder layer's projection "
                "(embedding and lm_head adapters, and saved modules, are not served)"
            )
        layer, block, module, half = match.groups()
        halves[(int(layer), f"{block}.{module}", half)] = tensor.float()
    alpha, use_rslora = float(config.get("lora_alpha", 8)), bool(config.get("use_rslora", False))
    pairs = {}
    for (layer, name, half), tensor in halves.items():
        other = halves.get((layer, name, "B" if half == "A" else "A"))
        if other is None:
            raise ModelFileError(
                f"{path.name}: layer {layer}'s {name} has lora_{half} but not the other half of the pair; save it again"
            )
        if half != "A":
            continue
        module_path = f"model.layers.{layer}.{name}"
        r = tensor.shape[0]
        module_alpha = float(_pattern_value(config.get("alpha_pattern"), module_path, alpha))
        scale = module_alpha / math.sqrt(r) if use_rslora else module_alpha / r
        pairs[(layer, name.split(".", 1)[1])] = LoRAPair(tensor, other, scale)
    return pairs


# ------------------------------------------------------------------------------------------------ GGUF files


def _gguf(path: Path, config: dict[str, Any]) -> dict[tuple[int, str], LoRAPair]:
    from gguf import GGUFReader, dequantize
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, TensorProcessor

    try:
        reader = GGUFReader(path)
    except Exception as exc:  # noqa: BLE001 - gguf-py fails on a damaged file in many ways; all mean the same
        raise ModelFileError(f"{path.name}: not a readable GGUF file ({type(exc).__name__}: {exc})") from None

    def field_value(key: str) -> Any:
        found = reader.fields.get(key)
        if found is None or not found.data:
            return None
        value = found.parts[found.data[0]]
        return bytes(value).decode() if found.types and found.types[0].name == "STRING" else value.tolist()[0]

    if field_value("general.type") != "adapter" or field_value("adapter.type") != "lora":
        raise ModelFileError(
            f"{path.name}: a GGUF file that is not a LoRA adapter (general.type "
            f"{field_value('general.type')!r}); make one with llama.cpp's convert_lora_to_gguf.py"
        )
    architecture = field_value("general.architecture") or ""
    processor = TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)
    alpha = float(field_value("adapter.lora.alpha") or 0.0)
    halves: dict[tuple[int, str, str], torch.Tensor] = {}
    for tensor in reader.tensors:
        match = _GGUF_KEY.match(tensor.name)
        if match is None or match.group(2) not in _GGUF_MODULES:
            raise ModelFileError(
                f"{path.name}: tensor '{tensor.name}' is not a LoRA pair of a layer's projection "
                "(embedding, output and norm tensors in an adapter are not served)"
            )
        layer, gguf_module, half = match.groups()
        values = dequantize(tensor.data, tensor.tensor_type)
        if half == "b" and gguf_module in ("attn_q", "attn_k"):  # llama.cpp's rotary row order, back to transformers'
            values = processor.process(
                weights=values, name=f"blk.{layer}.{gguf_module}.weight", tensor_key_mapping={}, parsed_parameters={}
            ).weights
        halves[(int(layer), _GGUF_MODULES[gguf_module], half)] = torch.from_numpy(values.copy()).float()
    pairs = {}
    for (layer, module, half), a in halves.items():
        if half != "a":
            continue
        b = halves.get((layer, module, "b"))
        if b is None:
            raise ModelFileError(f"{path.name}: layer {layer}'s {module} has lora_a but no lora_b; convert it again")
        r = a.shape[0]
        pairs[(layer, module)] = LoRAPair(a, b, alpha / r if alpha else 1.0)
    return pairs
