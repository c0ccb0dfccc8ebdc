"""The sparse MoE block against transformers' Qwen3-MoE and Mixtral blocks: routing (ties included), the experts'
outputs and their combination, batch invariance, GGUF expert blocks, and which experts a step reads."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from engines.pytorch import gemm_library, kernel_modes, native
from engines.pytorch.dense_ops import DenseOps
from engines.pytorch.expert_blocks import ExpertBlocks, LayerExperts
from engines.pytorch.layers.moe import Routing, SparseMoE
from engines.pytorch.layers.projections import Kernels

HIDDEN = 64
ROWS = (1, 3, 17)  # a decode step, a few decode rows, a prefill-sized step


@pytest.fixture(scope="module")
def tmp_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One kernel cache for the module: each build (this CPU's, AVX2) is compiled once."""
    return tmp_path_factory.mktemp("kernels")


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def _config(family: str, norm_topk_prob: bool = True):
    from transformers import MixtralConfig, Qwen3MoeConfig

    if family == "qwen3_moe":  # k = 4 of 8: the combination's order matters (not for k = 2)
        return Qwen3MoeConfig(
            hidden_size=HIDDEN,
            moe_intermediate_size=32,
            num_experts=8,
            num_experts_per_tok=4,
            norm_topk_prob=norm_topk_prob,
        )
    return MixtralConfig(hidden_size=HIDDEN, intermediate_size=96, num_local_experts=6, num_experts_per_tok=2)


def _reference(config, implementation: str = "grouped_mm", dtype: torch.dtype = torch.float32, seed: int = 0):
    """transformers' block with random weights; "grouped_mm" is the experts implementation from_pretrained picks."""
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeSparseMoeBlock

    config._experts_implementation = implementation
    block = (Qwen3MoeSparseMoeBlock if config.model_type == "qwen3_moe" else MixtralSparseMoeBlock)(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in block.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.1)
    return block.to(dtype).eval()


def _ours(reference, config, fast: bool, tmp_path: Path, dtype: torch.dtype = torch.float32, **kw) -> SparseMoE:
    return SparseMoE.build(reference, config, Kernels(fast, tmp_path, None, DenseOps(fast, dtype, tmp_path)), **kw)


def _theirs(reference, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """transformers' output and chosen experts for rows x [T, H]."""
    with torch.no_grad():
        _, _, chosen = reference.gate(x)
        return reference(x[None])[0], chosen


def _kernel_or_skip(block: SparseMoE) -> None:
    if block.router.kind != "kernel":
        pytest.skip("no C compiler or no AVX2/FMA here: the engine uses torch's projections")


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
@pytest.mark.parametrize("rows", ROWS)
def test_kernels_match_transformers(family: str, rows: int, tmp_path: Path) -> None:
    """float32 on the GEMM kernel: the experts transformers chooses, outputs within 1e-5 (the kernel sums each dot
    product in another order than torch's GEMM: last bits)."""
    config = _config(family)
    reference = _reference(config)
    block = _ours(reference, config, True, tmp_path)
    _kernel_or_skip(block)
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    expected, chosen = _theirs(reference, x)
    assert torch.equal(block.route(x)[1], chosen)
    torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize(("family", "norm"), [("qwen3_moe", True), ("qwen3_moe", False), ("mixtral", True)])
@pytest.mark.parametrize("rows", ROWS)
def test_torch_projections_give_transformers_bits(family: str, norm: bool, rows: int, tmp_path: Path) -> None:
    """Without the kernels the projections are F.linear, which transformers' grouped_mm computes per expert over the
    same rows in the same order: then routing, weighting and the slot-order sum give transformers' bits exactly.
    transformers' eager implementation adds the experts in expert order: the same bits for k = 2 only."""
    config = _config(family, norm)
    reference = _reference(config)
    block = _ours(reference, config, False, tmp_path)
    assert block.router.kind == "torch"
    x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
    expected, _ = _theirs(reference, x)
    assert torch.equal(block(x), expected)
    if config.num_experts_per_tok == 2:
        assert torch.equal(block(x), _theirs(_reference(_config(family, norm), "eager"), x)[0])


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_bfloat16_torch_projections_give_transformers_bits(family: str, tmp_path: Path) -> None:
    """bfloat16: Qwen3-MoE's weights cast to bfloat16 before the product, Mixtral's kept in float32, the k products
    summed in float32 and rounded once -- as transformers' grouped_mm implementation."""
    config = _config(family)
    reference = _reference(config, dtype=torch.bfloat16)
    block = _ours(reference, config, False, tmp_path, torch.bfloat16)
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)).bfloat16()
        out = block(x)
        assert out.dtype == torch.bfloat16
        assert torch.equal(out, _theirs(reference, x)[0])
    assert block.route(x)[0].dtype == (torch.bfloat16 if family == "qwen3_moe" else torch.float32)


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_bfloat16_kernels_match_transformers(family: str, tmp_path: Path) -> None:
    config = _config(family)
    reference = _reference(config, dtype=torch.bfloat16)
    block = _ours(reference, config, True, tmp_path, torch.bfloat16)
    _kernel_or_skip(block)
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows)).bfloat16()
        expected, chosen = _theirs(reference, x)
        assert torch.equal(block.route(x)[1], chosen)
        torch.testing.assert_close(block(x), expected, atol=2e-2, rtol=2e-2)  # one bfloat16 rounding apart at most


