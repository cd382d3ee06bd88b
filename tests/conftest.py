"""Set-up shared by every test file.

The per-machine cache (``models.cache_dir()``: backend choice, step times, compiled libraries,
calibrations, converted models) is moved to a temporary folder for the whole test run, through
``$SPECDEMO_CACHE`` in ``os.environ`` so that child processes (``python -m specdemo ...``, the
app) inherit it too; the user's own cache is left untouched. Converted built-in models that are
already fresh in the user's cache are linked in (a fresh folder is only read, never written), so
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

#: the cache folder the user's environment names (before the test run moves it); tests read it
USER_CACHE: Path | None = None
#: the test run's temporary cache folder
TEST_CACHE: Path | None = None
_BEFORE = os.environ.get("SPECDEMO_CACHE")


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
    global USER_CACHE, TEST_CACHE
    USER_CACHE = builtin.cache_dir()
    fresh = _fresh_builtins()
    TEST_CACHE = Path(tempfile.mkdtemp(prefix="specdemo-test-cache-"))
    os.environ["SPECDEMO_CACHE"] = str(TEST_CACHE)
    for name in fresh:  # only read while fresh; a rebuild replaces the link, not its target
        (TEST_CACHE / name).symlink_to(USER_CACHE / name, target_is_directory=True)


def pytest_unconfigure(config):
    if TEST_CACHE is not None:
        shutil.rmtree(TEST_CACHE, ignore_errors=True)  # removes links, never their targets
    if _BEFORE is None:
        os.environ.pop("SPECDEMO_CACHE", None)
    else:
        os.environ["SPECDEMO_CACHE"] = _BEFORE
