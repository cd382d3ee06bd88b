"""Training data from the target itself: its own answers to the prompt set, then its features.

A drafter must predict what *this* target says, so the answers come from the target (batched
``generate``: the first answer per prompt greedy, the others sampled at a modest temperature),
as EAGLE-3 and SpecForge regenerate their data with the target. Both stages append to files in
the output folder and skip what is there, so an interrupted run resumes where it stopped.
"""

from __future__ import annotations

import itertools
import json
import random
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from ...core import family_backends
from ...core.drafters.features import capture
from ...models import native as nb
from ...models.native import NativeKV, native_model

ANSWERS = "answers.jsonl"
FEATURES = "features"


def chat_ids(tokenizer, prompt: str, messages: list[dict] | None = None) -> list[int]:
    """Prompt ids as the app builds them (chat template when the tokenizer has one).

    ``messages`` (earlier turns ending with the user's ``prompt``) replaces the single user turn.
    """
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(messages or [{"role": "user", "content": prompt}],
                                            add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
    if messages:
        return tokenizer.encode("\n\n".join(m["content"] for m in messages))
    return tokenizer.encode(prompt)


def _nothing_left(path: Path, done: set) -> bool:
    """Print one line and return True when no answer is left to generate (instead of an empty
    progress bar, which tqdm prints once when opened and once when closed)."""
    import sys
    print(f"generating answers: nothing left to generate ({len(done)} answers already in "
          f"{path.name})", file=sys.stderr, flush=True)
    return True


def _done(path: Path) -> set[tuple[int, int]]:
    if not path.exists():
        return set()
    done = set()
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
            done.add((row["prompt_index"], row["answer_index"]))
        except (ValueError, KeyError):
            continue  # a line cut by an interruption: regenerated
    return done


def answer_indices(n_prompts: int, answers, done: set[tuple[int, int]]) -> list[tuple[int, int]]:
    """The (prompt index, answer index) pairs left to generate: for each answer index of
    ``answers`` in turn, the prompts 0..``n_prompts``-1 whose pair ``done`` (the pairs an
    answers file holds) lacks."""
    return [(i, a) for a in answers for i in range(n_prompts) if (i, a) not in done]


def answer_temperature(temperature: float | tuple[float, ...], a: int) -> float:
    """The temperature of answer index ``a``: 0 (greedy) for answer 0, else ``temperature`` (for
    a tuple, ``temperature[(a - 1) % len(temperature)]``)."""
    if a == 0:
        return 0.0
    temps = temperature if isinstance(temperature, (list, tuple)) else (temperature,)
    return temps[(a - 1) % len(temps)]


def _append(path: Path):
    """``path`` opened for appending lines, after a newline when an interruption cut its last
    line (else the first new line would be glued to the cut one and lost)."""
    if path.exists() and path.stat().st_size:
        with path.open("rb") as f:
            f.seek(-1, 2)
            cut = f.read(1) != b"\n"
        if cut:
            with path.open("a") as f:
                f.write("\n")
    return path.open("a")


@torch.inference_mode()
def generate_answers(target, rows: list[dict], out_dir: Path, answers_per_prompt: int = 2,
                     temperature: float | tuple[float, ...] = 0.7, max_new_tokens: int = 160,
                     batch_size: int = 16,
                     seed: int = 0, budget_s: float | None = None,
                     answers: tuple[int, ...] | None = None) -> Path:
    """Append the target's answers to ``out_dir/answers.jsonl`` (resumable).

    Each line: {"prompt_index", "answer_index", "task", "ids" (prompt + answer ids),
    "n_prompt"}; the answer ends at the first EOS (kept) or after ``max_new_tokens``.

    Args:
        target: a ``models.LoadedModel``.
        rows: prompt rows ({"task", "prompt"}).
        answers_per_prompt: answer 0 is greedy, answer a > 0 is sampled at ``temperature`` (or,
            for a tuple, at ``temperature[(a - 1) % len(temperature)]``).
        budget_s: start no new batch after this many seconds (greedy answers of every prompt
            come first, shortest prompts first); None = generate everything.
        answers: the answer indices to generate (default ``range(answers_per_prompt)``); answer
            a's temperature and seed are the same whichever others are generated with it.
    Returns:
        The answers file.
    """
    path = out_dir / ANSWERS
    done = _done(path)
    tok, model = target.tokenizer, target.model
    pad = getattr(tok, "pad_token_id", None)
    pad = pad if pad is not None else min(target.eos_token_ids)
    eos = target.eos_token_ids
    todo = answer_indices(len(rows), answers or range(answers_per_prompt), done)
    if not todo and _nothing_left(path, done):
        return path
    prompts = {i: chat_ids(tok, rows[i]["prompt"], rows[i].get("messages")) for i, _ in todo}
    todo.sort(key=lambda ia: (ia[1], len(prompts[ia[0]])))  # similar lengths batch together
    bar = tqdm(total=len(todo), desc="generating answers", unit="answer")
    began = time.perf_counter()
    # a batch holds one answer index only: its first row decides greedy or sampled for all of them
    groups = [[ia for ia in todo if ia[1] == a] for a in sorted({a for _, a in todo})]
    chunks = [g[s:s + batch_size] for g in groups for s in range(0, len(g), batch_size)]
    starts = itertools.accumulate(map(len, chunks), initial=0)  # answers before each batch
    with _append(path) as out:
        for batch, start in zip(chunks, starts):
            if budget_s is not None and time.perf_counter() - began > budget_s:
                bar.write(f"generation budget of {budget_s:.0f} s spent: training on the "
                          f"{len(done) + start} answers generated so far")
                break
            width = max(len(prompts[i]) for i, _ in batch)
            ids = torch.tensor([[pad] * (width - len(prompts[i])) + prompts[i] for i, _ in batch])
            mask = torch.tensor([[0] * (width - len(prompts[i])) + [1] * len(prompts[i])
                                 for i, _ in batch])
            sample = batch[0][1] > 0
            temp = answer_temperature(temperature, batch[0][1])
            torch.manual_seed(seed + start + 1000 * batch[0][1])
            gen = model.generate(input_ids=ids.to(target.device), attention_mask=mask.to(target.device),
                                 max_new_tokens=max_new_tokens, do_sample=sample,
                                 temperature=temp if sample else None, top_p=None, top_k=None,
                                 pad_token_id=pad, eos_token_id=sorted(eos))
            for row_i, (i, a) in enumerate(batch):
                answer = gen[row_i, width:].tolist()
                cut = next((n + 1 for n, t in enumerate(answer) if t in eos), len(answer))
                out.write(json.dumps({"prompt_index": i, "answer_index": a,
                                      "task": rows[i].get("task", "chat"), "temperature": temp,
                                      "ids": prompts[i] + answer[:cut], "n_prompt": len(prompts[i])}) + "\n")
            out.flush()
            bar.update(len(batch))
    bar.close()
    return path


@torch.inference_mode()
def generate_answers_native(target, rows: list[dict], out_dir: Path, answers_per_prompt: int = 2,
                            temperature: float | tuple[float, ...] = 0.7, max_new_tokens: int = 160,
                            slots: int = 32, weights: str = "w8a8", seed: int = 0,
                            budget_s: float | None = None,
                            answers: tuple[int, ...] | None = None) -> Path:
    """Append answers to ``out_dir/answers.jsonl`` from the target on our native CPU forward
    (``models.native``, ``weights`` ``w8a8``, ``int8`` or ``bf16``), ``slots`` answers
    decoded together with continuous batching (``NativeBatch``: a finished answer's slot takes
    the next prompt in the same forward as the others' next tokens). Resumable; the same lines
    as :func:`generate_answers`, plus "source"; ``answers`` as there.

    Answer 0 is greedy, answer a > 0 sampled at its temperature (as :func:`generate_answers`)
    from a generator seeded by (``seed``, prompt, answer), and a token's logits do not depend on
    the other sequences of a forward, so an answer is the same whatever it was batched with
    (and after a resume). Answers of int8 weights can differ from the float32 target's in
    places (``scripts/backend_divergence.py`` measures how often); training targets are the
    target's own logits, captured afterwards.

    Raises:
        models.NativeError: the native backend cannot run this target here.
    """

    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / ANSWERS
    done = _done(path)
    todo = answer_indices(len(rows), answers or range(answers_per_prompt), done)
    if not todo and _nothing_left(path, done):
        return path
    nmodel = nb.native_model(target, weights)
    eos = set(target.eos_token_ids)
    prompts = {i: chat_ids(target.tokenizer, rows[i]["prompt"], rows[i].get("messages")) for i, _ in todo}
    todo.sort(key=lambda ia: (ia[1], len(prompts[ia[0]])))
    todo.reverse()  # popped from the end: shortest first
    longest = max((len(p) for p in prompts.values()), default=1)
    batch = nb.NativeBatch(nmodel, slots, longest + max_new_tokens)
    source = next(name for name, w in family_backends("native").items() if w == weights)
    live: dict[int, dict] = {}  # slot -> {"i", "a", "temp", "answer", "gen"}
    bar = tqdm(total=len(todo), desc=f"generating answers ({source}, {slots} at once)", unit="answer")
    began = time.perf_counter()
    with _append(path) as out:
        while todo or live:
            entries = [(slot, [state["answer"][-1]]) for slot, state in live.items()]
            spent = budget_s is not None and time.perf_counter() - began > budget_s
            for slot in range(slots):
                if slot in live or not todo or spent:
                    continue
                i, a = todo.pop()
                temp = answer_temperature(temperature, a)
                gen = torch.Generator().manual_seed(seed * 1_000_003 + 7919 * i + a)
                live[slot] = {"i": i, "a": a, "temp": temp, "answer": [], "gen": gen}
                batch.reset(slot)
                entries.append((slot, prompts[i]))
            if not entries:
                break
            logits = batch.forward(entries)
            finished = []
            for row, (slot, _) in enumerate(entries):
                state = live[slot]
                if state["temp"] > 0:
                    probs = torch.softmax(logits[row] / state["temp"], -1)
                    token = int(torch.multinomial(probs, 1, generator=state["gen"]))
                else:
                    token = int(logits[row].argmax())
                state["answer"].append(token)
                if token in eos or len(state["answer"]) >= max_new_tokens:
                    finished.append(slot)
            for slot in finished:
                state = live.pop(slot)
                i = state["i"]
                out.write(json.dumps({"prompt_index": i, "answer_index": state["a"],
                                      "task": rows[i].get("task", "chat"), "temperature": state["temp"],
                                      "ids": prompts[i] + state["answer"], "n_prompt": len(prompts[i]),
                                      "source": source}) + "\n")
                bar.update(1)
            if finished:
                out.flush()
    bar.close()
    if budget_s is not None and todo:
        print(f"generation budget of {budget_s:.0f} s spent: {len(todo)} answers left for --resume")
    return path


def _reply_tokens(reply, base: str) -> list[int]:
    """The token ids of a llama-server ``/completion`` reply (``return_tokens``).

    Raises:
        RuntimeError: no token ids, or ids that are not whole numbers of 0 or more.
    """
    try:
        reply_json = reply.json()
    except ValueError:
        reply_json = None
    answer = reply_json.get("tokens") if isinstance(reply_json, dict) else None
    if not isinstance(answer, list):
        raise RuntimeError(f"{base}/completion answered without token ids (is it llama-server?)")
    bad = next((t for t in answer if isinstance(t, bool) or not isinstance(t, int) or t < 0), None)
    if bad is not None:
        raise RuntimeError(f"the server at {base} sent {bad!r} among the token ids of "
                           "/completion's tokens, where whole numbers of 0 or more belong")
    return answer


def generate_answers_endpoint(url: str, tokenizer, rows: list[dict], out_dir: Path, answers_per_prompt: int = 2,
                              temperature: float | tuple[float, ...] = 0.7, max_new_tokens: int = 160,
                              eos_token_ids: set[int] | frozenset[int] = frozenset(), concurrency: int = 16,
                              seed: int = 0, budget_s: float | None = None, timeout_s: float = 600.0,
                              retries: int = 3) -> Path:
    """Append answers to ``out_dir/answers.jsonl`` from a llama.cpp ``llama-server`` serving the
    target's own GGUF weights (resumable; the same lines as ``generate_answers``, plus "source").

    The prompt goes as token ids (our tokenizer's chat template) to llama-server's native
    ``/completion`` endpoint with ``return_tokens``, so prompt and answer ids are exactly the ids
    our engine would see; ``concurrency`` requests run at once (start the server with
    ``--parallel`` at least that). Answers of a quantised GGUF can differ from the float32
    target's in places; training targets are the target's own logits, captured afterwards.
    A request that times out or loses its connection is retried ``retries`` times (5, 10, 20 s
    apart), then left out of the file (a later ``--resume`` asks for it again).

    Raises:
        RuntimeError: the server answered an HTTP error, without token ids, or with token ids
            that are not whole numbers of 0 or more (one sentence).
    """
    import concurrent.futures as cf

    import httpx

    path = out_dir / ANSWERS
    done = _done(path)
    todo = answer_indices(len(rows), range(answers_per_prompt), done)
    if not todo and _nothing_left(path, done):
        return path
    base = url.rstrip("/").removesuffix("/v1")
    client = httpx.Client(timeout=timeout_s)

    def one(ia: tuple[int, int]) -> dict:
        i, a = ia
        ids = chat_ids(tokenizer, rows[i]["prompt"], rows[i].get("messages"))
        temp = answer_temperature(temperature, a)
        body = {"prompt": ids, "n_predict": max_new_tokens, "temperature": temp, "top_k": 0, "top_p": 1.0,
                "min_p": 0.0, "typical_p": 1.0, "repeat_penalty": 1.0, "seed": seed + 7919 * i + a,
                "return_tokens": True, "cache_prompt": True}  # temperature only (0: greedy)
        for attempt in range(retries + 1):
            try:
                reply = client.post(f"{base}/completion", json=body)
                reply.raise_for_status()
                break
            except httpx.TransportError:  # a timeout or a dropped connection on a busy machine
                if attempt == retries:
                    return None  # left out now; --resume asks for it again
                time.sleep(min(60.0, 5.0 * 2 ** attempt))
            except httpx.HTTPStatusError as exc:
                raise RuntimeError(f"{base}/completion answered HTTP {exc.response.status_code} "
                                   "(is it llama-server?)") from None
        answer = _reply_tokens(reply, base)
        cut = next((n + 1 for n, t in enumerate(answer) if t in eos_token_ids), len(answer))
        return {"prompt_index": i, "answer_index": a, "task": rows[i].get("task", "chat"), "temperature": temp,
                "ids": ids + answer[:cut], "n_prompt": len(ids), "source": "llama-server"}

    bar = tqdm(total=len(todo), desc="generating answers (llama-server)", unit="answer")
    began, missed = time.perf_counter(), 0
    with _append(path) as out, cf.ThreadPoolExecutor(concurrency) as pool:
        for start in range(0, len(todo), 4 * concurrency):
            if budget_s is not None and time.perf_counter() - began > budget_s:
                break
            for row in pool.map(one, todo[start:start + 4 * concurrency]):
                if row is None:
                    missed += 1
                    continue
                out.write(json.dumps(row) + "\n")
                bar.update(1)
            out.flush()
    bar.close()
    if missed:
        bar.write(f"{missed} answers left out after {retries} retries (the server timed out or "
                  "dropped the connection); run again with --resume to ask for them")
    return path


def load_answers(out_dir: Path) -> list[dict]:
    """The complete lines of ``answers.jsonl``, in the order they were written (generation
    appends: answers added by a later run come last, so feature shards captured before
    them keep their answers; sorting by prompt would move every later answer)."""
    rows = []
    for line in (out_dir / ANSWERS).read_text().splitlines():
        try:
            rows.append(json.loads(line))
        except ValueError:
            continue
    return rows


#: --capture-backend -> the native weights it runs with (None: transformers, float32): the
#: native backends of the table whose forward gives features (BF16 and W8A8 weights)
CAPTURE_BACKENDS = {"transformers": None, **{name: w for name, w in family_backends("native").items()
                                             if w in ("bf16", "w8a8")}}


@torch.inference_mode()
def capture_features(target, answers: list[dict], indices: tuple[int, ...], out_dir: Path,
                     shard_size: int = 64, batch_size: int = 8,
                     backend: str = "transformers") -> list[Path]:
    """Run the target over every answer once and store what training reads, in shards
    (resumable: existing shards are kept; a shard holds answers [64 s, 64 s + 64), so shards
    written before more answers were appended stay valid).

    Each shard ``features/NNNNN.pt`` is a list of {"ids" (N,) int32, "n_prompt",
    "features" (N, F) float16, "last" (N, H) float16}: the drafter's input features and the
    target's final hidden state (its logits are ``lm_head(last)``).

    Args:
        backend: "transformers" (the float32 model, ``batch_size`` answers a forward),
            "native" (our C forward with BF16 weights, one answer a forward: about twice as
            fast on a CPU with AVX512-BF16; its features are those the target has when it runs
            on that backend, within BF16 rounding of the float32 ones) or "native-w8a8" (the
            same forward with the int8 weights and activations ``auto`` picks on most CPUs: the
            features a head reads when users run it there).
    Raises:
        ValueError: an unknown backend; models.native.NativeError: native unavailable.
    """
    if backend not in CAPTURE_BACKENDS:
        raise ValueError(f"capture backend {backend!r}: one of {', '.join(CAPTURE_BACKENDS)}")
    run = None if backend == "transformers" else _native_capture(target, indices, CAPTURE_BACKENDS[backend])

    def captured(chunk: list[dict]):
        """(answer, features (N, F), last (N, H)) per answer of ``chunk``, in order."""
        if run is not None:  # one answer a forward
            for r in chunk:
                yield (r, *run(r["ids"]))
            return
        for b in range(0, len(chunk), batch_size):  # batch_size answers a forward, right-padded
            batch = chunk[b:b + batch_size]
            width = max(len(r["ids"]) for r in batch)
            ids = torch.tensor([r["ids"] + [0] * (width - len(r["ids"])) for r in batch])
            mask = torch.tensor([[1] * len(r["ids"]) + [0] * (width - len(r["ids"])) for r in batch])
            feats, last = capture(target.model, ids.to(target.device), indices, mask.to(target.device))
            for j, r in enumerate(batch):
                yield r, feats[j, :len(r["ids"])], last[j, :len(r["ids"])]

    folder = out_dir / FEATURES
    folder.mkdir(parents=True, exist_ok=True)
    shards = []
    bar = tqdm(total=len(answers), desc="capturing features", unit="answer")
    for s, start in enumerate(range(0, len(answers), shard_size)):
        path = folder / f"{s:05d}.pt"
        shards.append(path)
        chunk = answers[start:start + shard_size]
        if path.exists() and _shard_holds(path, chunk):
            bar.update(len(chunk))
            continue
        items = []
        for r, feats, last in captured(chunk):
            items.append({"ids": torch.tensor(r["ids"], dtype=torch.int32), "n_prompt": r["n_prompt"],
                          "features": feats.to(torch.float16).cpu(), "last": last.to(torch.float16).cpu()})
            bar.update(1)
        tmp = path.with_suffix(".tmp")
        torch.save(items, tmp)
        tmp.rename(path)  # a shard exists only when complete
    bar.close()
    return shards


def _shard_holds(path: Path, chunk: list[dict]) -> bool:
    """Whether the shard at ``path`` holds exactly these answers (the last shard of a smaller
    answer set holds fewer: it is captured again once more answers were appended)."""
    try:
        items = torch.load(path, weights_only=False, mmap=True)
    except Exception:  # damaged (e.g. cut short by a full disk): capture it again
        return False
    return len(items) == len(chunk) and all(
        x["ids"].tolist() == r["ids"] for x, r in zip(items, chunk))


def _native_capture(target, indices: tuple[int, ...], weights: str = "bf16"):
    """ids -> (features (N, len(indices) * H), last (N, H)) float32 through the native backend
    with ``weights`` ("bf16", "w8a8"): one forward over the whole answer, the final norm's output
    as ``last``."""
    kv = NativeKV(native_model(target, weights))
    n_layer, width = kv.n_layer, len(indices) * target.model.config.get_text_config().hidden_size

    def run(ids: list[int]):
        kv.reset()
        _, feats = kv.forward_features(list(ids), 1, tuple(indices) + (n_layer,))
        return feats[:, :width], feats[:, width:]
    return run


def split_rows(rows: list[dict], heldout: bool) -> list[dict]:
    """The rows of one split ("heldout" or "train")."""
    want = "heldout" if heldout else "train"
    return [r for r in rows if r.get("split", "train") == want]


def shuffled(items: list, seed: int) -> list:
    out = list(items)
    random.Random(seed).shuffle(out)
    return out
