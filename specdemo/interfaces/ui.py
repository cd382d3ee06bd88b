"""The side-by-side chat app: plain decoding on the left, speculative decoding on the right.

``build_ui()`` builds a gradio Blocks and ``launch`` serves it; nothing heavy happens at import or
build time. The preset's models load when the app starts or the page opens, each slow step shown
with a progress bar and an estimate (:mod:`specdemo.interfaces.ui_state`); the race's handlers and the
``/race`` API live in :mod:`specdemo.interfaces.ui_race`, what the page shows (counters, badges, charts) in
:mod:`specdemo.interfaces.ui_format`. This module holds the page, the preset and draft controls, and launch.
No metric is computed here.
"""

from __future__ import annotations

import os
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import gradio as gr

from .. import PROJECT_DIR
from ..checks import inputs
from ..checks.compat import NON_MODEL_DRAFTS, non_model_verdict
from ..core.draft_spec import DraftSpec, as_draft_spec
from ..services import race as racing
from ..core.machine import ACTIVE_RACES
from .ui_format import (AXIS_FORMAT, acceptance_frame, chart_colors,  # noqa: F401
                        chat_messages, counters_html, exact_check, legend, privacy_html,
                        race_frame, race_y_top, startup_html, tokens_html, verdict_html)
from .ui_i18n import (DEFAULT, HEAD, LANGUAGES, LOAD_LANG_JS, SWITCH_JS, i18n, locale, sentence,
                      t, words)
from .ui_race import (clear, model_messages, new_conversation, race_api,  # noqa: F401
                      race_api_for, redraw, replay, rerender, send, stop, turn_of)
from .ui_state import (CACHE, FALLBACK_TARGET, LOAD_LOCK, AppSettings, Pairing,  # noqa: F401
                       _default_preset_name, _pairing, _presets, engine_imports, follow_startup,
                       loaded_backend,
                       model_status, preload,
                       start_preload, startup_done, wait_until_ready)
from ..models.learned import BUILTIN_DRAFTERS, is_learned
from ..models import hardware
from ..models.loading import ModelLoadError, resolve_device, resolve_dtype
from ..services.pipeline import lossless_expectation
from ..checks import compat
from ..models import loading
from ..services.check_worker import CheckWorker
from ..services.prompts import TASKS, load_prompts
from .ui_engines import engines_controls

ASSETS = PROJECT_DIR / "assets"
CSS_PATH = ASSETS / "specdemo.css"
#: the drafters without a model the app offers (compat.NON_MODEL_DRAFTS less "none": a race has a drafter)
PLAIN_DRAFTS = tuple(spec for spec in NON_MODEL_DRAFTS if spec != "none")
DRAFT_LENGTHS = ["auto"] + [str(k) for k in range(1, 17)]

_VERDICTS: dict[tuple[str, str], Any] = {}


# --- presets and drafts --------------------------------------------------------------------

_CHECKS: ThreadPoolExecutor | None = None
_CHECKS_LOCK = threading.Lock()


def _lowest_priority() -> None:
    """Give the calling thread the lowest CPU priority (nice 19; Linux sets it per thread, and
    threads it starts, such as the tokenizers' own, inherit it). Elsewhere nothing changes."""
    if sys.platform.startswith("linux"):
        try:
            os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        except OSError:
            pass


def _checks() -> ThreadPoolExecutor:
    """The one low-priority thread that computes draft-list verdicts."""
    global _CHECKS
    with _CHECKS_LOCK:
        if _CHECKS is None:
            _CHECKS = ThreadPoolExecutor(1, thread_name_prefix="specdemo-checks",
                                         initializer=_lowest_priority)
        return _CHECKS


