"""The target's answers to the training prompts, kept in the repository as compact shards.

Generating answers is the slow part of training a drafter (hours on a CPU), so what was generated
lives in git, under ``assets/train/answers/``, and every later machine continues from it. A shard
``NNNNN.npz`` (numpy's compressed archive) holds answers only: the prompt's ids are rebuilt from
``assets/train/prompts.jsonl`` with the target's chat template (:func:`data.chat_ids`), and the
number of prompt tokens stored beside each answer checks that they come out the same. Features
are recomputed from the ids by ``train-draft``; they never go to git.

Arrays of a shard (A answers, N answer tokens in all):
    keys (A,) str: :func:`prompt_key` of the prompt row the answer belongs to.
    answer_index (A,) int16: 0 is the greedy answer, 1.. sampled ones.
    temperature (A,) float32: 0 for greedy.
    n_prompt (A,) int32: prompt tokens (chat template included) at generation time.
    lengths (A,) int32: answer tokens of each answer (EOS included when it ended there).
    tokens (N,) uint16 or uint32: the answers, concatenated in order.
    meta () str: JSON: {"target", "max_new_tokens", "generated_on", "created"}.

A shard is written once, whole (a temporary file renamed), and never changed; generation
appends new shards. ``train-draft --answers-dir DIR`` reads the shards of its target before it
generates (so it generates only what is missing) and packs what it generated into a new shard.
"""

from __future__ import annotations

import hashlib
import json
import time
import zipfile
from pathlib import Path

import numpy as np

from ... import PROJECT_DIR

SHARDS_DIR = PROJECT_DIR / "assets" / "train" / "answers"
MAX_ANSWERS_PER_SHARD = 4000  # ~1-2 MB a shard for a 135M target's answers


class ShardError(ValueError):
    """A shard file that cannot be read (the message is one sentence naming the file)."""


def prompt_key(row: dict) -> str:
    """A stable 16-hex-digit name for a prompt row: a hash of its conversation (``messages``,
    else the single user ``prompt``), independent of the row's place in the file."""
    turns = row.get("messages") or [{"role": "user", "content": row["prompt"]}]
    text = json.dumps(turns, ensure_ascii=False, sort_keys=True)
    return hashlib.sha1(text.encode("utf-8")).hexdigest()[:16]


def read_shard(path: Path) -> dict:
    """One shard's arrays and its parsed ``meta``.

    Raises:
        ShardError: the file is missing, damaged, or lacks an array or a consistent length.
    """
    try:
        with np.load(path, allow_pickle=False) as z:
            shard = {k: z[k] for k in ("keys", "answer_index", "temperature", "n_prompt",
                                       "lengths", "tokens", "meta")}
    except KeyError as exc:
        raise ShardError(f"answer shard {path} lacks the array {exc}: regenerate it") from None
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ShardError(f"answer shard {path} cannot be read ({type(exc).__name__}): the file "
                         "is damaged; delete it and generate its answers again") from None
    try:
        shard["meta"] = json.loads(str(shard["meta"]))
    except ValueError:
        raise ShardError(f"answer shard {path} has unreadable metadata: regenerate it") from None
    a = len(shard["keys"])
    if any(len(shard[k]) != a for k in ("answer_index", "temperature", "n_prompt", "lengths")) \
            or int(shard["lengths"].sum()) != len(shard["tokens"]):
        raise ShardError(f"answer shard {path} has arrays of inconsistent lengths: regenerate it")
    return shard


def shard_paths(directory: Path) -> list[Path]:
    """The shard files of ``directory`` in the order they were written."""
    return sorted(Path(directory).glob("[0-9]*.npz"))


def read_all(directory: Path, target: str | None = None) -> tuple[list[dict], list[str]]:
    """Every answer in ``directory``'s shards, as dicts {"key", "answer_index", "temperature",
    "n_prompt", "answer" (list of ids), "max_new_tokens" (the generation's token limit from the
    shard's metadata, None where it does not say), "shard" (the file's name)}, and one note per shard skipped because another target
    wrote it (when ``target`` is given).

    Raises:
        ShardError: a damaged shard (one sentence).
    """
    answers, notes = [], []
    for path in shard_paths(directory):
        shard = read_shard(path)
        if target is not None and shard["meta"].get("target") != target:
            notes.append(f"{path.name}: answers of {shard['meta'].get('target')!r}, not {target!r}")
            continue
        ends = np.cumsum(shard["lengths"])
        starts = ends - shard["lengths"]
        tokens = shard["tokens"]
        for i, key in enumerate(shard["keys"]):
            answers.append({"key": str(key), "answer_index": int(shard["answer_index"][i]),
                            "temperature": round(float(shard["temperature"][i]), 4),
                            "n_prompt": int(shard["n_prompt"][i]),
                            "answer": tokens[starts[i]:ends[i]].astype(np.int64).tolist(),
                            "max_new_tokens": shard["meta"].get("max_new_tokens"),
                            "shard": path.name})
    return answers, notes