# the AVX2 build compiles the C libraries again for another target: slow lane (docs/testing.md)
AVX2 = pytest.param("avx2", marks=pytest.mark.slow)


@pytest.fixture
def build(request, monkeypatch: pytest.MonkeyPatch):
    """Force a kernel path as the linear tests do: the library rebuilt without AVX-512, or the tile unit off."""
    if request.param == "avx2":
        monkeypatch.setattr(native, "CFLAGS", [*native.CFLAGS, "-mno-avx512f"])
        monkeypatch.delitem(native._loaded, "gemm", raising=False)
        monkeypatch.delitem(native._loaded, "moe", raising=False)
        monkeypatch.setattr(gemm_library, "_lib", None)
    elif request.param == "no-tile-unit":
        monkeypatch.setattr(kernel_modes, "TILE_UNIT", False)
    return request.param  # monkeypatch puts this CPU's build back


@pytest.mark.parametrize("build", ["native", AVX2, "no-tile-unit"], indirect=True)
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_a_rows_output_does_not_depend_on_the_batch(family: str, build: str, tmp_path: Path) -> None:
    """Each row of a 17-row step (decode rows then prompt rows) alone, as a decode row, gives the bits it got in
    the step; and the forced builds match transformers as the native one does."""
    config = _config(family)
    reference = _reference(config)
    block = _ours(reference, config, True, tmp_path)
    _kernel_or_skip(block)
    x = torch.randn(17, HIDDEN, generator=torch.Generator().manual_seed(3))
    whole = block(x, prompt_from=5)
    for i in range(17):
        assert torch.equal(block(x[i : i + 1], prompt_from=1), whole[i : i + 1]), f"row {i}"
    assert torch.equal(block(x[4:9]), whole[4:9])
    expected, chosen = _theirs(reference, x)
    assert torch.equal(block.route(x)[1], chosen)
    torch.testing.assert_close(whole, expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("fast", [True, False], ids=["kernels", "torch"])
@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_router_ties_are_broken_as_transformers_breaks_them(family: str, fast: bool, tmp_path: Path) -> None:
    """Ties go to torch.topk, as in transformers. A zero router ties every expert in both (probabilities exactly
    1 / E): the same choices. Experts with equal router rows: torch's projections give transformers' logits, so its
    choices; the kernel gives tied experts the same logit bit for bit (one FMA chain over the same values), while
    torch's GEMM (transformers) does not always (its last bits depend on the column's place in the GEMM), so where
    transformers' near-tie falls on another expert of the tied group, ours is one of that group (and its expert
    weights differ: outputs are not compared there)."""
    config = _config(family)
    reference = _reference(config)
    x = torch.randn(17, HIDDEN, generator=torch.Generator().manual_seed(11))
    with torch.no_grad():
        reference.gate.weight.zero_()
    block = _ours(reference, config, fast, tmp_path)
    expected, chosen = _theirs(reference, x)
    assert torch.equal(block.route(x)[1], chosen)
    torch.testing.assert_close(block(x), expected, atol=1e-5 if fast else 0, rtol=0)

    reference = _reference(config)
    group = torch.arange(reference.gate.weight.shape[0])  # experts 1, 3, 5 tie, and 0, 4
    with torch.no_grad():
        w = reference.gate.weight
        w[3], w[5], w[4] = w[1], w[1], w[0]
    group[3], group[5], group[4] = 1, 1, 0
    block = _ours(reference, config, fast, tmp_path)
    logits = block.router(x)
    if fast:
        assert torch.equal(logits[:, 3], logits[:, 1]) and torch.equal(logits[:, 5], logits[:, 1])
    expected, chosen = _theirs(reference, x)
    ours = block.route(x)[1]
    if not fast:
        assert torch.equal(ours, chosen)
        assert torch.equal(block(x), expected)
    assert torch.equal(group[ours].sort(dim=1).values, group[chosen].sort(dim=1).values)


class _Spy:
    """Counts the rows a projection is called with."""

    def __init__(self, inner, calls: list, name: tuple) -> None:
        self.inner, self.calls, self.name = inner, calls, name

    def __call__(self, x, *args, **kwargs):
        self.calls.append((self.name, x.shape[0]))
        return self.inner(x, *args, **kwargs)


def test_a_step_reads_only_the_experts_its_rows_chose_once_each(tmp_path: Path) -> None:
    """The Python block's grouping (the fused C call's: the next test)."""
    config = _config("qwen3_moe")
    block = _ours(_reference(config), config, True, tmp_path)
    block.fused = None
    calls: list = []
    block.experts = [
        (_Spy(g, calls, (e, "gate_up")), _Spy(d, calls, (e, "down"))) for e, (g, d) in enumerate(block.experts)
    ]
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows + 7))
        chosen = block.route(x)[1]
        calls.clear()
        block(x)
        used = sorted(set(chosen.flatten().tolist()))
        rows_of = {e: int((chosen == e).any(dim=1).sum()) for e in used}
        assert calls == [((e, part), rows_of[e]) for e in used for part in ("gate_up", "down")]
        if rows == 1:
            assert len(used) == config.num_experts_per_tok < config.num_experts