def _verdict(target: str, draft: DraftSpec | str):
    """compat.check_specs, remembered per pair for this process (``recheck`` forgets).

    A model draft's check (its tokenizer against the target's: a first Gemma 3 tokenizer check
    converts it from its GGUF, a minute of CPU) runs in the check process
    (:mod:`specdemo.services.check_worker`), which is stopped while a race is queued or timed: a
    Send never waits for it and its clocks share the CPU with none of it. The other checks
    (learned drafters against the loaded target, early-exit layer counts) take a fraction of a
    second; they run here on a thread of the lowest CPU priority, not while models load nor
    while a race is queued or timed, and a race sent meanwhile lets the one in progress end
    before its first lane's clock starts (``ACTIVE_RACES.background``).
    """
    key = (target, draft)
    if key not in _VERDICTS:
        if as_draft_spec(draft).is_model and not is_learned(draft):
            _VERDICTS[key] = _worker().verdict(target, draft)
            return _VERDICTS[key]
        with LOAD_LOCK:  # not while models load...
            pass
        with ACTIVE_RACES.background():  # ...nor while a race is queued or timed
            _VERDICTS[key] = _checks().submit(compat.check_specs, target, draft).result()
    return _VERDICTS[key]


_WORKER: list = []


def _worker():
    """The one check process of this app (started on first use)."""
    with _CHECKS_LOCK:
        if not _WORKER:
            _WORKER.append(CheckWorker())
        return _WORKER[0]


def draft_options(target: str, presets: list) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Compatible drafts for ``target`` as (label, spec) choices, and (spec, reason) per refused one.

    Candidates: ngram and self (always compatible), early-exit drafts of presets for this
    target, learned drafters built for it (presets' EAGLE-3 / DFlash / MTP drafts and shipped
    ``builtin:`` drafters), the model drafts of those presets and the other built-in models.
    All but the first two are checked with ``compat.check_specs``: model drafts by their
    tokenizers (no weights), early-exit layer counts against the target's config, learned
    drafters against the target's weights (``drafters.learned``).
    """
    ours = [p for p in presets if p.target == target]
    early_exits = sorted({p.draft for p in ours if p.draft.is_early_exit})
    kinds = {f"builtin:{n}": "eagle3" for n, t in BUILTIN_DRAFTERS.items() if t == target}
    kinds.update({p.draft: p.draft_kind for p in ours if p.draft_is_learned})
    models = list(dict.fromkeys(list(kinds) + [p.draft for p in ours if p.draft_is_model]
                                + [f"builtin:{n}" for n in loading.builtin_names()
                                   if f"builtin:{n}" != target]))
    choices = [(spec, spec) for spec in PLAIN_DRAFTS]
    refused = []
    for spec in early_exits + models:
        kind = f" ({KIND_LABELS[kinds[spec]]})" if spec in kinds else ""
        try:
            verdict = _verdict(target, spec)
        except (ModelLoadError, OSError, ValueError, RuntimeError) as exc:
            refused.append((spec, _cannot_check(spec, exc, learned=bool(kind))))
            continue
        if verdict.status == "incompatible":
            refused.append((spec, verdict.reasons[0]))
        elif verdict.status == "compatible":
            choices.append((spec + kind, spec))
        else:
            choices.append((f"{spec}{kind} (with warnings)", spec))
    return choices, refused


def _cannot_check(spec: DraftSpec | str, exc: Exception, learned: bool = False) -> str:
    """Why ``spec`` could not be checked, for the draft list and the draft note."""
    if as_draft_spec(spec).is_early_exit:
        return str(exc)  # "cannot check early-exit:N: the layer count of T is unknown (...)"
    return f"cannot check {'it' if learned else 'its tokenizer'} ({exc})"


KIND_LABELS = {"eagle3": "EAGLE-3", "dflash": "DFlash", "dspark": "DSpark",
               "gemma4-assistant": "Gemma 4 assistant", "mtp": "MTP"}


def load_models(preset_name, draft, lang=DEFAULT, app: AppSettings = AppSettings()):
    """The explicit Load path: load target and draft on the app's backend, reporting progress."""
    engine_imports()
    p = _pairing(preset_name)
    draft = draft or p.draft
    yield t("loading_target", lang, target=p.target)
    try:
        CACHE.get(p.target, "none", p.dtype, p.quantization, backend=app.backend)
        yield t("loaded_preparing", lang, target=p.target, draft=draft)
        CACHE.get(p.target, draft, p.dtype, p.quantization, backend=app.backend)
    except Exception as exc:  # ModelLoadError, incompatible draft, out of memory
        yield f"⚠ {racing.describe_error(exc)}"
        return
    yield model_status(preset_name, draft, lang)


