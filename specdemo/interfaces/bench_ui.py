"""The app's Benchmark tab: the ``bench`` sweep with a progress bar, its plots and the CSV.

:func:`build_benchmark_tab` adds the components to the gradio Blocks (or Tab) being built, so the
app places it in a tab and a test can wrap it in ``gr.Blocks()`` alone. Every number comes from
:mod:`specdemo.services.bench` (the same cells the CSV holds); this module only lays them out.
Run standalone with ``python -m specdemo.interfaces.bench_ui``.
"""

from __future__ import annotations

import queue
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gradio as gr

from .. import PROJECT_DIR
from ..services import bench, endpoint_bench
from ..services.prompts import TASKS, load_prompts
from ..services.presets import PresetError, list_presets
from ..core.model_spec import builtin_spec
from ..models.builtin import FALLBACK_BUILTIN
from ..models.loading import cache_dir
from .ui_format import AXIS_FORMAT, about, chart_colors, lane_label
from .ui_i18n import DEFAULT, locale, t, words

DRAFT_LENGTH_CHOICES = ["1", "2", "3", "4", "6", "8", "12", "16", "auto"]
CONCURRENCY_CHOICES = ["1", "2", "4", "8", "16"]
TABLE_COLUMNS = ("task", "draft_length", "engine", "plain_tokens_per_s", "tokens_per_s", "speedup",
                 "speedup_min", "speedup_max", "acceptance_rate", "mean_acceptance_length",
                 "ttft_s", "identical", "status")
FALLBACK = {"target": builtin_spec(FALLBACK_BUILTIN), "draft": "ngram", "dtype": "auto",
            "quantization": "none"}


@dataclass
class BenchmarkTab:
    """The tab's components (for the app to wire further and for tests)."""

    preset: gr.Dropdown
    target: gr.Textbox
    draft: gr.Textbox
    tasks: gr.CheckboxGroup
    draft_lengths: gr.CheckboxGroup
    max_new_tokens: gr.Slider
    repeats: gr.Slider
    prompts_per_task: gr.Slider
    temperature: gr.Slider
    reference: gr.Checkbox
    concurrency: gr.CheckboxGroup
    run: gr.Button
    summary: gr.Markdown
    table: gr.Dataframe
    speedup_plot: gr.Plot
    acceptance_plot: gr.Plot
    tokens_plot: gr.Plot
    concurrency_plot: gr.Plot
    csv_file: gr.File
    report_file: gr.File
    estimate: gr.Markdown | None = None
    measured_intro: gr.Markdown | None = None
    measured_speedup: gr.LinePlot | None = None
    measured_tokens: gr.LinePlot | None = None


_PIPELINES = None  # a race.PipelineCache, made on first use (tests may put their own here)


def pipelines():
    """The tab's pipeline cache: ``get(target, draft, dtype, quantization) -> Pipeline``; the
    race page's (``ui_state.CACHE``), so a pairing the page has loaded is not prepared again."""
    global _PIPELINES
    if _PIPELINES is None:
        from .ui_state import CACHE  # lazy: imports torch
        _PIPELINES = CACHE
    return _PIPELINES


def _presets() -> tuple[list, str | None]:
    """(presets, default preset name); a broken preset file leaves the list empty."""
    try:
        presets = list(list_presets())
    except PresetError:
        return [], None
    default = next((p.name for p in presets if p.default), presets[0].name if presets else None)
    return presets, default


def pairing(preset_name: str | None) -> dict:
    """target, draft, dtype and quantization of a preset (a fallback when there is none)."""
    presets, _ = _presets()
    for p in presets:
        if p.name == preset_name:
            return {"target": p.target, "draft": p.draft, "dtype": p.dtype,
                    "quantization": p.quantization}
    return dict(FALLBACK)


def config_from_inputs(tasks, draft_lengths, max_new_tokens, repeats, prompts_per_task,
                       temperature, reference, concurrency) -> bench.BenchConfig:
    """The form's values as a :class:`bench.BenchConfig` (ValueError with what to fix)."""
    lengths = bench.parse_draft_lengths(",".join(draft_lengths or []))
    order = {k: i for i, k in enumerate(DRAFT_LENGTH_CHOICES)}
    lengths = tuple(sorted(lengths, key=lambda k: order.get(str(k), len(order))))
    return bench.BenchConfig(tasks=tuple(t for t in TASKS if t in (tasks or [])),
                             draft_lengths=lengths, max_new_tokens=int(max_new_tokens),
                             repeats=int(repeats), temperature=float(temperature),
                             prompts_per_task=int(prompts_per_task), reference=bool(reference),
                             concurrency=tuple(sorted(int(n) for n in concurrency or [])))


