"""Issue 12 item 1: the slow steps before a first token are named, estimated, remembered and
printed; a first plain run waits for nothing only the speculative run needs; the GGUF is parsed
once per conversion and converts to the same weights."""

import io
import threading
import time

import pytest
import torch

from specdemo.services import startup
from specdemo.services.pipeline import DecodeSettings, Pipeline
from specdemo.services.race import LOADING, PLAIN, SPECULATIVE, Lane, Race
from specdemo.services.startup import Steps
from test_race import PROMPT, FakeLoaded
from tiny import tiny_llama


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    return tmp_path


def test_a_step_is_estimated_from_the_last_time_it_ran(cache):
    steps = Steps()
    with steps.step("convert x", "converting x", estimate_s=30.0):
        assert steps.current().name == "converting x" and steps.current().estimate_s == 30.0
        with steps.step("inner", "inner step"):
            assert steps.current().name == "inner step"  # the innermost step shows
        assert steps.current().name == "converting x"
        time.sleep(startup.MIN_REMEMBER_S)
    assert steps.current() is None
    remembered = startup.remembered_s("convert x")
    assert remembered is not None and remembered < 1.0  # this machine's time, not the guess
    with steps.step("convert x", "converting x", estimate_s=30.0):
        assert steps.current().estimate_s == remembered
    assert [d.name for d in steps.recent()] == ["inner step", "converting x", "converting x"]


def test_a_failed_or_instant_step_teaches_nothing(cache, monkeypatch):
    steps = Steps()
    with pytest.raises(RuntimeError):
        with steps.step("load y", "loading y", estimate_s=3.0):
            raise RuntimeError("broken")
    assert startup.remembered_s("load y") is None and steps.recent()[-1].failed
    monkeypatch.setattr(startup, "MIN_REMEMBER_S", 10.0)  # a cache hit: far below a real load
    with steps.step("load y", "loading y", estimate_s=3.0):
        pass
    assert startup.remembered_s("load y") is None


def test_a_step_that_took_a_stored_shortcut_keeps_the_earlier_estimate(cache):
    """The backend choice read from its store takes a blink; the next start may measure (12 s)."""
    steps = Steps()
    with steps.step("choose z", "choosing z", estimate_s=8.0):
        time.sleep(startup.MIN_REMEMBER_S)
    measured = startup.remembered_s("choose z")
    assert measured is not None
    with steps.step("choose z", "choosing z", estimate_s=8.0) as record:
        time.sleep(2 * startup.MIN_REMEMBER_S)
        record.remember = False
    assert startup.remembered_s("choose z") == measured


def test_the_command_line_prints_each_step(cache, monkeypatch):
    steps = Steps()
    monkeypatch.setattr(startup, "STEPS", steps)
    out = io.StringIO()
    with startup.printed(out):
        with steps.step("k", "warming up m", estimate_s=3.0):
            pass
    lines = out.getvalue().splitlines()
    assert lines[0] == "… warming up m (about 3 s)"
    assert lines[1].startswith("✓ warming up m: ") and lines[1].endswith(" s")
    assert startup.about(150) == "about 2 min" and startup.about(None) == ""


def test_every_lane_is_prepared_as_steps_before_the_first_lane_is_timed(cache):
    """Warm-ups and forward costs are named steps, and all of them (the speculative lane's and
    auto's cost table included) run before the plain lane's clock starts (issue 21 item 4):
    nothing of it runs between the lanes."""
    loaded = FakeLoaded(tiny_llama(seed=1, layers=2, vocab_size=80), vocab_size=80)
    seen = []
    steps = Steps()
    original = startup.STEPS
    startup.STEPS = steps
    try:
        with steps.listening(lambda event, what: event == "start" and seen.append(what.name)):
            plain, spec = Pipeline(loaded, "none"), Pipeline(loaded, "ngram")
            messages = [{"role": "user", "content": PROMPT}]
            race = Race([Lane(PLAIN, False, lambda: plain, messages),
                         Lane(SPECULATIVE, True, lambda: spec, messages)],
                        DecodeSettings(max_new_tokens=8, draft_length="auto"))
            assert race.snapshot().panes[PLAIN].status == "waiting"
            race.start()
            assert race.snapshot().panes[PLAIN].status in (LOADING, "running", "done")
            final = list(race.run())[-1]
    finally:
        startup.STEPS = original
    assert final.panes[PLAIN].status == final.panes[SPECULATIVE].status == "done"
    assert seen == ["warming up tiny", "warming up tiny with draft ngram",
                    "measuring what a forward over n tokens costs tiny here (once per start, for draft "
                    "length auto)"]
    assert race.records[PLAIN].steps[-1].stats.new_tokens == 8


