"""``bench --plain-endpoint URL --spec-endpoint URL --concurrency 1,2,4``: servers under load.

For each concurrency level N, N requests start at once (threads released together; prompts of
the tasks interleaved), first against the plain lane's server, then against the speculative
lane's (lanes one after the other, never both at once). Per level and lane:
``total_tokens_per_s`` = all new tokens (the server's ``usage``) / wall seconds from the first
request's start to the last one's end; ``mean_latency_s`` = mean seconds until a request's last
chunk; drafted / accepted = the sum of what the engine reported over every request of the
level's repeats (None when it does not report them). ``speedup`` per level = speculative / plain total tokens/s.
Each row also names the machine (``cpu_model``) and the 1-minute load average at the level's start
and end (``load_before``, ``load_after``): the servers' own work raises the second, the first
says how busy the machine was with other work.

A llama-server decodes up to ``--parallel`` requests at once; more wait for a slot, which is the
load a server sees. Writes ``concurrency.csv``, ``concurrency.json``, ``concurrency.png`` and
``report.md`` (with date, machine, servers).
"""

from __future__ import annotations

import csv
import json
import os
import platform
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from statistics import median

from .endpoints import Endpoint, EndpointError, shown_url, stream_events
from ..core.stats import ratio
from .bench.report import _figure
from .. import OMP_WAIT
from ..models.hardware import _cpu_name

COLUMNS = ("concurrency", "lane", "engine", "endpoint", "requests", "repeats",
           "total_tokens_per_s", "total_tokens_per_s_min", "total_tokens_per_s_max",
           "mean_latency_s", "mean_ttft_s", "new_tokens", "drafted", "accepted",
           "acceptance_rate", "speedup", "errors", "cpu_model", "load_before", "load_after")


def one_request(endpoint: Endpoint, prompt: str, settings, start_at: threading.Barrier,
                t0: list[float]) -> dict:
    """Stream one request after every thread of its level is ready; its tokens, times, counters."""
    start_at.wait()
    events = stream_events(endpoint, [{"role": "user", "content": prompt}], settings)
    last = None
    try:
        for event in events:
            last = event
    except EndpointError as exc:
        return {"error": str(exc)}
    s = last.stats
    return {"new_tokens": s.new_tokens, "end_s": time.perf_counter() - t0[0],
            "ttft_s": s.ttft_s, "drafted": s.drafted, "accepted": s.accepted}


def level(endpoint: Endpoint, prompts: list[str], n: int, settings) -> dict:
    """N simultaneous requests; {tokens, seconds, latencies, ttfts, drafted, accepted, errors}."""
    barrier = threading.Barrier(n + 1)
    t0 = [0.0]
    with ThreadPoolExecutor(n) as pool:
        futures = [pool.submit(one_request, endpoint, prompts[i % len(prompts)], settings,
                               barrier, t0) for i in range(n)]
        t0[0] = time.perf_counter()
        barrier.wait()
        results = [f.result() for f in futures]
    ok = [r for r in results if "error" not in r]
    seconds = max((r["end_s"] for r in ok), default=0.0)

    def total(name):
        values = [r[name] for r in ok]
        return None if not values or any(v is None for v in values) else sum(values)
    return {"tokens": sum(r["new_tokens"] for r in ok), "seconds": seconds,
            "latencies": [r["end_s"] for r in ok], "ttfts": [r["ttft_s"] for r in ok if r["ttft_s"]],
            "drafted": total("drafted"), "accepted": total("accepted"),
            "errors": [r["error"] for r in results if "error" in r]}


