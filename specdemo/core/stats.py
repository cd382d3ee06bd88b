"""Decode statistics: one dataclass, computed in the engine, formatted elsewhere.

Metric names and definitions follow ``docs/design.md`` ("Metric names"). Every ratio is guarded: a run
with nothing to divide by reports ``None`` (JSON ``null``), never NaN and never an exception.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


def ratio(numerator: float, denominator: float) -> float | None:
    """``numerator / denominator``, or ``None`` when the denominator is zero or negative."""
    return numerator / denominator if denominator > 0 else None


def count_positions(position_drafted: list[int], position_accepted: list[int], n_drafted: int,
                    n_accepted: int) -> None:
    """Add one verification round to per-position counters (lists grown in place).

    Position i is verified only if positions 1..i-1 were accepted: a rejection ends the round.
    """
    missing = n_drafted - len(position_drafted)
    if missing > 0:
        position_drafted.extend([0] * missing)
        position_accepted.extend([0] * missing)
    for i in range(min(n_drafted, n_accepted + 1)):
        position_drafted[i] += 1
        if i < n_accepted:
            position_accepted[i] += 1


@dataclass
class DecodeStats:
    """Counters of one decode (plain or speculative). Times are seconds of wall clock.

    The raw counters are filled by the engine while it decodes; the derived metrics are
    properties, so a snapshot is always self-consistent.

    Attributes:
        new_tokens: tokens generated, prompt excluded.
        prompt_tokens: tokens in the prompt (prefill length).
        ttft_s: seconds from request to first new token (prefill included); None before it.
        elapsed_s: seconds from request to the last new token.
        target_forwards: target forward passes after prefill.
        drafted: draft tokens proposed and verified.
        accepted: draft tokens accepted.
        draft_s: seconds spent drafting.
        verify_s: seconds spent in target forwards after prefill (verification, or plain steps).
        prefill_s: seconds spent in the prefill forward.
        position_drafted: ``position_drafted[i]`` = rounds in which draft position i+1 was verified.
        position_accepted: ``position_accepted[i]`` = rounds in which draft position i+1 was accepted.
        draft_length: draft tokens verified in the latest round only (0 for plain decoding,
            and with ``auto`` 0 in a round that drafted nothing); not the setting, and not a
            summary of the run: see ``mean_draft_length`` and ``draft_length_min``/``_max``.
        drafted_by, accepted_by: drafted / accepted tokens per drafter that proposed them (a
            combined drafter has several; keys are the proposals' sources).
        rounds: verification rounds (target forwards after prefill) recorded so far.
        draft_length_sum, draft_length_min, draft_length_max: sum, smallest and largest number
            of draft tokens verified in a round, over every round (plain rounds count as 0);
            min/max are None before the first round. With ``auto`` the last round's
            ``draft_length`` can be 0 although the run drafted; these describe the whole run.
        extra_memory_bytes: bytes the drafter adds (its weights not shared with the target + its
            KV cache); 0 for plain decoding and for the n-gram drafter.
        other_cpu_share: CPU time other processes took during this decode (request to last
            token) as a share of all cores' time, 0..1 (``machine.OtherCpuUse``); set on the
            final event, None before it and for decodes shorter than ``machine.MIN_MEASURED_S``.
            Above ``machine.BUSY_SHARE`` the decode's times are not this machine's.
        finish_reason: "eos", "stop", "length", "cancelled" or None while running.
        engine: None for our engine; for a lane served by an OpenAI-compatible server, which
            engine reported these counters (``"llama.cpp"``, ``"vllm"``, ``"sglang"``,
            ``"lmstudio"`` or ``"openai-compatible"``; see :mod:`specdemo.services.endpoints`).
        served_model: for a server lane, the model the server says it serves (llama-server's
            ``/props`` model file name, else the stream's ``model`` field, else the
            ``/v1/models`` id requested); None for our engine. Two lanes whose servers name
            different models are not compared (``services.race``).
        not_reported: names of the counters above that the engine does not report; each is
            None (never estimated) and is shown as "not reported by this engine". Empty for
            our engine.
        tree: the draft tree's shape when the run was asked to verify draft trees
            (``core.tree``), or ``"not used: <why>"`` when it could not here; None when not
            asked. A tree round verifies all its nodes (``drafted``) and accepts one branch
            (``accepted``); per-position counters count depths.
        tree_rounds: rounds that verified a draft tree (the others were chains).
        drafter: the name of the drafter this decode had (whether or not it proposed), None
            for plain decoding and for a server lane.
    """

    new_tokens: int = 0
    prompt_tokens: int = 0
    ttft_s: float | None = None
    elapsed_s: float = 0.0
    target_forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    draft_length: int = 0
    drafted_by: dict[str, int] = field(default_factory=dict)
    accepted_by: dict[str, int] = field(default_factory=dict)
    rounds: int = 0
    draft_length_sum: int = 0
    draft_length_min: int | None = None
    draft_length_max: int | None = None
    extra_memory_bytes: int = 0
    other_cpu_share: float | None = None
    finish_reason: str | None = None
    engine: str | None = None
    served_model: str | None = None
    not_reported: list[str] = field(default_factory=list)
    tree: str | None = None
    tree_rounds: int = 0
    drafter: str | None = None

    # --- derived metrics (docs/design.md names) -------------------------------------------------
    @property
    def tokens_per_s(self) -> float | None:
        """new_tokens / seconds from request to last token."""
        return ratio(self.new_tokens, self.elapsed_s) if self.new_tokens else None

    @property
    def decode_tokens_per_s(self) -> float | None:
        """(new_tokens - 1) / seconds from first to last token."""
        if self.ttft_s is None or self.new_tokens < 2:
            return None
        return ratio(self.new_tokens - 1, self.elapsed_s - self.ttft_s)

    @property
    def acceptance_rate(self) -> float | None:
        """accepted / drafted (llama.cpp's "draft acceptance rate"); None when either is not
        reported."""
        if self.accepted is None or self.drafted is None:
            return None
        return ratio(self.accepted, self.drafted)

    @property
    def mean_acceptance_length(self) -> float | None:
        """New tokens per target forward after prefill (vLLM's definition, bonus token counted).

        The first token comes from prefill, so it is excluded: (new_tokens - 1) / target_forwards.
        None for a run without speculation (nothing drafted), and when the engine does not
        report its target forwards (a server lane whose engine reports drafted/accepted only).
        """
        if self.drafted == 0 or self.target_forwards is None:
            return None
        return ratio(self.new_tokens - 1, self.target_forwards)

    @property
    def mean_draft_length(self) -> float | None:
        """Draft tokens verified per round, averaged over the run's rounds; None before a round
        or when not reported."""
        if self.draft_length_sum is None or self.rounds is None:
            return None
        return ratio(self.draft_length_sum, self.rounds)

    @property
    def per_position_acceptance(self) -> list[float | None]:
        """For i = 1..k: P(draft token i accepted | tokens 1..i-1 were); [] when not reported."""
        if self.position_accepted is None or self.position_drafted is None:
            return []
        return [ratio(a, d) for a, d in zip(self.position_accepted, self.position_drafted)]

    # --- recording ---------------------------------------------------------------------------
    def record_round(self, n_drafted: int, n_accepted: int, n_emitted: int | None = None,
                     source: str | None = None) -> None:
        """Record one verification round: ``n_drafted`` proposed (by ``source``), the first
        ``n_accepted`` kept.

        Args:
            n_drafted: draft tokens verified this round (the draft length used).
            n_accepted: how many of them verification accepted.
            n_emitted: tokens of the round that were emitted: the accepted drafts then the
                correction/bonus token, cut at a stop point (EOS, stop string, max_new_tokens);
                None means all ``n_accepted + 1``. When the cut falls inside the accepted drafts
                (``n_emitted <= n_accepted``), the drafts after it were never refused, only not
                needed: the round counts ``n_emitted`` drafted, all accepted (also per position),
                and ``n_emitted`` verified (its draft length), so that ``mean_draft_length``
                and ``acceptance_rate`` count the same tokens.
            source: the drafter that proposed them (counted in ``drafted_by``/``accepted_by``).
        """
        counted_drafted, counted_accepted = n_drafted, n_accepted
        if n_emitted is not None and n_emitted <= n_accepted:
            counted_drafted = counted_accepted = n_emitted
        self._record(counted_drafted, counted_accepted, counted_drafted, source)

    def record_tree_round(self, n_nodes: int, depth: int, n_accepted: int,
                          n_emitted: int | None = None, source: str | None = None) -> None:
        """Record one draft-tree round: ``n_nodes`` verified, a branch of ``n_accepted`` kept
        (``depth``: the tree's longest branch, for the per-depth counters). ``n_emitted`` as
        :meth:`record_round`: a stop point inside the branch counts only the tokens before it,
        as drafted and as verified."""
        drafted, accepted, deep = n_nodes, n_accepted, depth
        if n_emitted is not None and n_emitted <= n_accepted:
            drafted = accepted = deep = n_emitted
        self.tree_rounds += 1
        self._record(drafted, accepted, deep, source)

    def _record(self, drafted: int, accepted: int, positions: int, source: str | None) -> None:
        """A round's counters: ``drafted`` draft tokens verified (its draft length) and
        ``accepted``, both counted after a stop point's cut, the per-position counters over
        ``positions`` positions."""
        verified = drafted
        self.drafted += drafted
        self.accepted += accepted
        if source and drafted:
            self.drafted_by[source] = self.drafted_by.get(source, 0) + drafted
            self.accepted_by[source] = self.accepted_by.get(source, 0) + accepted
        self.target_forwards += 1
        self.draft_length = verified
        self.rounds += 1
        self.draft_length_sum += verified
        self.draft_length_min = verified if self.draft_length_min is None else min(
            self.draft_length_min, verified)
        self.draft_length_max = max(self.draft_length_max or 0, verified)
        count_positions(self.position_drafted, self.position_accepted, positions, accepted)

    def as_dict(self) -> dict:
        """All raw counters and derived metrics, JSON-ready (None stays None)."""
        out = asdict(self)
        for name in ("tokens_per_s", "decode_tokens_per_s", "acceptance_rate",
                     "mean_acceptance_length", "per_position_acceptance", "mean_draft_length"):
            out[name] = getattr(self, name)
        if "position_accepted" in self.not_reported:  # not reported is null, not an empty list
            out["per_position_acceptance"] = None
        return out

    def copy(self) -> "DecodeStats":
        """An independent snapshot (lists and dicts copied; they hold only numbers and names).
        Called twice a round: ``dataclasses.asdict``'s deep copy took 0.28 ms here, 5% of a
        one-token forward of the built-in target on a 2-core Xeon."""
        values = {name: getattr(self, name) for name in _FIELDS}
        for name in _CONTAINERS:  # None where a server lane does not report them
            if values[name] is not None:
                values[name] = values[name].copy()
        return DecodeStats(**values)


_FIELDS = tuple(f.name for f in fields(DecodeStats))
_CONTAINERS = tuple(f.name for f in fields(DecodeStats)
                    if f.default_factory in (list, dict))  # type: ignore[comparison-overlap]


def speedup(plain: DecodeStats, speculative: DecodeStats) -> float | None:
    """tokens_per_s(speculative) / tokens_per_s(plain); None when either is unknown."""
    if plain.tokens_per_s is None or speculative.tokens_per_s is None:
        return None
    return ratio(speculative.tokens_per_s, plain.tokens_per_s)


@dataclass(frozen=True)
class RaceExplanation:
    """Why a race's speedup is what it is, from the two lanes' own measurements.

    Costs are in one-token steps: seconds divided by ``step_s``, the plain lane's mean seconds
    per target forward (one new token each; same target, backend and prompt). A speculative
    round costs ``verify_cost_steps + draft_cost_steps`` steps and yields
    ``mean_acceptance_length`` tokens, a plain round one token for one step, so

        speedup ~= mean_acceptance_length / (verify_cost_steps + draft_cost_steps)

    (prefill and per-round bookkeeping left out: ``modelled_speedup`` against the measured
    ``speedup``). Break-even is a mean acceptance length equal to the round's cost. The
    projection keeps this run's acceptance and drafting cost and sets verification to one step,
    as where the target's forward costs the same for k + 1 tokens as for one (memory-bound: a
    GPU, Apple silicon): ``mean_acceptance_length / (min(1, verify_cost_steps) +
    draft_cost_steps)`` (a run whose verification measured under a step, against a plain lane
    slowed by a disturbance or a colder cache, is its own projection). It is a
    projection, not a measurement: there ``auto`` would also choose longer drafts, and drafting
    may cost a different share of a step (docs/reference.md, "Why a race won or lost").

    Attributes:
        step_s: seconds of a one-token target forward, the plain lane's mean.
        mean_draft_length: draft tokens verified per speculative round (0 for a plain step).
        verify_cost_steps: the speculative lane's target forward (1 + mean_draft_length tokens
            on average, verification included), in steps.
        draft_cost_steps: its drafting per round (lookups, draft-model or head steps, the
            draft-length rule), in steps.
        break_even_mean_acceptance_length: verify_cost_steps + draft_cost_steps.
        mean_acceptance_length: new tokens per speculative round, (new_tokens - 1) /
            target_forwards (1.0 when nothing was drafted).
        modelled_speedup: mean_acceptance_length / break_even_mean_acceptance_length.
        projected_speedup_free_verification: mean_acceptance_length / (min(1,
            verify_cost_steps) + draft_cost_steps).
        has_drafter: whether the speculative lane had a drafter (``--draft none``: no).
    """

    step_s: float
    mean_draft_length: float
    verify_cost_steps: float
    draft_cost_steps: float
    break_even_mean_acceptance_length: float
    mean_acceptance_length: float
    modelled_speedup: float
    projected_speedup_free_verification: float
    has_drafter: bool = True

    def as_dict(self) -> dict:
        return asdict(self)


def explain(plain: DecodeStats | None, speculative: DecodeStats | None) -> RaceExplanation | None:
    """The :class:`RaceExplanation` of a race, or None where a lane has no decode forward
    (one token or fewer) or does not report its times and forwards (a server lane)."""
    if plain is None or speculative is None:
        return None
    counters = (plain.verify_s, plain.target_forwards, speculative.verify_s,
                speculative.draft_s, speculative.target_forwards, speculative.draft_length_sum)
    if any(c is None for c in counters) or not plain.target_forwards or plain.verify_s <= 0:
        return None
    rounds = speculative.target_forwards
    if not rounds:
        return None
    step_s = plain.verify_s / plain.target_forwards
    verify = speculative.verify_s / rounds / step_s
    draft = speculative.draft_s / rounds / step_s
    if verify + draft <= 0:
        return None
    tokens = (speculative.new_tokens - 1) / rounds
    return RaceExplanation(step_s=step_s, mean_draft_length=speculative.draft_length_sum / rounds,
                           verify_cost_steps=verify, draft_cost_steps=draft,
                           break_even_mean_acceptance_length=verify + draft,
                           mean_acceptance_length=tokens, modelled_speedup=tokens / (verify + draft),
                           projected_speedup_free_verification=tokens / (min(1.0, verify) + draft),
                           has_drafter=speculative.drafter is not None)
