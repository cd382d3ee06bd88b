"""Adaptive draft length and the n-gram drafter."""

import pytest

from specdemo.core.drafters import NgramDrafter, early_exit_view
from specdemo.core.policy import AdaptiveDraftLength, FixedDraftLength, make_policy
from specdemo.core.sampling import SamplingParams
from tiny import tiny_llama

CPU_COSTS = {1: 0.055, 2: 0.086, 3: 0.105, 4: 0.079, 5: 0.071, 6: 0.077, 7: 0.094, 8: 0.074, 9: 0.081}
FLAT = {n: 0.020 for n in range(1, 18)}


def feed(policy, rounds, accepted_of):
    for _ in range(rounds):
        k = policy.choose()
        n_acc = accepted_of(k)
        policy.update(k + 1, policy.forward_time(k + 1), k, n_acc, 0.0)


def test_no_speculation_when_nothing_is_accepted():
    policy = AdaptiveDraftLength(forward_s=CPU_COSTS)
    feed(policy, 20, lambda k: 0)
    assert policy.choose() == 0
    ks = [policy.choose() for _ in range(64)]
    assert ks.count(0) >= 56  # only occasional probes, backing off


def test_long_drafts_when_everything_is_accepted_and_forwards_are_flat():
    policy = AdaptiveDraftLength(forward_s=FLAT)
    feed(policy, 20, lambda k: k)
    assert policy.choose() == policy.max_k


def test_avoids_widths_that_are_slow_on_this_machine():
    """With the measured CPU table, 3 tokens cost more than 5: k=2 is never chosen over k=4."""
    policy = AdaptiveDraftLength(forward_s=CPU_COSTS)
    feed(policy, 20, lambda k: k)
    assert policy.choose() not in (1, 2)
    assert policy.expected_rate(4) > policy.expected_rate(2)


def test_first_round_is_plain_without_measurements():
    assert AdaptiveDraftLength().choose() == 0


def test_make_policy():
    assert isinstance(make_policy("auto"), AdaptiveDraftLength)
    assert make_policy(3).choose() == 3
    with pytest.raises(ValueError):
        make_policy(0)
    with pytest.raises(ValueError):
        FixedDraftLength(0)


GREEDY = SamplingParams()


def test_ngram_proposes_the_continuation():
    d = NgramDrafter()
    context = [5, 6, 7, 8, 9, 1, 5, 6]
    assert d.propose(context, 3, GREEDY, None).ids == [7, 8, 9]
    assert d.propose(context + [7], 2, GREEDY, None).ids == [8, 9]  # incremental index


def test_ngram_nothing_without_a_match():
    d = NgramDrafter()
    assert d.propose([1, 2, 3, 4], 4, GREEDY, None).ids == []
    assert NgramDrafter(min_ngram=2).propose([1, 2, 3, 1], 4, GREEDY, None).ids == []
    assert NgramDrafter(min_ngram=1).propose([1, 2, 3, 1], 4, GREEDY, None).ids == [2, 3, 1]


def test_ngram_prefers_a_match_with_a_full_continuation():
    d = NgramDrafter()
    # (1, 2) occurs at 0 and 4; the latest leaves only 2 tokens before the end, the first gives 3.
    assert d.propose([1, 2, 3, 4, 1, 2, 1, 2], 3, GREEDY, None).ids == [3, 4, 1]
    # The latest occurrence wins when it can supply k tokens.
    assert NgramDrafter().propose([1, 2, 9, 9, 9, 3, 4, 9, 9], 3, GREEDY, None).ids == [3, 4, 9]


def test_ngram_rebuilds_when_the_context_is_not_an_extension():
    d = NgramDrafter()
    d.propose([1, 2, 3, 1, 2], 1, GREEDY, None)
    assert d.propose([7, 8, 9, 7, 8], 1, GREEDY, None).ids == [9]


def test_early_exit_view_shares_weights_and_runs_fewer_layers():
    model = tiny_llama(layers=4)
    view = early_exit_view(model, 2)
    assert len(view.model.layers) == 2 and len(model.model.layers) == 4
    assert view.lm_head.weight is model.lm_head.weight
    assert view.model.layers[0] is model.model.layers[0]
    with pytest.raises(ValueError, match="1..3"):
        early_exit_view(model, 4)


