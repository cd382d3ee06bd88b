"""The target backends in one table, and which of them can serve a target here.

Which backend am I on? ``loaded.backend`` (:func:`backend_of`), one of ``core.BACKENDS``; its row
of :data:`TABLE` says what checks it (``unavailable``), what makes its forward (``prepare``, the
KV-cached target ``kv`` the engine runs) and what it gives a learned drafter
(``attach_drafter``). :func:`with_backend` sets a backend by name; :func:`candidate_backends`
says which ones ``auto`` may weigh. ``auto`` itself, which measures, is a service:
:mod:`specdemo.services.backend_choice`.

The families (``core.TARGET_BACKENDS``): ``transformers`` (the model's own forward,
:class:`specdemo.core.kv.KVModel`), ``ggml`` (llama.cpp over the GGUF file,
:mod:`specdemo.models.ggml_backend`), ``int8`` (torch int8, :mod:`specdemo.models.compiled_backend`)
and ``native`` (our C forward, :mod:`specdemo.models.native`).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable

from ..core import BACKENDS, TARGET_BACKENDS, family_backends
from ..core.kv import KVModel
from . import compiled_backend as cb
from . import cuda_graph_backend as cg
from . import ggml_backend as gg
from . import native as nb


@dataclass(frozen=True)
class Backend:
    """One row of :data:`TABLE`.

    Attributes:
        name: the backend's name (``core.TARGET_BACKENDS``).
        family: the module family computing its forward (``transformers``, ``ggml``, ``int8``,
            ``native``).
        weights: the weight format (``core.TARGET_BACKENDS``; None: the model's or file's own).
        unavailable: ``loaded`` -> why this backend cannot serve it (None: it can, as far as a
            cheap check tells; :meth:`prepare` is the full check).
        prepare: ``loaded`` -> None, building or loading the forward once (kept on the model);
            raises the family's ``ModelLoadError`` with the reason.
        kv: ``loaded`` (with ``backend`` set to this name) -> the KV-cached target the engine
            runs (``forward``, ``forward_features``, ``rollback``, ``reset``, ``length``).
        attach_drafter: (drafter, ``loaded``) -> None: what the backend gives a drafter (the
            native backends' C step of an EAGLE-3 head); no-op elsewhere.
    """

    name: str
    family: str
    weights: str | None
    unavailable: Callable[[object], str | None]
    prepare: Callable[[object], None]
    kv: Callable[[object], object]
    attach_drafter: Callable[[object, object], None]


def _nothing(*args) -> None:
    return None


def _row(name: str, family: str, weights: str | None) -> Backend:
    if family == "ggml":
        return Backend(name, family, weights, gg.unavailable_reason,
                       lambda loaded: gg.ggml_model(loaded, backend=name) and None,
                       lambda loaded: gg.GgmlKV(gg.ggml_model(loaded), loaded.model, backend=name),
                       _nothing)
    if family == "int8":
        return Backend(name, family, weights, cb.unavailable_reason,
                       lambda loaded: cb.int8_model(loaded) and None,
                       lambda loaded: cb.Int8KV(cb.int8_model(loaded)), _nothing)
    if family == "native":
        return Backend(name, family, weights, nb.unavailable_reason,
                       lambda loaded: nb.native_model(loaded, weights) and None,
                       lambda loaded: nb.NativeKV(nb.model_of(loaded)), nb.head_stepper)
    if family == "cuda-graphs":
        return Backend(name, family, weights, cg.unavailable_reason,
                       lambda loaded: cg.static_model(loaded) and None,
                       lambda loaded: cg.CudaGraphKV(cg.static_model(loaded)), _nothing)
    return Backend(name, family, weights, _nothing, _nothing,
                   lambda loaded: KVModel(loaded.model), _nothing)


#: the table of target backends: name (``core.TARGET_BACKENDS``, ``auto`` aside) -> its row
TABLE: dict[str, Backend] = {name: _row(name, facts.family, facts.weights)
                             for name, facts in TARGET_BACKENDS.items()}


def backend_of(loaded) -> str:
    """The backend a loaded target runs on (``transformers`` unless :func:`with_backend` said)."""
    return getattr(loaded, "backend", "transformers")


def target_kv(loaded):
    """A KV-cached target for the engine on ``loaded``'s backend (its :data:`TABLE` row's
    ``kv``): a ``ggml_backend.GgmlKV``, a ``compiled_backend.Int8KV``, a
    ``native.NativeKV``, else transformers' :class:`specdemo.core.kv.KVModel`."""
    return TABLE.get(backend_of(loaded), TABLE["transformers"]).kv(loaded)


