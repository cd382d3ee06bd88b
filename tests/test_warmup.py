"""Issue 21 item 4 / issue 20 item 6: nothing still warming up lands in one lane only.

Every forward width a timed lane uses (target and draft model) was run before the first lane's
clock started; all preparation (warm-ups, auto's forward costs) runs before the plain lane, never
between the lanes; a race waits, untimed, for a draft-list check in progress; ``compare`` and the
bench warm every mode and draft length they time.
"""

import threading
from dataclasses import dataclass, field

import pytest
import torch

from specdemo.services import pipeline as pipeline_module
from specdemo.services import race as race_module
from specdemo.services import startup
from specdemo.core.machine import ACTIVE_RACES
from specdemo.services.pipeline import DecodeSettings, Pipeline
from specdemo.services.race import PLAIN, SPECULATIVE, Lane, Race
from tiny import CharTokenizer, tiny_eagle, tiny_llama

PROMPT = "the cat sat on the mat. the cat sat on the"


@dataclass
class Loaded:
    """What Pipeline needs from models.LoadedModel (one per test: warm-up state lives on it)."""

    model: torch.nn.Module
    tokenizer: object = field(default_factory=CharTokenizer)
    vocab_size: int = 32
    eos_token_ids: frozenset = frozenset()
    device: torch.device = torch.device("cpu")
    spec: str = "tiny"


class Recorder:
    """Forward widths (tokens fed per call) of each model, split into those run while the race
    prepared (``startup.prepare_timed``) and those run inside a timed decode."""

    def __init__(self, monkeypatch, models: dict[str, torch.nn.Module]) -> None:
        self.phase = "other"
        self.warmed: set[tuple[str, int]] = set()
        self.timed: set[tuple[str, int]] = set()
        self.log: list[tuple[str, str]] = []  # (phase, event) in order
        for name, model in models.items():
            model.register_forward_pre_hook(self._hook(name), with_kwargs=True)
        real_prepare, real_decode = startup.prepare_timed, pipeline_module.decode

        def prepare(*args, **kwargs):
            self.phase = "warm"
            self.log.append(("warm", "start"))
            try:
                return real_prepare(*args, **kwargs)
            finally:
                self.phase = "other"

        def decode(*args, **kwargs):
            events = real_decode(*args, **kwargs)
            if self.phase == "warm":  # a warm-up decode
                return events

            def timed():
                self.phase = "timed"
                self.log.append(("timed", "start"))
                try:
                    yield from events
                finally:
                    self.phase = "other"
            return timed()
        monkeypatch.setattr(race_module, "prepare_timed", prepare)
        monkeypatch.setattr(startup, "prepare_timed", prepare)
        monkeypatch.setattr(pipeline_module, "decode", decode)

    def _hook(self, name: str):
        def hook(module, args, kwargs):
            ids = kwargs.get("input_ids", args[0] if args else None)
            if ids is not None:
                width = (name, int(ids.shape[-1]))
                if self.phase == "warm":
                    self.warmed.add(width)
                elif self.phase == "timed":
                    self.timed.add(width)
        return hook


class TinyEagle:
    """What ``drafters.learned.load_learned`` returns for an EAGLE-3 head: a drafter factory."""

    def __init__(self, head) -> None:
        self.head = head

    def new_drafter(self, target, vocab_size, name):
        from specdemo.core.drafters.eagle import Eagle3Drafter
        return Eagle3Drafter(self.head, vocab_size, name=name)


def race_of(loaded, draft, draft_length, draft_loaded=None):
    messages = [{"role": "user", "content": PROMPT}]
    plain, spec = Pipeline(loaded, "none"), Pipeline(loaded, draft, draft_loaded)
    return Race([Lane(PLAIN, False, lambda: plain, messages),
                 Lane(SPECULATIVE, True, lambda: spec, messages)],
                DecodeSettings(max_new_tokens=40, draft_length=draft_length))


@pytest.mark.parametrize("draft, draft_length", [
    ("self", 4), ("self", 7), ("ngram", 5), ("self", "auto"), ("model", 6), ("early-exit:1", 3),
    ("eagle3", 4)])
