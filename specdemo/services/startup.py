"""The slow steps before a first token, named and estimated, for the page and the command line.

A step is one slow thing: converting a built-in model's GGUF weights (once per machine), loading
a model, warming it up, measuring its forward costs (for draft length ``auto``), reading a draft's
tokenizer to check it. Code that does one wraps it in ``STEPS.step(key, name, estimate_s)``; the
page draws ``STEPS.current()`` as a progress bar with the step's name and estimate, and the
command line prints each step as it starts and ends (:func:`printed`).

Estimates: the duration this machine took last time (remembered in
``cache_dir()/step-times.json``), else the caller's guess. A conversion is guessed from the GGUF
size: SmolLM2-135M (98 MB Q4_1) converted in 10.6-13.7 s in three cold starts on a busy 2-core
AMD EPYC (~25 s in an earlier measurement), so 7 MB/s: within 2x of both.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, TextIO

from ..core import machine
from ..core.draft_spec import DraftSpec, as_draft_spec
from ..models import loading as models
from . import backend_store

if TYPE_CHECKING:
    from .pipeline import Pipeline

CONVERT_BYTES_PER_S = 7e6  # GGUF bytes converted per second on a 2-core CPU (see module doc)
TIMES_FILE = "step-times.json"
# guesses for a machine that ran none of these steps yet ("backend": the probe-then-time choice
# took 3.9 s on a busy 2-core AMD EPYC, 5.0-5.5 s on a quiet AVX-512 one; "native compile"
# 1.4-1.5 s there; the warm-up and forward-cost steps are scaled from the widths that choice
# timed when it ran: forward_estimate_s)
GUESS_S = {"imports": 5.0, "load": 3.0, "warm-up": 3.0, "forward costs": 8.0, "tokenizer": 10.0,
           "native compile": 2.0, "backend": 5.0, "background": 1.0}
MIN_REMEMBER_S = 0.05  # faster than this was a cache hit (a model already in memory): no lesson


@dataclass(frozen=True)
class StepView:
    """A step in progress.

    Attributes:
        name: what is happening, for people ("converting builtin:smollm2-135m ...").
        elapsed_s: seconds since it started.
        estimate_s: expected seconds in all (None when unknown).
    """

    name: str
    elapsed_s: float
    estimate_s: float | None

    @property
    def fraction(self) -> float | None:
        """elapsed / estimate, kept below 1 while the step runs (None without an estimate)."""
        if not self.estimate_s:
            return None
        return min(self.elapsed_s / self.estimate_s, 0.95)


@dataclass(frozen=True)
class DoneStep:
    """A finished step: its name, how long it took (seconds) and whether it failed."""

    name: str
    seconds: float
    failed: bool = False
    note: bool = False  # an outcome said in the list (Steps.note), not work that took time


def _times_path() -> Path:
    return models.cache_dir() / TIMES_FILE


def remembered_s(key: str) -> float | None:
    """Seconds the step ``key`` took last time on this machine, or None."""
    try:
        value = json.loads(_times_path().read_text()).get(key)
    except (OSError, ValueError, AttributeError):
        return None
    return float(value) if isinstance(value, (int, float)) else None


def remember_s(key: str, seconds: float) -> None:
    """Store a step's duration for the next estimate (best effort: a read-only cache is fine)."""
    path = _times_path()
    try:
        data = json.loads(path.read_text()) if path.is_file() else {}
        data = data if isinstance(data, dict) else {}
        data[key] = round(seconds, 2)
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=path.parent, delete=False, suffix=".tmp") as f:
            json.dump(data, f, indent=1, sort_keys=True)
        os.replace(f.name, path)
    except (OSError, ValueError):
        pass


Listener = Callable[[str, "StepView | DoneStep"], None]


@dataclass
class StepRecord:
    """What a running step's block can tell :meth:`Steps.step`.

    Attributes:
        remember: store this run's duration as the next estimate (default True).
    """

    remember: bool = True


