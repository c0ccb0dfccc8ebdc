"""Fuzz the readers of hostile files and bodies: GGUF (layout and the engine built from it), config.pbtxt,
config.yaml and KServe's binary tensor body (bench/fuzz_targets.py says what each target runs and promises).

    python bench/fuzz_gguf.py --inputs 100000                 # the long run: 100,000 GGUF layout inputs
    python bench/fuzz_gguf.py --targets all --seconds 600     # every target, 10 minutes each
    python bench/fuzz_gguf.py --targets gguf-loader --inputs 200 --save fuzz-out/

Reports each target's inputs by outcome (accepted, refused, and the defects: crash, hang, overallocation) with the
first defects' details, and exits 1 when any target found one. The process's address space is capped at what it
holds after the imports plus `--memory-gib` (an allocation past it fails as a crash instead of reaching the OOM
killer). A C fault kills the process: `--save DIR` keeps the input being run as `DIR/last-<target>.bin`.
`--json FILE` writes the reports (what tests/bench/test_fuzz_gguf.py reads).
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.fuzz_targets import DEFECTS, fuzz, targets  # noqa: E402

DEFAULT_TARGETS = ("gguf-layout",)


def _cap_address_space(extra_gib: float) -> None:
    held = 0
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmSize:"):
            held = int(line.split()[1]) * 1024
    hard = resource.getrlimit(resource.RLIMIT_AS)[1]
    cap = held + int(extra_gib * (1 << 30))
    if hard != resource.RLIM_INFINITY:
        cap = min(cap, hard)
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--targets",
        default=",".join(DEFAULT_TARGETS),
        help="comma-separated targets, or 'all' (gguf-layout, gguf-loader, config-pbtxt, config-yaml, kserve-body)",
    )
    parser.add_argument("--inputs", type=int, help="inputs per target")
    parser.add_argument("--seconds", type=float, help="seconds per target (with --inputs: whichever ends first)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--cache",
        type=Path,
        default=Path(tempfile.gettempdir()) / "switchyard-fuzz-seeds",
        help="where the seed files are made once",
    )
    parser.add_argument("--save", type=Path, help="keep the running input and each defect's input here")
    parser.add_argument("--json", type=Path, help="write the reports here")
    parser.add_argument("--memory-gib", type=float, default=4.0)
    args = parser.parse_args(argv)
    if args.inputs is None and args.seconds is None:
        parser.error("give --inputs or --seconds")
    found = targets()
    names = list(found) if args.targets == "all" else args.targets.split(",")
    unknown = [n for n in names if n not in found]
    if unknown:
        parser.error(f"unknown targets {unknown}; choose from {', '.join(found)}")
    # the seeds first (the tiny llama reads SmolLM2's vocabulary: seconds), the imports of every target too
    for name in names:
        found[name].seeds(args.cache)
    import engines.pytorch.engine  # noqa: F401
    import gateway.kserve.codec  # noqa: F401
    import gateway.repository.model_config  # noqa: F401

    _cap_address_space(args.memory_gib)
    reports = []
    with tempfile.TemporaryDirectory(prefix="switchyard-fuzz-") as tmp:
        for name in names:
            report = fuzz(
                found[name],
                Path(tmp) / name,
                args.cache,
                inputs=args.inputs,
                seconds=args.seconds,
                seed=args.seed,
                save=args.save,
            )
            reports.append(report)
            counts = ", ".join(f"{k} {v}" for k, v in sorted(report.outcomes.items()))
            print(
                f"{name}: {report.inputs} inputs ({counts}); slowest {report.slowest:.2f} s, "
                f"peak {report.peak / 2**20:.1f} MiB",
                flush=True,
            )
            for defect in report.defects:
                print(f"  {defect['kind']}: {defect['detail'][-1500:]}\n  input: {defect['input'] or '(not saved)'}")
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in reports], indent=1))
    return 1 if any(r.outcomes.get(k) for r in reports for k in DEFECTS) else 0


if __name__ == "__main__":
    raise SystemExit(main())
