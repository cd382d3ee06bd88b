"""``--backend auto``: which target backend a race runs on, chosen on this machine.

One service, top to bottom: :func:`use_backend` (the start-up step) -> :func:`with_backend` ->
:func:`choose_backend`, which reads a stored choice (:mod:`.backend_store`: validated, re-weighed
when a run disagrees) or asks the models layer for the candidates (``models.backends``) and
their forwards, times them and weighs them for the race's drafter by the rules of
:mod:`.backend_rules`. A learned drafter's acceptance and drafting cost change with the backend
(its features, a C step), so it is measured on each survivor here (:func:`lane_facts`); which
hidden states it reads comes from what was loaded for it (``LoadedDrafter.feature_layers``), not
from a drafter built for the purpose.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from dataclasses import dataclass, field
from typing import Callable

import torch

from .. import _omp
from ..core import BACKENDS, backend_family
from ..core import machine
from ..core.drafters.base import LoadedDrafter
from ..models import backends as mb
from ..models import ggml_backend as gg
from ..models import native
from ..models.hardware import _cpu_name
from . import backend_rules as bc
from . import backend_store as store
from . import startup
from .pipeline import DecodeSettings, Pipeline

log = logging.getLogger(__name__)

CHOICE_ENV = store.CHOICE_ENV
RECALIBRATE = store.RECALIBRATE
#: the choice notes this process has said (a note says what was ignored: once is enough)
_SAID: set[str] = set()


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
            prior ``backend_rules.PRIOR_ACCEPTANCE`` was weighed).
        notes: what was ignored on the way (a stored entry that failed its checks, a
            ``SPECDEMO_BACKEND`` value that means nothing), one sentence each.
        key: the store's key of this choice (None: not stored, e.g. asked for by name).
        why: for a choice measured under ``auto``, why it was measured rather than read back
            (the first on this machine, what changed since the stored one, a recheck that
            dropped it, ``SPECDEMO_BACKEND=recalibrate``); None when read back or not measured.
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
    notes: list[str] = field(default_factory=list)
    key: str | None = None
    why: str | None = None

    def as_dict(self) -> dict:
        return {"backend": self.backend, "reason": self.reason, "cost_s": self.cost_s,
                "cached": self.cached, "other_cpu_share": self.other_cpu_share,
                "forward_s": self.forward_s, "probe_s": self.probe_s, "dropped": self.dropped,
                "draft_length": self.draft_length, "acceptance": self.acceptance,
                "notes": self.notes, "why": self.why}


def omp_waiting() -> str:
    """How OpenMP threads wait, as the stored choice's key holds it: the value the user set
    (``OMP_WAIT_POLICY=active``, ``GOMP_SPINCOUNT=...``), or ``automatic``. An automatic setting
    is specdemo's own (specdemo/_omp.py: threads spin, or wait passively when another runnable
    task was seen in the ~20 ms at start), which flips between two identical commands on a busy
    machine: keyed by it, every other command measured again (a new user's report), so it is
    not part of the key; the entry says what it was measured with (:func:`_omp_policy`)."""
    decision = _omp.DECISION  # the decision made when specdemo was imported
    if decision is not None and decision["policy"] != "user":
        return "automatic"
    setting = {k: os.environ[k] for k in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT") if k in os.environ}
    return ", ".join(f"{k}={v}" for k, v in sorted(setting.items())) or "automatic"


def _omp_policy() -> str | None:
    """This process's OpenMP waiting: ``spin``, ``passive`` or ``user`` (None: not decided)."""
    return _omp.DECISION["policy"] if _omp.DECISION is not None else None


def _key_parts(loaded, candidates: tuple[str, ...], lane: bc.RaceLane) -> dict:
    """What a stored choice is keyed by, by name (stored with the entry, so that a start that
    finds none can say which of them changed: ``backend_store.miss_reason``)."""
    gguf = gg.gguf_path(loaded.spec) if "ggml" in candidates else None
    st = gguf.stat() if gguf is not None else None
    return {"cpu": _cpu_name(), "torch": torch.__version__,
            "torch threads": torch.get_num_threads(), "threads": machine.default_threads(),
            "target": loaded.spec, "dtype": str(loaded.dtype),
            "GGUF size": st.st_size if st else None,
            "GGUF modified": int(st.st_mtime) if st else None,
            "timed widths": list(bc.RACE_WIDTHS), "candidates": list(candidates),
            # what the race was weighed for: the path its verification takes, and the drafter
            # only where it was measured on each backend (a learned head); every other lane
            # (prompt lookup, self, a draft model, a plain run: race_lane) is weighed alike, so
            # run, compare, bench, costs and the app share one entry per target
            "drafter": lane.draft if lane.measured else "prior",
            "speculative": lane.speculative, "feature layers": list(lane.layers),
            "measured per backend": lane.measured,
            # a waiting the user set changes every backend's costs (2.5-3.3x for ggml:
            # specdemo/_omp.py); specdemo's own load-driven one is not keyed (omp_waiting)
            "OpenMP waiting": omp_waiting()}


def _key_of(parts: dict) -> str:
    return hashlib.sha256(json.dumps(list(parts.values()), default=str).encode()).hexdigest()[:20]


def _stored(key: str, names: tuple[str, ...], parts: dict | None = None
            ) -> tuple[BackendChoice | None, list[str], str | None]:
    """(the choice stored under ``key`` once checked, or None: none, ignored, or recalibration
    asked for; the sentences saying what was ignored; when None, why it is measured again, in
    one clause for the start-up step, e.g. ``"measured again: ..."``).

    ``parts``: the key's named parts (``_key_parts``), with which a missing entry is explained
    (``backend_store.miss_reason``)."""
    again, env_note = store.env_request()
    notes = [env_note] if env_note else []
    if again:
        return None, notes, f"measured again: {RECALIBRATE}"
    entry, problem = store.read(key, names)
    if problem:
        notes.append(problem)
        return None, notes, "measured again: the stored choice was ignored (said below)"
    if entry is None:
        return None, notes, store.miss_reason(key, parts) if parts else None
    share = entry.get("other_cpu_share")
    when = (f"measured earlier on this machine while other processes used {share:.0%} of "
            f"the CPU ({RECALIBRATE}): " if share is not None and share > machine.BUSY_SHARE
            else f"measured earlier on this machine ({RECALIBRATE}): ")
    then, now = entry.get("omp_policy"), _omp_policy()
    if then in ("spin", "passive") and now in ("spin", "passive") and then != now:
        when = when.replace("): ", f"; OpenMP threads {_POLICY_WORDS[then]} then, "
                            f"{_POLICY_WORDS[now]} now, as chosen from the load at start; a run "
                            "far from its estimate drops it): ", 1)
    choice = BackendChoice(entry["backend"], entry["reason"].replace("measured: ", when, 1),
                           entry["cost_s"], cached=True, other_cpu_share=share, key=key,
                           notes=notes)
    for name in ("probe_s", "dropped", "draft_length", "acceptance"):
        setattr(choice, name, entry.get(name) or {})
    # JSON keys are strings
    choice.forward_s = {b: {int(n): t for n, t in w.items()} for b, w in entry["forward_s"].items()}
    return choice, notes, None


_POLICY_WORDS = {"spin": "spun", "passive": "waited passively"}


def _short(why: str) -> str:
    """The first clause of a backend's "not available" reason (the page and the CLI print the
    choice on one line; ``costs`` and ``--backend NAME`` give the whole reason), keeping the
    command that would make ggml available."""
    short = why.split(" (")[0]
    if "scripts/setup.sh engines" in why and "scripts/setup.sh engines" not in short:
        short += " (scripts/setup.sh engines builds it)"
    return short


def _weighed(choice: BackendChoice, lane: bc.RaceLane) -> str:
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
               if lane.measured else
               f"acceptance {bc.PRIOR_ACCEPTANCE} assumed (the auto policy's prior), drafting "
               "cost the same on every backend")
        who = (f"draft {lane.draft}" if lane.measured else
               "a drafter not measured per backend (prompt lookup, self, a draft model; a "
               "plain run is weighed as this race's plain lane)")
        what = (f"weighed for a race with {who}: plain step plus speculative lane's "
                f"best k of 0/4/8 per token, from {widths}-token forwards"
                + (" with the drafter's features" if lane.layers else "") + f", {how}: ")
    else:
        what = f"weighed for a plain decode: the 1-token forward ({widths}-token forwards timed): "
    return what + "; ".join(one(n) for n in names)


