"""Draft length: fixed k, or adaptive ("auto") by a cost model measured on this machine.

The adaptive rule picks, each round, the k that maximises expected new tokens per unit of time:

    E[tokens | k] = 1 + sum_{i=1..k} prod_{j<=i} a_j        (Leviathan et al. 2023, eq. 1, with
                                                             per-position acceptance a_j)
    cost(k)       = t_forward(k + 1) + t_draft(k)

where a_j is a running estimate of P(draft token j accepted | tokens before it were) (a position
never verified yet takes the estimate of the deepest one verified before it, else the prior),
t_forward(n) the measured time of a target forward over n tokens, and t_draft(k) the measured
time of drafting k tokens in one round (:meth:`AdaptiveDraftLength.draft_time`: measured per
length, interpolated between lengths; a round has a fixed part, so it is not k times one token's
cost: the shipped EAGLE-3 head on a 2-core AVX-512 EPYC took 1.5 ms for 1 token and 3.3 ms for 4,
and a per-token model drafted too little). k = 0 is a plain step (E = 1, cost = t_forward(1)), so speculation is chosen
only when it is expected to pay. On a GPU t_forward is nearly flat in n, so long drafts win; on
a CPU it grows with n (1.2-2.3x for a few tokens), so the rule drafts less or not at all.
While k = 0 wins, it still probes with the cheapest draft now and then, so that it notices when the
text becomes predictable again. A probe is expected to lose time, so probes are spaced so that
their expected loss stays within ``PROBE_BUDGET`` of the plain steps between them (a probe that
costs one step more than it gains waits 100 plain steps), and never closer than a wait that doubles
after each probe that did not bring drafting back (exponential back-off, 8 to 128 rounds).

The same rule serves every drafter: prompt lookup, draft models, learned heads, a stack of
prompt lookup over a learned drafter (each source apart, below) and draft trees (a tree of N nodes
costs a forward N + 1 wide: :meth:`AdaptiveDraftLength.tree_rate_bound`, ``core.tree.TreeOrChain``).

When a proposal carries the drafter's confidence in each token (``Proposal.confidence``), the
acceptance of *this* round's tokens is estimated from it instead of from the running per-position
averages: a_j = calibration(c_j), a table of measured acceptance per confidence bin that starts at
the confidence itself. A drafter that drafts token by token (EAGLE-3) asks :meth:`more` after
each token and stops when no longer draft is expected to beat verifying what it has; ``limit``
then verifies the prefix with the best expected rate. This is EAGLE-2's dynamic draft (Li et al.
2024, "EAGLE-2: Faster Inference of Language Models with Dynamic Draft Trees": a draft model's
confidence approximates its acceptance rate) as a chain, and what transformers'
``assistant_confidence_threshold`` does with a fixed threshold; here the threshold follows from
the measured forward and drafting times. Measured on the shipped EAGLE-3 head, held-out chat,
k = 8: tokens drafted at confidence 0.1-0.2 were accepted 15% of the time, at 0.9-1.0 98%. Yet
on a 2-core Xeon, where a wider forward costs ~0.1-0.2 of a step a token, it did not beat the
running averages (within noise, some tasks slower), so it is off unless asked for
(``SPECDEMO_DRAFT_CONFIDENCE=1``; docs/learned-drafters.md, "Weighing drafts by confidence").

A drafter that stacks sources (prompt lookup over a learned drafter, :class:`CombinedDrafter`)
has its rounds counted per source: a_j and t_draft are kept for each (``source=``), the forward
times are shared. Prompt lookup's drafts cost next to nothing, so a match is worth verifying
where the learned drafter's k tokens, at its measured cost, are not (llama.cpp tries its n-gram
lookup before its draft model in the same way).
"""

from __future__ import annotations

import math
import os
import time
from typing import Protocol, runtime_checkable

from .clock import sync


class DraftLengthPolicy(Protocol):
    """What the engine asks every policy; the flags say which optional capabilities are on
    (``PerSourcePolicy``, ``ConfidencePolicy``), the others are declared below as Protocols."""

    per_source: bool  # the policy counts each draft source apart (``PerSourcePolicy``)
    use_confidence: bool  # the policy weighs the drafter's confidence (``ConfidencePolicy``)

    def choose(self, source: str | None = None) -> int: ...

    def limit(self, n_proposed: int, source: str | None = None,
              confidence: list[float] | None = None) -> int: ...

    def update(self, n_forward_tokens: int, forward_s: float, n_drafted: int, n_accepted: int,
               draft_s: float, source: str | None = None, confidence: list[float] | None = None,
               n_proposed: int | None = None, backlog: bool = False) -> None: ...


