"""The fair race: plain decoding, then speculative decoding, each alone on the device.

Running both decodes at the same time on one device would make each slow the other down, so
neither pane's counters would be true. Instead the race runs the lanes one after the other, on
the device thread (:data:`DEVICE`), which never waits for the UI, and records every engine event with the time the
engine measured for it (``stats.elapsed_s``, from that decode's own start). A replay then plays
both lanes side by side at their measured pace, so the faster one visibly finishes first.

One generator drives both panes (FastChat's side-by-side arena advances two generators in one
event); it yields :class:`RaceSnapshot` objects that know nothing about the UI. Every lane's
models are loaded before any lane runs: one that cannot be loaded (missing, unreachable,
incompatible) is that lane's error and the others are skipped with the reason. An error while a
lane decodes (out of memory, bad input) is kept in that lane's record; the other lane runs.

No metric is computed here: stats come from the engine, speedup and first divergence from
``stats`` and ``pipeline``.
"""

from __future__ import annotations

import gc
import queue
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Callable, Iterator

from ..core.kv import Cancelled, prefill_progress, stop_on, warm_prefix
from ..core.machine import ACTIVE_RACES
from .startup import GUESS_S, STEPS, prepare_timed, tokenizer_step
from ..core.stats import DecodeStats, RaceExplanation, explain, speedup
from .endpoints import EndpointPipeline
from ..core.engine import DecodeResult
from .pipeline import (DecodeSettings, Pipeline, output_divergence, race_warnings, result_dict,
                       target_lossless_expectation)
from . import backend_choice, startup
from ..checks import compat

PLAIN, SPECULATIVE = "plain", "speculative"

# Lane states, in the order a lane goes through them.
WAITING, LOADING, RUNNING, DONE, STOPPED, SKIPPED, ERROR = (
    "waiting", "loading", "running", "done", "stopped", "skipped", "error")
FINISHED = (DONE, STOPPED, SKIPPED, ERROR)
REPLAYING = "replaying"  # a lane being played back by Race.replay (nothing is decoding)


@dataclass
class Lane:
    """One side of the race.

    Attributes:
        name: ``plain`` or ``speculative`` (any unique name works).
        speculative: whether this lane decodes with the pipeline's drafter.
        pipeline: returns the pipeline to decode with; called on the device thread, so a slow model load
            happens there (status ``loading``) and a failure becomes this lane's error.
        messages: this lane's conversation, ``[{"role", "content"}, ...]`` ending with the user's
            new message (each pane keeps its own history).
    """

    name: str
    speculative: bool
    pipeline: Callable[[], Pipeline]
    messages: list[dict]


@dataclass(frozen=True)
class Step:
    """One engine event as the race recorded it.

    Attributes:
        t_s: the event's ``stats.elapsed_s``: seconds since that decode started.
        token_ids, from_draft, text, stats: as in :class:`specdemo.core.engine.DecodeEvent`.
        pieces: the text of each token (``DecodeEvent.pieces``, decoded once by the engine's
            ``TextTracker``); None where the event did not say: then the step's text goes
            with its first token.
    """

    t_s: float
    token_ids: tuple[int, ...]
    from_draft: tuple[bool, ...]
    text: str
    stats: DecodeStats
    pieces: tuple[str, ...] | None = None

    def token_pieces(self) -> tuple[str, ...]:
        """One text piece per token id: :attr:`pieces`, else the text with the first token."""
        if self.pieces is not None:
            return self.pieces
        return (self.text,) + ("",) * (len(self.token_ids) - 1) if self.token_ids else ()


@dataclass
class LaneRecord:
    """What one lane produced so far; written by the device thread only.

    Attributes:
        status: waiting, loading, running, done, stopped (Stop pressed mid-run), skipped (Stop
            pressed before it started) or error.
        error: a readable sentence when status is error (or why it was skipped).
        steps: every engine event, in order.
        speculative: whether the lane decodes speculatively.
        backend: the forward backend its target runs on once loaded (``transformers``, ``ggml``,
            ``native-w8a8``, ...: what ``auto`` chose), None for a server lane or before the load.
    """

    name: str
    speculative: bool
    status: str = WAITING
    error: str | None = None
    steps: list[Step] = field(default_factory=list)
    prefill: PrefillProgress | None = None
    backend: str | None = None


@dataclass(frozen=True)
class PrefillProgress:
    """How far a lane's prefill of a long prompt (more than one chunk, ``core.kv``) is.

    Attributes:
        fed: prompt tokens fed so far; total: the prompt's tokens.
        elapsed_s: seconds since the prefill's first chunk started.
    """

    fed: int
    total: int
    elapsed_s: float

    @property
    def left_s(self) -> float | None:
        """Seconds left at the rate of the chunks fed so far (None before the first is done)."""
        if self.fed <= 0 or self.elapsed_s <= 0:
            return None
        return (self.total - self.fed) * self.elapsed_s / self.fed


