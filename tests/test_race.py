"""The race scheduler on tiny random models: order, timing, replay, Stop and per-pane errors."""

import threading
from dataclasses import dataclass, field

import pytest
import torch

from specdemo.models.loading import ModelLoadError
from specdemo.services.pipeline import DecodeSettings, Pipeline
from specdemo.services.race import (DONE, ERROR, PLAIN, REPLAYING, RUNNING, SKIPPED, SPECULATIVE, STOPPED,
                           Lane, PipelineCache, Race, Step, race_lanes)
from specdemo.core.stats import DecodeStats
from tiny import CharTokenizer, tiny_llama

PROMPT = "the cat sat on the mat. the cat sat on the"


@dataclass
class FakeLoaded:
    """What Pipeline needs from models.LoadedModel."""

    model: torch.nn.Module
    tokenizer: object = field(default_factory=CharTokenizer)
    vocab_size: int = 32
    eos_token_ids: frozenset = frozenset()
    device: torch.device = torch.device("cpu")
    spec: str = "tiny"


@pytest.fixture(scope="module")
def loaded():
    return FakeLoaded(tiny_llama(seed=0, layers=3))


def lanes(loaded, draft="self", plain=None, spec=None):
    messages = [{"role": "user", "content": PROMPT}]
    plain = plain or (lambda: Pipeline(loaded, "none"))
    spec = spec or (lambda: Pipeline(loaded, draft))
    return [Lane(PLAIN, False, plain, messages), Lane(SPECULATIVE, True, spec, messages)]


SETTINGS = DecodeSettings(max_new_tokens=30, draft_length=4)


def test_race_runs_plain_then_speculative_and_matches(loaded):
    race = Race(lanes(loaded), SETTINGS)
    snaps = list(race.run(min_interval_s=0.0))
    final = snaps[-1]
    assert final.done and [s.phase for s in snaps].count("done") == 1
    plain, spec = final.panes[PLAIN], final.panes[SPECULATIVE]
    assert plain.status == DONE and spec.status == DONE
    # Never concurrent: whenever the speculative lane shows tokens, plain had finished.
    for snap in snaps:
        if snap.panes[SPECULATIVE].steps_shown:
            assert snap.panes[PLAIN].status == DONE
    assert plain.stats.new_tokens == spec.stats.new_tokens == 30
    assert spec.token_ids == plain.token_ids and final.identical is True
    assert final.first_divergence is None
    # Self-drafting: every token but the prefill one and the bonus tokens is an accepted draft.
    flags = [f for _, f in spec.tokens]
    assert sum(flags) == spec.stats.accepted == spec.stats.drafted
    assert spec.stats.accepted == 30 - 1 - spec.stats.target_forwards
    assert not any(f for _, f in plain.tokens)
    # Token pieces join to the text of each pane.
    assert "".join(t for t, _ in spec.tokens) == spec.text == plain.text
    assert final.speedup == pytest.approx(spec.stats.tokens_per_s / plain.stats.tokens_per_s)


def test_steps_carry_each_decodes_own_clock(loaded):
    race = Race(lanes(loaded, draft="ngram"), SETTINGS)
    list(race.run())
    for record in race.records.values():
        times = [s.t_s for s in record.steps]
        assert times == sorted(times)
        assert times[-1] == record.steps[-1].stats.elapsed_s
        assert times[0] == record.steps[0].stats.ttft_s
        assert sum(len(s.token_ids) for s in record.steps) == record.steps[-1].stats.new_tokens


def manual_race(plain_times, spec_times):
    """A race whose records are written by hand: one token per step at the given times."""
    race = Race(lanes(None), SETTINGS)
    for name, times in ((PLAIN, plain_times), (SPECULATIVE, spec_times)):
        record = race.records[name]
        for i, t in enumerate(times):
            stats = DecodeStats(new_tokens=i + 1, elapsed_s=t, ttft_s=times[0],
                                finish_reason="length" if i == len(times) - 1 else None)
            record.steps.append(Step(t, (i + 1,), (name == SPECULATIVE,), "x", stats))
        record.status = DONE
    return race


class FakeClock:
    def __init__(self):
        self.now = 0.0
        self.sleeps = []

    def __call__(self):
        return self.now

    def sleep(self, seconds):
        self.sleeps.append(seconds)
        self.now += seconds


