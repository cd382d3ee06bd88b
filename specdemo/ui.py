"""The side-by-side chat app: plain decoding on the left, speculative decoding on the right.

``build_ui()`` builds a gradio Blocks; nothing heavy happens at import or build time (models load
on first use, through the Load button, or from :func:`preload`). One handler drives both panes
through :class:`specdemo.race.Race`; this module only formats what the race and the engine's
stats report (it computes no metric). The race is also an API endpoint, ``/race``.
"""

from __future__ import annotations

import html
import os
import threading
from pathlib import Path
from typing import Any

import gradio as gr

from . import race as racing
from .race import (DONE, ERROR, LOADING, PLAIN, RUNNING, SKIPPED, SPECULATIVE, STOPPED, WAITING,
                   PaneView, PipelineCache, Race, RaceSnapshot)

ASSETS = Path(__file__).resolve().parent.parent / "assets"
CSS_PATH = ASSETS / "specdemo.css"
FALLBACK_TARGET = "builtin:smollm2-135m"
NON_MODEL_DRAFTS = ("ngram", "self")
DRAFT_LENGTHS = ["auto"] + [str(k) for k in range(1, 17)]
PANES = (PLAIN, SPECULATIVE)

RACE_NOTE = (
    "**How the race is run.** Plain decoding runs first, alone on the device; then speculative "
    "decoding runs alone on the same prompt and settings. Running both at once on one device "
    "would slow each down and make both numbers wrong, so each pane's counters are what that "
    "decode achieves by itself; while a decode is timed the page updates sparingly (once a second "
    "on a small CPU, which the browser shares). **Replay race** then plays both side by side, "
    "smoothly, at their measured pace, so you can see which one finishes first.")
FLOAT_REASON = (
    "floating point: speculative decoding verifies k+1 tokens in one batched forward, plain "
    "decoding computes one token per forward; the sums round differently (often in "
    "bfloat16/float16, rarely in float32), and a near-tie between two tokens can flip")

# Held by every model or tokenizer load (Load, draft checks) and by a race for its whole run:
# nothing else takes the CPU or device from a decode being timed.
LOAD_LOCK = threading.RLock()

CACHE = PipelineCache(lock=LOAD_LOCK)
_CANCELS: dict[str, set[threading.Event]] = {}  # session hash -> Stop events of its runs
_CANCELS_LOCK = threading.Lock()
_VERDICTS: dict[tuple[str, str], Any] = {}


# --- presets and drafts --------------------------------------------------------------------

def _presets() -> tuple[list, str | None]:
    """(presets, error message or None); a broken preset file must not break the page."""
    from .presets import PresetError, list_presets
    try:
        return list(list_presets()), None
    except PresetError as exc:
        return [], str(exc)


def _pairing(preset_name: str | None) -> dict:
    """target, draft, draft_length, dtype, quantization of a preset (or the built-in fallback)."""
    presets, _ = _presets()
    for p in presets:
        if p.name == preset_name:
            return {"target": p.target, "draft": p.draft, "draft_length": p.draft_length,
                    "dtype": p.dtype, "quantization": p.quantization, "preset": p}
    return {"target": FALLBACK_TARGET, "draft": "ngram", "draft_length": "auto",
            "dtype": "float32", "quantization": "none", "preset": None}


def _default_preset_name(name: str | None) -> str | None:
    from .presets import PresetError, default_preset
    if name:
        return name
    try:
        return default_preset().name
    except PresetError:
        return None


def engine_imports() -> None:
    """Import torch, transformers and the engine once, under the load lock.

    transformers resolves its names lazily and that is not thread-safe: two handlers importing
    it at once (a draft check and a race) can fail with "cannot import name 'AutoTokenizer'".
    """
    with LOAD_LOCK:
        import transformers

        from . import compat, models, pipeline  # noqa: F401
        transformers.AutoTokenizer, transformers.AutoModelForCausalLM, transformers.AutoConfig


def _verdict(target: str, draft: str):
    """compat.check_specs, remembered per pair for this process (``recheck`` forgets).

    Waits while a race is being timed (it holds LOAD_LOCK) but computes without the lock, so a
    race never waits for a check of the draft list.
    """
    from .compat import check_specs
    key = (target, draft)
    if key not in _VERDICTS:
        with LOAD_LOCK:  # not during a timed race...
            pass
        _VERDICTS[key] = check_specs(target, draft)  # ...and never in a race's way
    return _VERDICTS[key]


