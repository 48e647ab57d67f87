"""Every relative link of README.md and docs/*.md resolves: the file it names exists, and its
``#anchor`` is a heading (GitHub's slug) or an ``<a id>`` of that file. The README and the docs
never mention what is no part of the project."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)\)")
FENCE = re.compile(r"^(```|~~~)")


def _prose(text: str) -> str:
    """The text outside fenced code blocks and inline code spans."""
    out, fenced = [], False
    for line in text.splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            out.append(re.sub(r"`[^`]*`", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, markup and punctuation dropped, spaces to -."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading.strip())
    text = text.replace("`", "").replace("*", "").lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in path.read_text().splitlines():
        if FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        m = re.match(r"#{1,6}\s+(.*)", line)
        if m:
            base = slug(m.group(1))
            n = seen.get(base, 0)
            seen[base] = n + 1
            found.add(base if n == 0 else f"{base}-{n}")
        found.update(re.findall(r'<a id="([^"]+)"', line))
    return found


def links(path: Path) -> list[str]:
    return LINK.findall(_prose(path.read_text()))


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_and_anchor_resolves(page: Path) -> None:
    broken = []
    for target in links(page):
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            continue
        file_part, _, anchor = target.partition("#")
        dest = (page.parent / file_part).resolve() if file_part else page
        if not dest.exists():
            broken.append(f"{target}: no such file")
            continue
        if anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            broken.append(f"{target}: no such anchor in {dest.relative_to(ROOT)}")
    assert not broken, broken


def test_the_checker_sees_links_and_anchors() -> None:
    readme_links = links(ROOT / "README.md")
    assert any(t.startswith("docs/") for t in readme_links), readme_links
    assert any("#" in t for t in readme_links), readme_links
    assert "exact-limits" in anchors(ROOT / "docs" / "guarantees.md")
    assert slug("Checking the setup: `jobqueue check`") == "checking-the-setup-jobqueue-check"
    assert slug("Per-key and per-task concurrency caps, per-key rates") == (
        "per-key-and-per-task-concurrency-caps-per-key-rates")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_page_mentions_what_is_no_part_of_the_project(page: Path) -> None:
    text = page.read_text().lower()
    for word in ("seed", "../shared"):
        assert word not in text, f"{page.name} mentions {word!r}"
