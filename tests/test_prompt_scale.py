"""The training prompts at scale (``prompt_scale``) and the resumable answer growth (``grow``):
the shipped file is large, distinct and apart from the held-out split; registers, admission and
follow-ups do what they say; a chunk of answers becomes a shard that a later run skips."""

from __future__ import annotations

import gzip
import random

import pytest
import torch

from specdemo.models import native as nb
from specdemo.models.loading import LoadedModel
from specdemo.services.training import grow, prompt_scale, shards
from specdemo.services.training.split import Index, load_jsonl, near_duplicate, row_text
from tiny import CharTokenizer, tiny_llama


@pytest.fixture(scope="module")
def base_rows():
    return load_jsonl(prompt_scale.PROMPTS_FILE)


@pytest.fixture(scope="module")
def scale_rows():
    return prompt_scale.load_scale()


def test_the_shipped_scale_file_has_80k_distinct_prompts_none_in_the_base_set(scale_rows, base_rows):
    assert len(scale_rows) >= 80_000
    keys = [shards.prompt_key(r) for r in scale_rows]
    assert len(set(keys)) == len(keys)
    base_keys = {shards.prompt_key(r) for r in base_rows}
    assert not base_keys & set(keys)
    tasks = {r["task"] for r in scale_rows}
    assert {"chat", "code", "maths", "chinese", "chat-multiturn"} <= tasks
    scripts = {r["family"] for r in scale_rows if r["task"] == "chinese"}
    assert {"scale:zh-hant", "scale:zh-hans"} <= scripts


@pytest.mark.slow
def test_no_scale_prompt_is_a_near_duplicate_of_a_held_out_one_or_leans_on_a_held_out_family(scale_rows, base_rows):
    held = [r for r in base_rows if r.get("split") in ("heldout", "excluded")]
    assert len(held) > 500
    index = Index([row_text(r) for r in held])
    clashes = [row_text(r)[:80] for r in scale_rows if index.duplicates_of(row_text(r))]
    assert clashes == []
    adm = prompt_scale.Admission(base_rows)
    leaning = [row_text(r)[:80] for r in scale_rows[::7] if adm.leaning_family(row_text(r))]
    assert leaning == []


def test_admission_refuses_duplicates_held_out_near_copies_and_family_words(base_rows):
    adm = prompt_scale.Admission(base_rows)
    held = next(r for r in base_rows if r.get("split") == "heldout" and len(row_text(r).split()) > 10)
    words = held["prompt"].split()
    near = " ".join(words[:-1] + ["please"])  # one word changed: still a near-duplicate
    assert near_duplicate(near, row_text(held))
    assert not adm.admit({"prompt": near})
    fresh = {"prompt": "Describe how a lighthouse lens gathers light, in four sentences."}
    assert adm.admit(fresh)
    assert not adm.admit(dict(fresh))  # the same prompt again
    family, words = next((f, sorted(w)) for f, w in adm.words.items() if len(w) >= 2)
    assert adm.leaning_family(f"tell me about {words[0]} and {words[1]}") == family
    assert adm.reasons == {"near-duplicate of a held-out prompt": 1, "duplicate": 1}


def test_registers():
    rng = random.Random(3)
    assert prompt_scale.terse("Can you explain how tides work?") == "explain how tides work"
    typo = prompt_scale.misspell("Explain how volcanoes erupt underwater", rng, n=2)
    assert typo != "explain how volcanoes erupt underwater" and typo.islower()
    assert sum(a != b for a, b in zip(typo.split(), "explain how volcanoes erupt underwater".split())) == 2
    chatty = prompt_scale.chatty("Explain tides.", random.Random(0))
    assert "xplain tides." in chatty and chatty != "Explain tides."
    assert prompt_scale.in_register("Explain tides.", "persona", random.Random(0)).endswith("Explain tides.")


@pytest.mark.slow
def test_the_shipped_file_holds_what_the_command_builds_and_both_chinese_scripts(scale_rows, base_rows):
    """Every admissible seeded row is in the shipped file (the build is the same in every process:
    no order that follows string hashing), and Chinese comes in both scripts."""
    shipped = {shards.prompt_key(r) for r in scale_rows}
    kept, _ = prompt_scale.admit_all(prompt_scale.seeded_rows(0), base_rows, [])
    assert len(kept) > 65_000
    assert [r["prompt"] for r in kept if shards.prompt_key(r) not in shipped] == []
    hans = {r["prompt"] for r in kept if r["family"] == "scale:zh-hans"}
    hant = {r["prompt"] for r in kept if r["family"] == "scale:zh-hant"}
    assert "請解釋恆星的誕生。" in hant and "请解释恒星的诞生。" in hans


