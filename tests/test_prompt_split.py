"""The drafter prompt set's held-out split measures generalisation: no family, topic stem,
template topic or near-duplicate is shared with the training split."""

import pytest

from specdemo.services.training import prompt_set, split


@pytest.fixture(scope="module")
def rows():
    return prompt_set.load()


def test_near_duplicate_flags_slot_filled_templates_and_not_unrelated_prompts():
    assert split.near_duplicate("What are good habits for saving money?",
                                "What are good habits for learning a new language?")
    assert split.near_duplicate("Write a Python function that counts the vowels in a string.",
                                "Write a JavaScript function that counts the vowels in a string.")
    assert split.near_duplicate("請用簡單的話解釋光合作用。", "請用簡單的話解釋黑洞。")
    assert not split.near_duplicate("What is gravity?", "What is DNA?")
    assert not split.near_duplicate("How do I unclog a bathroom sink without chemicals?",
                                    "Plan a three-day trip to Lisbon for two people on a budget.")


def test_no_family_or_topic_stem_is_in_both_splits(rows):
    train = {r["family"] for r in rows if r["split"] == "train"}
    held = {r["family"] for r in rows if r["split"] == "heldout"}
    assert held and not (train & held)
    assert not ({split.family_stem(f) for f in train} & {split.family_stem(f) for f in held})
    assert not any(f.startswith("template:") for f in held)


def test_no_heldout_prompt_is_a_near_duplicate_of_a_training_prompt(rows):
    train = [split.row_text(r) for r in rows if r["split"] == "train"]
    index = split.Index(train)
    dupes = [(r["prompt"], [train[i] for i in index.duplicates_of(split.row_text(r))][:1])
             for r in rows if r["split"] == "heldout" and index.duplicates_of(split.row_text(r))]
    assert dupes == []


def test_no_heldout_prompt_names_a_template_topic(rows):
    topics = split.template_topics()
    named = [(r["prompt"], split.names_template_topic(split.row_text(r), topics))
             for r in rows if r["split"] == "heldout"]
    assert [n for n in named if n[1]] == []


@pytest.mark.parametrize("task", ["chat", "code", "maths", "chinese", "chat-multiturn"])
def test_each_reported_task_has_heldout_prompts(rows, task):
    assert sum(1 for r in rows if r["split"] == "heldout" and r["task"] == task) >= 16


def test_the_shipped_file_is_what_the_builder_writes(rows):
    from specdemo.services.training import prompt_more
    built = split.build(split.load_jsonl(split.HANDWRITTEN_FILE), prompt_more.build())
    assert built == rows
