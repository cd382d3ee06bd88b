"""Training answers from the native forward with continuous batching
(``data.generate_answers_native``): greedy answers are the target's greedy decoding on that
forward, and an answer does not depend on what it was batched with or on a resume."""

from __future__ import annotations

import random

import pytest
import torch

from specdemo.models import native as nb
from specdemo.models.loading import LoadedModel
from specdemo.services.training import data
from tiny import CharTokenizer, tiny_llama

try:
    nb.library()
    NO_LIBRARY = None
except nb.NativeError as exc:  # no C compiler here
    NO_LIBRARY = str(exc)
pytestmark = pytest.mark.skipif(NO_LIBRARY is not None, reason=f"{NO_LIBRARY}")


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(seed=5, layers=2, hidden=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)  # peaky distributions: answers that end at EOS too
    return LoadedModel("tiny", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")


def _rows(n):
    rng = random.Random(1)
    return [{"task": "chat", "prompt": "".join(rng.choice("abcdef ") for _ in range(rng.randint(3, 9)))}
            for _ in range(n)]


def _answers(path):
    return {(r["prompt_index"], r["answer_index"]): r for r in data.load_answers(path)}


def _greedy_alone(target, ids, max_new_tokens, weights):
    kv = nb.NativeKV(nb.native_model(target, weights))
    logits = kv.forward(ids)
    out = []
    while len(out) < max_new_tokens:
        token = int(logits[-1].argmax())
        out.append(token)
        if token in target.eos_token_ids:
            break
        logits = kv.forward([token])
    return out


@pytest.mark.parametrize("weights", ["w8a8", "bf16"])
def test_native_answers_are_greedy_decoding_and_do_not_depend_on_the_batch(target, tmp_path, weights):
    rows = _rows(7)
    data.generate_answers_native(target, rows, tmp_path / "one", answers_per_prompt=3,
                                 temperature=(0.8, 1.5), max_new_tokens=12, slots=1, weights=weights)
    data.generate_answers_native(target, rows, tmp_path / "three", answers_per_prompt=3,
                                 temperature=(0.8, 1.5), max_new_tokens=12, slots=3, weights=weights)
    one, three = _answers(tmp_path / "one"), _answers(tmp_path / "three")
    assert set(one) == {(i, a) for i in range(7) for a in range(3)}
    assert {k: v["ids"] for k, v in one.items()} == {k: v["ids"] for k, v in three.items()}
    source = {"w8a8": "native-w8a8", "bf16": "native"}[weights]
    for (i, a), row in one.items():
        assert row["temperature"] == [0.0, 0.8, 1.5][a] and row["source"] == source
        prompt = data.chat_ids(target.tokenizer, rows[i]["prompt"])
        assert row["ids"][:row["n_prompt"]] == prompt
        if a == 0:
            assert row["ids"][len(prompt):] == _greedy_alone(target, prompt, 12, weights)
    sampled = [row["ids"] for (i, a), row in one.items() if a > 0]
    greedy = {i: one[(i, 0)]["ids"] for i in range(7)}
    assert any(ids != greedy[i] for (i, a), ids in zip([k for k in one if k[1] > 0], sampled))


def test_native_generation_resumes_with_the_same_answers(target, tmp_path):
    rows = _rows(6)
    whole = tmp_path / "whole"
    data.generate_answers_native(target, rows, whole, answers_per_prompt=2, temperature=1.0,
                                 max_new_tokens=10, slots=4)
    part = tmp_path / "part"
    part.mkdir()
    lines = (whole / data.ANSWERS).read_text().splitlines()
    (part / data.ANSWERS).write_text("\n".join(lines[:5]) + "\n" + lines[5][:20])  # cut mid-line
    data.generate_answers_native(target, rows, part, answers_per_prompt=2, temperature=1.0,
                                 max_new_tokens=10, slots=2)
    assert {k: v["ids"] for k, v in _answers(part).items()} == {k: v["ids"] for k, v in _answers(whole).items()}
    assert len(data.load_answers(part)) == 12
    spent = tmp_path / "spent"  # a spent budget starts nothing new
    data.generate_answers_native(target, rows, spent, answers_per_prompt=2, temperature=1.0,
                                 max_new_tokens=10, slots=2, budget_s=0.0)
    assert data.load_answers(spent) == []
