"""The draft list never blocks the page while it is checked (issue 11 item 1, issue 39 item 3): a
race does not wait for a compatibility check of a draft the user did not pick (a model draft's
tokenizer check runs in a process that stops while a race runs), and a draft picked meanwhile is
kept."""

from __future__ import annotations

import os
import threading

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

from specdemo.checks import compat
from specdemo.interfaces import ui  # noqa: E402
from specdemo.checks.compat import COMPATIBLE, Verdict  # noqa: E402

IN_PROCESS = "early-exit:1"  # a check computed in the app (model drafts go to the check process)


def test_a_race_does_not_wait_for_a_draft_check(monkeypatch):
    started, release = threading.Event(), threading.Event()

    def slow_check(target, draft, **kwargs):
        started.set()
        release.wait(30)
        return Verdict(COMPATIBLE, ["fine"])
    monkeypatch.setattr(compat, "check_specs", slow_check)
    monkeypatch.setattr(ui, "_VERDICTS", {})
    checking = threading.Thread(target=ui._verdict, args=("builtin:t", IN_PROCESS), daemon=True)
    checking.start()
    try:
        assert started.wait(30)
        got = ui.LOAD_LOCK.acquire(timeout=2)  # what a race takes first (Race.device_lock)
        assert got, "a race would wait for the draft check"
        ui.LOAD_LOCK.release()
    finally:
        release.set()
        checking.join(30)
    assert ui._VERDICTS[("builtin:t", IN_PROCESS)].status == COMPATIBLE


def test_the_draft_checks_show_no_spinner_over_the_draft_list():
    """gradio's default progress ("full") covers the output components with a spinner: the draft
    list could not be used while its check ran. "minimal" shows only the elapsed time."""
    demo = ui.build_ui()
    checks = [f for f in demo.fns.values() if f.concurrency_id == "compat"
              and any(getattr(o, "elem_id", None) == "draft-refused" for o in f.outputs)]
    assert len(checks) == 3  # after page load, after a preset change, re-check
    assert {f.show_progress for f in checks} == {"minimal"}


def test_a_draft_picked_during_the_check_is_kept(monkeypatch):
    monkeypatch.setattr(ui, "engine_imports", lambda: None)
    monkeypatch.setattr(ui, "draft_options", lambda target, presets: (
        [("ngram", "ngram"), ("self", "self")], []))
    update, _ = ui.check_drafts(None, "self")
    assert "value" not in update  # the dropdown keeps whatever is in it now
    update, _ = ui.check_drafts(None, "builtin:refused")
    assert update["value"] == "ngram"  # the pairing's own draft


def test_draft_checks_run_at_the_lowest_cpu_priority(monkeypatch):
    """A check that a race overtakes must not be timed as part of the race: it computes on a
    thread of nice 19 (Linux), not on the page's worker thread."""
    import sys
    seen = {}

    def check(target, draft, **kwargs):
        seen["thread"] = threading.current_thread().name
        seen["nice"] = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
        return Verdict(COMPATIBLE, ["fine"])
    monkeypatch.setattr(compat, "check_specs", check)
    monkeypatch.setattr(ui, "_VERDICTS", {})
    before = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    assert ui._verdict("builtin:t", IN_PROCESS).status == COMPATIBLE
    assert seen["thread"].startswith("specdemo-checks")
    assert threading.current_thread().name != seen["thread"]
    if sys.platform.startswith("linux"):
        assert seen["nice"] == 19
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == before  # caller untouched


def test_the_api_defaults_to_the_preset_the_app_was_started_with(monkeypatch):
    """`python app.py --preset X`: a /race call that names no preset races X, as the page does."""
    from specdemo.services import presets
    from specdemo.interfaces import ui_state
    default = presets.default_preset().name
    assert ui_state._default_preset_name(None) == default
    app = ui_state.AppSettings(preset="smollm2-135m-int4-ngram")
    assert ui_state._default_preset_name(None, app) == "smollm2-135m-int4-ngram"
    assert ui_state._default_preset_name("smollm2-135m-self", app) == "smollm2-135m-self"


def test_model_status_names_a_quantised_target(monkeypatch):
    """An int4 target is not shown as a float32 one."""
    from types import SimpleNamespace as NS

    import torch

    from specdemo.interfaces import ui_state
    target = NS(spec="builtin:smollm2-135m", dtype=torch.float32, device="cpu", load_s=4.6,
                quantization="int4")
    monkeypatch.setattr(ui_state.CACHE, "loaded", lambda *a: NS(target=target, draft=None))
    line = ui_state.model_status("smollm2-135m-int4-ngram", "ngram")
    assert "(int4 torchao weights, rest float32, on cpu, 4.6 s)" in line
    target.quantization = None
    assert "(float32 on cpu, 4.6 s)" in ui_state.model_status("smollm2-135m-ngram", "ngram")


