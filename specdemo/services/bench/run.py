"""Run the sweep: our engine and the reference, interleaved per prompt and repeat; the
concurrency sweep; what machine it ran on and how busy the machine was."""

from __future__ import annotations

import itertools
import platform
import time
from dataclasses import asdict, dataclass, field
from typing import Callable

from ...core.machine import OtherCpuUse
from ...core.stats import ratio
from .aggregate import aggregate, best_overall_draft_length, median, rounded
from .config import DIGITS, BenchConfig, PeakMemory, Run
from .reference import TransformersEngine, batched_plain, error_status
from ..startup import about
from ... import OMP_WAIT, __version__
from ...models import hardware
from .. import startup

Progress = Callable[[int, int, str], None]  # (done, total, description)


class SpecdemoEngine:
    """Our engine through :class:`specdemo.services.pipeline.Pipeline` (plain and speculative)."""

    name = "specdemo"

    def __init__(self, pipe) -> None:
        self.pipe = pipe

    def method(self, draft_length: int | str) -> tuple[str, str | None]:
        """(label, reason it cannot run or None)."""
        return f"{self.pipe.draft_spec}, draft_length={draft_length}", None

    def warm_up(self, prompt_ids: list[int], config: BenchConfig, skip: dict) -> dict:
        """Untimed: every one-time cost of a timed run (``startup.prepare_timed``: each forward
        width plain decoding and every draft length of the sweep may use, the drafter's
        multi-step drafting, the forward-cost table ``auto`` measures once), so the first timed
        cell pays none of it.

        Returns:
            {} (our engine runs every setting; an error here propagates).
        """
        startup.prepare_timed(self.pipe, False, 4, prompt_ids)
        if self.pipe.draft_spec != "none":
            for k in config.draft_lengths:
                startup.prepare_timed(self.pipe, True, k, prompt_ids)
        return {}

    def run(self, prompt_ids: list[int], config: BenchConfig, draft_length: int | str | None,
            where: dict) -> Run:
        from ...core.engine import collect  # lazy: imports torch; --help stays fast
        speculative = draft_length is not None
        settings = config.settings(draft_length if speculative else 4)
        with PeakMemory(self.pipe.target.device) as memory:
            result = collect(memory.watch(self.pipe.stream(prompt_ids, settings, speculative)))
        s = result.stats
        return Run(self.name, draft_length=draft_length, new_tokens=s.new_tokens,
                   elapsed_s=s.elapsed_s, ttft_s=s.ttft_s, drafted=s.drafted, accepted=s.accepted,
                   rounds=s.target_forwards, round_tokens=max(s.new_tokens - 1, 0),
                   position_drafted=list(s.position_drafted),
                   position_accepted=list(s.position_accepted), draft_s=s.draft_s,
                   verify_s=s.verify_s, peak_memory_bytes=memory.peak, peak_memory_method=memory.method,
                   extra_memory_bytes=s.extra_memory_bytes, finish_reason=s.finish_reason,
                   token_ids=list(result.token_ids), **where)

# ----------------------------------------------------------------------------- the sweep

@dataclass
class Sweep:
    """Everything one benchmark measured."""

    config: BenchConfig
    target: str
    draft: str
    machine: dict
    cells: list[dict]
    runs: list[Run]
    concurrency: list[dict] = field(default_factory=list)
    concurrency_draft_length: int | str | None = None
    seconds: float = 0.0

    def as_dict(self) -> dict:
        return {"target": self.target, "draft": self.draft, "config": asdict(self.config),
                "machine": self.machine, "seconds": round(self.seconds, 1), "cells": self.cells,
                "concurrency_draft_length": self.concurrency_draft_length,
                "concurrency": self.concurrency, "runs": [r.as_dict() for r in self.runs]}