@runtime_checkable
class FixedLength(Protocol):
    """A policy with one fixed draft length ``k`` (``FixedDraftLength``)."""

    k: int


@runtime_checkable
class CostModelPolicy(Protocol):
    """A policy that times the target (``AdaptiveDraftLength``, ``auto``): forward seconds per
    width, the best expected tokens/s, a tree's best case; ``max_k`` the longest draft."""

    max_k: int

    def forward_time(self, n: int) -> float: ...

    def best(self, source: str | None = None) -> tuple[int, float]: ...

    def expected_rate(self, k: int, source: str | None = None) -> float: ...

    def tree_rate_bound(self, nodes: int, depth: int, source: str | None = None) -> float: ...


@runtime_checkable
class PerSourcePolicy(CostModelPolicy, Protocol):
    """A cost-model policy that learns each source (prompt lookup, learned) apart when
    ``per_source`` is true: the engine may then weigh a stacked drafter's lookup itself."""

    per_source: bool


@runtime_checkable
class ConfidencePolicy(Protocol):
    """A policy that asks a drafter's confidence after each token when ``use_confidence``."""

    use_confidence: bool

    def draft_budget(self, k: int, room: int) -> int: ...

    def more(self, confidence: list[float], k: int, source: str | None = None) -> bool: ...


class FixedDraftLength:
    """Always propose k tokens."""

    def __init__(self, k: int) -> None:
        if k < 1:
            raise ValueError(f"draft length must be >= 1, got {k}")
        self.k = k

    per_source = False  # the engine asks the drafter as usual (no separate lookup round)
    use_confidence = False  # every proposed token is verified, whatever the drafter's confidence

    def choose(self, source: str | None = None) -> int:
        return self.k

    def limit(self, n_proposed: int, source: str | None = None,
              confidence: list[float] | None = None) -> int:
        """Verify every proposed token."""
        return n_proposed

    def update(self, n_forward_tokens: int, forward_s: float, n_drafted: int, n_accepted: int,
               draft_s: float, source: str | None = None, confidence: list[float] | None = None,
               n_proposed: int | None = None, backlog: bool = False) -> None:
        pass


class Calibration:
    """Measured acceptance of draft tokens by the drafter's confidence in them.

    ``bins`` equal bins over [0, 1]; each starts at its centre (the confidence taken at its
    word) counted as two observations, then follows the tokens verified in it: a token is
    observed when every token before it in its round was accepted (the rest were never judged).
    """

    def __init__(self, bins: int = 10, smoothing: float = 0.05) -> None:
        self.bins = bins
        self.smoothing = smoothing
        self.acceptance = [(i + 0.5) / bins for i in range(bins)]
        self.seen = [0] * bins

    def _bin(self, confidence: float) -> int:
        if confidence != confidence:  # NaN (logits that were NaN): the least sure bin
            return 0
        return min(max(int(confidence * self.bins), 0), self.bins - 1)

    def __call__(self, confidence: float) -> float:
        """Estimated probability that a token drafted at ``confidence`` is accepted."""
        return self.acceptance[self._bin(confidence)]

    def observe(self, confidence: float, accepted: bool) -> None:
        b = self._bin(confidence)
        self.seen[b] += 1
        weight = max(1.0 / (self.seen[b] + 2), self.smoothing)
        self.acceptance[b] += weight * ((1.0 if accepted else 0.0) - self.acceptance[b])


#: the share of a decode's time that probes (drafting while plain steps are expected to win) may
#: be expected to lose (``AdaptiveDraftLength.probe_wait``)
PROBE_BUDGET = 0.01


class _SourceStats:
    """What the adaptive rule knows of one draft source: per-position acceptance a_j (with the
    number of observations of each), the seconds per drafted token (``draft_token_s``, a
    running average), the seconds of a round by the number of tokens drafted in it
    (``draft_round_s``, n -> running average), and acceptance by the drafter's confidence
    (:class:`Calibration`)."""

    def __init__(self, max_k: int, prior_acceptance: float) -> None:
        self.acceptance = [prior_acceptance] * max_k
        self.seen = [0] * max_k
        self.draft_token_s = 0.0
        self.draft_round_s: dict[int, float] = {}
        self.calibration = Calibration()
        self._draft_times: list[float] | None = None  # draft_time(0..max_k), until the next update


