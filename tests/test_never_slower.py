"""Draft length ``auto`` never makes speculative decoding slower than plain decoding, for every
kind of drafter: where verifying costs more than it can gain it drafts nothing (k = 0, a plain
step, with rare probes), where verifying is cheap it drafts. The target's forwards take time on a
fake clock (``tiny.TimedKV``), so the figures are the same however busy the machine is: nothing here
reads a real clock."""

import pytest

from specdemo.core import engine
from specdemo.core.drafters.base import Proposal
from specdemo.core.drafters.combined import CombinedDrafter
from specdemo.core.drafters.draft_model import ModelDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import DRAFT_PRIOR_SLOPE, PROBE_BUDGET, AdaptiveDraftLength
from tiny import CharTokenizer, FakeClock, TimedKV, tiny_llama

PROMPT = CharTokenizer().encode("speculative decoding, made visible")
STEP_S = 0.010  # a one-token forward on the fake clock
N = 96  # new tokens


def timed_kv(model, clock: FakeClock, extra: float) -> TimedKV:
    """A target whose forward over n tokens takes STEP_S * (1 + extra * (n - 1)) on ``clock``:
    ``extra`` is what each further token costs in one-token forwards."""
    return TimedKV(model, clock, lambda n: STEP_S * (1 + extra * (n - 1)))


class _Oracle:
    """A learned drafter stand-in that knows the target's greedy answer: it proposes it (or,
    while ``wrong(position)``, a token the target never picks there), at ``draft_s`` a token."""

    feature_layers = ()
    extra_memory_bytes = 0

    def __init__(self, answer: list[int], clock: FakeClock, draft_s: float = 0.001,
                 wrong=lambda position: False, name: str = "oracle", round_s: float = 0.0) -> None:
        self.answer, self.clock, self.draft_s, self.wrong, self.name = (answer, clock, draft_s,
                                                                         wrong, name)
        self.round_s = round_s  # a round's fixed part, whatever k (a head's set-up, a kernel launch)
        self.proposed = 0

    def propose(self, context, k, params, generator):
        self.clock.now += self.round_s + self.draft_s * k
        start = len(context) - len(PROMPT)
        ids = [t if not self.wrong(start + i) else (t + 1) % 32
               for i, t in enumerate(self.answer[start:start + k])]
        self.proposed += len(ids)
        return Proposal(ids, source=self.name)

    def feedback(self, n_accepted):
        pass


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=3, layers=2)


@pytest.fixture(scope="module")
def answer(target):
    return generate(KVModel(target), PROMPT, CharTokenizer(), max_new_tokens=N).token_ids


def drafter_of(kind: str, target, answer, clock, **kw):
    """A learned drafter (the oracle), prompt lookup stacked over it, or a draft model (the
    target itself: always right, its drafting free on the fake clock)."""
    if kind == "learned":
        return _Oracle(answer, clock, **kw)
    if kind == "stacked":  # prompt lookup stacked over the learned drafter
        return CombinedDrafter(_Oracle(answer, clock, **kw), name="oracle+ngram")
    return ModelDrafter(target, 32, name="self", shares_weights=True)  # a draft model


def race(target, answer, kind: str, extra: float, monkeypatch, **kw):
    """(plain, speculative) results with ``auto`` seeded with the fake forward costs."""
    clock = FakeClock()
    monkeypatch.setattr(engine, "time", clock)
    kv = timed_kv(target, clock, extra)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=N)
    policy = AdaptiveDraftLength(forward_s={n: kv.seconds(n) for n in range(1, 18)})
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=drafter_of(kind, target, answer, clock, **kw),
                    policy=policy, max_new_tokens=N)
    assert spec.token_ids == plain.token_ids == answer
    return plain.stats, spec.stats


@pytest.mark.parametrize("kind,wrong", [("learned", False), ("learned", True),
                                        ("stacked", False), ("stacked", True),
                                        ("draft model", False)])
