"""Issue 11 item 5: bad input is a clear error naming the field and the valid values, the same
way in the command line and the /race API (tests/test_ui.py drives the API)."""

import dataclasses
from pathlib import Path

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
    (["--draft", "early-exit:zero"], "early-exit's layer count 'zero' is not a whole number"),
    (["--draft", "early-exit:0"], "early-exit needs a layer count of at least 1"),
    (["--draft", "builtin:nope"], "'builtin:nope' is not a built-in model or drafter; valid forms: none, ngram, "
                                  "self, early-exit:<layers>, mtp, builtin:<name>"),
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
    with pytest.raises(gr.Error, match="draft 'early-exit:x': early-exit's layer count 'x' is not a whole number"):
        next(ui.send("hi", "", None, "early-exit:x", "4", 0.0, 1.0, 8, -1, True, None, request))
    with pytest.raises(gr.Error, match="system prompt has a character that is not valid text"):
        next(ui.send("hi", "\udcff", None, "ngram", "4", 0.0, 1.0, 8, -1, True, None, request))
    with pytest.raises(gr.Error, match="top-p must be a number above 0 and at most 1, got 2"):
        next(ui.send("hi", "", None, "ngram", "4", 0.0, 2, 8, -1, True, None, request))


@pytest.mark.parametrize("flag", ["--target", "--draft"])
def test_check_refuses_a_missing_path_at_once_with_runs_words(capsys, monkeypatch, tmp_path, flag):
    """A user's report: ``check --draft`` with a path that does not exist took 8 s and ended with
    exit status 1 and other words than ``run``'s immediate refusal."""
    import specdemo.models.loading as models

    def no_load(*args, **kwargs):
        raise AssertionError("a tokenizer or config was read for a path that does not exist")
    for name in ("load_tokenizer", "load_model", "layer_count"):
        monkeypatch.setattr(models, name, no_load)
    other = "--draft" if flag == "--target" else "--target"
    spec = {"--target": "builtin:smollm2-135m", "--draft": "ngram"}[other]
    missing = str(tmp_path / "specdemo-no-such-model-anywhere")
    checked = cli_error(capsys, "check", flag, missing, other, spec)
    field = flag.removeprefix("--")
    assert f"argument {flag}: {field} '{missing}': no such file or folder; valid forms: " in checked
    ran = cli_error(capsys, "run", "--prompt", "hi", flag, missing, other, spec)
    assert checked.splitlines()[0] == ran.splitlines()[0]  # the same sentence, then each's --help


# --- a tester's report: refusals with a usage block, typos that load the target first, exit 1
# for bad input in check, a refusal whose speed depended on the order of the flags -------------

def no_loading(monkeypatch):
    """Make any model load fail the test (every refusal below must come before one)."""
    import specdemo.models.loading as models
    import specdemo.services.startup as startup

    def no_load(*args, **kwargs):
        raise AssertionError("a model was loaded before the input was refused")
    monkeypatch.setattr(models, "load_model", no_load)
    monkeypatch.setattr(startup, "load_model", no_load)


@pytest.fixture
def offline_empty_cache(tmp_path, monkeypatch):
    """No hub model in the Hugging Face cache, and the hub does not answer."""
    import huggingface_hub.constants as constants

    import specdemo.models.loading as models
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "empty-cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: False)
    return tmp_path / "empty-cache"


FORMS = ("valid forms: none, ngram, self, early-exit:<layers>, mtp, builtin:<name>, a local model "
         "or learned-drafter folder or .gguf file, a Hugging Face id org/name, <learned>+ngram")
NGRM = ("error: argument --draft: draft 'ngrm' is not a known name, a local file or folder, or a "
        f"model in the local Hugging Face cache (did you mean ngram?); {FORMS}")


