"""Benchmark: does speculation pay for this model, task and machine, and with which draft length?

``python -m specdemo bench`` sweeps tasks x draft lengths. For every prompt and repeat it runs, one
decode at a time and interleaved so that machine noise hits every column alike:

* **specdemo**: our engine (``Pipeline.run``), plain once, then speculative per draft length;
* **transformers** (the reference column): the same model object through ``model.generate()``,
  plain (``do_sample=False`` at temperature 0) once, then its own assisted generation per draft
  length: ``prompt_lookup_num_tokens=k`` for ``ngram``, ``assistant_model=`` for a draft model and
  for ``self`` (the model assists itself), ``assistant_early_exit=N`` for ``early-exit:N``
  (transformers ``generation/candidate_generator.py``). ``auto`` maps to transformers' dynamic
  schedule (``num_assistant_tokens_schedule="heuristic_transient"``: +2 after a full accept, -1
  otherwise, with its default confidence threshold); prompt lookup has no dynamic length there,
  so that cell is n/a with the reason.

transformers returns no statistics, so the benchmark observes its candidate generator (draft
tokens proposed and matched per round, time in ``get_candidates``) without changing what it does.

Aggregation: for each (task, draft length, engine) and each repeat, the task's prompts are pooled
(tokens_per_s = total new tokens / total seconds, acceptance_rate = total accepted / total
drafted, ...); a cell reports the median of those per-repeat values with their min and max. The
speedup of a cell is against the *same engine's* plain decoding of the same prompts and repeat.
Every float is rounded once (``DIGITS``) before it is written, so the CSV, the JSON, the plots and
``report.md`` show the same numbers.

The concurrency sweep (``--concurrency 1,2,4,8``) serves N requests at once: plain decoding as one
batch (``model.generate`` on N left-padded prompts) against speculative decoding with our engine,
which is batch-1, one request after another. Total throughput = all new tokens / wall seconds.
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import itertools
import json
import platform
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Iterator

from .prompts import TASKS, load_prompts
from .stats import count_positions, ratio

ENGINES = ("specdemo", "transformers")
DIGITS = 4  # decimals kept for every float written out
DEFAULT_DRAFT_LENGTHS: tuple[int | str, ...] = (1, 2, 4, 8, "auto")
HEURISTIC_START = 5  # draft tokens transformers' heuristic schedule starts from, for "auto"
Progress = Callable[[int, int, str], None]  # (done, total, description)


# ----------------------------------------------------------------------------- configuration

@dataclass(frozen=True)
class BenchConfig:
    """What to sweep.

    Attributes:
        tasks: prompt sets under ``assets/prompts`` (or keys of the prompts given to the sweep).
        draft_lengths: fixed k values and/or "auto".
        max_new_tokens: per decode.
        repeats: times every decode runs; cells report median, min and max over repeats.
        temperature: 0 = greedy (outputs are then checked against plain decoding).
        seed: sampling seed (temperature > 0).
        prompts_per_task: use only the first N prompts of each task (None = all).
        concurrency: request counts for the concurrency sweep (empty = skip it).
        reference: also run transformers' generate() on the same model object.
        system: optional system prompt.
    """

    tasks: tuple[str, ...] = TASKS
    draft_lengths: tuple[int | str, ...] = DEFAULT_DRAFT_LENGTHS
    max_new_tokens: int = 128
    repeats: int = 1
    temperature: float = 0.0
    seed: int | None = None
    prompts_per_task: int | None = None
    concurrency: tuple[int, ...] = ()
    reference: bool = True
    system: str | None = None

    def __post_init__(self) -> None:
        if not self.tasks:
            raise ValueError("no tasks to benchmark: give at least one, e.g. --tasks code")
        if not self.draft_lengths:
            raise ValueError("no draft lengths: give at least one, e.g. --draft-lengths 4")
        for k in self.draft_lengths:
            if not (k == "auto" or (isinstance(k, int) and 1 <= k <= 64)):
                raise ValueError(f"draft length must be 1..64 or 'auto', got {k!r}")
        if self.max_new_tokens < 1 or self.repeats < 1:
            raise ValueError("max_new_tokens and repeats must be at least 1")
        if self.prompts_per_task is not None and self.prompts_per_task < 1:
            raise ValueError("prompts_per_task must be at least 1")
        if any(n < 1 for n in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {self.concurrency}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def engines(self) -> tuple[str, ...]:
        return ENGINES if self.reference else ENGINES[:1]

    def settings(self, draft_length: int | str = 4):
        from .pipeline import DecodeSettings
        return DecodeSettings(max_new_tokens=self.max_new_tokens, temperature=self.temperature,
                              seed=self.seed, draft_length=draft_length)


def parse_draft_lengths(text: str) -> tuple[int | str, ...]:
    """``"1,2,4,auto"`` -> ``(1, 2, 4, "auto")``.

    Raises:
        ValueError: for anything that is not an integer 1..64 or "auto".
    """
    out: list[int | str] = []
    for item in (s.strip() for s in text.split(",")):
        if not item:
            continue
        if item == "auto":
            out.append(item)
        elif item.isdigit() and 1 <= int(item) <= 64:
            out.append(int(item))
        else:
            raise ValueError(f"draft length must be 1..64 or 'auto', got {item!r}")
    return tuple(dict.fromkeys(out))


def parse_ints(text: str) -> tuple[int, ...]:
    """``"1,2,4,8"`` -> ``(1, 2, 4, 8)``; raises ValueError on a non-integer."""
    try:
        return tuple(dict.fromkeys(int(s) for s in text.split(",") if s.strip()))
    except ValueError:
        raise ValueError(f"expected comma-separated integers, got {text!r}") from None


def parse_tasks(text: str | Iterable[str]) -> tuple[str, ...]:
    items = text.split(",") if isinstance(text, str) else list(text)
    return tuple(dict.fromkeys(t.strip() for t in items if t.strip()))


# ----------------------------------------------------------------------------- one decode

@dataclass
class Run:
    """One timed decode.

    Attributes:
        draft_length: None for plain decoding.
        rounds: verification forwards (ours: target forwards after prefill; transformers: rounds
            of its assisted loop, the first of which is also the prefill).
        round_tokens: new tokens those rounds produced (ours: all but the prefill's token).
        peak_memory_bytes: CUDA: peak bytes allocated by torch during the decode; CPU/MPS: the
            highest memory in use (process RSS / MPS allocation) seen at any streamed token.
        identical: output equals the same engine's plain output (None when sampling).
        same_as_specdemo_plain: output equals our plain output (greedy only).
    """

    engine: str
    task: str
    prompt: int
    repeat: int
    draft_length: int | str | None
    new_tokens: int
    elapsed_s: float
    ttft_s: float | None
    drafted: int = 0
    accepted: int = 0
    rounds: int = 0
    round_tokens: int = 0
    position_drafted: list[int] = field(default_factory=list)
    position_accepted: list[int] = field(default_factory=list)
    draft_s: float | None = None
    verify_s: float | None = None
    peak_memory_bytes: int | None = None
    extra_memory_bytes: int | None = None
    finish_reason: str | None = None
    identical: bool | None = None
    same_as_specdemo_plain: bool | None = None
    token_ids: list[int] = field(default_factory=list, repr=False)

    def record_round(self, n_drafted: int, n_accepted: int, n_tokens: int) -> None:
        """One verification round (same per-position rule as ``DecodeStats.record_round``)."""
        self.rounds += 1
        self.round_tokens += n_tokens
        self.drafted += n_drafted
        self.accepted += n_accepted
        count_positions(self.position_drafted, self.position_accepted, n_drafted, n_accepted)

    def as_dict(self) -> dict:
        out = asdict(self)
        out.pop("token_ids")
        return out


class PeakMemory:
    """Peak memory of one decode on ``device`` (see :attr:`Run.peak_memory_bytes`)."""

    def __init__(self, device) -> None:
        import torch
        from .hardware import memory_in_use_bytes
        self.device = torch.device(device)
        self._in_use = memory_in_use_bytes
        self.peak = 0

    def __enter__(self) -> "PeakMemory":
        import torch
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)
        self.sample()
        return self

    def sample(self) -> None:
        if self.device.type != "cuda":
            self.peak = max(self.peak, self._in_use(self.device))

    def watch(self, events: Iterator) -> Iterator:
        for event in events:
            self.sample()
            yield event

    def __exit__(self, *exc) -> None:
        import torch
        if self.device.type == "cuda":
            self.peak = int(torch.cuda.max_memory_allocated(self.device))
        else:
            self.sample()


class SpecdemoEngine:
    """Our engine through :class:`specdemo.pipeline.Pipeline` (plain and speculative)."""

    name = "specdemo"

    def __init__(self, pipe) -> None:
        self.pipe = pipe

    def method(self, draft_length: int | str) -> tuple[str, str | None]:
        """(label, reason it cannot run or None)."""
        return f"{self.pipe.draft_spec}, draft_length={draft_length}", None

    def warm_up(self, prompt_ids: list[int], config: BenchConfig, skip: dict) -> dict:
        """Untimed: first-call overheads, and the forward-cost table ``auto`` measures once.

        Returns:
            {} (our engine runs every setting; an error here propagates).
        """
        short = dataclasses.replace(config, max_new_tokens=min(8, config.max_new_tokens))
        self.pipe.run(prompt_ids, short.settings(), speculative=False)
        self.pipe.run(prompt_ids, short.settings("auto" if "auto" in config.draft_lengths else 2),
                      speculative=True)
        return {}

    def run(self, prompt_ids: list[int], config: BenchConfig, draft_length: int | str | None,
            where: dict) -> Run:
        from .engine import collect
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
                   verify_s=s.verify_s, peak_memory_bytes=memory.peak,
                   extra_memory_bytes=s.extra_memory_bytes, finish_reason=s.finish_reason,
                   token_ids=list(result.token_ids), **where)


class _Streamer:
    """A transformers streamer that notes the time of the first new token and samples memory.

    ``generate`` puts the prompt first, then new tokens as they are accepted.
    """

    def __init__(self, start: float, memory: PeakMemory) -> None:
        self.start, self.memory = start, memory
        self.puts = 0
        self.ttft_s: float | None = None

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:  # values arrive on the CPU, so the device work is done
            self.ttft_s = time.perf_counter() - self.start
        self.memory.sample()

    def end(self) -> None:
        pass


@contextlib.contextmanager
def _observed(model, run: Run, device) -> Iterator[None]:
    """Count transformers' draft tokens and matches per round, and time its drafting.

    Wraps the candidate generator ``generate`` builds (``_get_candidate_generator``, transformers
    5.x) for this one call; what it proposes and accepts is unchanged.
    """
    from .engine import _sync
    original = model._get_candidate_generator
    run.draft_s = 0.0

    def build(*args, **kwargs):
        generator = original(*args, **kwargs)
        get, update = generator.get_candidates, generator.update_candidate_strategy

        def get_candidates(input_ids, **kw):
            t0 = time.perf_counter()
            out = get(input_ids, **kw)
            _sync(device)
            run.draft_s += time.perf_counter() - t0
            return out

        def update_candidate_strategy(input_ids, scores, num_matches):
            n_matches = int(num_matches)
            run.record_round(scores.shape[1] - 1, n_matches, n_matches + 1)  # scores: (1, k+1, V)
            return update(input_ids, scores, num_matches)

        generator.get_candidates = get_candidates
        generator.update_candidate_strategy = update_candidate_strategy
        return generator

    model._get_candidate_generator = build
    try:
        yield
    finally:
        del model._get_candidate_generator


@contextlib.contextmanager
def _assistant_config(model, **values) -> Iterator[None]:
    """Set ``model.generation_config`` fields for one call (transformers reads the assistant's
    draft-length settings from the assistant model's own generation config), then restore them."""
    config = model.generation_config
    old = {name: getattr(config, name, None) for name in values}
    for name, value in values.items():
        setattr(config, name, value)
    try:
        yield
    finally:
        for name, value in old.items():
            setattr(config, name, value)


@contextlib.contextmanager
def _quiet_transformers() -> Iterator[None]:
    """Silence transformers' per-call generation warnings while the benchmark runs."""
    from transformers.utils import logging as hf_logging
    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)


class TransformersEngine:
    """The reference column: the same model object through transformers' ``generate()``.

    Args:
        target: the loaded target (model, tokenizer, eos_token_ids, device).
        draft_spec: ``ngram``, ``self``, ``early-exit:N`` or a model spec.
        draft: the loaded draft model for model specs.
    """

    name = "transformers"

    def __init__(self, target, draft_spec: str, draft=None) -> None:
        self.target, self.draft_spec, self.draft = target, draft_spec, draft

    def _options(self, draft_length: int | str) -> tuple[dict, dict, object | None, str]:
        """(generate kwargs, assistant generation-config fields, the model holding them, label)."""
        if self.draft_spec == "ngram":
            return ({"prompt_lookup_num_tokens": draft_length}, {}, None,
                    f"prompt_lookup_num_tokens={draft_length}")
        if self.draft_spec.startswith("early-exit"):
            layers = int(self.draft_spec.partition(":")[2])
            holder, kwargs = self.target.model, {"assistant_early_exit": layers}
            what = f"assistant_early_exit={layers}"
        elif self.draft_spec == "self":
            holder = self.target.model
            kwargs, what = {"assistant_model": holder}, "assistant_model=<the target itself>"
        else:
            holder = self.draft.model
            kwargs, what = {"assistant_model": holder}, f"assistant_model={self.draft_spec}"
        if draft_length == "auto":
            fields = {"num_assistant_tokens": HEURISTIC_START,
                      "num_assistant_tokens_schedule": "heuristic_transient",
                      "assistant_confidence_threshold": 0.4}
            label = f"{what}, heuristic_transient from {HEURISTIC_START}, confidence 0.4"
            return kwargs, fields, holder, label
        # exactly k draft tokens per round, as ours: no confidence cut-off
        fields = {"num_assistant_tokens": draft_length, "num_assistant_tokens_schedule": "constant",
                  "assistant_confidence_threshold": 0.0}
        return kwargs, fields, holder, f"{what}, num_assistant_tokens={draft_length}"

    def method(self, draft_length: int | str) -> tuple[str, str | None]:
        """(label, reason it cannot run or None)."""
        if self.draft_spec == "ngram" and draft_length == "auto":
            return "prompt lookup", ("n/a: transformers' prompt lookup has no dynamic draft length "
                                     "(prompt_lookup_num_tokens is fixed)")
        return self._options(draft_length)[3], None

    def warm_up(self, prompt_ids: list[int], config: BenchConfig, skip: dict) -> dict:
        """Untimed short runs of plain and of every draft length not in ``skip``.

        Returns:
            {(engine, draft length): "error: ..."} for settings transformers refuses.
        """
        short = dataclasses.replace(config, max_new_tokens=min(8, config.max_new_tokens))
        where = {"task": "", "prompt": 0, "repeat": 0}
        self.run(prompt_ids, short, None, where)
        refused = {}
        for k in config.draft_lengths:
            if (self.name, k) not in skip:
                try:
                    self.run(prompt_ids, short, k, where)
                except Exception as exc:  # noqa: BLE001 - the refusal becomes the cell's status
                    refused[(self.name, k)] = _error(exc)
        return refused

    def _generate_kwargs(self, config: BenchConfig) -> dict:
        kwargs = dict(max_new_tokens=config.max_new_tokens, min_new_tokens=0,
                      do_sample=not config.greedy, eos_token_id=sorted(self.target.eos_token_ids) or None,
                      pad_token_id=_pad_id(self.target))
        if not config.greedy:  # the same distribution as ours: temperature only
            kwargs.update(temperature=config.temperature, top_k=0, top_p=1.0)
        return kwargs

    def run(self, prompt_ids: list[int], config: BenchConfig, draft_length: int | str | None,
            where: dict) -> Run:
        """One ``generate()`` call, timed from the call to its return (device synchronised)."""
        import torch
        from .engine import _sync
        model, device = self.target.model, self.target.device
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, P)
        kwargs = self._generate_kwargs(config)
        fields, holder = {}, None
        if draft_length is not None:
            extra, fields, holder, _ = self._options(draft_length)
            kwargs.update(extra)
        if not config.greedy and config.seed is not None:
            torch.manual_seed(config.seed)
        run = Run(self.name, draft_length=draft_length, new_tokens=0, elapsed_s=0.0, ttft_s=None, **where)
        with contextlib.ExitStack() as scope:
            memory = scope.enter_context(PeakMemory(device))
            if holder is not None:
                scope.enter_context(_assistant_config(holder, **fields))
            if draft_length is not None:
                scope.enter_context(_observed(model, run, device))
            scope.enter_context(_quiet_transformers())
            scope.enter_context(torch.inference_mode())
            _sync(device)
            start = time.perf_counter()
            streamer = _Streamer(start, memory)
            output = model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                    streamer=streamer, **kwargs)
            _sync(device)
            run.elapsed_s = time.perf_counter() - start
        run.token_ids = output[0, len(prompt_ids):].tolist()
        run.new_tokens, run.ttft_s, run.peak_memory_bytes = len(run.token_ids), streamer.ttft_s, memory.peak
        if draft_length is None:
            run.rounds = run.round_tokens = run.new_tokens  # one forward per token, prefill included
        ended = run.token_ids and run.token_ids[-1] in self.target.eos_token_ids
        run.finish_reason = "eos" if ended else "length"
        return run


