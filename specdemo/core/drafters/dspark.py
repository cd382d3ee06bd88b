"""DSpark: a DFlash block drafter with a sequential low-rank (Markov) head and a confidence head
(DeepSeek's DeepSpec; the layout read here is vLLM's ``speculators`` 0.9.0
``models/dspark``: ``DSparkSpeculatorConfig`` / ``DSparkDraftModel``, also read by llama.cpp's
``convert_hf_to_gguf.py`` for ``--spec-type draft-dspark``).

The backbone is DFlash's (see :mod:`.dflash`): the target's features at the accepted positions
(hidden states ``aux_hidden_state_layer_ids``, projected by ``fc`` and normed by ``hidden_norm``)
give keys/values, a block ``[anchor, mask, ..., mask]`` embedded with the target's own embedding
rows gives the queries, and one bidirectional forward yields the block's hidden states ``h``
(after ``norm``). DSpark then drafts left to right, each position's logits biased by the token
before it (speculators ``MarkovHead``; vLLM's DSpark proposer samples the same way)::

    base_j   = lm_head(h_j)                                   # (Vd,), the target's head when Vd = V
    e_j      = markov_w1[x_{j-1}]                             # (r,), x_0 = the anchor
    logits_j = base_j + markov_w2(e_j)                        # vanilla
             = base_j + markov_w2(sigmoid(gate_proj([h_j, e_j])) * e_j)          # gated
             = base_j + markov_w2(tanh(o_j)), (g, c, o)_j = joint_proj([s, e_j, h_j]),
               s <- g * s + (1 - g) * tanh(c) from s = 0                            # rnn
    c_j      = sigmoid(confidence_head.proj([h_j, e_j]))      # P(draft j accepted | the ones before)

``sample_from_anchor`` (the DSpark default) drafts from every slot of the block, slot j
predicting the token after position p + j (B drafts per block); without it slot 0 is the
anchor only and slots 1..B-1 draft (DFlash's B - 1). Either way ``x_{j-1}`` is the token just
before the one drafted (speculators ``DSparkDraftModel.forward``: ``prev_token_ids``). A config
without the key is read by :func:`samples_from_anchor`.

The confidence head feeds the draft length: a position is drafted only while the prefix
survival ``prod_{i<=j} c_i`` (the predicted probability that it and every draft before it are
accepted, vLLM's DSpark ``surv``) stays at least ``min_survival``; its ``c_j`` are the
proposal's ``confidence``.

Folder: ``config.json`` with ``speculators_model_type: "dspark"``, the draft layers' settings
under ``transformer_layer_config`` (Qwen3-style), and ``block_size``, ``mask_token_id``,
``aux_hidden_state_layer_ids`` (hidden-state indices: id a = ``hidden_states[a]``, the output of
layer a - 1), ``draft_vocab_size``, ``markov_rank``, ``markov_head_type``,
``enable_confidence_head``, ``confidence_head_with_markov``, ``sample_from_anchor``. Weights
``fc``, ``hidden_norm``, ``layers.*``, ``norm``, ``markov_head.markov_w1`` (V, r),
``markov_head.markov_w2`` (Vd, r), ``markov_head.gate_proj`` / ``joint_proj`` (gated / rnn),
``confidence_head.proj`` (1, H [+ r]), and with a draft vocabulary (Vd < V) ``lm_head`` and
``d2t``. The embeddings and, for Vd = V, the output head are the target's.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import DrafterRefused
from ..sampling import SamplingParams
from . import folders
from .base import DraftSampler, LoadedModule, Proposal, fit_vocab, param_bytes
from .dflash import DFlashDrafter
from .features import index_problems, num_layers
from .vocab import map_problems, target_ids

FAMILY = "dspark"
LAYOUT = "speculators"
#: the default of ``min_survival``: draft a position while the predicted probability that it and
#: every draft before it are accepted is at least this (TensorRT-LLM's DSpark default
#: ``confidence_min_predicted_gain``); ``SPECDEMO_DSPARK_MIN_SURVIVAL`` overrides it, 0 drafts
#: whole blocks
DEFAULT_MIN_SURVIVAL = 0.04
MARKOV_KINDS = ("vanilla", "gated", "rnn")

#: DSparkSpeculatorConfig's own settings (speculators 0.9.0) and their types
_FIELDS = {"block_size": folders.POS_INT, "mask_token_id": folders.INT,
           "aux_hidden_state_layer_ids": folders.INT_LIST, "draft_vocab_size": folders.POS_INT,
           "target_hidden_size": folders.POS_INT, "markov_rank": folders.INT,
           "markov_head_type": folders.STR, "enable_confidence_head": folders.BOOL,
           "confidence_head_with_markov": folders.BOOL, "sample_from_anchor": folders.BOOL,
           "sliding_window_non_causal": folders.BOOL, "speculators_model_type": folders.STR}
#: settings that change what is drafted, and the value this loader uses where a config gives none
#: (absent or null; the loaded drafter's warnings say which were filled in)
DEFAULTS = {"block_size": 8, "markov_rank": 256, "markov_head_type": "vanilla",
            "enable_confidence_head": True, "confidence_head_with_markov": True}
#: keys a saved speculators config carries besides :data:`_FIELDS` that change no computation
_METADATA = {"architectures", "auto_map", "dtype", "torch_dtype", "transformers_version",
             "speculators_version", "speculators_config", "tie_word_embeddings", "_name_or_path",
             "transformer_layer_config"}
#: weights that are the target's own (speculators reloads them from the verifier)
_TARGET_OWNED = ("embed_tokens.weight", "verifier_lm_head.weight", "verifier_norm.weight")
#: speculators names -> ours (the backbone is transformers' MuseGlimmerAssistantModel)
_RENAMES = {"fc.weight": "backbone.encoder.fc.weight",
            "hidden_norm.weight": "backbone.encoder.output_norm_enc.weight",
            "norm.weight": "backbone.norm.weight"}


class DSparkFormatError(folders.DrafterFolderError):
    """A folder that claims to be a DSpark drafter but cannot be read as one (reason inside)."""


def detect(config: dict) -> bool:
    """Whether a ``config.json`` declares a DSpark drafter (any layout: the ones this loader does
    not read are refused by :func:`load_dspark`, naming them)."""
    return (config.get("speculators_model_type") == "dspark"
            or any("dspark" in str(a).lower() for a in config.get("architectures") or ()))


class MarkovHead(nn.Module):
    """The sequential head: a logit bias from the previous token, ``markov_w2(f(markov_w1[x]))``
    (speculators ``MarkovHead``; weight names as there).

    Args:
        vocab: V, the target's vocabulary (rows of ``markov_w1``).  draft_vocab: Vd.
        rank: r.  hidden: H.  kind: "vanilla", "gated" or "rnn".
    """

    def __init__(self, vocab: int, draft_vocab: int, rank: int, hidden: int, kind: str) -> None:
        super().__init__()
        self.kind, self.rank = kind, rank
        self.markov_w1 = nn.Embedding(vocab, rank)
        self.markov_w2 = nn.Linear(rank, draft_vocab, bias=False)
        if kind == "gated":
            self.gate_proj = nn.Linear(hidden + rank, rank)
        elif kind == "rnn":
            self.joint_proj = nn.Linear(2 * rank + hidden, 3 * rank)

    def bias(self, emb: torch.Tensor, hidden: torch.Tensor,
             state: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One position's bias.

        Args:
            emb: (..., r) ``markov_w1`` rows of the previous tokens.  hidden: (..., H) the block's
                hidden states there.  state: (..., r) the rnn's state before it (None: zeros).
        Returns:
            ((..., Vd) logit bias, the rnn's state after it, None for the other kinds).
        """
        emb = emb.to(self.markov_w2.weight.dtype)
        if self.kind == "vanilla":
            return self.markov_w2(emb), None
        hidden = hidden.to(emb.dtype)
        if self.kind == "gated":
            gate = torch.sigmoid(self.gate_proj(torch.cat([hidden, emb], dim=-1)))
            return self.markov_w2(gate * emb), None
        if state is None:
            state = emb.new_zeros(emb.shape)
        gate, candidate, out = self.joint_proj(torch.cat([state, emb, hidden], dim=-1)).chunk(3, -1)
        gate = torch.sigmoid(gate)
        state = gate * state + (1.0 - gate) * torch.tanh(candidate)
        return self.markov_w2(torch.tanh(out)), state