def preset_info(preset_name: str | None, lang: str | None = DEFAULT) -> str:
    """The preset's note and whether it fits this machine."""
    engine_imports()
    presets, error = _presets()
    if error:
        return t("presets_unreadable", lang, error=error, target=FALLBACK_TARGET)
    p = _pairing(preset_name).preset
    if p is None:
        return t("target_only", lang, target=FALLBACK_TARGET)
    try:
        ok, reason = hardware.fits(p, hardware.detect(), alternatives=presets)
    except Exception as exc:  # hardware probing must not break the page
        ok, reason = True, f"(could not check this machine: {exc})"
    mark = t("fits" if ok else "fits_not", lang)
    runs = loaded_backend(preset_name)  # what the race computes in, not only the load dtype
    runs = t("runs_on", lang, runs=sentence(runs, lang)) if runs else t("backend_at_load", lang, dtype=p.dtype)
    return (t("preset_line", lang, target=p.target, draft=p.draft, runs=runs,
              note=p.note_in(locale(lang)))
            + f"  \n{mark}{t('colon', lang)}{sentence(reason, lang)}"
            + precision_line(p.dtype, p.quantization, lang=lang))


def precision_line(dtype: str, quantization: str | None, device: str = "auto",
                   lang: str | None = DEFAULT) -> str:
    """``""`` when a preset races in float32; else a line saying, before any race, that greedy
    outputs may differ in its precision (``auto`` is bfloat16 on CUDA), why, and that float32
    gives an exact check where memory allows."""
    try:
        resolved = resolve_dtype(dtype, resolve_device(device))
    except ModelLoadError:
        return ""
    expected, why = lossless_expectation(resolved, quantization)
    return "" if expected else "  \n" + t("may_differ", lang, why=why, check=exact_check(lang))


def on_preset(preset_name, lang=DEFAULT):
    """Preset changed: draft, draft length and the notes follow (the draft check comes next)."""
    p = _pairing(preset_name)
    choices = [(d, d) for d in PLAIN_DRAFTS]
    if p.draft not in PLAIN_DRAFTS:
        choices.append((p.draft, p.draft))
    return (gr.update(choices=choices, value=p.draft), str(p.draft_length),
            preset_info(preset_name, lang), t("checking_drafts", lang),
            model_status(preset_name, p.draft, lang))


def check_drafts(preset_name, draft, lang=DEFAULT, recheck: bool = False):
    """Offer only compatible drafts for the preset's target; list refused ones with reasons.

    Waits until the preset's models are loaded: a tokenizer check holds the load lock (and a
    first one can take minutes), so it must not stand between a first Send and its answer."""
    wait_until_ready()
    engine_imports()
    if recheck:
        _VERDICTS.clear()
    presets, _ = _presets()
    p = _pairing(preset_name)
    choices, refused = draft_options(p.target, presets)
    values = [v for _, v in choices]
    if p.draft not in values and p.draft not in [spec for spec, _ in refused]:
        choices.append((p.draft, p.draft))
        values.append(p.draft)
    note = (t("drafts_offered", lang, target=p.target, n=len(choices))
            + (t("refused", lang) + "  \n".join(f"✗ `{spec}`: {sentence(why, lang)}"
                                                 for spec, why in refused)
               if refused else t("none_refused", lang)))
    if draft in values:  # keep what the user may have picked while the check ran
        return gr.update(choices=choices), note
    return gr.update(choices=choices, value=p.draft), note


