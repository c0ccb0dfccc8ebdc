"""Which share of the CPU budget (engines/cpu_budget.py) a model gets when it loads, among the repository's models
that compute with torch in this process: LLMs on the native engine (`backend: pytorch`, share
`pytorch.gemm_threads`: its kernel threads) and tensor models on the `transformers` or `pytorch` backends (share
`cpu_threads`: torch threads for their batches, engines/torch_threads.py).

A share set in a model's config is taken as it is; a model without one gets the whole budget, as a model alone
would (the native engine's default). Shares only hold when they add up to at most the budget: then each model's
threads have their own cores while the others are busy. When they add up to more (two models on their defaults,
say), the models' threads contend for the CPUs and none is sure of its share: logged at load with the figures, so
that the operator can split the budget in the configs. Models that compute elsewhere (vLLM, remote upstreams) or
with their own thread settings (ONNX Runtime's `intra_op_thread_count`) take no share.
"""

from __future__ import annotations

import logging

from engines.cpu_budget import cpu_budget
from gateway.errors import ConfigError
from gateway.repository.layout import ModelDir
from gateway.repository.model_config import AnyModelConfig, ModelConfig, parse_model_config
from gateway.repository.tensor_config import TensorModelConfig

log = logging.getLogger("switchyard.repository")

TORCH_BACKENDS = ("transformers", "pytorch")


def computes_here(config: AnyModelConfig) -> bool:
    """Whether the model computes on this process's CPUs with threads Switchyard sizes."""
    if isinstance(config, ModelConfig):
        return config.backend == "pytorch"
    try:
        return config.resolved_backend in TORCH_BACKENDS
    except ValueError:
        return False


def configured_share(config: AnyModelConfig) -> int | None:
    if isinstance(config, ModelConfig):
        return config.pytorch.gemm_threads
    assert isinstance(config, TensorModelConfig)
    return config.cpu_threads


def shares(budget: int, wants: dict[str, int | None]) -> dict[str, int]:
    """Model -> threads: its configured share, else the whole budget."""
    return {name: want if want is not None else budget for name, want in wants.items()}


def cpu_share(models: list[ModelDir], folder: str, config: AnyModelConfig) -> int | None:
    """The threads `folder` (loading with `config`) gets; None for a model that takes no share. Logs how the
    repository's shares meet the budget (blocking: parses the other models' configs)."""
    if not computes_here(config):
        return None
    wants: dict[str, int | None] = {folder: configured_share(config)}
    for model in sorted(models, key=lambda m: m.name):
        if model.name == folder:
            continue
        try:
            other = parse_model_config(model.config_path, model.name)
        except ConfigError:
            continue
        if computes_here(other):
            wants[model.name] = configured_share(other)
    budget = cpu_budget().threads
    given = shares(budget, wants)
    total = sum(given.values())
    listing = ", ".join(f"{name} {n}" for name, n in given.items())
    if total > budget:
        log.info(
            "model '%s': %d of the %d threads of the CPU budget; the repository's models that compute here ask "
            "for %d together (%s), so while they are busy together none is sure of its share: set cpu_threads / "
            "pytorch.gemm_threads so that they add up to %d (docs/cpu.md#threads-per-model)",
            folder,
            given[folder],
            budget,
            total,
            listing,
            budget,
        )
    else:
        log.info("model '%s': %d of the %d threads of the CPU budget (%s)", folder, given[folder], budget, listing)
    return given[folder]
