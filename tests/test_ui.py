"""The real app on the built-in model, driven through gradio_client (as gradio's own tests do)."""

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

os.environ["GRADIO_ANALYTICS_ENABLED"] = "False"

from gradio_client import Client  # noqa: E402
from gradio_client.exceptions import AppError  # noqa: E402
from gradio_client.utils import Status  # noqa: E402

from specdemo.interfaces import ui  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
PROMPT = "Repeat this sentence exactly: The quick brown fox jumps over the lazy dog by the river."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def other_address() -> str | None:
    """A non-loopback address of this machine (``hostname -I``), or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    addresses = [a for a in out.split() if ":" not in a and not a.startswith("127.")]
    return addresses[0] if addresses else None


def answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=2):
            return True
    except OSError:
        return False


@pytest.fixture(scope="module")
def server():
    port = free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    yield port
    demo.close()


@pytest.fixture(scope="module")
def client(server):
    return Client(f"http://127.0.0.1:{server}/", verbose=False)


def race(client, **kwargs):
    kwargs.setdefault("prompt", PROMPT)
    kwargs.setdefault("max_new_tokens", 24)
    return client.predict(api_name="/race", **kwargs)


def check_pane(pane):
    assert pane["status"] == "done" and pane["error"] is None
    assert pane["new_tokens"] == len(pane["token_ids"]) == len(pane["from_draft"])
    assert sum(pane["from_draft"]) == pane["accepted"] <= pane["drafted"]
    assert pane["tokens_per_s"] == pytest.approx(pane["new_tokens"] / pane["elapsed_s"])
    assert 0 < pane["ttft_s"] <= pane["elapsed_s"]


@pytest.mark.slow
def test_race_api_both_panes_finish_and_agree(client):
    result = race(client, draft="ngram", draft_length="4")
    plain, spec = result["plain"], result["speculative"]
    check_pane(plain)
    check_pane(spec)
    assert plain["drafted"] == 0 and plain["acceptance_rate"] is None
    assert spec["new_tokens"] == plain["new_tokens"]
    assert spec["token_ids"] == plain["token_ids"] and spec["text"] == plain["text"]
    assert result["identical"] is True and result["first_divergence"] is None
    assert spec["drafted"] > 0  # the answer copies the prompt: prompt lookup has something to propose
    assert spec["mean_acceptance_length"] == pytest.approx(
        (spec["new_tokens"] - 1) / spec["target_forwards"])
    assert result["speedup"] == pytest.approx(spec["tokens_per_s"] / plain["tokens_per_s"])
    assert result["draft"] == "ngram"
    why = result["explanation"]  # stats.explain: the page's line under the speedup
    assert why["mean_acceptance_length"] == pytest.approx(spec["mean_acceptance_length"])
    assert why["step_s"] == pytest.approx(plain["verify_s"] / plain["target_forwards"])
    assert why["break_even_mean_acceptance_length"] == pytest.approx(
        why["verify_cost_steps"] + why["draft_cost_steps"])
    # the sentence the page shows, from the same figures
    assert f"this run got {why['mean_acceptance_length']:.2f}" in result["why"]


@pytest.mark.slow
def test_self_draft_marks_every_drafted_token(client):
    result = race(client, prompt="Write a long story about a lighthouse keeper.", draft="self",
                  draft_length="4", max_new_tokens=17)
    spec = result["speculative"]
    check_pane(spec)
    assert result["identical"] is True and spec["finish_reason"] == "length"
    # 1 prefill token, 3 rounds of 4 accepted drafts + 1 bonus token, then 1 plain step (no room
    # left to draft): 1 + 15 + 1 = 17 tokens, 12 drafted, 12 accepted, 4 target forwards.
    assert spec["accepted"] == spec["drafted"] == 12 and spec["target_forwards"] == 4
    assert spec["acceptance_rate"] == 1.0


@pytest.mark.slow
def test_stop_keeps_what_was_produced(client):
    # the same prompt and draft once, short: its warm-up (untimed, before the plain lane) is done,
    # so the Stop below lands in the plain lane's decode rather than in the preparation
    race(client, prompt="Write a long story about a lighthouse keeper.", max_new_tokens=2, draft="ngram")
    job = client.submit(api_name="/race", prompt="Write a long story about a lighthouse keeper.",
                        max_new_tokens=400, draft="ngram")
    time.sleep(3)
    client.predict(api_name="/stop")
    result = job.result(timeout=120)
    plain, spec = result["plain"], result["speculative"]
    assert plain["status"] == "stopped" and plain["finish_reason"] == "cancelled"
    assert 1 <= plain["new_tokens"] < 400 and len(plain["token_ids"]) == plain["new_tokens"]
    assert spec["status"] == "skipped" and "stopped" in spec["error"]
    assert result["identical"] is None


@pytest.mark.slow
def test_bad_inputs_give_readable_messages(client):
    with pytest.raises(AppError, match="prompt is empty"):
        race(client, prompt="   ")
    with pytest.raises(AppError, match="max_new_tokens must be a whole number from 1 to 8191"):
        race(client, prompt="hi", max_new_tokens=9000)  # beyond the config's context: up front
    result = race(client, prompt="hi", max_new_tokens=8190)  # the prompt's tokens tip it over
    for name in ("plain", "speculative"):
        assert result[name]["status"] == "error"
        assert "exceeds the model's context of 8192" in result[name]["error"]
    assert result["speedup_note"] == ("not compared: neither run started: "
                                      + result["plain"]["error"])


@pytest.mark.slow
def test_refused_draft_stops_the_race_before_either_pane_runs(client):
    result = race(client, draft="builtin:gemma3-270m", max_new_tokens=8)
    assert result["speculative"]["status"] == "error"
    assert "cannot serve" in result["speculative"]["error"]
    assert "different tokenizers" in result["speculative"]["error"]
    assert result["plain"]["status"] == "skipped" and result["plain"]["new_tokens"] == 0
    assert set(result["plain"]) == set(result["speculative"])  # the same keys in every lane
    assert result["plain"]["error"].startswith("not run: the speculative run cannot start")


# --- issue 11 item 5: bad input is refused with the field and the valid values -------------

@pytest.mark.parametrize("kwargs, message", [
    ({"draft_length": "0"}, "draft_length must be 'auto' or a whole number from 1 to 64, got '0'"),
    ({"draft_length": 0}, "draft_length must be 'auto' or a whole number from 1 to 64, got 0"),
    ({"preset": "nope"}, "preset 'nope' does not exist; valid presets: gemma2-9b-2b, "),
    ({"temperature": "abc"}, "temperature must be a number of at least 0, got 'abc'"),
    ({"max_new_tokens": "many"}, "max_new_tokens must be a whole number of at least 1, got 'many'"),
    ({"draft": "early-exit:x"}, "early-exit's layer count 'x' is not a whole number"),
])
@pytest.mark.slow
def test_race_api_refuses_bad_values_with_the_field_and_valid_values(client, kwargs, message):
    with pytest.raises(AppError) as caught:
        race(client, **kwargs)
    assert message in str(caught.value)
    assert "could not convert" not in str(caught.value) and "codec" not in str(caught.value)


def test_race_api_refuses_a_lone_surrogate_with_the_field_named():
    """JSON can carry "\\ud800" (gradio_client itself cannot encode it, so call the endpoint's
    function); the tokenizer would fail on it with a raw TypeError or codec message."""
    import gradio as gr
    with pytest.raises(gr.Error, match="prompt has a character that is not valid text at position 3"):
        ui.race_api("hi \ud800 there", max_new_tokens=4)


@pytest.mark.slow
def test_missing_draft_is_found_before_the_plain_run(client, monkeypatch):
    """Not cached and the hub does not answer: refused at once, as the command line refuses it;
    when the hub answers the load finds it missing before the plain run (the pane's error)."""
    import specdemo.models.loading as models
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: False)
    with pytest.raises(AppError) as caught:
        race(client, draft="someone/no-such-model", max_new_tokens=8)
    assert ("draft 'someone/no-such-model' is not in the local Hugging Face cache and the model "
            "hub is not reachable") in str(caught.value)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: True)
    result = race(client, draft="someone/no-such-model", max_new_tokens=8)
    assert result["speculative"]["status"] == "error"
    assert "someone/no-such-model" in result["speculative"]["error"]
    assert result["plain"]["status"] == "skipped" and result["plain"]["token_ids"] == []


