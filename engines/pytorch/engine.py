"""The native PyTorch `StepEngine`: loader + paged model runner + sampler."""

from __future__ import annotations

import gc
import json
import logging
import random
from collections.abc import Sequence
from pathlib import Path

import torch

from engines.cpu_budget import cpu_budget
from engines.hf_tokenizer import HFTokenizer
from engines.interface import ModelFileError, StepEngine, Tokenizer
from engines.pytorch import host_memory
from engines.pytorch.argmax import Argmax
from engines.pytorch.kernel_modes import decode_rows_on_registers, int8_activations, int8_available
from engines.pytorch.loader import default_cache_dir, load_gguf_blocks, load_hf, resolve_hf_folder
from engines.pytorch.lora import projection_shapes
from engines.pytorch.lora_weights import read_adapter
from engines.pytorch.memory_check import check_fits, weight_bytes
from engines.pytorch.model_runner import PagedModelRunner
from engines.pytorch.models import check_supported
from engines.pytorch.panel_cache import saved_panels
from engines.pytorch.sampler import greedy_result, plain_greedy, sample
from engines.pytorch.step_layout import row_order
from engines.pytorch.weight_memory import float_weights, runner_weights
from engines.torch_threads import TorchThreads
from engines.types import AdapterRef, EngineInfo, SequenceStep, StepResult

log = logging.getLogger("switchyard.engines.pytorch")


def _set_torch_threads(kernel_threads: int, budget_threads: int) -> int:
    """torch's intra-op threads: one where our kernels run the step on the budget's threads (torch's ops between
    them are small, and its OpenMP workers would spin on the cores our helpers need right after each op), else the
    budget (torch's ops are the step). Set here for the loading thread and as the default of fresh threads, and again
    on the step thread before each step (engines/torch_threads.py: the count is per thread); returns the count set."""
    threads = 1 if kernel_threads else budget_threads
    torch.set_num_threads(threads)
    return threads


def _check_architecture(source: Path, gguf: Path) -> None:
    """Refuse a model of a family the engine does not serve from its HF folder's config.json, before any weight
    loads (UnsupportedModelError; a GGUF file's family is checked once transformers has read its config)."""
    config = source / "config.json"
    if gguf.suffix == ".gguf" or not config.is_file():
        return
    try:
        fields = json.loads(config.read_text())
    except (OSError, ValueError):
        return  # transformers says what is wrong with it
    check_supported(fields.get("model_type"), fields.get("architectures"))


