"""The drafter-training prompt set at scale: ~100k training prompts beside ``prompts.jsonl``.

Published EAGLE-3 heads learn from 68k-1.4M prompts answered by the target; the hand-written and
templated set (``split.py``) has ~7,400 training prompts. This module widens it, written for this
project (nothing downloaded), in three ways:

* **seeded** prompts (:func:`seeded_rows`): a task kind's phrasing filled with a topic, a goal, a
  pair to compare, a code task in one of 20 languages, or a piece of writing
  (``prompt_seeds``), then put in a register (plain, terse, chatty, misspelled, with a persona,
  or two asks in one); Chinese in Traditional script, and the same in Simplified (OpenCC's
  ``tw2sp``); arithmetic and word problems with random numbers;
* **follow-ups** to the target's own answers (:func:`follow_up_rows`): a conversation of a
  training prompt, the target's greedy answer from the committed shards, and a follow-up ask;
* **target-written** prompts (``data.generate_prompts_native``): what the target writes when
  given only its chat template's user turn, sampled (Magpie, Xu et al. 2024, arXiv:2406.08464),
  added by ``scripts/grow_data.py prompts``.

Every row is checked against the held-out split (:func:`admissible`): no near-duplicate of a
held-out prompt (``split.near_duplicate``) and no two distinctive words of one held-out family
(:func:`heldout_words`); exact duplicates of each other or of ``prompts.jsonl`` are dropped.
Rows live in ``assets/train/prompts-scale.jsonl.gz`` (:data:`SCALE_FILE`), appended to, never
reordered: the answer shards refer to a row by ``shards.prompt_key`` (a hash of its
conversation), not by its place.
"""

from __future__ import annotations

import gzip
import json
import random
import re
from collections import Counter, defaultdict
from pathlib import Path

from ... import PROJECT_DIR
from . import prompt_seeds as S
from .split import Index, load_jsonl, row_text, tokens
from .prompt_set import PROMPTS_FILE

SCALE_FILE = PROJECT_DIR / "assets" / "train" / "prompts-scale.jsonl.gz"
#: a word of a held-out family is "distinctive" when it occurs in >= this many of the family's
#: prompts and in no training prompt of ``prompts.jsonl``
DISTINCT_MIN = 2
_STOP = set("a an the and or of to in on for with is are was be i my me you your it this that how what why "
            "do does can should would could at by from as about into than then so if not no yes just".split())


class PromptSetError(ValueError):
    """The prompt files cannot be read or written (one sentence naming the file)."""


# ---------------------------------------------------------------- registers

def terse(s: str) -> str:
    """A lower-case, unpunctuated version: "Can you explain X?" -> "explain x"."""
    s = re.sub(r"^(can you |could you |please )", "", s.strip(), flags=re.I)
    return s.rstrip("?.!").lower()


def chatty(s: str, rng: random.Random) -> str:
    """An opener and a closer around the ask."""
    open_ = rng.choice(S.CHATTY_OPEN)
    body = s[0].lower() + s[1:] if open_.rstrip().endswith((",", "but")) else s
    return (open_ + body + rng.choice(S.CHATTY_CLOSE)).strip()


def misspell(s: str, rng: random.Random, n: int = 2) -> str:
    """Lower-case, with ``n`` words of 5+ letters mistyped (two letters swapped or one dropped)."""
    words = s.lower().split(" ")
    long_ = [i for i, w in enumerate(words) if len(w) >= 5 and w.isalpha()]
    for i in rng.sample(long_, min(n, len(long_))):
        w, j = words[i], rng.randrange(1, len(words[i]) - 2)
        words[i] = w[:j] + w[j + 1] + w[j] + w[j + 2:] if rng.random() < 0.5 else w[:j] + w[j + 1:]
    return " ".join(words).rstrip("?.")


def in_register(s: str, register: str, rng: random.Random) -> str:
    """``s`` in one of the registers "plain", "terse", "chatty", "misspelled", "persona"."""
    if register == "terse":
        return terse(s)
    if register == "chatty":
        return chatty(s, rng)
    if register == "misspelled":
        return misspell(s, rng)
    if register == "persona":
        p = rng.choice(S.split_list(S.PERSONAS))
        return rng.choice(S.split_list(S.PERSONA_T)).format(p=p, q=s)
    return s


REGISTERS = ("plain", "plain", "terse", "chatty", "misspelled", "persona")


# ---------------------------------------------------------------- seeded rows

