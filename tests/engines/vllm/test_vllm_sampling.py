"""Our sampling parameters -> vLLM's, field by field, and vLLM's logprobs -> ours (needs vLLM; no engine start)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.logprobs import Logprob  # noqa: E402
from vllm.sampling_params import RequestOutputKind  # noqa: E402

from engines.types import JSON_FORMAT, GuidedSpec, SamplingParams, TokenLogprob  # noqa: E402
from engines.vllm.engine import engine_args  # noqa: E402
from engines.vllm.sampling import to_token_logprobs, to_vllm_sampling_params  # noqa: E402

pytestmark = pytest.mark.vllm


def test_every_field_maps_to_vllm() -> None:
    ours = SamplingParams(
        temperature=0.7,
        top_p=0.9,
        top_k=40,
        min_p=0.05,
        presence_penalty=0.5,
        frequency_penalty=0.25,
        repetition_penalty=1.1,
        logit_bias={7: -100.0, 9: 2.5},
        seed=1234,
        max_tokens=33,
        min_tokens=3,
        stop=["\n\n", "END"],
        stop_token_ids=[2, 5],
        include_stop_str_in_output=True,
        ignore_eos=True,
        skip_special_tokens=False,
        logprobs=4,
    )
    v = to_vllm_sampling_params(ours)
    assert (v.n, v.temperature, v.top_p, v.top_k, v.min_p) == (1, 0.7, 0.9, 40, 0.05)
    assert (v.presence_penalty, v.frequency_penalty, v.repetition_penalty) == (0.5, 0.25, 1.1)
    assert v.logit_bias == {7: -100.0, 9: 2.5} and v.seed == 1234
    assert (v.max_tokens, v.min_tokens) == (33, 3)
    assert v.stop == ["\n\n", "END"] and v.stop_token_ids == [2, 5]
    assert v.include_stop_str_in_output and v.ignore_eos and not v.skip_special_tokens
    assert v.logprobs == 4 and v.output_kind == RequestOutputKind.DELTA


def test_defaults_stay_defaults() -> None:
    v = to_vllm_sampling_params(SamplingParams(temperature=0.0))
    assert v.temperature == 0.0 and v.top_k in (0, -1) and v.logprobs is None
    assert not v.stop and not v.stop_token_ids and not v.logit_bias and v.seed is None


def test_guided_specs_become_vllm_structured_outputs() -> None:
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "additionalProperties": False}
    so = to_vllm_sampling_params(SamplingParams(guided=GuidedSpec("json", schema))).structured_outputs
    assert so.json == {"x-guidance": JSON_FORMAT, **schema}  # our compact formatting, read by the guidance backend
    so = to_vllm_sampling_params(SamplingParams(guided=GuidedSpec("regex", "[0-9]+"))).structured_outputs
    assert so.regex == "[0-9]+" and so.json is None
    so = to_vllm_sampling_params(SamplingParams(guided=GuidedSpec("choice", ["yes", "no"]))).structured_outputs
    assert so.choice == ["yes", "no"]
    so = to_vllm_sampling_params(SamplingParams(guided=GuidedSpec("lark", 'start: "x"'))).structured_outputs
    assert so.grammar == 'start: "x"'
    assert to_vllm_sampling_params(SamplingParams()).structured_outputs is None


def test_a_compiled_constraint_without_its_spec_is_refused_clearly() -> None:
    class Anything:
        def allowed_mask(self, vocab_size: int) -> None:
            return None

        def accept(self, token_id: int) -> None:
            pass

    with pytest.raises(ValueError, match="guided-decoding"):
        to_vllm_sampling_params(SamplingParams(constraint=Anything()))  # type: ignore[arg-type]


def test_logprobs_keep_the_top_k_in_rank_order_and_the_sampled_token() -> None:
    sampled_in_top = {5: Logprob(-0.1, 1), 8: Logprob(-2.5, 2), 3: Logprob(-3.0, 3)}
    sampled_outside = {9: Logprob(-4.0, 7), 5: Logprob(-0.2, 1), 8: Logprob(-1.9, 2)}
    out = to_token_logprobs([5, 9], [sampled_in_top, sampled_outside], k=2)
    assert out == [
        TokenLogprob(5, pytest.approx(-0.1), [(5, pytest.approx(-0.1)), (8, pytest.approx(-2.5))]),
        TokenLogprob(9, pytest.approx(-4.0), [(5, pytest.approx(-0.2)), (8, pytest.approx(-1.9))]),
    ]
    assert to_token_logprobs([5], [{5: Logprob(-0.3, 1)}], k=0) == [TokenLogprob(5, pytest.approx(-0.3), [])]
    assert to_token_logprobs([5], None, k=0) is None


def test_engine_args_from_config(tmp_path) -> None:  # type: ignore[no-untyped-def]
    args = engine_args(
        tmp_path,
        dtype="float32",
        max_model_len=2048,
        max_num_seqs=8,
        kv_cache_memory_gib=0.5,
        enable_prefix_caching=True,
        enforce_eager=True,
        extra={"max_num_batched_tokens": 1024},
    )
    assert (args.model, args.dtype, args.max_model_len, args.max_num_seqs) == (str(tmp_path), "float32", 2048, 8)
    assert args.kv_cache_memory_bytes == 2**29 and args.enable_prefix_caching and args.enforce_eager
    assert args.scheduling_policy == "priority" and args.max_num_batched_tokens == 1024
    assert args.structured_outputs_config.backend == "guidance"  # llguidance, as on the native engine
    xgr = engine_args(
        tmp_path,
        dtype="float32",
        max_model_len=None,
        max_num_seqs=8,
        kv_cache_memory_gib=1,
        enable_prefix_caching=True,
        enforce_eager=False,
        extra={"structured_outputs_config": {"backend": "xgrammar"}},
    )
    assert xgr.structured_outputs_config.backend == "xgrammar"
    with pytest.raises(ValueError, match="unknown vLLM engine argument"):
        engine_args(
            tmp_path,
            dtype="float32",
            max_model_len=None,
            max_num_seqs=8,
            kv_cache_memory_gib=1,
            enable_prefix_caching=True,
            enforce_eager=False,
            extra={"max_num_seq": 4},
        )
