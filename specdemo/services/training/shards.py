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

Every field is checked when a shard is read (:func:`read_shard`: the types and ranges above, the
lengths agreeing; ``meta`` a JSON object whose keys, where present, are of those types), and a
shard that fails is refused in one sentence naming the file and the field.

A shard is written once, whole (a temporary file renamed), and never changed; generation
appends new shards. ``train-draft --answers-dir DIR`` reads the shards of its target before it
generates (so it generates only what is missing) and packs what it generated into a new shard.
"""

from __future__ import annotations

import hashlib
import json
import tempfile
import time
import zipfile
import zlib
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
    """One shard's arrays and its parsed ``meta``, every field checked (types, ranges).

    Raises:
        ShardError: the file is missing or damaged, lacks an array, or a field is of the wrong
            type, out of range or of an inconsistent length (one sentence naming the file and
            the field).
    """
    names = ("keys", "answer_index", "temperature", "n_prompt", "lengths", "tokens", "meta")
    try:
        archive = np.load(path, allow_pickle=False)
        if not isinstance(archive, np.lib.npyio.NpzFile):  # one .npy array, not an archive
            raise ValueError("not a numpy archive")
        with archive:
            missing = [k for k in names if k not in archive.files]
            shard = {k: archive[k] for k in names if k not in missing}
    except (OSError, ValueError, zipfile.BadZipFile, zlib.error, EOFError) as exc:
        raise ShardError(f"answer shard {path} cannot be read ({type(exc).__name__}): the file "
                         "is damaged; delete it and generate its answers again") from None
    if missing:
        raise ShardError(f"answer shard {path} lacks the array {missing[0]!r}; delete it and "
                         "generate its answers again")
    problem = _arrays_problem(shard)
    if problem is None:
        shard["meta"], problem = _meta(shard["meta"])
    if problem:
        raise ShardError(f"answer shard {path}: {problem}; delete it and generate its answers "
                         "again")
    return shard


#: array -> (numpy kinds it may have, the smallest value allowed, its words)
_ARRAYS = {"keys": ("U", None, "16-hex-digit prompt keys"),
           "answer_index": ("iu", 0, "whole numbers of at least 0"),
           "temperature": ("f", 0.0, "finite numbers of at least 0"),
           "n_prompt": ("iu", 1, "whole numbers of at least 1"),
           "lengths": ("iu", 0, "whole numbers of at least 0"),
           "tokens": ("iu", 0, "token ids (whole numbers of at least 0)")}


def _arrays_problem(shard: dict) -> str | None:
    """What is wrong with a shard's arrays (naming the field), or None."""
    for name, (kinds, least, words) in _ARRAYS.items():
        values = shard[name]
        if values.ndim != 1 or values.dtype.kind not in kinds:
            return f"its {name} must be a list of {words}, not a {values.dtype} array of shape " \
                   f"{values.shape}"
        if name == "keys":
            if any(len(k) != 16 or k.strip("0123456789abcdef") for k in values.tolist()):
                return f"its {name} must be {words}"
        else:
            bad = values[~(np.isfinite(values) & (values >= least))]
            if bad.size:
                return f"its {name} must be {words}, not {bad[0].item()!r}"
    a = len(shard["keys"])
    for name in ("answer_index", "temperature", "n_prompt", "lengths"):
        if len(shard[name]) != a:
            return (f"its arrays have inconsistent lengths ({name} has {len(shard[name])} "
                    f"entries, keys {a})")
    if int(shard["lengths"].sum()) != len(shard["tokens"]):
        return (f"its arrays have inconsistent lengths (lengths add up to "
                f"{int(shard['lengths'].sum())}, tokens has {len(shard['tokens'])})")
    return None


#: meta key -> (test, words): the keys write_shards records (each may be absent)
_META = {"target": (lambda v: isinstance(v, str) and bool(v), "a model name"),
         "max_new_tokens": (lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
                            "a whole number of at least 1"),
         "generated_on": (lambda v: isinstance(v, str), "text"),
         "created": (lambda v: isinstance(v, str), "text")}


def _meta(meta: np.ndarray) -> tuple[dict | None, str | None]:
    """(the parsed ``meta`` array, None), or (None, what is wrong with it, naming the field)."""
    if meta.ndim != 0 or meta.dtype.kind != "U":
        return None, "its meta must be one JSON text"
    try:
        info = json.loads(str(meta))
    except ValueError:
        return None, "its meta is not JSON"
    if not isinstance(info, dict):
        return None, f"its meta must be a JSON object, not {json.dumps(info)[:40]}"
    for key, (fits, words) in _META.items():
        if info.get(key) is not None and not fits(info[key]):
            return None, f"its meta's \"{key}\" must be {words}, not {json.dumps(info[key])[:40]}"
    return info, None


def shard_paths(directory: Path) -> list[Path]:
    """The shard files of ``directory`` in the order they were written."""
    return sorted(Path(directory).glob("[0-9]*.npz"))


def read_all(directory: Path, target: str | None = None,
             vocab_size: int | None = None) -> tuple[list[dict], list[str]]:
    """Every answer in ``directory``'s shards, as dicts {"key", "answer_index", "temperature",
    "n_prompt", "answer" (list of ids), "max_new_tokens" (the generation's token limit from the
    shard's metadata, None where it does not say), "shard" (the file's name)}, and one note per
    shard skipped because another target wrote it (when ``target`` is given).

    Args:
        vocab_size: the target's vocabulary V; a shard of ``target`` holding an id >= V is
            refused (it was generated with another tokenizer).
    Raises:
        ShardError: a damaged shard, or one with ids beyond ``vocab_size`` (one sentence naming
            the file and the field).
    """
    answers, notes = [], []
    for path in shard_paths(directory):
        shard = read_shard(path)
        if target is not None and shard["meta"].get("target") != target:
            notes.append(f"{path.name}: answers of {shard['meta'].get('target')!r}, not {target!r}")
            continue
        if vocab_size is not None and shard["tokens"].size and shard["tokens"].max() >= vocab_size:
            raise ShardError(f"answer shard {path}: its tokens hold the id "
                             f"{int(shard['tokens'].max())}, beyond the {vocab_size:,}-id "
                             f"vocabulary of {target or 'the target'}; its answers were "
                             "generated with another tokenizer: move it out of this folder")
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


def folder_problem(directory: Path) -> str | None:
    """Why new shards could not be written into ``directory``, in words that follow its name
    ("is a file, not a folder"), or None when they can. Creates nothing: a folder that does not
    exist yet is judged by the nearest folder above it, where it would be created."""
    directory = Path(directory)
    if directory.exists() and not directory.is_dir():
        return "is a file, not a folder"
    existing = directory.absolute()
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"lies under {existing}, which is a file"
    try:  # the operating system's answer, whoever runs this (permissions, a read-only disk)
        with tempfile.TemporaryFile(dir=existing):
            pass
    except OSError as exc:
        where = "cannot be written" if existing == directory.absolute() \
            else f"cannot be created in {existing}"
        return f"{where} ({exc.strerror or type(exc).__name__})"
    return None


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
    """{"shards", "answers", "answer_tokens", "bytes", "targets"} of a shard folder.

    Raises:
        ShardError: a damaged shard (:func:`read_shard`).
    """
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