def load_average() -> float | None:
    """The 1-minute load average of this machine (None where the OS keeps none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except (OSError, AttributeError):
        return None


def sweep(endpoints: dict, prompts: list[str], levels: tuple[int, ...], settings, repeats: int,
          progress=print) -> list[dict]:
    """Rows (see :data:`COLUMNS`) for every lane with an endpoint and every level."""
    rows = []
    for lane, endpoint in endpoints.items():
        if endpoint is None:
            continue
        # One untimed request first: the server's first decode pays one-time costs.
        for _ in stream_events(endpoint, [{"role": "user", "content": prompts[0]}], settings):
            pass
        for n in levels:
            load_before = load_average()
            runs = []
            for r in range(repeats):
                runs.append(level(endpoint, prompts, n, settings))
                progress(f"{lane}: concurrency {n}, repeat {r + 1}/{repeats}: "
                         f"{ratio(runs[-1]['tokens'], runs[-1]['seconds']) or 0:.1f} tokens/s")
            tps = [ratio(run["tokens"], run["seconds"]) for run in runs]
            tps = [t for t in tps if t is not None]
            drafted = [run["drafted"] for run in runs]
            accepted = [run["accepted"] for run in runs]
            known = all(d is not None for d in drafted) and all(a is not None for a in accepted)
            rows.append({
                "concurrency": n, "lane": lane, "engine": endpoint.engine,
                "endpoint": shown_url(endpoint.url), "requests": n, "repeats": repeats,
                "total_tokens_per_s": _round(median(tps)) if tps else None,
                "total_tokens_per_s_min": _round(min(tps)) if tps else None,
                "total_tokens_per_s_max": _round(max(tps)) if tps else None,
                "mean_latency_s": _round(median([sum(r["latencies"]) / len(r["latencies"])
                                                 for r in runs if r["latencies"]] or [0.0])),
                "mean_ttft_s": _round(median([sum(r["ttfts"]) / len(r["ttfts"])
                                              for r in runs if r["ttfts"]] or [0.0])),
                "new_tokens": median([run["tokens"] for run in runs]),
                "drafted": sum(drafted) if known else None,
                "accepted": sum(accepted) if known else None,
                "acceptance_rate": _round(ratio(sum(accepted), sum(drafted))) if known else None,
                "speedup": None,
                "errors": "; ".join(sorted({e for run in runs for e in run["errors"]})) or None,
                "cpu_model": _cpu_name(), "load_before": load_before, "load_after": load_average()})
    by = {(r["lane"], r["concurrency"]): r for r in rows}
    for r in rows:
        plain = by.get(("plain", r["concurrency"]))
        if r["lane"] == "speculative" and plain and plain["total_tokens_per_s"]:
            r["speedup"] = _round(ratio(r["total_tokens_per_s"] or 0.0, plain["total_tokens_per_s"]))
    return rows


def _round(x, digits: int = 3):
    return None if x is None else round(x, digits)


def figure(rows: list[dict], meta: dict | None = None):
    """Total tokens/s per level, one line per lane, and the speedup per level; with ``meta``,
    the machine and its load average above them (:func:`machine_line`)."""
    fig, (ax, ax2) = _figure(9, 4.1 if meta else 3.8, ncols=2)
    for j, lane in enumerate(("plain", "speculative")):
        mine = sorted((r for r in rows if r["lane"] == lane and r["total_tokens_per_s"] is not None),
                      key=lambda r: r["concurrency"])
        if mine:
            ax.plot([r["concurrency"] for r in mine], [r["total_tokens_per_s"] for r in mine],
                    marker="o", color=f"C{j}", label=f"{lane} ({mine[0]['engine']})")
    levels = sorted({r["concurrency"] for r in rows})
    ax.set(xticks=levels, xlabel="concurrent requests", ylabel="total tokens/s", ylim=(0, None),
           title="Throughput under load")
    ax.legend(fontsize="small")
    gains = sorted((r for r in rows if r["speedup"] is not None), key=lambda r: r["concurrency"])
    ax2.plot([r["concurrency"] for r in gains], [r["speedup"] for r in gains], marker="o", color="C2")
    ax2.axhline(1.0, color="grey", linestyle=":")
    ax2.set(xticks=levels, xlabel="concurrent requests", ylabel="speculative / plain",
            title="Speedup under load", ylim=(0, max([1.2] + [r["speedup"] * 1.15 for r in gains])))
    if meta:
        fig.suptitle(machine_line(meta), fontsize="small")
    return fig


def loads(rows: list[dict]) -> tuple[float | None, float | None]:
    """(1-minute load average when the sweep's first level started, when its last ended)."""
    return ((rows[0].get("load_before"), rows[-1].get("load_after")) if rows else (None, None))


def machine_line(meta: dict) -> str:
    """'<date>, <CPU> (<n> logical cores), load average <before> before, <after> after'."""
    m = meta["machine"]
    before, after = meta.get("load_before"), meta.get("load_after")
    load = ("" if before is None else
            f", 1-minute load average {before:.2f} before, {after:.2f} after")
    return f"{meta['date']}, {m['cpu_model']} ({m['cpu_cores_logical']} logical cores){load}"


def machine() -> dict:
    import os
    return {"cpu_model": _cpu_name(), "cpu_cores_logical": os.cpu_count(), "omp_wait": OMP_WAIT,
            "platform": platform.platform(), "python": platform.python_version()}


def write(rows: list[dict], out: Path, meta: dict) -> dict[str, Path]:
    out.mkdir(parents=True, exist_ok=True)
    meta = {**meta, **dict(zip(("load_before", "load_after"), loads(rows)))}
    paths = {"csv": out / "concurrency.csv", "json": out / "concurrency.json",
             "png": out / "concurrency.png", "report": out / "report.md"}
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if r.get(k) is None else r[k] for k in COLUMNS})
    paths["json"].write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    figure(rows, meta).savefig(paths["png"], format="png", dpi=110)
    paths["report"].write_text(report(rows, meta))
    return paths


