"""Test modules have unique basenames: tests/ has no packages, so pytest imports each module by its basename, and two
files of the same name stop the whole run at collection (the fast lane, which skips the slow paths, would not see
a clash with a module under tests/e2e/)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parent


def test_no_two_test_modules_share_a_basename() -> None:
    by_name: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if "vendor" not in path.relative_to(TESTS).parts:
            by_name[path.name].append(str(path.relative_to(TESTS)))
    clashes = {name: paths for name, paths in by_name.items() if len(paths) > 1}
    assert not clashes, f"rename one of each (pytest imports test modules by basename): {clashes}"


def test_no_test_module_shadows_a_package() -> None:
    """pytest puts each test module's folder on sys.path, so a folder of tests beside one named for an installed
    package (tests/engines/vllm beside a module in tests/engines) turns `import vllm` into that folder."""
    shadowing = []
    for path in TESTS.rglob("test_*.py"):
        for sibling in path.parent.iterdir():
            if sibling.is_dir() and sibling.name in {"vllm", "tensorrt_llm", "onnxruntime", "tensorflow", "ray"}:
                shadowing.append(f"{path.relative_to(TESTS)} beside {sibling.relative_to(TESTS)}/")
    assert not shadowing, f"move these modules into a subfolder: {sorted(set(shadowing))}"
