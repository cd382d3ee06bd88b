"""What the race page shows, as HTML and chart data: counters, status, badges, text, charts.

Every number comes from the engine's :class:`specdemo.core.stats.DecodeStats` or from
:class:`specdemo.services.race.RaceSnapshot`; nothing here computes a metric, it only chooses words,
units and layout. Counters carry human labels with units; the metric key of docs/design.md stays in
``data-metric`` and in the tooltip, and the JSON of the API is untouched.
"""

from __future__ import annotations

import html
import os

from ..services.race import (DONE, ERROR, LOADING, PLAIN, REPLAYING, RUNNING, SKIPPED, SPECULATIVE, STOPPED,
                   WAITING, PaneView, RaceSnapshot)
from ..services.startup import DoneStep, StepView, about

PANES = (PLAIN, SPECULATIVE)
LANE_LABELS = {PLAIN: "plain", SPECULATIVE: "speculative"}
CHART_COLORS = {"plain": "#6b7280", "speculative": "#16a34a"}

# Metric key -> (label, tooltip). The label is what people read; the key is what JSON and the
# CLI call it (docs/design.md), shown in the tooltip with its meaning.
LABELS = {
    "new_tokens": ("Tokens", "new_tokens: tokens generated (prompt excluded)"),
    "tokens_per_s": ("Tokens/s", "tokens_per_s: new tokens / seconds from request to last token"),
    "ttft_s": ("Time to first token", "ttft_s: seconds from request to first new token "
                                      "(prefill included)"),
    "elapsed_s": ("Elapsed", "elapsed_s: seconds from request to the last new token"),
    "acceptance_rate": ("Acceptance", "acceptance_rate: accepted / drafted draft tokens"),
    "mean_acceptance_length": ("Mean accepted per step",
                               "mean_acceptance_length: new tokens per target forward (the "
                               "bonus or correction token counted, as vLLM)"),
    "drafted / accepted": ("Drafted / accepted", "drafted / accepted: draft tokens proposed and "
                                                 "verified / accepted"),
    "draft_length": ("Draft length", "draft_length: the policy (auto or k), then the k verified "
                                     "per round over the whole run: mean_draft_length "
                                     "(draft_length_min-draft_length_max)"),
    "extra_memory_bytes": ("Extra memory", "extra_memory_bytes: memory the drafter adds (its "
                                           "weights not shared with the target + its KV cache)"),
    "engine": ("Engine", "engine: the server that decoded this lane; its counters are the ones "
                         "it reports"),
    "tree": ("Draft tree", "tree: the draft tree's shape, and tree_rounds of rounds: a tree "
                           "round verifies every node and accepts one branch (with auto, "
                           "chains where they were faster)"),
}

STATUS_TEXT = {
    WAITING: "waiting: starts when the plain run has finished",
    LOADING: "preparing the race (loading the models, warming them up)…",
    RUNNING: "decoding…",
    SKIPPED: "not run: stopped before it started",
    REPLAYING: "replaying at the measured pace…",
}
FLOAT_REASON = (
    "floating point: speculative decoding verifies k+1 tokens in one batched forward, plain "
    "decoding computes one token per forward; the sums round differently (often in "
    "bfloat16/float16, rarely in float32), and a near-tie between two tokens can flip")
EXACT_CHECK = ("For an exact check, race in float32 on the transformers backend where memory "
               "allows (a float32 preset, or --dtype float32 --backend transformers on the "
               "command line).")


def precision_chip(note: str) -> str:
    """The chip shown before a race's outputs are compared when the target runs in a reduced
    precision (``RaceSnapshot.lossless_note``): greedy outputs may differ, why, and float32."""
    return (f'<span class="sd-chip sd-precision" data-lossless-expected="false">⚠ outputs may '
            f'differ: {html.escape(note)}. {html.escape(EXACT_CHECK)}</span>')


