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


# --- a new user's report: /race could not do what the page's controls do ---------------------

def _capture_race(monkeypatch, loaded, seen: dict):
    from specdemo.interfaces import ui_race

    def new_race(prompt, system, preset, draft, settings, conv, request, backend=None,
                 endpoints=None):
        seen.update(system=system, settings=settings)
        return Race(lanes(loaded), settings, system)
    monkeypatch.setattr(ui_race, "_new_race", new_race)
    return ui_race


def test_race_api_takes_the_pages_and_command_lines_sampling_controls(loaded, monkeypatch):
    """``system``, ``top_p``, ``top_k``, ``seed`` and ``repetition_penalty`` reach the race as
    the page's controls and ``compare``'s flags do, so a script can repeat a sampled race."""
    seen: dict = {}
    ui_race = _capture_race(monkeypatch, loaded, seen)
    kwargs = dict(max_new_tokens=12, temperature=1.2, draft_length="2", system="be brief",
                  top_p=0.9, top_k=5, seed=7, repetition_penalty=1.1)
    first = ui_race.race_api(PROMPT, **kwargs)
    s = seen["settings"]
    assert seen["system"] == "be brief"
    assert (s.top_p, s.top_k, s.seed, s.repetition_penalty) == (0.9, 5, 7, 1.1)
    again = ui_race.race_api(PROMPT, **kwargs)  # the same seed: the same sampled race
    for name in (PLAIN, SPECULATIVE):
        assert again[name]["token_ids"] == first[name]["token_ids"], name
    ui_race.race_api(PROMPT, max_new_tokens=4)  # the defaults: the page's and the CLI's
    s = seen["settings"]
    assert (s.top_p, s.top_k, s.seed, s.repetition_penalty) == (1.0, 0, None, 1.0)
    assert seen["system"] is None
    ui_race.race_api(PROMPT, max_new_tokens=4, seed=-1)  # the page's "random"
    assert seen["settings"].seed is None


@pytest.mark.parametrize("kwargs, message", [
    ({"top_p": 0}, "top_p must be a number above 0 and at most 1, got 0"),
    ({"top_p": 1.5}, "top_p must be a number above 0 and at most 1, got 1.5"),
    ({"top_k": -1}, "top_k must be a whole number of at least 0, got -1"),
    ({"top_k": 2.5}, "top_k must be a whole number of at least 0, got 2.5"),
    ({"seed": "x"}, "seed must be a whole number, got 'x'"),
    ({"repetition_penalty": 0}, "repetition_penalty must be a number above 0, got 0"),
    ({"system": "a \ud800"}, "system has a character that is not valid text at position 2"),
])
def test_race_api_refuses_bad_sampling_values_as_the_command_line(kwargs, message, loaded,
                                                                  monkeypatch):
    import gradio as gr
    seen: dict = {}
    ui_race = _capture_race(monkeypatch, loaded, seen)
    with pytest.raises(gr.Error) as caught:
        ui_race.race_api(PROMPT, max_new_tokens=4, **kwargs)
    assert message in str(caught.value)
    assert not seen  # refused before any race


def test_race_api_for_shows_the_new_parameters_to_gradio():
    """``gr.api`` reads the bound function's signature: the new keywords are there, ``app``
    is not, and gradio's API description lists them."""
    import inspect
    import gradio as gr
    from specdemo.interfaces.ui_race import race_api_for
    from specdemo.interfaces.ui_state import AppSettings
    bound = race_api_for(AppSettings())
    params = inspect.signature(bound).parameters
    assert {"system", "top_p", "top_k", "seed", "repetition_penalty"} <= set(params)
    assert "app" not in params and params["top_p"].default == 1.0 and params["seed"].default is None
    with gr.Blocks() as demo:
        gr.api(bound, api_name="race")
    info = demo.get_api_info()
    names = {p["parameter_name"] for p in info["named_endpoints"]["/race"]["parameters"]}
    assert {"system", "top_p", "top_k", "seed", "repetition_penalty", "prompt"} <= names


