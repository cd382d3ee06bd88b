"""The reference column: transformers' own ``generate()`` on the same model object.

Plain decoding, its assisted generation (prompt lookup, an assistant model, the target assisting
itself, early exit) and batched plain decoding for the concurrency sweep. transformers returns no
statistics, so :func:`_observed` reads them from its candidate generator without changing what
it does (transformers ``generation/candidate_generator.py``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from typing import Iterator

from ...core.draft_spec import DraftSpec, as_draft_spec
from .config import BenchConfig, PeakMemory, Run

HEURISTIC_START = 5  # draft tokens transformers' heuristic schedule starts from, for "auto"


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
    from ...core.clock import sync as _sync  # deferred: imports torch
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
        draft_spec: ``ngram``, ``self``, ``early-exit:N`` or a model spec (a ``DraftSpec`` or
            its text, :func:`as_draft_spec`).
        draft: the loaded draft model for model specs.
    """

    name = "transformers"

    def __init__(self, target, draft_spec: DraftSpec | str, draft=None) -> None:
        self.target, self.draft_spec, self.draft = target, as_draft_spec(draft_spec), draft

    def _options(self, draft_length: int | str) -> tuple[dict, dict, object | None, str]:
        """(generate kwargs, assistant generation-config fields, the model holding them, label)."""
        if self.draft_spec.kind == "ngram":
            return ({"prompt_lookup_num_tokens": draft_length}, {}, None,
                    f"prompt_lookup_num_tokens={draft_length}")
        if self.draft_spec.is_early_exit:
            layers = self.draft_spec.layers
            holder, kwargs = self.target.model, {"assistant_early_exit": layers}
            what = f"assistant_early_exit={layers}"
        elif self.draft_spec.kind == "self":
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
        if hasattr(self.draft, "new_drafter"):  # a learned drafter (EAGLE-3, combined, ...)
            return self.draft_spec.text, ("n/a: transformers' generate() has no EAGLE-3 "
                                          "drafter or n-gram stacking")
        if self.draft_spec.kind == "ngram" and draft_length == "auto":
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
                    refused[(self.name, k)] = error_status(exc)
        return refused

    def run(self, prompt_ids: list[int], config: BenchConfig, draft_length: int | str | None,
            where: dict) -> Run:
        """One ``generate()`` call, timed from the call to its return (device synchronised)."""
        import torch
        from ...core.clock import sync as _sync  # deferred: imports torch
        model, device = self.target.model, self.target.device
        input_ids = torch.tensor([prompt_ids], dtype=torch.long, device=device)  # (1, P)
        kwargs = _generate_kwargs(self.target, config, min_new_tokens=0)
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
        run.peak_memory_method = memory.method
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


def _generate_kwargs(target, config: BenchConfig, **extra) -> dict:
    """``generate()`` settings shared by every reference call: length, EOS, padding, sampling."""
    kwargs = dict(max_new_tokens=config.max_new_tokens, do_sample=not config.greedy,
                  eos_token_id=sorted(target.eos_token_ids) or None, pad_token_id=_pad_id(target),
                  **extra)
    if not config.greedy:  # the same distribution as ours: temperature only
        kwargs.update(temperature=config.temperature, top_k=0, top_p=1.0)
    return kwargs


def error_status(exc: Exception) -> str:
    """A refused setting as a cell's status: ``error: <type>: <message>`` (300 characters at most)."""
    return f"error: {type(exc).__name__}: {exc}"[:300]


def batched_plain(target, requests: list[list[int]],
                  config: BenchConfig) -> tuple[float, list[list[int]]]:
    """Plain decoding of all requests as one batch: ``model.generate`` on left-padded prompts.

    Returns:
        (wall seconds, new token ids per request cut after its first EOS).
    """
    import torch
    from ...core.clock import sync as _sync  # deferred: imports torch
    pad, width = _pad_id(target), max(len(r) for r in requests)
    rows = [[pad] * (width - len(r)) + r for r in requests]
    mask = [[0] * (width - len(r)) + [1] * len(r) for r in requests]
    input_ids = torch.tensor(rows, dtype=torch.long, device=target.device)  # (N, P_max)
    kwargs = _generate_kwargs(target, config,
                              attention_mask=torch.tensor(mask, device=target.device))  # (N, P_max)
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