def draft_options(target: str, presets: list) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Compatible drafts for ``target`` as (label, spec) choices, and (spec, reason) per refused one.

    Candidates: ngram and self (always compatible), early-exit drafts of presets for this target,
    learned drafters built for it (presets' EAGLE-3 / DFlash / MTP drafts and shipped
    ``builtin:`` drafters), the model drafts of those presets and the other built-in models.
    Model drafts are checked with ``compat.check_specs`` (tokenizers only, no weights); learned
    drafters against the target's weights (``drafters.learned``).
    """
    from .drafters.learned import BUILTIN_DRAFTERS
    from .models import ModelLoadError, builtin_names
    ours = [p for p in presets if p.target == target]
    non_model = list(NON_MODEL_DRAFTS) + sorted({p.draft for p in ours
                                                 if p.draft.startswith("early-exit")})
    kinds = {f"builtin:{n}": "eagle3" for n, t in BUILTIN_DRAFTERS.items() if t == target}
    kinds.update({p.draft: p.draft_kind for p in ours if p.draft_is_learned})
    models = list(dict.fromkeys(list(kinds) + [p.draft for p in ours if p.draft_is_model]
                                + [f"builtin:{n}" for n in builtin_names()
                                   if f"builtin:{n}" != target]))
    choices = [(spec, spec) for spec in non_model]
    refused = []
    for spec in models:
        kind = f" ({KIND_LABELS[kinds[spec]]})" if spec in kinds else ""
        try:
            verdict = _verdict(target, spec)
        except (ModelLoadError, OSError, ValueError, RuntimeError) as exc:
            what = "it" if kind else "its tokenizer"
            refused.append((spec, f"cannot check {what} ({exc})"))
            continue
        if verdict.status == "incompatible":
            refused.append((spec, verdict.reasons[0]))
        elif verdict.status == "compatible":
            choices.append((spec + kind, spec))
        else:
            choices.append((f"{spec}{kind} (with warnings)", spec))
    return choices, refused


KIND_LABELS = {"eagle3": "EAGLE-3", "dflash": "DFlash", "gemma4-assistant": "Gemma 4 assistant",
               "mtp": "MTP"}


# --- formatting (numbers come from DecodeStats; nothing is computed here) -----------------

def _fmt(value, spec: str = ".2f", unit: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{unit}"


def _bytes(n: int | None) -> str:
    if n is None:
        return "–"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


STATUS_TEXT = {
    WAITING: "waiting: starts when the plain run has finished",
    LOADING: "loading the model…",
    RUNNING: "decoding…",
    SKIPPED: "not run: stopped before it started",
}


def _status_line(view: PaneView | None) -> str:
    if view is None:
        return "idle"
    if view.status == DONE:
        return f"done ({view.stats.finish_reason})" if view.stats else "done"
    if view.status == STOPPED:
        return f"stopped: kept {view.stats.new_tokens if view.stats else 0} tokens"
    if view.status == ERROR:
        return f"error: {view.error}"
    return STATUS_TEXT.get(view.status, view.status)


def counters_html(view: PaneView | None, speculative: bool) -> str:
    """The live counters under a pane (DESIGN.md metric names as labels)."""
    s = view.stats if view else None
    cells = [("new_tokens", str(s.new_tokens) if s else "–"),
             ("tokens_per_s", _fmt(s.tokens_per_s if s else None, ".1f")),
             ("ttft_s", _fmt(s.ttft_s if s else None, ".2f", " s")),
             ("elapsed_s", _fmt(s.elapsed_s if s else None, ".2f", " s"))]
    if speculative:
        cells += [("acceptance_rate", _fmt(s.acceptance_rate * 100 if s and s.acceptance_rate
                                           is not None else None, ".0f", "%")),
                  ("mean_acceptance_length", _fmt(s.mean_acceptance_length if s else None)),
                  ("drafted / accepted", f"{s.drafted} / {s.accepted}" if s else "–"),
                  ("draft_length", str(s.draft_length) if s else "–"),
                  ("extra_memory_bytes", _bytes(s.extra_memory_bytes) if s else "–")]
    grid = "".join(f'<div class="sd-cell"><span class="sd-label">{html.escape(k)}</span>'
                   f'<span class="sd-value" data-metric="{html.escape(k)}">{html.escape(v)}</span></div>'
                   for k, v in cells)
    state = view.status if view else "idle"
    return (f'<div class="sd-counters" data-status="{state}">{grid}</div>'
            f'<div class="sd-status sd-status-{state}">{html.escape(_status_line(view))}</div>')


def verdict_html(snap: RaceSnapshot | None, temperature: float) -> str:
    """Speedup between the panes and the lossless badge."""
    if snap is None:
        return '<div class="sd-verdict"><span class="sd-chip">send a prompt to start the race</span></div>'
    chips = []
    if snap.speedup is not None:
        word = "faster" if snap.speedup >= 1 else "slower"
        chips.append(f'<span class="sd-chip sd-speedup" data-speedup="{snap.speedup:.4f}">'
                     f'speedup {snap.speedup:.2f}× (speculative {word}, tokens_per_s)</span>')
    plain, spec = snap.panes.get(PLAIN), snap.panes.get(SPECULATIVE)
    if snap.done and plain and spec:
        if plain.status != DONE or spec.status != DONE:
            chips.append('<span class="sd-chip sd-na">lossless check: not compared (a run did '
                         'not finish)</span>')
        elif temperature > 0:
            chips.append('<span class="sd-chip sd-na">temperature &gt; 0: both sample from the '
                         'same distribution, so the texts differ by chance, not by error</span>')
        elif snap.identical:
            chips.append(f'<span class="sd-chip sd-lossless" data-identical="true">lossless: '
                         f'identical output ({len(plain.token_ids)} tokens)</span>')
        else:
            i = snap.first_divergence
            a = plain.tokens[i][0] if i < len(plain.tokens) else "(end)"
            b = spec.tokens[i][0] if i < len(spec.tokens) else "(end)"
            chips.append(f'<span class="sd-chip sd-diverged" data-identical="false">outputs '
                         f'differ from token {i}: plain {html.escape(repr(a))}, speculative '
                         f'{html.escape(repr(b))}. Reason: {html.escape(FLOAT_REASON)}</span>')
    elif snap.phase == "replay":
        chips.append(f'<span class="sd-chip">replay at measured pace: {snap.clock_s:.2f} s</span>')
    if not chips:
        chips.append('<span class="sd-chip">racing…</span>')
    return '<div class="sd-verdict">' + "".join(chips) + "</div>"


def tokens_html(tokens, highlight: bool) -> str:
    """Assistant text as one HTML block: accepted draft tokens and target tokens as spans.

    One ``<span>`` per token (empty pieces too), so the number of ``sd-draft`` spans equals
    the stats' ``accepted``. Newlines become ``<br>`` so markdown never re-parses the text.
    """
    if highlight:
        body = "".join(f'<span class="sd-tok {"sd-draft" if flag else "sd-target"}">'
                       f'{html.escape(piece).replace(chr(10), "<br>")}</span>'
                       for piece, flag in tokens)
    else:
        body = html.escape("".join(p for p, _ in tokens)).replace("\n", "<br>")
    return f'<div class="sd-tokens">{body}</div>'


# --- conversation state --------------------------------------------------------------------

def new_conversation() -> dict[str, list[dict]]:
    """{pane: [turn, ...]}; a turn is {user, text, tokens, status, error}."""
    return {name: [] for name in PANES}


def turn_of(prompt: str, view: PaneView) -> dict:
    return {"user": prompt, "text": view.text, "tokens": [list(t) for t in view.tokens],
            "status": view.status, "error": view.error}


def model_messages(turns: list[dict]) -> list[dict]:
    """The messages a pane's next prompt is built from: finished or stopped turns with text."""
    out = []
    for t in turns:
        if t["status"] in (DONE, STOPPED) and t["text"].strip():
            out += [{"role": "user", "content": t["user"]},
                    {"role": "assistant", "content": t["text"]}]
    return out