LEGEND = ('<div class="sd-legend" id="sd-legend">'
          '<span class="sd-tok sd-draft">accepted draft token</span>'
          '<span class="sd-tok sd-target">token from the target</span>'
          '<span class="sd-legend-note">(the target makes one token per forward: the first, '
          'each correction and each bonus token)</span></div>')


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


def draft_length_cell(policy: int | str | None, s) -> str:
    """The draft length as people should read it: for ``auto`` the run's mean and range of k
    (the last round's k alone can be 0 although the run drafted), for a fixed k that k and,
    when rounds verified fewer (n-gram lookup found less, the run's end), the mean."""
    if s is None or not s.rounds:
        return str(policy) if policy is not None else "–"
    lo, hi = s.draft_length_min, s.draft_length_max
    spread = f"mean {s.mean_draft_length:.1f}" + (f" ({lo}–{hi})" if lo != hi else "")
    if policy == "auto":
        return f"auto · {spread}"
    if policy is not None and lo == hi == policy:
        return str(policy)
    return f"{policy} · {spread}" if policy is not None else spread


def counter_cells(s, speculative: bool, draft_length: int | str | None = None) -> list[tuple[str, str]]:
    """(metric key, formatted value) per counter of a pane, in display order."""
    cells = [("new_tokens", str(s.new_tokens) if s else "–"),
             ("tokens_per_s", fmt(s.tokens_per_s if s else None, ".1f")),
             ("ttft_s", fmt(s.ttft_s if s else None, ".2f", " s")),
             ("elapsed_s", fmt(s.elapsed_s if s else None, ".2f", " s"))]
    if s is not None and s.engine:  # a server lane: what its engine does not report says so
        return cells + endpoint_cells(s, speculative)
    if speculative:
        rate = s.acceptance_rate if s else None
        cells += [("acceptance_rate", fmt(rate * 100 if rate is not None else None, ".0f", "%")),
                  ("mean_acceptance_length", fmt(s.mean_acceptance_length if s else None)),
                  ("drafted / accepted", f"{s.drafted} / {s.accepted}" if s else "–"),
                  ("draft_length", draft_length_cell(draft_length, s)),
                  ("extra_memory_bytes", fmt_bytes(s.extra_memory_bytes) if s else "–")]
        if s is not None and s.tree:
            cells.append(("tree", s.tree if s.tree.startswith("not used")
                          else f"{s.tree}; {s.tree_rounds} of {s.rounds} rounds"))
    return cells


NOT_REPORTED = "not reported by this engine"


def endpoint_cells(s, speculative: bool) -> list[tuple[str, str]]:
    """The counters of a lane served by an OpenAI-compatible server (``s.engine`` names it):
    a counter its engine does not report reads "not reported by this engine"."""
    def cell(value, text):
        return NOT_REPORTED if value is None else text
    cells = [("engine", s.engine)]
    if speculative or s.drafted:
        rate = s.acceptance_rate
        both = None if s.drafted is None or s.accepted is None else 1
        cells += [("acceptance_rate", cell(rate, fmt(rate * 100 if rate is not None else None,
                                                     ".0f", "%"))),
                  ("mean_acceptance_length", cell(s.mean_acceptance_length,
                                                  fmt(s.mean_acceptance_length))),
                  ("drafted / accepted", cell(both, f"{s.drafted} / {s.accepted}")),
                  ("draft_length", NOT_REPORTED),
                  ("extra_memory_bytes", NOT_REPORTED)]
    return cells


# --- progress and status -------------------------------------------------------------------

def progress_html(step: StepView) -> str:
    """A progress bar with the step's name, its time so far and its estimate."""
    estimate = about(step.estimate_s)
    timing = f"{step.elapsed_s:.0f} s" + (f" of {estimate}" if estimate else "")
    if step.estimate_s and step.elapsed_s > step.estimate_s:
        timing = f"{step.elapsed_s:.0f} s (expected {estimate}: this machine is busier or slower)"
    value = (f'value="{step.fraction:.3f}" max="1"' if step.fraction is not None else "")
    return (f'<span class="sd-step" data-step="{html.escape(step.name)}">'
            f'<progress class="sd-progress" {value}></progress> '
            f'<span class="sd-step-name">{html.escape(step.name)}</span> '
            f'<span class="sd-step-time">· {html.escape(timing)}</span></span>')


