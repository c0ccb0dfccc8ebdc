"""Every `run` block of the README and docs/ runs against the session's real server and succeeds.

Python blocks run with this interpreter; sh blocks with bash (`set -euo pipefail`), `switchyard` and `python` on
this interpreter and this checkout, and `curl` set to fail on an HTTP error status. The address the docs use,
127.0.0.1:8000 / localhost:8000, becomes the test server's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.docs.markdown import PAGES, ROOT, Block, blocks

RUN_BLOCKS = [b for page in PAGES for b in blocks(page) if b.role == "run"]


def _code(block: Block, base_url: str) -> str:
    address = base_url.removeprefix("http://")
    return block.code.replace("127.0.0.1:8000", address).replace("localhost:8000", address)


@pytest.fixture(scope="module")
def env(base_url: str, tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    curl_home = tmp_path_factory.mktemp("curl")
    (curl_home / ".curlrc").write_text("fail-with-body\nmax-time = 300\n")
    return {
        **os.environ,
        "CURL_HOME": str(curl_home),
        "PYTHONPATH": str(ROOT),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
    }


@pytest.mark.parametrize("block", RUN_BLOCKS, ids=lambda b: b.name)
def test_block_runs(block: Block, base_url: str, env: dict[str, str]) -> None:
    code = _code(block, base_url)
    if block.lang == "python":
        cmd = [sys.executable, "-c", code]
    else:
        cmd = ["bash", "-c", "set -euo pipefail\n" + code]
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f"{block.name} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-3000:]}"
    )
    assert done.stdout.strip(), f"{block.name} printed nothing"
