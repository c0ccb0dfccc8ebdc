"""docs/configuration.md's table of settings is the one `python -m gateway.server.settings_table` writes from
ServerConfig: a setting added, renamed or re-documented without rewriting the table fails here."""

from __future__ import annotations

from gateway.config import SETTINGS
from gateway.server.settings_table import DOC, render, rewritten


def test_the_docs_table_is_current() -> None:
    text = DOC.read_text()
    assert rewritten(text) == text, (
        "docs/configuration.md's settings table is stale: run python -m gateway.server.settings_table"
    )


def test_the_table_has_a_row_per_setting() -> None:
    table = render()
    for spec in SETTINGS.values():
        assert f"`{spec.env}`" in table
        if spec.flag:
            assert f"`{spec.flag}" in table
