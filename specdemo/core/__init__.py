"""Core: the decode loop, KV cache and rollback, sampling and verification, statistics,
draft-length policies, the drafter protocol and the drafter families. Imports no other layer."""

#: the target backends ``--backend`` takes (costs, run, compare, bench, app.py) and ``with_backend``
#: accepts; here, importing no torch, so the flag checks stay fast (models/ggml_backend.py,
#: models/compiled_backend.py, models/native_backend.py implement them)
BACKENDS = ("auto", "transformers", "ggml", "ggml-bf16", "int8", "native", "native-int8", "native-w8a8")