DECIMALS = {"plain_tokens_per_s": 1, "tokens_per_s": 1, "speedup": 2, "speedup_min": 2,
            "speedup_max": 2, "acceptance_rate": 2, "mean_acceptance_length": 2, "ttft_s": 2}


def table_cell(column: str, value) -> str:
    """A cell as the table shows it: tokens/s with 1 decimal, ratios and seconds with 2 (the
    CSV keeps the sweep's own precision); anything else as in the CSV."""
    if isinstance(value, float) and column in DECIMALS:
        return f"{value:.{DECIMALS[column]}f}"
    return bench.fmt(value)


def table_header(column: str) -> str:
    """A column name that may break only at its underscores (a zero-width space after each),
    never mid-word; the name itself stays the CSV's."""
    return column.replace("_", "_\u200b")


def results_table(sweep: bench.Sweep):
    """The cells as a DataFrame with the table's columns (:func:`table_cell` per value)."""
    import pandas as pd
    rows = [[table_cell(col, c.get(col)) for col in TABLE_COLUMNS] for c in sweep.cells]
    return pd.DataFrame(rows, columns=[table_header(col) for col in TABLE_COLUMNS])


REFERENCE_SWEEP = PROJECT_DIR / "docs" / "results" / "bench-ngram-transformers.json"
_SECONDS_PER_TOKEN: list[float] = []  # measured by this process's last sweep


def seconds_per_token() -> tuple[float | None, str]:
    """(seconds per decoded token, the words' key of where it comes from): this process's last
    sweep, else the reference sweep in docs/results (the built-in model on a 2-core CPU), else
    (None, "")."""
    if _SECONDS_PER_TOKEN:
        return _SECONDS_PER_TOKEN[-1], "bench_source_last"
    try:
        import json
        runs = json.loads(REFERENCE_SWEEP.read_text())["runs"]
        tokens = sum(r["new_tokens"] for r in runs)
        return sum(r["elapsed_s"] for r in runs) / tokens, "bench_source_docs"
    except (OSError, ValueError, KeyError, TypeError, ZeroDivisionError):
        return None, ""


def estimate_text(tasks, draft_lengths, max_new_tokens, repeats, prompts_per_task, reference,
                  concurrency=(), lang=DEFAULT) -> str:
    """How many decodes the form's sweep runs and about how long it takes, for the line above
    Run: decodes x max new tokens x seconds per token (:func:`seconds_per_token`)."""
    lengths = list(draft_lengths or [])
    theirs = 1 + len([k for k in lengths if k != "auto"])  # transformers has no "auto"
    per_prompt = 1 + len(lengths) + (theirs if reference else 0)
    decodes = len(tasks or []) * int(prompts_per_task) * int(repeats) * per_prompt
    tokens = decodes * int(max_new_tokens)
    rate, source = seconds_per_token()
    text = t("bench_estimate", lang, decodes=decodes, tokens=int(max_new_tokens))
    if rate is None or not decodes:
        return text + ("." if locale(lang) == DEFAULT else "。")
    extra = t("bench_plus_concurrency", lang) if concurrency else ""
    return text + t("bench_estimate_time", lang, time=about(tokens * rate, lang), extra=extra,
                    rate=f"{rate:.3f}", source=t(source, lang))


def output_dir() -> Path:
    """The tab's output folder, ``<cache>/benchmark-tab`` (emptied for each run): one folder,
    not a new temporary one per run."""
    import shutil

    out = cache_dir() / "benchmark-tab"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True, exist_ok=True)
    return out