class DSparkModel(nn.Module):
    """A DSpark drafter's modules, built from a speculators-layout config (a dict already
    checked by :func:`config_problem`): the DFlash backbone (``backbone``, transformers'
    ``MuseGlimmerAssistantModel``), ``markov_head``, ``confidence_head.proj`` and, with a draft
    vocabulary (Vd < V), ``lm_head`` and ``d2t``.

    Attributes:
        config: the config dict (what :func:`save_dspark` writes back).
        feature_layers: the target hidden-state indices it reads (``aux_hidden_state_layer_ids``).
        sample_from_anchor, with_markov (the confidence head reads ``[h, e]``), vocab_size (V),
        draft_vocab_size (Vd).
    """

    def __init__(self, config: dict) -> None:
        from transformers import MuseGlimmerAssistantModel
        super().__init__()
        config = with_defaults(config)[0]
        layer = config["transformer_layer_config"]
        self.config = config
        self.backbone = MuseGlimmerAssistantModel(_backbone_config(config, layer))
        hidden = int(layer["hidden_size"])
        self.vocab_size = vocab = int(layer["vocab_size"])
        self.draft_vocab_size = draft_vocab = int(config.get("draft_vocab_size") or vocab)
        self.feature_layers = tuple(int(i) for i in config["aux_hidden_state_layer_ids"])
        self.sample_from_anchor = samples_from_anchor(config)
        rank = int(config["markov_rank"])
        self.with_markov = bool(config["confidence_head_with_markov"])
        self.markov_head = (MarkovHead(vocab, draft_vocab, rank, hidden,
                                       config["markov_head_type"])
                            if rank > 0 else None)
        self.confidence_head = None
        if config["enable_confidence_head"]:
            self.confidence_head = nn.Module()
            self.confidence_head.proj = nn.Linear(hidden + (rank if self.with_markov else 0), 1)
        self.lm_head = nn.Linear(hidden, draft_vocab, bias=False) if draft_vocab != vocab else None
        self.register_buffer("d2t", torch.zeros(draft_vocab, dtype=torch.long)
                             if draft_vocab != vocab else None)

    @property
    def block_size(self) -> int:
        return int(self.backbone.config.block_size)

    @property
    def mask_token_id(self) -> int:
        return int(self.backbone.config.mask_token_id)

    def confidence_logit(self, hidden: torch.Tensor, emb: torch.Tensor | None) -> torch.Tensor:
        """(...,) the confidence head's logits for (..., H) hidden states and (..., r) previous-
        token embeddings (speculators ``ConfidenceHead`` over ``[h, e]``, or ``h`` alone)."""
        proj = self.confidence_head.proj
        x = torch.cat([hidden, emb.to(hidden.dtype)], -1) if self.with_markov else hidden
        return proj(x.to(proj.weight.dtype)).squeeze(-1)


