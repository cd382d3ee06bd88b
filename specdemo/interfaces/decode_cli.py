"""``run`` and ``compare`` subcommands (docs/design.md, "Command line")."""

from __future__ import annotations

import argparse
import json
import sys

from ..checks import compat, inputs
from ..services import startup
from ..checks.compat import NON_MODEL_DRAFTS  # none, ngram, self: drafters that are not models
from ..services.endpoints import (EndpointError, EndpointPipeline, add_endpoint_flags,
                                  endpoints_from_args, format_endpoint_stats)
from ..checks.inputs import checked
from ..core import BACKENDS
from ..models.loading import ModelLoadError
from ..models.quantize import QUANTIZATION_CHOICES
from ..core.tree import named_shape
from ..services.presets import default_target, get_preset
from ..models.builtin import BUILTIN_DRAFTERS
from .cli import refuse


def draft_tree_arg(value: str):
    """``--draft-tree``: off, default, or rank paths (``core.tree.parse_shape``)."""
    import argparse
    try:
        return named_shape(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def draft_length_arg(value: str) -> int | str:
    """``auto`` or 1..64 (the same rule as the /race API and the page)."""
    return checked(inputs.draft_length, "draft length")(value)


def add_decode_flags(parser: argparse.ArgumentParser, draft_default: str) -> None:
    """Flags shared by run, compare and bench."""
    parser.add_argument("--preset", default=None,
                        help="a preset (python -m specdemo presets; the app's default is "
                             "the one marked *): sets --target, --draft, --draft-length, "
                             "--dtype and --quantization; --draft-length, --dtype and "
                             "--quantization given too override the preset's")
    parser.add_argument("--target", default=None, type=checked(inputs.target, "target"),
                        help="HF id, local dir, .gguf file or builtin:<name> (default "
                             f"{default_target()}: the default preset's)")
    parser.add_argument("--draft", default=None, type=checked(inputs.draft, "draft"),
                        help="none, ngram, self, early-exit:<layers>, mtp (the target's own MTP "
                             "layers), a learned drafter (EAGLE-3, DFlash, DSpark or Gemma 4 "
                             "assistant folder or hub id, "
                             + ", ".join(f"builtin:{n}" for n in BUILTIN_DRAFTERS) + ", <learned>+ngram), or a "
                             f"model like --target (default {draft_default})")
    parser.set_defaults(draft_default=draft_default)
    parser.add_argument("--max-new-tokens", default=128,
                        help="most tokens to generate (default %(default)s)",
                        type=checked(inputs.number, "max new tokens", minimum=1, integer=True))
    parser.add_argument("--temperature", default=0.0,
                        help="sampling temperature, 0 = greedy (default %(default)s)",
                        type=checked(inputs.number, "temperature", minimum=0))
    parser.add_argument("--top-k", default=0,
                        help="sample among the k likeliest tokens, 0 = off (default %(default)s)",
                        type=checked(inputs.number, "top k", minimum=0, integer=True))
    parser.add_argument("--top-p", default=1.0,
                        help="sample among the likeliest tokens reaching this probability, "
                             "in (0, 1], 1 = off (default %(default)s)",
                        type=checked(inputs.number, "top p", above=0, maximum=1))
    parser.add_argument("--repetition-penalty", default=1.0,
                        help="penalty on tokens already in prompt and output, 1 = off "
                             "(default %(default)s)",
                        type=checked(inputs.number, "repetition penalty", above=0))
    parser.add_argument("--seed", default=None,
                        help="seed of the sampling generators, for a repeatable sampled run (the "
                             "speculative one only with a fixed --draft-length: auto's lengths "
                             "follow measured timings) (default %(default)s: a fresh one each "
                             "run; greedy needs none)",
                        type=checked(inputs.number, "seed", integer=True))
    parser.add_argument("--draft-length", type=draft_length_arg, default=None,
                        help="draft tokens per round, 1..64, or auto (default 4, or the "
                             "preset's; the app and the default preset use auto)")
    parser.add_argument("--draft-tree", type=draft_tree_arg, default=None, metavar="SHAPE",
                        help="verify a tree of the EAGLE-3 drafter's guesses a round instead of "
                             "a chain (greedy only): 'default' (the shape tuned on the shipped "
                             "head), 'off', or rank paths like 0;1;0.0;0.0.0 (default off)")
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)",
                        type=checked(inputs.text, "stop", required=False))
    parser.add_argument("--system", default=None, help="system prompt",
                        type=checked(inputs.text, "system", required=False))
    parser.add_argument("--dtype", default=None, choices=["auto", "float32", "bfloat16", "float16"],
                        help="(default auto, or the preset's)")
    parser.add_argument("--device", default="auto", help="auto, cpu, cuda, cuda:N or mps")
    parser.add_argument("--quantization", default=None, choices=list(QUANTIZATION_CHOICES),
                        help="target quantisation: 4bit/8bit bitsandbytes (CUDA), int8/int4 "
                             "torchao (int4: CPU only)")
    parser.add_argument("--trust-remote-code", action="store_true",
                        help="allow code from the model repository to run (off by default)")
    add_backend_flag(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def chosen_preset(args):
    """The preset ``--preset`` names, or None without the flag (``run``, ``compare``, ``bench``).

    Raises:
        ValueError: ``--preset`` with ``--target`` or ``--draft``.
        PresetError: no preset of that name (the message lists the known ones).
    """
    if not getattr(args, "preset", None):
        return None
    if args.target or args.draft:
        raise ValueError("give either --preset or --target/--draft, not both")
    return get_preset(args.preset)


def preset_models(preset, args) -> tuple[str, str, str, str | None]:
    """(target, draft, dtype, quantization) of ``preset``, where ``--draft``, ``--dtype`` and
    ``--quantization`` given override its own."""
    quantization = args.quantization or (
        None if preset.quantization == "none" else preset.quantization)
    return preset.target, args.draft or preset.draft, args.dtype or preset.dtype, quantization


def resolve_decode_args(args) -> None:
    """Fill ``run``/``compare``'s model flags in place: from ``--preset`` when given (flags given
    beside it override its draft length, dtype and quantization), else the defaults.

    Raises:
        SystemExit(2): ``--preset`` with ``--target`` or ``--draft``, or an unknown preset (the
            sentence names the known ones).
    """
    try:
        preset = chosen_preset(args)
    except ValueError as exc:  # PresetError included
        refuse(str(exc), f"python -m specdemo {args.command}")
    if preset is not None:
        args.target, args.draft, args.dtype, args.quantization = preset_models(preset, args)
        if args.draft_length is None:
            args.draft_length = preset.draft_length
    args.target = args.target or default_target()
    args.draft = args.draft or args.draft_default
    args.draft_length = 4 if args.draft_length is None else args.draft_length
    args.dtype = args.dtype or "auto"


def add_backend_flag(parser: argparse.ArgumentParser) -> None:
    """``--backend`` (one of ``core.BACKENDS``): how the target's forward is computed (both lanes
    of a comparison use the same)."""
    parser.add_argument("--backend", default="auto",
                        choices=BACKENDS,
                        help="target forward: auto (the default, as the app: every backend "
                             "available for the target is ruled in or out by a short probe on "
                             "this CPU, the survivors timed, the choice stored; transformers "
                             "off the CPU), transformers (float32 eager: the reference for "
                             "losslessness, several times slower on a CPU), ggml (llama.cpp "
                             "over the GGUF file of a GGUF/built-in target), ggml-bf16 (the "
                             "same with the GGUF converted to BF16 once by llama-quantize), "
                             "int8 (our forward of a float32 Llama with int8 weights and "
                             "activations), native (our C forward of a Llama with BF16 weights, "
                             "compiled once with the system C compiler; docs/cpu-backends.md), "
                             "native-int8 (the same with int8 weights, one scale a row) or "
                             "native-w8a8 (int8 weights times int8 activations with one scale "
                             "per 32 values, exact integer sums) or, on a CUDA GPU, "
                             "cuda-graphs (a static KV cache and one captured CUDA graph per "
                             "verification width)")


def register(sub) -> None:
    run = sub.add_parser("run", help="decode one prompt (speculatively when --draft is given)")
    add_decode_flags(run, draft_default="none")
    run.add_argument("--prompt", required=True, type=checked(inputs.text, "prompt"))
    add_endpoint_flags(run)
    run.set_defaults(func=cmd_run)
    compare = sub.add_parser("compare", help="plain then speculative on the same prompt")
    add_decode_flags(compare, draft_default="ngram")
    compare.add_argument("--prompt", required=True, type=checked(inputs.text, "prompt"))
    add_endpoint_flags(compare)
    compare.set_defaults(func=cmd_compare)


def settings_from_args(args):
    from ..services.pipeline import DecodeSettings  # deferred: imports torch
    return DecodeSettings(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                          top_k=args.top_k, top_p=args.top_p,
                          repetition_penalty=args.repetition_penalty, seed=args.seed,
                          draft_length=args.draft_length, stop_strings=tuple(args.stop),
                          tree=getattr(args, "draft_tree", None))


def pipeline_from_args(args):
    """Load target (+ draft model) and refuse an incompatible draft with the reason. The slow
    steps (converting a built-in once, loading, measuring forward costs for ``auto``) are
    printed to stderr as they start and end, as the page shows them.

    Raises:
        SystemExit(2) with the reason printed, for a spec refused before loading
        (``compat.before_load``: a hub id that cannot be obtained, an early-exit layer count
        beyond the target's), load failures and incompatible drafts.
    """
    try:  # after every flag's own check, before anything loads (the /race API runs it too)
        compat.before_load(args.target, args.draft, trust_remote_code=args.trust_remote_code)
        if getattr(args, "max_new_tokens", None):  # beyond the context: refused before loading
            inputs.fits_context("max new tokens", args.max_new_tokens, args.target)
    except inputs.InputError as exc:  # refused like a flag: the sentence and where --help is
        refuse(str(exc), f"python -m specdemo {getattr(args, 'command', None) or 'run'}")
    with startup.printed():
        pipe = _load_pipeline(args)
        if args.draft != "none" and getattr(args, "draft_length", None) == "auto":  # bench: none
            startup.measure_forward_costs(pipe)
    return pipe


def _load_pipeline(args):
    from ..services.pipeline import build_pipeline  # deferred: imports torch
    try:
        target = startup.load_model(args.target, args.device, args.dtype,
                            trust_remote_code=args.trust_remote_code, quantization=args.quantization)
        return build_pipeline(
            target, args.draft,
            load_draft=lambda spec, device: startup.load_model(
                spec, device, args.dtype, trust_remote_code=args.trust_remote_code),
            check_draft=lambda spec: refuse_incompatible(args.target, spec, args.trust_remote_code),
            # auto weighs the backends for this drafter (both lanes then run the one chosen)
            on_backend=lambda loaded, spec, draft: _with_backend(
                loaded, getattr(args, "backend", "auto"), spec, draft),
            warn=lambda warning: print(f"warning: {warning}", file=sys.stderr))
    except ModelLoadError as exc:
        fail(str(exc))


def _with_backend(target, backend: str, draft_spec: str = "none", draft=None):
    """The target on ``backend`` (``auto``: weighed for a race with ``draft_spec``); exits
    with the reason when ``ggml`` cannot serve it."""
    from ..models.ggml_backend import GgmlError  # lazy: imports torch; --help stays fast
    from ..services.backend_choice import use_backend  # lazy: imports torch; --help stays fast
    if not hasattr(target, "backend"):  # not a models.LoadedModel (tests inject stand-ins)
        return target
    try:
        target, _ = use_backend(target, backend, draft_spec, draft)
    except GgmlError as exc:
        fail(str(exc))
    return target  # the choice and its reason are a start-up note (printed once)


def refuse_incompatible(target_spec: str, draft_spec: str, trust_remote_code: bool) -> None:
    """Exit with the verdict's reasons when the draft's tokenizer cannot serve the target."""
    verdict = compat.check_specs(target_spec, draft_spec, trust_remote_code=trust_remote_code)
    if verdict.status == "incompatible":
        fail(f"draft {draft_spec} is incompatible with target {target_spec}: "
             + "; ".join(verdict.reasons))


def offloaded(pipe) -> dict[str, str]:
    """The target's modules accelerate offloaded ({name: "cpu"/"disk"}), said once on stderr."""
    layers = getattr(pipe.target, "offloaded_layers", {})
    if layers:
        print(f"warning: {len(layers)} modules of {pipe.target.spec} are offloaded to "
              f"{'/'.join(sorted(set(layers.values())))}: it does not fit {pipe.target.device}, "
              "every forward streams their weights, and the speedup is not the GPU's",
              file=sys.stderr)
    return dict(layers)


def refuse_too_long(pipe, ids: list[int], settings, args) -> None:
    """Refuse a prompt + ``--max-new-tokens`` beyond the target's context as the flags are
    refused (the sentence, then where ``--help`` is; exit status 2), before any warm-up."""
    try:
        pipe.check_length(ids, settings.max_new_tokens)
    except ValueError as exc:
        refuse(str(exc), f"python -m specdemo {getattr(args, 'command', None) or 'run'}")


def fail(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    raise SystemExit(2)


def _endpoints(args) -> dict:
    """The lanes' endpoints from the flags; exit status 2 with the reason when one is refused."""
    try:
        return endpoints_from_args(args)
    except EndpointError as exc:
        fail(str(exc))


def precision_notice(pipe) -> str | None:
    """The line ``run``/``compare`` print before timing when greedy outputs are not expected to
    be identical in the target's precision (bfloat16, float16, quantised), naming
    ``--dtype float32`` for an exact check; None in float32."""
    # lazy: imports torch; --help stays fast
    from ..services.pipeline import on_llama_cpp, target_lossless_expectation
    expected, why = target_lossless_expectation(pipe.target)
    if expected:
        return None
    if on_llama_cpp(pipe.target):
        return (f"note: greedy speculative output may differ from plain greedy here: {why}. For "
                "an exact check run with --backend transformers --dtype float32.")
    return (f"note: greedy speculative output may differ from plain greedy here: {why}. For an "
            "exact check run with --dtype float32 (and no --quantization) where memory allows.")


def prepare_untimed(pipe, settings, ids, modes) -> None:
    """Warm every mode in ``modes`` (False plain, True speculative) before any clock starts
    (``startup.prepare_timed``), printing the steps to stderr."""
    with startup.printed():
        for speculative in modes:
            startup.prepare_timed(pipe, speculative, settings.draft_length, ids)


def _backend(pipe) -> str:
    """The forward backend ``pipe``'s target ran on (what ``--backend auto`` chose:
    ``transformers``, ``ggml``, ``native-w8a8``, ...), for the JSON outputs."""
    return getattr(pipe.target, "backend", "transformers")


def lane_json(lane: dict, backend: str | None, speculative: bool,
              draft_length: int | str | None) -> dict:
    """One lane of ``run --json``/``compare --json`` with the keys ``/race``'s panes have
    (``race.pane_dict``): ``backend``, the forward backend that lane ran on, and for a
    speculative lane ``draft_length`` the setting, k or "auto" (not its last round's k, which
    was 0 when the answer ended in a plain step; ``mean_draft_length`` and
    ``draft_length_min``/``_max``/``_sum`` cover every round)."""
    out = {**lane, "backend": backend}
    if speculative and draft_length is not None:
        out["draft_length"] = draft_length if draft_length == "auto" else int(draft_length)
    return out


def cmd_run(args) -> int:
    resolve_decode_args(args)
    endpoints = _endpoints(args)
    if endpoints["plain"] or endpoints["speculative"]:
        return run_endpoint(args, endpoints)
    pipe = pipeline_from_args(args)
    settings = settings_from_args(args)
    try:
        ids = pipe.prompt_ids(args.prompt, args.system)
        refuse_too_long(pipe, ids, settings, args)
        prepare_untimed(pipe, settings, ids, [args.draft != "none"])
        result = pipe.run(ids, settings, speculative=args.draft != "none") if args.json else None
        if result is None:
            result = stream_to_terminal(pipe, ids, settings, args.draft != "none")
    except ValueError as exc:
        fail(str(exc))
    from ..services.pipeline import result_dict  # deferred: imports torch
    layers = offloaded(pipe)
    if args.json:
        lane = lane_json(result_dict(result), _backend(pipe), args.draft != "none",
                         args.draft_length)
        print(json.dumps({**lane, "offloaded_layers": layers}))
    else:
        print()
        print(format_stats("result", result.stats, args.draft_length if args.draft != "none"
                           else None))
    return 0


def stream_to_terminal(pipe, ids, settings, speculative):
    from ..core.engine import collect  # deferred: imports torch

    def echo(events):
        for event in events:
            sys.stdout.write(event.text)
            sys.stdout.flush()
            yield event
    return collect(echo(pipe.stream(ids, settings, speculative)))


def run_endpoint(args, endpoints: dict) -> int:
    """``run`` against one server: stream its answer, then its stats (exit 2 on its error)."""
    from ..core.engine import collect  # lazy: imports torch; --help stays fast
    if endpoints["plain"] and endpoints["speculative"]:
        fail("run decodes one lane: give --plain-endpoint or --spec-endpoint, not both "
             "(compare races both)")
    endpoint = endpoints["plain"] or endpoints["speculative"]
    pipe = EndpointPipeline(endpoint)
    settings = settings_from_args(args)
    try:
        messages = pipe.prompt_ids(args.prompt, args.system)
        events = pipe.stream(messages, settings)
        if not args.json:
            events = _echo(events)
        result = collect(events)
    except (EndpointError, ValueError) as exc:
        if not args.json:
            print()
        fail(str(exc))
    from ..services.pipeline import result_dict  # lazy: imports torch; --help stays fast
    if args.json:
        print(json.dumps({**result_dict(result), "backend": None}))  # a server: see engine
    else:
        print()
        print(format_endpoint_stats(endpoint.label, result.stats))
    return 0


def _echo(events):
    for event in events:
        sys.stdout.write(event.text)
        sys.stdout.flush()
        yield event


def compare_lanes(args, endpoints: dict):
    """The race's two lanes: a server where an endpoint is given, else our engine (plain: the
    target alone; speculative: the target with ``--draft``, plain decoding when it is none)."""
    # lazy: imports torch; --help stays fast
    from ..services.race import PLAIN, SPECULATIVE, Lane, with_endpoints
    messages = [{"role": "user", "content": args.prompt}]
    pipe = None
    if not (endpoints["plain"] and endpoints["speculative"]):
        pipe = pipeline_from_args(args)
    ours = [Lane(PLAIN, False, lambda: pipe, messages),
            Lane(SPECULATIVE, args.draft != "none", lambda: pipe, messages)]
    return with_endpoints(ours, endpoints)  # the page's Send adds its servers the same way


def compare_endpoints(args, endpoints: dict) -> int:
    """``compare`` with a server in one lane or both: the race runs here (one lane after the
    other), each lane's error stays in that lane; exit status 2 when a lane failed."""
    # lazy: imports torch; --help stays fast
    from ..services.race import Race, sampled_verdict, snapshot_dict
    lanes = compare_lanes(args, endpoints)
    race = Race(lanes, settings_from_args(args), args.system)
    race.run_here()
    snap = race.snapshot()
    errors = [(name, v.error) for name, v in snap.panes.items() if v.status in ("error", "skipped")]
    if args.json:
        print(json.dumps(sampled_verdict(snapshot_dict(snap, race.settings.draft_length),
                                         args.temperature)))
    else:
        _print_race(args, snap, endpoints)
    for name, error in errors:
        print(f"error: {name} lane: {error}", file=sys.stderr)
    return 2 if errors else 0


def cut_mark(view) -> str:
    """The line after a lane's text when the lane did not finish: ``[cut: <why>]`` after what it
    produced (a failure mid-stream keeps its text), ``[stopped]``, ``[not run: <why>]``;
    "" for a finished lane."""
    if view.status == "error":
        return f"[cut: {view.error}]" if view.text else f"[failed: {view.error}]"
    if view.status == "stopped":
        return "[stopped here]"
    if view.status == "skipped":
        return f"[not run: {view.error}]"
    return ""


def _print_race(args, snap, endpoints: dict) -> None:
    for name, view in snap.panes.items():
        who = endpoints[name].label if endpoints[name] else (
            f"specdemo, draft {args.draft}" if name == "speculative" else "specdemo")
        mark = cut_mark(view)
        print(f"{name} ({who}):\n" + view.text + ("\n" + mark if mark else "") + "\n")
    for name, view in snap.panes.items():
        if view.stats is None:
            print(f"[{name}] {view.status}: {view.error}")
        elif view.stats.engine:
            print(format_endpoint_stats(name, view.stats))
        else:
            print(format_stats(name, view.stats, args.draft_length if view.stats.drafted else None))
    if snap.not_compared:
        print(f"speedup: not compared   identical: not compared ({snap.not_compared})")
    else:
        speed = "n/a" if snap.speedup is None else f"{snap.speedup:.2f}x"
        if snap.identical is None:
            same = "n/a"
        else:
            same = identical_words(snap.identical, f"{snap.divergence_unit} {snap.first_divergence}",
                                   args.temperature)
        print(f"speedup: {speed}   identical: {same}")
    if snap.explanation is not None:
        from .ui_format import explanation_text  # lazy: imports torch; --help stays fast
        print("why: " + explanation_text(snap.explanation, times="x"))
    for warning in snap.warnings:
        print(f"warning: {warning}")


def cmd_compare(args) -> int:
    resolve_decode_args(args)
    endpoints = _endpoints(args)
    if endpoints["plain"] or endpoints["speculative"]:
        return compare_endpoints(args, endpoints)
    pipe = pipeline_from_args(args)
    notice = precision_notice(pipe)
    if notice and args.temperature == 0:  # said before the race, not only after a divergence
        print(notice, file=sys.stderr, flush=True)
    try:
        ids = pipe.prompt_ids(args.prompt, args.system)
        settings = settings_from_args(args)
        refuse_too_long(pipe, ids, settings, args)
        prepare_untimed(pipe, settings, ids, [False, True])
        comparison = pipe.compare(ids, settings)
    except ValueError as exc:
        fail(str(exc))
    layers = offloaded(pipe)
    if args.json:
        out, backend = comparison.as_dict(), _backend(pipe)
        for name in ("plain", "speculative"):  # both lanes ran on pipe's backend
            out[name] = lane_json(out[name], backend, name == "speculative", args.draft_length)
        from ..services.race import sampled_verdict  # lazy: imports torch; --help stays fast
        out = sampled_verdict(out, args.temperature)
        print(json.dumps({**out, "backend": backend, "offloaded_layers": layers}))
        return 0
    print("plain:\n" + comparison.plain.text + "\n")
    print(f"speculative ({args.draft}):\n" + comparison.speculative.text + "\n")
    print(format_stats("plain", comparison.plain.stats))
    print(format_stats("speculative", comparison.speculative.stats, args.draft_length))
    speed = "n/a" if comparison.speedup is None else f"{comparison.speedup:.2f}x"
    same = identical_words(comparison.identical, f"token {comparison.first_divergence}",
                           args.temperature)
    print(f"speedup: {speed}   identical: {same}")
    if comparison.explanation is not None:
        from .ui_format import explanation_text  # lazy: imports torch; --help stays fast
        print("why: " + explanation_text(comparison.explanation, times="x"))
    if notice:
        from ..services.pipeline import on_llama_cpp  # lazy: imports torch; --help stays fast
        print("lossless expected: no (" + comparison.lossless_note + "; "
              + ("--backend transformers" if on_llama_cpp(pipe.target) else "--dtype float32")
              + " for an exact check)")
    for warning in comparison.warnings:
        print(f"warning: {warning}")
    return 0


#: after "identical: no, ..." when sampling: not a fault
SAMPLED = (" (expected when sampling: speculative sampling keeps the target's distribution, "
           "not the plain run's tokens; temperature 0 compares tokens)")


def identical_words(identical: bool, divergence: str, temperature: float) -> str:
    """What ``identical:`` says: "yes", or where the outputs first differ (``divergence``, e.g.
    "token 4"), with ``SAMPLED`` when sampling made that expected."""
    if identical:
        return "yes"
    return f"no, first divergence at {divergence}" + (SAMPLED if temperature > 0 else "")


def _fmt(value, spec: str = ".2f", unit: str = "") -> str:
    return "n/a" if value is None else f"{value:{spec}}{unit}"


def draft_length_text(policy: int | str, s) -> str:
    """The draft-length policy and the k the run used: ``"auto (k used: mean 3.2, range 0-8,
    over 12 rounds)"``, ``"4 (k used: mean 3.9, range 1-4, ...)"``; n-gram lookup and the end
    of a run can verify fewer tokens than k."""
    from ..core.policy import confidence_requested  # lazy: imports torch; --help stays fast
    if policy == "auto" and confidence_requested():
        policy = "auto, weighing the drafter's confidence (SPECDEMO_DRAFT_CONFIDENCE=1)"
    if not s.rounds:
        return f"{policy} (no verification round)"
    return (f"{policy} (k used: mean {_fmt(s.mean_draft_length, '.1f')}, range "
            f"{s.draft_length_min}-{s.draft_length_max}, over {s.rounds} rounds)")


def format_stats(label: str, s, draft_length: int | str | None = None) -> str:
    """A few lines of human-readable metrics (docs/design.md names); with ``draft_length`` (the
    policy of a speculative run) also the k it used."""
    lines = [f"[{label}] new_tokens={s.new_tokens} tokens_per_s={_fmt(s.tokens_per_s)} "
             f"decode_tokens_per_s={_fmt(s.decode_tokens_per_s)} ttft_s={_fmt(s.ttft_s, '.3f')} "
             f"target_forwards={s.target_forwards} finish_reason={s.finish_reason} "
             f"other_cpu_share={_fmt(s.other_cpu_share)}"]
    if s.drafted:
        per_pos = ", ".join(_fmt(a) for a in s.per_position_acceptance)
        lines.append(f"    drafted={s.drafted} accepted={s.accepted} "
                     f"acceptance_rate={_fmt(s.acceptance_rate)} "
                     f"mean_acceptance_length={_fmt(s.mean_acceptance_length)} "
                     f"per_position_acceptance=[{per_pos}] draft_s={s.draft_s:.2f} "
                     f"verify_s={s.verify_s:.2f} extra_memory_bytes={s.extra_memory_bytes}")
    if draft_length is not None:
        lines.append(f"    draft_length={draft_length_text(draft_length, s)}")
    if getattr(s, "tree", None) and s.tree.startswith("not used"):
        lines.append(f"    draft_tree={s.tree}")
    elif getattr(s, "tree", None):
        lines.append(f"    draft_tree={s.tree} (tree rounds: {s.tree_rounds} of {s.rounds}; a "
                     "tree round verifies every node and accepts one branch)")
    return "\n".join(lines)
