"""Decode steps replayed in one C call (engines/pytorch/step_replay.py) give the Python forward's bits, take greedy
tokens on the way, and leave steps they cannot repeat to Python."""

from __future__ import annotations

import logging
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from transformers import (
    Gemma2Config,
    Gemma2ForCausalLM,
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    GptOssConfig,
    GptOssForCausalLM,
    GraniteConfig,
    GraniteForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Olmo2Config,
    Olmo2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

from engines.pytorch import kernel_modes, step_replay
from engines.pytorch.model_runner import PagedModelRunner
from engines.types import SamplingParams, SequenceStep
from tests.family_models import GPT_OSS_YARN

PARAMS = SamplingParams(temperature=0.0, max_tokens=32)
SHAPE = dict(
    vocab_size=96,
    hidden_size=64,
    intermediate_size=160,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=256,
)


def _llama() -> LlamaForCausalLM:
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**SHAPE)).float().eval()


def _runner(tmp_path: Path, replay: bool, model=None) -> PagedModelRunner:
    saved = step_replay.ENABLED
    step_replay.ENABLED = replay
    try:
        return PagedModelRunner(
            model or _llama(), num_blocks=16, block_size=16, kernel_cache_dir=tmp_path, gemm_threads=2
        )
    finally:
        step_replay.ENABLED = saved


def _decode(runner: PagedModelRunner, batch: int, steps: int) -> tuple[list[torch.Tensor], list[list[int]]]:
    """Prefill `batch` prompts, then `steps` greedy decode steps: every step's logits and each sequence's tokens."""
    prompts = [[(5 * b + i) % 90 + 1 for i in range(9 + 4 * b)] for b in range(batch)]
    tables = [[3 * b, 3 * b + 1, 3 * b + 2] for b in range(batch)]
    runner.forward([SequenceStep(f"s{b}", p, 0, tables[b], True, PARAMS, p, len(p), 0) for b, p in enumerate(prompts)])
    tokens = [list(p) + [1 + b] for b, p in enumerate(prompts)]
    all_logits = []
    for _ in range(steps):
        step = [
            SequenceStep(
                f"s{b}", [t[-1]], len(t) - 1, tables[b], True, PARAMS, t, len(prompts[b]), len(t) - len(prompts[b])
            )
            for b, t in enumerate(tokens)
        ]
        logits, greedy = runner.forward_greedy(step)
        all_logits.append(logits.clone())
        picks = logits.argmax(dim=-1).tolist()
        if greedy is not None:
            assert greedy == picks
        for t, pick in zip(tokens, picks, strict=True):
            t.append(pick)
    return all_logits, tokens


@pytest.mark.parametrize("batch", [1, 3])
def test_replayed_steps_give_the_python_forwards_bits(tmp_path: Path, batch: int) -> None:
    python, replayed = _runner(tmp_path, replay=False), _runner(tmp_path, replay=True)
    assert python._replay is None and replayed._replay is not None
    expected, expected_tokens = _decode(python, batch, 6)
    got, tokens = _decode(replayed, batch, 6)
    assert replayed._replay.plan_state(batch) == "replayed"  # recorded at the first step, checked at the second
    assert tokens == expected_tokens
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_greedy_tokens_come_with_the_replayed_step_only_when_every_logit_is_finite(tmp_path: Path) -> None:
    runner = _runner(tmp_path, replay=True)
    _decode(runner, 1, 3)
    step = [SequenceStep("s0", [4], 12, [0, 1, 2], True, PARAMS, [1] * 13, 9, 4)]
    logits, tokens = runner.forward_greedy(step)
    assert tokens == logits.argmax(dim=-1).tolist()
    runner.norm.weight.data[0] = float("nan")  # the final norm's first channel: NaN logits
    logits, tokens = runner.forward_greedy(step)
    assert tokens is None and not bool(torch.isfinite(logits).all())


def _pair(make) -> tuple[torch.nn.Module, torch.nn.Module]:
    """Two copies of one random-weight model (each runner takes its model's weights over)."""
    torch.manual_seed(0)
    model, reference = make().float().eval(), make().float().eval()
    reference.load_state_dict(model.state_dict())
    return model, reference


def _replays_with_python_bits(tmp_path: Path, model, reference, batch: int = 2, steps: int = 6) -> None:
    python, replayed = _runner(tmp_path, replay=False, model=reference), _runner(tmp_path, replay=True, model=model)
    expected, expected_tokens = _decode(python, batch, steps)
    got, tokens = _decode(replayed, batch, steps)
    assert replayed._replay.plan_state(batch) == "replayed"  # recorded at the first step, checked at the second
    assert tokens == expected_tokens
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_sliding_window_steps_replay(tmp_path: Path) -> None:
    """Mistral's sliding window runs on the decode kernel, so its steps replay with the Python forward's bits."""
    _replays_with_python_bits(tmp_path, *_pair(lambda: MistralForCausalLM(MistralConfig(**SHAPE, sliding_window=8))))


