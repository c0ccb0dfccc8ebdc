"""The sparse mixture-of-experts block (Qwen3-MoE, Mixtral, gpt-oss): what transformers' `Qwen3MoeSparseMoeBlock`,
`MixtralSparseMoeBlock` and `GptOssMLP` compute, on the engine's projections.

Routing, as transformers' routers do it: router logits `x @ router.T` (in the model's dtype), softmax in float32,
`torch.topk` (so ties between experts are broken as transformers breaks them: the same op on the same values), the
top-k weights divided by their sum where the family normalises (Mixtral always; Qwen3-MoE with `norm_topk_prob`),
then cast back to the model's dtype (Qwen3-MoE) or kept in float32 (Mixtral). gpt-oss's router has a bias and takes
the top-k of the logits, then a softmax over those k (`Routing.softmax_of_top`); its experts are biased projections
around a clamped SwiGLU (swiglu.py), built by models/gpt_oss.py.

Experts: each is a gated MLP, `down(act(x @ gate.T) * (x @ up.T))`, held as its own `GatedActivation` and `Linear`
(gated_activation.py, linear.py): the packed GEMM kernel on float32 or bfloat16 weights, or on the expert's GGUF
blocks, which are a view of the layer's 3-D expert tensor (expert_blocks.py) and are repacked as any GGUF weight is.
A step's rows are grouped by expert: each expert its rows chose runs once, over those rows (ascending, so a step's
decode rows come first, as `prompt_from` wants), and experts no row chose are not read at all -- a one-row decode
step reads k experts' weights of the E.

Combination, in a fixed order: expert `e`'s output for a row is multiplied by the row's weight for `e` (the product in
the promoted dtype of the two, as transformers multiplies) and stored at the row's top-k slot; then each row's k
products are summed in slot order (slot 0, the expert of highest router probability, + slot 1, + slot 2 ...) in a
float32 accumulator, rounded once to the model's dtype. That is the order of transformers' default experts
implementation ("grouped_mm", which `from_pretrained` picks: `.view(T, k, H).sum(dim=1)`, whose float32 and bfloat16
sums torch runs in that sequential order); the "eager" implementation adds experts in ascending expert order instead
(the same bits for k = 2, within an ulp or two otherwise). The order depends on the row's own routing only, and the
kernel's GEMM gives a row the same bits whatever other rows it runs with (linear.py), so a row's output does not
depend on the rest of the batch (on CPUs with a tile unit, as for the dense layers: up to how many decode rows
share its expert, `Linear`'s `prompt_from`). The router runs on `Linear` too: its logits are batch-independent
(torch's F.linear is not), and within the kernel's last-bit difference from F.linear, so the same experts are
chosen as transformers chooses except where two experts' probabilities are that close.

In float32 on the kernels, everything after the router's projection is one C call instead (moe_experts.py,
csrc/moe.c: the same routing, grouping, expert jobs and slot-order sum, with torch.topk's choice among ties), so
that a decode step runs no torch op between its kernels and the step replay keeps it; this Python block is then
what that call is checked against (tests/engines/pytorch/layers/test_moe.py), and what bfloat16 models and
torch's projections run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engines.pytorch.expert_blocks import LayerExperts
from engines.pytorch.gated_activation import GatedActivation
from engines.pytorch.gguf_blocks import WeightBlocks
from engines.pytorch.layers.projections import Kernels
from engines.pytorch.layers.swiglu import ClampedSwiGLU
from engines.pytorch.linear import Linear
from engines.pytorch.moe_experts import FusedExperts


@dataclass(frozen=True)
class Routing:
    """How a family turns router probabilities into expert weights: `top_k` experts a row, `normalize` (divide the
    top-k probabilities by their sum), `model_dtype_weights` (cast the weights to the logits' dtype, as Qwen3-MoE
    does; Mixtral keeps them in float32)."""

    top_k: int
    normalize: bool
    model_dtype_weights: bool
    # gpt-oss: the top-k of the logits themselves, then a softmax over those k (in the logits' dtype)
    softmax_of_top: bool = False

    @classmethod
    def of(cls, config: Any) -> Routing:
        """The routing of a transformers config of a family with a sparse MoE block."""
        if config.model_type == "qwen3_moe":
            return cls(config.num_experts_per_tok, bool(config.norm_topk_prob), True)
        if config.model_type == "mixtral":
            return cls(config.num_experts_per_tok, True, False)
        if config.model_type == "gpt_oss":
            return cls(config.num_experts_per_tok, False, True, softmax_of_top=True)
        raise ValueError(f"no sparse MoE routing for model type '{config.model_type}' (qwen3_moe, mixtral, gpt_oss)")


class SparseMoE:
    """A sparse MoE block over the engine's projections (see the module's docstring): `block(x)` is transformers'
    block's output for the rows x [T, H]."""

    def __init__(
        self,
        router: Linear,
        experts: Sequence[tuple[GatedActivation | ClampedSwiGLU, Linear]],
        routing: Routing,
        fused: FusedExperts | None = None,
    ) -> None:
        """`fused`: the same block after the router in one C call (moe_experts.py), which float32 steps then take."""
        if not 0 < routing.top_k <= len(experts):
            raise ValueError(f"{routing.top_k} experts a token of {len(experts)}: the config is inconsistent")
        self.router, self.experts, self.routing, self.fused = router, list(experts), routing, fused

    @classmethod
    def build(
        cls,
        block: Any,
        config: Any,
        kernels: Kernels,
        experts_blocks: LayerExperts | None = None,
        router_blocks: WeightBlocks | None = None,
    ) -> SparseMoE:
        """Take over transformers' block (`mlp` of a Qwen3-MoE or Mixtral decoder layer): the router's weight, and
        each expert's halves of `experts.gate_up_proj` [E, 2 I, H] and its `experts.down_proj` [E, H, I] -- or,
        with `experts_blocks`, the experts' GGUF blocks instead (those tensors may then be on the meta device),
        and with `router_blocks` the router's."""
        experts = block.experts
        fast, cache_dir, helpers, dense = kernels.fast, kernels.cache_dir, kernels.helpers, kernels.dense
        router_weight = None if block.gate.weight.is_meta else block.gate.weight.detach()
        router = kernels.linear(router_weight, None, router_blocks)
        made = []
        if experts_blocks is not None:
            gate, up, down = experts_blocks
            if not gate.num_experts == up.num_experts == down.num_experts:
                raise ValueError("the gate, up and down expert tensors hold different numbers of experts")
            for e in range(gate.num_experts):
                made.append(
                    (
                        GatedActivation(
                            None, None, experts.act_fn, fast, cache_dir, helpers, dense, (gate.expert(e), up.expert(e))
                        ),
                        kernels.linear(None, None, down.expert(e)),
                    )
                )
        else:
            gate_up, down = experts.gate_up_proj.detach(), experts.down_proj.detach()
            width = gate_up.shape[1] // 2
            for e in range(gate_up.shape[0]):
                made.append(
                    (
                        GatedActivation(
                            gate_up[e, :width], gate_up[e, width:], experts.act_fn, fast, cache_dir, helpers, dense
                        ),
                        kernels.linear(down[e]),
                    )
                )
        return cls.over(router, made, Routing.of(config), int(config.hidden_size), kernels)

    @classmethod
    def over(
        cls,
        router: Linear,
        experts: Sequence[tuple[GatedActivation | ClampedSwiGLU, Linear]],
        routing: Routing,
        hidden: int,
        kernels: Kernels,
    ) -> SparseMoE:
        """The block over these projections, with its fused C call where they are all on the float32 kernels."""
        fused = None
        if kernels.fast:
            fused = FusedExperts.build(
                router, experts, routing.top_k, routing.normalize, hidden, kernels.cache_dir, routing.softmax_of_top
            )
        return cls(router, experts, routing, fused)

    def projections(self) -> list[Linear | GatedActivation | ClampedSwiGLU]:
        """Every projection of the block (the router's and the experts'), for what the runner asks of them all
        (layers/mlp.py's `MLP`: the step replay's recorder, `on_tile_unit`)."""
        return [self.router, *(p for pair in self.experts for p in pair)]

    def route(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Each row's top-k expert weights and experts ([T, k] each, highest probability first), as transformers'
        router computes them from the router's logits (in float32 with `fused`: as its C call routes)."""
        logits = self.router(x)
        if self.fused is not None and logits.dtype == torch.float32:
            return self.fused.route(logits)
        if self.routing.softmax_of_top:
            top, chosen = torch.topk(logits, self.routing.top_k, dim=-1)
            return torch.softmax(top, dim=-1, dtype=top.dtype), chosen
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.routing.top_k, dim=-1)
        if self.routing.normalize:
            weights /= weights.sum(dim=-1, keepdim=True)
        if self.routing.model_dtype_weights:
            weights = weights.to(logits.dtype)
        return weights, chosen

    def __call__(
        self, x: torch.Tensor, residual: torch.Tensor | None = None, prompt_from: int | None = None
    ) -> torch.Tensor:
        """The block's output for rows x [T, H] (+ `residual`, added after, as the decoder layer adds it);
        `prompt_from`: where the step's prompt rows start (they follow its decode rows), as for `Linear`."""
        if self.fused is not None and x.dtype == torch.float32:
            return self.fused(x, self.router(x), residual, prompt_from)
        t, k = x.shape[0], self.routing.top_k
        weights, chosen = self.route(x)
        pairs = chosen.reshape(-1)  # the (row, slot) pairs, row by row
        order = torch.argsort(pairs, stable=True)  # grouped by expert, rows ascending within an expert
        counts = torch.bincount(pairs, minlength=len(self.experts)).tolist()
        out_dtype = torch.promote_types(x.dtype, weights.dtype)
        products = x.new_empty(t * k, x.shape[1], dtype=out_dtype)  # [row * k + slot]: weight * expert's output
        flat_weights = weights.reshape(-1)
        start = 0
        for e, n in enumerate(counts):
            if not n:
                continue
            mine = order[start : start + n]
            start += n
            rows = mine // k
            decode = None if prompt_from is None else int(torch.searchsorted(rows, prompt_from))
            gate_up_act, down = self.experts[e]
            y = down(gate_up_act(x if t == 1 else x.index_select(0, rows), prompt_from=decode), prompt_from=decode)
            products[mine] = y * flat_weights[mine, None]
        products = products.view(t, k, -1)
        total = products[:, 0].to(torch.float32, copy=True)
        for slot in range(1, k):
            total += products[:, slot]
        total = total.to(x.dtype)
        return total if residual is None else residual + total
