"""Session set-up shared by every test file.

The per-machine cache (``models.cache_dir()``: backend choice, step times, compiled libraries,
calibrations, converted models) is moved to a temporary folder for the whole session, through
``$SPECDEMO_CACHE`` in ``os.environ`` so that child processes (``python -m specdemo ...``, the
app) inherit it too; the user's own cache is left untouched. Converted built-in models that are
already fresh in the user's cache are linked in read-only use (a fresh folder is only read), so
the slow tests do not pay the 20-40 s conversion again; a stale or missing one is converted
inside the temporary folder. Tests that test the cache itself set their own folder with
``monkeypatch.setenv("SPECDEMO_CACHE", ...)`` as before.
"""

import os
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

from specdemo.models import builtin  # noqa: E402  (torch-free: names and manifests only)

#: the cache folder the user's environment names (before the session moves it); tests read it
USER_CACHE: Path | None = None
#: the session's temporary cache folder
SESSION_CACHE: Path | None = None


def _fresh_builtins() -> list[str]:
    """Names of the built-in models whose converted copy in the current ``cache_dir()`` is fresh
    (manifest and file sizes only, milliseconds)."""
    names = []
    for name in builtin.builtin_names():
        try:
            if builtin.builtin_conversion_needed(f"builtin:{name}") is None:
                names.append(name)
        except Exception:  # its wheel is not installed: nothing to reuse
            pass
    return names


def pytest_configure(config):
    global USER_CACHE, SESSION_CACHE
    USER_CACHE = builtin.cache_dir()
    fresh = _fresh_builtins()
    SESSION_CACHE = Path(tempfile.mkdtemp(prefix="specdemo-test-cache-"))
    os.environ["SPECDEMO_CACHE"] = str(SESSION_CACHE)
    for name in fresh:  # only read while fresh; a rebuild replaces the link, not its target
        (SESSION_CACHE / name).symlink_to(USER_CACHE / name, target_is_directory=True)


def pytest_unconfigure(config):
    if SESSION_CACHE is not None:
        shutil.rmtree(SESSION_CACHE, ignore_errors=True)  # removes links, never their targets
