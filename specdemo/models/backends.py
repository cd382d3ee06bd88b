"""The target backends in one table, and the choice among them.

Which backend am I on? ``loaded.backend`` (:func:`backend_of`), one of ``core.BACKENDS``; its row
of :data:`TABLE` says what checks it (``unavailable``), what makes its forward (``prepare``, the
KV-cached target ``kv`` the engine runs) and what it gives a learned drafter
(``attach_drafter``). :func:`with_backend` sets a backend by name, ``auto`` measuring with
:func:`choose_backend` (the rules: :mod:`specdemo.models.backend_choice`).

The families (``core.TARGET_BACKENDS``): ``transformers`` (the model's own forward,
:class:`specdemo.core.kv.KVModel`), ``ggml`` (llama.cpp over the GGUF file,
:mod:`specdemo.models.ggml_backend`), ``int8`` (torch int8, :mod:`specdemo.models.compiled_backend`)
and ``native`` (our C forward, :mod:`specdemo.models.native_backend`).
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import torch

from ..core import BACKENDS, TARGET_BACKENDS, family_backends
from ..core import machine
from ..core.kv import KVModel
from . import backend_choice as bc
from . import builtin
from . import compiled_backend as cb
from . import cuda_graph_backend as cg
from . import ggml_backend as gg
from . import native_backend as nb
from .hardware import _cpu_name

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Backend:
    """One row of :data:`TABLE`.

    Attributes:
        name: the backend's name (``core.TARGET_BACKENDS``).
        family: the module family computing its forward (``transformers``, ``ggml``, ``int8``,
            ``native``).
        weights: the weight format (``core.TARGET_BACKENDS``; None: the model's or file's own).
        unavailable: ``loaded`` -> why this backend cannot serve it (None: it can, as far as a
            cheap check tells; :meth:`prepare` is the full check).
        prepare: ``loaded`` -> None, building or loading the forward once (kept on the model);
            raises the family's ``ModelLoadError`` with the reason.
        kv: ``loaded`` (with ``backend`` set to this name) -> the KV-cached target the engine
            runs (``forward``, ``forward_features``, ``rollback``, ``reset``, ``length``).
        attach_drafter: (drafter, ``loaded``) -> None: what the backend gives a drafter (the
            native backends' C step of an EAGLE-3 head); no-op elsewhere.
    """

    name: str
    family: str
    weights: str | None
    unavailable: Callable[[object], str | None]
    prepare: Callable[[object], None]
    kv: Callable[[object], object]
    attach_drafter: Callable[[object, object], None]


def _nothing(*args) -> None:
    return None


def _row(name: str, family: str, weights: str | None) -> Backend:
    if family == "ggml":
        return Backend(name, family, weights, gg.unavailable_reason,
                       lambda loaded: gg.ggml_model(loaded, backend=name) and None,
                       lambda loaded: gg.GgmlKV(gg.ggml_model(loaded), loaded.model, backend=name),
                       _nothing)
    if family == "int8":
        return Backend(name, family, weights, cb.unavailable_reason,
                       lambda loaded: cb.int8_model(loaded) and None,
                       lambda loaded: cb.Int8KV(cb.int8_model(loaded)), _nothing)
    if family == "native":
        return Backend(name, family, weights, nb.unavailable_reason,
                       lambda loaded: nb.native_model(loaded, weights) and None,
                       lambda loaded: nb.NativeKV(nb.model_of(loaded)), nb.head_stepper)
    if family == "cuda-graphs":
        return Backend(name, family, weights, cg.unavailable_reason,
                       lambda loaded: cg.static_model(loaded) and None,
                       lambda loaded: cg.CudaGraphKV(cg.static_model(loaded)), _nothing)
    return Backend(name, family, weights, _nothing, _nothing,
                   lambda loaded: KVModel(loaded.model), _nothing)


#: the table of target backends: name (``core.TARGET_BACKENDS``, ``auto`` aside) -> its row
TABLE: dict[str, Backend] = {name: _row(name, facts.family, facts.weights)
                             for name, facts in TARGET_BACKENDS.items()}


def backend_of(loaded) -> str:
    """The backend a loaded target runs on (``transformers`` unless :func:`with_backend` said)."""
    return getattr(loaded, "backend", "transformers")


def target_kv(loaded):
    """A KV-cached target for the engine on ``loaded``'s backend (its :data:`TABLE` row's
    ``kv``): a ``ggml_backend.GgmlKV``, a ``compiled_backend.Int8KV``, a
    ``native_backend.NativeKV``, else transformers' :class:`specdemo.core.kv.KVModel`."""
    return TABLE.get(backend_of(loaded), TABLE["transformers"]).kv(loaded)


