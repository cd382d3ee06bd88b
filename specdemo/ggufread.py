"""Faster GGUF loading through transformers: parse each file once per conversion.

transformers 5.24 reads a GGUF file with ``gguf.GGUFReader`` once for the tokenizer, once for the
config and once more for the weights, and builds ``gguf.get_tensor_name_map`` afresh for every
module of the model. Measured on a 2-core CPU for SmolLM2-135M (Q4_1, 98 MB): each parse takes
~10 s (the reader makes a numpy view per vocabulary entry) and the name maps ~15 s in all, of a
~47 s conversion. Inside :func:`shared_reading` the reader is built once per file and the name
map once per (architecture, layers); the tensors, config and tokenizer come out identical (the
reader is read-only; checked by ``tests/test_startup.py``).
"""

from __future__ import annotations

import contextlib
import functools
import os
import threading
from typing import Iterator

_LOCK = threading.Lock()  # one patch at a time: the patched names are module globals


@contextlib.contextmanager
def shared_reading() -> Iterator[None]:
    """Within the block, ``gguf.GGUFReader(path)`` returns one reader per path and
    ``gguf.get_tensor_name_map`` is memoised; both are restored on exit (also on error)."""
    import gguf
    with _LOCK:
        readers: dict[tuple[str, str], object] = {}
        make_reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map

        def reader(path, mode: str = "r"):
            key = (os.fspath(path), mode)
            if key not in readers:
                readers[key] = make_reader(path, mode)
            return readers[key]

        gguf.GGUFReader = reader
        gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
        try:
            yield
        finally:
            gguf.GGUFReader, gguf.get_tensor_name_map = make_reader, name_map
