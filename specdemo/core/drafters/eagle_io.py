"""EAGLE-3 head folders: vLLM speculators layout (read and written) and SafeAILab/SGLang layout
(read).

* speculators (``vllm serve DIR`` starts it): ``config.json`` with ``speculators_model_type:
  "eagle3"``, ``transformer_layer_config``, ``draft_vocab_size``, ``norm_before_residual``,
  ``target_hidden_size``, ``eagle_aux_hidden_state_layer_ids`` and ``speculators_config``
  (algorithm, proposal methods, ``verifier``); weights ``fc.*``, ``layers.0.*``, ``norm.*``,
  ``lm_head.*``, ``d2t``, ``t2d`` (``embed_tokens.weight`` optional: vLLM shares the target's).
* SafeAILab EAGLE / SGLang SpecForge: a flat Llama ``config.json`` with ``architectures:
  ["LlamaForCausalLMEagle3"]``, ``draft_vocab_size`` and optionally
  ``eagle_config.eagle_aux_hidden_state_layer_ids``; weights ``midlayer.*`` for ``layers.0.*``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from transformers import LlamaConfig

from . import folders
from .eagle import Eagle3Head
from .features import eagle3_default_layers

SPECULATORS_VERSION = "0.3.0"
WEIGHTS = "model.safetensors"
_LAYER_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
               "max_position_embeddings", "attention_bias", "mlp_bias", "hidden_act")


class Eagle3FormatError(folders.DrafterFolderError):
    """A folder that claims to be an EAGLE-3 head but cannot be read as one (reason inside)."""


#: top-level settings of both layouts and their types (folders.check_fields)
_TOP_FIELDS = {"draft_vocab_size": folders.POS_INT, "target_hidden_size": folders.POS_INT,
               "norm_before_residual": folders.BOOL, "norm_before_fc": folders.BOOL,
               "fc_norm": folders.BOOL, "norm_output": folders.BOOL,
               "eagle_aux_hidden_state_layer_ids": folders.INT_LIST}
#: speculators options this loader runs (anything else a reference reads is refused by name)
_RUN_OPTIONS = ("norm_before_residual", "norm_before_fc", "fc_norm", "norm_output")


def read_config(folder: Path) -> dict:
    """config.json of a folder.

    Raises:
        folders.DrafterFolderError: missing, unreadable, not JSON or not a JSON object.
    """
    return folders.read_config(folder)


def layout(config: dict) -> str | None:
    """"speculators", "safeailab" or None (not an EAGLE-3 head)."""
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if any("eagle3" in str(a).lower() for a in config.get("architectures") or ()):
        return "safeailab"
    return None


def _layer_config(config: dict, kind: str) -> dict:
    if kind == "speculators":
        layer = dict(config.get("transformer_layer_config") or {})
    else:
        layer = {k: v for k, v in config.items()
                 if k not in ("architectures", "eagle_config", "draft_vocab_size", "torch_dtype")}
    layer.setdefault("model_type", "llama")
    if "hidden_size" not in layer or "vocab_size" not in layer:
        raise Eagle3FormatError("the EAGLE-3 config lacks hidden_size or vocab_size")
    return layer


def _option_problem(config: dict, layer: dict, path: Path) -> str | None:
    """The first setting a reference implementation reads that this loader does not run."""
    if layer.get("model_type") != "llama":
        return (f"{path}: the draft layer is a {layer.get('model_type')!r} layer; this loader runs "
                "Llama-style EAGLE-3 layers only")
    kinds = set(layer.get("layer_types") or ["full_attention"])
    if kinds != {"full_attention"}:
        return (f"{path}: layer_types {sorted(kinds)} asks for sliding-window draft attention, "
                "which this loader does not run")
    if config.get("norm_before_fc") and config.get("fc_norm"):
        return f"{path}: norm_before_fc and fc_norm are both set (speculators refuses that too)"
    return None


def feature_layer_ids(config: dict) -> list[int] | None:
    """The configured target layer ids (inputs of layers), or None when the folder leaves them to
    the default [2, L//2, L-3]."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = ((config.get("eagle_config") or {}) if isinstance(config.get("eagle_config"), dict)
               else {}).get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else [int(i) for i in ids]