class PyTorchEngine(StepEngine):
    def __init__(
        self,
        source: Path,
        *,
        gguf_file: str | None = None,
        dtype: str = "float32",
        max_model_len: int | None = None,
        block_size: int = 16,
        kv_cache_tokens: int = 16384,
        kv_cache_dtype: str = "auto",
        cache_dir: Path | None = None,
        fast_kernels: bool = True,
        gemm_threads: int | None = None,
        match_transformers: bool = False,
        int8_activations: bool = False,
    ) -> None:
        """`fast_kernels`: our C kernels for projections, attention and norms (see model_runner.py);
        false runs torch ops only. `gemm_threads`: threads sharing each step's projections, attention and
        norms (default: the process's CPU budget, engines/cpu_budget.py). `match_transformers` (bfloat16): answer as
        transformers' generate does, bit for bit (exact_forward.py; needs whole prompts and no prefix caching).
        `kv_cache_dtype`: "auto" (the model's dtype) or "bfloat16" (under float32: half the cache's bytes, float32
        arithmetic). `int8_activations`: projections on a GGUF file's blocks take 8-bit activations
        (kernel_modes.int8_activations), where this CPU's kernels have them."""
        budget = cpu_budget().with_override(gemm_threads, "pytorch.gemm_threads")
        host_memory.return_freed_memory()  # while loading (keep_freed_memory once loaded: host_memory.py)
        num_blocks = max(1, kv_cache_tokens // block_size)
        kernel_cache_dir = cache_dir or default_cache_dir()
        gguf = source / gguf_file if gguf_file else source
        _check_architecture(source, gguf)
        as_blocks = fast_kernels and dtype == "float32" and gguf.is_file() and gguf.suffix == ".gguf"
        needed = weight_bytes(source, gguf, dtype, as_blocks)
        if needed is not None:  # refused here, with the figures, rather than by the OOM killer halfway through
            check_fits(gguf.name, needed)
        loaded = None
        if as_blocks:
            # block weights straight from the file: no float32 model of it is ever built (loader.py)
            loaded = load_gguf_blocks(gguf, cache_dir)
        if loaded is not None:
            model, hf_tok, weights = loaded
            blocks = weights.blocks
        else:
            model, hf_tok = load_hf(resolve_hf_folder(source, gguf_file, cache_dir), dtype)
            blocks = weights = None
        # a start after the first reads the packed weights the first one saved (panel_cache.py)
        with saved_panels(weights.panels if weights is not None else None):
            self._runner = PagedModelRunner(
                model,
                num_blocks,
                block_size,
                fast_kernels=fast_kernels,
                kernel_cache_dir=kernel_cache_dir,
                gemm_threads=budget.threads,
                blocks=blocks,
                match_transformers=match_transformers,
                packed=weights.drop_pages if weights is not None else None,
                kv_cache_dtype=None if kv_cache_dtype == "auto" else getattr(torch, kv_cache_dtype),
            )
        torch_threads = _set_torch_threads(self._runner.kernel_threads, budget.threads)
        self.cpu_threads = budget.threads  # its share of the CPU (switchyard_model_cpu_threads)
        self.torch_threads = TorchThreads(torch_threads)  # set again on the step thread (torch_threads.py)
        log.info(
            "native engine: CPU budget %d thread%s (%s): our kernels on %d, torch ops on %d",
            budget.threads,
            "s" if budget.threads > 1 else "",
            budget.reason,
            self._runner.kernel_threads,
            torch_threads,
        )
        self._argmax = Argmax(kernel_cache_dir).rows if fast_kernels else None
        self._int8 = int8_activations and blocks is not None and int8_available(kernel_cache_dir)
        if int8_activations and not self._int8:
            log.warning(
                "native engine: pytorch.int8_activations is on but %s: projections stay float32",
                "the model's weights are not a GGUF file's blocks"
                if blocks is None
                else "this CPU's kernels have no int8 path (it needs AVX-512 with VBMI and GFNI)",
            )
        self._tokenizer = HFTokenizer(hf_tok)
        config, generation_config = model.config, model.generation_config
        del model, blocks, loaded, weights  # the runner holds the weights it serves (packed, or as GGUF blocks)
        gc.collect()
        host_memory.release_freed()
        host_memory.keep_freed_memory()
        held = runner_weights(self._runner)
        log.info(
            "native engine: weights held: %.1f MB, %.1f MB of them in float tensors",
            sum(h.nbytes for h in held.values()) / 1e6,
            sum(h.nbytes for h in float_weights(held)) / 1e6,
        )
        eos = generation_config.eos_token_id if generation_config else None
        eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
        if hf_tok.eos_token_id is not None and hf_tok.eos_token_id not in eos_ids:
            eos_ids.append(hf_tok.eos_token_id)
        native_len = getattr(config, "max_position_embeddings", None) or 2048
        self._info = EngineInfo(
            model_type=config.model_type,
            dtype=dtype,
            max_model_len=min(max_model_len or native_len, native_len, num_blocks * block_size),
            vocab_size=config.vocab_size,
            eos_token_ids=eos_ids,
            block_size=block_size,
            num_kv_blocks=num_blocks,
            kv_bytes_per_token=self._runner.kv_bytes_per_token,
            # our GEMM and decode-attention kernels compute each row alone (match_transformers: each new token
            # alone); torch's GEMM and SDPA sum in an order that depends on the rows of the call
            exact_verification=match_transformers
            or (self._runner.kernel_threads > 0 and self._runner.attention.uses_kernel),
            max_exact_decode_rows=self._runner.tile_unit_decode_rows,
            weight_bytes=sum(h.nbytes for h in held.values()),
            # the prefill kernel (and the torch paths) write every prefill row's keys and values before any prefill
            # row attends; match_transformers attends each prompt alone (and refuses prefix caching)
            prefill_reads_step_writes=not match_transformers,
        )
        self._generators: dict[str, torch.Generator] = {}
        self._config = config.to_dict()  # what an adapter is read against (lora_weights.py)

    @property
    def info(self) -> EngineInfo:
        return self._info

    @property
    def tokenizer(self) -> Tokenizer:
        return self._tokenizer

    def _generator(self, step: SequenceStep) -> torch.Generator:
        gen = self._generators.get(step.seq_id)
        if gen is None:
            seed = step.sampling.seed if step.sampling.seed is not None else random.getrandbits(63)
            gen = self._generators[step.seq_id] = torch.Generator().manual_seed(seed)
        return gen

    def execute(self, batch: Sequence[SequenceStep]) -> StepResult:
        self.torch_threads.enter()  # this step thread's own count, whatever another model set as the default
        sampling_steps = [s for s in row_order(batch) if s.sample]  # the order of the runner's logits
        # A request with a seed reproduces whatever its batch: its step keeps decode rows off the tile unit, whose
        # bits differ from the register kernels' (only steps of more than 16 decode rows would use it; kernel_modes.py).
        with decode_rows_on_registers(any(s.sampling.seed is not None for s in batch)), int8_activations(self._int8):
            if self._argmax is not None and sampling_steps and all(plain_greedy(s) for s in sampling_steps):
                # the runner may take each row's greedy token on the way (a replayed step: step_replay.py)
                logits, tokens = self._runner.forward_greedy(batch)
                if tokens is not None:
                    return greedy_result(sampling_steps, tokens)
            else:
                logits = self._runner.forward(batch)
        for step in sampling_steps:
            if not step.sampling.greedy:
                self._generator(step)
        with torch.inference_mode():  # logits are inference tensors: penalties, bias and masks edit them in place
            return sample(logits, sampling_steps, self._info.eos_token_ids, self._generators, self._argmax)

    def load_adapter(self, adapter: AdapterRef) -> None:
        """Read a LoRA adapter (a PEFT folder or a GGUF LoRA file) and serve its rows from the next step on."""
        runner = self._runner
        weights = read_adapter(Path(adapter.path), projection_shapes(runner.model), runner.dtype, self._config)
        rotary = self._config.get("partial_rotary_factor") or 1.0
        if rotary < 1.0 and any(m in layer for layer in weights.layers for m in ("q_proj", "k_proj", "qkv_proj")):
            raise ModelFileError(
                f"{Path(adapter.path).name}: updates of q and k are not applied to a model with "
                "partial rotary embeddings (their dimensions are reordered at load); train the "
                "adapter without q_proj, k_proj and qkv_proj"
            )
        runner.add_adapter(adapter.id, weights)
        log.info(
            "native engine: LoRA adapter '%s' (id %d) from %s: rank %d, %.1f MB",
            adapter.name,
            adapter.id,
            Path(adapter.path).name,
            weights.rank,
            weights.nbytes / 1e6,
        )

    def unload_adapter(self, adapter: AdapterRef) -> None:
        self._runner.remove_adapter(adapter.id)

    def release(self, seq_id: str) -> None:
        self._generators.pop(seq_id, None)
