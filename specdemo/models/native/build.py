"""Compiling ``native_forward.c`` once per machine and loading it (:func:`library`), and the
kernel it runs (:func:`default_kernel`)."""

from __future__ import annotations

import ctypes
import hashlib
import logging
import os
import shutil
import subprocess
import threading
from pathlib import Path

from ...core.errors import ModelLoadError
from ...core.machine import cpu_flags
from ..builtin import cache_dir

log = logging.getLogger(__name__)


SOURCE = Path(__file__).with_name("native_forward.c")

KERNEL_ENV = "SPECDEMO_NATIVE_KERNEL"  # fma | dpbf16

KERNELS = {"fma": 0, "dpbf16": 1}


class NativeError(ModelLoadError):
    """The native backend cannot serve this target, or its library could not be built (a
    ``ModelLoadError``: the CLI, the page and ``/race`` show its one sentence)."""


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