@pytest.mark.slow
def test_two_clients_are_queued_not_run_together(server):
    first, second = (Client(f"http://127.0.0.1:{server}/", verbose=False) for _ in range(2))
    job1 = first.submit(api_name="/race", prompt=PROMPT, max_new_tokens=24, draft="ngram")
    time.sleep(0.5)
    job2 = second.submit(api_name="/race", prompt=PROMPT, max_new_tokens=24, draft="ngram")
    seen = set()
    while not job1.done():
        seen.add(job2.status().code)
        time.sleep(0.05)
    r1, r2 = job1.result(timeout=120), job2.result(timeout=120)
    assert Status.IN_QUEUE in seen
    assert r1["plain"]["token_ids"] == r2["plain"]["token_ids"]
    assert r1["identical"] and r2["identical"]


@pytest.mark.slow
def test_listens_on_loopback_only(server):
    assert answers("127.0.0.1", server)
    other = other_address()
    if other is None:
        pytest.skip("this machine has no non-loopback address to test against")
    assert not answers(other, server)


@pytest.mark.slow
def test_host_flag_changes_the_address():
    other = other_address()
    if other is None:
        pytest.skip("this machine has no non-loopback address to test against")
    port = free_port()
    proc = subprocess.Popen([sys.executable, "app.py", "--no-browser", "--host", other,
                             "--port", str(port)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 120
        while not answers(other, port) and time.monotonic() < deadline:
            assert proc.poll() is None, "app.py exited early"
            time.sleep(0.3)
        assert answers(other, port)
        assert not answers("127.0.0.1", port)
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_privacy_line_states_the_facts(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    line = ui.privacy_html("127.0.0.1", share=False)
    for fact in ("listening on 127.0.0.1", "usage analytics off", "no share link",
                 "HF_HUB_OFFLINE=1", "remote code from model repositories: off"):
        assert fact in line
    line = ui.privacy_html("0.0.0.0", share=True)
    assert "reachable from your network" in line and "share link ON" in line


# --- the page's helpers and the Send handler, in-process -----------------------------------

def test_tokens_html_marks_one_span_per_token():
    tokens = [("def", False), (" f", True), ("", True), ("<x>\n", False)]
    out = ui.tokens_html(tokens, highlight=True)
    assert out.count('class="sd-tok sd-draft"') == 2
    assert out.count('class="sd-tok sd-target"') == 2
    assert "&lt;x&gt;<br>" in out and "\n" not in out  # escaped, no newline for markdown to parse
    assert "sd-tok " not in ui.tokens_html(tokens, highlight=False)


def test_failed_turns_stay_visible_but_out_of_the_model_prompt():
    turns = [{"user": "a", "text": "A", "tokens": [["A", False]], "status": "done", "error": None},
             {"user": "b", "text": "", "tokens": [], "status": "error", "error": "out of memory"},
             {"user": "c", "text": "C", "tokens": [["C", True]], "status": "stopped", "error": None}]
    assert ui.model_messages(turns) == [
        {"role": "user", "content": "a"}, {"role": "assistant", "content": "A"},
        {"role": "user", "content": "c"}, {"role": "assistant", "content": "C"}]
    shown = ui.chat_messages(turns, speculative=True, highlight=True)
    assert [m["role"] for m in shown] == ["user", "assistant"] * 3
    assert "out of memory" in shown[3]["content"] and "sd-draft" in shown[5]["content"]


@pytest.mark.slow
def test_send_handler_keeps_two_multi_turn_histories(server):
    """Two turns through the Send handler: each pane's second prompt holds its own first answer."""
    from types import SimpleNamespace
    request = SimpleNamespace(session_hash="test-multi-turn")
    conv, outputs = ui.new_conversation(), None
    for prompt in ("Name a colour.", "Name another one."):
        for outputs in ui.send(prompt, "Answer in one word.", None, "ngram", "2", 0.0, 1.0, 8, -1,
                               True, conv, request):
            pass
        conv, last = outputs[7], outputs[8]
    assert [len(conv[name]) for name in ("plain", "speculative")] == [2, 2]
    messages = last["race"].lanes[0].messages
    assert [m["role"] for m in messages] == ["user", "assistant", "user"]
    assert messages[1]["content"] == conv["plain"][0]["text"] and messages[2]["content"] == "Name another one."
    assert last["race"].system == "Answer in one word."
    plain_chat, spec_chat = outputs[0], outputs[1]
    assert len(plain_chat) == len(spec_chat) == 4
    assert 'data-identical="true"' in outputs[4]
    race_chart, acceptance_chart = outputs[5], outputs[6]  # the race as a picture
    import pandas as pd
    top = race_chart.y_lim[1]  # the y-axis holds the lines (and its top tick) with room above
    race_chart = pd.DataFrame(race_chart.value["data"], columns=race_chart.value["columns"])
    assert top >= 1.05 * race_chart["tokens"].max()
    assert sorted(set(race_chart["lane"])) == ["plain", "speculative"]
    for lane in ("plain", "speculative"):
        points = race_chart[race_chart["lane"] == lane]
        assert points["tokens"].iloc[0] == 0 and points["seconds"].iloc[0] == 0.0
        assert points["tokens"].iloc[-1] == len(last["race"].snapshot().panes[lane].token_ids)
        assert points["seconds"].is_monotonic_increasing and points["tokens"].is_monotonic_increasing
    spec = last["race"].snapshot().panes["speculative"].stats
    assert acceptance_chart["rounds"].tolist() == [n for n, r in zip(
        spec.position_drafted, spec.per_position_acceptance) if r is not None]


def test_the_page_and_the_readme_say_the_conversation_is_kept():
    """Issue 20.10: the history kept between sends is stated on the page (beside Clear, which
    starts a new conversation) and in the README."""
    demo = ui.build_ui()
    notes = [b for b in demo.blocks.values() if getattr(b, "elem_id", None) == "history-note"]
    assert len(notes) == 1 and '"key": "history_note"' in str(notes[0].value)  # gr.I18n's marker
    note = ui.t("history_note")
    assert "Each pane keeps this conversation" in note and "**Clear**" in note
    assert ui.clear()[7] == ui.new_conversation() == {"plain": [], "speculative": []}
    assert "each pane keeps the conversation between sends" in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_launch_names_our_share_flag_not_gradios(capfd):
    """Issue 20.12: the terminal names ``--share``, not gradio's ``share=True`` in ``launch()``."""
    port = free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    try:
        out = capfd.readouterr().out
    finally:
        demo.close()
    assert "share=True" not in out
    assert f"* Running on local URL:  http://127.0.0.1:{port}/  (a public link: python app.py --share)" in out
