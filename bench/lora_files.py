"""Random LoRA adapters in PEFT's file format (adapter_config.json + adapter_model.safetensors, the tensor names
`PeftModel.save_pretrained` writes), made without peft or the base model's weights: only its shapes. For the LoRA
benchmark and the server tests, where what matters is that adapters change the answer and load like real ones (the
parity tests make theirs with peft itself: tests/engines/pytorch/test_lora_matches_peft.py).
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

# SmolLM2-135M's shapes: hidden 576, 9 heads and 3 KV heads of 64, MLP 1536, 30 layers
SMOLLM2 = {"layers": 30, "hidden": 576, "q": 576, "kv": 192, "intermediate": 1536}
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")


def _shape(module: str, shapes: dict[str, int]) -> tuple[int, int]:
    hidden, inter = shapes["hidden"], shapes["intermediate"]
    return {
        "q_proj": (shapes["q"], hidden),
        "k_proj": (shapes["kv"], hidden),
        "v_proj": (shapes["kv"], hidden),
        "o_proj": (hidden, shapes["q"]),
        "gate_proj": (inter, hidden),
        "up_proj": (inter, hidden),
        "down_proj": (hidden, inter),
    }[module]


def write_peft_adapter(
    folder: Path,
    *,
    rank: int = 8,
    alpha: float = 16.0,
    seed: int = 0,
    targets: tuple[str, ...] = ("q_proj", "v_proj"),
    scale: float = 0.05,
    shapes: dict[str, int] = SMOLLM2,
    base: str = "SmolLM2-135M-Instruct",
) -> Path:
    """A LoRA adapter of random A and B (both non-zero, each entry normal times `scale`) on `targets` of every layer."""
    from safetensors.torch import save_file

    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for layer in range(shapes["layers"]):
        for module in targets:
            out_features, in_features = _shape(module, shapes)
            block = "self_attn" if module in ATTENTION else "mlp"
            stem = f"base_model.model.model.layers.{layer}.{block}.{module}"
            tensors[f"{stem}.lora_A.weight"] = torch.randn(rank, in_features, generator=gen) * scale
            tensors[f"{stem}.lora_B.weight"] = torch.randn(out_features, rank, generator=gen) * scale
    folder.mkdir(parents=True, exist_ok=True)
    save_file(tensors, folder / "adapter_model.safetensors")
    config = {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": base,
        "r": rank,
        "lora_alpha": alpha,
        "lora_dropout": 0.0,
        "bias": "none",
        "target_modules": list(targets),
        "use_rslora": False,
        "use_dora": False,
        "fan_in_fan_out": False,
    }
    (folder / "adapter_config.json").write_text(json.dumps(config, indent=2))
    return folder