def test_follow_ups_continue_the_targets_answer():
    rows = prompt_scale.follow_up_rows([({"task": "chat", "prompt": "What is a comet?"}, "A comet is ice and dust."),
                                        ({"task": "chat", "prompt": "Empty?"}, "  ")], per_answer=2)
    assert len(rows) == 2
    for r in rows:
        m = r["messages"]
        assert [t["role"] for t in m] == ["user", "assistant", "user"]
        assert m[1]["content"] == "A comet is ice and dust." and m[2]["content"] == r["prompt"]
    assert rows[0]["prompt"] != rows[1]["prompt"]


def test_a_damaged_scale_file_is_refused_in_one_sentence(tmp_path):
    bad = tmp_path / "p.jsonl.gz"
    bad.write_bytes(b"not gzip at all")
    with pytest.raises(prompt_scale.PromptSetError, match="is damaged"):
        prompt_scale.load_scale(bad)
    with gzip.open(bad, "wt") as f:
        f.write('{"prompt": 3}\n')
    with pytest.raises(prompt_scale.PromptSetError, match="not a prompt row"):
        prompt_scale.load_scale(bad)
    assert prompt_scale.load_scale(tmp_path / "absent.jsonl.gz") == []


def test_append_keeps_earlier_rows_in_place(tmp_path):
    path = tmp_path / "s.jsonl.gz"
    prompt_scale.append_scale([{"prompt": "a"}], path)
    prompt_scale.append_scale([{"prompt": "b"}, {"prompt": "c"}], path)
    assert [r["prompt"] for r in prompt_scale.load_scale(path)] == ["a", "b", "c"]
    before = path.read_bytes()
    prompt_scale.append_scale([], path)  # nothing to add: the file is not rewritten
    assert path.read_bytes() == before
    again = tmp_path / "again.jsonl.gz"
    prompt_scale.append_scale([{"prompt": "a"}, {"prompt": "b"}, {"prompt": "c"}], again)
    assert again.read_bytes() == before  # the same rows, the same bytes (no timestamp)


def test_dedupe_among_drops_near_copies():
    rows = [{"prompt": "How do rivers carve deep valleys over thousands of years?"},
            {"prompt": "How do rivers carve deep valleys over thousands of years"},
            {"prompt": "Write a limerick about an owl."}]
    assert [r["prompt"] for r in grow.dedupe_among(rows)] == [rows[0]["prompt"], rows[2]["prompt"]]


def test_missing_skips_what_shards_hold_and_orders_by_a_seed():
    rows = [{"prompt": f"p{i}", "split": "train"} for i in range(10)] + [{"prompt": "h", "split": "heldout"}]
    have = [{"key": shards.prompt_key(rows[3]), "answer_index": 0}]
    todo = grow.missing(rows, have, answers_per_prompt=2, seed=1)
    assert (3, 0) not in todo and (3, 1) in todo and len(todo) == 19
    assert all(i != 10 for i, _ in todo)
    assert [a for _, a in todo] == [0] * 9 + [1] * 10
    assert todo == grow.missing(rows, have, answers_per_prompt=2, seed=1)
    assert todo != grow.missing(rows, have, answers_per_prompt=2, seed=2)


try:
    nb.library()
    NO_LIBRARY = None
except nb.NativeError as exc:  # no C compiler here
    NO_LIBRARY = str(exc)


