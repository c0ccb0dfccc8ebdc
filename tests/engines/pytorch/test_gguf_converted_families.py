"""GGUF files made by llama.cpp's own converter and quantizer from tiny HF folders of each family the native engine
serves: the engine reads from the file what transformers' GGUF loader drops (Llama 3's RoPE scaling from the
`rope_freqs` tensor, the head size from `attention.key_length`, bias presence) and answers as transformers does.

- F32 files: greedy output equals transformers' float32 model of the original folder, token for token.
- F16, Q8_0 and Q4_K_M files (their values are not the folder's): the config the engine reads equals the folder's on
  every key that shapes the answer, and greedy output equals transformers' float32 model of the file (its GGUF
  loader's weights under that config). The Q4_K_M models are 256 wide so that llama.cpp gives them K blocks.

Mixture of experts (Qwen3-MoE, Mixtral): the F32 files answer as the folder; in the Q8_0, Q4_K_M and MXFP4_MOE files
every expert is served from the file's blocks (no float copy of an expert is made). transformers' GGUF loader cannot
build a Mixtral of its file (llama.cpp writes Mixtral as a `llama`: transformers makes a dense Llama with random MLPs),
so a Mixtral file's reference is transformers' Mixtral of the folder's config holding transformers' own reading of the
file's attention, norms and embeddings and gguf-py's dequantization of its router and experts.

gpt-oss (`gpt-oss`: a config the engine makes of its metadata, experts stacked with biases, attention sinks): F32,
MXFP4_MOE (MXFP4 experts and Q8_0 attention: the released files' types) and Q8_0 files (every expert from the
file's blocks) answer as transformers' gpt-oss of the folder's config holding gguf-py's reading of
every tensor of the file put back where the converter took it from, logprobs within 1e-4, decode steps replayed;
for the F32 file that model is the folder's own.

Folders come from tests/family_models.py; files from bench/gguf_convert.py (the converter from the pinned
llama-cpp-python sdist, fetched once; quantized by llama.cpp in its environment). Without either the tests skip
and say why. Mistral's sliding window is not in its GGUF file (llama.cpp's converter writes a Mistral as a llama and
drops it, and llama.cpp attends over the whole context), so its prompts stay within the window.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

from bench.gguf_convert import converted
from bench.llamacpp_env import ConverterUnavailable, LlamaCppUnavailable
from engines.interface import ModelFileError
from engines.pytorch.engine import PyTorchEngine
from engines.pytorch.gguf_blocks import TYPES
from engines.pytorch.loader import resolve_hf_folder
from engines.types import GenerationRequest, SamplingParams
from gateway.repository.model_config import SchedulerConfig
from gateway.scheduler.llm.continuous_batcher import ContinuousBatcher
from tests.family_models import family_folder
from tests.greedy_reference import greedy_reference

NEW_TOKENS = 8
# qwen2 is left out: transformers gives its folder (SmolLM2's tokenizer under a qwen2 config) its Qwen2Tokenizer,
# whose pre-tokenizer llama.cpp's converter does not recognize, so the converter refuses the folder
# gemma2 and phi3 are left out too: llama.cpp's converter reads their vocabulary from a SentencePiece
# tokenizer.model only, which the test folders (SmolLM2's BPE tokenizer) do not have
SAME_AS_FOLDER = (
    "llama",
    "llama3_rope",
    "llama_untied",
    "llama_bias",
    "mistral",
    "qwen3",
    "gemma3_six",
    "qwen3_moe",
    "mixtral",
)
NOT_READ_BY_TRANSFORMERS = ("granite", "olmo2")  # the converter writes them; transformers' GGUF loader cannot read
QUANTIZED = (
    ("llama3_rope", "F16"),
    ("llama_bias", "Q8_0"),
    ("llama3_rope_wide", "Q4_K_M"),
    ("qwen3_wide", "Q4_K_M"),
    ("qwen3_wide", "F32"),
    ("qwen3_moe", "Q8_0"),
    ("qwen3_moe", "MXFP4_MOE"),  # MXFP4 experts, read in place as blocks (EXPERT_BLOCKS)
)
# files whose experts the kernels read as blocks (the wide ones 256 wide, for K blocks)
EXPERT_BLOCKS = (
    ("qwen3_moe", "Q8_0"),
    ("mixtral", "Q8_0"),
    ("qwen3_moe_wide", "Q4_K_M"),
    ("mixtral_wide", "Q4_K_M"),
    ("qwen3_moe", "MXFP4_MOE"),
)
# what must come out of the file as the folder has it (transformers' GGUF loader alone loses the first three)
CONFIG_KEYS = (
    "head_dim",
    "rope_parameters",
    "attention_bias",
    "mlp_bias",
    "tie_word_embeddings",
    "rms_norm_eps",
    "num_key_value_heads",
    "intermediate_size",
    "vocab_size",
)
FLAGS = ("attention_bias", "mlp_bias")  # absent from some config classes: absent is False
PER_FAMILY_KEYS = {
    "gemma3": ("sliding_window", "layer_types", "query_pre_attn_scalar"),
    "qwen3_moe": (
        "model_type",
        "num_experts",
        "num_experts_per_tok",
        "moe_intermediate_size",
        "norm_topk_prob",
        "decoder_sparse_step",
        "mlp_only_layers",
    ),
    "mixtral": ("model_type", "num_local_experts", "num_experts_per_tok"),
    "gpt_oss": (
        "model_type",
        "num_local_experts",
        "num_experts_per_tok",
        "sliding_window",
        "layer_types",
        "swiglu_alpha",
        "swiglu_limit",
        "max_position_embeddings",
        "attention_bias",
    ),
}
LOGPROB_TOLERANCE = 1e-4


def _gguf(family: str, kind: str) -> tuple[Path, Path]:
    folder = family_folder(family)
    try:
        return folder, converted(folder, kind)
    except (ConverterUnavailable, LlamaCppUnavailable) as exc:
        pytest.skip(f"no {kind} file of {family}: {exc}")


def _prompts(vocab: int, count: int, longest: int) -> list[list[int]]:
    rng = random.Random(7)
    return [[rng.randrange(100, vocab) for _ in range(rng.randrange(3, longest))] for _ in range(count)]


async def _generate(
    engine: PyTorchEngine, prompts: list[list[int]], logprobs: list[list[float]] | None = None
) -> list[list[int]]:
    """Greedy answers to `prompts`; where `logprobs` is given, each answer's tokens' logprobs are appended to it."""
    batcher = ContinuousBatcher(engine, SchedulerConfig(max_num_seqs=4, max_num_batched_tokens=32))
    await batcher.start()

    async def run(i: int, ids: list[int]) -> tuple[list[int], list[float]]:
        tokens: list[int] = []
        found: list[float] = []
        params = SamplingParams(
            temperature=0.0, max_tokens=NEW_TOKENS, ignore_eos=True, logprobs=None if logprobs is None else 0
        )
        async for out in batcher.generate(GenerationRequest(f"r{i}", ids, params)):
            tokens.extend(out.new_token_ids)
            found.extend(lp.logprob for lp in out.logprobs or [])
        return tokens, found

    try:
        answers = await asyncio.gather(*(run(i, p) for i, p in enumerate(prompts)))
    finally:
        await batcher.stop()
    if logprobs is not None:
        logprobs.extend(found for _tokens, found in answers)
    return [tokens for tokens, _found in answers]


def _reference(model: Any, prompts: list[list[int]], logprobs: list[list[float]] | None = None) -> list[list[int]]:
    """transformers' greedy answers (`logprobs` as for _generate)."""
    refs = [greedy_reference(model, ids, NEW_TOKENS) for ids in prompts]
    if logprobs is not None:
        logprobs.extend(ref.logprobs for ref in refs)
    return [ref.tokens for ref in refs]


