"""State the page's handlers share: the app's settings (:class:`AppSettings`, built once by
``app.py`` and passed down), the load lock, the pipeline cache, presets, and getting the preset's
models ready before the first Send (with the steps shown as progress).

Nothing is loaded at import. :func:`start_preload` loads the preset's models in the background
(``python app.py`` calls it at start, an opening page calls it too); :func:`follow_startup` is the
page's progress panel while that runs.
"""

from __future__ import annotations

import contextlib
import sys
import threading
from dataclasses import dataclass
from typing import Any

from ..core import TARGET_BACKENDS
from ..services import race as racing
from ..services.race import PipelineCache
from ..services.startup import STEPS, prepare_timed
from .ui_format import startup_html
from .ui_i18n import DEFAULT, sentence, t
from ..services.presets import PresetError, default_preset, list_presets
from ..services import startup
from ..core.model_spec import builtin_spec
from ..models.builtin import FALLBACK_BUILTIN

FALLBACK_TARGET = builtin_spec(FALLBACK_BUILTIN)  # when no preset can be read

# Held by every model or tokenizer load (Load, draft checks) and by a race for its whole run:
# nothing else takes the CPU or device from a decode being timed.
LOAD_LOCK = threading.RLock()
CACHE = PipelineCache(lock=LOAD_LOCK)
_READY = threading.Event()  # set when the preload has finished (or failed)
_PRELOAD: dict[str, Any] = {"started": False, "error": None, "steps": []}
_PRELOAD_LOCK = threading.Lock()
_IMPORTED = threading.Event()


def _presets() -> tuple[list, str | None]:
    """(presets, error message or None); a broken preset file must not break the page."""
    try:
        return list(list_presets()), None
    except PresetError as exc:
        return [], str(exc)


@dataclass(frozen=True)
class AppSettings:
    """How the app was started (``app.py``'s flags), built once and passed down to the page.

    Attributes:
        preset: the preset to start with, also what ``/race`` runs when it names none (None:
            the default preset).
        backend: the targets' forward backend for every lane (``--backend``; ``auto`` weighs
            them on this machine).
        host, port, share, open_browser: how the page is served (``port`` None: gradio's).
    """

    preset: str | None = None
    backend: str = "transformers"
    host: str = "127.0.0.1"
    port: int | None = None
    share: bool = False
    open_browser: bool = False


@dataclass(frozen=True)
class Pairing:
    """What a race over a preset needs: target, draft, draft length, dtype, quantization, the
    preset's server lanes, and the preset itself (None: the built-in fallback, no preset)."""

    target: str
    draft: str = "ngram"
    draft_length: int | str = "auto"
    dtype: str = "float32"
    quantization: str | None = "none"
    plain_endpoint: str = ""
    spec_endpoint: str = ""
    preset: Any = None  # a services.presets.Preset


def _pairing(preset_name: str | None) -> Pairing:
    """The pairing of a preset (or the built-in fallback)."""
    presets, _ = _presets()
    for p in presets:
        if p.name == preset_name:
            return Pairing(p.target, p.draft, p.draft_length, p.dtype, p.quantization,
                           p.plain_endpoint, p.spec_endpoint, p)
    return Pairing(FALLBACK_TARGET)


def _default_preset_name(name: str | None, app: AppSettings = AppSettings()) -> str | None:
    """``name``, else the preset the app was started with, else the default preset."""
    if name:
        return name
    if app.preset:
        return app.preset
    try:
        return default_preset().name
    except PresetError:
        return None


def engine_imports() -> None:
    """Import torch, transformers and the engine once, under the load lock.

    transformers resolves its names lazily and that is not thread-safe: two handlers importing
    it at once (a draft check and a race) can fail with "cannot import name 'AutoTokenizer'".
    Once done it returns at once, without waiting for a model load that holds the lock.
    """
    if _IMPORTED.is_set():
        return
    with LOAD_LOCK:
        if _IMPORTED.is_set():
            return
        # already imported (a preload, a caller): no step, whose estimate would say "about 5 s"
        # for what then takes no time
        done = "torch" in sys.modules and "transformers" in sys.modules
        with (contextlib.nullcontext() if done else
              startup.STEPS.step("imports", "importing torch and transformers (once per start)",
                                 startup.GUESS_S["imports"])):
            import transformers

            # lazy: imported inside the timed "imports" step, under the load lock
            from ..checks import compat  # noqa: F401
            from ..models import loading as models  # noqa: F401  (lazy: timed step, above)
            from ..services import pipeline  # noqa: F401  (lazy: imports torch)
            transformers.AutoTokenizer, transformers.AutoModelForCausalLM, transformers.AutoConfig
        _IMPORTED.set()


