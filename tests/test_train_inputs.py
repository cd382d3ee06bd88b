"""``train-draft`` inputs (issue 20, item 4): an empty, missing or malformed ``--prompts`` file
and an ``--out`` that is a file are refused before any work (the target is never loaded), in one
sentence naming the file (and line), with exit status 2, and nothing is written into ``--out``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from specdemo.interfaces.cli import main


@pytest.fixture
def no_target_load(monkeypatch):
    """Fail the test if the target would be loaded (refusals must come first)."""
    import specdemo.models.loading as models

    def refuse(*args, **kwargs):
        raise AssertionError("the target was loaded before the inputs were checked")
    monkeypatch.setattr(models, "load_model", refuse)


def _train(tmp_path, prompts, out=None):
    out = out or tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        main(["train-draft", "--target", "builtin:smollm2-135m", "--out", str(out),
              "--prompts", str(prompts), "--report-prompts", "0"])
    return exited.value.code, out


CASES = {
    "empty file": ("", "holds no training prompts (0 rows"),
    "only held-out rows": (json.dumps({"prompt": "hi", "split": "heldout"}) + "\n",
                           "holds no training prompts (1 rows, none outside the held-out split)"),
    "a line that is not JSON": ('{"prompt": "ok"}\nnot json at all\n',
                                ":2: expected a JSON object with a non-empty \"prompt\""),
    "a line without the prompt field": ('{"prompt": "ok"}\n{"task": "chat"}\n',
                                        ":2: expected a JSON object with a non-empty \"prompt\""),
    "a prompt that is not text": ('{"prompt": 7}\n', ":1: expected a JSON object"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_prompts_files_are_refused_before_any_work(tmp_path, capsys, no_target_load, case):
    text, words = CASES[case]
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(text)
    status, out = _train(tmp_path, prompts)
    err = capsys.readouterr().err
    assert status == 2
    assert err.startswith(f"error: --prompts {prompts}") and words in err, err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert not out.exists()  # nothing written


def test_a_missing_prompts_file_is_refused(tmp_path, capsys, no_target_load):
    status, out = _train(tmp_path, tmp_path / "nowhere.jsonl")
    assert status == 2
    assert capsys.readouterr().err.strip() == f"error: --prompts {tmp_path / 'nowhere.jsonl'}: no such file"
    assert not out.exists()


def test_a_prompts_file_that_is_not_text_is_refused(tmp_path, capsys, no_target_load):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_bytes(b"\xff\xfe\x00binary")
    status, _ = _train(tmp_path, prompts)
    assert status == 2
    assert f"error: --prompts {prompts} is not UTF-8 text" in capsys.readouterr().err


def test_an_out_that_is_a_file_is_refused_and_left_alone(tmp_path, capsys, no_target_load):
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text(json.dumps({"prompt": "hello"}) + "\n")
    out = tmp_path / "out.txt"
    out.write_text("keep me")
    status, _ = _train(tmp_path, prompts, out)
    assert status == 2
    assert f"error: --out {out} is a file, not a folder" in capsys.readouterr().err
    assert out.read_text() == "keep me"


@pytest.mark.parametrize("flag", ["--epochs", "--max-prompts", "--draft-vocab", "--ttt-steps"])
def test_counts_below_one_are_refused_by_name(tmp_path, capsys, no_target_load, flag):
    with pytest.raises(SystemExit) as exited:
        main(["train-draft", "--out", str(tmp_path / "o"), flag, "0"])
    assert exited.value.code == 2
    assert f"{flag} must be a whole number of at least 1, got '0'" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_features_larger_than_the_disk_are_refused_and_larger_than_memory_only_noted(
        tmp_path, monkeypatch, capsys):
    """Training memory-maps the captured features (10x the data is ~8 GB of float16), so free
    memory no longer caps the data; free disk does."""
    import shutil
    from collections import namedtuple

    import psutil

    from specdemo.services.training import inputs as train_inputs
    from specdemo.services.training.errors import TrainingError
    usage = namedtuple("usage", "total used free")
    memory = namedtuple("memory", "available")
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, 10**9))
    monkeypatch.setattr(psutil, "virtual_memory", lambda: memory(10**9))
    with pytest.raises(TrainingError, match=r"need ~2\.3 GB on disk but only 1\.0 GB are free"):
        train_inputs.check_space(1_000_000, 1152, tmp_path)  # 1M tokens x 1152 x 2 bytes
    monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**12, 0, 10**11))
    train_inputs.check_space(1_000_000, 1152, tmp_path)
    assert "exceed the free memory (1.0 GB); training reads them from disk" in capsys.readouterr().err



def _init_folder(tmp_path, head):
    import torch
    folder = tmp_path / "earlier"
    folder.mkdir()
    torch.save({"head": head}, folder / "checkpoint.pt")
    return folder


def test_init_reads_a_shipped_head_by_its_builtin_name():
    """``--init builtin:NAME`` reads the shipped head's model.safetensors (it has no
    checkpoint.pt): the early check sees an EAGLE-3 head, and refuses it for a DFlash run."""
    import argparse
    from specdemo.services.training.errors import TrainingError
    from specdemo.services.training.inputs import check_init
    from specdemo.services.training.warm_start import read_init
    saved, problem = read_init(Path("builtin:smollm2-135m-eagle3"))
    assert problem is None and saved["d2t"].shape == (8192,) and "fc.weight" in saved
    check_init(argparse.Namespace(init=Path("builtin:smollm2-135m-eagle3"), kind="eagle3"))
    with pytest.raises(TrainingError):
        check_init(argparse.Namespace(init=Path("builtin:smollm2-135m-eagle3"), kind="dflash"))


def test_keep_draft_vocab_is_refused_without_init_or_with_another_size(capsys):
    import argparse
    from specdemo.services.training.errors import TrainingError
    from specdemo.services.training.inputs import check_init
    shipped = Path("builtin:smollm2-135m-eagle3")
    check_init(argparse.Namespace(init=shipped, kind="eagle3", keep_draft_vocab=True, draft_vocab=8192))
    for args, says in ((dict(init=None, kind="eagle3", draft_vocab=8192), "without --init"),
                       (dict(init=shipped, kind="eagle3", draft_vocab=4096), "give --draft-vocab 8192")):
        with pytest.raises(TrainingError) as exc:
            check_init(argparse.Namespace(keep_draft_vocab=True, **args))
        assert exc.value.status == 2
        assert says in str(exc.value) and "\n" not in str(exc.value)


@pytest.mark.parametrize("case", ["missing", "damaged", "kind"])
def test_a_bad_init_is_refused_before_any_work(tmp_path, capsys, no_target_load, case):
    """``--init`` is checked with the other inputs: the target is never loaded, nothing is
    generated or written into ``--out``, and the sentence says what to change."""
    import torch
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    if case == "missing":
        folder, expected = tmp_path / "nowhere", "no checkpoint.pt or model.safetensors there"
    elif case == "damaged":
        folder = tmp_path / "bad"
        folder.mkdir()
        (folder / "checkpoint.pt").write_text("junk\n")
        expected = "checkpoint.pt could not be read (damaged, or not one train-draft wrote)"
    else:
        folder = _init_folder(tmp_path, {"fc.weight": torch.zeros(2, 2)})
        expected = "it holds a DFlash drafter, this run trains an EAGLE-3 head: give --kind dflash"
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        main(["train-draft", "--target", "builtin:smollm2-135m", "--out", str(out),
              "--prompts", str(prompts), "--init", str(folder)])
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --init {folder}: " + err.split(": ", 2)[2] and expected in err
    assert "\n" not in err and not out.exists()


def test_train_json_names_the_checkout_commit_when_specdemo_is_not_installed():
    """train.json's versions: specdemo runs from a checkout, not an installed package, so the
    commit stands for its version (it read "n/a")."""
    import re
    import subprocess
    from pathlib import Path
    from specdemo.services.training.saving import versions as _versions
    root = Path(__file__).resolve().parents[1]
    if not (root / ".git").exists():
        pytest.skip("not a git checkout")
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                          cwd=root).stdout.strip()
    got = _versions()["specdemo"]
    assert got == f"commit {head}" and re.fullmatch(r"commit [0-9a-f]{7,}", got)


def test_resume_says_which_given_options_the_saved_recipe_overrides(tmp_path, capsys):
    """``--resume`` trains with the recipe saved in the folder (so a resumed run equals an
    uninterrupted one); an option on the command line that differs from it is named, not
    silently dropped."""
    import argparse
    from dataclasses import asdict
    from specdemo.services.training.recipes import make_recipe as _recipe
    from specdemo.services.training import train
    saved = train.Recipe(epochs=3, draft_vocab_size=8192, feature_layers=(2, 15, 27),
                         train_dtype="bfloat16", temperature=[0.7, 1.0])
    recipe_file = tmp_path / "recipe.json"
    recipe_file.write_text(json.dumps({**asdict(saved), "feature_layers": [2, 15, 27]}))
    args = argparse.Namespace(resume=True, kind="eagle3", epochs=1, learning_rate=saved.learning_rate,
                              train_dtype="bfloat16", batch_tokens=saved.batch_tokens,
                              answers_per_prompt=saved.answers_per_prompt,
                              max_tokens=saved.max_new_tokens, draft_vocab=8192,
                              ttt_steps=saved.ttt_steps, answer_loss_only=False)
    import specdemo.core.drafters.features, specdemo.services.training.dflash_train  # noqa: F401
    capsys.readouterr()  # what their first import prints (torch's warnings) is not the message
    recipe = _recipe(args, None, recipe_file, temperature=(0.7, 1.0))
    assert recipe.epochs == 3
    err = capsys.readouterr().err
    assert err.strip() == (f"--resume keeps the recipe saved in {tmp_path}: epochs 3 (this command: 1); "
                           "start another folder to change it")
    args.epochs = 3
    _recipe(args, None, recipe_file, temperature=(0.7, 1.0))
    assert capsys.readouterr().err == ""


def test_answer_loss_only_is_part_of_the_recipe(tmp_path, capsys):
    """``--answer-loss-only`` sets the recipe's ``loss_on_prompt`` to False for a new run (both
    kinds), and on ``--resume`` a folder whose saved recipe differs says so."""
    import argparse
    from dataclasses import asdict
    from types import SimpleNamespace
    from tiny import tiny_llama
    from specdemo.interfaces.cli import build_parser
    from specdemo.services.training.recipes import make_recipe as _recipe
    from specdemo.services.training import train
    args = build_parser().parse_args(["train-draft", "--out", str(tmp_path / "a"), "--answer-loss-only"])
    target = SimpleNamespace(model=tiny_llama(seed=0))
    assert _recipe(args, target, tmp_path / "none.json").loss_on_prompt is False
    args.kind = "dflash"
    assert _recipe(args, target, tmp_path / "none.json").loss_on_prompt is False
    default = build_parser().parse_args(["train-draft", "--out", str(tmp_path / "b")])
    assert _recipe(default, target, tmp_path / "none.json").loss_on_prompt is True
    saved = train.Recipe(feature_layers=(1, 2, 3))
    recipe_file = tmp_path / "recipe.json"
    recipe_file.write_text(json.dumps({**asdict(saved), "feature_layers": [1, 2, 3]}))
    resumed = argparse.Namespace(**{**vars(default), "resume": True, "answer_loss_only": True,
                                    "epochs": saved.epochs})
    assert _recipe(resumed, target, recipe_file).loss_on_prompt is True
    assert "loss_on_prompt True (this command: False)" in capsys.readouterr().err


def test_bfloat16_training_on_a_cpu_without_bf16_instructions_is_flagged(monkeypatch):
    from specdemo.core import machine
    from specdemo.services.training import inputs as train_inputs
    monkeypatch.setattr(train_inputs.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(machine, "cpu_flags", lambda: "fpu sse2 avx avx2 fma")
    note = train_inputs.slow_bf16_note("cpu", "bfloat16")
    assert note is not None and "AVX512-BF16" in note
    assert train_inputs.slow_bf16_note("cpu", "float32") is None
    assert train_inputs.slow_bf16_note("cuda:0", "bfloat16") is None
    monkeypatch.setattr(machine, "cpu_flags", lambda: "avx2 avx512f avx512_bf16")
    assert train_inputs.slow_bf16_note("cpu", "bfloat16") is None
    monkeypatch.setattr(machine, "cpu_flags", lambda: "avx2 amx_bf16 amx_tile")
    assert train_inputs.slow_bf16_note("cpu", "bfloat16") is None
    monkeypatch.setattr(train_inputs.platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(machine, "cpu_flags", lambda: "fp asimd")
    assert train_inputs.slow_bf16_note("cpu", "bfloat16") is None
    # Windows: no flags list, only the machine's name, which says nothing either way
    monkeypatch.setattr(train_inputs.platform, "machine", lambda: "AMD64")
    monkeypatch.setattr(machine, "cpu_flags", lambda: "AMD64")
    assert train_inputs.slow_bf16_note("cpu", "bfloat16") is None


@pytest.mark.parametrize("theirs, kind", [("eagle3", "dflash"), ("dflash", "eagle3")])
def test_an_out_holding_another_drafters_run_is_refused_and_left_alone(tmp_path, capsys,
                                                                       no_target_load, theirs, kind):
    """``--out D`` where D holds the run of the other drafter kind (its recipe.json): refused
    in one sentence before any work, with or without --resume, and nothing in D changes (its
    recipe.json was overwritten, then its feature shards reused with the wrong shapes)."""
    from dataclasses import asdict
    from specdemo.services.training import dflash_train, train
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "D"
    out.mkdir()
    recipe = (train.Recipe(feature_layers=(1, 2, 3)) if theirs == "eagle3"
              else dflash_train.DFlashRecipe(target_layer_ids=(1, 2)))
    (out / "recipe.json").write_text(json.dumps(asdict(recipe)))
    (out / "features-00000.safetensors").write_bytes(b"shard")
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    words = {"eagle3": "an EAGLE-3 head", "dflash": "a DFlash drafter"}
    for resume in ([], ["--resume"]):
        with pytest.raises(SystemExit) as exited:
            main(["train-draft", "--target", "builtin:smollm2-135m", "--kind", kind, "--out",
                  str(out), "--prompts", str(prompts), *resume])
        assert exited.value.code == 2
        assert capsys.readouterr().err == (
            f"error: --out {out} holds the run of {words[theirs]} (its recipe.json), this run "
            f"trains {words[kind]}: give another --out, or --kind {theirs} to continue that one\n")
        assert {p.name: p.read_bytes() for p in out.iterdir()} == before


def test_an_out_holding_the_same_kinds_run_passes_the_early_checks(tmp_path):
    """The same kind keeps today's meaning: --resume continues it (the checks let it through)."""
    from dataclasses import asdict
    from specdemo.interfaces.cli import build_parser
    from specdemo.services.training.inputs import check_inputs, out_kind
    from specdemo.services.training import train
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "D"
    out.mkdir()
    (out / "recipe.json").write_text(json.dumps(asdict(train.Recipe(feature_layers=(1, 2)))))
    args = build_parser().parse_args(["train-draft", "--out", str(out), "--prompts", str(prompts),
                                      "--resume"])
    assert out_kind(out) == "eagle3"
    assert [row["prompt"] for row in check_inputs(args)] == ["hi"]


