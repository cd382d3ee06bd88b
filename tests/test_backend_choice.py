"""How ``auto`` picks a backend (specdemo/services/backend_rules.py, backend_choice.choose_backend):
the probe-then-time rule and the race weighing, with fake timings (no clock is asserted on)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from specdemo.core import machine
from specdemo.models import backends as mb
from specdemo.services import backend_choice as gb
from specdemo.services import backend_rules as bc
from specdemo.services import backend_store

# the busy-machine figures: seconds of one short forward per backend
PROBES = {"native-w8a8": 0.10, "native": 0.16, "transformers": 0.31, "int8": 3.7}


def fake_probe(seconds: dict[str, float], seen: list):
    def probe(name, limit_s):
        seen.append((name, limit_s))
        return seconds[name]
    return probe


def test_a_candidate_over_three_times_the_best_probe_is_never_timed_fully():
    seen, timed = [], []
    found = bc.probe_then_time(bc.order(list(PROBES)), fake_probe(PROBES, seen),
                               lambda name: timed.append(name) or PROBES[name])
    assert [name for name, _ in seen] == ["native-w8a8", "native", "transformers", "int8"]
    # every probe after the first is told the limit: 3x the best probe so far
    assert [limit for _, limit in seen] == [None, pytest.approx(0.3), pytest.approx(0.3),
                                            pytest.approx(0.3)]
    assert timed == ["native-w8a8", "native"]  # transformers 3.1x, int8 37x: probed only
    assert set(found.dropped) == {"transformers", "int8"}
    assert found.dropped["int8"] == "its probe took 3.7 s, 37.0x native-w8a8's"
    assert found.best == "native-w8a8" and found.probe_s == PROBES


def test_a_later_faster_probe_rules_out_an_earlier_survivor():
    timed = []
    found = bc.probe_then_time(["slow", "fast"], fake_probe({"slow": 1.0, "fast": 0.2}, []),
                               lambda name: timed.append(name) or 1.0)
    assert timed == ["fast"] and found.dropped["slow"] == "its probe took 1.0 s, 5.0x fast's"


def test_a_hopeless_probe_is_dropped_with_its_reason_and_nothing_else_is_lost():
    def probe(name, limit_s):
        if name == "int8":
            raise bc.Hopeless("its first forward took 4.0 s, over 10x the best probe")
        return {"a": 0.1, "b": 0.2}[name]
    found = bc.probe_then_time(["a", "int8", "b"], probe, lambda name: {"a": 2.0, "b": 1.0}[name])
    assert found.dropped == {"int8": "its first forward took 4.0 s, over 10x the best probe"}
    assert found.scores == {"a": 2.0, "b": 1.0} and found.best == "b"
    with pytest.raises(ValueError, match="no candidate"):
        bc.probe_then_time([], probe, lambda name: 0.0)


class CountingKV:
    """A KV cache whose forwards cost what a table says (seconds on a fake clock)."""

    def __init__(self, first_s: float, forward_s: float, clock: list) -> None:
        self.model = SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(num_embeddings=50))
        self.first_s, self.forward_s, self.clock = first_s, forward_s, clock
        self.length, self.calls = 0, 0

    def reset(self):
        self.length = 0

    def rollback(self, n):
        self.length = n

    def forward(self, ids, logits_to_keep=1):
        self.clock[0] += self.first_s if self.length == 0 else self.forward_s
        self.length += len(ids)
        self.calls += 1


def test_the_probe_stops_after_one_timed_forward_out_of_reach_and_rules_out_a_hopeless_start():
    clock = [0.0]
    now = lambda: clock[0]  # noqa: E731
    fast = CountingKV(0.1, 0.1, clock)
    assert bc.probe_s(fast, None, clock=now) == pytest.approx(0.1) and fast.calls == 3
    slow = CountingKV(0.5, 0.5, clock)
    assert bc.probe_s(slow, 0.3, clock=now) == pytest.approx(0.5) and slow.calls == 2
    hopeless = CountingKV(4.0, 3.7, clock)
    with pytest.raises(bc.Hopeless, match="first forward took 4.0 s"):
        bc.probe_s(hopeless, 0.3, clock=now)
    assert hopeless.calls == 1


def test_the_race_weighing_can_prefer_cheap_verification_over_a_cheap_step():
    step_fast = {1: 0.010, 5: 0.040, 9: 0.090}  # a quantised kernel: cheap step, dear verification
    verify_cheap = {1: 0.012, 5: 0.018, 9: 0.025}
    # a plain decode: the 1-token forward alone decides
    assert bc.race_cost_s(step_fast, False) == (0.010, 0)
    assert bc.race_cost_s(verify_cheap, False) == (0.012, 0)
    # a race with the prior acceptance: the speculative lane verifies, and that decides
    fast_cost, fast_k = bc.race_cost_s(step_fast, True)
    cheap_cost, cheap_k = bc.race_cost_s(verify_cheap, True)
    assert fast_k == 0 and fast_cost == pytest.approx(0.020)  # drafting does not pay there
    assert cheap_k == 4 and cheap_cost == pytest.approx(0.012 + 0.018 / bc.expected_tokens(4, 0.6))
    assert cheap_cost < fast_cost
    # a drafter that costs more than it saves on a backend: k 0 there
    assert bc.race_cost_s(verify_cheap, True, bc.LaneFacts(0.6, draft_s=0.02))[1] == 0


def test_acceptance_from_per_position_counts():
    assert bc.expected_tokens(4, 0.5) == pytest.approx(1.9375)
    # 10 rounds of 4 drafts: position 1 accepted 8 times, 2: 4, 3: 2, 4: 1
    assert bc.acceptance_of([10, 10, 10, 10], [8, 4, 2, 1]) == pytest.approx(15 / (10 + 8 + 4 + 2))
    assert bc.acceptance_of([], []) is None


REAL_TIME_WIDTHS = bc.time_widths  # the fixture below replaces it; the fake-clock test uses it


# --- choose_backend with fake measurements -------------------------------------------------------

@pytest.fixture
def chooser(monkeypatch, tmp_path):
    """choose_backend over fake candidates: probes and full timings from tables, a share of the
    CPU that the test sets, the store in a temporary folder."""
    state = {"share": 0.0, "timed": [], "probed": []}
    names = ("transformers", "int8", "native", "native-w8a8")
    monkeypatch.setattr(mb, "candidate_backends", lambda loaded: (names, []))
    monkeypatch.setattr(backend_store, "choice_path", lambda: tmp_path / "choice.json")
    monkeypatch.setattr(mb, "target_kv", lambda loaded: loaded.backend)
    monkeypatch.setattr(machine.OtherCpuUse, "share", lambda self: state["share"])
    monkeypatch.delenv(gb.CHOICE_ENV, raising=False)
    tables = {"native-w8a8": {1: 0.012, 5: 0.028, 9: 0.055},
              "native": {1: 0.014, 5: 0.018, 9: 0.020}}

    def probe(kv, limit_s, layers=()):
        state["probed"].append(kv)
        return PROBES[kv]

    def time_widths(kv, widths=bc.RACE_WIDTHS, layers=()):
        state["timed"].append((kv, layers))
        return tables[kv]
    monkeypatch.setattr(bc, "probe_s", probe)
    monkeypatch.setattr(bc, "time_widths", time_widths)
    loaded = SimpleNamespace(spec="tiny", dtype=torch.float32, device=torch.device("cpu"),
                             backend="transformers")
    return loaded, state


def test_auto_times_only_the_survivors_and_weighs_them_for_the_race(chooser):
    loaded, state = chooser
    choice = gb.choose_backend(loaded, bc.RaceLane("ngram"))
    assert state["probed"] == ["native-w8a8", "native", "transformers", "int8"]
    # 24.0 against 21.8 ms a token: a near tie, both timed again, the leader last
    assert [kv for kv, _ in state["timed"]] == ["native-w8a8", "native", "native-w8a8", "native"]
    assert set(choice.dropped) == {"transformers", "int8"}
    # w8a8 has the cheaper step, native the cheaper verification: the race picks native
    assert choice.backend == "native" and choice.draft_length == {"native-w8a8": 0, "native": 4}
    assert "weighed for a race with a drafter not measured per backend" in choice.reason
    assert "ruled out by a 5-token probe: transformers (its probe took 310 ms, 3.1x" in choice.reason
    plain = gb.choose_backend(loaded, bc.RaceLane("none"))  # another race: its own measurement
    assert plain.backend == "native-w8a8" and "weighed for a plain decode" in plain.reason


def test_a_busy_machines_choice_is_stored_marked_and_read_back(chooser):
    loaded, state = chooser
    state["share"] = 0.43
    first = gb.choose_backend(loaded)
    assert not first.cached and "machine busy: others used 43% of the CPU" in first.reason
    state["timed"].clear()
    again = gb.choose_backend(loaded)
    assert again.cached and state["timed"] == [] and again.backend == first.backend
    assert again.reason.startswith("measured earlier on this machine while other processes used "
                                   "43% of the CPU (SPECDEMO_BACKEND=recalibrate measures again): ")
    assert again.forward_s == first.forward_s and again.dropped == first.dropped
    state["share"] = 0.0
    quiet = gb.choose_backend(loaded, bc.RaceLane("none"))  # a plain decode: another entry
    stored = gb.choose_backend(loaded, bc.RaceLane("none"))
    assert stored.reason.startswith("measured earlier on this machine (SPECDEMO_BACKEND=")
    assert stored.backend == quiet.backend


def test_a_learned_drafter_is_measured_on_each_survivor_and_timed_with_its_features(chooser):
    loaded, state = chooser
    asked = []

    def facts(backend):
        asked.append(backend)
        return bc.LaneFacts(acceptance=0.9 if backend == "native-w8a8" else 0.3, draft_s=0.001,
                            drafted=40)
    choice = gb.choose_backend(loaded, bc.RaceLane("builtin:head", (2, 15, 27), source=object()),
                               facts)
    assert asked == ["native-w8a8", "native"]  # survivors only
    assert {layers for _, layers in state["timed"]} == {(2, 15, 27)}
    assert choice.acceptance == {"native-w8a8": 0.9, "native": 0.3}
    plain = gb.choose_backend(loaded, bc.RaceLane("ngram"))
    assert set(plain.acceptance.values()) == {None} and "acceptance 0.60 prior" in plain.reason
    assert choice.backend == "native-w8a8"  # its head accepts far more on its features
    assert "acceptance measured on each backend's own features" in choice.reason


def test_a_near_tie_is_timed_again_and_a_disturbed_first_timing_does_not_decide(chooser,
                                                                                monkeypatch):
    """What a fresh 2-core AMD EPYC (AVX2) stored: native-w8a8's first timing disturbed (12.9 ms
    against 9.9 later), ggml's 12.7: a near tie, so both are timed again, the leader last, and the
    faster timing of each width counts."""
    loaded, state = chooser
    first = {"native-w8a8": True}

    def time_widths(kv, widths=bc.RACE_WIDTHS, layers=()):
        state["timed"].append((kv, layers))
        if kv == "native-w8a8" and first.pop(kv, False):
            return {1: 0.0129, 5: 0.0291, 9: 0.0482}  # disturbed
        return {"native-w8a8": {1: 0.0099, 5: 0.0259, 9: 0.0455},
                "native": {1: 0.0127, 5: 0.0505, 9: 0.0883}}[kv]
    monkeypatch.setattr(bc, "time_widths", time_widths)
    choice = gb.choose_backend(loaded, bc.RaceLane("none"))
    assert [kv for kv, _ in state["timed"]] == ["native-w8a8", "native", "native-w8a8", "native"]
    assert choice.backend == "native-w8a8" and choice.forward_s["native-w8a8"][1] == 0.0099
    assert bc.close_runners_up({"a": 1.0, "b": 1.2, "c": 1.1}) == ["c"]
    assert bc.close_runners_up({"a": 1.0}) == []


def test_run_and_compare_read_one_stored_choice_for_a_target(chooser, monkeypatch):
    """A new user's report: ``run`` measured again and got one backend, ``compare`` minutes later
    read another from the store: a plain run was keyed (and weighed) apart from compare's race.
    Now a plain run is weighed as the race's plain lane and every drafter not measured per
    backend shares its entry: whichever command comes first measures, the others read it."""
    from specdemo.interfaces.decode_cli import _with_backend
    from specdemo.services import startup
    loaded, state = chooser
    loaded.model, loaded.vocab_size = None, 32
    monkeypatch.setattr(startup, "STEPS", startup.Steps())
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    # w8a8 has the cheaper one-token step, native the cheaper verification (the fixture's
    # tables): weighed for a plain decode alone they disagree, as the user saw
    assert gb.choose_backend(loaded, bc.RaceLane("none")).backend == "native-w8a8"
    state["timed"].clear()
    ran = _with_backend(loaded, "auto", "none")  # run's single lane (its default draft)
    timed = len(state["timed"])
    assert timed > 0  # measured once ...
    compared = _with_backend(loaded, "auto", "ngram")  # compare's default race
    assert len(state["timed"]) == timed  # ... and read back
    assert ran.backend == compared.backend == "native"
    assert gb.stored_choice(loaded, gb.race_lane(loaded, "none")).backend == "native"
    notes = [d.name for d in startup.STEPS.recent() if d.note]
    assert notes[-1].startswith("forward backend of tiny: native (measured earlier on this "
                                "machine") and "a plain run is weighed as this race's plain lane" \
        in notes[-1]


# --- the stored choice, checked (issue 52.5) ------------------------------------------------------

def _store(tmp_path) -> dict:
    import json
    return json.loads((tmp_path / "choice.json").read_text())


def _put(tmp_path, data: dict) -> None:
    import json
    (tmp_path / "choice.json").write_text(json.dumps(data))


@pytest.mark.parametrize("damage, said", [
    ({"backend": 42}, "its backend 42 is not one of this target's candidates here"),
    ({"backend": "ggml"}, "its backend 'ggml' is not one of this target's candidates here"),
    ({"machine": "another"}, "it was measured on another machine"),
    ({"cost_s": {"native": -1.0}}, "its cost_s holds -1.0 for native"),
    ({"forward_s": {"native": {"1": "fast"}}}, "its forward_s holds"),
    ({"acceptance": {"native": 3.0}}, "its acceptance holds 3.0 for native"),
    ({"other_cpu_share": "busy"}, "its other_cpu_share 'busy' is not a share"),
    ({"reason": None}, "its reason is not text"),
])
def test_a_damaged_stored_choice_is_ignored_said_and_measured_again(chooser, tmp_path, damage,
                                                                    said):
    loaded, state = chooser
    first = gb.choose_backend(loaded)
    data = _store(tmp_path)
    (key,) = data
    data[key].update(damage)
    _put(tmp_path, data)
    state["timed"].clear()
    again = gb.choose_backend(loaded)
    assert not again.cached and state["timed"]  # measured again ...
    assert again.backend == first.backend
    assert len(again.notes) == 1 and said in again.notes[0]  # ... saying what was ignored
    assert again.notes[0].startswith("the stored backend choice for this target was ignored: ")
    assert _store(tmp_path)[key]["backend"] == first.backend  # and stored anew


def test_a_stored_file_that_is_not_an_object_is_ignored_and_said(chooser, tmp_path):
    loaded, _ = chooser
    _put(tmp_path, [1, 2])
    choice = gb.choose_backend(loaded)
    assert choice.notes == [f"the stored backend choices in {tmp_path / 'choice.json'} were "
                            "ignored (not a JSON object)"]


def test_a_bogus_SPECDEMO_BACKEND_is_warned_about_on_the_start_up_and_changes_nothing(
        chooser, monkeypatch):
    from specdemo.services import startup
    loaded, state = chooser
    loaded.model, loaded.vocab_size = None, 32
    monkeypatch.setattr(startup, "STEPS", startup.Steps())
    monkeypatch.setattr(gb, "_SAID", set())
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    quiet = gb.choose_backend(loaded)
    monkeypatch.setenv(gb.CHOICE_ENV, "bogus")
    chosen, choice = gb.use_backend(loaded, "auto", "ngram")
    assert choice.cached and chosen.backend == quiet.backend  # the stored choice still holds
    notes = [d.name for d in startup.STEPS.recent() if d.note]
    assert notes[0] == ("SPECDEMO_BACKEND=bogus ignored: it takes only 'recalibrate' (measure "
                        "the backend choice again); choose a backend with --backend NAME")
    assert notes[1].startswith(f"forward backend of tiny: {quiet.backend} (measured earlier")
    monkeypatch.setenv(gb.CHOICE_ENV, "ReCalibrate")  # the one word it takes, any case
    state["timed"].clear()
    assert not gb.choose_backend(loaded).cached and state["timed"]


def test_a_bogus_SPECDEMO_BACKEND_is_printed_once(chooser, monkeypatch, capsys, caplog):
    """A new user's ``SPECDEMO_BACKEND=bogus python app.py`` printed the warning twice (a log
    warning and the start-up note), and again for each model loaded later."""
    from specdemo.services import startup
    loaded, _ = chooser
    loaded.model, loaded.vocab_size = None, 32
    monkeypatch.setattr(startup, "STEPS", startup.Steps())
    monkeypatch.setattr(gb, "_SAID", set())
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    gb.choose_backend(loaded)
    monkeypatch.setenv(gb.CHOICE_ENV, "bogus")
    with startup.printed():
        gb.use_backend(loaded, "auto", "ngram")
        gb.use_backend(loaded, "auto", "ngram")  # a second model load, e.g. another preset
    shown = capsys.readouterr().err + "".join(r.getMessage() + "\n" for r in caplog.records)
    assert shown.count("SPECDEMO_BACKEND=bogus ignored") == 1, shown


class ClockedKV:
    """A target whose forwards advance a fake clock by the seconds a table gives its backend
    in the machine's current phase (a transient just after set-up, or quiet)."""

    def __init__(self, backend: str, machine_state: dict, clock: list) -> None:
        self.model = SimpleNamespace(get_input_embeddings=lambda: SimpleNamespace(num_embeddings=50))
        self.device = torch.device("cpu")
        self.backend, self.machine, self.clock = backend, machine_state, clock

    def reset(self):
        pass

    def rollback(self, n):
        pass

    def forward(self, ids, logits_to_keep=1):
        step_s = self.machine["step_s"][self.machine["phase"]][self.backend]
        self.clock[0] += step_s * (1 + 0.1 * (len(ids) - 1))  # a wider forward costs a little more

    def forward_features(self, ids, logits_to_keep, layers):
        self.forward(ids, logits_to_keep)


