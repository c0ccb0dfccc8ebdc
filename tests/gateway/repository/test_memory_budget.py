"""The memory budget's default (cgroup v2 and v1 limits over the process's cgroup and its ancestors, else the
machine), and models' estimated bytes from their files."""

from __future__ import annotations

from pathlib import Path

from gateway.repository.layout import ModelDir
from gateway.repository.memory_budget import cgroup_memory_limit, default_budget, estimate_bytes, fmt_bytes
from gateway.repository.model_config import validate_model_config


def cgroup_v2(tmp_path: Path, limits: dict[str, str]) -> tuple[Path, Path]:
    root = tmp_path / "cgroup"
    (root / "kubepods" / "pod1").mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpu memory\n")
    for rel, value in limits.items():
        (root / rel / "memory.max").write_text(value + "\n")
    proc = tmp_path / "proc_cgroup"
    proc.write_text("0::/kubepods/pod1\n")
    return proc, root


def test_cgroup_v2_takes_the_tightest_limit_up_the_tree(tmp_path: Path) -> None:
    proc, root = cgroup_v2(tmp_path, {"kubepods/pod1": "max", "kubepods": str(3 * 2**30), ".": "max"})
    limit = cgroup_memory_limit(proc, root)
    assert limit is not None and limit.bytes == 3 * 2**30 and "kubepods/memory.max" in limit.source
    assert default_budget(proc, root).bytes == 3 * 2**30  # below this machine's memory


def test_no_cgroup_limit_means_the_machine(tmp_path: Path) -> None:
    proc, root = cgroup_v2(tmp_path, {"kubepods/pod1": "max"})
    assert cgroup_memory_limit(proc, root) is None
    assert default_budget(proc, root).source == "the machine's memory"
    assert cgroup_memory_limit(tmp_path / "absent", root) is None


def test_cgroup_v1_limit_in_bytes(tmp_path: Path) -> None:
    root = tmp_path / "cgroup"
    (root / "memory" / "docker" / "abc").mkdir(parents=True)
    (root / "memory" / "docker" / "abc" / "memory.limit_in_bytes").write_text(str(2**31))
    (root / "memory" / "memory.limit_in_bytes").write_text("9223372036854771712")  # v1's "no limit"
    proc = tmp_path / "proc_cgroup"
    proc.write_text("5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n")
    limit = cgroup_memory_limit(proc, root)
    assert limit is not None and limit.bytes == 2**31


def test_tensor_model_estimate_is_its_files(tmp_path: Path) -> None:
    folder = tmp_path / "m"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.onnx").write_bytes(b"0" * 5000)
    (folder / "1" / "notes.md").write_text("not weights")
    (folder / "config.yaml").write_text("backend: onnxruntime\n")
    config = validate_model_config({"backend": "onnxruntime", "max_batch_size": 1}, "c", "m")
    assert estimate_bytes(ModelDir("m", folder, folder / "config.yaml", (1,)), config) == 5000


def test_llm_estimate_counts_dtype_and_the_kv_pool(tmp_path: Path) -> None:
    folder = tmp_path / "llm"
    (folder / "1").mkdir(parents=True)
    (folder / "1" / "model.safetensors").write_bytes(b"0" * 1000)
    (folder / "1" / "config.json").write_text(
        '{"torch_dtype": "bfloat16", "num_hidden_layers": 2, '
        '"num_attention_heads": 4, "num_key_value_heads": 2, "hidden_size": 64}'
    )
    model = ModelDir("llm", folder, folder / "config.yaml", (1,))
    config = validate_model_config(
        {"backend": "pytorch", "dtype": "float32", "kv_cache": {"max_tokens": 100}}, "c", "llm"
    )
    per_token = 2 * 2 * 2 * 16 * 4  # keys and values x layers x kv heads x head dim x float32
    assert estimate_bytes(model, config) == 2000 + 100 * per_token  # bfloat16 file -> float32 weights
    remote = validate_model_config({"backend": "remote", "remote": {"upstreams": ["http://h:1"]}}, "c", "llm")
    assert estimate_bytes(model, remote) == 0  # held by another process


def test_bytes_read_as_people_write_them() -> None:
    assert [fmt_bytes(n) for n in (512, 2048, 3 * 2**20, int(1.5 * 2**30))] == [
        "512 B",
        "2.0 KiB",
        "3.0 MiB",
        "1.5 GiB",
    ]
