"""``costs`` subcommand: what a target forward costs on this machine, and the bound (the
measurements and the report: ``services/costs.py``)."""

from __future__ import annotations

import argparse
import json
import sys

from ..core import BACKENDS
from ..services import costs
from ..models.quantize import QUANTIZATION_CHOICES
from ..models import loading
from ..services.presets import default_target


def register(sub) -> None:
    p = sub.add_parser("costs", help="forward-cost table n=1..N, memory bandwidth and bound")
    p.add_argument("--target", default=default_target(),
                   help="HF id, local dir, .gguf file or builtin:<name> (default %(default)s: the "
                        "default preset's)")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"])
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    p.add_argument("--quantization", default=None, choices=list(QUANTIZATION_CHOICES))
    p.add_argument("--max-n", type=int, default=16, help="widest forward timed (default 16)")
    p.add_argument("--context", type=int, default=128, help="cached tokens before each forward")
    p.add_argument("--repeats", type=int, default=5, help="forwards timed per width (median)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    p.add_argument("--clock", default="wall", choices=list(costs.CLOCKS),
                   help="wall (default) or cpu: this thread's CPU time, for a shared machine "
                        "(needs --threads 1)")
    p.add_argument("--before-after", type=int, default=0, metavar="ROUNDS",
                   help="also time transformers' own kernels, alternating with the fast path "
                        "ROUNDS times in this process (stock_forward_s in the output)")
    p.add_argument("--trust-remote-code", action="store_true")
    p.add_argument("--backend", default="auto", choices=BACKENDS,
                   help="auto (default): measure every backend available for the target and "
                        "report the one auto chooses first; or only transformers / ggml / ggml-bf16 / "
                        "int8 / native / native-int8 / native-w8a8")
    p.add_argument("--llama-bench", action="store_true",
                   help="also run llama.cpp's llama-bench (tg 64, same threads) on the GGUF")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(func=cmd_costs)


def cmd_costs(args: argparse.Namespace) -> int:
    if args.max_n < 1 or args.context < 1:
        print("error: --max-n and --context must be >= 1", file=sys.stderr)
        return 2
    if args.threads:
        import torch
        torch.set_num_threads(args.threads)
    try:
        loaded = loading.load_model(args.target, args.device, args.dtype, quantization=args.quantization,
                            trust_remote_code=args.trust_remote_code)
    except loading.ModelLoadError as exc:
        print(f"error: {exc}\n(python -m specdemo costs --help)", file=sys.stderr)
        return 2
    # lazy: imports torch; --help stays fast
    from ..models.backends import candidate_backends
    # lazy: imports torch; --help stays fast
    from ..services.backend_choice import with_backend
    # lazy: imports torch; --help stays fast
    from ..models.ggml_backend import ggml_model, gguf_path
    from ..core.machine import OtherCpuUse
    from ..services.backend_store import recheck_against_others
    try:
        chosen, choice = with_backend(loaded, args.backend)
        names = [chosen.backend]
        if args.backend == "auto" and loaded.device.type == "cpu":
            names += [b for b in candidate_backends(loaded)[0] if b != chosen.backend]
        others = OtherCpuUse()
        reports = costs.measure_backends(loaded, names, max_n=args.max_n, context=args.context,
                                   repeats=args.repeats, clock=args.clock,
                                   before_after_rounds=args.before_after)
        if args.backend == "auto":
            note = recheck_against_others(choice, {b: r.plain_tokens_per_s for b, r in reports.items()},
                                          others.share_if_measurable())
            if note:
                print(f"note: {note}", file=sys.stderr)
    except (ValueError, loading.ModelLoadError) as exc:
        print(f"error: {exc}\n(python -m specdemo costs --help)", file=sys.stderr)
        return 2
    report = reports[chosen.backend]
    report.backend_choice = choice.as_dict()
    report.backends = {b: {k: getattr(r, k) for k in costs.SUMMARY_KEYS} for b, r in reports.items()}
    if args.llama_bench:
        import torch
        try:
            threads = ggml_model(loaded).threads if "ggml" in reports else torch.get_num_threads()
            lb = costs.run_llama_bench(gguf_path(loaded.spec), threads)
            # the chosen backend's plain rate: the one run, compare and the app use
            ours = report.plain_tokens_per_s
            lb["ours_backend"] = chosen.backend
            lb["ours_over_llama_bench"] = (ours / lb["tg_tokens_per_s"]
                                           if ours and lb["tg_tokens_per_s"] else None)
            lb["by_backend"] = {b: (r.plain_tokens_per_s / lb["tg_tokens_per_s"]
                                    if r.plain_tokens_per_s and lb["tg_tokens_per_s"] else None)
                                for b, r in reports.items()}
        except (OSError, RuntimeError, ValueError, TypeError) as exc:
            lb = {"error": str(exc)}
        report.llama_bench = lb
    print(json.dumps(report.as_dict()) if args.json else costs.format_report(report))
    return 0