@pytest.mark.parametrize("argv, first", [
    (["compare", "--prompt", ""], "error: argument --prompt: the prompt is empty: type something "
                                  "to send"),
    (["compare", "--prompt", "hi", "--max-new-tokens", "0"],
     "error: argument --max-new-tokens: max new tokens must be a whole number of at least 1, "
     "got '0'"),
    (["compare", "--prompt", "hi", "--draft-length", "0"],
     "error: argument --draft-length: draft length must be 'auto' or a whole number from 1 to 64, "
     "got '0'"),
    (["compare"], "error: the following arguments are required: --prompt"),
    (["run", "--prompt", "hi", "--target", "./missing.gguf"],
     "error: argument --target: target './missing.gguf': no such file or folder; valid forms: "
     "builtin:<name> (gemma3-270m, smollm2-135m), a local model folder, a .gguf file or a Hugging "
     "Face id like org/name"),
    (["compare", "--prompt", "hi", "--draft", "ngrm"], NGRM),
    (["run", "--prompt", "hi", "--draft", "ngrm"], NGRM),
    (["bench", "--draft", "ngrm", "--out", "unused"], NGRM),
    (["check", "--target", "builtin:smollm2-135m", "--draft", "ngrm"], NGRM),
    (["compare", "--prompt", "hi", "--draft", "no-such-draft"],
     "error: argument --draft: draft 'no-such-draft' is not a known name, a local file or folder, "
     f"or a model in the local Hugging Face cache; {FORMS}"),
    (["run", "--prompt", "hi", "--draft", "early_exit:4"],
     "error: argument --draft: draft 'early_exit:4' is not a known name, a local file or folder, "
     f"or a model in the local Hugging Face cache (did you mean early-exit:4?); {FORMS}"),
    (["run", "--prompt", "hi", "--target", "smollm2-135m"],
     "error: argument --target: target 'smollm2-135m' is not a known name, a local file or folder, "
     "or a model in the local Hugging Face cache (did you mean builtin:smollm2-135m?); valid "
     "forms: builtin:<name> (gemma3-270m, smollm2-135m), a local model folder, a .gguf file or a "
     "Hugging Face id like org/name"),
    (["compare", "--prompt", "hi", "--dtype", "float8"],
     "error: argument --dtype: invalid choice: 'float8' (choose from auto, float32, bfloat16, "
     "float16) (did you mean float32?)"),
])
def test_a_refusal_is_one_sentence_and_where_the_help_is(capsys, monkeypatch, offline_empty_cache,
                                                         argv, first):
    """No usage block: the sentence, then ``(python -m specdemo <command> --help)``; exit 2;
    nothing loaded."""
    no_loading(monkeypatch)
    err = cli_error(capsys, *argv)
    assert err.splitlines() == [first.replace("'float8' (choose from auto, float32, bfloat16, "
                                              "float16)", _dtype_choice_text()),
                                f"(python -m specdemo {argv[0]} --help)"]


def _dtype_choice_text() -> str:
    """argparse's own words for an invalid choice (its quoting changed across Python versions)."""
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument("--dtype", choices=["auto", "float32", "bfloat16", "float16"])
    try:
        parser._get_values(parser._actions[-1], ["float8"])  # noqa: SLF001 (argparse's message)
    except argparse.ArgumentError as exc:
        return str(exc).split("invalid choice: ", 1)[1]
    raise AssertionError("argparse accepted float8")


def test_the_top_level_parser_refuses_the_same_way(capsys):
    err = cli_error(capsys, "nosuchcommand")
    assert err.splitlines()[0].startswith("error: argument command: invalid choice: ")
    assert err.splitlines()[1:] == ["(python -m specdemo --help)"]


def test_did_you_mean_only_for_a_close_name():
    for typo, meant in [("ngrm", "ngram"), ("nram", "ngram"), ("slef", "self"), ("Ngram", "ngram"),
                        ("early-exti:8", "early-exit:8"), ("builtin:smolm2-135m-eagle3",
                                                           "builtin:smollm2-135m-eagle3")]:
        with pytest.raises(inputs.InputError, match=f"did you mean {meant}\\?"):
            inputs.draft("draft", typo)
    with pytest.raises(inputs.InputError) as refused:
        inputs.draft("draft", "no-such-draft")
    assert "did you mean" not in str(refused.value)


