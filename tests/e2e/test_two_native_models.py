"""Two native models of different settings in one server (bench/two_models_bench.py), under concurrent load on
both for about a minute: every greedy answer equals the model's answer served alone, and resident memory does not
grow after warm-up (each model's step replay records on its own thread over the same kernel libraries)."""

from __future__ import annotations

from pathlib import Path

from bench import two_models_bench


def test_two_native_models_answer_as_alone_with_flat_memory(tmp_path: Path) -> None:
    report = two_models_bench.soak(tmp_path, seconds=75, clients=2)
    print("\n".join(report.lines()))
    assert not report.errors, report.errors[:3]
    assert not report.mismatches, report.mismatches[:3]
    assert all(n >= 2 * len(two_models_bench.PROMPTS) for n in report.requests.values()), report.requests
    assert report.growth <= 0.02, report.lines()