def run_benchmark(preset_name, target, draft, tasks, draft_lengths, max_new_tokens, repeats,
                  prompts_per_task, temperature, reference, concurrency, lang=DEFAULT,
                  backend: str | None = None, progress=gr.Progress()):
    """The Run button: load, sweep with progress, write the files, show plots and table.
    ``backend``: the app's ``--backend`` for a pairing the page has not loaded (None: the
    pipeline cache's own).

    Raises:
        gr.Error: bad settings, a model that cannot be loaded, or an incompatible draft.
    """
    try:
        config = config_from_inputs(tasks, draft_lengths, max_new_tokens, repeats,
                                    prompts_per_task, temperature, reference, concurrency)
    except ValueError as exc:
        from .ui_race import refusal  # lazy: imports torch
        raise refusal(str(exc)) from None
    pair = pairing(preset_name)
    target, draft = (target or pair["target"]).strip(), (draft or pair["draft"]).strip()
    how = (pair["dtype"] if target == pair["target"] else "auto",
           pair["quantization"] if target == pair["target"] else None)
    loaded = getattr(pipelines(), "loaded", lambda *a: None)(target, draft, *how)
    progress(0, desc=t("bench_loading" if loaded is None else "bench_loaded", lang,
                       target=target, draft=draft))
    try:
        pipe = pipelines().get(target, draft, *how, **({"backend": backend} if backend else {}))
        if loaded is None:
            progress(0, desc=t("bench_warming", lang))
        prompts = load_prompts(config.tasks)
        sweep = on_device(lambda report: bench.run_sweep(pipe, prompts, config, show_bar=False,
                                                         progress=report),
                          lambda done, total, desc: progress((done, total), desc=desc))
    except Exception as exc:  # noqa: BLE001 - ModelLoadError, incompatible draft, out of memory
        from ..services.race import describe_error  # lazy: imports torch
        raise gr.Error(describe_error(exc))
    tokens = sum(r.new_tokens for r in sweep.runs)
    if tokens:
        _SECONDS_PER_TOKEN.append(sum(r.elapsed_s for r in sweep.runs) / tokens)
    figs = bench.figures(sweep)
    out = output_dir()
    paths = bench.write_outputs(sweep, out, figs)
    summary = "\n".join([f"{bench.summary_text(sweep).splitlines()[0]}. {t('bench_best', lang)}"]
                        + [f"- {line}" for line in bench.best_lines(sweep)]
                        + ["\n" + t("bench_files", lang, path=out)])
    concurrency_fig = figs.get("concurrency")
    return (summary, results_table(sweep), figs["speedup"], figs["acceptance"], figs["tokens_per_s"],
            gr.Plot(value=concurrency_fig, visible=concurrency_fig is not None),
            str(paths["csv"]), str(paths["report"]))


def on_device(job: Callable[[Callable], object], progress: Callable[[int, int, str], None]):
    """Run ``job(report)`` on the device thread, where the race and ``app.py``'s loads run, and
    pass its ``report(done, total, desc)`` calls to ``progress`` on this (the handler's) thread,
    where gradio can send them. On a 2-core CPU the same decodes measured ~20% slower on a
    gradio worker thread than on the thread ``python -m specdemo bench`` uses (torch's OpenMP
    teams are per calling thread), so the tab's numbers would not have matched the CLI's.

    Returns:
        What ``job`` returned (its exception is raised here).
    """
    from ..services.race import DEVICE  # lazy: imports torch
    if DEVICE.on_device():
        return job(progress)
    updates: queue.SimpleQueue = queue.SimpleQueue()
    future = DEVICE.submit(lambda: job(lambda *update: updates.put(update)))
    while not future.done() or not updates.empty():
        try:
            progress(*updates.get(timeout=0.2))
        except queue.Empty:
            continue
    return future.result()


#: the servers' concurrency sweep the tab draws: llama-server plain against n-gram drafting at
#: 1, 2, 4 and 8 requests (docs/engines.md), and the command that wrote it
MEASURED_SWEEP = PROJECT_DIR / "docs" / "results" / "engines-concurrency.csv"
MEASURED_COMMAND = "scripts/engines_concurrency.sh OUT"


def measured_frames(rows: list[dict], lang=DEFAULT):
    """The charts' data from a concurrency CSV's rows (``endpoint_bench.read_csv``): (speedup
    frame: ``concurrency``, ``speedup``; throughput frame: ``concurrency``, ``tokens_per_s``,
    ``lane``, the lane's legend word in ``lang``), both in numeric order of concurrency. The
    levels are text, one evenly spaced tick each (1, 2, 4, 8; a number axis would tick 1.2, 1.4),
    which the charts keep in this order (``sort``: :func:`levels`)."""
    import pandas as pd
    speedup = pd.DataFrame([(str(n), x) for n, x in endpoint_bench.speedups(rows)],
                           columns=["concurrency", "speedup"])
    tokens = pd.DataFrame(
        [(str(r["concurrency"]), r["total_tokens_per_s"], lane_label(r["lane"], lang))
         for r in sorted(rows, key=lambda r: (r["lane"] != "plain", r["concurrency"]))
         if r["total_tokens_per_s"] is not None],
        columns=["concurrency", "tokens_per_s", "lane"])
    return (speedup.astype({"concurrency": "str", "speedup": "float64"}),
            tokens.astype({"concurrency": "str", "tokens_per_s": "float64", "lane": "str"}))