def test_no_drafting_where_verification_costs_more_than_it_can_gain(target, answer, kind, wrong,
                                                                    monkeypatch):
    """Each further token in a forward costs 1.2 one-token forwards: no draft pays, not even one
    that is always accepted (k + 1 tokens for 1 + 1.2 k steps). Drafting drops to zero but for
    probes, and the speculative lane costs at most the probes' budget more than plain, also when
    every probe is refused (``wrong``: before, probes after 8, 16, 32 and 64 plain steps cost it
    4% here)."""
    plain, spec = race(target, answer, kind, 1.2, monkeypatch,
                       **({"wrong": lambda position: True} if wrong else {}))
    probes = spec.position_drafted[0] if spec.position_drafted else 0  # rounds that drafted
    assert probes <= 4, (probes, spec.draft_length_sum)  # back-off: rounds 8+, 16+, 32+, 64+
    assert spec.draft_length_max <= 1  # a probe is the cheapest draft: one token
    plain_s = plain.elapsed_s - plain.prefill_s
    spec_s = spec.elapsed_s - spec.prefill_s
    assert spec_s <= plain_s * (1 + 2 * PROBE_BUDGET), (spec_s, plain_s)


@pytest.mark.parametrize("kind", ["learned", "stacked", "draft model"])
def test_drafting_where_verification_is_cheap(target, answer, kind, monkeypatch):
    """A forward over any width costs one step (a GPU): the always-right drafter drafts long."""
    plain, spec = race(target, answer, kind, 0.0, monkeypatch)
    assert spec.mean_draft_length > 4 and spec.target_forwards < plain.target_forwards / 4
    assert spec.elapsed_s - spec.prefill_s < (plain.elapsed_s - plain.prefill_s) / 2


def test_drafting_comes_back_when_the_drafter_becomes_right_again(target, answer, monkeypatch):
    """Wrong for the first 24 tokens, right afterwards; a further token costs 0.3 steps. Auto
    stops drafting while it is wrong, probes, and drafts again once probes are accepted."""
    plain, spec = race(target, answer, "learned", 0.3, monkeypatch,
                       wrong=lambda position: position < 24)
    per_position = spec.per_position_acceptance
    assert spec.draft_length_max >= 2 and spec.accepted >= 30, (spec.accepted, per_position)
    assert spec.elapsed_s - spec.prefill_s < plain.elapsed_s - plain.prefill_s


def test_probes_are_spaced_by_their_expected_loss():
    """A probe that costs a step more than it is expected to gain waits 1 / PROBE_BUDGET plain
    steps; where a wider forward costs the same as a one-token one, the back-off's 8."""
    dear = AdaptiveDraftLength(forward_s={1: 1.0, 2: 2.0})
    for _ in range(20):  # nothing accepted: the expected tokens of a probe fall towards 1
        dear.update(2, 2.0, 1, 0, 0.0)
    assert dear.best()[0] == 0
    loss = dear.round_s(1) - dear.expected_tokens(1) * 1.0
    assert loss == pytest.approx(1.0, abs=0.05)
    assert dear.probe_wait(1) == pytest.approx(loss / PROBE_BUDGET, abs=1)
    flat = AdaptiveDraftLength(forward_s={n: 1.0 for n in range(1, 18)})
    for _ in range(20):
        flat.update(2, 1.0, 1, 0, 0.0)
    assert flat.probe_wait(1) == 8


def test_unverified_positions_follow_the_deepest_measured_one():
    """A further token costs 0.3 steps. A drafter accepted at every verified position, verified
    only one token deep so far: positions 2.. are expected to do as well (not the prior 0.6), so
    auto tries a long draft and measures it; one accepted 20% of the time is not expected to do
    better deeper. A position measured keeps its own figure."""
    costs = {n: 1.0 + 0.3 * (n - 1) for n in range(1, 18)}
    good = AdaptiveDraftLength(forward_s=costs)
    assert good.best()[0] <= 3  # on the prior alone
    for _ in range(20):
        good.update(2, costs[2], 1, 1, 0.0)
    assert good.acceptance[1] == good.acceptance[0] > 0.9
    assert good.best()[0] >= 6
    poor = AdaptiveDraftLength(forward_s=costs)
    for i in range(20):
        poor.update(2, costs[2], 1, int(i % 5 == 0), 0.0)
    assert poor.acceptance[1] == poor.acceptance[0] < 0.5 and poor.best()[0] <= 1
    good.update(3, costs[3], 2, 1, 0.0)  # position 2 verified once, rejected
    assert good.acceptance[1] < 0.9 and good.acceptance[2] == good.acceptance[1]


# -- why a race won or lost (stats.explain): figures from a known cost table -------------------