def test_a_sampled_race_gives_no_token_verdict_and_says_why(loaded, monkeypatch, capsys,
                                                           tmp_path):
    """``"identical": false, "first_divergence": 0`` beside ``"lossless_expected": true`` read as
    a contradiction: under sampling ``/race`` and ``compare --json`` give no token-for-token
    verdict (None, as the page's badge gives none) and ``lossless_note`` says why."""
    from specdemo.services.race import SAMPLED_NOTE
    ui_race = _capture_race(monkeypatch, loaded, {})
    raced = ui_race.race_api(PROMPT, max_new_tokens=12, temperature=1.5, seed=3,
                             draft_length="2")
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    monkeypatch.setattr(startup, "prepare_timed", lambda *args, **kwargs: None)
    assert main(["compare", "--target", str(tmp_path), "--draft", "self", "--prompt", PROMPT,
                 "--max-new-tokens", "12", "--draft-length", "2", "--backend", "transformers",
                 "--temperature", "1.5", "--seed", "3", "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    for out in (raced, compared):
        assert out["identical"] is None and out["first_divergence"] is None
        assert out["lossless_note"] == SAMPLED_NOTE
        assert "equal in distribution, not token for token" in out["lossless_note"]
    greedy = ui_race.race_api(PROMPT, max_new_tokens=12, draft_length="2")
    assert greedy["identical"] is True and greedy["lossless_note"] != SAMPLED_NOTE


def test_a_race_whose_runs_never_started_says_so_and_why(loaded, monkeypatch):
    """A prompt + ``max_new_tokens`` beyond the context: both panes carry the refusal, and the
    note said "the plain run did not finish; the speculative run did not finish" though
    neither ran. (The tiny model's config is not read up front: this is the later refusal.)"""
    from specdemo.checks import inputs
    monkeypatch.setattr(inputs, "fits_context", lambda field, n, target, **kw: n)
    ui_race = _capture_race(monkeypatch, loaded, {})
    result = ui_race.race_api(PROMPT, max_new_tokens=100000000)
    error = result[PLAIN]["error"]
    assert "exceeds the model's context" in error and result[SPECULATIVE]["error"] == error
    assert result["speedup_note"] == f"not compared: neither run started: {error}"
    assert "did not finish" not in result["speedup_note"]


def test_race_api_refuses_a_max_new_tokens_beyond_the_configs_context_up_front(loaded,
                                                                               monkeypatch):
    """The preset's target's context is read from its config without loading it: 100000000
    new tokens is refused as one sentence, as the other bad values, before any race."""
    import gradio as gr
    seen: dict = {}
    ui_race = _capture_race(monkeypatch, loaded, seen)
    with pytest.raises(gr.Error) as caught:
        ui_race.race_api("hi", max_new_tokens=100000000, preset="smollm2-135m-ngram")
    assert ("max_new_tokens must be a whole number from 1 to 8191 (builtin:smollm2-135m's "
            "context is 8192 tokens, the prompt included), got 100000000") in str(caught.value)
    assert not seen


def test_compare_refuses_a_max_new_tokens_beyond_the_context_as_a_flag(loaded, monkeypatch,
                                                                       capsys, tmp_path):
    """The refusal is the flags' one: the sentence, then where ``--help`` is; exit status 2;
    and nothing is warmed up first."""
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    warmed = []
    monkeypatch.setattr(startup, "prepare_timed", lambda *args, **kwargs: warmed.append(1))
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--target", str(tmp_path), "--draft", "ngram", "--prompt", "hi",
              "--max-new-tokens", "100000000", "--backend", "transformers"])
    assert exc.value.code == 2 and not warmed
    err = capsys.readouterr().err
    assert "exceeds the model's context" in err
    assert err.rstrip().endswith("(python -m specdemo compare --help)"), err


def test_compare_refuses_a_max_new_tokens_beyond_the_configs_context_before_loading(
        monkeypatch, capsys):
    """``compare --prompt hi --max-new-tokens 100000000`` loaded for 8 s, then refused without
    the ``--help`` line; the target's config says its context, so it is refused at once."""
    def load(*args, **kwargs):
        raise AssertionError("loaded a model for a value the config refuses")
    monkeypatch.setattr(startup, "load_model", load)
    with pytest.raises(SystemExit) as exc:
        main(["compare", "--prompt", "hi", "--target", "builtin:smollm2-135m",
              "--max-new-tokens", "100000000"])
    assert exc.value.code == 2
    assert capsys.readouterr().err == (
        "error: max new tokens must be a whole number from 1 to 8191 (builtin:smollm2-135m's "
        "context is 8192 tokens, the prompt included), got 100000000\n"
        "(python -m specdemo compare --help)\n")
