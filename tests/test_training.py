"""Training an EAGLE-3 head on a tiny random target: loss falls, acceptance rises, the folder
loads through the learned-drafter loader, and --resume continues the same loss curve."""

import random
from dataclasses import replace

import pytest
import torch

from specdemo.core.drafters.eagle import Eagle3Drafter
from specdemo.core.drafters.vocab import target_ids
from specdemo.models.learned import load_learned
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.policy import FixedDraftLength
from specdemo.services.training import data, train
from tiny import CharTokenizer, tiny_llama

LAYERS = (1, 2, 3)


@pytest.fixture(scope="module")
def target():
    model = tiny_llama(seed=7, layers=4)
    with torch.no_grad():
        model.lm_head.weight.mul_(8.0)  # peaky distributions, as a trained model has
    return LoadedModel("tiny-llama", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")


def _prompts(n, seed):
    rng = random.Random(seed)
    return [{"task": "chat", "prompt": "".join(rng.choice("abcdefghij ") for _ in range(rng.randint(4, 12)))}
            for _ in range(n)]


@pytest.fixture(scope="module")
def features(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("train")
    data.generate_answers(target, _prompts(16, 0), out, answers_per_prompt=2, max_new_tokens=32,
                          batch_size=8)
    answers = data.load_answers(out)
    shards = data.capture_features(target, answers, LAYERS, out, shard_size=16)
    return out, [x for s in shards for x in torch.load(s, weights_only=False)]


RECIPE = train.Recipe(draft_vocab_size=24, ttt_steps=3, epochs=40, learning_rate=3e-3,
                      warmup_steps=5, batch_tokens=512, feature_layers=LAYERS,
                      checkpoint_every_s=1e9)


def _head(target, items):
    return train.new_head(target, RECIPE, train.token_counts(items, target.vocab_size))


def _mean_acceptance_length(target, head, prompts):
    kv = KVModel(target.model)
    tok, forwards = 0, 0
    for row in prompts:
        ids = target.tokenizer.encode(row["prompt"])
        stats = generate(kv, ids, target.tokenizer, drafter=Eagle3Drafter(head, target.vocab_size),
                         policy=FixedDraftLength(4), max_new_tokens=40).stats
        tok, forwards = tok + stats.new_tokens - 1, forwards + stats.target_forwards
    return tok / forwards


def test_training_lowers_loss_and_raises_heldout_acceptance(target, features, tmp_path):
    _, items = features
    untrained = _head(target, items)
    before = _mean_acceptance_length(target, untrained, _prompts(6, 99))
    head = _head(target, items)
    state = train.train(head, target, items, RECIPE, tmp_path, max_steps=60)
    assert state.step == 60
    assert sum(state.losses[-5:]) / 5 < 0.5 * sum(state.losses[:5]) / 5
    after = _mean_acceptance_length(target, head, _prompts(6, 99))
    assert after > before + 0.3, (before, after)


def test_bfloat16_autocast_trains_float32_weights_as_well(target, features, tmp_path):
    _, items = features
    head = _head(target, items)
    state = train.train(head, target, items, replace(RECIPE, train_dtype="bfloat16"), tmp_path,
                        max_steps=60)
    assert all(p.dtype == torch.float32 for p in head.parameters())  # master weights stay float32
    assert sum(state.losses[-5:]) / 5 < 0.5 * sum(state.losses[:5]) / 5
    after = _mean_acceptance_length(target, head, _prompts(6, 99))
    before = _mean_acceptance_length(target, _head(target, items), _prompts(6, 99))
    assert after > before + 0.3, (before, after)
    with pytest.raises(ValueError, match="float32 or bfloat16"):
        train.autocast(head, replace(RECIPE, train_dtype="float16"))


def test_saved_folder_loads_through_the_loader(target, features, tmp_path):
    from specdemo.core.drafters import eagle_io
    _, items = features
    head = _head(target, items)
    train.train(head, target, items, RECIPE, tmp_path, max_steps=3)
    eagle_io.save_head(head, tmp_path / "head", dtype=torch.float32)
    loaded = load_learned(str(tmp_path / "head"), target)
    assert loaded.head.feature_layers == LAYERS
    assert torch.equal(loaded.head.d2t, head.d2t)
    for name, value in head.state_dict().items():
        assert torch.equal(loaded.head.state_dict()[name], value), name
    # readable by others like the folder's other files (safetensors writes a private 0600 file)
    assert (tmp_path / "head" / "model.safetensors").stat().st_mode & 0o777 == 0o644


def test_resume_continues_the_same_loss_curve(target, features, tmp_path):
    _, items = features
    straight = train.train(_head(target, items), target, items, RECIPE, tmp_path / "a", max_steps=12)
    first = train.train(_head(target, items), target, items, RECIPE, tmp_path / "b", max_steps=5)
    assert first.step == 5
    resumed = train.train(_head(target, items), target, items, RECIPE, tmp_path / "b", resume=True,
                          max_steps=12)
    assert resumed.step == 12
    assert resumed.losses == pytest.approx(straight.losses, rel=1e-4, abs=1e-5)


def test_init_starts_from_an_earlier_runs_head_and_refuses_what_does_not_fit(target, features, tmp_path,
                                                                              capsys):
    """``train-draft --init DIR``: the new head takes the weights and draft-vocabulary maps of
    the head an earlier run left in DIR, so training more data starts where that run ended (its
    first loss is the earlier run's level, not a fresh head's); with another draft vocabulary the
    shared ids keep their rows; other layer shapes, a missing or a damaged checkpoint are refused
    in one sentence and change nothing."""
    from specdemo.services.training.warm_start import warm_start
    _, items = features
    first = train.train(_head(target, items), target, items, RECIPE, tmp_path / "a", max_steps=30)
    saved = torch.load(tmp_path / "a" / "checkpoint.pt", weights_only=False)["head"]
    fresh = _head(target, items)
    assert warm_start(fresh, tmp_path / "a") is None
    for name, value in saved.items():
        assert torch.equal(fresh.state_dict()[name], value), name
    again = train.train(fresh, target, items, replace(RECIPE, warmup_steps=1, learning_rate=1e-4),
                        tmp_path / "b", max_steps=1)
    cold = train.train(_head(target, items), target, items, RECIPE, tmp_path / "c", max_steps=1)
    assert again.losses[0] < 0.5 * cold.losses[0]
    assert again.losses[0] == pytest.approx(first.losses[-1], rel=0.5)

    # another draft vocabulary (16 of the 24 ids the earlier head has, and 4 it lacks): every
    # other weight carries over, the shared ids keep the earlier head's rows, new ids the target's
    counts = train.token_counts(items, target.vocab_size)
    theirs = [int(i) for i in target_ids(saved["d2t"])]
    outside = [i for i in range(target.vocab_size) if i not in theirs][:4]
    counts = torch.zeros_like(counts)
    counts[theirs[:12]] = 10
    counts[outside] = 5
    other = train.new_head(target, replace(RECIPE, draft_vocab_size=16), counts)
    fresh_rows = other.lm_head.weight.detach().clone()
    assert warm_start(other, tmp_path / "a") is None
    assert "12 of this run's 16 draft ids carried over from the earlier head's 24; 4 new ids" \
        in capsys.readouterr().out
    ours = [int(i) for i in other.draft_ids()]
    assert sorted(ours) == sorted(theirs[:12] + outside)
    for row, tid in enumerate(ours):
        expected = (saved["lm_head.weight"][theirs.index(tid)] if tid in theirs
                    else fresh_rows[row])
        assert torch.equal(other.lm_head.weight[row], expected), tid
    for name, value in saved.items():
        if name not in ("d2t", "t2d", "lm_head.weight"):
            assert torch.equal(other.state_dict()[name], value), name
    # --keep-draft-vocab: the earlier head's vocabulary and rows as they are, whatever this
    # run's answers would have built; a vocabulary of another size is refused
    kept = train.new_head(target, RECIPE, counts)
    assert not torch.equal(kept.d2t, saved["d2t"])
    assert warm_start(kept, tmp_path / "a", keep_vocab=True) is None
    for name, value in saved.items():
        assert torch.equal(kept.state_dict()[name], value), name
    assert "its draft vocabulary has 24 ids, this run's --draft-vocab 16" in warm_start(
        train.new_head(target, replace(RECIPE, draft_vocab_size=16), counts), tmp_path / "a",
        keep_vocab=True)
    wider = _head(target, items)
    wider.fc = torch.nn.Linear(wider.fc.in_features, wider.fc.out_features + 1, bias=False)
    before = {k: v.clone() for k, v in wider.state_dict().items()}
    assert "its weight fc.weight is" in warm_start(wider, tmp_path / "a")
    assert all(torch.equal(before[k], v) for k, v in wider.state_dict().items())
    assert "no checkpoint.pt or model.safetensors there" in warm_start(other, tmp_path / "missing")
    # a folder with the saved weights only (a shipped head): BF16 values, widened to float32
    from safetensors.torch import save_file
    (tmp_path / "s").mkdir()
    save_file({k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in saved.items()},
              str(tmp_path / "s" / "model.safetensors"))
    from_weights = _head(target, items)
    assert warm_start(from_weights, tmp_path / "s") is None
    for name, value in saved.items():
        expected = value.to(torch.bfloat16).float() if value.is_floating_point() else value
        assert torch.equal(from_weights.state_dict()[name], expected), name
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "checkpoint.pt").write_bytes(b"\x80\x04 not a checkpoint")
    problem = warm_start(other, tmp_path / "d")
    assert problem.startswith(f"--init {tmp_path / 'd'}: checkpoint.pt could not be read")
    assert "\n" not in problem


def test_capture_after_more_answers_keeps_full_shards_and_redoes_the_short_last_one(target, tmp_path):
    """Answers are appended across runs: a capture of the longer list keeps the shards that
    already hold their 16 answers and captures the last shard of the shorter list again (it held
    4), so every answer has its features, in order."""
    out = tmp_path / "run"
    out.mkdir()
    data.generate_answers(target, _prompts(12, 3), out, answers_per_prompt=2, max_new_tokens=8,
                          batch_size=8)
    answers = data.load_answers(out)
    assert len(answers) == 24
    first = data.capture_features(target, answers[:20], LAYERS, out, shard_size=16)
    assert [len(torch.load(p, weights_only=False)) for p in first] == [16, 4]
    kept = first[0].stat().st_mtime_ns
    second = data.capture_features(target, answers, LAYERS, out, shard_size=16)
    items = [x for p in second for x in torch.load(p, weights_only=False)]
    assert [x["ids"].tolist() for x in items] == [a["ids"] for a in answers]
    assert second[0].stat().st_mtime_ns == kept
    (out / "features" / "00001.pt").write_bytes(b"cut short")  # a damaged shard is redone too
    third = data.capture_features(target, answers, LAYERS, out, shard_size=16)
    assert len(torch.load(third[1], weights_only=False)) == 8


def test_new_head_names_the_verifier_class_when_the_target_config_has_none(target, features):
    """A target built from a GGUF has no ``config.architectures``; the head's config then names
    the target's transformers class (what speculators' verifier config and vLLM read)."""
    _, items = features
    before = target.model.config.architectures
    target.model.config.architectures = None
    try:
        head = _head(target, items)
    finally:
        target.model.config.architectures = before
    assert type(target.model).__name__ == "LlamaForCausalLM"
    assert head.verifier["architectures"] == ["LlamaForCausalLM"]


def test_the_loss_mask_covers_prompt_positions_only_when_asked():
    """``collate``'s mask (True where the head is taught): from the third position with
    ``loss_on_prompt`` (the first pair needs a feature and a token before it), else from the
    first answer token; always up to the prediction after the last token."""
    item = {"ids": torch.arange(7), "features": torch.zeros(7, 6), "last": torch.zeros(7, 4),
            "n_prompt": 4}
    short = {**item, "ids": torch.arange(5), "features": torch.zeros(5, 6), "last": torch.zeros(5, 4)}
    *_, answer, lengths = train.collate([item, short], steps=2, loss_on_prompt=True)
    assert answer[0].tolist() == [False, False] + [True] * 6 + [False]
    assert answer[1].tolist() == [False, False] + [True] * 4 + [False] * 3
    *_, answer, _ = train.collate([item, short], steps=2, loss_on_prompt=False)
    assert answer[0].tolist() == [False] * 4 + [True] * 4 + [False]
    assert answer[1].tolist() == [False] * 4 + [True] * 2 + [False] * 3
    assert lengths.tolist() == [7, 5]


def test_online_features_train_the_same_head_as_stored_ones(target, features, tmp_path):
    """--online-features: the target's features computed batch by batch give the same steps as
    the captured shards (float16 storage aside: the same loss to within its rounding)."""
    _, items = features
    bare = [{"ids": x["ids"], "n_prompt": x["n_prompt"]} for x in items]
    recipe = replace(RECIPE, epochs=1)
    stored, online = _head(target, items), _head(target, items)
    a = train.train(stored, target, items, recipe, tmp_path / "stored", max_steps=3)
    b = train.train(online, target, bare, recipe, tmp_path / "online", max_steps=3)
    assert a.step == b.step == 3
    assert b.losses == pytest.approx(a.losses, rel=2e-3)
    for (name, p), q in zip(stored.named_parameters(), online.parameters()):
        assert torch.allclose(p, q, atol=1e-4), name
    assert all("features" not in x for x in bare)  # nothing stored in the items


def test_a_time_budget_fits_the_schedule_to_the_pace_of_the_first_steps(monkeypatch, tmp_path):
    """recipe.train_budget_s: after TIMING_STEPS steps the schedule's length is the steps that
    fit the budget at their pace (a fake clock: each step takes 2 s), and the learning rate
    still decays to 0 by the end."""
    now = [0.0]
    monkeypatch.setattr(train.time, "perf_counter", lambda: now[0])
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    items = [{"ids": torch.zeros(3, dtype=torch.long), "x": torch.randn(4)} for _ in range(400)]
    recipe = train.Recipe(epochs=2, learning_rate=1e-2, warmup_steps=2, batch_tokens=3, seed=0,
                          checkpoint_every_s=1e9, train_budget_s=60.0)

    def make_step():
        def step(batch, n):
            now[0] += 2.0
            return model(torch.stack([x["x"] for x in batch])).pow(2).mean() + 0 * other.weight.sum(), [0.0]
        return step
    other = torch.nn.Linear(4, 1)
    state = train.run_training(model, list(model.parameters()), items, recipe, tmp_path, make_step)
    assert state.planned == 30 and state.step == 30  # 60 s at 2 s a step, not the 800 of 2 epochs
    assert train._lr(state.step - 1, state.planned, recipe) < 0.01 * recipe.learning_rate
    assert torch.load(tmp_path / train.CHECKPOINT, weights_only=False)["state"]["planned"] == 30
    unbounded = train.run_training(other, list(other.parameters()), items[:6], replace(recipe, train_budget_s=None),
                                   tmp_path / "b", make_step)
    assert unbounded.planned == unbounded.step == 12  # 6 batches of one item, 2 epochs