def test_a_damaged_recipe_in_out_is_refused(tmp_path, capsys, no_target_load):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    out = tmp_path / "D"
    out.mkdir()
    (out / "recipe.json").write_text("{not json")
    status, _ = _train(tmp_path, prompts, out)
    assert status == 2
    assert capsys.readouterr().err == (f"error: --out {out}: its recipe.json is not one "
                                       "train-draft wrote (damaged or another program's); give "
                                       "another --out\n")
    assert (out / "recipe.json").read_text() == "{not json"


def _prompts(tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text('{"prompt": "hi"}\n')
    return prompts


@pytest.mark.parametrize("where", ["a file", "under a file", "unwritable", "unwritable parent"])
def test_an_answers_dir_that_cannot_take_shards_is_refused_before_any_work(
        tmp_path, capsys, no_target_load, monkeypatch, where):
    """``--answers-dir`` naming a file, a path under a file, a folder that cannot be written or
    one that cannot be created: refused before the target is loaded (it failed after minutes of
    generation, with FileExistsError or PermissionError), nothing created or changed."""
    import os
    import tempfile
    prompts = _prompts(tmp_path)
    blocker = tmp_path / "answers.txt"
    blocker.write_text("keep me")
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(0o500)
    if os.geteuid() == 0:  # root writes anywhere: the operating system's refusal, simulated
        real = tempfile.TemporaryFile

        def refuse(*args, dir=None, **kwargs):
            if dir is not None and Path(dir) == locked:
                raise PermissionError(13, "Permission denied")
            return real(*args, dir=dir, **kwargs)
        monkeypatch.setattr(tempfile, "TemporaryFile", refuse)
    answers_dir, words = {
        "a file": (blocker, "is a file, not a folder"),
        "under a file": (blocker / "shards", f"lies under {blocker}, which is a file"),
        "unwritable": (locked, "cannot be written (Permission denied)"),
        "unwritable parent": (locked / "new", f"cannot be created in {locked} (Permission denied)"),
    }[where]
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        main(["train-draft", "--out", str(out), "--prompts", str(prompts), "--answers-dir",
              str(answers_dir), "--report-prompts", "0"])
    err = capsys.readouterr().err
    locked.chmod(0o700)
    assert exited.value.code == 2
    assert err == (f"error: --answers-dir {answers_dir} {words}: the answers generated would "
                   "have nowhere to go; give a folder that can be written\n")
    assert not out.exists() and blocker.read_text() == "keep me" and list(locked.iterdir()) == []


def test_an_answers_dir_to_be_created_passes_and_is_not_created_by_the_check(tmp_path):
    from specdemo.interfaces.cli import build_parser
    from specdemo.services.training.inputs import check_inputs
    answers_dir = tmp_path / "new" / "answers"
    args = build_parser().parse_args(["train-draft", "--out", str(tmp_path / "out"), "--prompts",
                                      str(_prompts(tmp_path)), "--answers-dir", str(answers_dir)])
    assert [row["prompt"] for row in check_inputs(args)] == ["hi"]
    assert not (tmp_path / "new").exists()


def test_answers_with_ids_beyond_the_targets_vocabulary_are_refused_before_capture(
        tmp_path, capsys, monkeypatch):
    """``--answers FILE`` made with another tokenizer (an id of 40 for a 32-id target): one
    sentence naming the file, before any feature is captured (it died with IndexError there)."""
    import torch
    import specdemo.models.loading as models
    from tiny import CharTokenizer, tiny_llama
    target = models.LoadedModel("tiny", tiny_llama(seed=3, layers=4), CharTokenizer(),
                                torch.device("cpu"), torch.float32, 0.0, "test")
    monkeypatch.setattr(models, "load_model", lambda spec, device, dtype: target)
    answers = tmp_path / "answers.jsonl"
    answers.write_text(json.dumps({"prompt_index": 0, "answer_index": 0, "task": "chat",
                                   "temperature": 0.0, "ids": [3, 4, 5, 40], "n_prompt": 2}) + "\n")
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as exited:
        main(["train-draft", "--target", "tiny", "--out", str(out), "--prompts",
              str(_prompts(tmp_path)), "--answers", str(answers), "--report-prompts", "0"])
    assert exited.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"error: {answers}: an answer's ids hold 40, beyond the 32-id vocabulary of tiny: the "
        "answers were made with another tokenizer")
    assert not (out / "features").exists()


