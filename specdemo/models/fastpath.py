"""Cheaper target forwards on a CPU, for any transformers decoder: the matrix-multiply kernel is
chosen per row count, measured on this machine.

Where the time of a forward over n tokens goes (SmolLM2-135M, float32, 2-core Xeon, 1 thread):
the 211 weight matrices take 45-52 ms of a 70-85 ms one-token forward and almost all of the
growth with n. ``F.linear`` with one row runs MKL's matrix-vector path at memory speed, but with
2-16 rows it runs a general matrix multiply that re-packs each weight on every call: 1.1x (2
rows), 1.7x (4), 2.6x (8) the one-row time. Attention, norms, the KV-cache append and Python
overhead (14 ms with near-zero weights) cost about the same for every n <= 16. So the fix is the kernel, per row count, and which kernel wins differs between
CPUs (AVX2 vs AVX-512/AMX, MKL vs oneDNN), so it is measured at load time instead of assumed:

* ``linear``: ``F.linear`` as transformers calls it (no extra memory).
* ``blocked``: the weight viewed as blocks of 64 output rows, one batched multiply
  ``x @ W_b^T`` over the blocks: each block is packed while it is in cache (no extra memory).
* ``packed``: the weight reordered once into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, what PyTorch's Inductor "freezing" and IPEX do
  for CPU linears), multiplied by ``torch.ops.mkldnn._linear_pointwise``. It keeps a second copy
  of the weights, so it is a candidate only where the memory is there; for bfloat16 on a CPU
  with native bf16 (AVX512-BF16/AMX) it cut a one-token forward by a quarter here.

:func:`speed_up` times each candidate over the model's own weights for a few row counts, then
gives every ``nn.Linear`` a ``forward`` that dispatches on the row count (rows above the
calibrated range use ``F.linear``, the best for prefill). All kernels compute the same float
products in a different summation order, so logits differ in the last bits only.
``SPECDEMO_FASTPATH=0`` leaves the model as transformers built it (for before/after measurements).
The choice is stored per machine and model shape and reused (``SPECDEMO_FASTPATH=recalibrate``
measures again). A calibration during which other processes used more than
``machine.BUSY_SHARE`` of the CPU is not stored (timings of 0.10-1.04 s per pass instead of
0.016-0.047 s chose the wrong kernels on a shared 2-core machine): that process keeps ``linear``
for every row count, and the next load calibrates again.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
import types
from dataclasses import asdict, dataclass, field

import torch
import torch.nn.functional as F

from .builtin import cache_dir, store_cache_entry
from .hardware import _cpu_name
from ..core.machine import BUSY_SHARE, OtherCpuUse

log = logging.getLogger(__name__)

KERNELS = ("linear", "blocked", "packed")
BLOCK_ROWS = 64  # output rows per block of the ``blocked`` kernel
CALIBRATION_ROWS = (1, 2, 3, 4, 6, 8, 12, 16)  # row counts timed; others use the nearest below
CALIBRATION_BYTES = 256 << 20  # weights timed per pass: the model's first linears up to this size
CACHE_FILE = "fastpath-kernels.json"  # in models.cache_dir(): choices by machine and model shape
DISABLE_ENV = "SPECDEMO_FASTPATH"
MARGIN = 0.9  # another kernel replaces F.linear only when it is at least 10% faster
MIN_WEIGHT_BYTES = 32 << 20  # below this the kernels barely matter: leave small models alone


@dataclass
class FastPathInfo:
    """What :func:`speed_up` did.

    Attributes:
        applied: False when the model was left as it was (then ``reason`` says why).
        reason: why the model was left as it was; when applied, a note on the choice or "" (a
            calibration on a busy machine: ``linear`` kept for every row count, not stored).
        kernels: rows -> kernel name for 1..max calibrated rows (more rows: ``linear``).
        timings_s: kernel -> {rows: seconds of one pass over the timed weights}.
        extra_memory_bytes: bytes of packed weight copies kept (they are packed on first use).
        calibrate_s: seconds the calibration took (0 when the choice came from the cache).
        linears: number of ``nn.Linear`` modules given the dispatching forward.
        cached: True when the kernels came from an earlier calibration on this machine.
        other_cpu_share: CPU time other processes took during this calibration, as a share of
            all cores' time (0..1); None when nothing was calibrated (cached or forced).
    """

    applied: bool
    reason: str = ""
    kernels: dict[int, str] = field(default_factory=dict)
    timings_s: dict[str, dict[int, float]] = field(default_factory=dict)
    extra_memory_bytes: int = 0
    calibrate_s: float = 0.0
    linears: int = 0
    cached: bool = False
    other_cpu_share: float | None = None

    def as_dict(self) -> dict:
        return asdict(self)


def linear_modules(model: torch.nn.Module) -> list[torch.nn.Linear]:
    """The plain ``nn.Linear`` modules with dense float weights on the CPU (quantised layers,
    which are subclasses or hold tensor subclasses, are left alone)."""
    out = []
    for module in model.modules():
        weight = getattr(module, "weight", None)
        if (type(module) is torch.nn.Linear and type(weight) is torch.nn.Parameter
                and weight.device.type == "cpu" and weight.is_floating_point()
                and weight.dim() == 2 and weight.is_contiguous()):
            out.append(module)
    return out


# ----------------------------------------------------------------------------- kernels

def _block_rows(out_features: int) -> int:
    """Rows per block for ``blocked``: 64, or the whole weight when it has fewer rows; 0 when
    64 does not divide the row count (then ``blocked`` falls back to ``F.linear``)."""
    if out_features <= BLOCK_ROWS:
        return out_features
    return BLOCK_ROWS if out_features % BLOCK_ROWS == 0 else 0


def blocked_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """``F.linear`` computed as one batched multiply over blocks of 64 weight rows.

    Args:
        x: (..., in_features) input, any leading shape.
        weight: (out_features, in_features) contiguous.
        bias: (out_features,) or None.
    Returns:
        (..., out_features), equal to ``F.linear(x, weight, bias)`` up to summation order.
    """
    out_features, in_features = weight.shape
    block = _block_rows(out_features)
    if block == 0:
        return F.linear(x, weight, bias)
    rows = x.reshape(-1, in_features)  # (n, in)
    blocks = weight.view(out_features // block, block, in_features).transpose(1, 2)  # (B, in, r)
    y = torch.matmul(rows, blocks)  # (B, n, r)
    y = y.transpose(0, 1).reshape(*x.shape[:-1], out_features)  # (..., out)
    return y if bias is None else y + bias


def packed_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """oneDNN linear with a weight reordered by :func:`pack_weight`; x: (..., in) -> (..., out)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")