def _fill(templates: str, key: str, values: list[str]) -> list[str]:
    return [t.format(**{key: v}) for t in S.split_list(templates) for v in values]


def _english(rng: random.Random) -> list[tuple[str, str]]:
    """(kind, plain prompt) of the English chat and writing kinds."""
    clause = re.compile(r"^(how|why|what|which) ")
    out = [("chat-topic", t.lstrip("*").format(t=x)) for t in S.split_list(S.TOPIC_T) for x in S.split_list(S.TOPICS)
           if not (t.startswith("*") and clause.match(x))]
    out += [("chat-goal", p) for p in _fill(S.GOAL_T, "g", S.split_list(S.GOALS))]
    out += [("chat-compare", t.format(a=a, b=b)) for t in S.split_list(S.PAIR_T) for a, b in S.pairs()]
    out += [("creative", p) for p in _fill(S.WRITE_T, "w", S.split_list(S.WRITING))]
    return out


def _code(rng: random.Random) -> list[tuple[str, str]]:
    tasks, concepts = S.split_list(S.CODE_TASKS), S.split_list(S.CODE_CONCEPTS)
    out = [("code", t.format(l=lang, c=c)) for lang in S.CODE_LANGS for c in tasks for t in S.split_list(S.CODE_T)]
    out += [("code", t.format(l=lang, x=x)) for lang in S.CODE_LANGS for x in concepts
            for t in S.split_list(S.CONCEPT_T)]
    return out


def _maths(rng: random.Random, n: int) -> list[str]:
    """``n`` arithmetic and word problems with random numbers (distinct by construction of the set)."""
    names = ["Ana", "Ben", "Chen", "Dana", "Eli", "Farah", "Gus", "Hana", "Ivo", "Jun", "Kofi", "Lena"]
    things = ["marbles", "stickers", "books", "apples", "shells", "stamps", "cards", "pencils"]
    out: set[str] = set()
    while len(out) < n:
        a, b, c = rng.randint(11, 999), rng.randint(2, 99), rng.randint(2, 12)
        who, what = rng.choice(names), rng.choice(things)
        out.add(rng.choice([
            f"What is {a} + {b} * {c}?", f"Compute {a} x {c} and explain each step.", f"What is {a * c} divided by {c}?",
            f"{who} has {a} {what} and gives away {b}. How many are left?",
            f"{who} buys {c} boxes of {b} {what}. How many {what} in total?",
            f"A train travels {a} km in {c} hours. What is its average speed?",
            f"Solve for x: {c}x + {b} = {c * a + b}.", f"Is {a} a prime number? Show how you check.",
            f"What is the sum of all whole numbers from 1 to {a}?", f"A rectangle is {b} cm by {c} cm. What are its area and perimeter?",
            f"What is {b}% of {a * 4}?", f"If {c} workers take {b} hours, how long do {c * 2} workers take at the same rate?",
            f"Find the mean of {a}, {b}, {c} and {a + b}.", f"What is {a} squared?",
            f"A bag has {b} red and {c} blue balls. What is the chance of drawing a blue one?",
            f"Round {a}.{b} to the nearest ten.", f"What is the least common multiple of {b} and {c}?"]))
    return sorted(out)


def _chinese(rng: random.Random) -> list[tuple[str, str]]:
    """(kind, Traditional prompt) of the Chinese kinds."""
    out = [("chinese", p) for p in _fill(S.ZH_T, "t", S.split_list(S.ZH_TOPICS))]
    out += [("chinese", p) for p in _fill(S.ZH_GOAL_T, "g", S.split_list(S.ZH_GOALS))]
    langs = ["Python", "JavaScript", "Java", "Go", "C++", "Rust"]
    out += [("chinese", t.format(l=lang, c=c)) for t in S.split_list(S.ZH_CODE_T) for lang in langs
            for c in S.split_list(S.ZH_CODE_TASKS)]
    for _ in range(600):
        a, b, c = rng.randint(11, 999), rng.randint(2, 99), rng.randint(2, 12)
        out.append(("chinese", rng.choice([f"{a}加{b}乘以{c}等於多少？請寫出步驟。", f"小明有{a}張貼紙，送出{b}張，還剩幾張？",
                                           f"解方程：{c}x + {b} = {c * a + b}。", f"一輛車{c}小時走了{a}公里，平均時速是多少？",
                                           f"長方形的長是{b}公分，寬是{c}公分，面積是多少？"])))
    return out


