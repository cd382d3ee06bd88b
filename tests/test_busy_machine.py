"""A race or ``compare`` timed while other processes used the CPU says so: each lane's
``other_cpu_share`` in the stats and the JSON, and a warning beside the speedup (page chip,
``compare`` text line, ``warnings`` in both JSONs). Tiny models; the shares are set by hand."""

import json

import pytest

import specdemo.services.startup as startup
from specdemo.core import machine
from specdemo.interfaces.cli import main
from specdemo.core.engine import decode
from specdemo.core.kv import KVModel
from specdemo.core.machine import OtherCpuUse
from specdemo.services.pipeline import DecodeSettings, Pipeline
from specdemo.services.race import PLAIN, SPECULATIVE, Race
from specdemo.interfaces.ui_format import verdict_html
from test_race import PROMPT, FakeLoaded, lanes
from tiny import CharTokenizer, tiny_llama

BUSY_PLAIN = ("machine busy: other processes used 43% of the CPU during the plain run; the "
              "speedup is not reliable")


def report_shares(monkeypatch, queue: list[float]) -> list[float]:
    """From now on, decodes report these shares when they finish, in order (however short the
    decode); one decode more than planned fails the test (IndexError). Returns ``queue``."""
    monkeypatch.setattr(machine, "MIN_MEASURED_S", 0.0)
    monkeypatch.setattr(OtherCpuUse, "share", lambda self: queue.pop(0))
    return queue


@pytest.fixture
def shares(monkeypatch):
    return report_shares(monkeypatch, [])


@pytest.fixture(scope="module")
def loaded():
    return FakeLoaded(tiny_llama(seed=0, layers=2))


def test_the_final_event_carries_the_share_and_earlier_ones_do_not(shares):
    shares.append(0.31)
    tok = CharTokenizer()
    events = list(decode(KVModel(tiny_llama(seed=0, layers=1)), tok.encode(PROMPT), tok,
                         max_new_tokens=6))
    assert [e.stats.other_cpu_share for e in events[:-1]] == [None] * (len(events) - 1)
    assert events[-1].done and events[-1].stats.other_cpu_share == 0.31
    assert events[-1].stats.as_dict()["other_cpu_share"] == 0.31
    assert shares == []  # measured once per decode


def test_a_decode_too_short_to_measure_reports_null(monkeypatch):
    monkeypatch.setattr(machine, "MIN_MEASURED_S", 1e9)
    monkeypatch.setattr(OtherCpuUse, "share", lambda self: pytest.fail("not measurable"))
    tok = CharTokenizer()
    result = Pipeline(FakeLoaded(tiny_llama(seed=0, layers=1)), "ngram").run(
        tok.encode(PROMPT), DecodeSettings(max_new_tokens=4), True)
    assert result.stats.other_cpu_share is None


def test_compare_warns_when_a_run_shared_the_machine(shares, loaded, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    # compare's untimed warm-ups decode too (tests/test_warmup.py); only the timed runs count here
    monkeypatch.setattr(startup, "prepare_timed", lambda *args, **kwargs: None)
    command = ["compare", "--target", str(tmp_path), "--draft", "self", "--prompt", PROMPT,
               "--max-new-tokens", "12", "--draft-length", "3"]  # a folder passes --target's check
    shares += [0.43, 0.02]  # plain runs first
    assert main(command + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["plain"]["other_cpu_share"] == 0.43
    assert out["speculative"]["other_cpu_share"] == 0.02
    assert out["warnings"] == [BUSY_PLAIN]
    shares += [0.43, 0.02]
    assert main(command) == 0
    text = capsys.readouterr().out.splitlines()
    assert text[-1] == "warning: " + BUSY_PLAIN
    assert text[-3].startswith("speedup: ") and text[-2].startswith("why: ")
    assert any(line.startswith("[plain] ") and line.endswith(" other_cpu_share=0.43")
               for line in text)
    shares += [0.1, 0.2]  # a quiet machine: no warning
    assert main(command + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["warnings"] == []


def warmed_lanes(loaded, draft_length=3):
    """Lanes over pipelines warmed up already for this draft length and prompt, so that the
    race decodes only the two timed runs (each takes one share from the queue)."""
    plain, spec = Pipeline(loaded, "none"), Pipeline(loaded, "self")
    ids = CharTokenizer().encode(PROMPT)
    startup.prepare_timed(plain, False, draft_length, ids)
    startup.prepare_timed(spec, True, draft_length, ids)
    return lanes(loaded, plain=lambda: plain, spec=lambda: spec)


SETTINGS = DecodeSettings(max_new_tokens=12, draft_length=3)


def test_race_warns_beside_the_speedup_once_a_busy_lane_finished(loaded, monkeypatch):
    race_lanes = warmed_lanes(loaded)
    report_shares(monkeypatch, [0.02, 0.43])
    snaps = list(Race(race_lanes, SETTINGS).run(min_interval_s=0.0))
    final = snaps[-1]
    assert final.panes[PLAIN].stats.other_cpu_share == 0.02
    assert final.panes[SPECULATIVE].stats.other_cpu_share == 0.43
    assert final.warnings == ("machine busy: other processes used 43% of the CPU during the "
                              "speculative run; the speedup is not reliable",)
    # Until the speculative lane's final event, nothing was known to be wrong.
    spec_final = [s.panes[SPECULATIVE].stats is not None
                  and s.panes[SPECULATIVE].stats.finish_reason is not None for s in snaps]
    assert [bool(s.warnings) for s in snaps] == spec_final
    page = verdict_html(final, 0.0)
    speedup_at, warning_at = page.index('class="sd-chip sd-speedup"'), page.index("sd-busy")
    assert speedup_at < warning_at < page.index("sd-lossless")  # next to the speedup
    assert "⚠ " + final.warnings[0] in page
    assert 'title="other_cpu_share: plain 0.02, speculative 0.43"' in page


def test_a_quiet_race_shows_no_warning(loaded, monkeypatch):
    race_lanes = warmed_lanes(loaded)
    report_shares(monkeypatch, [0.25, 0.25])  # at the threshold: not above it
    final = list(Race(race_lanes, SETTINGS).run(min_interval_s=0.0))[-1]
    assert final.warnings == () and final.speedup is not None
    assert "sd-busy" not in verdict_html(final, 0.0)


def test_race_api_json_has_each_lanes_share_and_the_warnings(loaded, monkeypatch):
    from specdemo.interfaces import ui_race
    race_lanes = warmed_lanes(loaded, 2)
    monkeypatch.setattr(ui_race, "_new_race", lambda prompt, system, preset, draft, settings,
                        conv, request, backend=None, endpoints=None: Race(race_lanes, settings))
    report_shares(monkeypatch, [0.5, 0.3])
    result = ui_race.race_api(PROMPT, max_new_tokens=8, draft_length="2")
    assert result["plain"]["other_cpu_share"] == 0.5
    assert result["speculative"]["other_cpu_share"] == 0.3
    # the setting, beside each lane's last-round k (draft_length) and its mean over the rounds
    spec = result["speculative"]
    assert result["draft_length_setting"] == 2 and spec["rounds"] > 0
    assert spec["mean_draft_length"] == spec["draft_length_sum"] / spec["rounds"]
    assert result["warnings"] == [
        "machine busy: other processes used 50% of the CPU during the plain run and 30% during "
        "the speculative run; the speedup is not reliable"]
    json.dumps(result, allow_nan=False)
