"""Targets and drafts with sliding-window attention layers (Gemma 3, Mistral) stay exact once the
sequence passes the window, rejections and rollbacks included (issue 11 item 7: transformers'
sliding layers forget what a rollback needs unless told to keep it)."""

from __future__ import annotations

import pytest
import torch
from transformers import Gemma3ForCausalLM, Gemma3TextConfig, MistralConfig, MistralForCausalLM

from specdemo.core.drafters import ModelDrafter, make_drafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength
from tiny import CharTokenizer

WINDOW = 16
TOK = CharTokenizer()
PROMPT = TOK.encode("the cat sat on the mat and the dog ran far away.")  # 48 > WINDOW


def tiny_windowed(family: str, seed: int = 0, layers: int = 4) -> torch.nn.Module:
    """A random float32 model whose attention looks back at most WINDOW tokens (Mistral: every
    layer; Gemma 3: every other layer, the rest full attention)."""
    torch.manual_seed(seed)
    common = dict(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                  sliding_window=WINDOW, bos_token_id=None, eos_token_id=0, pad_token_id=None)
    if family == "gemma3":
        config = Gemma3TextConfig(**common, head_dim=8, tie_word_embeddings=False,
                                  layer_types=["sliding_attention", "full_attention"] * (layers // 2))
        return Gemma3ForCausalLM(config).eval()
    return MistralForCausalLM(MistralConfig(**common, tie_word_embeddings=False)).eval()


def greedy_without_cache(model, prompt: list[int], n: int) -> list[int]:
    """Reference: each token from a full forward over the whole sequence (no cache at all)."""
    seq = list(prompt)
    with torch.inference_mode():
        for _ in range(n):
            seq.append(int(model(torch.tensor([seq])).logits[0, -1].argmax()))
    return seq[len(prompt):]


FAMILIES = ["gemma3", "mistral"]


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    return request.param


@pytest.fixture(scope="module")
def target(family):
    return tiny_windowed(family)


@pytest.fixture(scope="module")
def plain(target):
    result = generate(KVModel(target), PROMPT, TOK, max_new_tokens=40)
    assert result.token_ids == greedy_without_cache(target, PROMPT, 40)
    return result


@pytest.mark.parametrize("spec", ["ngram", "self", "early-exit:1", "early-exit:3", "random-model"])
@pytest.mark.parametrize("k", [3, 8])
def test_speculative_equals_plain_past_the_window(family, target, plain, spec, k):
    drafter = (ModelDrafter(tiny_windowed(family, seed=5), 32) if spec == "random-model"
               else make_drafter(spec, target, 32))
    result = generate(KVModel(target), PROMPT, TOK, drafter=drafter, policy=FixedDraftLength(k),
                      max_new_tokens=40)
    assert result.token_ids == plain.token_ids
    if spec in ("random-model", "early-exit:1"):
        assert result.stats.accepted < result.stats.drafted  # rollbacks past the window happened


@pytest.mark.parametrize("keep", [3, 15, 16, 30, 44])
def test_rollback_far_back_is_exact(target, keep):
    """A rollback past what a sliding layer still holds (a draft cache meeting a new context)
    gives the same logits as a fresh cache holding only the kept tokens."""
    ids = (PROMPT * 2)[:60]
    kv = KVModel(target)
    for start, end in ((0, 40), (40, 50), (50, 60)):
        kv.forward(ids[start:end])
        kv.rollback(end)  # what the engine does after every round: sliding layers trimmed
    kv.rollback(keep)
    assert kv.length == keep
    got = kv.forward(ids[keep:keep + 2], logits_to_keep=2)
    with torch.inference_mode():
        want = target(torch.tensor([ids[:keep + 2]])).logits[0, -2:]
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_cache_stays_bounded_on_sliding_layers(target):
    """Keeping past states for rollback must not keep them all: sliding layers hold at most the
    window plus the tokens of the latest round."""
    kv = KVModel(target)
    kv.forward(PROMPT)
    for token in PROMPT[:30]:
        kv.forward([token, token, token])
        kv.rollback(kv.length - 2)
    sliding = [layer for layer in kv.cache.layers if getattr(layer, "is_sliding", False)]
    assert sliding and all(layer.keys.shape[-2] <= WINDOW + 3 for layer in sliding)
