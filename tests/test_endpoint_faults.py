"""Server lanes that misbehave, against small fake OpenAI-compatible servers on 127.0.0.1 (no
model, no llama-server): a lane cut mid-stream gets no verdict and keeps its text, lanes on
different models are not compared, a field of the wrong type is one sentence naming the server
and the field, bad endpoint flags are refused before anything runs, and https:// to a plain-http
server is named a TLS mismatch."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from specdemo.interfaces.cli import main
from specdemo.services import endpoints as ep
from specdemo.services.pipeline import DecodeSettings
from specdemo.services.race import (DONE, ERROR, PLAIN, SPECULATIVE, Race, endpoint_lane,
                                    snapshot_dict)

MESSAGES = [{"role": "user", "content": "hi"}]


def chunk(content, **extra) -> dict:
    """One chat-completions stream chunk adding ``content``."""
    return {"object": "chat.completion.chunk", "model": extra.pop("model", "m"),
            "choices": [{"index": 0, "delta": {"content": content}, "finish_reason": None}],
            **extra}


def finish(model: str = "m") -> list[dict]:
    """The last chunks: finish_reason, then usage (``stream_options.include_usage``)."""
    return [{"object": "chat.completion.chunk", "model": model,
             "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]},
            {"object": "chat.completion.chunk", "model": model, "choices": [],
             "usage": {"completion_tokens": 3, "prompt_tokens": 2}}]


class FakeServer:
    """A llama-server look-alike: ``/v1/models`` (owned_by llamacpp unless told), ``/props``
    with ``model_path`` when given, and a chat stream of ``chunks``; with ``cut`` the stream
    ends without ``[DONE]`` (the server went away mid-answer); with ``done=False`` the stream
    closes cleanly (its HTTP body complete) but without ``[DONE]``."""

    def __init__(self, chunks, model_path=None, owned_by="llamacpp", model_id="m", cut=False,
                 done=True):
        self.chunks, self.model_path, self.cut, self.done = chunks, model_path, cut, done
        self.completion_tokens = [1, 2]
        self.models = {"object": "list", "data": [{"id": model_id, "object": "model",
                                                   "owned_by": owned_by}]}
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def _json(self, status, body):
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self):
                if self.path == "/v1/models":
                    self._json(200, server.models)
                elif self.path == "/props" and server.model_path:
                    self._json(200, {"model_path": server.model_path})
                else:
                    self._json(404, {"error": {"message": "not found"}})

            def do_POST(self):
                self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/completion":  # llama-server's own endpoint (training answers)
                    self._json(200, {"tokens": server.completion_tokens})
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                events = [f"data: {json.dumps(c)}\n\n" for c in server.chunks]
                sent_done = server.done and not server.cut
                for event in events + (["data: [DONE]\n\n"] if sent_done else []):
                    data = event.encode()
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
                if server.cut:  # gone mid-answer: no last chunk, the connection just closes
                    self.close_connection = True
                else:
                    self.wfile.write(b"0\r\n\r\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def servers():
    made = []

    def make(*args, **kwargs) -> FakeServer:
        made.append(FakeServer(*args, **kwargs))
        return made[-1]
    yield make
    for server in made:
        server.close()


def race(plain: FakeServer, spec: FakeServer):
    lanes = [endpoint_lane(PLAIN, ep.Endpoint(plain.url), MESSAGES),
             endpoint_lane(SPECULATIVE, ep.Endpoint(spec.url), MESSAGES)]
    r = Race(lanes, DecodeSettings(max_new_tokens=8))
    r.run_here()
    return r.snapshot()


WORDS = [chunk("Once"), chunk(" upon"), chunk(" a")]


# --- 1. a verdict over lanes that failed ------------------------------------------------------

def test_two_lanes_cut_mid_stream_get_no_verdict(servers):
    """Both lanes stream the same words, then their servers go away: the texts agree, but a cut
    output is no evidence of losslessness, so there is no identical and no speedup."""
    snap = race(servers(WORDS, cut=True), servers(WORDS, cut=True))
    assert snap.panes[PLAIN].status == snap.panes[SPECULATIVE].status == ERROR
    assert snap.panes[PLAIN].text == snap.panes[SPECULATIVE].text == "Once upon a"
    assert snap.identical is None and snap.first_divergence is None and snap.speedup is None
    assert snap.not_compared == ("the plain run did not finish; the speculative run did not "
                                 "finish")
    out = snapshot_dict(snap)
    assert out["identical"] is None and out["not_compared"] == snap.not_compared
    assert out[SPECULATIVE]["text"] == "Once upon a"  # what it produced is kept


@pytest.mark.parametrize("last", ["no finish_reason", "finish_reason null"])
def test_a_stream_that_closes_cleanly_without_an_end_is_cut(servers, last):
    """A server that closes its stream cleanly (the HTTP body complete) after chunks whose
    finish_reason stays null, without ``[DONE]``: the lane did not finish, so it is cut as a lane
    that errors (it got a speedup and an identical verdict); its text is kept."""
    ending = [] if last == "no finish_reason" else [
        {"object": "chat.completion.chunk", "model": "m",
         "choices": [{"index": 0, "delta": {}, "finish_reason": None}]}]
    spec = servers(WORDS + ending, done=False)
    snap = race(servers(WORDS + finish()), spec)
    assert snap.panes[PLAIN].status == DONE and snap.panes[SPECULATIVE].status == ERROR
    assert snap.panes[SPECULATIVE].text == "Once upon a"
    assert snap.speedup is None and snap.identical is None
    assert snap.not_compared == "the speculative run did not finish"
    assert snap.panes[SPECULATIVE].error == (
        f"the server at {spec.url} closed the stream after 3 chunks of the answer without "
        "finishing it (no finish_reason, no [DONE])")


def test_a_stream_that_finishes_without_done_is_finished(servers):
    """A finish_reason ends the answer even when the server then closes without ``[DONE]``;
    ``[DONE]`` without a closing chunk ends it too."""
    snap = race(servers(WORDS + finish(), done=False), servers(WORDS + finish()))
    assert snap.panes[PLAIN].status == snap.panes[SPECULATIVE].status == DONE
    assert snap.identical is True and snap.speedup is not None
    snap = race(servers(WORDS + finish()), servers(WORDS))  # [DONE] after null finish_reasons
    assert snap.panes[SPECULATIVE].status == DONE and snap.identical is True


def test_compare_prints_the_cut_lanes_text_marked_as_cut(servers, capsys):
    plain = servers(WORDS + [chunk(" time")] + finish())
    spec = servers(WORDS, cut=True)
    with pytest.raises(SystemExit) as exited:
        raise SystemExit(main(["compare", "--plain-endpoint", plain.url, "--spec-endpoint",
                               spec.url, "--prompt", "hi", "--max-new-tokens", "8"]))
    assert exited.value.code == 2
    out, err = capsys.readouterr()
    cut = (f"the server at {spec.url} closed the connection after 3 chunks of the answer (it "
           "stopped or crashed)")
    assert f"speculative (llama.cpp at {spec.url}):\nOnce upon a\n[cut: {cut}]\n" in out
    assert f"plain (llama.cpp at {plain.url}):\nOnce upon a time\n" in out
    assert ("speedup: not compared   identical: not compared (the speculative run did not "
            "finish)") in out
    assert "identical: yes" not in out and "first divergence" not in out
    assert err.strip() == f"error: speculative lane: {cut}"


def test_the_page_shows_what_a_failed_lane_produced():
    from specdemo.interfaces.ui_format import chat_messages
    turn = {"user": "hi", "text": "Once", "tokens": [["Once", False]], "status": ERROR,
            "error": "the server closed the connection"}
    body = chat_messages([turn], True, False)[1]["content"]
    assert "Once" in body and "cut here: the server closed the connection" in body


# --- 2. lanes on different models ------------------------------------------------------------

def test_lanes_on_different_model_files_are_not_compared(servers):
    """llama-server echoes whatever model name a request gives, so its /props model file is
    what it serves: two different files are no comparison (a warning, no verdicts)."""
    done = WORDS + finish()
    snap = race(servers(done, model_path="/models/a-135m.gguf"),
                servers(done, model_path="/models/b-1b.gguf"))
    assert snap.panes[PLAIN].status == snap.panes[SPECULATIVE].status == DONE
    assert snap.speedup is None and snap.identical is None
    assert snap.not_compared == ("the lanes ran different models: plain a-135m.gguf, "
                                 "speculative b-1b.gguf")
    assert snap.panes[SPECULATIVE].stats.served_model == "b-1b.gguf"
    # The same file in two folders (or the same server twice): compared.
    same = race(servers(done, model_path="/x/a-135m.gguf"), servers(done, model_path="/y/a-135m.gguf"))
    assert same.identical is True and same.speedup is not None and same.not_compared is None


def test_other_engines_are_told_apart_by_the_streams_model_field(servers):
    a = [chunk("Hi", model="qwen-0.5b")] + finish("qwen-0.5b")
    b = [chunk("Hi", model="llama-1b")] + finish("llama-1b")
    snap = race(servers(a, owned_by="vllm", model_id="qwen-0.5b"),
                servers(b, owned_by="vllm", model_id="llama-1b"))
    assert snap.not_compared == ("the lanes ran different models: plain qwen-0.5b, "
                                 "speculative llama-1b")
    # Two engines name models their own way (a GGUF file, a hub id): not compared by name.
    mixed = race(servers(a, owned_by="vllm", model_id="qwen-0.5b"),
                 servers(b, model_path="/m/qwen-0.5b-q4.gguf"))
    assert mixed.not_compared is None and mixed.identical is True
    from specdemo.interfaces.ui_format import verdict_html
    html = verdict_html(snap, 0.0)
    assert "Speedup: not compared (the lanes ran different models" in html
    assert "lossless check: not compared" in html and 'data-identical' not in html


# --- 3. a stream value of the wrong type ---------------------------------------------------------

@pytest.mark.parametrize("bad, says", [
    pytest.param(chunk(5), "a number (5) for choices[0].delta.content, where a string belongs",
                 id="content-number"),
    pytest.param(chunk("x", timings={"draft_n": "7", "predicted_n": 1}),
                 "a string ('7') for timings.draft_n, where a whole number of 0 or more belongs",
                 id="draft_n-string"),
    pytest.param(chunk("x", usage={"completion_tokens": "3"}),
                 "a string ('3') for usage.completion_tokens, where a whole number of 0 or more "
                 "belongs", id="usage-string"),
    pytest.param({"choices": {"0": 1}}, "an object ({\"0\": 1}) for choices, where a list belongs",
                 id="choices-object"),
    pytest.param(chunk("x", model=7), "a number (7) for model, where a string belongs",
                 id="model-number"),
])
def test_a_field_of_the_wrong_type_is_the_lanes_error_in_one_sentence(servers, bad, says):
    spec = servers([chunk("ok"), bad] + finish())
    snap = race(servers(WORDS + finish()), spec)
    view = snap.panes[SPECULATIVE]
    assert view.status == ERROR and view.text == "ok"
    assert view.error == f"the server at {spec.url} sent {says}"
    assert snap.panes[PLAIN].status == DONE and snap.identical is None


def test_a_models_list_of_the_wrong_type_names_the_field(servers):
    server = servers(WORDS + finish())
    server.models = {"data": [{"id": 12, "owned_by": "llamacpp"}]}
    with pytest.raises(ep.EndpointError) as caught:
        list(ep.stream_events(ep.Endpoint(server.url), MESSAGES, DecodeSettings()))
    assert str(caught.value) == (f"the server at {server.url} sent a number (12) for /v1/models "
                                 "data[0].id, where a string belongs")


def test_the_stats_mappers_check_their_fields():
    with pytest.raises(ep.BadField, match="meta_info.spec_verify_ct"):
        ep.sglang_stats({"spec_verify_ct": 2.5})
    with pytest.raises(ep.BadField, match="stats.accepted_draft_tokens_count"):
        ep.lmstudio_stats({"accepted_draft_tokens_count": -1})
    with pytest.raises(ep.BadField, match="timings.prompt_ms"):
        ep.llama_cpp_stats({"prompt_ms": float("nan")})
    assert ep.llama_cpp_stats({"draft_n": 4.0, "draft_n_accepted": 2}) == {"drafted": 4,
                                                                           "accepted": 2}
    assert ep.vllm_counters("vllm:spec_decode_num_drafts_total NaN\n") == {}


# --- 4. endpoint flags and transport ----------------------------------------------------------------

@pytest.mark.parametrize("value", ["0", "nan", "-5", "inf"])
def test_a_bad_endpoint_timeout_is_refused_before_anything_runs(capsys, value):
    with pytest.raises(SystemExit) as exited:
        main(["compare", "--plain-endpoint", "http://127.0.0.1:9", "--spec-endpoint",
              "http://127.0.0.1:9", "--prompt", "hi", "--endpoint-timeout", value])
    assert exited.value.code == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: argument --endpoint-timeout: endpoint timeout (seconds) must be a "
                   f"number above 0, got {value!r}", "(python -m specdemo compare --help)"]


def test_an_endpoint_refuses_a_timeout_that_is_not_seconds():
    for value in (0, -1.0, float("nan"), float("inf"), True):
        with pytest.raises(ep.EndpointError, match="endpoint timeout must be a number of "
                                                    "seconds above 0"):
            ep.Endpoint("http://127.0.0.1:9", timeout_s=value)


def test_https_to_a_plain_http_server_is_named_a_tls_mismatch(servers):
    server = servers(WORDS + finish())
    url = server.url.replace("http://", "https://")
    with pytest.raises(ep.EndpointError) as caught:
        list(ep.stream_events(ep.Endpoint(url), MESSAGES, DecodeSettings()))
    message = str(caught.value)
    assert message.startswith(f"could not make a TLS (https://) connection to {url}: the server "
                              "did not answer in TLS (")
    assert message.endswith("); if it serves plain HTTP, use http://")
    assert "is the server running" not in message


def test_race_api_answers_a_bad_field_in_the_lanes_sentence(servers):
    """``/race`` (the function behind it): the pane's error is the sentence, not Python's
    TypeError, and the verdicts are not given."""
    from specdemo.interfaces import ui
    spec = servers([chunk("ok"), chunk(5)] + finish())
    result = ui.race_api("hi", max_new_tokens=8, plain_endpoint=servers(WORDS + finish()).url,
                         spec_endpoint=spec.url)
    assert result["speculative"]["status"] == "error"
    assert result["speculative"]["error"] == (f"the server at {spec.url} sent a number (5) for "
                                              "choices[0].delta.content, where a string belongs")
    assert result["speculative"]["text"] == "ok"
    assert result["identical"] is None and result["speedup"] is None
    assert result["speedup_note"] == "not compared: the speculative run did not finish"


def test_training_answers_with_bad_token_ids_are_one_sentence(servers, tmp_path):
    """train-draft --generate-endpoint reads llama-server's /completion token ids: one that is
    not a token id is refused in one sentence naming the server, not written to the answers."""
    from specdemo.services.training import data
    from tiny import CharTokenizer
    server = servers([])
    server.completion_tokens = [5, "6"]
    with pytest.raises(RuntimeError) as caught:
        data.generate_answers_endpoint(server.url, CharTokenizer(), [{"prompt": "abc"}], tmp_path,
                                       answers_per_prompt=1, retries=0, timeout_s=5)
    assert str(caught.value) == (f"the server at {server.url} sent '6' among the token ids of "
                                 "/completion's tokens, where whole numbers of 0 or more belong")
    assert (tmp_path / data.ANSWERS).read_text() == ""