def startup_html(step: StepView | None, done: list[DoneStep], ready: bool,
                 error: str | None = None, checking: bool = False) -> str:
    """The panel above the panes while the models of the chosen preset get ready.

    Args:
        checking: the models are ready and the page's draft checks still run in the
            background (a Send does not wait for them: the check process stops while a race
            runs), which the panel says beside Ready.
    """
    finished = " ".join(f'<span class="sd-done-step">{"✗" if d.failed else "✓"} '
                        f'{html.escape(d.name)}'
                        + ("" if getattr(d, "note", False) else f" ({d.seconds:.1f} s)")
                        + '</span>' for d in done)
    if error:
        body, state = f'<span class="sd-error">⚠ {html.escape(error)}</span>', "error"
    elif ready and checking:
        body = ("<b>Ready</b>: the models are loaded and warmed up; send a prompt. Checking "
                "which other drafts fit this target in the background (stopped while a race "
                "runs, so a Send does not wait for it).")
        state = "checking"
    elif ready:
        body = "<b>Ready</b>: the models are loaded and warmed up; send a prompt."
        state = "ready"
    else:
        body = ("<b>Getting ready</b>: the models load now, so that Send answers at once. "
                + (progress_html(step) if step else "starting…"))
        state = "loading"
    return (f'<div class="sd-startup" data-state="{state}">{body}'
            + (f'<div class="sd-done-steps">{finished}</div>' if finished else "") + "</div>")


def prefill_html(progress) -> str:
    """A lane's prefill of a long prompt (``race.PrefillProgress``) as a progress bar: tokens
    fed of the prompt's, and the time left at the rate of the chunks fed so far."""
    left = progress.left_s
    timing = f" · {about(left)} left" if left is not None else ""
    return (f'<span class="sd-step" data-step="prefill">'
            f'<progress class="sd-progress" value="{progress.fed / progress.total:.3f}" '
            f'max="1"></progress> <span class="sd-step-name">prefilling the prompt: '
            f'{progress.fed:,} of {progress.total:,} tokens</span>'
            f'<span class="sd-step-time">{html.escape(timing)}</span></span>')


def status_line(view: PaneView | None, step: StepView | None = None) -> str:
    """The status under a pane, as HTML; a loading pane shows the step in progress, a lane
    prefilling a long prompt how far it is."""
    if view is None:
        return "idle"
    if view.status == RUNNING and getattr(view, "prefill", None) is not None:
        return prefill_html(view.prefill)
    if view.status == DONE:
        return html.escape(f"done ({view.stats.finish_reason})" if view.stats else "done")
    if view.status == STOPPED:
        return html.escape(f"stopped: kept {view.stats.new_tokens if view.stats else 0} tokens")
    if view.status == ERROR:
        return html.escape(f"error: {view.error}")
    if view.status == SKIPPED and view.error:
        return html.escape(view.error)
    if view.status == LOADING and step is not None:
        return progress_html(step)
    return html.escape(STATUS_TEXT.get(view.status, view.status))


def counters_html(view: PaneView | None, speculative: bool, draft_length: int | str | None = None,
                  step: StepView | None = None) -> str:
    """The live counters under a pane: human labels with units, the metric key in the
    tooltip and in ``data-metric``."""
    s = view.stats if view else None
    grid = "".join(
        f'<div class="sd-cell" title="{html.escape(LABELS[key][1])}">'
        f'<span class="sd-label">{html.escape(LABELS[key][0])}</span>'
        f'<span class="sd-value" data-metric="{html.escape(key)}">{html.escape(value)}</span></div>'
        for key, value in counter_cells(s, speculative, draft_length))
    state = view.status if view else "idle"
    return (f'<div class="sd-counters" data-status="{state}">{grid}</div>'
            f'<div class="sd-status sd-status-{state}">{status_line(view, step)}</div>')