def attach_drafter(drafter, loaded) -> None:
    """Give ``drafter`` what ``loaded``'s backend offers it (its :data:`TABLE` row's
    ``attach_drafter``: on the native backends, the C step of an EAGLE-3 head)."""
    row = TABLE.get(backend_of(loaded))
    if row is not None and drafter is not None:
        row.attach_drafter(drafter, loaded)


#: why auto leaves ggml-bf16 out (measured with scripts/backend_divergence.py, docs/cpu-backends.md)
BF16_NOT_AUTO = ("llama.cpp's BF16 kernels give a token different numbers in a one-token and a "
                 "multi-token decode, so speculative output differed from plain output on 8 of 20 "
                 "prompts (0 of 20 with the Q4_1 file); ask for it with --backend ggml-bf16")
#: why auto leaves the torch int8 backend out where the native ones are candidates
INT8_NOT_AUTO = ("native-int8 computes the same int8 weights in our C forward, and the torch int8 "
                 "backend measured 2.8-16x slower than the native ones on both CPUs of "
                 "docs/cpu-backends.md while its weights and activation scales take seconds to "
                 "build; ask for it with --backend int8")



@dataclass
class BackendChoice:
    """What :func:`choose_backend` decided.

    Attributes:
        backend: a name of ``core.BACKENDS`` other than ``auto``.
        reason: why, in one line (what was weighed, what a probe ruled out, what is missing).
        cost_s: timed backend -> seconds a token of the race it was weighed for (plain lane plus
            speculative lane; the plain step alone for a plain decode).
        cached: True when the measurement came from an earlier one on this machine.
        other_cpu_share: other processes' share of the CPU while measuring (for a cached choice,
            while it was measured; None when not known).
        forward_s: timed backend -> {width: seconds of one forward over that many tokens}.
        probe_s: probed backend -> seconds of its probe forward.
        dropped: backend -> why it was not timed fully (a probe ruled it out).
        draft_length: timed backend -> the speculative lane's best k there (0: plain steps).
        acceptance: timed backend -> the per-position acceptance measured there (None: the
            prior ``backend_choice.PRIOR_ACCEPTANCE`` was weighed).
    """

    backend: str
    reason: str
    cost_s: dict[str, float] = field(default_factory=dict)
    cached: bool = False
    other_cpu_share: float | None = None
    forward_s: dict[str, dict[int, float]] = field(default_factory=dict)
    probe_s: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    draft_length: dict[str, int] = field(default_factory=dict)
    acceptance: dict[str, float | None] = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"backend": self.backend, "reason": self.reason, "cost_s": self.cost_s,
                "cached": self.cached, "other_cpu_share": self.other_cpu_share,
                "forward_s": self.forward_s, "probe_s": self.probe_s, "dropped": self.dropped,
                "draft_length": self.draft_length, "acceptance": self.acceptance}


CHOICE_FILE = "backend-choice.json"  # in models.cache_dir(): measured costs by machine and target
CHOICE_ENV = "SPECDEMO_BACKEND"  # "recalibrate" measures again
RECALIBRATE = f"{CHOICE_ENV}=recalibrate measures again"


