"""Speculative sampling keeps the target's distribution (statistical tests that can fail)."""

import itertools

import pytest
import torch

from specdemo.core.drafters import ModelDrafter, Proposal
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength
from specdemo.core.sampling import SamplingParams, next_token_probs, probs_from_logits, verify
from tiny import (CharTokenizer, tiny_dflash, tiny_dspark, tiny_eagle, tiny_gemma4,
                  tiny_gemma4_assistant, tiny_llama, tiny_mtp_target)

V = 8
ALPHA = 1e-3  # a correct sampler fails this by chance once in a thousand; seeds are fixed


def chi2_pvalue(counts: torch.Tensor, probs: torch.Tensor) -> float:
    """Pearson chi-square goodness of fit; cells with expected count < 5 are pooled."""
    n = counts.sum()
    expected = probs * n
    big = expected >= 5
    obs = torch.cat([counts[big], counts[~big].sum().reshape(1)])
    exp = torch.cat([expected[big], expected[~big].sum().reshape(1)])
    keep = exp > 0
    obs, exp = obs[keep].double(), exp[keep].double()
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0), stat / 2.0))


# --- the rule on hand-made distributions -----------------------------------------------------
P = torch.tensor([0.5, 0.3, 0.15, 0.05])
Q = torch.tensor([0.1, 0.1, 0.2, 0.6])
PARAMS = SamplingParams(temperature=1.0)