class Steps:
    """Steps in progress (thread-safe); nested steps show the innermost one."""

    def __init__(self, keep: int = 12) -> None:
        self._lock = threading.Lock()
        self._active: list[tuple[str, float, float | None]] = []  # (name, start, estimate_s)
        self._done: list[DoneStep] = []
        self._keep = keep
        self._listeners: list[Listener] = []

    @contextlib.contextmanager
    def step(self, key: str, name: str, estimate_s: float | None = None) -> Iterator[StepRecord]:
        """Run the block as a named step.

        Args:
            key: identifies the step across runs (for the remembered duration), e.g.
                ``"convert builtin:smollm2-135m"``.
            name: what the page and the command line say.
            estimate_s: a guess used when this machine has no remembered duration.
        Yields:
            a :class:`StepRecord`; the block sets its ``remember`` to False when this run took
            a shortcut (a stored result) whose duration would mislead the next estimate.
        """
        record = StepRecord()
        estimate = remembered_s(key) or estimate_s
        entry = (name, time.monotonic(), estimate)
        with self._lock:
            self._active.append(entry)
        self._tell("start", StepView(name, 0.0, estimate))
        failed = True
        try:
            yield record
            failed = False
        finally:
            seconds = time.monotonic() - entry[1]
            with self._lock:
                self._active.remove(entry)
                self._done = (self._done + [DoneStep(name, seconds, failed)])[-self._keep:]
            if not failed and record.remember and seconds >= MIN_REMEMBER_S:
                remember_s(key, seconds)
            self._tell("end", DoneStep(name, seconds, failed))

    def note(self, name: str) -> None:
        """Say ``name`` in the step list as a finished step of no duration (an outcome, such as
        the backend chosen, rather than work)."""
        done = DoneStep(name, 0.0, note=True)
        with self._lock:
            self._done = (self._done + [done])[-self._keep:]
        self._tell("end", done)  # no "start": nothing ran

    def current(self) -> StepView | None:
        """The innermost step running now, or None."""
        with self._lock:
            if not self._active:
                return None
            name, start, estimate = self._active[-1]
        return StepView(name, time.monotonic() - start, estimate)

    def recent(self, n: int = 6) -> list[DoneStep]:
        """The last ``n`` finished steps, oldest first."""
        with self._lock:
            return list(self._done[-n:])

    @contextlib.contextmanager
    def listening(self, listener: Listener) -> Iterator[None]:
        """Call ``listener("start", StepView)`` / ``listener("end", DoneStep)`` within the block."""
        with self._lock:
            self._listeners.append(listener)
        try:
            yield
        finally:
            with self._lock:
                self._listeners.remove(listener)

    def _tell(self, event: str, what) -> None:
        with self._lock:
            listeners = list(self._listeners)
        for listener in listeners:
            listener(event, what)


STEPS = Steps()


def about(seconds: float | None) -> str:
    """``"about 25 s"``, ``"about 2 min"``, ``"under a second"``; empty when unknown."""
    if seconds is None:
        return ""
    if seconds < 1:
        return "under a second"
    return f"about {seconds:.0f} s" if seconds < 90 else f"about {seconds / 60:.0f} min"


@contextlib.contextmanager
def printed(stream: TextIO | None = None) -> Iterator[None]:
    """Print each step to ``stream`` (default stderr) as it starts and ends."""
    out = stream or sys.stderr

    def show(event: str, what) -> None:
        if event == "start":
            estimate = about(what.estimate_s)
            print(f"… {what.name}" + (f" ({estimate})" if estimate else ""), file=out, flush=True)
        elif getattr(what, "note", False):
            print(f"· {what.name}", file=out, flush=True)
        else:
            print(f"{'✗' if what.failed else '✓'} {what.name}: {what.seconds:.1f} s", file=out,
                  flush=True)
    with STEPS.listening(show):
        yield


#: a first check of a built-in draft whose tokenizer is converted from its GGUF (the Gemma 3
#: tokenizer, 262k tokens: 86 s on a busy 2-core AMD EPYC, 31 s on a less busy one)
TOKENIZER_CONVERT_GUESS_S = 60.0