@pytest.mark.parametrize("family", ["qwen3_moe", "mixtral"])
def test_the_fused_call_reads_only_the_experts_its_rows_chose(family: str, tmp_path: Path) -> None:
    """The fused block (moe_experts.py) runs as the Python one (the same experts; outputs within the last bits of
    the softmax's exp), and touches no expert its rows did not choose: those experts' table entries are made
    invalid, which the kernel refuses when it reaches one."""
    from engines.pytorch.moe_experts import P_WORDS, T_HEADER

    config = _config(family)
    block = _ours(_reference(config), config, True, tmp_path)
    _kernel_or_skip(block)
    assert block.fused is not None
    table = block.fused.table
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows + 7))
        chosen = block.route(x)[1]
        fused = block(x)
        python = SparseMoE(block.router, block.experts, block.routing)
        assert torch.equal(python.route(x)[1], chosen)
        torch.testing.assert_close(fused, python(x), atol=1e-6, rtol=0)
        saved = table.clone()
        unused = [e for e in range(len(block.experts)) if e not in set(chosen.flatten().tolist())]
        for e in unused:
            table[T_HEADER + 2 * P_WORDS * e] = table[T_HEADER + 2 * P_WORDS * e + P_WORDS] = 99
        try:
            assert torch.equal(block(x), fused)
            if unused:
                x_all = x.clone()
                with pytest.raises(RuntimeError, match="refused"):
                    block.fused(x_all, _router_logits_choosing(block, x_all, unused[0]), None, None)
        finally:
            table.copy_(saved)
        if rows == 1:
            assert len(unused) == len(block.experts) - config.num_experts_per_tok