#: backend name -> what its forward computes in, for the page (``core.TARGET_BACKENDS``'
#: ``page_words``; transformers is described by its dtype instead)
BACKEND_WORDS = {name: facts.page_words for name, facts in TARGET_BACKENDS.items()
                 if facts.page_words}


def runs_on(target) -> str:
    """What a loaded target's forward really computes in, for the page: ``"float32"`` on the
    transformers backend (its dtype, with quantised weights named), else the backend's name
    and words (``"native-w8a8: int8 weights and int8 activations in our C forward"``): a
    target loaded in float32 and raced on native-w8a8 is not a float32 race."""
    dtype = str(target.dtype).replace("torch.", "")
    backend = getattr(target, "backend", "transformers") or "transformers"
    if backend == "transformers":
        library = "torchao" if target.quantization in ("int4", "int8") else "bitsandbytes"
        return (f"{target.quantization} {library} weights, rest {dtype}," if target.quantization
                else dtype)
    return f"{backend}: {BACKEND_WORDS.get(backend, 'its own forward')}, loaded from {dtype}"


def loaded_backend(preset_name: str | None) -> str | None:
    """``runs_on`` of the preset's target when it is loaded (never loads), else None."""
    p = _pairing(preset_name)
    plain = CACHE.loaded(p.target, "none", p.dtype, p.quantization)
    return runs_on(plain.target) if plain is not None else None


def model_status(preset_name: str | None, draft: str | None, lang: str | None = DEFAULT) -> str:
    """Which models of this pairing are loaded (never loads), in ``lang``."""
    p = _pairing(preset_name)
    draft = draft or p.draft
    pipe = CACHE.loaded(p.target, draft, p.dtype, p.quantization)
    plain = pipe or CACHE.loaded(p.target, "none", p.dtype, p.quantization)
    if plain is None:
        when = t("models_loading_now" if _PRELOAD["started"] and not _READY.is_set()
                 else "models_on_send", lang)
        return t("models_not_loaded", lang, target=p.target, when=when)
    target = plain.target
    line = t("models_loaded", lang, spec=target.spec, runs=sentence(runs_on(target), lang), device=target.device,
             seconds=f"{target.load_s:.1f}")
    offloaded = getattr(target, "offloaded_layers", {})
    if offloaded:
        line += t("models_offloaded", lang, n=len(offloaded), device=target.device,
                  where="/".join(sorted(set(offloaded.values()))))
    if pipe is None:
        return line + t("draft_not_loaded", lang, draft=draft)
    if pipe.draft is not None:
        line += t("draft_loaded", lang, draft=pipe.draft.spec, seconds=f"{pipe.draft.load_s:.1f}")
    else:
        line += t("draft_ready", lang, draft=draft)
    return line + ("" if line.endswith("。") or lang not in (None, DEFAULT) else ".")