def test_a_choice_made_under_a_transient_is_weighed_again_when_a_run_measures_far_from_it(
        chooser, monkeypatch, tmp_path):
    """Issue 52.5 on a fake clock: in the first minute after set-up both leaders ran slowly,
    native within 4% of native-w8a8 (11.0 against 11.5 ms a step), and native was stored; quiet,
    native-w8a8 takes 4.8 ms and native 5.6. A run that measures native's step at 5.6 ms (0.51x
    the stored estimate) on a quiet machine drops the entry, and the next start weighs again."""
    from specdemo.core.policy import measure_forward_s
    from specdemo.services import startup
    loaded, state = chooser
    clock = [0.0]
    now = lambda: clock[0]  # noqa: E731
    phase = {"phase": "transient", "step_s": {
        "transient": {"native": 0.0110, "native-w8a8": 0.0115},
        "quiet": {"native": 0.0056, "native-w8a8": 0.0048}}}
    kvs = {name: ClockedKV(name, phase, clock) for name in ("native", "native-w8a8")}

    def time_widths(kv, widths=bc.RACE_WIDTHS, layers=()):
        return REAL_TIME_WIDTHS(kvs[kv], widths, layers, clock=now)
    monkeypatch.setattr(bc, "time_widths", time_widths)
    monkeypatch.setattr(startup, "STEPS", startup.Steps())
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    loaded.model, loaded.vocab_size = None, 32
    chosen, first = gb.use_backend(loaded, "auto")  # a plain run: weighed as a race's plain lane
    assert first.backend == "native" and first.forward_s["native"][1] == pytest.approx(0.0110)
    assert chosen.backend_choice is first
    # a run close to the estimate, or one on a busy machine, concludes nothing
    phase["phase"] = "quiet"
    assert backend_store.recheck(chosen, {1: 0.0105}, 0.0) is None
    assert backend_store.recheck(chosen, {1: 0.0056}, 0.6) is None
    assert gb.stored_choice(loaded) is not None
    # the run's own forward-cost table, measured on the fake clock, quiet
    measured = measure_forward_s(kvs["native"], 4, clock=now)
    assert measured[1] == pytest.approx(0.0056)
    said = backend_store.recheck(chosen, measured, 0.0)
    assert said == ("the stored backend choice expected a one-token forward of 11.0 ms on "
                    "native, this run measured 5.6 ms (0.51x): the backends are weighed again "
                    "at the next start")
    assert gb.stored_choice(loaded) is None
    assert [e.get("dropped_because") for e in _store(tmp_path).values()] == [
        "a run measured a one-token forward of 5.6 ms on native, 0.51x the 11.0 ms it expected"]
    assert backend_store.recheck(chosen, measured, 0.0) is None  # said once
    again, second = gb.use_backend(loaded, "auto")  # the next start, quiet
    assert not second.cached and again.backend == "native-w8a8"
    # ... whose step says why it measures again
    steps = [d.name for d in startup.STEPS.recent(12) if not d.note]
    assert steps[-1].endswith("; measured again: the stored choice was dropped: a run measured "
                              "a one-token forward of 5.6 ms on native, 0.51x the 11.0 ms it "
                              "expected)")
    assert second.forward_s["native-w8a8"][1] == pytest.approx(0.0048)