@pytest.mark.skipif(NO_LIBRARY is not None, reason=f"{NO_LIBRARY}")
def test_a_chunk_becomes_a_shard_that_the_next_run_skips(tmp_path):
    model = tiny_llama(seed=5, layers=2, hidden=64)
    with torch.no_grad():
        model.lm_head.weight.mul_(6.0)
    target = LoadedModel("tiny", model, CharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    rows = [{"task": "chat", "prompt": p, "split": "train"} for p in ["abc", "bad cab", "fed", "a b c d"]]
    todo = grow.missing(rows, [], answers_per_prompt=2)
    first = grow.answer_chunk(target, rows, todo[:5], tmp_path, max_new_tokens=6, temperatures=(0.8,),
                              backend="w8a8", slots=3, budget_s=None, target_name="tiny")
    assert first.answers == 5 and first.shard is not None and first.answer_tokens > 0
    have, _ = shards.read_all(tmp_path, target="tiny")
    assert sorted((a["key"], a["answer_index"]) for a in have) == sorted(
        (shards.prompt_key(rows[i]), a) for i, a in todo[:5])
    assert {a["temperature"] for a in have if a["answer_index"] == 1} <= {0.8}
    assert {a["temperature"] for a in have if a["answer_index"] == 0} == {0.0}
    rest = grow.missing(rows, have, answers_per_prompt=2)
    assert rest == todo[5:]
    second = grow.answer_chunk(target, rows, rest, tmp_path, max_new_tokens=6, temperatures=(0.8,),
                               backend="w8a8", slots=2, budget_s=None, target_name="tiny")
    assert second.answers == 3
    have, _ = shards.read_all(tmp_path, target="tiny")
    assert grow.missing(rows, have, answers_per_prompt=2) == []


class ChatCharTokenizer(CharTokenizer):
    """CharTokenizer with a chat template: "hi. " + the user's text + "!"."""
    chat_template = "hi. {content}!"

    def encode(self, text, **kwargs):
        return super().encode(text)

    def apply_chat_template(self, messages, tokenize=False, **kwargs):
        return "hi. " + messages[-1]["content"] + "!"


@pytest.mark.skipif(NO_LIBRARY is not None, reason=f"{NO_LIBRARY}")
def test_magpie_prompts_are_what_the_target_writes_after_its_user_turn_prefix(monkeypatch):
    model = tiny_llama(seed=2, layers=2, hidden=64)
    target = LoadedModel("tiny", model, ChatCharTokenizer(), torch.device("cpu"), torch.float32, 0.0, "test")
    assert grow.user_turn_prefix(target.tokenizer) == CharTokenizer().encode("hi. ")
    monkeypatch.setattr(grow, "MAGPIE_STARTS", ["", "tell me"])
    rows = grow.magpie_prompts(target, 6, seed=1, slots=4, temperature=50.0, max_new_tokens=40)
    again = grow.magpie_prompts(target, 6, seed=1, slots=4, temperature=50.0, max_new_tokens=40)
    assert rows == again and 1 <= len(rows) <= 6  # seeded; near-uniform sampling ends at EOS (id 0) often
    for r in rows:
        assert r["family"] == "scale:magpie" and r["source"] == "target-written"
        assert 12 <= len(r["prompt"]) <= 600 and "\0" not in r["prompt"]
    with pytest.raises(grow.GrowError, match="no chat template"):
        grow.user_turn_prefix(CharTokenizer())


def test_import_skips_held_answers_and_refuses_shorter_limits(tmp_path):
    rows = [{"prompt": f"p{i}", "split": "train"} for i in range(4)]

    def answer(i, a=0, limit=384):
        return {"key": shards.prompt_key(rows[i]), "answer_index": a, "temperature": 0.0, "n_prompt": 3,
                "answer": [5, 6, 7], "max_new_tokens": limit}
    have = [answer(0), answer(1)]
    added, written = grow.import_answers([answer(1), answer(2), answer(3, 1)], have, rows, tmp_path, "t")
    assert added == 2 and len(written) == 1
    got, _ = shards.read_all(tmp_path, target="t")
    assert sorted((a["key"], a["answer_index"]) for a in got) == sorted(
        [(shards.prompt_key(rows[2]), 0), (shards.prompt_key(rows[3]), 1)])
    assert {a["max_new_tokens"] for a in got} == {384}
    with pytest.raises(grow.GrowError, match="at most 32 tokens, fewer than the 384"):
        grow.import_answers([answer(2, limit=32)], have, rows, tmp_path, "t")


def test_a_chinese_follow_up_is_in_the_conversations_script():
    rows = prompt_scale.follow_up_rows([({"task": "chinese", "prompt": "请解释这段代码"}, "好的。"),
                                        ({"task": "chinese", "prompt": "請解釋這段程式碼"}, "好的。")], per_answer=8)
    hans = {r["prompt"] for r in rows[:8]}
    hant = {r["prompt"] for r in rows[8:]}
    assert "为什么？" in hans and "為什麼？" in hant and not hans & {"為什麼？", "請用表格整理。"}
