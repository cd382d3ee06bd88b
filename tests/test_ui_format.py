"""What the page shows (issue 12 items 2 and 3): human labels with units, the metric key in the
tooltip, the run's draft length for auto, progress bars, and the chart data."""

import re
import pytest

from specdemo.services.race import DONE, LOADING, PLAIN, SPECULATIVE, PaneView, RaceSnapshot
from specdemo.services.startup import DoneStep, StepView
from specdemo.core.stats import DecodeStats
from specdemo.interfaces.ui_format import (acceptance_frame, counters_html, draft_length_cell, race_frame,
                                startup_html, status_line)

HUMAN = {"new_tokens": "Tokens", "tokens_per_s": "Tokens/s", "ttft_s": "Time to first token",
         "elapsed_s": "Elapsed", "acceptance_rate": "Acceptance",
         "mean_acceptance_length": "Mean acceptance length", "drafted / accepted": "Drafted / accepted",
         "draft_length": "Draft length", "extra_memory_bytes": "Extra memory"}


def auto_run() -> DecodeStats:
    """An auto run: drafted 8, then 3, then stopped drafting (the last round says k = 0)."""
    s = DecodeStats(new_tokens=13, ttft_s=0.25, elapsed_s=1.0, extra_memory_bytes=12_300_000)
    for k, accepted in ((8, 6), (3, 2), (0, 0)):
        s.record_round(k, accepted)
    return s


def view(name=SPECULATIVE, status=DONE, stats=None, timeline=()) -> PaneView:
    return PaneView(name, status, None, "", (), (), stats, len(timeline), timeline)


def cells(html_text: str) -> dict[str, tuple[str, str, str]]:
    """metric key -> (label, tooltip, value) from the counters' HTML."""
    found = re.findall(r'<div class="sd-cell" title="([^"]*)"><span class="sd-label">([^<]*)</span>'
                       r'<span class="sd-value" data-metric="([^"]*)">([^<]*)</span>', html_text)
    return {key: (label, title, value) for title, label, key, value in found}


def test_counters_have_human_labels_with_units_and_the_key_in_the_tooltip():
    shown = cells(counters_html(view(stats=auto_run()), True, "auto"))
    assert {key: label for key, (label, _, _) in shown.items()} == HUMAN
    for key, (_, title, _) in shown.items():
        assert title.startswith(key + ":")
    values = {key: value for key, (_, _, value) in shown.items()}
    assert values == {"new_tokens": "13", "tokens_per_s": "13.0", "ttft_s": "0.25 s",
                      "elapsed_s": "1.00 s", "acceptance_rate": "73%",
                      "mean_acceptance_length": "4.00", "drafted / accepted": "11 / 8",
                      "draft_length": "auto · mean 3.7 (0–8)", "extra_memory_bytes": "12.3 MB"}
    plain = cells(counters_html(view(PLAIN, stats=DecodeStats(new_tokens=2)), False))
    assert list(plain) == ["new_tokens", "tokens_per_s", "ttft_s", "elapsed_s"]


def test_auto_shows_the_runs_mean_and_range_not_the_last_round():
    s = auto_run()
    assert s.draft_length == 0  # what the pane used to show, read as "did not draft"
    assert draft_length_cell("auto", s) == "auto · mean 3.7 (0–8)"
    fixed = DecodeStats()
    for _ in range(3):
        fixed.record_round(4, 1)
    assert draft_length_cell(4, fixed) == "4"
    fixed.record_round(2, 0)  # n-gram lookup found only 2 tokens
    assert draft_length_cell(4, fixed) == "4 · mean 3.5 (2–4)"
    assert draft_length_cell("auto", None) == "auto" and draft_length_cell(None, None) == "–"


def test_a_loading_pane_and_the_startup_panel_show_the_step_with_its_estimate():
    step = StepView("converting builtin:smollm2-135m's weights (once; not converted yet)", 12.0, 25.0)
    line = status_line(view(PLAIN, LOADING), step)
    assert '<progress class="sd-progress" value="0.480" max="1">' in line
    assert "converting builtin:smollm2-135m&#x27;s weights" in line and "12 s of about 25 s" in line
    assert "30 s (expected about 25 s" in status_line(view(PLAIN, LOADING), StepView("x", 30, 25))
    # no step running: no claim that models are loading (they may be loaded already)
    assert status_line(view(PLAIN, LOADING), None) == "preparing the race…"
    panel = startup_html(step, [DoneStep("loading", 1.25)], ready=False)
    assert 'data-state="loading"' in panel and "<progress" in panel and "✓ loading (1.2 s)" in panel
    done = startup_html(None, [DoneStep("a", 20.0), DoneStep("b", 5.0)], ready=True)
    assert 'data-state="ready"' in done and "✓ a (20.0 s)" in done and "<progress" not in done
    assert "⚠ no model" in startup_html(None, [], ready=True, error="no model")


