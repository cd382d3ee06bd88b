"""Server lanes against a REAL llama.cpp llama-server on the built-in model's GGUF (no mock).

The servers are started by a fixture (``python -m specdemo serve``'s class); every test here is
slow and skips, with the reason, only when llama-server is not installed
(``requirements-engines.txt``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")

from specdemo.services import endpoints as ep  # noqa: E402
from specdemo.services import serve  # noqa: E402
from specdemo.services.race import ERROR, DONE, PLAIN, SPECULATIVE, Race, endpoint_lane  # noqa: E402

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
PASSAGE = ("The lighthouse keeper climbed the spiral stairs every evening at dusk, trimmed the "
           "wick, polished the great lens, and wrote the weather in a leather logbook before the "
           "ships came past the rocks.")
COPY_PROMPT = f"Repeat this passage exactly, word for word:\n\n{PASSAGE}"


def _binary_or_skip():
    try:
        serve.llama_server_binary()
    except serve.ServeError as exc:
        pytest.skip(f"llama-server is not installed: {exc}")


@pytest.fixture(scope="module")
def servers():
    """A plain llama-server and an n-gram speculative one (--spec-type ngram-simple,
    --spec-draft-n-max 8), each with 4 slots, on builtin:smollm2-135m."""
    _binary_or_skip()
    plain = serve.LlamaServer("builtin:smollm2-135m", "none", parallel=4, threads=2)
    spec = serve.LlamaServer("builtin:smollm2-135m", "ngram", parallel=4, threads=2, draft_max=8)
    try:
        plain.start()
        spec.start()
        yield {"plain": plain, "speculative": spec}
    finally:
        plain.stop()
        spec.stop()


def specdemo(*args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdemo", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_compare_json_races_plain_and_ngram_servers(servers):
    out = specdemo("compare", "--plain-endpoint", servers["plain"].url,
                   "--spec-endpoint", servers["speculative"].url + "/v1",
                   "--prompt", COPY_PROMPT, "--max-new-tokens", "64", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    plain, spec = result["plain"], result["speculative"]
    for pane in (plain, spec):
        assert pane["status"] == "done" and pane["error"] is None
        assert pane["engine"] == "llama.cpp"
        assert 0 < pane["new_tokens"] <= 64 and pane["ttft_s"] > 0 and pane["tokens_per_s"] > 0
        assert pane["text"].strip()
        # llama-server does not report its forwards or per-position counts: null and named.
        assert pane["target_forwards"] is None and "target_forwards" in pane["not_reported"]
        assert pane["per_position_acceptance"] is None and pane["draft_s"] is None
    # The speculative server drafted on a copy prompt, and said so in its own timings.
    assert spec["drafted"] > 0 and 0 < spec["accepted"] <= spec["drafted"]
    assert spec["acceptance_rate"] == pytest.approx(spec["accepted"] / spec["drafted"])
    assert plain["drafted"] == 0 and plain["acceptance_rate"] is None
    # Greedy: identical, or the first divergence is shown (chat API: texts are compared).
    assert result["divergence_unit"] == "character"
    if result["identical"]:
        assert plain["text"] == spec["text"] and result["first_divergence"] is None
    else:
        i = result["first_divergence"]
        assert plain["text"][:i] == spec["text"][:i]
    assert result["speedup"] == pytest.approx(spec["tokens_per_s"] / plain["tokens_per_s"])


def test_drafted_and_accepted_are_the_servers_own(servers):
    """The lane's drafted/accepted equal llama-server's timings for the same greedy request
    sent directly (n-gram drafting is deterministic), and new_tokens its usage."""
    import httpx
    endpoint = ep.Endpoint(servers["speculative"].url)
    from specdemo.services.pipeline import DecodeSettings
    settings = DecodeSettings(max_new_tokens=48)
    events = list(ep.stream_events(endpoint, [{"role": "user", "content": COPY_PROMPT}], settings))
    stats = events[-1].stats
    body = ep.request_body(endpoint, [{"role": "user", "content": COPY_PROMPT}], settings)
    body.update(stream=False)
    body.pop("stream_options")
    direct = httpx.post(endpoint.url + "/v1/chat/completions", json=body, timeout=120).json()
    assert stats.drafted == direct["timings"]["draft_n"] > 0
    assert stats.accepted == direct["timings"]["draft_n_accepted"]
    assert stats.new_tokens == direct["usage"]["completion_tokens"]
    assert "".join(e.text for e in events) == direct["choices"][0]["message"]["content"]


def test_completions_api_returns_token_ids(servers):
    """On /v1/completions llama-server returns the token ids, so divergence is by token."""
    out = specdemo("compare", "--plain-endpoint", servers["plain"].url,
                   "--spec-endpoint", servers["speculative"].url, "--endpoint-api", "completions",
                   "--prompt", COPY_PROMPT, "--max-new-tokens", "32", "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    for name in (PLAIN, SPECULATIVE):
        assert len(result[name]["token_ids"]) == result[name]["new_tokens"] > 0
    assert result["divergence_unit"] == "token"
    assert result["identical"] == (result["plain"]["token_ids"] == result["speculative"]["token_ids"])


def test_race_api_with_server_lanes(servers):
    """The app's /race, through gradio_client, with both lanes on the servers."""
    from gradio_client import Client
    from specdemo.interfaces import ui
    port = serve.free_port()
    demo = ui.build_ui()
    ui.launch(demo, host="127.0.0.1", port=port, prevent_thread_lock=True)
    try:
        client = Client(f"http://127.0.0.1:{port}/", verbose=False)
        result = client.predict(api_name="/race", prompt=COPY_PROMPT, max_new_tokens=48,
                                plain_endpoint=servers["plain"].url,
                                spec_endpoint=servers["speculative"].url)
    finally:
        demo.close()
    assert result["plain"]["status"] == result["speculative"]["status"] == "done"
    assert result["speculative"]["engine"] == "llama.cpp"
    assert result["speculative"]["drafted"] > 0 and result["speculative"]["accepted"] > 0
    assert result["identical"] in (True, False)
    assert result["identical"] or isinstance(result["first_divergence"], int)


