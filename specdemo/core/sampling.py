"""Sampling parameters, logits processing and the speculative-sampling acceptance rule.

The same :func:`target_probs` is used by plain decoding, by verification and by drafters, so the
sampling parameters apply identically in both modes.

References:
    Leviathan, Kalman, Matias, "Fast Inference from Transformers via Speculative Decoding", 2023
    (arXiv:2211.17192), Algorithm 1; Chen et al., "Accelerating Large Language Model Decoding with
    Speculative Sampling", 2023 (arXiv:2302.01318), Algorithm 2.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class SamplingParams:
    """How the next token is chosen from the target's logits.

    Attributes:
        temperature: 0 means greedy (argmax); > 0 divides the logits before softmax.
        top_k: keep the k most likely tokens (0 = off).
        top_p: keep the smallest set whose probability reaches top_p (1.0 = off).
        repetition_penalty: CTRL-style penalty (Keskar et al. 2019, as in transformers'
            ``RepetitionPenaltyLogitsProcessor``) on every token already in prompt + output; 1.0 = off.
        seed: seed of the random generator used for sampling (None = nondeterministic).

    Raises:
        ValueError: on a negative temperature, top_k < 0, top_p outside (0, 1] or a
            repetition_penalty <= 0.
    """

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise ValueError(f"top_k must be >= 0, got {self.top_k}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if self.repetition_penalty <= 0:
            raise ValueError(f"repetition_penalty must be > 0, got {self.repetition_penalty}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def penalize(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """Apply the repetition penalty to the ids in ``seen``.

    Args:
        logits: (V,) float logits (not modified).
        seen: (S,) long ids already in the context (duplicates allowed).
        penalty: > 1 discourages repeats: positive logits are divided, negative multiplied.
    Returns:
        (V,) penalised logits.
    """
    if penalty == 1.0 or seen.numel() == 0:
        return logits
    out = logits.clone()
    picked = out[seen]
    out[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return out


def probs_from_logits(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution a token is drawn from, after temperature, top-k and top-p.

    Args:
        logits: (V,) float logits (penalty already applied).
    Returns:
        (V,) float32 probabilities summing to 1; for greedy, one-hot at the argmax.
    """
    logits = logits.float()
    if params.greedy:
        return torch.nn.functional.one_hot(logits.argmax(), logits.shape[-1]).float()
    logits = logits / params.temperature
    if params.top_k and params.top_k < logits.shape[-1]:
        kth = torch.topk(logits, params.top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=True)
        cumulative = sorted_logits.softmax(-1).cumsum(-1)
        drop = cumulative - sorted_logits.softmax(-1) >= params.top_p  # keep the first crossing
        logits = logits.masked_fill(drop.scatter(0, order, drop), float("-inf"))
    return logits.softmax(-1)


