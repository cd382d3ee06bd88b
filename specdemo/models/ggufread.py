"""Faster GGUF loading through transformers: parse each file once per conversion.

transformers 5.24 reads a GGUF file with ``gguf.GGUFReader`` once for the tokenizer, once for the
config and once more for the weights, and builds ``gguf.get_tensor_name_map`` afresh for every
module of the model. Measured on a 2-core CPU for SmolLM2-135M (Q4_1, 98 MB): each parse takes
~10 s (the reader makes a numpy view per vocabulary entry) and the name maps ~15 s in all, of a
~47 s conversion. Inside :func:`shared_reading` the reader is built once per file and the name
map once per (architecture, layers); the tensors, config and tokenizer come out identical (the
reader is read-only; checked by ``tests/test_startup.py``).

:func:`block_count` reads a model's layer count from the metadata at the head of the file
alone (milliseconds), where ``GGUFReader`` would parse the whole file first. :func:`check_whole`
reads the header, metadata and tensor list (half a second for a 100 MB model) and refuses a file
cut short or damaged in words, before ``GGUFReader`` or llama.cpp would fail in theirs
("unpack_from requires a buffer of at least 101 bytes").
"""

from __future__ import annotations

import contextlib
import functools
import os
import struct
import threading
from pathlib import Path
from typing import BinaryIO, Iterator

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


# GGUF metadata value types (ggml's gguf.md, "GGUF file structure"): fixed sizes in bytes
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_INTS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 10: "<Q", 11: "<q"}
_STRING, _ARRAY = 8, 9


class _EndsEarly(ValueError):
    """The GGUF's header, metadata or tensor list goes on past the end of the file."""


class _Parts:
    """The files of a GGUF split into parts, read as one stream (only forward)."""

    def __init__(self, paths: list[Path]) -> None:
        self._paths, self._file = list(paths), None
        self.size = sum(Path(p).stat().st_size for p in self._paths)  # bytes in all
        self.pos = 0  # bytes read so far

    def read(self, n: int) -> bytes:
        if n > self.size - self.pos:  # checked first: a damaged length never reads the file whole
            raise _EndsEarly("the GGUF file ends inside its metadata")
        self.pos += n
        out = b""
        while len(out) < n:
            if self._file is None:
                if not self._paths:  # a part shrank while it was read
                    raise _EndsEarly("the GGUF file ends inside its metadata")
                self._file = open(self._paths.pop(0), "rb")
            chunk = self._file.read(n - len(out))
            if not chunk:
                self._file.close()
                self._file = None
            out += chunk
        return out

    def close(self) -> None:
        if self._file is not None:
            self._file.close()


def _unpack(f: BinaryIO | _Parts, fmt: str):
    return struct.unpack(fmt, f.read(struct.calcsize(fmt)))[0]


def _value(f: BinaryIO | _Parts, kind: int):
    """One metadata value: an int or str, or None for a value skipped (floats, bools, arrays)."""
    if kind == _STRING:
        return f.read(_unpack(f, "<Q")).decode("utf-8", "replace")
    if kind == _ARRAY:
        item, n = _unpack(f, "<I"), _unpack(f, "<Q")
        if item in _SIZES:
            f.read(_SIZES[item] * n)
        else:
            for _ in range(n):
                _value(f, item)
        return None
    if kind in _INTS:
        return _unpack(f, _INTS[kind])
    if kind in _SIZES:
        f.read(_SIZES[kind])
        return None
    raise ValueError(f"unknown GGUF metadata type {kind}")


class GGUFDamaged(ValueError):
    """A GGUF file cut short or damaged (the message says how, in words that follow its name)."""


def _tensor_bytes(dims: tuple[int, ...], kind: int) -> int:
    """Bytes of a tensor of ``dims`` stored as ggml type ``kind`` (blocks of the gguf package's
    ``GGML_QUANT_SIZES``)."""
    from gguf.constants import GGML_QUANT_SIZES
    if kind not in GGML_QUANT_SIZES:
        raise ValueError(f"a tensor has the unknown type {kind}")
    block, size = GGML_QUANT_SIZES[kind]
    n = 1
    for d in dims:
        n *= d
    return n // block * size