def chat_messages(turns: list[dict], speculative: bool, highlight: bool) -> list[dict]:
    """gr.Chatbot messages for a pane."""
    out = []
    for t in turns:
        out.append({"role": "user", "content": t["user"]})
        if t["status"] == ERROR:
            body = f'<div class="sd-error">⚠ {html.escape(t["error"] or "error")}</div>'
        elif t["status"] in (WAITING, LOADING, SKIPPED) and not t["tokens"]:
            body = f'<div class="sd-pending">{html.escape(STATUS_TEXT[t["status"]])}</div>'
        else:
            body = tokens_html(t["tokens"], highlight and speculative)
        out.append({"role": "assistant", "content": body})
    return out


def _session(request: gr.Request | None) -> str:
    return getattr(request, "session_hash", None) or "default"


def _session_cancel(request: gr.Request | None) -> threading.Event:
    """A fresh Stop event for a race or replay of this browser session (Stop sets them all)."""
    event = threading.Event()
    with _CANCELS_LOCK:
        _CANCELS.setdefault(_session(request), set()).add(event)
    return event


def _forget_cancel(request: gr.Request | None, event: threading.Event) -> None:
    with _CANCELS_LOCK:
        _CANCELS.get(_session(request), set()).discard(event)


def stop(request: gr.Request) -> None:
    """End the running race and replay of this session; what was produced is kept."""
    with _CANCELS_LOCK:
        for event in _CANCELS.pop(_session(request), set()):
            event.set()