def stored_choice(loaded, lane: bc.RaceLane | None = None) -> BackendChoice | None:
    """The choice :func:`choose_backend` would read back for ``loaded`` and ``lane`` without
    measuring anything (None: it would measure, or ``auto`` has one candidate only)."""
    return lookup(loaded, lane)[0]


def lookup(loaded, lane: bc.RaceLane | None = None) -> tuple[BackendChoice | None, str | None]:
    """(:func:`stored_choice`, and when it is None why :func:`choose_backend` would measure:
    ``"measured again: the stored choice was for OpenMP waiting OMP_WAIT_POLICY=active, now
    automatic"``, ``"first choice ..."``; None when ``auto`` has one candidate only)."""
    lane = lane or bc.RaceLane("ngram")
    names, _ = mb.candidate_backends(loaded)
    if len(names) == 1:
        return None, None
    parts = _key_parts(loaded, names, lane)
    choice, _, why = _stored(_key_of(parts), names, parts)
    return choice, why


Facts = Callable[[str], bc.LaneFacts]


def choose_backend(loaded, lane: bc.RaceLane | None = None, facts: Facts | None = None
                   ) -> BackendChoice:
    """``auto``: the backend on which a race of ``lane``'s drafter is fastest on this machine
    for this target (:mod:`.backend_rules`: a probe rules hopeless candidates out, the survivors
    are timed at widths 1, 5 and 9 and weighed for the race).

    Candidates on a CPU (``models.backends.candidate_backends``): transformers; ggml for a GGUF
    target; the native backends for a Llama where a C compiler is found, else int8 for a
    float32 Llama (``INT8_NOT_AUTO``). The result is stored per machine, target, candidate set
    and learned drafter (every lane not measured per backend shares one entry:
    :func:`_key_parts`) by :mod:`.backend_store` (``SPECDEMO_BACKEND=recalibrate`` measures
    again), also when other processes used more than ``machine.BUSY_SHARE`` of the CPU
    meanwhile (marked so: the reason says it when it is read back), so restarts do not pay again.

    Args:
        loaded: a ``models.LoadedModel`` on the CPU.
        lane: a ``backend_rules.RaceLane`` (None: a race with prompt lookup, whose acceptance
            and drafting cost do not depend on the backend).
        facts: ``facts(backend) -> LaneFacts`` for a lane measured per backend (None:
            :func:`lane_facts` on ``lane.source``).
    """
    lane = lane or bc.RaceLane("ngram")
    names, why = mb.candidate_backends(loaded)
    if len(names) == 1:
        return BackendChoice("transformers", "; ".join(why))
    parts = _key_parts(loaded, names, lane)
    key = _key_of(parts)
    cached, notes, miss = _stored(key, names, parts)
    if cached is not None:
        return cached
    if facts is None and lane.measured and lane.speculative:
        facts = lambda backend: _measured_or_none(loaded, lane, backend)  # noqa: E731
    others = machine.OtherCpuUse()
    kvs: dict[str, object] = {}

    def kv_of(name: str):
        if name not in kvs:
            kvs[name] = mb.target_kv(mb.replace_backend(loaded, name))
        return kvs[name]

    choice = BackendChoice("", "", notes=notes, key=key, why=miss)
    facts_of: dict[str, bc.LaneFacts | None] = {}

    def time_fully(name: str) -> float:
        forward = bc.time_widths(kv_of(name), bc.RACE_WIDTHS, lane.layers)
        if name not in facts_of:  # the drafter's acceptance on this backend: measured once
            facts_of[name] = facts(name) if facts is not None else None
        measured = facts_of[name]
        if name in choice.forward_s:  # timed again: the faster of the two timings of each width
            forward = {n: min(t, choice.forward_s[name][n]) for n, t in forward.items()}
        cost, k = bc.race_cost_s(forward, lane.speculative, measured)
        choice.forward_s[name], choice.draft_length[name] = forward, k
        choice.acceptance[name] = measured.acceptance if measured is not None else None
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
    entry = {k: v for k, v in choice.as_dict().items() if k not in ("cached", "notes", "why")}
    if share > machine.BUSY_SHARE:  # stored all the same, marked by its share (_stored says it)
        choice.reason += (f"; machine busy: others used {share:.0%} of the CPU ({RECALIBRATE} "
                          "on a quiet machine)")
    store.write(key, {**entry, "measured_unix_s": time.time(), "key_parts": parts,
                      "omp_policy": _omp_policy()})
    return choice