def test_limit_trims_short_proposals_that_do_not_pay():
    policy = AdaptiveDraftLength(forward_s=CPU_COSTS)
    feed(policy, 20, lambda k: 0)
    assert policy.limit(5) == 0  # nothing gets accepted: verify nothing, take a plain step
    policy = AdaptiveDraftLength(forward_s=CPU_COSTS)
    feed(policy, 20, lambda k: k)
    # everything accepted: the best of 8 proposed is all 8; positions never verified follow
    # the deepest measured one, so auto asks for at least as many
    assert policy.limit(8) == 8 and policy.choose() >= 8
    assert FixedDraftLength(4).limit(3) == 3


def test_measure_forward_s_on_a_tiny_vocabulary():
    from specdemo.core.kv import KVModel
    from specdemo.core.policy import measure_forward_s
    costs = measure_forward_s(KVModel(tiny_llama(vocab_size=8)), max_n=5, repeats=1)
    assert sorted(costs) == [1, 2, 3, 4, 5] and all(t > 0 for t in costs.values())


def test_a_disturbed_one_token_forward_does_not_make_long_drafts_look_free():
    """What a new user saw: the one-token forward timed at 1.9 s while another process had the
    CPU, the wider ones at ~0.08 s; with nothing accepted, auto drafted 16 tokens every round."""
    disturbed = {1: 1.9, **{n: 0.05 + 0.005 * n for n in range(2, 18)}}
    policy = AdaptiveDraftLength(forward_s=disturbed)
    assert policy.forward_time(1) == pytest.approx(0.06)  # no dearer than the cheapest width
    assert all(policy.forward_time(n) >= policy.forward_time(1) for n in range(2, 18))
    ks = []
    for _ in range(64):  # nothing is accepted; drafting costs 4 ms a token
        k = policy.choose()
        ks.append(k)
        policy.update(k + 1, 0.05 + 0.005 * (k + 1), k, 0, 0.004 * k)
    assert ks.count(0) >= 50, ks


def test_measure_forward_s_keeps_the_fastest_repeat(monkeypatch):
    """One forward slowed by another process must not set a width's cost."""
    from specdemo.core.kv import KVModel
    from specdemo.core.policy import measure_forward_s
    ticks = iter([0.0, 5.0] + [0.0, 0.01] * 20)  # the first timed forward "took" 5 s
    costs = measure_forward_s(KVModel(tiny_llama(vocab_size=8)), max_n=2, repeats=3,
                              clock=lambda: next(ticks))
    assert costs == {1: 0.01, 2: 0.01}


def test_forward_costs_are_measured_once_per_target(monkeypatch):
    """Switching the draft keeps the target's table (it does not depend on the drafter)."""
    from specdemo.services import pipeline as P
    calls = []
    monkeypatch.setattr(P, "measure_forward_s", lambda kv, n: calls.append(n) or {1: 0.1, 2: 0.12})

    class Loaded:
        model = tiny_llama(vocab_size=8)
    target = Loaded()
    first, second = P.Pipeline(target, "ngram"), P.Pipeline(target, "self")
    assert not second.forward_costs_known
    assert first.forward_costs() == {1: 0.1, 2: 0.12}
    assert second.forward_costs_known and second.forward_costs() == {1: 0.1, 2: 0.12}
    assert len(calls) == 1


def test_a_probe_is_verified_not_trimmed_away():
    """While plain steps win, choose() probes now and then; limit() must let that probe through,
    or the acceptance figures it is meant to refresh never change (before: every probe was
    trimmed to 0 tokens and auto never drafted again in that decode)."""
    policy = AdaptiveDraftLength(forward_s=CPU_COSTS)
    feed(policy, 20, lambda k: 0)
    probes = []
    for _ in range(40):
        k = policy.choose()
        if k:
            probes.append((k, policy.limit(k)))
        policy.update(k + 1, policy.forward_time(k + 1), k, 0, 0.0)
    assert probes and all(verified == k for k, verified in probes), probes
    assert policy.limit(5) == 0  # outside a probe, drafts that do not pay are still trimmed


def test_each_source_keeps_its_own_acceptance_and_cost():
    policy = AdaptiveDraftLength(forward_s=FLAT)
    for _ in range(20):  # lookup: everything accepted, free; learned: nothing, 10 ms a token
        policy.update(5, 0.020, 4, 4, 0.0, "lookup")
        policy.update(5, 0.020, 4, 0, 0.040, "learned")
    assert policy.sources["lookup"].acceptance[0] > 0.9 > 0.1 > policy.sources["learned"].acceptance[0]
    assert policy.sources["learned"].draft_token_s == pytest.approx(0.010)
    assert policy.sources["lookup"].draft_token_s == 0.0
    assert policy.limit(4, "lookup") == 4 and policy.limit(4, "learned") == 0
    assert policy.best("learned") == (0, pytest.approx(1 / 0.020))
    assert policy.best("lookup")[0] == policy.max_k
    assert policy.acceptance == [0.6] * policy.max_k  # the drafter as a whole: untouched


