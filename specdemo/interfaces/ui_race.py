"""The race's handlers: Send, Stop, Replay, Clear and the ``/race`` API.

One handler drives both panes through :class:`specdemo.services.race.Race` (plain, then speculative,
each alone on the device thread); what they show is laid out by :mod:`specdemo.interfaces.ui_format`.
Every value a person or a script gives is checked by :mod:`specdemo.checks.inputs` first, so an
unknown preset, draft length 0 or a lone surrogate is refused with the field named and the valid
values listed, as the command line does.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import os
import threading

import gradio as gr

from ..checks import compat, inputs
from ..services import race as racing
from ..services.race import DONE, PLAIN, SPECULATIVE, STOPPED, PaneView, Race, RaceSnapshot
from ..services.startup import STEPS
from .ui_format import (PANES, acceptance_frame, chat_messages, counters_html, explanation_text, not_compared,
                        race_chart, verdict_html)
from .ui_i18n import DEFAULT, t
from .ui_state import (CACHE, LOAD_LOCK, AppSettings, _default_preset_name, _pairing, _presets,
                       engine_imports, model_status)
from ..services.pipeline import DecodeSettings
from ..core.tree import named_shape
from ..services.endpoints import Endpoint, EndpointError

#: gradio's session_hash (one per browser tab) -> Stop events of its runs
_CANCELS: dict[str, set[threading.Event]] = {}
_CANCELS_LOCK = threading.Lock()


def new_conversation() -> dict[str, list[dict]]:
    """{pane: [turn, ...]}; a turn is {user, text, tokens, status, error}."""
    return {name: [] for name in PANES}


def turn_of(prompt: str, view: PaneView) -> dict:
    return {"user": prompt, "text": view.text, "tokens": [list(t) for t in view.tokens],
            "status": view.status, "error": view.error}


def model_messages(turns: list[dict], kept: list[bool] | None = None) -> list[dict]:
    """The messages a pane's next prompt is built from: its turns with text that ended in both
    panes (``kept``, from :func:`kept_turns`; default: the turns that finished or were stopped
    with text in this pane)."""
    out = []
    for i, turn in enumerate(turns):
        keep = kept[i] if kept is not None else (turn["status"] in (DONE, STOPPED)
                                                 and turn["text"].strip())
        if keep:
            out += [{"role": "user", "content": turn["user"]},
                    {"role": "assistant", "content": turn["text"]}]
    return out


def kept_turns(conv: dict) -> list[bool]:
    """Per turn of the conversation, whether it goes into the next prompt of both panes: only a
    turn that finished with text in every pane. A turn stopped in either pane (the plain lane
    stopped at 126 tokens, the speculative one not started) is left out of both, so the two
    panes always continue the same conversation."""
    panes = [conv[name] for name in PANES]
    return [all(turns[i]["status"] == DONE and turns[i]["text"].strip() for turns in panes)
            for i in range(min(len(turns) for turns in panes))]


def histories(conv: dict) -> dict[str, list[dict]]:
    """{pane: the messages its next prompt is built from} (:func:`kept_turns`)."""
    kept = kept_turns(conv)
    return {name: model_messages(conv[name][:len(kept)], kept) for name in PANES}


def histories_differ(conv: dict) -> bool:
    """Whether the panes' earlier answers differ (sampling, or an earlier divergence): then the
    two lanes continue different conversations, which a divergence in this turn may come from."""
    texts = {name: [m["content"] for m in messages] for name, messages in histories(conv).items()}
    return len({tuple(v) for v in texts.values()}) > 1


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def _session_cancel(request: gr.Request | None) -> threading.Event:
    """A fresh Stop event for a race or replay of this browser tab (Stop sets them all)."""
    event = threading.Event()
    with _CANCELS_LOCK:
        _CANCELS.setdefault(_session(request), set()).add(event)
    return event


def _forget_cancel(request: gr.Request | None, event: threading.Event) -> None:
    with _CANCELS_LOCK:
        _CANCELS.get(_session(request), set()).discard(event)


def stop(request: gr.Request) -> None:
    """End the running race and replay of this browser tab; what was produced is kept."""
    with _CANCELS_LOCK:
        for event in _CANCELS.pop(_session(request), set()):
            event.set()


def client_gone(request: gr.Request | None):
    """A function telling whether the client of this queued call has gone away.

    gradio marks a queued event not alive (``Event.alive``) once its client's event stream
    disconnects (``Queue.clean_events``, by the request's ``session_hash``) but lets a running
    function run on; the race's loops ask this between snapshots and set the race's Stop event,
    so an abandoned race stops between two prefill chunks or rounds instead of holding the
    device. Where the queue cannot be read (a direct call, another gradio), the client never
    reads as gone.
    """
    tab = getattr(request, "session_hash", None)
    try:
        queue = request.request.app.get_blocks()._queue
        queue.active_jobs  # noqa: B018 - read once here, so a missing attribute says "unknown"
    except Exception:
        return lambda: False

    def gone() -> bool:
        jobs = [job for job_set in list(queue.active_jobs) if job_set for job in job_set
                if getattr(job, "session_hash", None) == tab]
        return bool(jobs) and not any(getattr(job, "alive", True) for job in jobs)
    return gone


def refusal(message: str) -> gr.Error:
    """A gr.Error for input the user can fix: shown on the page and returned to API callers, but
    not printed as a traceback in the app's terminal (it is not a fault of the app)."""
    try:
        return gr.Error(message, print_exception=False)
    except TypeError:  # a gradio without print_exception
        return gr.Error(message)


def _valid(check, *args, **kwargs):
    """An :mod:`specdemo.checks.inputs` check whose InputError becomes a gr.Error (the same message the
    command line gives)."""
    try:
        return check(*args, **kwargs)
    except inputs.InputError as exc:
        raise refusal(str(exc)) from None


def _settings(temperature, top_p, max_new_tokens, seed, draft_length, names: dict | None = None,
              draft_tree: str | None = None, top_k=0, repetition_penalty=1.0):
    """DecodeSettings from the controls' (or the API's) values, each checked with its field
    named in the message and the command line's bounds (seed -1 or None = random, draft length
    "auto" or 1..64, top-p in (0, 1], top-k >= 0 with 0 = off, repetition penalty > 0).

    Args:
        names: field names to use in messages, by parameter (the API's keyword names differ
            from the page's labels).
    Raises:
        gr.Error: a value out of range or not a number.
    """
    names = {"temperature": "temperature", "top_p": "top-p", "max_new_tokens": "max new tokens",
             "seed": "seed", "draft_length": "draft length", "top_k": "top-k",
             "repetition_penalty": "repetition penalty", **(names or {})}
    seed = _valid(inputs.number, names["seed"], -1 if seed in (None, "") else seed, integer=True)
    try:
        tree = named_shape(None if draft_tree == "" else draft_tree)  # "": not given (the API's rule)
    except ValueError as exc:
        raise refusal(f"{names.get('draft_tree', 'draft tree')}: {exc}") from None
    return DecodeSettings(
        tree=tree,
        max_new_tokens=_valid(inputs.number, names["max_new_tokens"], max_new_tokens, minimum=1,
                              integer=True),
        temperature=_valid(inputs.number, names["temperature"], temperature, minimum=0),
        top_p=_valid(inputs.number, names["top_p"], top_p, above=0, maximum=1),
        top_k=_valid(inputs.number, names["top_k"], top_k, minimum=0, integer=True),
        repetition_penalty=_valid(inputs.number, names["repetition_penalty"], repetition_penalty,
                                  above=0),
        seed=None if seed < 0 else seed,
        draft_length=_valid(inputs.draft_length, names["draft_length"],
                            "auto" if draft_length in (None, "") else draft_length))


def _check_prompt(prompt: str | None, system: str | None = None,
                  system_field: str = "system prompt") -> str:
    _valid(inputs.text, system_field, system, required=False)
    return _valid(inputs.text, "prompt", prompt)


def _new_race(prompt, system, preset_name, draft, settings, conv, request, backend,
              endpoints: dict | None = None) -> Race:
    """The race of one Send or ``/race`` call: a lane that ``endpoints`` names
    (:func:`_lane_endpoints`) is that server, the others our engine (the preset's target on
    ``backend``; the speculative lane with ``draft``, default the preset's). What our lanes
    will load is checked first, as the command line checks it.

    Raises:
        gr.Error: a malformed or unknown draft, a draft that cannot serve the target, a target
            that cannot be obtained (the command line's sentences).
    """
    endpoints = endpoints or {}
    pairing = _pairing(preset_name)
    draft = _valid(inputs.draft, "draft", draft or pairing.draft)
    if endpoints.get(SPECULATIVE) is None:  # our engine drafts: the CLI's check, before any load
        _valid(compat.before_load, pairing.target, draft)
    elif endpoints.get(PLAIN) is None:  # our engine decodes plainly: only the target matters
        _valid(inputs.obtainable, "target", pairing.target)
    lanes = racing.race_lanes(CACHE, pairing.target, draft, histories(conv), prompt,
                              pairing.dtype, pairing.quantization, backend)
    return Race(racing.with_endpoints(lanes, endpoints), settings, system,
                cancel=_session_cancel(request), device_lock=LOAD_LOCK)


def _run_race(race: Race, request, min_interval_s: float):
    """Run ``race`` and yield its snapshots (at most one per ``min_interval_s``, the last one
    ``done``); a client gone away (:func:`client_gone`) stops it between two prefill chunks or
    rounds, and the race's Stop event is forgotten at the end. Send and ``/race`` both run here."""
    gone = client_gone(request)
    try:
        for snap in race.run(min_interval_s=min_interval_s):
            if gone():  # the tab was closed or the caller gave up: nobody will see the rest
                race.cancel.set()
            yield snap
    finally:
        _forget_cancel(request, race.cancel)


ENGINE_CHOICES = ("specdemo (this app)", "servers (OpenAI-compatible endpoints)")


def _lane_endpoints(engines, plain_endpoint, spec_endpoint, endpoint_model, key_env,
                    allow_remote, preset_name: str | None = None,
                    lang: str | None = DEFAULT) -> dict | None:
    """{"plain": Endpoint or None, "speculative": ...} when the Engines choice is servers (or
    the API names an endpoint), else None (both lanes are our engine). With servers chosen (or
    from the API) and no URL given, the endpoints the preset names (``plain_endpoint``,
    ``spec_endpoint`` in its file) are used.

    Raises:
        gr.Error: a malformed URL, a remote one without the tick, an unset key variable, or
            servers chosen with no URL (the same sentences as the command line).
    """
    urls = {PLAIN: (plain_endpoint or "").strip(), SPECULATIVE: (spec_endpoint or "").strip()}
    if engines != ENGINE_CHOICES[0] and not any(urls.values()):
        pairing = _pairing(preset_name)
        urls = {PLAIN: pairing.plain_endpoint or "", SPECULATIVE: pairing.spec_endpoint or ""}
    if engines != ENGINE_CHOICES[1] and not any(urls.values()):
        return None
    if engines == ENGINE_CHOICES[1] and not any(urls.values()):
        raise refusal(t("err_no_endpoint", lang))
    try:
        return {name: Endpoint(url, (endpoint_model or "").strip() or None,
                               (key_env or "").strip() or None, allow_remote=bool(allow_remote))
                if url else None for name, url in urls.items()}
    except EndpointError as exc:
        raise refusal(str(exc)) from None


def _render(snap: RaceSnapshot, conv: dict, prompt: str, upto: int, highlight: bool,
            settings, lang: str | None = DEFAULT) -> tuple:
    """Chatbots, counters, verdict and the two charts for a snapshot shown after the first
    ``upto`` turns; a pane that is loading shows the step in progress."""
    out = []
    step = STEPS.current()
    for name in PANES:
        turns = conv[name][:upto] + [turn_of(prompt, snap.panes[name])]
        out.append(chat_messages(turns, name == SPECULATIVE, highlight, step, lang))
    spec = snap.panes[SPECULATIVE]
    before = {name: conv[name][:upto] for name in PANES}
    return (out[0], out[1], counters_html(snap.panes[PLAIN], False, step=step, lang=lang),
            counters_html(spec, True, settings.draft_length, step, lang),
            verdict_html(snap, settings.temperature, lang, histories_differ(before)),
            race_chart(snap, lang), acceptance_frame(spec))


def live_interval_s() -> float:
    """Seconds between page updates while a decode is being timed.

    The browser redraws the page on this machine's CPU. Measured on a 2-core CPU with headless
    Chromium: updating 3-7 times a second cost the timed decodes 10-25% of their speed, once a
    second about 8% (``specdemo compare`` as the reference). So a small CPU without a GPU gets one
    update a second (Replay race then shows the run smoothly); a GPU or 8+ cores get ten.
    """
    import torch
    mps = getattr(torch.backends, "mps", None)
    accelerated = torch.cuda.is_available() or bool(mps and mps.is_available())
    return 0.1 if accelerated or (os.cpu_count() or 1) >= 8 else 1.0


def _same(old, new) -> bool:
    return old.equals(new) if hasattr(old, "equals") else old == new  # DataFrames: .equals


def _only_changed(before: tuple | None, after: tuple) -> tuple:
    """``after`` with gr.skip() where nothing changed: less for the browser to redraw while a
    decode is being timed on the same machine."""
    if before is None:
        return after
    return tuple(gr.skip() if _same(old, new) else new for old, new in zip(before, after))


def send(prompt, system, preset_name, draft, draft_length, temperature, top_p, max_new_tokens,
         seed, highlight, conv, request: gr.Request, engines=None, plain_endpoint="",
         spec_endpoint="", endpoint_model="", key_env="", allow_remote=False, draft_tree="off",
         lang=DEFAULT, app: AppSettings = AppSettings()):
    """Race the prompt through both panes; yields the page's outputs as the race goes. With
    Engines set to servers, a lane with an endpoint URL streams from that server. ``lang``: the
    page's locale (``ui_i18n.LOCALES``); ``app``: the app's settings (its backend)."""
    _check_prompt(prompt, system)
    settings = _settings(temperature, top_p, max_new_tokens, seed, draft_length,
                         draft_tree=draft_tree)
    endpoints = _lane_endpoints(engines, plain_endpoint, spec_endpoint, endpoint_model, key_env,
                                allow_remote, preset_name, lang)
    engine_imports()
    conv = conv or new_conversation()
    race = _new_race(prompt, system, preset_name, draft, settings, conv, request, app.backend,
                     endpoints)
    upto = len(conv[PLAIN])
    snap, box, shown = None, "", None  # empty the prompt box once, then leave it to the user
    with contextlib.closing(_run_race(race, request, live_interval_s())) as snaps:
        for snap in snaps:
            view = _render(snap, conv, prompt, upto, highlight, settings, lang)
            yield _only_changed(shown, view) + (gr.skip(), gr.skip(), box, gr.skip())
            shown, box = view, gr.skip()
    conv = {name: conv[name] + [turn_of(prompt, snap.panes[name])] for name in PANES}
    replayable = {"race": race, "prompt": prompt, "upto": upto}
    yield _render(snap, conv, prompt, upto, highlight, settings, lang) + (
        conv, replayable, box, model_status(preset_name, draft, lang))


def replay(replayable, conv, highlight, request: gr.Request, lang=DEFAULT):
    """Play the last race back, both panes side by side at their measured pace."""
    if not replayable:
        raise refusal(t("err_nothing_to_replay", lang))
    race, prompt, upto = replayable["race"], replayable["prompt"], replayable["upto"]
    cancel = _session_cancel(request)
    try:
        for snap in race.replay(cancel=cancel):
            yield _render(snap, conv, prompt, upto, highlight, race.settings, lang)
    finally:
        _forget_cancel(request, cancel)


def rerender(conv, highlight, lang=DEFAULT):
    """Both panes' conversations drawn again (the highlight or the language changed)."""
    conv = conv or new_conversation()
    return tuple(chat_messages(conv[name], name == SPECULATIVE, highlight, lang=lang)
                 for name in PANES)


def redraw(replayable, conv, highlight, lang=DEFAULT) -> tuple:
    """The race outputs drawn again in ``lang`` (the page's language changed): the last race's
    panes, counters and badges, or the empty ones."""
    if not replayable:
        return clear(lang)[:7]
    race, prompt, upto = replayable["race"], replayable["prompt"], replayable["upto"]
    return _render(race.snapshot(), {name: conv[name][:upto] for name in PANES}, prompt, upto,
                   highlight, race.settings, lang)


def clear(lang=DEFAULT):
    return ([], [], counters_html(None, False, lang=lang), counters_html(None, True, lang=lang),
            verdict_html(None, 0, lang), race_chart(None, lang), acceptance_frame(None),
            new_conversation(), None)


def _pane_dict(view: PaneView, draft_length_setting: int | str | None = None) -> dict:
    """docs/design.md metric names plus text, token_ids, from_draft, status, error and backend
    (``race.pane_dict``: the same keys for a lane that did not run; ``draft_length`` "auto"
    for the speculative lane under auto)."""
    return racing.pane_dict(view, draft_length_setting)


def _note(snap: RaceSnapshot) -> str | None:
    reason = not_compared(snap)
    return f"not compared: {reason}" if reason else None


#: the ``/race`` keyword names its refusals use (the page's labels differ)
API_FIELDS = {name: name for name in ("max_new_tokens", "draft_length", "draft_tree", "top_p",
                                      "top_k", "repetition_penalty")}


def race_api(prompt: str, preset: str | None = None, draft: str | None = None,
             max_new_tokens: int = 128, temperature: float = 0.0,
             draft_length: str | int | None = None, plain_endpoint: str | None = None,
             spec_endpoint: str | None = None, endpoint_model: str | None = None,
             endpoint_key_env: str | None = None, allow_remote_endpoint: bool = False,
             draft_tree: str | None = None, system: str | None = None, top_p: float = 1.0,
             top_k: int = 0, seed: int | None = None, repetition_penalty: float = 1.0,
             request: gr.Request = None, app: AppSettings = AppSettings()) -> dict:
    """Race one prompt: plain, then speculative, each alone; returns both results. A call whose
    client goes away is stopped between two prefill chunks or rounds (:func:`client_gone`).

    Args:
        prompt: the user message (chat template applied).
        preset: a preset name (default: the one the app was started with, else the default preset).
        draft: none, ngram, self, early-exit:N or a model (default: the preset's draft).
        max_new_tokens, temperature: tokens to generate at most; 0 for greedy.
        draft_length: 1..64 or "auto" (default: the preset's).
        plain_endpoint, spec_endpoint: base URL of an OpenAI-compatible server for that lane
            (llama-server, vLLM, SGLang, LM Studio); a lane without one is our engine.
        endpoint_model, endpoint_key_env: the model to request (default: the server's first);
            the name of the app's environment variable holding the API key.
        allow_remote_endpoint: allow an endpoint that is not on this machine.
        draft_tree: "off" (default), "default" or rank paths (``core.tree``): the EAGLE-3
            drafter's rounds verify a tree of its guesses (greedy only); the pane's
            ``tree`` and ``tree_rounds`` say whether it was used.
        system: a system prompt (the page's System prompt box; default none).
        top_p, top_k, seed, repetition_penalty: as the page's controls and ``compare``'s flags:
            top-p in (0, 1] (default 1.0: off), top-k a whole number >= 0 (default 0: off), seed
            a whole number for a repeatable sampled race (None or -1, the default: random;
            the speculative lane repeats with a fixed ``draft_length`` only),
            repetition penalty above 0 (default 1.0: off).
        app: the app's settings (its preset and backend; the page binds them,
            :func:`race_api_for`).
    Returns:
        {"plain": {...}, "speculative": {...}, "speedup": x, "speedup_note": None,
        "explanation": why the speedup is what it is (``stats.RaceExplanation``'s figures, None
        when a run did not finish), "why": the page's sentence from those figures (None
        likewise), "identical": bool, "first_divergence": i, "warnings": [...], "lossless_expected": bool or
        None, "lossless_note": why greedy outputs may differ in the target's precision or None,
        (under sampling, temperature > 0: ``identical`` and ``first_divergence`` None and
        ``lossless_note`` says identical text is not expected, the outputs being equal in
        distribution, not token for token),
        "draft_length_setting": "auto" or k (the policy; the speculative pane's ``draft_length``
        is "auto" under auto, else the k of its last round; ``mean_draft_length`` and
        ``draft_length_min``/``_max`` cover every round), "backend": the forward backend both
        lanes ran on (what ``auto`` chose: ``ggml``, ``native-w8a8``, ...; each pane has its
        own ``backend`` too, None for a server lane)} with docs/design.md metric names; every
        pane has the same keys (a skipped one 0 or None where it did not run); when a run was stopped or failed, ``speedup`` is None and
        ``speedup_note`` says "not compared" and why (each pane's
        ``other_cpu_share``; ``warnings`` says when other processes used so much of the CPU
        during a run that the speedup is not reliable); a pane that failed has "error"
        (a draft that cannot be loaded fails before either pane runs: the other is "skipped").
    Raises:
        gr.Error: an empty or invalid prompt, an unknown preset, a malformed or unknown draft
            (a typo gets "did you mean ...?"), a hub id not cached while the hub is unreachable,
            an early-exit layer count beyond the target's, a value out of range (max_new_tokens
            beyond the target's context, read from its config); the message
            names the field and the valid values, in the command line's words, before anything
            loads.
    """
    _check_prompt(prompt, system, "system")
    presets, _ = _presets()
    if preset not in (None, ""):
        _valid(inputs.preset, preset, [p.name for p in presets])
    preset = _default_preset_name(preset or None, app)
    pairing = _pairing(preset)
    k = draft_length if draft_length not in (None, "") else pairing.draft_length
    settings = _settings(temperature, top_p, max_new_tokens, seed, k, names=API_FIELDS,
                         draft_tree=draft_tree, top_k=top_k, repetition_penalty=repetition_penalty)
    if draft not in (None, ""):  # text checks first, as the command line's flags
        _valid(inputs.draft, "draft", draft)
    endpoints = _lane_endpoints(None, plain_endpoint, spec_endpoint, endpoint_model,
                                endpoint_key_env, allow_remote_endpoint, preset)
    if endpoints is None or None in endpoints.values():  # our engine: its context, before loading
        _valid(inputs.fits_context, "max_new_tokens", settings.max_new_tokens, pairing.target)
    engine_imports()
    race = _new_race(prompt, system or None, preset, draft, settings, new_conversation(), request,
                     app.backend, endpoints)
    *_, snap = _run_race(race, request, 1.0)  # only the last snapshot is returned
    return _race_result(race, snap, settings.draft_length, preset, draft or pairing.draft)


def _race_result(race, snap, k, preset: str, draft: str) -> dict:
    """:func:`race_api`'s answer from the race's last snapshot (its Returns say the keys); a
    sampled race has no token-for-token verdict (``race.sampled_verdict``, as the page's
    badge and ``compare --json``)."""
    out = {PLAIN: _pane_dict(snap.panes[PLAIN], k),
           SPECULATIVE: _pane_dict(snap.panes[SPECULATIVE], k),
           "backend": racing.snapshot_dict(snap)["backend"], "speedup": snap.speedup,
           "speedup_note": _note(snap),
           "explanation": snap.explanation.as_dict() if snap.explanation else None,
           "why": explanation_text(snap.explanation) if snap.explanation else None,
           "identical": snap.identical,
           "first_divergence": snap.first_divergence, "divergence_unit": snap.divergence_unit,
           "warnings": list(snap.warnings),
           "lossless_expected": race.lossless_expected, "lossless_note": race.lossless_note,
           "preset": preset, "draft": draft, "draft_length_setting": k}
    return racing.sampled_verdict(out, race.settings.temperature)


def race_api_for(app: AppSettings):
    """:func:`race_api` with the app's settings bound, for ``gr.api``: the same signature less
    ``app`` (gradio reads the parameters and their type hints; ``functools.partial`` loses the
    hints and the ``gr.Request``)."""
    @functools.wraps(race_api)
    def race(*args, **kwargs) -> dict:
        return race_api(*args, **kwargs, app=app)
    signature = inspect.signature(race_api)
    race.__signature__ = signature.replace(
        parameters=[p for name, p in signature.parameters.items() if name != "app"])
    return race
