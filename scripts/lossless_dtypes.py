"""How often greedy speculative output differs from plain greedy, per dtype and draft.

    python scripts/lossless_dtypes.py [--target builtin:smollm2-135m]
        [--drafts ngram,builtin:smollm2-135m-eagle3] [--dtypes float32,bfloat16,float16]
        [--draft-length 4] [--max-new-tokens 64] [--json OUT.json]

For every dtype, every draft and every bench task prompt (``assets/prompts``, all tasks), it runs
plain greedy decoding and greedy speculative decoding with a fixed draft length on the same
loaded target and compares the token ids (``pipeline.first_divergence``). In float32 the two are
expected to agree; in a reduced precision they can differ, because the target's verification
forward over k + 1 tokens is not bit-identical to k + 1 one-token forwards (other matrix
shapes, other summation orders), and a near-tie between two tokens can flip. A dtype that does
not run on this device (float16 matrix multiplies on some CPUs) is reported as such.

Prints a markdown table (one row per dtype and draft: prompts whose outputs differ, the first
divergence positions, and the tokens compared) and, with ``--json``, writes the per-prompt data.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _runs_here(loaded) -> str | None:
    """None when a one-token forward works in this dtype on this device, else why not."""
    import torch
    try:
        with torch.no_grad():
            loaded.model(input_ids=torch.tensor([[1, 2]], device=loaded.device))
    except (RuntimeError, NotImplementedError) as exc:
        return str(exc).splitlines()[0]
    return None


def divergences(pairs: list[tuple[str, str, list[int], list[int]]]) -> dict:
    """Where each (task, prompt, reference ids, other ids) pair first differs
    (``pipeline.first_divergence``): {prompts, diverged, first_divergences, tokens (compared),
    per_prompt: [{task, prompt, first_divergence}]}. Also used by backend_divergence.py."""
    from specdemo.services.pipeline import first_divergence
    per_prompt = [{"task": t, "prompt": p, "first_divergence": first_divergence(a, b)}
                  for t, p, a, b in pairs]
    firsts = [x["first_divergence"] for x in per_prompt if x["first_divergence"] is not None]
    return {"prompts": len(pairs), "diverged": len(firsts), "first_divergences": firsts,
            "tokens": sum(min(len(a), len(b)) for _, _, a, b in pairs), "per_prompt": per_prompt}


def measure(target: str, drafts: list[str], dtypes: list[str], k: int, max_new_tokens: int,
            device: str = "cpu", on_row=None) -> list[dict]:
    """One row per (dtype, draft): {dtype, draft, prompts, diverged, first_divergences, tokens,
    note, per_prompt: [{task, prompt, first_divergence}]}."""
    from specdemo.models.learned import is_learned, load_learned
    from specdemo.models.loading import load_model
    from specdemo.services.pipeline import DecodeSettings, Pipeline
    from specdemo.services.prompts import load_prompts

    prompts = [(task, p) for task, ps in load_prompts().items() for p in ps]
    settings = DecodeSettings(max_new_tokens=max_new_tokens, temperature=0.0, draft_length=k)
    rows = []
    for dtype in dtypes:
        loaded = load_model(target, device, dtype)
        why_not = _runs_here(loaded)
        if why_not is not None:
            rows += [{"dtype": dtype, "draft": d, "prompts": 0, "diverged": None,
                      "first_divergences": [], "tokens": 0,
                      "note": f"does not run on this device: {why_not}", "per_prompt": []}
                     for d in drafts]
            continue
        plain_pipe = Pipeline(loaded, "none")
        plain = {}
        for i, (task, prompt) in enumerate(prompts):
            ids = plain_pipe.prompt_ids(prompt)
            plain[i] = plain_pipe.run(ids, settings, False).token_ids
        for draft in drafts:
            source = load_learned(draft, loaded) if is_learned(draft) else None
            pipe = Pipeline(loaded, draft, source)
            pairs = [(task, prompt, plain[i], pipe.run(pipe.prompt_ids(prompt), settings, True).token_ids)
                     for i, (task, prompt) in enumerate(prompts)]
            row = {"dtype": dtype, "draft": draft, **divergences(pairs), "note": ""}
            rows.append(row)
            print(f"{dtype} {draft}: {row['diverged']} of {row['prompts']} differ "
                  f"{row['first_divergences']}", file=sys.stderr, flush=True)
            if on_row is not None:
                on_row(rows)
    return rows


def table(rows: list[dict], keys: tuple[str, ...] = ("dtype", "draft")) -> str:
    """The rows as a markdown table: the ``keys`` columns, then the divergence columns (a row
    whose ``diverged`` is None shows its ``note``). Also used by backend_divergence.py."""
    lines = ["| " + " | ".join(keys) + " | prompts whose output differs | first divergence at "
             "token | tokens compared |", "|---" * (len(keys) + 3) + "|"]
    for r in rows:
        label = " | ".join(str(r[k]) for k in keys)
        if r["diverged"] is None:
            lines.append(f"| {label} | {r['note']} | | |")
            continue
        firsts = ", ".join(str(f) for f in sorted(r["first_divergences"])) or "none"
        lines.append(f"| {label} | {r['diverged']} of {r['prompts']} | {firsts} | {r['tokens']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", default="builtin:smollm2-135m")
    parser.add_argument("--drafts", default="ngram,builtin:smollm2-135m-eagle3")
    parser.add_argument("--dtypes", default="float32,bfloat16,float16")
    parser.add_argument("--draft-length", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", default=None, help="write the per-prompt data here")
    args = parser.parse_args(argv)
    start = time.time()
    def partial(rows):  # what is measured so far survives an interrupted run
        if args.json:
            Path(args.json).write_text(json.dumps({"header": "partial", "rows": rows}, indent=1))
    rows = measure(args.target, args.drafts.split(","), args.dtypes.split(","),
                   args.draft_length, args.max_new_tokens, args.device, partial)
    import torch
    header = (f"{datetime.date.today().isoformat()}, {platform.processor() or platform.machine()}, "
              f"{os.cpu_count()} CPUs, torch {torch.__version__}, {args.target}, greedy, "
              f"k = {args.draft_length}, {args.max_new_tokens} new tokens, "
              f"{time.time() - start:.0f} s")
    print(header)
    print(table(rows))
    if args.json:
        Path(args.json).write_text(json.dumps({"header": header, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
