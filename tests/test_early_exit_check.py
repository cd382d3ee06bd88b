"""``early-exit:N`` is checked against the target's layer count, read from its config (no
weights): ``check`` and the app's draft list say what ``run`` would say (a user's report:
``check`` called early-exit:99 compatible for the 30-layer SmolLM2, ``run`` refused it)."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
from transformers import LlamaConfig

from specdemo.models import builtin, loading as models
from specdemo.checks import compat
from specdemo.core.draft_spec import DraftSpec
from specdemo.interfaces import ui
from specdemo.interfaces.cli import main
from specdemo.models.loading import ModelLoadError

REFUSAL = "early-exit layers must be in 1..3, got {n}"  # for a 4-layer target


@pytest.fixture
def four_layers(tmp_path):
    """A target folder holding only a 4-layer config (no weights, no tokenizer)."""
    folder = tmp_path / "target"
    LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=32).save_pretrained(folder)
    assert sorted(p.name for p in folder.iterdir()) == ["config.json"]
    return str(folder)


@pytest.mark.parametrize("n, status", [(1, "compatible"), (3, "compatible"), (4, "incompatible"),
                                       (99, "incompatible")])
def test_early_exit_is_checked_against_the_target_layers(four_layers, n, status):
    verdict = compat.check_specs(four_layers, f"early-exit:{n}")
    assert verdict.status == status
    if status == "incompatible":
        assert verdict.reasons == [REFUSAL.format(n=n)]
    else:
        assert verdict.reasons == [f"early-exit:{n} runs the first {n} of the target's 4 layers "
                                   "and its head: same tokenizer by construction"]


def test_the_check_gives_the_engines_own_words():
    """``run`` refuses through ``early_exit_view``; the check must say the same thing."""
    from tiny import tiny_llama

    from specdemo.core.drafters import early_exit_view
    from specdemo.core.drafters.draft_model import early_exit_problem
    with pytest.raises(ValueError) as refused:
        early_exit_view(tiny_llama(layers=4), 99)
    assert str(refused.value) == REFUSAL.format(n=99) == early_exit_problem(99, 4)


def test_check_command_refuses_with_exit_status_2(four_layers, capsys):
    assert main(["check", "--target", four_layers, "--draft", "early-exit:99"]) == 2
    out = capsys.readouterr().out
    assert out.splitlines() == [f"target {four_layers}, draft early-exit:99: incompatible",
                                f"  - {REFUSAL.format(n=99)}"]
    assert main(["check", "--target", four_layers, "--draft", "early-exit:3", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "compatible"


def test_uncached_hub_target_offline_cannot_be_checked(monkeypatch, capsys):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    target = "no-such-org/no-such-model"
    with pytest.raises(ModelLoadError, match=f"cannot check early-exit:4: the layer count of "
                                             f"{target} is unknown .*hub is not reachable"):
        compat.check_specs(target, "early-exit:4")
    # the command refuses such a target at once, as run does (input, exit status 2), rather than
    # "could not decide" (1)
    assert main(["check", "--target", target, "--draft", "early-exit:4"]) == 2
    assert capsys.readouterr().out == (f"error: target '{target}' is not in the local Hugging Face "
                                       "cache and the model hub is not reachable (or "
                                       "HF_HUB_OFFLINE=1): download it on a connected machine, or "
                                       "give a local folder or file\n")


def _write_gguf(path, block_count: int) -> None:
    """A GGUF file with metadata only: an array of strings and a float before the block count,
    which the header reader must step over."""
    import gguf
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_array("tokenizer.ggml.tokens", [f"tok{i}" for i in range(300)])
    writer.add_float32("llama.rope.freq_base", 10000.0)
    writer.add_block_count(block_count)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_layer_count_is_read_from_the_metadata_of_one_file_or_its_parts(tmp_path):
    from specdemo.models.ggufread import block_count
    whole = tmp_path / "m.gguf"
    _write_gguf(whole, 7)
    assert models.layer_count(str(whole)) == 7
    data = whole.read_bytes()
    parts = [tmp_path / f"m.part{i}" for i in range(3)]
    for part, (a, b) in zip(parts, [(0, 10), (10, 1000), (1000, len(data))]):
        part.write_bytes(data[a:b])
    assert block_count(parts) == 7


def test_builtin_layer_count_needs_no_conversion(tmp_path, monkeypatch, capsys):
    """An unconverted built-in is read from its GGUF metadata (nothing is converted); a converted
    one from its folder's config."""
    gguf_file = tmp_path / "smol.gguf"
    _write_gguf(gguf_file, 30)
    monkeypatch.setattr(models, "_LOADED", {})  # a model loaded by an earlier test lends its config
    monkeypatch.setenv("SPECDEMO_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(builtin, "_locate_parts", lambda b: [gguf_file])
    assert main(["check", "--target", "builtin:smollm2-135m", "--draft", "early-exit:99"]) == 2
    assert "early-exit layers must be in 1..29, got 99" in capsys.readouterr().out
    assert not (tmp_path / "cache").exists()  # nothing converted, nothing written
    monkeypatch.setattr(builtin, "_stale_reason", lambda folder, sources, needs=None: None)
    LlamaConfig(num_hidden_layers=5).save_pretrained(tmp_path / "cache" / "smollm2-135m")
    assert models.layer_count("builtin:smollm2-135m") == 5


def test_the_draft_list_refuses_an_early_exit_the_target_cannot_run(four_layers, monkeypatch):
    monkeypatch.setattr(ui, "_VERDICTS", {})
    monkeypatch.setattr(models, "builtin_names", lambda: [])  # no other models to check
    monkeypatch.setattr(ui, "engine_imports", lambda: None)
    presets = [SimpleNamespace(target=four_layers, draft=DraftSpec.parse(d),  # as Preset.draft
                               draft_is_learned=False, draft_is_model=False, draft_kind="")
               for d in ("early-exit:2", "early-exit:99")]
    choices, refused = ui.draft_options(four_layers, presets)
    assert [spec for _, spec in choices] == ["ngram", "self", "early-exit:2"]
    assert refused == [("early-exit:99", REFUSAL.format(n=99))]
    monkeypatch.setattr(ui, "_pairing", lambda name: ui.Pairing(four_layers))
    assert ui.on_draft(None, "early-exit:99") == (f"✗ `early-exit:99`: incompatible. "
                                                  f"{REFUSAL.format(n=99)}")
    monkeypatch.setattr(ui, "_pairing", lambda name: ui.Pairing("no-such-org/no-such-model"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert ui.on_draft(None, "early-exit:2").startswith(
        "⚠ `early-exit:2`: cannot check early-exit:2: the layer count of "
        "no-such-org/no-such-model is unknown")
