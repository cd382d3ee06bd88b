"""The native forward kept on a loaded target: whether it can serve it
(:func:`unavailable_reason`) and its :class:`~.model.NativeModel` per weight format
(:func:`native_model`, :func:`model_of`)."""

from __future__ import annotations

import logging
import threading

from ..attached import attached
from .build import NativeError, default_kernel, library
from .model import NativeModel, unsupported_reason
from .prefetch import choose_prefetch
from .weights import _WEIGHTS

log = logging.getLogger(__name__)


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
    def build() -> NativeModel:
        nmodel = NativeModel(loaded.model, weights=weights)
        if weights == "w8a8":
            nmodel.prefetch = choose_prefetch(nmodel)
            log.info("native-w8a8: %s", nmodel.prefetch["reason"])
        return nmodel
    attr = _ATTR if weights == "bf16" else f"{_ATTR}_{weights}"
    return attached(loaded.model, attr, _ATTACH_LOCK, build, lambda: unavailable_reason(loaded), NativeError)


def model_of(loaded) -> NativeModel:
    """The :class:`NativeModel` that ``loaded``'s backend (a :data:`_WEIGHTS` name) runs."""
    return native_model(loaded, _WEIGHTS[loaded.backend])