def _pad_id(target) -> int:
    pad = getattr(target.tokenizer, "pad_token_id", None)
    if pad is None:
        pad = min(target.eos_token_ids) if target.eos_token_ids else 0
    return int(pad)


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
              progress: Progress | None = None, show_bar: bool = True) -> Sweep:
    """Run the benchmark on a loaded pipeline.

    Args:
        pipe: a :class:`specdemo.pipeline.Pipeline` with a drafter (draft_spec other than none).
        prompts: {task: [prompt text, ...]}; ``config.tasks`` picks and orders them.
        config: what to sweep.
        progress: called after every decode with (done, total, description).
        show_bar: draw a tqdm progress bar on stderr.
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
    for engine in engines:  # untimed; a setting transformers refuses shows up here
        unavailable.update(engine.warm_up(first, config, unavailable))
    n_prompts = sum(len(v) for v in ids.values())
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
                unavailable[(engine.name, k)] = _error(exc)
                continue
            _mark(spec, plain, ours_plain, config.greedy)
            runs.append(spec)
            bar.advance(f"{where['task']} {engine.name} k={k}")
    return runs


def _error(exc: Exception) -> str:
    return f"error: {type(exc).__name__}: {exc}"[:300]


def _mark(run: Run, plain: Run, ours_plain: Run, greedy: bool) -> None:
    """Greedy output checks: equal to the same engine's plain output, and to ours."""
    if greedy:
        run.identical = run.token_ids == plain.token_ids
        run.same_as_specdemo_plain = run.token_ids == ours_plain.token_ids


