"""A tensor model under the rate limiter: each instance gets a gate with its group's resources and priority, the
dynamic and sequence batchers wait on it (counted in the model's statistics), the config shows it, and unloading
gives the resources back."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from gateway.errors import ConfigError
from gateway.repository.layout import find_model_dir
from gateway.repository.model_config import parse_model_config
from gateway.scheduler.tensor.rate_limiter import RateLimiter, ResourceLimit
from gateway.tensor.model import TensorModel

ROOT = Path(__file__).resolve().parents[3]
LIMITER = ' rate_limiter { resources [ { name: "R" count: 2 }, { name: "G" global: true count: 1 } ] priority: 3 }'


def model(repo: Path, name: str, limiter: RateLimiter) -> TensorModel:
    model_dir = find_model_dir(repo, name)
    assert model_dir is not None
    return TensorModel(model_dir, parse_model_config(model_dir.config_path, name), limiter)  # type: ignore[arg-type]


def copy_with_limiter(tmp_path: Path, name: str) -> None:
    shutil.copytree(ROOT / "tests" / "kserve_repository" / name, tmp_path / name)
    path = tmp_path / name / "config.pbtxt"
    text = path.read_text()
    path.write_text(
        text.replace("kind: KIND_CPU }", "kind: KIND_CPU" + LIMITER + " }")
        if "instance_group" in text
        else text + "\ninstance_group [ { count: 2 kind: KIND_CPU" + LIMITER + " } ]\n"
    )


async def test_dynamic_and_sequence_batchers_wait_on_their_gates(tmp_path: Path) -> None:
    limiter = RateLimiter()
    copy_with_limiter(tmp_path, "batch_probe")
    copy_with_limiter(tmp_path, "accumulator")
    probe, acc = model(tmp_path, "batch_probe", limiter), model(tmp_path, "accumulator", limiter)
    probe.load()
    from gateway.tensor.schedulers import scheduler_factory

    acc.load(scheduler_factory(lambda name: None))
    gates = probe.versions[1].gates + acc.versions[1].gates
    assert len(gates) == 4 and {g.priority for g in gates} == {3}
    assert gates[0].needs == {("R", 0): 2, ("G", None): 1}
    assert {(n, d): a for n, d, a, _ in limiter.snapshot()} == {("G", None): 1, ("R", 0): 2}
    group = probe.config_json()["instance_group"][0]
    assert group["rate_limiter"] == {
        "resources": [{"name": "R", "global": False, "count": 2}, {"name": "G", "global": True, "count": 1}],
        "priority": 3,
    }
    await probe.start()
    await acc.start()
    try:
        out = await probe.versions[1].batcher.infer({"X": np.array([[3]], dtype=np.int64)})
        assert out["Y"].tolist() == [[30]]
        params = {"sequence_id": 7, "sequence_start": True, "sequence_end": True}
        out = await acc.versions[1].batcher.infer({"IN": np.array([[5]], dtype=np.int32)}, parameters=params)
        assert out["OUT"].tolist() == [[5]]
        assert probe.versions[1].stats.rate_limiter.count == 1 and acc.versions[1].stats.rate_limiter.count == 1
        assert all(used == 0 for *_, used in limiter.snapshot())  # given back after each batch
    finally:
        await probe.stop()
        await acc.stop()
    assert limiter.snapshot() == []  # unloaded instances no longer count


def test_too_large_a_need_fails_the_load_and_registers_nothing(tmp_path: Path) -> None:
    limiter = RateLimiter([ResourceLimit.parse("G:0")])
    copy_with_limiter(tmp_path, "batch_probe")
    probe = model(tmp_path, "batch_probe", limiter)
    try:
        probe.load()
    except ConfigError as exc:
        assert "config.pbtxt" in str(exc) and "needs 1 of rate limiter resource 'G'" in str(exc)
    else:
        raise AssertionError("the load should fail")
    assert limiter.snapshot() == [] and probe.versions == {}
