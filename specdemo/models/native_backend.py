"""The ``native`` target backend: our own C forward of a Llama-architecture target with BF16
weights (issue 18's third candidate, after the ggml and int8 backends).

Why: on a 2-core CPU the transformers path spends ~15 ms of a 34 ms one-token forward in ~2,000
small operator calls and reads 538 MB of float32 weights, while llama.cpp's quantised kernels
are compute-bound, so a k-token verification there costs 2-4x a step (docs/cpu-backends.md).
``native_forward.c`` computes a whole forward in one call: weights in BF16 (half the float32
bytes), each weight block loaded once per forward and multiplied with every token of the forward
while it sits in registers (so a verification over 5-8 tokens reads the weights once, as a
one-token step does), a static float32 KV cache, a small thread pool instead of an operator per
step. Every token's numbers are independent of the other tokens of its forward (see the C file's
header), so greedy speculative output equals plain greedy output on this backend bit for bit.

Kernels (``SPECDEMO_NATIVE_KERNEL``; :func:`default_kernel`):

* ``fma``: BF16 weights widened to float32, float32 activations and accumulation (any CPU the C
  compiler vectorises for: AVX2, AVX-512, NEON).
* ``dpbf16``: activations rounded to BF16 too, products accumulated in float32 by VDPBF16PS
  (AVX512-BF16 CPUs only: Zen 4+, Cooper Lake, Sapphire Rapids+): twice the products per
  instruction, what keeps a 8-token forward close to a 1-token one on a 2-core CPU.

The C file is compiled once per machine with the system C compiler (``cc``, or ``$CC``;
``-O3 -march=native``) into ``models.cache_dir()/native/``; without a compiler the backend says
so and ``auto`` leaves it out. The weights are the transformers model's (for the built-in GGUF
models: the dequantised Q4_1 values) rounded to BF16, so logits differ from the float32 reference
by that rounding; the transformers float32 path stays the reference for losslessness tests, and
speculative output on this backend is compared with plain output *of this backend*.

``native-int8`` (:data:`_WEIGHTS`) is the same forward over int8 weights with one float32 scale
per output row (absmax / 127, round to nearest: weight-only, as gpt-fast's int8 and
``compiled_backend``'s), widened to float32 in the ``fma`` kernel: half the bytes a token of
BF16, for CPUs where reading the weights is what a step waits for. Its logits differ from the
float32 reference by that rounding; greedy speculative output still equals plain output of the
same backend bit for bit.

``native-w8a8`` is ``native-int8``'s weights with the activations quantised too: each matrix's
input is rounded to int8 with one scale per 32 values a token (absmax / 127, llama.cpp's Q8_0
format for activations) and multiplied with the int8 weights in exact int32 sums of 32 products
(``nf_quantize_activations``; W8A8 as in SmoothQuant and LLM.int8()). Its weights are laid out
for that kernel (:func:`repack_q8`: a vector lane per output row), which sums 32 products with
AVX512-VNNI's ``vpdpbusd`` where the CPU has it, else with AVX2's u8 x s8 product with the
weights' signs moved onto the activations (llama.cpp's q8 dot products), else in portable C: the
same numbers on all three. No widening of the weights and 4-16x the multiplies per instruction of
the float32 ``fma`` kernel, for CPUs where a verification over 5-8 tokens is compute-bound
(docs/cpu-backends.md). Its logits differ from ``native-int8``'s by the activation rounding;
each token's numbers still do not depend on the other tokens of a forward, so greedy
speculative output equals plain output of the same backend bit for bit.
"""

from __future__ import annotations

import contextlib
import ctypes
import hashlib
import json
import logging
import os
import shutil
import statistics
import subprocess
import threading
import time
from pathlib import Path

import torch

from ..core import family_backends
from ..core.errors import ModelLoadError
from ..core.kv import RotaryTables, StaticCacheKV, keep_tree_rows
from ..core.machine import cpu_flags, default_threads
from .builtin import cache_dir, store_cache_entry
from .compiled_backend import llama_reason, quantize_rows
from .hardware import _cpu_name
from ..core import machine

log = logging.getLogger(__name__)

NAME = "native"
#: the native backends (``core.TARGET_BACKENDS``): name -> weight format of the C forward
_WEIGHTS = family_backends("native")
SOURCE = Path(__file__).with_name("native_forward.c")
ARCHITECTURES = ("llama",)  # transformers model_type values whose forward the C file computes
MIN_CAPACITY = 512  # cache positions allocated at first; doubled when a forward passes them
KERNEL_ENV = "SPECDEMO_NATIVE_KERNEL"  # fma | dpbf16
KERNELS = {"fma": 0, "dpbf16": 1}


class NativeError(ModelLoadError):
    """The native backend cannot serve this target, or its library could not be built (a
    ``ModelLoadError``: the CLI, the page and ``/race`` show its one sentence)."""


# ----------------------------------------------------------------------------- the library

_LIB = None
_LIB_ERROR: str | None = None
_LIB_LOCK = threading.Lock()


def _compiler() -> str | None:
    """``$CC`` when set (None when it names no program: the user asked for that one), else
    the first of cc, gcc, clang found."""
    if os.environ.get("CC"):
        return shutil.which(os.environ["CC"])
    return shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")


CFLAGS_ENV = "SPECDEMO_NATIVE_CFLAGS"  # extra compiler flags (experiments: -DTB=4 -DRB=4)


def _extra_flags() -> str:
    return os.environ.get(CFLAGS_ENV, "").strip()


def library_path() -> Path:
    """Where the compiled library of this source, compiler and CPU lives (it may not exist yet)."""
    key = hashlib.sha256(SOURCE.read_bytes() + (_compiler() or "").encode()
                         + cpu_flags().encode() + _extra_flags().encode()).hexdigest()[:16]
    return cache_dir() / "native" / f"libspecdemo_native-{key}.so"


