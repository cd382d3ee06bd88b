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
