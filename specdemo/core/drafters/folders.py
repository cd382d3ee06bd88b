"""Reading a learned-drafter folder safely: ``config.json`` and weight files that are missing, cut
short, of the wrong kind or hold values of the wrong type are refused with one sentence naming the
file and what is wrong with it, before any module is built (so no traceback reaches a user).

Every family's loader (EAGLE-3, DFlash, DSpark, Gemma 4 assistants) and ``check`` for draft-model
folders read through here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

#: field kinds for :func:`check_fields`
INT, POS_INT, FLOAT, BOOL, STR, INT_LIST = "int", "pos_int", "float", "bool", "str", "int_list"
_WORDS = {INT: "a whole number", POS_INT: "a whole number of at least 1", FLOAT: "a number",
          BOOL: "true or false", STR: "text", INT_LIST: "a list of whole numbers"}
#: the decoder-layer settings every family's config shares (Llama / Qwen3 / Gemma style)
LAYER_FIELDS = {"hidden_size": POS_INT, "intermediate_size": POS_INT, "vocab_size": POS_INT,
                "num_hidden_layers": POS_INT, "num_attention_heads": POS_INT,
                "num_key_value_heads": POS_INT, "head_dim": POS_INT,
                "max_position_embeddings": POS_INT, "rms_norm_eps": FLOAT, "hidden_act": STR,
                "attention_bias": BOOL, "mlp_bias": BOOL, "rope_theta": FLOAT,
                "sliding_window": POS_INT}


def verifier_warning(what: str, verifier, target) -> str | None:
    """One sentence when the verifier a drafter's config records names another model than
    ``target`` (a ``models.LoadedModel``); None when it records none, or names the target's
    spec, its ``_name_or_path``, another name it is known by (its ``aliases``: a built-in
    target's hub id) or a folder of the same name (a local target is recorded by its folder's
    name).

    Args:
        what: the drafter in words, e.g. "the head", "the DSpark drafter".
    """
    if not verifier or not isinstance(verifier, str):
        return None
    own = str(getattr(target.model.config, "_name_or_path", "") or "")
    names = {target.spec, own, *getattr(target, "aliases", ())} - {""}
    if verifier in names or Path(verifier).name in {Path(n).name for n in names}:
        return None
    return (f"{what} was trained for {verifier}, not {target.spec}; expect low acceptance unless "
            "they are the same model")


class DrafterFolderError(ValueError):
    """A learned-drafter folder that cannot be read; the message names the file and the fault."""


def read_config(folder: Path) -> dict:
    """The settings in ``folder/config.json``.

    Raises:
        DrafterFolderError: the file is missing, unreadable, not JSON or not a JSON object.
    """
    path = Path(folder) / "config.json"
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DrafterFolderError(f"{path} is missing: a drafter folder needs its "
                                 "config.json") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise DrafterFolderError(f"{path} cannot be read ({_first_line(exc)})") from None
    try:
        config = json.loads(text)
    except ValueError as exc:
        raise DrafterFolderError(f"{path} is not valid JSON ({exc})") from None
    if not isinstance(config, dict):
        raise DrafterFolderError(f"{path} holds a JSON {type(config).__name__}, not an object of "
                                 "settings")
    return config


def _fits(value, kind: str) -> bool:
    if kind == BOOL:
        return isinstance(value, bool)
    if kind == STR:
        return isinstance(value, str)
    if kind == FLOAT:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind == INT_LIST:
        return isinstance(value, list) and all(_fits(v, INT) for v in value)
    ok = isinstance(value, int) and not isinstance(value, bool)
    return ok and (kind == INT or value >= 1)


def check_fields(config: dict, fields: dict[str, str], path: Path, section: str = "") -> None:
    """Refuse a config whose settings have the wrong type (``"hidden_size": "576"``).

    Args:
        config: the settings (a dict); keys absent or null are left to the loader's defaults.
        fields: key -> kind (:data:`INT`, :data:`POS_INT`, ...).
        path: the file, named in the message.
        section: the key of a nested object (e.g. ``transformer_layer_config``), named in it.
    Raises:
        DrafterFolderError: the first setting of the wrong type.
    """
    if not isinstance(config, dict):
        raise DrafterFolderError(f"{path}: \"{section}\" must be an object of settings, got "
                                 f"{config!r}")
    where = f"{section}." if section else ""
    for key, kind in fields.items():
        value = config.get(key)
        if value is not None and not _fits(value, kind):
            raise DrafterFolderError(f"{path}: \"{where}{key}\" must be {_WORDS[kind]}, got "
                                     f"{json.dumps(value)}")


def weight_files(folder: Path) -> list[Path]:
    """The folder's ``*.safetensors`` files, else its ``pytorch_model*.bin`` files.

    Raises:
        DrafterFolderError: it has neither.
    """
    folder = Path(folder)
    files = sorted(folder.glob("*.safetensors")) or sorted(folder.glob("pytorch_model*.bin"))
    if not files:
        raise DrafterFolderError(f"{folder} has no weights (model.safetensors or "
                                 "pytorch_model.bin)")
    return files


def check_weight_files(folder: Path) -> dict[str, tuple[int, ...]]:
    """Open each weight file's header (cheap: no tensor is read), so that a file cut short or not
    a weight file at all is named before a loader fails on it.

    Returns:
        the shape of every tensor in the folder's safetensors files, name -> shape (what the
        headers say; empty for ``.bin`` weights, whose shapes need the tensors read).
    Raises:
        DrafterFolderError: no weights, or a file that cannot be read.
    """
    from safetensors import safe_open
    shapes: dict[str, tuple[int, ...]] = {}
    for path in weight_files(folder):
        if path.suffix != ".safetensors":
            continue
        try:
            with safe_open(str(path), "pt") as handle:
                shapes.update({name: tuple(handle.get_slice(name).get_shape())
                               for name in handle.keys()})
        except Exception as exc:  # SafetensorError, OSError: the file is damaged
            raise DrafterFolderError(_damaged(path, exc)) from None
    return shapes


def read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """Every tensor in the folder's weight files, checked for non-finite values.

    Raises:
        DrafterFolderError: no weights, a file cut short or not a weight file, or a floating
            tensor holding NaN or infinity (a drafter with one can never draft usefully).
    """
    from safetensors.torch import load_file
    state: dict[str, torch.Tensor] = {}
    for path in weight_files(folder):
        try:
            if path.suffix == ".safetensors":
                part = load_file(str(path))
            else:
                part = torch.load(path, map_location="cpu", weights_only=True)
        except Exception as exc:  # SafetensorError, pickle errors, OSError
            raise DrafterFolderError(_damaged(path, exc)) from None
        if not isinstance(part, dict):
            raise DrafterFolderError(f"{path} holds no named tensors")
        bad = nonfinite_names(part)
        if bad:
            raise DrafterFolderError(f"{path}: {_listed(bad)} hold(s) NaN or infinite values; "
                                     "a drafter with such weights cannot draft (the file is "
                                     "damaged or training diverged)")
        state.update(part)
    return state


def nonfinite_names(state: dict[str, torch.Tensor]) -> list[str]:
    """Names of the floating-point tensors in ``state`` with a NaN or infinite value."""
    return [name for name, t in state.items()
            if isinstance(t, torch.Tensor) and t.is_floating_point()
            and not bool(torch.isfinite(t).all())]


def unused_weights_problem(path: Path, names: list[str], what: str) -> str:
    """The sentence for weight tensors a model would not use (never dropped in silence)."""
    return (f"{path}: {_listed(sorted(names))} would not be used by {what}: the folder was saved "
            "with an option or a layout this loader does not run")


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:4])
    return shown + (f" and {len(names) - 4} more" if len(names) > 4 else "")


def _damaged(path: Path, exc: BaseException) -> str:
    return (f"{path} cannot be read: it is cut short, damaged or not a weight file "
            f"({_first_line(exc)})")


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]