def test_schedule_merges_lanes_by_measured_time():
    race = manual_race([0.1, 0.2, 0.3, 0.4], [0.05, 0.25])
    assert race.schedule() == [(0.05, SPECULATIVE, 1), (0.1, PLAIN, 1), (0.2, PLAIN, 2),
                               (0.25, SPECULATIVE, 2), (0.3, PLAIN, 3), (0.4, PLAIN, 4)]


def test_replay_plays_at_measured_pace():
    race = manual_race([0.1, 0.2, 0.3, 0.4], [0.05, 0.25])
    clock = FakeClock()
    snaps = list(race.replay(fps=1000, clock=clock, sleep=clock.sleep))
    replay = [s for s in snaps if s.phase == "replay"]
    assert [s.clock_s for s in replay] == [0.05, 0.1, 0.2, 0.25, 0.3, 0.4]
    assert clock.now == pytest.approx(0.4)  # played in real time, no faster, no slower
    # The speculative lane finishes at 0.25 s while plain is still running.
    at_spec_end = replay[3]
    assert at_spec_end.panes[SPECULATIVE].status == DONE
    assert at_spec_end.panes[PLAIN].status == REPLAYING  # played back, not decoding (issue 20.8)
    assert at_spec_end.panes[PLAIN].steps_shown == 2
    assert replay[0].panes[PLAIN].status == REPLAYING
    assert snaps[-1].done and snaps[-1].panes[PLAIN].steps_shown == 4
    # Half speed takes twice as long.
    clock = FakeClock()
    list(race.replay(speed=0.5, fps=1000, clock=clock, sleep=clock.sleep))
    assert clock.now == pytest.approx(0.8)


def test_replay_merges_steps_within_a_frame_and_stops_on_cancel():
    race = manual_race([0.01, 0.02, 0.03, 1.0], [0.015])
    clock = FakeClock()
    snaps = list(race.replay(fps=10, clock=clock, sleep=clock.sleep))
    assert [s.clock_s for s in snaps if s.phase == "replay"] == [0.03, 1.0]
    cancel = threading.Event()
    cancel.set()
    snaps = list(race.replay(cancel=cancel, clock=clock, sleep=clock.sleep))
    assert len(snaps) == 1 and snaps[0].done and snaps[0].panes[PLAIN].steps_shown == 4


class StopAfter(Pipeline):
    """Sets the race's cancel event after ``n`` events, as the Stop button would."""

    def __init__(self, loaded, n, cancel):
        super().__init__(loaded, "none")
        self.n, self.cancel_event = n, cancel

    def stream(self, prompt_ids, settings, speculative, cancel=None):
        for i, event in enumerate(super().stream(prompt_ids, settings, speculative, cancel)):
            if i + 1 == self.n:
                self.cancel_event.set()
            yield event


def test_stop_keeps_what_was_produced(loaded):
    cancel = threading.Event()
    race = Race(lanes(loaded, plain=lambda: StopAfter(loaded, 4, cancel)), SETTINGS, cancel=cancel)
    final = list(race.run())[-1]
    plain, spec = final.panes[PLAIN], final.panes[SPECULATIVE]
    assert plain.status == STOPPED and plain.stats.finish_reason == "cancelled"
    assert plain.stats.new_tokens == 4 and len(plain.token_ids) == 4 and len(plain.text) == 4
    assert spec.status == SKIPPED and spec.steps_shown == 0 and "stopped" in spec.error
    assert final.identical is None


class StopSpeculativeAfter(Pipeline):
    """A self-drafting pipeline whose speculative decode is stopped after ``n`` events."""

    def __init__(self, loaded, n, cancel):
        super().__init__(loaded, "self")
        self.n, self.cancel_event = n, cancel

    def stream(self, prompt_ids, settings, speculative, cancel=None):
        for i, event in enumerate(super().stream(prompt_ids, settings, speculative, cancel)):
            if speculative and cancel is not None and i + 1 == self.n:  # the race's, not a warm-up
                self.cancel_event.set()
            yield event


