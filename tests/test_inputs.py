"""Issue 11 item 5: bad input is a clear error naming the field and the valid values, the same
way in the command line and the /race API (tests/test_ui.py drives the API)."""

import pytest

from specdemo.checks import inputs
from specdemo.interfaces.cli import main

SURROGATE_PROMPT = "hi \udced\udca0\udc80"  # what Python makes of printf 'hi \xed\xa0\x80' in argv


def cli_error(capsys, *argv) -> str:
    with pytest.raises(SystemExit) as caught:
        main(list(argv))
    assert caught.value.code == 2
    return capsys.readouterr().err


def test_lone_surrogate_prompt_is_refused_before_any_model_loads(capsys, monkeypatch):
    import specdemo.models.loading as models

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded for an invalid prompt")
    monkeypatch.setattr(models, "load_model", no_load)
    err = cli_error(capsys, "run", "--prompt", SURROGATE_PROMPT, "--max-new-tokens", "4")
    assert "argument --prompt: prompt has a character that is not valid text at position 3" in err
    assert "Traceback" not in err and "TypeError" not in err and "codec" not in err


@pytest.mark.parametrize("argv, message", [
    (["--draft-length", "0"], "draft length must be 'auto' or a whole number from 1 to 64, got '0'"),
    (["--temperature", "abc"], "argument --temperature: temperature must be a number of at least 0, "
                               "got 'abc'"),
    (["--top-p", "0"], "top p must be a number above 0 and at most 1, got '0'"),
    (["--max-new-tokens", "2.5"], "max new tokens must be a whole number of at least 1, got '2.5'"),
    (["--draft", "early-exit:zero"], "early-exit needs a layer count of at least 1"),
    (["--draft", "builtin:nope"], "'builtin:nope' is not a built-in model or drafter; valid forms: none, ngram, "
                                  "self, early-exit:<layers>, builtin:<name> (gemma3-270m, "
                                  "smollm2-135m)"),
    (["--system", "\udcff"], "system has a character that is not valid text at position 0"),
])
def test_cli_names_the_field_and_the_valid_values(capsys, argv, message):
    err = cli_error(capsys, "compare", "--prompt", "hi", *argv)
    assert message in err and "could not convert" not in err


def test_the_api_and_the_cli_share_the_rules():
    assert inputs.draft_length("k", "auto") == "auto" and inputs.draft_length("k", " 4 ") == 4
    assert inputs.draft_length("k", 64) == 64
    for bad in (0, "0", 65, "x", 2.5, None, True):
        with pytest.raises(inputs.InputError, match="k must be 'auto' or a whole number from 1 to 64"):
            inputs.draft_length("k", bad)
    assert inputs.number("t", "0.5", minimum=0) == 0.5
    for bad in ("nan", "inf", "", None, [1]):
        with pytest.raises(inputs.InputError, match="t must be a number"):
            inputs.number("t", bad, minimum=0)
    assert inputs.preset("a", ["a", "b"]) == "a"
    with pytest.raises(inputs.InputError, match="preset 'c' does not exist; valid presets: a, b"):
        inputs.preset("c", ["a", "b"])
    assert inputs.text("prompt", "héllo 🦩") == "héllo 🦩"
    with pytest.raises(inputs.InputError, match="the prompt is empty"):
        inputs.text("prompt", "  ")
    assert inputs.draft("draft", " ngram ") == "ngram"
    assert inputs.draft("draft", "org/model") == "org/model"  # checked when loaded


def test_the_page_refuses_with_the_same_words():
    """The Send handler: the same checks, as a gr.Error the page shows (nothing is loaded)."""
    from types import SimpleNamespace

    import gradio as gr

    from specdemo.interfaces import ui
    request = SimpleNamespace(session_hash="test-inputs")
    with pytest.raises(gr.Error, match="draft length must be 'auto' or a whole number from 1 to 64, "
                                       "got '0'"):
        next(ui.send("hi", "", None, "ngram", "0", 0.0, 1.0, 8, -1, True, None, request))
    with pytest.raises(gr.Error, match="draft 'early-exit:x': early-exit needs a layer count"):
        next(ui.send("hi", "", None, "early-exit:x", "4", 0.0, 1.0, 8, -1, True, None, request))
    with pytest.raises(gr.Error, match="system prompt has a character that is not valid text"):
        next(ui.send("hi", "\udcff", None, "ngram", "4", 0.0, 1.0, 8, -1, True, None, request))
    with pytest.raises(gr.Error, match="top-p must be a number above 0 and at most 1, got 2"):
        next(ui.send("hi", "", None, "ngram", "4", 0.0, 2, 8, -1, True, None, request))


@pytest.mark.parametrize("flag", ["--target", "--draft"])
def test_check_refuses_a_missing_path_at_once_with_runs_words(capsys, monkeypatch, flag):
    """A user's report: ``check --draft /tmp/nonexistent`` took 8 s and ended with exit status 1
    and other words than ``run``'s immediate refusal."""
    import specdemo.models.loading as models

    def no_load(*args, **kwargs):
        raise AssertionError("a tokenizer or config was read for a path that does not exist")
    for name in ("load_tokenizer", "load_model", "layer_count"):
        monkeypatch.setattr(models, name, no_load)
    other = "--draft" if flag == "--target" else "--target"
    spec = {"--target": "builtin:smollm2-135m", "--draft": "ngram"}[other]
    missing = "/tmp/specdemo-no-such-model-anywhere"
    checked = cli_error(capsys, "check", flag, missing, other, spec)
    field = flag.removeprefix("--")
    assert f"argument {flag}: {field} '{missing}': no such file or folder; valid forms: " in checked
    ran = cli_error(capsys, "run", "--prompt", "hi", flag, missing, other, spec)
    assert checked.splitlines()[-1].split(": error: ")[1] == ran.splitlines()[-1].split(": error: ")[1]
