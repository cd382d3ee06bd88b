"""The training/held-out split of the drafter prompt set, by family, with near-duplicates kept out.

A held-out figure means something only if the held-out prompts are unlike the training ones. Rows
carry a ``family``: ``template:<task>`` for the slot-filled rows of ``prompt_more`` (all of them
train: a template's variants are near-copies of each other), and a topic family for the
hand-written rows of ``assets/train/handwritten.jsonl``. Whole hand-written families go to the
held-out split (a seeded quarter of each task's families); a held-out row is then excluded
(``split: "excluded"``: used for nothing) when it

* is a near-duplicate of any training row (:func:`near_duplicate`: half of the shorter row's word
  4-grams, or of its Chinese character 4-grams, occur in the other row, or they share an 8-gram),
* or names a topic a template fills in (``prompt_more.ALL_TOPICS`` and the other slot lists).

``python -m specdemo.services.training.split`` rewrites ``assets/train/prompts.jsonl`` from the
templates and the hand-written file; ``tests/test_prompt_split.py`` checks the shipped file.
"""

from __future__ import annotations

import json
import random
import re
from collections import defaultdict
from pathlib import Path

from ... import PROJECT_DIR
from . import prompt_more, prompt_set
from .prompt_set import PROMPTS_FILE

HANDWRITTEN_FILE = PROJECT_DIR / "assets" / "train" / "handwritten.jsonl"
HELDOUT_SHARE = 0.25  # of each task's hand-written families
MIN_HELDOUT = 16  # held-out prompts per task, at least, where the families allow
NGRAM = 4
CONTAINMENT = 0.5
LONG_NGRAM = 8

_TOKEN = re.compile(r"[a-z0-9]+|[\u3400-\u9fff\uf900-\ufaff]")


def tokens(text: str) -> list[str]:
    """Lower-cased words, and each CJK character as a token of its own (Chinese has no spaces)."""
    return _TOKEN.findall(text.lower())


def row_text(row: dict) -> str:
    """Every user turn of a row (multi-turn rows: all of them), joined."""
    turns = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    return "\n".join(t["content"] for t in turns if t.get("role") == "user")


def ngrams(toks: list[str], n: int) -> set[tuple[str, ...]]:
    if len(toks) < n:
        return {tuple(toks)} if toks else set()
    return {tuple(toks[i:i + n]) for i in range(len(toks) - n + 1)}


def near_duplicate(a: str, b: str) -> bool:
    """Whether two prompts are near-duplicates: at least half of the shorter one's 4-grams (of
    words; of characters in Chinese) occur in the other, or they share an 8-gram."""
    ta, tb = tokens(a), tokens(b)
    ga, gb = ngrams(ta, NGRAM), ngrams(tb, NGRAM)
    if ga and gb and len(ga & gb) >= CONTAINMENT * min(len(ga), len(gb)):
        return True
    return bool(ngrams(ta, LONG_NGRAM) & ngrams(tb, LONG_NGRAM)) and min(len(ta), len(tb)) >= LONG_NGRAM


class Index:
    """An inverted index of rows' 4-grams and 8-grams, for near-duplicate queries against many rows."""

    def __init__(self, texts: list[str]):
        self.texts: list[str] = []
        self.short: dict[tuple, set[int]] = defaultdict(set)
        for text in texts:
            self.add(text)

    def add(self, text: str) -> None:
        """Index one more row."""
        i = len(self.texts)
        self.texts.append(text)
        toks = tokens(text)
        for g in ngrams(toks, NGRAM) | (ngrams(toks, LONG_NGRAM) if len(toks) >= LONG_NGRAM else set()):
            self.short[g].add(i)

    def duplicates_of(self, text: str) -> list[int]:
        """Indices of the indexed rows that are near-duplicates of ``text``."""
        toks = tokens(text)
        candidates = set()
        for g in ngrams(toks, NGRAM) | (ngrams(toks, LONG_NGRAM) if len(toks) >= LONG_NGRAM else set()):
            candidates |= self.short.get(g, set())
        return sorted(i for i in candidates if near_duplicate(text, self.texts[i]))


