"""The page's Engines choice: race our engine, or lanes served by OpenAI-compatible servers.

With "servers", a lane whose endpoint URL is filled in streams from that server (llama-server,
vLLM, SGLang, LM Studio); a lane left empty is our engine with the preset. "Start llama.cpp"
starts two llama-server processes on the built-in model's GGUF (plain, and n-gram speculative),
fills in their URLs, and they stop with the app (or with "Stop servers").
"""

from __future__ import annotations

import threading

import gradio as gr

from .ui_race import ENGINE_CHOICES
from ..services.serve import LlamaServer, ServeError

_SERVERS: dict[str, object] = {}  # lane -> serve.LlamaServer started from this page
_SERVERS_LOCK = threading.Lock()


def engines_controls() -> tuple:
    """Build the Engines controls; returns (engines, plain_endpoint, spec_endpoint,
    endpoint_model, key_env, allow_remote) in the order ``ui_race.send`` takes them."""
    engines = gr.Radio(list(ENGINE_CHOICES), value=ENGINE_CHOICES[0], label="Engines",
                       elem_id="engines",
                       info="race our engine, or servers you run (a lane left empty stays ours)")
    with gr.Accordion("Server lanes", open=False, elem_id="engines-servers"):
        plain_ep = gr.Textbox(label="Plain lane endpoint", placeholder="http://127.0.0.1:8080",
                              elem_id="plain-endpoint")
        spec_ep = gr.Textbox(label="Speculative lane endpoint", placeholder="http://127.0.0.1:8081",
                             elem_id="spec-endpoint")
        model = gr.Textbox(label="Model name (empty: the server's first)", elem_id="endpoint-model")
        key_env = gr.Textbox(label="API key: name of an environment variable of the app",
                             placeholder="OPENAI_API_KEY", elem_id="endpoint-key-env",
                             info="the variable's name only; the key is never shown")
        allow_remote = gr.Checkbox(False, label="allow remote endpoints (the prompt leaves this "
                                   "machine)", elem_id="allow-remote")
        with gr.Row():
            start_btn = gr.Button("Start llama.cpp (plain + n-gram)", size="sm", elem_id="serve-start")
            stop_btn = gr.Button("Stop servers", size="sm", elem_id="serve-stop")
        note = gr.Markdown("", elem_id="serve-note")
    start_btn.click(start_servers, None, [engines, plain_ep, spec_ep, note],
                    api_visibility="undocumented", concurrency_id="serve", concurrency_limit=1)
    stop_btn.click(stop_servers, None, [engines, plain_ep, spec_ep, note],
                   api_visibility="undocumented", concurrency_id="serve", concurrency_limit=1)
    return engines, plain_ep, spec_ep, model, key_env, allow_remote


def start_servers():
    """Start llama-server twice on builtin:smollm2-135m (plain; ``--spec-type ngram-simple``)."""
    with _SERVERS_LOCK:
        try:
            for lane, draft in (("plain", "none"), ("speculative", "ngram")):
                server = _SERVERS.get(lane)
                if server is None or not server.running:
                    server = _SERVERS[lane] = LlamaServer("builtin:smollm2-135m", draft,
                                                          draft_max=8 if draft == "ngram" else None)
                    server.start()
        except ServeError as exc:
            return gr.skip(), gr.skip(), gr.skip(), f"⚠ {exc}"
        urls = {lane: s.url for lane, s in _SERVERS.items()}
    return (ENGINE_CHOICES[1], urls["plain"], urls["speculative"],
            f"llama-server running: plain {urls['plain']}, n-gram {urls['speculative']} "
            f"(stops with the app)")


def stop_servers():
    with _SERVERS_LOCK:
        for server in _SERVERS.values():
            server.stop()
        stopped = bool(_SERVERS)
        _SERVERS.clear()
    return (ENGINE_CHOICES[0], "", "", "servers stopped" if stopped else "no server was running")