@dataclass(frozen=True)
class PaneView:
    """One pane at one moment: what the UI shows.

    Attributes:
        tokens: (text piece, from_draft) per generated token, in order.
        stats: the latest stats snapshot, None before the first token.
        steps_shown: how many recorded steps this view includes.
        timeline: (seconds since the decode started, new tokens so far) per step shown.
        prefill: while the lane prefills a long prompt, how far it is; else None.
        backend: the lane's forward backend (``LaneRecord.backend``), None for a server lane.
    """

    name: str
    status: str
    error: str | None
    text: str
    token_ids: tuple[int, ...]
    tokens: tuple[tuple[str, bool], ...]
    stats: DecodeStats | None
    steps_shown: int
    timeline: tuple[tuple[float, int], ...] = ()
    prefill: PrefillProgress | None = None
    backend: str | None = None

    @property
    def finished(self) -> bool:
        return self.status in FINISHED


def unfinished_reasons(views: list[PaneView]) -> list[str]:
    """Why each lane in ``views`` that did not end DONE has no verdict: ``the plain run was
    stopped``, ``the speculative run did not finish`` (it produced something, then failed or
    was cut), or ``the plain run did not start: <its error>`` for a lane refused before its
    first token (a prompt too long for the context, a draft that cannot be loaded); two lanes
    refused with the same sentence read ``neither run started: <it>``."""
    unstarted = [v for v in views if v.status != DONE and v.status != STOPPED
                 and v.steps_shown == 0 and v.error]
    errors = {v.error for v in unstarted}
    if len(unstarted) == len(views) > 1 and len(errors) == 1:
        return [f"neither run started: {errors.pop()}"]
    reasons = []
    for v in views:
        if v.status == DONE:
            continue
        if v.status == STOPPED:
            reasons.append(f"the {v.name} run was stopped")
        elif v.name in {u.name for u in unstarted}:
            reasons.append(f"the {v.name} run did not start: {v.error}")
        else:
            reasons.append(f"the {v.name} run did not finish")
    return reasons


@dataclass(frozen=True)
class RaceSnapshot:
    """Both panes at one moment, and how they compare.

    Attributes:
        panes: {lane name: PaneView}, in lane order.
        phase: the lane running now, ``replay``, or ``done``.
        clock_s: during a replay, the replay clock in measured seconds; else None.
        speedup: tokens_per_s(speculative) / tokens_per_s(plain), once both have tokens; None
            during a replay (the values there are partial), when a lane ended without
            finishing (stopped, skipped, failed: a finished run against a cut one is no
            comparison) and when the lanes' servers serve different models.
        first_divergence: index of the first differing token once both lanes finished (status
            done), else None.
        identical: True/False once both lanes finished (status done) with tokens, else None: a
            run that failed or was stopped is cut, and a cut output says nothing about
            losslessness; None too for lanes on different models.
        not_compared: once both lanes ended, why there is no speedup or identity verdict (``the
            speculative run did not finish``, ``was stopped``, ``did not start: <why>``
            (:func:`unfinished_reasons`), ``the lanes ran different
            models: ...``; ``; ``-joined), else None.
        warnings: sentences on why the speedup may not hold (``pipeline.race_warnings``: other
            processes used much of the CPU during a finished lane), else empty; a replay
            carries the recorded race's.
        divergence_unit: ``token`` when ``first_divergence`` indexes token ids, ``character``
            when a lane's server returned no token ids and the texts were compared.
        lossless_note: once the models are loaded, why greedy outputs may differ in the
            target's precision (``pipeline.lossless_expectation``: bfloat16, float16, quantised
            weights), None in float32 or before the load.
        explanation: once both lanes finished (and outside a replay's partial steps), why the
            speedup is what it is (``stats.explain``), else None.
    """

    panes: dict[str, PaneView]
    phase: str
    clock_s: float | None = None
    speedup: float | None = None
    first_divergence: int | None = None
    identical: bool | None = None
    warnings: tuple[str, ...] = ()
    divergence_unit: str = "token"
    lossless_note: str | None = None
    not_compared: str | None = None
    explanation: RaceExplanation | None = None

    @property
    def done(self) -> bool:
        return self.phase == "done"