# --- handlers ------------------------------------------------------------------------------

def _settings(temperature, top_p, max_new_tokens, seed, draft_length):
    """DecodeSettings from the controls' values (seed -1 = random, draft length "auto" or k)."""
    from .pipeline import DecodeSettings
    seed = None if seed is None or seed == "" or int(seed) < 0 else int(seed)
    k = draft_length if draft_length in ("auto", None, "") else int(draft_length)
    return DecodeSettings(max_new_tokens=int(max_new_tokens), temperature=float(temperature),
                          top_p=float(top_p), seed=seed, draft_length=k or "auto")


def _check_prompt(prompt: str | None) -> str:
    if not prompt or not prompt.strip():
        raise gr.Error("The prompt is empty: type something to send.")
    return prompt


def _new_race(prompt, system, preset_name, draft, settings, conv, request) -> Race:
    pairing = _pairing(preset_name)
    histories = {name: model_messages(conv[name]) for name in PANES}
    lanes = racing.race_lanes(CACHE, pairing["target"], draft or pairing["draft"], histories,
                              prompt, pairing["dtype"], pairing["quantization"])
    return Race(lanes, settings, system, cancel=_session_cancel(request), device_lock=LOAD_LOCK)


def _render(snap: RaceSnapshot, conv: dict, prompt: str, upto: int, highlight: bool,
            temperature: float) -> tuple:
    """Chatbots, counters and verdict for a snapshot shown after the first ``upto`` turns."""
    out = []
    for name in PANES:
        turns = conv[name][:upto] + [turn_of(prompt, snap.panes[name])]
        out.append(chat_messages(turns, name == SPECULATIVE, highlight))
    return (out[0], out[1], counters_html(snap.panes[PLAIN], False),
            counters_html(snap.panes[SPECULATIVE], True), verdict_html(snap, temperature))


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


def _only_changed(before: tuple | None, after: tuple) -> tuple:
    """``after`` with gr.skip() where nothing changed: less for the browser to redraw while a
    decode is being timed on the same machine."""
    if before is None:
        return after
    return tuple(gr.skip() if old == new else new for old, new in zip(before, after))


def send(prompt, system, preset_name, draft, draft_length, temperature, top_p, max_new_tokens,
         seed, highlight, conv, request: gr.Request):
    """Race the prompt through both panes; yields the page's outputs as the race goes."""
    _check_prompt(prompt)
    engine_imports()
    conv = conv or new_conversation()
    settings = _settings(temperature, top_p, max_new_tokens, seed, draft_length)
    race = _new_race(prompt, system, preset_name, draft, settings, conv, request)
    upto = len(conv[PLAIN])
    snap, box, shown = None, "", None  # empty the prompt box once, then leave it to the user
    try:
        for snap in race.run(min_interval_s=live_interval_s()):
            view = _render(snap, conv, prompt, upto, highlight, settings.temperature)
            yield _only_changed(shown, view) + (gr.skip(), gr.skip(), box, gr.skip())
            shown, box = view, gr.skip()
    finally:
        _forget_cancel(request, race.cancel)
    conv = {name: conv[name] + [turn_of(prompt, snap.panes[name])] for name in PANES}
    replayable = {"race": race, "prompt": prompt, "upto": upto}
    yield _render(snap, conv, prompt, upto, highlight, settings.temperature) + (
        conv, replayable, box, model_status(preset_name, draft))


def replay(replayable, conv, highlight, request: gr.Request):
    """Play the last race back, both panes side by side at their measured pace."""
    if not replayable:
        raise gr.Error("Nothing to replay yet: send a prompt first.")
    race, prompt, upto = replayable["race"], replayable["prompt"], replayable["upto"]
    cancel = _session_cancel(request)
    try:
        for snap in race.replay(cancel=cancel):
            yield _render(snap, conv, prompt, upto, highlight, race.settings.temperature)
    finally:
        _forget_cancel(request, cancel)


