"""/api/generate's `template`: the Go template subset Ollama's prompt templates use, and clear refusals."""

from __future__ import annotations

import pytest

from gateway.errors import InvalidRequestError
from gateway.ollama.go_template import render_template

CHATML = (
    "{{ if .System }}<|im_start|>system\n{{ .System }}<|im_end|>\n{{ end }}"
    "{{ if .Prompt }}<|im_start|>user\n{{ .Prompt }}<|im_end|>\n{{ end }}<|im_start|>assistant\n{{ .Response }}"
)


def test_an_ollama_chatml_template() -> None:
    assert render_template(CHATML, "Be brief.", "Hi") == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
    )
    assert render_template(CHATML, "", "Hi") == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_else_branches_nesting_trims_and_comments() -> None:
    source = "{{/* a note */}}{{- if .System -}}  S={{ .System }}  {{- else if .Prompt }}P{{ else }}none{{ end }}"
    assert render_template(source, "x", "p") == "S=x"
    assert render_template(source, "", "p") == "P"
    assert render_template(source, "", "") == "none"
    nested = "{{ if .Prompt }}<{{ if .System }}{{ .System }}:{{ end }}{{ .Prompt }}>{{ end }}"
    assert render_template(nested, "s", "p") == "<s:p>" and render_template(nested, "", "p") == "<p>"
    assert render_template("a\n\n  {{- .Prompt -}}  \n\nb", "", "p") == "apb"


@pytest.mark.parametrize(
    ("source", "culprit"),
    [
        ("{{ range .Messages }}{{ .Content }}{{ end }}", "range .Messages"),
        ("{{ .Messages }}", ".Messages"),
        ("{{ .Prompt | upper }}", ".Prompt | upper"),
        ("{{ if .System }}x{{ else }}y{{ else }}z{{ end }}", "else"),
        ("{{ end }}", "end"),
    ],
)
def test_what_is_not_read_here_is_refused_by_name(source: str, culprit: str) -> None:
    with pytest.raises(InvalidRequestError, match="is not supported here") as info:
        render_template(source, "s", "p")
    assert culprit in info.value.message and info.value.param == "template"


def test_an_if_without_end_is_refused() -> None:
    with pytest.raises(InvalidRequestError, match="has no"):
        render_template("{{ if .System }}x", "s", "p")
