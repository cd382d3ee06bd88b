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
from pathlib import Path

import torch
from transformers import LlamaConfig

from .eagle import Eagle3Head

SPECULATORS_VERSION = "0.3.0"
WEIGHTS = "model.safetensors"
_LAYER_KEYS = ("num_attention_heads", "num_key_value_heads", "head_dim", "intermediate_size",
               "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
               "max_position_embeddings", "attention_bias", "mlp_bias", "hidden_act")


class Eagle3FormatError(ValueError):
    """A folder that claims to be an EAGLE-3 head but cannot be read as one (reason inside)."""


def read_config(folder: Path) -> dict:
    """config.json of a folder.

    Raises:
        Eagle3FormatError: missing or not JSON.
    """
    try:
        return json.loads((Path(folder) / "config.json").read_text())
    except FileNotFoundError:
        raise Eagle3FormatError(f"{folder} has no config.json") from None
    except ValueError as exc:
        raise Eagle3FormatError(f"{folder}/config.json is not valid JSON ({exc})") from None


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
    layer["num_hidden_layers"] = 1
    if "hidden_size" not in layer or "vocab_size" not in layer:
        raise Eagle3FormatError("the EAGLE-3 config lacks hidden_size or vocab_size")
    return layer


def feature_layer_ids(config: dict) -> list[int] | None:
    """The configured target layer ids (inputs of layers), or None when the folder leaves them to
    the default [2, L//2, L-3]."""
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        ids = (config.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    return None if ids is None else [int(i) for i in ids]


def verifier_of(config: dict) -> dict:
    """{"name_or_path", "architectures"} of the target the head was trained for ({} if unknown)."""
    return dict((config.get("speculators_config") or {}).get("verifier") or {})


def _read_weights(folder: Path) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file
    files = sorted(folder.glob("*.safetensors"))
    if files:
        state = {}
        for f in files:
            state.update(load_file(str(f)))
        return state
    bins = sorted(folder.glob("pytorch_model*.bin"))
    if bins:
        state = {}
        for f in bins:
            state.update(torch.load(f, map_location="cpu", weights_only=True))
        return state
    raise Eagle3FormatError(f"{folder} has no weights (*.safetensors or pytorch_model.bin)")


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
        Eagle3FormatError: not an EAGLE-3 folder, or weights missing / mis-shaped.
    """
    from .features import eagle3_default_layers
    folder = Path(folder)
    config = read_config(folder)
    kind = layout(config)
    if kind is None:
        raise Eagle3FormatError(f"{folder} is not an EAGLE-3 head (no speculators_model_type "
                                "'eagle3' nor an Eagle3 architecture in config.json)")
    layer = LlamaConfig(**_layer_config(config, kind))
    ids = feature_layer_ids(config)
    if ids is None:
        if n_target_layers is None:
            raise Eagle3FormatError(f"{folder} names no feature layers; the target's depth is needed")
        ids = list(eagle3_default_layers(n_target_layers))
    state = _read_weights(folder)
    if kind == "safeailab":
        state = {k.replace("midlayer.", "layers.0.", 1): v for k, v in state.items()}
    draft_vocab = int(config.get("draft_vocab_size") or state["lm_head.weight"].shape[0])
    head = Eagle3Head(layer, draft_vocab, tuple(ids),
                      target_hidden_size=config.get("target_hidden_size"),
                      norm_before_residual=bool(config.get("norm_before_residual", False)),
                      verifier=verifier_of(config), own_embeddings="embed_tokens.weight" in state)
    missing = [name for name in ("d2t", "t2d") if name not in state]
    expected = head.state_dict()
    for name in missing:
        state[name] = expected[name]  # identity d2t / full t2d: checked against the target later
    state = {k: v for k, v in state.items() if k in expected or k.startswith("layers.0.")}
    try:
        result = head.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        raise Eagle3FormatError(f"{folder}: weights do not fit the config ({str(exc).splitlines()[1:2]})") from None
    absent = [k for k in result.missing_keys if not k.startswith("rotary_emb")]
    if absent or result.unexpected_keys:
        raise Eagle3FormatError(f"{folder}: weights missing {absent[:3]} / unexpected "
                                f"{result.unexpected_keys[:3]}")
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
             if k in _LAYER_KEYS or k in ("hidden_size", "vocab_size", "model_type",
                                          "num_hidden_layers")}
    config = {
        "architectures": ["Eagle3Speculator"],
        "speculators_model_type": "eagle3",
        "speculators_version": SPECULATORS_VERSION,
        "transformer_layer_config": layer,
        "draft_vocab_size": head.draft_vocab_size,
        "norm_before_residual": head.norm_before_residual,
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
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder
