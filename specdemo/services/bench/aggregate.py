"""From runs to cells: per repeat the task's prompts are pooled, then the median (min, max) over
repeats; every float rounded once (:data:`~specdemo.services.bench.config.DIGITS`). See :mod:`specdemo.services.bench`."""

from __future__ import annotations

import statistics

from ...core.stats import ratio
from .config import DIGITS, BenchConfig, Run


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def pool(plain: list[Run], spec: list[Run]) -> dict:
    """Metrics of one repeat of one cell: the task's prompts pooled (module docstring)."""
    plain_tps = ratio(sum(r.new_tokens for r in plain), sum(r.elapsed_s for r in plain))
    tps = ratio(sum(r.new_tokens for r in spec), sum(r.elapsed_s for r in spec))
    drafted = sum(r.drafted for r in spec)
    width = max((len(r.position_drafted) for r in spec), default=0)
    per_position = [ratio(sum(r.position_accepted[i] for r in spec if i < len(r.position_accepted)),
                           sum(r.position_drafted[i] for r in spec if i < len(r.position_drafted)))
                    for i in range(width)]
    return {
        "plain_tokens_per_s": plain_tps,
        "tokens_per_s": tps,
        "speedup": ratio(tps, plain_tps) if tps is not None and plain_tps is not None else None,
        "acceptance_rate": ratio(sum(r.accepted for r in spec), drafted),
        "mean_acceptance_length": ratio(sum(r.round_tokens for r in spec),
                                         sum(r.rounds for r in spec)) if drafted else None,
        "per_position_acceptance": per_position,
        "plain_ttft_s": _mean([r.ttft_s for r in plain]),
        "ttft_s": _mean([r.ttft_s for r in spec]),
        "draft_s": None if any(r.draft_s is None for r in spec) else sum(r.draft_s for r in spec),
        "verify_s": None if any(r.verify_s is None for r in spec) else sum(r.verify_s for r in spec),
        "peak_memory_bytes": max((r.peak_memory_bytes or 0 for r in spec), default=None),
        "peak_memory_method": next((r.peak_memory_method for r in spec if r.peak_memory_method), None),
        "extra_memory_bytes": None if any(r.extra_memory_bytes is None for r in spec)
        else max((r.extra_memory_bytes for r in spec), default=None),
        "new_tokens": sum(r.new_tokens for r in spec),
        "plain_new_tokens": sum(r.new_tokens for r in plain),
    }


RANGED = ("plain_tokens_per_s", "tokens_per_s", "speedup", "acceptance_rate",
          "mean_acceptance_length", "plain_ttft_s", "ttft_s", "vs_transformers", "plain_vs_transformers")


def rounded(value):
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, list):
        return [rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: rounded(v) for k, v in value.items()}
    return value


def median(values: list) -> float | int | None:
    values = [v for v in values if v is not None]
    if not values:
        return None
    return statistics.median_low(values) if all(isinstance(v, int) for v in values) \
        else statistics.median(values)


def summarise(per_repeat: list[dict]) -> dict:
    """Median over repeats of every metric, plus min and max of the :data:`RANGED` ones."""
    out: dict = {}
    for name in per_repeat[0]:
        values = [m[name] for m in per_repeat]
        if name == "per_position_acceptance":
            width = max(len(v) for v in values)
            out[name] = [median([v[i] if i < len(v) else None for v in values]) for i in range(width)]
            continue
        if any(isinstance(v, str) for v in values):  # a description (peak_memory_method)
            out[name] = next((v for v in values if v), None)
            continue
        out[name] = median(values)
        if name in RANGED:
            present = [v for v in values if v is not None]
            out[f"{name}_min"] = min(present) if present else None
            out[f"{name}_max"] = max(present) if present else None
    return out


