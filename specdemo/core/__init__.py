"""Core: the decode loop, KV cache and rollback, sampling and verification, statistics,
draft-length policies, the drafter protocol and the drafter families. Imports no other layer."""

#: The one list of target backends: name -> (family, weight format). The family names the module
#: that computes the forward (``transformers``: the model's own; ``ggml``: models/ggml_backend.py,
#: the format being the llama-quantize type a GGUF is converted to, None for the file's own
#: weights; ``int8``: models/compiled_backend.py; ``native``: models/native_backend.py, the
#: format of its C forward). Kept here, importing no torch, so the flag checks stay fast;
#: models/backends.py holds the table of probes and factories keyed by these names.
TARGET_BACKENDS: dict[str, tuple[str, str | None]] = {
    "transformers": ("transformers", None),
    "ggml": ("ggml", None),
    "ggml-bf16": ("ggml", "BF16"),
    "int8": ("int8", "int8"),
    "native": ("native", "bf16"),
    "native-int8": ("native", "int8"),
    "native-w8a8": ("native", "w8a8"),
}
#: the names ``--backend`` takes (costs, run, compare, bench, app.py) and ``with_backend`` accepts
BACKENDS = ("auto", *TARGET_BACKENDS)


def backend_family(name: str) -> str | None:
    """The family of backend ``name`` (:data:`TARGET_BACKENDS`); None for ``auto`` or an unknown name."""
    entry = TARGET_BACKENDS.get(name)
    return entry[0] if entry else None


def family_backends(family: str) -> dict[str, str | None]:
    """The backends of ``family``: name -> weight format, in :data:`TARGET_BACKENDS`' order."""
    return {name: weights for name, (fam, weights) in TARGET_BACKENDS.items() if fam == family}
