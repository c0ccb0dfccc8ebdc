"""The lifecycle settings: a model's `load` and `keep_alive`, the server's --memory-budget, --keep-alive,
--load-timeout-secs and --exit-on-error, and the errors that say the fix."""

from __future__ import annotations

import pytest

from gateway.cli import load_config
from gateway.errors import ConfigError
from gateway.repository.lifecycle_config import FOREVER, describe_keep_alive, parse_duration
from gateway.repository.model_config import ModelConfig, validate_model_config
from gateway.repository.tensor_config import TensorModelConfig


@pytest.mark.parametrize(
    ("given", "seconds"),
    [
        (300, 300.0),
        ("300", 300.0),
        ("5m", 300.0),
        ("1h30m", 5400.0),
        ("90s", 90.0),
        ("500ms", 0.5),
        ("1.5h", 5400.0),
        (0, 0.0),
        ("0", 0.0),
        (-1, FOREVER),
        ("-1", FOREVER),
        ("-5m", FOREVER),
        (" 10M ", 600.0),
    ],
)
def test_durations_read_as_ollama_s(given: object, seconds: float) -> None:
    assert parse_duration(given) == seconds


@pytest.mark.parametrize("given", ["", "5 minutes", "m", "5x", "1h 30m", "inf", "nan", True, None, [5]])
def test_bad_durations_say_the_fix(given: object) -> None:
    with pytest.raises(ValueError, match=r"is not a duration; use seconds .* or -1 to keep the model loaded"):
        parse_duration(given)


def test_durations_read_back() -> None:
    assert [describe_keep_alive(s) for s in (300, 5400, 3600, 90, 0.5, FOREVER)] == [
        "5m",
        "90m",
        "1h",
        "90s",
        "0.5s",
        "forever",
    ]


def test_both_config_kinds_take_load_and_keep_alive() -> None:
    llm = validate_model_config({"backend": "pytorch", "load": "on_request", "keep_alive": "10m"}, "m.yaml", "m")
    assert isinstance(llm, ModelConfig) and (llm.load, llm.keep_alive) == ("on_request", 600.0)
    tensor = validate_model_config(
        {"backend": "python", "max_batch_size": 4, "load": "on_startup", "keep_alive": -1}, "t.pbtxt", "t", tensor=True
    )
    assert isinstance(tensor, TensorModelConfig) and (tensor.load, tensor.keep_alive) == ("on_startup", FOREVER)
    assert ModelConfig().load is None and ModelConfig().keep_alive is None  # unset: the control mode decides


@pytest.mark.parametrize(
    ("raw", "says"),
    [
        ({"load": "lazy"}, "field 'load'"),
        ({"keep_alive": "forever-ish"}, "field 'keep_alive': 'forever-ish' is not a duration"),
    ],
)
def test_bad_lifecycle_fields_name_the_field(raw: dict, says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        validate_model_config(raw, "m.yaml", "m")


def test_server_flags() -> None:
    config = load_config(
        [
            "--model-control-mode",
            "on_demand",
            "--memory-budget",
            "12GiB",
            "--keep-alive",
            "10m",
            "--load-timeout-secs",
            "30",
            "--exit-on-error",
        ],
        environ={},
    )
    assert config.model_control_mode == "on_demand" and config.memory_budget == 12 * 2**30
    assert (config.keep_alive, config.load_timeout_secs, config.exit_on_error) == (600.0, 30.0, True)
    defaults = load_config([], environ={})
    assert (defaults.memory_budget, defaults.keep_alive, defaults.exit_on_error) == (None, 300.0, False)
    env = load_config([], environ={"SWITCHYARD_MEMORY_BUDGET": "800MB", "SWITCHYARD_KEEP_ALIVE": "-1"})
    assert (env.memory_budget, env.keep_alive) == (800 * 10**6, FOREVER)


@pytest.mark.parametrize(
    ("argv", "says"),
    [
        (["--memory-budget", "lots"], "--memory-budget"),
        (["--memory-budget", "8 gigs"], "could not interpret byte unit"),
        (["--keep-alive", "soon"], "--keep-alive.*is not a duration"),
    ],
)
def test_bad_server_flags_say_which_and_how(argv: list[str], says: str) -> None:
    with pytest.raises(ConfigError, match=says):
        load_config(argv, environ={})
