"""Greedy output of a target backend against the float32 reference, and its speculative output
against its own plain output.

    python scripts/backend_divergence.py [--target builtin:smollm2-135m] [--backend int8]
        [--drafts ngram,builtin:smollm2-135m-eagle3] [--draft-length 4] [--max-new-tokens 32]
        [--json OUT.json]

For every bench task prompt (``assets/prompts``) it runs plain greedy decoding on the
transformers float32 target (the reference) and on ``--backend``, and greedy speculative
decoding with each draft and a fixed draft length on ``--backend``; it compares token ids with
``pipeline.first_divergence``. "vs reference" counts prompts where the backend's plain output
differs from float32's (the backend's weights differ, so this is expected); "spec vs plain"
counts prompts where speculative output differs from plain output on the same backend (the
engine's losslessness on that backend; docs/losslessness.md explains why reduced precision can
flip a near-tie). "top-1 agreement" feeds each prompt and float32's greedy answer through the
backend in one forward (teacher forcing) and counts the answer positions where the backend's
most likely next token is float32's: a per-token measure of the backend's rounding that one
early flip cannot hide, as it hides the rest of a greedy answer.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _row(name: str, pairs: list[tuple[str, str, list[int], list[int]]]) -> dict:
    from lossless_dtypes import divergences  # this folder: the same per-prompt comparison
    return {"comparison": name, **divergences(pairs)}


def top1_agreement(kv, prompt_ids: list[int], answer: list[int]) -> tuple[int, int]:
    """(positions where ``kv``'s argmax is the answer's token, positions): ``kv`` (a fresh
    KV-cached target) runs prompt + answer[:-1] in one forward, its logits for the answer's
    positions kept."""
    if not answer:
        return 0, 0
    logits = kv.forward(prompt_ids + answer[:-1], logits_to_keep=len(answer))
    agree = sum(int(a) == b for a, b in zip(logits.argmax(-1).tolist(), answer))
    return agree, len(answer)


def agreement_line(backend: str, tf: dict) -> str:
    """The printed line of a ``top1_agreement`` row entry ({"agree", "positions"})."""
    return (f"{backend} top-1 agreement with float32's greedy tokens (teacher forced): "
            f"{tf['agree']} of {tf['positions']} ({tf['agree'] / max(tf['positions'], 1):.1%})")


def measure(target: str, backend: str, drafts: list[str], k: int, max_new_tokens: int) -> list[dict]:
    from specdemo.models.backends import target_kv
    from specdemo.services.backend_choice import with_backend
    from specdemo.models.learned import is_learned, load_learned
    from specdemo.models.loading import load_model
    from specdemo.services.pipeline import DecodeSettings, Pipeline
    from specdemo.services.prompts import load_prompts

    prompts = [(task, p) for task, ps in load_prompts().items() for p in ps]
    settings = DecodeSettings(max_new_tokens=max_new_tokens, temperature=0.0, draft_length=k)
    loaded = load_model(target, "cpu", "float32")
    ref_pipe = Pipeline(with_backend(loaded, "transformers")[0], "none")
    ours = with_backend(loaded, backend)[0]
    pipe = Pipeline(ours, "none")
    ref, plain = {}, {}
    for i, (task, prompt) in enumerate(prompts):
        ids = ref_pipe.prompt_ids(prompt)
        ref[i] = ref_pipe.run(ids, settings, False).token_ids
        plain[i] = pipe.run(ids, settings, False).token_ids
    rows = [_row(f"{backend} plain vs transformers float32 plain",
                 [(t, p, ref[i], plain[i]) for i, (t, p) in enumerate(prompts)])]
    print(rows[-1]["comparison"], rows[-1]["diverged"], file=sys.stderr, flush=True)
    agree = total = 0
    for i, (_, prompt) in enumerate(prompts):
        a, n = top1_agreement(target_kv(ours), ref_pipe.prompt_ids(prompt), ref[i])
        agree, total = agree + a, total + n
    rows[0]["top1_agreement"] = {"agree": agree, "positions": total}
    print(agreement_line(backend, rows[0]["top1_agreement"]), file=sys.stderr, flush=True)
    for draft in drafts:
        source = load_learned(draft, ours) if is_learned(draft) else None
        spec_pipe = Pipeline(ours, draft, source)
        spec = {i: spec_pipe.run(spec_pipe.prompt_ids(p), settings, True).token_ids
                for i, (_, p) in enumerate(prompts)}
        rows.append(_row(f"{backend} {draft} speculative vs {backend} plain",
                         [(t, p, plain[i], spec[i]) for i, (t, p) in enumerate(prompts)]))
        print(rows[-1]["comparison"], rows[-1]["diverged"], file=sys.stderr, flush=True)
    return rows


def table(rows: list[dict]) -> str:
    from lossless_dtypes import table as divergence_table
    return divergence_table(rows, keys=("comparison",))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="builtin:smollm2-135m")
    parser.add_argument("--backend", default="int8")
    parser.add_argument("--drafts", default="ngram,builtin:smollm2-135m-eagle3")
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=32)
    parser.add_argument("--json", default=None, help="write the per-prompt data here")
    args = parser.parse_args(argv)
    start = time.time()
    rows = measure(args.target, args.backend, [d for d in args.drafts.split(",") if d],
                   args.draft_length, args.max_new_tokens)
    header = (f"{datetime.date.today().isoformat()}, {args.target}, backend {args.backend}, "
              f"greedy, k = {args.draft_length}, {args.max_new_tokens} new tokens, "
              f"{time.time() - start:.0f} s")
    print(header)
    print(table(rows))
    print("\n" + agreement_line(args.backend, rows[0]["top1_agreement"]))
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