def preload(preset_name: str | None = None, app: AppSettings = AppSettings()) -> str:
    """Load the preset's target and draft on the app's backend and warm them up, each a named
    step (:data:`specdemo.services.startup.STEPS`) that the page and the command line show. Sets
    the ready event (also on failure, keeping the error).

    Args:
        preset_name: the preset (default: the app's, else the default preset).
        app: the app's settings (its preset and backend).
    Returns:
        The model status line.
    """
    preset_name = _default_preset_name(preset_name, app)
    p = _pairing(preset_name)
    try:
        engine_imports()
        # One device job per step. Everything a first race would otherwise do before or
        # between its lanes is done here, before Ready: the warm-up of every forward width the
        # preset's draft length uses, the drafter's, and auto's forward-cost table (a race still
        # prepares what a changed draft or draft length needs, before its first lane's clock).
        # The speculative pipeline first: the target's backend is chosen for its drafter (a
        # draft that cannot serve leaves the plain lane ready all the same, then says why).
        try:
            pipe = CACHE.get(p.target, p.draft, p.dtype, p.quantization, backend=app.backend)
            refused = None
        except Exception as exc:  # noqa: BLE001 - raised again below, after the plain lane
            pipe, refused = None, exc
        plain = CACHE.get(p.target, "none", p.dtype, p.quantization, backend=app.backend)
        racing.DEVICE.call(lambda: prepare_timed(plain, False, p.draft_length))
        if refused is not None:
            raise refused
        racing.DEVICE.call(lambda: prepare_timed(pipe, True, p.draft_length))
    except Exception as exc:  # ModelLoadError, incompatible draft, out of memory: shown, kept
        _PRELOAD["error"] = racing.describe_error(exc)
    finally:
        _READY.set()
    return model_status(preset_name, p.draft)


def start_preload(preset_name: str | None = None,
                  app: AppSettings = AppSettings()) -> threading.Event:
    """Start :func:`preload` in a background thread, once per process; returns the ready event.
    ``python app.py`` calls it at start, and an opening page calls it too (for other launchers)."""
    with _PRELOAD_LOCK:
        if not _PRELOAD["started"]:
            _PRELOAD["started"] = True
            threading.Thread(target=_recorded_preload, args=(preset_name, app), name="preload",
                             daemon=True).start()
    return _READY


def _recorded_preload(preset_name: str | None, app: AppSettings) -> None:
    """:func:`preload`, keeping the steps that end meanwhile for the banner (:func:`startup_steps`),
    so that later steps (a draft switch's check or load) do not grow it."""
    steps = _PRELOAD.setdefault("steps", [])

    def keep(event: str, what) -> None:
        if event == "end" and not _READY.is_set():
            steps.append(what)
    with STEPS.listening(keep):
        preload(preset_name, app)


def wait_until_ready() -> None:
    """Block until the preload has finished, when one was started (else return at once)."""
    if _PRELOAD["started"]:
        _READY.wait()


def startup_steps(n: int = 6) -> list:
    """The last ``n`` finished steps of the start-up (the preload), oldest first: the banner's
    list, which later steps (a draft switch's load or check) do not grow."""
    return list(_PRELOAD.get("steps", []))[-n:]


def follow_startup(preset_name: str | None, lang: str | None = DEFAULT,
                   app: AppSettings = AppSettings()):
    """The page's progress panel while the models get ready: the step in progress with its
    estimate, every half second, until the models are ready (then one last update: Ready, with
    the page's draft checks running in the background, and the handler ends, so an idle page
    costs nothing; :func:`startup_done` drops the checks' note once they are done)."""
    ready = start_preload(preset_name, app)
    while not ready.wait(0.5):
        yield startup_html(STEPS.current(), startup_steps(), ready=False, lang=lang)
    yield startup_html(STEPS.current(), startup_steps(), ready=True, error=_PRELOAD["error"],
                       checking=True, lang=lang, note=threads_note(lang))


def startup_done(lang: str | None = DEFAULT) -> str:
    """The panel once the models are ready and the page's draft checks have run: Ready (or the
    start-up's error), with how the threads wait."""
    return startup_html(None, startup_steps(), ready=True, error=_PRELOAD["error"], lang=lang,
                        note=threads_note(lang))


def threads_note(lang: str | None = DEFAULT) -> str | None:
    """How this process's OpenMP threads wait and why (``specdemo.OMP_WAIT``, decided once when
    the process started: OpenMP reads it once), for the page; passive waiting says what it costs
    and what to do."""
    from .. import OMP_WAIT, _omp
    if not OMP_WAIT:
        return None
    how = sentence(_omp.describe(OMP_WAIT), lang)
    return t("threads_passive" if OMP_WAIT.get("policy") == "passive" else "threads_spin", lang,
             how=how)