class _Progress:
    """A tqdm bar on stderr plus ``callback(done, total, description)`` after every decode."""

    def __init__(self, total: int, callback: Progress | None, show_bar: bool) -> None:
        self.done, self.total, self.callback = 0, total, callback
        self.bar = None
        if show_bar:
            from tqdm.auto import tqdm
            self.bar = tqdm(total=total, unit="decode", dynamic_ncols=True)

    def advance(self, description: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_description(description[:40])
            self.bar.update(1)
        if self.callback is not None:
            self.callback(self.done, self.total, description)

    def drop(self, n: int) -> None:
        """``n`` planned decodes will not run (a reference setting transformers refused)."""
        self.total -= n
        if self.bar is not None:
            self.bar.total = self.total
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_sweep(pipe, prompts: dict[str, list[str]], config: BenchConfig, *,
              progress: Progress | None = None, show_bar: bool = True,
              note: Callable[[str], None] | None = None) -> Sweep:
    """Run the benchmark on a loaded pipeline.

    Args:
        pipe: a :class:`specdemo.services.pipeline.Pipeline` with a drafter (draft_spec other than none).
        prompts: {task: [prompt text, ...]}; ``config.tasks`` picks and orders them.
        config: what to sweep.
        progress: called after every decode with (done, total, description).
        show_bar: draw a tqdm progress bar on stderr.
        note: called with one line announcing the reference column's decodes and their
            estimated time (:func:`reference_estimate_s`) before the timed sweep starts.
    Returns:
        A :class:`Sweep` with one cell per task x draft length x engine.
    Raises:
        ValueError: no drafter, a missing task, or a prompt too long for the model.
    """
    if pipe.draft_spec in ("none", ""):
        raise ValueError("the benchmark races plain against speculative decoding: give a draft "
                         "(ngram, self, early-exit:N or a draft model)")
    missing = [t for t in config.tasks if t not in prompts]
    if missing:
        raise ValueError(f"no prompts for task(s) {', '.join(missing)}")
    started = time.perf_counter()
    machine = machine_info(pipe.target)
    others = OtherCpuUse()
    ids = {task: [pipe.prompt_ids(p, config.system) for p in prompts[task][:config.prompts_per_task]]
           for task in config.tasks}
    for prompt_ids in itertools.chain(*ids.values()):
        pipe.check_length(prompt_ids, config.max_new_tokens)
    engines = [SpecdemoEngine(pipe)]
    if config.reference:
        engines.append(TransformersEngine(pipe.target, pipe.draft_spec, pipe.draft))
    unavailable = {(e.name, k): e.method(k)[1] for e in engines for k in config.draft_lengths
                   if e.method(k)[1]}
    first = next(iter(ids.values()))[0]
    warm_s = {}
    for engine in engines:  # untimed; a setting transformers refuses shows up here
        start = time.perf_counter()
        unavailable.update(engine.warm_up(first, config, unavailable))
        warm_s[engine.name] = time.perf_counter() - start
    n_prompts = sum(len(v) for v in ids.values())
    if config.reference and note is not None:
        note(_reference_note(config, n_prompts, unavailable, warm_s[TransformersEngine.name]))
    planned = sum(1 + sum((e.name, k) not in unavailable for k in config.draft_lengths) for e in engines)
    bar = _Progress(config.repeats * n_prompts * planned
                    + _concurrency_decodes(config.concurrency, config.repeats), progress, show_bar)

    runs: list[Run] = []
    for repeat in range(config.repeats):
        for task, task_ids in ids.items():
            for index, prompt_ids in enumerate(task_ids):
                where = {"task": task, "prompt": index, "repeat": repeat}
                runs += _measure_prompt(engines, prompt_ids, config, where, unavailable, bar)
    runs = [r for r in runs if (r.engine, r.draft_length) not in unavailable]  # refused part-way
    methods = {(e.name, k): e.method(k)[0] for e in engines for k in config.draft_lengths}
    cells = aggregate(runs, config, unavailable, methods)
    sweep = Sweep(config, pipe.target.spec, pipe.draft_spec, machine, cells, runs)
    if config.concurrency:
        sweep.concurrency_draft_length = best_overall_draft_length(cells)
        columns = itertools.zip_longest(*ids.values())  # the tasks' prompts interleaved
        requests = [p for column in columns for p in column if p is not None]
        sweep.concurrency = concurrency_sweep(pipe, requests, config, sweep.concurrency_draft_length,
                                              bar.advance)
    bar.close()
    machine["other_processes_cpu_share"] = round(others.share(), DIGITS)
    sweep.seconds = time.perf_counter() - started
    return sweep


def reference_estimate_s(config: BenchConfig, decodes: int, warm_up_s: float,
                         warm_up_decodes: int) -> float:
    """Seconds the reference column's ``decodes`` will take, scaled from its warm-up: the
    warm-up ran ``warm_up_decodes`` decodes of at most 8 new tokens in ``warm_up_s`` seconds,
    and a decode's time is taken to grow with its new tokens (prefill counted as a token's worth;
    an upper bound when decodes end early at EOS)."""
    short = min(8, config.max_new_tokens)
    return warm_up_s / max(warm_up_decodes, 1) * config.max_new_tokens / short * decodes


def _reference_note(config: BenchConfig, n_prompts: int, unavailable: dict, warm_up_s: float) -> str:
    """The line announcing the reference column before the sweep: how many decodes, how long."""
    name = TransformersEngine.name
    runnable = 1 + sum((name, k) not in unavailable for k in config.draft_lengths)
    decodes = config.repeats * n_prompts * runnable
    estimate = reference_estimate_s(config, decodes, warm_up_s, runnable)
    return (f"reference column: {decodes} decodes through transformers' generate() on the same "
            f"model, {about(estimate)} on this machine (scaled from its warm-up; the progress "
            "bar counts them with ours)")


def _measure_prompt(engines: list, prompt_ids: list[int], config: BenchConfig, where: dict,
                    unavailable: dict, bar: _Progress) -> list[Run]:
    """One prompt and repeat: per engine, plain once, then every draft length it can run.

    A reference setting that transformers refuses is recorded in ``unavailable`` with the error
    and not tried again; an error in our own engine propagates.
    """
    runs: list[Run] = []
    ours_plain = None
    for engine in engines:  # interleaved: machine noise hits both engines alike
        plain = engine.run(prompt_ids, config, None, where)
        ours_plain = ours_plain or plain
        _mark(plain, plain, ours_plain, config.greedy)
        runs.append(plain)
        bar.advance(f"{where['task']} {engine.name} plain")
        for k in config.draft_lengths:
            if (engine.name, k) in unavailable:
                continue
            try:
                spec = engine.run(prompt_ids, config, k, where)
            except Exception as exc:  # noqa: BLE001 - transformers' refusal becomes the cell's status
                if isinstance(engine, SpecdemoEngine):
                    raise
                unavailable[(engine.name, k)] = error_status(exc)
                continue
            _mark(spec, plain, ours_plain, config.greedy)
            runs.append(spec)
            bar.advance(f"{where['task']} {engine.name} k={k}")
    return runs


def _mark(run: Run, plain: Run, ours_plain: Run, greedy: bool) -> None:
    """Greedy output checks: equal to the same engine's plain output, and to ours."""
    if greedy:
        run.identical = run.token_ids == plain.token_ids
        run.same_as_specdemo_plain = run.token_ids == ours_plain.token_ids


# ----------------------------------------------------------------------------- concurrency

def _concurrency_decodes(levels: tuple[int, ...], repeats: int) -> int:
    return repeats * sum(1 + n for n in levels)


def concurrency_sweep(pipe, requests: list[list[int]], config: BenchConfig,
                      draft_length: int | str | None, tick: Callable) -> list[dict]:
    """N requests at once, for N in ``config.concurrency``: batched plain vs speculative per request.

    Requests cycle through ``requests`` (the tasks' prompts interleaved). Per level and repeat:
    plain = one ``model.generate`` over the N left-padded prompts; speculative = our engine on each
    request in turn (batch 1), at ``draft_length``. total_tokens_per_s = all new tokens / wall
    seconds; mean_latency_s = mean seconds from the start until a request's last token (batched:
    all finish with the batch; sequential: request i waits for the i-1 before it).
    """
    if draft_length is None:
        draft_length = config.draft_lengths[0]
    rows = []
    for n in config.concurrency:
        batch = [requests[i % len(requests)] for i in range(n)]
        measured: dict[str, list[dict]] = {"plain_batched": [], "speculative_sequential": []}
        for _ in range(config.repeats):
            seconds, outputs = batched_plain(pipe.target, batch, config)
            tick(f"concurrency {n} plain batched")
            results, finished = [], []
            clock = 0.0
            for ids in batch:
                result = pipe.run(ids, config.settings(draft_length), speculative=True)
                clock += result.stats.elapsed_s
                results.append(result)
                finished.append(clock)
                tick(f"concurrency {n} speculative")
            same = sum(o == r.token_ids for o, r in zip(outputs, results)) if config.greedy else None
            measured["plain_batched"].append({
                "new_tokens": sum(len(o) for o in outputs), "seconds": seconds,
                "mean_latency_s": seconds, "same_as_speculative": same})
            measured["speculative_sequential"].append({
                "new_tokens": sum(r.stats.new_tokens for r in results), "seconds": clock,
                "mean_latency_s": sum(finished) / n, "same_as_speculative": None})
        medians = {}
        for mode, values in measured.items():
            tps = [ratio(v["new_tokens"], v["seconds"]) for v in values]
            medians[mode] = median(tps)
            rows.append(rounded({
                "concurrency": n, "mode": mode,
                "draft_length": draft_length if mode == "speculative_sequential" else None,
                "total_tokens_per_s": medians[mode],
                "total_tokens_per_s_min": min(t for t in tps if t is not None),
                "total_tokens_per_s_max": max(t for t in tps if t is not None),
                "mean_latency_s": median([v["mean_latency_s"] for v in values]),
                "new_tokens": median([v["new_tokens"] for v in values]),
                "outputs_equal_speculative": median([v["same_as_speculative"] for v in values])}))
        gain = ratio(medians["speculative_sequential"] or 0.0, medians["plain_batched"] or 0.0)
        rows[-1]["speculative_over_batched_plain"] = rounded(gain)
        rows[-2]["speculative_over_batched_plain"] = None
    return rows


# ----------------------------------------------------------------------------- machine

def machine_info(target) -> dict:
    """Device, dtype, library versions, CPU model, cores and memory of this machine."""
    import psutil
    import torch
    import transformers
    device = torch.device(target.device)
    cpu_name = getattr(hardware, "_cpu_name", platform.processor)()
    info = {
        "device": str(device), "device_name": cpu_name, "dtype": str(target.dtype).replace("torch.", ""),
        "cpu_model": cpu_name, "cpu_cores_physical": psutil.cpu_count(logical=False),
        "cpu_cores_logical": psutil.cpu_count(logical=True), "torch_threads": torch.get_num_threads(),
        "memory_total_bytes": psutil.virtual_memory().total,
        "memory_available_bytes": psutil.virtual_memory().available,
        "torch": torch.__version__, "transformers": transformers.__version__,
        "python": platform.python_version(), "platform": platform.platform(), "specdemo": __version__,
        "backend": getattr(target, "backend", "transformers"),
        "omp_wait": OMP_WAIT,
    }
    if info["backend"] == "native-w8a8":  # which kernel blocks prefetch weights, as measured here
        from ...models.native import model_of  # lazy: imports torch; --help stays fast
        info["native_prefetch"] = model_of(target).prefetch
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, device_memory_bytes=props.total_memory)
    elif device.type == "mps":
        info["device_name"] = f"Apple silicon ({platform.machine()}) via MPS"
    return info

