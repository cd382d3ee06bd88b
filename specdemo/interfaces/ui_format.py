"""What the race page shows, as HTML and chart data: counters, status, badges, text, charts.

Every number comes from the engine's :class:`specdemo.core.stats.DecodeStats` or from
:class:`specdemo.services.race.RaceSnapshot`; nothing here computes a metric, it only chooses words,
units and layout. Counters carry human labels with units; the metric key of docs/design.md stays in
``data-metric`` and in the tooltip, and the JSON of the API is untouched.
"""

from __future__ import annotations

import html
import math
import os

from ..services.race import (DONE, ERROR, LOADING, PLAIN, REPLAYING, RUNNING, SKIPPED, SPECULATIVE, STOPPED,
                   WAITING, PaneView, RaceSnapshot)
from ..services.startup import DoneStep, StepView
from .ui_i18n import DEFAULT, sentence, t

PANES = (PLAIN, SPECULATIVE)
#: each lane's word in the charts' legend (the charts' data: written in the page's language)
LANE_WORDS = {PLAIN: "lane_plain", SPECULATIVE: "lane_speculative"}
LANE_COLORS = {PLAIN: "#6b7280", SPECULATIVE: "#16a34a"}

#: metric key -> its words' key in the page's dictionaries (``m_<key>``: the label people
#: read; ``m_<key>_tip``: the tooltip, which names the key JSON and the CLI use, docs/design.md)
WORD_KEYS = {"drafted / accepted": "m_drafted_accepted"}
STATUS_KEYS = {WAITING: "st_waiting", LOADING: "st_loading", RUNNING: "st_running",
               SKIPPED: "st_skipped", REPLAYING: "st_replaying"}


def label(key: str, lang: str | None = DEFAULT) -> tuple[str, str]:
    """(label, tooltip) of a counter in ``lang``."""
    words = WORD_KEYS.get(key, f"m_{key}")
    return t(words, lang), t(f"{words}_tip", lang)


def lane_label(name: str, lang: str | None = DEFAULT) -> str:
    """A lane's name in the charts' legend, in ``lang`` ("plain", "一般", ...)."""
    return t(LANE_WORDS[name], lang) if name in LANE_WORDS else name


def chart_colors(lang: str | None = DEFAULT) -> dict[str, str]:
    """The charts' colour of each lane, keyed by its legend word in ``lang`` (gradio's
    ``color_map`` maps the values of the colour column)."""
    return {lane_label(name, lang): color for name, color in LANE_COLORS.items()}


def exact_check(lang: str | None = DEFAULT) -> str:
    """How to get an exact lossless check: float32 on the transformers backend."""
    return t("exact_check", lang)


def precision_chip(note: str, lang: str | None = DEFAULT) -> str:
    """The chip shown before a race's outputs are compared when the target runs in a reduced
    precision (``RaceSnapshot.lossless_note``): greedy outputs may differ, why, and float32."""
    text = t("precision_chip", lang, note=sentence(note, lang), check=exact_check(lang))
    return f'<span class="sd-chip sd-precision" data-lossless-expected="false">{html.escape(text)}</span>'


def legend(lang: str | None = DEFAULT) -> str:
    """The highlight legend (accepted draft token, token from the target)."""
    return t("legend_html", lang)


# --- numbers -------------------------------------------------------------------------------

def fmt(value, spec: str = ".2f", unit: str = "") -> str:
    """``value`` formatted with ``spec`` and ``unit``; an en dash when unknown (None)."""
    return "–" if value is None else f"{value:{spec}}{unit}"


def fmt_bytes(n: int | None) -> str:
    """Decimal units, as model cards and GPU boxes use: ``12_300_000`` -> ``'12.3 MB'``."""
    if n is None:
        return "–"
    for unit, size in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def draft_length_cell(policy: int | str | None, s, lang: str | None = DEFAULT) -> str:
    """The draft length as people should read it: for ``auto`` the run's mean and range of k
    (the last round's k alone can be 0 although the run drafted), for a fixed k that k and,
    when rounds verified fewer (n-gram lookup found less, the run's end), the mean."""
    if s is None or not s.rounds:
        return str(policy) if policy is not None else "–"
    lo, hi = s.draft_length_min, s.draft_length_max
    spread = t("mean_k", lang, k=f"{s.mean_draft_length:.1f}") + (f" ({lo}–{hi})" if lo != hi else "")
    if policy == "auto":
        return f"auto · {spread}"
    if policy is not None and lo == hi == policy:
        return str(policy)
    return f"{policy} · {spread}" if policy is not None else spread


