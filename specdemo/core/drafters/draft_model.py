"""Independent draft models with their own KV cache (Leviathan et al. 2023), and views of the
target that draft for it: ``self`` (the target itself: 100% acceptance at temperature 0, this
hardware's ceiling) and ``early-exit:N`` (its first N layers with its final norm and head, as in
LayerSkip, Elhoushi et al. 2024). Views share every weight with the target.
"""

from __future__ import annotations

import copy

import torch

from ..kv import KVModel
from ..sampling import SamplingParams
from .base import DraftSampler, Proposal, fit_vocab, param_bytes


class ModelDrafter:
    """A draft model with its own KV cache, drafting autoregressively with the target's sampling
    parameters. Its cache follows the context by common prefix: after a rejection the stale draft
    tokens are cropped (KVModel.rollback) before the next proposal.

    Args:
        model: a transformers causal LM sharing the target's tokenizer (ids mean the same text).
        vocab_size: the target's logits width; draft distributions are resized to it.
        name: shown in stats and the UI.
        shares_weights: True when ``model``'s weights are the target's (self, early-exit), so only
            its KV cache counts as extra memory.
    """

    def __init__(self, model: torch.nn.Module, vocab_size: int, name: str = "model",
                 shares_weights: bool = False) -> None:
        self.kv = KVModel(model)
        self.vocab_size = vocab_size
        self.name = name
        self._weight_bytes = 0 if shares_weights else param_bytes(model)
        self._fed: list[int] = []  # ids whose keys/values are in self.kv's cache
        self._prompt_length: int | None = None
        self._widest = 1  # widest catch-up piece: the longest draft this decode may ask for, + 1

    def begin(self, prompt_length: int, max_k: int) -> None:
        """Told by the engine once per decode, after the target's prefill.

        A first proposal that comes late (draft length ``auto`` drafting nothing in the first
        rounds) then feeds the prompt and the token after it in one forward and the rest in
        pieces of at most ``max_k + 1`` tokens; so does a catch-up after rounds without drafting.
        Those are the widths :func:`specdemo.services.startup.warm_up` runs before a race's
        clocks start, where one forward over the whole gap would be a width never seen before
        (a first oneDNN primitive, a first cuBLAS plan) inside a timed lane.

        Args:
            prompt_length: tokens in the prompt the target was prefilled with.
            max_k: the longest draft the decode may ask for (``AdaptiveDraftLength.max_k``, or k).
        """
        self._prompt_length = prompt_length
        self._widest = max(1, max_k) + 1

    def _pieces(self, common: int, n: int, k: int) -> list[int]:
        """Widths of the forwards that feed ``n`` pending ids after ``common`` cached ones."""
        widths = []
        if common == 0 and self._prompt_length is not None:
            widths.append(min(n, self._prompt_length + 1))  # the prefill warm_up ran
            n -= widths[0]
        widest = max(self._widest, k + 1)
        if common == 0 and self._prompt_length is None:
            widest = max(widest, n)  # not told: one forward, as a plain drafter would
        while n > 0:
            widths.append(min(n, widest))
            n -= widths[-1]
        return widths

    def propose(self, context: list[int], k: int, params: SamplingParams,
                generator: torch.Generator | None) -> Proposal:
        if k <= 0:
            return Proposal([])
        common = 0
        limit = min(len(self._fed), len(context) - 1)  # feed at least the last token
        while common < limit and self._fed[common] == context[common]:
            common += 1
        self.kv.rollback(common)
        pending = context[common:]
        for width in self._pieces(common, len(pending), k)[:-1]:  # catch-up, logits unused
            self.kv.forward(pending[:width])
            pending = pending[width:]
        sampler = DraftSampler(context, params, generator)
        for _ in range(k):
            logits = fit_vocab(self.kv.forward(pending)[-1], self.vocab_size)
            pending = sampler.draw(logits)  # fed as a device tensor: no wait per token
        proposal = sampler.proposal(self.name)
        self._fed = list(context) + proposal.ids[:-1]  # the last draft token was never fed
        self.kv.ids[len(context):] = proposal.ids[:-1]  # the fed draft tokens, as ids
        return proposal

    def feedback(self, n_accepted: int) -> None:
        pass

    @property
    def extra_memory_bytes(self) -> int:
        return self._weight_bytes + self.kv.cache_bytes


def early_exit_problem(n_layers: int, target_layers: int) -> str | None:
    """Why the first ``n_layers`` of a ``target_layers``-layer model cannot draft, else None
    (one layer at least, and fewer than the target has). :func:`early_exit_view` refuses with
    these words, and ``compat.early_exit_verdict`` gives them as its reason."""
    if not 1 <= n_layers < target_layers:
        return f"early-exit layers must be in 1..{target_layers - 1}, got {n_layers}"
    return None


def early_exit_view(model: torch.nn.Module, n_layers: int) -> torch.nn.Module:
    """A causal LM that runs only the first ``n_layers`` decoder layers of ``model``, then its
    final norm and head. Shares every weight with ``model`` (no copy).

    Works for the decoder-only layouts transformers uses for Llama, Qwen2/3, Gemma, Mistral and
    SmolLM (``model.model.layers``).

    Raises:
        ValueError: if n_layers is not within 1..(number of layers - 1), or the layout differs.
    """
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, torch.nn.ModuleList):
        raise ValueError(f"early-exit needs a decoder with model.layers; {type(model).__name__} has none")
    problem = early_exit_problem(n_layers, len(layers))
    if problem:
        raise ValueError(problem)
    config = copy.copy(model.config)
    config.num_hidden_layers = n_layers
    if getattr(config, "layer_types", None):
        config.layer_types = list(config.layer_types)[:n_layers]
    view = copy.copy(model)
    view._modules = dict(model._modules)
    view.config = config
    view_inner = copy.copy(inner)
    view_inner._modules = dict(inner._modules)
    view_inner.layers = torch.nn.ModuleList(list(layers)[:n_layers])
    view_inner.config = config
    view.model = view_inner
    _rebind_hooked_forward(view)
    _rebind_hooked_forward(view_inner)
    return view


def _rebind_hooked_forward(copied: torch.nn.Module) -> None:
    """Make a shallow copy of an accelerate-hooked module run its *own* forward.

    ``dispatch_model`` / ``device_map="auto"`` replace a module's ``forward`` by an instance
    attribute that runs the hook around ``_old_forward``, a method bound to the original module;
    ``copy.copy`` keeps both, so a view would call the whole original model (early exit returned
    the full model's logits). Here the copy gets the same hook (``_hf_hook``: inputs to the
    execution device, offloaded weights loaded for the call) around its class's forward bound to
    the copy, as accelerate's ``add_hook_to_module`` builds it.
    """
    hook = copied.__dict__.get("_hf_hook")
    if "_old_forward" not in copied.__dict__ or hook is None:
        return
    import functools
    own = type(copied).forward.__get__(copied)

    def forward(*args, **kwargs):
        args, kwargs = hook.pre_forward(copied, *args, **kwargs)
        if getattr(hook, "no_grad", False):
            with torch.no_grad():
                output = own(*args, **kwargs)
        else:
            output = own(*args, **kwargs)
        return hook.post_forward(copied, output)

    copied._old_forward = own
    copied.forward = functools.update_wrapper(forward, own)