from specdemo.core.policy import FixedDraftLength  # noqa: E402
from specdemo.core.stats import explain  # noqa: E402


@pytest.mark.parametrize("wrong", [False, True])
def test_explanation_figures_from_a_known_cost_table(target, answer, wrong, monkeypatch):
    """Forced k = 4 where each further token costs half a step and drafting 0.1 step a token:
    verifying costs 1 + 4 * 0.5 = 3 steps, drafting 0.4, so a round must yield 3.4 tokens to
    break even; the always-right drafter yields 5 (95 tokens in 19 rounds), and where verifying
    costs one step the same acceptance would give 5 / 1.4. The always-wrong one yields 1 a
    round (its last rounds draft fewer than 4: fewer tokens are left to generate)."""
    from specdemo.interfaces.ui_format import explanation_text
    from specdemo.services.pipeline import Comparison
    clock = FakeClock()
    monkeypatch.setattr(engine, "time", clock)
    kv = timed_kv(target, clock, 0.5)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=N)
    oracle = _Oracle(answer, clock, draft_s=0.1 * STEP_S,
                     **({"wrong": lambda position: True} if wrong else {}))
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=oracle, policy=FixedDraftLength(4),
                    max_new_tokens=N)
    e = explain(plain.stats, spec.stats)
    k = e.mean_draft_length
    assert k == (4 if not wrong else pytest.approx((4 * 91 + 3 + 2 + 1 + 0) / 95))
    tokens = 5.0 if not wrong else 1.0
    assert e.step_s == pytest.approx(STEP_S)
    assert e.verify_cost_steps == pytest.approx(1 + 0.5 * k)
    assert e.draft_cost_steps == pytest.approx(0.1 * k)
    assert e.break_even_mean_acceptance_length == pytest.approx(1 + 0.6 * k)
    assert e.mean_acceptance_length == pytest.approx(tokens)
    assert e.modelled_speedup == pytest.approx(tokens / (1 + 0.6 * k))
    assert e.projected_speedup_free_verification == pytest.approx(tokens / (1 + 0.1 * k))
    figures = Comparison(plain, spec).as_dict()["explanation"]  # compare --json
    assert figures["break_even_mean_acceptance_length"] == pytest.approx(1 + 0.6 * k)
    assert figures["projected_speedup_free_verification"] == pytest.approx(tokens / (1 + 0.1 * k))
    if not wrong:
        line = explanation_text(e)
        assert line == ("Verifying 4.0 draft tokens a round on average cost 3.00 one-token "
                        "steps here and drafting them 0.40, so breaking even takes a mean acceptance length of 3.40; this run "
                        "got 5.00. Projection, not measured: where verifying costs one step (a "
                        "GPU, Apple silicon), the same acceptance would give 3.57× "
                        "(5.00 / (1 + 0.40)).")
        assert explanation_text(e, times="x").endswith("would give 3.57x (5.00 / (1 + 0.40)).")


def test_explanation_of_a_race_that_drafted_nothing(target, answer, monkeypatch):
    """Auto where nothing can pay: the line says so instead of a break-even."""
    from specdemo.interfaces.ui_format import explanation_text
    plain, spec = race(target, answer, "learned", 1.2, monkeypatch,
                       wrong=lambda position: True)
    spec.drafted = spec.draft_length_sum = 0  # the probe left out: a run without drafts
    e = explain(plain, spec)
    assert e.mean_draft_length == 0 and e.mean_acceptance_length == 1.0
    line = explanation_text(e)
    assert line.startswith("No draft tokens were verified (the drafter proposed none, e.g. "
                           "prompt lookup finding no match, or auto judged that none would save "
                           "time here), so every round was a plain one-token step, costing ")
    assert "expected to pay" not in line and "drafts a round" not in line
    assert explain(plain, None) is None and explain(type(plain)(), spec) is None