def to_simplified(texts: list[str]) -> list[str]:
    """Traditional Chinese -> Simplified with Taiwan phrases mapped (OpenCC ``tw2sp``).

    Raises:
        PromptSetError: OpenCC (``opencc-python-reimplemented``, requirements-dev.txt) is not installed.
    """
    try:
        from opencc import OpenCC
    except ImportError as e:
        raise PromptSetError("building the prompt set needs OpenCC: pip install opencc-python-reimplemented") from e
    cc = OpenCC("tw2sp")
    return [cc.convert(t) for t in texts]


def seeded_rows(seed: int = 0) -> list[dict]:
    """Every seeded prompt as {"task", "family": "scale:<kind>", "prompt", "source": "seeded"}.

    Each English phrasing is kept in up to four registers (plain or terse, one drawn from ``REGISTERS``, two of
    the non-plain ones), every second pair of asks of different kinds is joined into one multi-part
    prompt, code and maths prompts are kept as written, Chinese in both scripts. Deterministic for
    a seed.
    """
    rng = random.Random(seed)
    rows: list[dict] = []
    english = _english(rng)
    for kind, p in english:
        task = "creative" if kind == "creative" else "chat"
        # dict, not set: a set's order follows string hashing, which changes with each process
        for register in dict.fromkeys([rng.choice(("plain", "terse")), rng.choice(REGISTERS),
                                       *rng.sample(REGISTERS[2:], 2)]):
            rows.append({"task": task, "family": f"scale:{kind}:{register}", "prompt": in_register(p, register, rng)})
    shuffled = english[:]
    rng.shuffle(shuffled)
    for (k1, p1), (k2, p2) in zip(shuffled[0::4], shuffled[1::4]):
        if k1 != k2:
            rows.append({"task": "chat", "family": "scale:multi-part",
                         "prompt": p1 + rng.choice(S.MULTI_JOIN) + p2[0].lower() + p2[1:]})
    code = _code(rng)
    rng.shuffle(code)
    rows += [{"task": "code", "family": "scale:code", "prompt": p if i % 5 else in_register(p, "chatty", rng)}
             for i, (_, p) in enumerate(code)]
    rows += [{"task": "maths", "family": "scale:maths", "prompt": p} for p in _maths(rng, 12000)]
    zh = [p for _, p in _chinese(rng)]
    rows += [{"task": "chinese", "family": "scale:zh-hant", "prompt": p} for p in zh]
    rows += [{"task": "chinese", "family": "scale:zh-hans", "prompt": p} for p in to_simplified(zh)]
    return [{**r, "source": "seeded"} for r in rows]


def follow_up_rows(answered: list[tuple[dict, str]], seed: int = 0, per_answer: int = 2) -> list[dict]:
    """Multi-turn rows from the target's own answers: [user, assistant answer, user follow-up].

    Args:
        answered: (training prompt row, the target's answer text) pairs; rows with ``messages``
            keep their earlier turns.
        per_answer: follow-ups written for each answer (distinct asks).
    Returns:
        rows {"task": "chat-multiturn", "family": "scale:follow-up", "prompt", "messages", "source"};
        a Chinese conversation gets its follow-up in its own script.
    """
    rng = random.Random(seed)
    en, zh = S.split_list(S.FOLLOW_UPS), S.split_list(S.ZH_FOLLOW_UPS)
    zh_hans = None  # converted only when a Chinese row needs it
    out = []
    for row, answer in answered:
        answer = answer.strip()
        if not answer:
            continue
        turns = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
        asks = en
        if row.get("task") == "chinese":
            text = row_text(row)
            asks = zh
            if to_simplified([text])[0] == text:  # the conversation is in Simplified script
                zh_hans = zh_hans or to_simplified(zh)
                asks = zh_hans
        for ask in rng.sample(asks, min(per_answer, len(asks))):
            msgs = turns + [{"role": "assistant", "content": answer}, {"role": "user", "content": ask}]
            out.append({"task": "chat-multiturn", "family": "scale:follow-up", "prompt": ask,
                        "messages": msgs, "source": "follow-up"})
    return out


# ---------------------------------------------------------------- admissibility