def _choice_key(loaded, candidates: tuple[str, ...], lane) -> str:
    gguf = gg.gguf_path(loaded.spec) if "ggml" in candidates else None
    st = gguf.stat() if gguf is not None else None
    parts = [_cpu_name(), torch.__version__, torch.get_num_threads(), machine.default_threads(),
             loaded.spec, str(loaded.dtype), st.st_size if st else None,
             int(st.st_mtime) if st else None, bc.RACE_WIDTHS, list(candidates),
             # what the race was weighed for: the path its verification takes, and the drafter
             # only where it was measured on each backend (a learned head); every other lane
             # (prompt lookup, self, a draft model, a plain run: startup.race_lane) is weighed
             # alike, so run, compare, bench, costs and the app share one entry per target
             lane.draft if lane.facts is not None else "prior", lane.speculative,
             list(lane.layers), lane.facts is not None]
    # how OpenMP threads wait changes every backend's costs (2.5-3.3x for ggml: specdemo/_omp.py)
    parts.append([os.environ.get("OMP_WAIT_POLICY"), os.environ.get("GOMP_SPINCOUNT")])
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def _choice_path() -> Path:
    return builtin.cache_dir() / CHOICE_FILE


def candidate_backends(loaded) -> tuple[tuple[str, ...], list[str]]:
    """(backends ``auto`` measures for ``loaded``, why each other one is not a candidate)."""
    names, why = ["transformers"], []
    reason = gg.unavailable_reason(loaded)
    if reason is None:
        try:
            gg.ggml_model(loaded)
            names.append("ggml")
        except gg.GgmlError as exc:
            why.append(f"ggml not available: {exc}")
    else:
        why.append(f"ggml not available: {reason}")
    if "ggml" in names:
        why.append(f"ggml-bf16 not a candidate: {BF16_NOT_AUTO}")
    native = nb.unavailable_reason(loaded) if loaded.device.type == "cpu" else "not on the CPU"
    reason = cb.unavailable_reason(loaded) if loaded.device.type == "cpu" else "not on the CPU"
    if reason is None and native is None:
        why.append(f"int8 not a candidate: {INT8_NOT_AUTO}")
    elif reason is None:
        names.append("int8")
    else:
        why.append(f"int8 not available: {reason}")
    if native is None:
        names += list(family_backends("native"))
    else:
        why.append(f"native not available: {native}")
    return tuple(names), why


def _short(why: str) -> str:
    """The first clause of a backend's "not available" reason (the page and the CLI print the
    choice on one line; ``costs`` and ``--backend NAME`` give the whole reason), keeping the
    command that would make ggml available."""
    short = why.split(" (")[0]
    if "scripts/setup.sh engines" in why and "scripts/setup.sh engines" not in short:
        short += " (scripts/setup.sh engines builds it)"
    return short


def _cached_choice(key: str) -> BackendChoice | None:
    """The choice stored under ``key`` (None: none, unreadable, or recalibration asked for)."""
    if os.environ.get(CHOICE_ENV, "").strip().lower() == "recalibrate":
        return None
    try:
        entry = json.loads(_choice_path().read_text())[key]
        share = entry.get("other_cpu_share")
        when = (f"measured earlier on this machine while other processes used {share:.0%} of "
                f"the CPU ({RECALIBRATE}): " if share is not None and share > _busy_share()
                else f"measured earlier on this machine ({RECALIBRATE}): ")
        choice = BackendChoice(entry["backend"], entry["reason"].replace("measured: ", when, 1),
                               entry["cost_s"], cached=True, other_cpu_share=share)
        for name in ("forward_s", "probe_s", "dropped", "draft_length", "acceptance"):
            value = entry.get(name) or {}
            if name == "forward_s":  # JSON keys are strings
                value = {b: {int(n): t for n, t in w.items()} for b, w in value.items()}
            setattr(choice, name, value)
        return choice
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _busy_share() -> float:
    return machine.BUSY_SHARE


