"""DFlash: a block-diffusion drafter (z-lab, "DFlash: Block Diffusion for Flash Speculative
Decoding", arXiv:2602.06036), run through transformers' own class
(``MuseGlimmerAssistantModel``, driven in transformers 5.24 by
``generation/candidate_generator.py: DFlashTokenCandidateGenerator``).

A few non-causal layers draft a whole block in one forward. Keys/values come from the target's
features at the accepted positions (the *outputs* of layers ``target_layer_ids``, i.e.
``hidden_states[k + 1]``, projected by ``encoder.fc`` and normed) and from the block itself; the
queries are the block: the last token (the anchor) and ``block_size - 1`` mask tokens, embedded
with the target's embeddings. The block's outputs go through the target's head::

    ctx   = norm(fc(concat(features)))             # (n, H), cached per layer as k/v
    block = embed([anchor, mask, ..., mask])       # (B, H)
    h     = layers(block | ctx)                    # bidirectional inside the block
    logits = target.lm_head(norm(h)[1:])           # (B - 1, V): drafts 1..B-1

Folders: transformers' layout (``model_type: "muse_glimmer_assistant"``, what we save) and z-lab's
(``architectures: ["DFlashDraftModel"]``, ``dflash_config: {mask_token_id, target_layer_ids}``,
weights ``fc``/``hidden_norm``/``layers.*``/``norm``), mapped onto the same class.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from ..errors import DrafterRefused
from ..sampling import SamplingParams
from . import folders
from .base import DraftSampler, LoadedModule, ModuleDrafter, Proposal, fit_vocab, param_bytes
from .features import dflash_indices, num_layers

FAMILY = "dflash"
#: z-lab weight names -> transformers' MuseGlimmerAssistantModel names
ZLAB_RENAMES = {"fc.weight": "encoder.fc.weight", "hidden_norm.weight": "encoder.output_norm_enc.weight"}
_UNSUPPORTED = ("projector_type", "selector_rank", "conv_kernel_size")  # DFlash2 / Domino / DSpark


#: DFlash settings (top level or under z-lab's dflash_config) and their types
_DFLASH_FIELDS = {"block_size": folders.POS_INT, "mask_token_id": folders.INT,
                  "target_layer_ids": folders.INT_LIST, "num_target_layers": folders.POS_INT,
                  "output_multiplier": folders.FLOAT, "final_logit_softcapping": folders.FLOAT,
                  "input_embedding_scale": folders.FLOAT, "is_causal": folders.BOOL}
#: z-lab weights that are the target's own (DFlash shares the target's embeddings and head)
_TARGET_OWNED = ("embed_tokens.weight", "lm_head.weight")


class DFlashFormatError(folders.DrafterFolderError):
    """A folder that claims to be a DFlash drafter but cannot be read as one (reason inside)."""


def detect(config: dict) -> bool:
    """Whether a ``config.json`` declares a DFlash drafter (either layout)."""
    return (config.get("model_type") == "muse_glimmer_assistant"
            or any("dflash" in str(a).lower() for a in config.get("architectures") or ()))


def _dflash_value(config: dict, key: str, default=None):
    """z-lab keeps DFlash settings under ``dflash_config`` (older files: at the top level)."""
    return (config.get("dflash_config") or {}).get(key, config.get(key, default))


def _zlab_config(config: dict):
    """MuseGlimmerAssistantConfig for a z-lab ``DFlashDraftModel`` config (a Qwen3-style dict).

    Raises:
        DFlashFormatError: a variant the transformers class does not implement.
    """
    from transformers import MuseGlimmerAssistantConfig
    extra = config.get("dflash_config") or {}
    arch = ", ".join(config.get("architectures") or ())
    if any(key in extra or key in config for key in _UNSUPPORTED) or "DFlash2" in arch:
        raise DFlashFormatError(f"{arch or 'this DFlash variant'} (candidate selector, convolutions "
                                "or another projector) is not what transformers' DFlash class runs")
    if _dflash_value(config, "causal", False) or _dflash_value(config, "is_causal", False) \
            or config.get("attention_bias"):
        raise DFlashFormatError("is_causal / causal or attention_bias: causal or biased DFlash "
                                "attention is not what transformers' DFlash class runs")
    kinds = config.get("layer_types") or ()
    sliding = [i for i, kind in enumerate(kinds) if kind != "full_attention"]
    if sliding:
        raise DFlashFormatError(f"layer_types makes layers {sliding} sliding-window layers, which "
                                "z-lab runs causal with a strict window and transformers' DFlash "
                                "class does not: not supported")
    n = int(config["num_hidden_layers"])
    rope = dict(config.get("rope_parameters") or {}) or {
        "rope_type": "default", "rope_theta": float(config.get("rope_theta", 1_000_000.0))}
    if config.get("rope_scaling"):
        rope.update(config["rope_scaling"])
        rope["rope_type"] = rope.pop("type", rope.get("rope_type", "default"))
    max_pos = int(config.get("max_position_embeddings", 40960))
    return MuseGlimmerAssistantConfig(
        hidden_size=config["hidden_size"], intermediate_size=config["intermediate_size"],
        num_hidden_layers=n, num_attention_heads=config["num_attention_heads"],
        num_key_value_heads=config.get("num_key_value_heads", config["num_attention_heads"]),
        head_dim=config.get("head_dim") or config["hidden_size"] // config["num_attention_heads"],
        rms_norm_eps=config.get("rms_norm_eps", 1e-6), rope_parameters=rope,
        max_position_embeddings=max_pos, sliding_window=config.get("sliding_window") or max_pos,
        layer_types=config.get("layer_types") or ["full_attention"] * n,
        hidden_act=config.get("hidden_act", "silu"),
        bos_token_id=config.get("bos_token_id"), eos_token_id=config.get("eos_token_id"),
        pad_token_id=config.get("pad_token_id"),
        block_size=int(_dflash_value(config, "block_size", 16)),
        mask_token_id=int(_dflash_value(config, "mask_token_id")),
        target_layer_ids=[int(i) for i in _dflash_value(config, "target_layer_ids")])


def load_assistant(folder: Path, dtype: torch.dtype = torch.float32):
    """Read a DFlash folder in either layout into ``MuseGlimmerAssistantModel``.

    Returns:
        (model in eval mode, {"layout": "transformers" | "z-lab", "config": the raw config}).
    Raises:
        DFlashFormatError: not a DFlash folder, an unsupported variant, or weights that do not fit.
    """
    from transformers import MuseGlimmerAssistantModel
    folder = Path(folder)
    path = folder / "config.json"
    config = folders.read_config(folder)
    folders.check_fields(config, {**folders.LAYER_FIELDS, **_DFLASH_FIELDS}, path)
    if config.get("dflash_config") is not None:
        folders.check_fields(config["dflash_config"], _DFLASH_FIELDS, path, "dflash_config")
    if config.get("model_type") == "muse_glimmer_assistant":
        folders.check_weight_files(folder)
        try:
            model, report = MuseGlimmerAssistantModel.from_pretrained(
                folder, dtype=dtype, local_files_only=True, output_loading_info=True)
        except Exception as exc:  # transformers' own refusal of the settings or the weights
            raise DFlashFormatError(f"{folder} cannot be read as a DFlash drafter "
                                    f"({folders._first_line(exc)})") from None
        _refuse_mismatch(folder, report.get("missing_keys"), report.get("unexpected_keys"))
        bad = folders.nonfinite_names(model.state_dict())
        if bad:
            raise DFlashFormatError(f"{folder}: {', '.join(bad[:4])} hold(s) NaN or infinite "
                                    "values; a drafter with such weights cannot draft")
        return model.eval(), {"layout": "transformers", "config": config, "ignored": []}
    if not detect(config):
        raise DFlashFormatError(f"{folder} is not a DFlash drafter")
    if _dflash_value(config, "mask_token_id") is None or _dflash_value(config, "target_layer_ids") is None:
        raise DFlashFormatError(f"{folder}: the DFlash config names no mask_token_id or "
                                "target_layer_ids")
    if "num_hidden_layers" not in config or "hidden_size" not in config:
        raise DFlashFormatError(f"{path} lacks num_hidden_layers or hidden_size")
    try:
        model = MuseGlimmerAssistantModel(_zlab_config(config))
    except (TypeError, ValueError, KeyError) as exc:
        if isinstance(exc, DFlashFormatError):
            raise
        raise DFlashFormatError(f"{path}: the settings do not make a DFlash drafter "
                                f"({folders._first_line(exc)})") from None
    state = folders.read_weights(folder)
    ignored = sorted(k for k in state if k in _TARGET_OWNED)
    state = {ZLAB_RENAMES.get(k, k): v for k, v in state.items() if k not in _TARGET_OWNED}
    expected = model.state_dict()
    _refuse_mismatch(folder, [], [k for k in state if k not in expected])
    try:
        result = model.load_state_dict(state, strict=False)
    except RuntimeError as exc:
        detail = [line.strip() for line in str(exc).splitlines()[1:2]]
        raise DFlashFormatError(f"{folder}: weights do not fit the config "
                                f"({'; '.join(detail) or folders._first_line(exc)})") from None
    _refuse_mismatch(folder, result.missing_keys, [])
    return model.to(dtype).eval(), {"layout": "z-lab", "config": config, "ignored": ignored}


def _refuse_mismatch(folder: Path, missing, unexpected) -> None:
    """Refuse weights the model needs and lacks, or holds and would not use (never dropped)."""
    missing = [k for k in missing or () if "rotary_emb" not in k]
    if unexpected:
        raise DFlashFormatError(folders.unused_weights_problem(folder, list(unexpected),
                                                               "the DFlash drafter"))
    if missing:
        raise DFlashFormatError(f"{folder}: weights missing: {', '.join(missing[:4])}")


def save_assistant(model: nn.Module, folder: Path) -> Path:
    """Write ``model`` in transformers' layout (``MuseGlimmerAssistantModel.from_pretrained``)."""
    model.save_pretrained(folder)
    return Path(folder)


