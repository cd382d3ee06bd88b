"""Stats arithmetic on hand-made runs."""

import json
import math

from specdemo.core.stats import DecodeStats, speedup


def test_no_drafting_reports_null_not_nan():
    s = DecodeStats(new_tokens=10, ttft_s=0.5, elapsed_s=2.5, target_forwards=9)
    d = s.as_dict()
    assert d["acceptance_rate"] is None
    assert d["mean_acceptance_length"] is None
    assert d["per_position_acceptance"] == []
    assert d["tokens_per_s"] == 4.0
    assert d["decode_tokens_per_s"] == 9 / 2.0
    json.dumps(d, allow_nan=False)


def test_empty_run():
    d = DecodeStats().as_dict()
    assert d["tokens_per_s"] is None and d["decode_tokens_per_s"] is None
    json.dumps(d, allow_nan=False)


def test_rounds_and_positions():
    s = DecodeStats(new_tokens=1)
    s.record_round(4, 4)  # all accepted: +5 tokens
    s.record_round(4, 1)  # position 2 rejected: +2 tokens
    s.record_round(2, 0)  # first rejected: +1 token
    s.new_tokens += 5 + 2 + 1
    assert (s.drafted, s.accepted, s.target_forwards) == (10, 5, 3)
    assert s.acceptance_rate == 0.5
    assert s.mean_acceptance_length == 8 / 3
    assert s.position_drafted == [3, 2, 1, 1]
    assert s.position_accepted == [2, 1, 1, 1]
    assert s.per_position_acceptance == [2 / 3, 0.5, 1.0, 1.0]
    assert s.draft_length == 2


def test_drafts_after_a_stop_point_are_not_counted():
    s = DecodeStats()
    s.record_round(4, 4, 2)  # EOS at draft 2: drafts 3 and 4 never refused, nor counted verified
    assert (s.drafted, s.accepted, s.draft_length, s.draft_length_sum) == (2, 2, 2, 2)
    s.record_round(4, 1, 2)  # draft 2 rejected, the correction token ends the run: counted
    assert (s.drafted, s.accepted) == (6, 3)
    assert s.position_drafted == [2, 2, 0, 0] and s.position_accepted == [2, 1, 0, 0]
    s.record_round(4, 2, 3)  # nothing cut: the same as without n_emitted
    assert (s.drafted, s.accepted) == (10, 5)


def test_speedup():
    plain = DecodeStats(new_tokens=10, elapsed_s=2.0)
    spec = DecodeStats(new_tokens=10, elapsed_s=1.0)
    assert math.isclose(speedup(plain, spec), 2.0)
    assert speedup(DecodeStats(), spec) is None


def test_draft_length_mean_and_range_cover_the_whole_run():
    """An ``auto`` run that drafted 8, then 3, then stopped drafting: the last round says 0,
    the run's mean and range say what was used."""
    s = DecodeStats()
    assert s.mean_draft_length is None and s.draft_length_min is None
    for k in (8, 3, 0, 0):
        s.record_round(k, 0)
    assert s.draft_length == 0
    assert s.rounds == 4 and s.draft_length_sum == 11
    assert (s.draft_length_min, s.draft_length_max) == (0, 8)
    assert s.mean_draft_length == 11 / 4
    d = s.as_dict()
    assert d["mean_draft_length"] == 2.75 and d["draft_length_max"] == 8
    assert d["draft_length"] == 0  # the existing key keeps its meaning
    json.dumps(d, allow_nan=False)


def test_copy_is_an_equal_independent_snapshot():
    """copy() (twice a round in the engine) copies every list and dict field, shares nothing."""
    s = DecodeStats(new_tokens=5, ttft_s=0.1, finish_reason="eos")
    s.record_round(4, 2, 3, "eagle3")
    s.not_reported.append("ttft_s")
    c = s.copy()
    assert c == s
    for name in ("position_drafted", "position_accepted", "drafted_by", "accepted_by",
                 "not_reported"):
        assert getattr(c, name) == getattr(s, name) and getattr(c, name) is not getattr(s, name)
    c.record_round(4, 4, 5, "ngram")
    assert s.drafted_by == {"eagle3": 4} and s.rounds == 1 and c.rounds == 2


def test_copy_keeps_counters_a_server_lane_leaves_unset():
    """A lane served by llama.cpp or vLLM may leave per-position counters None (not reported)."""
    s = DecodeStats(engine="llama.cpp", not_reported=["position_drafted"])
    s.position_drafted = s.position_accepted = None
    c = s.copy()
    assert c.position_drafted is None and c.position_accepted is None and c == s


def test_a_cut_round_counts_the_same_tokens_drafted_and_verified():
    """At a run's end inside the accepted drafts (EOS, a stop string, max tokens), drafted was
    trimmed and the verified count was not (7 drafted against 8 verified; 99 against 112 tree
    nodes), so mean_draft_length and acceptance_rate disagreed: chains and trees alike."""
    chain = DecodeStats()
    chain.record_round(4, 1)  # a refusal: 4 verified, 4 drafted
    chain.record_round(4, 4, 3)  # the run ends at the third accepted draft
    assert (chain.drafted, chain.draft_length_sum, chain.accepted) == (7, 7, 4)
    assert chain.mean_draft_length * chain.rounds == chain.drafted
    tree = DecodeStats()
    tree.record_tree_round(14, 4, 1)  # 14 nodes verified, a branch of 1 kept
    tree.record_tree_round(14, 4, 3, 2)  # max tokens inside the branch: 2 counted
    assert (tree.drafted, tree.draft_length_sum, tree.accepted) == (16, 16, 3)
    assert (tree.draft_length, tree.draft_length_min, tree.draft_length_max) == (2, 2, 14)
    assert tree.position_drafted == [2, 2, 0, 0] and tree.position_accepted == [2, 1, 0, 0]