def verifier_of(config: dict) -> dict:
    """{"name_or_path", "architectures"} of the target the head was trained for ({} if unknown)."""
    return dict((config.get("speculators_config") or {}).get("verifier") or {})


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    """folders.read_weights (kept for callers of this name)."""
    return folders.read_weights(folder)


def _draft_layers(state: dict) -> int:
    """How many draft decoder layers the weights hold (``layers.N.*``)."""
    found = {int(k.split(".")[1]) for k in state
             if k.startswith("layers.") and k.split(".")[1].isdigit()}
    return max(found) + 1 if found else 0


def _checked_config(folder: Path) -> tuple[dict, str, dict]:
    """(the config of the EAGLE-3 head in ``folder``, its layout, the draft layer's settings),
    every field checked.

    Raises:
        folders.DrafterFolderError: as :func:`load_head`.
    """
    path = folder / "config.json"
    config = read_config(folder)
    kind = layout(config)
    if kind is None:
        raise Eagle3FormatError(f"{folder} is not an EAGLE-3 head (no speculators_model_type "
                                "'eagle3' nor an Eagle3 architecture in config.json)")
    folders.check_fields(config, _TOP_FIELDS, path)
    if kind == "speculators":
        folders.check_fields(config.get("transformer_layer_config") or {}, folders.LAYER_FIELDS,
                             path, "transformer_layer_config")
    else:
        folders.check_fields(config, folders.LAYER_FIELDS, path)
        if config.get("eagle_config") is not None:
            folders.check_fields(config["eagle_config"], _TOP_FIELDS, path, "eagle_config")
    raw_layer = _layer_config(config, kind)
    problem = _option_problem(config, raw_layer, path)
    if problem:
        raise Eagle3FormatError(problem)
    return config, kind, raw_layer


def _load_weights(head: Eagle3Head, state: dict, folder: Path) -> list[str]:
    """Load ``state`` into ``head``; returns the optional tensors it lacked (``d2t``/``t2d``,
    set to the identity map / the full vocabulary: checked against the target later).

    Raises:
        Eagle3FormatError: weights the head would not use, that do not fit it, or missing.
    """
    missing = [name for name in ("d2t", "t2d") if name not in state]
    expected = head.state_dict()
    for name in missing:
        state[name] = expected[name]
    unused = [k for k in state if k not in expected]
    if unused:
        raise Eagle3FormatError(folders.unused_weights_problem(folder, unused, "the EAGLE-3 head"))
    try:
        result = head.load_state_dict({k: v for k, v in state.items() if k in expected},
                                      strict=False)
    except RuntimeError as exc:
        detail = [line.strip() for line in str(exc).splitlines()[1:2]]
        raise Eagle3FormatError(f"{folder}: weights do not fit the config "
                                f"({'; '.join(detail) or folders._first_line(exc)})") from None
    absent = [k for k in result.missing_keys if not k.startswith("rotary_emb")]
    if absent:
        raise Eagle3FormatError(f"{folder}: weights missing: {', '.join(absent[:4])}")
    return missing


