"""The drafter-training prompt set: its size and tasks, the held-out split, the first 617 rows
kept as they were, conversations, and answers at several temperatures."""

import json
import random
import subprocess
import sys

import pytest
import torch

from specdemo.models.loading import LoadedModel
from specdemo.services.prompts import load_prompts
from specdemo.services.training import data, prompt_more, prompt_set
from tiny import CharTokenizer, tiny_llama


@pytest.fixture(scope="module")
def rows():
    return prompt_more.build()


def test_the_shipped_file_holds_the_templated_rows_all_for_training(rows):
    """The shipped file starts with these rows, each in its template's family and in the
    training split (a template's variants are near-copies: none can be held out); the held-out
    split is made of hand-written families (services/training/split.py)."""
    shipped = prompt_set.load()[:len(rows)]
    assert [{k: v for k, v in r.items() if k not in ("split", "family")} for r in shipped] == \
        [{k: v for k, v in r.items() if k != "split"} for r in rows]
    assert {r["split"] for r in shipped} == {"train"}
    assert {r["family"] for r in shipped} == {f"template:{r['task']}" for r in rows}


def test_size_tasks_and_languages(rows):
    tasks = {r["task"] for r in rows}
    assert len(rows) >= 4000
    assert {"chat", "chat-multiturn", "code", "maths", "summary", "creative", "chinese",
            "other-languages"} <= tasks
    chinese = [r["prompt"] for r in rows if r["task"] == "chinese"]
    assert any("什麼" in p for p in chinese) and any("什么" in p for p in chinese)  # Traditional and Simplified
    code = " ".join(r["prompt"] for r in rows if r["task"] == "code")
    assert all(f"a {lang} function" in code for lang in ("Python", "Go", "Rust", "Java", "C++", "TypeScript"))


def test_wave2_rows_keep_their_order_and_split(rows):
    assert rows[:617] == prompt_set.build_wave2()
    assert len(prompt_set.build_wave2()) == 617


def test_heldout_is_disjoint_from_train_and_from_the_bench(rows):
    def key(r):
        return json.dumps(r.get("messages") or r["prompt"], ensure_ascii=False)
    held = {key(r) for r in rows if r["split"] == "heldout"}
    train = {key(r) for r in rows if r["split"] == "train"}
    assert held and not held & train
    for task in {r["task"] for r in rows}:
        task_rows = [r for r in rows if r["task"] == task]
        assert any(r["split"] == "heldout" for r in task_rows), task
    bench = {p for ps in load_prompts().values() for p in ps}
    assert not bench & {r["prompt"] for r in rows}


def test_everyday_chat_rows_come_last_in_new_phrasings_with_two_templates_held_out(rows):
    """The everyday chat rows are appended (the rows before keep the indices answers refer to),
    use none of the benchmark's chat phrasings, and hold two templates out whole, so a report on
    them measures phrasings never trained on; the 20-prompt report's picks are unchanged."""
    from specdemo.services.training.report import heldout_prompts
    everyday = prompt_more.build_everyday()
    assert rows[-len(everyday):] == everyday and len(everyday) >= 300
    assert heldout_prompts(rows, 20) == heldout_prompts(rows[:-len(everyday)], 20)
    bench_openings = {" ".join(p.split()[:3]) for p in load_prompts(["chat"])["chat"]}
    assert not {r["prompt"] for r in everyday if " ".join(r["prompt"].split()[:3]) in bench_openings}
    held = {r["prompt"] for r in everyday if r["split"] == "heldout"}
    by_template = prompt_more.everyday_heldout()
    assert set(by_template) == prompt_more.EVERYDAY_HELDOUT
    assert held and held == {p for prompts in by_template.values() for p in prompts}
    for template, prompts in by_template.items():  # every prompt of a held-out template
        stem = template.split("{")[0]
        assert prompts and all(p.startswith(stem) for p in prompts)
        assert not [r for r in everyday if r["prompt"].startswith(stem) and r["split"] == "train"]


def test_conversations_end_with_the_prompt_as_the_users_turn(rows):
    convs = [r for r in rows if "messages" in r]
    assert len(convs) >= 500
    for r in convs:
        assert r["messages"][-1] == {"role": "user", "content": r["prompt"]}
        assert [m["role"] for m in r["messages"][:2]] == ["user", "assistant"]


def test_a_bad_conversation_line_is_refused_with_its_line(tmp_path):
    path = tmp_path / "p.jsonl"
    path.write_text(json.dumps({"prompt": "hi"}) + "\n"
                    + json.dumps({"prompt": "x", "messages": [{"role": "assistant", "content": "x"}]}) + "\n")
    with pytest.raises(ValueError, match=r"p\.jsonl:2: \"messages\""):
        prompt_set.load(path)


class _Template(CharTokenizer):
    chat_template = "x"

    def apply_chat_template(self, messages, add_generation_prompt, tokenize):
        text = "".join(f"{m['role'][0]},{m['content']}." for m in messages) + "a,"
        return self.encode(text)


def test_chat_ids_use_the_whole_conversation():
    tok = _Template()
    messages = [{"role": "user", "content": "ab"}, {"role": "assistant", "content": "c"},
                {"role": "user", "content": "d"}]
    assert tok.decode(data.chat_ids(tok, "d", messages)) == "u,ab.a,c.u,d.a,"
    assert tok.decode(data.chat_ids(tok, "d")) == "u,d.a,"


def test_answers_cycle_through_the_temperatures(tmp_path):
    model = tiny_llama(seed=3)
    target = LoadedModel("tiny", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    rng = random.Random(0)
    rows = [{"task": "chat", "prompt": "".join(rng.choice("abc ") for _ in range(6))} for _ in range(3)]
    data.generate_answers(target, rows, tmp_path, answers_per_prompt=4, temperature=(0.5, 1.5),
                          max_new_tokens=4, batch_size=3)
    got = {(r["prompt_index"], r["answer_index"]): r["temperature"] for r in data.load_answers(tmp_path)}
    assert got == {(i, a): [0.0, 0.5, 1.5, 0.5][a] for i in range(3) for a in range(4)}


@pytest.mark.parametrize("text,error", [("0.7,x", "expected numbers"), ("0", "above 0"), ("0.5,-1", "above 0")])
def test_temperatures_flag_is_refused_when_wrong(text, error, tmp_path):
    run = subprocess.run([sys.executable, "-m", "specdemo", "train-draft", "--out", str(tmp_path / "o"),
                          "--temperatures", text], capture_output=True, text=True)
    assert run.returncode != 0 and error in run.stderr and "Traceback" not in run.stderr
