"""Chunked prefill (issue 11 item 3): Stop during a long prompt takes effect after one chunk, not
after the whole prefill; chunking changes no output and hands drafters every prompt feature."""

from __future__ import annotations

import threading

import pytest
import torch

from specdemo.core import kv as kv_module
from specdemo.core.drafters import ModelDrafter, make_drafter
from specdemo.core.drafters.base import Proposal
from specdemo.core.engine import decode, generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength
from tiny import CharTokenizer, tiny_llama

TOK = CharTokenizer()
PROMPT = TOK.encode("the cat sat on the mat. the dog ran far away, so the cat sat alone. " * 3)
CHUNK = 16  # the prompt is ~200 tokens: 13 chunks


@pytest.fixture(scope="module")
def target():
    return tiny_llama(seed=0, layers=4)


def chunked(monkeypatch, size: int = CHUNK) -> None:
    monkeypatch.setattr(kv_module, "PREFILL_CHUNK", size)


def calls(model) -> list[int]:
    """Token counts of every forward of ``model`` from now on (hooks: use a model of its own)."""
    seen: list[int] = []
    model.register_forward_hook(lambda module, args, kwargs, out: seen.append(
        kwargs["input_ids"].shape[1]), with_kwargs=True)
    return seen


@pytest.mark.parametrize("spec", [None, "ngram", "self", "early-exit:2", "model"])
def test_chunked_prefill_changes_no_token(target, monkeypatch, spec):
    def run():
        drafter = (ModelDrafter(tiny_llama(seed=7), 32) if spec == "model"
                   else make_drafter(spec, target, 32) if spec else None)
        return generate(KVModel(target), PROMPT, TOK, drafter=drafter, policy=FixedDraftLength(4),
                        max_new_tokens=30).token_ids
    whole = run()
    chunked(monkeypatch)
    assert run() == whole


def test_chunks_give_the_same_logits(monkeypatch):
    target = tiny_llama(seed=0, layers=4)  # a fresh model: hooks stay on it
    whole = KVModel(target).forward(PROMPT, logits_to_keep=20)
    chunked(monkeypatch)
    kv = KVModel(target)
    seen = calls(target)
    torch.testing.assert_close(kv.forward(PROMPT, logits_to_keep=20), whole, rtol=1e-5, atol=1e-5)
    assert len(seen) == len(PROMPT) // CHUNK and seen[-1] >= 20  # the last chunk has the 20 rows
    assert kv.length == len(PROMPT) == len(kv.ids)


class FeatureRecorder:
    """A drafter that reads hidden states and proposes nothing; keeps what it observed."""

    name = "recorder"
    feature_layers = (1, 3)
    extra_memory_bytes = 0

    def __init__(self) -> None:
        self.observed: list[torch.Tensor] = []

    def observe(self, features: torch.Tensor) -> None:
        self.observed.append(features)

    def propose(self, context, k, params, generator) -> Proposal:
        return Proposal([])

    def feedback(self, n_accepted: int) -> None:
        pass


def test_feature_drafters_get_every_prompt_position(target, monkeypatch):
    whole = FeatureRecorder()
    generate(KVModel(target), PROMPT, TOK, drafter=whole, max_new_tokens=2)
    chunked(monkeypatch)
    parts = FeatureRecorder()
    generate(KVModel(target), PROMPT, TOK, drafter=parts, max_new_tokens=2)
    assert parts.observed[0].shape == (len(PROMPT), 2 * target.config.hidden_size)
    torch.testing.assert_close(parts.observed[0], whole.observed[0], rtol=1e-5, atol=1e-5)


def test_stop_during_the_prefill_takes_effect_after_one_chunk(monkeypatch):
    chunked(monkeypatch)
    target = tiny_llama(seed=0, layers=4)
    cancel = threading.Event()
    seen = calls(target)
    target.register_forward_hook(lambda *args: cancel.set())  # Stop while chunk 1 computes
    events = list(decode(KVModel(target), PROMPT, TOK, max_new_tokens=20, cancel=cancel))
    assert len(seen) == 1  # not the other 12 chunks
    assert len(events) == 1 and events[0].done
    assert events[0].stats.finish_reason == "cancelled"
    assert events[0].token_ids == [] and events[0].text == ""


def test_stop_while_a_draft_model_catches_up_with_the_prompt(target, monkeypatch):
    """A draft model's first proposal feeds it the whole prompt: that stops after a chunk too."""
    chunked(monkeypatch)
    draft = tiny_llama(seed=7)
    cancel = threading.Event()
    seen = calls(draft)
    draft.register_forward_hook(lambda *args: cancel.set())
    events = list(decode(KVModel(target), PROMPT, TOK, drafter=ModelDrafter(draft, 32),
                         max_new_tokens=20, cancel=cancel))
    assert len(seen) == 1
    assert [e.stats.finish_reason for e in events] == [None, "cancelled"]
    assert sum(len(e.token_ids) for e in events) == 1  # the prefill's token is kept
