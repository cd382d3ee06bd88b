"""A learned drafter that accepts almost nothing on a run (under 5% of 40+ drafts) is said in
words beside the speedup, as a busy machine is: ``compare`` text and JSON, the race snapshot and
the page's chip, ``/race`` JSON. Tiny models: random untrained EAGLE-3 and DFlash drafters accept
~nothing on a random target of 128 ids; prompt lookup on a copy prompt gets no warning."""

import json

import pytest
import torch

import specdemo.services.startup as startup
from specdemo.interfaces.cli import main
from specdemo.core.drafters import dflash
from specdemo.core.drafters.dflash import LoadedDFlash
from specdemo.models.learned import LoadedEagle3
from specdemo.services.pipeline import DecodeSettings, Pipeline, low_acceptance_warnings
from specdemo.services.race import Race
from specdemo.core.stats import DecodeStats
from specdemo.interfaces.ui_format import verdict_html
from test_race import FakeLoaded, lanes
from tiny import CharTokenizer, tiny_dflash, tiny_eagle, tiny_llama

V = 128
PROMPT = "speculative decoding, made visible"
SETTINGS = DecodeSettings(max_new_tokens=60, draft_length=4)


def expected(name: str, accepted: int, drafted: int) -> str:
    return (f"drafter {name} accepted almost nothing: {accepted} of {drafted} drafts "
            f"({accepted / drafted:.0%}); it does not predict this target on this text (a "
            "language or kind of text it was not trained on, or a drafter for another target), "
            "so speculative decoding only adds its cost here")


@pytest.fixture(scope="module")
def loaded():
    model = tiny_llama(seed=5, vocab_size=V, layers=4)
    return FakeLoaded(model, tokenizer=CharTokenizer(V), vocab_size=V, spec="tiny-llama")


def learned(kind, loaded):
    if kind == "eagle3":
        return LoadedEagle3("random-eagle3", tiny_eagle(loaded.model, seed=3), {"layout": "speculators", "missing": []})
    return LoadedDFlash("random-dflash", tiny_dflash(loaded.model, seed=3), {"layout": "transformers", "config": {}})


def test_threshold_counts_per_drafter_and_leaves_prompt_lookup_out():
    def stats(by: dict[str, tuple[int, int]]):
        s = DecodeStats()
        s.drafted_by = {k: d for k, (d, a) in by.items()}
        s.accepted_by = {k: a for k, (d, a) in by.items()}
        return s
    assert low_acceptance_warnings(stats({"x": (39, 0)})) == []  # too few drafts to say
    assert low_acceptance_warnings(stats({"x": (40, 1)})) == [expected("x", 1, 40)]  # 2.5%
    assert low_acceptance_warnings(stats({"x": (40, 2)})) == []  # 5%: not under it
    assert low_acceptance_warnings(stats({"ngram": (100, 0), "x": (80, 30)})) == []
    assert low_acceptance_warnings(stats({"ngram": (50, 40), "x": (200, 0)})) == [expected("x", 0, 200)]
    assert low_acceptance_warnings(None) == []


@pytest.mark.parametrize("kind", ["eagle3", "dflash"])
def test_a_random_learned_drafter_gets_the_warning_in_compare(loaded, kind):
    pipe = Pipeline(loaded, f"random-{kind}", learned(kind, loaded))
    result = pipe.compare(pipe.prompt_ids(PROMPT), SETTINGS)
    spec = result.speculative.stats
    name = f"random-{kind}"
    drafted, accepted = spec.drafted_by[name], spec.accepted_by.get(name, 0)
    assert drafted >= 40 and accepted < 0.05 * drafted, (accepted, drafted)
    assert result.identical  # still lossless: only slower
    assert expected(name, accepted, drafted) in result.warnings
    assert expected(name, accepted, drafted) in result.as_dict()["warnings"]


def test_prompt_lookup_on_a_copy_prompt_gets_none(loaded):
    pipe = Pipeline(loaded, "ngram")
    copy = "the cat sat on the mat. " * 6 + "the cat"
    result = pipe.compare(pipe.prompt_ids(copy), SETTINGS)
    assert result.speculative.stats.drafted > 0
    assert not any("accepted almost nothing" in w for w in result.warnings)


@pytest.mark.slow
def test_compare_cli_says_it_in_text_and_json(loaded, tmp_path, monkeypatch, capsys):
    folder = dflash.save_assistant(tiny_dflash(loaded.model, seed=3), tmp_path / "random-dflash")
    monkeypatch.setattr(startup, "load_model", lambda spec, *a, **k: loaded)
    command = ["compare", "--target", str(tmp_path), "--draft", str(folder), "--prompt", PROMPT,
               "--max-new-tokens", "60", "--draft-length", "4"]
    assert main(command + ["--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    stats = out["speculative"]
    name = next(iter(stats["drafted_by"]))
    drafted, accepted = stats["drafted_by"][name], stats["accepted_by"].get(name, 0)
    warning = expected(name, accepted, drafted)
    assert [w for w in out["warnings"] if "accepted almost nothing" in w] == [warning]
    assert main(command) == 0
    text = capsys.readouterr().out.splitlines()
    assert "warning: " + warning in text


@pytest.mark.slow
def test_race_snapshot_page_chip_and_race_json(loaded, monkeypatch):
    from specdemo.interfaces import ui_race
    draft = learned("eagle3", loaded)
    race_lanes = lanes(loaded, spec=lambda: Pipeline(loaded, "random-eagle3", draft))
    final = list(Race(race_lanes, SETTINGS).run(min_interval_s=0.0))[-1]
    stats = final.panes["speculative"].stats
    warning = expected("random-eagle3", stats.accepted_by.get("random-eagle3", 0),
                       stats.drafted_by["random-eagle3"])
    assert warning in final.warnings
    page = verdict_html(final, 0.0)
    assert 'data-warning="acceptance"' in page and "⚠ " + warning in page
    assert page.index('class="sd-chip sd-speedup"') < page.index('data-warning="acceptance"')
    monkeypatch.setattr(ui_race, "_new_race", lambda prompt, system, preset, d, settings, conv,
                        request, backend=None, endpoints=None: Race(lanes(loaded, spec=lambda: Pipeline(loaded, "random-eagle3", draft)),
                                      settings))
    result = ui_race.race_api(PROMPT, max_new_tokens=60, draft_length="4")
    assert any(w.startswith("drafter random-eagle3 accepted almost nothing: ") for w in result["warnings"])
