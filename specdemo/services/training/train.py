"""Training an EAGLE-3 head on the target's own features: the loop, checkpoints, resume.

Recipe after EAGLE-3 (Li et al. 2025, section 3) and SGLang SpecForge: frozen target; the draft
vocabulary = the most frequent target tokens in the generated data (``d2t``/``t2d``); the head's
``lm_head`` starts from those rows of the target's head, ``fc`` from the deepest feature layer
and the decoder layer close to the identity (so training starts from the target's own late-layer
read-out rather than noise); training-time test unrolls ``ttt_steps``
draft steps on the head's own outputs, step j weighted ``step_decay ** j``; the loss is the KL
divergence from the target's distribution (restricted to the draft vocabulary), at answer
positions and (``loss_on_prompt``, default) prompt positions too: the label is the target's own
prediction there, not the prompt's text, so every captured position teaches the head. AdamW with warm-up and cosine decay.

A checkpoint (head, optimiser, position in the data, loss history) is written every
``checkpoint_every_s`` seconds and on Ctrl-C; ``resume`` continues from it with the same batch
order, so the loss curve continues where it stopped.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from tqdm.auto import tqdm
from transformers import LlamaConfig

from ...core.drafters.eagle import Eagle3Head
from ...core.drafters.features import capture
from ...core.drafters.vocab import build_maps
from ...core.shape import ModelShape
from ...models.learned import verifier_name

CHECKPOINT = "checkpoint.pt"


@dataclass
class LoopRecipe:
    """The settings of the answers and of the shared loop (:func:`run_training`) that every
    drafter kind's recipe holds: :class:`Recipe` (EAGLE-3), ``dflash_train.DFlashRecipe``
    (and DSpark's)."""

    epochs: int = 3
    learning_rate: float = 1e-3
    warmup_steps: int = 20
    batch_tokens: int = 1024
    weight_decay: float = 0.0
    answers_per_prompt: int = 2
    temperature: float | tuple[float, ...] = 0.7  # answers 1.. (answer 0 is greedy); a tuple is used in turn
    max_new_tokens: int = 128
    seed: int = 0
    checkpoint_every_s: float = 180.0
    loss_on_prompt: bool = True  # the target's distribution is a label at prompt positions too
    train_dtype: str = "float32"  # "bfloat16": the forward and backward under autocast (weights stay float32)


@dataclass
class Recipe(LoopRecipe):
    """Everything that decides the result (saved in train.json and in checkpoints)."""

    draft_vocab_size: int = 8192
    ttt_steps: int = 3
    step_decay: float = 0.8
    feature_layers: tuple[int, ...] = ()
    feature_noise: float = 0.0  # Gaussian noise on the input features, times each vector's RMS
    train_budget_s: float | None = None  # fit the learning-rate schedule to this many seconds of training


@dataclass
class TrainState:
    step: int = 0
    epoch: int = 0
    batch_in_epoch: int = 0
    losses: list[float] = field(default_factory=list)
    accuracy: list[list[float]] = field(default_factory=list)  # per step: top-1 agreement per TTT step
    seconds: float = 0.0
    planned: int = 0  # the learning-rate schedule's length in steps (fixed once known; kept across resumes)


def new_head(target, recipe: Recipe, token_counts: torch.Tensor) -> Eagle3Head:
    """A fresh head for ``target``: its layer shapes, the draft vocabulary from ``token_counts``,
    ``lm_head`` initialised from the target's head rows of that vocabulary."""
    cfg = target.model.config.get_text_config()
    shape = ModelShape(cfg)
    layer = LlamaConfig(vocab_size=target.vocab_size, hidden_size=shape.hidden,
                        intermediate_size=shape.inter, num_attention_heads=shape.n_head,
                        num_key_value_heads=shape.n_kv, head_dim=shape.head_dim,
                        rms_norm_eps=cfg.rms_norm_eps,
                        max_position_embeddings=cfg.max_position_embeddings,
                        rope_parameters=getattr(cfg, "rope_parameters", None))
    torch.manual_seed(recipe.seed)
    layer.num_hidden_layers = 1  # the head's own draft layers, as its config.json says
    # a target built from a GGUF has no config.architectures: its transformers class names it
    architectures = list(getattr(target.model.config, "architectures", None) or [])
    if not architectures and type(target.model).__name__.endswith("ForCausalLM"):
        architectures = [type(target.model).__name__]
    head = Eagle3Head(layer, recipe.draft_vocab_size, recipe.feature_layers,
                      verifier={"name_or_path": verifier_name(target), "architectures": architectures})
    head = head.to(target.device)  # built where the target runs: its features, embeddings, head
    d2t, t2d = build_maps(token_counts, recipe.draft_vocab_size)
    head.d2t.copy_(d2t)
    head.t2d.copy_(t2d)
    with torch.no_grad():  # start as the target's late layers read out by its own head
        head.lm_head.weight.copy_(target.model.get_output_embeddings().weight[head.draft_ids()])
        head.norm.weight.copy_(_final_norm(target.model).weight)
        h = head.config.hidden_size
        head.fc.weight.zero_()
        head.fc.weight[:, -h:].copy_(torch.eye(h))  # fc(features) = the deepest feature layer
        layer = head.layers[0]
        layer.self_attn.o_proj.weight.mul_(0.1)  # the layer starts close to the identity
        layer.mlp.down_proj.weight.mul_(0.1)
    head.attach(target.model.get_input_embeddings())
    return head


def placement_problems(head: Eagle3Head, target, batch=()) -> list[str]:
    """Why ``head`` and a training ``batch`` (tensors) cannot train together with ``target``:
    every parameter and buffer of the head, and every batch tensor, must be on the target's
    device; the head's floating parameters in float32. One sentence each; [] when fine."""
    problems = []
    device = torch.device(target.device)
    for name, tensor in [*head.named_parameters(), *head.named_buffers()]:
        if tensor.device.type != device.type:
            problems.append(f"head tensor {name} is on {tensor.device}, the target on {device}")
        elif tensor.is_floating_point() and not name.startswith("embed_tokens") \
                and tensor.dtype != torch.float32:
            problems.append(f"head tensor {name} is {tensor.dtype}, training needs float32")
    for i, tensor in enumerate(batch):
        if isinstance(tensor, torch.Tensor) and tensor.device.type != device.type:
            problems.append(f"batch tensor {i} is on {tensor.device}, the target on {device}")
    return problems


def preflight(target, recipe: Recipe) -> None:
    """One training step of a throwaway head on a made-up batch, on the target's device, before
    the hour of generation and capture: a placement or dtype mistake fails here in seconds.

    Raises:
        RuntimeError: the head or the batch is misplaced (the problems), or the step fails.
    """
    counts = torch.ones(target.vocab_size, dtype=torch.long)
    head = new_head(target, replace(recipe, draft_vocab_size=min(recipe.draft_vocab_size,
                                                                  target.vocab_size)), counts)
    hidden = head.config.hidden_size
    n = 6
    item = {"ids": torch.arange(n) % target.vocab_size, "n_prompt": 2,
            "features": torch.zeros(n, hidden * len(head.feature_layers)),
            "last": torch.zeros(n, hidden)}
    batch = to_device(collate([item, item], recipe.ttt_steps), target.device)
    problems = placement_problems(head, target, batch)
    if problems:
        raise RuntimeError("train-draft cannot train on this placement: " + "; ".join(problems))
    target_head = target.model.get_output_embeddings().weight[head.draft_ids()].detach().float()
    loss, _ = ttt_loss(head, target_head, batch, recipe)
    loss.backward()
    for p in target.model.parameters():  # the head's attached embeddings are the target's
        p.grad = None


def to_device(batch, device):
    """A collated batch with every tensor on ``device``."""
    return tuple(t.to(device) if isinstance(t, torch.Tensor) else t for t in batch)


def _final_norm(model: torch.nn.Module) -> torch.nn.Module:
    return model.model.norm


def token_counts(items: list[dict], vocab_size: int) -> torch.Tensor:
    """(V,) how often each id occurs in the answers (prompt tokens excluded)."""
    counts = torch.zeros(vocab_size, dtype=torch.long)
    for item in items:
        answer = item["ids"][item["n_prompt"]:].long()
        counts += torch.bincount(answer, minlength=vocab_size)[:vocab_size]
    return counts


def batches(items: list[dict], batch_tokens: int, seed: int) -> list[list[int]]:
    """Item indices grouped by similar length into batches of ~batch_tokens padded tokens,
    in a seeded order."""
    order = sorted(range(len(items)), key=lambda i: len(items[i]["ids"]))
    out, current, width = [], [], 0
    for i in order:
        n = len(items[i]["ids"])
        if current and max(width, n) * (len(current) + 1) > batch_tokens:
            out.append(current)
            current, width = [], 0
        current.append(i)
        width = max(width, n)
    if current:
        out.append(current)
    random.Random(seed).shuffle(out)
    return out


def collate(items: list[dict], steps: int, loss_on_prompt: bool = False):
    """Pad a batch. Returns features (B, T, F), ids (B, T + steps + 1), last (B, T + steps + 1, H),
    answer (B, T + steps + 1) bool (a token at that index belongs to an answer, or is the
    prediction after the last token) and lengths (B,)."""
    n_max = max(len(x["ids"]) for x in items)
    t = n_max - 1  # pairs (feature at t, token at t + 1)
    width = t + steps + 1
    b = len(items)
    f = items[0]["features"].shape[-1]
    h = items[0]["last"].shape[-1]
    features = torch.zeros(b, t, f)
    ids = torch.zeros(b, width, dtype=torch.long)
    last = torch.zeros(b, width, h)
    answer = torch.zeros(b, width, dtype=torch.bool)
    for i, x in enumerate(items):
        n = len(x["ids"])
        features[i, :n - 1] = x["features"][:n - 1].float()
        ids[i, :n] = x["ids"].long()
        last[i, :n] = x["last"].float()
        first = 2 if loss_on_prompt else x["n_prompt"]
        answer[i, first:n + 1] = True  # answer tokens, and the prediction after the last
    lengths = torch.tensor([len(x["ids"]) for x in items])
    return features, ids, last, answer, lengths


@torch.no_grad()
def with_features(target, items: list[dict], indices: tuple[int, ...]) -> list[dict]:
    """``items`` ({"ids" (N,), "n_prompt"}) with the target's "features" (N, F) and "last" (N, H)
    computed now, in one right-padded forward on the target's device (online training: nothing
    stored, as SpecForge's online mode; the features are the target's in the step's autocast
    dtype)."""
    width = max(len(x["ids"]) for x in items)
    ids = torch.zeros(len(items), width, dtype=torch.long)
    mask = torch.zeros(len(items), width, dtype=torch.long)
    for i, x in enumerate(items):
        ids[i, :len(x["ids"])] = x["ids"].long()
        mask[i, :len(x["ids"])] = 1
    feats, last = capture(target.model, ids.to(target.device), indices, mask.to(target.device))
    return [{**x, "features": feats[i, :len(x["ids"])].float(), "last": last[i, :len(x["ids"])].float()}
            for i, x in enumerate(items)]


def ttt_loss(head: Eagle3Head, target_head: torch.Tensor, batch, recipe: Recipe):
    """Weighted TTT loss and top-1 agreement per step.

    Args:
        target_head: (Vd, H) the target's head rows of the draft vocabulary (frozen).
    Returns:
        (loss tensor, [agreement of step j]).
    """
    features, ids, last, answer, lengths = batch
    noise = getattr(recipe, "feature_noise", 0.0)
    if noise and head.training:  # robustness to features from other forwards (int8, BF16)
        rms = features.pow(2).mean(-1, keepdim=True).sqrt()  # (B, T, 1)
        features = features + noise * rms * torch.randn_like(features)
    t = features.shape[1]
    anchors = torch.arange(t, device=features.device).unsqueeze(0)  # (1, T)
    hidden = head.ttt_forward(features, ids, recipe.ttt_steps, logits=False)
    total, weight, agree = 0.0, 0.0, []
    for j, h in enumerate(hidden):
        # anchor a predicts the token at a + 2 + j from the target's state at a + 1 + j
        valid = answer[:, 2 + j:2 + j + t] & (anchors + 1 + j < lengths.unsqueeze(1))  # (B, T)
        state = last[:, 1 + j:1 + j + t][valid]          # (M, H)
        logits = head.lm_head(h[valid])                  # (M, Vd)
        with torch.no_grad():
            log_p = (state @ target_head.T).log_softmax(-1)
            p = log_p.exp()
        # KL(p || q): 0 when the head matches the target (cross entropy minus p's entropy)
        loss = (p * (log_p - F.log_softmax(logits, dim=-1))).sum(-1).mean()
        w = recipe.step_decay ** j
        total, weight = total + w * loss, weight + w
        agree.append(float((logits.argmax(-1) == p.argmax(-1)).float().mean()) if len(p) else 0.0)
    return total / weight, agree


def _lr(step: int, total: int, recipe: Recipe) -> float:
    if step < recipe.warmup_steps:
        return recipe.learning_rate * (step + 1) / recipe.warmup_steps
    progress = (step - recipe.warmup_steps) / max(1, total - recipe.warmup_steps)
    return recipe.learning_rate * 0.5 * (1 + math.cos(math.pi * min(progress, 1.0)))


def save_checkpoint(path: Path, head: Eagle3Head, optimizer, state: TrainState, recipe: Recipe) -> None:
    tmp = path.with_suffix(".tmp")
    torch.save({"head": head.state_dict(), "optimizer": optimizer.state_dict(),
                "state": asdict(state), "recipe": asdict(recipe)}, tmp)
    tmp.rename(path)  # never a half-written checkpoint


def autocast(model: torch.nn.Module, recipe):
    """The context a training step runs in: ``torch.autocast`` to bfloat16 on the model's device
    when ``recipe.train_dtype`` is "bfloat16" (matrix products in bfloat16, float32 master
    weights, losses and softmaxes in float32, as SpecForge and speculators train drafters), else
    a no-op.

    Raises:
        ValueError: another ``train_dtype``.
    """
    dtype = getattr(recipe, "train_dtype", "float32")
    if dtype not in ("float32", "bfloat16"):
        raise ValueError(f"train_dtype {dtype!r}: float32 or bfloat16")
    device = next(model.parameters()).device.type
    return torch.autocast(device, dtype=torch.bfloat16, enabled=dtype == "bfloat16")


StepLoss = Callable[[list[dict], int], tuple[torch.Tensor, list[float]]]
TIMING_STEPS = 12  # steps timed before a time budget fixes the schedule's length


def run_training(model: torch.nn.Module, params: list[torch.nn.Parameter], items: list[dict],
                 recipe, out_dir: Path, make_step: Callable[[], StepLoss], resume: bool = False,
                 max_steps: int | None = None, desc: str = "training",
                 shown: int | None = None) -> TrainState:
    """The training loop every drafter kind shares: train ``params`` of ``model`` in place on
    feature ``items`` with the loss ``make_step`` returns.

    AdamW (``recipe.learning_rate``, ``recipe.weight_decay``) with linear warm-up over
    ``recipe.warmup_steps`` and cosine decay to 0 over ``recipe.epochs`` epochs, gradients
    clipped to norm 1; each epoch's batches of ~``recipe.batch_tokens`` padded tokens in an
    order seeded by ``recipe.seed + epoch`` (:func:`batches`). With ``recipe.train_budget_s``,
    the schedule's length is fixed after the first ``TIMING_STEPS`` steps to the steps that fit
    the budget at their pace (never more than the epochs give), so that a run on a machine of
    unknown speed (a GPU lent for minutes) still decays its learning rate to 0. A checkpoint (``model`` under
    "head", optimiser, :class:`TrainState`, recipe) is written to ``out_dir/checkpoint.pt``
    every ``recipe.checkpoint_every_s`` seconds, at the end and on Ctrl-C; ``resume`` loads it
    and continues with the same batch order and schedule, so the loss curve is the one an
    uninterrupted run draws.

    Args:
        params: the parameters the optimiser updates (a subset of ``model``'s: frozen shared
            tensors left out).
        recipe: a dataclass with the fields above (:class:`Recipe`, ``DFlashRecipe``).
        make_step: called once, after any checkpoint is loaded; returns ``step(batch_items,
            n)`` -> (scalar loss tensor, [top-1 agreement per draft position]) for the items
            of one batch at optimiser step ``n`` (0-based, counted across resumes).
        max_steps: stop after this many optimiser steps in total (for tests and smaller recipes).
        desc: the progress bar's label.  shown: how many agreements the progress bar shows
            (None: all).
    Returns:
        The final state (losses per step, agreement per step and draft position).
    Raises:
        KeyboardInterrupt: after writing a checkpoint, when interrupted.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    optimizer = torch.optim.AdamW(params, lr=recipe.learning_rate, weight_decay=recipe.weight_decay)
    state = TrainState()
    ckpt = out_dir / CHECKPOINT
    if resume and ckpt.exists():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        model.load_state_dict(saved["head"])
        optimizer.load_state_dict(saved["optimizer"])
        state = TrainState(**saved["state"])
    step_loss = make_step()
    per_epoch = len(batches(items, recipe.batch_tokens, recipe.seed))
    planned = state.planned or per_epoch * recipe.epochs  # the learning-rate schedule's length
    budget_s = getattr(recipe, "train_budget_s", None)
    total = min(planned, max_steps or planned)
    bar = tqdm(total=total, initial=state.step, desc=desc, unit="step")
    last_save = paced = time.perf_counter()
    model.train()
    try:
        while state.step < total:
            order = batches(items, recipe.batch_tokens, recipe.seed + state.epoch)
            for b in range(state.batch_in_epoch, len(order)):
                if state.step >= total:
                    break
                start = time.perf_counter()
                for group in optimizer.param_groups:
                    group["lr"] = _lr(state.step, planned, recipe)
                with autocast(model, recipe):
                    loss, agree = step_loss([items[i] for i in order[b]], state.step)
                optimizer.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(params, 1.0)
                optimizer.step()
                state.step += 1
                state.batch_in_epoch = b + 1
                state.losses.append(float(loss.detach()))
                state.accuracy.append(agree)
                state.seconds += time.perf_counter() - start
                if budget_s and not state.planned and state.step == TIMING_STEPS:
                    # the schedule fits the time budget: steps at the pace of steps 2..TIMING_STEPS
                    pace_s = (time.perf_counter() - paced) / (TIMING_STEPS - 1)
                    planned = min(planned, max(TIMING_STEPS, int(budget_s / pace_s)))
                    total = min(planned, max_steps or planned)
                    bar.total = total
                if state.step == 1:
                    paced = time.perf_counter()
                if state.step >= TIMING_STEPS or not budget_s:
                    state.planned = planned
                bar.update(1)
                bar.set_postfix(loss=f"{state.losses[-1]:.3f}", top1=" ".join(f"{a:.2f}" for a in agree[:shown]))
                if time.perf_counter() - last_save > recipe.checkpoint_every_s:
                    save_checkpoint(ckpt, model, optimizer, state, recipe)
                    last_save = time.perf_counter()
            else:
                state.epoch += 1
                state.batch_in_epoch = 0
    except KeyboardInterrupt:
        save_checkpoint(ckpt, model, optimizer, state, recipe)
        bar.close()
        raise
    save_checkpoint(ckpt, model, optimizer, state, recipe)
    bar.close()
    model.eval()
    return state


def train(head: Eagle3Head, target, items: list[dict], recipe: Recipe, out_dir: Path,
          resume: bool = False, max_steps: int | None = None) -> TrainState:
    """Train ``head`` in place on feature ``items`` (see ``data.capture_features``) with the
    training-time-test loss (:func:`ttt_loss`) in the shared loop (:func:`run_training`).

    Args:
        max_steps: stop after this many optimiser steps in total (for tests and smaller recipes).
        resume: continue from ``out_dir/checkpoint.pt`` when it exists.
    Returns:
        The final state (losses per step, agreement per step and TTT step).
    Raises:
        KeyboardInterrupt: after writing a checkpoint, when interrupted.
    """
    params = [p for n, p in head.named_parameters() if not n.startswith("embed_tokens")]

    def make_step() -> StepLoss:  # after resume: the loaded head's draft vocabulary
        target_head = target.model.get_output_embeddings().weight[head.draft_ids()].detach().float()

        def step(batch_items: list[dict], n: int):
            if "features" not in batch_items[0]:  # online: the target's features of this batch, now
                batch_items = with_features(target, batch_items, recipe.feature_layers)
            batch = to_device(collate(batch_items, recipe.ttt_steps, recipe.loss_on_prompt),
                              target_head.device)
            return ttt_loss(head, target_head, batch, recipe)
        return step

    return run_training(head, params, items, recipe, out_dir, make_step, resume, max_steps)
