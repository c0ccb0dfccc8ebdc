"""The CPU budget (engines/cpu_budget.py) from a faked affinity mask and faked cgroup v1 / v2 files."""

from __future__ import annotations

from pathlib import Path

import pytest

from engines.cpu_budget import CpuBudget, cgroup_limit, detect


def v2(
    tmp_path: Path,
    cpu_max: str | None,
    cgroup: str = "/kubepods/pod1/ctr",
    parent_max: str | None = None,
) -> tuple[Path, Path]:
    """A unified hierarchy with this process in `cgroup`; `cpu_max` its cpu.max, `parent_max` its parent's."""
    root = tmp_path / "sys-fs-cgroup"
    leaf = root.joinpath(*cgroup.strip("/").split("/"))
    leaf.mkdir(parents=True)
    (root / "cgroup.controllers").write_text("cpuset cpu io memory pids\n")
    if cpu_max is not None:
        (leaf / "cpu.max").write_text(cpu_max + "\n")
    if parent_max is not None:
        (leaf.parent / "cpu.max").write_text(parent_max + "\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"0::{cgroup}\n")
    return proc, root


def v1(
    tmp_path: Path, quota: int, period: int = 100000, cgroup: str = "/docker/abc", controllers: str = "cpu,cpuacct"
) -> tuple[Path, Path]:
    """A v1 cpu hierarchy mounted at <root>/<controllers> with this process in `cgroup`."""
    root = tmp_path / "sys-fs-cgroup"
    leaf = (root / controllers).joinpath(*cgroup.strip("/").split("/"))
    leaf.mkdir(parents=True)
    (root / controllers / "cpu.cfs_quota_us").write_text("-1\n")  # the root: no limit
    (root / controllers / "cpu.cfs_period_us").write_text("100000\n")
    (leaf / "cpu.cfs_quota_us").write_text(f"{quota}\n")
    (leaf / "cpu.cfs_period_us").write_text(f"{period}\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text(f"12:memory:/docker/abc\n4:{controllers}:{cgroup}\n1:name=systemd:/docker/abc\n0::/\n")
    return proc, root


@pytest.mark.parametrize("cpus", [1, 2, 4, 16, 64])
def test_affinity_alone_gives_every_cpu_in_the_mask(tmp_path: Path, cpus: int) -> None:
    proc, root = v2(tmp_path, "max 100000")
    budget = detect(affinity=cpus, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.source, budget.quota, budget.cpus) == (cpus, "affinity", None, cpus)
    assert f"{cpus} CPUs in the affinity mask" in budget.reason


@pytest.mark.parametrize("quota_cpus", [1, 2, 4, 16])
def test_v2_quota_narrows_a_64_cpu_mask(tmp_path: Path, quota_cpus: int) -> None:
    proc, root = v2(tmp_path, f"{quota_cpus * 100000} 100000")
    budget = detect(affinity=64, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.source, budget.cpus) == (quota_cpus, "cgroup", quota_cpus)
    assert budget.quota is not None and budget.quota.path.endswith("ctr/cpu.max")


@pytest.mark.parametrize("quota_cpus", [1, 2, 4, 16])
def test_v1_quota_narrows_a_64_cpu_mask(tmp_path: Path, quota_cpus: int) -> None:
    proc, root = v1(tmp_path, quota_cpus * 50000, period=50000)
    budget = detect(affinity=64, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.source, budget.cpus) == (quota_cpus, "cgroup", quota_cpus)
    assert budget.quota is not None and budget.quota.path.endswith("abc/cpu.cfs_quota_us")


@pytest.mark.parametrize(
    ("cpu_max", "threads", "cpus"),
    [
        ("150000 100000", 1, 1.5),
        ("250000 100000", 2, 2.5),
        ("390000 100000", 3, 3.9),
    ],
)
def test_fractional_quota_keeps_whole_cpus_for_compute(tmp_path: Path, cpu_max: str, threads: int, cpus: float) -> None:
    proc, root = v2(tmp_path, cpu_max)
    budget = detect(affinity=16, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.cpus) == (threads, cpus)
    assert f"the fraction above {threads} whole CPU" in budget.reason


def test_quota_below_one_cpu_still_gets_one_thread(tmp_path: Path) -> None:
    proc, root = v2(tmp_path, "50000 100000")
    budget = detect(affinity=16, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.cpus) == (1, 0.5)
    assert "below one CPU" in budget.reason


def test_v1_fractional_quota(tmp_path: Path) -> None:
    proc, root = v1(tmp_path, 150000, controllers="cpu")
    budget = detect(affinity=4, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.cpus) == (1, 1.5)


def test_quota_above_the_mask_changes_nothing(tmp_path: Path) -> None:
    proc, root = v2(tmp_path, "800000 100000")
    budget = detect(affinity=2, environ={}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.source, budget.cpus) == (2, "affinity", 2)
    assert "does not narrow it" in budget.reason


def test_a_parent_cgroup_limit_applies(tmp_path: Path) -> None:
    """A pod's limit sits on the pod's cgroup; the container's own may be unlimited."""
    proc, root = v2(tmp_path, "max 100000", parent_max="400000 100000")
    assert detect(affinity=64, environ={}, proc_cgroup=proc, cgroup_root=root).threads == 4
    proc, root = v2(tmp_path / "tighter-child", "200000 100000", parent_max="400000 100000")
    assert detect(affinity=64, environ={}, proc_cgroup=proc, cgroup_root=root).threads == 2


def test_container_with_its_own_cgroup_mounted(tmp_path: Path) -> None:
    """/proc/self/cgroup names the host's path, but the mount is the container's cgroup itself."""
    root = tmp_path / "sys-fs-cgroup"
    root.mkdir()
    (root / "cgroup.controllers").write_text("cpu\n")
    (root / "cpu.max").write_text("300000 100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("0::/kubepods.slice/kubepods-pod1.slice/cri-containerd-abc.scope\n")
    assert detect(affinity=64, environ={}, proc_cgroup=proc, cgroup_root=root).threads == 3


def test_hybrid_layout_reads_the_unified_mount(tmp_path: Path) -> None:
    root = tmp_path / "sys-fs-cgroup"
    (root / "unified" / "svc").mkdir(parents=True)
    (root / "unified" / "cgroup.controllers").write_text("cpu\n")
    (root / "unified" / "svc" / "cpu.max").write_text("200000 100000\n")
    proc = tmp_path / "proc-self-cgroup"
    proc.write_text("1:name=systemd:/svc\n0::/svc\n")
    limit = cgroup_limit(proc, root)
    assert limit is not None and limit.cpus == 2


def test_no_cgroup_files_means_no_quota(tmp_path: Path) -> None:
    assert cgroup_limit(tmp_path / "missing", tmp_path) is None
    budget = detect(affinity=4, environ={}, proc_cgroup=tmp_path / "missing", cgroup_root=tmp_path)
    assert (budget.threads, budget.quota) == (4, None)


@pytest.mark.parametrize(
    ("cpu_max", "omp", "threads"), [(None, "3", 3), ("400000 100000", "2", 2), ("150000 100000", "1", 1)]
)
def test_omp_num_threads_overrides(tmp_path: Path, cpu_max: str | None, omp: str, threads: int) -> None:
    proc, root = v2(tmp_path, cpu_max)
    budget = detect(affinity=16, environ={"OMP_NUM_THREADS": omp}, proc_cgroup=proc, cgroup_root=root)
    assert (budget.threads, budget.source) == (threads, "OMP_NUM_THREADS")
    assert budget.reason.startswith(f"OMP_NUM_THREADS={omp} (detected: ")
    assert "oversubscribes" not in budget.reason


def test_override_above_the_cpus_is_honoured_and_said_to_oversubscribe(tmp_path: Path) -> None:
    proc, root = v2(tmp_path, "200000 100000")
    budget = detect(affinity=64, environ={"OMP_NUM_THREADS": "8"}, proc_cgroup=proc, cgroup_root=root)
    assert budget.threads == 8 and "oversubscribes the 2 CPUs" in budget.reason
    config = budget.with_override(4, "pytorch.gemm_threads")
    assert (config.threads, config.source) == (4, "pytorch.gemm_threads")
    assert budget.with_override(None, "pytorch.gemm_threads") is budget


@pytest.mark.parametrize("omp", ["zero", "0", "-2"])
def test_bad_omp_num_threads_says_how_to_fix_it(tmp_path: Path, omp: str) -> None:
    with pytest.raises(ValueError, match="OMP_NUM_THREADS"):
        detect(affinity=2, environ={"OMP_NUM_THREADS": omp}, proc_cgroup=tmp_path / "x", cgroup_root=tmp_path)


def test_override_below_one_is_refused() -> None:
    budget = CpuBudget(2, 2, None, "affinity", "2 CPUs in the affinity mask")
    with pytest.raises(ValueError, match=r"pytorch\.gemm_threads must be at least 1"):
        budget.with_override(0, "pytorch.gemm_threads")