def pack_weight(weight: torch.Tensor) -> torch.Tensor | None:
    """The weight in oneDNN's layout for :func:`packed_linear`, or None where oneDNN cannot
    (no mkldnn build, or bfloat16/float16 without native support on this CPU)."""
    if not torch.backends.mkldnn.is_available():
        return None
    if weight.dtype in (torch.bfloat16, torch.float16):
        supported = (torch.ops.mkldnn._is_mkldnn_bf16_supported() if weight.dtype == torch.bfloat16
                     else torch.ops.mkldnn._is_mkldnn_fp16_supported())
        if not supported:
            return None
    try:
        return torch.ops.mkldnn._reorder_linear_weight(weight.detach(), None)
    except RuntimeError:
        return None


_PACK_LOCK = threading.Lock()


def _packed(module: torch.nn.Linear) -> torch.Tensor | None:
    """The module's packed weight, packed on its first use (:func:`install` packs nothing: a
    target that another backend runs, or that never verifies that many rows, never holds the
    second copy); None where oneDNN cannot pack it (the module then runs ``F.linear``). The
    bytes are added to the model's ``FastPathInfo.extra_memory_bytes``."""
    packed = getattr(module, "_specdemo_packed", None)
    if packed is not None or getattr(module, "_specdemo_unpackable", False):
        return packed
    with _PACK_LOCK:  # two lanes of a race may reach the same weight first together
        packed = getattr(module, "_specdemo_packed", None)
        if packed is None:
            packed = pack_weight(module.weight)
            if packed is None:
                module._specdemo_unpackable = True
                return None
            module._specdemo_packed = packed
            info = getattr(module, "_specdemo_info", None)
            if info is not None:
                info.extra_memory_bytes += packed.numel() * module.weight.element_size()
    return packed