def samples_from_anchor(config: dict) -> bool:
    """Whether slot 0 of the block drafts (speculators ``sample_from_anchor``).

    The key when present. Exports that predate it omit it and reserve slot 0 for the anchor
    (``makora-ai/gemma4-26b-a4b-dspark``: block_size 7 with 6 speculative tokens; llama.cpp's
    speculators-format converter, ggml-org/llama.cpp#26275, reads a missing key as false), so
    without it the declared proposal width decides: ``speculators_config.proposal_methods[0].
    speculative_tokens`` of ``block_size - 1`` means false, of ``block_size`` true. With neither,
    speculators 0.9.0's ``DSparkSpeculatorConfig`` default: true. Reading the wrong slot stays
    lossless (the target verifies) but shifts every draft by one position.
    """
    if "sample_from_anchor" in config:
        return bool(config["sample_from_anchor"])
    speculators = config.get("speculators_config")
    methods = speculators.get("proposal_methods") if isinstance(speculators, dict) else None
    method = methods[0] if isinstance(methods, list) and methods else None
    method = method if isinstance(method, dict) else {}
    tokens = method.get("speculative_tokens")
    block = config.get("block_size") or DEFAULTS["block_size"]
    if isinstance(tokens, int) and isinstance(block, int) and tokens == block - 1:
        return False
    return True


