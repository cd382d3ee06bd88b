"""The JSON of a race (``/race``, ``compare --json``, ``run --json``): which forward backend
ran, ``draft_length`` "auto" for the speculative lane under auto, and the same keys in every
lane, a skipped one included. Tiny models."""

import json

import pytest

import specdemo.services.startup as startup
from specdemo.interfaces.cli import main
from specdemo.models.loading import ModelLoadError
from specdemo.services.pipeline import DecodeSettings, Pipeline
from specdemo.services.race import PLAIN, SKIPPED, SPECULATIVE, Race, pane_dict, snapshot_dict
from test_race import PROMPT, FakeLoaded, lanes
from tiny import tiny_llama


@pytest.fixture(scope="module")
def loaded():
    return FakeLoaded(tiny_llama(seed=0, layers=2))


def test_race_api_names_the_backend_and_says_auto_for_the_speculative_draft_length(loaded,
                                                                                  monkeypatch):
    """Under auto the speculative lane's ``draft_length`` is "auto" (as the page shows), not
    its last round's k (0 once auto stopped drafting); ``mean_draft_length`` stays a number.
    ``backend`` names the backend the lanes ran on, top level and per lane."""
    from specdemo.interfaces import ui_race
    monkeypatch.setattr(ui_race, "_new_race", lambda prompt, system, preset, draft, settings,
                        conv, request, backend=None, endpoints=None: Race(lanes(loaded), settings))
    result = ui_race.race_api(PROMPT, max_new_tokens=10, draft_length="auto")
    plain, spec = result[PLAIN], result[SPECULATIVE]
    assert result["draft_length_setting"] == "auto" and spec["draft_length"] == "auto"
    assert plain["draft_length"] == 0
    assert spec["rounds"] > 0 and spec["mean_draft_length"] == pytest.approx(
        spec["draft_length_sum"] / spec["rounds"])
    assert result["backend"] == plain["backend"] == spec["backend"] == "transformers"
    json.dumps(result, allow_nan=False)
    result = ui_race.race_api(PROMPT, max_new_tokens=10, draft_length="2")  # a fixed k: its k
    assert result[SPECULATIVE]["draft_length"] in (1, 2)


def test_a_skipped_lane_carries_every_key_of_a_lane_that_ran(loaded):
    """A draft that cannot load: the plain lane is skipped, yet has ``new_tokens`` (0) and every
    other key a finished lane has, None or empty where nothing was measured."""
    def broken():
        raise ModelLoadError("could not load the draft: file missing")
    final = list(Race(lanes(loaded, spec=broken), DecodeSettings(max_new_tokens=6)).run())[-1]
    assert final.panes[PLAIN].status == SKIPPED
    out = snapshot_dict(final)
    done = pane_dict(list(Race(lanes(loaded), DecodeSettings(max_new_tokens=6)).run())[-1]
                     .panes[PLAIN])
    for name in (PLAIN, SPECULATIVE):
        assert set(out[name]) == set(done), name
        assert out[name]["new_tokens"] == 0 and out[name]["tokens_per_s"] is None
        assert out[name]["text"] == "" and out[name]["token_ids"] == []
        assert out[name]["backend"] is None
    assert out["backend"] is None and done["backend"] == "transformers"


@pytest.mark.parametrize("command", ["run", "compare"])
def test_run_and_compare_json_name_the_backend(command, loaded, monkeypatch, capsys, tmp_path):
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    monkeypatch.setattr(startup, "prepare_timed", lambda *args, **kwargs: None)
    assert main([command, "--target", str(tmp_path), "--draft", "ngram", "--prompt", PROMPT,
                 "--max-new-tokens", "6", "--draft-length", "2", "--backend", "transformers",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["backend"] == "transformers"
    lane = out if command == "run" else out[SPECULATIVE]
    assert lane["draft_length"] == 2  # the setting, not the last round's k (0 after a plain step)


def test_compare_says_a_divergence_is_expected_when_sampling(loaded, monkeypatch, capsys,
                                                             tmp_path):
    """At temperature > 0 the two runs draw different tokens (speculative sampling keeps the
    target's distribution, not the plain run's draws): "identical: no" says that is expected."""
    from specdemo.interfaces.decode_cli import SAMPLED
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    monkeypatch.setattr(startup, "prepare_timed", lambda *args, **kwargs: None)
    assert main(["compare", "--target", str(tmp_path), "--draft", "self", "--prompt", PROMPT,
                 "--max-new-tokens", "24", "--draft-length", "2", "--backend", "transformers",
                 "--temperature", "1.5", "--seed", "3"]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("speedup:"))
    assert "identical: no, first divergence" in line and line.endswith(SAMPLED), line


def test_every_lane_names_its_backend_and_auto_in_run_compare_and_race(loaded, monkeypatch,
                                                                      capsys, tmp_path):
    """A new user's report: ``compare --json``'s lanes had no ``backend`` and the speculative
    lane's ``draft_length`` was its last round's k under auto. Now each lane of ``run --json``,
    ``compare --json`` and ``/race`` carries the backend it ran on and ``draft_length`` "auto"
    (the speculative one), and the per-round k stays in ``mean_draft_length`` & co."""
    from specdemo.interfaces import ui_race
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    monkeypatch.setattr(startup, "prepare_timed", lambda *args, **kwargs: None)
    flags = ["--target", str(tmp_path), "--draft", "ngram", "--prompt", PROMPT,
             "--max-new-tokens", "8", "--draft-length", "auto", "--backend", "transformers",
             "--json"]
    assert main(["compare", *flags]) == 0
    compared = json.loads(capsys.readouterr().out)
    assert main(["run", *flags]) == 0
    ran = json.loads(capsys.readouterr().out)
    monkeypatch.setattr(ui_race, "_new_race", lambda prompt, system, preset, draft, settings,
                        conv, request, backend=None, endpoints=None: Race(lanes(loaded), settings))
    raced = ui_race.race_api(PROMPT, max_new_tokens=8, draft_length="auto")
    for out in (compared, raced):
        assert out[PLAIN]["backend"] == out[SPECULATIVE]["backend"] == out["backend"]
        assert out[SPECULATIVE]["draft_length"] == "auto"
        assert isinstance(out[PLAIN]["draft_length"], int)
        # the same keys per lane (a /race pane adds its status and error)
        assert set(out[SPECULATIVE]) - {"status", "error"} == set(compared[SPECULATIVE])
    assert compared["backend"] == ran["backend"] == "transformers"
    assert ran["draft_length"] == "auto" and set(ran) == set(compared[SPECULATIVE]) | {
        "offloaded_layers"}
    spec = compared[SPECULATIVE]
    assert spec["rounds"] > 0 and spec["mean_draft_length"] == pytest.approx(
        spec["draft_length_sum"] / spec["rounds"])
    assert 0 <= spec["draft_length_min"] <= spec["draft_length_max"]