def levels(rows: list[dict]) -> list[str]:
    """The sweep's concurrency levels in numeric order, as the charts' x values."""
    return [str(n) for n in sorted({r["concurrency"] for r in rows})]


def measured_charts(lang=DEFAULT, path: Path = MEASURED_SWEEP) -> tuple[str, dict, dict]:
    """The measured sweep in ``lang``: (the line above the charts, the speedup chart's and the
    throughput chart's properties: value, titles, visible); a file that cannot be read is said
    in the line and the charts are hidden."""
    try:
        rows = endpoint_bench.read_csv(path)
    except (OSError, ValueError) as exc:
        return t("bench_measured_missing", lang, error=exc), {"visible": False}, {"visible": False}
    speedup, tokens = measured_frames(rows, lang)
    loads = [r["load_before"] for r in rows if r["load_before"] is not None]
    cpu = next((r["cpu_model"] for r in rows if r["cpu_model"]), None)
    shown = path.relative_to(PROJECT_DIR) if path.is_relative_to(PROJECT_DIR) else path.name
    intro = t("bench_measured_intro", lang, machine=cpu or t("bench_not_recorded", lang),
              load=f"{loads[0]:.2f}" if loads else t("bench_not_recorded", lang),
              path=shown, command=MEASURED_COMMAND)
    axis = {"x_title": t("bench_measured_x", lang), "sort": levels(rows), "visible": True}
    return (intro,
            {"value": speedup, "title": t("bench_measured_plot", lang),
             "y_title": t("bench_measured_speedup_y", lang), **axis},
            {"value": tokens, "title": t("bench_measured_tokens_plot", lang),
             "y_title": t("bench_measured_tokens_y", lang), "color_title": t("chart_lane", lang),
             "color_map": chart_colors(lang), **axis})


def measured_view(lang=DEFAULT) -> tuple:
    """:func:`measured_charts` as updates of the tab's line and charts (the page's language
    changed)."""
    intro, speedup, tokens = measured_charts(lang)
    return intro, gr.LinePlot(**speedup), gr.LinePlot(**tokens)


def _measured_components() -> tuple[gr.Markdown, gr.LinePlot, gr.LinePlot]:
    """The measured sweep's line and charts, in English until the page redraws them in its
    language (:func:`measured_view`)."""
    intro, speedup, tokens = measured_charts(DEFAULT)
    markdown = gr.Markdown(intro, elem_id="bench-measured-intro")
    with gr.Row():
        speedup_plot = gr.LinePlot(x="concurrency", y="speedup", y_lim=[0, None], height=260,
                                   x_label_angle=0, y_axis_format=AXIS_FORMAT,
                                   elem_id="bench-measured-speedup", show_label=False, **speedup)
        tokens_plot = gr.LinePlot(x="concurrency", y="tokens_per_s", color="lane", y_lim=[0, None],
                                  height=260, x_label_angle=0, y_axis_format=AXIS_FORMAT,
                                  elem_id="bench-measured-tokens", show_label=False, **tokens)
    return markdown, speedup_plot, tokens_plot


def on_preset(preset_name):
    pair = pairing(preset_name)
    return pair["target"], pair["draft"]