def new_config(layer: dict, feature_layers, block_size: int, mask_token_id: int,
               draft_vocab_size: int | None = None, markov_rank: int = 256,
               markov_head_type: str = "vanilla", enable_confidence_head: bool = True,
               confidence_head_with_markov: bool = True, sample_from_anchor: bool = True,
               verifier: str | None = None, verifier_architectures=()) -> dict:
    """A speculators-layout DSpark config (the keys and defaults of speculators 0.9.0's
    ``DSparkSpeculatorConfig``) for draft layers ``layer`` (a Qwen3-style dict: hidden_size,
    intermediate_size, num_hidden_layers, num_attention_heads, num_key_value_heads, head_dim,
    vocab_size, rms_norm_eps, rope_parameters, max_position_embeddings, hidden_act)."""
    layer = {"model_type": "qwen3", "attention_bias": False, "hidden_act": "silu",
             "tie_word_embeddings": False, **layer,
             "layer_types": ["full_attention"] * int(layer["num_hidden_layers"])}
    draft_vocab_size = int(draft_vocab_size or layer["vocab_size"])
    drafts = block_size if sample_from_anchor else block_size - 1
    return {"architectures": ["DSparkDraftModel"], "speculators_model_type": "dspark",
            "transformer_layer_config": layer, "draft_vocab_size": draft_vocab_size,
            "block_size": int(block_size), "target_hidden_size": None,
            "aux_hidden_state_layer_ids": [int(i) for i in feature_layers],
            "mask_token_id": int(mask_token_id), "sliding_window_non_causal": False,
            "sample_from_anchor": bool(sample_from_anchor), "markov_rank": int(markov_rank),
            "markov_head_type": markov_head_type,
            "enable_confidence_head": bool(enable_confidence_head),
            "confidence_head_with_markov": bool(confidence_head_with_markov),
            "tie_word_embeddings": False,
            "speculators_config": {
                "algorithm": "dspark", "default_proposal_method": "greedy",
                "proposal_methods": [{"proposal_type": "greedy", "speculative_tokens": drafts,
                                      "accept_tolerance": 0.0, "verifier_accept_k": 1}],
                "verifier": {"name_or_path": verifier,
                             "architectures": list(verifier_architectures)}}}


