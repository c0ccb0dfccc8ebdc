"""The `openai` backend's config section (an upstream used as it is): accepted shapes, the key from the
environment or a file, and errors that say the fix without showing a key."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.passthrough.engine import PassthroughSettings
from gateway.errors import ConfigError
from gateway.repository.async_engines import build_async_scheduler
from gateway.repository.layout import ModelDir
from gateway.repository.model_config import ModelConfig, parse_model_config
from gateway.scheduler.llm.passthrough import PassthroughScheduler

SECRET = "sk-test-0123456789"


def write(tmp_path: Path, text: str, name: str = "m") -> tuple[ModelDir, Path]:
    folder = tmp_path / name
    folder.mkdir(exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(text)
    return ModelDir(name, folder, path, ()), path


def test_the_section_with_its_defaults(tmp_path: Path) -> None:
    model, path = write(tmp_path, "backend: openai\nopenai:\n  base_url: http://llama:8080/v1\n")
    config = parse_model_config(path, model.name)
    assert isinstance(config, ModelConfig) and config.openai is not None
    assert config.openai.read_timeout_seconds == 600 and config.openai.max_connections == 64


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("backend: openai\n", "needs an 'openai:' section"),
        ("openai:\n  base_url: http://x:1/v1\n", "needs 'backend: openai'"),
        ("backend: openai\nopenai:\n  base_url: llama:8080\n", "not an http(s) URL"),
        ("backend: openai\nopenai:\n  base_url: http://x:1/v1\n  api_key_env: 'MY-KEY'\n", "environment variable name"),
        ("backend: openai\nopenai:\n  base_url: http://x:1/v1\n  api_key_env: K\n  api_key_file: k.txt\n", "keep one"),
        ("backend: openai\nopenai:\n  base_url: http://x:1/v1\n  timeout: 3\n", "remove it or check its spelling"),
    ],
)
def test_errors_say_the_fix(tmp_path: Path, text: str, says: str) -> None:
    model, path = write(tmp_path, text)
    with pytest.raises(ConfigError, match="openai") as caught:
        parse_model_config(path, model.name)
    assert says in str(caught.value)


def _settings(tmp_path: Path, section: str) -> PassthroughSettings:
    # 127.0.0.1:9 (discard) answers nothing: the context-length probe fails fast and the model still builds
    model, path = write(
        tmp_path, f"backend: openai\nmax_model_len: 4096\nopenai:\n  base_url: http://127.0.0.1:9\n{section}"
    )
    config = parse_model_config(path, model.name)
    assert isinstance(config, ModelConfig)
    scheduler = build_async_scheduler(model, config, tmp_path)
    assert isinstance(scheduler, PassthroughScheduler) and scheduler.info.max_model_len == 4096
    return scheduler.engine._settings  # type: ignore[attr-defined]


def test_the_key_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UPSTREAM_KEY", SECRET)
    settings = _settings(tmp_path, "  api_key_env: UPSTREAM_KEY\n  model: their-name\n")
    assert settings.api_key == SECRET and settings.model == "their-name"
    assert settings.root == "http://127.0.0.1:9/v1"  # a URL without a path gets /v1
    assert SECRET not in repr(settings)


def test_the_key_comes_from_a_file_beside_the_config(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "key.txt").write_text(f"\n{SECRET}\n")
    assert _settings(tmp_path, "  api_key_file: key.txt\n").api_key == SECRET


def test_a_missing_key_names_where_it_was_looked_for(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("UPSTREAM_KEY", raising=False)
    with pytest.raises(ConfigError, match="UPSTREAM_KEY is not set"):
        _settings(tmp_path, "  api_key_env: UPSTREAM_KEY\n")
    with pytest.raises(ConfigError, match=r"cannot read nothere\.txt"):
        _settings(tmp_path, "  api_key_file: nothere.txt\n")
