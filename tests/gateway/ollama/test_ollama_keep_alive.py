"""keep_alive: Ollama's durations read as seconds, and who may unload models through it."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from gateway.errors import InvalidRequestError
from gateway.keys.auth import ANONYMOUS, Principal
from gateway.ollama.keep_alive import FOREVER, control_refusal, parse_keep_alive


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, None),
        (0, 0.0),
        ("0", 0.0),
        ("0s", 0.0),
        (300, 300.0),
        (1.5, 1.5),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("1.5h", 5400.0),
        ("300ms", 0.3),
        ("2m30s", 150.0),
        ("-5m", FOREVER),
        ("10", 10.0),
    ],
)
def test_durations_are_read_as_ollama_reads_them(value: object, seconds: float | None) -> None:
    assert parse_keep_alive(value) == seconds  # type: ignore[arg-type]


@pytest.mark.parametrize("value", ["soon", "5 minutes", "5x", "m", "", "1h-5m"])
def test_bad_durations_are_400s(value: str) -> None:
    with pytest.raises(InvalidRequestError, match="keep_alive: time: invalid duration") as info:
        parse_keep_alive(value)
    assert info.value.param == "keep_alive"


def test_only_the_admin_key_in_explicit_mode_may_unload() -> None:
    admin = Principal("abc", admin=True)
    assert "model control mode is 'none'" in control_refusal(SimpleNamespace(control_mode="none"), admin)
    assert "'poll'" in control_refusal(SimpleNamespace(control_mode="poll"), admin)
    explicit = SimpleNamespace(control_mode="explicit")
    assert "admin key" in control_refusal(explicit, ANONYMOUS)
    assert "admin key" in control_refusal(explicit, Principal("user"))
    assert control_refusal(explicit, admin) is None