def test_refused_connection_is_one_sentence_and_the_other_lane_runs(servers):
    dead = f"http://127.0.0.1:{serve.free_port()}"
    out = specdemo("compare", "--plain-endpoint", servers["plain"].url, "--spec-endpoint", dead,
                   "--prompt", "Say hello.", "--max-new-tokens", "8", "--json")
    assert out.returncode == 2
    assert "Traceback" not in out.stderr
    result = json.loads(out.stdout)
    assert result["plain"]["status"] == "done" and result["plain"]["new_tokens"] > 0
    spec = result["speculative"]
    assert spec["status"] == "error" and spec["error"] == (
        f"could not connect to {dead}: connection refused or host unreachable (is the "
        f"server running?)")
    assert spec["new_tokens"] == 0 and spec["token_ids"] == []  # every lane carries every key


def test_server_killed_mid_stream_is_the_lanes_error(servers):
    """A server killed while it streams: that lane's error (one sentence, what it streamed is
    kept), the other lane's answer survives. The server is killed once its lane has received 5
    chunks (an event, not a fixed wait: the lanes run one after the other, and the plain lane's
    2000 tokens take minutes on a busy machine)."""
    _binary_or_skip()
    victim = serve.LlamaServer("builtin:smollm2-135m", "none", threads=2)
    victim.start()
    try:
        messages = [{"role": "user", "content": "Write a very long story about a lighthouse."}]
        from specdemo.services.pipeline import DecodeSettings
        streaming = threading.Event()
        spec_lane = endpoint_lane(SPECULATIVE, ep.Endpoint(victim.url), messages)
        pipe = spec_lane.pipeline()
        stream = pipe.stream

        def counted(*args, **kwargs):
            for i, event in enumerate(stream(*args, **kwargs)):
                if i == 4:
                    streaming.set()  # 5 chunks received: the server is mid-answer
                yield event
        pipe.stream = counted
        lanes = [endpoint_lane(PLAIN, ep.Endpoint(servers["plain"].url), messages), spec_lane]
        race = Race(lanes, DecodeSettings(max_new_tokens=2000))
        race.start()
        while not streaming.wait(1.0) and not race.finished:  # each lane ends by itself (its
            pass                                               # endpoint timeout bounds a chunk)
        victim.kill()
        race.join()
        snap = race.snapshot()
    finally:
        victim.stop()
    assert streaming.is_set(), snap.panes[SPECULATIVE].error
    assert snap.panes[PLAIN].status == DONE and snap.panes[PLAIN].stats.new_tokens > 0
    spec = snap.panes[SPECULATIVE]
    assert spec.status == ERROR
    assert spec.error.startswith(f"the server at {victim.url} closed the connection after ")
    assert spec.error.endswith("(it stopped or crashed)")
    assert len(spec.text) > 0  # what it streamed before dying is kept
    assert snap.identical is None and snap.speedup is None  # a cut lane gets no verdict
    assert snap.not_compared == "the speculative run did not finish"