def rerender(conv, highlight):
    conv = conv or new_conversation()
    return tuple(chat_messages(conv[name], name == SPECULATIVE, highlight) for name in PANES)


def clear():
    return ([], [], counters_html(None, False), counters_html(None, True), verdict_html(None, 0),
            new_conversation(), None)


def model_status(preset_name: str | None, draft: str | None) -> str:
    """Which models of this pairing are loaded (never loads)."""
    p = _pairing(preset_name)
    draft = draft or p["draft"]
    pipe = CACHE.loaded(p["target"], draft, p["dtype"], p["quantization"])
    plain = pipe or CACHE.loaded(p["target"], "none", p["dtype"], p["quantization"])
    if plain is None:
        return f"Models: `{p['target']}` not loaded yet (loads on first Send or with Load)."
    t = plain.target
    line = (f"Models: `{t.spec}` loaded ({str(t.dtype).replace('torch.', '')} on {t.device}, "
            f"{t.load_s:.1f} s)")
    if pipe is None:
        return line + f"; draft `{draft}` not loaded yet."
    if pipe.draft is not None:
        line += f"; draft `{pipe.draft.spec}` loaded ({pipe.draft.load_s:.1f} s)"
    else:
        line += f"; draft `{draft}` ready"
    return line + "."


def load_models(preset_name, draft):
    """The explicit Load path: load target and draft, reporting progress."""
    engine_imports()
    p = _pairing(preset_name)
    draft = draft or p["draft"]
    yield f"Loading `{p['target']}`…"
    try:
        CACHE.get(p["target"], "none", p["dtype"], p["quantization"])
        yield f"Loaded `{p['target']}`; preparing draft `{draft}`…"
        CACHE.get(p["target"], draft, p["dtype"], p["quantization"])
    except Exception as exc:  # ModelLoadError, incompatible draft, out of memory
        yield f"⚠ {racing.describe_error(exc)}"
        return
    yield model_status(preset_name, draft)


def preset_info(preset_name: str | None) -> str:
    """The preset's note and whether it fits this machine."""
    engine_imports()
    presets, error = _presets()
    if error:
        return f"⚠ presets could not be read: {error}. Using `{FALLBACK_TARGET}`."
    p = _pairing(preset_name)["preset"]
    if p is None:
        return f"Target `{FALLBACK_TARGET}`."
    from . import hardware
    try:
        ok, reason = hardware.fits(p, hardware.detect(), alternatives=presets)
    except Exception as exc:  # hardware probing must not break the page
        ok, reason = True, f"(could not check this machine: {exc})"
    mark = "fits this machine" if ok else "⚠ does not fit this machine"
    return (f"Target `{p.target}` · draft `{p.draft}` · {p.dtype}. {p.note}  \n"
            f"{mark}: {reason}")


def on_preset(preset_name):
    """Preset changed: draft, draft length and the notes follow (the draft check comes next)."""
    p = _pairing(preset_name)
    choices = [(d, d) for d in NON_MODEL_DRAFTS]
    if p["draft"] not in NON_MODEL_DRAFTS:
        choices.append((p["draft"], p["draft"]))
    return (gr.update(choices=choices, value=p["draft"]), str(p["draft_length"]),
            preset_info(preset_name), "Checking which drafts fit this target…",
            model_status(preset_name, p["draft"]))


def check_drafts(preset_name, draft, recheck: bool = False):
    """Offer only compatible drafts for the preset's target; list refused ones with reasons."""
    engine_imports()
    if recheck:
        _VERDICTS.clear()
    presets, _ = _presets()
    p = _pairing(preset_name)
    choices, refused = draft_options(p["target"], presets)
    values = [v for _, v in choices]
    if p["draft"] not in values and p["draft"] not in [spec for spec, _ in refused]:
        choices.append((p["draft"], p["draft"]))
        values.append(p["draft"])
    note = (f"Drafts offered for `{p['target']}`: {len(choices)}. "
            + ("Refused:  \n" + "  \n".join(f"✗ `{spec}`: {why}" for spec, why in refused) if refused
               else "None refused."))
    if draft in values:  # keep what the user may have picked while the check ran
        return gr.update(choices=choices), note
    return gr.update(choices=choices, value=p["draft"]), note