def test_the_page_and_race_json_carry_the_explanation_once_both_lanes_finished():
    """The line sits under the speedup on the page and its figures in ``/race``'s JSON (and in
    ``compare`` with a server lane), from the same ``stats.explain``; not while racing."""
    from test_race import SETTINGS, FakeLoaded, lanes
    from specdemo.interfaces.ui_format import explanation_text, verdict_html
    from specdemo.services.race import Race, snapshot_dict
    race = Race(lanes(FakeLoaded(tiny_llama(seed=0, layers=3))), SETTINGS)
    snaps = list(race.run(min_interval_s=0.0))
    final = snaps[-1]
    e = final.explanation
    plain, spec = final.panes["plain"].stats, final.panes["speculative"].stats
    assert e == explain(plain, spec) and 0 < e.mean_draft_length <= 4  # self-drafting, k = 4
    assert all(s.explanation is None for s in snaps[:-1])
    page = verdict_html(final, 0.0)
    assert 'class="sd-explain"' in page and "Projection, not measured" in page
    assert explanation_text(e).split(";")[0] in page
    assert snapshot_dict(final)["explanation"] == e.as_dict()
    assert "sd-explain" not in verdict_html(snaps[-2], 0.0)


def test_first_draft_of_a_source_is_a_probe_of_the_cheapest_length():
    """Before a source was ever verified its figures are priors: its first draft is the
    cheapest probe (verified whole), not the prior's best k; once measured, the best k."""
    cheap = AdaptiveDraftLength(forward_s={n: 1.0 for n in range(1, 18)})
    assert cheap.best("learned")[0] > 1  # the prior alone would draft long here
    assert cheap.choose("learned") == 1 and cheap.limit(1, "learned") == 1  # a probe, verified
    cheap.update(2, 1.0, 1, 1, 0.0, "learned")  # accepted
    assert cheap.choose("learned") == cheap.best("learned")[0] > 1
    assert cheap.choose("lookup") == 1  # each source starts with its own probe


def test_expected_rates_match_the_formula_and_follow_updates():
    """``rates`` (one pass, kept until an update) equals E[tokens | k] / round_s(k) for every k,
    and ``best`` / ``limit`` pick the highest rate, the shortest draft among equals."""
    policy = AdaptiveDraftLength(max_k=8, forward_s={1: 1.0, 2: 1.3, 3: 1.5, 5: 2.4, 9: 4.0})
    for accepted in (2, 0, 1, 3):
        policy.update(accepted + 2, 1.5, accepted + 1, accepted, 0.01, "learned")
        rates = policy.rates("learned")
        formula = [policy.expected_tokens(k, "learned") / policy.round_s(k, "learned")
                   for k in range(9)]
        assert rates == pytest.approx(formula, rel=1e-12)
        best = max(range(9), key=lambda k: (formula[k], -k))
        assert policy.best("learned") == (best, pytest.approx(formula[best]))
        assert policy.limit(3, "learned") == max(range(4), key=lambda k: (formula[k], -k))


def test_drafting_cost_is_measured_per_draft_length():
    """``draft_time(k)``: a length measured is its running average; between two, interpolated;
    beyond them, the slope of the nearest two; with one measured, the prior shape
    1 + DRAFT_PRIOR_SLOPE (k - 1); never less than a shorter length's."""
    policy = AdaptiveDraftLength(max_k=8, forward_s={n: 0.010 for n in range(1, 10)})
    assert policy.draft_time(3, "learned") == 0.0  # nothing measured: free, as the prior
    policy.update(2, 0.010, 1, 1, 0.007, "learned")  # 7 ms for one token
    shape = [1 + DRAFT_PRIOR_SLOPE * (k - 1) for k in range(1, 9)]
    assert [policy.draft_time(k, "learned") for k in range(1, 9)] == pytest.approx(
        [0.007 * s for s in shape])
    policy.update(5, 0.010, 4, 4, 0.010, "learned")  # 10 ms for four: 6 ms + 1 ms a token
    assert [policy.draft_time(k, "learned") for k in range(1, 9)] == pytest.approx(
        [0.006 + 0.001 * k for k in range(1, 9)])
    policy.update(3, 0.010, 2, 2, 0.020, "learned")  # a disturbed round at k = 2: 20 ms
    times = [policy.draft_time(k, "learned") for k in range(1, 9)]
    assert times == sorted(times) and times[2] >= times[1] > 0.010  # never cheaper for more


