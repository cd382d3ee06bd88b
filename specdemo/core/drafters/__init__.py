"""Drafters: what proposes tokens for the target to verify. One module per family, as vLLM's
``v1/spec_decode/``:

* ``ngram`` - prompt lookup over prompt + generated text, no model.
* ``draft_model`` - an independent draft model with its own KV cache; ``self`` and
  ``early-exit:N`` views of the target.
* ``eagle`` - EAGLE-3 heads reading target hidden states (``eagle_io`` loads/saves their folders).
* ``dflash``, ``dspark``, ``mtp`` - block-diffusion drafters (DSpark: with a sequential and a
  confidence head) and multi-token-prediction heads.
* shared: ``base`` (the protocol), ``vocab`` (draft vocabulary maps), ``features`` (which target
  hidden states a drafter reads). Loading a learned-drafter folder or hub id is
  ``models/learned.py``.
"""

from __future__ import annotations

import torch

from ..draft_spec import DraftSpec, as_draft_spec
from .base import Drafter, FeatureDrafter, Proposal, fit_vocab, param_bytes, wants_features
from .draft_model import ModelDrafter, early_exit_view
from .ngram import NgramDrafter

__all__ = ["Drafter", "FeatureDrafter", "Proposal", "ModelDrafter", "NgramDrafter",
           "early_exit_view", "fit_vocab", "make_drafter", "param_bytes",
           "wants_features"]


def make_drafter(spec: DraftSpec | str, target: torch.nn.Module, vocab_size: int,
                 draft_model: object | None = None) -> Drafter | None:
    """Build a fresh drafter (no state shared with earlier decodes) named by ``spec``.

    Args:
        spec: a :class:`DraftSpec` (what a ``Pipeline`` holds), or its text
            (:func:`as_draft_spec`): ``none``,
            ``ngram``, ``self``, ``early-exit:<layers>``, or anything else together with
            ``draft_model``.
        target: the target model (for self and early-exit views).
        vocab_size: the target's logits width V.
        draft_model: for other specs, what was loaded for them: a transformers causal LM (an
            independent draft model), or a loaded learned drafter (anything with
            ``new_drafter(target, vocab_size, name)``: EAGLE-3, DFlash, MTP, combinations).
    Returns:
        The drafter, or None for ``none`` (plain decoding).
    Raises:
        ValueError: for an unknown spec; a ``DraftSpecError`` (a ValueError naming the text)
            for text no form accepts, e.g. a bad early-exit layer count.
    """
    parsed = as_draft_spec(spec)
    spec = parsed.text
    if parsed.kind == "none":
        return None
    if parsed.kind == "ngram":
        return NgramDrafter()
    if parsed.kind == "self":
        return ModelDrafter(target, vocab_size, name="self", shares_weights=True)
    if parsed.is_early_exit:
        return ModelDrafter(early_exit_view(target, parsed.layers), vocab_size, name=spec,
                            shares_weights=True)
    if draft_model is None:
        raise ValueError(f"unknown drafter {spec!r}: expected none, ngram, self, early-exit:N, "
                         "a draft model or a learned drafter")
    new_drafter = getattr(draft_model, "new_drafter", None)
    if new_drafter is not None:
        return new_drafter(target, vocab_size, spec)
    return ModelDrafter(draft_model, vocab_size, name=spec)