def test_known_forms_pass_the_text_check(tmp_path, offline_empty_cache):
    folder = tmp_path / "drafter"
    folder.mkdir()
    for spec in ("none", "ngram", "self", "mtp", "mtp+ngram", "early-exit:3",
                 "builtin:smollm2-135m", "builtin:smollm2-135m-eagle3",
                 "builtin:smollm2-135m-eagle3+ngram", "org/model", "org/model+ngram", str(folder),
                 str(folder) + "+ngram"):
        assert inputs.draft("draft", spec) == spec


def _cache_model(cache, repo: str) -> None:
    """A Hugging Face cache entry for ``repo`` holding a config.json (the layout huggingface_hub
    reads: refs/main names the snapshot)."""
    entry = cache / ("models--" + repo.replace("/", "--"))
    (entry / "refs").mkdir(parents=True)
    (entry / "refs" / "main").write_text("0" * 40)
    snapshot = entry / "snapshots" / ("0" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text("{}")


def test_a_hub_model_in_the_local_cache_passes_offline(offline_empty_cache):
    """A bare legacy hub name (``gpt2``) is accepted when it is cached, refused when not; an
    ``org/name`` id not cached while the hub does not answer is refused, cached it passes."""
    with pytest.raises(inputs.InputError, match="'gpt2' is not a known name"):
        inputs.draft("draft", "gpt2")
    with pytest.raises(inputs.InputError, match="draft 'org/model' is not in the local Hugging Face "
                                                "cache and the model hub is not reachable"):
        inputs.obtainable("draft", "org/model")
    _cache_model(offline_empty_cache, "gpt2")
    _cache_model(offline_empty_cache, "org/model")
    assert inputs.draft("draft", "gpt2") == "gpt2"
    assert inputs.target("target", "gpt2") == "gpt2"
    assert inputs.obtainable("draft", "org/model+ngram") == "org/model+ngram"


def test_an_uncached_hub_id_is_obtainable_when_the_hub_answers(offline_empty_cache, monkeypatch):
    import specdemo.models.loading as models
    monkeypatch.setattr(models, "_hub_reachable", lambda timeout_s=5.0: True)
    assert inputs.obtainable("draft", "org/model") == "org/model"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(inputs.InputError, match="not in the local Hugging Face cache"):
        inputs.obtainable("draft", "org/model")


UNREACHABLE = ("draft 'org/not-cached' is not in the local Hugging Face cache and the model hub is "
               "not reachable (or HF_HUB_OFFLINE=1): download it on a connected machine, or give a "
               "local folder or file")


@pytest.mark.parametrize("argv", [
    ["compare", "--prompt", "hi", "--draft", "org/not-cached"],
    ["run", "--prompt", "hi", "--draft", "org/not-cached"],
    ["bench", "--target", "builtin:smollm2-135m", "--draft", "org/not-cached", "--out", "unused",
     "--tasks", "chat"],
])
def test_an_unobtainable_hub_draft_is_refused_before_the_target_loads(capsys, monkeypatch,
                                                                     offline_empty_cache, argv):
    no_loading(monkeypatch)
    assert cli_error(capsys, *argv).splitlines() == ["error: " + UNREACHABLE,
                                                     f"(python -m specdemo {argv[0]} --help)"]


def test_check_refuses_an_unobtainable_hub_id_with_exit_status_2(capsys, monkeypatch,
                                                                 offline_empty_cache):
    """Exit status 1 in ``check`` means "could not decide" (a tokenizer or config that cannot
    be read); input that can be refused at once is status 2, as everywhere."""
    no_loading(monkeypatch)
    assert main(["check", "--target", "builtin:smollm2-135m", "--draft", "org/not-cached"]) == 2
    assert capsys.readouterr().out.splitlines() == ["error: " + UNREACHABLE]


def test_check_refuses_a_hub_draft_offline_before_any_step_or_model(tmp_path):
    """``check --draft foo/bar`` offline (a hub id not in the cache): one sentence on stdout,
    status 2, nothing on stderr (no start-up step: nothing is read), and neither torch nor
    transformers imported (it took 6 s importing them to ask whether foo/bar is a learned
    drafter before it asked whether foo/bar could be had at all)."""
    import os
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys\nfrom specdemo.interfaces.cli import main\nstatus = main(sys.argv[1:])\n"
            "print(status, 'torch' in sys.modules, 'transformers' in sys.modules)\n")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(tmp_path / "empty-cache")}
    done = subprocess.run([sys.executable, "-c", code, "check", "--target", "builtin:smollm2-135m",
                           "--draft", "foo/bar"], capture_output=True, text=True, env=env,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.stdout.splitlines() == [
        "error: draft 'foo/bar' is not in the local Hugging Face cache and the model hub is not "
        "reachable (or HF_HUB_OFFLINE=1): download it on a connected machine, or give a local "
        "folder or file", "2 False False"], done.stderr
    assert done.stderr == ""


def test_the_draft_check_returns_the_parsed_spec(tmp_path, offline_empty_cache):
    """What ``--draft`` (and the page's draft box) hands inwards is a ``DraftSpec``: its text,
    with its kind, read below without parsing it again."""
    from specdemo.core.draft_spec import DraftSpec
    for text, kind, layers in (("ngram", "ngram", None), (" early-exit:3 ", "early-exit", 3),
                               ("org/model+ngram", "hub", None), ("mtp", "mtp", None)):
        spec = inputs.draft("draft", text)
        assert isinstance(spec, DraftSpec) and spec == text.strip()
        assert (spec.kind, spec.layers, spec.is_early_exit) == (kind, layers, kind == "early-exit")


@pytest.fixture
def four_layer_target(tmp_path):
    """A target folder holding only a 4-layer config (no weights, no tokenizer)."""
    from transformers import LlamaConfig
    folder = tmp_path / "target"
    LlamaConfig(num_hidden_layers=4, hidden_size=32, intermediate_size=64, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=32).save_pretrained(folder)
    return str(folder)


@pytest.mark.parametrize("command", ["run", "compare"])
def test_early_exit_beyond_the_target_is_refused_before_it_loads(capsys, monkeypatch,
                                                                 four_layer_target, command):
    no_loading(monkeypatch)
    err = cli_error(capsys, command, "--prompt", "hi", "--target", four_layer_target,
                    "--draft", "early-exit:99")
    assert err.splitlines() == [f"error: draft 'early-exit:99' does not fit target "
                                f"{four_layer_target}: early-exit layers must be in 1..3, got 99",
                                f"(python -m specdemo {command} --help)"]


def test_the_race_api_refuses_with_the_command_lines_sentences(capsys, monkeypatch,
                                                              offline_empty_cache,
                                                              four_layer_target):
    import gradio as gr

    from specdemo.interfaces import ui_race
    no_loading(monkeypatch)
    with pytest.raises(gr.Error) as refused:
        ui_race.race_api("hi", draft="ngrm", max_new_tokens=4)
    assert "error: " + refused.value.message == NGRM.replace("argument --draft: ", "")
    with pytest.raises(gr.Error) as refused:
        ui_race.race_api("hi", draft="org/not-cached", max_new_tokens=4)
    assert refused.value.message == UNREACHABLE
    real_pairing = ui_race._pairing
    monkeypatch.setattr(ui_race, "_pairing", lambda name: dataclasses.replace(
        real_pairing(name), target=four_layer_target))
    with pytest.raises(gr.Error) as refused:
        ui_race.race_api("hi", draft="early-exit:99", max_new_tokens=4)
    assert refused.value.message == (f"draft 'early-exit:99' does not fit target "
                                     f"{four_layer_target}: early-exit layers must be in 1..3, "
                                     "got 99")


@pytest.mark.parametrize("argv", [
    ["compare", "--draft", "builtin:smollm2-135m-eagle3", "--prompt", ""],
    ["compare", "--draft", "ngram", "--prompt", ""],
    ["compare", "--prompt", "", "--draft", "ngram"],
    ["compare", "--draft", "ngrm", "--prompt", "hi"],
    ["compare"],  # the default --draft is checked before "required: --prompt"
])
def test_flag_checks_import_no_torch_whatever_their_order(argv):
    """The tester's ``compare --draft ngram --prompt ""`` took 12.5 s, the other order 0.6 s: the
    draft check imported torch to name the built-in drafters. Every flag's check is text and
    disk only, so a refusal comes before any heavy import in any order."""
    import subprocess
    import sys
    from pathlib import Path
    code = ("import sys\nfrom specdemo.interfaces.cli import main\ntry:\n    main(sys.argv[1:])\n"
            "except SystemExit as exc:\n    print(exc.code, 'torch' in sys.modules, "
            "'transformers' in sys.modules)\n")
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True,
                          cwd=Path(__file__).resolve().parents[1], timeout=120)
    assert done.stdout.split() == ["2", "False", "False"], done.stderr


