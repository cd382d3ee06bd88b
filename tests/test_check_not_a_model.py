"""``check --target PATH`` for a target that is not a model (issue 20, item 3): ``run`` refuses a
system file or a folder without a config before loading anything; ``check`` must refuse it too,
whatever the draft, in the same words and with the same exit status."""

from __future__ import annotations

import pytest

from specdemo.interfaces.cli import main


def _not_models(tmp_path):
    system_file = tmp_path / "hostname"
    system_file.write_text("a-machine\n")
    bare = tmp_path / "bare"
    bare.mkdir()
    (bare / "notes.txt").write_text("not a model")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{not json")
    return {"a file": (system_file, "is neither a model folder nor a .gguf file"),
            "a folder without config.json": (bare, "the folder has no config.json, so it is not "
                                                   "a model folder"),
            "a folder whose config.json is not JSON": (broken, "config.json is not valid JSON")}


@pytest.mark.parametrize("what", ["a file", "a folder without config.json",
                                  "a folder whose config.json is not JSON"])
@pytest.mark.parametrize("draft", ["ngram", "none", "self"])
def test_check_refuses_what_run_refuses_in_the_same_words(tmp_path, capsys, what, draft):
    target, words = _not_models(tmp_path)[what]
    with pytest.raises(SystemExit) as exited:
        main(["run", "--target", str(target), "--draft", draft, "--prompt", "hello"])
    run_err = capsys.readouterr().err
    assert exited.value.code == 2
    status = main(["check", "--target", str(target), "--draft", draft])
    check_out = capsys.readouterr().out
    assert status == 2
    assert words in check_out and "compatible" not in check_out, check_out
    assert check_out.strip() == run_err.strip().splitlines()[-1]  # "error: <the same sentence>"


def test_check_json_names_the_error(tmp_path, capsys):
    import json
    target, words = _not_models(tmp_path)["a folder without config.json"]
    assert main(["check", "--target", str(target), "--draft", "ngram", "--json"]) == 2
    out = json.loads(capsys.readouterr().out)
    assert words in out["error"] and "status" not in out


@pytest.fixture
def tiny_folder(tmp_path):
    """A tiny Llama folder (random weights, a tokenizer) whose config.json the tests rewrite."""
    from test_compat import make_tokenizer
    from tiny import tiny_llama
    folder = tmp_path / "tiny"
    tiny_llama(seed=3, vocab_size=32, layers=2).save_pretrained(folder)
    make_tokenizer().save_pretrained(folder)
    return folder


@pytest.mark.parametrize("change,first", [
    # a bare model type: transformers' defaults would build a 7B model (22 GB of random weights)
    (lambda config: {"model_type": config["model_type"]}, "model.embed_tokens.weight"),
    # one size wrong: the key/value projections no longer fit
    (lambda config: config | {"num_key_value_heads": config["num_key_value_heads"] * 2},
     "model.layers.0.self_attn.k_proj.weight"),
])
def test_a_config_that_does_not_describe_its_weights_is_refused_in_one_sentence(
        tiny_folder, capsys, change, first):
    import json

    from specdemo.models import loading
    config_path = tiny_folder / "config.json"
    loading.check_local(str(tiny_folder))  # the folder as saved passes
    config_path.write_text(json.dumps(change(json.loads(config_path.read_text()))))
    with pytest.raises(loading.ModelLoadError) as refused:
        loading.check_local(str(tiny_folder))
    words = str(refused.value)
    assert "its config.json does not describe its weights" in words and first in words, words
    assert main(["check", "--target", str(tiny_folder), "--draft", "ngram"]) == 2
    assert "does not describe its weights" in capsys.readouterr().out
