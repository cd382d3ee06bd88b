"""The measuring steps of scripts/device_check.sh (issue 50), each one subcommand that appends
JSON records (one a line) to a file as it goes, so that a step cut by its time limit keeps what
it measured; ``summary`` joins them into one results file.

    python scripts/device_check.py env       --out R.jsonl
    python scripts/device_check.py races     --out R.jsonl --device cuda --dtype float32 [--backend B]
    python scripts/device_check.py reference --out R.jsonl --device cuda --dtype bfloat16
    python scripts/device_check.py plain     --out R.jsonl --device cuda --dtype bfloat16
    python scripts/device_check.py bnb4      --out R.jsonl --device cuda
    python scripts/device_check.py summary   --records R.jsonl --junit J.xml --costs C.json --out device_check.json

A record is one (kind, engine/backend, drafter, dtype, prompt): ``race`` (our compare: both lanes'
tokens/s, mean acceptance length, speedup, identical output, the explanation's projection for
hardware where verification costs one step beside the measured speedup), ``reference``
(transformers' own ``generate``: plain, ``prompt_lookup_num_tokens``, ``assistant_model``),
``plain`` (plain decoding tokens/s: ours eager and on cuda-graphs against ``generate`` with a
dynamic and a static cache). Imports no gradio (the GPU machine has none).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

TARGET = "builtin:smollm2-135m"
HEAD = "builtin:smollm2-135m-eagle3"
#: a chat, a code, a Chinese and a copying prompt (the issue's four kinds of text)
PROMPTS = {
    "chat": "Explain in three sentences why the sky is blue.",
    "code": "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "chinese": "用三句话解释为什么天空是蓝色的。",
    "copying": ("Repeat this paragraph word for word: The quick brown fox jumps over the lazy dog "
                "near the quiet river bank, and the dog, startled, runs up the hill to the old "
                "mill where the miller keeps his bread."),
}
#: name -> (draft spec, draft length, draft tree); the app's default pairing first
DRAFTERS = {
    "default (eagle3+ngram, auto)": (f"{HEAD}+ngram", "auto", None),
    "eagle3 k=4": (HEAD, 4, None),
    "eagle3 auto": (HEAD, "auto", None),
    "eagle3 tree": (HEAD, 4, "default"),
    "ngram k=4": ("ngram", 4, None),
    "self k=4": ("self", 4, None),
}
REFERENCE = {"plain": (None, None), "ngram k=4": ("ngram", 4), "self k=4": ("self", 4)}
PROJECTION_GAP = 0.20  # the bound between measured speedup and projection


def emit(path: Path, record: dict) -> None:
    """Append ``record`` as one JSON line and echo it (the report keeps the step's output)."""
    line = json.dumps(record, default=str)
    with path.open("a", encoding="utf-8") as out:
        out.write(line + "\n")
    print(line, flush=True)


def _round(x, digits: int = 4):
    return round(x, digits) if isinstance(x, float) else x


# ----------------------------------------------------------------------------- loading

def load(device: str, dtype: str, quantization: str | None = None):
    from specdemo.services import startup
    with startup.printed():
        return startup.load_model(TARGET, device, dtype, quantization=quantization)


def pipeline(target, draft_spec: str, backend: str):
    """Our pipeline of ``target`` with ``draft_spec`` on ``backend`` (``cuda-graphs`` off CUDA:
    :func:`rehearsed_graphs`)."""
    from specdemo.services.backend_choice import use_backend
    from specdemo.services.pipeline import build_pipeline
    from specdemo.models.backends import replace_backend
    if backend == "cuda-graphs" and target.device.type != "cuda":
        rehearsed_graphs(target)

        def on_backend(loaded, spec, draft):
            return replace_backend(loaded, "cuda-graphs")
    else:
        def on_backend(loaded, spec, draft):
            return use_backend(loaded, backend, spec, draft)[0]
    return build_pipeline(target, draft_spec,
                          load_draft=lambda spec, device: load(
                              device, str(target.dtype).replace("torch.", "")),
                          check_draft=lambda spec: None, on_backend=on_backend)


def rehearsed_graphs(target) -> None:
    """Let the cuda-graphs backend serve a CPU target in a dry run: its static weights are put
    where ``cuda_graph_backend.static_model`` finds them, past the CUDA-only check, so the same
    code runs with each graph replayed eagerly (``run_eagerly``). A rehearsal of the plumbing,
    not a backend the app offers on a CPU."""
    from specdemo.models import cuda_graph_backend as cg
    if getattr(target.model, cg._ATTR, None) is None:
        setattr(target.model, cg._ATTR, cg.StaticLlama(target.model))


def settings_for(tokens: int, draft_length, tree):
    from specdemo.core.tree import named_shape
    from specdemo.services.pipeline import DecodeSettings
    return DecodeSettings(max_new_tokens=tokens, draft_length=draft_length,
                          tree=named_shape(tree) if tree else None)


# ----------------------------------------------------------------------------- steps

def cmd_env(args) -> int:
    """The commit, the GPU, its driver, torch's and transformers' versions."""
    import torch
    import transformers
    record = {"kind": "env", "commit": _git("rev-parse", "HEAD"),
              "dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
              "python": platform.python_version(), "torch": torch.__version__,
              "torch_cuda": torch.version.cuda, "transformers": transformers.__version__,
              "cpu": platform.processor() or platform.machine(),
              "cuda_available": torch.cuda.is_available(), "gpu": None, "gpu_memory_gib": None,
              "driver": None, "bitsandbytes": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        record.update(gpu=props.name, gpu_memory_gib=round(props.total_memory / 2**30, 1),
                      bf16_supported=torch.cuda.is_bf16_supported())
        try:
            record["driver"] = subprocess.run(
                ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                capture_output=True, text=True, timeout=20).stdout.strip().splitlines()[0]
        except (OSError, IndexError, subprocess.SubprocessError) as exc:
            record["driver"] = f"unknown ({type(exc).__name__})"
    try:
        import bitsandbytes
        record["bitsandbytes"] = bitsandbytes.__version__
    except Exception as exc:  # noqa: BLE001 - any failure to import is the finding
        record["bitsandbytes"] = f"not importable ({type(exc).__name__}: {exc})"[:200]
    emit(args.out, record)
    return 0


def _git(*argv: str) -> str | None:
    try:
        return subprocess.run(["git", *argv], capture_output=True, text=True,
                              timeout=20).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None


def race_record(comparison, *, backend: str, drafter: str, spec: str, draft_length, tree,
                dtype: str, prompt: str, device: str) -> dict:
    """One ``race`` record from a ``pipeline.Comparison``."""
    p, s = comparison.plain.stats, comparison.speculative.stats
    e = comparison.explanation
    projected = e.projected_speedup_free_verification if e else None
    return {"kind": "race", "device": device, "backend": backend, "drafter": drafter,
            "draft": spec, "draft_length": draft_length, "draft_tree": tree, "dtype": dtype,
            "prompt": prompt, "new_tokens": s.new_tokens,
            "plain_tokens_per_s": _round(p.tokens_per_s),
            "speculative_tokens_per_s": _round(s.tokens_per_s),
            "speedup": _round(comparison.speedup),
            "mean_acceptance_length": _round(s.mean_acceptance_length),
            "acceptance_rate": _round(s.acceptance_rate),
            "identical": comparison.identical, "lossless_expected": comparison.lossless_expected,
            "tree": s.tree, "tree_rounds": s.tree_rounds,
            "projected_speedup_free_verification": _round(projected),
            "modelled_speedup": _round(e.modelled_speedup) if e else None,
            "verify_cost_steps": _round(e.verify_cost_steps) if e else None,
            "draft_cost_steps": _round(e.draft_cost_steps) if e else None,
            "step_s": _round(e.step_s, 6) if e else None,
            "other_cpu_share": _round(s.other_cpu_share), "warnings": comparison.warnings}


def cmd_races(args) -> int:
    """Our compare of every drafter of :data:`DRAFTERS` on every prompt, one dtype, one backend."""
    from specdemo.services import startup
    target = load(args.device, args.dtype)
    failures = 0
    for name in _pick(DRAFTERS, args.drafters):
        spec, k, tree = DRAFTERS[name]
        where = {"kind": "race", "device": args.device, "backend": args.backend, "drafter": name,
                 "draft": spec, "dtype": args.dtype}
        try:
            pipe = pipeline(target, spec, args.backend)
        except Exception as exc:  # noqa: BLE001 - one drafter's failure is its record
            emit(args.out, {**where, "prompt": None, "error": _error(exc)})
            failures += 1
            continue
        for prompt in _pick(PROMPTS, args.prompts):
            try:
                ids = pipe.prompt_ids(PROMPTS[prompt])
                settings = settings_for(args.tokens, k, tree)
                for speculative in (False, True):
                    startup.prepare_timed(pipe, speculative, k, ids)
                pipe.run(ids, dataclasses.replace(settings, max_new_tokens=min(16, args.tokens)),
                         True)  # untimed: every width this race verifies (trees too) once
                comparison = pipe.compare(ids, settings)
                emit(args.out, race_record(comparison, backend=pipe.target.backend, drafter=name,
                                           spec=spec, draft_length=k, tree=tree, dtype=args.dtype,
                                           prompt=prompt, device=args.device))
            except Exception as exc:  # noqa: BLE001
                emit(args.out, {**where, "prompt": prompt, "error": _error(exc)})
                failures += 1
    return 1 if failures else 0


def _pick(table: dict, names: str | None) -> list[str]:
    if not names:
        return list(table)
    wanted = [n.strip() for n in names.split(",") if n.strip()]
    unknown = [n for n in wanted if not any(key.startswith(n) for key in table)]
    if unknown:
        raise SystemExit(f"unknown: {unknown}; known: {list(table)}")
    return [key for key in table if any(key.startswith(n) for n in wanted)]


def _error(exc: BaseException) -> str:
    traceback.print_exc()
    return f"{type(exc).__name__}: {exc}"[:400]


def reference_run(engine, ids, tokens: int, draft_length):
    """One timed ``generate`` (after an untimed one of the same settings) -> bench ``Run``."""
    from specdemo.services.bench.config import BenchConfig
    config = BenchConfig(tasks=("chat",), draft_lengths=(4,), max_new_tokens=tokens,
                         reference=True)
    where = {"task": "", "prompt": 0, "repeat": 0}
    engine.run(ids, dataclasses.replace(config, max_new_tokens=min(8, tokens)), draft_length, where)
    return engine.run(ids, config, draft_length, where)


def cmd_reference(args) -> int:
    """transformers' own assisted generation on the same model object: plain, prompt lookup
    (``prompt_lookup_num_tokens=4``), the target assisting itself (``assistant_model``, 4)."""
    from specdemo.services.bench.reference import TransformersEngine
    target = load(args.device, args.dtype)
    failures = 0
    for prompt in _pick(PROMPTS, args.prompts):
        ids = None
        plain = None
        for name, (spec, k) in REFERENCE.items():
            where = {"kind": "reference", "device": args.device, "engine": "transformers",
                     "drafter": name, "dtype": args.dtype, "prompt": prompt}
            try:
                engine = TransformersEngine(target, spec or "ngram")
                if ids is None:
                    from specdemo.services.pipeline import Pipeline
                    ids = Pipeline(target).prompt_ids(PROMPTS[prompt])
                run = reference_run(engine, ids, args.tokens, k)
                tokens_per_s = run.new_tokens / run.elapsed_s if run.elapsed_s else None
                if spec is None:
                    plain = (run, tokens_per_s)
                record = {**where, "method": engine.method(k)[0] if k else "generate()",
                          "new_tokens": run.new_tokens, "tokens_per_s": _round(tokens_per_s),
                          "mean_acceptance_length": _round(run.round_tokens / run.rounds)
                          if spec and run.rounds else None,
                          "acceptance_rate": _round(run.accepted / run.drafted)
                          if run.drafted else None}
                if spec and plain is not None:
                    record["speedup"] = _round(tokens_per_s / plain[1]) if plain[1] else None
                    record["identical"] = run.token_ids == plain[0].token_ids
                emit(args.out, record)
            except Exception as exc:  # noqa: BLE001
                emit(args.out, {**where, "error": _error(exc)})
                failures += 1
    emit(args.out, {"kind": "reference", "device": args.device, "engine": "transformers",
                    "drafter": "eagle3", "dtype": args.dtype, "prompt": None,
                    "not_run": "transformers' generate() has no EAGLE-3 drafter"})
    return 1 if failures else 0


def cmd_plain(args) -> int:
    """Plain decoding tokens/s on one prompt: ours on the transformers backend and on
    cuda-graphs, against ``generate`` with a dynamic and with a static cache (on CUDA
    transformers compiles the static-cache forward itself; the untimed first call pays it)."""
    from specdemo.services import startup
    from specdemo.services.bench.reference import TransformersEngine
    target = load(args.device, args.dtype)
    prompt = _pick(PROMPTS, args.prompts)[0]
    settings = settings_for(args.tokens, 4, None)
    failures = 0
    base = {"kind": "plain", "device": args.device, "dtype": args.dtype, "prompt": prompt}
    ours = {}
    for backend in ("transformers", "cuda-graphs"):
        try:
            pipe = pipeline(target, "none", backend)
            ids = pipe.prompt_ids(PROMPTS[prompt])
            startup.prepare_timed(pipe, False, 4, ids)
            pipe.run(ids, settings, False)  # untimed: captures every width once
            result = pipe.run(ids, settings, False)
            ours[backend] = result.token_ids
            graphs = {"graphs_captured": pipe.kv.captures, "capture_error": pipe.kv.capture_error} \
                if backend == "cuda-graphs" else {}
            emit(args.out, {**base, "engine": f"specdemo {backend}", **graphs,
                            "new_tokens": result.stats.new_tokens,
                            "tokens_per_s": _round(result.stats.tokens_per_s),
                            "decode_tokens_per_s": _round(result.stats.decode_tokens_per_s),
                            "same_as_specdemo_transformers":
                                result.token_ids == ours.get("transformers")})
        except Exception as exc:  # noqa: BLE001
            emit(args.out, {**base, "engine": f"specdemo {backend}", "error": _error(exc)})
            failures += 1
    for cache in ("dynamic", "static"):
        try:
            from specdemo.services.pipeline import Pipeline
            engine = TransformersEngine(target, "ngram")
            ids = Pipeline(target).prompt_ids(PROMPTS[prompt])
            with _generation_cache(target.model, cache):
                start = time.perf_counter()
                run = reference_run(engine, ids, args.tokens, None)
                first_s = time.perf_counter() - start - run.elapsed_s
            emit(args.out, {**base, "engine": f"transformers generate ({cache} cache)",
                            "new_tokens": run.new_tokens,
                            "tokens_per_s": _round(run.new_tokens / run.elapsed_s),
                            "untimed_first_call_s": _round(first_s),
                            "same_as_specdemo_transformers":
                                run.token_ids == ours.get("transformers")})
        except Exception as exc:  # noqa: BLE001
            emit(args.out, {**base, "engine": f"transformers generate ({cache} cache)",
                            "error": _error(exc)})
            failures += 1
    return 1 if failures else 0


class _generation_cache:
    """``model.generation_config.cache_implementation`` set to ``static`` for one block
    (``dynamic``: left as it is)."""

    def __init__(self, model, cache: str) -> None:
        self.config, self.cache = model.generation_config, cache

    def __enter__(self):
        self.old = getattr(self.config, "cache_implementation", None)
        if self.cache == "static":
            self.config.cache_implementation = "static"

    def __exit__(self, *exc) -> None:
        self.config.cache_implementation = self.old


def cmd_bnb4(args) -> int:
    """A 4-bit bitsandbytes target: ngram k=4 on the chat prompt, if bitsandbytes loads."""
    where = {"kind": "race", "device": args.device, "backend": "transformers",
             "drafter": "ngram k=4", "draft": "ngram", "dtype": "4bit", "prompt": "chat"}
    try:
        import bitsandbytes  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        emit(args.out, {**where, "not_run": f"bitsandbytes does not load: {type(exc).__name__}: "
                                            f"{exc}"[:300]})
        return 0
    if not args.device.startswith("cuda"):
        emit(args.out, {**where, "not_run": f"bitsandbytes 4-bit runs on CUDA; this is {args.device}"})
        return 0
    try:
        from specdemo.services import startup
        target = load(args.device, "auto", quantization="4bit")
        pipe = pipeline(target, "ngram", "transformers")
        ids = pipe.prompt_ids(PROMPTS["chat"])
        for speculative in (False, True):
            startup.prepare_timed(pipe, speculative, 4, ids)
        comparison = pipe.compare(ids, settings_for(args.tokens, 4, None))
        emit(args.out, race_record(comparison, backend="transformers", drafter="ngram k=4",
                                   spec="ngram", draft_length=4, tree=None, dtype="4bit",
                                   prompt="chat", device=args.device))
        return 0
    except Exception as exc:  # noqa: BLE001
        emit(args.out, {**where, "error": _error(exc)})
        return 1


# ----------------------------------------------------------------------------- summary

def projection_rows(records: list[dict], rehearsal: bool = False) -> list[dict]:
    """Each GPU race beside the projection for where verification costs one step: its own
    (``projected_speedup_free_verification`` of the GPU race) and the CPU's (the same drafter,
    prompt and float32 race on the CPU, when the check ran one), with ``gap`` = measured /
    CPU projection - 1 and ``beyond_20_percent`` where it is larger than :data:`PROJECTION_GAP`.
    A ``rehearsal`` (the CPU dry run) pairs the CPU races with themselves: the plumbing only."""
    cpu = {(r["drafter"], r["prompt"]): r for r in records
           if r.get("kind") == "race" and r.get("device") == "cpu" and "speedup" in r
           and r.get("dtype") == "float32"}
    rows = []
    for r in records:
        if r.get("kind") != "race" or "speedup" not in r or (
                r.get("device") == "cpu" and not rehearsal):
            continue
        twin = cpu.get((r["drafter"], r["prompt"]))
        cpu_projection = twin.get("projected_speedup_free_verification") if twin else None
        gap = (r["speedup"] / cpu_projection - 1 if r.get("speedup") and cpu_projection
               else None)
        rows.append({k: r.get(k) for k in ("backend", "drafter", "dtype", "prompt", "speedup",
                                           "projected_speedup_free_verification")}
                    | {"cpu_projection": cpu_projection, "gap": _round(gap),
                       "beyond_20_percent": abs(gap) > PROJECTION_GAP if gap is not None else None})
    return rows


def junit_outcome(path: Path | None) -> dict | None:
    """{passed, failed, errors, skipped, failures: [names]} of a pytest junit file."""
    if path is None or not path.exists():
        return None
    import xml.etree.ElementTree as ET
    root = ET.parse(path).getroot()
    cases = root.iter("testcase")
    out = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "failures": []}
    for case in cases:
        name = f"{case.get('classname')}::{case.get('name')}"
        if case.find("failure") is not None:
            out["failed"] += 1
            out["failures"].append(name)
        elif case.find("error") is not None:
            out["errors"] += 1
            out["failures"].append(name)
        elif case.find("skipped") is not None:
            out["skipped"] += 1
        else:
            out["passed"] += 1
    return out


def summary_lines(result: dict) -> list[str]:
    """The figures in a few lines, for the end of the report."""
    env = result.get("env") or {}
    lines = [f"commit {env.get('commit')}, GPU {env.get('gpu')}, driver {env.get('driver')}, "
             f"torch {env.get('torch')} (CUDA {env.get('torch_cuda')}), transformers "
             f"{env.get('transformers')}, bitsandbytes {env.get('bitsandbytes')}"]
    tests = result.get("cuda_tests")
    lines.append("cuda tests: " + (f"{tests['passed']} passed, {tests['failed']} failed, "
                                   f"{tests['errors']} errors, {tests['skipped']} skipped"
                                   if tests else "no outcome recorded"))
    for r in result["records"]:
        what = f"{r.get('kind')} {r.get('device')} {r.get('backend') or r.get('engine')} " \
               f"{r.get('drafter', '')} {r.get('dtype')} {r.get('prompt')}"
        if "error" in r or "not_run" in r:
            lines.append(f"{what}: {'ERROR ' + r['error'] if 'error' in r else 'not run: ' + r['not_run']}")
        elif r.get("kind") == "race":
            lines.append(f"{what}: plain {r['plain_tokens_per_s']} tok/s, spec "
                         f"{r['speculative_tokens_per_s']} tok/s, speedup {r['speedup']}, "
                         f"mean acceptance length {r['mean_acceptance_length']}, identical "
                         f"{r['identical']}, projection {r['projected_speedup_free_verification']}")
        elif r.get("kind") in ("reference", "plain"):
            lines.append(f"{what}: {r.get('tokens_per_s')} tok/s"
                         + (f", speedup {r['speedup']}" if r.get("speedup") else "")
                         + (f", mean acceptance length {r['mean_acceptance_length']}"
                            if r.get("mean_acceptance_length") else ""))
    costs = result.get("costs")
    if costs:
        forward = costs.get("forward_s") or {}
        lines.append("costs: forward ms by width " + ", ".join(
            f"{n}: {float(t) * 1000:.2f}" for n, t in list(forward.items())[:16]))
    return lines


def cmd_summary(args) -> int:
    records = []
    if args.records.exists():
        for line in args.records.read_text(encoding="utf-8").splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
    env = next((r for r in records if r.get("kind") == "env"), None)
    costs = None
    if args.costs and args.costs.exists():
        try:
            costs = json.loads(args.costs.read_text(encoding="utf-8").strip().splitlines()[-1])
        except (ValueError, IndexError):
            costs = None
    measured = [r for r in records if r.get("kind") != "env"]
    result = {"what": "scripts/device_check.sh (issue 50): one record per (kind, engine or "
                      "backend, drafter, dtype, prompt)",
              "mode": args.mode, "env": env, "steps": args.steps or [],
              "cuda_tests": junit_outcome(args.junit), "records": measured,
              "projection_vs_measured": projection_rows(measured, args.mode != "accelerator"),
              "costs": costs}
    args.out.write_text(json.dumps(result, indent=1, default=str) + "\n", encoding="utf-8")
    for line in summary_lines(result):
        print(line)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, func in (("env", cmd_env), ("races", cmd_races), ("reference", cmd_reference),
                       ("plain", cmd_plain), ("bnb4", cmd_bnb4)):
        p = sub.add_parser(name)
        p.add_argument("--out", type=Path, required=True, help="records file (JSON lines)")
        p.add_argument("--device", default="cuda")
        p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
        p.add_argument("--backend", default="transformers")
        p.add_argument("--tokens", type=int, default=128, help="max new tokens per decode")
        p.add_argument("--prompts", default=None, help=f"comma-separated of {list(PROMPTS)}")
        p.add_argument("--drafters", default=None, help="comma-separated name prefixes of "
                                                        f"{list(DRAFTERS)}")
        p.set_defaults(func=func)
    p = sub.add_parser("summary")
    p.add_argument("--records", type=Path, required=True)
    p.add_argument("--junit", type=Path, default=None)
    p.add_argument("--costs", type=Path, default=None)
    p.add_argument("--mode", default="accelerator")
    p.add_argument("--steps", nargs="*", default=None, help="each step's verdict")
    p.add_argument("--out", type=Path, required=True)
    p.set_defaults(func=cmd_summary)
    args = parser.parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    raise SystemExit(main())