def save_dspark(model: DSparkModel, folder: Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write ``model`` in speculators' layout (``config.json`` + ``model.safetensors`` with
    speculators' tensor names, without the target's embeddings and head), the folder
    :func:`load_dspark` and speculators' ``DSparkDraftModel.from_pretrained`` read."""
    import json

    from safetensors.torch import save_file
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    back = {v: k for k, v in _RENAMES.items()}
    state = {}
    for name, t in model.state_dict().items():
        name = back.get(name, name.removeprefix("backbone."))
        state[name] = t.detach().to("cpu").contiguous()
        if t.is_floating_point():
            state[name] = state[name].to(dtype)
    if model.d2t is not None:
        ids = target_ids(model.d2t.cpu())
        t2d = torch.zeros(model.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        state["t2d"] = t2d
    save_file(state, str(folder / "model.safetensors"), metadata={"format": "pt"})
    config = {**model.config, "dtype": str(dtype).replace("torch.", "")}
    (folder / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return folder

def _backbone_config(config: dict, layer: dict):
    """MuseGlimmerAssistantConfig for speculators' ``transformer_layer_config`` (the DFlash
    decoder layers speculators builds: ``Qwen3DFlashDecoderLayer``, Qwen3 attention with q/k
    norms and no biases, a gated MLP)."""
    from transformers import MuseGlimmerAssistantConfig
    n = int(layer["num_hidden_layers"])
    heads = int(layer["num_attention_heads"])
    rope = dict(layer.get("rope_parameters") or {}) or {
        "rope_type": "default", "rope_theta": float(layer.get("rope_theta") or 1_000_000.0)}
    if layer.get("rope_scaling"):
        rope.update(layer["rope_scaling"])
        rope["rope_type"] = rope.pop("type", rope.get("rope_type", "default"))
    rope.setdefault("rope_type", "default")
    max_pos = int(layer.get("max_position_embeddings") or 40960)  # null: absent, as everywhere
    aux = [int(i) for i in config["aux_hidden_state_layer_ids"]]
    return MuseGlimmerAssistantConfig(
        hidden_size=layer["hidden_size"], intermediate_size=layer["intermediate_size"],
        num_hidden_layers=n, num_attention_heads=heads,
        num_key_value_heads=layer.get("num_key_value_heads") or heads,
        head_dim=layer.get("head_dim") or int(layer["hidden_size"]) // heads,
        rms_norm_eps=layer.get("rms_norm_eps") or 1e-6, rope_parameters=rope,
        max_position_embeddings=max_pos, sliding_window=max_pos,
        layer_types=["full_attention"] * n, hidden_act=layer.get("hidden_act") or "silu",
        bos_token_id=None, eos_token_id=None, pad_token_id=None,
        block_size=int(config.get("block_size") or DEFAULTS["block_size"]),
        mask_token_id=int(config["mask_token_id"]),
        # transformers counts outputs of layers (DFlash's convention): hidden state a = layer a - 1
        target_layer_ids=[a - 1 for a in aux])


def with_defaults(config: dict) -> tuple[dict, list[str]]:
    """(``config`` with a :data:`DEFAULTS` value for every such setting it leaves absent or
    null, the keys filled in)."""
    missing = [k for k in DEFAULTS if config.get(k) is None]
    return {**config, **{k: DEFAULTS[k] for k in missing}}, missing


def defaults_warning(path: Path, keys: list[str]) -> str | None:
    """The sentence naming the settings a config left to :data:`DEFAULTS` (None for none)."""
    if not keys:
        return None
    used = ", ".join(f"{k} {json.dumps(DEFAULTS[k])}" for k in keys)
    return (f"{path} gives no {', '.join(keys)}: this loader's default{'s' if len(keys) > 1 else ''}"
            f" {used} {'are' if len(keys) > 1 else 'is'} used, which may not be how it was trained")


def config_problem(config: dict, layer: dict, path: Path) -> str | None:
    """The first setting speculators' DSpark reads that this loader does not run (or that makes
    no drafter), as one sentence; None when there is none."""
    unknown = sorted(k for k in config if k not in _FIELDS and k not in _METADATA)
    if unknown:
        one = len(unknown) == 1
        return (f"{path}: {', '.join(unknown[:4])} {'is not a setting' if one else 'are not settings'}"
                " of speculators' DSpark config that this loader runs")
    config = with_defaults(config)[0]
    kind = config["markov_head_type"]
    if kind not in MARKOV_KINDS:
        return (f"{path}: markov_head_type {kind!r} is not one of {', '.join(MARKOV_KINDS)} "
                "(the kinds speculators' DSpark defines)")
    rank = int(config["markov_rank"])
    if rank < 0:
        return f"{path}: markov_rank is {rank}; it must be 0 (no sequential head) or more"
    if config["enable_confidence_head"] and config["confidence_head_with_markov"] and rank == 0:
        return (f"{path}: confidence_head_with_markov needs the Markov head, but markov_rank is 0 "
                "(speculators refuses the same config)")
    for key in ("mask_token_id", "aux_hidden_state_layer_ids"):
        if config.get(key) is None:
            return f"{path}: the DSpark config names no {key}"
    if not config["aux_hidden_state_layer_ids"]:
        return f"{path}: aux_hidden_state_layer_ids is empty: the drafter reads no target layers"
    for key in ("num_hidden_layers", "hidden_size", "intermediate_size", "num_attention_heads",
                "vocab_size"):
        if layer.get(key) is None:
            return f"{path}: transformer_layer_config lacks {key}"
    kinds = layer.get("layer_types") or ()
    sliding = [i for i, k in enumerate(kinds) if k != "full_attention"]
    if sliding:
        return (f"{path}: layer_types makes layers {sliding} sliding-window layers (causal inside "
                "the block with a window from the anchor in speculators); this loader runs "
                "full-attention DSpark layers only")
    if layer.get("attention_bias"):
        return (f"{path}: attention_bias is true; this loader runs DSpark attention without "
                "biases (MuseGlimmerAssistantModel)")
    width = config.get("target_hidden_size")
    if width is not None and int(width) != int(layer["hidden_size"]):
        return (f"{path}: target_hidden_size {width} differs from the draft's hidden size "
                f"{layer['hidden_size']}; speculators' DSpark reads target features of its own "
                "width only")
    draft_vocab = int(config.get("draft_vocab_size") or layer["vocab_size"])
    if draft_vocab > int(layer["vocab_size"]):
        return (f"{path}: draft_vocab_size {draft_vocab} exceeds the vocabulary of "
                f"{layer['vocab_size']} ids")
    return None


def load_dspark(folder: Path, dtype: torch.dtype = torch.float32) -> tuple[DSparkModel, dict]:
    """Read a DSpark folder in speculators' layout.

    Returns:
        (model in eval mode, {"layout": "speculators", "config": the config with
        :data:`DEFAULTS` filled in, "ignored": target-owned tensors found and not read, "t2d":
        the (V,) bool map or None, "embed_tokens": the folder's (V, H) embedding copy or None,
        "defaults": the keys of :data:`DEFAULTS` the config did not give}).
    Raises:
        DSparkFormatError: not a DSpark folder of this layout, a setting this loader does not run,
            a setting of the wrong type, or weights that are missing, unused or do not fit.
    """
    folder = Path(folder)
    path = folder / "config.json"
    config = folders.read_config(folder)
    if not detect(config):
        raise DSparkFormatError(f"{folder} is not a DSpark drafter")
    if config.get("speculators_model_type") != "dspark":
        arch = ", ".join(str(a) for a in config.get("architectures") or ())
        raise DSparkFormatError(f"{path} declares {arch} without speculators_model_type "
                                "\"dspark\": only speculators' DSpark layout is read here")
    folders.check_fields(config, _FIELDS, path)
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        raise DSparkFormatError(f"{path}: \"transformer_layer_config\" must be an object of "
                                "settings")
    folders.check_fields(layer, folders.LAYER_FIELDS, path, "transformer_layer_config")
    config, defaulted = with_defaults(config)
    assumed = "" if not defaulted else (
        f"; {path.name} gives no {', '.join(defaulted)}, so "
        + ", ".join(f"{k} {json.dumps(DEFAULTS[k])}" for k in defaulted) + " was assumed")
    problem = config_problem(config, layer, path)
    if problem:
        raise DSparkFormatError(problem + assumed)
    vocab = int(layer["vocab_size"])
    draft_vocab = int(config.get("draft_vocab_size") or vocab)
    try:
        model = DSparkModel(config)
    except (TypeError, ValueError, KeyError) as exc:
        raise DSparkFormatError(f"{path}: the settings do not make a DSpark drafter "
                                f"({folders._first_line(exc)}){assumed}") from None
    state = folders.read_weights(folder)
    ignored = sorted(k for k in state if k in _TARGET_OWNED)
    embed_copy = state.get("embed_tokens.weight")
    if draft_vocab == vocab:  # speculators rebuilds the head from the target's and has no maps
        ignored += sorted(k for k in state if k in ("lm_head.weight", "d2t", "t2d"))
    t2d = state.get("t2d") if draft_vocab != vocab else None
    state = {(_RENAMES.get(k) or ("backbone." + k if k.startswith("layers.") else k)): v
             for k, v in state.items() if k not in ignored and k != "t2d"}
    expected = model.state_dict()
    unused = [k for k in state if k not in expected]
    if unused:
        back = {v: k for k, v in _RENAMES.items()}
        raise DSparkFormatError(folders.unused_weights_problem(
            folder, [back.get(k, k.removeprefix("backbone.")) for k in unused], "the DSpark drafter")
            + assumed)
    missing = [k for k in expected if k not in state and "rotary_emb" not in k]
    if missing:
        shown = [{v: k for k, v in _RENAMES.items()}.get(k, k.removeprefix("backbone."))
                 for k in missing]
        raise DSparkFormatError(f"{folder}: weights missing: {', '.join(shown[:4])}{assumed}")
    wrong = [f"{k} {tuple(v.shape)} (expected {tuple(expected[k].shape)})"
             for k, v in state.items() if tuple(v.shape) != tuple(expected[k].shape)]
    if wrong:
        raise DSparkFormatError(f"{folder}: weights do not fit the config: "
                                f"{', '.join(wrong[:3])}{assumed}")
    model.load_state_dict(state, strict=False)
    return model.to(dtype).eval(), {"layout": LAYOUT, "config": config, "ignored": ignored,
                                    "t2d": t2d, "embed_tokens": embed_copy,
                                    "defaults": defaulted}


def dspark_problems(model: DSparkModel, info: dict, target) -> tuple[list[str], list[str]]:
    """(refusals, warnings) for a DSpark drafter against a loaded ``target``
    (models.LoadedModel); one sentence each."""
    depth = num_layers(target.model)
    hidden = int(target.model.config.get_text_config().hidden_size)
    rows = int(target.model.get_input_embeddings().num_embeddings)
    problems = index_problems(model.feature_layers, depth, "the DSpark drafter")
    width = int(model.backbone.config.hidden_size)
    if width != hidden:
        problems.append(f"the DSpark drafter's hidden size is {width} but the target's is "
                        f"{hidden}: it was built for another target")
    if model.vocab_size != rows:
        problems.append(f"the DSpark drafter was built for a vocabulary of {model.vocab_size:,} "
                        f"ids, the target has {rows:,}")
    if not 0 <= model.mask_token_id < rows:
        problems.append(f"the mask token id {model.mask_token_id} is outside the target's "
                        f"vocabulary of {rows:,} ids: it was built for another tokenizer")
    if model.block_size < (1 if model.sample_from_anchor else 2):
        problems.append(f"block_size {model.block_size} drafts nothing")
    problems += map_problems(model.d2t, info.get("t2d"), model.draft_vocab_size, model.vocab_size)
    speculators = info["config"].get("speculators_config")
    verifier = speculators.get("verifier") if isinstance(speculators, dict) else None
    name = verifier.get("name_or_path") if isinstance(verifier, dict) else None
    warning = folders.verifier_warning("the DSpark drafter", name, target)
    return problems, [warning] if warning else []


def min_survival_setting() -> float:
    """``SPECDEMO_DSPARK_MIN_SURVIVAL`` as a number in [0, 1], else :data:`DEFAULT_MIN_SURVIVAL`.

    Raises:
        ValueError: the variable is set to something else (one sentence).
    """
    raw = os.environ.get("SPECDEMO_DSPARK_MIN_SURVIVAL", "").strip()
    if not raw:
        return DEFAULT_MIN_SURVIVAL
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"SPECDEMO_DSPARK_MIN_SURVIVAL must be a number from 0 to 1, got {raw!r}")
    return value


class DSparkDrafter(DFlashDrafter):
    """Drafting with a DSpark drafter inside the engine (a FeatureDrafter).

    One backbone forward per proposal (DFlash's, with its context cache and rollback), then the
    Markov chain left to right. Each position's distribution is the target's sampling
    parameters applied to its biased logits (one-hot at the argmax when greedy): the q of
    verification. With a confidence head the proposal ends before the first position whose
    prefix survival falls below ``min_survival`` (at least one token is proposed; the chain's
    ids and ``c_j`` reach the host in one transfer, so the cut is made there), and its
    ``confidence`` holds each proposed position's ``c_j``; a ``keep_going`` callback (the draft-
    length policy's, ``stops_early``) may stop the chain sooner.

    Args:
        model: a :class:`DSparkModel`.
        target: the target causal LM (its embedding rows and, for Vd = V, its output head).
        vocab_size: V, the target's logits width.  name: shown in stats and the UI.
        min_survival: see above; 0 drafts whole blocks.
    """

    stops_early = True

    def __init__(self, model: DSparkModel, target: nn.Module, vocab_size: int,
                 name: str = "dspark", min_survival: float = DEFAULT_MIN_SURVIVAL) -> None:
        super().__init__(model.backbone, target, vocab_size, name)
        self.dspark = model
        self.feature_layers = model.feature_layers
        self.min_survival = float(min_survival)
        self._first = 0 if model.sample_from_anchor else 1
        self._weight_bytes = param_bytes(model)
        self._ids = None
        if model.d2t is not None:
            self._ids = target_ids(model.d2t)
            self._ids_host = self._ids.tolist()
            self._ids_increasing = bool((self._ids[1:] > self._ids[:-1]).all())

    def _noise(self, block: torch.Tensor) -> torch.Tensor:
        """The target's embedding rows of the block's ids, as speculators' ``embed_tokens``
        (the verifier's weight, read without any scale its embedding module applies)."""
        return F.embedding(block, self._embed.weight)

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None, keep_going=None) -> Proposal:
        if k <= 0:
            return Proposal([], source=self.name)
        sampler = DraftSampler(context, params, generator)
        if self._ids is not None:
            def pick(logits):
                return sampler.draw_subset(logits, self._ids, self.vocab_size,
                                           self._ids_increasing, self._ids_host)
        else:
            def pick(logits):
                return sampler.draw(fit_vocab(logits, self.vocab_size))
        more = None
        if keep_going is not None and self.dspark.confidence_head is None:
            def more(_):
                return keep_going([float(c) for c in sampler.confidence])
        elif keep_going is not None:
            more = keep_going
        _, confidence = self._chain(context, k, pick, more)
        if confidence:  # the head's estimates replace the drafts' own probabilities
            sampler.confidence[:len(confidence)] = confidence
        proposal = sampler.proposal(self.name)  # ids and confidences: one transfer
        n = self._surviving(proposal.confidence) if confidence else len(proposal.ids)
        if n < len(proposal.ids):
            proposal = Proposal(proposal.ids[:n], proposal.probs[:n], proposal.source,
                                proposal.confidence[:n])
        return proposal

    def _surviving(self, confidence: list[float]) -> int:
        """How many leading drafts keep the prefix survival ``prod c_j`` at ``min_survival`` or
        above (at least one)."""
        survive = 1.0
        for j, c in enumerate(confidence):
            survive *= c
            if j > 0 and survive < self.min_survival:
                return j
        return len(confidence)

    @torch.inference_mode()
    def _chain(self, context: list[int], k: int, pick, keep_going=None):
        """One backbone forward, then the Markov chain over at most ``k`` block positions.

        Args:
            pick: ``pick((Vd,) float32 logits) -> (1,) long tensor``, the target id drawn there
                (it becomes the next position's previous token).
            keep_going: None, or ``keep_going(confidence so far: list[float]) -> bool`` asked
                after each token (then each ``c_j`` is read on the host as it is made).
        Returns:
            (list of the (Vd,) float32 biased logits of each drafted position, list of their
            ``c_j`` as () float32 tensors on the drafter's device: empty without a confidence
            head).
        """
        m = self.dspark
        hidden = self._block_hidden(context)[self._first:self._first + k]  # (n, H)
        head = m.lm_head if m.lm_head is not None else self._head
        base = head(hidden.to(head.weight.dtype))  # (n, Vd)
        prev = torch.tensor([context[-1]], device=hidden.device)
        state, rows, confidence, said = None, [], [], []
        for j in range(hidden.shape[0]):
            emb = m.markov_head.markov_w1(prev)[0] if m.markov_head is not None else None
            logits = base[j]
            if m.markov_head is not None:
                bias, state = m.markov_head.bias(emb, hidden[j], state)
                logits = logits + bias.to(logits.dtype)
            rows.append(logits.float())
            if m.confidence_head is not None:
                confidence.append(torch.sigmoid(m.confidence_logit(hidden[j], emb).float()))
            prev = pick(rows[-1]).view(1)
            if keep_going is not None:
                if confidence:
                    said.append(float(confidence[-1]))
                if not keep_going(said):
                    break
        return rows, confidence


