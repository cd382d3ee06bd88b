"""Training a DFlash block drafter on a tiny random target: the loss falls, held-out acceptance
(through the engine) beats an untrained drafter's, resume reproduces an uninterrupted run, and the
saved folders (transformers' layout and z-lab's) load through the learned-drafter loader."""

import json
import random
from dataclasses import replace

import pytest
import torch

from specdemo.core.drafters.dflash import DFlashDrafter
from specdemo.models.learned import load_learned
from specdemo.core.engine import generate
from specdemo.core.kv import KVModel
from specdemo.models.loading import LoadedModel
from specdemo.core.policy import FixedDraftLength
from specdemo.services.training import data, dflash_train, train
from tiny import CharTokenizer, tiny_llama

RECIPE = dflash_train.DFlashRecipe(block_size=5, draft_layers=1, target_layer_ids=(0, 2, 3),
                                   mask_token_id=31, anchors_per_sequence=8, epochs=40,
                                   learning_rate=3e-3, warmup_steps=5, batch_tokens=512,
                                   checkpoint_every_s=1e9)


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
def items(target, tmp_path_factory):
    out = tmp_path_factory.mktemp("train_dflash")
    data.generate_answers(target, _prompts(16, 0), out, answers_per_prompt=2, max_new_tokens=32,
                          batch_size=8)
    shards = data.capture_features(target, data.load_answers(out), RECIPE.feature_layers, out,
                                   shard_size=16)
    return [x for s in shards for x in torch.load(s, weights_only=False)]


def _mean_acceptance_length(target, model, prompts, k=4):
    kv = KVModel(target.model)
    tok, forwards = 0, 0
    for row in prompts:
        ids = target.tokenizer.encode(row["prompt"])
        drafter = DFlashDrafter(model, target.model, target.vocab_size)
        stats = generate(kv, ids, target.tokenizer, drafter=drafter, policy=FixedDraftLength(k),
                         max_new_tokens=40).stats
        tok, forwards = tok + stats.new_tokens - 1, forwards + stats.target_forwards
    return tok / forwards


def test_features_are_outputs_of_the_target_layers():
    assert RECIPE.feature_layers == (1, 3, 4)  # hidden_states[k + 1]
    assert dflash_train.default_target_layers(30, 4) == (1, 10, 18, 27)  # z-lab: 1 .. L-3
    assert dflash_train.default_target_layers(4, 3) == (0, 2, 3)


def test_mask_token_is_the_least_used_non_eos_id():
    counts = torch.tensor([0, 5, 0, 3, 0, 9])
    assert dflash_train.pick_mask_token(counts, eos_ids={4}) == 2
    assert dflash_train.pick_mask_token(counts, eos_ids={0, 2, 4}) == 3


@pytest.mark.slow
def test_training_lowers_loss_and_beats_an_untrained_drafter(target, items, tmp_path):
    held = _prompts(6, 99)
    before = _mean_acceptance_length(target, dflash_train.new_drafter(target, RECIPE).eval(), held)
    model = dflash_train.new_drafter(target, RECIPE)
    state = dflash_train.train(model, target, items, RECIPE, tmp_path, max_steps=80)
    assert state.step == 80
    assert sum(state.losses[-5:]) / 5 < 0.5 * sum(state.losses[:5]) / 5
    after = _mean_acceptance_length(target, model, held)
    assert after > before + 0.3, (before, after)


def test_resume_reproduces_an_uninterrupted_run(target, items, tmp_path):
    straight = dflash_train.new_drafter(target, RECIPE)
    a = dflash_train.train(straight, target, items, RECIPE, tmp_path / "a", max_steps=8)
    first = dflash_train.train(dflash_train.new_drafter(target, RECIPE), target, items, RECIPE,
                               tmp_path / "b", max_steps=3)
    assert first.step == 3
    resumed = dflash_train.new_drafter(target, RECIPE)
    b = dflash_train.train(resumed, target, items, RECIPE, tmp_path / "b", resume=True, max_steps=8)
    assert b.step == 8
    assert b.losses == pytest.approx(a.losses, rel=1e-4, abs=1e-5)
    for name, value in straight.state_dict().items():
        assert torch.allclose(resumed.state_dict()[name], value, atol=1e-5), name