def dflash_problems(model: nn.Module, raw: dict, target) -> list[str]:
    """Why a DFlash drafter cannot serve a loaded ``target`` (models.LoadedModel); one sentence
    each, empty when it can."""
    cfg = model.config
    depth = num_layers(target.model)
    hidden = int(target.model.config.get_text_config().hidden_size)
    rows = int(target.model.get_input_embeddings().num_embeddings)
    ids = [int(i) for i in cfg.target_layer_ids]
    problems = []
    bad = [i for i in ids if not 0 <= i < depth]
    repeated = sorted({i for i in ids if ids.count(i) > 1})
    if not ids:
        problems.append("the DFlash drafter names no target layers to read")
    elif any(i < 0 for i in ids):
        problems.append(f"the DFlash drafter names negative target layer ids "
                        f"{[i for i in ids if i < 0]}: layer ids count from 0")
    elif repeated:
        problems.append(f"the DFlash drafter reads target layer(s) {repeated} more than once "
                        f"({ids}): its features would repeat, a corrupt or hand-edited config")
    elif bad:
        problems.append(f"the DFlash drafter reads the outputs of target layers {bad} but the "
                        f"target has only {depth} layers (0..{depth - 1}): it was built for a "
                        "deeper target")
    trained_on = _dflash_value(raw, "num_target_layers")
    if trained_on is not None and int(trained_on) != depth:
        problems.append(f"the DFlash drafter was trained on a target of {trained_on} layers, this "
                        f"one has {depth}: it was built for another target")
    if int(cfg.hidden_size) != hidden:
        problems.append(f"the DFlash drafter's hidden size is {cfg.hidden_size} but the target's "
                        f"is {hidden}: it was built for another target")
    if not 0 <= int(cfg.mask_token_id) < rows:
        problems.append(f"the mask token id {cfg.mask_token_id} is outside the target's "
                        f"vocabulary of {rows:,} ids: it was built for another tokenizer")
    vocab = raw.get("vocab_size")
    if vocab is not None and int(vocab) != rows:
        problems.append(f"the DFlash drafter was built for a vocabulary of {int(vocab):,} ids, the "
                        f"target has {rows:,}")
    if int(cfg.block_size) < 2:
        problems.append(f"block_size {cfg.block_size} drafts nothing (it must be at least 2)")
    return problems