@dataclass
class LoadedDSpark(LoadedModule):
    """A loaded, checked DSpark drafter, ready to make a fresh drafter per decode."""

    min_survival: float = DEFAULT_MIN_SURVIVAL

    def new_drafter(self, target: nn.Module, vocab_size: int, name: str) -> DSparkDrafter:
        return DSparkDrafter(self.model, target, vocab_size, name, self.min_survival)

    def feature_layers(self, target: nn.Module) -> tuple[int, ...]:
        """Its config's ``aux_hidden_state_layer_ids``."""
        return tuple(self.model.feature_layers)

    @property
    def summary(self) -> str:
        m = self.model
        drafts = m.block_size if m.sample_from_anchor else m.block_size - 1
        heads = (f"a {m.markov_head.kind} Markov head of rank {m.markov_head.rank}"
                 if m.markov_head is not None else "no Markov head")
        conf = ("a confidence head (drafting while the prefix survival is at least "
                f"{self.min_survival:g})" if m.confidence_head is not None else "no confidence head")
        return (f"DSpark drafter ({self.info['layout']} layout, "
                f"{m.backbone.config.num_hidden_layers} layers) reading target hidden states "
                f"{list(m.feature_layers)}, drafting blocks of {drafts} tokens with {heads} and "
                f"{conf}")