def test_stop_ends_the_running_server_lane_and_skips_the_next(servers):
    messages = [{"role": "user", "content": "Write a very long story about a lighthouse."}]
    from specdemo.services.pipeline import DecodeSettings
    lanes = [endpoint_lane(PLAIN, ep.Endpoint(servers["plain"].url), messages),
             endpoint_lane(SPECULATIVE, ep.Endpoint(servers["speculative"].url), messages)]
    race = Race(lanes, DecodeSettings(max_new_tokens=2000))
    race.start()
    while len(race.records[PLAIN].steps) < 3 and not race.finished:
        time.sleep(0.01)
    race.cancel.set()
    race.join(60)
    snap = race.snapshot()
    assert snap.panes[PLAIN].status == "stopped" and snap.panes[PLAIN].stats.finish_reason == "cancelled"
    assert snap.panes[SPECULATIVE].status == "skipped"


def test_serve_command_prints_url_and_stops_on_interrupt():
    _binary_or_skip()
    port = serve.free_port()
    # SIGINT as a terminal delivers it: a suite started as a background job of a
    # non-interactive shell inherits SIGINT ignored, and Python then never raises Ctrl-C
    proc = subprocess.Popen([sys.executable, "-m", "specdemo", "serve", "llama.cpp", "--port",
                             str(port), "--draft", "ngram"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = proc.stdout.readline()
        assert f"ready at http://127.0.0.1:{port}" in line
        import httpx
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).status_code == 200
    finally:
        proc.send_signal(2)  # Ctrl-C
        proc.wait(60)
    assert proc.returncode == 0
    with pytest.raises(Exception):
        import httpx
        httpx.get(f"http://127.0.0.1:{port}/health", timeout=2)


def test_page_send_with_server_lanes_keeps_history(servers):
    """The page's Send with Engines = servers: both panes stream from the servers, the turn is
    kept in each pane's history; a second Send with the speculative server gone is that pane's
    error and the first turn survives."""
    from types import SimpleNamespace

    from specdemo.interfaces import ui
    from specdemo.interfaces.ui_race import ENGINE_CHOICES
    request = SimpleNamespace(session_hash="test-llama-server")
    urls = (servers["plain"].url, servers["speculative"].url)
    outputs = list(ui.send(COPY_PROMPT, "", None, "ngram", "4", 0.0, 1.0, 32, -1, True, None,
                           request, ENGINE_CHOICES[1], *urls, "", "", False))
    conv = outputs[-1][7]
    for pane in ("plain", "speculative"):
        assert conv[pane][0]["status"] == "done" and conv[pane][0]["text"].strip()
    assert "llama.cpp" in outputs[-1][3]  # the speculative pane's counters name the engine
    dead = f"http://127.0.0.1:{serve.free_port()}"
    outputs = list(ui.send("Say hello.", "", None, "ngram", "4", 0.0, 1.0, 8, -1, True, conv,
                           request, ENGINE_CHOICES[1], urls[0], dead, "", "", False))
    conv = outputs[-1][7]
    assert len(conv["plain"]) == len(conv["speculative"]) == 2
    assert conv["plain"][1]["status"] == "done"
    assert conv["speculative"][1]["status"] == "error"
    assert conv["speculative"][1]["error"].startswith(f"could not connect to {dead}")
    assert conv["speculative"][0]["status"] == "done"  # the history survives


def test_live_counters_come_from_the_server_while_it_streams(servers):
    """llama-server sends its timings with every chunk (timings_per_token): the lane's counters
    grow while it streams, and never exceed the final ones."""
    from specdemo.services.pipeline import DecodeSettings
    events = list(ep.stream_events(ep.Endpoint(servers["speculative"].url),
                                   [{"role": "user", "content": COPY_PROMPT}],
                                   DecodeSettings(max_new_tokens=48)))
    live = [e.stats for e in events[:-1]]
    final = events[-1].stats
    assert all(s.engine == "llama.cpp" and s.drafted is not None for s in live)
    assert [s.new_tokens for s in live] == sorted(s.new_tokens for s in live)
    assert [s.drafted for s in live] == sorted(s.drafted for s in live)
    assert live[-1].drafted <= final.drafted and final.drafted > 0


def test_training_answers_from_the_server_are_our_token_ids(servers, tmp_path):
    """train-draft --generate-endpoint: the prompt goes as our chat-template ids, the answer
    comes back as ids; greedy answers equal the server's own greedy completion of those ids."""
    import httpx
    from specdemo.models.loading import load_tokenizer
    from specdemo.services.training import data
    tok = load_tokenizer("builtin:smollm2-135m")
    rows = [{"task": "chat", "prompt": "Name three colours."},
            {"task": "chat-multiturn", "prompt": "Why?", "messages": [
                {"role": "user", "content": "Is the sky blue?"},
                {"role": "assistant", "content": "Yes, on a clear day."},
                {"role": "user", "content": "Why?"}]}]
    eos = {tok.eos_token_id}
    data.generate_answers_endpoint(servers["plain"].url, tok, rows, tmp_path, answers_per_prompt=2,
                                   temperature=0.8, max_new_tokens=24, eos_token_ids=eos,
                                   concurrency=1)  # one at a time: a batch of two can flip a near-tie
    got = {(r["prompt_index"], r["answer_index"]): r for r in data.load_answers(tmp_path)}
    assert sorted(got) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for (i, a), r in got.items():
        ids = data.chat_ids(tok, rows[i]["prompt"], rows[i].get("messages"))
        assert r["ids"][:r["n_prompt"]] == ids and r["n_prompt"] == len(ids)
        assert 0 < len(r["ids"]) - r["n_prompt"] <= 24
        assert r["temperature"] == (0.0 if a == 0 else 0.8) and r["source"] == "llama-server"
    direct = httpx.post(servers["plain"].url + "/completion", timeout=120, json={
        "prompt": data.chat_ids(tok, rows[0]["prompt"]), "n_predict": 24, "temperature": 0,
        "return_tokens": True, "cache_prompt": True}).json()["tokens"]
    answer = got[(0, 0)]["ids"][got[(0, 0)]["n_prompt"]:]
    assert answer == direct[:len(answer)]


def test_training_answers_left_out_when_the_server_is_gone(tmp_path):
    """A server that does not answer: the requests are left out (for --resume), not a crash."""
    from specdemo.services.training import data
    from tiny import CharTokenizer
    port = serve.free_port()  # nothing listens there
    data.generate_answers_endpoint(f"http://127.0.0.1:{port}", CharTokenizer(),
                                   [{"prompt": "abc"}], tmp_path, answers_per_prompt=1,
                                   retries=0, timeout_s=5)
    assert (tmp_path / data.ANSWERS).read_text() == ""


def test_concurrency_sweep_runs_8_requests_and_records_the_machine(servers):
    """bench's server sweep at 1 and 8 requests at once (8 > the fixture's 4 slots: the rest
    wait for one): every request answers, and each row names this CPU and its load average."""
    from specdemo.models.hardware import _cpu_name
    from specdemo.services import endpoint_bench as eb
    from specdemo.services.pipeline import DecodeSettings
    endpoints = {name: ep.Endpoint(server.url) for name, server in servers.items()}
    rows = eb.sweep(endpoints, [COPY_PROMPT, "Name three colours."], (1, 8),
                    DecodeSettings(max_new_tokens=4), repeats=1, progress=lambda line: None)
    assert [(r["lane"], r["concurrency"], r["requests"]) for r in rows] == [
        ("plain", 1, 1), ("plain", 8, 8), ("speculative", 1, 1), ("speculative", 8, 8)]
    assert [r["errors"] for r in rows] == [None] * 4
    assert all(r["cpu_model"] == _cpu_name() and r["load_before"] >= 0 and r["load_after"] >= 0
               for r in rows)
    assert rows[3]["speedup"] == round(rows[3]["total_tokens_per_s"] / rows[1]["total_tokens_per_s"], 3)