def with_backend(loaded, backend: str = "auto", lane: bc.RaceLane | None = None):
    """``loaded`` set to run on ``backend``.

    Args:
        loaded: a ``models.LoadedModel``.
        backend: ``auto`` (:func:`choose_backend` on a CPU; transformers elsewhere) or a name
            ``models.backends.with_backend`` takes.
        lane: for ``auto``, the race's speculative lane the choice is weighed for (None: prompt
            lookup).
    Returns:
        (a LoadedModel with ``backend`` set, the :class:`BackendChoice`).
    Raises:
        as ``models.backends.with_backend``: the backend cannot serve this target, an unknown
        name (ValueError).
    """
    name = (backend or "auto").strip().lower()
    if name not in BACKENDS:
        raise ValueError(f"unknown backend '{backend}'; use {', '.join(BACKENDS)}")
    if name != "auto":
        return mb.with_backend(loaded, name), BackendChoice(name, "asked for")
    if loaded.device.type != "cpu":
        return mb.replace_backend(loaded, "transformers"), BackendChoice(
            "transformers", f"auto on {loaded.device.type}: the ggml, int8 and native backends run "
            "on the CPU")
    choice = choose_backend(loaded, lane)
    return mb.replace_backend(loaded, choice.backend), choice


#: the lane a learned drafter is measured in on each backend ``auto`` times fully: greedy, a fixed
#: draft length, a short everyday prompt (the acceptance of its head on that backend's features)
FACTS_PROMPT = "explain in two sentences why the sky is blue."
FACTS_NEW_TOKENS = 32
FACTS_DRAFT_LENGTH = 4