# ----------------------------------------------------------------------------- aggregation

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
        "extra_memory_bytes": None if any(r.extra_memory_bytes is None for r in spec)
        else max((r.extra_memory_bytes for r in spec), default=None),
        "new_tokens": sum(r.new_tokens for r in spec),
        "plain_new_tokens": sum(r.new_tokens for r in plain),
    }


RANGED = ("plain_tokens_per_s", "tokens_per_s", "speedup", "acceptance_rate",
          "mean_acceptance_length", "plain_ttft_s", "ttft_s", "vs_transformers", "plain_vs_transformers")


def _rounded(value):
    if isinstance(value, float):
        return round(value, DIGITS)
    if isinstance(value, list):
        return [_rounded(v) for v in value]
    if isinstance(value, dict):
        return {k: _rounded(v) for k, v in value.items()}
    return value


def _median(values: list) -> float | int | None:
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
            out[name] = [_median([v[i] if i < len(v) else None for v in values]) for i in range(width)]
            continue
        out[name] = _median(values)
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
                cells.append(_rounded(_cell_of(task, k, engine, per_repeat, runs, config,
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


# ----------------------------------------------------------------------------- concurrency

def _concurrency_decodes(levels: tuple[int, ...], repeats: int) -> int:
    return repeats * sum(1 + n for n in levels)


def batched_plain(target, requests: list[list[int]],
                  config: BenchConfig) -> tuple[float, list[list[int]]]:
    """Plain decoding of all requests as one batch: ``model.generate`` on left-padded prompts.

    Returns:
        (wall seconds, new token ids per request cut after its first EOS).
    """
    import torch
    from .engine import _sync
    pad, width = _pad_id(target), max(len(r) for r in requests)
    rows = [[pad] * (width - len(r)) + r for r in requests]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in requests]
    input_ids = torch.tensor(rows, dtype=torch.long, device=target.device)  # (N, P_max)
    eos = sorted(target.eos_token_ids)
    kwargs = dict(attention_mask=torch.tensor(mask, device=target.device),
                  max_new_tokens=config.max_new_tokens, do_sample=not config.greedy,
                  eos_token_id=eos or None, pad_token_id=pad)
    if not config.greedy:
        kwargs.update(temperature=config.temperature, top_k=0, top_p=1.0)
    with _quiet_transformers(), torch.inference_mode():
        _sync(target.device)
        start = time.perf_counter()
        output = target.model.generate(input_ids, **kwargs)
        _sync(target.device)
        seconds = time.perf_counter() - start
    outputs = []
    for row in output[:, width:].tolist():
        end = next((i + 1 for i, t in enumerate(row) if t in target.eos_token_ids), len(row))
        outputs.append(row[:end])
    return seconds, outputs


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
            medians[mode] = _median(tps)
            rows.append(_rounded({
                "concurrency": n, "mode": mode,
                "draft_length": draft_length if mode == "speculative_sequential" else None,
                "total_tokens_per_s": medians[mode],
                "total_tokens_per_s_min": min(t for t in tps if t is not None),
                "total_tokens_per_s_max": max(t for t in tps if t is not None),
                "mean_latency_s": _median([v["mean_latency_s"] for v in values]),
                "new_tokens": _median([v["new_tokens"] for v in values]),
                "outputs_equal_speculative": _median([v["same_as_speculative"] for v in values])}))
        gain = ratio(medians["speculative_sequential"] or 0.0, medians["plain_batched"] or 0.0)
        rows[-1]["speculative_over_batched_plain"] = _rounded(gain)
        rows[-2]["speculative_over_batched_plain"] = None
    return rows


# ----------------------------------------------------------------------------- machine

def machine_info(target) -> dict:
    """Device, dtype, library versions, CPU model, cores and memory of this machine."""
    import psutil
    import torch
    import transformers
    from . import __version__, hardware
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
    }
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=props.name, device_memory_bytes=props.total_memory)
    elif device.type == "mps":
        info["device_name"] = f"Apple silicon ({platform.machine()}) via MPS"
    return info