def test_every_width_a_timed_lane_uses_was_warmed_before_its_clock(monkeypatch, tmp_path, draft,
                                                                   draft_length):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    target = tiny_llama(seed=3, layers=2)
    models = {"target": target}
    draft_loaded = None
    if draft == "model":
        draft_model = tiny_llama(seed=4, layers=1)
        models["draft"] = draft_model
        draft_loaded = Loaded(draft_model, spec="tiny-draft")
        draft = "tiny-draft"
    elif draft == "eagle3":  # reads hidden states: the target's widths go the features path
        draft_loaded = TinyEagle(tiny_eagle(target, seed=5))
    recorder = Recorder(monkeypatch, models)
    race = race_of(Loaded(target), draft, draft_length, draft_loaded)
    final = list(race.run(min_interval_s=0.0))[-1]
    assert final.panes[PLAIN].status == final.panes[SPECULATIVE].status == "done"
    assert recorder.timed, "nothing was recorded in the timed lanes"
    assert recorder.timed <= recorder.warmed, f"cold in a timed lane: {recorder.timed - recorder.warmed}"
    # The race verified several drafts at once, so the check covered wide verification forwards.
    assert max(w for name, w in recorder.timed if name == "target" and w < len(PROMPT)) >= 2


@pytest.mark.parametrize("draft", ["self", "early-exit:1"])
def test_a_draft_model_that_starts_late_catches_up_in_warmed_widths(monkeypatch, tmp_path, draft):
    """Draft length auto may draft nothing for a few rounds (a busy machine made drafting look
    dear: CI once saw it); the draft model's first proposal then feeds the prompt and the tokens
    after it. It must do so in widths the warm-up ran (the prompt's, then at most max_k + 1),
    not in one forward of a width never seen (CI: ('target', 46) cold in a timed lane)."""
    from specdemo.core.policy import AdaptiveDraftLength
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    real_choose = AdaptiveDraftLength.choose
    calls = {"n": 0}

    def late(self, source=None):
        calls["n"] += 1
        return 0 if calls["n"] <= 4 else real_choose(self, source) or 2
    target = tiny_llama(seed=3, layers=2)
    recorder = Recorder(monkeypatch, {"target": target})
    race = race_of(Loaded(target), draft, "auto")
    monkeypatch.setattr(AdaptiveDraftLength, "choose", late)  # the warm-up drafts at a fixed k
    # ... and every proposal is verified whole: `limit` would drop a proposal when the timings
    # of a busy machine make any verification look dearer than a plain step (CI once: nothing
    # drafted in the whole run, so the test checked nothing).
    monkeypatch.setattr(AdaptiveDraftLength, "limit",
                        lambda self, n_proposed, source=None, confidence=None: n_proposed)
    final = list(race.run(min_interval_s=0.0))[-1]
    spec = final.panes[SPECULATIVE]
    assert spec.status == "done" and spec.stats.drafted > 0, "the late drafter never drafted"
    assert recorder.timed <= recorder.warmed, f"cold in a timed lane: {recorder.timed - recorder.warmed}"
    assert final.panes[PLAIN].token_ids == spec.token_ids  # still the target's greedy tokens
    # Every preparation came before the first timed decode: nothing between the lanes.
    first_timed = recorder.log.index(("timed", "start"))
    assert ("warm", "start") not in recorder.log[first_timed:]


