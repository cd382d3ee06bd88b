"""Training a DFlash block drafter on the target's own features: the model, the block loss, the
loop with checkpoints and resume, and both saved layouts.

DFlash (z-lab, "DFlash: Block Diffusion for Flash Speculative Decoding", arXiv:2602.06036): a few
non-causal layers draft a block in one forward. Queries are the block (the anchor token and
``block_size - 1`` mask tokens, embedded with the target's frozen embeddings); keys/values are
the target's features at the positions before the anchor (outputs of the layers
``target_layer_ids``, ``hidden_states[k + 1]``, through ``fc`` and a norm) and the block itself.
Block position i (1..B-1) is read out by the target's frozen head and predicts the token at
anchor + i.

Training, as in the paper's recipe: frozen target, random anchors in each sequence, many blocks
per sequence in one forward (each block attends to the context before its anchor and to its own
positions only, through an explicit attention mask), loss weighted by block position
(``exp(-(i - 1) / gamma)``, the paper's position decay: early positions matter most since a
rejection ends the block). The label is the target's own distribution at the position before
(``lm_head(last[a + i - 1])``), so the drafter learns what *this* target says (KL divergence,
full vocabulary). The drafter's own layers start random; ``embed_tokens``/``lm_head`` are the
target's and are not saved.

Saved folders:

* transformers' layout (``MuseGlimmerAssistantModel.from_pretrained``; what our loader and
  transformers' ``DFlashTokenCandidateGenerator`` read): ``config.json`` with ``model_type:
  "muse_glimmer_assistant"``, ``target_layer_ids``, ``block_size``, ``mask_token_id``; weights
  ``encoder.fc``, ``encoder.output_norm_enc``, ``layers.*``, ``norm``.
* z-lab's layout (``zlab/``; what z-lab's ``dflash`` package and vLLM's ``qwen3_dflash.py``
  read): a Qwen3 ``config.json`` with ``architectures: ["DFlashDraftModel"]``,
  ``num_target_layers``, ``block_size``, ``dflash_config: {mask_token_id, target_layer_ids,
  block_size}`` and ``eagle_aux_hidden_state_layer_ids`` (the same layers in EAGLE-3's numbering,
  ids + 1: vLLM reads it first, and releases before its DFlash fallback read only it); weights ``fc.weight``, ``hidden_norm.weight``, ``layers.N.*`` (q/k/v/o_proj,
  q_norm, k_norm, mlp gate/up/down, input/post_attention_layernorm), ``norm.weight``; no
  ``embed_tokens``/``lm_head`` (vLLM shares the target's when absent).
"""

from __future__ import annotations

import copy
import json
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from ...core.drafters.features import dflash_indices, num_layers
from ...core.shape import ModelShape
from .train import LoopRecipe, StepLoss, TrainState, run_training
from ...core.drafters.dflash import ZLAB_RENAMES, noise_embeddings

ZLAB_DIR = "zlab"


@dataclass
class DFlashRecipe(LoopRecipe):
    """Everything that decides a DFlash result (saved in train.json and in checkpoints): the
    loop's settings (``train.LoopRecipe``) and the blocks'."""

    block_size: int = 8
    draft_layers: int = 2
    target_layer_ids: tuple[int, ...] = ()  # outputs of these target layers (DFlash numbering)
    mask_token_id: int = -1
    anchors_per_sequence: int = 16
    gamma: float = 4.0  # position weight exp(-(i - 1) / gamma)

    @property
    def feature_layers(self) -> tuple[int, ...]:
        """``hidden_states`` indices to capture (outputs of layers: id + 1)."""
        return dflash_indices(self.target_layer_ids)