class OtherCpuUse:
    """CPU time other processes take while the benchmark runs, as a share of all cores' time.

    System-wide busy seconds (psutil) minus this process's own, over wall seconds x logical cores.
    """

    def __init__(self) -> None:
        import psutil
        self._psutil = psutil
        self._start = (self._busy_s(), self._own_s(), time.perf_counter())

    def _busy_s(self) -> float:
        t = self._psutil.cpu_times()
        return sum(getattr(t, name, 0.0) for name in ("user", "nice", "system", "irq", "softirq"))

    def _own_s(self) -> float:
        t = self._psutil.Process().cpu_times()
        return t.user + t.system

    def share(self) -> float:
        busy0, own0, wall0 = self._start
        wall = (time.perf_counter() - wall0) * (self._psutil.cpu_count(logical=True) or 1)
        others = (self._busy_s() - busy0) - (self._own_s() - own0)
        return max(0.0, min(1.0, others / wall)) if wall > 0 else 0.0


# ----------------------------------------------------------------------------- plots

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


def speedup_figure(sweep: Sweep):
    """Speedup vs draft length, one line per task and engine (bars: min..max over repeats)."""
    ks = list(sweep.config.draft_lengths)
    figure, (ax,) = _figure(7.5, 4.5)
    colors = _colors(len(sweep.config.tasks))
    for color, task in zip(colors, sweep.config.tasks):
        for shift, engine in zip((-0.04, 0.04), sweep.config.engines):
            cells = [_cell(sweep, task, k, engine) for k in ks]
            y = [_value(c, "speedup") for c in cells]
            low = [v - _value(c, "speedup_min") for v, c in zip(y, cells)]
            high = [_value(c, "speedup_max") - v for v, c in zip(y, cells)]
            ax.errorbar([i + shift for i in range(len(ks))], y, yerr=[low, high], color=color, capsize=3,
                        label=f"{task} ({engine})", **STYLE[engine])
    ax.axhline(1.0, color="grey", linestyle=":", label="plain (1.0x)")
    ax.set(xticks=range(len(ks)), xticklabels=[str(k) for k in ks], xlabel="draft length",
           ylabel="speedup over plain (x)", title=f"{sweep.target} + {sweep.draft}: speedup")
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
            y = [_value(c, "tokens_per_s") for c in cells]
            err = [[v - _value(c, "tokens_per_s_min") for v, c in zip(y, cells)],
                   [_value(c, "tokens_per_s_max") - v for v, c in zip(y, cells)]]
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
    "draft_s", "verify_s", "peak_memory_bytes", "extra_memory_bytes", "new_tokens", "plain_new_tokens",
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
        f"transformers {m['transformers']}.",
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


