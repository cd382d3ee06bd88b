"""``bench --plain-endpoint URL --spec-endpoint URL --concurrency 1,2,4``: servers under load.

For each concurrency level N, N requests start at once (threads released together; prompts of
the tasks interleaved), first against the plain lane's server, then against the speculative
lane's (lanes one after the other, never both at once). Per level and lane:
``total_tokens_per_s`` = all new tokens (the server's ``usage``) / wall seconds from the first
request's start to the last one's end; ``mean_latency_s`` = mean seconds until a request's last
chunk; drafted / accepted = the sum of what the engine reported over every request of the
level's repeats (None when it does not report them). ``speedup`` per level = speculative / plain total tokens/s.

A llama-server decodes up to ``--parallel`` requests at once; more wait for a slot, which is the
load a server sees. Writes ``concurrency.csv``, ``concurrency.json``, ``concurrency.png`` and
``report.md`` (with date, machine, servers).
"""

from __future__ import annotations

import json
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
           "acceptance_rate", "speedup", "errors")


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
                "errors": "; ".join(sorted({e for run in runs for e in run["errors"]})) or None})
    by = {(r["lane"], r["concurrency"]): r for r in rows}
    for r in rows:
        plain = by.get(("plain", r["concurrency"]))
        if r["lane"] == "speculative" and plain and plain["total_tokens_per_s"]:
            r["speedup"] = _round(ratio(r["total_tokens_per_s"] or 0.0, plain["total_tokens_per_s"]))
    return rows


def _round(x, digits: int = 3):
    return None if x is None else round(x, digits)


def figure(rows: list[dict]):
    """Total tokens/s per level, one line per lane, and the speedup per level."""
    fig, (ax, ax2) = _figure(9, 3.8, ncols=2)
    for j, lane in enumerate(("plain", "speculative")):
        mine = [r for r in rows if r["lane"] == lane and r["total_tokens_per_s"] is not None]
        if mine:
            ax.plot([r["concurrency"] for r in mine], [r["total_tokens_per_s"] for r in mine],
                    marker="o", color=f"C{j}", label=f"{lane} ({mine[0]['engine']})")
    levels = sorted({r["concurrency"] for r in rows})
    ax.set(xticks=levels, xlabel="concurrent requests", ylabel="total tokens/s", ylim=(0, None),
           title="Throughput under load")
    ax.legend(fontsize="small")
    gains = [r for r in rows if r["speedup"] is not None]
    ax2.plot([r["concurrency"] for r in gains], [r["speedup"] for r in gains], marker="o", color="C2")
    ax2.axhline(1.0, color="grey", linestyle=":")
    ax2.set(xticks=levels, xlabel="concurrent requests", ylabel="speculative / plain",
            title="Speedup under load", ylim=(0, max([1.2] + [r["speedup"] * 1.15 for r in gains])))
    return fig


def machine() -> dict:
    import os
    return {"cpu_model": _cpu_name(), "cpu_cores_logical": os.cpu_count(), "omp_wait": OMP_WAIT,
            "platform": platform.platform(), "python": platform.python_version()}


def write(rows: list[dict], out: Path, meta: dict) -> dict[str, Path]:
    import csv
    out.mkdir(parents=True, exist_ok=True)
    paths = {"csv": out / "concurrency.csv", "json": out / "concurrency.json",
             "png": out / "concurrency.png", "report": out / "report.md"}
    with paths["csv"].open("w", newline="") as f:
        writer = csv.DictWriter(f, COLUMNS)
        writer.writeheader()
        for r in rows:
            writer.writerow({k: "" if r.get(k) is None else r[k] for k in COLUMNS})
    paths["json"].write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    figure(rows).savefig(paths["png"], format="png", dpi=110)
    paths["report"].write_text(report(rows, meta))
    return paths


def report(rows: list[dict], meta: dict) -> str:
    def cell(v, column=""):
        if v is None:  # drafted/accepted None: the engine does not report them
            return "not reported" if column in ("drafted", "accepted") else "n/a"
        return f"{v:.3g}" if isinstance(v, float) else str(v)
    shown = [c for c in COLUMNS if c not in ("endpoint", "errors")]
    lines = ["# Servers under load: plain vs speculative", "",
             f"Measured {meta['date']} on {meta['machine']['cpu_model']} "
             f"({meta['machine']['cpu_cores_logical']} logical cores), {meta['note']}", "",
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