def on_draft(preset_name, draft, lang=DEFAULT):
    """A draft typed or picked: say whether it can serve the target (a model is checked)."""
    engine_imports()
    target = _pairing(preset_name).target
    if not draft:
        return ""
    try:
        draft = inputs.draft("draft", draft)
    except inputs.InputError as exc:
        return f"✗ {exc}"
    verdict = non_model_verdict(draft)
    if verdict is None:
        try:
            verdict = _verdict(target, draft)
        except Exception as exc:
            return f"⚠ `{draft}`: {_cannot_check(draft, exc)}"
    mark, word = {"compatible": ("✓", "v_compatible"), "compatible with warnings": ("⚠", "v_warnings"),
                  "incompatible": ("✗", "v_incompatible")}[verdict.status]
    return f"{mark} `{draft}`: {t(word, lang)}. " + " ".join(verdict.reasons[:2])


# --- the page ------------------------------------------------------------------------------

def _theme():
    """Default theme with system fonts: the page loads nothing from the internet."""
    system = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"]
    mono = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
    return gr.themes.Default(font=system, font_mono=mono)


def launch_options() -> dict:
    """Keyword arguments for ``Blocks.launch`` (gradio 6 takes css, theme, head and i18n
    there): the page's words in English, Traditional and Simplified Chinese (``ui_i18n``)."""
    return {"css_paths": [CSS_PATH], "theme": _theme(), "head": HEAD, "i18n": i18n()}


QUEUE_IDLE_SLEEP_S = 0.05  # gradio's queue loop polls every 1 ms when idle (50 ms on Windows)


def quiet_queue(demo: gr.Blocks) -> None:
    """Let an idle server be idle: gradio 6's queue loop wakes every 1 ms (its progress loop every
    10 ms) while nothing is queued, which measured 3-8% of a core here with nobody connected.
    Waking every 50 ms (gradio's own choice on Windows) delays the start of an event by 50 ms at
    most. Skipped silently when a gradio version lacks these attributes."""
    queue = getattr(demo, "_queue", None)
    if queue is not None and hasattr(queue, "sleep_when_free"):
        queue.sleep_when_free = max(queue.sleep_when_free, QUEUE_IDLE_SLEEP_S)
        queue.progress_update_sleep_when_free = max(
            getattr(queue, "progress_update_sleep_when_free", 0.0), 2 * QUEUE_IDLE_SLEEP_S)


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None,
           inbrowser: bool = False, share: bool = False, prevent_thread_lock: bool = False):
    """Queue (one race at a time; other tabs wait their turn) and launch the page.

    Without ``share``, gradio's start-up lines are replaced by one line with the local URL:
    gradio's own hint ("set `share=True` in `launch()`") names its API, not our ``--share``.
    """
    demo.queue(default_concurrency_limit=1)
    quiet_queue(demo)
    out = demo.launch(server_name=host, server_port=port, inbrowser=inbrowser, share=share,
                      prevent_thread_lock=True, show_error=True, quiet=not share,
                      **launch_options())
    if not share:
        print(f"* Running on local URL:  {demo.local_url}  (a public link: python app.py --share)",
              flush=True)
    if not prevent_thread_lock:
        demo.block_thread()
    return out


def _examples(prompt: gr.Textbox) -> None:
    try:
        prompts = load_prompts()
    except (OSError, ValueError) as exc:
        gr.Markdown(f"⚠ example prompts could not be read: {exc}")
        return
    with gr.Accordion(words("examples"), open=False, elem_id="examples"):
        for task in TASKS:
            with gr.Tab(words(f"task_{task}") if f"task_{task}" in i18n().translations_dict[DEFAULT]
                        else task):
                gr.Examples([[p] for p in prompts[task]], inputs=[prompt], label=None,
                            examples_per_page=10)