def race_lane(loaded, draft_spec: str | None = None, draft=None) -> bc.RaceLane:
    """The speculative lane ``auto`` weighs the backends for: the drafter's spec, the hidden
    states its verification reads (a learned drafter's ``feature_layers``, read from what was
    loaded for it), and that learned drafter, measured on each backend (its head steps and
    features change with the backend).

    Args:
        loaded: the target (a ``models.LoadedModel``).
        draft_spec: the race's draft (None or ``none``: a plain decode, weighed as the plain
            lane of ``compare``'s default race, prompt lookup, so that a plain ``run`` and
            ``compare`` read one stored choice and run on the same backend).
        draft: what was loaded for it (a learned drafter, a draft model), or None.
    """
    if draft_spec in (None, "", "none"):
        return bc.RaceLane("ngram")
    if isinstance(draft, LoadedDrafter):
        return bc.RaceLane(draft_spec, tuple(draft.feature_layers(loaded.model)), draft)
    return bc.RaceLane(draft_spec)  # prompt lookup, self, early-exit:N, a draft model: no features


def _measured_or_none(loaded, lane: bc.RaceLane, backend: str) -> bc.LaneFacts:
    """:func:`lane_facts`, or nothing measured (the prior is weighed, and the reason says so)
    when its decode fails: the choice of a backend must not fail on a measurement's extra."""
    try:
        return lane_facts(loaded, lane.draft, lane.source, backend)
    except Exception as exc:  # noqa: BLE001 - logged; the choice weighs the prior instead
        log.warning("could not measure %s on %s: %s", lane.draft, backend, exc)
        return bc.LaneFacts()