def counter_cells(s, speculative: bool, draft_length: int | str | None = None,
                  lang: str | None = DEFAULT) -> list[tuple[str, str]]:
    """(metric key, formatted value) per counter of a pane, in display order."""
    seconds = t("seconds_unit", lang)
    cells = [("new_tokens", str(s.new_tokens) if s else "–"),
             ("tokens_per_s", fmt(s.tokens_per_s if s else None, ".1f")),
             ("ttft_s", fmt(s.ttft_s if s else None, ".2f", seconds)),
             ("elapsed_s", fmt(s.elapsed_s if s else None, ".2f", seconds))]
    if s is not None and s.engine:  # a server lane: what its engine does not report says so
        return cells + endpoint_cells(s, speculative, lang)
    if speculative:
        rate = s.acceptance_rate if s else None
        cells += [("acceptance_rate", fmt(rate * 100 if rate is not None else None, ".0f", "%")),
                  ("mean_acceptance_length", fmt(s.mean_acceptance_length if s else None)),
                  ("drafted / accepted", f"{s.drafted} / {s.accepted}" if s else "–"),
                  ("draft_length", draft_length_cell(draft_length, s, lang)),
                  ("extra_memory_bytes", fmt_bytes(s.extra_memory_bytes) if s else "–")]
        if s is not None and s.tree:
            cells.append(("tree", s.tree if s.tree.startswith("not used")
                          else t("tree_rounds", lang, tree=s.tree, n=s.tree_rounds,
                                 rounds=s.rounds)))
    return cells


def endpoint_cells(s, speculative: bool, lang: str | None = DEFAULT) -> list[tuple[str, str]]:
    """The counters of a lane served by an OpenAI-compatible server (``s.engine`` names it):
    a counter its engine does not report reads "not reported by this engine"."""
    not_reported = t("not_reported", lang)

    def cell(value, text):
        return not_reported if value is None else text
    cells = [("engine", s.engine)]
    if speculative or s.drafted:
        rate = s.acceptance_rate
        both = None if s.drafted is None or s.accepted is None else 1
        cells += [("acceptance_rate", cell(rate, fmt(rate * 100 if rate is not None else None,
                                                     ".0f", "%"))),
                  ("mean_acceptance_length", cell(s.mean_acceptance_length,
                                                  fmt(s.mean_acceptance_length))),
                  ("drafted / accepted", cell(both, f"{s.drafted} / {s.accepted}")),
                  ("draft_length", not_reported),
                  ("extra_memory_bytes", not_reported)]
    return cells


# --- progress and status -------------------------------------------------------------------

def about(seconds: float | None, lang: str | None = DEFAULT) -> str:
    """``"about 25 s"``, ``"about 2 min"``, ``"under a second"`` in ``lang``; empty when
    unknown (``services.startup.about``'s rule)."""
    if seconds is None:
        return ""
    if seconds < 1:
        return t("about_under_s", lang)
    return (t("about_s", lang, n=f"{seconds:.0f}") if seconds < 90
            else t("about_min", lang, n=f"{seconds / 60:.0f}"))


def progress_html(step: StepView, lang: str | None = DEFAULT) -> str:
    """A progress bar with the step's name, its time so far and its estimate (``data-step``
    keeps the step's English name, for scripts)."""
    estimate = about(step.estimate_s, lang)
    elapsed = f"{step.elapsed_s:.0f}"
    timing = (t("step_time_of", lang, elapsed=elapsed, estimate=estimate) if estimate
              else t("step_time", lang, elapsed=elapsed))
    if step.estimate_s and step.elapsed_s > step.estimate_s:
        timing = t("step_time_over", lang, elapsed=elapsed, estimate=estimate)
    value = (f'value="{step.fraction:.3f}" max="1"' if step.fraction is not None else "")
    return (f'<span class="sd-step" data-step="{html.escape(step.name)}">'
            f'<progress class="sd-progress" {value}></progress> '
            f'<span class="sd-step-name">{html.escape(sentence(step.name, lang))}</span> '
            f'<span class="sd-step-time">· {html.escape(timing)}</span></span>')