def on_draft(preset_name, draft):
    """A draft typed or picked: say whether it can serve the target (a model is checked)."""
    engine_imports()
    p = _pairing(preset_name)
    if not draft:
        return ""
    from .compat import non_model_verdict
    verdict = non_model_verdict(draft)
    if verdict is None:
        try:
            verdict = _verdict(p["target"], draft)
        except Exception as exc:
            return f"⚠ `{draft}`: cannot check its tokenizer ({exc})"
    mark = {"compatible": "✓", "compatible with warnings": "⚠", "incompatible": "✗"}[verdict.status]
    return f"{mark} `{draft}`: {verdict.status}. " + " ".join(verdict.reasons[:2])


# --- the /race API -------------------------------------------------------------------------

def _pane_dict(view: PaneView) -> dict:
    """DESIGN.md metric names plus text, token_ids, from_draft, status and error."""
    from .engine import DecodeResult
    from .pipeline import result_dict
    out: dict = {"status": view.status, "error": view.error}
    if view.stats is not None:
        result = DecodeResult(view.text, list(view.token_ids), [f for _, f in view.tokens],
                              view.stats)
        out.update(result_dict(result))
    return out


def race_api(prompt: str, preset: str | None = None, draft: str | None = None,
             max_new_tokens: int = 128, temperature: float = 0.0,
             draft_length: str | int | None = None, request: gr.Request = None) -> dict:
    """Race one prompt: plain, then speculative, each alone; returns both results.

    Args:
        prompt: the user message (chat template applied).
        preset: a preset name (default: the default preset).
        draft: none, ngram, self, early-exit:N or a model (default: the preset's draft).
        max_new_tokens: tokens to generate at most.
        temperature: 0 for greedy.
        draft_length: 1..16 or "auto" (default: the preset's).
    Returns:
        {"plain": {...}, "speculative": {...}, "speedup": x, "identical": bool,
        "first_divergence": i} with DESIGN.md metric names; a pane that failed has "error".
    """
    _check_prompt(prompt)
    engine_imports()
    preset = _default_preset_name(preset)
    pairing = _pairing(preset)
    k = draft_length if draft_length not in (None, "") else pairing["draft_length"]
    settings = _settings(temperature, 1.0, max_new_tokens, -1, k)
    race = _new_race(prompt, None, preset, draft, settings, new_conversation(), request)
    try:
        snap = list(race.run(min_interval_s=1.0))[-1]
    finally:
        _forget_cancel(request, race.cancel)
    return {PLAIN: _pane_dict(snap.panes[PLAIN]), SPECULATIVE: _pane_dict(snap.panes[SPECULATIVE]),
            "speedup": snap.speedup, "identical": snap.identical,
            "first_divergence": snap.first_divergence, "preset": preset,
            "draft": draft or pairing["draft"]}


# --- the page ------------------------------------------------------------------------------

def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def privacy_html(host: str, share: bool) -> str:
    """What this process does and does not talk to (each fact read from the live setting)."""
    local = host in ("127.0.0.1", "localhost", "::1")
    analytics_off = os.environ.get("GRADIO_ANALYTICS_ENABLED", "").strip().lower() in (
        "false", "0", "no", "off")
    facts = [
        (local, f"listening on {host}" + ("" if local else " (reachable from your network)")),
        (analytics_off, "gradio usage analytics " + ("off" if analytics_off else "ON")),
        (not share, "no share link" if not share else "public share link ON (--share)"),
        (True, "HF_HUB_OFFLINE=1: the model hub is never contacted" if _env_true("HF_HUB_OFFLINE")
         else "HF_HUB_OFFLINE unset: the hub is contacted only for a hub model not cached yet"),
        (True, "remote code from model repositories: off"),
    ]
    items = "".join(f'<span class="sd-fact {"sd-ok" if ok else "sd-warn"}">{html.escape(text)}</span>'
                    for ok, text in facts)
    return f'<div class="sd-privacy" id="sd-privacy">Privacy: {items}</div>'


LEGEND = ('<div class="sd-legend" id="sd-legend">'
          '<span class="sd-tok sd-draft">accepted draft token</span>'
          '<span class="sd-tok sd-target">token from the target</span>'
          '<span class="sd-legend-note">(the target makes one token per forward: the first, '
          'each correction and each bonus token)</span></div>')