@pytest.mark.parametrize("argv, meant", [
    (["run", "--prompt", "hi", "--backend", "nativ"], "native"),
    (["compare", "--prompt", "hi", "--dtype", "bfloat61"], "bfloat16"),
    (["compar", "--prompt", "hi"], "compare"),
])
def test_a_choice_typo_gets_did_you_mean_like_the_other_flags(capsys, argv, meant):
    err = cli_error(capsys, *argv).splitlines()
    assert err[0].startswith("error: argument ") and "invalid choice" in err[0]
    assert err[0].endswith(f" (did you mean {meant}?)") and len(err) == 2


def test_a_choice_far_from_every_name_gets_no_guess(capsys):
    err = cli_error(capsys, "run", "--prompt", "hi", "--backend", "zzz")
    assert "did you mean" not in err and "invalid choice: 'zzz'" in err


def test_an_unknown_builtin_draft_lists_every_builtin_the_flag_accepts(capsys):
    """A new user's ``run --draft builtin:nope`` ended with "built-in drafters:
    builtin:smollm2-135m-eagle3" alone, though ``--draft`` also takes every built-in model as a
    draft model (builtin:smollm2-135m, builtin:gemma3-270m, ...)."""
    from specdemo.models import builtin
    err = cli_error(capsys, "run", "--prompt", "hi", "--draft", "builtin:nope")
    said = err.split("; built-in draft models: ", 1)[1].splitlines()[0]
    models_, learned = said.split("; built-in learned drafters: ")
    assert models_.split(", ") == [f"builtin:{n}" for n in builtin.builtin_names()]
    assert {"builtin:smollm2-135m", "builtin:gemma3-270m"} <= set(models_.split(", "))
    assert "builtin:smollm2-135m-eagle3" in learned.split(", ")
    for name in models_.split(", ") + learned.split(", "):  # each one is accepted
        assert inputs.draft("draft", name) == name


