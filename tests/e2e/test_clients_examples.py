"""Every script in examples/ runs against the real server and prints what its docstring promises."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT

EXPECTED = {
    "openai_chat.py": ["Paris", "usage:"],
    "openai_streaming.py": ["tokens]"],
    "openai_completions.py": ["Paris"],
    "openai_embeddings.py": ["dimensions: 384", "truncated: 128 dims"],
    "openai_tools.py": ["finish_reason: tool_calls", "get_weather({'city':", "answer:"],
    "openai_structured_output.py": ["{'city': 'Paris'", "Person(name="],
    "langchain_chat.py": ["Paris", "City(name=", "'name': 'get_weather'"],
    "llamaindex_chat.py": ["Paris"],
}


def test_every_example_is_covered() -> None:
    scripts = {p.name for p in (ROOT / "examples").glob("*.py") if not p.name.startswith("_")}
    assert scripts == set(EXPECTED)


@pytest.mark.parametrize("script", sorted(EXPECTED))
def test_example_runs(base_url: str, script: str) -> None:
    env = {**os.environ, "SWITCHYARD_BASE_URL": f"{base_url}/v1"}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / script)], env=env, capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    for marker in EXPECTED[script]:
        assert marker in done.stdout, done.stdout
