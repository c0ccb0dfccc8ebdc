"""Model folders and names from the network: nothing outside the repository is ever reached."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.errors import ConfigError
from gateway.repository.layout import find_model_dir, is_valid_model_name, scan_repository


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    root = tmp_path / "repo"
    for name in ("good", "other"):
        (root / name / "1").mkdir(parents=True)
        (root / name / "3").mkdir()
        (root / name / "config.pbtxt").write_text('backend: "python"')
    (root / "not_a_model").mkdir()
    return root


@pytest.mark.parametrize(
    "name",
    ["..", ".", "../etc", "a/../b", "/etc/passwd", "%2e%2e%2f", "bad\x00name", "good\n", "", "a" * 200, "-x", "a\\b"],
)
def test_hostile_names_are_refused_before_the_file_system(repo: Path, name: str) -> None:
    assert not is_valid_model_name(name)
    with pytest.raises(ValueError):
        find_model_dir(repo, name)


def test_found_models_and_versions(repo: Path) -> None:
    model = find_model_dir(repo, "good")
    assert model is not None and model.versions == (1, 3) and model.config_path.name == "config.pbtxt"
    assert find_model_dir(repo, "missing") is None
    assert find_model_dir(repo, "not_a_model") is None
    assert [m.name for m in scan_repository(repo)] == ["good", "other"]


def test_symlink_leaving_the_repository_is_refused(repo: Path, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    (outside / "1").mkdir(parents=True)
    (outside / "config.pbtxt").write_text('backend: "python"')
    (repo / "escape").symlink_to(outside, target_is_directory=True)
    with pytest.raises(ConfigError, match="leaves the repository"):
        find_model_dir(repo, "escape")
    (repo / "inside").symlink_to(repo / "good", target_is_directory=True)  # a link within the repository is fine
    assert find_model_dir(repo, "inside") is not None


def test_config_file_symlinked_outside_is_refused(repo: Path, tmp_path: Path) -> None:
    secret = tmp_path / "secret.yaml"
    secret.write_text("backend: python\n")
    (repo / "linked" / "1").mkdir(parents=True)
    (repo / "linked" / "config.yaml").symlink_to(secret)
    with pytest.raises(ConfigError, match="leaves the repository"):
        find_model_dir(repo, "linked")


def test_two_config_files_are_ambiguous(repo: Path) -> None:
    (repo / "good" / "config.yaml").write_text("backend: python\n")
    with pytest.raises(ConfigError, match="keep one"):
        scan_repository(repo)