def _rope(config: Any) -> dict[str, Any]:
    params = dict(config.rope_parameters or {})
    return {k: float(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for k, v in params.items()}


def _same_config(gguf_config: Any, folder: Path) -> None:
    want = AutoConfig.from_pretrained(folder)
    for key in CONFIG_KEYS + PER_FAMILY_KEYS.get(want.model_type.removesuffix("_text"), ()):
        ours, theirs = getattr(gguf_config, key, None), getattr(want, key, None)
        if key == "rope_parameters":
            ours, theirs = _rope(gguf_config), _rope(want)
        elif key == "rms_norm_eps":  # the file holds it as float32
            theirs = float(torch.tensor(theirs, dtype=torch.float32))
        elif key in FLAGS:
            ours, theirs = bool(ours), bool(theirs)
        elif key == "head_dim":  # unset (Mixtral's config class): hidden / heads, which a Llama config writes
            ours = ours or gguf_config.hidden_size // gguf_config.num_attention_heads
            theirs = theirs or want.hidden_size // want.num_attention_heads
        assert ours == theirs, f"{key}: {ours} from the file, {theirs} in the folder"


@pytest.fixture(scope="module")
def run_engine() -> Iterator[Any]:
    engines: list[PyTorchEngine] = []

    def run(
        gguf: Path, prompts: list[list[int]], logprobs: list[list[float]] | None = None
    ) -> tuple[PyTorchEngine, list[list[int]]]:
        engine = PyTorchEngine(gguf, dtype="float32", kv_cache_tokens=1024, block_size=16)
        engines.append(engine)
        return engine, asyncio.run(_generate(engine, prompts, logprobs))

    yield run
    engines.clear()


@pytest.mark.parametrize("family", SAME_AS_FOLDER)
def test_f32_file_answers_as_the_original_folder(family: str, run_engine: Any) -> None:
    folder, gguf = _gguf(family, "F32")
    config = AutoConfig.from_pretrained(folder)
    longest = 6 if getattr(config, "sliding_window", None) else 40  # prompt + answer within Mistral's window
    prompts = _prompts(config.vocab_size, 4, longest)
    _engine, ours = run_engine(gguf, prompts)
    reference = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    theirs = _reference(reference, prompts)
    assert ours == theirs
    _same_config(AutoConfig.from_pretrained(resolve_hf_folder(gguf)), folder)
    if family == "llama3_rope":  # the test can fail: with transformers' GGUF loader's `rope_type: default` it does
        config = AutoConfig.from_pretrained(folder)
        config.rope_parameters = {"rope_type": "default", "rope_theta": config.rope_parameters["rope_theta"]}
        unscaled = AutoModelForCausalLM.from_pretrained(folder, config=config, dtype=torch.float32).eval()
        assert _reference(unscaled, prompts) != theirs


@pytest.mark.parametrize(("family", "kind"), QUANTIZED)
def test_quantized_file_reads_the_folders_config_and_answers_as_transformers(
    family: str, kind: str, run_engine: Any
) -> None:
    folder, gguf = _gguf(family, kind)
    converted_folder = resolve_hf_folder(gguf)  # transformers' float32 model of the file, under the config we read
    _same_config(AutoConfig.from_pretrained(converted_folder), folder)
    prompts = _prompts(AutoConfig.from_pretrained(folder).vocab_size, 4, 40)
    _engine, ours = run_engine(gguf, prompts)
    theirs = _reference(AutoModelForCausalLM.from_pretrained(converted_folder, dtype=torch.float32).eval(), prompts)
    assert ours == theirs


def _expert_projections(engine: PyTorchEngine) -> list[Any]:
    return [p for layer in engine._runner.model.layers for pair in getattr(layer.mlp, "experts", ()) for p in pair]


def _mixtral_reference(folder: Path, gguf: Path) -> Any:
    """transformers' Mixtral of the folder's config holding the file's weights: attention, norms and embeddings as
    transformers' GGUF loader reads them (its dense Llama of the file; it reverses the converter's q/k row order),
    router and experts as gguf-py dequantizes them."""
    from gguf import GGUFReader, dequantize

    dense = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32).eval()
    state = {k: v for k, v in dense.state_dict().items() if ".mlp." not in k}
    tensors = {t.name: t for t in GGUFReader(gguf).tensors}

    def read(name: str) -> torch.Tensor:
        return torch.from_numpy(dequantize(tensors[name].data, tensors[name].tensor_type).copy())

    for i in range(model.config.num_hidden_layers):
        state[f"model.layers.{i}.mlp.gate.weight"] = read(f"blk.{i}.ffn_gate_inp.weight")
        state[f"model.layers.{i}.mlp.experts.gate_up_proj"] = torch.cat(
            [read(f"blk.{i}.ffn_gate_exps.weight"), read(f"blk.{i}.ffn_up_exps.weight")], dim=1
        )
        state[f"model.layers.{i}.mlp.experts.down_proj"] = read(f"blk.{i}.ffn_down_exps.weight")
    model.load_state_dict(state, strict=True)
    return model