def different_models(plain: DecodeStats | None, speculative: DecodeStats | None) -> str | None:
    """``the lanes ran different models: plain A, speculative B`` when both lanes' servers are
    of one engine, say what they serve (``stats.served_model``) and it differs, else None: a
    speedup or an output comparison across two models measures the models, not speculative
    decoding. Engines name models differently (llama-server a GGUF file, vLLM a hub id), so
    names from two engines are not compared."""
    a = plain.served_model if plain is not None else None
    b = speculative.served_model if speculative is not None else None
    if not a or not b or a == b or plain.engine != speculative.engine:
        return None
    return f"the lanes ran different models: plain {a}, speculative {b}"


def describe_error(exc: BaseException) -> str:
    """A readable sentence for an exception raised while loading or decoding."""
    text = str(exc).strip() or type(exc).__name__
    if "out of memory" in text.lower() or type(exc).__name__ == "OutOfMemoryError":
        return ("out of memory: " + text.splitlines()[0] + ". Lower max new tokens, choose a smaller"
                " preset or a smaller draft")
    if isinstance(exc, (ValueError,)) or any(c.__name__ == "ModelLoadError"  # and DrafterRefused
                                             for c in type(exc).__mro__):
        return text
    return f"{type(exc).__name__}: {text}"


def _free_device_memory() -> None:
    try:
        import torch
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        if torch.backends.mps.is_available():  # Metal keeps freed buffers cached otherwise
            torch.mps.empty_cache()
    except Exception:  # best effort after an out-of-memory error
        pass


class DeviceThread:
    """One thread for all device work: model loads, warm-ups and timed decodes, one job at a time.

    Decodes are timed where they run, and the thread matters: on a 2-core CPU the same
    speculative decode measured 20% slower on a fresh Python thread than on the main thread
    (torch's OpenMP teams are per calling thread), and ``specdemo compare`` runs on the main
    thread. So ``app.py`` hands its main thread over (:meth:`adopt_current_thread`, then
    :meth:`serve_forever`); elsewhere (tests, notebooks) a long-lived daemon thread starts on the
    first job. Either way every load, warm-up and race runs on the same thread.
    """

    def __init__(self) -> None:
        self._jobs: "queue.Queue[tuple[Callable[[], object], Future]]" = queue.Queue()
        self._owner: threading.Thread | None = None
        self._lock = threading.Lock()

    def adopt_current_thread(self) -> None:
        """Declare that the calling thread will serve jobs (call :meth:`serve_forever` later);
        jobs submitted meanwhile wait in the queue."""
        with self._lock:
            if self._owner is None:
                self._owner = threading.current_thread()

    def on_device(self) -> bool:
        """True when called from the device thread."""
        return self._owner is threading.current_thread()

    def submit(self, fn: Callable[[], object]) -> Future:
        """Queue ``fn``; its result or exception arrives in the returned future."""
        future: Future = Future()
        with self._lock:
            if self._owner is None:
                self._owner = threading.Thread(target=self.serve_forever, name="specdemo-device",
                                               daemon=True)
                self._owner.start()
        self._jobs.put((fn, future))
        return future

    def call(self, fn: Callable[[], object]):
        """Run ``fn`` on the device thread and return its result (inline when already there)."""
        return fn() if self.on_device() else self.submit(fn).result()

    def serve_forever(self, stop: threading.Event | None = None, poll_s: float = 0.5) -> None:
        """Run queued jobs on the calling thread until ``stop`` is set (never, by default)."""
        self.adopt_current_thread()
        while stop is None or not stop.is_set():
            try:
                fn, future = self._jobs.get(timeout=poll_s)
            except queue.Empty:
                continue
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn())
                except BaseException as exc:  # delivered to the submitter
                    future.set_exception(exc)
                    if isinstance(exc, KeyboardInterrupt):  # Ctrl-C also ends the serving
                        raise


DEVICE = DeviceThread()