def _weighed(choice: BackendChoice, lane) -> str:
    """The reason's clause of what was weighed and found, best first."""
    names = sorted(choice.cost_s, key=choice.cost_s.get)
    widths = "/".join(str(n) for n in bc.RACE_WIDTHS)

    def one(name: str) -> str:
        forward = "/".join(f"{choice.forward_s[name][n] * 1000:.1f}" for n in bc.RACE_WIDTHS)
        text = f"{name} {choice.cost_s[name] * 1000:.1f} ms a token ({forward} ms"
        if lane.speculative:
            measured = choice.acceptance.get(name)
            text += (f", acceptance {measured:.2f}" if measured is not None
                     else f", acceptance {bc.PRIOR_ACCEPTANCE:.2f} prior") + (
                f", best k {choice.draft_length[name]}")
        return text + ")"
    if lane.speculative:
        how = ("acceptance measured on each backend's own features and drafting"
               if lane.facts is not None else
               f"acceptance {bc.PRIOR_ACCEPTANCE} assumed (the auto policy's prior), drafting "
               "cost the same on every backend")
        who = (f"draft {lane.draft}" if lane.facts is not None else
               "a drafter not measured per backend (prompt lookup, self, a draft model; a "
               "plain run is weighed as this race's plain lane)")
        what = (f"weighed for a race with {who}: plain step plus speculative lane's "
                f"best k of 0/4/8 per token, from {widths}-token forwards"
                + (" with the drafter's features" if lane.layers else "") + f", {how}: ")
    else:
        what = f"weighed for a plain decode: the 1-token forward ({widths}-token forwards timed): "
    return what + "; ".join(one(n) for n in names)


def stored_choice(loaded, lane=None) -> BackendChoice | None:
    """The choice :func:`choose_backend` would read back for ``loaded`` and ``lane`` without
    measuring anything (None: it would measure, or ``auto`` has one candidate only)."""
    lane = lane or bc.RaceLane("ngram")
    names, _ = candidate_backends(loaded)
    return None if len(names) == 1 else _cached_choice(_choice_key(loaded, names, lane))


def choose_backend(loaded, lane=None) -> BackendChoice:
    """``auto``: the backend on which a race of ``lane``'s drafter is fastest on this machine
    for this target (:mod:`specdemo.models.backend_choice`: a probe rules hopeless candidates
    out, the survivors are timed at widths 1, 5 and 9 and weighed for the race).

    Candidates on a CPU (:func:`candidate_backends`): transformers; ggml for a GGUF target;
    the native backends for a Llama where a C compiler is found (``native_backend.py``), else
    int8 for a float32 Llama (``compiled_backend.py``; :data:`INT8_NOT_AUTO`). The result is stored per machine, target, candidate set and
    learned drafter (every lane without ``facts`` shares one entry: :func:`_choice_key`)
    in ``models.cache_dir()/backend-choice.json`` (``SPECDEMO_BACKEND=recalibrate`` measures
    again), also when other processes used more than ``machine.BUSY_SHARE`` of the CPU
    meanwhile (marked so: the reason says it when it is read back), so restarts do not pay again.

    Args:
        loaded: a ``models.LoadedModel`` on the CPU.
        lane: a ``backend_choice.RaceLane`` (None: a race with prompt lookup, whose acceptance
            and drafting cost do not depend on the backend).
    """
    lane = lane or bc.RaceLane("ngram")
    names, why = candidate_backends(loaded)
    if len(names) == 1:
        return BackendChoice("transformers", "; ".join(why))
    key = _choice_key(loaded, names, lane)
    cached = _cached_choice(key)
    if cached is not None:
        return cached
    others = machine.OtherCpuUse()
    kvs: dict[str, object] = {}

    def kv_of(name: str):
        if name not in kvs:
            kvs[name] = target_kv(replace_backend(loaded, name))
        return kvs[name]

    choice = BackendChoice("", "")

    facts_of: dict[str, object] = {}

    def time_fully(name: str) -> float:
        forward = bc.time_widths(kv_of(name), bc.RACE_WIDTHS, lane.layers)
        if name not in facts_of:  # the drafter's acceptance on this backend: measured once
            facts_of[name] = (lane.facts(name) if lane.facts is not None and lane.speculative
                              else None)
        facts = facts_of[name]
        if name in choice.forward_s:  # timed again: the faster of the two timings of each width
            forward = {n: min(t, choice.forward_s[name][n]) for n, t in forward.items()}
        cost, k = bc.race_cost_s(forward, lane.speculative, facts)
        choice.forward_s[name], choice.draft_length[name] = forward, k
        choice.acceptance[name] = facts.acceptance if facts is not None else None
        return cost

    found = bc.probe_then_time(bc.order(names), lambda name, limit: bc.probe_s(
        kv_of(name), limit, lane.layers), time_fully)
    close = bc.close_runners_up(found.scores)
    if close:  # a near tie: time them again, the leader last, so that one disturbed timing
        for name in [*close, found.best]:  # (a first run's one-time costs, another process)
            found.scores[name] = time_fully(name)  # does not decide the choice for good
    share = others.share()
    choice.backend, choice.cost_s = found.best, found.scores
    choice.probe_s, choice.dropped, choice.other_cpu_share = found.probe_s, found.dropped, share
    choice.reason = "measured: " + _weighed(choice, lane)
    if found.dropped:
        choice.reason += (f"; ruled out by a {bc.PROBE_WIDTH}-token probe: "
                          + "; ".join(f"{n} ({w})" for n, w in found.dropped.items()))
    missing = [_short(w) for w in why if " not available: " in w]  # e.g. llama.cpp not built
    if missing:
        choice.reason += "; " + "; ".join(missing)
    entry = {k: v for k, v in choice.as_dict().items() if k != "cached"}
    if share > _busy_share():  # stored all the same, marked by its share (_cached_choice says it)
        choice.reason += (f"; machine busy: others used {share:.0%} of the CPU ({RECALIBRATE} "
                          "on a quiet machine)")
    try:
        builtin.store_cache_entry(_choice_path(), key, {**entry, "measured_unix_s": time.time()})
    except OSError as exc:
        log.warning("backend choice not stored in %s (%s)", _choice_path(), exc)
    return choice