def test_per_head_qk_norms_replay(tmp_path: Path) -> None:
    """qwen3's per-head q/k norms run on the norm kernel (one call for every head of every row): its steps replay."""
    _replays_with_python_bits(tmp_path, *_pair(lambda: Qwen3ForCausalLM(Qwen3Config(**SHAPE, head_dim=16))))


def test_block_output_norms_replay(tmp_path: Path) -> None:
    """OLMo 2's norms of each block's output with the residual add after them are one kernel: its steps replay."""
    _replays_with_python_bits(tmp_path, *_pair(lambda: Olmo2ForCausalLM(Olmo2Config(**SHAPE))))


@pytest.mark.parametrize("batch", [1, 3])
def test_granite_steps_replay(tmp_path: Path, batch: int) -> None:
    """Granite: each block's output times the residual multiplier with the residual add after it is one kernel, the
    logits' division another, the attention multiplier the decode kernel's scale: no torch op between the kernels
    (the embedding multiplier is applied before the replayed part)."""
    config = lambda: GraniteConfig(  # noqa: E731
        **SHAPE, embedding_multiplier=12.0, residual_multiplier=0.22, attention_multiplier=0.0078125, logits_scaling=7.3
    )
    _replays_with_python_bits(tmp_path, *_pair(lambda: GraniteForCausalLM(config())), batch=batch)


GEMMA = dict(SHAPE, head_dim=16, sliding_window=8, hidden_activation="gelu_pytorch_tanh")


@pytest.mark.parametrize("batch", [1, 3])
def test_gemma2_steps_replay(tmp_path: Path, batch: int) -> None:
    """Gemma 2: sandwich norms (the output norm and the residual add in one kernel), GELU-tanh, windows and capped
    scores on the decode kernel, the final logit soft-cap on its kernel: no torch op between the kernels."""
    config = lambda: Gemma2Config(**GEMMA, final_logit_softcapping=3.0, attn_logit_softcapping=5.0)  # noqa: E731
    _replays_with_python_bits(tmp_path, *_pair(lambda: Gemma2ForCausalLM(config())), batch=batch)


@pytest.mark.parametrize("batch", [1, 3])
def test_gemma3_steps_replay(tmp_path: Path, batch: int) -> None:
    """Gemma 3: per-head q/k norms, and a rotary table per layer type (local and global RoPE), each attention call
    patched with its own table's cos and sin every step."""
    config = lambda: Gemma3TextConfig(**GEMMA, layer_types=["sliding_attention", "full_attention"])  # noqa: E731
    _replays_with_python_bits(tmp_path, *_pair(lambda: Gemma3ForCausalLM(config())), batch=batch)


@pytest.mark.parametrize("batch", [1, 3])
def test_gpt_oss_steps_replay(tmp_path: Path, batch: int) -> None:
    """gpt-oss: attention sinks, biased q/k/v/o and sliding layers on the kernels, and its MoE block after the router
    (top-k-then-softmax routing, biased experts, the clamped SwiGLU) one C call (moe_experts.py): no torch op
    between the kernels, so its decode steps replay with the Python forward's bits."""
    config = lambda: GptOssConfig(  # noqa: E731
        **SHAPE,
        head_dim=16,
        num_local_experts=4,
        num_experts_per_tok=2,
        sliding_window=8,
        rope_parameters=dict(GPT_OSS_YARN),
    )
    _replays_with_python_bits(tmp_path, *_pair(lambda: GptOssForCausalLM(config())), batch=batch)


