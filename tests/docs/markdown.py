"""The README and docs/ as the tests see them: fenced code blocks with their roles, and links.

Every fenced block says in its info string what it is (docs/testing.md): `<lang> run` (run against the test
server), `<lang> config` (validated as a model configuration), `<lang> norun: <why>` (cannot run here), or the
languages `text` / `mermaid` (not code).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
NOT_CODE = {"text", "mermaid"}

_FENCE = re.compile(r"^(```+)(.*)$")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")


@dataclass(frozen=True)
class Block:
    page: Path
    line: int  # 1-based line of the opening fence
    lang: str
    role: str  # "run", "config", "norun", "" (not code) or anything else (a mistake the tests report)
    reason: str  # why a norun block cannot run
    code: str

    @property
    def name(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    """The fenced blocks of a Markdown page, at the top level (not indented)."""
    out: list[Block] = []
    lines = page.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        fence, info = match.group(1), match.group(2).strip()
        lang, _, rest = info.partition(" ")
        role, _, reason = rest.strip().partition(":")
        end = next((j for j in range(i + 1, len(lines)) if lines[j].startswith(fence)), len(lines))
        out.append(
            Block(
                page,
                i + 1,
                lang,
                "" if lang in NOT_CODE else role.strip(),
                reason.strip(),
                "\n".join(lines[i + 1 : end]) + "\n",
            )
        )
        i = end + 1
    return out


def links(page: Path) -> list[str]:
    """Targets of the page's Markdown links, outside code blocks and inline code."""
    text = page.read_text(encoding="utf-8")
    text = re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]*`", "", text)
    return _LINK.findall(text)


def anchors(page: Path) -> set[str]:
    """GitHub's anchors of the page's headings: lower case, punctuation dropped, spaces as hyphens."""
    text = re.sub(r"^```.*?^```", "", page.read_text(encoding="utf-8"), flags=re.S | re.M)
    return {
        re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