class Race:
    """Run lanes one after the other and expose their progress as snapshots.

    Args:
        lanes: the lanes, run one after the other in this order.
        settings: decode settings, identical for every lane.
        system: optional system prompt for every lane.
        cancel: set it to stop the lane running now (it keeps what it produced) and skip the rest.
        device_lock: held for the whole race, so that nothing else sharing it (model loads,
            tokenizer checks) takes CPU or device time while a lane is being timed.
    """

    def __init__(self, lanes: list[Lane], settings: DecodeSettings, system: str | None = None,
                 cancel: threading.Event | None = None,
                 device_lock: threading.RLock | None = None) -> None:
        if len({lane.name for lane in lanes}) != len(lanes):
            raise ValueError("lane names must be unique")
        self.lanes = list(lanes)
        self.settings = settings
        self.system = system or None
        self.cancel = cancel or threading.Event()
        self.device_lock = device_lock or threading.RLock()
        self.records = {lane.name: LaneRecord(lane.name, lane.speculative) for lane in lanes}
        self._changed = threading.Condition()
        self._future: Future | None = None
        self.lossless_expected: bool | None = None  # set once the models are loaded
        self.lossless_note: str | None = None

    # --- on the device thread ------------------------------------------------------------------------
    def _notify(self) -> None:
        with self._changed:
            self._changed.notify_all()

    def _prepare(self) -> dict[str, Pipeline] | None:
        """Load every lane's pipeline before any lane runs, so that a draft that cannot be
        loaded (missing, unreachable, incompatible) stops the race before the plain run rather
        than after it. On a failure that lane has the error, the others are skipped with the
        reason, and None is returned."""
        pipes: dict[str, Pipeline] = {}
        for lane in self.lanes:
            record = self.records[lane.name]
            record.status = LOADING
            self._notify()
            try:
                pipes[lane.name] = lane.pipeline()
            except Exception as exc:  # kept in this lane; the others are not run
                record.status, record.error = ERROR, describe_error(exc)
                _free_device_memory()
                for other in self.records.values():
                    if other is not record:
                        other.status = SKIPPED
                        other.error = f"not run: the {lane.name} run cannot start ({record.error})"
                return None
            if not getattr(pipes[lane.name], "is_endpoint", False):  # what auto chose, if asked
                record.backend = getattr(pipes[lane.name].target, "backend", "transformers")
            if lane.speculative and not getattr(pipes[lane.name], "is_endpoint", False):
                self.lossless_expected, self.lossless_note = \
                    target_lossless_expectation(pipes[lane.name].target)
        for lane in self.lanes[1:]:
            self.records[lane.name].status = WAITING
        return pipes

    def _warm(self, pipes: dict[str, Pipeline]) -> dict[str, list[int]]:
        """Prepare every lane before the first one is timed: its prompt's token ids, and every
        one-time cost of a decode in its mode (``startup.prepare_timed``: warm-up of each
        forward width and of the drafter, ``auto``'s forward-cost table), so that none of it
        runs between the lanes or inside either clock. A long prompt is warmed over its first
        ``core.kv.warm_prefix`` tokens (every chunk width its prefill uses), not prefilled whole
        once more; Stop ends the warm-up between two chunks. A lane whose prompt or preparation
        fails gets the error (the others still run). Returns {lane name: prompt ids} for the
        others."""
        ids: dict[str, list[int]] = {}
        for lane in self.lanes:
            record, pipe = self.records[lane.name], pipes[lane.name]
            if self.cancel.is_set():
                break
            try:
                ids[lane.name] = pipe.prompt_ids(lane.messages, self.system)
                if not getattr(pipe, "is_endpoint", False):  # a server lane: nothing to warm here
                    prompt = ids[lane.name]
                    with stop_on(self.cancel):
                        prepare_timed(pipe, lane.speculative, self.settings.draft_length,
                                      prompt[:warm_prefix(len(prompt))])
                    reserve = getattr(pipe.kv, "reserve", None)  # a static cache: sized now
                    if reserve is not None:
                        reserve(len(prompt) + 1)
            except Cancelled:  # Stop during the warm-up: the lanes are skipped
                break
            except Exception as exc:  # kept in this lane
                ids.pop(lane.name, None)
                record.status, record.error = ERROR, describe_error(exc)
                _free_device_memory()
        return ids

    def _run_lane(self, lane: Lane, record: LaneRecord, pipe: Pipeline,
                  ids: list[int] | None) -> None:
        if record.status == ERROR:
            return
        if self.cancel.is_set() or ids is None:
            record.status, record.error = SKIPPED, "stopped before this run started"
            return
        started = [0.0]

        def progress(fed: int, total: int) -> None:  # a long prefill's chunks (core.kv)
            if not record.steps:  # the target's prefill, not a draft model's catch-up
                if fed == 0:
                    started[0] = time.perf_counter()
                record.prefill = PrefillProgress(fed, total, time.perf_counter() - started[0])
                self._notify()

        try:
            gc.collect()  # garbage of the loads and of earlier lanes: collected outside the clock
            events = pipe.stream(ids, self.settings, lane.speculative, self.cancel)
            record.status = RUNNING
            self._notify()
            with prefill_progress(progress):  # the generator runs on this thread
                for event in events:  # nothing slow in this loop: the engine's clock is running
                    record.prefill = None
                    pieces = None if event.pieces is None else tuple(event.pieces)
                    record.steps.append(Step(event.stats.elapsed_s, tuple(event.token_ids),
                                             tuple(event.from_draft), event.text, event.stats,
                                             pieces))
                    self._notify()
            last = record.steps[-1].stats if record.steps else None
            record.status = STOPPED if last and last.finish_reason == "cancelled" else DONE
        except Exception as exc:  # kept in this lane; the other lanes still run
            record.status, record.error = ERROR, describe_error(exc)
            _free_device_memory()
        finally:
            record.prefill = None

    def _work(self) -> None:
        try:
            if self.lanes:  # waiting for the device (a load or check in progress) reads as loading
                self.records[self.lanes[0].name].status = LOADING
                self._notify()
            if ACTIVE_RACES.background_running():  # a draft-list check: let it end, untimed
                with STEPS.step("background checks", "letting a draft check in progress "
                                "finish before the clocks start", GUESS_S["background"]):
                    ACTIVE_RACES.wait_background(600)
            with self.device_lock:
                pipes = self._prepare()
                if pipes is not None:
                    self.records[self.lanes[0].name].status = LOADING
                    self._notify()
                    ids = self._warm(pipes)
                    for lane in self.lanes:
                        self._run_lane(lane, self.records[lane.name], pipes[lane.name],
                                       ids.get(lane.name))
                        self._notify()
        except Exception as exc:  # a fault outside the lanes' own handling ends the race, not hangs it
            for record in self.records.values():
                if record.status not in FINISHED:
                    record.status, record.error = ERROR, describe_error(exc)
        finally:
            self._notify()

    def run_here(self) -> None:
        """Run the whole race on the calling thread (the command line's main thread, where our
        engine's decodes are timed as ``compare`` times them); returns when it is done."""
        self._work()

    def start(self) -> None:
        """Queue the race on the device thread (once); until it starts there (a model load may
        be in progress), the first lane reads as loading."""
        if self._future is None:
            if self.lanes and self.records[self.lanes[0].name].status == WAITING:
                self.records[self.lanes[0].name].status = LOADING
            ACTIVE_RACES.begin()  # background checks of the page wait until it is done
            self._future = DEVICE.submit(self._work)
            self._future.add_done_callback(lambda _: ACTIVE_RACES.end())

    def join(self, timeout: float | None = None) -> None:
        """Wait until the race has run (no-op when it was never started)."""
        if self._future is not None:
            self._future.result(timeout)

    @property
    def finished(self) -> bool:
        return all(r.status in FINISHED for r in self.records.values())

    # --- snapshots ---------------------------------------------------------------------------
    def _view(self, record: LaneRecord, upto: int | None = None, status: str | None = None) -> PaneView:
        steps = record.steps[:upto] if upto is not None else list(record.steps)
        ids = tuple(t for s in steps for t in s.token_ids)
        flags = tuple(f for s in steps for f in s.from_draft)
        if steps and not ids:  # a server lane without token ids: its chunks
            tokens = tuple((s.text, False) for s in steps if s.text)
        else:
            tokens = tuple(zip((p for s in steps for p in s.token_pieces()), flags))
        return PaneView(record.name, status or record.status, record.error,
                        "".join(s.text for s in steps), ids, tokens,
                        steps[-1].stats if steps else None, len(steps),
                        tuple((s.t_s, s.stats.new_tokens) for s in steps),
                        record.prefill if upto is None else None, record.backend)

    def _snapshot(self, views: dict[str, PaneView], phase: str, clock_s: float | None = None) -> RaceSnapshot:
        plain, spec = views.get(PLAIN), views.get(SPECULATIVE)
        gain = divergence = identical = why = None
        unit = "token"
        last = {n: r.steps[-1].stats if r.steps else None for n, r in self.records.items()}
        models = different_models(last.get(PLAIN), last.get(SPECULATIVE))
        if plain and spec and plain.stats and spec.stats and models is None:
            cut = plain.finished and spec.finished and not plain.status == spec.status == DONE
            if phase != "replay" and not cut:
                gain = speedup(plain.stats, spec.stats)
            if phase == "done" and plain.status == spec.status == DONE:
                why = explain(plain.stats, spec.stats)
            if plain.status == spec.status == DONE:  # a cut output is no evidence either way
                divergence, unit = output_divergence(plain.token_ids, spec.token_ids,
                                                     plain.text, spec.text)
                identical = divergence is None
        reasons = []
        if plain and spec and plain.finished and spec.finished:
            reasons = unfinished_reasons(list(views.values()))
            reasons += [models] if models else []
        if phase == "replay":  # the recorded race's warnings, not those of the steps shown so far
            warnings = race_warnings(last.get(PLAIN), last.get(SPECULATIVE))
        else:
            warnings = race_warnings(plain.stats if plain else None, spec.stats if spec else None)
        return RaceSnapshot(views, phase, clock_s, gain, divergence, identical, tuple(warnings),
                            divergence_unit=unit, lossless_note=self.lossless_note,
                            not_compared="; ".join(reasons) or None, explanation=why)

    def snapshot(self) -> RaceSnapshot:
        """Both panes as recorded so far."""
        running = next((r.name for r in self.records.values() if r.status not in FINISHED), "done")
        return self._snapshot({name: self._view(r) for name, r in self.records.items()}, running)

    def run(self, min_interval_s: float = 0.1) -> Iterator[RaceSnapshot]:
        """Start the race and yield snapshots as lanes progress, the last one with phase ``done``.

        Yields at most one snapshot per ``min_interval_s`` (events in between are merged), so a
        slow consumer never slows the decode; the first snapshot with a token comes at once
        (a first token should not wait for the interval). Closing the generator early stops the
        race.
        """
        self.start()
        last_yield, token_shown = 0.0, False
        try:
            while True:
                with self._changed:
                    if not self.finished:
                        self._changed.wait(timeout=max(min_interval_s, 0.01))
                if self.finished:
                    break
                now = time.monotonic()
                has_tokens = any(r.steps for r in self.records.values())
                if now - last_yield >= min_interval_s or (has_tokens and not token_shown):
                    last_yield, token_shown = now, has_tokens
                    yield self.snapshot()
            self.join()
            yield self.snapshot()
        finally:
            if not self.finished:  # closed early (client gone): stop the decode
                self.cancel.set()

    # --- replay ------------------------------------------------------------------------------
    def schedule(self) -> list[tuple[float, str, int]]:
        """(measured time, lane name, steps shown) per recorded step, in time order.

        Every lane's clock starts at 0 (its own decode start), so merging by time puts both lanes
        on one clock as if they had run side by side, each at its measured pace.
        """
        points = [(step.t_s, name, i + 1)
                  for name, record in self.records.items() for i, step in enumerate(record.steps)]
        return sorted(points, key=lambda p: (p[0], p[2]))

    def replay(self, speed: float = 1.0, fps: float = 20.0, cancel: threading.Event | None = None,
               clock: Callable[[], float] = time.monotonic,
               sleep: Callable[[float], None] = time.sleep) -> Iterator[RaceSnapshot]:
        """Play the recorded race back with both lanes side by side at their measured pace.

        Args:
            speed: playback rate (2.0 plays twice as fast).
            fps: at most this many snapshots per second of wall time.
            cancel: when set, the replay jumps to the end.
            clock, sleep: injectable for tests.
        Yields:
            Snapshots with phase ``replay`` and ``clock_s`` in measured seconds, then one ``done``.
        """
        self.join()
        shown = {name: 0 for name in self.records}
        start = clock()
        frame_s = 1.0 / fps

        def views(final: bool = False) -> dict[str, PaneView]:
            out = {}
            for name, record in self.records.items():
                n = shown[name]
                done = final or n == len(record.steps)
                status = record.status if done else REPLAYING
                out[name] = self._view(record, n, status)
            return out

        points = self.schedule()
        i = 0
        while i < len(points) and not (cancel and cancel.is_set()):
            due_s = points[i][0] / speed
            wait_s = due_s - (clock() - start)
            if wait_s > 0:
                sleep(wait_s)
            # Take every step due within this frame, then show one snapshot.
            horizon = (clock() - start + frame_s) * speed
            while i < len(points) and points[i][0] <= horizon:
                _, name, n = points[i]
                shown[name] = max(shown[name], n)
                i += 1
            yield self._snapshot(views(), "replay", points[i - 1][0])
        shown = {name: len(r.steps) for name, r in self.records.items()}
        yield self._snapshot(views(final=True), "done")