# -- the drafter's confidence (EAGLE-2's dynamic draft length, as a chain) --------------------

from specdemo.core.policy import Calibration  # noqa: E402


def confident_policy(costs=FLAT, rounds=20, accepted_of=lambda k: k, draft_token_s=0.0):
    policy = AdaptiveDraftLength(forward_s=costs, use_confidence=True)
    for _ in range(rounds):
        k = policy.choose()
        policy.update(k + 1, policy.forward_time(k + 1), k, accepted_of(k), draft_token_s * k)
    return policy


def test_calibration_starts_at_the_confidence_and_learns_what_is_accepted():
    cal = Calibration()
    assert cal(0.05) == pytest.approx(0.05) and cal(0.95) == pytest.approx(0.95)
    assert cal(1.0) == pytest.approx(0.95) and cal(-0.1) == pytest.approx(0.05)  # clamped to a bin
    for _ in range(200):
        cal.observe(0.95, False)  # an over-confident drafter
        cal.observe(0.15, True)   # an under-confident one
    assert cal(0.95) < 0.1 and cal(0.15) > 0.9
    assert cal(0.55) == pytest.approx(0.55)  # bins not observed keep their prior


def test_limit_verifies_the_confident_prefix_only():
    """Forwards nearly flat but not free: sure tokens are worth verifying, a near-certain miss
    is not, whatever the running averages say."""
    costs = {n: 0.020 + 0.002 * n for n in range(1, 18)}
    policy = confident_policy(costs)
    assert policy.limit(5, confidence=[0.99, 0.98, 0.97, 0.02, 0.99]) == 3
    assert policy.limit(5, confidence=[0.01, 0.99, 0.99, 0.99, 0.99]) == 0
    assert policy.limit(5) == 5  # without confidence: the averages (everything was accepted)
    assert FixedDraftLength(4).limit(4, confidence=[0.0] * 4) == 4  # a fixed k stays k


def test_more_drafts_on_while_sure_and_stops_at_a_doubtful_token():
    costs = {n: 0.020 + 0.002 * n for n in range(1, 18)}
    policy = confident_policy(costs, draft_token_s=0.001)
    assert policy.more([0.99, 0.99], 8)
    assert not policy.more([0.99, 0.01], 8)  # the next token could only extend a likely miss
    assert not policy.more([0.99] * 8, 8)     # the budget is spent
    # a dear forward per extra token: even sure tokens stop paying after a few
    steep = {n: 0.020 * (1 + 0.5 * (n - 1)) for n in range(1, 18)}
    policy = confident_policy(steep, draft_token_s=0.001)
    stop = next(j for j in range(1, 17) if not policy.more([0.9] * j, 16))
    assert 1 <= stop < 8


def test_without_use_confidence_the_averages_decide():
    policy = AdaptiveDraftLength(forward_s=FLAT, use_confidence=False)
    for _ in range(20):
        policy.update(5, 0.020, 4, 4, 0.0)
    assert policy.limit(4, confidence=[0.01] * 4) == 4
    assert policy.more([0.01], 8) and policy.draft_budget(4, 100) == 4
    assert confident_policy().draft_budget(4, 100) == 16  # with it: up to max_k
    assert confident_policy().draft_budget(4, 6) == 6     # within the tokens still to generate


def test_make_policy_reads_the_confidence_switch(monkeypatch):
    monkeypatch.delenv("SPECDEMO_DRAFT_CONFIDENCE", raising=False)
    assert not make_policy("auto").use_confidence  # off by default (it did not pay on a CPU)
    monkeypatch.setenv("SPECDEMO_DRAFT_CONFIDENCE", "1")
    assert make_policy("auto").use_confidence


def test_update_learns_calibration_from_judged_tokens_and_cost_from_drafted_ones():
    policy = AdaptiveDraftLength(forward_s=FLAT)
    # 6 drafted, 3 verified (limit trimmed 3), the first 2 accepted, the 3rd rejected
    policy.update(4, 0.02, 3, 2, 0.006, "learned", confidence=[0.95, 0.75, 0.35],
                  n_proposed=6)
    stats = policy.sources["learned"]
    assert stats.draft_token_s == pytest.approx(0.001)  # 6 ms for 6 tokens, not for 3
    cal = stats.calibration
    assert cal.seen[9] == cal.seen[7] == cal.seen[3] == 1 and sum(cal.seen) == 3
    assert cal(0.95) > 0.95 and cal(0.75) > 0.75 and cal(0.35) < 0.35