def test_fixed_k_warms_exactly_its_verification_widths(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    target = tiny_llama(seed=5, layers=2)
    recorder = Recorder(monkeypatch, {"target": target})
    pipe = Pipeline(Loaded(target), "ngram")
    ids = pipe.prompt_ids(PROMPT)
    recorder.phase = "warm"
    startup.prepare_timed(pipe, True, 5, ids)
    recorder.phase = "other"
    widths = {w for _, w in recorder.warmed}
    assert {1, 2, 3, 4, 5, 6} <= widths and len(ids) in widths
    assert startup.verification_widths(True, 5) == [1, 2, 3, 4, 5, 6]
    assert startup.verification_widths(False, 5) == [1]
    assert startup.verification_widths(True, "auto") == list(range(1, 18))  # max_k 16 + 1
    # A second preparation for the same draft length and prompt length runs nothing.
    recorder.warmed.clear()
    recorder.phase = "warm"
    startup.prepare_timed(pipe, True, 5, ids)
    recorder.phase = "other"
    assert recorder.warmed == set()


def test_auto_costs_and_all_warm_ups_run_before_the_plain_lane(monkeypatch, tmp_path):
    """The step order of a first race with draft length auto: both warm-ups and the forward
    costs, then the plain lane, then the speculative lane (before: the costs and the
    speculative warm-up ran between the lanes)."""
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    target = tiny_llama(seed=6, layers=2)
    order = []
    real_decode = pipeline_module.decode

    def decode(*args, **kwargs):
        drafter = kwargs.get("drafter")
        label = "speculative" if drafter is not None else "plain"
        events = real_decode(*args, **kwargs)
        if startup.STEPS.current() is None:  # not inside a warm-up step: a timed lane
            order.append(label)
        return events
    monkeypatch.setattr(pipeline_module, "decode", decode)
    with startup.STEPS.listening(lambda event, what: event == "start" and order.append(what.name)):
        final = list(race_of(Loaded(target), "ngram", "auto").run(min_interval_s=0.0))[-1]
    assert final.panes[SPECULATIVE].status == "done"
    assert order == ["warming up tiny", "warming up tiny with draft ngram",
                     "measuring what a forward over n tokens costs tiny here (once per start, for draft "
                     "length auto)", "plain", "speculative"]


def test_a_race_waits_for_a_draft_check_in_progress_before_timing(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    target = tiny_llama(seed=7, layers=2)
    checking, release = threading.Event(), threading.Event()
    seen_during_check = []

    def check():  # a draft-list check that started before the race was sent
        with ACTIVE_RACES.background():
            checking.set()
            release.wait(30)
    worker = threading.Thread(target=check)
    worker.start()
    assert checking.wait(10)
    real_decode = pipeline_module.decode

    def decode(*args, **kwargs):
        seen_during_check.append(not release.is_set())
        return real_decode(*args, **kwargs)
    monkeypatch.setattr(pipeline_module, "decode", decode)
    race = race_of(Loaded(target), "ngram", 3)
    race.start()
    # The race is queued: nothing of it may decode (warm-up or lane) while the check runs.
    threading.Timer(0.5, release.set).start()
    race.join(60)
    worker.join(10)
    assert race.records[PLAIN].status == race.records[SPECULATIVE].status == "done"
    assert seen_during_check and not any(seen_during_check)
    # A check asked for while a race runs waits until the race has ended.
    assert ACTIVE_RACES.wait_background(1) and not ACTIVE_RACES.background_running()


def test_compare_and_the_bench_warm_every_mode_and_draft_length_they_time(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    calls = []
    real = startup.prepare_timed

    def prepare(pipe, speculative, draft_length, prompt_ids=None):
        calls.append((speculative, draft_length))
        return real(pipe, speculative, draft_length, prompt_ids)
    monkeypatch.setattr(startup, "prepare_timed", prepare)
    pipe = Pipeline(Loaded(tiny_llama(seed=8, layers=2)), "self")
    ids = pipe.prompt_ids(PROMPT)
    comparison = pipe.compare(ids, DecodeSettings(max_new_tokens=10, draft_length=6),
                              prepare=startup.prepare_timed)
    assert calls == [(False, 6), (True, 6)] and comparison.identical
    calls.clear()
    from specdemo.services.bench.config import BenchConfig
    from specdemo.services.bench.run import SpecdemoEngine
    SpecdemoEngine(pipe).warm_up(ids, BenchConfig(draft_lengths=(2, 8, "auto")), {})
    assert calls == [(False, 4), (True, 2), (True, 8), (True, "auto")]