def default_target_layers(n_layers: int, count: int) -> tuple[int, ...]:
    """``count`` evenly spaced target layers (DFlash ids: outputs of layers), z-lab's rule
    (``dflash.model.build_target_layer_ids``: from layer 1 to layer L-3); targets of fewer than
    6 layers use 0..L-1."""
    if count == 1:
        return (n_layers // 2,)
    start, end = (1, n_layers - 3) if n_layers >= 6 else (0, n_layers - 1)
    return tuple(sorted({round(start + i * (end - start) / (count - 1)) for i in range(count)}))


def pick_mask_token(counts: torch.Tensor, eos_ids) -> int:
    """The mask token: the id least used in the training data (the highest of those; never an
    EOS id), so its frozen embedding means nothing else to the drafter."""
    c = counts.clone().float()
    for e in eos_ids:
        c[int(e)] = float("inf")
    least = c.min()
    return int((c == least).nonzero().max())


def draft_layer_config(target, n_layers: int, vocab_size: int | None = None) -> dict:
    """The Qwen3-style config of ``n_layers`` draft layers shaped like ``target``'s (a
    ``models.LoadedModel``; ``core.shape.ModelShape``): hidden size, MLP width, heads, head
    width, ``vocab_size`` when given, RMSNorm epsilon, RoPE (``rope_parameters``, else the
    default rope of its ``rope_theta``), context length and activation. DFlash's and DSpark's
    drafters are built from it."""
    cfg = target.model.config.get_text_config()
    shape = ModelShape(cfg)
    rope = dict(getattr(cfg, "rope_parameters", None) or {}) or {
        "rope_type": "default", "rope_theta": float(getattr(cfg, "rope_theta", 10000.0))}
    widths = {"hidden_size": shape.hidden, "intermediate_size": shape.inter,
              "num_hidden_layers": n_layers, "num_attention_heads": shape.n_head,
              "num_key_value_heads": shape.n_kv, "head_dim": shape.head_dim}
    if vocab_size is not None:
        widths["vocab_size"] = vocab_size
    return {**widths, "rms_norm_eps": cfg.rms_norm_eps, "rope_parameters": rope,
            "max_position_embeddings": cfg.max_position_embeddings,
            "hidden_act": getattr(cfg, "hidden_act", "silu")}


def new_drafter(target, recipe: DFlashRecipe):
    """A fresh ``MuseGlimmerAssistantModel`` for ``target`` (a ``models.LoadedModel``): the
    target's hidden size, heads and RoPE (:func:`draft_layer_config`), ``recipe.draft_layers``
    layers, seeded init."""
    from transformers import MuseGlimmerAssistantConfig, MuseGlimmerAssistantModel
    layer = draft_layer_config(target, recipe.draft_layers)
    config = MuseGlimmerAssistantConfig(
        **layer, sliding_window=layer["max_position_embeddings"],
        layer_types=["full_attention"] * recipe.draft_layers, block_size=recipe.block_size,
        target_layer_ids=list(recipe.target_layer_ids), mask_token_id=recipe.mask_token_id,
        bos_token_id=None, eos_token_id=None, pad_token_id=None)
    torch.manual_seed(recipe.seed)
    model = MuseGlimmerAssistantModel(config)
    model.config.vocab_size = int(target.model.get_input_embeddings().num_embeddings)
    return model


def _anchors(item: dict, recipe: DFlashRecipe, gen: torch.Generator) -> list[int]:
    """Anchor positions a of one sequence (context = positions < a, the block starts at a)."""
    n = len(item["ids"])
    first = 1 if recipe.loss_on_prompt else max(1, item["n_prompt"] - 1)
    valid = torch.arange(first, n - 1)
    if len(valid) == 0:
        return []
    pick = torch.randperm(len(valid), generator=gen)[:recipe.anchors_per_sequence]
    return sorted(int(valid[i]) for i in pick)


def collate(items: list[dict], recipe: DFlashRecipe, gen: torch.Generator, shift: int = 0) -> dict:
    """One batch of blocks.

    Args:
        shift: 0 for DFlash (block slots 1..B-1 draft the tokens at anchor + 1..B-1); 1 for a
            drafter that samples from the anchor (DSpark's ``sample_from_anchor``: slots 0..B-1
            draft the tokens at anchor + 1..B).
    Returns:
        {"features" (S, T, F), "noise_ids" (S, M*B), "position_ids" (S, T + M*B),
        "mask" (S, 1, M*B, T + M*B) additive float, "label_pos" (S, M, B-1+shift) index into
        ``last`` (the position whose next-token distribution labels the slot), "prev_ids" (S, M,
        B-1+shift) the token at that position (the one before the drafted one), "valid" (S, M,
        B-1+shift) bool, "last" (S, T, H)}; S sequences padded to T, M anchors (blocks) each,
        B = ``block_size``.
    """
    b = recipe.block_size
    anchors = [_anchors(x, recipe, gen) for x in items]
    s, t, m = len(items), max(len(x["ids"]) for x in items), max(1, max(len(a) for a in anchors))
    steps = torch.arange(1 - shift, b)  # the block slots that draft
    feats = torch.zeros(s, t, items[0]["features"].shape[1])
    last = torch.zeros(s, t, items[0]["last"].shape[1])
    noise = torch.full((s, m, b), recipe.mask_token_id, dtype=torch.long)
    pos = torch.zeros(s, m, b, dtype=torch.long)
    allowed = torch.zeros(s, m * b, t + m * b, dtype=torch.bool)
    label_pos = torch.zeros(s, m, len(steps), dtype=torch.long)
    prev_ids = torch.zeros(s, m, len(steps), dtype=torch.long)
    valid = torch.zeros(s, m, len(steps), dtype=torch.bool)
    for i, (x, anc) in enumerate(zip(items, anchors)):
        n = len(x["ids"])
        ids = torch.as_tensor(x["ids"], dtype=torch.long)
        feats[i, :n] = x["features"].float()
        last[i, :n] = x["last"].float()
        for j in range(m):
            rows = slice(j * b, (j + 1) * b)
            allowed[i, rows, t + j * b:t + (j + 1) * b] = True  # its own block, both ways
            if j >= len(anc):
                continue  # a padding block: no context, no loss
            a = anc[j]
            noise[i, j, 0] = int(x["ids"][a])
            pos[i, j] = a + torch.arange(b)
            allowed[i, rows, :a] = True  # the context before the anchor
            label_pos[i, j] = (a + steps - 1 + shift).clamp(max=n - 1)
            prev_ids[i, j] = ids[label_pos[i, j]]
            valid[i, j] = a + steps - 1 + shift <= n - 1
    mask = torch.zeros(allowed.shape).masked_fill(~allowed, torch.finfo(torch.float32).min)
    position_ids = torch.cat([torch.arange(t).expand(s, t), pos.view(s, m * b)], dim=1)
    return {"features": feats, "noise_ids": noise.view(s, m * b), "position_ids": position_ids,
            "mask": mask.unsqueeze(1), "label_pos": label_pos, "prev_ids": prev_ids,
            "valid": valid, "last": last}


def block_loss(model, embeddings: torch.nn.Module, head_weight: torch.Tensor, batch: dict,
               recipe: DFlashRecipe) -> tuple[torch.Tensor, list[float]]:
    """Position-weighted KL(target || drafter) over the block positions, and top-1 agreement per
    block position.

    Args:
        embeddings: the target's input embeddings (frozen).
        head_weight: (V, H) the target's output head (frozen).
    Returns:
        (loss tensor, [agreement at block position i for i = 1..B-1]).
    """
    b = recipe.block_size
    with torch.no_grad():
        noise = noise_embeddings(embeddings, batch["noise_ids"]).float()
    masks = {"full_attention": batch["mask"], "sliding_attention": batch["mask"]}
    out = model(noise_embeds=noise, context_hidden_states=batch["features"],
                position_ids=batch["position_ids"], attention_mask=masks)
    s, mb, h = out.last_hidden_state.shape
    hidden = out.last_hidden_state.view(s, mb // b, b, h)[:, :, 1:]  # (S, M, B-1, H)
    idx = batch["label_pos"].view(s, -1, 1).expand(-1, -1, batch["last"].shape[-1])
    state = batch["last"].gather(1, idx).view(*batch["label_pos"].shape, -1)  # (S, M, B-1, H)
    total, weight, agree = 0.0, 0.0, []
    for i in range(b - 1):
        valid = batch["valid"][:, :, i]
        if not valid.any():
            agree.append(0.0)
            continue
        logits = hidden[:, :, i][valid] @ head_weight.T  # (N, V)
        with torch.no_grad():
            log_p = (state[:, :, i][valid] @ head_weight.T).log_softmax(-1)
            p = log_p.exp()
        loss = (p * (log_p - F.log_softmax(logits, dim=-1))).sum(-1).mean()
        w = math.exp(-i / recipe.gamma)
        total, weight = total + w * loss, weight + w
        agree.append(float((logits.argmax(-1) == p.argmax(-1)).float().mean()))
    return total / weight, agree


def train_blocks(model, target, items: list[dict], recipe: DFlashRecipe, out_dir: Path,
                 loss: Callable, *, shift: int = 0, desc: str, resume: bool = False,
                 max_steps: int | None = None) -> TrainState:
    """Train a block drafter (DFlash's, DSpark's) in place on feature ``items``
    (``data.capture_features`` with ``recipe.feature_layers``) in the shared loop
    (``train.run_training``): each step's batch is :func:`collate` (``shift``) of its items,
    its loss ``loss(model, embeddings, head_weight, batch, recipe)`` -> (loss tensor,
    agreement per block position), ``embeddings`` and ``head_weight`` ((V, H), float32) the
    target's frozen ones.

    Anchors are drawn from a generator seeded by (seed, step), so a resumed run draws the same
    blocks as an uninterrupted one.

    Args:
        resume: continue from ``out_dir/checkpoint.pt`` when it exists.
        max_steps: stop after this many optimiser steps in total.
        desc: the progress bar's words.
    Returns:
        The final state (losses per step, agreement per step and block position).
    Raises:
        KeyboardInterrupt: after writing a checkpoint, when interrupted.
    """
    def make_step() -> StepLoss:
        embeddings = target.model.get_input_embeddings()
        head_weight = target.model.get_output_embeddings().weight.detach().float()

        def step(batch_items: list[dict], n: int):
            gen = torch.Generator().manual_seed(recipe.seed * 1_000_003 + n)  # n: the optimiser step
            return loss(model, embeddings, head_weight, collate(batch_items, recipe, gen, shift), recipe)
        return step

    return run_training(model, list(model.parameters()), items, recipe, out_dir, make_step,
                        resume, max_steps, desc=desc, shown=4)


def train(model, target, items: list[dict], recipe: DFlashRecipe, out_dir: Path,
          resume: bool = False, max_steps: int | None = None) -> TrainState:
    """Train the DFlash ``model`` in place with the block loss (:func:`block_loss`) in
    :func:`train_blocks` (its arguments, its result, its errors)."""
    return train_blocks(model, target, items, recipe, out_dir, block_loss,
                        desc="training (DFlash)", resume=resume, max_steps=max_steps)


def save(model, folder: Path, target, dtype: torch.dtype = torch.bfloat16,
         verifier: str | None = None) -> Path:
    """Write ``model`` in transformers' layout in ``folder`` and in z-lab's layout in
    ``folder/zlab`` (see the module docstring for the keys each reads).

    Args:
        target: the ``models.LoadedModel`` it was trained for (its depth and vocabulary size go
            into the configs).
        dtype: dtype of the saved weights.
        verifier: the target's name recorded in z-lab's config (``dflash_config.target_model``).
    Returns:
        ``folder``.
    """
    from safetensors.torch import save_file

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    out = copy.deepcopy(model).to(dtype)
    out.config.vocab_size = int(target.model.get_input_embeddings().num_embeddings)
    out.save_pretrained(folder)
    cfg = out.config
    z = folder / ZLAB_DIR
    z.mkdir(exist_ok=True)
    back = {v: k for k, v in ZLAB_RENAMES.items()}
    state = {back.get(k, k): v.contiguous() for k, v in out.state_dict().items()
             if not k.startswith("rotary_emb")}
    save_file(state, str(z / "model.safetensors"), metadata={"format": "pt"})
    for weights in folder.rglob("*.safetensors"):  # written through private temporary files (0600)
        os.chmod(weights, 0o644)
    dflash_config = {"mask_token_id": int(cfg.mask_token_id),
                     "target_layer_ids": [int(i) for i in cfg.target_layer_ids],
                     "block_size": int(cfg.block_size)}
    if verifier:
        dflash_config["target_model"] = verifier
    rope = dict(cfg.rope_parameters)
    (z / "config.json").write_text(json.dumps({
        "architectures": ["DFlashDraftModel"], "model_type": "qwen3",
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers, "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads, "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act, "rms_norm_eps": cfg.rms_norm_eps,
        "max_position_embeddings": cfg.max_position_embeddings,
        "rope_theta": float(rope.get("rope_theta", 10000.0)), "rope_parameters": rope,
        "attention_bias": False, "tie_word_embeddings": False,
        "layer_types": ["full_attention"] * cfg.num_hidden_layers,
        "vocab_size": int(out.config.vocab_size), "num_target_layers": num_layers(target.model),
        "block_size": int(cfg.block_size), "dflash_config": dflash_config,
        # vLLM reads these before dflash_config (older releases read only these): EAGLE-3's
        # numbering, inputs of layers, so DFlash's ids + 1
        "eagle_aux_hidden_state_layer_ids": [int(i) + 1 for i in cfg.target_layer_ids],
        "torch_dtype": str(dtype).removeprefix("torch.")}, indent=2) + "\n")
    return folder


def recipe_dict(recipe: DFlashRecipe) -> dict:
    return {**asdict(recipe), "feature_layers": list(recipe.feature_layers)}
