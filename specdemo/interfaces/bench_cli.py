"""``python -m specdemo bench``: parse the flags, load the pipeline, sweep, write the outputs."""

from __future__ import annotations

import argparse
import sys
from datetime import datetime, timezone
from pathlib import Path

from ..checks.inputs import checked, draft, target  # the same rule as run, compare and /race
from ..services.prompts import TASKS, load_prompts
from ..services.bench import __doc__ as _PACKAGE_DOC
from ..services.bench.config import BenchConfig, parse_draft_lengths, parse_ints, parse_tasks
from ..services.bench.report import summary_text, write_outputs
from ..services.bench.run import run_sweep
from .decode_cli import (add_backend_flag, chosen_preset, draft_tree_arg, fail, pipeline_from_args,
                         preset_models)
from ..services.endpoints import EndpointError, add_endpoint_flags, endpoints_from_args
from ..services.presets import PresetError, default_preset


def register(sub) -> None:
    bench = sub.add_parser("bench", help="sweep tasks x draft lengths: CSV, JSON, PNG plots, report",
                           description=_PACKAGE_DOC.split("\n\n")[0])
    bench.add_argument("--preset", default=None, help="a preset name (python -m specdemo presets); "
                       "sets target, draft, dtype and quantization (the draft lengths are "
                       "--draft-lengths')")
    bench.add_argument("--target", default=None, type=checked(target, "target"),
                       help="as for run (default: the default preset's)")
    bench.add_argument("--draft", default=None, type=checked(draft, "draft"),
                       help="as for run: ngram, self, early-exit:N, mtp, a learned drafter "
                       "(<learned>+ngram stacks prompt lookup over it) or a draft model "
                       "(default: the default preset's)")
    bench.add_argument("--tasks", default=",".join(TASKS), help="comma-separated (default %(default)s)")
    bench.add_argument("--draft-lengths", default="1,2,4,8,auto", help="(default %(default)s)")
    bench.add_argument("--draft-tree", type=draft_tree_arg, default=None, metavar="SHAPE",
                       help="as for run: default, off, or rank paths (default off)")
    bench.add_argument("--max-new-tokens", type=int, default=128,
                       help="most tokens per decode (default %(default)s)")
    bench.add_argument("--repeats", type=int, default=3,
                       help="passes over all the prompts, each decoding every prompt with "
                            "every method; the report keeps each figure's median over them "
                            "(default %(default)s)")
    bench.add_argument("--temperature", type=float, default=0.0,
                       help="sampling temperature, 0 = greedy (default %(default)s)")
    bench.add_argument("--seed", type=int, default=None,
                       help="seed of the sampling generators (default %(default)s: a fresh one "
                            "each run; greedy needs none)")
    bench.add_argument("--prompts-per-task", type=int, default=None, help="default: all")
    bench.add_argument("--concurrency", default="", help="e.g. 1,2,4,8 (default: skip)")
    bench.add_argument("--reference", action="store_true",
                       help="add the reference column: the same float32 model through "
                            "transformers' own generate() and its assisted generation (prompt "
                            "lookup, an assistant model); slow on a CPU (announced with an "
                            "estimate from its warm-up before the sweep); off by default")
    bench.add_argument("--no-reference", action="store_true", help=argparse.SUPPRESS)  # the default
    bench.add_argument("--system", default=None, help="system prompt")
    bench.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"])
    bench.add_argument("--device", default="auto")
    bench.add_argument("--quantization", default=None, choices=["4bit", "8bit", "int8", "int4"])
    bench.add_argument("--trust-remote-code", action="store_true")
    add_backend_flag(bench)
    bench.add_argument("--out", required=True, help="folder for bench.csv, bench.json, *.png, report.md")
    add_endpoint_flags(bench)
    bench.add_argument("--note", default="", help="a line for the server report (e.g. how the "
                       "servers were started)")
    bench.set_defaults(func=cmd_bench)


def resolve_models(args) -> tuple[str, str, str, str | None]:
    """(target, draft, dtype, quantization) from --preset or --target/--draft (else the default preset).

    Raises:
        ValueError: --preset together with --target/--draft.
        PresetError: an unknown preset.
    """
    preset = chosen_preset(args)
    if preset is None and not args.target:
        preset = default_preset()
    if preset is not None:
        return preset_models(preset, args)
    return args.target, args.draft or "ngram", args.dtype or "auto", args.quantization


def cmd_bench(args) -> int:
    try:
        config = BenchConfig(tasks=parse_tasks(args.tasks),
                             draft_lengths=parse_draft_lengths(args.draft_lengths),
                             max_new_tokens=args.max_new_tokens, repeats=args.repeats,
                             temperature=args.temperature, seed=args.seed,
                             prompts_per_task=args.prompts_per_task,
                             concurrency=parse_ints(args.concurrency), reference=args.reference and not args.no_reference,
                             system=args.system, tree=args.draft_tree)
        prompts = load_prompts(config.tasks)
        if args.plain_endpoint or args.spec_endpoint:  # servers: the concurrency sweep
            try:
                endpoints = endpoints_from_args(args)
            except EndpointError as exc:
                fail(str(exc))
            return _cmd_endpoints(args, endpoints, config)
        args.target, args.draft, args.dtype, args.quantization = resolve_models(args)
    except (ValueError, PresetError, FileNotFoundError) as exc:
        fail(str(exc))
    pipe = pipeline_from_args(args)  # exits with the reason when a model cannot be used
    try:
        sweep = run_sweep(pipe, prompts, config, note=lambda line: print(line, file=sys.stderr))
    except ValueError as exc:
        fail(str(exc))
    paths = write_outputs(sweep, args.out)
    print(summary_text(sweep))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0


def _cmd_endpoints(args, endpoints: dict, config) -> int:
    """``bench`` with server lanes: the concurrency sweep (``services/endpoint_bench.py``);
    exit 2 with the reason when it cannot run."""
    from ..services import endpoint_bench as eb  # lazy: server lanes only (--help stays fast)
    from ..services.endpoints import shown_url  # lazy: --help stays fast
    from ..services.pipeline import DecodeSettings  # lazy: imports torch
    try:
        levels = parse_ints(args.concurrency) or (1, 2, 4)
        if any(n < 1 for n in levels):
            raise ValueError("concurrency levels must be 1 or more")
        prompts_by_task = load_prompts(config.tasks)
    except (ValueError, FileNotFoundError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    per = args.prompts_per_task or max(levels)
    prompts = [p for i in range(per) for ps in prompts_by_task.values() if i < len(ps)
               for p in [ps[i]]]
    settings = DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                              seed=args.seed)
    try:
        rows = eb.sweep(endpoints, prompts, levels, settings, args.repeats,
                     progress=lambda line: print(line, file=sys.stderr, flush=True))
    except EndpointError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    meta = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "machine": eb.machine(), "note": args.note or "",
            "servers": {lane: f"{e.engine} at {shown_url(e.url)} ({Path(e.model).name})"
                        for lane, e in endpoints.items() if e is not None},
            "tasks": list(config.tasks), "repeats": args.repeats,
            "max_new_tokens": args.max_new_tokens, "temperature": args.temperature}
    paths = eb.write(rows, Path(args.out), meta)
    for r in rows:
        print(f"  concurrency {r['concurrency']:>2} {r['lane']:<11} "
              f"{r['total_tokens_per_s'] or 0:8.1f} tokens/s"
              + (f"  speedup {r['speedup']:.2f}x" if r["speedup"] is not None else ""))
    print("wrote " + ", ".join(str(p) for p in paths.values()))
    return 0