def _converts_tokenizer(draft: str) -> bool:
    """Whether checking ``draft`` converts its tokenizer from a built-in's GGUF first."""
    try:
        return models.builtin_tokenizer_conversion_needed(draft)
    except models.ModelLoadError:
        return False  # the check says why


def tokenizer_step(target: str, draft: str) -> tuple[str, str, float]:
    """(key, name, guess in seconds) of the step that checks ``draft``'s tokenizer against
    ``target``'s: a conversion of the draft's tokenizer from its GGUF (once per machine) is a
    step of its own, so its duration is not remembered as the estimate of a later plain read."""
    if _converts_tokenizer(draft):
        return (f"tokenizer convert {draft}", f"converting {draft}'s tokenizer from its GGUF "
                f"(once per machine) to check that it fits {target}", TOKENIZER_CONVERT_GUESS_S)
    return (f"tokenizer {target} {draft}", f"checking that {draft}'s tokenizer fits {target}",
            GUESS_S["tokenizer"])


def check_step(target: str, draft: DraftSpec | str) -> tuple[str, str, float]:
    """(key, name, guess in seconds) of the step ``check`` prints while it reads what its verdict
    on ``draft`` for ``target`` needs (``checks.compat.check_specs``): importing torch and
    transformers, the target's folder, then both tokenizers, the target's config for
    ``early-exit:N``, or the target's weights and a learned drafter. A built-in draft whose
    tokenizer is converted first is :func:`tokenizer_step`'s conversion step. Reads no model
    and imports no torch (the step line comes before either)."""
    if _converts_tokenizer(draft):  # the conversion is the slow part: say so
        return tokenizer_step(target, draft)
    guess = GUESS_S["tokenizer"] if as_draft_spec(draft).is_model else GUESS_S["imports"]
    return f"check {target} {draft}", f"checking {draft} against {target}", guess


def load_model(spec: str, device: str = "auto", dtype: str = "auto", **kwargs):
    """``models.load_model`` with its slow parts as steps: converting a built-in (once), loading.

    Raises:
        ModelLoadError: as ``models.load_model``.
    """
    reason = models.builtin_conversion_needed(spec)
    if reason is not None:
        guess = models.builtin_source_bytes(spec) / CONVERT_BYTES_PER_S
        with STEPS.step(f"convert {spec}",
                        f"locating and converting {spec}'s weights (once; {reason})", guess):
            models.convert_builtin(spec)
    with STEPS.step(f"load {spec} {dtype} {device}", f"loading {spec}", GUESS_S["load"]):
        return models.load_model(spec, device, dtype, **kwargs)


WARM_ATTR = "_specdemo_warmed"  # on a model or a pipeline: the set of what was warmed up


def _warmed(obj) -> set:
    """What was warmed on ``obj`` (a model or a pipeline), kept on the object itself."""
    done = getattr(obj, WARM_ATTR, None)
    if done is None:
        done = set()
        setattr(obj, WARM_ATTR, done)
    return done


def max_draft_length(draft_length: int | str) -> int:
    """The longest draft a decode with this draft length may verify (``auto``: the adaptive
    policy's ``max_k``)."""
    if draft_length == "auto":
        from ..core.policy import AdaptiveDraftLength  # lazy: imports torch; --help stays fast
        return AdaptiveDraftLength().max_k
    return int(draft_length)


def verification_widths(speculative: bool, draft_length: int | str = 4) -> list[int]:
    """Target forward widths (tokens per forward after the prefill) a decode may use: 1 for a
    plain decode; 1..k+1 for a speculative one (a round verifies the last token and up to k
    drafts: fewer when the drafter proposes fewer, the policy verifies a prefix, the run ends, or
    ``auto`` chooses k = 0), k up to ``max_k`` for ``auto``."""
    return list(range(1, max_draft_length(draft_length) + 2)) if speculative else [1]