def noise_embeddings(embeddings: nn.Module, ids: torch.Tensor) -> torch.Tensor:
    """The target's input embeddings of ``ids`` without an optional ``embed_norm`` (as
    transformers' ``DFlashTokenCandidateGenerator._get_noise_embeds``)."""
    norm = getattr(embeddings, "embed_norm", None)
    if norm is None:
        return embeddings(ids)
    embeddings.embed_norm = nn.Identity()
    try:
        return embeddings(ids)
    finally:
        embeddings.embed_norm = norm


class DFlashDrafter(ModuleDrafter):
    """Drafting with a DFlash assistant inside the engine (a FeatureDrafter).

    The assistant's cache holds keys/values of the accepted context only: each proposal appends
    the new context positions and the block, then crops the block off again, so a rejection
    needs no other rollback. One forward drafts up to ``block_size - 1`` tokens; each position's
    distribution is the target's sampling parameters applied to its logits, and the token is drawn
    from it (one-hot at the argmax when greedy): that distribution is the q of verification.

    Args:
        model: a ``MuseGlimmerAssistantModel``.
        target: the target causal LM (its input embeddings and output head are used, not copied).
        vocab_size: V, the target's logits width.
        name: shown in stats and the UI.
        logit_scale, softcap: z-lab's ``output_multiplier`` / ``final_logit_softcapping``
            (1.0 / None when the checkpoint has none).
        embed_scale: z-lab's ``input_embedding_scale``: the block's embeddings are multiplied by
            it (dflash ``_raw_input_embeddings``; 1.0 when the checkpoint has none).
    """

    def __init__(self, model: nn.Module, target: nn.Module, vocab_size: int, name: str = "dflash",
                 logit_scale: float = 1.0, softcap: float | None = None,
                 embed_scale: float = 1.0) -> None:
        from transformers.cache_utils import DFlashCache
        self.model = model
        self.name = name
        self.vocab_size = vocab_size
        self.feature_layers = dflash_indices(model.config.target_layer_ids)
        self.block_size = int(model.config.block_size)
        self.mask_token_id = int(model.config.mask_token_id)
        self._embed = target.get_input_embeddings()
        self._head = target.get_output_embeddings()
        self._scale, self._softcap, self._embed_scale = logit_scale, softcap, embed_scale
        self._cache = DFlashCache(config=model.config)
        self._cache.activate_past_recording()  # sliding layers may be cropped past their window
        self._pending: list[torch.Tensor] = []
        self._n_ctx = 0  # context positions in the cache
        self._weight_bytes = param_bytes(model)

    def observe(self, features: torch.Tensor) -> None:
        self._pending.append(features)

    def _noise(self, block: torch.Tensor) -> torch.Tensor:
        """(1, B, H) input embeddings of the block's ids (1, B)."""
        return noise_embeddings(self._embed, block) * self._embed_scale

    @torch.inference_mode()
    def _block_logits(self, context: list[int], k: int) -> torch.Tensor:
        """One assistant forward over the new context features and the block; (min(k, B - 1), V)
        logits (the head runs on the positions that will be proposed only)."""
        hidden = self._block_hidden(context)[1:1 + k]  # (min(k, B - 1), H)
        logits = self._head(hidden.to(self._head.weight.dtype)).float() * self._scale
        if self._softcap:
            logits = torch.tanh(logits / self._softcap) * self._softcap
        return fit_vocab(logits, self.vocab_size)

    @torch.inference_mode()
    def _block_hidden(self, context: list[int]) -> torch.Tensor:
        """One assistant forward over the new context features and the block ``[context[-1],
        mask, ..., mask]`` at positions ``len(context) - 1 ..``; (B, H) the block's final-normed
        hidden states. The cache keeps the context's keys/values and drops the block's."""
        if not self._pending:
            raise RuntimeError("DFlash drafter: no new target features since the last round")
        feats = torch.cat(self._pending).unsqueeze(0)  # (1, n, F)
        self._pending.clear()
        n, start = feats.shape[1], self._n_ctx
        if start + n != len(context) - 1:
            raise RuntimeError(f"DFlash drafter out of step: features for {start + n} positions, "
                               f"context has {len(context)} tokens")
        device = feats.device
        block = torch.tensor([[context[-1]] + [self.mask_token_id] * (self.block_size - 1)],
                             device=device)  # (1, B)
        positions = torch.arange(start, len(context) - 1 + self.block_size, device=device)[None]
        dtype = self.model.encoder.fc.weight.dtype
        self._cache.set_previous_accepted_tokens(n)
        out = self.model(noise_embeds=self._noise(block).to(dtype),
                         context_hidden_states=feats.to(dtype), position_ids=positions,
                         cache=self._cache)
        self._cache.crop(-self.block_size)  # keep the context, drop the block
        self._n_ctx = start + n
        return out.last_hidden_state[0]

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal([], source=self.name)
        sampler = DraftSampler(context, params, generator)
        for row in self._block_logits(context, k):
            sampler.draw(row)
        return sampler.proposal(self.name)


