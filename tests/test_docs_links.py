"""Every link from the README (and from the pages in docs/) to a file of this repository resolves,
and every link to a heading (``page.md#heading``, ``#heading``) names a heading of that page."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
FENCE = re.compile(r"^\s*(```|~~~)")
HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def local_links(page: Path, root: Path = ROOT) -> list[str]:
    """Targets of the page's markdown links and images that are files here (no URL, no anchor
    alone), relative to ``root``."""
    found = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
            continue
        path = (page.parent / target.split("#", 1)[0]).resolve()
        found.append(path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path))
    return found


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation other than ``-`` and ``_``
    dropped (backticks, colons, parentheses, apostrophes, ...), each space a hyphen."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    """The anchors of a markdown page's headings (outside code blocks), with GitHub's ``-1``,
    ``-2`` suffixes for repeated headings."""
    seen: dict[str, int] = {}
    out = set()
    in_code = False
    for line in page.read_text(encoding="utf-8").splitlines():
        if FENCE.match(line):
            in_code = not in_code
            continue
        m = None if in_code else HEADING.match(line)
        if m:
            base = slug(m.group(2))
            n = seen.get(base, 0)
            seen[base] = n + 1
            out.add(base if n == 0 else f"{base}-{n}")
    return out


def anchor_links(page: Path) -> list[tuple[Path, str]]:
    """(markdown page, anchor) for every link of ``page`` that names a heading."""
    found = []
    for target in LINK.findall(page.read_text(encoding="utf-8")):
        if re.match(r"[a-z][a-z0-9+.-]*:", target) or "#" not in target:
            continue
        file, anchor = target.split("#", 1)
        dest = (page.parent / file).resolve() if file else page
        if dest.suffix == ".md":
            found.append((dest, anchor))
    return found


def test_local_links_of_a_page(tmp_path):
    page = tmp_path / "docs" / "x.md"
    page.parent.mkdir()
    page.write_text("[a](../README.md) ![b](race.png) [c](https://example.org/x.md) [d](#top) "
                    "[e](reference.md#the-app) [f](results/ \"title\")")
    root = tmp_path.resolve()
    assert local_links(page.resolve(), root) == ["README.md", "docs/race.png", "docs/reference.md",
                                                 "docs/results"]


def test_anchors_follow_githubs_rule(tmp_path):
    page = tmp_path / "x.md"
    page.write_text("# Title\n## The native backend: our C forward\n```bash\n# not a heading\n```\n"
                    "### Speculation on the bench's five tasks (`bench --backend auto`)\n## Title\n")
    assert anchors(page) == {"title", "the-native-backend-our-c-forward",
                             "speculation-on-the-benchs-five-tasks-bench---backend-auto", "title-1"}


PAGES = [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").glob("*.md"))]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_local_link_resolves(page):
    links = local_links(page)
    if page.name == "README.md":
        assert "docs/design.md" in links and "docs/race.png" in links
    missing = [t for t in links if not (ROOT / t).exists()]
    assert missing == [], f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_every_link_to_a_heading_finds_it(page):
    wrong = [f"{dest.relative_to(ROOT).as_posix()}#{anchor}" for dest, anchor in anchor_links(page)
             if dest.exists() and anchor not in anchors(dest)]
    assert wrong == [], f"{page.relative_to(ROOT)} links to headings that do not exist: {wrong}"