def startup_html(step: StepView | None, done: list[DoneStep], ready: bool,
                 error: str | None = None, checking: bool = False,
                 lang: str | None = DEFAULT, note: str | None = None) -> str:
    """The panel above the panes while the models of the chosen preset get ready.

    Args:
        checking: the models are ready and the page's draft checks still run in the
            background (a Send does not wait for them: the check process stops while a race
            runs), which the panel says beside Ready.
        note: a line under the steps (how this process's threads wait, and why).
    """
    seconds = t("seconds_unit", lang)
    finished = " ".join(f'<span class="sd-done-step">{"✗" if d.failed else "✓"} '
                        f'{html.escape(sentence(d.name, lang))}'
                        + ("" if getattr(d, "note", False) else f" ({d.seconds:.1f}{seconds})")
                        + '</span>' for d in done)
    if error:
        body, state = f'<span class="sd-error">⚠ {html.escape(sentence(error, lang))}</span>', "error"
    elif ready and checking:
        body, state = t("startup_checking", lang), "checking"
    elif ready:
        body, state = t("startup_ready", lang), "ready"
    else:
        body = t("startup_loading", lang) + (progress_html(step, lang) if step
                                             else t("startup_starting", lang))
        state = "loading"
    return (f'<div class="sd-startup" data-state="{state}">{body}'
            + (f'<div class="sd-done-steps">{finished}</div>' if finished else "")
            + (f'<div class="sd-threads">{html.escape(note)}</div>' if note else "") + "</div>")


def prefill_html(progress, lang: str | None = DEFAULT) -> str:
    """A lane's prefill of a long prompt (``race.PrefillProgress``) as a progress bar: tokens
    fed of the prompt's, and the time left at the rate of the chunks fed so far."""
    left = progress.left_s
    timing = t("left", lang, time=about(left, lang)) if left is not None else ""
    name = t("prefill", lang, fed=f"{progress.fed:,}", total=f"{progress.total:,}")
    return (f'<span class="sd-step" data-step="prefill">'
            f'<progress class="sd-progress" value="{progress.fed / progress.total:.3f}" '
            f'max="1"></progress> <span class="sd-step-name">{html.escape(name)}</span>'
            f'<span class="sd-step-time">{html.escape(timing)}</span></span>')


def status_text(status: str, lang: str | None = DEFAULT) -> str:
    """The words of a pane's status (waiting, loading, running, skipped, replaying)."""
    return t(STATUS_KEYS[status], lang) if status in STATUS_KEYS else status


#: the finish reasons the engines write (``DecodeStats.finish_reason``), each with its words
#: (``finish_<reason>``): the end-of-sequence token, max_new_tokens, a stop string, a cancel
FINISH_REASONS = ("eos", "length", "stop", "cancelled")


def finish_words(reason: str | None, lang: str | None = DEFAULT) -> str:
    """``reason`` (a :data:`FINISH_REASONS` code) in ``lang``; another reason (an endpoint's
    own finish_reason) as written."""
    return t(f"finish_{reason}", lang) if reason in FINISH_REASONS else str(reason)


def status_line(view: PaneView | None, step: StepView | None = None,
                lang: str | None = DEFAULT) -> str:
    """The status under a pane, as HTML; a loading pane shows the step in progress, a lane
    prefilling a long prompt how far it is."""
    if view is None:
        return html.escape(t("st_idle", lang))
    if view.status == RUNNING and getattr(view, "prefill", None) is not None:
        return prefill_html(view.prefill, lang)
    if view.status == DONE:
        return html.escape(t("st_done", lang, reason=finish_words(view.stats.finish_reason, lang))
                           if view.stats
                           else t("st_done_plain", lang))
    if view.status == STOPPED:
        return html.escape(t("st_stopped", lang, n=view.stats.new_tokens if view.stats else 0))
    if view.status == ERROR:
        return html.escape(t("st_error", lang, error=sentence(view.error, lang)))
    if view.status == SKIPPED and view.error:
        return html.escape(sentence(view.error, lang))
    if view.status == LOADING and step is not None:
        return progress_html(step, lang)
    return html.escape(status_text(view.status, lang))