def next_token_probs(logits: torch.Tensor, context: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Penalty + temperature/top-k/top-p for one position.

    Args:
        logits: (V,) raw logits for the next token.
        context: (S,) long ids before that token (prompt + generated + earlier draft tokens).
    Returns:
        (V,) float32 probabilities.
    """
    return probs_from_logits(penalize(logits, context, params.repetition_penalty), params)


class Generators:
    """Seeded random generators, one per device, made on first use.

    ``torch.multinomial`` and ``torch.rand`` need a generator on the device of the tensors they
    sample ("Expected a 'cuda' device type for generator" otherwise), and one decode samples on
    the target's device (drafters) and, for verification, on the CPU. Every generator is seeded
    with ``seed``, so a decode is reproducible on the same device; the CPU one is the stream the
    engine used before there was one per device.

    Args:
        seed: the seed of every generator.
    """

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._made: dict[str, torch.Generator] = {}

    def on(self, device: torch.device | str) -> torch.Generator:
        """The generator for ``device`` (``cuda`` and ``cuda:0`` are the same device)."""
        device = torch.device(device)
        if device.type == "cuda" and device.index is None:
            device = torch.device("cuda", torch.cuda.current_device())
        key = str(device)
        if key not in self._made:
            self._made[key] = torch.Generator(device=device).manual_seed(self.seed)
        return self._made[key]


def generator_for(generator: Generators | torch.Generator | None,
                  device: torch.device) -> torch.Generator | None:
    """The torch generator to sample a tensor on ``device`` with.

    Args:
        generator: None (unseeded), :class:`Generators` (one per device) or one torch generator,
            which must be on ``device``.
    Raises:
        ValueError: a torch generator on another device than the tensor sampled (torch's own
            error says less, and only on an accelerator).
    """
    if generator is None or isinstance(generator, torch.Generator) and generator.device.type == device.type:
        return generator
    if isinstance(generator, torch.Generator):
        raise ValueError(f"a random generator on {generator.device} cannot sample a tensor on "
                         f"{device}; pass sampling.Generators(seed) to sample on any device")
    return generator.on(device)


def choose(probs: torch.Tensor, params: SamplingParams,
           generator: Generators | torch.Generator | None) -> int:
    """Draw one token id from (V,) ``probs`` (argmax when greedy) with a generator on their device."""
    if params.greedy:
        return int(probs.argmax())
    return int(torch.multinomial(probs, 1, generator=generator_for(generator, probs.device)))


def verify_greedy(draft_ids: list[int], target_ids: list[int]) -> tuple[int, int]:
    """:func:`verify` at temperature 0 from the target's argmaxes alone.

    Args:
        draft_ids: the k proposed ids.
        target_ids: the k+1 argmaxes of the target's (processed) logits at each draft position
            and the bonus position.
    Returns:
        (n_accepted, next_token): the longest prefix of ``draft_ids`` equal to ``target_ids``, and
        the target's argmax after it.
    """
    n = 0
    while n < len(draft_ids) and draft_ids[n] == target_ids[n]:
        n += 1
    return n, target_ids[n]


def verify(
    draft_ids: list[int],
    draft_probs: torch.Tensor | None,
    target_probs: torch.Tensor,
    params: SamplingParams,
    generator: Generators | torch.Generator | None,
) -> tuple[int, int]:
    """The speculative-sampling rule: how many draft tokens to keep and the token that follows.

    For each draft token x_i in order: accept with probability min(1, p_i(x_i) / q_i(x_i)); at the
    first rejection, draw the correction token from norm(max(p_i - q_i, 0)) and stop. When all k
    are accepted, draw the bonus token from p_{k+1}. A drafter without probabilities has
    q_i = one-hot(x_i). In greedy mode this is "keep the longest prefix equal to the target's argmax".

    Args:
        draft_ids: the k proposed ids.
        draft_probs: (k, V) the drafter's distributions, or None for a drafter without them.
        target_probs: (k+1, V) the target's distributions at each draft position and the bonus.
        generator: see :func:`generator_for` (used on ``target_probs``' device).
    Returns:
        (n_accepted, next_token): 0 <= n_accepted <= k, and the correction or bonus token.
    """
    for i, token in enumerate(draft_ids):
        p = target_probs[i]
        q_token = 1.0 if draft_probs is None else float(draft_probs[i, token])
        p_token = float(p[token])
        if params.greedy:
            accept = p_token == 1.0
        else:
            draw = torch.rand((), generator=generator_for(generator, p.device), device=p.device)
            accept = q_token > 0 and draw.item() * q_token < p_token
        if not accept:
            if params.greedy:
                return i, int(p.argmax())
            if draft_probs is None:
                residual = p.clone()
                residual[token] = 0.0
            else:
                residual = (p - draft_probs[i]).clamp_min(0.0)
            total = residual.sum()
            if total <= 0:  # p == q exactly yet rejected: impossible in exact arithmetic; use p
                residual, total = p, p.sum()
            return i, choose(residual / total, params, generator)
    return len(draft_ids), choose(target_probs[len(draft_ids)], params, generator)
