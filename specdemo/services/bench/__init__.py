"""Benchmark: does speculation pay for this model, task and machine, and with which draft length?

``python -m specdemo bench`` sweeps tasks x draft lengths. For every prompt and repeat it runs, one
decode at a time and interleaved so that machine noise hits every column alike:

* **specdemo**: our engine (``Pipeline.run``), plain once, then speculative per draft length;
* **transformers** (the reference column, on request: ``--reference``, announced with an
  estimate from its warm-up): the same model object through ``model.generate()``,
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

from .aggregate import aggregate, best_draft_lengths, best_overall_draft_length, pool, summarise
from .config import (DEFAULT_DRAFT_LENGTHS, DIGITS, ENGINES, BenchConfig, PeakMemory, Run,
                     parse_draft_lengths, parse_ints, parse_tasks)
from .report import (CONCURRENCY_COLUMNS, CSV_COLUMNS, best_lines, figures, fmt, report_markdown,
                     summary_text, write_outputs)
from .run import (Progress, SpecdemoEngine, Sweep, concurrency_sweep, machine_info,
                  reference_estimate_s, run_sweep)

__all__ = [
    "BenchConfig", "CONCURRENCY_COLUMNS", "CSV_COLUMNS", "DEFAULT_DRAFT_LENGTHS", "DIGITS",
    "ENGINES", "PeakMemory", "Progress", "Run", "SpecdemoEngine", "Sweep", "aggregate",
    "best_draft_lengths", "best_lines", "best_overall_draft_length", "concurrency_sweep",
    "figures", "fmt", "machine_info", "parse_draft_lengths", "parse_ints", "parse_tasks", "pool",
    "reference_estimate_s", "report_markdown", "run_sweep", "summarise", "summary_text",
    "write_outputs",
]