def lane_facts(loaded, draft_spec: str, draft, backend: str) -> bc.LaneFacts:
    """The drafter's acceptance and drafting cost on ``backend``: a greedy decode of
    :data:`FACTS_PROMPT` at draft length :data:`FACTS_DRAFT_LENGTH` (after an untimed short one),
    ``backend_rules.acceptance_of`` its per-position counts, its drafting seconds per drafted
    token."""
    pipe = Pipeline(mb.replace_backend(loaded, backend), draft_spec, draft)
    ids = pipe.prompt_ids(FACTS_PROMPT)
    settings = DecodeSettings(max_new_tokens=FACTS_NEW_TOKENS, draft_length=FACTS_DRAFT_LENGTH)
    pipe.run(ids, DecodeSettings(max_new_tokens=FACTS_DRAFT_LENGTH + 2,
                                 draft_length=FACTS_DRAFT_LENGTH), True)  # first steps: untimed
    stats = pipe.run(ids, settings, True).stats
    if not stats.drafted:
        return bc.LaneFacts()
    return bc.LaneFacts(bc.acceptance_of(stats.position_drafted, stats.position_accepted),
                        stats.draft_s / stats.drafted, stats.drafted)


def _compile_native_once(loaded, backend: str) -> None:
    """The native backend's first use on a machine compiles its C forward (~2-10 s): a step of
    its own, so the start-up says what it waits for (a failure is said by the backend choice)."""
    if (backend != "auto" and backend_family(backend) != "native") or loaded.device.type != "cpu":
        return
    if native.unsupported_reason(loaded.model) or native.library_path().exists():
        return
    with startup.STEPS.step("native compile",
                            "compiling our C forward for this CPU (once per machine)",
                            startup.GUESS_S["native compile"]):
        try:
            native.library()
        except native.NativeError:
            pass  # auto leaves native out and says why; --backend native raises it again


def use_backend(loaded, backend: str = "auto", draft_spec: str | None = None, draft=None):
    """``loaded`` set to run on ``backend`` (:func:`with_backend`), as a named step: loading the
    GGUF into llama.cpp, and for ``auto`` on a CPU the first choice on this machine (a probe of
    every candidate, the survivors timed and weighed for a race with ``draft_spec``:
    :func:`race_lane`; stored, later starts read it). The choice, what was weighed and what was
    ignored on the way are start-up notes; the chosen target carries its choice
    (``backend_choice``), which ``backend_store.recheck`` compares a run's timings with.

    Returns:
        (the LoadedModel with ``backend`` set, the :class:`BackendChoice`).
    Raises:
        GgmlError: ``ggml`` asked for and unavailable for this target; ValueError: unknown name.
    """
    backend = backend or "auto"
    if backend == "transformers":
        return with_backend(loaded, "transformers")
    _compile_native_once(loaded, backend)
    lane = race_lane(loaded, draft_spec, draft) if backend == "auto" else None
    stored, why = lookup(loaded, lane) if lane is not None and loaded.device.type == "cpu" \
        else (None, None)
    if stored is not None:  # read back in milliseconds: no step, only the note
        chosen, choice = mb.replace_backend(loaded, stored.backend), stored
    else:
        weighed = "" if lane is None else (
            f", weighed for draft {draft_spec}" if draft_spec not in (None, "", "none")
            else ", weighed as a race's plain lane")
        with startup.STEPS.step(f"backend {backend} {loaded.spec}",
                                f"choosing the forward backend for {loaded.spec} "
                                f"({backend}{weighed}" + (f"; {why}" if why else "") + ")",
                                startup.GUESS_S["backend"]):
            chosen, choice = with_backend(loaded, backend, lane)
    chosen.backend_choice = choice
    if choice.forward_s.get(choice.backend):
        startup.FORWARD_HINT_S[startup.hint_key(chosen)] = choice.forward_s[choice.backend]
    for note in choice.notes:
        if note not in _SAID:  # a start-up note once a process, not once per model loaded
            _SAID.add(note)
            startup.STEPS.note(note)  # printed by startup.printed(), shown by the page
    startup.STEPS.note(f"forward backend of {loaded.spec}: {choice.backend} ({choice.reason})")
    return chosen, choice
