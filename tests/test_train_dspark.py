"""Training a DSpark drafter on a tiny random target: the loss (block KL + confidence BCE) falls,
the confidence head learns to predict acceptance, and the saved folder (speculators' layout)
loads through the learned-drafter loader and drafts losslessly."""

import random

import pytest
import torch

from specdemo.core.drafters.dspark import DSparkDrafter
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.core.policy import FixedDraftLength
from specdemo.models.learned import load_learned
from specdemo.models.loading import LoadedModel
from specdemo.services.training import data, dflash_train, dspark_train
from tiny import CharTokenizer, tiny_llama

RECIPE = dspark_train.DSparkRecipe(block_size=4, draft_layers=1, target_layer_ids=(0, 2, 3),
                                   mask_token_id=31, anchors_per_sequence=8, epochs=40,
                                   learning_rate=3e-3, warmup_steps=5, batch_tokens=512,
                                   checkpoint_every_s=1e9, markov_rank=8)


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(seed=7, layers=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaky distributions, as a trained model has
    return LoadedModel("tiny-llama", model, CharTokenizer(), torch.device("cpu"), torch.float32,
                       0.0, "test")


def _prompts(n, seed):
    rng = random.Random(seed)
    return [{"task": "chat", "prompt": "".join(rng.choice("abcdefghij ") for _ in range(rng.randint(4, 12)))}
            for _ in range(n)]


@pytest.fixture(scope="module")
def items(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("train_dspark")
    data.generate_answers(target, _prompts(12, 0), out, answers_per_prompt=2, max_new_tokens=24,
                          batch_size=8)
    shards = data.capture_features(target, data.load_answers(out), RECIPE.feature_layers, out,
                                   shard_size=16)
    return [x for s in shards for x in torch.load(s, weights_only=False)]


def test_default_layers_are_speculators_and_eagle3s():
    recipe = dspark_train.DSparkRecipe(target_layer_ids=dspark_train.default_target_layers_dspark(30))
    assert recipe.feature_layers == (2, 15, 27)  # hidden states [2, L//2, L-3]
    assert dspark_train.default_target_layers_dspark(4) == (0, 2, 3)  # too shallow: DFlash's


def test_collate_labels_every_slot_with_the_position_before_its_token():
    """Slot j of a block anchored at a drafts the token at a + j + 1: its label is the target's
    distribution at a + j and its Markov key the token at a + j."""
    item = {"ids": list(range(10, 22)), "n_prompt": 3, "features": torch.zeros(12, 4),
            "last": torch.arange(12.0)[:, None]}
    batch = dflash_train.collate([item], RECIPE, torch.Generator().manual_seed(0), shift=1)
    anchors = batch["noise_ids"].view(-1, 4)[:, 0] - 10  # the anchor tokens give the positions
    for j in range(4):
        expect = (anchors + j).clamp(max=11)
        assert torch.equal(batch["label_pos"][0, :, j], expect)
        assert torch.equal(batch["prev_ids"][0, :, j], expect + 10)
        assert torch.equal(batch["valid"][0, :, j], anchors + j <= 11)


def test_training_lowers_the_loss_and_saves_a_lossless_drafter(target, items, tmp_path):
    model = dspark_train.new_drafter(target, RECIPE, verifier="tiny-org/tiny")
    state = dspark_train.train(model, target, items, RECIPE, tmp_path, max_steps=30)
    first, last = sum(state.losses[:3]) / 3, sum(state.losses[-3:]) / 3
    assert last < 0.7 * first, state.losses
    folder = dspark_train.save(model, tmp_path / "out", dtype=torch.float32, verifier="tiny-org/tiny")
    loaded = load_learned(str(folder), target)
    assert loaded.info["config"]["speculators_config"]["verifier"]["name_or_path"] == "tiny-org/tiny"
    kv = KVModel(target.model)
    prompt = target.tokenizer.encode("abc defg hij")
    plain = generate(kv, prompt, target.tokenizer, max_new_tokens=30)
    drafter = loaded.new_drafter(target.model, target.vocab_size, "dspark")
    spec = generate(kv, prompt, target.tokenizer, drafter=drafter, policy=FixedDraftLength(4),
                    max_new_tokens=30)
    assert spec.token_ids == plain.token_ids and spec.stats.accepted > 0


@pytest.mark.slow
def test_the_trained_confidence_head_ranks_acceptance(target, items, tmp_path):
    """After training, the drafts the confidence head rates in the upper half are accepted more
    often than those in the lower half (positions reached in a round, held-out prompts, through
    the engine): c_j estimates P(draft j accepted | the ones before were)."""
    model = dspark_train.new_drafter(target, RECIPE)
    dspark_train.train(model, target, items, RECIPE, tmp_path, max_steps=80)
    model.eval()
    kv = KVModel(target.model)
    seen = []  # (confidence, accepted) of every draft position a round reached

    class Watch(DSparkDrafter):
        def propose(self, *args, **kwargs):
            self.last = super().propose(*args, **kwargs)
            return self.last

        def feedback(self, n_accepted):
            seen.extend((c, i < n_accepted) for i, c in enumerate(self.last.confidence)
                        if i <= n_accepted)

    for row in _prompts(8, 99):
        ids = target.tokenizer.encode(row["prompt"])
        generate(kv, ids, target.tokenizer, max_new_tokens=40, policy=FixedDraftLength(4),
                 drafter=Watch(model, target.model, target.vocab_size, min_survival=0.0))
    seen.sort()
    low, high = seen[:len(seen) // 2], seen[len(seen) // 2:]
    rate = lambda part: sum(a for _, a in part) / len(part)  # noqa: E731
    assert len(seen) >= 40 and rate(high) > rate(low), (len(seen), rate(low), rate(high))


@pytest.mark.slow
def test_cli_trains_dspark_and_reports_it(target, tmp_path, monkeypatch):
    """``train-draft --kind dspark`` end to end on the tiny target: the recipe, a speculators-
    layout folder the loader reads, and a held-out report with the DSpark drafter in it."""
    import json

    import specdemo.models.loading as models
    from specdemo.interfaces.cli import main
    monkeypatch.setattr(models, "load_model", lambda spec, device, dtype: target)
    prompts = tmp_path / "prompts.jsonl"
    rows = _prompts(8, 0) + [{**r, "split": "heldout"} for r in _prompts(2, 99)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    status = main(["train-draft", "--kind", "dspark", "--target", "tiny", "--out", str(out),
                   "--prompts", str(prompts), "--max-tokens", "16", "--answers-per-prompt", "1",
                   "--max-steps", "3", "--block-size", "4", "--draft-layers", "1",
                   "--markov-rank", "8", "--report-prompts", "2", "--report-k", "4"])
    assert status == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["feature_layers"] == [1, 3, 4] and recipe["markov_rank"] == 8
    config = json.loads((out / "config.json").read_text())
    assert (config["speculators_model_type"], config["aux_hidden_state_layer_ids"],
            config["block_size"], config["dtype"]) == ("dspark", [1, 3, 4], 4, "bfloat16")
    assert load_learned(str(out), target).summary.startswith("DSpark drafter (speculators layout")
    report = json.loads((out / "report.json").read_text())
    assert set(report["heldout"]) == {"plain", "dspark", "ngram"}
    assert report["heldout"]["dspark"]["k"] == 4
    assert 0 < report["heldout"]["dspark"]["drafted_per_round"] <= 4  # B = 4 drafts at most
    assert report["heldout"]["plain"]["drafted_per_round"] == 0.0  # plain rounds draft nothing