def counters_html(view: PaneView | None, speculative: bool, draft_length: int | str | None = None,
                  step: StepView | None = None, lang: str | None = DEFAULT) -> str:
    """The live counters under a pane: human labels with units, the metric key in the
    tooltip and in ``data-metric``."""
    s = view.stats if view else None
    cells = []
    for key, value in counter_cells(s, speculative, draft_length, lang):
        name, tip = label(key, lang)
        cells.append(f'<div class="sd-cell" title="{html.escape(tip)}">'
                     f'<span class="sd-label">{html.escape(name)}</span>'
                     f'<span class="sd-value" data-metric="{html.escape(key)}">'
                     f'{html.escape(value)}</span></div>')
    state = view.status if view else "idle"
    return (f'<div class="sd-counters" data-status="{state}">{"".join(cells)}</div>'
            f'<div class="sd-status sd-status-{state}">{status_line(view, step, lang)}</div>')


def not_compared(snap: RaceSnapshot | None) -> str | None:
    """Why a finished race has no speedup (a lane stopped, skipped or failed; the lanes'
    servers serve different models), else None: for the page's speedup chip and the ``/race``
    API's ``speedup_note`` (``RaceSnapshot.not_compared``)."""
    if snap is None or not snap.done:
        return None
    return snap.not_compared


def explanation_text(e, times: str = "×", lang: str | None = DEFAULT) -> str:
    """One sentence on why the race ended as it did, from a ``stats.RaceExplanation``: what
    verifying and drafting cost here in one-token steps, the mean acceptance length that breaks
    even and the one this run got, and the projection where verifying costs one step.
    ``times``: the sign after a speedup, as the speedup beside it is written ("×" on the page,
    "x" in the terminal)."""
    if e.mean_draft_length == 0:
        key = "why_none" if e.has_drafter else "why_no_drafter"  # no drafter: no one to blame
        return t(key, lang, cost=f"{e.break_even_mean_acceptance_length:.2f}",
                 verify=f"{e.verify_cost_steps:.2f}", draft=f"{e.draft_cost_steps:.2f}")
    k = f"{e.mean_draft_length:.1f}"  # an average: a run's last rounds draft fewer
    drafts = t("why_drafts_one" if k == "1.0" else "why_drafts", lang, k=k)
    measured = t("why_measured", lang, drafts=drafts, verify=f"{e.verify_cost_steps:.2f}",
                 draft=f"{e.draft_cost_steps:.2f}",
                 even=f"{e.break_even_mean_acceptance_length:.2f}",
                 got=f"{e.mean_acceptance_length:.2f}")
    if float(f"{e.verify_cost_steps:.2f}") < 1:  # as written above (0.9994 is "1.00" and is
        # projected): the plain lane's steps were the dearer, so nothing to project
        return measured + t("why_slowed", lang)
    return measured + t("why_projection", lang,
                        x=f"{e.projected_speedup_free_verification:.2f}", times=times,
                        got=f"{e.mean_acceptance_length:.2f}", draft=f"{e.draft_cost_steps:.2f}")


def from_noise(snap: RaceSnapshot) -> float | None:
    """When the race's speedup is above what drafting can explain, that bound, else None.

    Each target forward of the speculative lane gave ``mean_acceptance_length`` tokens (1 when
    nothing was drafted), so even free drafting and verification could not make the lane
    faster than that many times: the rest of a speedup above it is noise between the two runs
    (another process, a cache), not a win. A server lane that reports no counts: None."""
    spec = snap.panes.get(SPECULATIVE)
    s = spec.stats if spec else None
    if snap.speedup is None or s is None or s.drafted is None:
        return None
    bound = max(1.0, s.mean_acceptance_length or 1.0)
    return bound if snap.speedup > bound else None