#: the shape of drafting's cost in k before two lengths are measured: t_draft(k) / t_draft(1) =
#: 1 + DRAFT_PRIOR_SLOPE * (k - 1) (half of a one-token round taken as the round's fixed part;
#: the shipped EAGLE-3 head measured 1 + 0.4 (k - 1) on a 2-core AVX-512 EPYC, a draft model
#: nearer 1 + 0.9 (k - 1))
DRAFT_PRIOR_SLOPE = 0.5


class AdaptiveDraftLength:
    """Cost-model draft length (module docstring).

    Args:
        max_k: longest draft considered.
        prior_acceptance: a_j before anything was measured.
        prior_slope: t_forward(n) / t_forward(1) grows by this per extra token before measured.
        smoothing: weight of a new observation in the running averages.
        forward_s: measured seconds of a target forward over n tokens, n -> s (see
            :func:`measure_forward_s`); refined while decoding. Without it the first round is a
            plain step and other widths are extrapolated with ``prior_slope``.
        use_confidence: weigh each proposal by the drafter's confidence in its tokens when it
            gives one (module docstring); False (the default) keeps to the running
            per-position averages. :func:`make_policy` sets it from ``SPECDEMO_DRAFT_CONFIDENCE``.

    ``source`` (``choose``, ``limit``, ``update``, ``expected_rate``): the draft source a
    round's proposal came from (``Proposal.source``, e.g. "ngram" or "eagle3"); each has its own
    acceptance and drafting cost, starting from the priors. None is the drafter as a whole.
    """

    per_source = True  # the engine may offer a stacked drafter's free lookup first (engine.decode)

    def __init__(self, max_k: int = 16, prior_acceptance: float = 0.6, prior_slope: float = 0.15,
                 smoothing: float = 0.2, forward_s: dict[int, float] | None = None,
                 use_confidence: bool = False) -> None:
        self.max_k = max_k
        self.use_confidence = use_confidence
        self.prior_acceptance = prior_acceptance
        self.prior_slope = prior_slope
        self.smoothing = smoothing
        self.forward_s: dict[int, float] = dict(forward_s or {})  # n tokens -> running mean seconds
        self.sources: dict[str | None, _SourceStats] = {}
        self._idle_rounds = 0
        self._probe_every = 8
        self._probing = False  # this round's k is a probe: verify it whatever limit() would say
        self._times: dict[int, float] = {}  # forward_time's answers until the next update
        self._floor: float | None = None  # the cheapest width measured, once 1 is (forward_time)
        # per source: (what the rates were computed from, expected rate of k = 0..max_k)
        self._rates: dict[str | None, tuple[tuple, list[float]]] = {}

    def _source(self, source: str | None) -> _SourceStats:
        if source not in self.sources:
            self.sources[source] = _SourceStats(self.max_k, self.prior_acceptance)
        return self.sources[source]

    @property
    def acceptance(self) -> list[float]:
        """a_j of the drafter as a whole (rounds updated without a source)."""
        return self._source(None).acceptance

    def _avg(self, old: float | None, new: float) -> float:
        return new if old is None else old + self.smoothing * (new - old)

    def _observe(self, stats: _SourceStats, j: int, accepted: bool) -> None:
        """Running acceptance at position j: the prior counts as two observations, so the first
        few rounds move it fast; later, an exponential average that follows changes in the text."""
        stats.seen[j] += 1
        weight = max(1.0 / (stats.seen[j] + 2), self.smoothing)
        stats.acceptance[j] += weight * ((1.0 if accepted else 0.0) - stats.acceptance[j])

    def forward_time(self, n: int) -> float:
        """Estimated seconds of a target forward over n tokens (interpolated from measurements).

        A wider forward does at least the work of a narrower one, and another process taking
        the CPU only ever adds time; so a one-token forward is taken to cost no more than the
        cheapest width measured, and no width less than that. A one-token time inflated by a
        disturbance would otherwise make every draft length look free next to it (``auto`` once
        drafted 16 tokens a round, accepting 1%, for a whole decode).
        """
        if not self._times:  # every width the rules ask for, in one pass after each update
            self._fill_times()
        t = self._times.get(n)
        if t is None:  # wider than a chain (a draft tree's forward)
            t = self._times[n] = self._floored(n, self._forward_time(n))
        return t

    def _floored(self, n: int, t: float) -> float:
        floor = self._floor
        return t if floor is None else (floor if n == 1 else max(t, floor))

    def _fill_times(self) -> None:
        """``_times`` for n = 1..max_k + 1 (the widths of a chain) from ``forward_s``."""
        self._floor = min(self.forward_s.values()) if 1 in self.forward_s else None
        known = sorted(self.forward_s)
        for n in range(1, self.max_k + 2):
            self._times[n] = self._floored(n, self._forward_time(n, known))

    def _forward_time(self, n: int, known: list[int] | None = None) -> float:
        if n in self.forward_s:
            return self.forward_s[n]
        t1 = self.forward_s.get(1)
        known = sorted(self.forward_s) if known is None else known
        if t1 is None:
            if not known:
                return 1.0 + self.prior_slope * (n - 1)
            m = known[0]
            t1 = self.forward_s[m] / (1.0 + self.prior_slope * (m - 1))
        below = max((m for m in known if m < n), default=1)
        above = min((m for m in known if m > n), default=None)
        t_below = self.forward_s.get(below, t1)
        if above is None:  # extrapolate with the measured slope, never flatter than the prior's half
            slope = (t_below - t1) / (below - 1) if below > 1 else self.prior_slope * t1
            return t_below + max(slope, 0.5 * self.prior_slope * t1) * (n - below)
        return t_below + (self.forward_s[above] - t_below) * (n - below) / (above - below)

    def expected_tokens(self, k: int, source: str | None = None) -> float:
        """E[new tokens | k] = 1 + sum_{i<=k} prod_{j<=i} a_j for a k-token draft from ``source``
        (the bonus or correction token counted)."""
        tokens, survive = 1.0, 1.0
        for a in self._source(source).acceptance[:k]:
            survive *= a
            tokens += survive
        return tokens

    def draft_time(self, k: int, source: str | None = None) -> float:
        """Expected seconds of drafting k tokens in one round from ``source``.

        From the running average of the rounds that drafted k tokens; a length not measured is
        interpolated between the measured lengths around it, or extrapolated from the nearest two
        (slope never negative), or, with one length measured, scaled by ``DRAFT_PRIOR_SLOPE``'s
        shape. Never less than a shorter length's time (drafting more does not cost less). Before
        any round is measured: k times the per-token average (0 until measured).
        """
        if k <= 0:
            return 0.0
        stats = self._source(source)
        if not stats.draft_round_s:
            return k * stats.draft_token_s
        if k > self.max_k:
            return self._draft_time(stats, k)
        if stats._draft_times is None:
            times, top = [0.0], 0.0
            for n in range(1, self.max_k + 1):
                top = max(top, self._draft_time(stats, n))
                times.append(top)
            stats._draft_times = times
        return stats._draft_times[k]

    @staticmethod
    def _draft_time(stats: _SourceStats, k: int) -> float:
        measured = stats.draft_round_s
        if k in measured:
            return measured[k]
        known = sorted(measured)
        below = [n for n in known if n < k]
        above = [n for n in known if n > k]
        if below and above:
            lo, hi = below[-1], above[0]
            return measured[lo] + (measured[hi] - measured[lo]) * (k - lo) / (hi - lo)
        if len(known) >= 2:  # beyond the measured lengths: the slope of the nearest two
            a, b = (known[-2], known[-1]) if below else (known[0], known[1])
            slope = max((measured[b] - measured[a]) / (b - a), 0.0)
            edge = b if below else a
            return max(measured[edge] + slope * (k - edge), 0.0)
        (n,) = known
        shape = lambda m: 1.0 + DRAFT_PRIOR_SLOPE * (m - 1)  # noqa: E731
        return measured[n] * shape(k) / shape(n)

    def round_s(self, k: int, source: str | None = None) -> float:
        """Expected seconds of a round drafting k tokens from ``source`` and verifying them:
        t_forward(k + 1) + t_draft(k) (:meth:`draft_time`)."""
        return self.forward_time(k + 1) + self.draft_time(k, source)

    def expected_rate(self, k: int, source: str | None = None) -> float:
        """Expected new tokens per second with draft length k from ``source``."""
        if 0 <= k <= self.max_k:
            return self.rates(source)[k]
        return self.expected_tokens(k, source) / self.round_s(k, source)

    def rates(self, source: str | None = None) -> list[float]:
        """Expected new tokens per second of every draft length k = 0..max_k from ``source``
        (E[tokens | k] / round_s(k), the module docstring's rule), in one pass over the
        positions; kept until the estimates change (the engine asks several times a round, and
        on a CPU step of ~10 ms a quadratic pass each time cost 2-3% of the decode)."""
        stats = self._source(source)
        key = (tuple(stats.acceptance), stats.draft_token_s, tuple(stats.draft_round_s.items()))
        cached = self._rates.get(source)
        if cached is not None and cached[0] == key:
            return cached[1]
        if not self._times:
            self._fill_times()
        times = self._times  # round_s(k), inlined
        out = [1.0 / times[1]]
        tokens, survive = 1.0, 1.0
        for k in range(1, self.max_k + 1):
            survive *= stats.acceptance[k - 1]
            tokens += survive
            out.append(tokens / (times[k + 1] + self.draft_time(k, source)))
        self._rates[source] = (key, out)
        return out

    @staticmethod
    def _argmax(rates: list[float]) -> int:
        """The index of the highest rate, the first (shortest draft) among equals."""
        best = 0
        for k in range(1, len(rates)):
            if rates[k] > rates[best]:
                best = k
        return best

    def tree_rate_bound(self, nodes: int, depth: int, source: str | None = None) -> float:
        """The most new tokens per second a draft tree of ``nodes`` nodes and ``depth`` levels
        could give: every level accepted (1 + depth tokens) for a forward nodes + 1 wide and
        ``depth`` drafting steps. Where even this loses to a plain step (a CPU, where a forward
        17 wide costs several one-token forwards), the tree is not worth a try
        (``core.tree.TreeOrChain``)."""
        return (1 + depth) / (self.forward_time(nodes + 1) + self.draft_time(depth, source))

    def best(self, source: str | None = None) -> tuple[int, float]:
        """The draft length with the best expected rate for ``source`` and that rate (tokens/s),
        k = 0 (a plain step) included; no side effects (``choose`` also probes)."""
        rates = self.rates(source)
        k = self._argmax(rates)
        return k, rates[k]

    def choose(self, source: str | None = None) -> int:
        self._probing = False
        if 1 not in self.forward_s:
            return 0  # measure a plain step first: the baseline every choice is compared with
        k, _ = self.best(source)  # ties go to the shorter draft, so k > 0 strictly beats plain
        if k > 0 and not any(self._source(source).seen):
            # a source never verified drafts first as a probe of the cheapest length: what
            # drafting and acceptance cost here is known only from the priors (on a 2-core
            # CPU the first draft of a learned head also feeds it the whole prompt)
            self._idle_rounds, self._probing = 0, True
            return self.probe_length()
        if k > 0:
            self._idle_rounds, self._probe_every = 0, 8
            return k
        self._idle_rounds += 1
        probe = self.probe_length()
        if self._idle_rounds >= self.probe_wait(probe, source):  # look again, then wait longer
            self._idle_rounds, self._probe_every = 0, min(self._probe_every * 2, 128)
            self._probing = True
            return probe
        return 0

    def probe_length(self) -> int:
        """The draft length of a probe: the cheapest forward to verify it (k >= 1)."""
        return min(range(1, self.max_k + 1), key=lambda k: self.forward_time(k + 1))

    def probe_wait(self, k: int, source: str | None = None) -> int:
        """Plain rounds between two probes of k tokens from ``source``: the back-off wait (8,
        doubled after each probe, up to 128; back to 8 after a probe accepted whole), and at least
        enough that the probe's expected loss against plain steps, round_s(k) -
        E[tokens | k] * t_forward(1), is at most ``PROBE_BUDGET`` of the plain steps waited."""
        step_s = self.forward_time(1)
        loss_s = max(self.round_s(k, source) - self.expected_tokens(k, source) * step_s, 0.0)
        return max(self._probe_every, math.ceil(loss_s / (PROBE_BUDGET * step_s)))

    def limit(self, n_proposed: int, source: str | None = None,
              confidence: list[float] | None = None) -> int:
        """How many of a proposal's tokens are worth verifying: a drafter may return fewer than
        asked (n-gram lookup), and a forward over that width may cost more than a wider or a
        plain one on this machine; verify the prefix with the best expected rate (0 = none).
        With ``confidence`` (the drafter's, per proposed token) this round's acceptance is
        estimated from it (:class:`Calibration`) and the drafting already done counts for every
        choice alike. A probe (``choose`` looking again while plain steps win) is verified whole:
        trimming it by the very figures it is there to refresh would leave them as they are for
        good."""
        if self._probing:
            return n_proposed
        if self.use_confidence and confidence is not None and len(confidence) >= n_proposed:
            return self._best_prefix(confidence[:n_proposed], self._source(source))[0]
        if n_proposed <= self.max_k:
            return self._argmax(self.rates(source)[:n_proposed + 1])
        return max(range(n_proposed + 1), key=lambda m: (self.expected_rate(m, source), -m))

    def _best_prefix(self, confidence: list[float], stats: _SourceStats) -> tuple[int, float]:
        """(m, rate): the prefix of a drafted proposal with the best expected tokens per second,
        its tokens' acceptance estimated from their confidence, all of it drafted already."""
        sunk = len(confidence) * stats.draft_token_s
        best_m, best_rate = 0, 1.0 / (sunk + self.forward_time(1))
        tokens, survive = 1.0, 1.0
        for m, c in enumerate(confidence, 1):
            survive *= stats.calibration(c)
            tokens += survive
            rate = tokens / (sunk + self.forward_time(m + 1))
            if rate > best_rate:
                best_m, best_rate = m, rate
        return best_m, best_rate

    def draft_budget(self, k: int, room: int) -> int:
        """The most tokens a drafter that stops early (``more``) may draft this round, when
        ``choose`` said k: up to ``max_k`` (within ``room``, the tokens still to generate),
        except on a probe or without ``use_confidence`` (then k)."""
        if self._probing or not self.use_confidence:
            return k
        return max(k, min(self.max_k, room))

    def more(self, confidence: list[float], k: int, source: str | None = None) -> bool:
        """Whether a drafter that has drafted ``len(confidence)`` tokens of at most ``k`` should
        draft another: True when some longer draft, its further tokens at the running
        per-position acceptance, is expected to beat verifying the best prefix of what is
        drafted (:meth:`limit`). Never stops a probe."""
        j = len(confidence)
        if j >= k:
            return False
        if not self.use_confidence:
            return True
        if self._probing:
            return True
        stats = self._source(source)
        _, stop_rate = self._best_prefix(confidence, stats)
        tokens, survive = 1.0, 1.0
        for c in confidence:
            survive *= stats.calibration(c)
            tokens += survive
        for n in range(j + 1, k + 1):
            survive *= stats.acceptance[n - 1] if n - 1 < len(stats.acceptance) else 0.0
            tokens += survive
            if tokens / (n * stats.draft_token_s + self.forward_time(n + 1)) > stop_rate:
                return True
        return False

    def update(self, n_forward_tokens: int, forward_s: float, n_drafted: int, n_accepted: int,
               draft_s: float, source: str | None = None, confidence: list[float] | None = None,
               n_proposed: int | None = None, backlog: bool = False) -> None:
        """Learn from one round.

        Args:
            n_forward_tokens: the width of the target forward (drafts verified + 1).
            forward_s: its seconds.  draft_s: the seconds drafting took.
            n_drafted: draft tokens verified.  n_accepted: of those, accepted.
            confidence: the drafter's confidence in the verified tokens, when it gives one.
            n_proposed: draft tokens drafted (>= n_drafted when ``limit`` trimmed the
                proposal; default n_drafted): what ``draft_s`` paid for.
            backlog: the source did not draft the round before (plain steps or another
                source's rounds came between), so ``draft_s`` also paid for feeding the drafter
                every position since (an EAGLE-3 head's catch-up; a source's first draft feeds
                it the whole prompt). Such a time is an upper bound of drafting's steady cost:
                it may lower the estimate, never raise it. Were it averaged in, a drafter
                drafting rarely would look dearer with every plain step between two of its
                drafts, and draft still more rarely (on a 2-core CPU a learned head's cost
                measured 1.7-7.3 ms a token where drafting every round measured 0.9-1.0 ms).
        """
        if self._probing and n_drafted and n_accepted == n_drafted:
            self._probe_every = 8  # a probe accepted whole: the text may have changed, look soon
        self._probing = False
        self.forward_s[n_forward_tokens] = self._avg(self.forward_s.get(n_forward_tokens), forward_s)
        self._times.clear()
        self._rates.clear()
        n_proposed = max(n_drafted, n_proposed or 0)
        stats = self._source(source)
        if n_proposed:
            per_token, known = draft_s / n_proposed, stats.draft_token_s or None
            stats.draft_token_s = (min(known, per_token) if backlog and known is not None
                                   else self._avg(known, per_token))
            round_s = stats.draft_round_s.get(n_proposed)
            if backlog:  # an upper bound: of this length's time, or of what the others predict
                bound = (round_s if round_s is not None
                         else self._draft_time(stats, n_proposed) if stats.draft_round_s else None)
                stats.draft_round_s[n_proposed] = draft_s if bound is None else min(bound, draft_s)
            else:
                stats.draft_round_s[n_proposed] = self._avg(round_s, draft_s)
            stats._draft_times = None
        if n_drafted:
            for j in range(min(n_drafted, n_accepted + 1)):
                self._observe(stats, j, j < n_accepted)
                if confidence is not None and j < len(confidence):
                    stats.calibration.observe(confidence[j], j < n_accepted)
            self._extend_unseen(stats)

    @staticmethod
    def _extend_unseen(stats: _SourceStats) -> None:
        """Give each position never verified yet the estimate of the deepest one verified before
        it, instead of the fixed prior: a drafter accepted 90% at position 1 is expected to do
        about as well at position 2 until position 2 is measured (were it left at the prior, a
        short draft chosen on the prior would never verify the deeper positions that could show
        a longer one pays); a drafter accepted 30% is not expected to do better deeper."""
        last = None
        for i, n in enumerate(stats.seen):
            if n:
                last = stats.acceptance[i]
            elif last is not None:
                stats.acceptance[i] = last