def _forward_widths(kv, widths: list[int], layers: tuple[int, ...], context: list[int]) -> None:
    """One forward per width after ``context``, through the path a decode uses (with the
    drafter's feature layers when it reads them), rolled back each time; resets ``kv``."""
    kv.reset()
    kv.forward(context)
    vocab = kv.model.get_input_embeddings().num_embeddings
    for n in widths:
        ids = [(i % (vocab - 1)) + 1 for i in range(n)]
        if layers:
            kv.forward_features(ids, n, layers)
        else:
            kv.forward(ids, logits_to_keep=n)
        kv.rollback(len(context))
    kv.reset()


def warm_up(pipe: Pipeline, speculative: bool = False, prompt: str = "hi", *,
            draft_length: int | str = 2, prompt_ids: list[int] | None = None) -> None:
    """Do, untimed, every one-time cost a timed decode in that mode would otherwise pay, so that
    none of it lands in one lane of a race: first forwards of each shape (oneDNN primitives and
    MKL buffers on a CPU, cuBLAS handles and lazy kernel loading on CUDA, Metal graphs on MPS),
    the drafter's first multi-step draft, allocator growth. A named step; what was warmed is
    remembered on the target model (forward widths, plain decodes) or the pipeline (speculative
    decodes, draft-model widths), so a second call with the same mode, draft length and prompt
    length does nothing.

    What is warmed:
        * a short decode in that mode with the longest draft the decode may use (``auto``:
          ``max_k``): the drafter's multi-step drafting (EAGLE-3, DFlash, a draft model's
          one-token steps) and lazy initialisation along the way;
        * with ``prompt_ids``: the same short decode of those ids, so the prefill shapes of
          this prompt (the target's, and a draft model's first catch-up) are not first seen in
          the timed run; otherwise of ``prompt``;
        * every target forward width of :func:`verification_widths`, through the same path as
          the decode (feature layers included for drafters that read hidden states);
        * for draft models (``self``, ``early-exit:N``, a separate model): their forward widths
          1..k+1.

    Call it on the device thread, before the clock of the first timed decode of a race starts
    (:class:`specdemo.services.race.Race` warms both lanes before the plain lane runs).

    Args:
        pipe: the pipeline whose decode is prepared.
        speculative: warm the speculative mode (the pipeline's drafter) or the plain one.
        prompt: text used when ``prompt_ids`` is not given.
        draft_length: the race's draft length (k or ``auto``).
        prompt_ids: the token ids the timed decode will be given.
    Raises:
        ValueError: the prompt does not fit the target's context (``Pipeline.check_length``).
        core.kv.Cancelled: inside ``core.kv.stop_on``, Stop ended the warm-up decode.
    """
    from ..core.drafters import wants_features  # deferred: imports torch
    from ..core.kv import Cancelled, stop_requested  # lazy: imports torch; --help stays fast
    from ..core.drafters.draft_model import ModelDrafter  # lazy: imports torch; --help stays fast
    from .pipeline import DecodeSettings  # lazy: imports torch; --help stays fast
    speculative = speculative and pipe.draft_spec != "none"
    k = max_draft_length(draft_length) if speculative else 0
    widths = verification_widths(speculative, draft_length)
    drafter = pipe.new_drafter() if speculative else None
    layers = wants_features(drafter)
    ids = list(prompt_ids) if prompt_ids is not None else pipe.prompt_ids(prompt)
    owner = pipe if speculative else pipe.target.model
    done_target = _warmed(pipe.target.model)
    decode_key = ("decode", k)
    prompt_key = ("prefill", k, len(ids))
    todo_widths = [n for n in widths if ("width", layers, n) not in done_target]
    draft_kv = drafter.kv if isinstance(drafter, ModelDrafter) else None
    todo_draft = [n for n in range(1, k + 2) if ("draft width", n) not in _warmed(owner)
                  ] if draft_kv is not None else []
    todo_decode = decode_key not in _warmed(owner) or prompt_key not in _warmed(owner)
    if not (todo_widths or todo_draft or todo_decode):
        return
    mode = f" with draft {pipe.draft_spec}" if speculative else ""
    # the target's part, from the backend choice's timings: the prompt's prefill, the short
    # decode's steps, each width once (a drafter's own steps are left out: small beside them)
    steps = ([len(ids)] + [k + 1] * (k + 2 if speculative else 3) if todo_decode else []) \
        + todo_widths + ([8] if todo_widths else [])
    guess = forward_estimate_s(pipe.target, steps)
    with STEPS.step(f"warm-up {pipe.target.spec}{mode}", f"warming up {pipe.target.spec}{mode}",
                    GUESS_S["warm-up"] if guess is None else guess):
        if todo_decode:  # prefill, then rounds at the longest draft length used
            settings = DecodeSettings(max_new_tokens=k + 2 if speculative else 3,
                                      draft_length=max(k, 1))
            for _ in pipe.stream(ids, settings, speculative):
                pass
            if stop_requested():  # Stop (kv.stop_on) ended it: nothing more, nothing marked
                raise Cancelled()
        if todo_widths:
            _forward_widths(pipe.kv, todo_widths, layers, ids[:8])
        if todo_draft:
            _forward_widths(draft_kv, todo_draft, (), ids[:8])
    done_target.update(("width", layers, n) for n in todo_widths)
    _warmed(owner).update([decode_key, prompt_key] + [("draft width", n) for n in todo_draft])