@pytest.mark.parametrize("config, limit", [
    ({"max_position_embeddings": 512}, 512),
    ({"text_config": {"max_position_embeddings": 256}, "max_position_embeddings": 999}, 256),
    ({}, None),
])
def test_fits_context_reads_the_targets_config_without_loading(tmp_path, config, limit):
    """``max_new_tokens`` that cannot fit the context even after a one-token prompt is refused
    from ``config.json`` alone; a config without a context, or none at all, refuses nothing."""
    import json as _json
    (tmp_path / "config.json").write_text(_json.dumps(config), encoding="utf-8")
    assert inputs.fits_context("max new tokens", 10_000, str(tmp_path / "missing")) == 10_000
    if limit is None:
        assert inputs.fits_context("max new tokens", 10**8, str(tmp_path)) == 10**8
        return
    assert inputs.fits_context("max new tokens", limit - 1, str(tmp_path)) == limit - 1
    with pytest.raises(inputs.InputError) as caught:
        inputs.fits_context("max new tokens", limit, str(tmp_path))
    assert str(caught.value) == (f"max new tokens must be a whole number from 1 to {limit - 1} "
                                 f"({tmp_path}'s context is {limit} tokens, the prompt included), "
                                 f"got {limit}")


def test_fits_context_reads_a_builtins_context_without_transformers():
    import subprocess
    import sys
    code = ("import sys; from specdemo.checks import inputs\n"
            "try:\n    inputs.fits_context('n', 8192, 'builtin:smollm2-135m')\n"
            "except inputs.InputError as e:\n    print(e)\n"
            "print('transformers' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         cwd=Path(__file__).resolve().parent.parent).stdout.splitlines()
    assert out == ["n must be a whole number from 1 to 8191 (builtin:smollm2-135m's context is "
                   "8192 tokens, the prompt included), got 8192", "False"]
