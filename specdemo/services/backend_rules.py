"""How ``auto`` picks a target backend: a short probe rules hopeless candidates out, the
survivors are timed at the widths a race verifies, and each is weighed for the race's drafter.

The rule (:func:`probe_then_time`), on a busy 2-core machine where timing every backend fully
took 132 s (``int8`` at 3.7 s a forward, ``transformers`` at 0.31 s, ``native-w8a8`` at 0.10 s):

1. **probe** each candidate in :data:`PROBE_ORDER` with one short forward after a few tokens of
   context (:func:`probe_s`): the first forward of a backend is untimed (it pays one-time costs),
   the second is timed, and a third only when the second is within reach of the best so far
   (the faster of the two counts: another process only ever adds time). A candidate whose probe
   costs more than :data:`PROBE_RATIO` times the best probe is ruled out, and so is one whose
   untimed first forward alone costs more than :data:`HOPELESS_RATIO` times it;
2. **time** each survivor at the race's widths (:data:`RACE_WIDTHS`: a plain step, verifying 4
   and 8 drafted tokens; through the feature path when the drafter reads hidden states), the
   fastest of :data:`TIMING_REPEATS` per width (:func:`time_widths`);
3. **weigh** the survivors for the race (:func:`race_cost_s`): seconds a token of the plain lane
   plus seconds a token of the speculative lane at its best draft length among 0, 4 and 8, from
   the drafter's acceptance and drafting cost on that backend (measured on each survivor where the
   backend changes them, e.g. a learned head's C step and features; else the auto policy's prior
   acceptance and no drafting cost). Both lanes of a race run the backend chosen.

Expected tokens a round at draft length k with a per-position acceptance a:
``1 + a + ... + a^k`` (Leviathan et al. 2023, "Fast Inference from Transformers via
Speculative Decoding", eq. 1, with i.i.d. acceptance).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

from ..core import TARGET_BACKENDS

#: a candidate whose probe costs more than this times the best probe so far is not timed fully
PROBE_RATIO = 3.0
#: ... nor one whose untimed first forward alone already costs more than this times it
HOPELESS_RATIO = 10.0
#: the order candidates are probed in (``core.TARGET_BACKENDS``' ``probe_rank``): the fastest
#: measured so far first (docs/cpu-backends.md), so the best probe is known early and slow
#: candidates are ruled out after one short forward; ggml-bf16 is never a candidate
PROBE_ORDER = tuple(sorted((name for name, facts in TARGET_BACKENDS.items()
                            if facts.probe_rank is not None),
                           key=lambda name: TARGET_BACKENDS[name].probe_rank))
PROBE_CONTEXT = 8  # tokens fed (untimed) before the probe's forward
PROBE_WIDTH = 5  # tokens of the probe's forward: a verification of 4 drafted tokens
RACE_WIDTHS = (1, 5, 9)  # a plain step, verifying 4 drafted tokens, verifying 8
TIMING_CONTEXT = 64  # tokens in the cache while the survivors are timed
TIMING_REPEATS = 3  # the fastest of this many per width
PRIOR_ACCEPTANCE = 0.6  # core.policy.AdaptiveDraftLength's prior, when nothing is measured


@dataclass(frozen=True)
class LaneFacts:
    """What the speculative lane's drafter does on one backend.

    Attributes:
        acceptance: per-position acceptance a (0..1) on this backend, or None (not measured:
            :data:`PRIOR_ACCEPTANCE` is assumed).
        draft_s: seconds of drafting per drafted token on this backend (0 for prompt lookup).
        drafted: drafted tokens the measurement saw (0: nothing measured).
    """

    acceptance: float | None = None
    draft_s: float = 0.0
    drafted: int = 0


@dataclass
class RaceLane:
    """The speculative lane a backend is chosen for.

    Attributes:
        draft: the drafter's spec (``none`` for a plain-only decode: only the plain step counts).
        layers: the hidden states its verification forwards return (its feature layers), () for
            none: the survivors are timed through that path.
        source: the loaded learned drafter whose acceptance and drafting cost change with the
            backend (its features, a C step): measured on each survivor
            (``services.backend_choice.lane_facts``); None for drafters whose acceptance and
            cost do not depend on the backend (the prior acceptance, no drafting cost).
    """

    draft: str = "none"
    layers: tuple[int, ...] = ()
    source: object | None = field(default=None, compare=False)

    @property
    def speculative(self) -> bool:
        return self.draft not in ("none", "")

    @property
    def measured(self) -> bool:
        """Whether the drafter is measured on each backend (a learned one)."""
        return self.source is not None


def expected_tokens(k: int, acceptance: float) -> float:
    """Tokens a round yields at draft length ``k`` with per-position acceptance ``acceptance``:
    ``sum(a**j for j in 0..k)`` (the target's own token included; Leviathan et al. 2023, eq. 1)."""
    return sum(acceptance ** j for j in range(k + 1))


def acceptance_of(position_drafted: list[int], position_accepted: list[int]) -> float | None:
    """The per-position acceptance a of a chain drafter from its per-position counts
    (``DecodeStats.position_drafted``/``position_accepted``): accepted tokens over the positions
    that were reached (position 1 whenever drafted; position j+1 when drafted and j accepted),
    the maximum-likelihood a of i.i.d. acceptance; None when nothing was drafted."""
    reached = [d if j == 0 else min(d, position_accepted[j - 1])
               for j, d in enumerate(position_drafted)]
    return sum(position_accepted) / sum(reached) if sum(reached) else None


def race_cost_s(forward_s: dict[int, float], speculative: bool, facts: LaneFacts | None = None
                ) -> tuple[float, int]:
    """(seconds a token of the race, the speculative lane's best draft length) on one backend.

    Args:
        forward_s: {width: seconds of one target forward over that many tokens}, with width 1.
        speculative: whether the race has a speculative lane (False: the plain step alone).
        facts: the drafter on this backend (None: :data:`PRIOR_ACCEPTANCE`, no drafting cost).
    Returns:
        (plain lane's seconds a token + speculative lane's, the k in {0} and {width - 1} that
        gives the speculative lane's; k = 0 is a plain step: ``auto`` may draft nothing).
    """
    plain = forward_s[1]
    if not speculative:
        return plain, 0
    facts = facts or LaneFacts()
    a = PRIOR_ACCEPTANCE if facts.acceptance is None else facts.acceptance
    best, best_k = plain, 0
    for width, seconds in sorted(forward_s.items()):
        k = width - 1
        if k < 1:
            continue
        per_token = (seconds + k * facts.draft_s) / expected_tokens(k, a)
        if per_token < best:
            best, best_k = per_token, k
    return plain + best, best_k


@dataclass
class ProbeResult:
    """What :func:`probe_then_time` found.

    Attributes:
        probe_s: candidate -> seconds of its probe forward (the probed ones).
        dropped: candidate -> why it was not timed fully (one clause).
        scores: survivor -> what ``time_fully`` returned (lower is better).
    """

    probe_s: dict[str, float] = field(default_factory=dict)
    dropped: dict[str, str] = field(default_factory=dict)
    scores: dict[str, float] = field(default_factory=dict)

    @property
    def best(self) -> str:
        return min(self.scores, key=self.scores.get)


TIE_MARGIN = 0.15  # survivors within this share of the best are timed a second time


def close_runners_up(scores: dict[str, float], margin: float = TIE_MARGIN) -> list[str]:
    """The candidates other than the best whose score is within ``margin`` of the best's
    (a relative difference), slowest first; [] when one candidate alone. A first choice on a
    2-core AMD EPYC (AVX2) timed native-w8a8 at 12.9 ms a token and ggml at 12.7, then stored
    ggml for good; timed again, native-w8a8 took 9.9 ms and decoded 40% faster."""
    if len(scores) < 2:
        return []
    best = min(scores, key=scores.get)
    close = [n for n, s in scores.items() if n != best and s <= scores[best] * (1 + margin)]
    return sorted(close, key=scores.get, reverse=True)


class Hopeless(Exception):
    """Raised by a probe that ruled its candidate out before timing it (the message says why)."""


def probe_then_time(names: list[str] | tuple[str, ...], probe: Callable[[str, float | None], float],
                    time_fully: Callable[[str], float], ratio: float = PROBE_RATIO) -> ProbeResult:
    """The rule of the module docstring, over injected measurements.

    Args:
        names: candidates in the order to probe them.
        probe: ``probe(name, limit_s)`` -> seconds of its probe; ``limit_s`` is ``ratio`` times
            the best probe so far (None for the first), past which the probe may stop early by
            raising :class:`Hopeless`.
        time_fully: ``time_fully(name)`` -> its score (seconds; lower is better).
        ratio: :data:`PROBE_RATIO`.
    Returns:
        A :class:`ProbeResult`; at least one candidate is timed.
    Raises:
        ValueError: ``names`` is empty.
    """
    if not names:
        raise ValueError("no candidate backends to choose from")
    out = ProbeResult()
    for name in names:
        best = min(out.probe_s.values(), default=None)
        try:
            seconds = probe(name, None if best is None else ratio * best)
        except Hopeless as exc:
            out.dropped[name] = str(exc)
            continue
        out.probe_s[name] = seconds
    if out.probe_s:
        best_name = min(out.probe_s, key=out.probe_s.get)
        best = out.probe_s[best_name]
        for name, seconds in out.probe_s.items():
            if seconds > ratio * best:
                out.dropped[name] = (f"its probe took {_ms(seconds)}, {seconds / best:.1f}x "
                                     f"{best_name}'s")
    survivors = [name for name in names if name not in out.dropped] or [names[0]]
    for name in survivors:
        out.scores[name] = time_fully(name)
    return out


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"


def _ids(n: int, vocab: int, start: int = 1) -> list[int]:
    """``n`` ordinary token ids (no special ones at the low end)."""
    return [(start + i) % (vocab - 1) + 1 for i in range(n)]


def _forward(kv, n: int, layers: tuple[int, ...], vocab: int) -> None:
    ids = _ids(n, vocab, start=7)
    if layers:
        kv.forward_features(ids, n, layers)
    else:
        kv.forward(ids, logits_to_keep=n)


def probe_s(kv, limit_s: float | None, layers: tuple[int, ...] = (), width: int = PROBE_WIDTH,
            context: int = PROBE_CONTEXT, clock: Callable[[], float] = time.perf_counter) -> float:
    """Seconds of one ``width``-token forward after ``context`` tokens on ``kv`` (the faster of
    two when the first is within ``limit_s``), its first forward untimed; resets ``kv``.

    Raises:
        Hopeless: the untimed first forward alone took more than ``HOPELESS_RATIO / PROBE_RATIO``
            times ``limit_s`` (more than :data:`HOPELESS_RATIO` times the best probe).
    """
    vocab = kv.model.get_input_embeddings().num_embeddings
    kv.reset()
    start = clock()
    kv.forward(_ids(context, vocab))  # untimed: one-time costs land here
    first_s = clock() - start
    try:
        if limit_s is not None and first_s > limit_s * HOPELESS_RATIO / PROBE_RATIO:
            raise Hopeless(f"its first forward took {_ms(first_s)}, over "
                           f"{HOPELESS_RATIO:.0f}x the best probe")
        times = []
        for _ in range(2):
            start = clock()
            _forward(kv, width, layers, vocab)
            times.append(clock() - start)
            kv.rollback(context)
            if limit_s is not None and times[0] > limit_s:
                break  # out of reach already: probe_then_time rules it out
        return min(times)
    finally:
        kv.reset()


def time_widths(kv, widths: tuple[int, ...] = RACE_WIDTHS, layers: tuple[int, ...] = (),
                context: int = TIMING_CONTEXT, repeats: int = TIMING_REPEATS,
                clock: Callable[[], float] = time.perf_counter) -> dict[int, float]:
    """{width: seconds of one forward over that many tokens after ``context`` tokens}, the
    fastest of ``repeats`` (another process only ever adds time), through ``forward_features``
    when ``layers`` is given (the path a learned drafter's verification takes); resets ``kv``."""
    vocab = kv.model.get_input_embeddings().num_embeddings
    kv.reset()
    kv.forward(_ids(context, vocab))
    times: dict[int, list[float]] = {n: [] for n in widths}
    try:
        for _ in range(repeats):
            for n in widths:
                start = clock()
                _forward(kv, n, layers, vocab)
                times[n].append(clock() - start)
                kv.rollback(context)
    finally:
        kv.reset()
    return {n: min(v) for n, v in times.items()}


def order(names: tuple[str, ...] | list[str]) -> list[str]:
    """``names`` in :data:`PROBE_ORDER` (others after, as given)."""
    rank = {name: i for i, name in enumerate(PROBE_ORDER)}
    return sorted(names, key=lambda n: rank.get(n, len(rank)))