def _build(out: Path) -> None:
    cc = _compiler()
    if cc is None and os.environ.get("CC"):
        raise NativeError(f"the native backend builds its forward with CC={os.environ['CC']}, "
                          "which was not found; unset CC to use cc, gcc or clang")
    if cc is None:
        raise NativeError("the native backend needs a C compiler (cc, gcc or clang) to build "
                          "its forward once; none was found (e.g. apt install gcc)")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(f".{os.getpid()}.tmp")
    errors = []
    # OpenMP first: in a torch process the team is torch's own (libgomp.so.1), so a drafter's
    # torch threads and ours take turns instead of spinning against each other; without it
    # (e.g. Apple's clang) the C file's own thread pool
    for omp, arch in [(o, a) for o in (["-fopenmp"], []) for a in
                      (["-march=native"], ["-mcpu=native"], [])]:
        cmd = [cc, "-O3", *arch, *omp, *_extra_flags().split(), "-std=gnu11", "-fPIC",
               "-shared", "-pthread", str(SOURCE), "-o", str(tmp), "-lm"]
        run = subprocess.run(cmd, capture_output=True, text=True)
        if run.returncode == 0:
            os.replace(tmp, out)
            log.info("native backend: built %s (%s)", out, " ".join(cmd[1:4]))
            return
        errors.append(run.stderr.strip().splitlines()[-1:] or [f"exit {run.returncode}"])
    raise NativeError(f"the native backend's C forward did not compile with {cc}: {errors[-1][0]}")


def library():
    """The compiled ``native_forward.c`` (built on first use, ~2 s), loaded once.

    Raises:
        NativeError: no C compiler, or the compile failed (the compiler's last line)."""
    global _LIB, _LIB_ERROR
    with _LIB_LOCK:
        if _LIB is not None:
            return _LIB
        if _LIB_ERROR is not None:
            raise NativeError(_LIB_ERROR)
        try:
            path = library_path()
            if not path.exists():
                _build(path)
            lib = ctypes.CDLL(str(path))
        except NativeError as exc:
            _LIB_ERROR = str(exc)
            raise
        except OSError as exc:
            _LIB_ERROR = f"the native backend's library could not be loaded: {exc}"
            raise NativeError(_LIB_ERROR) from None
        c = ctypes
        lib.nf_create.restype = c.c_void_p
        lib.nf_create.argtypes = [c.c_int] * 7 + [c.c_float, c.c_float, c.c_int, c.c_int]
        lib.nf_free.argtypes = [c.c_void_p]
        lib.nf_has_dpbf16.restype = c.c_int
        lib.nf_rows.restype = c.c_int
        lib.nf_rows_q8.restype = c.c_int
        lib.nf_set_prefetch.argtypes = [c.c_int, c.c_int]
        lib.nf_set_prefetch.restype = None
        lib.nf_prefetch_min.restype = c.c_int
        lib.nf_prefetch_min_default.restype = c.c_int
        lib.nf_prefetch_distance.restype = c.c_int
        lib.nf_set_layer.argtypes = [c.c_void_p, c.c_int] + [c.c_void_p] * 6
        lib.nf_set_output.argtypes = [c.c_void_p] * 4
        lib.nf_set_scales.argtypes = [c.c_void_p, c.c_int] + [c.c_void_p] * 4
        lib.nf_quantize_activations.restype = None
        lib.nf_quantize_activations.argtypes = [c.c_void_p]
        lib.nf_set_cache.argtypes = [c.c_void_p] * 5 + [c.c_int]
        lib.nf_forward.restype = c.c_int
        lib.nf_forward.argtypes = [c.c_void_p, c.c_void_p, c.c_int, c.c_int, c.c_int, c.c_void_p,
                                   c.c_void_p, c.c_int, c.c_void_p]
        lib.nf_forward_rows.restype = c.c_int
        lib.nf_forward_rows.argtypes = [c.c_void_p, c.c_void_p, c.c_int] + [c.c_void_p] * 3 + [c.c_int, c.c_void_p]
        lib.nf_set_tree.restype = c.c_int
        lib.nf_set_tree.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_int]
        lib.nf_head_create.restype = c.c_void_p
        lib.nf_head_create.argtypes = [c.c_int] * 7 + [c.c_float, c.c_float] + [c.c_int] * 3
        lib.nf_head_set.argtypes = [c.c_void_p] * 11
        lib.nf_head_forward.restype = c.c_int
        lib.nf_head_forward.argtypes = [c.c_void_p, c.c_void_p, c.c_void_p, c.c_int, c.c_int,
                                        c.c_int, c.c_void_p, c.c_void_p]
        _LIB = lib
        return lib


def default_kernel() -> str:
    """``SPECDEMO_NATIVE_KERNEL`` when set, else ``dpbf16`` where the CPU has AVX512-BF16 (the
    compiled library says), else ``fma``.

    Raises:
        NativeError: an unknown kernel name, or ``dpbf16`` on a CPU without AVX512-BF16."""
    asked = os.environ.get(KERNEL_ENV, "").strip().lower()
    has = bool(library().nf_has_dpbf16())
    if not asked:
        return "dpbf16" if has else "fma"
    if asked not in KERNELS:
        raise NativeError(f"{KERNEL_ENV}={asked} is not a native kernel; use {' or '.join(KERNELS)}")
    if asked == "dpbf16" and not has:
        raise NativeError(f"{KERNEL_ENV}=dpbf16 needs a CPU with AVX512-BF16; this one has none")
    return asked


# ----------------------------------------------------------------------------- the weights

def unsupported_reason(model: torch.nn.Module) -> str | None:
    """Why the native backend cannot compute ``model``'s forward (None when it can): a Llama
    (``model_type`` in :data:`ARCHITECTURES`) with SiLU MLPs, no biases, no sliding window,
    widths the C kernels take (multiples of 32), on the CPU in float32 or bfloat16
    (``compiled_backend.llama_reason`` and the widths)."""
    reason = llama_reason(model, "native", ARCHITECTURES)
    if reason is not None:
        return reason
    cfg = model.config
    heads = cfg.num_attention_heads
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // heads
    widths = (cfg.hidden_size, cfg.intermediate_size, heads * head_dim)
    if any(w % 32 for w in widths) or head_dim > 1024 or head_dim % 2:
        return f"the native backend needs widths that are multiples of 32; this target has {widths}"
    p = next(model.parameters())
    if p.dtype not in (torch.float32, torch.bfloat16):
        return f"the native backend reads float32 or bfloat16 weights; this target is {p.dtype}"
    return None


