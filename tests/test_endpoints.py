"""Server lanes without a server: URL checks, request bodies, and each engine's statistics
mapped onto our metric names from recorded response payloads (llama.cpp is also tested against
the real llama-server in tests/test_llama_server.py)."""

from __future__ import annotations

import json

import pytest

from specdemo.services import endpoints as ep
from specdemo.services.pipeline import DecodeSettings, output_divergence
from specdemo.core.stats import DecodeStats


# --- addresses -------------------------------------------------------------------------------

@pytest.mark.parametrize("url, base", [
    ("http://127.0.0.1:8080", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/", "http://127.0.0.1:8080"),
    ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080"),
    ("http://localhost:8080/v1/", "http://localhost:8080"),
    ("http://[::1]:9000/v1", "http://[::1]:9000"),
    ("https://127.0.0.1/proxy/v1", "https://127.0.0.1/proxy"),
])
def test_base_url_strips_v1_and_slash(url, base):
    assert ep.base_url(url) == base


def test_remote_endpoint_needs_the_flag():
    with pytest.raises(ep.EndpointError, match="not on this machine.*--allow-remote-endpoint"):
        ep.base_url("http://10.1.2.3:8000/v1")
    assert ep.base_url("http://10.1.2.3:8000/v1", allow_remote=True) == "http://10.1.2.3:8000"


@pytest.mark.parametrize("url", ["127.0.0.1:8080", "ftp://127.0.0.1/", "", "http://"])
def test_not_a_url_is_refused(url):
    with pytest.raises(ep.EndpointError, match="not an http"):
        ep.base_url(url)


def test_shown_url_drops_credentials():
    assert ep.shown_url("http://user:secret@127.0.0.1:8080/v1?key=abc") == "http://127.0.0.1:8080/v1"


def test_key_from_environment_never_in_messages(monkeypatch):
    monkeypatch.setenv("SPECDEMO_TEST_KEY", "sk-very-secret")
    endpoint = ep.Endpoint("http://127.0.0.1:1", key_env="SPECDEMO_TEST_KEY")
    assert endpoint.headers() == {"Authorization": "Bearer sk-very-secret"}
    assert "sk-very-secret" not in repr(endpoint) and "sk-very-secret" not in endpoint.label
    monkeypatch.delenv("SPECDEMO_TEST_KEY")
    with pytest.raises(ep.EndpointError) as info:
        ep.Endpoint("http://127.0.0.1:1", key_env="SPECDEMO_TEST_KEY")
    assert str(info.value) == ("environment variable SPECDEMO_TEST_KEY (named by "
                               "--endpoint-key-env) is not set or empty")


@pytest.mark.parametrize("owners, engine", [
    ({"llamacpp"}, "llama.cpp"), ({"vllm"}, "vllm"), ({"sglang"}, "sglang"),
    ({"organization_owner"}, "lmstudio"), ({"openai"}, "openai-compatible")])
def test_engine_from_owned_by(owners, engine):
    assert ep.engine_name(owners) == engine


# --- request bodies ----------------------------------------------------------------------------

def _endpoint(engine, api="chat"):
    e = ep.Endpoint("http://127.0.0.1:8080", model="m", api=api)
    e.engine = engine
    return e


def test_llama_cpp_body_turns_its_own_samplers_off():
    settings = DecodeSettings(max_new_tokens=7, temperature=0.7, top_p=0.9, seed=3,
                              stop_strings=("END",))
    body = ep.request_body(_endpoint("llama.cpp"), [{"role": "user", "content": "hi"}], settings)
    assert body == {"model": "m", "stream": True, "stream_options": {"include_usage": True},
                    "max_tokens": 7, "temperature": 0.7, "top_p": 0.9, "seed": 3,
                    "stop": ["END"], "messages": [{"role": "user", "content": "hi"}],
                    "top_k": 0, "min_p": 0.0, "repeat_penalty": 1.0, "timings_per_token": True,
                    "cache_prompt": False, "return_tokens": True}


def test_completions_body_joins_messages_and_asks_llama_cpp_for_ids():
    body = ep.request_body(_endpoint("llama.cpp", "completions"),
                           [{"role": "system", "content": "S"}, {"role": "user", "content": "U"}],
                           DecodeSettings())
    assert body["prompt"] == "S\n\nU" and "messages" not in body and body["verbose"] is True


def test_vllm_body_passes_top_k_and_repetition_penalty_only_when_set():
    plain = ep.request_body(_endpoint("vllm"), [], DecodeSettings())
    assert "top_k" not in plain and "repetition_penalty" not in plain
    set_ = ep.request_body(_endpoint("vllm"), [], DecodeSettings(top_k=5, repetition_penalty=1.1))
    assert (set_["top_k"], set_["repetition_penalty"]) == (5, 1.1)


def test_unknown_engine_refuses_non_openai_sampling():
    with pytest.raises(ep.EndpointError, match="top-k"):
        ep.request_body(_endpoint("openai-compatible"), [], DecodeSettings(top_k=5))


# --- each engine's statistics --------------------------------------------------------------------

# The last chunk of a llama-server stream (server_slot_stats::to_json, llama.cpp 11434).
LLAMA_TIMINGS = {"cache_n": 0, "prompt_n": 41, "prompt_ms": 30.5, "prompt_per_token_ms": 0.74,
                 "prompt_per_second": 1344.3, "predicted_n": 64, "predicted_ms": 480.0,
                 "predicted_per_token_ms": 7.5, "predicted_per_second": 133.3,
                 "draft_n": 60, "draft_n_accepted": 18}


def test_llama_cpp_timings_map_to_drafted_accepted():
    reported = ep.llama_cpp_stats(LLAMA_TIMINGS)
    assert reported == {"drafted": 60, "accepted": 18, "prefill_s": 0.0305, "prompt_tokens": 41}
    stats = ep.apply_reported(DecodeStats(new_tokens=64, engine="llama.cpp"), reported)
    assert stats.acceptance_rate == pytest.approx(0.3)
    assert stats.mean_acceptance_length is None  # llama-server does not report its forwards
    assert stats.target_forwards is None and "target_forwards" in stats.not_reported
    assert "drafted" not in stats.not_reported and "accepted" not in stats.not_reported
    d = stats.as_dict()
    assert d["per_position_acceptance"] is None and d["draft_s"] is None
    json.dumps(d)  # JSON-ready


def test_llama_cpp_without_draft_fields_drafted_nothing():
    assert ep.llama_cpp_stats({"predicted_n": 5, "prompt_n": 3, "prompt_ms": 1.0}) == {
        "drafted": 0, "accepted": 0, "prefill_s": 0.001, "prompt_tokens": 3}


# vLLM /metrics before and after one request (Prometheus text, vllm v1 spec_decode metrics).
VLLM_BEFORE = """# HELP vllm:spec_decode_num_drafts_total Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts_total counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="m"} 30.0
vllm:spec_decode_num_accepted_tokens_total{engine="0",model_name="m"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 7.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 4.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 1.0
vllm:num_requests_running{engine="0",model_name="m"} 0.0
"""
VLLM_AFTER = VLLM_BEFORE.replace("} 10.0", "} 30.0").replace("} 30.0\nvllm:spec_decode_num_acc",
                                                             "} 90.0\nvllm:spec_decode_num_acc")
VLLM_AFTER = (VLLM_AFTER.replace('tokens_total{engine="0",model_name="m"} 12.0',
                                 'tokens_total{engine="0",model_name="m"} 42.0')
              .replace('position="0"} 7.0', 'position="0"} 23.0')
              .replace('position="1"} 4.0', 'position="1"} 14.0')
              .replace('position="2"} 1.0', 'position="2"} 5.0'))


def test_vllm_counter_deltas():
    before, after = ep.vllm_counters(VLLM_BEFORE), ep.vllm_counters(VLLM_AFTER)
    assert before["vllm:spec_decode_num_drafts"] == 10.0
    assert after["vllm:spec_decode_num_accepted_tokens_per_pos"] == {0: 23.0, 1: 14.0, 2: 5.0}
    reported = ep.vllm_stats(before, after)
    assert reported == {"drafted": 60, "accepted": 30, "rounds": 20, "target_forwards": 20,
                        "position_accepted": [16, 10, 4], "position_drafted": [20, 20, 20]}
    stats = ep.apply_reported(DecodeStats(new_tokens=51, engine="vllm"), reported)
    assert stats.acceptance_rate == pytest.approx(0.5)
    assert stats.mean_acceptance_length == pytest.approx(2.5)  # vLLM: 1 + 30 / 20
    assert stats.per_position_acceptance == pytest.approx([0.8, 0.5, 0.2])


def test_vllm_without_speculation_reports_nothing():
    assert ep.vllm_stats({}, ep.vllm_counters("vllm:num_requests_running 0.0\n")) == {}


# SGLang meta_info of a finished request with EAGLE-3.
SGLANG_META = {"id": "x", "prompt_tokens": 20, "completion_tokens": 61, "cached_tokens": 0,
               "spec_verify_ct": 20, "spec_accept_length": 3.05, "finish_reason": {"type": "stop"}}


def test_sglang_meta_info():
    reported = ep.sglang_stats(SGLANG_META)
    assert reported == {"target_forwards": 20, "rounds": 20, "prompt_tokens": 20}
    stats = ep.apply_reported(DecodeStats(new_tokens=61, engine="sglang"), reported)
    assert stats.drafted is None and stats.acceptance_rate is None
    assert stats.mean_acceptance_length == pytest.approx(3.0)  # (61 - 1) / 20
    assert {"drafted", "accepted"} <= set(stats.not_reported)


# LM Studio REST API stats (api/v0), with a draft model.
LMSTUDIO_STATS = {"tokens_per_second": 51.4, "time_to_first_token": 0.11, "generation_time": 1.2,
                  "stop_reason": "eosFound", "draft_model": "qwen2.5-0.5b-instruct",
                  "total_draft_tokens_count": 80, "accepted_draft_tokens_count": 52,
                  "rejected_draft_tokens_count": 24, "ignored_draft_tokens_count": 4}


def test_lmstudio_stats():
    assert ep.lmstudio_stats(LMSTUDIO_STATS) == {"drafted": 80, "accepted": 52}
    assert ep.lmstudio_stats({"accepted_draft_tokens_count": 5,
                              "rejected_draft_tokens_count": 3}) == {"drafted": 8, "accepted": 5}


def test_format_says_not_reported():
    stats = ep.apply_reported(DecodeStats(new_tokens=10, elapsed_s=1.0, ttft_s=0.1,
                                          engine="llama.cpp"), {"drafted": 4, "accepted": 2})
    text = ep.format_endpoint_stats("speculative", stats)
    assert "target_forwards=not reported by this engine" in text
    assert "drafted=4 accepted=2 acceptance_rate=0.50" in text
    assert "tokens_per_s=10.00" in text


def test_divergence_by_tokens_else_text():
    assert output_divergence([1, 2, 3], [1, 2, 4], "abc", "abd") == (2, "token")
    assert output_divergence([], [1, 2], "hello", "help") == (3, "character")
    assert output_divergence([], [], "same", "same") == (None, "character")


# --- serve: flags and files (the server itself: tests/test_llama_server.py) ----------------------

def test_serve_draft_flags(tmp_path):
    from specdemo.services import serve
    assert serve.draft_flags("none") == []
    assert serve.draft_flags("ngram", 8) == ["--spec-type", "ngram-simple", "--spec-draft-n-max", "8"]
    assert serve.draft_flags("ngram-mod") == ["--spec-type", "ngram-mod"]  # llama.cpp's own names
    with pytest.raises(serve.ServeError, match="no n-gram draft 'ngram-big'.*ngram-map-k"):
        serve.draft_flags("ngram-big")
    gguf = tmp_path / "d.gguf"
    gguf.write_bytes(b"GGUF")
    assert serve.draft_flags(str(gguf)) == ["--spec-type", "draft-simple", "--spec-draft-model",
                                            str(gguf)]
    with pytest.raises(serve.ServeError, match="is not a .gguf file") as missing:
        serve.draft_flags(str(tmp_path / "missing.gguf"))
    assert "did you mean" not in str(missing.value)
    with pytest.raises(serve.ServeError, match="did you mean --draft ngram\\?"):
        serve.draft_flags("ngrm")  # a typo of a draft type, not a missing file
    with pytest.raises(serve.ServeError, match="did you mean ngram-mod\\?"):
        serve.draft_flags("ngram-mdo")


def test_serve_finds_the_builtin_gguf():
    from specdemo.services import serve
    path = serve.gguf_path("builtin:smollm2-135m")
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    with pytest.raises(serve.ServeError, match="no built-in model 'nope'"):
        serve.gguf_path("builtin:nope")


# --- the page's counters for a server lane ---------------------------------------------------------

def test_page_cells_say_not_reported():
    from specdemo.interfaces.ui_format import counter_cells
    stats = ep.apply_reported(DecodeStats(new_tokens=10, elapsed_s=1.0, ttft_s=0.1,
                                          engine="llama.cpp"), {"drafted": 4, "accepted": 2})
    cells = dict(counter_cells(stats, True, "auto"))
    assert cells["engine"] == "llama.cpp" and cells["acceptance_rate"] == "50%"
    assert cells["drafted / accepted"] == "4 / 2"
    assert cells["mean_acceptance_length"] == "not reported by this engine"
    assert cells["draft_length"] == "not reported by this engine"


def test_preset_may_name_endpoints(tmp_path):
    from specdemo.services.presets import PresetError, load_preset
    base = ('name = "{name}"\ntarget = "builtin:smollm2-135m"\ndraft = "ngram"\ndraft_length = "auto"\n'
            'dtype = "float32"\nquantization = "none"\nmemory_bytes = 2000000000\n'
            'tasks = ["chat"]\nlicence = "Apache-2.0"\ngated = false\ndevices = ["cpu"]\n'
            'note = "x"\nsources = ["https://github.com/ggml-org/llama.cpp"]\n')
    good = tmp_path / "servers.toml"
    good.write_text(base.format(name="servers") + 'plain_endpoint = "http://127.0.0.1:8080/v1"\n'
                    'spec_endpoint = "http://127.0.0.1:8081"\n')
    preset = load_preset(good)
    assert (preset.plain_endpoint, preset.spec_endpoint) == ("http://127.0.0.1:8080",
                                                             "http://127.0.0.1:8081")
    bad = tmp_path / "bad.toml"
    bad.write_text(base.format(name="bad") + 'spec_endpoint = "127.0.0.1:8081"\n')
    with pytest.raises(PresetError, match="spec_endpoint.*not an http"):
        load_preset(bad)