@pytest.mark.parametrize("build", ["native", AVX2], indirect=True)
def test_the_fused_routing_chooses_among_ties_as_torch_topk(build: str, tmp_path: Path) -> None:
    """csrc/moe.c's top-k against torch.topk on probabilities (or, gpt-oss's rule, logits) full of ties (logits
    from a few levels), on both of torch's algorithms (partial sort where k * 64 <= E, else nth_element and a sort):
    the same experts in the same order; the weights within the last bits of the softmax's exp. Each rule: softmax
    then top-k (Mixtral, Qwen3-MoE), with the k weights normalised, and top-k then a softmax of those k (gpt-oss)."""
    from engines.pytorch.moe_experts import R_SOFTMAX_TOP, R_SOFTMAX_TOP_NORMALIZE, R_TOP_SOFTMAX, library

    lib = library(tmp_path)
    if lib is None:
        pytest.skip("no C compiler here")
    gen = torch.Generator().manual_seed(5)
    for experts, k in [(4, 2), (6, 2), (8, 4), (60, 6), (64, 1), (128, 8), (128, 2), (256, 8), (200, 17)]:
        for rule in (R_SOFTMAX_TOP, R_SOFTMAX_TOP_NORMALIZE, R_TOP_SOFTMAX):
            logits = torch.randint(0, 3, (64, experts), generator=gen).float() * 0.5
            if rule == R_TOP_SOFTMAX:  # transformers' GptOssTopKRouter; half the rows without ties (other weights)
                logits += torch.randn(logits.shape, generator=gen) * (torch.rand(64, 1, generator=gen) < 0.5)
                top, chosen = torch.topk(logits, k, dim=-1)
                weights = torch.softmax(top, dim=-1, dtype=top.dtype)
            else:
                weights, chosen = torch.topk(torch.softmax(logits, dim=-1, dtype=torch.float32), k, dim=-1)
                if rule == R_SOFTMAX_TOP_NORMALIZE:
                    weights /= weights.sum(dim=-1, keepdim=True)
            ours = torch.empty(64, k, dtype=torch.int32)
            our_weights = torch.empty(64, k)
            assert (
                lib.moe_route_f32(
                    logits.data_ptr(), experts, 64, experts, k, rule, ours.data_ptr(), our_weights.data_ptr()
                )
                == 0
            )
            assert torch.equal(ours.long(), chosen), (experts, k, rule)
            torch.testing.assert_close(our_weights, weights, rtol=4e-6, atol=0)
    assert lib.moe_route_f32(logits.data_ptr(), 4, 1, 4, 2, 3, ours.data_ptr(), our_weights.data_ptr()) == -2


def _router_logits_choosing(block: SparseMoE, x: torch.Tensor, expert: int) -> torch.Tensor:
    """The router's logits for x with `expert` made every row's first choice."""
    logits = block.router(x).clone()
    logits[:, expert] = logits.max() + 10
    return logits


def _quantized_experts(e: int, n: int, k: int, qtype: str, seed: int) -> ExpertBlocks:
    """An [e, n, k] expert tensor as gguf-py quantizes it, the experts stacked as llama.cpp's converter stacks them."""
    from gguf import GGMLQuantizationType
    from gguf.quants import quantize

    weight = (np.random.default_rng(seed).standard_normal((e * n, k)) * 0.1).astype(np.float32)
    raw = np.ascontiguousarray(quantize(weight, GGMLQuantizationType[qtype])).view(np.uint8)
    return ExpertBlocks(qtype, torch.from_numpy(raw.reshape(e, n, -1).copy()))


def _layer_experts(reference, qtype: str) -> LayerExperts:
    """Random experts of transformers' block's shapes as GGUF blocks of `qtype`."""
    e, two_i, h = reference.experts.gate_up_proj.shape
    i = two_i // 2
    return LayerExperts(
        _quantized_experts(e, i, h, qtype, 1),
        _quantized_experts(e, i, h, qtype, 2),
        _quantized_experts(e, h, i, qtype, 3),
    )