COLUMNS = 32  # columns per chunk of a block


def _row_blocks(w: torch.Tensor, rows: int) -> torch.Tensor:
    """(M, K) -> (ceil(M / rows), rows, K // COLUMNS, COLUMNS), M padded with zero rows.

    Raises:
        ValueError: K not a multiple of COLUMNS."""
    m, k = w.shape
    if k % COLUMNS:
        raise ValueError(f"a weight of {k} columns; the native kernels need a multiple of {COLUMNS}")
    pad = -m % rows
    if pad:
        w = torch.cat([w, w.new_zeros(pad, k)])
    return w.view(-1, rows, k // COLUMNS, COLUMNS)


def repack(w: torch.Tensor, rows: int) -> torch.Tensor:
    """A (M, K) weight in the C kernels' layout: rows in blocks of ``rows`` (native_forward.c's
    RB, ``nf_rows()``; M padded with zero rows to a multiple), each block stored chunk by chunk
    of :data:`COLUMNS` columns, the rows of the block one after another within a chunk, so a
    block is one contiguous stream.

    Returns:
        (ceil(M / ROWS) * ROWS * K,) tensor of w's dtype.
    Raises:
        ValueError: K not a multiple of COLUMNS."""
    return _row_blocks(w, rows).permute(0, 2, 1, 3).contiguous().view(-1)


def repack_q8(q: torch.Tensor, rows: int) -> torch.Tensor:
    """A (M, K) int8 weight in the layout of native_forward.c's integer kernel (block_q8, for
    int8 activations): rows in blocks of ``rows`` (RBQ, ``nf_rows_q8()``; M padded with zero rows
    to a multiple), each block stored :data:`COLUMNS` columns at a time as 8 groups of 4 columns,
    a group holding the block's rows' 4 bytes one row after another (so a vector lane is a row).

    Returns:
        (ceil(M / rows) * rows * K,) int8.
    Raises:
        ValueError: K not a multiple of COLUMNS."""
    blocks = _row_blocks(q, rows)
    groups = blocks.reshape(*blocks.shape[:3], COLUMNS // 4, 4).permute(0, 2, 3, 1, 4)
    return groups.contiguous().view(-1)


def _int8(rows: int, *weights: torch.Tensor, layout=repack) -> tuple[torch.Tensor, torch.Tensor]:
    """The weights stacked by rows as int8 with one scale per row (absmax / 127, round to
    nearest; w ~= q * scale), in ``layout`` (:func:`repack` or :func:`repack_q8`) in blocks of
    ``rows``.

    Returns:
        (q: (ceil(M / rows) * rows * K,) int8, scale: (ceil(M / rows) * rows,) float32; padded
        rows 0)."""
    q, scale = quantize_rows(torch.cat([w.detach() for w in weights]))
    pad = -scale.numel() % rows
    scale = torch.cat([scale, scale.new_zeros(pad)]) if pad else scale
    return layout(q, rows), scale.contiguous()


def _bf16(rows: int, *weights: torch.Tensor) -> torch.Tensor:
    """The weights stacked by rows, rounded to BF16 (round to nearest even), :func:`repack`ed
    in blocks of ``rows``."""
    return repack(torch.cat([w.detach() for w in weights]).to(torch.bfloat16), rows)


def _check_weights(weights: str) -> str:
    """``weights`` when it is a weight format of :data:`_WEIGHTS`.

    Raises:
        ValueError: it is not."""
    if weights not in _WEIGHTS.values():
        raise ValueError(f"weights {weights!r}: use {', '.join(_WEIGHTS.values())}")
    return weights


def _packer(weights: str, lib, scales: list[torch.Tensor]):
    """A function of linear weights -> their stacked matrix in the C library ``lib``'s layout:
    :func:`_bf16` for ``bf16``, else :func:`_int8` (``w8a8``: in :func:`repack_q8`'s layout),
    whose row scales it appends to ``scales`` (in call order, as :func:`_set_scales` gives them
    to the C model)."""
    q8 = weights == "w8a8"
    rows = lib.nf_rows_q8() if q8 else lib.nf_rows()

    def pack(*ws: torch.Tensor) -> torch.Tensor:
        if weights == "bf16":
            return _bf16(rows, *ws)
        q, scale = _int8(rows, *ws, layout=repack_q8 if q8 else repack)
        scales.append(scale)
        return q
    return pack


def _set_scales(lib, handle, weights: str, scales: list[torch.Tensor], layers: int) -> None:
    """Tell the C model ``handle`` its int8 weights' row scales (``scales`` in :func:`_packer`'s
    order: qkv, o, gate_up, down a layer for ``layers`` layers, then the output head's) and, for
    ``w8a8``, to quantise activations too; nothing for ``bf16``."""
    if weights == "bf16":
        return
    for i in range(layers):
        lib.nf_set_scales(handle, i, *(t.data_ptr() for t in scales[4 * i:4 * i + 4]))
    lib.nf_set_scales(handle, -1, scales[-1].data_ptr(), None, None, None)
    if weights == "w8a8":
        lib.nf_quantize_activations(handle)


class NativeModel(RotaryTables):
    """The BF16 weights of one transformers Llama and the C model over them, built once and
    shared by its caches (one forward at a time: the C model owns one set of scratch buffers).

    Args:
        model: a transformers ``LlamaForCausalLM`` on the CPU (float32 or bfloat16).
        threads: threads of the C forward (default: the cores this process may use, at most 8).
        kernel: ``fma`` or ``dpbf16`` (default :func:`default_kernel`); int8 weights always
            use the ``fma`` arithmetic (float32 activations).
        weights: ``bf16``, ``int8`` (per-row scales, :func:`_int8`) or ``w8a8`` (the same int8
            weights times int8 activations, one scale per 32 values: ``nf_quantize_activations``).
    Raises:
        NativeError: :func:`unsupported_reason`, the library could not be built, or the C
            model could not be created.
    """

    def __init__(self, model: torch.nn.Module, threads: int | None = None,
                 kernel: str | None = None, weights: str = "bf16") -> None:
        reason = unsupported_reason(model)
        if reason:
            raise NativeError(reason)
        self.weights = _check_weights(weights)
        self.lib = library()
        self.kernel = kernel or default_kernel()
        cfg = model.config
        self.model = model
        self.n_layer = cfg.num_hidden_layers
        self.hidden = cfg.hidden_size
        self.n_head = cfg.num_attention_heads
        self.n_kv = getattr(cfg, "num_key_value_heads", None) or self.n_head
        self.head_dim = getattr(cfg, "head_dim", None) or self.hidden // self.n_head
        self.inter = cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.threads = threads or default_threads()
        base = model.model
        self.scales: list[torch.Tensor] = []  # int8: (qkv, o, gate_up, down) row scales a layer, then the head's
        pack = _packer(weights, self.lib, self.scales)
        self.scaling = float(getattr(base.layers[0].self_attn, "scaling", self.head_dim ** -0.5))
        with torch.no_grad():
            self.embed = base.embed_tokens.weight.detach().float().contiguous()  # (V, H)
            self.vocab = self.embed.shape[0]
            self.layers = []
            for layer in base.layers:
                a, m = layer.self_attn, layer.mlp
                self.layers.append({
                    "qkv": pack(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                    "o": pack(a.o_proj.weight),
                    "gate_up": pack(m.gate_proj.weight, m.up_proj.weight),
                    "down": pack(m.down_proj.weight),
                    "norm1": layer.input_layernorm.weight.detach().float().contiguous(),
                    "norm2": layer.post_attention_layernorm.weight.detach().float().contiguous(),
                })
            self.norm = base.norm.weight.detach().float().contiguous()
            self.head = pack(model.get_output_embeddings().weight)
        self.rotary = base.rotary_emb
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        self.lock = threading.Lock()
        handle = self.lib.nf_create(self.n_layer, self.hidden, self.n_head, self.n_kv,
                                    self.head_dim, self.inter, self.vocab, self.eps, self.scaling,
                                    self.threads, KERNELS[self.kernel])
        if not handle:
            raise NativeError("the native backend could not create its model (widths or memory)")
        self.handle = handle
        for i, lay in enumerate(self.layers):
            self.lib.nf_set_layer(handle, i, *(lay[k].data_ptr() for k in
                                               ("qkv", "o", "gate_up", "down", "norm1", "norm2")))
        self.lib.nf_set_output(handle, self.embed.data_ptr(), self.norm.data_ptr(),
                               self.head.data_ptr())
        _set_scales(self.lib, handle, weights, self.scales, self.n_layer)
        self._cache_owner = None  # the NativeKV whose cache the C model points at
        self.prefetch: dict | None = None  # native-w8a8: choose_prefetch's choice

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.nf_free(handle)
            self.handle = None

    @property
    def weight_bytes(self) -> int:
        """Bytes of weights one forward reads: the BF16 or int8 matrices (with their row scales)
        and the norms (the embedding rows read are not counted, as in
        ``costs.weight_bytes_per_forward``)."""
        total = self.head.numel() * self.head.element_size() + self.norm.numel() * 4
        for lay in self.layers:
            total += sum(lay[k].numel() * lay[k].element_size() for k in ("qkv", "o", "gate_up", "down"))
            total += (lay["norm1"].numel() + lay["norm2"].numel()) * 4
        return total + sum(t.numel() * 4 for t in self.scales)



def _grow_cache(owner, needed: int, layers: int, weights) -> None:
    """Give ``owner`` (a :class:`NativeKV` or :class:`NativeEagleHead`: ``capacity``,
    ``k_cache``, ``v_cache``) room for ``needed`` positions: float32 (layers, n_kv, capacity,
    head_dim) keys and values, the capacity doubled from :data:`MIN_CAPACITY` until it fits, the
    cached positions copied; ``weights`` (its ``n_kv``, ``head_dim`` and rotary tables) computes
    the tables for the new capacity."""
    capacity = max(owner.capacity, MIN_CAPACITY)
    while capacity < needed:
        capacity *= 2
    if capacity == owner.capacity:
        return
    shape = (layers, weights.n_kv, capacity, weights.head_dim)
    new_k, new_v = torch.zeros(shape), torch.zeros(shape)
    if owner.k_cache is not None:
        new_k[:, :, :owner.capacity] = owner.k_cache
        new_v[:, :, :owner.capacity] = owner.v_cache
    owner.k_cache, owner.v_cache, owner.capacity = new_k, new_v, capacity
    weights.rope(capacity)


class NativeKV(StaticCacheKV):
    """:class:`specdemo.core.kv.KVModel`'s interface over a :class:`NativeModel`: a static
    float32 KV cache of one sequence, rollback by length.

    Args:
        nmodel: the BF16 weights and C model.
        capacity: cache positions allocated at first (grows by doubling).
    """

    backend = NAME

    def __init__(self, nmodel: NativeModel, capacity: int = MIN_CAPACITY) -> None:
        self.nmodel = nmodel
        self.backend = next(name for name, w in _WEIGHTS.items() if w == nmodel.weights)
        self.n_layer = nmodel.n_layer
        self.model = nmodel.model  # what callers read: config, input embeddings
        self.device = torch.device("cpu")
        self.capacity = 0
        self.k_cache = self.v_cache = None
        self._grow(capacity)
        self.reset()

    def _grow(self, needed: int) -> None:
        m = self.nmodel
        _grow_cache(self, needed, m.n_layer, m)

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values of the cached tokens (``capacity`` of them are
        allocated)."""
        m = self.nmodel
        return 2 * 4 * m.n_layer * m.n_kv * m.head_dim * self.length

    # ------------------------------------------------------------------ internals

    def _run(self, ids: list[int], keep: int, layers: tuple[int, ...],
             tree: tuple[list[int], list[int], int] | None = None):
        """One C forward after the cached tokens; ``tree`` as :func:`_tree_mode`."""
        m = self.nmodel
        s, start = len(ids), self.length
        self._grow(start + s)
        tokens = torch.tensor(ids, dtype=torch.int32)
        want = torch.tensor(layers, dtype=torch.int32)
        logits = torch.empty(keep, m.vocab)
        feats = torch.empty(s, len(layers) * m.hidden) if layers else None
        with m.lock:
            cos, sin = m.rope(self.capacity)
            m.lib.nf_set_cache(m.handle, self.k_cache.data_ptr(), self.v_cache.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), self.capacity)
            with _tree_mode(m.lib, m.handle, tree):
                status = m.lib.nf_forward(m.handle, tokens.data_ptr(), s, start, keep,
                                          logits.data_ptr(), want.data_ptr() if layers else None,
                                          len(layers), feats.data_ptr() if layers else None)
        if status == -2:
            raise ValueError(f"a token id outside 0..{m.vocab - 1}: {ids}")
        if status != 0:
            raise MemoryError("the native forward could not allocate its buffers")
        self.length += s
        self.ids += ids
        return logits, feats

    def forward_tree(self, ids: list[int], depth: list[int], anc: list[int],
                     layers: tuple[int, ...] = ()) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``core.kv.KVModel.forward_tree`` in C (tree attention: ``nf_set_tree``)."""
        s, start = len(ids), self.length
        if not (s == len(depth) == len(anc)) or not 1 <= s <= 64:
            raise ValueError("forward_tree: ids, depth and anc must have the same length 1..64")
        return self._run(list(ids), s, tuple(layers), ([start + d for d in depth], anc, start))

    def keep_rows(self, start: int, rows: list[int]) -> None:
        """``core.kv.KVModel.keep_rows``: the kept rows' keys and values moved into place."""
        keep_tree_rows(self, [self.k_cache, self.v_cache], start, rows)


@contextlib.contextmanager
def _tree_mode(lib, handle, tree: tuple[list[int], list[int], int] | None):
    """Within the block the C model computes draft-tree rows (``nf_set_tree``): ``tree`` is
    (per row its rotary position, per row the bitmask of the cache rows from ``first`` on it
    attends to, ``first``); None: the ordinary causal forward. Call with the model's lock."""
    if tree is None:
        yield
        return
    pos = torch.tensor(tree[0], dtype=torch.int32)
    anc = torch.tensor([a - (1 << 64) if a >= 1 << 63 else a for a in tree[1]],
                       dtype=torch.int64)  # uint64 bit patterns in an int64 tensor
    lib.nf_set_tree(handle, pos.data_ptr(), anc.data_ptr(), tree[2])
    try:
        yield
    finally:
        lib.nf_set_tree(handle, None, None, 0)


class NativeBatch:
    """Several sequences decoded together over one :class:`NativeModel` (continuous batching,
    for generating training data): sequence slot ``i`` owns cache rows ``i * positions ..
    (i + 1) * positions - 1``, and one forward (``nf_forward_rows``) runs any mix of the slots'
    new tokens, reading each matrix once for all of them. A token's logits are exactly those a
    :class:`NativeKV` of its sequence alone gives it (the kernels' numbers do not depend on the
    other tokens of a forward).

    Args:
        nmodel: the weights and C model (shared with its other caches: one forward at a time).
        slots: sequences at once.
        positions: cache positions per sequence (prompt + answer).
    Raises:
        ValueError: ``slots`` or ``positions`` below 1.
    """

    def __init__(self, nmodel: NativeModel, slots: int, positions: int) -> None:
        if slots < 1 or positions < 1:
            raise ValueError(f"slots and positions must be at least 1; got {slots}, {positions}")
        self.nmodel, self.slots, self.positions = nmodel, slots, positions
        self.capacity = slots * positions
        shape = (nmodel.n_layer, nmodel.n_kv, self.capacity, nmodel.head_dim)
        self.k_cache, self.v_cache = torch.zeros(shape), torch.zeros(shape)
        self.lengths = [0] * slots
        self._logits = torch.empty(slots, nmodel.vocab)  # reused: no fresh pages every step

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values allocated (all slots)."""
        return 2 * self.k_cache.numel() * 4

    def reset(self, slot: int) -> None:
        """Forget slot ``slot``'s sequence (its rows are written again from position 0)."""
        self.lengths[slot] = 0

    def forward(self, entries: list[tuple[int, list[int]]]) -> torch.Tensor:
        """Append each entry's ids to its slot's sequence, all in one forward.

        Args:
            entries: (slot, ids) pairs, each slot at most once, ids non-empty.
        Returns:
            (len(entries), vocab) float32: the logits after each entry's last id (a view of a
            buffer the next call overwrites).
        Raises:
            ValueError: a slot out of range or given twice, empty ids, a sequence longer than
                ``positions``, or an id outside the vocabulary.
            MemoryError: the C forward could not allocate its buffers.
        """
        m = self.nmodel
        ids, base, pos, keep = [], [], [], []
        seen = set()
        for slot, toks in entries:
            if not 0 <= slot < self.slots or slot in seen or not toks:
                raise ValueError(f"entry for slot {slot}: slots are 0..{self.slots - 1}, once each, "
                                 "with at least one id")
            seen.add(slot)
            start = self.lengths[slot]
            if start + len(toks) > self.positions:
                raise ValueError(f"slot {slot} would hold {start + len(toks)} positions; it has "
                                 f"{self.positions}")
            ids += toks
            base += [slot * self.positions] * len(toks)
            pos += range(start, start + len(toks))
            keep.append(len(ids) - 1)
        as_int = [torch.tensor(v, dtype=torch.int32) for v in (ids, base, pos, keep)]
        logits = self._logits[:len(keep)]
        with m.lock:
            cos, sin = m.rope(self.positions)
            m.lib.nf_set_cache(m.handle, self.k_cache.data_ptr(), self.v_cache.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), self.capacity)
            status = m.lib.nf_forward_rows(m.handle, as_int[0].data_ptr(), len(ids), as_int[1].data_ptr(),
                                           as_int[2].data_ptr(), as_int[3].data_ptr(), len(keep),
                                           logits.data_ptr())
        if status == -2:
            raise ValueError(f"a token id outside 0..{m.vocab - 1}")
        if status != 0:
            raise MemoryError("the native forward could not allocate its buffers")
        for slot, toks in entries:
            self.lengths[slot] += len(toks)
        return logits


# ----------------------------------------------------------------------------- attaching

_ATTR = "_specdemo_native"  # the NativeModel, kept on the transformers model it copies
_ATTACH_LOCK = threading.Lock()


def unavailable_reason(loaded) -> str | None:
    """Why ``loaded`` (a ``models.LoadedModel``) cannot run on the native backend; None when it
    can (a supported architecture, and the C forward compiles here)."""
    if getattr(loaded, "quantization", None):
        return (f"--quantization {loaded.quantization} is a transformers path; the native backend "
                "uses BF16 weights")
    reason = unsupported_reason(loaded.model)
    if reason:
        return reason
    try:
        library()
        default_kernel()  # SPECDEMO_NATIVE_KERNEL names a kernel this CPU has
    except NativeError as exc:
        return str(exc)
    return None


def native_model(loaded, weights: str = "bf16") -> NativeModel:
    """The :class:`NativeModel` of ``loaded`` with ``weights`` (:data:`_WEIGHTS`' values), built
    once per transformers model and weight format (~1 s for 135M).

    Raises:
        NativeError: :func:`unavailable_reason`.
    """
    attr = _ATTR if weights == "bf16" else f"{_ATTR}_{weights}"
    with _ATTACH_LOCK:
        nmodel = getattr(loaded.model, attr, None)
        if nmodel is None:
            reason = unavailable_reason(loaded)
            if reason:
                raise NativeError(reason)
            nmodel = NativeModel(loaded.model, weights=weights)
            if weights == "w8a8":
                nmodel.prefetch = choose_prefetch(nmodel)
                log.info("native-w8a8: %s", nmodel.prefetch["reason"])
            setattr(loaded.model, attr, nmodel)
        return nmodel


PREFETCH_FILE = "native-prefetch.json"  # in models.cache_dir(): the measured choice per machine
PREFETCH_ENV = "SPECDEMO_NATIVE_PREFETCH"  # unset: measured once; "recalibrate"; "all"; "wide"
PREFETCH_ALL = 1  # nf_set_prefetch's narrowest prefetching register block: every block
PREFETCH_WIDTHS = (1, 5)  # a plain step and a verification of 4 drafted tokens (as auto's choice)
PREFETCH_GAIN = 0.03  # prefetching every block must save this share of the time to be chosen


def _prefetch_key(nmodel: NativeModel) -> str:
    parts = [_cpu_name(), library_path().name, nmodel.threads, nmodel.n_layer, nmodel.hidden,
             nmodel.inter, nmodel.vocab, PREFETCH_WIDTHS]
    return hashlib.sha256(json.dumps(parts).encode()).hexdigest()[:20]


def choose_prefetch(nmodel: NativeModel, repeats: int = 12) -> dict:
    """Sets, for the int8-activation kernel (``native-w8a8``), which register blocks prefetch
    their weight stream (``nf_set_prefetch``), from a measurement on this machine, and returns
    ``{"prefetch": "all" | "wide", "reason": str, "cost_s": {...} | None}``.

    ``wide`` (the C default, ``PFQ_MIN``): only blocks of 6+ tokens prefetch; ``all``: every
    block. Which is faster depends on the machine: prefetching at 1-5 tokens measured no gain
    (4-5 tokens: 5% slower) on a 2-core Zen 4 with 40+ GB/s, and 11-25% faster forwards of 1-5
    tokens on a 2-core Xeon with 21 GB/s (``docs/cpu-backends.md``, "Weight prefetch"). The
    measurement alternates both settings forward by forward over :data:`PREFETCH_WIDTHS` tokens
    after 128 cached tokens (``repeats`` each, medians; ~0.5 s for 135M), chooses ``all`` when it
    saves at least :data:`PREFETCH_GAIN`, and is stored per machine, library and model shape in
    ``models.cache_dir()/native-prefetch.json`` unless other processes used more than
    ``machine.BUSY_SHARE`` of the CPU meanwhile. ``SPECDEMO_NATIVE_PREFETCH``: ``all`` or
    ``wide`` chooses without measuring, ``recalibrate`` (or ``SPECDEMO_BACKEND=recalibrate``)
    measures again. The numbers a forward computes do not depend on the setting.

    Raises:
        NativeError: ``SPECDEMO_NATIVE_PREFETCH`` names no setting.
    """
    lib = nmodel.lib
    wide = lib.nf_prefetch_min_default()  # the build's PFQ_MIN, whatever was set since
    asked = os.environ.get(PREFETCH_ENV, "").strip().lower()
    if asked in ("all", "wide"):
        lib.nf_set_prefetch(PREFETCH_ALL if asked == "all" else wide, -1)
        return {"prefetch": asked, "reason": f"{PREFETCH_ENV}={asked}", "cost_s": None}
    if asked not in ("", "recalibrate"):
        raise NativeError(f"{PREFETCH_ENV}={asked} is not a prefetch setting; use all, wide or "
                          "recalibrate")
    path, key = cache_dir() / PREFETCH_FILE, _prefetch_key(nmodel)
    # SPECDEMO_BACKEND (services.backend_store.CHOICE_ENV: a layer above this one)
    again = "recalibrate" in (asked, os.environ.get("SPECDEMO_BACKEND", "").strip().lower())
    if not again:
        try:
            entry = json.loads(path.read_text())[key]
            lib.nf_set_prefetch(PREFETCH_ALL if entry["prefetch"] == "all" else wide, -1)
            return {**entry, "reason": "measured earlier on this machine: " + entry["reason"]}
        except (OSError, ValueError, KeyError, TypeError):
            pass
    kv = NativeKV(nmodel)
    context = [i % (nmodel.vocab - 1) + 1 for i in range(128)]
    kv.forward(context)
    settings = {"wide": wide, "all": PREFETCH_ALL}
    times = {(name, n): [] for name in settings for n in PREFETCH_WIDTHS}
    others = machine.OtherCpuUse()
    for _ in range(repeats):
        for n in PREFETCH_WIDTHS:
            for name, narrowest in settings.items():
                lib.nf_set_prefetch(narrowest, -1)
                start = time.perf_counter()
                kv.forward([1] * n, logits_to_keep=1)
                times[(name, n)].append(time.perf_counter() - start)
                kv.rollback(len(context))
    share = others.share()
    cost = {name: sum(statistics.median(times[(name, n)]) for n in PREFETCH_WIDTHS)
            for name in settings}
    best = "all" if cost["all"] < (1 - PREFETCH_GAIN) * cost["wide"] else "wide"
    lib.nf_set_prefetch(settings[best], -1)
    reason = (f"prefetch {best}: every block {cost['all'] * 1e3:.2f} ms, blocks of {wide}+ tokens "
              f"{cost['wide'] * 1e3:.2f} ms for a 1-token plus a 5-token forward")
    entry = {"prefetch": best, "reason": reason, "cost_s": cost}
    if share is not None and share > machine.BUSY_SHARE:
        return {**entry, "reason": reason + f"; machine busy (others used {share:.0%} of the CPU), "
                "so not stored"}
    try:
        store_cache_entry(path, key, {**entry, "measured_unix_s": time.time()})
    except OSError as exc:
        log.warning("native prefetch choice not stored in %s (%s)", path, exc)
    return entry


def model_of(loaded) -> NativeModel:
    """The :class:`NativeModel` that ``loaded``'s backend (a :data:`_WEIGHTS` name) runs."""
    return native_model(loaded, _WEIGHTS[loaded.backend])


# ----------------------------------------------------------------------------- EAGLE-3 head

HEAD_NORM_BEFORE_RESIDUAL, HEAD_NORM_OUTPUT = 1, 2  # native_forward.c's NF_HEAD_* flags
_HEAD_ATTR = "_specdemo_native_head"  # {(embedding pointer, kernel): NativeEagleWeights}


def head_unsupported_reason(head) -> str | None:
    """Why the C head step cannot compute ``head``'s (an ``Eagle3Head``) layer (None when it
    can): biases, an activation other than SiLU, widths that are not multiples of 32, a head
    off the CPU. ``fc`` and its optional norms are not its part (``Eagle3Head.project`` runs
    in torch once per round)."""
    cfg = head.config
    if getattr(cfg, "attention_bias", False) or getattr(cfg, "mlp_bias", False):
        return "the native EAGLE-3 head step computes heads without biases; this one has biases"
    if getattr(cfg, "hidden_act", "silu") != "silu":
        return f"the native EAGLE-3 head step computes SiLU MLPs; this head uses {cfg.hidden_act}"
    layer = head.layers[0]
    widths = (cfg.hidden_size, cfg.intermediate_size, layer.heads * layer.head_dim)
    if any(w % 32 for w in widths) or layer.head_dim > 1024 or layer.head_dim % 2:
        return f"the native EAGLE-3 head step needs widths that are multiples of 32; this head has {widths}"
    if head.fc.weight.device.type != "cpu":
        return f"the native EAGLE-3 head step runs on the CPU; this head is on {head.fc.weight.device.type}"
    return None


class NativeEagleWeights(RotaryTables):
    """An ``Eagle3Head``'s decoder layer, final norm and ``lm_head`` in BF16 (or int8) and the C
    head model over them (``nf_head_create``), built once per head, embedding table, kernel and
    weight format (:meth:`of`) and shared by the drafters' caches (one step at a time).

    Args:
        head: the EAGLE-3 head (float32 or bfloat16 weights on the CPU).
        embed: (V, H) the embedding table its ids index (the target's, or the head's own);
            read as float32 (no copy when it is float32 and contiguous).
        threads, kernel: as :class:`NativeModel`.
        weights: as :class:`NativeModel` (``bf16``, ``int8``, ``w8a8``): the matrices of the
            layer and ``lm_head`` (the step reads them all every draft token, so int8 halves
            what a step waits for where it is memory-bound).
    Raises:
        NativeError: :func:`head_unsupported_reason`, the library could not be built, or the C
            model could not be created.
    """

    def __init__(self, head, embed: torch.Tensor, threads: int | None = None,
                 kernel: str | None = None, weights: str = "bf16") -> None:
        reason = head_unsupported_reason(head)
        if reason:
            raise NativeError(reason)
        self.weights = _check_weights(weights)
        self.lib = library()
        self.kernel = kernel or default_kernel()
        cfg, layer = head.config, head.layers[0]
        self.hidden, self.n_head, self.n_kv = cfg.hidden_size, layer.heads, layer.kv_heads
        self.head_dim, self.inter = layer.head_dim, cfg.intermediate_size
        self.eps = float(cfg.rms_norm_eps)
        self.scaling = self.head_dim ** -0.5  # F.scaled_dot_product_attention's default
        self.draft_vocab = head.draft_vocab_size
        self.threads = threads or default_threads()
        self.rotary = head.rotary_emb
        self._rope: tuple[torch.Tensor, torch.Tensor] | None = None
        a, m = layer.self_attn, layer.mlp
        self.scales: list[torch.Tensor] = []  # int8: qkv, o, gate_up, down, lm_head row scales
        pack = _packer(weights, self.lib, self.scales)

        def f32(t):
            return t.detach().float().contiguous()

        with torch.no_grad():
            self.embed = f32(embed)
            if self.embed.shape[1] != self.hidden:
                raise NativeError(f"the embedding table is {self.embed.shape[1]} wide; the EAGLE-3 "
                                  f"head reads {self.hidden}")
            self.tensors = {
                "qkv": pack(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight),
                "o": pack(a.o_proj.weight),
                "gate_up": pack(m.gate_proj.weight, m.up_proj.weight),
                "down": pack(m.down_proj.weight),
                "input_ln": f32(layer.input_layernorm.weight),
                "hidden_norm": f32(layer.hidden_norm.weight),
                "post_ln": f32(layer.post_attention_layernorm.weight),
                "norm": f32(head.norm.weight),
                "lm_head": pack(head.lm_head.weight),
            }
        flags = ((HEAD_NORM_BEFORE_RESIDUAL if layer.norm_before_residual else 0)
                 | (HEAD_NORM_OUTPUT if head.norm_output else 0))
        self.lock = threading.Lock()
        handle = self.lib.nf_head_create(self.hidden, self.n_head, self.n_kv, self.head_dim,
                                         self.inter, self.draft_vocab, self.embed.shape[0],
                                         self.eps, self.scaling, self.threads,
                                         KERNELS[self.kernel], flags)
        if not handle:
            raise NativeError("the native backend could not create the EAGLE-3 head's model "
                              "(widths or memory)")
        self.handle = handle
        t = self.tensors
        self.lib.nf_head_set(handle, *(t[k].data_ptr() for k in (
            "qkv", "o", "gate_up", "down", "input_ln", "hidden_norm", "post_ln", "norm",
            "lm_head")), self.embed.data_ptr())
        _set_scales(self.lib, handle, weights, self.scales, 1)

    @classmethod
    def of(cls, head, embed: torch.Tensor, kernel: str | None = None,
           weights: str = "bf16") -> "NativeEagleWeights":
        """The weights of ``head`` over ``embed``, built on first use and kept on the head."""
        kernel = kernel or default_kernel()
        with _ATTACH_LOCK:
            built = head.__dict__.setdefault(_HEAD_ATTR, {})
            key = (embed.data_ptr(), tuple(embed.shape), kernel, weights)
            if key not in built:
                built[key] = cls(head, embed, kernel=kernel, weights=weights)
            return built[key]

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.nf_free(handle)
            self.handle = None



class NativeEagleHead:
    """``Eagle3Head.step`` in C with a static float32 KV cache of one sequence (rollback by
    length): the object ``Eagle3Drafter`` takes as its ``stepper``.

    Args:
        head: the EAGLE-3 head (its embeddings attached, or its own).
        embed: (V, H) the embedding table (default: the head's own or the attached one).
        kernel: ``fma`` or ``dpbf16`` (default :func:`default_kernel`).
        capacity: cache positions allocated at first (doubled when a step passes them).
        weights: ``bf16``, ``int8`` or ``w8a8`` (:class:`NativeEagleWeights`).
    Raises:
        NativeError: as :class:`NativeEagleWeights`.
    """

    def __init__(self, head, embed: torch.Tensor | None = None, kernel: str | None = None,
                 capacity: int = MIN_CAPACITY, weights: str = "bf16") -> None:
        if embed is None:
            table = head.embedding_table()
            if table is None:
                raise NativeError("the EAGLE-3 head needs the target's embeddings: call attach()")
            embed = table.weight
        self.weights = NativeEagleWeights.of(head, embed, kernel, weights)
        self.capacity = 0
        self.k_cache = self.v_cache = None
        self.length = 0
        self._grow(capacity)

    def _grow(self, needed: int) -> None:
        _grow_cache(self, needed, 1, self.weights)

    def step(self, hidden: torch.Tensor, ids: list[int], start: int,
             keep: int = 1, tree: tuple[list[int], list[int], int] | None = None,
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """One head pass over T positions start..start+T-1 (``Eagle3Head.step`` without the
        batch dimension); the cache keeps positions 0..start+T-1 afterwards.

        Args:
            hidden: (T, H) inputs (``project(features)``, or the previous step's output).
            ids: the T target ids of the tokens after those positions.
            start: the first position, at most the cached length (later positions are dropped).
            keep: logits for the last ``keep`` positions (1..T).
            tree: None, or draft-tree nodes (``nf_set_tree``): (per position its rotary
                position, per position a bitmask of the rows from ``first`` on it attends to,
                ``first``); the positions stay in cache rows start..start+T-1.
        Returns:
            (output (T, H) float32, the one the next draft step reads; logits (keep, Vd)
            float32).
        Raises:
            ValueError: shapes or ``keep`` out of range, ``start`` beyond the cache, or an id
                outside the embedding table.
        """
        w = self.weights
        n = len(ids)
        if hidden.dim() != 2 or hidden.shape != (n, w.hidden) or n == 0:
            raise ValueError(f"hidden must be (T, {w.hidden}) for T = len(ids) = {n} >= 1; got "
                             f"{tuple(hidden.shape)}")
        if not 1 <= keep <= n:
            raise ValueError(f"keep must be in 1..{n}, got {keep}")
        if not 0 <= start <= self.length:
            raise ValueError(f"start {start} is beyond the cached length {self.length}")
        self._grow(start + n)
        x = hidden.detach().float().contiguous()
        tokens = torch.tensor(ids, dtype=torch.int32)
        out = torch.empty(n, w.hidden)
        logits = torch.empty(keep, w.draft_vocab)
        with w.lock:
            cos, sin = w.rope(self.capacity)
            w.lib.nf_set_cache(w.handle, self.k_cache.data_ptr(), self.v_cache.data_ptr(),
                               cos.data_ptr(), sin.data_ptr(), self.capacity)
            with _tree_mode(w.lib, w.handle, tree):
                status = w.lib.nf_head_forward(w.handle, x.data_ptr(), tokens.data_ptr(), n,
                                               start, keep, logits.data_ptr(), out.data_ptr())
        if status == -2:
            raise ValueError(f"a token id outside 0..{w.embed.shape[0] - 1}: {ids}")
        if status != 0:
            raise MemoryError("the native head step could not allocate its buffers")
        self.length = start + n
        return out, logits

    def rollback(self, length: int) -> None:
        """Drop cached positions beyond ``length`` (nothing to drop: no-op)."""
        self.length = min(self.length, max(0, length))

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float32 keys and values of the cached positions."""
        return 2 * 4 * self.weights.n_kv * self.weights.head_dim * self.length


def head_stepper(drafter, loaded) -> None:
    """Give ``drafter`` (an ``Eagle3Drafter``, or a drafter stacked over one, e.g.
    ``CombinedDrafter``) the C head step when ``loaded`` (a ``models.LoadedModel``) runs on a
    native backend, in that backend's weight format (BF16, int8, or int8 with int8 activations:
    the drafts of a head change with it, the output does not); anything else is left as it is
    (the torch head is the reference). A head the C step cannot compute keeps the torch step
    (logged once, not an error)."""
    backend = getattr(loaded, "backend", "transformers")
    if backend not in _WEIGHTS or drafter is None:
        return
    for d in (drafter, getattr(drafter, "learned", None)):
        if d is None or not hasattr(d, "use_stepper") or getattr(d, "stepper", None) is not None:
            continue
        try:
            d.use_stepper(NativeEagleHead(d.head, weights=_WEIGHTS[backend]))
        except NativeError as exc:
            log.info("the EAGLE-3 head keeps its torch step: %s", exc)