def test_a_call_pointing_to_memory_of_one_call_leaves_the_steps_on_python(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A kernel argument into a buffer made for that call alone (freed after it) could not be replayed: recording
    notices, and the steps stay right, on Python."""
    runner, reference = _runner(tmp_path, replay=True), _runner(tmp_path, replay=False)
    inner = runner.dense.rms_norm
    weights = {
        id(m): m.weight.detach().numpy()
        for m in [runner.norm, *(n for layer in runner.layers for n in (layer.input_norm, layer.post_norm))]
    }

    def norm(module: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
        scratch = torch.from_numpy(weights[id(module)].copy())  # a new buffer every call, not torch's
        return inner(SimpleNamespace(weight=scratch, variance_epsilon=module.variance_epsilon), x)

    runner.dense.rms_norm = norm
    with caplog.at_level(logging.INFO, logger="switchyard.engines.pytorch"):
        got, _ = _decode(runner, 1, 3)
    assert runner._replay.plan_state(1) == "off"
    assert "points to memory of one call" in caplog.text
    expected, _ = _decode(reference, 1, 3)
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a, b)


def _verify(runner: PagedModelRunner, k: int, steps: int) -> tuple[list[torch.Tensor], list[list[int] | None]]:
    """Prefill a prompt, then `steps` verification steps of k proposed tokens (some right, some wrong): every step's
    logits and greedy tokens (None where the step did not take them)."""
    prompt = [(7 * i) % 90 + 1 for i in range(11)]
    table = [0, 1, 2, 3]
    runner.forward([SequenceStep("v", prompt, 0, table, True, PARAMS, prompt, len(prompt), 0)])
    tokens = prompt + [3]
    all_logits, all_greedy = [], []
    for i in range(steps):
        drafts = [(tokens[-1] + j * (i + 2)) % 90 + 1 for j in range(k)]
        step = SequenceStep(
            "v",
            [tokens[-1], *drafts],
            len(tokens) - 1,
            table,
            True,
            PARAMS,
            tokens,
            len(prompt),
            len(tokens) - len(prompt),
            num_draft_tokens=k,
        )
        logits, greedy = runner.forward_greedy([step])
        assert logits.shape[0] == k + 1
        all_logits.append(logits.clone())
        all_greedy.append(greedy)
        picks = logits.argmax(dim=-1).tolist()
        if greedy is not None:
            assert greedy == picks
        accepted = next((j for j in range(k) if picks[j] != drafts[j]), k)
        tokens += drafts[:accepted] + [picks[accepted]]
    return all_logits, all_greedy


@pytest.mark.parametrize("k", [2, 4])
def test_replayed_verification_steps_give_the_python_forwards_bits(tmp_path: Path, k: int) -> None:
    """A verification step's k + 1 rows (consecutive positions of one sequence, each attending over the keys of the
    rows before it) replay as a plan of k + 1 decode rows: recorded at the first step, checked at the second,
    replayed from the third, with the greedy tokens taken on the way, and the same bits as the Python forward."""
    python, replayed = _runner(tmp_path, replay=False), _runner(tmp_path, replay=True)
    expected, _ = _verify(python, k, 5)
    got, greedy = _verify(replayed, k, 5)
    assert replayed._replay.plan_state(k + 1) == "replayed"
    assert greedy[0] is None and greedy[1] is None and all(g is not None for g in greedy[2:])
    for a, b in zip(got, expected, strict=True):
        assert torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_overlapping_recordings_on_two_threads_keep_their_own_calls() -> None:
    """Two models in one process share the kernel libraries and step on their own threads. Recording A starts,
    recording B starts, each thread calls the shared function, A ends first, B calls again, B ends: each recorder
    holds exactly its own thread's calls, and the library's function is the original again."""
    import threading

    def kernel(x: int) -> int:
        return x + 1

    lib = SimpleNamespace(kernel=kernel)
    table = {"kernel": (None, [])}
    recorders = [step_replay._Recorder([lib], [table], []) for _ in range(2)]
    turn = [threading.Event() for _ in range(6)]
    results: dict[int, int] = {}

    def thread_a() -> None:
        with recorders[0]:
            turn[0].set()
            turn[1].wait()
            results[0] = lib.kernel(10)
            turn[2].set()
            turn[3].wait()
        turn[4].set()

    def thread_b() -> None:
        turn[0].wait()
        with recorders[1]:
            turn[1].set()
            turn[2].wait()
            results[1] = lib.kernel(20)
            turn[3].set()
            turn[4].wait()
            results[2] = lib.kernel(21)
        assert lib.kernel(99) == 100  # after both: calls are recorded nowhere

    threads = [threading.Thread(target=thread_a), threading.Thread(target=thread_b)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=10)
    assert results == {0: 11, 1: 21, 2: 22}
    assert [c.args for c in recorders[0].calls] == [(10,)]
    assert [c.args for c in recorders[1].calls] == [(20,), (21,)]
    assert lib.kernel is kernel
    assert not step_replay._Recorder._patched


def test_steps_that_keep_decode_rows_on_registers_have_plans_of_their_own(tmp_path: Path) -> None:
    """A step with a seeded request keeps its decode rows off the tile unit (other projection calls on a CPU with
    AMX): it never replays the plan recorded for steps of as many rows without one."""
    runner = _runner(tmp_path, replay=True)
    _decode(runner, batch=3, steps=3)
    assert runner._replay.plan_state(3) == "replayed"
    with kernel_modes.decode_rows_on_registers():
        assert runner._replay.plan_state(3) == "none"
        _decode(runner, batch=3, steps=3)
        assert runner._replay.plan_state(3) == "replayed"