def heldout_words(rows: list[dict]) -> dict[str, set[str]]:
    """{held-out family: its distinctive words}: words (not stop words; CJK: 2-character runs) in at
    least ``DISTINCT_MIN`` of the family's prompts and in no training prompt of ``rows``."""
    def words(text: str) -> set[str]:
        toks = tokens(text)
        out = {t for t in toks if len(t) > 2 and t not in _STOP and not re.match(r"[\u3400-\u9fff]", t)}
        cjk = [t for t in toks if re.match(r"[\u3400-\u9fff]", t)]
        return out | {a + b for a, b in zip(cjk, cjk[1:])}

    train = set().union(*(words(row_text(r)) for r in rows if r.get("split") == "train"))
    per_family: dict[str, Counter] = defaultdict(Counter)
    for r in rows:
        if r.get("split") == "heldout":
            per_family[r["family"]].update(words(row_text(r)))
    return {f: {w for w, n in c.items() if n >= DISTINCT_MIN and w not in train} for f, c in per_family.items()}


class Admission:
    """Decides whether a generated row may join the training prompts (see the module)."""

    def __init__(self, base_rows: list[dict]):
        held = [r for r in base_rows if r.get("split") in ("heldout", "excluded")]
        self.heldout = Index([row_text(r) for r in held])
        self.words = heldout_words(base_rows)
        self.seen = {row_text(r) for r in base_rows}
        self.reasons: Counter = Counter()

    def leaning_family(self, text: str) -> str | None:
        """The held-out family two or more of whose distinctive words ``text`` uses, else None."""
        toks = tokens(text)
        have = set(toks) | {a + b for a, b in zip(toks, toks[1:])}
        for family, words in self.words.items():
            if len(have & words) >= 2:
                return family
        return None

    def admit(self, row: dict) -> bool:
        """True (and remembered, so that a repeat is refused) if ``row`` is admissible."""
        text = row_text(row)
        if text in self.seen:
            self.reasons["duplicate"] += 1
            return False
        if self.heldout.duplicates_of(text):
            self.reasons["near-duplicate of a held-out prompt"] += 1
            return False
        if self.leaning_family(text):
            self.reasons["words of a held-out family"] += 1
            return False
        self.seen.add(text)
        return True


# ---------------------------------------------------------------- the file

def load_scale(path: Path = SCALE_FILE) -> list[dict]:
    """The rows of the scale file ([] when it does not exist yet).

    Raises:
        PromptSetError: the file is damaged (not gzip, or a line is not a JSON object with "prompt").
    """
    if not Path(path).exists():
        return []
    try:
        with gzip.open(path, "rt", encoding="utf-8") as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise PromptSetError(f"{path} is damaged ({type(e).__name__}); restore it with git checkout") from e
    if not all(isinstance(r, dict) and isinstance(r.get("prompt"), str) for r in rows):
        raise PromptSetError(f"{path} has a line that is not a prompt row")
    return rows


def append_scale(rows: list[dict], path: Path = SCALE_FILE) -> None:
    """Write the file's rows followed by ``rows`` (a temporary file renamed: never half-written;
    no timestamp in the gzip header, so the same rows give the same bytes). No ``rows``: the file
    is left as it is."""
    if not rows:
        return
    path = Path(path)
    tmp = path.with_suffix(".tmp")
    with open(tmp, "wb") as raw, gzip.GzipFile(filename="", fileobj=raw, mode="wb", compresslevel=9, mtime=0) as z:
        for r in load_scale(path) + rows:
            z.write((json.dumps(r, ensure_ascii=False) + "\n").encode("utf-8"))
    tmp.replace(path)


def training_rows(base: Path = PROMPTS_FILE, scale: Path = SCALE_FILE) -> list[dict]:
    """Every prompt row ``train-draft`` may use: ``prompts.jsonl`` (all splits, as before) then the
    scale rows (split "train")."""
    return load_jsonl(base) + [{**r, "split": "train"} for r in load_scale(scale)]


def admit_all(rows: list[dict], base_rows: list[dict], existing: list[dict]) -> tuple[list[dict], Counter]:
    """The admissible ``rows`` (see :class:`Admission`), after ``existing`` scale rows."""
    adm = Admission(base_rows)
    adm.seen |= {row_text(r) for r in existing}
    kept = [r for r in rows if adm.admit(r)]
    return kept, adm.reasons


def build(seed: int = 0, base: Path = PROMPTS_FILE, path: Path = SCALE_FILE) -> dict:
    """Append the admissible seeded rows missing from the scale file; returns counts."""
    base_rows = load_jsonl(base)
    existing = load_scale(path)
    kept, reasons = admit_all(seeded_rows(seed), base_rows, existing)
    append_scale(kept, path)
    return {"added": len(kept), "total": len(existing) + len(kept), "refused": dict(reasons)}