@pytest.mark.parametrize(("family", "kind"), EXPERT_BLOCKS)
def test_experts_are_served_from_the_files_blocks(family: str, kind: str, run_engine: Any) -> None:
    folder, gguf = _gguf(family, kind)
    prompts = _prompts(AutoConfig.from_pretrained(folder).vocab_size, 3, 24)
    engine, ours = run_engine(gguf, prompts)
    experts = _expert_projections(engine)
    assert len(experts) == 2 * sum(len(layer.mlp.experts) for layer in engine._runner.model.layers)
    assert experts and all(p.blocks_nbytes > 0 and p.weight is None for p in experts)  # blocks, no float copy
    if kind == "MXFP4_MOE":  # llama.cpp's quantizer gives the experts MXFP4 (the rest Q8_0): read as MXFP4 panels
        assert {int(code) for p in experts for code in p._blocks.segs[1::2]} == {TYPES["MXFP4"].code}
    converted_folder = AutoModelForCausalLM.from_pretrained(resolve_hf_folder(gguf), dtype=torch.float32).eval()
    if not family.startswith("mixtral"):
        assert ours == _reference(converted_folder, prompts)
        return
    theirs = _reference(_mixtral_reference(folder, gguf), prompts)
    assert ours == theirs
    # the float32 / bfloat16 path's model of the file (loader.py builds Mixtral's, transformers cannot) too
    assert _reference(converted_folder, prompts) == theirs


