"""A test run keeps out of the user's per-machine cache (tests/conftest.py): every file the
code under test stores there (backend choice, step times, compiled libraries) goes to a
temporary folder, in this process and in the child processes it starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import conftest
from specdemo.models import builtin
from specdemo.services import backend_store, startup

REPO = Path(__file__).resolve().parent.parent


def _under(path: Path, folder: Path) -> bool:
    return path.resolve().is_relative_to(folder.resolve())


def test_the_cache_is_a_temporary_folder_not_the_users():
    ours = conftest.TEST_CACHE
    assert ours is not None and ours.is_dir()
    assert builtin.cache_dir() == ours
    for user in {conftest.USER_CACHE, Path.home() / ".cache" / "specdemo"}:
        assert not _under(ours, user) and not _under(user, ours)
    # the files that choosing a backend and timing start-up steps write
    assert _under(backend_store.choice_path(), ours)
    assert _under(startup._times_path(), ours)


def test_child_processes_inherit_the_test_cache():
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run([sys.executable, "-c",
                          "from specdemo.models.builtin import cache_dir; print(cache_dir())"],
                         env=env, capture_output=True, text=True, check=True, cwd=REPO)
    assert Path(out.stdout.strip()) == conftest.TEST_CACHE


def test_a_test_may_still_name_its_own_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "own"))
    assert backend_store.choice_path() == tmp_path / "own" / backend_store.CHOICE_FILE