def not_compared(snap: RaceSnapshot | None) -> str | None:
    """Why a finished race has no speedup (a lane stopped, skipped or failed; the lanes'
    servers serve different models), else None: for the page's speedup chip and the ``/race``
    API's ``speedup_note`` (``RaceSnapshot.not_compared``)."""
    if snap is None or not snap.done:
        return None
    return snap.not_compared


def explanation_text(e, times: str = "×") -> str:
    """One sentence on why the race ended as it did, from a ``stats.RaceExplanation``: what
    verifying and drafting cost here in one-token steps, the mean acceptance length that breaks
    even and the one this run got, and the projection where verifying costs one step.
    ``times``: the sign after a speedup, as the speedup beside it is written ("×" on the page,
    "x" in the terminal)."""
    if e.mean_draft_length == 0:
        return (f"No draft tokens were verified (the drafter proposed none, e.g. prompt lookup "
                f"finding no match, or auto judged that none would save time here), so every "
                f"round was a plain one-token step, costing "
                f"{e.break_even_mean_acceptance_length:.2f} plain steps (the forward "
                f"{e.verify_cost_steps:.2f}, choosing the draft length "
                f"{e.draft_cost_steps:.2f}).")
    k = f"{e.mean_draft_length:.1f}"  # an average: a run's last rounds draft fewer
    drafts = f"{k} draft token{'' if k == '1.0' else 's'} a round on average"
    measured = (f"Verifying {drafts} cost {e.verify_cost_steps:.2f} one-token steps "
                f"here and drafting them {e.draft_cost_steps:.2f}, so breaking even takes a mean "
                f"acceptance length of {e.break_even_mean_acceptance_length:.2f}; this run got "
                f"{e.mean_acceptance_length:.2f}. ")
    if e.verify_cost_steps < 1:  # the plain lane's steps were the dearer: nothing to project
        return measured + ("Verifying cost less than the plain run's one-token steps, so those "
                           "steps were slowed (another process, a colder cache) and the "
                           "figures are not this machine's: no projection from them.")
    return measured + (f"Projection, not measured: where verifying costs "
                       f"one step (a GPU, Apple silicon), the same acceptance would give "
                       f"{e.projected_speedup_free_verification:.2f}{times} "
                       f"({e.mean_acceptance_length:.2f} / (1 + {e.draft_cost_steps:.2f})).")


EXPLANATION_TITLE = ("verify_cost_steps, draft_cost_steps: seconds per speculative round in "
                     "one-token forwards of the plain run; break_even_mean_acceptance_length = "
                     "their sum; projected_speedup_free_verification = mean_acceptance_length / "
                     "(min(1, verify_cost_steps) + draft_cost_steps) (docs/reference.md)")