class PipelineCache:
    """Pipelines by (target, draft, dtype, quantization, device); models load on first use.

    Plain lanes use the target with draft ``none``; a model draft is checked with
    ``compat.check_specs`` before it is loaded and refused with the verdict's reasons.

    Loads, conversions and tokenizer checks run as named steps (:data:`specdemo.services.startup.STEPS`),
    so the page and the command line can show what is happening and for how long.

    Args:
        load: ``startup.load_model`` (``models.load_model`` with steps; injectable for tests).
        check: ``compat.check_specs`` (injectable for tests).
        lock: held while loading; share it with other code that loads models or tokenizers so
            that loads never run concurrently (transformers' lazy imports are not thread-safe).
        backend: the targets' forward backend when :meth:`get` names none (``auto``,
            ``transformers``, ``ggml``): every pipeline over a target, so both lanes of a race,
            use the same.
    """

    def __init__(self, load: Callable | None = None, check: Callable | None = None,
                 lock: threading.RLock | None = None, backend: str = "transformers") -> None:
        self._load = load
        self._check = check
        self.backend = backend
        self._pipelines: dict[tuple, Pipeline] = {}
        self._models: dict[tuple, object] = {}  # (spec, device, dtype, quantization) -> loaded
        self.lock = lock or threading.RLock()

    def _loader(self) -> Callable:
        if self._load is None:
            self._load = startup.load_model
        return self._load

    def _checker(self) -> Callable:
        if self._check is None:
            self._check = compat.check_specs
        return self._check

    def get(self, target: str, draft: str = "none", dtype: str = "auto",
            quantization: str | None = None, device: str = "auto",
            backend: str | None = None) -> Pipeline:
        """The pipeline for this pairing, loading what is missing, its target on ``backend``
        (default: this cache's ``backend``; the app passes its ``--backend``). A pairing
        already built keeps the backend it was built on.

        Raises:
            ModelLoadError: a model cannot be loaded.
            ValueError: the draft is incompatible with the target (the reasons are in the message).
        """
        quantization = None if quantization in (None, "none") else quantization
        key = (target, draft, dtype, quantization, device)
        if key in self._pipelines:  # loaded: no need to wait for a load in progress elsewhere
            return self._pipelines[key]
        # Load on the device thread, where this pipeline's races (and warm-ups) will run.
        return DEVICE.call(lambda: self._build(target, draft, dtype, quantization, device,
                                               backend or self.backend))

    def _build(self, target: str, draft: str, dtype: str, quantization: str | None,
               device: str, backend: str) -> Pipeline:
        key = (target, draft, dtype, quantization, device)
        from .pipeline import build_pipeline  # deferred: imports torch (the app starts without it)
        with self.lock:
            if key in self._pipelines:
                return self._pipelines[key]
            base = self._model(target, device, dtype, quantization)  # before a backend is set

            def check_draft(spec: str) -> None:  # refused before the draft model loads
                with STEPS.step(*tokenizer_step(target, spec)):
                    verdict = self._checker()(target, spec)
                if verdict.status == "incompatible":
                    raise ValueError(f"draft {spec} cannot serve target {target}: "
                                     + "; ".join(verdict.reasons[:2]))

            # a learned drafter that cannot serve is refused with its problems (DrafterRefused);
            # the first pipeline of a target chooses its backend, weighed for its drafter
            pipe = build_pipeline(
                base, draft, check_draft=check_draft,
                load_draft=lambda spec, dev: self._model(spec, dev, dtype, None),
                on_backend=lambda _loaded, spec, draft_model: self._target(
                    target, device, dtype, quantization, backend, spec, draft_model))
            self._pipelines[key] = pipe
            return pipe

    def _model(self, spec: str, device: str, dtype: str, quantization: str | None):
        """A loaded model, through the loader once per (spec, device, dtype, quantization)."""
        key = (spec, device, dtype, quantization)
        if key not in self._models:
            self._models[key] = self._loader()(spec, device, dtype, quantization=quantization)
        return self._models[key]

    def _target(self, spec: str, device: str, dtype: str, quantization: str | None,
                backend: str, draft: str = "none", draft_model=None):
        """:meth:`_model` on ``backend``, chosen once per loaded target, for ``auto``
        weighed for a race with ``draft`` (``backend_choice.use_backend``; the first pipeline built
        for the target decides, and later ones share it: both lanes run the same backend). A
        ggml backend that cannot serve it raises ``GgmlError``, a ``ModelLoadError``."""
        key = ("backend", spec, device, dtype, quantization, backend)
        if key not in self._models:
            loaded = self._model(spec, device, dtype, quantization)
            if hasattr(loaded, "backend"):  # a models.LoadedModel (tests inject stand-ins)
                loaded, _ = backend_choice.use_backend(loaded, backend, draft, draft_model)
            self._models[key] = loaded
        return self._models[key]

    def loaded(self, target: str, draft: str = "none", dtype: str = "auto",
               quantization: str | None = None, device: str = "auto") -> Pipeline | None:
        """The pipeline if it is loaded already, else None (never loads)."""
        quantization = None if quantization in (None, "none") else quantization
        return self._pipelines.get((target, draft, dtype, quantization, device))


