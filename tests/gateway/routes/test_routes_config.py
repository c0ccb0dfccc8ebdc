"""The routes file: shorthands, defaults, and errors that name the route, the field and the fix."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.routes.config import load_routes


def _load(tmp_path: Path, text: str):  # noqa: ANN202 - RoutesFile
    path = tmp_path / "routes.yaml"
    path.write_text(text)
    return load_routes(path)


def test_aliases_and_lists_are_shorthands(tmp_path: Path) -> None:
    routes = _load(tmp_path, "routes:\n  gpt-4o-mini: smollm2-135m-instruct\n  chat: [a, b]\n").routes
    assert [t.model for t in routes["gpt-4o-mini"].targets] == ["smollm2-135m-instruct"]
    chat = routes["chat"]
    assert [t.model for t in chat.targets] == ["a", "b"]
    assert chat.strategy == "ordered" and chat.retries == 0
    assert chat.fallback_on == ["connect", "timeout", "429", "5xx"] and chat.retry_on == ["connect", "429"]


def test_a_full_route(tmp_path: Path) -> None:
    route = _load(
        tmp_path,
        """\
routes:
  canary:
    strategy: weighted
    targets: [{model: stable, weight: 9}, {model: candidate, weight: 1}]
    fallback_on: [connect, 5xx]
    retries: 2
    retry_on: [429]
    backoff: {initial_seconds: 0.1, multiplier: 3, max_seconds: 1, jitter: 0}
    timeout_seconds: 5
""",
    ).routes["canary"]
    assert [t.weight for t in route.targets] == [9, 1]
    assert route.backoff.multiplier == 3 and route.timeout_seconds == 5


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("routes:\n  r: {targets: [a, a]}\n", "targets name a more than once"),
        ("routes:\n  r: {targets: [{model: a, weight: 2}, b]}\n", "strategy: weighted"),
        ("routes:\n  r: {targets: [a], fallback_on: [500]}\n", "routes.r.fallback_on.0"),
        ("routes:\n  r: {targets: [a], retrys: 2}\n", "remove it or check its spelling"),
        ("routes:\n  r: {targets: []}\n", "routes.r.targets"),
        ("- a\n", "top level must be a mapping"),
        ("routes: [\n", "not valid YAML"),
    ],
)
def test_errors_say_the_fix(tmp_path: Path, text: str, says: str) -> None:
    with pytest.raises(ConfigError, match="routes") as caught:
        _load(tmp_path, text)
    assert says in str(caught.value)


def test_a_missing_file_names_the_flag(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--routes"):
        load_routes(tmp_path / "nowhere.yaml")


def test_the_docs_examples_are_valid_routes_files(tmp_path: Path) -> None:
    doc = Path(__file__).resolve().parents[3] / "docs" / "routes.md"
    blocks = re.findall(r"```yaml norun: a routes file[^\n]*\n(.*?)```", doc.read_text(), re.S)
    assert blocks
    for block in blocks:
        assert _load(tmp_path, block).routes