def build_ui(app: AppSettings = AppSettings()) -> gr.Blocks:
    """The app's page. Nothing is loaded here: the preset's models load when the app starts
    (``app.py``) or when the page opens, with a progress panel above the panes.

    Args:
        app: the app's settings (``app.py`` builds them from its flags): the preset selected at
            start (default: the one marked default) and run by ``/race`` when it names none,
            the backend every lane runs on, and how the app is served, for the privacy line
            (``launch`` does the serving). The handlers that load models get them as an input
            (a ``gr.State``); ``/race`` gets them bound (:func:`ui_race.race_api_for`).
    """
    host, share = app.host, app.share
    presets, preset_error = _presets()
    preset_name = _default_preset_name(None, app) if not preset_error else None
    names = [p.name for p in presets]
    if preset_name not in names:
        preset_name = names[0] if names else None
    start = _pairing(preset_name)

    with gr.Blocks(title="specdemo: plain vs speculative decoding", analytics_enabled=False) as demo:
        settings = gr.State(app)
        conv = gr.State(new_conversation())
        last_race = gr.State(None)
        with gr.Row(equal_height=True):
            gr.HTML(words("header_html"), elem_id="sd-title", scale=4)
            lang = gr.Radio([(name, code) for code, name in LANGUAGES], value=DEFAULT,
                            label="Language / 語言 / 语言", elem_id="lang", scale=1,
                            min_width=260)
        with gr.Tab(words("tab_race"), elem_id="race-tab"):
            startup = gr.HTML(startup_html(None, [], ready=False), elem_id="startup")
            with gr.Row(equal_height=False):
                with gr.Column(scale=3):
                    with gr.Row():
                        with gr.Column():
                            plain_chat = gr.Chatbot(label=words("pane_plain"), elem_id="plain-chat",
                                                    height=420, buttons=["copy"], latex_delimiters=[],
                                                    feedback_options=None, group_consecutive_messages=False)
                            plain_stats = gr.HTML(counters_html(None, False), elem_id="plain-stats")
                        with gr.Column():
                            spec_chat = gr.Chatbot(label=words("pane_spec"), elem_id="spec-chat", height=420,
                                                   buttons=["copy"], latex_delimiters=[],
                                                   feedback_options=None, group_consecutive_messages=False)
                            spec_stats = gr.HTML(counters_html(None, True), elem_id="spec-stats")
                    verdict = gr.HTML(verdict_html(None, 0), elem_id="race-verdict")
                    race_chart, acceptance_chart = _charts()
                    prompt = gr.Textbox(label=words("prompt"), elem_id="prompt", lines=3, max_lines=12,
                                        placeholder=words("prompt_placeholder"))
                    with gr.Row():
                        send_btn = gr.Button(words("send"), variant="primary", elem_id="send")
                        stop_btn = gr.Button(words("stop"), variant="stop", elem_id="stop")
                        replay_btn = gr.Button(words("replay"), elem_id="replay")
                        clear_btn = gr.Button(words("clear"), elem_id="clear")
                    gr.Markdown(words("history_note"), elem_id="history-note")
                    with gr.Row():
                        highlight = gr.Checkbox(True, label=words("highlight"),
                                                elem_id="highlight", scale=0, min_width=200)
                        gr.HTML(words("legend_html"))
                    _examples(prompt)
                with gr.Column(scale=1, min_width=420):  # long draft names fit their box
                    preset = gr.Dropdown(names, value=preset_name, label=words("preset"),
                                         elem_id="preset", interactive=bool(names))
                    info = gr.Markdown(f"⚠ {preset_error}" if preset_error else "", elem_id="preset-info")
                    engine_inputs = list(engines_controls())
                    with gr.Row():
                        load_btn = gr.Button(words("load_models"), size="sm", elem_id="load")
                        recheck_btn = gr.Button(words("recheck"), size="sm", elem_id="recheck")
                    status = gr.Markdown("", elem_id="model-status")
                    draft = gr.Dropdown([(d, d) for d in dict.fromkeys([*PLAIN_DRAFTS, start.draft])],
                                        value=start.draft, label=words("draft"), elem_id="draft",
                                        allow_custom_value=True, info=words("draft_info"))
                    draft_note = gr.Markdown("", elem_id="draft-note")
                    refused = gr.Markdown(words("checking_drafts"), elem_id="draft-refused")
                    draft_length = gr.Dropdown(DRAFT_LENGTHS, value=str(start.draft_length),
                                               label=words("draft_length"), elem_id="draft-length")
                    draft_tree = gr.Dropdown(["off", "default"], value="off",
                                             label=words("draft_tree"), elem_id="draft-tree",
                                             info=words("draft_tree_info"))
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label=words("temperature"),
                                            elem_id="temperature")
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label=words("top_p"),
                                      elem_id="top-p")
                    max_new = gr.Slider(1, 2048, value=128, step=1, label=words("max_new_tokens"),
                                        elem_id="max-new-tokens")
                    seed = gr.Number(-1, precision=0, label=words("seed"), elem_id="seed")
                    system = gr.Textbox(label=words("system_prompt"), lines=2, elem_id="system")
            gr.Markdown(words("race_note"), elem_id="race-note")
            privacy = gr.HTML(privacy_html(host, share))

        bench = _benchmark_builder()
        if bench is not None:
            with gr.Tab(words("tab_benchmark"), elem_id="benchmark-tab"):
                bench(lang, app.backend)

        race_outputs = [plain_chat, spec_chat, plain_stats, spec_stats, verdict, race_chart,
                        acceptance_chart]
        go = dict(fn=send, inputs=[prompt, system, preset, draft, draft_length, temperature, top_p,
                                   max_new, seed, highlight, conv] + engine_inputs
                  + [draft_tree, lang, settings],
                  outputs=race_outputs + [conv, last_race, prompt, status], concurrency_id="device",
                  concurrency_limit=1, show_progress="hidden")
        send_btn.click(**go, api_name="send", api_visibility="undocumented")
        prompt.submit(**go, api_visibility="private")
        stop_btn.click(stop, None, None, api_name="stop", concurrency_limit=None)
        replay_btn.click(replay, [last_race, conv, highlight, lang], race_outputs,
                         concurrency_limit=None, show_progress="hidden",
                         api_visibility="undocumented")
        clear_btn.click(clear, lang, race_outputs + [conv, last_race], api_visibility="undocumented")
        highlight.change(rerender, [conv, highlight, lang], [plain_chat, spec_chat],
                         api_visibility="undocumented")
        load_btn.click(load_models, [preset, draft, lang, settings], status, concurrency_id="device",
                       concurrency_limit=1, api_visibility="undocumented")
        preset.change(on_preset, [preset, lang], [draft, draft_length, info, refused, status],
                      api_visibility="undocumented").then(
            check_drafts, [preset, draft, lang], [draft, refused], concurrency_id="compat",
            show_progress="minimal", api_visibility="undocumented")
        recheck_btn.click(lambda p, d, lg: check_drafts(p, d, lg, recheck=True), [preset, draft, lang],
                          [draft, refused], concurrency_id="compat", show_progress="minimal",
                          api_visibility="undocumented")
        draft.change(on_draft, [preset, draft, lang], draft_note, concurrency_id="compat",
                     api_visibility="undocumented")
        draft.change(model_status, [preset, draft, lang], status, api_visibility="private")  # at once

        # The language: the switch starts at the browser's language (gradio's i18n translates
        # the static words); what the handlers wrote is drawn again in the switch's language.
        def relang(code, replayable, conversation, highlight_on, preset_name, draft_spec):
            return (*redraw(replayable, conversation or new_conversation(), highlight_on, code),
                    privacy_html(host, share, code), preset_info(preset_name, code),
                    model_status(preset_name, draft_spec, code), *_chart_titles(code))
        relang_outputs = race_outputs + [privacy, info, status, race_chart, acceptance_chart]
        relang_inputs = [lang, last_race, conv, highlight, preset, draft]
        lang.input(relang, relang_inputs, relang_outputs, js=SWITCH_JS, api_visibility="private",
                   show_progress="hidden")

        # Getting ready first (progress above the panes), then the draft checks: a tokenizer
        # check holds the load lock, so it waits until the models are loaded.
        opened = demo.load(None, None, lang, js=LOAD_LANG_JS, api_visibility="private")
        opened.then(relang, relang_inputs, relang_outputs, api_visibility="private",
                    show_progress="hidden")
        opened.then(follow_startup, [preset, lang, settings], startup, concurrency_id="startup",
                    concurrency_limit=None, show_progress="hidden", api_visibility="private").then(
            model_status, [preset, draft, lang], status, api_visibility="private").then(
            check_drafts, [preset, draft, lang], [draft, refused], concurrency_id="compat",
            show_progress="minimal", api_visibility="undocumented").then(
            startup_done, lang, startup, api_visibility="private")  # Ready once checks are done
        gr.api(race_api_for(app), api_name="race", concurrency_id="device", concurrency_limit=1)
    return demo