def test_a_mixtral_file_is_never_served_as_a_dense_llama(run_engine: Any) -> None:
    """llama.cpp writes Mixtral as architecture `llama`; transformers' GGUF loader alone would build a dense Llama
    whose MLPs are random (the file has no dense MLP tensors). The engine reads the expert metadata: a Mixtral."""
    folder, gguf = _gguf("mixtral", "F32")
    dense = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    assert dense.config.model_type == "llama"  # what transformers alone makes of the file
    engine, _ = run_engine(gguf, [[100, 200, 300]])
    assert engine._runner.model.layers[0].mlp.__class__.__name__ == "SparseMoE"
    assert len(engine._runner.model.layers[0].mlp.experts) == AutoConfig.from_pretrained(folder).num_local_experts
    _same_config(AutoConfig.from_pretrained(resolve_hf_folder(gguf)), folder)


def test_mlp_biases_are_read_not_dropped(run_engine: Any) -> None:
    """transformers' GGUF loader would build a llama without MLP biases and drop the file's: the engine reads that
    the file has them (and, not serving MLP biases, says so)."""
    _folder, gguf = _gguf("llama_mlp_bias", "F32")
    with pytest.raises(ValueError, match="MLP projections with bias"):
        run_engine(gguf, [[100, 200, 300]])


@pytest.mark.parametrize("family", NOT_READ_BY_TRANSFORMERS)
def test_an_architecture_transformers_cannot_read_is_refused_clearly(family: str) -> None:
    _folder, gguf = _gguf(family, "F32")
    with pytest.raises(ModelFileError, match=f"architecture '{family}' is not one transformers' GGUF loader reads"):
        PyTorchEngine(gguf, dtype="float32", kv_cache_tokens=256, block_size=16)