@pytest.mark.parametrize("layout", ["transformers", "z-lab"])
def test_saved_folders_load_with_the_same_weights(target, items, tmp_path, layout):
    model = dflash_train.new_drafter(target, RECIPE)
    dflash_train.train(model, target, items, RECIPE, tmp_path / "run", max_steps=2)
    folder = dflash_train.save(model, tmp_path / "out", target, dtype=torch.float32,
                               verifier="tiny-llama")
    zlab = json.loads((folder / "zlab" / "config.json").read_text())
    assert zlab["architectures"] == ["DFlashDraftModel"]
    assert zlab["dflash_config"] == {"mask_token_id": 31, "target_layer_ids": [0, 2, 3],
                                     "block_size": 5, "target_model": "tiny-llama"}
    assert zlab["num_target_layers"] == 4 and zlab["vocab_size"] == 32
    assert zlab["eagle_aux_hidden_state_layer_ids"] == [1, 3, 4]  # vLLM: inputs of layers
    from safetensors.torch import load_file
    keys = set(load_file(str(folder / "zlab" / "model.safetensors")))
    assert {"fc.weight", "hidden_norm.weight", "norm.weight",
            "layers.0.self_attn.q_proj.weight"} <= keys
    assert not any(k.startswith(("embed_tokens", "lm_head", "encoder.")) for k in keys)
    loaded = load_learned(str(folder if layout == "transformers" else folder / "zlab"), target)
    assert loaded.info["layout"] == layout
    for name, value in model.state_dict().items():
        assert torch.equal(loaded.model.state_dict()[name], value), name
    assert all(p.stat().st_mode & 0o777 == 0o644 for p in folder.rglob("*.safetensors"))


@pytest.mark.slow
def test_cli_trains_dflash_at_two_data_sizes_and_reports_speed(target, tmp_path, monkeypatch, capsys):
    """``train-draft --kind dflash --data-sizes 0.5,1`` end to end on the tiny target: both
    layouts, a report with acceptance and held-out speed at two k, and the data-size curve."""
    import specdemo.models.loading as models
    from specdemo.interfaces.cli import main
    monkeypatch.setattr(models, "load_model", lambda spec, device, dtype: target)
    prompts = tmp_path / "prompts.jsonl"
    rows = _prompts(10, 0) + [{**r, "split": "heldout"} for r in _prompts(2, 99)]
    prompts.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "out"
    status = main(["train-draft", "--kind", "dflash", "--target", "tiny", "--out", str(out),
                   "--prompts", str(prompts), "--max-tokens", "16", "--answers-per-prompt", "1",
                   "--max-steps", "3", "--block-size", "4", "--draft-layers", "1",
                   "--target-layers", "3", "--report-prompts", "2", "--report-k", "2,4",
                   "--data-sizes", "0.5,1"])
    assert status == 0
    recipe = json.loads((out / "recipe.json").read_text())
    assert recipe["target_layer_ids"] == [0, 2, 3] and recipe["feature_layers"] == [1, 3, 4]
    assert json.loads((out / "config.json").read_text())["model_type"] == "muse_glimmer_assistant"
    assert json.loads((out / "zlab" / "config.json").read_text())["architectures"] == ["DFlashDraftModel"]
    report = json.loads((out / "report.json").read_text())
    assert set(report["heldout"]) == {"plain", "dflash", "ngram"}
    assert set(report["heldout_by_k"]) == {"2", "4"}
    assert report["heldout_by_k"]["4"]["dflash"]["k"] == 4
    row = report["heldout"]["dflash"]
    assert row["tokens_per_s"] > 0 and row["draft_s_per_round"] > 0 and row["speedup"] > 0
    assert report["heldout"]["plain"]["mean_acceptance_length"] == 1.0
    curve = json.loads((out / "data_size_curve.json").read_text())
    assert [c["answers"] for c in curve] == [5, 10]
    assert curve[0]["answer_tokens"] < curve[1]["answer_tokens"]
    assert (out / "size-0.5" / "zlab" / "model.safetensors").exists()
    assert "answer tokens" in (out / "data_size_curve.md").read_text()
    ran_on = json.loads((out / "train.json").read_text())["stages_ran_on"]
    from specdemo.models.native import unavailable_reason
    generated_by = "transformers" if unavailable_reason(target) else "native-w8a8"  # --generate-backend auto
    assert ran_on == {"generate": f"the target on cpu, {generated_by} backend", "capture": "the target on cpu",
                      "train": "cpu, float32",
                      "report": "the target on cpu (transformers, float32: the reference)"}
    timings = json.loads((out / "train.json").read_text())["timings_s"]
    assert 0 < timings["report_s"] < timings["total_s"]


def test_cli_refuses_bad_sizes_in_one_sentence(tmp_path, capsys):
    from specdemo.interfaces.cli import main
    with pytest.raises(SystemExit) as exc:
        main(["train-draft", "--kind", "dflash", "--out", str(tmp_path / "o"), "--data-sizes", "0,2"])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.strip() == "error: --data-sizes takes comma-separated fractions in (0, 1], not '0,2'"