def test_start_preload_runs_once_and_reports_failure(monkeypatch):
    from specdemo.interfaces import ui_state
    calls = []
    monkeypatch.setattr(ui_state, "_PRELOAD", {"started": False, "error": None})
    monkeypatch.setattr(ui_state, "_READY", threading.Event())

    def fake_preload(name, app=None):
        calls.append(name)
        ui_state._PRELOAD["error"] = "could not load x"
        ui_state._READY.set()
    monkeypatch.setattr(ui_state, "preload", fake_preload)
    ready = ui_state.start_preload("p")
    assert ui_state.start_preload("q") is ready
    assert ready.wait(10) and calls == ["p"]
    panel = list(ui_state.follow_startup("p"))
    assert len(panel) == 1 and "could not load x" in panel[0] and 'data-state="error"' in panel[0]


@pytest.mark.slow
def test_gguf_parsed_once_converts_to_the_same_weights():
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from specdemo.models import builtin
    from specdemo.models.ggufread import shared_reading
    gguf = builtin._locate_parts(builtin.BUILTINS["smollm2-135m"])[0]
    with shared_reading():
        tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        fast = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                    dtype=torch.float32).state_dict()
    import gguf as gguf_module
    assert gguf_module.GGUFReader.__name__ == "GGUFReader"  # restored
    ref_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ref = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                               dtype=torch.float32).state_dict()
    assert fast.keys() == ref.keys() and all(torch.equal(fast[k], ref[k]) for k in ref)
    text = "The quick brown fox 🦩 jumps"
    assert tok.encode(text) == ref_tok.encode(text) and tok.chat_template == ref_tok.chat_template


def test_the_banner_lists_the_start_ups_steps_not_later_ones(monkeypatch):
    """Issue 20.9: steps after the start-up (a draft switch's check or load) do not grow the
    banner; it says Ready once the models are, with a note while the page's draft checks run
    in the background (a Send does not wait for them), then Ready alone."""
    from specdemo.interfaces import ui_state
    from specdemo.services.startup import STEPS
    monkeypatch.setattr(ui_state, "_PRELOAD", {"started": False, "error": None})
    monkeypatch.setattr(ui_state, "_READY", threading.Event())

    def fake_preload(name, app=None):
        with STEPS.step("test-load", "loading the test target"):
            pass
        ui_state._READY.set()
    monkeypatch.setattr(ui_state, "preload", fake_preload)
    assert ui_state.start_preload("p").wait(10)
    with STEPS.step("test-check", "reading the tokenizer of another draft"):
        pass
    panel = list(ui_state.follow_startup("p"))[-1]
    assert "loading the test target" in panel and "another draft" not in panel
    assert 'data-state="checking"' in panel and "Ready</b>" in panel
    assert "a Send does not wait for it" in panel
    done = ui_state.startup_done()
    assert 'data-state="ready"' in done and "Ready</b>" in done
    assert "loading the test target" in done and "another draft" not in done


def test_the_native_backends_first_compile_is_a_step_of_its_own(cache, monkeypatch):
    """On a machine where the native forward was never built, the start-up names the compile
    (a fresh-clone trial saw ~10 s hidden inside "choosing the forward backend"); once built,
    no step."""
    from types import SimpleNamespace

    from specdemo.models import native as nb
    from specdemo.services import backend_choice
    if nb.build._compiler() is None:
        pytest.skip("no C compiler here")
    steps = Steps()
    monkeypatch.setattr(startup, "STEPS", steps)
    monkeypatch.setattr(nb.build, "_LIB", None)
    monkeypatch.setattr(nb.build, "_LIB_ERROR", None)
    loaded = SimpleNamespace(model=tiny_llama(seed=0, layers=1), device=torch.device("cpu"))
    assert not nb.library_path().exists()  # SPECDEMO_CACHE is this test's folder
    backend_choice._compile_native_once(loaded, "auto")
    assert [d.name for d in steps.recent()] == [
        "compiling our C forward for this CPU (once per machine)"]
    assert nb.library_path().exists()
    backend_choice._compile_native_once(loaded, "native")  # built: nothing to say
    backend_choice._compile_native_once(loaded, "transformers")
    assert len(steps.recent()) == 1


def test_a_note_is_said_once_without_a_duration(cache, monkeypatch):
    """An outcome (the backend chosen) is one line, not a step that started and took 0.0 s (a
    fresh-clone trial saw it printed twice)."""
    from specdemo.interfaces.ui_format import startup_html
    steps = Steps()
    monkeypatch.setattr(startup, "STEPS", steps)
    out = io.StringIO()
    with startup.printed(out):
        steps.note("forward backend of t: native (measured)")
    assert out.getvalue().splitlines() == ["· forward backend of t: native (measured)"]
    done = steps.recent()
    assert len(done) == 1 and done[0].note and not done[0].failed
    html = startup_html(None, done, ready=True)
    assert "forward backend of t: native (measured)</span>" in html and "0.0 s" not in html