def attach_drafter(drafter, loaded) -> None:
    """Give ``drafter`` what ``loaded``'s backend offers it (its :data:`TABLE` row's
    ``attach_drafter``: on the native backends, the C step of an EAGLE-3 head)."""
    row = TABLE.get(backend_of(loaded))
    if row is not None and drafter is not None:
        row.attach_drafter(drafter, loaded)


#: why auto leaves ggml-bf16 out (measured with scripts/backend_divergence.py, docs/cpu-backends.md)
BF16_NOT_AUTO = ("llama.cpp's BF16 kernels give a token different numbers in a one-token and a "
                 "multi-token decode, so speculative output differed from plain output on 8 of 20 "
                 "prompts (0 of 20 with the Q4_1 file); ask for it with --backend ggml-bf16")
#: why auto leaves the torch int8 backend out where the native ones are candidates
INT8_NOT_AUTO = ("native-int8 computes the same int8 weights in our C forward, and the torch int8 "
                 "backend measured 2.8-16x slower than the native ones on both CPUs of "
                 "docs/cpu-backends.md while its weights and activation scales take seconds to "
                 "build; ask for it with --backend int8")


def candidate_backends(loaded) -> tuple[tuple[str, ...], list[str]]:
    """(backends ``auto`` measures for ``loaded``, why each other one is not a candidate)."""
    names, why = ["transformers"], []
    reason = gg.unavailable_reason(loaded)
    if reason is None:
        try:
            gg.ggml_model(loaded)
            names.append("ggml")
        except gg.GgmlError as exc:
            why.append(f"ggml not available: {exc}")
    else:
        why.append(f"ggml not available: {reason}")
    if "ggml" in names:
        why.append(f"ggml-bf16 not a candidate: {BF16_NOT_AUTO}")
    native = nb.unavailable_reason(loaded) if loaded.device.type == "cpu" else "not on the CPU"
    reason = cb.unavailable_reason(loaded) if loaded.device.type == "cpu" else "not on the CPU"
    if reason is None and native is None:
        why.append(f"int8 not a candidate: {INT8_NOT_AUTO}")
    elif reason is None:
        names.append("int8")
    else:
        why.append(f"int8 not available: {reason}")
    if native is None:
        names += list(family_backends("native"))
    else:
        why.append(f"native not available: {native}")
    return tuple(names), why


def replace_backend(loaded, backend: str):
    """``loaded`` (a ``models.LoadedModel``) on ``backend``: the same model, tokenizer and
    weights objects, with ``backend`` set (nothing is loaded again)."""
    out = copy.copy(loaded)  # shallow: model, tokenizer and weights stay shared
    out.backend = backend
    return out


def with_backend(loaded, backend: str):
    """``loaded`` set to run on the backend named ``backend`` (``auto`` is chosen by
    :func:`specdemo.services.backend_choice.with_backend`, which measures).

    Args:
        loaded: a ``models.LoadedModel``.
        backend: ``transformers``, ``ggml``, ``ggml-bf16``, ``int8`` (``compiled_backend.py``),
            ``native``, ``native-int8`` or ``native-w8a8`` (``models/native/``: BF16 or int8
            weights; int8 activations too).
    Returns:
        a LoadedModel with ``backend`` set (the same model, tokenizer and weights objects).
    Raises:
        GgmlError: ``ggml`` cannot serve this target (the reason).
        compiled_backend.Int8Error: ``int8`` cannot serve this target.
        native.NativeError: a ``native`` backend cannot serve this target.
        ValueError: not a backend's name (``auto`` included).
    """
    name = (backend or "").strip().lower()
    if name not in TABLE:
        raise ValueError(f"unknown backend '{backend}'; use {', '.join(BACKENDS)}")
    TABLE[name].prepare(loaded)  # raises with the reason
    return replace_backend(loaded, name)