def test_the_forward_cost_step_of_a_run_rechecks_the_stored_choice(monkeypatch):
    """startup.measure_forward_costs (draft length auto) hands its table to the recheck and says
    a wide miss as a start-up note."""
    from specdemo.services import startup
    steps = startup.Steps()
    monkeypatch.setattr(startup, "STEPS", steps)
    seen = []
    monkeypatch.setattr(backend_store, "recheck",
                        lambda loaded, forward_s, share: seen.append(forward_s) or "weighed again")
    pipe = SimpleNamespace(forward_costs_known=False, forward_costs=lambda: {1: 0.005},
                           target=SimpleNamespace(spec="t", backend="native"))
    startup.measure_forward_costs(pipe)
    assert seen == [{1: 0.005}] and [d.name for d in steps.recent() if d.note] == ["weighed again"]


def test_costs_drops_a_stored_choice_another_backend_beats_widely_on_a_quiet_machine(monkeypatch, tmp_path):
    """Issue 52.5 as a new user met it: native-int8 stored under load ran 22.8 plain tokens/s
    where native-w8a8 ran 78.4 in the same `costs` table. A margin within WIDE_MARGIN, a busy
    machine, or a choice that is not stored conclude nothing; a wide margin on a quiet machine
    drops the entry once."""
    monkeypatch.setattr(backend_store, "choice_path", lambda: tmp_path / "choice.json")
    backend_store.write("k", {"backend": "native-int8"})
    choice = gb.BackendChoice("native-int8", "stored", {}, key="k")
    rates = {"native-int8": 22.8, "native-w8a8": 78.4, "transformers": None}
    assert backend_store.recheck_against_others(choice, {"native-int8": 60.0, "native-w8a8": 78.4}, 0.0) is None
    assert backend_store.recheck_against_others(choice, rates, 0.6) is None
    assert "k" in _store(tmp_path)
    said = backend_store.recheck_against_others(choice, rates, 0.0)
    assert said == ("the stored backend choice is native-int8 (22.8 plain tokens/s now), but native-w8a8 "
                    "measured 78.4 (3.44x): the backends are weighed again at the next start")
    assert _store(tmp_path)["k"] == {  # no choice left, only why it was dropped
        "dropped_because": "costs measured native-w8a8 at 78.4 plain tokens/s, 3.44x the "
                           "stored choice native-int8 (22.8)",
        "machine": backend_store.machine_fingerprint(), "key_parts": None}
    assert backend_store.read("k", ("native-int8", "native-w8a8")) == (None, None)
    assert choice.key is None
    assert backend_store.recheck_against_others(choice, rates, 0.0) is None  # said once