def load_head(folder: Path, n_target_layers: int | None = None,
              dtype: torch.dtype = torch.float32) -> tuple[Eagle3Head, dict]:
    """Read an EAGLE-3 head in either layout.

    Args:
        folder: the head's folder.
        n_target_layers: L of the target, for the default feature layers when the folder names
            none (SafeAILab checkpoints); required then.
        dtype: the dtype to compute in.
    Returns:
        (head in eval mode, {"layout", "missing": [names of absent optional tensors],
        "config": the raw config}).
    Raises:
        folders.DrafterFolderError (Eagle3FormatError among them): not an EAGLE-3 folder, a
            config.json or weight file that cannot be read or holds values of the wrong type,
            non-finite weights, an option this loader does not run (named), weights missing,
            mis-shaped or that the head would not use (named).
    """
    folder = Path(folder)
    path = folder / "config.json"
    config, kind, raw_layer = _checked_config(folder)
    ids = feature_layer_ids(config)
    if ids is None:
        if n_target_layers is None:
            raise Eagle3FormatError(f"{folder} names no feature layers; the target's depth is needed")
        ids = list(eagle3_default_layers(n_target_layers))
    state = folders.read_weights(folder)
    if kind == "safeailab":
        state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
    n_layers = _draft_layers(state)
    if n_layers > 1:
        raise Eagle3FormatError(f"{folder}: the head has {n_layers} draft layers (layers.0 to "
                                f"layers.{n_layers - 1}); this loader runs EAGLE-3 heads of one "
                                "draft layer")
    said = raw_layer.get("num_hidden_layers")
    if kind == "speculators" and said is not None and said != max(n_layers, 1):
        raise Eagle3FormatError(f"{path}: transformer_layer_config.num_hidden_layers is {said} but "
                                f"the weights hold {n_layers} draft layer(s); vLLM's speculators "
                                "would build the missing layers at random (a folder saved by an "
                                "older specdemo: set it to 1)")
    raw_layer["num_hidden_layers"] = 1
    try:
        layer = LlamaConfig(**raw_layer)
    except (TypeError, ValueError) as exc:
        raise Eagle3FormatError(f"{path}: the draft layer's settings are not valid "
                                f"({folders._first_line(exc)})") from None
    draft_vocab = config.get("draft_vocab_size")
    if draft_vocab is None:
        if "lm_head.weight" not in state:
            raise Eagle3FormatError(f"{folder}: the weights have no lm_head.weight")
        draft_vocab = state["lm_head.weight"].shape[0]
    try:
        head = Eagle3Head(layer, int(draft_vocab), tuple(ids),
                          target_hidden_size=config.get("target_hidden_size"),
                          norm_before_residual=bool(config.get("norm_before_residual", False)),
                          verifier=verifier_of(config),
                          own_embeddings="embed_tokens.weight" in state,
                          norm_before_fc=bool(config.get("norm_before_fc", False)),
                          fc_norm=bool(config.get("fc_norm", False)),
                          norm_output=bool(config.get("norm_output", False)))
    except (TypeError, ValueError, RuntimeError, KeyError, AttributeError) as exc:  # e.g. heads
        raise Eagle3FormatError(f"{path}: the settings do not make a model "
                                f"({folders._first_line(exc)})") from None
    missing = _load_weights(head, state, folder)
    head.to(dtype).eval()
    head.d2t.data = head.d2t.data.long()
    head.t2d.data = head.t2d.data.bool()
    return head, {"layout": kind, "missing": missing, "config": config}


def save_head(head: Eagle3Head, folder: Path, dtype: torch.dtype = torch.bfloat16,
              speculative_tokens: int = 4, extra: dict | None = None) -> Path:
    """Write ``head`` in the speculators layout (``vllm serve DIR`` reads it).

    Args:
        dtype: dtype of the saved floating-point weights (bfloat16 halves the folder).
        speculative_tokens: the greedy proposal's draft length recorded in the config.
        extra: more top-level config keys (e.g. training provenance).
    Returns:
        The folder.
    """
    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    layer = {k: v for k, v in head.config.to_dict().items()
             if k in _LAYER_KEYS or k in ("hidden_size", "vocab_size", "model_type")}
    layer["num_hidden_layers"] = len(head.layers)  # the draft layers it has (vLLM builds these)
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": head.draft_vocab_size,
        "norm_before_residual": head.norm_before_residual,
        "norm_before_fc": head.input_norm is not None,
        "fc_norm": head.fc_norm is not None,
        "norm_output": head.norm_output,
        "target_hidden_size": (None if head.target_hidden_size == head.config.hidden_size
                               else head.target_hidden_size),
        "eagle_aux_hidden_state_layer_ids": list(head.feature_layers),
        "speculators_config": {
            "algorithm": "eagle3",
            "default_proposal_method": "greedy",
            "proposal_methods": [{"proposal_type": "greedy",
                                  "speculative_tokens": speculative_tokens,
                                  "verifier_accept_k": 1, "accept_tolerance": 0.0}],
            "verifier": head.verifier,
        },
        "torch_dtype": str(dtype).removeprefix("torch."),
        **(extra or {}),
    }
    state = {k: (v.to(dtype) if v.is_floating_point() else v).contiguous()
             for k, v in head.state_dict().items() if not k.startswith("rotary_emb")}
    save_file(state, str(folder / WEIGHTS), metadata={"format": "pt"})
    os.chmod(folder / WEIGHTS, 0o644)  # safetensors writes through a private temporary file (0600)
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