# ----------------------------------------------------------------------------- command line

def register(sub) -> None:
    bench = sub.add_parser("bench", help="sweep tasks x draft lengths: CSV, JSON, PNG plots, report",
                           description=__doc__.split("\n\n")[0])
    bench.add_argument("--preset", default=None, help="a preset name (python -m specdemo presets); "
                       "sets target, draft and dtype")
    bench.add_argument("--target", default=None, help="as for run (default: the default preset's)")
    bench.add_argument("--draft", default=None, help="ngram, self, early-exit:N or a draft model")
    bench.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default %(default)s)")
    bench.add_argument("--draft-lengths", default="1,2,4,8,auto", help="(default %(default)s)")
    bench.add_argument("--max-new-tokens", type=int, default=128)
    bench.add_argument("--repeats", type=int, default=3)
    bench.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    bench.add_argument("--seed", type=int, default=None)
    bench.add_argument("--prompts-per-task", type=int, default=None, help="default: all")
    bench.add_argument("--concurrency", default="", help="e.g. 1,2,4,8 (default: skip)")
    bench.add_argument("--no-reference", action="store_true",
                       help="skip the transformers generate() reference column")
    bench.add_argument("--system", default=None, help="system prompt")
    bench.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    bench.add_argument("--device", default="auto")
    bench.add_argument("--quantization", default=None, choices=["4bit", "8bit", "int8", "int4"])
    bench.add_argument("--trust-remote-code", action="store_true")
    bench.add_argument("--out", required=True, help="folder for bench.csv, bench.json, *.png, report.md")
    bench.set_defaults(func=cmd_bench)