def build_benchmark_tab(lang: gr.Radio | None = None, backend: str | None = None) -> BenchmarkTab:
    """Add the Benchmark components to the Blocks/Tab being built; returns them.

    Args:
        lang: the page's language switch (``ui_i18n``), whose value the tab's computed lines
            (the estimate, the progress, the summary) are written in; English without one.
        backend: the app's ``--backend``, for the pairings the race page has not loaded.

    Nothing loads here: models load when Run is pressed. The run shares the app's ``device``
    concurrency group, so it never overlaps a race (each would slow the other and both numbers
    would be wrong).
    """
    presets, default = _presets()
    start = pairing(default)
    gr.Markdown(words("bench_intro"), elem_id="bench-intro")
    with gr.Row():
        preset = gr.Dropdown([p.name for p in presets], value=default, label=words("preset"),
                             elem_id="bench-preset", interactive=bool(presets))
        target = gr.Textbox(start["target"], label=words("bench_target"), elem_id="bench-target")
        draft = gr.Textbox(start["draft"], label=words("bench_draft"),
                           elem_id="bench-draft")
    with gr.Row():
        tasks = gr.CheckboxGroup(list(TASKS), value=list(TASKS), label=words("bench_tasks"), elem_id="bench-tasks")
        draft_lengths = gr.CheckboxGroup(DRAFT_LENGTH_CHOICES, value=["1", "2", "4", "8", "auto"],
                                         label=words("bench_draft_lengths"), elem_id="bench-draft-lengths")
    with gr.Row():
        max_new_tokens = gr.Slider(8, 512, value=64, step=8, label=words("max_new_tokens"),
                                   elem_id="bench-max-new-tokens")
        repeats = gr.Slider(1, 10, value=1, step=1, label=words("bench_repeats"),
                            elem_id="bench-repeats")
        prompts_per_task = gr.Slider(1, 8, value=2, step=1, label=words("bench_prompts"),
                                     elem_id="bench-prompts-per-task")
        temperature = gr.Slider(0.0, 2.0, value=0.0, step=0.05, label=words("temperature"),
                                elem_id="bench-temperature")
    with gr.Row():
        reference = gr.Checkbox(True, label=words("bench_reference"),
                                elem_id="bench-reference")
        concurrency = gr.CheckboxGroup(CONCURRENCY_CHOICES, value=[],
                                       label=words("bench_concurrency"),
                                       elem_id="bench-concurrency")
    form = [tasks, draft_lengths, max_new_tokens, repeats, prompts_per_task, reference, concurrency]
    estimate = gr.Markdown(estimate_text(*(c.value for c in form)), elem_id="bench-estimate")
    run = gr.Button(words("bench_run"), variant="primary", elem_id="bench-run")
    summary = gr.Markdown("", elem_id="bench-summary")
    with gr.Row():
        speedup_plot = gr.Plot(label=words("bench_speedup_plot"), elem_id="bench-speedup-plot")
        tokens_plot = gr.Plot(label=words("bench_tokens_plot"), elem_id="bench-tokens-plot")
    with gr.Row():
        acceptance_plot = gr.Plot(label=words("bench_acceptance_plot"), elem_id="bench-acceptance-plot")
        concurrency_plot = gr.Plot(label=words("bench_concurrency_plot"), elem_id="bench-concurrency-plot",
                                   visible=False)
    table = gr.Dataframe(headers=[table_header(c) for c in TABLE_COLUMNS],
                         label=words("bench_table"),
                         elem_id="bench-table", interactive=False, wrap=True)
    with gr.Row():
        csv_file = gr.File(label="bench.csv", elem_id="bench-csv", interactive=False)
        report_file = gr.File(label="report.md", elem_id="bench-report", interactive=False)
    measured_intro, measured_speedup, measured_tokens = _measured_components()

    preset.change(on_preset, preset, [target, draft], api_visibility="undocumented")
    language = [lang] if lang is not None else []
    if lang is not None:
        lang.change(measured_view, lang, [measured_intro, measured_speedup, measured_tokens],
                    api_visibility="private", show_progress="hidden")
    for control in form + language:
        control.change(estimate_text, form + language, estimate, api_visibility="private",
                       show_progress="hidden")
    run.click(run_benchmark,
              [preset, target, draft, tasks, draft_lengths, max_new_tokens, repeats,
               prompts_per_task, temperature, reference, concurrency]
              + (language or [gr.State(DEFAULT)]) + [gr.State(backend)],
              [summary, table, speedup_plot, acceptance_plot, tokens_plot, concurrency_plot,
               csv_file, report_file],
              concurrency_id="device", concurrency_limit=1, api_name="benchmark",
              api_visibility="undocumented")
    return BenchmarkTab(preset, target, draft, tasks, draft_lengths, max_new_tokens, repeats,
                        prompts_per_task, temperature, reference, concurrency, run, summary, table,
                        speedup_plot, acceptance_plot, tokens_plot, concurrency_plot, csv_file,
                        report_file, estimate, measured_intro, measured_speedup, measured_tokens)


def build_standalone() -> gr.Blocks:
    """The tab alone in a page (``python -m specdemo.interfaces.bench_ui``)."""
    with gr.Blocks(title="specdemo benchmark", analytics_enabled=False) as demo:
        build_benchmark_tab()
    return demo


if __name__ == "__main__":
    build_standalone().launch(server_name="127.0.0.1")
