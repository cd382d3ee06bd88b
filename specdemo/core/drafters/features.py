"""Hidden-state capture: which target layers a learned drafter reads, and reading them.

transformers numbers hidden states 0..L for a decoder of L layers: ``hidden_states[0]`` is the
embedding output, ``hidden_states[k]`` the *input* of layer k (= output of layer k-1), and
``hidden_states[L]`` the final output (after the final norm). Since transformers 5.x
``output_hidden_states=[i, j, k]`` returns only those (``None`` elsewhere).

The two families count differently, and a wrong index does not break losslessness: it silently
drops acceptance to ~1%. So the conventions live here, once:

* EAGLE-3 (SafeAILab EAGLE, vLLM ``eagle_aux_hidden_state_layer_ids``) names *inputs* of layers:
  id k -> ``hidden_states[k]``; default [2, L//2, L-3].
* DFlash (z-lab; transformers ``target_layer_ids``) names *outputs* of layers:
  id k -> ``hidden_states[k + 1]``.
"""

from __future__ import annotations

import torch


def num_layers(model: torch.nn.Module) -> int:
    """L, the number of decoder layers of a transformers causal LM."""
    return int(model.config.get_text_config().num_hidden_layers)


def eagle3_default_layers(n_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's default feature layers for a target of ``n_layers`` layers: inputs of layers
    2, L//2 and L-3 (SafeAILab EAGLE ``modeling_llama_kv.py``; vLLM ``llama.py``)."""
    return (2, n_layers // 2, n_layers - 3)


def eagle3_indices(layer_ids, n_layers: int) -> tuple[int, ...]:
    """``hidden_states`` indices for EAGLE-3 layer ids (inputs of layers: the same numbers)."""
    return tuple(int(i) for i in layer_ids)


def dflash_indices(layer_ids) -> tuple[int, ...]:
    """``hidden_states`` indices for DFlash layer ids (outputs of layers: id + 1)."""
    return tuple(int(i) + 1 for i in layer_ids)


def index_problems(indices, n_layers: int, what: str) -> list[str]:
    """Why ``hidden_states`` indices cannot be read from an L-layer target (empty when fine)."""
    indices = list(indices)
    if not indices:
        return [f"{what} names no target layers to read"]
    negative = [i for i in indices if i < 0]
    if negative:
        return [f"{what} names negative target layer ids {negative}: layer ids count from 0"]
    repeated = sorted({i for i in indices if indices.count(i) > 1})
    if repeated:
        return [f"{what} reads hidden state(s) {repeated} more than once ({indices}): its features "
                "would repeat, a corrupt or hand-edited config"]
    bad = [i for i in indices if not 0 <= i <= n_layers]
    if bad:
        return [f"{what} reads hidden state(s) {bad} but the target has only {n_layers} layers "
                f"(hidden states 0..{n_layers}): it was built for a deeper target"]
    return []


@torch.inference_mode()
def capture(model: torch.nn.Module, input_ids: torch.Tensor, indices: tuple[int, ...],
            attention_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One forward of the target over whole sequences, keeping the features a drafter reads.

    Args:
        model: a transformers causal LM.
        input_ids: (B, T) token ids.
        indices: ``hidden_states`` indices to keep.
        attention_mask: (B, T) 1 for real tokens (right padding), or None.
    Returns:
        (features (B, T, len(indices) * H), last (B, T, H)): the chosen hidden states
        concatenated in the order given, and the final hidden state (after the final norm), from
        which the target's logits are ``lm_head(last)``.
    """
    wanted = sorted(set(indices) | {num_layers(model)})
    out = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                output_hidden_states=wanted, logits_to_keep=1)
    hidden = out.hidden_states
    if len(hidden) <= num_layers(model) or any(hidden[i] is None for i in wanted):
        # older transformers 5.x leave the final state out of the list form: ask for all of them
        hidden = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False,
                       output_hidden_states=True, logits_to_keep=1).hidden_states
    return torch.cat([hidden[i] for i in indices], dim=-1), hidden[num_layers(model)]