def _speedup_chip(snap: RaceSnapshot, lang: str | None) -> str | None:
    """The speedup chip: not compared and why, a speedup from noise said as such, or the
    speedup with its direction."""
    title = html.escape(t("speedup_title", lang))
    reason = not_compared(snap)
    if reason:
        return (f'<span class="sd-chip sd-speedup sd-na" data-speedup="not compared" '
                f'title="{title}">{html.escape(t("speedup_not_compared", lang, reason=sentence(reason, lang)))}</span>')
    if snap.speedup is None:
        return None
    x = f"{snap.speedup:.2f}"
    noise = from_noise(snap) if snap.done else None
    if noise is not None:
        return (f'<span class="sd-chip sd-speedup sd-noise" data-speedup="{snap.speedup:.4f}" '
                f'data-noise="true" title="{title}">'
                f'{html.escape(t("speedup_noise", lang, x=x, mal=f"{noise:.2f}"))}</span>')
    # a figure that reads 1.00x says neither faster nor slower (102.3 against 102.1 tokens/s)
    words = t("speedup_same" if x == f"{1:.2f}" else "speedup_faster" if snap.speedup >= 1
              else "speedup_slower", lang, x=x)
    return (f'<span class="sd-chip sd-speedup" data-speedup="{snap.speedup:.4f}" '
            f'title="{title}">{html.escape(words)}</span>')


def _outcome_chip(snap: RaceSnapshot, temperature: float, note: str | None,
                  lang: str | None, histories_differ: bool = False) -> str | None:
    """The lossless badge of a finished race (identical, differ and why, or not compared)."""
    plain, spec = snap.panes.get(PLAIN), snap.panes.get(SPECULATIVE)
    if plain.status != DONE or spec.status != DONE:
        return f'<span class="sd-chip sd-na">{html.escape(t("lossless_not_finished", lang))}</span>'
    if snap.identical is None:  # both finished, but not comparable (different models)
        reason = sentence(snap.not_compared, lang) or t("no_verdict", lang)
        return (f'<span class="sd-chip sd-na">'
                f'{html.escape(t("lossless_not_compared", lang, reason=reason))}</span>')
    if temperature > 0:
        return f'<span class="sd-chip sd-na">{t("sampled", lang)}</span>'
    if snap.identical:
        caveat = (t("identical_caveat", lang, note=sentence(note, lang), check=exact_check(lang))
                  if note else "")
        return (f'<span class="sd-chip sd-lossless" data-identical="true" '
                f'data-lossless-expected="{"false" if note else "true"}">'
                f'{html.escape(t("identical", lang, n=len(plain.token_ids)) + caveat)}</span>')
    i = snap.first_divergence
    a = plain.tokens[i][0] if i < len(plain.tokens) else t("end", lang)
    b = spec.tokens[i][0] if i < len(spec.tokens) else t("end", lang)
    if histories_differ:
        reason = t("history_reason", lang)
    else:
        reason = (f"{sentence(note, lang)}. {exact_check(lang)}" if note
                  else t("float_reason", lang))
    text = t("diverged", lang, i=i, a=repr(a), b=repr(b), reason=reason)
    return f'<span class="sd-chip sd-diverged" data-identical="false">{html.escape(text)}</span>'


def verdict_html(snap: RaceSnapshot | None, temperature: float, lang: str | None = DEFAULT,
                 histories_differ: bool = False) -> str:
    """Speedup between the panes, a warning beside it when the machine was busy during a lane or
    a drafter accepted almost nothing (``snap.warnings``), and the lossless badge.

    Args:
        histories_differ: the panes continued different conversations (their earlier answers
            differ), which the badge then names as the cause of a divergence.
    """
    if snap is None:
        return (f'<div class="sd-verdict"><span class="sd-chip">'
                f'{html.escape(t("send_to_start", lang))}</span></div>')
    chips = [chip for chip in [_speedup_chip(snap, lang)] if chip]
    shares = {name: view.stats.other_cpu_share for name, view in snap.panes.items()
              if view.stats is not None and view.stats.other_cpu_share is not None}
    busy_title = t("busy_title", lang, shares=", ".join(f"{name} {share:.2f}"
                                                        for name, share in shares.items()))
    for warning in snap.warnings:
        kind, title = ("busy", busy_title) if warning.startswith("machine busy") else (
            "acceptance", t("acceptance_title", lang))
        chips.append(f'<span class="sd-chip sd-busy" data-warning="{kind}" '
                     f'title="{html.escape(title)}">⚠ {html.escape(sentence(warning, lang))}</span>')
    plain, spec = snap.panes.get(PLAIN), snap.panes.get(SPECULATIVE)
    note = snap.lossless_note if temperature == 0 else None
    if note and not snap.done:  # said before the outputs are compared, not only after
        chips.append(precision_chip(note, lang))
    if snap.done and plain and spec:
        chips.append(_outcome_chip(snap, temperature, note, lang, histories_differ))
    elif snap.phase == "replay":
        chips.append(f'<span class="sd-chip">'
                     f'{html.escape(t("replay_at", lang, clock=f"{snap.clock_s:.2f}"))}</span>')
    if not chips:
        chips.append(f'<span class="sd-chip">{html.escape(t("racing", lang))}</span>')
    why = ""
    if snap.explanation is not None:
        why = (f'<div class="sd-explain" title="{html.escape(t("why_title", lang))}">'
               f'{html.escape(explanation_text(snap.explanation, lang=lang))}</div>')
    return '<div class="sd-verdict">' + "".join(chips) + why + "</div>"