@dataclass
class LoadedDFlash(LoadedModule):
    """A loaded, checked DFlash assistant, ready to make a fresh drafter per decode."""

    def new_drafter(self, target: nn.Module, vocab_size: int, name: str) -> DFlashDrafter:
        raw = self.info["config"]
        return DFlashDrafter(self.model, target, vocab_size, name,
                             float(_dflash_value(raw, "output_multiplier", 1.0)),
                             _dflash_value(raw, "final_logit_softcapping"),
                             float(_dflash_value(raw, "input_embedding_scale", 1.0)))

    def feature_layers(self, target: nn.Module) -> tuple[int, ...]:
        """The outputs of the target layers its config names (``target_layer_ids``)."""
        return dflash_indices(self.model.config.target_layer_ids)

    @property
    def summary(self) -> str:
        cfg = self.model.config
        return (f"DFlash drafter ({self.info['layout']} layout, {cfg.num_hidden_layers} layers) "
                f"reading the outputs of target layers {list(cfg.target_layer_ids)}, drafting "
                f"blocks of {cfg.block_size - 1} tokens with mask token {cfg.mask_token_id}")


def load_checked(spec: str, folder: Path, target, dtype: torch.dtype = torch.float32) -> LoadedDFlash:
    """Load the DFlash folder of ``spec`` and check it against a loaded ``target``.

    Raises:
        DrafterRefused: it cannot serve this target (one sentence per problem).
    """
    try:
        model, info = load_assistant(folder, dtype)
    except folders.DrafterFolderError as exc:
        raise DrafterRefused(spec, target.spec, [str(exc)]) from None
    problems = dflash_problems(model, info["config"], target)
    if problems:
        raise DrafterRefused(spec, target.spec, problems)
    warnings = [f"{folder} also holds {', '.join(info['ignored'])}: DFlash uses the target's own "
                "embeddings and head, so these are not read"] if info.get("ignored") else []
    return LoadedDFlash(spec, model.to(target.device), info, warnings)