def test_a_stopped_speculative_run_is_not_compared(loaded):
    """Issue 20.8: Stop during the speculative run: no speedup of a finished run against a cut
    one, on the page and in /race's JSON."""
    from specdemo.interfaces.ui_format import verdict_html
    from specdemo.interfaces.ui_race import _note
    cancel = threading.Event()
    race = Race(lanes(loaded, spec=lambda: StopSpeculativeAfter(loaded, 2, cancel)), SETTINGS,
                cancel=cancel)
    final = list(race.run(min_interval_s=0.0))[-1]
    assert final.panes[PLAIN].status == DONE and final.panes[SPECULATIVE].status == STOPPED
    assert final.panes[SPECULATIVE].stats.new_tokens > 0
    assert final.speedup is None
    badge = verdict_html(final, 0.0)
    assert "Speedup: not compared (the speculative run was stopped)" in badge
    assert "×" not in badge and "lossless check: not compared" in badge
    assert _note(final) == "not compared: the speculative run was stopped"


def test_replay_shows_no_partial_values_and_keeps_the_busy_warning():
    """Issue 20.8: during Replay the badge shows no partial speedup, the panes say they are
    replaying (not both "decoding…"), and the busy-machine warning of the race stays."""
    from specdemo.interfaces.ui_format import status_line, verdict_html
    race = manual_race([0.1, 0.2, 0.3, 0.4], [0.05, 0.25])
    last = race.records[PLAIN].steps[-1]
    busy = DecodeStats(new_tokens=4, elapsed_s=0.4, ttft_s=0.1, finish_reason="length",
                       other_cpu_share=0.6)
    race.records[PLAIN].steps[-1] = Step(last.t_s, last.token_ids, last.from_draft, last.text, busy)
    clock = FakeClock()
    snaps = list(race.replay(fps=1000, clock=clock, sleep=clock.sleep))
    replay = [s for s in snaps if s.phase == "replay"]
    assert len(replay) == 6
    for snap in replay:
        assert snap.speedup is None
        assert "data-speedup" not in verdict_html(snap, 0.0)
        assert snap.warnings and "60% of the CPU during the plain run" in snap.warnings[0]
        assert 'data-warning="busy"' in verdict_html(snap, 0.0)
    assert status_line(replay[0].panes[PLAIN]) == "replaying at the measured pace…"
    assert "decoding" not in status_line(replay[0].panes[SPECULATIVE])
    final = snaps[-1]
    assert final.done and final.speedup == pytest.approx((2 / 0.25) / (4 / 0.4))
    assert 'data-warning="busy"' in verdict_html(final, 0.0)


def test_closing_the_generator_cancels_the_decode(loaded):
    race = Race(lanes(loaded), DecodeSettings(max_new_tokens=400))
    gen = race.run(min_interval_s=0.0)
    next(gen)
    gen.close()
    assert race.cancel.is_set()
    race.join(timeout=30)
    assert race.finished


def test_a_draft_that_cannot_load_stops_the_race_before_the_plain_run(loaded):
    """Issue 11 item 5: both lanes' models are loaded before either lane starts, so a missing
    draft is reported at once instead of after a whole plain run."""
    ran = []

    def plain():
        pipe = Pipeline(loaded, "none")
        stream = pipe.stream
        pipe.stream = lambda *a, **k: ran.append("plain") or stream(*a, **k)
        return pipe

    def broken():
        raise ModelLoadError("could not load the draft: file missing")
    final = list(Race(lanes(loaded, plain=plain, spec=broken), SETTINGS).run())[-1]
    assert final.panes[SPECULATIVE].status == ERROR
    assert final.panes[SPECULATIVE].error == "could not load the draft: file missing"
    assert final.panes[PLAIN].status == SKIPPED and ran == []
    assert final.panes[PLAIN].error == ("not run: the speculative run cannot start (could not "
                                        "load the draft: file missing)")
    assert final.panes[PLAIN].stats is None and final.identical is None and final.speedup is None


def test_error_while_decoding_one_pane_leaves_the_other(loaded):
    class OutOfMemory(Pipeline):
        def stream(self, *args, **kwargs):
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    final = list(Race(lanes(loaded, plain=lambda: OutOfMemory(loaded, "none")), SETTINGS).run())[-1]
    assert final.panes[PLAIN].status == ERROR and final.panes[PLAIN].error.startswith("out of memory")
    assert final.panes[SPECULATIVE].status == DONE and final.panes[SPECULATIVE].stats.new_tokens == 30