def race_lanes(cache: PipelineCache, target: str, draft: str, histories: dict[str, list[dict]],
               prompt: str, dtype: str = "auto", quantization: str | None = None,
               backend: str | None = None) -> list[Lane]:
    """The two standard lanes: plain (draft ``none``) then speculative (``draft``).

    Args:
        backend: the targets' forward backend (default: the cache's).
        histories: {``plain``/``speculative``: earlier messages of that pane}.
        prompt: the user's new message, appended to both histories.
    """
    def lane(name: str, speculative: bool, draft_spec: str) -> Lane:
        messages = list(histories.get(name, [])) + [{"role": "user", "content": prompt}]
        return Lane(name, speculative,
                    lambda: cache.get(target, draft_spec, dtype, quantization, backend=backend),
                    messages)
    return [lane(PLAIN, False, "none"), lane(SPECULATIVE, True, draft)]


def endpoint_lane(name: str, endpoint, messages: list[dict]) -> Lane:
    """A lane served by an OpenAI-compatible server (:class:`specdemo.services.endpoints.Endpoint`); it
    counts as speculative when the server drafts (that is the server's configuration)."""
    pipe = EndpointPipeline(endpoint)
    return Lane(name, name == SPECULATIVE, lambda: pipe, messages)


def with_endpoints(lanes: list[Lane], endpoints: dict | None) -> list[Lane]:
    """``lanes`` with each lane that ``endpoints`` names (``{lane name: Endpoint or None}``)
    served by that server (:func:`endpoint_lane`, with the lane's messages); the others as they
    are. Nothing is loaded: a lane's pipeline is built when the race runs."""
    endpoints = endpoints or {}
    return [endpoint_lane(lane.name, endpoints[lane.name], lane.messages)
            if endpoints.get(lane.name) is not None else lane for lane in lanes]