def resolve_models(args) -> tuple[str, str, str, str | None]:
    """(target, draft, dtype, quantization) from --preset or --target/--draft (else the default preset).

    Raises:
        ValueError: --preset together with --target/--draft.
    """
    from .presets import default_preset, get_preset
    if args.preset and (args.target or args.draft):
        raise ValueError("give either --preset or --target/--draft, not both")
    if args.preset or not args.target:
        preset = get_preset(args.preset) if args.preset else default_preset()
        target, draft = preset.target, args.draft or preset.draft
        dtype, quant = args.dtype or preset.dtype, args.quantization or (
            None if preset.quantization == "none" else preset.quantization)
        return target, draft, dtype, quant
    return args.target, args.draft or "ngram", args.dtype or "auto", args.quantization


def cmd_bench(args) -> int:
    from .decode_cli import fail, pipeline_from_args
    from .presets import PresetError
    try:
        config = BenchConfig(tasks=parse_tasks(args.tasks),
                             draft_lengths=parse_draft_lengths(args.draft_lengths),
                             max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                             temperature=args.temperature, seed=args.seed,
                             prompts_per_task=args.prompts_per_task,
                             concurrency=parse_ints(args.concurrency), reference=not args.no_reference,
                             system=args.system)
        prompts = load_prompts(config.tasks)
        args.target, args.draft, args.dtype, args.quantization = resolve_models(args)
    except (ValueError, PresetError, FileNotFoundError) as exc:
        fail(str(exc))
    pipe = pipeline_from_args(args)  # exits with the reason when a model cannot be used
    try:
        sweep = run_sweep(pipe, prompts, config)
    except ValueError as exc:
        fail(str(exc))
    paths = write_outputs(sweep, args.out)
    print(summary_text(sweep))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def summary_text(sweep: Sweep) -> str:
    """A few terminal lines: what ran, and the best draft length per task and engine."""
    head = (f"{sweep.target} + {sweep.draft} on {sweep.machine['device']} "
            f"({sweep.machine['dtype']}), {sweep.seconds:.0f} s")
    return "\n".join([head] + [f"  {line.replace('**', '')}" for line in best_lines(sweep)])