def test_bad_input_is_a_readable_message_in_each_pane(loaded):
    final = list(Race(lanes(loaded), DecodeSettings(max_new_tokens=600)).run())[-1]
    for pane in final.panes.values():
        assert pane.status == ERROR
        assert "exceeds the model's context of 512" in pane.error


class ByteTokenizer:
    """Ids are UTF-8 bytes; decoding a cut character gives U+FFFD."""

    def decode(self, ids, skip_special_tokens=True):
        return bytes(ids).decode("utf-8", errors="replace")


def test_token_pieces_keep_multibyte_characters_whole():
    """The engine's tracker gives each token's text (a round at a time, as the race records it)."""
    from specdemo.core.engine import TextTracker
    tracker, pieces = TextTracker(ByteTokenizer()), []
    for round_ in ("aé", "€b"):
        for byte in round_.encode():
            tracker.add(byte)
        pieces += tracker.pieces()
    assert pieces == ["a", "", "é", "", "", "€", "b"]


def test_the_pane_shows_the_pieces_the_engine_decoded(loaded):
    """The race keeps each event's pieces (no second decode): a pane's tokens are the engine's
    pieces, joined they are the pane's text."""
    race = Race(lanes(loaded, draft="ngram"), SETTINGS)
    final = list(race.run(min_interval_s=0.0))[-1]
    for name, pane in final.panes.items():
        steps = race.records[name].steps
        assert all(s.pieces is not None and len(s.pieces) == len(s.token_ids) for s in steps)
        assert [p for p, _ in pane.tokens] == [p for s in steps for p in s.pieces]
        assert "".join(p for p, _ in pane.tokens) == pane.text and len(pane.tokens) == 30
    assert any(len(s.token_ids) > 1 for s in race.records[SPECULATIVE].steps)


def test_a_step_without_pieces_shows_its_text_once():
    """A server's chunk with several token ids and no pieces: its text goes with its first
    token, not once per token."""
    step = Step(0.1, (5, 6, 7), (False, False, False), "abc", DecodeStats(new_tokens=3))
    assert step.token_pieces() == ("abc", "", "")
    race = Race(lanes(None), SETTINGS)
    race.records[PLAIN].steps.append(step)
    race.records[PLAIN].status = DONE
    view = race.snapshot().panes[PLAIN]
    assert view.tokens == (("abc", False), ("", False), ("", False)) and view.text == "abc"


def test_pipeline_cache_loads_once_and_refuses_incompatible_drafts():
    loaded = FakeLoaded(tiny_llama(seed=0, layers=2, vocab_size=80), vocab_size=80)
    calls = []

    def load(spec, device="auto", dtype="auto", **kwargs):
        calls.append(spec)
        return loaded

    @dataclass
    class Verdict:
        status: str
        reasons: list

    def check(target, draft):
        return Verdict("incompatible", ["different tokenizers: 49,152 vs 262,144 tokens"])

    cache = PipelineCache(load, check)
    assert cache.loaded("t") is None
    first = cache.get("t")
    assert cache.get("t") is first and cache.loaded("t") is first and calls == ["t"]
    assert cache.get("t", "ngram").draft_spec == "ngram"
    with pytest.raises(ValueError, match="different tokenizers"):
        cache.get("t", "other/model")
    assert "other/model" not in calls
    race = Race(race_lanes(cache, "t", "other/model", {PLAIN: [], SPECULATIVE: []}, PROMPT),
                SETTINGS)
    final = list(race.run())[-1]
    assert final.panes[PLAIN].status == SKIPPED and "cannot serve" in final.panes[PLAIN].error
    assert final.panes[SPECULATIVE].status == ERROR and "cannot serve" in final.panes[SPECULATIVE].error


def test_race_holds_the_device_lock_while_it_runs(loaded):
    lock = threading.RLock()
    seen = []

    def probe():
        """Runs in the race's worker: can another thread take the lock now?"""
        free = []
        t = threading.Thread(target=lambda: free.append(lock.acquire(blocking=False)))
        t.start()
        t.join()
        seen.append(free[0])
        return Pipeline(loaded, "none")

    final = list(Race(lanes(loaded, plain=probe), SETTINGS, device_lock=lock).run())[-1]
    assert seen == [False] and final.panes[PLAIN].status == DONE
    assert lock.acquire(blocking=False)  # released afterwards