def test_a_round_with_a_fixed_part_still_drafts_long(target, answer, monkeypatch):
    """A drafter whose round costs 5 ms whatever k plus 0.5 ms a token, on a target whose further
    tokens cost 0.2 steps (10 ms a step): k always-right tokens take 15 + 2.5 k ms for k + 1
    tokens, so long drafts pay (17 tokens in 55 ms against 5.5 plain steps). Its first one-token
    round (5.5 ms) read as a per-token cost says a 16-token draft costs 130 ms, barely better than
    plain; measured per length, auto drafts long (a per-token model here: 3.5 tokens a round on
    average, 0.49 of plain decoding's time; per length: 8.5, 0.38)."""
    plain, spec = race(target, answer, "learned", 0.2, monkeypatch, draft_s=0.0005, round_s=0.005)
    assert spec.mean_draft_length > 6, spec.mean_draft_length
    assert spec.elapsed_s - spec.prefill_s < 0.45 * (plain.elapsed_s - plain.prefill_s)


def test_a_backlog_round_can_lower_the_drafting_cost_but_never_raise_it():
    """A source drafting after other rounds first feeds its drafter every position since (an
    EAGLE-3 head's catch-up): that time bounds drafting's cost from above. It may lower the
    estimate; it never raises it, so a drafter drafting rarely does not look dearer with every
    plain step between its drafts. Rounds after a draft of the same source average as before."""
    policy = AdaptiveDraftLength(forward_s={n: 0.020 for n in range(1, 18)})
    policy.update(3, 0.020, 2, 2, 0.010, "learned", backlog=True)  # nothing known: taken (5 ms)
    assert policy.sources["learned"].draft_token_s == pytest.approx(0.005)
    for _ in range(5):  # long catch-ups: 20 ms a token
        policy.update(3, 0.020, 2, 2, 0.040, "learned", backlog=True)
    assert policy.sources["learned"].draft_token_s == pytest.approx(0.005)
    policy.update(3, 0.020, 2, 2, 0.004, "learned", backlog=True)  # a short one: 2 ms
    assert policy.sources["learned"].draft_token_s == pytest.approx(0.002)
    for _ in range(40):  # drafting every round at 3 ms a token: the average follows, up too
        policy.update(3, 0.020, 2, 2, 0.006, "learned")
    assert policy.sources["learned"].draft_token_s == pytest.approx(0.003, rel=1e-3)


class _Feeding(_Oracle):
    """The oracle as an EAGLE-3 head is fed: it reads target features (``observe``), and a
    draft first feeds it every position observed since its last one at ``row_s`` a position;
    ``prime`` (``base.Primes``) feeds them at once."""

    feature_layers = (1,)

    def __init__(self, *args, row_s: float = 0.002, **kw) -> None:
        super().__init__(*args, **kw)
        self.row_s, self.pending, self.primed = row_s, 0, 0

    def observe(self, features):
        self.pending += features.shape[0]

    def _feed(self):
        self.clock.now += self.row_s * self.pending
        self.pending = 0

    def prime(self, context):
        self.primed += 1
        self._feed()

    def propose(self, context, k, params, generator):
        self._feed()
        return super().propose(context, k, params, generator)


def test_the_prompt_is_fed_to_the_drafter_outside_its_first_draft(target, answer, monkeypatch):
    """A drafter that primes is fed the prompt once, after the first token, on the drafting
    clock; its first draft then costs what a later one does, and ``auto`` drafts as the steady
    cost says (a further token costs 0.3 steps, the drafter is always right). Fed in its first
    draft instead, the 35 prompt positions cost 70 ms, seven plain steps, for one token: taken
    for what drafting costs a token, that kept ``auto`` from drafting for the rest of this run
    (mean draft length 0.01)."""
    clock = FakeClock()
    monkeypatch.setattr(engine, "time", clock)
    kv = timed_kv(target, clock, 0.3)
    plain = generate(kv, PROMPT, CharTokenizer(), max_new_tokens=N).stats
    drafter = _Feeding(answer, clock)
    policy = AdaptiveDraftLength(forward_s={n: kv.seconds(n) for n in range(1, 18)})
    spec = generate(kv, PROMPT, CharTokenizer(), drafter=drafter, policy=policy,
                    max_new_tokens=N).stats
    assert drafter.primed == 1
    assert spec.draft_s >= drafter.row_s * len(PROMPT)  # the prompt's feed is drafting time
    assert spec.mean_draft_length > 2, spec.mean_draft_length
    assert spec.elapsed_s - spec.prefill_s < 0.8 * (plain.elapsed_s - plain.prefill_s)