def aggregate(runs: list[Run], config: BenchConfig, unavailable: dict, methods: dict) -> list[dict]:
    """One cell per task x draft length x engine, in that order (rounded, see :data:`DIGITS`).

    Our cells also compare us with the reference, per repeat then median/min/max:
    ``vs_transformers`` = our speculative tokens/s / transformers' at the same draft length, and
    ``plain_vs_transformers`` = our plain tokens/s / transformers' plain tokens/s.
    """
    def pools(engine: str, task: str, k) -> list[dict] | None:
        spec = [r for r in runs if (r.engine, r.task, r.draft_length) == (engine, task, k)]
        if (engine, k) in unavailable or not spec:
            return None
        plain = [r for r in runs if (r.engine, r.task, r.draft_length) == (engine, task, None)]
        return [pool([r for r in plain if r.repeat == i], [r for r in spec if r.repeat == i])
                for i in range(config.repeats)]

    cells = []
    for task in config.tasks:
        for k in config.draft_lengths:
            by_engine = {engine: pools(engine, task, k) for engine in config.engines}
            ours, ref = by_engine["specdemo"], by_engine.get("transformers")
            if ours is not None and "transformers" in config.engines:
                ref_plain = [pool([r for r in runs if (r.engine, r.task, r.draft_length, r.repeat)
                                   == ("transformers", task, None, i)], [])["plain_tokens_per_s"]
                             for i in range(config.repeats)]  # shared by all draft lengths
                for i, mine in enumerate(ours):
                    theirs = ref[i]["tokens_per_s"] if ref is not None else None
                    mine["vs_transformers"] = _ratio_or_none(mine["tokens_per_s"], theirs)
                    mine["plain_vs_transformers"] = _ratio_or_none(mine["plain_tokens_per_s"],
                                                                   ref_plain[i])
            for engine, per_repeat in by_engine.items():
                cells.append(rounded(_cell_of(task, k, engine, per_repeat, runs, config,
                                               unavailable, methods)))
    return cells


def _ratio_or_none(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else ratio(a, b)


def _cell_of(task: str, k, engine: str, per_repeat: list[dict] | None, runs: list[Run],
             config: BenchConfig, unavailable: dict, methods: dict) -> dict:
    cell = {"task": task, "draft_length": k, "engine": engine, "method": methods[(engine, k)],
            "status": "ok", "prompts": len({r.prompt for r in runs if r.task == task}),
            "repeats": config.repeats}
    if per_repeat is None:
        cell["status"] = unavailable.get((engine, k), "n/a: no runs")
        return cell
    cell.update(summarise(per_repeat))
    spec = [r for r in runs if (r.engine, r.task, r.draft_length) == (engine, task, k)]
    checked = [r.identical for r in spec if r.identical is not None]
    same = [r.same_as_specdemo_plain for r in spec if r.same_as_specdemo_plain is not None]
    cell.update(runs=len(spec), identical_runs=sum(checked) if checked else None,
                identical=all(checked) if checked else None,
                same_as_specdemo_plain=all(same) if same else None)
    return cell


def best_draft_lengths(cells: list[dict], engine: str = "specdemo") -> dict[str, dict | None]:
    """Per task: the cell with the highest median speedup for ``engine`` (None when none ran)."""
    best: dict[str, dict | None] = {}
    for cell in cells:
        if cell["engine"] != engine:
            continue
        best.setdefault(cell["task"], None)
        if cell.get("speedup") is None:
            continue
        current = best[cell["task"]]
        if current is None or cell["speedup"] > current["speedup"]:
            best[cell["task"]] = cell
    return best


def best_overall_draft_length(cells: list[dict]) -> int | str | None:
    """Our draft length with the highest mean speedup over tasks (used by the concurrency sweep)."""
    by_k: dict = {}
    for cell in cells:
        if cell["engine"] == "specdemo" and cell.get("speedup") is not None:
            by_k.setdefault(cell["draft_length"], []).append(cell["speedup"])
    return max(by_k, key=lambda k: sum(by_k[k]) / len(by_k[k])) if by_k else None