def verdict_html(snap: RaceSnapshot | None, temperature: float) -> str:
    """Speedup between the panes, a warning beside it when the machine was busy during a lane or
    a drafter accepted almost nothing (``snap.warnings``), and the lossless badge."""
    if snap is None:
        return '<div class="sd-verdict"><span class="sd-chip">send a prompt to start the race</span></div>'
    chips = []
    reason = not_compared(snap)
    if reason:
        chips.append(f'<span class="sd-chip sd-speedup sd-na" data-speedup="not compared" '
                     f'title="speedup: tokens_per_s(speculative) / tokens_per_s(plain)">'
                     f'Speedup: not compared ({html.escape(reason)})</span>')
    elif snap.speedup is not None:
        word = "faster" if snap.speedup >= 1 else "slower"
        chips.append(f'<span class="sd-chip sd-speedup" data-speedup="{snap.speedup:.4f}" '
                     f'title="speedup: tokens_per_s(speculative) / tokens_per_s(plain)">'
                     f'Speedup {snap.speedup:.2f}× (speculative {word}, in tokens/s)</span>')
    shares = {name: view.stats.other_cpu_share for name, view in snap.panes.items()
              if view.stats is not None and view.stats.other_cpu_share is not None}
    busy_title = "other_cpu_share: " + ", ".join(f"{name} {share:.2f}"
                                                 for name, share in shares.items())
    for warning in snap.warnings:
        kind, title = ("busy", busy_title) if warning.startswith("machine busy") else (
            "acceptance", "acceptance_rate of the drafter in this run")
        chips.append(f'<span class="sd-chip sd-busy" data-warning="{kind}" '
                     f'title="{html.escape(title)}">⚠ {html.escape(warning)}</span>')
    plain, spec = snap.panes.get(PLAIN), snap.panes.get(SPECULATIVE)
    note = snap.lossless_note if temperature == 0 else None
    if note and not snap.done:  # said before the outputs are compared, not only after
        chips.append(precision_chip(note))
    if snap.done and plain and spec:
        if plain.status != DONE or spec.status != DONE:
            chips.append('<span class="sd-chip sd-na">lossless check: not compared (a run did '
                         'not finish)</span>')
        elif snap.identical is None:  # both finished, but not comparable (different models)
            chips.append(f'<span class="sd-chip sd-na">lossless check: not compared '
                         f'({html.escape(snap.not_compared or "no verdict")})</span>')
        elif temperature > 0:
            chips.append('<span class="sd-chip sd-na">temperature &gt; 0: both sample from the '
                         'same distribution, so the texts differ by chance, not by error</span>')
        elif snap.identical:
            caveat = (f" this time, though not guaranteed: {html.escape(note)}. {EXACT_CHECK}"
                      if note else "")
            chips.append(f'<span class="sd-chip sd-lossless" data-identical="true" '
                         f'data-lossless-expected="{"false" if note else "true"}">lossless: '
                         f'identical output ({len(plain.token_ids)} tokens){caveat}</span>')
        else:
            i = snap.first_divergence
            a = plain.tokens[i][0] if i < len(plain.tokens) else "(end)"
            b = spec.tokens[i][0] if i < len(spec.tokens) else "(end)"
            reason = f"{note}. {EXACT_CHECK}" if note else FLOAT_REASON
            chips.append(f'<span class="sd-chip sd-diverged" data-identical="false">outputs '
                         f'differ from token {i}: plain {html.escape(repr(a))}, speculative '
                         f'{html.escape(repr(b))}. Reason: {html.escape(reason)}</span>')
    elif snap.phase == "replay":
        chips.append(f'<span class="sd-chip">replay at measured pace: {snap.clock_s:.2f} s</span>')
    if not chips:
        chips.append('<span class="sd-chip">racing…</span>')
    why = ""
    if snap.explanation is not None:
        why = (f'<div class="sd-explain" title="{html.escape(EXPLANATION_TITLE)}">'
               f'{html.escape(explanation_text(snap.explanation))}</div>')
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


def pending_text(status: str, error: str | None = None, step: StepView | None = None) -> str:
    """What a pane without tokens says it waits for: a skipped lane's reason, the named step in
    progress (a load, a warm-up, a draft check) while preparing, else the status's words."""
    if status == SKIPPED and error:
        return error
    if status == LOADING and step is not None:
        return f"{step.name}…"  # the step's own words: "warming up …", "waiting for …"
    return STATUS_TEXT[status]


def chat_messages(turns: list[dict], speculative: bool, highlight: bool,
                  step: StepView | None = None) -> list[dict]:
    """gr.Chatbot messages for a pane (turns as :func:`specdemo.interfaces.ui.turn_of` makes
    them); ``step``: the named step in progress, which a preparing pane names."""
    out = []
    for t in turns:
        out.append({"role": "user", "content": t["user"]})
        if t["status"] == ERROR:  # what it produced before it failed, marked as cut
            body = (tokens_html(t["tokens"], highlight and speculative) if t["tokens"] else "") + (
                f'<div class="sd-error">⚠ {"cut here: " if t["tokens"] else ""}'
                f'{html.escape(t["error"] or "error")}</div>')
        elif t["status"] in (WAITING, LOADING, SKIPPED) and not t["tokens"]:
            text = pending_text(t["status"], t["error"], step)
            body = f'<div class="sd-pending">{html.escape(text)}</div>'
        else:
            body = tokens_html(t["tokens"], highlight and speculative)
        out.append({"role": "assistant", "content": body})
    return out