def as_answer_rows(answers: list[dict], rows: list[dict], prompt_ids) -> tuple[list[dict], int]:
    """Shard answers as ``answers.jsonl`` rows for the prompts in ``rows`` (their index there is
    ``prompt_index``): {"prompt_index", "answer_index", "task", "temperature", "ids" (prompt +
    answer), "n_prompt"}. Answers to prompts not in ``rows`` (another split, a removed prompt)
    are left out; so are answers whose prompt now tokenizes to another length (a changed chat
    template), counted in the second value.

    Args:
        prompt_ids: row -> the prompt's ids (``data.chat_ids`` with the target's tokenizer).
    """
    index = {prompt_key(r): i for i, r in enumerate(rows)}
    cache: dict[int, list[int]] = {}
    out, mismatched = [], 0
    for a in answers:
        i = index.get(a["key"])
        if i is None:
            continue
        if i not in cache:
            cache[i] = list(prompt_ids(rows[i]))
        ids = cache[i]
        if len(ids) != a["n_prompt"]:
            mismatched += 1
            continue
        out.append({"prompt_index": i, "answer_index": a["answer_index"],
                    "task": rows[i].get("task", "chat"), "temperature": a["temperature"],
                    "ids": ids + a["answer"], "n_prompt": a["n_prompt"]})
    return out, mismatched


def write_shards(directory: Path, answer_rows: list[dict], rows: list[dict], meta: dict) -> list[Path]:
    """Pack ``answers.jsonl`` rows (``prompt_index`` into ``rows``) into new shards after the
    existing ones, ``MAX_ANSWERS_PER_SHARD`` answers at most each. Returns the new files."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    existing = shard_paths(directory)
    number = int(existing[-1].stem) + 1 if existing else 0
    written = []
    for start in range(0, len(answer_rows), MAX_ANSWERS_PER_SHARD):
        chunk = answer_rows[start:start + MAX_ANSWERS_PER_SHARD]
        answers = [r["ids"][r["n_prompt"]:] for r in chunk]
        flat = [t for a in answers for t in a]
        dtype = np.uint16 if not flat or max(flat) < 2 ** 16 else np.uint32
        info = {**meta, "created": time.strftime("%Y-%m-%d", time.gmtime())}
        path = directory / f"{number:05d}.npz"
        tmp = directory / f".{number:05d}.tmp.npz"
        np.savez_compressed(
            tmp, keys=np.array([prompt_key(rows[r["prompt_index"]]) for r in chunk], dtype="<U16"),
            answer_index=np.array([r["answer_index"] for r in chunk], dtype=np.int16),
            temperature=np.array([r.get("temperature", 0.0) or 0.0 for r in chunk], dtype=np.float32),
            n_prompt=np.array([r["n_prompt"] for r in chunk], dtype=np.int32),
            lengths=np.array([len(a) for a in answers], dtype=np.int32),
            tokens=np.array(flat, dtype=dtype), meta=np.array(json.dumps(info, sort_keys=True)))
        tmp.rename(path)
        written.append(path)
        number += 1
    return written


def summary(directory: Path = SHARDS_DIR) -> dict:
    """{"shards", "answers", "answer_tokens", "bytes", "targets"} of a shard folder."""
    paths = shard_paths(directory)
    answers = tokens = 0
    targets = set()
    for p in paths:
        s = read_shard(p)
        answers += len(s["keys"])
        tokens += int(s["lengths"].sum())
        targets.add(s["meta"].get("target"))
    return {"shards": len(paths), "answers": answers, "answer_tokens": tokens,
            "bytes": sum(p.stat().st_size for p in paths), "targets": sorted(t for t in targets if t)}


def main(argv: list[str] | None = None) -> int:
    """``python -m specdemo.services.training.shards [DIR]``: print :func:`summary` of DIR as
    JSON. Returns the exit status (0)."""
    import argparse
    ap = argparse.ArgumentParser(
        prog="python -m specdemo.services.training.shards",
        description="Summarise a folder of answer shards (the target's answers that train-draft "
                    "--answers-dir reads): shards, answers, answer tokens, bytes and targets, "
                    "as JSON.")
    ap.add_argument("directory", nargs="?", type=Path, default=SHARDS_DIR,
                    help="the shard folder (default: assets/train/answers in the checkout)")
    args = ap.parse_args(argv)
    if not args.directory.is_dir():
        ap.error(f"{args.directory} is not a folder")
    print(json.dumps(summary(args.directory), indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