def replace_backend(loaded, backend: str):
    """``loaded`` (a ``models.LoadedModel``) on ``backend``: the same model, tokenizer and
    weights objects, with ``backend`` set (nothing is loaded again)."""
    out = copy.copy(loaded)  # shallow: model, tokenizer and weights stay shared
    out.backend = backend
    return out


def with_backend(loaded, backend: str = "auto", lane=None):
    """``loaded`` set to run on ``backend``.

    Args:
        loaded: a ``models.LoadedModel``.
        lane: for ``auto``, the race's speculative lane (``backend_choice.RaceLane``) the
            choice is weighed for (None: prompt lookup).
        backend: ``auto`` (:func:`choose_backend` on a CPU; transformers elsewhere),
            ``transformers``, ``ggml``, ``ggml-bf16``, ``int8`` (``compiled_backend.py``),
            ``native``, ``native-int8`` or ``native-w8a8`` (``native_backend.py``: BF16 or int8
            weights; int8 activations too).
    Returns:
        (a LoadedModel with ``backend`` set, the :class:`BackendChoice`).
    Raises:
        GgmlError: ``ggml`` was asked for and cannot serve this target (the reason).
        compiled_backend.Int8Error: ``int8`` was asked for and cannot serve this target.
        native_backend.NativeError: a ``native`` backend was asked for and cannot
            serve this target.
        ValueError: an unknown backend name.
    """
    name = (backend or "auto").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}'; use {', '.join(BACKENDS)}")
    if name in TABLE:
        TABLE[name].prepare(loaded)  # raises with the reason
        return replace_backend(loaded, name), BackendChoice(name, "asked for")
    if loaded.device.type != "cpu":
        return replace_backend(loaded, "transformers"), BackendChoice(
            "transformers", f"auto on {loaded.device.type}: the ggml, int8 and native backends run "
            "on the CPU")
    choice = choose_backend(loaded, lane)
    return replace_backend(loaded, choice.backend), choice