def tokens_html(tokens, highlight: bool) -> str:
    """Assistant text as one HTML block: accepted draft tokens and target tokens as spans.

    One ``<span>`` per token (empty pieces too), so the number of ``sd-draft`` spans equals
    the stats' ``accepted``. Newlines become ``<br>`` so markdown never re-parses the text.
    """
    if highlight:
        body = "".join(f'<span class="sd-tok {"sd-draft" if flag else "sd-target"}">'
                       f'{html.escape(piece).replace(chr(10), "<br>")}</span>'
                       for piece, flag in tokens)
    else:
        body = html.escape("".join(p for p, _ in tokens)).replace("\n", "<br>")
    return f'<div class="sd-tokens">{body}</div>'


def pending_text(status: str, error: str | None = None, step: StepView | None = None,
                 lang: str | None = DEFAULT) -> str:
    """What a pane without tokens says it waits for: a skipped lane's reason, the named step in
    progress (a load, a warm-up, a draft check) while preparing, else the status's words."""
    if status == SKIPPED and error:
        return sentence(error, lang)
    if status == LOADING and step is not None:
        return f"{sentence(step.name, lang)}…"  # the step's own words: "warming up …"
    return status_text(status, lang)


def chat_messages(turns: list[dict], speculative: bool, highlight: bool,
                  step: StepView | None = None, lang: str | None = DEFAULT) -> list[dict]:
    """gr.Chatbot messages for a pane (turns as :func:`specdemo.interfaces.ui.turn_of` makes
    them); ``step``: the named step in progress, which a preparing pane names."""
    out = []
    for turn in turns:
        out.append({"role": "user", "content": turn["user"]})
        if turn["status"] == ERROR:  # what it produced before it failed, marked as cut
            cut = t("error_cut", lang) if turn["tokens"] else ""
            error = sentence(turn["error"], lang) or t("error", lang)
            body = (tokens_html(turn["tokens"], highlight and speculative) if turn["tokens"]
                    else "") + f'<div class="sd-error">⚠ {html.escape(cut + error)}</div>'
        elif turn["status"] in (WAITING, LOADING, SKIPPED) and not turn["tokens"]:
            text = pending_text(turn["status"], turn["error"], step, lang)
            body = f'<div class="sd-pending">{html.escape(text)}</div>'
        else:
            body = tokens_html(turn["tokens"], highlight and speculative)
        out.append({"role": "assistant", "content": body})
    return out


# --- charts (gradio's native plots take a pandas DataFrame) --------------------------------

#: d3-format specifier of the charts' axis ticks: plain numbers ("0", "1.5", "50", "100").
#: Vega formats ticks through d3-scale's ``tickFormat``, which sets a precision from the tick
#: step when the specifier has none: "~g" then became ".1~g" for ticks 50 apart, written "5e+1"
#: and "1e+2"; "r" (significant digits) is never written with an exponent.
AXIS_FORMAT = "~r"

