"""`switchyard serve`'s flags and SWITCHYARD_* variables, all derived from ServerConfig's fields: every field has
both, the older spellings still work, and a wrong value names where it came from and how to fix it."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gateway.cli import build_parser, load_config, main
from gateway.config import SETTINGS, ServerConfig, build_config
from gateway.errors import ConfigError


def test_every_field_is_a_flag_and_a_variable() -> None:
    """One declaration: every ServerConfig field reaches the parser (unless environment only) and --help."""
    assert SETTINGS.keys() == ServerConfig.model_fields.keys()
    parser = build_parser()
    serve = parser._subparsers._group_actions[0].choices["serve"]  # noqa: SLF001 - argparse keeps sub-parsers here
    dests = {action.dest for action in serve._actions}  # noqa: SLF001
    help_text = serve.format_help()
    for spec in SETTINGS.values():
        assert spec.env.startswith("SWITCHYARD_") and spec.env in help_text
        assert spec.help, f"{spec.name} has no help"
        if spec.flag is not None:
            assert spec.name in dests and spec.flag in help_text


def test_names_of_the_settings_before_the_declaration_still_work() -> None:
    """Every flag and variable the server read before ServerConfig was the one declaration."""
    flags = [
        "--model-repository",
        "--host",
        "--http-port",
        "--grpc-port",
        "--metrics-port",
        "--log-level",
        "--cache-dir",
        "--max-body-bytes",
        "--always-include-usage",
        "--api-key",
        "--api-key-file",
        "--admin-key-file",
        "--public-path",
        "--cors-allow-origin",
        "--rate-limit-rpm",
        "--rate-limit-tpm",
        "--drain-seconds",
        "--stream-send-timeout-secs",
        "--no-console",
        "--log-format",
        "--model-control-mode",
        "--load-model",
        "--repository-poll-secs",
        "--rate-limit",
        "--rate-limit-resource",
    ]
    envs = [
        "SWITCHYARD_MODEL_REPOSITORY",
        "SWITCHYARD_HOST",
        "SWITCHYARD_HTTP_PORT",
        "SWITCHYARD_GRPC_PORT",
        "SWITCHYARD_METRICS_PORT",
        "SWITCHYARD_LOG_LEVEL",
        "SWITCHYARD_CACHE_DIR",
        "SWITCHYARD_MAX_BODY_BYTES",
        "SWITCHYARD_ALWAYS_INCLUDE_USAGE",
        "SWITCHYARD_API_KEYS",
        "SWITCHYARD_API_KEY_FILE",
        "SWITCHYARD_ADMIN_KEY_FILE",
        "SWITCHYARD_ADMIN_KEY",
        "SWITCHYARD_RATE_LIMIT_RPM",
        "SWITCHYARD_RATE_LIMIT_TPM",
        "SWITCHYARD_DRAIN_SECONDS",
        "SWITCHYARD_STREAM_SEND_TIMEOUT_S",
        "SWITCHYARD_CONSOLE",
        "SWITCHYARD_LOG_FORMAT",
        "SWITCHYARD_MODEL_CONTROL_MODE",
        "SWITCHYARD_LOAD_MODEL",
        "SWITCHYARD_REPOSITORY_POLL_SECS",
        "SWITCHYARD_RATE_LIMIT",
        "SWITCHYARD_RATE_LIMIT_RESOURCES",
    ]
    known_flags = {f for s in SETTINGS.values() if s.flag for f in (s.flag, *s.flag_aliases)}
    known_flags |= {f"--no-{s.flag[2:]}" for s in SETTINGS.values() if s.flag and s.kind == "bool"}
    assert set(flags) <= known_flags
    assert set(envs) <= {e for s in SETTINGS.values() for e in s.envs}


def test_values_from_flags_and_environment() -> None:
    env = {
        "SWITCHYARD_HTTP_PORT": "9000",
        "SWITCHYARD_ALWAYS_INCLUDE_USAGE": "yes",
        "SWITCHYARD_CONSOLE": "off",
        "SWITCHYARD_CORS_ALLOW_ORIGINS": "https://a.example, https://b.example",
        "SWITCHYARD_CACHE_DIR": "",
    }
    config = load_config(["--grpc-port", "0", "--drain-seconds=2.5"], environ=env)
    assert (config.http_port, config.grpc_port, config.drain_seconds) == (9000, 0, 2.5)
    assert config.always_include_usage is True and config.console is False
    assert config.cache_dir == Path.home() / ".cache" / "switchyard"  # what the engines default to as well
    assert config.cors_allow_origins == ("https://a.example", "https://b.example")
    assert load_config(["--http-port", "9001", "--console"], environ=env).http_port == 9001  # the flag wins
    assert load_config(["--console"], environ=env).console is True


def test_the_older_spelling_is_read_and_the_canonical_one_wins() -> None:
    assert load_config([], environ={"SWITCHYARD_STREAM_SEND_TIMEOUT_S": "5"}).stream_send_timeout_secs == 5
    both = {"SWITCHYARD_STREAM_SEND_TIMEOUT_S": "5", "SWITCHYARD_STREAM_SEND_TIMEOUT_SECS": "7"}
    assert load_config([], environ=both).stream_send_timeout_secs == 7
    assert load_config(["--stream-send-timeout-secs", "9"], environ=both).stream_send_timeout_secs == 9


def test_api_keys_from_every_source_count(tmp_path) -> None:
    keys = tmp_path / "keys"
    keys.write_text("# team keys\nk-file\n")
    admin = tmp_path / "admin"
    admin.write_text("a-file\n")
    config = load_config(
        ["--api-key", "k-flag", "--api-key-file", str(keys), "--admin-key-file", str(admin)],
        environ={"SWITCHYARD_API_KEYS": "k-env1,k-env2", "SWITCHYARD_ADMIN_KEY": "a-env"},
    )
    assert [k.get_secret_value() for k in config.api_keys] == ["k-flag", "k-env1", "k-env2", "k-file"]
    assert [k.get_secret_value() for k in config.admin_keys] == ["a-env", "a-file"]
    with pytest.raises(ConfigError, match=r"cannot read the API key file .*check the path"):
        load_config(["--api-key-file", str(tmp_path / "missing")], environ={})
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ConfigError, match="holds no key; write one key per line"):
        load_config(["--admin-key-file", str(tmp_path / "empty")], environ={})


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--http-port", "eighty"],
            {},
            (
                r"setting 'http_port' \(--http-port\): .*integer \(got 'eighty'\); "
                r"give --http-port a valid value"
            ),
        ),
        ([], {"SWITCHYARD_HTTP_PORT": "70000"}, r"\(SWITCHYARD_HTTP_PORT\): .*less than or equal to 65535"),
        ([], {"SWITCHYARD_CONSOLE": "maybe"}, r"\(SWITCHYARD_CONSOLE\): Input should be a valid boolean"),
        ([], {"SWITCHYARD_LOG_FORMAT": "xml"}, r"\(SWITCHYARD_LOG_FORMAT\): Input should be 'text' or 'json'"),
        ([], {"SWITCHYARD_STREAM_SEND_TIMEOUT_S": "0"}, r"\(SWITCHYARD_STREAM_SEND_TIMEOUT_S\): .*greater than 0"),
        (["--max-body-bytes", "10"], {}, r"greater than or equal to 1024 \(got '10'\)"),
    ],
)
def test_a_wrong_value_names_its_source_and_the_fix(argv: list[str], env: dict, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config(argv, environ=env)


def test_secrets_are_not_echoed() -> None:
    with pytest.raises(ConfigError, match="setting 'api_keys'") as info:
        build_config(api_keys=["sk-1", 12345678])
    assert "12345678" not in str(info.value) and "sk-1" not in str(info.value)


def test_main_exits_2_with_the_message(monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr("gateway.server.request_log.setup_logging", lambda *a, **k: None)
    monkeypatch.setenv("SWITCHYARD_GRPC_PORT", "-1")
    with caplog.at_level(logging.ERROR):
        assert main(["serve"]) == 2
    assert "setting 'grpc_port' (SWITCHYARD_GRPC_PORT)" in caplog.text
