"""The documentation: the README's two commands come first, and every relative link
and anchor in the Markdown files resolves (anchors as GitHub makes them)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", ROOT / "BENCHMARKS.md", *sorted((ROOT / "docs").rglob("*.md"))]
FIRST_COMMANDS = [
    'bash scripts/setup.sh && .venv/bin/kvtrim ask resources/samples/passkey.txt --question "What '
    'is the pass key? Give the number." --answer-prefix "The pass key is"',
    "bash scripts/setup.sh && .venv/bin/python -m pytest -q -n 2 --dist loadfile",
]
FENCE = re.compile(r"^```.*?^```", re.S | re.M)
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, links and punctuation dropped,
    spaces as hyphens."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip().lower())
    return "".join(c for c in text if c.isalnum() or c in " -_").replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """Every heading's anchor; a repeated one gets -1, -2, as on GitHub."""
    seen: dict[str, int] = {}
    out = set()
    for line in FENCE.sub("", page.read_text()).splitlines():
        found = re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if found:
            name = slug(found.group(1))
            n = seen.get(name, 0)
            seen[name] = n + 1
            out.add(name if n == 0 else f"{name}-{n}")
    return out


def test_the_readme_opens_with_its_two_commands():
    blocks = re.findall(r"^```bash\n(.*?)\n```", (ROOT / "README.md").read_text(), re.S | re.M)
    assert blocks[:2] == FIRST_COMMANDS
    assert FIRST_COMMANDS[1] in (ROOT / ".ci" / "run").read_text().splitlines(), "CI runs it"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page):
    broken = []
    for target in LINK.findall(FENCE.sub("", page.read_text())):
        if re.match(r"^[a-z]+:", target):
            continue  # a web address
        path, _, anchor = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists() or (anchor and dest.suffix == ".md" and anchor not in anchors(dest)):
            broken.append(target)
    assert not broken, f"{page.name}: {broken}"