def race_frame(snap: RaceSnapshot | None, lang: str | None = DEFAULT):
    """Tokens generated against seconds since each decode started, one line per lane (a point
    per engine event): columns ``seconds``, ``tokens``, ``lane``. Replays pass views cut at the
    replay clock, so the lines grow as the replay plays. Every lane starts at (0, 0), also
    before it has a token: gradio 6.31's line plot draws no lines after an update when the
    lanes (its colour domain) were not all there from the start. The ``lane`` column holds each
    lane's legend word in ``lang`` (:func:`lane_label`)."""
    import pandas as pd
    panes = snap.panes if snap else {name: None for name in PANES}
    rows = []
    for name, view in panes.items():
        label = lane_label(name, lang)
        rows += [(0.0, 0, label)] + [(t, n, label) for t, n in (view.timeline if view else ())]
    frame = pd.DataFrame(rows, columns=["seconds", "tokens", "lane"])
    return frame.astype({"seconds": "float64", "tokens": "int64", "lane": "str"})  # typed axes


def race_y_top(frame) -> float:
    """The race chart's y-axis top, in tokens: the first of 1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8
    x 10^n at or above the most tokens either lane has plus 5% (so that the leading line and a
    tick label at the top stay inside the plot), and at least 10 (an empty race gets an axis,
    not one tick at 0). Left to itself, the page's Vega chart ended the axis at the data's
    maximum (128 tokens: ticks 0, 50, 100 and the line on the plot's top edge)."""
    most = float(frame["tokens"].max()) if len(frame) else 0.0
    need = max(10.0, most * 1.05)
    scale = 10.0 ** math.floor(math.log10(need))
    return next(m * scale for m in (1, 1.2, 1.5, 2, 2.5, 3, 4, 5, 6, 8, 10) if m * scale >= need)


def race_chart(snap: RaceSnapshot | None, lang: str | None = DEFAULT):
    """The race chart's update: :func:`race_frame`'s points and a y-axis from 0 to
    :func:`race_y_top` of them (a ``gr.LinePlot``)."""
    import gradio as gr
    frame = race_frame(snap, lang)
    return gr.LinePlot(value=frame, y_lim=[0, race_y_top(frame)])


def acceptance_frame(view: PaneView | None):
    """Per-position acceptance of the speculative lane: columns ``position`` (draft position
    1..k, as text so the bars are categories; the page orders them numerically), ``acceptance``
    (0..1), ``accepted`` and ``rounds`` (rounds in which that position was verified: accepted /
    verified, so a 1.0 over three rounds reads as such); positions never verified are left
    out."""
    import pandas as pd
    s = view.stats if view else None
    rows = []
    if s and s.position_drafted is not None:
        accepted = list(s.position_accepted) + [0] * len(s.position_drafted)
        rows = [(str(i + 1), rate, accepted[i], n) for i, (rate, n) in
                enumerate(zip(s.per_position_acceptance, s.position_drafted)) if rate is not None]
    frame = pd.DataFrame(rows, columns=["position", "acceptance", "accepted", "rounds"])
    return frame.astype({"position": "str", "acceptance": "float64", "accepted": "int64",
                         "rounds": "int64"})


# --- the privacy line ----------------------------------------------------------------------

def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def privacy_html(host: str, share: bool, lang: str | None = DEFAULT) -> str:
    """What this process does and does not talk to (each fact read from the live setting)."""
    local = host in ("127.0.0.1", "localhost", "::1")
    analytics_off = os.environ.get("GRADIO_ANALYTICS_ENABLED", "").strip().lower() in (
        "false", "0", "no", "off")
    facts = [
        (local, t("p_listening", lang, host=host) + ("" if local else t("p_reachable", lang))),
        (analytics_off, t("p_analytics_off" if analytics_off else "p_analytics_on", lang)),
        (not share, t("p_no_share" if not share else "p_share", lang)),
        (True, t("p_offline" if _env_true("HF_HUB_OFFLINE") else "p_online", lang)),
        (True, t("p_remote_code", lang)),
    ]
    items = "".join(f'<span class="sd-fact {"sd-ok" if ok else "sd-warn"}">{html.escape(text)}</span>'
                    for ok, text in facts)
    return f'<div class="sd-privacy" id="sd-privacy">{html.escape(t("privacy", lang))}{items}</div>'