def test_chart_frames_hold_the_timelines_and_the_per_position_acceptance():
    spec = view(stats=auto_run(), timeline=((0.25, 1), (0.5, 8), (1.0, 13)))
    plain = view(PLAIN, stats=DecodeStats(new_tokens=2), timeline=((0.3, 1), (0.6, 2)))
    frame = race_frame(RaceSnapshot({PLAIN: plain, SPECULATIVE: spec}, "done"))
    assert frame.values.tolist() == [[0.0, 0, "plain"], [0.3, 1, "plain"], [0.6, 2, "plain"],
                                     [0.0, 0, "speculative"], [0.25, 1, "speculative"],
                                     [0.5, 8, "speculative"], [1.0, 13, "speculative"]]
    # before any token both lanes sit at the origin (the chart needs both from the start)
    assert race_frame(None).values.tolist() == [[0.0, 0, "plain"], [0.0, 0, "speculative"]]
    bars = acceptance_frame(spec)
    s = auto_run()
    # 8 drafted, 6 accepted: position 7 was verified and refused, position 8 never verified
    # each bar is its position (short ticks); its counts are in its tooltip: a 1.0 over one
    # round reads "1 / 1" there, not a sure thing
    assert bars["position"].tolist() == [str(i) for i in range(1, 8)]
    assert bars["accepted"].tolist() == s.position_accepted[:7]
    assert bars["acceptance"].tolist() == s.per_position_acceptance[:7]
    assert bars["rounds"].tolist() == s.position_drafted[:7] == [2, 2, 2, 1, 1, 1, 1]
    assert acceptance_frame(view(stats=None)).empty


def test_a_prefilling_lane_shows_tokens_fed_and_the_time_left():
    """Issue 42 item 7: a long prompt's prefill shows how far it is, not a bare "decoding…"."""
    from specdemo.services.race import RUNNING, PrefillProgress
    busy = PaneView(PLAIN, RUNNING, None, "", (), (), None, 0, (),
                    PrefillProgress(1024, 4096, 20.0))
    line = status_line(busy)
    assert "prefilling the prompt: 1,024 of 4,096 tokens" in line
    assert 'value="0.250"' in line and "about 60 s left" in line  # 3,072 tokens at 51 tokens/s
    starting = PaneView(PLAIN, RUNNING, None, "", (), (), None, 0, (), PrefillProgress(0, 4096, 0))
    assert "0 of 4,096 tokens" in status_line(starting) and "left" not in status_line(starting)
    assert status_line(view(PLAIN, RUNNING)) == "decoding…"


def test_a_waiting_pane_names_what_it_waits_for():
    """Issue 42 item 9: not "loading the model…" while a warm-up or a draft check runs."""
    from specdemo.interfaces.ui_format import chat_messages
    turn = {"user": "hi", "text": "", "tokens": [], "status": LOADING, "error": None}
    step = StepView("waiting for the draft list's check to finish (not timed)", 3.0, 10.0)
    shown = chat_messages([turn], False, True, step)[1]["content"]
    assert "waiting for the draft list&#x27;s check to finish (not timed)…" in shown
    assert "loading the model" not in shown
    assert "preparing the race" in chat_messages([turn], False, True)[1]["content"]


def test_chart_ticks_are_plain_numbers():
    """Issue 42 item 9: vega's tick formatter gave "~g" a precision from the tick step ("1e+2",
    "5e+1"); "r" writes significant digits without an exponent. The charts use it."""
    import gradio as gr

    from specdemo.interfaces import ui
    from specdemo.interfaces.ui_format import AXIS_FORMAT
    assert AXIS_FORMAT.endswith("r") and "g" not in AXIS_FORMAT
    with gr.Blocks():
        race_chart, acceptance_chart = ui._charts()
    assert race_chart.x_axis_format == race_chart.y_axis_format == AXIS_FORMAT
    # the acceptance axis titles fit their 260-pixel axes (they were cut after ~30 characters)
    assert len(acceptance_chart.y_title) <= 20 and len(acceptance_chart.x_title) <= 20
    # issue 53: positions in numeric order (as text they sorted 1, 10, 11, ..., 2), each tick
    # one number (labels with counts smeared from ~7 positions), the counts in the tooltip
    assert acceptance_chart.sort[:12] == [str(k) for k in range(1, 13)]
    assert acceptance_chart.x_label_angle == 0
    assert {"accepted", "rounds"} <= set(acceptance_chart.tooltip)


