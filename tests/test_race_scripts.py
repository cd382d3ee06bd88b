"""scripts/first_race.py and scripts/race_screenshots.py run the app as app.py does: one
``AppSettings`` built from their flags (``--backend`` default ``auto``, as app.py's) and passed to
the preload and the page; first_race's ``--json`` says the backend the races ran on;
race_screenshots says how to install selenium when it is missing, before anything starts."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "scripts"))
import first_race  # noqa: E402
import race_screenshots  # noqa: E402


class Stop(Exception):
    """Raised by a stand-in to end a script's main before it races."""


def stopped_preload(monkeypatch, seen: dict) -> None:
    """``ui_state.start_preload`` that records its arguments and reports a failed preload (each
    script then exits 2 before any race)."""
    from specdemo.interfaces import ui_state
    done = threading.Event()
    done.set()

    def start_preload(preset_name=None, app=ui_state.AppSettings()):
        seen["preload"] = (preset_name, app)
        return done
    monkeypatch.setattr(ui_state, "start_preload", start_preload)
    monkeypatch.setitem(ui_state._PRELOAD, "error", "stopped by the test")


class FakeDemo:
    def close(self) -> None:
        pass


@pytest.mark.parametrize("argv, backend", [([], "auto"), (["--backend", "native-w8a8"], "native-w8a8")])
def test_first_race_passes_its_settings_to_the_page_and_the_preload(monkeypatch, argv, backend):
    from specdemo.interfaces import ui
    seen: dict = {}
    stopped_preload(monkeypatch, seen)

    def build_ui(app=None):
        seen["page"] = app
        return FakeDemo()
    monkeypatch.setattr(ui, "build_ui", build_ui)
    monkeypatch.setattr(ui, "launch", lambda demo, **kw: None)
    assert first_race.main(argv) == 2
    assert seen["page"].backend == backend
    assert seen["preload"][1] is seen["page"]


def test_first_race_json_says_the_backend_the_races_ran_on():
    def race(speedup: float) -> dict:
        lane = {"tokens_per_s": 100.0, "ttft_s": 0.1, "other_cpu_share": 0.0}
        return {"plain": lane, "speculative": lane, "backend": "native-w8a8", "speedup": speedup,
                "identical": True, "warnings": []}
    seen = first_race.summary([race(1.2), race(1.0), race(1.1)], "auto")
    assert seen["backend"] == {"setting": "auto", "ran_on": ["native-w8a8"]}
    assert [r["backend"] for r in seen["races"]] == ["native-w8a8"] * 3
    assert seen["first_over_later_median"] == pytest.approx(1.2 / 1.05)


@pytest.mark.parametrize("argv, backend", [([], "auto"), (["--backend", "native-w8a8"], "native-w8a8")])
def test_race_screenshots_passes_its_settings_to_the_preload(monkeypatch, tmp_path, argv, backend):
    pytest.importorskip("selenium")
    seen: dict = {}
    stopped_preload(monkeypatch, seen)
    monkeypatch.setattr(race_screenshots, "missing_tools", lambda: None)
    monkeypatch.setattr(race_screenshots.shutil, "which", lambda name: name)
    assert race_screenshots.main([*argv, "--out", str(tmp_path)]) == 2
    assert seen["preload"][1].backend == backend


def test_race_screenshots_says_how_to_install_selenium(monkeypatch, capsys):
    """Without selenium: exit 2 at once with one sentence naming both ways to install it."""
    monkeypatch.setattr(race_screenshots.shutil, "which", lambda name: name)
    monkeypatch.setitem(sys.modules, "selenium", None)  # import selenium raises ImportError
    assert race_screenshots.main([]) == 2
    err = capsys.readouterr().err
    assert "scripts/setup.sh test" in err and "pip install selenium" in err