def test_the_models_line_and_the_preset_text_name_the_backend_the_race_runs(monkeypatch):
    """Issue 42 item 9: a float32 load raced on native-w8a8 is not called float32."""
    from types import SimpleNamespace as NS

    import torch

    from specdemo.interfaces import ui, ui_state
    target = NS(spec="builtin:smollm2-135m", dtype=torch.float32, device="cpu", load_s=4.6,
                quantization=None, backend="native-w8a8")
    monkeypatch.setattr(ui_state.CACHE, "loaded", lambda *a: NS(target=target, draft=None))
    line = ui_state.model_status("smollm2-135m-ngram", "ngram")
    assert ("(native-w8a8: int8 weights and int8 activations in our C forward, loaded from "
            "float32 on cpu, 4.6 s)") in line
    info = ui.preset_info("smollm2-135m-ngram")
    assert "runs on native-w8a8: int8 weights and int8 activations" in info
    assert "· float32." not in info
    monkeypatch.setattr(ui_state.CACHE, "loaded", lambda *a: None)  # nothing loaded yet
    assert "float32; forward backend chosen at load (auto)" in ui.preset_info("smollm2-135m-ngram")


def test_model_status_names_a_stacked_drafter(monkeypatch):
    """The default preset's draft is a learned drafter with prompt lookup over it (Combined)."""
    from types import SimpleNamespace as NS

    import torch

    from specdemo.interfaces import ui_state
    from specdemo.models.learned import Combined
    target = NS(spec="builtin:smollm2-135m", dtype=torch.float32, device="cpu", load_s=1.2,
                quantization=None)
    draft = Combined(NS(spec="builtin:smollm2-135m-eagle3", warnings=[]), load_s=0.1)
    monkeypatch.setattr(ui_state.CACHE, "loaded", lambda *a: NS(target=target, draft=draft))
    line = ui_state.model_status("smollm2-135m-eagle3-ngram", "builtin:smollm2-135m-eagle3+ngram")
    assert "draft `builtin:smollm2-135m-eagle3+ngram` loaded (0.1 s)" in line


def test_a_draft_check_waits_while_a_race_is_queued_or_running(monkeypatch):
    """Its CPU would be timed as part of the race: it starts only once no race is active."""
    from specdemo.core.machine import ActiveRaces
    races = ActiveRaces()
    monkeypatch.setattr(ui, "ACTIVE_RACES", races)
    monkeypatch.setattr(ui, "_VERDICTS", {})
    started = threading.Event()

    def check(target, draft, **kwargs):
        started.set()
        return Verdict(COMPATIBLE, ["fine"])
    monkeypatch.setattr(compat, "check_specs", check)
    races.begin()
    checking = threading.Thread(target=ui._verdict, args=("builtin:t", IN_PROCESS), daemon=True)
    checking.start()
    try:
        assert not started.wait(0.5), "the check ran during a race"
    finally:
        races.end()
    assert started.wait(30)
    checking.join(30)
    assert ui._VERDICTS[("builtin:t", IN_PROCESS)].status == COMPATIBLE


def test_races_are_counted_until_their_device_work_is_done():
    from specdemo.core.machine import ACTIVE_RACES
    from specdemo.services.race import Race
    assert ACTIVE_RACES.wait_idle(5)
    race = Race([], None, None)
    release = threading.Event()
    monkey_work = lambda: release.wait(30)  # noqa: E731
    race._work = monkey_work
    race.start()
    assert not ACTIVE_RACES.wait_idle(0.2)
    release.set()
    assert ACTIVE_RACES.wait_idle(30)


def test_refused_input_is_not_printed_as_a_traceback():
    """A bad value from the page or the API is the user's to fix: gradio shows the message but
    the app's terminal gets no traceback for it (a fresh user saw nine for nine refusals)."""
    import gradio as gr
    import pytest
    with pytest.raises(gr.Error) as caught:
        ui.race_api("   ", max_new_tokens=4)
    assert "the prompt is empty" in str(caught.value)
    assert getattr(caught.value, "print_exception", False) is False


# --- model drafts: the check process ------------------------------------------------------------

# A stand-in for the check process: it answers its one request once the file the request names
# as the draft exists (so the test decides when a "long tokenizer conversion" ends).
SLOW_CHILD = """
import json, os, sys, time
ask = json.loads(sys.stdin.readline())
while not os.path.exists(ask["draft"]):
    time.sleep(0.02)
print(json.dumps({"status": "incompatible", "reasons": ["different tokenizers"]}), flush=True)
"""


def _status(pid: int) -> str:
    import psutil
    return psutil.Process(pid).status()