def template_topics() -> list[str]:
    """The phrases the templates fill in (topics, activities, code tasks, ...), lower-cased."""
    phrases = []
    for name in ("TOPICS", "ACTIVITIES", "CODE_TASKS", "POEM_TOPICS", "CHARACTERS", "EVENTS", "PLACES"):
        phrases += getattr(prompt_set, name, [])
    for name in ("ALL_TOPICS", "MORE_CODE_TASKS", "CONCEPTS", "GOALS"):
        phrases += getattr(prompt_more, name, [])
    for name in ("ZH_TOPICS", "ZH_CODE_TASKS", "ZH_THEMES"):
        phrases += [p for pair in getattr(prompt_more, name, []) for p in pair]
    for a, b in getattr(prompt_more, "PAIRS", []):
        phrases += [a, b]
    out = set()
    for p in phrases:
        p = p.lower().strip()
        for article in ("the ", "a ", "an "):
            if p.startswith(article):
                p = p[len(article):]
        if len(tokens(p)) >= 1 and len(p) >= 4:
            out.add(p)
    return sorted(out)


def names_template_topic(text: str, topics: list[str]) -> str | None:
    """The first template topic ``text`` names (whole words; CJK: as a substring), else None."""
    low = text.lower()
    for t in topics:
        if re.search(r"[\u3400-\u9fff]", t):
            if t in text:
                return t
        elif re.search(r"(?<![a-z0-9])" + re.escape(t) + r"(?![a-z0-9])", low):
            return t
    return None


_PREFIXES = ("maths_", "code_", "mt_", "creative_", "summary_", "fr_", "es_", "de_", "it_", "pt_")
_SUFFIXES = ("_zh_hans", "_zh_hant")


def family_stem(family: str) -> str:
    """A family's topic without its task prefix or script suffix (``maths_personal_finance`` ->
    ``personal_finance``; ``travel_zh_hans`` -> ``travel``)."""
    for p in _PREFIXES:
        if family.startswith(p):
            family = family[len(p):]
            break
    for s in _SUFFIXES:
        if family.endswith(s):
            family = family[:-len(s)]
    return family


def build(handwritten: list[dict], templated: list[dict], seed: int = 0) -> list[dict]:
    """The prompt set: ``templated`` rows (all train, family ``template:<task>``), then
    ``handwritten`` rows split by family as the module says.

    Args:
        handwritten: rows {"task", "family", "prompt"[, "messages"]}.
        templated: rows {"task", "prompt"[, "messages"]} (their old split is dropped).
    Returns:
        rows {"task", "family", "prompt"[, "messages"], "split"}, split in train/heldout/excluded.
    """
    rng = random.Random(seed)
    out = [{**{k: v for k, v in r.items() if k != "split"}, "family": f"template:{r.get('task', 'chat')}",
            "split": "train"} for r in templated]
    by_task: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for r in handwritten:
        by_task[r["task"]][r["family"]].append(r)
    family_task = defaultdict(set)
    for r in handwritten:
        family_task[r["family"]].add(r["task"])
    heldout_families = set()
    for task in sorted(by_task):
        families = sorted(f for f in by_task[task] if len(family_task[f]) == 1)
        rng.shuffle(families)
        total = sum(len(by_task[task][f]) for f in families)
        taken = 0
        for f in families:
            if taken >= max(MIN_HELDOUT, HELDOUT_SHARE * total) or len(heldout_families & set(families)) \
                    >= max(1, len(families) - 1):
                break
            heldout_families.add(f)
            taken += len(by_task[task][f])
    # a topic goes wholly to one side: families of one stem (personal_finance and
    # maths_personal_finance) follow the family picked
    stems = {family_stem(f) for f in heldout_families}
    heldout_families |= {f for f in family_task if family_stem(f) in stems}
    for r in handwritten:
        out.append({**r, "split": "heldout" if r["family"] in heldout_families else "train"})
    train_texts = [row_text(r) for r in out if r["split"] == "train"]
    index = Index(train_texts)
    topics = template_topics()
    for r in out:
        if r["split"] != "heldout":
            continue
        text = row_text(r)
        if index.duplicates_of(text) or names_template_topic(text, topics):
            r["split"] = "excluded"
    return out


def load_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text(encoding="utf-8").splitlines() if line.strip()]


def main() -> None:
    rows = build(load_jsonl(HANDWRITTEN_FILE), prompt_more.build())
    PROMPTS_FILE.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    counts = defaultdict(lambda: defaultdict(int))
    for r in rows:
        counts[r["task"]][r["split"]] += 1
    for task in sorted(counts):
        print(task, dict(counts[task]))


if __name__ == "__main__":
    main()
