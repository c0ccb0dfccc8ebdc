"""A model folder's config.yaml that YAML itself cannot turn into data (a number too long for Python, nesting deeper
than its parser recurses, aliases that expand to millions of values) is a ConfigError naming the file, found in
bounded time and memory; never a ValueError or RecursionError out of the loader, nor a hang."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.repository.model_config import parse_model_config

LAUGHS = (
    "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
    + "".join(f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdefgh", "bcdefghi", strict=True))
    + "parameters: {laughs: *i}\n"
)


@pytest.mark.parametrize(
    ("text", "fault"),
    [
        ("max_model_len: " + "9" * 5000 + "\n", "not valid YAML"),
        ("parameters: {x: " + "[" * 5000 + "]" * 5000 + "}\n", "nested more than 64 deep"),
        ("parameters: {x: " + "[" * 2000 + "\n", "nested more than 64 deep"),  # seconds in YAML's scanner
        ("".join(f"{' ' * i}k{i}:\n" for i in range(200)), "nested more than 64 deep"),
        (LAUGHS, "expand to more than"),
        ("parameters: &p {self: *p}\n", "expand to more than"),
    ],
)
def test_yaml_the_loader_cannot_hold_is_a_config_error(tmp_path: Path, text: str, fault: str) -> None:
    path = tmp_path / "m" / "config.yaml"
    path.parent.mkdir()
    path.write_text(text)
    started = time.monotonic()
    with pytest.raises(ConfigError, match=fault) as info:
        parse_model_config(path, "m")
    assert "config.yaml" in str(info.value) and time.monotonic() - started < 5