def check_whole(paths: list[Path]) -> None:
    """Refuse a GGUF file (one file, or its parts in order) that is cut short or damaged, reading
    its header, metadata and tensor list only (ggml's gguf.md, "GGUF file structure"): every
    tensor must lie inside the file, where its offset, shape and type put it.

    Raises:
        GGUFDamaged: not a GGUF file, an unknown version, metadata or tensor list that ends
            early or holds a value of no known type, or tensor data beyond the file's end.
        OSError: a file cannot be read.
    """
    f = _Parts(paths)
    try:
        if f.size < 4 or f.read(4) != b"GGUF":  # (an empty file too)
            raise GGUFDamaged("is not a GGUF file (it does not start with the bytes GGUF)")
        version, n_tensors, n_keys = struct.unpack("<IQQ", f.read(20))
        if version not in (2, 3):
            raise GGUFDamaged(f"is damaged or of another format (it declares GGUF version "
                              f"{version}; versions 2 and 3 exist)")
        alignment = 32  # GGUF_DEFAULT_ALIGNMENT
        for _ in range(n_keys):
            key = f.read(_unpack(f, "<Q")).decode("utf-8", "replace")
            value = _value(f, _unpack(f, "<I"))
            if key == "general.alignment" and isinstance(value, int) and value > 0:
                alignment = value
        tensors = []
        for _ in range(n_tensors):
            f.read(_unpack(f, "<Q"))  # the name
            n_dims = _unpack(f, "<I")
            if n_dims > 4:  # GGML_MAX_DIMS
                raise ValueError(f"a tensor declares {n_dims} dimensions")
            dims = struct.unpack(f"<{n_dims}Q", f.read(8 * n_dims))
            kind, offset = _unpack(f, "<I"), _unpack(f, "<Q")
            tensors.append(offset + _tensor_bytes(dims, kind))
    except _EndsEarly:
        raise GGUFDamaged("is cut short or damaged (it ends inside its header: metadata or "
                          "tensor list)") from None
    except GGUFDamaged:
        raise
    except ValueError as exc:  # a value or tensor of no known type, too many dimensions
        raise GGUFDamaged(f"is damaged ({exc})") from None
    finally:
        f.close()
    if not tensors:  # no tensor data to hold
        return
    start = -(-f.pos // alignment) * alignment  # the tensor data begins at the next alignment
    need = start + max(tensors)
    if need > f.size:
        raise GGUFDamaged(f"is cut short (its tensors need {need:,} bytes, it has "
                          f"{f.size:,})")


def block_count(paths: list[Path]) -> int:
    """The number of decoder layers (``<architecture>.block_count``) of the GGUF file made of
    ``paths`` (one file, or its parts in order), read from its metadata only.

    Raises:
        ValueError: not a GGUF file, or no block count before the metadata ends.
        OSError: a file cannot be read.
    """
    count = _architecture_int(paths, "block_count")
    if count is None:
        raise ValueError(f"{paths[0]} has no <architecture>.block_count in its metadata")
    return count


def context_length(paths: list[Path]) -> int | None:
    """The context the model was trained for (``<architecture>.context_length``, tokens) of the
    GGUF file made of ``paths``, from its metadata only; None when the metadata has none.

    Raises:
        ValueError: not a GGUF file.
        OSError: a file cannot be read.
    """
    return _architecture_int(paths, "context_length")


def _architecture_int(paths: list[Path], field: str) -> int | None:
    """``<architecture>.<field>`` of the GGUF file made of ``paths`` when it is an integer,
    read key by key from the metadata (stops at the key), else None."""
    f = _Parts(paths)
    try:
        if f.read(4) != b"GGUF":
            raise ValueError(f"{paths[0]} is not a GGUF file")
        _version, _tensors, n_keys = struct.unpack("<IQQ", f.read(20))
        values: dict[str, object] = {}
        for _ in range(n_keys):
            key = f.read(_unpack(f, "<Q")).decode("utf-8", "replace")
            values[key] = _value(f, _unpack(f, "<I"))
            arch = values.get("general.architecture")
            if isinstance(values.get(f"{arch}.{field}"), int):
                return int(values[f"{arch}.{field}"])
    finally:
        f.close()
    return None
