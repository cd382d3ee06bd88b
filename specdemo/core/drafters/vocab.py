"""Draft vocabulary maps shared by learned drafters (EAGLE-3's reduced head).

A draft head may predict over a subset of the target's vocabulary (the most frequent target
tokens), which makes its output layer several times smaller. Two tensors map between them, in the
layout of SafeAILab EAGLE-3 and vLLM speculators:

* ``d2t`` (Vd,) int64 offsets: ``target_id = draft_id + d2t[draft_id]``;
* ``t2d`` (V,) bool: whether a target id is in the draft vocabulary.
"""

from __future__ import annotations

import torch


def build_maps(token_counts: torch.Tensor, draft_vocab_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The draft vocabulary = the ``draft_vocab_size`` most frequent target ids.

    Args:
        token_counts: (V,) how often each target id occurs in the training data.
        draft_vocab_size: Vd, 1 <= Vd <= V.
    Returns:
        (d2t (Vd,) int64, t2d (V,) bool); draft ids are the chosen target ids in increasing order.
    Raises:
        ValueError: Vd outside 1..V.
    """
    vocab = token_counts.numel()
    if not 1 <= draft_vocab_size <= vocab:
        raise ValueError(f"draft vocabulary size must be in 1..{vocab}, got {draft_vocab_size}")
    # stable: ties broken by lower id, so the same counts always give the same vocabulary
    order = torch.argsort(-token_counts.to(torch.float64), stable=True)[:draft_vocab_size]
    chosen = order.sort().values
    d2t = chosen - torch.arange(draft_vocab_size)
    t2d = torch.zeros(vocab, dtype=torch.bool)
    t2d[chosen] = True
    return d2t.long(), t2d


def target_ids(d2t: torch.Tensor) -> torch.Tensor:
    """(Vd,) the target id of every draft id."""
    return torch.arange(d2t.numel(), device=d2t.device) + d2t


def expand_logits(draft_logits: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(..., Vd) draft-vocabulary logits -> (..., V) target-vocabulary logits, -inf elsewhere."""
    out = draft_logits.new_full((*draft_logits.shape[:-1], vocab_size), float("-inf"))
    out[..., ids] = draft_logits
    return out


def map_problems(d2t: torch.Tensor | None, t2d: torch.Tensor | None, draft_vocab_size: int,
                 vocab_size: int) -> list[str]:
    """What is wrong with a head's vocabulary maps for a target of ``vocab_size`` ids (one
    sentence each; empty when they are usable)."""
    if draft_vocab_size > vocab_size:
        return [f"the draft head predicts {draft_vocab_size} ids but the target has only "
                f"{vocab_size}"]
    if d2t is None:
        if draft_vocab_size < vocab_size:
            return [f"the draft vocabulary ({draft_vocab_size} ids) is smaller than the target's "
                    f"({vocab_size}) but the folder has no d2t map to translate draft ids back"]
        return []
    problems = []
    if d2t.numel() != draft_vocab_size:
        problems.append(f"d2t has {d2t.numel()} entries but the head predicts {draft_vocab_size} ids")
    ids = target_ids(d2t)
    if ids.numel() and int(ids.min()) < 0:
        problems.append(f"d2t maps draft ids to negative target ids (down to {int(ids.min())}): "
                        "the map is corrupt")
    elif ids.numel() and int(ids.max()) >= vocab_size:
        problems.append(f"d2t maps draft ids to target ids outside 0..{vocab_size - 1} "
                        f"(up to {int(ids.max())}): it was built for another vocabulary")
    if t2d is not None and t2d.numel() != vocab_size:
        problems.append(f"t2d covers {t2d.numel()} target ids but the target has {vocab_size}")
    return problems