def _gpt_oss_reference(folder: Path, gguf: Path) -> Any:
    """transformers' gpt-oss of the folder's config holding gguf-py's dequantization of every tensor of the file,
    each put back where llama.cpp's converter took it from (conversion/gpt_oss.py): the experts' gate and up rows
    (and biases) as the even and odd columns of `gate_up_proj` again, the experts' projections transposed back, the
    sinks without the `.weight` the converter gave them. Written from the converter's steps, not the engine's."""
    from gguf import GGUFReader, dequantize

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(folder), dtype=torch.float32).eval()
    tensors = {t.name: t for t in GGUFReader(gguf).tensors}

    def read(name: str) -> torch.Tensor:
        tensor = tensors.pop(name)
        return torch.from_numpy(dequantize(tensor.data, tensor.tensor_type).copy())

    def interleaved(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:  # the converter's [:, ::2], [:, 1::2]
        joined = gate.new_empty(gate.shape[0], 2 * gate.shape[1], *gate.shape[2:])
        joined[:, 0::2], joined[:, 1::2] = gate, up
        return joined

    state = {
        "model.embed_tokens.weight": read("token_embd.weight"),
        "model.norm.weight": read("output_norm.weight"),
        "lm_head.weight": read("output.weight"),
    }
    attention = (("q_proj", "attn_q"), ("k_proj", "attn_k"), ("v_proj", "attn_v"), ("o_proj", "attn_output"))
    for i in range(model.config.num_hidden_layers):
        at, blk, experts = f"model.layers.{i}.", f"blk.{i}.", f"model.layers.{i}.mlp.experts."
        state[f"{at}input_layernorm.weight"] = read(f"{blk}attn_norm.weight")
        state[f"{at}post_attention_layernorm.weight"] = read(f"{blk}post_attention_norm.weight")
        for ours, theirs in attention:
            for kind in ("weight", "bias"):
                state[f"{at}self_attn.{ours}.{kind}"] = read(f"{blk}{theirs}.{kind}")
        state[f"{at}self_attn.sinks"] = read(f"{blk}attn_sinks.weight")
        state[f"{at}mlp.router.weight"] = read(f"{blk}ffn_gate_inp.weight")
        state[f"{at}mlp.router.bias"] = read(f"{blk}ffn_gate_inp.bias")
        gate_up = interleaved(read(f"{blk}ffn_gate_exps.weight"), read(f"{blk}ffn_up_exps.weight"))
        state[f"{experts}gate_up_proj"] = gate_up.transpose(-1, -2)
        state[f"{experts}gate_up_proj_bias"] = interleaved(
            read(f"{blk}ffn_gate_exps.bias"), read(f"{blk}ffn_up_exps.bias")
        )
        state[f"{experts}down_proj"] = read(f"{blk}ffn_down_exps.weight").transpose(-1, -2)
        state[f"{experts}down_proj_bias"] = read(f"{blk}ffn_down_exps.bias")
    assert not tensors, f"tensors of the file this reference leaves out: {sorted(tensors)}"
    model.load_state_dict(state, strict=True)
    return model


def _same_weights(model: Any, reference: Any) -> None:
    theirs = reference.state_dict()
    for name, values in model.state_dict().items():
        assert torch.equal(values, theirs[name]), name


@pytest.mark.parametrize("kind", ["F32", "MXFP4_MOE", "Q8_0"])
def test_a_gpt_oss_file_answers_as_transformers_gpt_oss_of_its_weights(kind: str, run_engine: Any) -> None:
    """llama.cpp's gpt-oss files: F32 (the folder's weights: the reference is the folder's model), MXFP4_MOE (the
    released files' types: MXFP4 experts, Q8_0 attention and embeddings) and Q8_0 (its experts served from the
    file's blocks), against _gpt_oss_reference, logprobs within 1e-4, with prompts past the sliding window (12) and
    YaRN's original length (64), both read from the file; decode steps replayed as the folder's are."""
    folder, gguf = _gguf("gpt_oss", kind)
    reference = _gpt_oss_reference(folder, gguf)
    if kind == "F32":
        _same_weights(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32), reference)
    prompts = _prompts(reference.config.vocab_size, 4, 80)
    ours_logprobs: list[list[float]] = []
    theirs_logprobs: list[list[float]] = []
    engine, ours = run_engine(gguf, prompts, ours_logprobs)
    assert ours == _reference(reference, prompts, theirs_logprobs)
    for got, want in zip(ours_logprobs, theirs_logprobs, strict=True):
        assert len(got) == NEW_TOKENS
        assert max(abs(a - b) for a, b in zip(got, want, strict=True)) <= LOGPROB_TOLERANCE
    experts = _expert_projections(engine)
    assert len(experts) == 2 * reference.config.num_local_experts * reference.config.num_hidden_layers
    in_blocks = kind in ("Q8_0", "MXFP4_MOE")  # F32 experts are float32 tensors
    assert all((p.blocks_nbytes > 0 and p.weight is None) == in_blocks for p in experts)
    replay = engine._runner._replay
    if replay is not None:  # the MoE block is one C call (moe_experts.py), attention with sinks a kernel
        states = {rows: replay.plan_state(rows) for rows in range(1, 5)}
        assert "off" not in states.values() and "replayed" in states.values(), states
    # the float32 / bfloat16 path's model of the file (loader.py builds it: transformers' GGUF loader cannot)
    converted_folder = resolve_hf_folder(gguf)
    _same_config(AutoConfig.from_pretrained(converted_folder), folder)
    _same_weights(AutoModelForCausalLM.from_pretrained(converted_folder, dtype=torch.float32), reference)
    # the file's tokenizer (transformers' AutoTokenizer cannot make it: it makes the file's config first)
    ours_tokenizer, theirs_tokenizer = (
        AutoTokenizer.from_pretrained(converted_folder),
        AutoTokenizer.from_pretrained(folder),
    )
    text = "Hello world, it's 2026!\n  Ünïcode\tand numbers 12345"
    assert ours_tokenizer(text).input_ids == theirs_tokenizer(text).input_ids
    chat = [{"role": "user", "content": "hi"}]
    assert theirs_tokenizer.chat_template and ours_tokenizer.chat_template == theirs_tokenizer.chat_template
    assert ours_tokenizer.apply_chat_template(chat, tokenize=False) == theirs_tokenizer.apply_chat_template(
        chat, tokenize=False
    )