def test_device_thread_runs_every_job_on_one_thread_in_order():
    from specdemo.services.race import DeviceThread
    device = DeviceThread()
    seen = []
    futures = [device.submit(lambda i=i: seen.append((i, threading.current_thread())) or i)
               for i in range(5)]
    assert [f.result(timeout=30) for f in futures] == list(range(5))
    assert [i for i, _ in seen] == list(range(5)) and len({t for _, t in seen}) == 1
    assert seen[0][1] is not threading.current_thread()
    assert device.call(lambda: device.on_device()) is True  # runs there...
    assert device.submit(lambda: device.call(threading.current_thread)).result(30) is seen[0][1]
    with pytest.raises(ZeroDivisionError):  # ...and errors come back to the caller
        device.call(lambda: 1 / 0)


def test_a_thread_can_adopt_the_device_role():
    from specdemo.services.race import DeviceThread
    device, stop = DeviceThread(), threading.Event()
    device.adopt_current_thread()
    future = device.submit(threading.current_thread)  # queued: no other thread is started
    threading.Timer(0.2, stop.set).start()
    device.serve_forever(stop, poll_s=0.05)
    assert future.result(timeout=1) is threading.current_thread()


def test_the_first_token_is_shown_at_once_not_after_the_update_interval(loaded):
    """With 30 s between page updates, the first snapshot with a token still comes while the
    decode runs (here: 0.2 s between events), not at the end."""
    import time

    def slow():
        pipe = Pipeline(loaded, "none")
        stream = pipe.stream

        def paced(*args, **kwargs):
            for event in stream(*args, **kwargs):
                yield event
                time.sleep(0.2)
        pipe.stream = paced
        return pipe
    race = Race(lanes(loaded, plain=slow), DecodeSettings(max_new_tokens=6, draft_length=2))
    snaps = list(race.run(min_interval_s=30.0))
    live = [s for s in snaps if not s.done and s.panes[PLAIN].stats is not None]
    assert live and live[0].panes[PLAIN].status == RUNNING
    assert live[0].panes[PLAIN].stats.new_tokens < 6 and snaps[-1].done


def test_a_fault_outside_the_lanes_ends_the_race_with_the_error(loaded, monkeypatch):
    """A fault that no lane catches (here in the preparation step) ends the race with that
    error in every unfinished pane; before, race.run waited for ever (seen with server lanes)."""
    def broken(self, pipes):
        raise AttributeError("'_NoModel' object has no attribute 'model'")
    monkeypatch.setattr(Race, "_warm", broken)
    race = Race(lanes(loaded), SETTINGS)
    race.start()
    race.join(timeout=120)  # before the fix: the fault escaped here and the lanes stayed loading
    final = race.snapshot()
    assert race.finished
    for name in (PLAIN, SPECULATIVE):
        assert final.panes[name].status == ERROR
        assert "no attribute 'model'" in final.panes[name].error


def test_server_lane_stats_without_per_drafter_counts_get_no_low_acceptance_warning():
    from specdemo.services.pipeline import low_acceptance_warnings
    stats = DecodeStats(new_tokens=40, drafted=50, accepted=1)
    stats.drafted_by = stats.accepted_by = None  # what a server lane reports: totals only
    assert low_acceptance_warnings(stats) == []


def test_with_endpoints_serves_only_the_lanes_named():
    """The one helper that puts servers in lanes (the page's Send, /race and compare): a lane
    with an endpoint becomes that server's lane with the same messages; the others stay ours."""
    from specdemo.services.endpoints import Endpoint
    from specdemo.services.race import with_endpoints
    ours = lanes(None)
    assert with_endpoints(ours, None) == ours and with_endpoints(ours, {PLAIN: None}) == ours
    mixed = with_endpoints(ours, {SPECULATIVE: Endpoint("http://127.0.0.1:9")})
    assert mixed[0] is ours[0] and mixed[1] is not ours[1]
    assert mixed[1].name == SPECULATIVE and mixed[1].speculative
    assert mixed[1].messages == ours[1].messages
    assert getattr(mixed[1].pipeline(), "is_endpoint", False)  # nothing is contacted yet