# --- an identical command reads the stored choice (a new user's report) ---------------------------

def _omp(monkeypatch, policy: str, environ: dict) -> None:
    """This process's OpenMP decision (specdemo/_omp.py) as ``policy`` with ``environ``'s
    variables in effect."""
    from specdemo import _omp
    monkeypatch.setattr(_omp, "DECISION", {"policy": policy, "others_running": 0, "cores": 2,
                                           "setting": dict(environ)})
    for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)


def test_an_identical_command_reads_the_choice_when_the_load_flips_openmp_waiting(
        chooser, monkeypatch):
    """A new user's report: the same compare three times; the second measured again (16.6 s)
    with no reason given. specdemo sets OMP_WAIT_POLICY=PASSIVE when another runnable task is
    seen at start (specdemo/_omp.py), and the key held it: on a busy 2-core machine it flips
    between identical commands. Now specdemo's own setting is not keyed; the reason read back
    says how the threads waited when it was measured."""
    from specdemo.services import startup
    loaded, state = chooser
    loaded.model, loaded.vocab_size = None, 32
    monkeypatch.setattr(startup, "STEPS", startup.Steps())
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    _omp(monkeypatch, "spin", {})
    first = gb.use_backend(loaded, "auto", "ngram")[1]
    assert not first.cached and first.why == "first choice here: none stored for tiny and " \
        "this race on this machine yet"
    assert startup.STEPS.recent(12)[0].name.endswith(
        "; first choice here: none stored for tiny and this race on this machine yet)")
    state["timed"].clear()
    _omp(monkeypatch, "passive", {"OMP_WAIT_POLICY": "PASSIVE"})
    second = gb.use_backend(loaded, "auto", "ngram")[1]
    assert second.cached and not state["timed"] and second.backend == first.backend
    assert second.reason.startswith("measured earlier on this machine (SPECDEMO_BACKEND="
                                     "recalibrate measures again; OpenMP threads spun then, "
                                     "waited passively now, as chosen from the load at start")
    _omp(monkeypatch, "spin", {})
    assert gb.use_backend(loaded, "auto", "ngram")[1].cached and not state["timed"]


