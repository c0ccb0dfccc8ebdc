"""The README stays a short read, the docs stand alone in the repository, and their config examples are valid."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest
import yaml

from gateway.repository.model_config import validate_model_config
from gateway.repository.pbtxt import parse_pbtxt
from tests.docs.markdown import PAGES, README, ROOT, Block, blocks, links
from tests.docs.markdown import anchors as heading_anchors

README_MAX_BYTES = 8000  # a five-minute read; the rest belongs in docs/
ALL_BLOCKS = [b for page in PAGES for b in blocks(page)]
CONFIG_BLOCKS = [b for b in ALL_BLOCKS if b.role == "config"]


def _rel(page: Path) -> str:
    return str(page.relative_to(ROOT))


def test_the_readme_is_short() -> None:
    size = len(README.read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes; move details into docs/ (bound {README_MAX_BYTES})"


def _block_under(heading: str) -> Block:
    text = README.read_text(encoding="utf-8")
    start = text.index(heading + "\n")
    section = text[start:]
    assert section.index("```") < section.index("\n## ", 1), f"{heading} lost its code block"
    return next(b for b in blocks(README) if b.line > text[:start].count("\n"))


def _first_block_under(heading: str) -> list[str]:
    return _block_under(heading).code.splitlines()


QUICKSTART = _block_under("## Quickstart")


def test_the_readme_keeps_the_quickstart_and_vllm_commands() -> None:
    """.ci/run takes the test command from the second line of the first block under `## Quickstart`, and makes the
    vLLM group's venv with the line under `## The vLLM backend` (the documented vLLM install)."""
    lines = _first_block_under("## Quickstart")
    assert len(lines) == 2 and lines[0].endswith("switchyard serve --model-repository model_repository")
    assert lines[1].endswith("python -m pytest -q")
    (vllm,) = _first_block_under("## The vLLM backend")
    assert "pip install torch==2.13.0 '.[vllm]'" in vllm and ". .venv-vllm/bin/activate" in vllm
    assert 'pytest -q -m "not slow"' in README.read_text(encoding="utf-8")  # the fast lane is announced


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_link_leaves_the_repository(page: Path) -> None:
    text = page.read_text(encoding="utf-8")
    assert "../" + "shared" not in text, f"{_rel(page)} refers to files outside the repository"
    for target in links(page):
        if re.match(r"^[a-z]+:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#")[0]).resolve()
        assert path.is_relative_to(ROOT), f"{_rel(page)}: {target} points outside the repository"
        if page == README:
            assert not target.startswith("../"), f"README.md: {target}"


def _repository_text_files() -> list[Path]:
    """Source, docs, deployment and CI files of the checkout (virtual environments, caches and .git pruned)."""
    out = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [
            d
            for d in dirs
            if not d.startswith(".venv")
            and d not in {".git", "__pycache__", "node_modules"}
            and not d.endswith(".egg-info")
        ]
        out += [
            Path(folder, f)
            for f in files
            if f.endswith((".py", ".md", ".sh", ".yaml", ".yml", ".toml", ".txt", ".pbtxt", ".json"))
            or f.startswith("Dockerfile")
            or f == "run"
        ]
    return out


def test_nothing_in_the_repository_points_outside_it() -> None:
    """The design notes the project started from are not part of it: a clone must stand on its own."""
    outside = re.compile(re.escape("../" + "shared") + "|" + re.escape("DESIGN" + ".md"))
    found = [
        f"{_rel(path)}:{n}"
        for path in _repository_text_files()
        for n, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1)
        if outside.search(line)
    ]
    assert not found, f"references to files outside the repository: {found}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_every_relative_link_resolves(page: Path) -> None:
    for target in links(page):
        if re.match(r"^[a-z]+:", target):
            continue
        file, _, anchor = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        assert path.exists(), f"{_rel(page)}: {target} does not exist"
        if anchor and path.suffix == ".md":
            assert anchor in heading_anchors(path), f"{_rel(page)}: no heading for #{anchor} in {_rel(path)}"


@pytest.mark.parametrize("page", PAGES, ids=_rel)
def test_no_history_dated_by_working_session(page: Path) -> None:
    """Figures' history is in git; the docs say what is true now."""
    text = page.read_text(encoding="utf-8")
    for pattern in (
        r"\b20\d\d-\d\d-\d\d\b",
        r"\b(?:night|evening|morning|first|second) session\b",
        r"\bthis session\b",
        r"\btoday\b",
    ):
        found = re.search(pattern, text, flags=re.I)
        assert found is None, f"{_rel(page)}: '{found.group(0)}' dates the text by working session"


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.name)
def test_every_code_block_says_whether_it_runs(block) -> None:  # type: ignore[no-untyped-def]
    if block.lang in {"text", "mermaid"} or block == QUICKSTART:
        return  # the Quickstart keeps a bare fence (readers copy it as is); .ci/run runs its test line
    assert block.role in {"run", "config", "norun"}, (
        f"{block.name}: info string '{block.lang} {block.role}' must say run, config or norun: <why> (docs/testing.md)"
    )
    if block.role == "norun":
        assert block.reason, f"{block.name}: say why it cannot run (norun: <why>)"
    if block.role == "run":
        assert block.lang in {"python", "sh"}, f"{block.name}: only python and sh blocks can run"


def test_the_docs_have_blocks_that_run() -> None:
    assert sum(b.role == "run" for b in ALL_BLOCKS) >= 5 and CONFIG_BLOCKS


@pytest.mark.parametrize("block", CONFIG_BLOCKS, ids=lambda b: b.name)
def test_config_examples_are_valid(block) -> None:  # type: ignore[no-untyped-def]
    """A config block is what a model folder's config.yaml / config.pbtxt may hold, as the server reads it."""
    if block.lang == "yaml":
        raw = yaml.safe_load(block.code)
        validate_model_config(raw, block.name, raw.get("name", "model"))
    else:
        assert block.lang == "protobuf", f"{block.name}: a config block is yaml or protobuf (config.pbtxt)"
        raw = parse_pbtxt(block.code)
        validate_model_config(raw, block.name, raw.get("name", "model"), tensor=True)
