"""Training a DSpark drafter on the target's own features: the model, the block loss with the
Markov head and the confidence head, and the saved folder (speculators' layout).

DSpark (DeepSeek's DeepSpec; recipe after vLLM speculators 0.9.0 ``models/dspark``): DFlash's
block drafter (:mod:`.dflash_train`: random anchors, many blocks per sequence in one forward,
each attending to the context before its anchor and to its own block) whose every block slot
drafts (``sample_from_anchor``: slot j predicts the token after anchor + j), with

* the Markov head's bias on each slot's logits, keyed on the token before the drafted one (the
  training data's token there: teacher forcing, as speculators' ``prev_token_ids``);
* the confidence head trained to predict each slot's acceptance rate ``1 - TV(p, q) =
  sum_v min(p_v, q_v)`` (speculators ``dspark/metrics.py``) with a binary cross-entropy.

loss = sum_j w_j KL(p_j || q_j) / sum_j w_j + alpha * sum_j w_j BCE(c_j, 1 - TV_j) / sum_j w_j,
``w_j = exp(-j / gamma)`` (speculators' ``dflash_loss_decay`` from slot 0 with
``sample_from_anchor``), p the target's distribution (full vocabulary, its frozen head), q the
drafter's biased one. The target's embeddings and head are shared and frozen; the drafter's own
layers and heads start random.

The target layers it reads default to speculators' (``resolve_target_layer_ids``): hidden states
[2, L//2, L-3], EAGLE-3's, so the two train on the same captured features.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from ...core.drafters import dspark
from ...core.drafters.features import eagle3_default_layers
from .dflash_train import DFlashRecipe, default_target_layers, draft_layer_config, train_blocks
from .train import TrainState


@dataclass
class DSparkRecipe(DFlashRecipe):
    """Everything that decides a DSpark result: DFlash's recipe (its ``target_layer_ids`` in
    DFlash's numbering, outputs of layers; ``feature_layers`` = ids + 1 are the hidden states
    saved as ``aux_hidden_state_layer_ids``) and the heads'."""

    markov_rank: int = 256
    markov_head_type: str = "vanilla"
    confidence_alpha: float = 1.0


def default_target_layers_dspark(n_layers: int) -> tuple[int, ...]:
    """DFlash-numbered ids of speculators' default DSpark layers, hidden states [2, L//2, L-3]
    (EAGLE-3's); for targets too shallow for three distinct ones, DFlash's evenly spaced three."""
    states = eagle3_default_layers(n_layers)
    if min(states) >= 1 and len(set(states)) == len(states):
        return tuple(sorted(i - 1 for i in states))
    return default_target_layers(n_layers, 3)


def new_drafter(target, recipe: DSparkRecipe, verifier: str | None = None) -> dspark.DSparkModel:
    """A fresh :class:`DSparkModel` for ``target`` (a ``models.LoadedModel``): the target's hidden
    size, heads and RoPE (``dflash_train.draft_layer_config``), ``recipe.draft_layers`` layers, the full vocabulary, seeded init
    (speculators': the Markov embedding from N(0, 0.01))."""
    layer = draft_layer_config(target, recipe.draft_layers,
                               int(target.model.get_input_embeddings().num_embeddings))
    config = dspark.new_config(layer, recipe.feature_layers, recipe.block_size,
                               recipe.mask_token_id, markov_rank=recipe.markov_rank,
                               markov_head_type=recipe.markov_head_type, verifier=verifier,
                               verifier_architectures=getattr(target.model.config,
                                                              "architectures", None) or ())
    torch.manual_seed(recipe.seed)
    model = dspark.DSparkModel(config)
    if model.markov_head is not None:
        torch.nn.init.normal_(model.markov_head.markov_w1.weight, std=0.01)
    return model


def block_loss(model: dspark.DSparkModel, embeddings: torch.nn.Module, head_weight: torch.Tensor,
               batch: dict, recipe: DSparkRecipe) -> tuple[torch.Tensor, list[float]]:
    """The DSpark loss (module docstring) of one :func:`dflash_train.collate` batch (``shift``
    1), and top-1 agreement per block slot.

    Args:
        embeddings: the target's input embeddings (frozen; their rows, unscaled, as speculators).
        head_weight: (V, H) the target's output head (frozen).
    Returns:
        (loss tensor, [agreement of slot j with the target's argmax, j = 0..B-1]).
    """
    b = recipe.block_size
    with torch.no_grad():
        noise = F.embedding(batch["noise_ids"], embeddings.weight).float()
    masks = {"full_attention": batch["mask"], "sliding_attention": batch["mask"]}
    out = model.backbone(noise_embeds=noise, context_hidden_states=batch["features"],
                         position_ids=batch["position_ids"], attention_mask=masks)
    s, mb, h = out.last_hidden_state.shape
    hidden = out.last_hidden_state.view(s, mb // b, b, h)  # (S, M, B, H): every slot drafts
    idx = batch["label_pos"].view(s, -1, 1).expand(-1, -1, batch["last"].shape[-1])
    state = batch["last"].gather(1, idx).view(*batch["label_pos"].shape, -1)  # (S, M, B, H)
    markov, rnn = model.markov_head, None
    total, conf_total, weight, agree = 0.0, 0.0, 0.0, []
    for j in range(b):
        valid = batch["valid"][:, :, j]
        emb = markov.markov_w1(batch["prev_ids"][:, :, j]) if markov is not None else None
        logits = hidden[:, :, j] @ head_weight.T  # (S, M, V)
        if markov is not None:  # over every block, padding too: the rnn state runs along
            bias, rnn = markov.bias(emb, hidden[:, :, j], rnn)
            logits = logits + bias
        if not valid.any():
            agree.append(0.0)
            continue
        q_log = F.log_softmax(logits[valid], dim=-1)  # (N, V)
        with torch.no_grad():
            log_p = (state[:, :, j][valid] @ head_weight.T).log_softmax(-1)
            p = log_p.exp()
        w = math.exp(-j / recipe.gamma)
        total = total + w * (p * (log_p - q_log)).sum(-1).mean()
        if model.confidence_head is not None:
            with torch.no_grad():
                accept = torch.minimum(p, q_log.exp()).sum(-1).clamp(0.0, 1.0)  # 1 - TV(p, q)
            c = model.confidence_logit(hidden[:, :, j][valid],
                                       emb[valid] if emb is not None else None)
            conf_total = conf_total + w * F.binary_cross_entropy_with_logits(c, accept)
        weight += w
        agree.append(float((q_log.argmax(-1) == p.argmax(-1)).float().mean()))
    return (total + recipe.confidence_alpha * conf_total) / weight, agree


def train(model: dspark.DSparkModel, target, items: list[dict], recipe: DSparkRecipe,
          out_dir: Path, resume: bool = False, max_steps: int | None = None) -> TrainState:
    """Train the DSpark ``model`` in place with :func:`block_loss` in
    ``dflash_train.train_blocks`` (batches of ``shift`` 1; its arguments, its result, its
    errors)."""
    return train_blocks(model, target, items, recipe, out_dir, block_loss, shift=1,
                        desc="training (DSpark)", resume=resume, max_steps=max_steps)


def save(model: dspark.DSparkModel, folder: Path, dtype: torch.dtype = torch.bfloat16,
         verifier: str | None = None) -> Path:
    """Write ``model`` in speculators' layout (:func:`dspark.save_dspark`), recording
    ``verifier`` (the target's hub id) as speculators' ``speculators_config.verifier``."""
    if verifier:
        model.config["speculators_config"]["verifier"]["name_or_path"] = verifier
    return dspark.save_dspark(model, folder, dtype=dtype)