def _loaded_on_cpu():
    from types import SimpleNamespace
    return SimpleNamespace(spec="tiny-est", model=tiny_llama(seed=0, layers=1), dtype=torch.float32,
                           device=torch.device("cpu"), backend="transformers", vocab_size=32)


def test_a_stored_backend_choice_is_a_note_not_a_step_and_scales_the_later_estimates(cache,
                                                                                    monkeypatch):
    """Issue 39.3: a choice read back from its store takes milliseconds, so it shows no step
    with a measuring estimate; the widths it timed scale the warm-up and forward-cost estimates
    of a first start (a fresh clone guessed 8 s for 0.9 s of forward costs)."""
    from specdemo.services import backend_choice as gb
    steps = Steps()
    monkeypatch.setattr(startup, "STEPS", steps)
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    forward = {1: 0.010, 5: 0.020, 9: 0.040}
    stored = gb.BackendChoice("native-w8a8", "measured earlier on this machine (...): ...",
                              {"native-w8a8": 0.02}, cached=True,
                              forward_s={"native-w8a8": forward})
    monkeypatch.setattr(gb, "lookup", lambda loaded, lane=None: (stored, None))
    monkeypatch.setattr(gb, "with_backend", lambda *a, **k: pytest.fail("measured again"))
    chosen, choice = gb.use_backend(_loaded_on_cpu(), "auto", "ngram")
    assert chosen.backend == "native-w8a8" and choice is stored
    assert [(d.name, d.note) for d in steps.recent()] == [
        ("forward backend of tiny-est: native-w8a8 (measured earlier on this machine (...): ...)",
         True)]
    # interpolated between the timed widths, extrapolated past the widest (5 ms a token there)
    assert startup.forward_estimate_s(chosen, [1, 3, 9, 13]) == pytest.approx(
        0.010 + 0.015 + 0.040 + 0.060)
    assert startup.forward_estimate_s(_loaded_on_cpu(), [1]) is None  # nothing timed for it


def test_a_backend_choice_to_measure_is_a_step_weighed_for_the_race(cache, monkeypatch):
    from specdemo.models import backends as mb
    from specdemo.services import backend_choice as gb
    steps = Steps()
    monkeypatch.setattr(startup, "STEPS", steps)
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    monkeypatch.setattr(gb, "lookup", lambda loaded, lane=None: (
        None, "measured again: the stored choice was for torch 2.4.0, now 2.5.1"))
    lanes = []

    def measure(loaded, backend, lane=None):
        lanes.append(lane)
        return mb.replace_backend(loaded, "native"), gb.BackendChoice("native", "measured: ...")
    monkeypatch.setattr(gb, "with_backend", measure)
    gb.use_backend(_loaded_on_cpu(), "auto", "ngram")
    assert lanes[0].draft == "ngram" and lanes[0].layers == () and not lanes[0].measured
    assert [d.name for d in steps.recent()] == [
        "choosing the forward backend for tiny-est (auto, weighed for draft ngram; measured "
        "again: the stored choice was for torch 2.4.0, now 2.5.1)",  # why it measures
        "forward backend of tiny-est: native (measured: ...)"]


def test_a_learned_drafters_lane_is_timed_with_its_features_and_measured_per_backend():
    """Issue 39.2: a learned head's acceptance and drafting change with the backend (its
    features, its C step on the native ones), so auto measures them on each backend it times."""
    from specdemo.models.learned import LoadedEagle3
    from tiny import CharTokenizer, tiny_eagle
    model = tiny_llama(seed=5, vocab_size=128, layers=4)
    loaded = FakeLoaded(model, tokenizer=CharTokenizer(128), vocab_size=128, spec="tiny-llama")
    head = LoadedEagle3("random-eagle3", tiny_eagle(model, seed=3), {"layout": "speculators",
                                                                   "missing": []})
    from specdemo.services import backend_choice as gb
    lane = gb.race_lane(loaded, "random-eagle3", head)
    # its feature layers read from what was loaded (the head's config), no drafter built
    assert lane.speculative and lane.layers == head.head.feature_layers and lane.measured
    facts = gb.lane_facts(loaded, lane.draft, lane.source, "transformers")
    assert facts.drafted > 0 and 0.0 <= facts.acceptance <= 1.0 and facts.draft_s > 0
    plain = gb.race_lane(loaded, "ngram")
    assert (plain.layers, plain.measured) == ((), False)  # lookup: the same on every backend
    # a plain run is weighed as the plain lane of a race with prompt lookup (one stored choice)
    assert gb.race_lane(loaded, "none") == plain
