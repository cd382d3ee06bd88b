"""Growing the committed training data in resumable steps: prompts at scale and the target's
answers to them, in chunks that each end as a file in git.

A machine of any kind (the 2-core build machine, a GPU machine, a later empty one) continues from
what is committed: :func:`missing` reads the answer shards under ``assets/train/answers`` and
lists the (prompt, answer index) pairs no shard holds, in a fixed seeded order that mixes the
tasks, so that a run stopped after any chunk has covered every task alike. Each chunk is
generated (``data.generate_answers_native`` on a CPU, ``data.generate_answers`` on a GPU) into
a scratch folder and packed into one new shard (``shards.write_shards``); the caller commits it.

``scripts/grow_data.py`` is the command (prompts, answers, a throughput benchmark).
"""

from __future__ import annotations

import random
import re
import shutil
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from . import data, prompt_scale, shards
from .split import Index, row_text


class GrowError(RuntimeError):
    """A data-growing step cannot run (one sentence)."""


@dataclass
class ChunkResult:
    """What one chunk of answer generation made."""
    answers: int
    answer_tokens: int
    seconds: float
    shard: Path | None
    tokens_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.tokens_per_s = self.answer_tokens / self.seconds if self.seconds > 0 else 0.0


def unanswered(rows: list[dict], have: list[dict], pairs: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (row index, answer index) ``pairs`` that no shard answer in ``have``
    (``shards.read_all``) holds, in their order."""
    known = {(a["key"], a["answer_index"]) for a in have}
    return [(i, a) for i, a in pairs if (shards.prompt_key(rows[i]), a) not in known]


def missing(rows: list[dict], have: list[dict], answers_per_prompt: int = 1,
            seed: int = 0) -> list[tuple[int, int]]:
    """(row index, answer index) pairs of the training ``rows`` that no shard answer in ``have``
    (``shards.read_all``) holds, in a seeded order (answer index first, then shuffled rows)."""
    order = [i for i, r in enumerate(rows) if r.get("split", "train") == "train"]
    random.Random(seed).shuffle(order)
    return unanswered(rows, have, [(i, a) for a in range(answers_per_prompt) for i in order])


def answer_chunk(target, rows: list[dict], todo: list[tuple[int, int]], shard_dir: Path, *,
                 max_new_tokens: int, temperatures: tuple[float, ...], backend: str, slots: int,
                 budget_s: float | None, target_name: str) -> ChunkResult:
    """Generate the answers ``todo`` names and pack the finished ones into one new shard.

    Args:
        target: a loaded target (``models.loading.load_model``).
        rows: every prompt row (``prompt_scale.training_rows``); ``todo`` indexes into it.
        backend: "w8a8", "int8" or "bf16" (our native CPU forward, continuous batching) or
            "transformers" (batched ``generate``: the path for a GPU).
        slots: sequences decoded together.
        budget_s: seconds after which no new answer starts (finished ones are kept), or None.
        target_name: the target's spec as the shards record it (``builtin:smollm2-135m``).
    Returns:
        the chunk's counts; ``shard`` is None when nothing finished.
    Raises:
        models.NativeError: the native backend cannot run this target here.
    """
    by_answer: dict[int, list[int]] = {}
    for i, a in todo:
        by_answer.setdefault(a, []).append(i)
    scratch = Path(tempfile.mkdtemp(prefix="specdemo-grow-"))
    began = time.perf_counter()
    made: list[dict] = []
    try:
        for a, idx in sorted(by_answer.items()):
            sub = [rows[i] for i in idx]
            left = None if budget_s is None else budget_s - (time.perf_counter() - began)
            if left is not None and left <= 0:
                break
            # answer index a of each prompt alone, its seed and temperature by the usual rule
            out = scratch / f"a{a}"
            out.mkdir()
            if backend == "transformers":
                data.generate_answers(target, sub, out, a + 1, temperatures, max_new_tokens,
                                      batch_size=slots, budget_s=left, answers=(a,))
            else:
                data.generate_answers_native(target, sub, out, a + 1, temperatures, max_new_tokens,
                                             slots=slots, weights=backend, budget_s=left, answers=(a,))
            if (out / data.ANSWERS).exists():
                made += [{**r, "prompt_index": idx[r["prompt_index"]]} for r in data.load_answers(out)]
        seconds = time.perf_counter() - began
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    if not made:
        return ChunkResult(0, 0, seconds, None)
    meta = {"target": target_name, "max_new_tokens": max_new_tokens, "generated_on": str(target.device),
            "backend": backend}
    written = shards.write_shards(shard_dir, made, rows, meta)
    n_tokens = sum(len(r["ids"]) - r["n_prompt"] for r in made)
    return ChunkResult(len(made), n_tokens, seconds, written[-1] if written else None)


def import_answers(theirs: list[dict], have: list[dict], rows: list[dict], shard_dir: Path,
                   target_name: str) -> tuple[int, list[Path]]:
    """Pack shard answers ``theirs`` (``shards.read_all`` of another machine's folder) into new
    shards in ``shard_dir``, leaving out the (prompt, answer index) pairs ``have`` holds and
    answers to prompts not in ``rows``. Returns (answers added, new shard files).

    Raises:
        GrowError: an answer of ``theirs`` was generated with a lower token limit than the least
            of ``have``'s (a training run reading both would have to cut every answer to it).
    """
    floor = min((a["max_new_tokens"] or 0 for a in have), default=0)
    short = {a["max_new_tokens"] for a in theirs if (a["max_new_tokens"] or 0) < floor}
    if short:
        raise GrowError(f"those shards hold answers of at most {min(x or 0 for x in short)} tokens, fewer than "
                        f"the {floor} of the shards here: importing them would cut every training answer")
    known = {(a["key"], a["answer_index"]) for a in have}
    index = {shards.prompt_key(r): i for i, r in enumerate(rows)}
    made, limits = [], []
    for a in theirs:
        i = index.get(a["key"])
        if i is None or (a["key"], a["answer_index"]) in known:
            continue
        known.add((a["key"], a["answer_index"]))
        made.append({"prompt_index": i, "answer_index": a["answer_index"], "temperature": a["temperature"],
                     "n_prompt": a["n_prompt"], "ids": [0] * a["n_prompt"] + a["answer"]})
        limits.append(a["max_new_tokens"])
    if not made:
        return 0, []
    limit = None if None in limits else min(limits)  # the least any of them was allowed
    meta = {"target": target_name, "max_new_tokens": limit, "generated_on": "imported"}
    return len(made), shards.write_shards(shard_dir, made, rows, meta)


def follow_ups_from_shards(tokenizer, base_rows: list[dict], shard_dir: Path, target_name: str,
                           seed: int = 0, per_answer: int = 2) -> list[dict]:
    """``prompt_scale.follow_up_rows`` for every greedy shard answer to a training row of
    ``base_rows`` (answers decoded with ``tokenizer``, special tokens dropped)."""
    have, _ = shards.read_all(shard_dir, target=target_name)
    by_key = {shards.prompt_key(r): r for r in base_rows if r.get("split") == "train"}
    answered = []
    for a in have:
        row = by_key.get(a["key"])
        if row is not None and a["answer_index"] == 0:
            answered.append((row, tokenizer.decode(a["answer"], skip_special_tokens=True)))
    return prompt_scale.follow_up_rows(answered, seed=seed, per_answer=per_answer)


#: first words of a user turn that Magpie-style generation starts from (a task kind and a
#: register each); the target writes the rest
MAGPIE_STARTS = ["", "", "", "Can you", "How do I", "What is the best way to", "Write a", "Explain", "I need",
                 "Help me", "Why does", "hey", "quick question", "Give me", "What are", "Is it", "Write a Python",
                 "Write a function", "How can I", "Tell me", "I'm trying to", "Could you", "Make a list of",
                 "我想", "請問", "请问", "如何", "為什麼", "为什么", "幫我", "帮我"]
_USER_SENTINEL = "\u2063SPLIT\u2063"


def user_turn_prefix(tokenizer) -> list[int]:
    """The ids of the chat template up to where a user's message begins (Magpie's query).

    Raises:
        GrowError: the tokenizer has no chat template, or its template does not place the user's
            text after a fixed prefix.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise GrowError("the target's tokenizer has no chat template: it has no user turn to write")
    text = tokenizer.apply_chat_template([{"role": "user", "content": _USER_SENTINEL}], tokenize=False)
    if _USER_SENTINEL not in text:
        raise GrowError("the chat template does not place the user's text where it can be cut")
    return tokenizer.encode(text.split(_USER_SENTINEL)[0], add_special_tokens=False)


@torch.inference_mode()
def magpie_prompts(target, n: int, *, seed: int = 0, slots: int = 32, weights: str = "w8a8",
                   temperature: float = 1.0, max_new_tokens: int = 80, budget_s: float | None = None) -> list[dict]:
    """Up to ``n`` user prompts the target writes itself, sampled after its template's user-turn
    prefix and a start from :data:`MAGPIE_STARTS` (Magpie: Xu et al. 2024, arXiv:2406.08464),
    on the native CPU forward with continuous batching. A prompt ends at the template's
    end-of-turn (an EOS id); one that runs to ``max_new_tokens`` is dropped.

    Returns:
        rows {"task", "family": "scale:magpie", "prompt", "source": "target-written"}, not yet
        checked for admission (``prompt_scale.Admission``).
    Raises:
        GrowError: :func:`user_turn_prefix`.
        models.NativeError: the native backend cannot run this target here.
    """
    from ...models import native as nb
    tok = target.tokenizer
    prefix = user_turn_prefix(tok)
    nmodel = nb.native_model(target, weights)
    eos = set(target.eos_token_ids)
    rng = random.Random(seed)
    batch = nb.NativeBatch(nmodel, slots, len(prefix) + 16 + max_new_tokens)
    out: list[dict] = []
    live: dict[int, dict] = {}
    began = time.perf_counter()
    started = 0
    while len(out) < n and (live or started < 4 * n):
        entries = [(s, [st["ids"][-1]]) for s, st in live.items()]
        late = budget_s is not None and time.perf_counter() - began > budget_s
        for s in range(slots):
            if s in live or late or started >= 4 * n:
                continue
            start = rng.choice(MAGPIE_STARTS)
            head = tok.encode(start, add_special_tokens=False) if start else []
            gen = torch.Generator().manual_seed(seed * 1_000_003 + started)
            live[s] = {"start": head, "ids": [], "gen": gen}
            batch.reset(s)
            entries.append((s, prefix + head))
            started += 1
        if not entries:
            break
        logits = batch.forward(entries)
        for row, (s, _) in enumerate(entries):
            st = live[s]
            probs = torch.softmax(logits[row] / temperature, -1)
            token = int(torch.multinomial(probs, 1, generator=st["gen"]))
            if token in eos or len(st["ids"]) >= max_new_tokens:
                live.pop(s)
                text = tok.decode(st["start"] + st["ids"], skip_special_tokens=True).strip()
                if token in eos and 12 <= len(text) <= 600:
                    out.append({"task": _task_of(text), "family": "scale:magpie", "prompt": text,
                                "source": "target-written"})
                continue
            st["ids"].append(token)
    return out[:n]


def _task_of(text: str) -> str:
    if re.search(r"[\u3400-\u9fff]", text):
        return "chinese"
    if re.search(r"\b(code|function|python|javascript|program|script|sql|class)\b", text, re.I):
        return "code"
    return "chat"


def dedupe_among(rows: list[dict]) -> list[dict]:
    """``rows`` without those that are near-duplicates (``split.near_duplicate``) of an earlier one."""
    kept: list[dict] = []
    index = Index([])
    for r in rows:
        text = row_text(r)
        if index.duplicates_of(text):
            continue
        index.add(text)
        kept.append(r)
    return kept