def _run(kernel: str, module: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
    if kernel == "blocked":
        return blocked_linear(x, module.weight, module.bias)
    if kernel == "packed":
        packed = _packed(module)
        if packed is not None:
            return packed_linear(x, packed, module.bias)
    return F.linear(x, module.weight, module.bias)


def _dispatching_forward(table: tuple[str, ...]):
    """A ``Linear.forward`` that runs ``table[rows]`` (``linear`` past the end of the table)."""
    last = len(table)

    def forward(self: torch.nn.Linear, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        return _run(table[rows] if rows < last else "linear", self, x)
    return forward


# ----------------------------------------------------------------------------- calibration

def _pass_s(kernel: str, modules: list[torch.nn.Linear], rows: int) -> float:
    """Seconds of one pass of ``kernel`` over ``modules`` with inputs of ``rows`` rows."""
    dtype = modules[0].weight.dtype
    inputs = {m.in_features: torch.randn(1, rows, m.in_features, dtype=dtype) for m in modules}
    clock = time.thread_time if torch.get_num_threads() == 1 else time.perf_counter
    start = clock()  # one thread: CPU time, which other processes on the machine do not inflate
    for m in modules:
        _run(kernel, m, inputs[m.in_features])
    return clock() - start


def _timed_subset(modules: list[torch.nn.Linear]) -> list[torch.nn.Linear]:
    """The first modules (module order mixes the shapes of a layer) up to CALIBRATION_BYTES,
    distinct weights so that a pass streams from memory as a real forward does."""
    subset, total = [], 0
    for m in modules:
        nbytes = m.weight.numel() * m.weight.element_size()
        if subset and total + nbytes > CALIBRATION_BYTES:
            break
        subset.append(m)
        total += nbytes
    return subset


def calibrate(modules: list[torch.nn.Linear], kernels: tuple[str, ...],
              rows: tuple[int, ...] = CALIBRATION_ROWS, repeats: int = 2
              ) -> tuple[dict[int, str], dict[str, dict[int, float]]]:
    """Fastest kernel per row count, timed over the modules' own weights.

    The candidates are interleaved within each repeat and the minimum of the repeats is kept,
    so a burst of load on a shared machine hurts every candidate alike or none; a kernel
    replaces ``linear`` (transformers' own path) only when it is at least 10% faster, and
    ``packed`` (extra memory) only when it beats the others by 10%.

    Args:
        modules: linears (those using ``packed`` must carry ``_specdemo_packed``).
        kernels: candidate names from :data:`KERNELS`, ``linear`` among them.
        rows: row counts to time (ascending, starting at 1).
        repeats: passes per (kernel, rows).
    Returns:
        ({rows: kernel} for 1..max(rows), {kernel: {rows: seconds}}).
    """
    subset = _timed_subset(modules)
    best: dict[str, dict[int, float]] = {k: {} for k in kernels}
    with torch.inference_mode():
        for k in kernels:  # warm-up: first calls create oneDNN primitives and MKL buffers
            _pass_s(k, subset[:8], 2)
        for _ in range(repeats):
            for n in rows:
                for k in kernels:
                    s = _pass_s(k, subset, n)
                    best[k][n] = min(best[k].get(n, s), s)
    choice: dict[int, str] = {}
    current = "linear"
    for n in range(1, max(rows) + 1):
        if n in rows:
            current = _pick({k: best[k][n] for k in kernels})
        choice[n] = current
    return choice, best


def _pick(seconds: dict[str, float]) -> str:
    """``linear`` unless another kernel is >= 10% faster; ``packed`` (a second copy of the
    weights) only when it is >= 10% faster than the best kernel that needs no copy."""
    pick = "linear"
    for kernel in ("blocked", "packed"):
        if kernel in seconds and seconds[kernel] < MARGIN * seconds[pick]:
            pick = kernel
    return pick


def _packing_fits(modules: list[torch.nn.Linear]) -> bool:
    """True when a second copy of the weights leaves at least 1 GiB of RAM free."""
    import psutil
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in modules)
    return psutil.virtual_memory().available - weight_bytes > (1 << 30)


def _candidates(modules: list[torch.nn.Linear]) -> tuple[str, ...]:
    """Kernels worth timing: always linear and blocked; packed where the weights were packed."""
    packed = _packing_fits(modules)
    if packed:
        for m in modules:
            weight = pack_weight(m.weight)
            if weight is None:
                packed = False
                break
            m._specdemo_packed = weight
    if not packed:
        _drop_packed(modules)
    return ("linear", "blocked", "packed") if packed else ("linear", "blocked")


def _cache_key(modules: list[torch.nn.Linear], rows: tuple[int, ...]) -> str:
    """What a calibration depends on: CPU model, torch, threads, dtype, weight shapes, rows."""
    shapes = sorted({tuple(m.weight.shape) for m in modules})
    parts = [_cpu_name(), torch.__version__, torch.get_num_threads(), str(modules[0].weight.dtype),
             shapes, len(modules), list(rows), CALIBRATION_BYTES, MARGIN]
    return hashlib.sha256(json.dumps(parts, default=str).encode()).hexdigest()[:20]


def _cache_path():
    return cache_dir() / CACHE_FILE


def _cached_choice(key: str) -> tuple[dict[int, str], dict[str, dict[int, float]]] | None:
    """A stored calibration for ``key``, or None (missing, unreadable, or a recalibration was
    asked for with ``SPECDEMO_FASTPATH=recalibrate``)."""
    if os.environ.get(DISABLE_ENV, "").strip().lower() == "recalibrate":
        return None
    try:
        entry = json.loads(_cache_path().read_text())[key]
        kernels = {int(n): k for n, k in entry["kernels"].items()}
        timings = {k: {int(n): s for n, s in v.items()} for k, v in entry["timings_s"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return (kernels, timings) if set(kernels.values()) <= set(KERNELS) else None


def _store_choice(key: str, kernels: dict[int, str], timings: dict[str, dict[int, float]]) -> None:
    """Add a calibration to the cache file (replaced atomically; failures only logged)."""
    path = _cache_path()
    try:
        store_cache_entry(path, key, {"kernels": kernels, "timings_s": timings,
                                      "measured_unix_s": time.time()})
    except OSError as exc:
        log.warning("fast path: could not store the calibration in %s (%s)", path, exc)


def _choose(modules: list[torch.nn.Linear], rows: tuple[int, ...]) -> FastPathInfo:
    """Kernels by rows from the cache when this machine calibrated this model shape before (the
    packed weights are rebuilt if needed), else by :func:`calibrate`, then stored unless other
    processes used more than ``BUSY_SHARE`` of the CPU meanwhile (then ``linear`` for every row
    count, a note in ``reason``, nothing stored). ``calibrate_s`` and ``linears`` are left 0."""
    key = _cache_key(modules, rows)
    cached = _cached_choice(key)
    if cached is not None and ("packed" not in cached[0].values() or _packing_fits(modules)):
        # packed weights, if chosen, are built on first use (_packed)
        return FastPathInfo(True, kernels=cached[0], timings_s=cached[1], cached=True)
    others = OtherCpuUse()
    choice, timings = calibrate(modules, _candidates(modules), rows)
    share = others.share()
    if share > BUSY_SHARE:
        note = (f"machine busy during calibration (others used {share:.0%} of the CPU): kept "
                "F.linear, not stored")
        log.warning("fast path: %s", note)
        return FastPathInfo(True, reason=note, kernels={n: "linear" for n in choice},
                            timings_s=timings, other_cpu_share=share)
    _store_choice(key, choice, timings)
    return FastPathInfo(True, kernels=choice, timings_s=timings, other_cpu_share=share)


def _drop_packed(modules: list[torch.nn.Linear]) -> None:
    for m in modules:
        if hasattr(m, "_specdemo_packed"):
            del m._specdemo_packed


def speed_up(model: torch.nn.Module, rows: tuple[int, ...] = CALIBRATION_ROWS,
             force: str | None = None, min_weight_bytes: int = MIN_WEIGHT_BYTES) -> FastPathInfo:
    """Give the model's CPU linears a forward that picks the fastest kernel per row count.

    The first time on a machine it takes a few seconds for a 135M model (each candidate times
    a few passes over the weights); the choice is stored in ``models.cache_dir()/`` and reused
    by later loads of a model with the same weight shapes (``SPECDEMO_FASTPATH=recalibrate``
    measures again). Undo with :func:`restore`.

    Args:
        model: a transformers model in eval mode on the CPU.
        rows: row counts to calibrate (speculative verification uses k + 1 <= 17 rows).
        force: one kernel of :data:`KERNELS` for every row count up to ``max(rows)``, without
            timing (tests, experiments).
        min_weight_bytes: models whose linear weights are smaller are left alone (tiny test
            models stay deterministic; per-call overhead dominates there anyway).
    Returns:
        :class:`FastPathInfo`; ``applied`` is False when ``SPECDEMO_FASTPATH=0`` or when the
        model has no plain float linears on the CPU. A calibration during which other processes
        took more than ``machine.BUSY_SHARE`` of the CPU is not stored and chooses ``linear``
        for every row count (``reason`` says so, ``other_cpu_share`` gives the share).
    Raises:
        ValueError: an unknown ``force`` kernel, or ``packed`` where oneDNN cannot pack.
    """
    restore(model)
    modules = linear_modules(model)
    weight_bytes = sum(m.weight.numel() * m.weight.element_size() for m in modules)
    reason = None
    if os.environ.get(DISABLE_ENV, "1").strip().lower() in ("0", "off", "no", "false"):
        reason = f"{DISABLE_ENV}=0"
    elif not modules:
        reason = "no dense float nn.Linear on the CPU"
    elif force is None and weight_bytes < min_weight_bytes:
        reason = f"linear weights of {weight_bytes} bytes: too small to matter"
    if reason:
        model._specdemo_fastpath = FastPathInfo(False, reason=reason)
        return model._specdemo_fastpath
    start = time.perf_counter()
    if force is not None:
        if force not in KERNELS:
            raise ValueError(f"unknown kernel {force!r}; choose from {', '.join(KERNELS)}")
        if force == "packed" and "packed" not in _candidates(modules):
            raise ValueError("oneDNN cannot pack these weights on this machine")
        info = FastPathInfo(True, kernels={n: force for n in range(1, max(rows) + 1)})
    else:
        info = _choose(modules, rows)
    info.calibrate_s = 0.0 if info.cached else time.perf_counter() - start
    info.linears = len(modules)
    install(model, info)
    log.info("fast path: kernels by rows %s (%s)", info.kernels,
             "cached" if info.cached else f"calibrated in {info.calibrate_s:.1f} s")
    return info


def install(model: torch.nn.Module, info: FastPathInfo) -> None:
    """Give the model's linears the dispatching forward for ``info.kernels`` (no timing): after
    :func:`speed_up` chose them, or again after :func:`restore` (before/after comparisons).
    Weights the ``packed`` kernel needs are packed on their first use, not here; a weight oneDNN
    cannot pack runs ``F.linear`` instead."""
    modules = linear_modules(model)
    if "packed" not in info.kernels.values():
        _drop_packed(modules)
    table = ("linear",) + tuple(info.kernels[n] for n in range(1, max(info.kernels) + 1))
    forward = _dispatching_forward(table)  # table[rows]
    for m in modules:
        m.forward = types.MethodType(forward, m)
        m._specdemo_dispatch = True  # restore() removes only these forwards
        m._specdemo_info = info  # _packed adds the bytes of a weight packed later
    info.extra_memory_bytes = sum(m._specdemo_packed.numel() * m.weight.element_size()
                                  for m in modules if hasattr(m, "_specdemo_packed"))
    model._specdemo_fastpath = info


def restore(model: torch.nn.Module, forget: bool = True) -> None:
    """Undo :func:`speed_up`: the linears use transformers' own forward again.

    Args:
        forget: also drop the record of what was chosen (``fastpath_info`` returns None); keep
            it to :func:`install` the same kernels again.
    """
    for m in model.modules():
        if getattr(m, "_specdemo_dispatch", False):
            del m.forward, m._specdemo_dispatch
        for name in ("_specdemo_packed", "_specdemo_info"):
            if hasattr(m, name):
                delattr(m, name)
    if forget and hasattr(model, "_specdemo_fastpath"):
        del model._specdemo_fastpath


def fastpath_info(model: torch.nn.Module) -> FastPathInfo | None:
    """What :func:`speed_up` did to ``model``, or None when it was not called."""
    return getattr(model, "_specdemo_fastpath", None)
