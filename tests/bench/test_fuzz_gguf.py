"""bench/fuzz_gguf.py over every target for a few seconds each: inputs run, some accepted and some refused, and no
crash, hang or allocation past what the input justifies (the long run: `python bench/fuzz_gguf.py --inputs
100000`; docs/reliability.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.fuzz_targets import DEFECTS, ROOT

pytestmark = pytest.mark.slow
SECONDS = 4  # per target: five targets, about half a minute with the imports and the seeds


def test_every_target_refuses_clearly(tmp_path: Path) -> None:
    out = tmp_path / "fuzz.json"
    done = subprocess.run(
        [
            sys.executable,
            "bench/fuzz_gguf.py",
            "--targets",
            "all",
            "--seconds",
            str(SECONDS),
            "--json",
            str(out),
            "--save",
            str(tmp_path / "inputs"),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert out.exists(), done.stdout[-3000:] + done.stderr[-3000:]
    reports = {r["target"]: r for r in json.loads(out.read_text())}
    assert set(reports) == {"gguf-layout", "gguf-loader", "config-pbtxt", "config-yaml", "kserve-body"}
    for name, report in reports.items():
        assert not any(report["outcomes"].get(kind) for kind in DEFECTS), (name, report["defects"][:3])
        assert report["outcomes"].get("refused"), (name, report["outcomes"])
    assert done.returncode == 0, done.stdout[-3000:]
