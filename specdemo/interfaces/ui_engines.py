"""The page's Engines choice: race our engine, or lanes served by OpenAI-compatible servers.

With "servers", a lane whose endpoint URL is filled in streams from that server (llama-server,
vLLM, SGLang, LM Studio); a lane left empty is our engine with the preset. "Start llama.cpp"
starts two llama-server processes on the built-in model's GGUF (plain, and n-gram speculative),
fills in their URLs, and they stop with the app (or with "Stop servers").
"""

from __future__ import annotations

import threading

import gradio as gr

from .ui_i18n import words
from .ui_race import ENGINE_CHOICES
from ..core.model_spec import builtin_spec
from ..models.builtin import FALLBACK_BUILTIN
from ..services.serve import LlamaServer, ServeError

_SERVERS: dict[str, object] = {}  # lane -> serve.LlamaServer started from this page
_SERVERS_LOCK = threading.Lock()


def engines_controls() -> tuple:
    """Build the Engines controls; returns (engines, plain_endpoint, spec_endpoint,
    endpoint_model, key_env, allow_remote) in the order ``ui_race.send`` takes them."""
    shown = (words("engine_ours"), words("engine_servers"))  # the values stay ENGINE_CHOICES
    engines = gr.Radio(list(zip(shown, ENGINE_CHOICES)), value=ENGINE_CHOICES[0], label=words("engines"),
                       elem_id="engines", info=words("engines_info"))
    with gr.Accordion(words("server_lanes"), open=False, elem_id="engines-servers"):
        plain_ep = gr.Textbox(label=words("plain_endpoint"), placeholder="http://127.0.0.1:8080",
                              elem_id="plain-endpoint")
        spec_ep = gr.Textbox(label=words("spec_endpoint"), placeholder="http://127.0.0.1:8081",
                             elem_id="spec-endpoint")
        model = gr.Textbox(label=words("endpoint_model"), elem_id="endpoint-model")
        key_env = gr.Textbox(label=words("key_env"), placeholder="OPENAI_API_KEY",
                             elem_id="endpoint-key-env", info=words("key_env_info"))
        allow_remote = gr.Checkbox(False, label=words("allow_remote"), elem_id="allow-remote")
        with gr.Row():
            start_btn = gr.Button(words("serve_start"), size="sm", elem_id="serve-start")
            stop_btn = gr.Button(words("serve_stop"), size="sm", elem_id="serve-stop")
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
                    server = _SERVERS[lane] = LlamaServer(builtin_spec(FALLBACK_BUILTIN), draft,
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