def test_send_does_not_wait_on_the_check_of_a_draft_the_user_did_not_pick(monkeypatch, tmp_path):
    """A model draft's check in progress (the Gemma 3 tokenizer took 86 s) is stopped while a
    race runs: the race starts and finishes meanwhile, and the check resumes after it."""
    import sys

    import pytest

    from specdemo.core.machine import ACTIVE_RACES
    from specdemo.services import check_worker
    from specdemo.services import pipeline as pipeline_module
    from specdemo.services.race import PLAIN, SPECULATIVE
    from test_warmup import Loaded, race_of
    from tiny import tiny_llama
    if not check_worker.CAN_STOP:
        pytest.skip("no SIGSTOP here: the check process only runs at the lowest priority")
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path))
    worker = check_worker.CheckWorker(ACTIVE_RACES, [sys.executable, "-c", SLOW_CHILD])
    marker = tmp_path / "conversion-done"
    result = {}
    checking = threading.Thread(target=lambda: result.update(
        verdict=worker.verdict("builtin:smollm2-135m", str(marker))), daemon=True)
    checking.start()
    try:
        while worker._proc is None:  # the check is running in its process
            threading.Event().wait(0.01)
        seen = []
        real_decode = pipeline_module.decode

        def decode(*args, **kwargs):  # every decode of the race, warm-ups included
            seen.append(_status(worker._proc.pid))
            return real_decode(*args, **kwargs)
        monkeypatch.setattr(pipeline_module, "decode", decode)
        race = race_of(Loaded(tiny_llama(seed=7, layers=2)), "ngram", 3)
        race.start()
        race.join(120)
        assert race.records[PLAIN].status == race.records[SPECULATIVE].status == "done"
        assert seen and set(seen) == {"stopped"}  # the check took no CPU while the race ran
        assert "verdict" not in result  # and the race did not wait for it
        assert ACTIVE_RACES.wait_idle(30) and not worker.stopped
        assert _status(worker._proc.pid) != "stopped"
        marker.touch()
        checking.join(60)
        assert result["verdict"] == Verdict("incompatible", ["different tokenizers"])
    finally:
        marker.touch()
        worker.close()


def test_model_drafts_are_checked_in_the_check_process_and_others_here(monkeypatch):
    asked = []

    class Worker:
        def verdict(self, target, draft):
            asked.append(draft)
            return Verdict(COMPATIBLE, ["same vocabulary"])
    monkeypatch.setattr(ui, "_worker", lambda: Worker())
    monkeypatch.setattr(ui, "_VERDICTS", {})
    monkeypatch.setattr(compat, "check_specs", lambda target, draft, **k: Verdict(COMPATIBLE, ["here"]))
    assert ui._verdict("builtin:t", "builtin:gemma3-270m").reasons == ["same vocabulary"]
    assert ui._verdict("builtin:t", IN_PROCESS).reasons == ["here"]
    assert asked == ["builtin:gemma3-270m"]


def test_the_check_process_answers_each_request_and_reports_errors_in_one_line(monkeypatch):
    import io
    import json

    import pytest

    from specdemo.models.loading import ModelLoadError
    from specdemo.services import check_worker

    def check(target, draft, **kwargs):
        if draft == "broken":
            raise ModelLoadError("broken has no tokenizer")
        return Verdict(COMPATIBLE, [f"{draft} fits {target}"])
    monkeypatch.setattr(compat, "check_specs", check)
    requests = io.StringIO("".join(json.dumps({"target": "t", "draft": d}) + "\n"
                                   for d in ("d1", "broken")))
    replies = io.StringIO()
    check_worker.serve(requests, replies, idle_exit_s=0)
    first, second = [json.loads(line) for line in replies.getvalue().splitlines()]
    assert check_worker._answer(first) == Verdict(COMPATIBLE, ["d1 fits t"])
    assert second == {"error": "broken has no tokenizer", "type": "ModelLoadError"}
    with pytest.raises(ModelLoadError, match="^broken has no tokenizer$"):
        check_worker._answer(second)


APP_KILLED_DURING_A_RACE = """
import os, signal, sys
from specdemo.core.machine import ActiveRaces
from specdemo.services.check_worker import CheckWorker
races = ActiveRaces()
worker = CheckWorker(races, [sys.executable, "-c", "import sys; sys.stdin.readline()"])
worker._process()
races.begin()  # a race: the child is stopped (begin returns once it is)
print(worker._proc.pid, flush=True)
os.kill(os.getpid(), signal.SIGKILL)  # the app dies without its exit handlers
"""


def test_a_stopped_check_process_does_not_outlive_the_app():
    import subprocess
    import sys
    import time

    import psutil
    import pytest

    from specdemo.services import check_worker
    if not check_worker.CAN_STOP:
        pytest.skip("no SIGSTOP here")
    app = subprocess.run([sys.executable, "-c", APP_KILLED_DURING_A_RACE], capture_output=True,
                         text=True, timeout=120)
    pid = int(app.stdout.split()[0])
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                break
        except psutil.NoSuchProcess:
            break
        time.sleep(0.05)
    else:
        psutil.Process(pid).kill()
        raise AssertionError("the stopped check process outlived the app")


def test_the_check_process_hears_of_the_first_race_and_the_last():
    from specdemo.core.machine import ActiveRaces
    races, heard = ActiveRaces(), []
    assert races.on_change(heard.append) is False
    races.begin()
    races.begin()  # a second race queued: the child is stopped already
    races.end()
    assert heard == [True]
    races.end()
    assert heard == [True, False]
    races.begin()
    assert ActiveRaces.on_change(races, heard.append) is True  # a race is running now