def prepare_timed(pipe: Pipeline, speculative: bool, draft_length: int | str,
                  prompt_ids: list[int] | None = None) -> None:
    """Everything a timed decode in this mode needs done before its clock starts: the warm-up
    (:func:`warm_up`) and, for a speculative decode with draft length ``auto``, the forward-cost
    table (:func:`measure_forward_costs`). Call it on the device thread for every lane of a
    race before the first lane is timed."""
    warm_up(pipe, speculative, draft_length=draft_length, prompt_ids=prompt_ids)
    if speculative and pipe.draft_spec != "none" and draft_length == "auto":
        measure_forward_costs(pipe)


def measure_forward_costs(pipe: Pipeline) -> None:
    """Measure what a target forward over n tokens costs on this machine (draft length ``auto``
    needs it), once per target model, as a named step; call it on the device thread."""
    if pipe.forward_costs_known:
        return
    from ..core.policy import AdaptiveDraftLength  # lazy: imports torch; --help stays fast
    widths = range(1, AdaptiveDraftLength().max_k + 2)
    per_pass = forward_estimate_s(pipe.target, widths)  # measure_forward_s: 3 passes after 64
    guess = GUESS_S["forward costs"] if per_pass is None else \
        3 * per_pass + forward_estimate_s(pipe.target, [64])
    with STEPS.step(f"forward costs {pipe.target.spec}",
                    f"measuring what a forward over n tokens costs {pipe.target.spec} here "
                    "(once per start, for draft length auto)", guess):
        others = machine.OtherCpuUse()
        costs = pipe.forward_costs()
        share = others.share()
    miss = backend_store.recheck(pipe.target, costs, share)
    if miss:  # the stored choice was made under a transient (or the machine changed)
        STEPS.note(miss)


#: (target spec, backend) -> {width: seconds of one forward}, from the backend choice (measured
#: or stored): what the estimates of the warm-up and forward-cost steps are scaled from
FORWARD_HINT_S: dict[tuple[str, str], dict[int, float]] = {}


def hint_key(loaded) -> tuple[str, str]:
    return (getattr(loaded, "spec", ""), getattr(loaded, "backend", "transformers"))


def forward_estimate_s(loaded, widths) -> float | None:
    """Seconds one forward over each of ``widths`` tokens takes in all on ``loaded``'s backend,
    interpolated between the widths the backend choice timed (beyond the widest, extrapolated
    with the slope of the last two, never downwards); None when it timed none for this target
    and backend."""
    import numpy as np
    table = FORWARD_HINT_S.get(hint_key(loaded))
    if not table:
        return None
    xs, ts = zip(*sorted(table.items()))
    slope = max((ts[-1] - ts[-2]) / (xs[-1] - xs[-2]), 0.0) if len(xs) > 1 else 0.0
    return sum(ts[-1] + (n - xs[-1]) * slope if n > xs[-1] else float(np.interp(n, xs, ts))
               for n in widths)