#: the per-position chart's order of positions: numeric (as text they would sort 1, 10, 11, 2)
POSITION_ORDER = [str(k) for k in range(1, 65)]


def _charts() -> tuple[gr.LinePlot, gr.BarPlot]:
    """The race as a picture, under the panes: tokens against seconds for both lanes (the gap
    between the lines is the speedup), and the speculative lane's acceptance per position
    (positions in numeric order; the counts behind each bar in its tooltip). The titles are
    set in the page's language when the page opens (:func:`_chart_titles`)."""
    with gr.Row():
        race_chart = gr.LinePlot(
            race_frame(None), x="seconds", y="tokens", color="lane",
            y_lim=[0, race_y_top(race_frame(None))],
            **_race_titles(DEFAULT), height=260, elem_id="race-chart", scale=3,
            x_axis_format=AXIS_FORMAT, y_axis_format=AXIS_FORMAT, show_label=False)
        acceptance_chart = gr.BarPlot(
            acceptance_frame(None), x="position", y="acceptance", y_lim=[0, 1],
            **_acceptance_titles(DEFAULT), sort=POSITION_ORDER, x_label_angle=0,
            tooltip=["position", "acceptance", "accepted", "rounds"], height=260,
            elem_id="acceptance-chart", scale=2, show_label=False)
    return race_chart, acceptance_chart


def _race_titles(lang: str) -> dict:
    return {"title": t("chart_race_title", lang), "x_title": t("chart_race_x", lang),
            "y_title": t("chart_race_y", lang), "label": t("chart_race_label", lang),
            "color_title": t("chart_lane", lang), "color_map": chart_colors(lang)}


def _acceptance_titles(lang: str) -> dict:
    return {"title": t("chart_acc_title", lang), "x_title": t("chart_acc_x", lang),
            "y_title": t("chart_acc_y", lang), "label": t("chart_acc_label", lang)}


def _chart_titles(lang: str) -> tuple:
    """Both charts' titles in ``lang`` (gradio's i18n does not translate axis titles)."""
    return gr.LinePlot(**_race_titles(lang)), gr.BarPlot(**_acceptance_titles(lang))


def _benchmark_builder():
    """``bench_ui.build_benchmark_tab`` when that module is installed, else None."""
    try:
        from .bench_ui import build_benchmark_tab  # lazy: an optional module (ImportError below)
    except ImportError:
        return None
    return build_benchmark_tab