def _theme():
    """Default theme with system fonts: the page loads nothing from the internet."""
    system = ["ui-sans-serif", "system-ui", "-apple-system", "Segoe UI", "sans-serif"]
    mono = ["ui-monospace", "SFMono-Regular", "Menlo", "Consolas", "monospace"]
    return gr.themes.Default(font=system, font_mono=mono)


def launch_options() -> dict:
    """Keyword arguments for ``Blocks.launch`` (gradio 6 takes css and theme there)."""
    return {"css_paths": [CSS_PATH], "theme": _theme()}


def launch(demo: gr.Blocks, host: str = "127.0.0.1", port: int | None = None,
           inbrowser: bool = False, share: bool = False, prevent_thread_lock: bool = False):
    """Queue (one race at a time; other tabs wait their turn) and launch the page."""
    demo.queue(default_concurrency_limit=1)
    return demo.launch(server_name=host, server_port=port, inbrowser=inbrowser, share=share,
                       prevent_thread_lock=prevent_thread_lock, show_error=True,
                       **launch_options())


def preload(preset_name: str | None = None) -> str:
    """Load the preset's target and draft now (``python app.py`` does it in the background)."""
    preset_name = _default_preset_name(preset_name)
    status = ""
    for status in load_models(preset_name, None):
        pass
    return status


def _examples(prompt: gr.Textbox) -> None:
    from .prompts import TASKS, load_prompts
    try:
        prompts = load_prompts()
    except (OSError, ValueError) as exc:
        gr.Markdown(f"⚠ example prompts could not be read: {exc}")
        return
    labels = {"code": "Code", "maths": "Maths", "grounded": "Grounded / copying", "chat": "Chat",
              "creative": "Creative"}
    with gr.Accordion("Example prompts by task (acceptance changes with the kind of text)",
                      open=False, elem_id="examples"):
        for task in TASKS:
            with gr.Tab(labels.get(task, task)):
                gr.Examples([[p] for p in prompts[task]], inputs=[prompt], label=None,
                            examples_per_page=10)


