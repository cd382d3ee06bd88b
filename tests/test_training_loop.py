"""The training loop both drafter kinds share (train.run_training), on a tiny linear model:
Ctrl-C writes a checkpoint that resumes to the uninterrupted run, the timed checkpoint is
written during the run, only the given parameters move, and the warm-up/cosine schedule."""

import math
from dataclasses import replace

import pytest
import torch

from specdemo.services.training import train

RECIPE = train.Recipe(epochs=3, learning_rate=1e-2, warmup_steps=2, batch_tokens=8, seed=3,
                      checkpoint_every_s=1e9)


def _items():
    gen = torch.Generator().manual_seed(0)
    return [{"ids": torch.zeros(2 + i % 3, dtype=torch.long), "x": torch.randn(4, generator=gen),
             "y": torch.randn(1, generator=gen)} for i in range(12)]


def _model():
    torch.manual_seed(1)
    return torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 1))


def _make_step(model, interrupt_at=None, seen=None):
    def make_step():
        def step(batch_items, step):
            if step == interrupt_at:
                raise KeyboardInterrupt
            if seen is not None:
                seen.append(step)
            x = torch.stack([item["x"] for item in batch_items])
            y = torch.stack([item["y"] for item in batch_items])
            return torch.nn.functional.mse_loss(model(x), y), [0.5]
        return step
    return make_step


def test_batches_per_epoch_are_several():
    assert len(train.batches(_items(), RECIPE.batch_tokens, RECIPE.seed)) == 5  # 15 steps in all


def test_ctrl_c_writes_a_checkpoint_that_resumes_to_the_uninterrupted_run(tmp_path):
    items = _items()
    straight = _model()
    a = train.run_training(straight, list(straight.parameters()), items, RECIPE, tmp_path / "a",
                           _make_step(straight))
    assert a.step == 15 and a.epoch == 3 and len(a.losses) == 15 and a.accuracy == [[0.5]] * 15
    first = _model()
    with pytest.raises(KeyboardInterrupt):  # in the second epoch
        train.run_training(first, list(first.parameters()), items, RECIPE, tmp_path / "b",
                           _make_step(first, interrupt_at=7))
    saved = torch.load(tmp_path / "b" / train.CHECKPOINT, weights_only=False)
    assert set(saved) == {"head", "optimizer", "state", "recipe"}
    assert (saved["state"]["step"], saved["state"]["epoch"], saved["state"]["batch_in_epoch"]) == (7, 1, 2)
    assert saved["state"]["losses"] == a.losses[:7]
    resumed, seen = _model(), []
    b = train.run_training(resumed, list(resumed.parameters()), items, RECIPE, tmp_path / "b",
                           _make_step(resumed, seen=seen), resume=True)
    assert seen == list(range(7, 15))
    assert b.losses == a.losses
    for name, value in straight.state_dict().items():
        assert torch.equal(resumed.state_dict()[name], value), name
    assert not resumed.training  # handed back in eval mode


def test_timed_checkpoint_is_written_during_the_run_and_only_params_move(tmp_path):
    items, model = _items(), _model()
    frozen = model[1].weight.detach().clone()
    ckpt, steps_saved = tmp_path / train.CHECKPOINT, []
    make_step = _make_step(model)

    def make_checking_step():
        step = make_step()

        def checking(batch_items, n):
            steps_saved.append(torch.load(ckpt, weights_only=False)["state"]["step"]
                               if ckpt.exists() else None)
            return step(batch_items, n)
        return checking

    state = train.run_training(model, list(model[0].parameters()), items,
                               replace(RECIPE, checkpoint_every_s=0.0), tmp_path,
                               make_checking_step, max_steps=3)
    assert steps_saved == [None, 1, 2]  # written after every step, not only at the end
    assert state.step == 3
    assert torch.load(ckpt, weights_only=False)["state"]["step"] == 3
    assert torch.equal(model[1].weight, frozen)  # not in params: not trained


def test_learning_rate_warms_up_then_decays_on_a_cosine():
    recipe = replace(RECIPE, learning_rate=1.0, warmup_steps=2)
    got = [train._lr(step, 10, recipe) for step in range(11)]
    want = [0.5, 1.0] + [0.5 * (1 + math.cos(math.pi * i / 8)) for i in range(9)]
    assert got == pytest.approx(want)
    assert got[6] == pytest.approx(0.5) and got[10] == pytest.approx(0.0, abs=1e-12)
