"""The target's answers kept in git as shards: written and read back exactly, damaged files
refused in one sentence, answers rebuilt only for prompts of the training split whose chat
template still gives the same prompt length, and ``train-draft --answers-dir`` generating only
what the shards lack. The shipped shards belong to training prompts only."""

import json

import numpy as np
import pytest
import torch

from specdemo.interfaces.cli import main
from specdemo.services.training.errors import TrainingError
from specdemo.models.loading import LoadedModel
from specdemo.services.training import data, prompt_set, shards
from tiny import CharTokenizer, tiny_llama


def _rows(n):
    words = ["one", "two", "three", "four", "five", "six", "seven", "eight"]
    return [{"task": "chat", "prompt": f"prompt number {words[i]}", "split": "train"} for i in range(n)]


def _answer_rows(rows, tok):
    out = []
    for i, r in enumerate(rows):
        ids = tok.encode(r["prompt"])
        for a in range(2):
            out.append({"prompt_index": i, "answer_index": a, "task": "chat", "temperature": 0.7 * a,
                        "ids": ids + [5 + i, 6 + a, 7], "n_prompt": len(ids)})
    return out


def test_shards_round_trip_exactly(tmp_path, monkeypatch):
    monkeypatch.setattr(shards, "MAX_ANSWERS_PER_SHARD", 3)
    tok = CharTokenizer()
    rows = _rows(4)
    written = shards.write_shards(tmp_path, _answer_rows(rows, tok), rows, {"target": "t", "max_new_tokens": 8})
    assert [p.name for p in written] == ["00000.npz", "00001.npz", "00002.npz"]
    answers, notes = shards.read_all(tmp_path, target="t")
    assert notes == []
    back, mismatched = shards.as_answer_rows(answers, rows, lambda r: tok.encode(r["prompt"]))
    assert mismatched == 0
    assert back == _answer_rows(rows, tok)
    # more answers later go to new files after the old ones
    more = shards.write_shards(tmp_path, _answer_rows(rows, tok)[:1], rows, {"target": "t"})
    assert more[0].name == "00003.npz"
    assert shards.summary(tmp_path)["answers"] == 9


def test_answers_of_another_target_or_split_or_template_are_left_out(tmp_path):
    tok = CharTokenizer()
    rows = _rows(3)
    shards.write_shards(tmp_path, _answer_rows(rows, tok), rows, {"target": "t"})
    _, notes = shards.read_all(tmp_path, target="other")
    assert len(notes) == 1 and "'t', not 'other'" in notes[0]
    answers, _ = shards.read_all(tmp_path, target="t")
    back, mismatched = shards.as_answer_rows(answers, rows[1:], lambda r: tok.encode(r["prompt"]))
    assert sorted({r["prompt_index"] for r in back}) == [0, 1] and len(back) == 4
    back, mismatched = shards.as_answer_rows(answers, rows, lambda r: tok.encode(r["prompt"] + "!"))
    assert back == [] and mismatched == 6


@pytest.mark.parametrize("damage", [b"not a zip", b""])
def test_a_damaged_shard_is_one_sentence(tmp_path, damage):
    (tmp_path / "00000.npz").write_bytes(damage)
    with pytest.raises(shards.ShardError) as err:
        shards.read_all(tmp_path)
    msg = str(err.value)
    assert msg.startswith("answer shard ") and "damaged" in msg and "\n" not in msg


def test_a_shard_with_inconsistent_arrays_is_refused(tmp_path):
    np.savez_compressed(tmp_path / "00000.npz", keys=np.array(["a" * 16], dtype="<U16"),
                        answer_index=np.array([0], dtype=np.int16), temperature=np.zeros(1, np.float32),
                        n_prompt=np.array([3], np.int32), lengths=np.array([5], np.int32),
                        tokens=np.zeros(4, np.uint16), meta=np.array("{}"))
    with pytest.raises(shards.ShardError, match="inconsistent lengths"):
        shards.read_all(tmp_path)


