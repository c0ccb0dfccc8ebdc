"""How a vLLM refusal is named to the client (needs vLLM's exception types; no engine start)."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm")

from vllm.exceptions import VLLMValidationError  # noqa: E402

from engines.types import GenerationRequest, GuidedSpec, SamplingParams  # noqa: E402
from engines.vllm.engine import _refused_param  # noqa: E402

pytestmark = pytest.mark.vllm


def _validate_structured_outputs() -> None:  # named as vLLM's check is
    raise VLLMValidationError("Invalid grammar specification")


def _other_check() -> None:
    raise VLLMValidationError("Invalid grammar specification")


def _raised(check) -> VLLMValidationError:  # noqa: ANN001
    try:
        check()
    except VLLMValidationError as exc:
        return exc
    raise AssertionError("no error")


def test_a_refusal_names_the_field_vllm_names_else_the_guided_field() -> None:
    guided = GenerationRequest("r", [1], SamplingParams(guided=GuidedSpec("lark", "start: x", "structured_outputs")))
    plain = GenerationRequest("r", [1], SamplingParams())
    assert _refused_param(VLLMValidationError("bad", parameter="top_p"), guided) == "top_p"
    assert _refused_param(_raised(_validate_structured_outputs), guided) == "structured_outputs"
    assert _refused_param(_raised(_validate_structured_outputs), plain) is None
    assert _refused_param(_raised(_other_check), guided) is None
