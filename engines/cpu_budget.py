"""How many CPUs this process may use for compute: the one place that decides it.

Read in order, each step able only to narrow what the one before allowed:
  1. the affinity mask (`sched_getaffinity`: taskset, cpusets, Kubernetes' static CPU manager);
  2. the cgroup CPU quota of this process's cgroup and every cgroup above it (v2 `cpu.max`, v1
     `cpu.cfs_quota_us / cpu.cfs_period_us`): a pod limited to 4 CPUs on a 64-core node sees 64 CPUs in its mask,
     but threads beyond its quota only get it throttled. A fractional quota (1.5 CPUs) gives its whole CPUs to
     compute threads (at least one) and leaves the fraction to the server's own work (HTTP, detokenization);
then explicit settings replace it: `OMP_NUM_THREADS`, then a config override (`pytorch.gemm_threads`). An
override above the CPUs the process has is honoured but said to oversubscribe.

The native engine sizes both its kernels' helper threads and torch's intra-op threads from this budget (see
engines/pytorch/engine.py); the gateway logs it at startup and exports it in /metrics.
"""

from __future__ import annotations

import functools
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

PROC_CGROUP = Path("/proc/self/cgroup")
CGROUP_ROOT = Path("/sys/fs/cgroup")


@dataclass(frozen=True)
class CpuLimit:
    """A cgroup CPU quota: `cpus` = quota / period, read from `path` (the file that set it)."""

    cpus: float
    path: str


@dataclass(frozen=True)
class CpuBudget:
    """`threads`: compute threads to run (>= 1). `affinity`: CPUs in the mask; `quota`: the tightest cgroup limit
    (None: unlimited); `source`: what decided `threads`; `reason`: one line saying why, for the startup log."""

    threads: int
    affinity: int
    quota: CpuLimit | None
    source: str
    reason: str

    @property
    def cpus(self) -> float:
        """The CPUs this process may use at all: its mask, capped by its quota (fractional)."""
        return min(float(self.affinity), self.quota.cpus) if self.quota else float(self.affinity)

    def with_override(self, threads: int | None, source: str) -> CpuBudget:
        """This budget with `threads` set explicitly (None: unchanged)."""
        if threads is None:
            return self
        if threads < 1:
            raise ValueError(f"{source} must be at least 1 (got {threads})")
        note = f"{source}={threads}"
        if threads > math.floor(self.cpus) and threads > 1:
            note += f" oversubscribes the {self.cpus:g} CPUs this process may use"
        return CpuBudget(threads, self.affinity, self.quota, source, f"{note} (detected: {self.reason})")


def _affinity() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _v2_limit(directory: Path) -> CpuLimit | None:
    """`cpu.max` is "max <period>" (no limit) or "<quota> <period>" in microseconds."""
    text = _read(directory / "cpu.max")
    if not text:
        return None
    parts = text.split()
    if parts[0] == "max":
        return None
    try:
        quota, period = int(parts[0]), int(parts[1]) if len(parts) > 1 else 100000
    except ValueError:
        return None
    return CpuLimit(quota / period, str(directory / "cpu.max")) if quota > 0 and period > 0 else None


def _v1_limit(directory: Path) -> CpuLimit | None:
    """`cpu.cfs_quota_us` is -1 (no limit) or the quota per `cpu.cfs_period_us`, in microseconds."""
    quota, period = _read(directory / "cpu.cfs_quota_us"), _read(directory / "cpu.cfs_period_us")
    try:
        q, p = int(quota or "-1"), int(period or "0")
    except ValueError:
        return None
    return CpuLimit(q / p, str(directory / "cpu.cfs_quota_us")) if q > 0 and p > 0 else None


def _chain(mount: Path, cgroup_path: str) -> list[Path]:
    """The cgroup's directory and each one above it, up to the mount. A path that is not under the mount (a
    container that sees the host's path but has its own cgroup mounted) leaves the mount alone: it is that cgroup."""
    parts = [p for p in cgroup_path.split("/") if p]
    dirs = [mount.joinpath(*parts[:i]) for i in range(len(parts), 0, -1)]
    return [d for d in dirs if d.is_dir()] + [mount]


def cgroup_limit(proc_cgroup: Path = PROC_CGROUP, cgroup_root: Path = CGROUP_ROOT) -> CpuLimit | None:
    """The tightest CPU quota over this process's cgroup and its ancestors (v2 and v1 hierarchies), or None."""
    text = _read(proc_cgroup)
    if text is None:
        return None
    limits: list[CpuLimit] = []
    for line in text.splitlines():
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        if hierarchy == "0" and controllers == "":  # cgroup v2 (unified): pure, or the hybrid layout's unified/
            for mount in (cgroup_root, cgroup_root / "unified"):
                if (mount / "cgroup.controllers").is_file():
                    limits += [lim for d in _chain(mount, path) if (lim := _v2_limit(d))]
                    break
        elif "cpu" in controllers.split(","):  # cgroup v1: cpu (often co-mounted with cpuacct)
            for name in (controllers, "cpu", "cpu,cpuacct", "cpuacct,cpu"):
                mount = cgroup_root / name
                if mount.is_dir():
                    limits += [lim for d in _chain(mount, path) if (lim := _v1_limit(d))]
                    break
    return min(limits, key=lambda lim: lim.cpus, default=None)


def _env_threads(environ: Mapping[str, str]) -> int | None:
    value = environ.get("OMP_NUM_THREADS", "").strip()
    if not value:
        return None
    try:
        threads = int(value.split(",")[0])  # OpenMP allows a list per nesting level; the first is ours
    except ValueError:
        raise ValueError(
            f"OMP_NUM_THREADS={value!r} is not a whole number: set it to the threads to use, "
            "or unset it to use every CPU this process may use"
        ) from None
    if threads < 1:
        raise ValueError(f"OMP_NUM_THREADS={value!r} must be at least 1")
    return threads


def detect(
    *,
    affinity: int | None = None,
    environ: Mapping[str, str] | None = None,
    proc_cgroup: Path = PROC_CGROUP,
    cgroup_root: Path = CGROUP_ROOT,
) -> CpuBudget:
    """The budget from the mask, the cgroup quota and OMP_NUM_THREADS (arguments replace the process's own, for
    tests). Raises ValueError for an OMP_NUM_THREADS that is not a positive whole number."""
    cpus = affinity if affinity is not None else _affinity()
    quota = cgroup_limit(proc_cgroup, cgroup_root)
    if quota is not None and quota.cpus < cpus:
        threads = max(1, math.floor(quota.cpus))
        source = "cgroup"
        reason = f"cgroup quota {quota.cpus:g} CPUs ({quota.path}) of {cpus} CPUs in the affinity mask"
        if quota.cpus < 1:
            reason += "; below one CPU: one compute thread, throttled to the quota"
        elif quota.cpus != threads:
            reason += f"; the fraction above {threads} whole CPU{'s' if threads > 1 else ''} is left to the server"
    else:
        threads, source = cpus, "affinity"
        reason = f"{cpus} CPUs in the affinity mask" + (
            f" (cgroup quota {quota.cpus:g} CPUs does not narrow it)" if quota else ", no cgroup CPU quota"
        )
    budget = CpuBudget(threads, cpus, quota, source, reason)
    return budget.with_override(_env_threads(os.environ if environ is None else environ), "OMP_NUM_THREADS")


@functools.cache
def cpu_budget() -> CpuBudget:
    """This process's budget, detected once (the mask and quota of a running process rarely change; a restart
    picks up new ones)."""
    return detect()