def test_generation_resumes_from_shards_and_packs_only_what_is_new(tmp_path, monkeypatch):
    """What ``train-draft --answers-dir`` does: answers in the shards go to answers.jsonl first,
    generation skips them, and only the new ones are packed into a new shard."""
    from types import SimpleNamespace
    from specdemo.services.training import answer_shards
    model = tiny_llama(seed=3, layers=2)
    target = LoadedModel("tiny-llama", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    rows = _rows(6)
    shard_dir, out1, out2 = tmp_path / "answers", tmp_path / "run1", tmp_path / "run2"
    args = SimpleNamespace(answers_dir=shard_dir, target="tiny-llama")
    recipe = SimpleNamespace(max_new_tokens=6, answers_per_prompt=1, temperature=0.7)
    out1.mkdir()
    data.generate_answers(target, rows[:4], out1, answers_per_prompt=1, max_new_tokens=6, batch_size=4)
    answer_shards.answers_to_shards(args, target, rows, out1, recipe)
    assert shards.summary(shard_dir)["answers"] == 4
    out2.mkdir()
    answer_shards.answers_from_shards(args, target, rows, out2, recipe)
    first = data.load_answers(out2)
    assert sorted(r["prompt_index"] for r in first) == [0, 1, 2, 3]
    assert {json.dumps(r["ids"]) for r in first} == {json.dumps(r["ids"]) for r in data.load_answers(out1)}
    data.generate_answers(target, rows, out2, answers_per_prompt=1, max_new_tokens=6, batch_size=4)
    assert len(data.load_answers(out2)) == 6  # two generated, four kept
    answer_shards.answers_to_shards(args, target, rows, out2, recipe)
    assert shards.summary(shard_dir)["answers"] == 6
    assert len(shards.shard_paths(shard_dir)) == 2


def test_shipped_shards_answer_training_prompts_only():
    """Every shipped answer belongs to a prompt of the training split (the shipped set's or the
    prompts at scale): none to a held-out one (its figures would mean nothing) and none to a
    prompt no longer in the set."""
    from specdemo.services.training import prompt_scale
    rows = prompt_scale.training_rows()
    split_of = {shards.prompt_key(r): r.get("split", "train") for r in rows}
    answers, notes = shards.read_all(shards.SHARDS_DIR, target="builtin:smollm2-135m")
    assert notes == [] and answers
    assert {split_of.get(a["key"], "missing") for a in answers} == {"train"}


def test_a_batch_never_mixes_greedy_and_sampled_answers(tmp_path):
    """Batches split at the change of answer index: with 3 prompts, 2 answers each and batches
    of 4, the first batch once held answer 1 of prompt 0 and generated it greedily (its first
    row decides), writing a copy of answer 0 labelled answer 1."""
    model = tiny_llama(seed=3, layers=2)
    target = LoadedModel("tiny-llama", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    data.generate_answers(target, _rows(3), tmp_path, answers_per_prompt=2, temperature=0.7,
                          max_new_tokens=6, batch_size=4)
    answers = data.load_answers(tmp_path)
    assert sorted((r["answer_index"], r["temperature"]) for r in answers) == \
        [(0, 0.0)] * 3 + [(1, 0.7)] * 3


def test_the_shard_summary_command_has_help_and_refuses_a_missing_folder(tmp_path, capsys):
    """``python -m specdemo shards --help`` prints a help text (it once took ``--help`` for a
    folder); a folder that is not there is one sentence, no traceback."""
    with pytest.raises(SystemExit) as done:
        main(["shards", "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert "usage: python -m specdemo shards" in out and "shard folder" in out
    with pytest.raises(SystemExit) as done:
        main(["shards", str(tmp_path / "absent")])
    assert done.value.code == 2 and "is not a folder" in capsys.readouterr().err
    tok = CharTokenizer()
    rows = _rows(2)
    shards.write_shards(tmp_path, _answer_rows(rows, tok), rows, {"target": "t"})
    assert main(["shards", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["answers"] == 4


def test_heldout_acceptance_options_all_have_help():
    """Every option of ``scripts/heldout_acceptance.py`` says what it is in ``--help``."""
    import subprocess
    import sys
    from pathlib import Path
    script = Path(__file__).resolve().parents[1] / "scripts" / "heldout_acceptance.py"
    out = subprocess.run([sys.executable, str(script), "--help"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    text = " ".join(out.stdout.split())
    for option, words in (("heads", "EAGLE-3 heads"), ("--tasks", "comma-separated tasks"),
                          ("--per-task", "held-out prompts per task"), ("--k", "draft length"),
                          ("--max-new-tokens", "greedy answer"), ("--cache", "greedy answers"),
                          ("--json", "JSON file")):
        assert option in text and words in text, option


def _shard_run(tmp_path, answers_per_prompt=1, temperature=0.7, max_new_tokens=8):
    """Greedy (and sampled) answers of a tiny target generated at ``max_new_tokens`` and packed
    into shards, as ``train-draft --answers-dir`` leaves them."""
    from types import SimpleNamespace
    from specdemo.services.training import answer_shards
    model = tiny_llama(seed=3, layers=2)
    target = LoadedModel("tiny-llama", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    rows = _rows(3)
    first = tmp_path / "first"
    first.mkdir()
    data.generate_answers(target, rows, first, answers_per_prompt=answers_per_prompt,
                          temperature=temperature, max_new_tokens=max_new_tokens, batch_size=4)
    args = SimpleNamespace(answers_dir=tmp_path / "answers", target="tiny-llama")
    answer_shards.answers_to_shards(args, target, rows, first, SimpleNamespace(max_new_tokens=max_new_tokens))
    return answer_shards, target, rows, args


def test_shard_answers_are_cut_to_a_shorter_max_tokens_and_equal_greedy_generation(tmp_path, capsys):
    """Shards of 8-token greedy answers used by a run of ``--max-tokens 3``: each answer is cut
    to 3 tokens, which is exactly what generating 3 greedy tokens gives, and the run says so."""
    from types import SimpleNamespace
    answer_shards, target, rows, args = _shard_run(tmp_path)
    out = tmp_path / "run"
    out.mkdir()
    capsys.readouterr()
    recipe = SimpleNamespace(max_new_tokens=3, answers_per_prompt=1, temperature=0.7)
    answer_shards.answers_from_shards(args, target, rows, out, recipe)
    assert "answers cut to --max-tokens 3" in capsys.readouterr().err
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    data.generate_answers(target, rows, fresh, answers_per_prompt=1, max_new_tokens=3, batch_size=4)
    got = {r["prompt_index"]: r["ids"] for r in data.load_answers(out)}
    want = {r["prompt_index"]: r["ids"] for r in data.load_answers(fresh)}
    assert got == want and all(len(ids) - r["n_prompt"] <= 3
                               for r, ids in zip(data.load_answers(out), got.values()))


def test_shards_of_a_shorter_max_tokens_or_another_temperature_are_refused(tmp_path, capsys):
    """A run wanting longer answers than the shards hold, or sampling answer 1 at another
    temperature than the shards', stops with one sentence (exit status 2, no traceback)."""
    from types import SimpleNamespace
    answer_shards, target, rows, args = _shard_run(tmp_path, answers_per_prompt=2, temperature=0.7,
                                               max_new_tokens=4)
    out = tmp_path / "run"
    out.mkdir()
    capsys.readouterr()  # the generation's bar
    for recipe, words in ((SimpleNamespace(max_new_tokens=9, answers_per_prompt=2, temperature=0.7),
                           "holds answers of at most 4 tokens, fewer than this run's --max-tokens 9"),
                          (SimpleNamespace(max_new_tokens=4, answers_per_prompt=2, temperature=1.1),
                           "generated at temperature 0.7, but this run generates answer 1 at 1.1")):
        with pytest.raises(TrainingError) as done:
            answer_shards.answers_from_shards(args, target, rows, out, recipe)
        err = str(done.value)
        assert done.value.status == 2 and words in err and "\n" not in err, err
        assert not (out / data.ANSWERS).exists()
    # answer 1 left out (one answer a prompt wanted): its temperature does not matter
    recipe = SimpleNamespace(max_new_tokens=4, answers_per_prompt=1, temperature=1.1)
    answer_shards.answers_from_shards(args, target, rows, out, recipe)
    assert sorted(r["answer_index"] for r in data.load_answers(out)) == [0, 0, 0]


def test_nothing_left_to_generate_is_one_line_not_an_empty_bar(tmp_path, capsys):
    """Every answer already there: one line says so, no progress bar is drawn."""
    model = tiny_llama(seed=3, layers=2)
    target = LoadedModel("tiny-llama", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    data.generate_answers(target, _rows(2), tmp_path, answers_per_prompt=1, max_new_tokens=3)
    capsys.readouterr()
    data.generate_answers(target, _rows(2), tmp_path, answers_per_prompt=1, max_new_tokens=3)
    err = capsys.readouterr().err
    assert err == "generating answers: nothing left to generate (2 answers already in answers.jsonl)\n"


def _arrays(**change):
    """A valid one-answer shard's arrays with ``change`` applied (an array or a meta dict)."""
    arrays = dict(keys=np.array(["0123456789abcdef"], dtype="<U16"),
                  answer_index=np.array([0], dtype=np.int16), temperature=np.zeros(1, np.float32),
                  n_prompt=np.array([3], np.int32), lengths=np.array([2], np.int32),
                  tokens=np.array([5, 6], np.uint16),
                  meta={"target": "t", "max_new_tokens": 8, "generated_on": "cpu",
                        "created": "2026-12-06"})
    arrays.update(change)
    if isinstance(arrays["meta"], (dict, list)):
        arrays["meta"] = np.array(json.dumps(arrays["meta"]))
    return arrays


#: one damaged field of each kind -> words the refusal must hold (the field's name)
DAMAGED_FIELDS = {
    "meta a list": (dict(meta=[]), "its meta must be a JSON object"),
    "meta not JSON": (dict(meta=np.array("{oops")), "its meta is not JSON"),
    "meta an array": (dict(meta=np.array(["{}", "{}"])), "its meta must be one JSON text"),
    "max_new_tokens text": (dict(meta={"target": "t", "max_new_tokens": "8"}),
                            "its meta's \"max_new_tokens\" must be a whole number of at least 1, not \"8\""),
    "max_new_tokens 0": (dict(meta={"target": "t", "max_new_tokens": 0}),
                         "its meta's \"max_new_tokens\" must be a whole number of at least 1, not 0"),
    "max_new_tokens a bool": (dict(meta={"target": "t", "max_new_tokens": True}),
                              "\"max_new_tokens\" must be a whole number"),
    "target a number": (dict(meta={"target": 7}), "its meta's \"target\" must be a model name"),
    "created a number": (dict(meta={"target": "t", "created": 2026}), "\"created\" must be text"),
    "keys not prompt keys": (dict(keys=np.array(["short"])), "its keys must be 16-hex-digit"),
    "keys numbers": (dict(keys=np.array([7])), "its keys must be a list of 16-hex-digit"),
    "answer_index negative": (dict(answer_index=np.array([-1], np.int16)),
                              "its answer_index must be whole numbers of at least 0, not -1"),
    "answer_index fractions": (dict(answer_index=np.array([0.5])), "its answer_index must be"),
    "temperature NaN": (dict(temperature=np.array([np.nan], np.float32)), "its temperature must be"),
    "temperature negative": (dict(temperature=np.array([-0.5], np.float32)),
                             "its temperature must be finite numbers of at least 0, not -0.5"),
    "temperature text": (dict(temperature=np.array(["hot"])), "its temperature must be"),
    "n_prompt 0": (dict(n_prompt=np.array([0], np.int32)), "its n_prompt must be whole numbers of at least 1"),
    "lengths negative": (dict(lengths=np.array([-2], np.int32)), "its lengths must be"),
    "tokens fractions": (dict(tokens=np.array([5.0, 6.5])), "its tokens must be a list of token ids"),
    "tokens negative": (dict(tokens=np.array([5, -6], np.int64)), "its tokens must be token ids"),
    "tokens in rows": (dict(tokens=np.array([[5, 6]], np.uint16)), "its tokens must be a list"),
    "lengths not adding up": (dict(lengths=np.array([3], np.int32)),
                              "inconsistent lengths (lengths add up to 3, tokens has 2)"),
    "one index too many": (dict(answer_index=np.array([0, 1], np.int16)),
                           "inconsistent lengths (answer_index has 2 entries, keys 1)"),
}


@pytest.mark.parametrize("case", list(DAMAGED_FIELDS))
def test_every_field_of_a_shard_is_checked(tmp_path, case):
    """A shard whose field has the wrong type or range is refused in one sentence naming the file
    and the field (it once gave AttributeError for a list as meta, TypeError for a text
    max_new_tokens), by every reader, and the file is left as it was."""
    change, words = DAMAGED_FIELDS[case]
    path = tmp_path / "00000.npz"
    np.savez_compressed(path, **_arrays(**change))
    before = path.read_bytes()
    for read in (lambda: shards.read_all(tmp_path, target="t"), lambda: shards.summary(tmp_path)):
        with pytest.raises(shards.ShardError) as err:
            read()
        msg = str(err.value)
        assert msg.startswith(f"answer shard {path}: ") and words in msg and "\n" not in msg, msg
    assert path.read_bytes() == before


def test_the_valid_shard_of_the_field_checks_is_read(tmp_path):
    """The base of the cases above passes, so each refusal is its one change."""
    np.savez_compressed(tmp_path / "00000.npz", **_arrays())
    answers, _ = shards.read_all(tmp_path, target="t")
    assert [(a["key"], a["answer"], a["max_new_tokens"]) for a in answers] == \
        [("0123456789abcdef", [5, 6], 8)]


@pytest.mark.parametrize("write", ["lacks tokens", "one array", "cut short"])
def test_a_shard_that_is_no_archive_or_lacks_an_array_is_one_sentence(tmp_path, write):
    path = tmp_path / "00000.npz"
    if write == "lacks tokens":
        arrays = _arrays()
        del arrays["tokens"]
        np.savez_compressed(path, **arrays)
        words = "lacks the array 'tokens'"
    elif write == "one array":
        with open(path, "wb") as f:
            np.save(f, np.arange(4))
        words = "cannot be read (ValueError): the file is damaged"
    else:
        np.savez_compressed(path, **_arrays())
        path.write_bytes(path.read_bytes()[:-40])
        words = "the file is damaged"
    with pytest.raises(shards.ShardError) as err:
        shards.read_all(tmp_path)
    assert str(err.value).startswith(f"answer shard {path}") and words in str(err.value)


def test_a_damaged_shard_stops_train_draft_in_one_line(tmp_path, capsys):
    """``train-draft --answers-dir`` with a shard whose max_new_tokens is text: exit status 2 and
    one line (it was a TypeError in _fit_shard_answers), nothing written to the run."""
    from types import SimpleNamespace
    from specdemo.services.training import answer_shards
    target = LoadedModel("t", tiny_llama(seed=3, layers=2), CharTokenizer(), torch.device("cpu"),
                         torch.float32, 0.0, "test")
    shard_dir, out = tmp_path / "answers", tmp_path / "run"
    shard_dir.mkdir()
    out.mkdir()
    np.savez_compressed(shard_dir / "00000.npz", **_arrays(meta={"target": "t", "max_new_tokens": "8"}))
    args = SimpleNamespace(answers_dir=shard_dir, target="t")
    recipe = SimpleNamespace(max_new_tokens=6, answers_per_prompt=1, temperature=0.7)
    with pytest.raises(TrainingError) as done:
        answer_shards.answers_from_shards(args, target, _rows(2), out, recipe)
    err = str(done.value)
    assert done.value.status == 2 and "\n" not in err and "\"max_new_tokens\"" in err, err
    assert list(out.iterdir()) == []


def test_the_summary_command_names_a_damaged_shard_in_one_line(tmp_path, capsys):
    np.savez_compressed(tmp_path / "00000.npz", **_arrays(meta=[]))
    with pytest.raises(SystemExit) as done:
        main(["shards", str(tmp_path)])
    assert done.value.code == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == (f"error: answer shard {tmp_path / '00000.npz'}: its meta must be a "
                            "JSON object, not []; delete it and generate its answers again\n")


def test_shard_ids_beyond_the_targets_vocabulary_are_refused_before_any_work(tmp_path, capsys):
    """A shard labelled for the target whose ids lie beyond its vocabulary (32 ids here) is
    refused when the shards are read, before generation or capture (it died with IndexError in
    feature capture); another target's shard is skipped, not judged."""
    from types import SimpleNamespace
    from specdemo.services.training import answer_shards
    target = LoadedModel("t", tiny_llama(seed=3, layers=2), CharTokenizer(), torch.device("cpu"),
                         torch.float32, 0.0, "test")
    assert target.vocab_size == 32
    shard_dir, out = tmp_path / "answers", tmp_path / "run"
    shard_dir.mkdir()
    out.mkdir()
    np.savez_compressed(shard_dir / "00000.npz", **_arrays(tokens=np.array([5, 32], np.uint16)))
    np.savez_compressed(shard_dir / "00001.npz",
                        **_arrays(tokens=np.array([5, 900], np.uint16), meta={"target": "other"}))
    with pytest.raises(shards.ShardError, match=r"00000\.npz: its tokens hold the id 32, beyond "
                                                r"the 32-id vocabulary of t"):
        shards.read_all(shard_dir, target="t", vocab_size=32)
    _, notes = shards.read_all(shard_dir, target="other", vocab_size=1000)
    assert notes == ["00000.npz: answers of 't', not 'other'"]
    args = SimpleNamespace(answers_dir=shard_dir, target="t")
    recipe = SimpleNamespace(max_new_tokens=2, answers_per_prompt=1, temperature=0.7)
    with pytest.raises(TrainingError) as done:
        answer_shards.answers_from_shards(args, target, _rows(2), out, recipe)
    err = str(done.value)
    assert done.value.status == 2 and "\n" not in err and "00000.npz: its tokens" in err
    assert list(out.iterdir()) == []