def measure_forward_s(kv, max_n: int, context: int = 64, repeats: int = 3,
                      clock=time.perf_counter) -> dict[int, float]:
    """Seconds of a target forward over n = 1..max_n new tokens after ``context`` tokens.

    On a CPU the cost is not monotonic in n (matrix-multiply kernels change with the row count;
    for SmolLM2-135M on 2 cores, 3 tokens took longer than 5), so the adaptive policy uses this
    table instead of a formula. Takes about repeats * max_n forwards; resets ``kv``'s cache.
    Keeps the fastest of the repeats per width: another process taking the CPU only adds time,
    and one disturbed forward must not make a width look cheap or dear for a whole run
    (``auto`` once drafted 16 tokens a round for a whole run after a one-token forward was timed
    at 1.9 s under load).

    Args:
        kv: the target (a ``kv.TargetKV``).
        clock: seconds counter; ``time.thread_time`` measures CPU work only (one thread), which
            a shared machine's other processes do not inflate.
    Returns:
        {n: seconds} for n = 1..max_n.
    """
    vocab = kv.model.get_input_embeddings().num_embeddings
    kv.reset()
    kv.forward([i % vocab for i in range(1, context + 1)])
    times: dict[int, list[float]] = {n: [] for n in range(1, max_n + 1)}
    for _ in range(repeats):
        for n in times:
            sync(kv.device)
            start = clock()
            kv.forward([1] * n, logits_to_keep=n)
            sync(kv.device)
            times[n].append(clock() - start)
            kv.rollback(context)
    kv.reset()
    return {n: min(v) for n, v in times.items()}


def confidence_requested() -> bool:
    """Whether the environment asks ``auto`` to weigh drafts by the drafter's confidence
    (``SPECDEMO_DRAFT_CONFIDENCE=1``, also on/true/yes; off by default)."""
    value = os.environ.get("SPECDEMO_DRAFT_CONFIDENCE", "0").strip().lower()
    return value in ("1", "on", "true", "yes")


def make_policy(draft_length: int | str, forward_s: dict[int, float] | None = None) -> DraftLengthPolicy:
    """``"auto"`` -> AdaptiveDraftLength (seeded with ``forward_s``; weighing drafts by the
    drafter's confidence only when the environment sets ``SPECDEMO_DRAFT_CONFIDENCE=1``: on a
    2-core Xeon it did not beat the running averages, docs/learned-drafters.md, "Weighing
    drafts by confidence"), an int k -> FixedDraftLength(k).

    Raises:
        ValueError: for anything else or k outside 1..64.
    """
    if draft_length == "auto":
        return AdaptiveDraftLength(forward_s=forward_s, use_confidence=confidence_requested())
    k = int(draft_length)
    if not 1 <= k <= 64:
        raise ValueError(f"draft length must be 1..64 or 'auto', got {draft_length!r}")
    return FixedDraftLength(k)