def rule_samples(q: torch.Tensor | None, n: int = 20000, fixed_token: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    counts = torch.zeros(4)
    for _ in range(n):
        if q is None:
            draft = [fixed_token]
            n_acc, nxt = verify(draft, None, torch.stack([P, P]), PARAMS, g)
        else:
            draft = [int(torch.multinomial(q, 1, generator=g))]
            n_acc, nxt = verify(draft, q[None], torch.stack([P, P]), PARAMS, g)
        counts[draft[0] if n_acc else nxt] += 1
    return counts


def test_rule_with_draft_probabilities_gives_target_distribution():
    assert chi2_pvalue(rule_samples(Q), P) > ALPHA


def test_rule_without_draft_probabilities_gives_target_distribution():
    assert chi2_pvalue(rule_samples(None), P) > ALPHA


def test_the_test_detects_a_wrong_distribution():
    """Negative control: samples of q itself are rejected as samples of p."""
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(torch.multinomial(Q, 20000, replacement=True, generator=g), minlength=4)
    assert chi2_pvalue(counts.float(), P) < ALPHA


def test_greedy_rule_keeps_longest_argmax_prefix():
    p = torch.eye(4)[[2, 1, 3]]  # target argmax 2, then 1, then bonus 3
    assert verify([2, 1], None, p, SamplingParams(), None) == (2, 3)
    assert verify([2, 0], None, p, SamplingParams(), None) == (1, 1)
    assert verify([0, 1], None, p, SamplingParams(), None) == (0, 2)


def test_top_k_top_p_and_temperature():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    assert torch.allclose(probs_from_logits(logits, SamplingParams(temperature=1.0)),
                          torch.tensor([0.5, 0.3, 0.15, 0.05]), atol=1e-6)
    top2 = probs_from_logits(logits, SamplingParams(temperature=1.0, top_k=2))
    assert torch.allclose(top2, torch.tensor([0.625, 0.375, 0, 0]), atol=1e-6)
    top_p = probs_from_logits(logits, SamplingParams(temperature=1.0, top_p=0.7))
    assert torch.allclose(top_p, torch.tensor([0.625, 0.375, 0, 0]), atol=1e-6)
    penalised = next_token_probs(logits, torch.tensor([0]), SamplingParams(temperature=1.0,
                                                                           repetition_penalty=2.0))
    assert penalised[0] < 0.5 - 0.1  # log(0.5) < 0 is multiplied by 2: less likely


# --- end to end: first 3 sampled tokens of plain vs speculative decoding --------------------
class FixedDrafter:
    """A drafter without probabilities that always proposes the same tokens."""

    name = "fixed"
    extra_memory_bytes = 0

    def __init__(self, ids):
        self.ids = ids

    def propose(self, context, k, params, generator):
        return Proposal(self.ids[:k])

    def feedback(self, n_accepted):
        pass


def sharp_model(seed: int):
    model = tiny_llama(seed=seed, vocab_size=V, layers=1, hidden=16)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # peakier, and different between seeds
    return model


PROMPT = [1, 2, 3]


def exact_marginals(model) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact distributions of generated tokens 2 and 3 by enumeration (temperature 1)."""
    def dist(ids):
        with torch.no_grad():
            return model(torch.tensor([ids])).logits[0, -1].softmax(-1).double()
    p1 = dist(PROMPT)
    second, third = torch.zeros(V, dtype=torch.double), torch.zeros(V, dtype=torch.double)
    for a in range(V):
        p2 = dist(PROMPT + [a])
        second += p1[a] * p2
        for b in range(V):
            third += p1[a] * p2[b] * dist(PROMPT + [a, b])
    return second, third


def sampled_counts(target, drafter_factory, n):
    kv = KVModel(target)
    counts = torch.zeros(2, V)
    for seed in range(n):
        drafter = drafter_factory() if drafter_factory else None
        ids = generate(kv, PROMPT, CharTokenizer(), drafter=drafter, policy=FixedDraftLength(2),
                       params=SamplingParams(temperature=1.0, seed=seed), max_new_tokens=3).token_ids
        counts[0, ids[1]] += 1
        counts[1, ids[2]] += 1
    return counts


@pytest.fixture(scope="module")
def target():
    return sharp_model(11)


@pytest.fixture(scope="module")
def marginals(target):
    return exact_marginals(target)


def drafter_factory(kind: str, target):
    """A function making fresh drafters of ``kind`` for ``target`` (the models built once)."""
    from specdemo.core.drafters.dflash import DFlashDrafter
    from specdemo.core.drafters.eagle import Eagle3Drafter
    if kind == "plain":
        return None
    if kind == "model-draft":
        draft = sharp_model(12)
        return lambda: ModelDrafter(draft, V)
    if kind == "no-probabilities":
        return lambda: FixedDrafter([5, 6])
    if kind == "eagle3":
        head = tiny_eagle(target, seed=13, scale=4.0)
        return lambda: Eagle3Drafter(head, V)
    if kind == "dflash":
        model = tiny_dflash(target, layer_ids=(0,), block_size=3, seed=14)
        return lambda: DFlashDrafter(model, target, V)
    if kind == "dspark":  # q: the Markov-biased distribution, position by position
        from specdemo.core.drafters.dspark import DSparkDrafter
        model = tiny_dspark(target, feature_layers=(1,), block_size=3, seed=14)
        return lambda: DSparkDrafter(model, target, V, min_survival=0.0)
    raise ValueError(kind)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["plain", "model-draft", "no-probabilities", "eagle3", "dflash",
                                  "dspark"])
def test_sampled_tokens_follow_the_target(target, marginals, kind):
    counts = sampled_counts(target, drafter_factory(kind, target), n=2500)
    for position in range(2):
        assert chi2_pvalue(counts[position], marginals[position].float()) > ALPHA, position


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gemma4-assistant", "mtp"])
def test_sampled_tokens_follow_targets_with_mtp_drafters(kind):
    """The same test with the targets MTP drafters need: Gemma 4 (assistant) and a GLM-4.5-style
    model with its own MTP layer."""
    from specdemo.core.drafters.mtp import Gemma4AssistantDrafter, NativeMtpDrafter
    if kind == "gemma4-assistant":
        target = tiny_gemma4(seed=15, vocab_size=V, hidden=16)
        assistant = tiny_gemma4_assistant(target, seed=16, hidden=16, scale=4.0)
        factory = lambda: Gemma4AssistantDrafter(assistant, target, V)  # noqa: E731
    else:
        target, mtp = tiny_mtp_target(seed=17, vocab_size=V, layers=1, hidden=16)
        factory = lambda: NativeMtpDrafter(mtp, target, V)  # noqa: E731
    with torch.no_grad():
        target.lm_head.weight.mul_(6.0)  # peakier (Gemma ties it to the embeddings: also fine)
    marginals = exact_marginals(target)
    counts = sampled_counts(target, factory, n=2500)
    for position in range(2):
        assert chi2_pvalue(counts[position], marginals[position].float()) > ALPHA, position


@pytest.mark.slow
def test_end_to_end_test_detects_the_draft_distribution(target, marginals):
    """Negative control: sampling tokens 2-3 from the draft model instead fails the same test."""
    draft = sharp_model(12)
    counts = sampled_counts(draft, None, n=2500)
    assert min(chi2_pvalue(counts[i], marginals[i].float()) for i in range(2)) < ALPHA
