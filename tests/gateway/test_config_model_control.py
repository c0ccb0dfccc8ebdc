"""--model-control-mode, --load-model, --repository-poll-secs: parsing, environment variables and the checks that
tell the user how to fix a wrong combination."""

from __future__ import annotations

import logging

import pytest

from gateway.cli import build_parser, load_config, main
from gateway.config import build_config
from gateway.errors import ConfigError


def parse(*argv: str):
    return build_parser().parse_args(["serve", *argv])


def test_defaults_are_tritons() -> None:
    config = load_config([], environ={})
    assert (config.model_control_mode, config.load_models, config.repository_poll_secs) == ("none", [], 15.0)


def test_flags() -> None:
    args = parse("--model-control-mode", "EXPLICIT", "--load-model", "a", "--load-model=b")
    assert (args.model_control_mode, args.load_models) == ("explicit", ["a", "b"])
    config = load_config(["--model-control-mode", "EXPLICIT", "--load-model", "a", "--load-model=b"], environ={})
    assert (config.model_control_mode, config.load_models) == ("explicit", ["a", "b"])
    config = load_config(["--model-control-mode=poll", "--repository-poll-secs", "0.5"], environ={})
    assert config.repository_poll_secs == 0.5
    with pytest.raises(SystemExit):
        parse("--model-control-mode", "sometimes")


def test_environment_variables(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    config = load_config(
        [], environ={"SWITCHYARD_MODEL_CONTROL_MODE": "Poll", "SWITCHYARD_REPOSITORY_POLL_SECS": "2.5"}
    )
    assert (config.model_control_mode, config.repository_poll_secs) == ("poll", 2.5)
    monkeypatch.setenv("SWITCHYARD_MODEL_CONTROL_MODE", "explicit")
    monkeypatch.setenv("SWITCHYARD_LOAD_MODEL", "a, b")  # the older spelling of SWITCHYARD_LOAD_MODELS
    seen = {}

    class Stop(Exception):
        pass

    def fake_control(root, cache_dir, **kw):
        seen.update(kw)
        raise Stop

    monkeypatch.setattr("gateway.app.ModelControl", fake_control)  # built by gateway.app.build_model_control
    with pytest.raises(Stop):
        main(["serve", "--model-repository", str(tmp_path)])
    assert seen["control_mode"] == "explicit" and seen["load_models"] == ["a", "b"]


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"load_models": ["a"]}, "--load-model is only used with --model-control-mode=explicit"),
        (
            {"model_control_mode": "poll", "load_models": ["a"]},
            "add --model-control-mode=explicit or drop --load-model",
        ),
        ({"model_control_mode": "explicit", "load_models": ["*", "a"]}, "must be the only --load-model"),
        ({"model_control_mode": "explicit", "load_models": ["../etc"]}, "is not a model name"),
        ({"model_control_mode": "explicit", "repository_poll_secs": 5}, "--repository-poll-secs is only used with"),
        ({"model_control_mode": "poll", "repository_poll_secs": 0}, "repository_poll_secs"),
        ({"model_control_mode": "poll", "repository_poll_secs": -1}, "greater than 0"),
        ({"model_control_mode": "sometimes"}, "model-control-mode"),
    ],
)
def test_wrong_combinations_say_how_to_fix_them(values: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message.replace("*", r"\*")):
        build_config(**values)


@pytest.fixture(autouse=True)
def _keep_logging(monkeypatch: pytest.MonkeyPatch) -> None:
    """main() would reconfigure the test process's logging."""
    monkeypatch.setattr("gateway.server.request_log.setup_logging", lambda *a, **k: None)


def test_cli_exits_2_with_the_message(caplog: pytest.LogCaptureFixture, tmp_path) -> None:
    with caplog.at_level(logging.ERROR):
        assert main(["serve", "--model-repository", str(tmp_path), "--load-model", "x"]) == 2
    assert "--load-model is only used with --model-control-mode=explicit" in caplog.text


def test_rate_limit_flags() -> None:
    from gateway.config import build_rate_limiter

    config = load_config(
        ["--rate-limit", "execution_count", "--rate-limit-resource", "R1:4", "--rate-limit-resource", "R1:2:0"],
        environ={},
    )
    assert (config.rate_limit, config.rate_limit_resources) == ("execution_count", ("R1:4", "R1:2:0"))
    limiter = build_rate_limiter(config)
    assert limiter is not None and limiter.amount(("R1", 0)) == 2 and limiter.amount(("R1", 1)) == 4
    assert build_rate_limiter(build_config()) is None
    with pytest.raises(ConfigError, match="needs --rate-limit=execution_count"):
        build_rate_limiter(build_config(rate_limit_resources=("R1:4",)))
    with pytest.raises(ConfigError, match="NAME:COUNT"):
        build_rate_limiter(build_config(rate_limit="execution_count", rate_limit_resources=("R1",)))