# --- charts (gradio's native plots take a pandas DataFrame) --------------------------------

#: d3-format specifier of the charts' axis ticks: plain numbers ("0", "1.5", "50", "100").
#: Vega formats ticks through d3-scale's ``tickFormat``, which sets a precision from the tick
#: step when the specifier has none: "~g" then became ".1~g" for ticks 50 apart, written "5e+1"
#: and "1e+2"; "r" (significant digits) is never written with an exponent.
AXIS_FORMAT = "~r"

def race_frame(snap: RaceSnapshot | None):
    """Tokens generated against seconds since each decode started, one line per lane (a point
    per engine event): columns ``seconds``, ``tokens``, ``lane``. Replays pass views cut at the
    replay clock, so the lines grow as the replay plays. Every lane starts at (0, 0), also
    before it has a token: gradio 6.31's line plot draws no lines after an update when the
    lanes (its colour domain) were not all there from the start."""
    import pandas as pd
    panes = snap.panes if snap else {name: None for name in PANES}
    rows = []
    for name, view in panes.items():
        label = LANE_LABELS.get(name, name)
        rows += [(0.0, 0, label)] + [(t, n, label) for t, n in (view.timeline if view else ())]
    frame = pd.DataFrame(rows, columns=["seconds", "tokens", "lane"])
    return frame.astype({"seconds": "float64", "tokens": "int64", "lane": "str"})  # typed axes


def acceptance_frame(view: PaneView | None):
    """Per-position acceptance of the speculative lane: columns ``position`` (draft position
    1..k with its counts, ``"3 (2/5)"``: accepted / verified, as text so the bars are
    categories and a 1.0 over three rounds reads as such), ``acceptance`` (0..1), ``accepted``
    and ``rounds`` (rounds in which that position was verified); positions never verified are
    left out."""
    import pandas as pd
    s = view.stats if view else None
    rows = []
    if s and s.position_drafted is not None:
        accepted = list(s.position_accepted) + [0] * len(s.position_drafted)
        rows = [(f"{i + 1} ({accepted[i]}/{n})", rate, accepted[i], n) for i, (rate, n) in
                enumerate(zip(s.per_position_acceptance, s.position_drafted)) if rate is not None]
    frame = pd.DataFrame(rows, columns=["position", "acceptance", "accepted", "rounds"])
    return frame.astype({"position": "str", "acceptance": "float64", "accepted": "int64",
                         "rounds": "int64"})


# --- the privacy line ----------------------------------------------------------------------

def _env_true(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def privacy_html(host: str, share: bool) -> str:
    """What this process does and does not talk to (each fact read from the live setting)."""
    local = host in ("127.0.0.1", "localhost", "::1")
    analytics_off = os.environ.get("GRADIO_ANALYTICS_ENABLED", "").strip().lower() in (
        "false", "0", "no", "off")
    facts = [
        (local, f"listening on {host}" + ("" if local else " (reachable from your network)")),
        (analytics_off, "gradio usage analytics " + ("off" if analytics_off else "ON")),
        (not share, "no share link" if not share else "public share link ON (--share)"),
        (True, "HF_HUB_OFFLINE=1: the model hub is never contacted" if _env_true("HF_HUB_OFFLINE")
         else "HF_HUB_OFFLINE unset: the hub is contacted only for a hub model not cached yet"),
        (True, "remote code from model repositories: off"),
    ]
    items = "".join(f'<span class="sd-fact {"sd-ok" if ok else "sd-warn"}">{html.escape(text)}</span>'
                    for ok, text in facts)
    return f'<div class="sd-privacy" id="sd-privacy">Privacy: {items}</div>'
