"""The table of server settings in docs/configuration.md, written from `ServerConfig`'s declarations.

`python -m gateway.server.settings_table` rewrites the table between its two markers;
tests/gateway/server/test_settings_table.py fails while the file differs from what this would write, so the docs
cannot drift from the flags.
"""

from __future__ import annotations

import sys
from pathlib import Path

from gateway.config import SETTINGS, Setting

DOC = Path(__file__).resolve().parents[2] / "docs" / "configuration.md"
BEGIN = (
    "<!-- settings table: written by `python -m gateway.server.settings_table` from gateway/config.py; do not edit -->"
)
END = "<!-- end of the settings table -->"


def _flag(spec: Setting) -> str:
    if spec.flag is None:
        return "(environment only)"
    if spec.kind == "bool":
        return f"`{spec.flag}`, `--no-{spec.flag[2:]}`"
    value = "{" + ",".join(spec.choices) + "}" if spec.choices else spec.metavar
    text = f"`{spec.flag} {value}`" if value else f"`{spec.flag}`"
    return text + (" (repeatable)" if spec.kind == "list" else "")


def _env(spec: Setting) -> str:
    text = f"`{spec.env}`" + (" (comma-separated)" if spec.kind == "list" else "")
    return text + "".join(f", or `{alias}`" for alias in spec.env_aliases)


def _meaning(spec: Setting) -> str:
    return spec.help + (f" ([{spec.doc.split('#')[0]}]({spec.doc}))" if spec.doc else "")


def render() -> str:
    """The table, markers included."""
    rows = [
        f"| {_flag(s)} | {_env(s)} | {s.shown_default} | {_meaning(s).replace('|', '&#124;')} |"
        for s in SETTINGS.values()
    ]
    return "\n".join(
        [BEGIN, "", "| flag | environment variable | default | meaning |", "| --- | --- | --- | --- |", *rows, "", END]
    )


def rewritten(text: str) -> str:
    """`text` with its settings table replaced by the current one."""
    if BEGIN not in text or END not in text:
        raise SystemExit(f"{DOC} has no settings table markers; put these two lines where it goes:\n{BEGIN}\n{END}")
    head, rest = text.split(BEGIN, 1)
    return head + render() + rest.split(END, 1)[1]


def main() -> int:
    old = DOC.read_text()
    new = rewritten(old)
    if new != old:
        DOC.write_text(new)
        print(f"updated {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
