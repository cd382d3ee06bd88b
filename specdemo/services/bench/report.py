"""What a sweep writes: bench.csv, bench.json, PNG plots (matplotlib, Agg canvas), report.md,
and the short summaries the terminal and the app show. Every number is the cell's, formatted by
:func:`fmt`, so the files cannot disagree."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from ..._omp import describe as describe_omp
from .aggregate import best_draft_lengths
from .run import Sweep


def _figure(width: float, height: float, ncols: int = 1):
    """A matplotlib Figure on the Agg canvas (no pyplot: safe in the UI's worker threads)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, ncols, squeeze=False)[0]
    return figure, list(axes)


STYLE = {"specdemo": {"linestyle": "-", "marker": "o"},
         "transformers": {"linestyle": "--", "marker": "s"}}


def _value(cell: dict | None, name: str) -> float:
    value = None if cell is None else cell.get(name)
    return float("nan") if value is None else float(value)


def _cell(sweep: Sweep, task: str, k, engine: str) -> dict | None:
    key = (task, k, engine)
    return next((c for c in sweep.cells
                 if (c["task"], c["draft_length"], c["engine"]) == key and c["status"] == "ok"), None)


def _ranged(cells: list[dict | None], name: str) -> tuple[list[float], list[list[float]]]:
    """(medians, matplotlib ``yerr`` [below, above]) of metric ``name`` from its _min/_max."""
    y = [_value(c, name) for c in cells]
    return y, [[v - _value(c, f"{name}_min") for v, c in zip(y, cells)],
               [_value(c, f"{name}_max") - v for v, c in zip(y, cells)]]


def speedup_figure(sweep: Sweep):
    """Speedup vs draft length, one line per task and engine (bars: min..max over repeats)."""
    ks = list(sweep.config.draft_lengths)
    figure, (ax,) = _figure(7.5, 4.5)
    colors = _colors(len(sweep.config.tasks))
    shifts = (-0.04, 0.04) if len(sweep.config.engines) > 1 else (0.0,)  # engines side by side
    for color, task in zip(colors, sweep.config.tasks):
        for shift, engine in zip(shifts, sweep.config.engines):
            cells = [_cell(sweep, task, k, engine) for k in ks]
            y, err = _ranged(cells, "speedup")
            ax.errorbar([i + shift for i in range(len(ks))], y, yerr=err, color=color, capsize=3,
                        label=f"{task} ({engine})", **STYLE[engine])
    ax.axhline(1.0, color="grey", linestyle=":", label="plain (1.0x)")
    ax.set(xticks=range(len(ks)), xticklabels=[str(k) for k in ks], xlabel="draft length",
           ylabel="speedup over plain (x)", xlim=(-0.5, len(ks) - 0.5))
    ax.set_title(f"Speedup: {sweep.target}\n+ {sweep.draft}", fontsize="medium")  # long names
    ax.legend(fontsize="small", ncols=2)
    return figure


def acceptance_figure(sweep: Sweep):
    """Per-position acceptance, one panel per task, one line per draft length and engine."""
    from matplotlib.ticker import MaxNLocator
    tasks, ks = sweep.config.tasks, list(sweep.config.draft_lengths)
    figure, axes = _figure(3.2 * len(tasks) + 1, 3.4, ncols=len(tasks))
    colors = _colors(len(ks))
    for ax, task in zip(axes, tasks):
        for color, k in zip(colors, ks):
            for engine in sweep.config.engines:
                rates = (_cell(sweep, task, k, engine) or {}).get("per_position_acceptance") or []
                if rates:
                    ax.plot(range(1, len(rates) + 1), [float("nan") if r is None else r for r in rates],
                            color=color, label=f"k={k} ({engine})", **STYLE[engine])
        ax.set(title=task, xlabel="draft position", ylim=(0, 1.05))
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes[0].set_ylabel("P(accepted | earlier accepted)")
    _legend_below(figure, axes)
    return figure


def tokens_per_s_figure(sweep: Sweep):
    """Tokens/s per task: speculative bars per draft length and engine, plain as lines."""
    tasks, ks = sweep.config.tasks, list(sweep.config.draft_lengths)
    engines = sweep.config.engines
    figure, axes = _figure(3.2 * len(tasks) + 1, 3.6, ncols=len(tasks))
    width = 0.8 / len(engines)
    for ax, task in zip(axes, tasks):
        for j, engine in enumerate(engines):
            cells = [_cell(sweep, task, k, engine) for k in ks]
            y, err = _ranged(cells, "tokens_per_s")
            ax.bar([i + (j - (len(engines) - 1) / 2) * width for i in range(len(ks))], y, width,
                   yerr=err, capsize=2, label=f"{engine} speculative", color=f"C{j}")
            plain = next((c for c in cells if c is not None), None)
            if plain is not None:
                ax.axhline(_value(plain, "plain_tokens_per_s"), color=f"C{j}", label=f"{engine} plain",
                           linestyle=STYLE[engine]["linestyle"])
        ax.set(title=task, xticks=range(len(ks)), xticklabels=[str(k) for k in ks], xlabel="draft length")
    axes[0].set_ylabel("tokens/s")
    _legend_below(figure, axes)
    return figure


def concurrency_figure(sweep: Sweep):
    """Total throughput vs concurrent requests: batched plain vs sequential speculative."""
    figure, (ax,) = _figure(6, 4)
    for j, mode in enumerate(("plain_batched", "speculative_sequential")):
        rows = [r for r in sweep.concurrency if r["mode"] == mode]
        ax.plot([r["concurrency"] for r in rows], [_value(r, "total_tokens_per_s") for r in rows],
                marker="o", color=f"C{j}", label=mode.replace("_", ", "))
    levels = sorted({r["concurrency"] for r in sweep.concurrency})
    ax.set(xticks=levels, xticklabels=[str(n) for n in levels], ylim=(0, None),
           xlabel="concurrent requests", ylabel="total tokens/s", title="Throughput under load")
    ax.legend()
    return figure


def _legend_below(figure, axes) -> None:
    """One legend for all panels, under them (never over the data)."""
    entries = {}
    for ax in axes:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            entries.setdefault(label, handle)
    if entries:
        figure.legend(entries.values(), entries.keys(), loc="outside lower center",
                      ncols=min(len(entries), 4), fontsize="small")


def _colors(n: int) -> list[str]:
    return [f"C{i % 10}" for i in range(n)]


def figures(sweep: Sweep) -> dict:
    """{name: matplotlib Figure}: speedup, acceptance, tokens_per_s (+ concurrency when measured)."""
    out = {"speedup": speedup_figure(sweep), "acceptance": acceptance_figure(sweep),
           "tokens_per_s": tokens_per_s_figure(sweep)}
    if sweep.concurrency:
        out["concurrency"] = concurrency_figure(sweep)
    return out


def save_png(figure, path: Path) -> Path:
    figure.savefig(path, format="png", dpi=110)
    return path


# ----------------------------------------------------------------------------- outputs

CSV_COLUMNS = (
    "task", "draft_length", "engine", "method", "status", "prompts", "repeats", "runs",
    "identical_runs", "identical", "same_as_specdemo_plain",
    "plain_tokens_per_s", "plain_tokens_per_s_min", "plain_tokens_per_s_max",
    "tokens_per_s", "tokens_per_s_min", "tokens_per_s_max",
    "speedup", "speedup_min", "speedup_max",
    "acceptance_rate", "acceptance_rate_min", "acceptance_rate_max",
    "mean_acceptance_length", "mean_acceptance_length_min", "mean_acceptance_length_max",
    "per_position_acceptance",
    "plain_ttft_s", "plain_ttft_s_min", "plain_ttft_s_max", "ttft_s", "ttft_s_min", "ttft_s_max",
    "draft_s", "verify_s", "peak_memory_bytes", "peak_memory_method", "extra_memory_bytes", "new_tokens",
    "plain_new_tokens",
    "vs_transformers", "vs_transformers_min", "vs_transformers_max",
    "plain_vs_transformers", "plain_vs_transformers_min", "plain_vs_transformers_max",
)
CONCURRENCY_COLUMNS = ("concurrency", "mode", "draft_length", "total_tokens_per_s",
                       "total_tokens_per_s_min", "total_tokens_per_s_max", "mean_latency_s",
                       "new_tokens", "outputs_equal_speculative", "speculative_over_batched_plain")


def fmt(value) -> str:
    """How a value appears in the CSV and in report.md (one function: they cannot disagree)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(fmt(v) or "-" for v in value)
    return str(value)


def write_csv(rows: list[dict], columns: tuple[str, ...], path: Path) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f)
        writer.writerow(columns)
        for row in rows:
            writer.writerow([fmt(row.get(c)) for c in columns])
    return path


def write_outputs(sweep: Sweep, out_dir: str | Path, figs: dict | None = None) -> dict[str, Path]:
    """Write bench.csv, bench.json, the PNG plots, concurrency.csv (when measured) and report.md.

    Args:
        figs: the figures of :func:`figures` when already drawn (else drawn here).
    Returns:
        {name: path} of the files written.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": write_csv(sweep.cells, CSV_COLUMNS, out / "bench.csv")}
    if sweep.concurrency:
        paths["concurrency_csv"] = write_csv(sweep.concurrency, CONCURRENCY_COLUMNS,
                                             out / "concurrency.csv")
    (out / "bench.json").write_text(json.dumps(sweep.as_dict(), indent=1), encoding="utf-8")
    paths["json"] = out / "bench.json"
    for name, figure in (figs or figures(sweep)).items():
        paths[name] = save_png(figure, out / f"{name}.png")
    paths["report"] = out / "report.md"
    paths["report"].write_text(report_markdown(sweep, {k: p.name for k, p in paths.items()}),
                               encoding="utf-8")
    return paths


def best_lines(sweep: Sweep) -> list[str]:
    """One line per engine: the best draft length per task (from the cells' median speedups)."""
    return [f"**{engine}**: " + "; ".join(f"{task}: {_verdict(best)}" for task, best
                                          in best_draft_lengths(sweep.cells, engine).items())
            for engine in sweep.config.engines]


def _verdict(best: dict | None) -> str:
    if best is None:
        return "no measurement"
    k, s = best["draft_length"], best["speedup"]
    if s < 1:
        return f"none pays: plain is faster (best was k={k} at {fmt(s)}x)"
    return f"k={k} ({fmt(s)}x)"


REPORT_COLUMNS = ("task", "draft_length", "engine", "plain_tokens_per_s", "tokens_per_s", "speedup",
                  "speedup_min", "speedup_max", "acceptance_rate", "mean_acceptance_length",
                  "per_position_acceptance", "ttft_s", "draft_s", "verify_s", "peak_memory_bytes",
                  "identical", "status")


VERSUS_COLUMNS = ("task", "draft_length", "engine", "plain_vs_transformers", "vs_transformers",
                  "vs_transformers_min", "vs_transformers_max")


def report_markdown(sweep: Sweep, files: dict[str, str]) -> str:
    """A short report: what ran where, best draft length per task, the table, the plots."""
    c, m = sweep.config, sweep.machine
    device = m["device"] if m["device"] == "cpu" else f"{m['device']} ({m['device_name']})"
    lines = [
        f"# specdemo benchmark: {sweep.target} with draft `{sweep.draft}`", "",
        f"Machine: {device}, {m['dtype']}; CPU {m['cpu_model']}, "
        f"{m['cpu_cores_physical']} cores / {m['cpu_cores_logical']} threads, "
        f"{m['memory_total_bytes'] / 1e9:.1f} GB RAM; torch {m['torch']}, "
        f"transformers {m['transformers']}."
        + (f" {describe_omp(m['omp_wait'])}." if m.get("omp_wait") else "")
        + (f" native-w8a8 weight prefetch: {m['native_prefetch']['reason']}."
           if m.get("native_prefetch") else ""),
        f"Settings: tasks {', '.join(c.tasks)}; draft lengths {', '.join(map(str, c.draft_lengths))}; "
        f"{c.max_new_tokens} new tokens; temperature {c.temperature}; {c.repeats} repeat(s); "
        f"prompts per task: {c.prompts_per_task or 'all'}. Took {sweep.seconds:.0f} s.",
        _load_note(m), "",
        "Each cell pools the task's prompts per repeat (tokens/s = all new tokens / all seconds) and "
        "reports the median over repeats (min and max beside the speedup). The speedup is against "
        "the same engine's plain decoding of the same prompts; `identical` says whether every "
        "greedy speculative output equalled that plain output token for token. The transformers "
        "rows run the same model object through `generate()` (its statistics are read from its "
        "candidate generator). Numbers here are the CSV's (`bench.csv`), to the digit.", "",
        "## Best draft length per task", "",
    ]
    lines += [f"- {line}" for line in best_lines(sweep)]
    lines += ["", "## Results", "", "| " + " | ".join(REPORT_COLUMNS) + " |",
              "|" + "---|" * len(REPORT_COLUMNS)]
    for cell in sweep.cells:
        lines.append("| " + " | ".join(fmt(cell.get(col)).replace("|", "/") for col in REPORT_COLUMNS) + " |")
    if "transformers" in c.engines:
        lines += ["", "## specdemo against transformers", "",
                  "Ratios of our tokens/s to transformers' on the same prompts, model and dtype "
                  "(per repeat, then the median): `plain_vs_transformers` for plain decoding, "
                  "`vs_transformers` for speculative decoding at the same draft length.", "",
                  "| " + " | ".join(VERSUS_COLUMNS) + " |", "|" + "---|" * len(VERSUS_COLUMNS)]
        lines += ["| " + " | ".join(fmt(cell.get(col)) for col in VERSUS_COLUMNS) + " |"
                  for cell in sweep.cells if cell["engine"] == "specdemo" and cell["status"] == "ok"]
    lines += ["", "## Plots", ""]
    for name, title in (("speedup", "Speedup vs draft length"),
                        ("acceptance", "Acceptance rate per draft position"),
                        ("tokens_per_s", "Tokens/s: plain, specdemo and transformers")):
        if name in files:
            lines += [f"![{title}]({files[name]})", ""]
    if sweep.concurrency:
        lines += concurrency_section(sweep, files)
    return "\n".join(lines) + "\n"


def _load_note(machine: dict) -> str:
    """How much CPU other processes took during the sweep (contention hurts speculation most)."""
    share = machine.get("other_processes_cpu_share")
    if share is None:
        return ""
    note = f"Other processes used {share:.0%} of this machine's CPU time during the sweep"
    if share >= 0.1:
        return (note + ": the timings are disturbed. On a CPU, multi-token forwards (prefill, "
                "verification) suffer most from contention, so speculative numbers here are "
                "pessimistic; rerun on a quiet machine.")
    return note + "."


def concurrency_section(sweep: Sweep, files: dict[str, str]) -> list[str]:
    k = sweep.concurrency_draft_length
    lines = [
        "## Under load: concurrency sweep", "",
        f"N requests arrive at once (prompts of the tasks above, interleaved). **plain_batched**: "
        f"transformers `generate()` decodes all N as one batch (left padding), plain greedy. "
        f"**speculative_sequential**: our engine (batch size 1) serves them one after another with "
        f"draft length {k} (the best mean speedup above). total_tokens_per_s = all new tokens / "
        f"wall seconds; mean_latency_s = mean time until a request's last token. At each N both "
        f"modes serve the same N requests (the first N prompts, tasks interleaved), so compare them "
        f"at each N; the mix itself changes with N. A batch reads "
        f"the weights once per step for all N rows, so plain throughput grows with N while "
        f"batch-1 speculation cannot: its advantage (speculative_over_batched_plain) shrinks as "
        f"load grows and turns into a loss once batching wins, which is why servers such as vLLM "
        f"can disable speculation above a batch size.", "",
        "| " + " | ".join(CONCURRENCY_COLUMNS) + " |", "|" + "---|" * len(CONCURRENCY_COLUMNS)]
    for row in sweep.concurrency:
        lines.append("| " + " | ".join(fmt(row.get(col)) for col in CONCURRENCY_COLUMNS) + " |")
    lines.append("")
    if "concurrency" in files:
        lines += [f"![Throughput under load]({files['concurrency']})", ""]
    return lines



def summary_text(sweep: Sweep) -> str:
    """A few terminal lines: what ran, and the best draft length per task and engine."""
    backend = sweep.machine.get("backend", "transformers")
    weights = sweep.machine["dtype"] if backend == "transformers" else f"backend {backend}"
    head = (f"{sweep.target} + {sweep.draft} on {sweep.machine['device']} ({weights}), "
            f"{sweep.seconds:.0f} s")
    return "\n".join([head] + [f"  {line.replace('**', '')}" for line in best_lines(sweep)])