def _is_targets_embedding(rows: torch.Tensor | None, target) -> bool:
    """Whether a folder's (V, H) ``embed_tokens.weight`` equals the target's embedding rows (in
    the target's dtype), as speculators saves them (copied from the verifier and frozen).
    Compared 16,384 rows at a time, so the device holds no second full copy."""
    if rows is None:
        return False
    weight = target.model.get_input_embeddings().weight.detach()
    if tuple(rows.shape) != tuple(weight.shape):
        return False
    return all(torch.equal(rows[i:i + 16384].to(weight.device, weight.dtype), weight[i:i + 16384])
               for i in range(0, rows.shape[0], 16384))


def load_checked(spec: str, folder: Path, target, dtype: torch.dtype = torch.float32) -> LoadedDSpark:
    """Load the DSpark folder of ``spec`` and check it against a loaded ``target``.

    Raises:
        DrafterRefused: it cannot serve this target, or SPECDEMO_DSPARK_MIN_SURVIVAL is not a
            number from 0 to 1 (one sentence per problem).
    """
    try:
        model, info = load_dspark(folder, dtype)
        min_survival = min_survival_setting()
    except (folders.DrafterFolderError, ValueError) as exc:
        raise DrafterRefused(spec, target.spec, [str(exc)]) from None
    problems, warnings = dspark_problems(model, info, target)
    if problems:
        raise DrafterRefused(spec, target.spec, problems)
    ignored = list(info.get("ignored") or ())
    if _is_targets_embedding(info.pop("embed_tokens", None), target):
        ignored.remove("embed_tokens.weight")  # speculators saved the target's own rows: no news
    if ignored:
        warnings.append(f"{folder} also holds {', '.join(ignored)}: DSpark uses the "
                        "target's own embeddings and head, so these are not read")
    defaulted = defaults_warning(Path(folder) / "config.json", info.get("defaults") or [])
    if defaulted:
        warnings.append(defaulted)
    return LoadedDSpark(spec, model.to(target.device), info, warnings, min_survival=min_survival)
