"""The documentation holds together: every relative link of the README and of ``docs/``
reaches a file (and, with ``#anchor``, a heading of it), and ``docs/configuration.md``'s
table is what ``fedsys keys --markdown`` prints today."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fedsys_launch import config_schema
from fedsys_launch.commands.cli import main

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces to '-'."""
    text = heading.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of ``page``'s headings (outside code blocks)."""
    return {slug(line.lstrip("#")) for line in _prose(page) if re.match(r"#{1,6} ", line)}


def _prose(page: Path) -> list[str]:
    """``page``'s lines outside fenced code blocks."""
    out, fenced = [], False
    for line in page.read_text().splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
            continue
        if not fenced:
            out.append(line)
    return out


def links(page: Path) -> list[str]:
    """The relative link targets of ``page``'s prose (no URL scheme)."""
    return [t for line in _prose(page) for t in LINK.findall(line)
            if not re.match(r"^[a-z][a-z+.-]*:", t)]


def test_the_slug_is_githubs():
    assert slug("What `make run` does") == "what-make-run-does"
    assert slug("Flower's compat API (`NumPyClient`)") == "flowers-compat-api-numpyclient"
    assert slug("11. What fedsys refuses, and why") == "11-what-fedsys-refuses-and-why"


@pytest.mark.parametrize("page", PAGES, ids=[str(p.relative_to(ROOT)) for p in PAGES])
def test_every_relative_link_reaches_its_file_and_heading(page):
    broken = []
    for target in links(page):
        path, _, frag = target.partition("#")
        dest = (page.parent / path).resolve() if path else page
        if not dest.exists():
            broken.append(f"{target}: no {dest.relative_to(ROOT) if dest.is_relative_to(ROOT) else dest}")
        elif frag and dest.suffix == ".md" and frag not in anchors(dest):
            broken.append(f"{target}: no heading '#{frag}' in {dest.relative_to(ROOT)}")
    assert not broken, "\n".join(broken)


def test_the_readme_links_the_reference():
    text = (ROOT / "README.md").read_text()
    for page in ("docs/methods.md", "docs/usage.md", "docs/configuration.md",
                 "docs/flower-apps.md", "docs/deployment.md", "docs/results/README.md",
                 "docs/performance.md", "docs/extending.md", "docs/development.md"):
        assert f"]({page})" in text, page


def test_the_configuration_page_is_fedsys_keys(capsys):
    assert main(["keys", "--markdown"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == config_schema.describe_markdown()
    page = (ROOT / "docs" / "configuration.md").read_text()
    table = page[page.index("| key | default |"):].strip()
    assert table == printed, ("docs/configuration.md is not what `fedsys keys --markdown` prints: "
                              "regenerate its table")
    assert "| `ray-address` |" in table and "| `fedcda.memory` |" in table
