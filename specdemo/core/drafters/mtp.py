"""Multi-token prediction (MTP) drafters: Gemma 4 assistant checkpoints and the native MTP layers
some models ship (DeepSeek-V3, Gloeckle et al. 2024 "Better & Faster Large Language Models via
Multi-token Prediction"), both through transformers' own classes.

* **Gemma 4 assistant** (``Gemma4AssistantForCausalLM``, e.g. google/gemma-4-E2B-it-assistant for
  google/gemma-4-E2B-it; transformers' ``SinglePositionMultiTokenCandidateGenerator``): a small
  decoder whose every layer cross-attends to the target's keys/values (those of the last
  non-shared target layer of each attention type, the "store" layers), at one fixed position::

      x_0 = concat(embed(last token), h_target)            # (2H,), h = target's last hidden state
      h_j, logits_j = assistant(x_j, kv = target store layers, position = len(context) - 1)
      x_{j+1} = concat(embed(draft_j), h_j)

  The store layers' keys/values are recomputed here from their *inputs* (``hidden_states[j]``,
  read in the verification forward like any feature), with the target's own projections, norms
  and RoPE, so they follow the accepted context exactly and need no access to the target's cache.
* **Native MTP layers** (``num_mtp_layers`` in the config; ``MtpModel`` in
  ``transformers.modeling_layers``, loaded from the target's own checkpoint): layer 0 reads the
  target's last hidden state at position t and the embedding of token t + 1 and predicts token
  t + 2; further draft steps feed its output back (as vLLM's ``mtp_proposer`` does when more
  tokens are drafted than there are MTP layers). Its own cache covers the accepted context;
  draft steps are cropped after each round.

transformers drafts both greedily and hands on raw logits as the draft distribution; here every
draft token is drawn with the target's sampling parameters and the distribution it was drawn
from is its q (one-hot at the argmax when greedy), so verification stays exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

from ..errors import DrafterRefused
from ..sampling import SamplingParams
from .base import DraftSampler, LoadedModule, ModuleDrafter, Proposal, fit_vocab, param_bytes
from .features import num_layers
from . import folders
from .folders import DrafterFolderError

ASSISTANT = "gemma4-assistant"
NATIVE = "mtp"
_ASSISTANT_TYPES = ("gemma4_assistant", "gemma4_unified_assistant")


def detect_assistant(config: dict) -> bool:
    """Whether a ``config.json`` declares a Gemma 4 assistant."""
    return config.get("model_type") in _ASSISTANT_TYPES


def load_assistant(folder: Path, dtype: torch.dtype = torch.float32) -> nn.Module:
    """``Gemma4AssistantForCausalLM`` (or the unified variant) from a local folder, in eval mode.

    Raises:
        folders.DrafterFolderError: config.json or a weight file cannot be read, a setting has
            the wrong type, weights are missing, unused (named), or hold NaN / infinity.
    """
    import transformers

    folder = Path(folder)
    config = folders.read_config(folder)
    folders.check_fields(config, {"backbone_hidden_size": folders.POS_INT,
                                  **folders.LAYER_FIELDS}, folder / "config.json")
    for key in ("text_config", "assistant_config"):
        if isinstance(config.get(key), dict):
            folders.check_fields(config[key], folders.LAYER_FIELDS, folder / "config.json", key)
    folders.check_weight_files(folder)
    cls = (transformers.Gemma4UnifiedAssistantForCausalLM
           if config.get("model_type") == "gemma4_unified_assistant"
           else transformers.Gemma4AssistantForCausalLM)
    try:
        model, report = cls.from_pretrained(folder, dtype=dtype, local_files_only=True,
                                            output_loading_info=True)
    except Exception as exc:  # transformers' refusal of the settings or the weights
        raise folders.DrafterFolderError(f"{folder} cannot be read as a Gemma 4 assistant "
                                         f"({folders._first_line(exc)})") from None
    if report.get("unexpected_keys"):
        raise folders.DrafterFolderError(folders.unused_weights_problem(
            folder, list(report["unexpected_keys"]), "the Gemma 4 assistant"))
    missing = [k for k in report.get("missing_keys") or () if "rotary" not in k]
    if missing:
        raise folders.DrafterFolderError(f"{folder}: weights missing: {', '.join(missing[:4])}")
    bad = folders.nonfinite_names(model.state_dict())
    if bad:
        raise folders.DrafterFolderError(f"{folder}: {', '.join(bad[:4])} hold(s) NaN or infinite "
                                         "values; a drafter with such weights cannot draft")
    return model.eval()


def store_layers(text_config) -> dict[str, int]:
    """{attention type: index of the target layer whose keys/values Gemma 4 assistants read}."""
    modes = getattr(text_config, "kv_sharing_modes", None) or []
    types = getattr(text_config, "layer_types", None) or []
    return {types[i]: i for i, mode in enumerate(modes) if mode == "store"}


def _kv_shape(attn: nn.Module) -> tuple[int, int]:
    """(kv heads, head dim) of a Gemma 4 attention module."""
    return attn.config.num_attention_heads // attn.num_key_value_groups, attn.head_dim


def assistant_problems(assistant: nn.Module, target) -> list[str]:
    """Why a Gemma 4 assistant cannot serve a loaded ``target`` (one sentence each)."""
    tcfg = target.model.config.get_text_config()
    if not str(getattr(tcfg, "model_type", "")).startswith("gemma4"):
        return [f"a Gemma 4 assistant reads the keys/values of a Gemma 4 target; {target.spec} is "
                f"a {getattr(tcfg, 'model_type', 'different')} model"]
    problems = []
    hidden, rows = int(tcfg.hidden_size), int(target.model.get_input_embeddings().num_embeddings)
    if int(assistant.config.backbone_hidden_size) != hidden:
        problems.append(f"the assistant was trained on a target of hidden size "
                        f"{assistant.config.backbone_hidden_size}, this one has {hidden}: it "
                        "belongs to another Gemma 4 size")
    if int(assistant.vocab_size) != rows:
        problems.append(f"the assistant predicts {assistant.vocab_size:,} ids, the target has {rows:,}")
    store = store_layers(tcfg)
    decoder = target.model.get_decoder()
    for layer in assistant.model.layers:
        kind = layer.self_attn.layer_type
        if kind not in store:
            problems.append(f"the assistant reads {kind} keys/values but the target has no such layer")
            continue
        ours, theirs = _kv_shape(layer.self_attn), _kv_shape(decoder.layers[store[kind]].self_attn)
        if ours != theirs:
            problems.append(f"the assistant's {kind} layers expect {ours[0]} KV heads of size "
                            f"{ours[1]}, the target's layer {store[kind]} has {theirs[0]} of size "
                            f"{theirs[1]}")
    return list(dict.fromkeys(problems))


def assistant_store_layers(assistant: nn.Module, target: nn.Module) -> list[tuple[int, str]]:
    """(target layer index, attention kind) of the store layers whose keys/values a Gemma 4
    assistant attends to: one per attention kind its layers use, in layer order."""
    wanted = {layer.self_attn.layer_type for layer in assistant.model.layers}
    store = store_layers(target.config.get_text_config())
    return sorted((i, kind) for kind, i in store.items() if kind in wanted)


def assistant_feature_layers(assistant: nn.Module, target: nn.Module) -> tuple[int, ...]:
    """What a Gemma 4 assistant reads: the inputs of the store layers (to recompute their
    keys/values), then the last hidden state."""
    return tuple(i for i, _ in assistant_store_layers(assistant, target)) + (num_layers(target),)


class Gemma4AssistantDrafter(ModuleDrafter):
    """Drafting with a Gemma 4 assistant inside the engine (a FeatureDrafter).

    Args:
        assistant: a ``Gemma4AssistantForCausalLM``.
        target: the Gemma 4 target causal LM (its embeddings and store layers are used, not copied).
        vocab_size: V, the target's logits width.
        name: shown in stats and the UI.
    """

    def __init__(self, assistant: nn.Module, target: nn.Module, vocab_size: int,
                 name: str = ASSISTANT) -> None:
        self.assistant = assistant
        self.name = name
        self.vocab_size = vocab_size
        self._decoder = target.get_decoder()
        self._embed = target.get_input_embeddings()
        self._store = assistant_store_layers(assistant, target)
        self.feature_layers = assistant_feature_layers(assistant, target)
        self._kv: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
        self._last: torch.Tensor | None = None  # (1, 1, H) target's last hidden state
        self._n = 0  # context positions whose keys/values are held
        self._weight_bytes = param_bytes(assistant)

    def _store_kv(self, index: int, kind: str, hidden: torch.Tensor, positions: torch.Tensor):
        """Keys/values (1, kvh, n, d) of target layer ``index`` for (1, n, H) layer inputs, as
        ``Gemma4TextAttention.forward`` computes them."""
        from transformers.models.gemma4.modeling_gemma4 import apply_rotary_pos_emb
        layer = self._decoder.layers[index]
        attn = layer.self_attn
        x = layer.input_layernorm(hidden)
        shape = (*x.shape[:-1], -1, attn.head_dim)
        keys = attn.k_proj(x).view(shape)
        values = attn.v_proj(x).view(shape) if attn.v_proj is not None else keys
        cos, sin = self._decoder.rotary_emb(x, positions, kind)
        keys = apply_rotary_pos_emb(attn.k_norm(keys), cos, sin, unsqueeze_dim=2).transpose(1, 2)
        return keys, attn.v_norm(values).transpose(1, 2)

    @torch.inference_mode()
    def observe(self, features: torch.Tensor) -> None:
        n = features.shape[0]
        chunks = features.unsqueeze(0).split(features.shape[-1] // len(self.feature_layers), dim=-1)
        positions = torch.arange(self._n, self._n + n, device=features.device)[None]
        for (index, kind), hidden in zip(self._store, chunks):
            keys, values = self._store_kv(index, kind, hidden, positions)
            if kind in self._kv:
                keys = torch.cat([self._kv[kind][0], keys], dim=2)
                values = torch.cat([self._kv[kind][1], values], dim=2)
            self._kv[kind] = (keys, values)
        self._last = chunks[-1][:, -1:]
        self._n += n

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal([], source=self.name)
        if self._n != len(context) - 1:
            raise RuntimeError(f"Gemma 4 assistant out of step: keys/values for {self._n} "
                               f"positions, context has {len(context)} tokens")
        device = self._last.device
        position = torch.tensor([[len(context) - 1]], device=device)
        hidden, token = self._last, torch.tensor([context[-1]], device=device)
        sampler = DraftSampler(context, params, generator)
        dtype = next(self.assistant.parameters()).dtype  # the target's unless asked otherwise
        kv = {kind: (keys.to(dtype), values.to(dtype)) for kind, (keys, values) in self._kv.items()}
        for _ in range(k):
            embeds = self._embed(token.view(1, 1))
            out = self.assistant(inputs_embeds=torch.cat([embeds, hidden.to(embeds.dtype)], dim=-1).to(dtype),
                                 position_ids=position, shared_kv_states=kv)
            token = sampler.draw(fit_vocab(out.logits[0, -1].float(), self.vocab_size))
            hidden = out.last_hidden_state
        return sampler.proposal(self.name)

    @property
    def extra_memory_bytes(self) -> int:
        held = sum(t.numel() * t.element_size() for kv in self._kv.values() for t in kv)
        return self._weight_bytes + held


class NativeMtpDrafter(ModuleDrafter):
    """Drafting with a model's own MTP layers (transformers ``MtpModel``; a FeatureDrafter).

    Args:
        mtp: the ``MtpModel`` (embeddings, head and rotary shared with ``target``).
        target: the target causal LM.
        vocab_size: V, the target's logits width.
        name: shown in stats and the UI.
    """

    def __init__(self, mtp: nn.Module, target: nn.Module, vocab_size: int, name: str = NATIVE) -> None:
        from transformers.cache_utils import MtpCache
        self.mtp = mtp
        self.name = name
        self.vocab_size = vocab_size
        self.feature_layers = (num_layers(target),)  # the last hidden state, as transformers reads
        self._cache = MtpCache(config=target.config.get_mtp_config())
        self._cache.activate_past_recording()
        self._pending: list[torch.Tensor] = []
        self._n = 0  # accepted (hidden state, next token) pairs in the cache
        self._weight_bytes = param_bytes(mtp.layers)  # embeddings and head are the target's

    def observe(self, features: torch.Tensor) -> None:
        self._pending.append(features)

    def _step(self, hidden: torch.Tensor, ids: list[int] | torch.Tensor, start: int) -> torch.Tensor:
        """MTP layer 0 over pairs (hidden (1, n, H) at positions start.., token ids after them:
        a list or a (n,) long tensor on the device); returns its (1, n, H) outputs (cached under
        positions start + 1..)."""
        device = hidden.device
        ids = torch.as_tensor(ids, device=device).view(1, -1)
        positions = torch.arange(start + 1, start + 1 + ids.shape[1], device=device)[None]
        return self.mtp.forward_layer(0, hidden, positions, self._cache, input_ids=ids)

    @torch.inference_mode()
    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal([], source=self.name)
        if not self._pending:
            raise RuntimeError("MTP drafter: no new target features since the last round")
        feats = torch.cat(self._pending).unsqueeze(0)  # (1, n, H)
        self._pending.clear()
        start, n = self._n, feats.shape[1]
        if start + n != len(context) - 1:
            raise RuntimeError(f"MTP drafter out of step: features for {start + n} positions, "
                               f"context has {len(context)} tokens")
        hidden = self._step(feats.to(self.mtp.layers[0].eh_proj.weight.dtype),
                            context[start + 1:start + n + 1], start)[:, -1:]
        self._n = start + n
        sampler = DraftSampler(context, params, generator)
        for step in range(k):
            logits = self.mtp._project_to_logits(hidden)[0, -1].float()
            token = sampler.draw(fit_vocab(logits, self.vocab_size))
            if step + 1 < k:
                hidden = self._step(hidden, token, self._n + step)
        if k > 1:
            self._cache.crop(-(k - 1))  # keep only accepted pairs
        return sampler.proposal(self.name)



@dataclass
class LoadedAssistant(LoadedModule):
    """A loaded, checked Gemma 4 assistant, ready to make a fresh drafter per decode."""

    def new_drafter(self, target: nn.Module, vocab_size: int, name: str) -> Gemma4AssistantDrafter:
        return Gemma4AssistantDrafter(self.model, target, vocab_size, name)

    def feature_layers(self, target: nn.Module) -> tuple[int, ...]:
        return assistant_feature_layers(self.model, target)

    @property
    def summary(self) -> str:
        n = len(self.model.model.layers)
        return (f"Gemma 4 assistant ({n} layers) attending to the target's keys/values and last "
                "hidden state, drafting at one position")


@dataclass
class LoadedNativeMtp:
    """A target's own MTP layers, loaded from its checkpoint."""

    spec: str
    model: nn.Module
    warnings: list[str] = field(default_factory=list)
    load_s: float = 0.0

    def new_drafter(self, target: nn.Module, vocab_size: int, name: str) -> NativeMtpDrafter:
        return NativeMtpDrafter(self.model, target, vocab_size, name)

    def feature_layers(self, target: nn.Module) -> tuple[int, ...]:
        return (num_layers(target),)  # the last hidden state, as transformers reads

    @property
    def weight_bytes(self) -> int:
        return param_bytes(self.model.layers)

    @property
    def summary(self) -> str:
        n = len(self.model.layers)
        used = "its MTP layer" if n == 1 else f"the first of its {n} MTP layers"
        return f"the target's own multi-token prediction: {used}, chained for longer drafts"


