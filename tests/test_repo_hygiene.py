"""The repository reads as the product, not as the log of how it was built.

- No tracked text file speaks of the stints the work was done in: the words s[e]ssion(s),
  w[a]ve(s) and s[i]tting(s), alone or with a number (``w[a]ve-3``, ``s[e]ssion14``), any case.
  An identifier that contains such a word joined by ``_`` is not a word of prose and passes
  (gradio's ``s[e]ssion_hash``, huggingface_hub's ``get_s[e]ssion``, subprocess'
  ``start_new_s[e]ssion``); anything else is rephrased (e.g. "a run of the app", "a browser tab").
- No tracked text file names a path of a build machine (``/w[o]rk/...``, ``/r[o]ot/...``,
  ``/h[o]me/NAME``, ``/t[m]p/...``, ``/U[s]ers/NAME``): commands are written relative to the
  checkout, tests write under pytest's ``tmp_path``.
- docs/ holds pages (``*.md``), the README's picture and one results folder, fewer than 40
  files and under 2 MB in all, and every result in it is cited by a page (or the code); the
  README is at most 150 lines.

Files are those ``git ls-files`` lists; a file that is not UTF-8 text (images, archives, weights)
is not read.
"""

from __future__ import annotations

import importlib.util
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# The forbidden words and paths, the data files exempt from them and the text reader live in
# scripts/repo_counts.py, which counts the same offences for the before/after figures.
_spec = importlib.util.spec_from_file_location("repo_counts", ROOT / "scripts" / "repo_counts.py")
repo_counts = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(repo_counts)
WORDS, PATHS, DATA_FILES = repo_counts.WORDS, repo_counts.PATHS, repo_counts.DATA_FILES
text_of = repo_counts.text
DOCS_MAX_FILES = 40
DOCS_MAX_BYTES = 2_000_000
README_MAX_LINES = 150


def tracked_files() -> list[str]:
    """Paths ``git ls-files`` lists for the checkout (skips the test outside a git checkout)."""
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout (the rules are about tracked files)")
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True)
    return [p for p in out.stdout.decode().split("\0") if p]


def offences(pattern: re.Pattern, files: list[str]) -> list[str]:
    """``path:line: match`` for every match of ``pattern`` in the text files, and in their paths."""
    found = []
    for path in files:
        for m in pattern.finditer(path):
            found.append(f"{path}: (its path) {m.group(0)!r}")
        text = text_of(path)
        if text is None:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for m in pattern.finditer(line):
                found.append(f"{path}:{number}: {m.group(0)!r} in {line.strip()[:80]!r}")
    return found


def test_the_patterns_catch_what_they_should_and_nothing_else():
    said = ["the third " + "w" + "ave-3 s" + "ession", "Sess" + "ion 14",
            "docs/bench-learned/s" + "ession17/x", "S" + "ITTINGS", "ocean w" + "aves"]
    assert [bool(WORDS.search(s)) for s in said] == [True] * len(said)
    fine = ["request.session_hash", "get_session()", "start_new_session=True", "microwave",
            "build_wave2", "obsession", "waveform"]
    assert [bool(WORDS.search(s)) for s in fine] == [False] * len(fine)
    paths = ["cd /" + "work/main", "-o /" + "tmp/mm", "/" + "root/.cache", "/" + "home/alice/x",
             "C:\\" + "Users\\bob"]
    assert [bool(PATHS.search(s)) for s in paths] == [True] * len(paths)
    not_paths = ["~/.cache/specdemo", "/proc/stat", "/usr/bin/chromium", "https://example.org/tmp/x",
                 "tmp_path / 'x'", "docs/results/", "/home"]
    assert [bool(PATHS.search(s)) for s in not_paths] == [False] * len(not_paths)


#: data, not prose: the prompt set holds user requests that may use any word or path


def test_no_tracked_file_speaks_of_sittings():
    found = offences(WORDS, [f for f in tracked_files() if f not in DATA_FILES])
    assert found == [], "say what is true now (history goes to CHANGELOG.md by date):\n" + "\n".join(found)


def test_no_tracked_file_names_a_build_machines_paths():
    found = offences(PATHS, [f for f in tracked_files() if f not in DATA_FILES])
    assert found == [], "write paths relative to the checkout or under tmp_path:\n" + "\n".join(found)


def test_docs_are_pages_and_one_small_results_folder():
    docs = [p for p in tracked_files() if p.startswith("docs/")]
    others = [p for p in docs if not (p.count("/") == 1 and (p.endswith(".md") or p == "docs/race.png"))
              and not (p.startswith("docs/results/") and p.count("/") == 2)]
    assert others == [], f"docs/ holds pages, race.png and docs/results/ only: {others}"
    size = sum((ROOT / p).stat().st_size for p in docs if (ROOT / p).exists())
    assert len(docs) < DOCS_MAX_FILES, f"docs/ has {len(docs)} tracked files (fewer than {DOCS_MAX_FILES})"
    assert size < DOCS_MAX_BYTES, f"docs/ holds {size:,} bytes (under {DOCS_MAX_BYTES:,})"


def test_every_result_is_cited():
    """A file in docs/results/ that no page (and no code) names is clutter: delete it or cite it."""
    files = tracked_files()
    citing = [p for p in files if p.endswith(".md") or (p.startswith("specdemo/") and p.endswith(".py"))]
    text = "\n".join(t for t in map(text_of, citing) if t)
    uncited = [p for p in files if p.startswith("docs/results/") and Path(p).name not in text]
    assert uncited == [], f"results no page cites: {uncited}"


def test_the_readme_is_short():
    lines = (ROOT / "README.md").read_text(encoding="utf-8").splitlines()
    assert len(lines) <= README_MAX_LINES, (
        f"README.md has {len(lines)} lines (at most {README_MAX_LINES}): move detail to docs/")
