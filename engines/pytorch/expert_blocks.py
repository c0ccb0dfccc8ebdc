"""A GGUF file's mixture-of-experts weights: a layer's experts stacked in one 3-D tensor, read per expert in place.

Why: an MoE model is mostly experts (Qwen3-30B-A3B: 29 of its 30 B weights), and a decode step reads only the few
its rows chose. Each expert's weight is a contiguous run of the tensor's block rows, so an expert is a view of the
file's bytes (`ExpertBlocks.expert`), which `Linear` / `GatedActivation` take as any other GGUF weight.

How llama.cpp's converter (convert_hf_to_gguf.py, gguf-py) writes them, for Qwen3-MoE (`qwen3moe`) and Mixtral
(written as `llama`: Mixtral has no GGUF architecture of its own):
- per layer three tensors `blk.N.ffn_gate_exps.weight`, `blk.N.ffn_up_exps.weight` (GGUF dims (H, I, E), fastest
  first: torch's [E, I, H]) and `blk.N.ffn_down_exps.weight` ((I, H, E): [E, H, I]), the experts stacked in order
  (`torch.stack` of the checkpoint's experts; a transformers 5 checkpoint's `gate_up_proj` [E, 2 I, H] is split into
  its gate half and its up half first), in the file's quantization type: expert e's [N, K] weight is block rows
  e N .. e N + N - 1 of the tensor read as [E N, K];
- the router `blk.N.ffn_gate_inp.weight` ([E, H]) in F32 (the converter and llama-quantize keep it so);
- metadata `{arch}.expert_count` (E), `{arch}.expert_used_count` (k, experts a token) and, for qwen3moe,
  `{arch}.expert_feed_forward_length` (I; a Mixtral file's I is its `feed_forward_length`).
gpt-oss (`gpt-oss`, conversion/gpt_oss.py) has the same three tensors and the router, each with a bias:
`blk.N.ffn_{gate,up}_exps.bias` [E, I], `blk.N.ffn_down_exps.bias` [E, H], `blk.N.ffn_gate_inp.bias` [E]. Its
checkpoint holds `gate_up_proj` [E, H, 2 I] with gate and up interleaved along the last dimension (gate the even
columns) and `down_proj` [E, I, H]: the converter transposes them and takes gate's and up's rows (and biases) apart,
so the file's layout is the one above; the released checkpoints' MXFP4 experts are repacked as GGUF MXFP4 blocks.

transformers' GGUF loader (5.19) reads qwen3moe files: `expert_count` -> `num_experts`, `expert_used_count` ->
`num_experts_per_tok`, `norm_topk_prob` set True (llama.cpp's qwen3moe graph normalises; the config class's default
is False); `expert_feed_forward_length` is not mapped (`moe_intermediate_size` stays the config class's default
unless the file's shapes agree with it, so the engine takes I from the tensors' shapes); its tensor processor
dequantizes each 3-D tensor to float32 and writes gate and up into the two halves of `mlp.experts.gate_up_proj`,
down as `mlp.experts.down_proj`. It does not read Mixtral files as Mixtral: their `llama` architecture gives a
dense Llama config with no experts, so a Mixtral GGUF needs the expert metadata read here. Its gpt-oss tensor
processor expects other tensor names (`ffn_*_projs`) than llama.cpp writes.

transformers' experts modules say how they hold a layer's experts (`use_experts_implementation`'s attributes):
`is_concatenated` (gate and up as the two halves of `gate_up_proj`'s 2 I outputs; gpt-oss: interleaved),
`is_transposed` (gpt-oss: [E, H, 2 I] and [E, I, H]), and biases where it has `gate_up_proj_bias` /
`down_proj_bias`. `expert_shapes` and `transformers_experts` go between the file's layout and the module's by them.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import torch

from engines.pytorch.gguf_blocks import TYPES, GGUFBlocks, file_view

CHECK_EXPERT_ROWS = 16  # rows of each checked expert compared with gguf-py's dequantization as the file is read
EXPERT_TENSORS = ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")
EXPERT_NAME = re.compile(r"blk\.(\d+)\.ffn_(gate|up|down)_exps\.(weight|bias)")
PROJECTIONS = ("gate_proj", "up_proj", "down_proj")  # a layer's expert weights by module name (expert_block_path's)
EXPERTS = ".mlp.experts"  # a layer's experts module, in module paths


@dataclass(frozen=True)
class ExpertBlocks:
    """A layer's [E, N, K] expert weight as one GGUF type's blocks: `raw` [E, N, row bytes], each expert's rows as
    the file stores them."""

    qtype: str
    raw: torch.Tensor  # [E, N, K / block * block_bytes] uint8
    source: str | None = None  # the module path it was read as (GGUFBlocks.source); expert e's is `source.e`

    @property
    def shape(self) -> tuple[int, int, int]:
        t = TYPES[self.qtype]
        e, n, row = self.raw.shape
        return e, n, row // t.block_bytes * t.block

    @property
    def num_experts(self) -> int:
        return self.raw.shape[0]

    @property
    def nbytes(self) -> int:
        return self.raw.numel()

    @property
    def parts(self) -> tuple[ExpertBlocks, ...]:
        """As `WeightBlocks.parts`, for what goes over every held block tensor (`GGUFWeights.drop_pages`)."""
        return (self,)

    def expert(self, e: int) -> GGUFBlocks:
        """Expert `e`'s [N, K] weight: a view of the tensor's bytes (nothing is copied)."""
        return GGUFBlocks(self.qtype, self.raw[e], None if self.source is None else f"{self.source}.{e}")

    def dequantize(self) -> torch.Tensor:
        """The float32 [E, N, K] weight, as gguf-py (and so transformers' GGUF loader) computes it."""
        e, n, k = self.shape
        return GGUFBlocks(self.qtype, self.raw.reshape(e * n, -1)).dequantize().view(e, n, k)


class LayerExperts(NamedTuple):
    """A layer's experts: gate and up [E, I, H], down [E, H, I]."""

    gate: ExpertBlocks
    up: ExpertBlocks
    down: ExpertBlocks

    @classmethod
    def held(cls, own: dict[str, Any]) -> LayerExperts | None:
        """A layer's experts from its blocks by module name (models/decoder.py's `layer_blocks`) where all three
        are held as blocks; else None (transformers' float parameters hold them)."""
        parts = [own.get(name) for name in PROJECTIONS]
        return cls(*parts) if all(isinstance(p, ExpertBlocks) for p in parts) else None


class ExpertCounts(NamedTuple):
    """The file's expert metadata: experts per layer, experts a token uses, and their width (None: not written)."""

    count: int
    used: int
    feed_forward_length: int | None


def expert_counts(reader: Any) -> ExpertCounts | None:
    """`reader`'s (a gguf.GGUFReader) `{arch}.expert_count`, `expert_used_count` and `expert_feed_forward_length`;
    None for a file without experts."""

    def field(key: str) -> int | None:
        found = reader.fields.get(key)
        return None if found is None else int(found.contents())

    arch = reader.fields["general.architecture"].contents()
    count, used = field(f"{arch}.expert_count"), field(f"{arch}.expert_used_count")
    if not count:
        return None
    if not used or used > count:
        raise ValueError(f"{arch}.expert_used_count is {used} for {count} experts: the file's metadata is corrupt")
    return ExpertCounts(count, used, field(f"{arch}.expert_feed_forward_length"))


def expert_tensor(tensor: Any, file: str = "the GGUF file") -> ExpertBlocks | None:
    """A 3-D expert tensor of a gguf.GGUFReader as per-expert blocks (a view of the reader's mapping), if the
    kernels read its type; None otherwise (then dequantize it as transformers does). The first and the last expert
    are checked against gguf-py's dequantization, CHECK_EXPERT_ROWS rows each, as gguf_weights.py checks 2-D
    tensors."""
    from gguf import dequantize

    if len(tensor.shape) != 3:
        raise ValueError(
            f"{tensor.name} in {file} has shape {list(tensor.shape)}: an expert tensor has 3 dimensions "
            "(the file is not what llama.cpp's converter writes)"
        )
    spec = TYPES.get(tensor.tensor_type.name)
    k, n, e = (int(d) for d in tensor.shape)  # GGUF lists the fastest dimension first
    if spec is None or k % spec.record_k:
        return None
    data = np.asarray(tensor.data).view(np.uint8).reshape(e, n, -1)
    blocks = ExpertBlocks(spec.name, file_view(data))
    rows = np.unique(np.linspace(0, n - 1, min(n, CHECK_EXPERT_ROWS)).round().astype(np.int64))
    for x in sorted({0, e - 1}):
        ours = blocks.expert(x).rows(torch.from_numpy(rows)).dequantize()
        theirs = dequantize(np.ascontiguousarray(data[x, rows]), tensor.tensor_type).reshape(ours.shape)
        if not torch.equal(ours, torch.from_numpy(np.ascontiguousarray(theirs, dtype=np.float32))):
            return None
    return blocks


def layer_experts(
    reader: Any, layer: int, counts: ExpertCounts, hidden: int, file: str = "the GGUF file"
) -> LayerExperts | None:
    """Layer `layer`'s expert tensors in `reader` as per-expert blocks, their shapes checked against `counts` and
    the model's `hidden` size (a ValueError names the tensor otherwise); None where the layer has none (a dense
    layer of a model with some, e.g. Qwen3-MoE's `mlp_only_layers`) or where some is of a type the kernels do not
    read."""
    found = {t.name: t for t in reader.tensors if t.name.startswith(f"blk.{layer}.ffn_") and "_exps." in t.name}
    if not found:
        return None
    parts = []
    for name in EXPERT_TENSORS:
        tensor = found.get(f"blk.{layer}.{name}.weight")
        if tensor is None:
            raise ValueError(
                f"{file} has no blk.{layer}.{name}.weight beside its other expert tensors of layer {layer}"
            )
        blocks = expert_tensor(tensor, file)
        if blocks is None:
            return None
        parts.append(blocks)
    gate, up, down = parts
    _e, i, _h = gate.shape
    width = counts.feed_forward_length or i
    want = {
        "ffn_gate_exps": (counts.count, width, hidden),
        "ffn_up_exps": (counts.count, width, hidden),
        "ffn_down_exps": (counts.count, hidden, width),
    }
    for name, blocks in zip(EXPERT_TENSORS, parts, strict=True):
        if blocks.shape != want[name]:
            raise ValueError(
                f"blk.{layer}.{name}.weight in {file} is {list(blocks.shape)} (experts, rows, columns); "
                f"the metadata says {list(want[name])}: the file is corrupt or from another converter"
            )
    return LayerExperts(gate, up, down)


def expert_block_path(tensor_name: str) -> str | None:
    """Where a layer's expert blocks are kept among a file's blocks by module path (models/moe.py reads them there):
    `blk.3.ffn_up_exps.weight` -> `model.layers.3.mlp.experts.up_proj`, and its bias (gpt-oss) ->
    `model.layers.3.mlp.experts.up_proj.bias`; None for any other tensor."""
    found = EXPERT_NAME.fullmatch(tensor_name)
    if found is None:
        return None
    path = f"model.layers.{found[1]}{EXPERTS}.{found[2]}_proj"
    return path if found[3] == "weight" else f"{path}.bias"


def experts_module_part(path: str) -> tuple[str, str]:
    """An expert_block_path split into its experts module's path and the part:
    `model.layers.3.mlp.experts.up_proj.bias` -> (`model.layers.3.mlp.experts`, `up_proj.bias`)."""
    head, _, part = path.partition(f"{EXPERTS}.")
    return f"{head}{EXPERTS}", part


def _layout(module: Any) -> tuple[bool, bool]:
    """(is_concatenated, is_transposed) of transformers' experts module (its defaults where it lacks them)."""
    return bool(getattr(module, "is_concatenated", True)), bool(getattr(module, "is_transposed", False))


def expert_shapes(module: Any) -> dict[str, tuple[int, ...]]:
    """The shape the file holds each expert tensor of a layer in, by part (experts_module_part's; biases only where
    the module has them), from transformers' experts module of the layer (its parameters' shapes: on the meta device
    too): gate and up [E, I, H], down [E, H, I], their biases [E, I], [E, I], [E, H]."""
    _concatenated, transposed = _layout(module)
    e, rows, columns = module.gate_up_proj.shape
    h, i = (rows, columns // 2) if transposed else (columns, rows // 2)
    shapes: dict[str, tuple[int, ...]] = {"gate_proj": (e, i, h), "up_proj": (e, i, h), "down_proj": (e, h, i)}
    if getattr(module, "gate_up_proj_bias", None) is not None:
        shapes.update({"gate_proj.bias": (e, i), "up_proj.bias": (e, i)})
    if getattr(module, "down_proj_bias", None) is not None:
        shapes["down_proj.bias"] = (e, h)
    return shapes


def transformers_experts(module: Any, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """transformers' parameters of a layer's experts module (`gate_up_proj`, `down_proj`, and from biases
    `gate_up_proj_bias`, `down_proj_bias`) from the file's float32 tensors `parts` (by part and in the shapes
    expert_shapes gives), laid out as the module holds them: gate and up as the two halves of the 2 I outputs, or
    interleaved (gate first) where it is not `is_concatenated`; the weights transposed where it `is_transposed`.
    A parameter is made only where all its parts are given."""
    concatenated, transposed = _layout(module)
    out: dict[str, torch.Tensor] = {}
    for suffix, name in (("", "gate_up_proj"), (".bias", "gate_up_proj_bias")):
        gate, up = parts.get(f"gate_proj{suffix}"), parts.get(f"up_proj{suffix}")
        if gate is None or up is None:
            continue
        joined = torch.cat((gate, up), dim=1) if concatenated else torch.stack((gate, up), dim=2).flatten(1, 2)
        out[name] = joined.transpose(1, 2).contiguous() if transposed and not suffix else joined
    down, down_bias = parts.get("down_proj"), parts.get("down_proj.bias")
    if down is not None:
        out["down_proj"] = down.transpose(1, 2).contiguous() if transposed else down
    if down_bias is not None:
        out["down_proj_bias"] = down_bias
    return out


def expert_parameters(block_paths: Iterable[str]) -> set[str]:
    """transformers' parameters that expert blocks kept under `block_paths` stand for (its experts hold gate and up
    as one `gate_up_proj` [E, 2 I, H]): what a loader need not find among the file's float tensors."""
    found = set()
    for path in block_paths:
        stem, _, part = path.rpartition(".")
        if stem.endswith(".mlp.experts") and part in ("gate_proj", "up_proj", "down_proj"):
            found.add(f"{stem}.{'down_proj' if part == 'down_proj' else 'gate_up_proj'}")
    return found


def blocks_of(qtype: str, raw: torch.Tensor, source: str | None = None) -> GGUFBlocks | ExpertBlocks:
    """Blocks saved as their raw bytes (a loader's cache), read as module path `source`: a 3-D tensor is a layer's
    experts."""
    return ExpertBlocks(qtype, raw, source) if raw.dim() == 3 else GGUFBlocks(qtype, raw, source)


def moe_config(config: Any, field: Callable[[str], Any]) -> Any:
    """transformers' config of a GGUF file (AutoConfig's) completed with what its GGUF loader leaves out of an MoE
    file; `field(key)`: the file's `{arch}.key` metadata (None where absent). Qwen3-MoE: the experts' width
    (`expert_feed_forward_length`, else `moe_intermediate_size` keeps the config class's default). A `llama` file
    with experts is Mixtral (llama.cpp's converter writes Mixtral so; transformers builds a dense Llama of it): a
    MixtralConfig of the same fields, `expert_count` experts of `feed_forward_length`, `expert_used_count` a token.
    Any other config is returned as it is."""
    count, used = field("expert_count"), field("expert_used_count")
    if not count:
        return config
    if not used or int(used) > int(count):
        raise ValueError(f"expert_used_count is {used} for {count} experts: the file's metadata is corrupt")
    if config.model_type == "qwen3_moe":
        width = field("expert_feed_forward_length")
        if width:
            config.moe_intermediate_size = int(width)
        config.num_experts, config.num_experts_per_tok = int(count), int(used)
        return config
    if config.model_type == "llama":
        from transformers import MixtralConfig

        fields = {k: v for k, v in config.to_dict().items() if k not in ("model_type", "architectures")}
        fields.update(num_local_experts=int(count), num_experts_per_tok=int(used), architectures=["MixtralForCausalLM"])
        return MixtralConfig(**fields)
    return config
