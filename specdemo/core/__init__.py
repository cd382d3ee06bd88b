"""Core: the decode loop, KV cache and rollback, sampling and verification, statistics,
draft-length policies, the drafter protocol and the drafter families. Imports no other layer."""

from typing import NamedTuple


class BackendFacts(NamedTuple):
    """What the code outside the backend's own module says of one target backend.

    A tuple, so ``TARGET_BACKENDS[name][0]`` is the family and ``[1]`` the weight format.

    Attributes:
        family: the module that computes the forward: ``transformers`` (the model's own),
            ``ggml`` (models/ggml_backend.py), ``int8`` (models/compiled_backend.py),
            ``native`` (models/native/), ``cuda-graphs`` (models/cuda_graph_backend.py).
        weights: the weight format: for ``ggml`` the llama-quantize type a GGUF is converted to
            (None: the file's own weights), for ``native`` the format of its C forward, None for
            the model's own weights.
        page_words: what its forward computes in, for the app's page
            (``interfaces/ui_state.BACKEND_WORDS``); None: the page says the dtype instead.
        report_words: the weights for ``costs``' report (``services/costs.format_report``),
            ``{dtype}`` standing for the dtype the target was loaded in.
        probe_rank: its place in the order ``auto`` probes candidates in
            (``services/backend_rules.PROBE_ORDER``, 0 first); None: never a candidate of ``auto``.
    """

    family: str
    weights: str | None
    page_words: str | None
    report_words: str
    probe_rank: int | None


#: The one table of target backends: name -> :class:`BackendFacts`. Kept here, importing no
#: torch, so the flag checks stay fast; models/backends.py holds the table of probes and
#: factories keyed by these names. The probe ranks put the fastest measured so far first
#: (docs/cpu-backends.md), so the best probe is known early and slow candidates are ruled out
#: after one short forward; ggml-bf16 is left out of ``auto`` (``models.backends.BF16_NOT_AUTO``).
TARGET_BACKENDS: dict[str, BackendFacts] = {
    "transformers": BackendFacts("transformers", None, None, "{dtype}", 4),
    "ggml": BackendFacts("ggml", None, "llama.cpp's kernels over the GGUF's quantised weights",
                         "the GGUF file's own weights", 3),
    "ggml-bf16": BackendFacts("ggml", "BF16", "llama.cpp's kernels over BF16 weights",
                              "BF16 weights", None),
    "int8": BackendFacts("int8", "int8", "int8 weights in torch", "int8 weights (from {dtype})", 5),
    "native": BackendFacts("native", "bf16", "BF16 weights in our C forward",
                           "BF16 weights (from {dtype})", 1),
    "native-int8": BackendFacts("native", "int8", "int8 weights in our C forward",
                                "int8 weights, per-row scales (from {dtype})", 2),
    "native-w8a8": BackendFacts("native", "w8a8",
                                "int8 weights and int8 activations in our C forward",
                                "int8 weights, per-row scales (from {dtype}), int8 activations", 0),
    "cuda-graphs": BackendFacts("cuda-graphs", None, "CUDA graphs over a static KV cache",
                                "{dtype} weights, one CUDA graph per width", None),
}
#: the names ``--backend`` takes (costs, run, compare, bench, app.py) and ``with_backend`` accepts
BACKENDS = ("auto", *TARGET_BACKENDS)


def backend_family(name: str) -> str | None:
    """The family of backend ``name`` (:data:`TARGET_BACKENDS`); None for ``auto`` or an unknown name."""
    entry = TARGET_BACKENDS.get(name)
    return entry.family if entry else None


def family_backends(family: str) -> dict[str, str | None]:
    """The backends of ``family``: name -> weight format, in :data:`TARGET_BACKENDS`' order."""
    return {name: facts.weights for name, facts in TARGET_BACKENDS.items()
            if facts.family == family}