def load_assistant_checked(spec: str, folder: Path, target,
                           dtype: torch.dtype = torch.float32) -> LoadedAssistant:
    """Load a Gemma 4 assistant folder and check it against a loaded ``target``.

    Raises:
        DrafterRefused: it cannot serve this target (one sentence per problem).
    """
    try:
        model = load_assistant(folder, dtype)
    except DrafterFolderError as exc:
        raise DrafterRefused(spec, target.spec, [str(exc)]) from None
    problems = assistant_problems(model, target)
    if problems:
        raise DrafterRefused(spec, target.spec, problems)
    return LoadedAssistant(spec, model.to(target.device), {"layout": "transformers"})


def load_native(target, dtype: torch.dtype | None = None) -> LoadedNativeMtp:
    """The MTP layers of a loaded ``target``, read from its own checkpoint (``--draft mtp``).

    Raises:
        DrafterRefused: the target has no MTP layers, or they cannot be read.
    """
    config = target.model.config.get_text_config()
    if not getattr(config, "num_mtp_layers", None):
        raise DrafterRefused(NATIVE, target.spec, [
            f"{target.spec} has no multi-token prediction layers (no num_mtp_layers in its "
            "config); --draft mtp needs a model that ships them, such as DeepSeek-V3 or GLM-4.5"])
    from transformers.modeling_layers import MtpModel
    try:
        model = MtpModel.from_pretrained(target.model, device_map={"": str(target.device)})
    except Exception as exc:  # missing files, missing keys: say which
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]
        raise DrafterRefused(NATIVE, target.spec,
                             [f"its MTP layers could not be read from its checkpoint ({first})"]) from None
    return LoadedNativeMtp(NATIVE, model.to(dtype or target.dtype).eval())