@pytest.mark.parametrize("theirs, kind", [("eagle3", "dspark"), ("dspark", "eagle3"),
                                          ("dspark", "dflash"), ("dflash", "dspark")])
def test_dspark_runs_are_told_apart_from_the_other_kinds(tmp_path, capsys, no_target_load,
                                                         theirs, kind):
    """``--kind dspark`` into an EAGLE-3 run gave KeyError 'dspark'; ``--kind eagle3`` into a
    DSpark run called it a DFlash drafter and suggested ``--kind dflash``."""
    from dataclasses import asdict
    from specdemo.services.training.inputs import out_kind
    from specdemo.services.training import dflash_train, dspark_train, train
    out = tmp_path / "D"
    out.mkdir()
    recipe = {"eagle3": lambda: train.Recipe(feature_layers=(1, 2, 3)),
              "dflash": lambda: dflash_train.DFlashRecipe(target_layer_ids=(1, 2)),
              "dspark": lambda: dspark_train.DSparkRecipe(target_layer_ids=(1, 2))}[theirs]()
    (out / "recipe.json").write_text(json.dumps(asdict(recipe)))
    before = (out / "recipe.json").read_bytes()
    assert out_kind(out) == theirs
    words = {"eagle3": "an EAGLE-3 head", "dflash": "a DFlash drafter", "dspark": "a DSpark drafter"}
    with pytest.raises(SystemExit) as exited:
        main(["train-draft", "--kind", kind, "--out", str(out), "--prompts",
              str(_prompts(tmp_path)), "--resume"])
    assert exited.value.code == 2
    assert capsys.readouterr().err == (
        f"error: --out {out} holds the run of {words[theirs]} (its recipe.json), this run "
        f"trains {words[kind]}: give another --out, or --kind {theirs} to continue that one\n")
    assert (out / "recipe.json").read_bytes() == before


def test_a_dspark_run_is_known_by_its_train_json_too(tmp_path):
    from specdemo.services.training.inputs import out_kind
    (tmp_path / "train.json").write_text(json.dumps({"kind": "dspark"}))
    assert out_kind(tmp_path) == "dspark"