def test_a_waiting_the_user_set_is_a_reason_to_measure_again_and_is_said(chooser, monkeypatch):
    from specdemo.services import startup
    loaded, state = chooser
    loaded.model, loaded.vocab_size = None, 32
    monkeypatch.setattr(startup, "STEPS", startup.Steps())
    monkeypatch.setattr(gb, "_compile_native_once", lambda loaded, backend: None)
    _omp(monkeypatch, "user", {"OMP_WAIT_POLICY": "active"})
    gb.use_backend(loaded, "auto", "ngram")
    _omp(monkeypatch, "spin", {})
    state["timed"].clear()
    again = gb.use_backend(loaded, "auto", "ngram")[1]
    assert not again.cached and state["timed"]
    said = ("measured again: the stored choice was for OpenMP waiting OMP_WAIT_POLICY=active, "
            "now automatic")
    assert again.why == said
    assert [d.name for d in startup.STEPS.recent(12) if not d.note][-1].endswith(f"; {said})")


def test_a_choice_stored_by_an_earlier_specdemo_is_said_when_the_first_one_is_measured(
        chooser, tmp_path):
    """Entries written before the key's parts were stored cannot say what differs; the first
    choice measured says that they are keyed otherwise."""
    loaded, _ = chooser
    _put(tmp_path, {"0123": {"backend": "native", "machine": backend_store.machine_fingerprint()}})
    assert gb.choose_backend(loaded).why == (
        "first choice here: none stored for tiny and this race on this machine yet (choices "
        "stored by an earlier specdemo are keyed otherwise)")
    assert gb.lookup(loaded)[0].cached  # and now read back


def test_a_part_not_read_now_is_not_named_as_what_changed(tmp_path, monkeypatch):
    """A new user's step read "the stored choice was for GGUF size 98362432, now None, ...,
    candidates transformers/ggml/..., now transformers/native/...": the GGUF is read only when
    ggml is a candidate, so its parts follow from the candidates and are not named."""
    import json
    from specdemo.services import backend_store as store
    path = tmp_path / "backend-choice.json"
    monkeypatch.setattr(store, "choice_path", lambda: path)
    theirs = {"target": "t", "GGUF size": 98362432, "candidates": ["transformers", "ggml"]}
    path.write_text(json.dumps({"old": {"machine": store.machine_fingerprint(),
                                        "backend": "ggml", "key_parts": theirs}}))
    said = store.miss_reason("k", {"target": "t", "GGUF size": None,
                                   "candidates": ["transformers", "native"]})
    assert said == ("measured again: the stored choice was for candidates transformers/ggml, "
                    "now transformers/native")