def test_the_why_line_of_an_auto_race_is_an_average_in_plain_words():
    """An auto race that verified one draft token a round on average: the line says "1.0 draft
    token a round on average" (singular, an average), never "1 drafts a round"."""
    from specdemo.core.stats import RaceExplanation
    from specdemo.interfaces.ui_format import explanation_text
    e = RaceExplanation(step_s=0.01, mean_draft_length=1.0, verify_cost_steps=1.1,
                        draft_cost_steps=0.05, break_even_mean_acceptance_length=1.15,
                        mean_acceptance_length=1.6, modelled_speedup=1.6 / 1.15,
                        projected_speedup_free_verification=1.6 / 1.05)
    line = explanation_text(e)
    assert line.startswith("Verifying 1.0 draft token a round on average cost 1.10 one-token "
                           "steps here and drafting them 0.05, so breaking even takes a mean "
                           "acceptance length of 1.15; this run got 1.60.")
    assert "drafts a round" not in line


def test_no_projection_above_a_run_whose_verification_cost_under_a_step():
    """Verification measured at 0.9 steps (the plain lane's steps were the slower): setting it
    to one step would project a speedup below this run's own, so the figure keeps the run's V
    and the line says there is nothing to project."""
    from specdemo.core.stats import DecodeStats, explain
    from specdemo.interfaces.ui_format import explanation_text
    plain = DecodeStats(new_tokens=11, prompt_tokens=4, verify_s=0.10, target_forwards=10)
    spec = DecodeStats(new_tokens=11, prompt_tokens=4, verify_s=0.045, target_forwards=5,
                       draft_s=0.005, draft_length_sum=10)
    e = explain(plain, spec)
    assert e.verify_cost_steps == pytest.approx(0.9) and e.draft_cost_steps == pytest.approx(0.1)
    assert e.projected_speedup_free_verification == pytest.approx(2.0 / (0.9 + 0.1))
    assert e.projected_speedup_free_verification >= e.modelled_speedup
    line = explanation_text(e)
    assert "Projection" not in line and "no projection from them" in line


def _explained(drafter, verify_s=0.10, draft_length_sum=0, new_tokens=11):
    from specdemo.core.stats import DecodeStats, explain
    plain = DecodeStats(new_tokens=11, prompt_tokens=4, verify_s=0.10, target_forwards=10)
    spec = DecodeStats(new_tokens=new_tokens, prompt_tokens=4, verify_s=verify_s,
                       target_forwards=10, draft_s=0.001, draft_length_sum=draft_length_sum,
                       drafted=draft_length_sum, drafter=drafter)
    return explain(plain, spec)


def test_the_why_line_of_a_lane_without_a_drafter_does_not_blame_one():
    """``--draft none`` (also ``/race``): the line blamed "prompt lookup ... or auto"; it says
    there is no drafter. A drafter that proposed nothing keeps its own reasons."""
    from specdemo.interfaces.ui_format import explanation_text
    none = _explained(None)
    assert none.has_drafter is False and none.as_dict()["has_drafter"] is False
    line = explanation_text(none)
    assert line.startswith("No draft tokens were verified (the speculative lane has no drafter: "
                           "draft none), so every round was a plain one-token step")
    assert "prompt lookup" not in line and "auto" not in line and "choosing the draft" not in line
    quiet = explanation_text(_explained("ngram"))
    assert "the drafter proposed none, e.g. prompt lookup finding no match" in quiet


@pytest.mark.parametrize("verify_s, projected", [(0.09994, True), (0.1, True), (0.09949, False)])
def test_the_projection_follows_the_verification_cost_as_written(verify_s, projected):
    """Verification at 0.9994 steps was written "cost 1.00 one-token steps" and then called
    cheaper than a plain step; the line decides on the figure it writes."""
    from specdemo.interfaces.ui_format import explanation_text
    e = _explained("ngram", verify_s=verify_s, draft_length_sum=20, new_tokens=21)
    line = explanation_text(e)
    written = f"{e.verify_cost_steps:.2f}"
    assert f"cost {written} one-token steps" in line
    assert ("Projection, not measured" in line) is projected
    assert ("Verifying cost less than the plain run's one-token steps" in line) is (not projected)


@pytest.mark.parametrize("most, top", [(0, 10), (9, 10), (10, 12), (100, 120), (128, 150),
                                       (143, 200), (990, 1200), (1905, 2500)])
def test_the_race_charts_y_axis_holds_the_most_tokens_with_room_above(most, top):
    """The race chart's y-axis ended at the data's maximum (a new user's 128 tokens: ticks 0, 50,
    100 and the leading line on the plot's top edge); now it ends at a round number at least 5%
    above it."""
    from specdemo.interfaces.ui_format import race_chart, race_y_top
    spec = view(stats=DecodeStats(new_tokens=most), timeline=((0.5, most // 2), (1.0, most)))
    plain = view(PLAIN, stats=DecodeStats(new_tokens=most // 3), timeline=((1.0, most // 3),))
    snap = RaceSnapshot({PLAIN: plain, SPECULATIVE: spec}, "done")
    frame = race_frame(snap)
    assert race_y_top(frame) == top and top >= 1.05 * frame["tokens"].max()
    chart = race_chart(snap)  # the update the page gets: the points and the axis
    assert chart.y_lim == [0, top] and max(row[1] for row in chart.value["data"]) == most