#: ``lossless_note`` of a sampled race (``/race``, ``compare --json``): why it has no verdict
SAMPLED_NOTE = ("sampled (temperature > 0): speculative sampling keeps the target's "
                "distribution, so the outputs are equal in distribution, not token for token; "
                "identical text is not expected and not compared (temperature 0 compares tokens)")


def sampled_verdict(out: dict, temperature: float) -> dict:
    """``out`` (a ``/race`` or ``compare --json`` answer) as it reads under sampling: no
    token-for-token verdict (``identical`` and ``first_divergence`` None) and ``lossless_note``
    saying why (:data:`SAMPLED_NOTE`), as the page's badge says; unchanged at temperature 0."""
    if temperature > 0:
        out.update(identical=None, first_divergence=None, lossless_note=SAMPLED_NOTE)
    return out


def pane_dict(view: PaneView, draft_length_setting: int | str | None = None) -> dict:
    """docs/design.md metric names plus text, token_ids, from_draft, status, error and
    ``backend`` (the forward backend the lane ran on, None for a server lane or a lane that did
    not run); a server lane adds ``engine`` and ``not_reported`` (its stats' fields). A lane
    that did not run (skipped, or failed before its first token) carries the same keys, with
    the counters 0 and the rest empty or None. Under ``draft_length_setting`` ``auto`` a
    speculative lane's ``draft_length`` is ``"auto"`` (otherwise it is its last round's k;
    ``mean_draft_length`` and ``draft_length_min``/``_max`` cover every round)."""
    out: dict = {"status": view.status, "error": view.error}
    if view.stats is not None:
        flags = [f for _, f in view.tokens] if view.token_ids else []
        out.update(result_dict(DecodeResult(view.text, list(view.token_ids), flags, view.stats)))
        out["backend"] = view.backend
        if view.name == SPECULATIVE and draft_length_setting == "auto":
            out["draft_length"] = "auto"
    else:  # did not run: every key of a lane that ran, nothing measured
        out.update({**result_dict(DecodeResult("", [], [], DecodeStats())), "backend": None})
    return out


def snapshot_dict(snap: RaceSnapshot, draft_length_setting: int | str | None = None) -> dict:
    """A finished race as the command line's and ``/race``'s JSON: each lane's
    :func:`pane_dict`, and ``backend``, the forward backend our engine's lanes ran on (None
    when no lane of ours ran or two ran on different ones)."""
    ran = {view.backend for view in snap.panes.values() if view.backend and view.stats is not None}
    return {**{name: pane_dict(view, draft_length_setting) for name, view in snap.panes.items()},
            "backend": ran.pop() if len(ran) == 1 else None,
            "speedup": snap.speedup,
            "explanation": snap.explanation.as_dict() if snap.explanation else None,
            "identical": snap.identical,
            "first_divergence": snap.first_divergence, "divergence_unit": snap.divergence_unit,
            "not_compared": snap.not_compared, "warnings": list(snap.warnings)}