@pytest.mark.parametrize(("family", "qtype"), [("qwen3_moe", "Q8_0"), ("mixtral", "Q4_0"), ("qwen3_moe", "MXFP4")])
def test_experts_from_gguf_blocks_match_transformers_on_their_weights(family: str, qtype: str, tmp_path: Path) -> None:
    """Experts read from a 3-D GGUF tensor's blocks, per expert in place, against transformers' block holding the
    dequantized weights (what its GGUF loader makes of them: gate and up as the halves of gate_up_proj)."""
    config = _config(family)
    reference = _reference(config)
    experts = _layer_experts(reference, qtype)
    with torch.no_grad():  # the block is built while transformers' experts are zeros: it reads the blocks only
        reference.experts.gate_up_proj.zero_()
        reference.experts.down_proj.zero_()
    block = _ours(reference, config, True, tmp_path, experts_blocks=experts)
    assert experts.gate.expert(2).raw.data_ptr() == experts.gate.raw[2].data_ptr()  # a view, not a copy
    with torch.no_grad():
        reference.experts.gate_up_proj.copy_(torch.cat((experts.gate.dequantize(), experts.up.dequantize()), dim=1))
        reference.experts.down_proj.copy_(experts.down.dequantize())
    if block.router.kind == "kernel":
        assert all(p.blocks_nbytes for p in block.projections()[1:])  # the kernel reads the blocks, no float32 copy
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows))
        expected, chosen = _theirs(reference, x)
        assert torch.equal(block.route(x)[1], chosen)
        torch.testing.assert_close(block(x), expected, atol=1e-5, rtol=0)


@pytest.mark.parametrize("build", ["native", AVX2], indirect=True)
@pytest.mark.parametrize(("family", "qtype"), [("qwen3_moe", "Q8_0"), ("mixtral", "Q4_0"), ("qwen3_moe", "MXFP4")])
def test_experts_grouped_in_one_job_give_the_bits_of_one_job_each(
    family: str, qtype: str, build: str, tmp_path: Path
) -> None:
    """On GGUF blocks the chosen experts' projections run as two grouped jobs (gemm.c's gemm_grouped_par) rather
    than two an expert; each row gets the bits the per-expert jobs give it (the table's grouped entry cleared),
    with float32 and with int8 activations, decode rows and prompt rows."""
    from engines.pytorch.moe_experts import T_GROUPED

    config = _config(family)
    reference = _reference(config)
    experts = _layer_experts(reference, qtype)
    block = _ours(reference, config, True, tmp_path, experts_blocks=experts)
    _kernel_or_skip(block)
    assert block.fused is not None and block.fused.table[T_GROUPED] != 0
    table = block.fused.table
    for rows in (*ROWS, 40):
        x = torch.randn(rows, HIDDEN, generator=torch.Generator().manual_seed(rows + 11))
        for int8 in (False, True):
            with kernel_modes.int8_activations(int8):
                grouped = block(x, prompt_from=rows // 2)
                saved = int(table[T_GROUPED])
                table[T_GROUPED] = 0
                try:
                    alone = block(x, prompt_from=rows // 2)
                finally:
                    table[T_GROUPED] = saved
            assert torch.equal(grouped, alone), (rows, int8)


def test_residual_is_added_after_the_block(tmp_path: Path) -> None:
    config = _config("mixtral")
    block = _ours(_reference(config), config, True, tmp_path)
    x, residual = torch.randn(3, HIDDEN), torch.randn(3, HIDDEN)
    assert torch.equal(block(x, residual), residual + block(x))


def test_routing_of_each_family() -> None:
    assert Routing.of(_config("qwen3_moe", False)) == Routing(4, False, True)
    assert Routing.of(_config("mixtral")) == Routing(2, True, False)
    from transformers import LlamaConfig

    with pytest.raises(ValueError, match="qwen3_moe, mixtral"):
        Routing.of(LlamaConfig())