def report(rows: list[dict], meta: dict) -> str:
    def cell(v, column=""):
        if v is None:  # drafted/accepted None: the engine does not report them
            return "not reported" if column in ("drafted", "accepted") else "n/a"
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    shown = [c for c in COLUMNS if c not in ("endpoint", "errors", "cpu_model")]
    lines = ["# Servers under load: plain vs speculative", "",
             f"Measured {machine_line(meta)}" + (f"; {meta['note']}" if meta.get("note") else ""),
             "",
             "Servers: " + "; ".join(f"{k}: {v}" for k, v in meta["servers"].items()), "",
             f"Each level: N requests start at once ({meta['max_new_tokens']} new tokens at most, "
             f"temperature {meta['temperature']}, prompts of tasks {', '.join(meta['tasks'])} "
             f"interleaved), median of {meta['repeats']} repeats; the plain server's levels run "
             f"first, then the speculative server's. total_tokens_per_s = all new tokens / wall "
             f"seconds; drafted / accepted are the server's own counts summed over every request of the "
             f"level's repeats.", "",
             "| " + " | ".join(shown) + " |", "|" + "---|" * len(shown)]
    for r in rows:
        lines.append("| " + " | ".join(cell(r.get(c), c) for c in shown) + " |")
    errors = [r["errors"] for r in rows if r.get("errors")]
    if errors:
        lines += ["", "Errors: " + " | ".join(errors)]
    lines += ["", "![Throughput and speedup under load](concurrency.png)", ""]
    return "\n".join(lines)
#: columns of :data:`COLUMNS` that hold text; the others are numbers ("" in the CSV: None)
TEXT_COLUMNS = ("lane", "engine", "endpoint", "errors", "cpu_model")


def read_csv(path: Path) -> list[dict]:
    """The rows of a ``concurrency.csv`` (:func:`write`) with their numbers as numbers, ordered
    by lane (plain first) and concurrency as a number (1, 2, 4, 8, 16; never 1, 16, 2 as text).
    A column an older file lacks (``cpu_model``, ``load_before``, ``load_after``) is None.

    Raises:
        OSError: the file cannot be read.
        ValueError: a cell that should be a number is not, or a row without a level or lane.
    """
    with Path(path).open(newline="", encoding="utf-8") as f:
        raw = list(csv.DictReader(f))
    rows = []
    for i, r in enumerate(raw, start=2):
        row = {}
        for column in COLUMNS:
            cell = (r.get(column) or "").strip()
            try:
                row[column] = (cell or None) if column in TEXT_COLUMNS else (
                    None if not cell else int(cell) if column in ("concurrency", "requests", "repeats")
                    else float(cell))
            except ValueError:
                raise ValueError(f"{path}, line {i}: {column} is {cell!r}, not a number") from None
        if row["concurrency"] is None or row["lane"] is None:
            raise ValueError(f"{path}, line {i}: a row needs its concurrency and lane")
        rows.append(row)
    order = {"plain": 0, "speculative": 1}
    return sorted(rows, key=lambda r: (order.get(r["lane"], 2), r["concurrency"]))


def speedups(rows: list[dict]) -> list[tuple[int, float]]:
    """(concurrency, speedup) of every level that has one, in numeric order of concurrency."""
    return sorted((r["concurrency"], r["speedup"]) for r in rows
                  if r["lane"] == "speculative" and r["speedup"] is not None)