def build_ui(default_preset: str | None = None, *, host: str = "127.0.0.1",
             share: bool = False) -> gr.Blocks:
    """The app's page. Nothing is loaded here; models load on first use.

    Args:
        default_preset: preset selected at start (default: the one marked default).
        host, share: how the app is served, for the privacy line (``launch`` does the serving).
    """
    presets, preset_error = _presets()
    preset_name = _default_preset_name(default_preset) if not preset_error else None
    names = [p.name for p in presets]
    if preset_name not in names:
        preset_name = names[0] if names else None
    start = _pairing(preset_name)

    with gr.Blocks(title="specdemo: plain vs speculative decoding", analytics_enabled=False) as demo:
        conv = gr.State(new_conversation())
        last_race = gr.State(None)
        gr.HTML('<div class="sd-header"><h1>Plain vs speculative decoding</h1>'
                '<p>One prompt, two panes: the same model decodes it plainly (left) and '
                'speculatively (right).</p></div>')
        with gr.Tab("Race", elem_id="race-tab"):
            with gr.Row(equal_height=False):
                with gr.Column(scale=3):
                    with gr.Row():
                        with gr.Column():
                            plain_chat = gr.Chatbot(label="Plain (autoregressive)", elem_id="plain-chat",
                                                    height=420, buttons=["copy"], latex_delimiters=[],
                                                    feedback_options=None, group_consecutive_messages=False)
                            plain_stats = gr.HTML(counters_html(None, False), elem_id="plain-stats")
                        with gr.Column():
                            spec_chat = gr.Chatbot(label="Speculative", elem_id="spec-chat", height=420,
                                                   buttons=["copy"], latex_delimiters=[],
                                                   feedback_options=None, group_consecutive_messages=False)
                            spec_stats = gr.HTML(counters_html(None, True), elem_id="spec-stats")
                    verdict = gr.HTML(verdict_html(None, 0), elem_id="race-verdict")
                    prompt = gr.Textbox(label="Prompt", elem_id="prompt", lines=3, max_lines=12,
                                        placeholder="Ask something; both panes answer it.")
                    with gr.Row():
                        send_btn = gr.Button("Send", variant="primary", elem_id="send")
                        stop_btn = gr.Button("Stop", variant="stop", elem_id="stop")
                        replay_btn = gr.Button("Replay race", elem_id="replay")
                        clear_btn = gr.Button("Clear", elem_id="clear")
                    with gr.Row():
                        highlight = gr.Checkbox(True, label="Highlight draft tokens",
                                                elem_id="highlight", scale=0, min_width=200)
                        gr.HTML(LEGEND)
                    _examples(prompt)
                with gr.Column(scale=1, min_width=300):
                    preset = gr.Dropdown(names, value=preset_name, label="Preset", elem_id="preset",
                                         interactive=bool(names))
                    info = gr.Markdown(f"⚠ {preset_error}" if preset_error else "", elem_id="preset-info")
                    with gr.Row():
                        load_btn = gr.Button("Load models", size="sm", elem_id="load")
                        recheck_btn = gr.Button("Re-check drafts", size="sm", elem_id="recheck")
                    status = gr.Markdown("", elem_id="model-status")
                    draft = gr.Dropdown([(d, d) for d in dict.fromkeys([*NON_MODEL_DRAFTS, start["draft"]])],
                                        value=start["draft"], label="Draft", elem_id="draft",
                                        allow_custom_value=True,
                                        info="compatible drafts only; type a model id or path to check one")
                    draft_note = gr.Markdown("", elem_id="draft-note")
                    refused = gr.Markdown("Checking which model drafts fit this target…",
                                          elem_id="draft-refused")
                    draft_length = gr.Dropdown(DRAFT_LENGTHS, value=str(start["draft_length"]),
                                               label="Draft length (k)", elem_id="draft-length")
                    temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label="Temperature (0 = greedy)",
                                            elem_id="temperature")
                    top_p = gr.Slider(0.05, 1.0, value=1.0, step=0.05, label="Top-p", elem_id="top-p")
                    max_new = gr.Slider(1, 2048, value=128, step=1, label="Max new tokens",
                                        elem_id="max-new-tokens")
                    seed = gr.Number(-1, precision=0, label="Seed (-1 = random)", elem_id="seed")
                    system = gr.Textbox(label="System prompt (optional)", lines=2, elem_id="system")
            gr.Markdown(RACE_NOTE, elem_id="race-note")
            gr.HTML(privacy_html(host, share))

        bench = _benchmark_builder()
        if bench is not None:
            with gr.Tab("Benchmark", elem_id="benchmark-tab"):
                bench()

        race_outputs = [plain_chat, spec_chat, plain_stats, spec_stats, verdict]
        go = dict(fn=send, inputs=[prompt, system, preset, draft, draft_length, temperature, top_p,
                                   max_new, seed, highlight, conv],
                  outputs=race_outputs + [conv, last_race, prompt, status], concurrency_id="device",
                  concurrency_limit=1, show_progress="hidden")
        send_btn.click(**go, api_name="send", api_visibility="undocumented")
        prompt.submit(**go, api_visibility="private")
        stop_btn.click(stop, None, None, api_name="stop", concurrency_limit=None)
        replay_btn.click(replay, [last_race, conv, highlight], race_outputs, concurrency_limit=None,
                         show_progress="hidden", api_visibility="undocumented")
        clear_btn.click(clear, None, race_outputs + [conv, last_race], api_visibility="undocumented")
        highlight.change(rerender, [conv, highlight], [plain_chat, spec_chat],
                         api_visibility="undocumented")
        load_btn.click(load_models, [preset, draft], status, concurrency_id="device",
                       concurrency_limit=1, api_visibility="undocumented")
        preset.change(on_preset, preset, [draft, draft_length, info, refused, status],
                      api_visibility="undocumented").then(
            check_drafts, [preset, draft], [draft, refused], concurrency_id="compat",
            show_progress="minimal", api_visibility="undocumented")
        recheck_btn.click(lambda p, d: check_drafts(p, d, recheck=True), [preset, draft],
                          [draft, refused], concurrency_id="compat", show_progress="minimal",
                          api_visibility="undocumented")
        draft.change(on_draft, [preset, draft], draft_note, concurrency_id="compat",
                     api_visibility="undocumented")
        demo.load(lambda p, d: (preset_info(p), model_status(p, d)), [preset, draft], [info, status],
                  api_visibility="undocumented").then(
            check_drafts, [preset, draft], [draft, refused], concurrency_id="compat",
            show_progress="minimal", api_visibility="undocumented")
        gr.api(race_api, api_name="race", concurrency_id="device", concurrency_limit=1)
    return demo


def _benchmark_builder():
    """``bench_ui.build_benchmark_tab`` when that module is installed, else None."""
    try:
        from .bench_ui import build_benchmark_tab
    except ImportError:
        return None
    return build_benchmark_tab
