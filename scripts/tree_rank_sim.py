"""Offline: the rank of the target's greedy token in the shipped EAGLE-3 head's draft logits at
each depth along the target's own path (what a draft tree would need to contain), and the mean
acceptance length a chain (k=4) and static trees (Medusa/Sequoia-style, built greedily from
rank-tuple frequencies on calibration prompts) would reach on held-out prompts
(scripts/tree_shape_eval.py reads what this writes; docs/results/tree-ranks.json.gz is one run).
Resumable: tasks already in OUT.json are skipped. About an hour on 2 cores.

    python scripts/tree_rank_sim.py OUT.json [PER_TASK=12] [CALIB=12]
"""
import json, sys, time
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo
import torch
from specdemo.models.learned import load_learned
from specdemo.models.loading import load_model
from specdemo.services.pipeline import Pipeline, DecodeSettings
from specdemo.services.training import data, prompt_set

DEPTH = 5
torch.set_grad_enabled(False)
out_path = sys.argv[1]
per_task = int(sys.argv[2]) if len(sys.argv) > 2 else 12
calib = int(sys.argv[3]) if len(sys.argv) > 3 else 12
target = load_model("builtin:smollm2-135m", "cpu", "float32")
learned = load_learned("builtin:smollm2-135m-eagle3", target)
head = learned.head.eval()
if head.embedding_table() is None:
    head.attach(target.model.get_input_embeddings())
pipe = Pipeline(target, "none")
layers = head.feature_layers
rows = {}
for row in data.split_rows(prompt_set.load(), heldout=True):
    rows.setdefault(row.get("task", "chat"), []).append(row)
d2t = head.draft_ids()  # (Vd,) target ids
t2d = {int(t): i for i, t in enumerate(d2t.tolist())}
res = {}
order = [("chat", "eval"), ("chat", "calib"), ("code", "eval"), ("maths", "eval"),
         ("chinese", "eval"), ("code", "calib"), ("maths", "calib"), ("chinese", "calib"),
         ("creative", "eval"), ("creative", "calib")]
if Path(out_path).exists():
    res = json.load(open(out_path))
for task, split in order:
        if split in res.get(task, {}):
            continue
        sel = rows[task][:per_task] if split == "eval" else rows[task][per_task:per_task + calib]
        seqs = []
        for row in sel:
            ids = pipe.prompt_ids(row["prompt"])
            r = pipe.run(ids, DecodeSettings(max_new_tokens=96, draft_length=4), speculative=False)
            full = ids + r.token_ids
            kv = target.kv() if hasattr(target, "kv") else None
            from specdemo.core.kv import KVModel
            m = KVModel(target.model)
            m.reset()
            _, feats = m.forward_features(full, 1, layers)
            n = len(full)
            hidden = head.project(feats.unsqueeze(0))  # (1, n, H)
            tok = torch.tensor([full[1:]])
            outs, logits, past = head.step(hidden[:, :n - 1], tok, torch.arange(n - 1).unsqueeze(0), None)
            ranks = {}
            for t in range(len(ids) - 2, n - 2):  # anchor: last real position t, context length t+2
                rk = []
                lg, h, pk = logits[0, t], outs[:, t:t + 1], (past[0][:, :, :t + 1], past[1][:, :, :t + 1])
                for j in range(DEPTH):
                    if t + 2 + j >= n:
                        break
                    true = full[t + 2 + j]
                    d = t2d.get(true)
                    rk.append(10**6 if d is None else int((lg > lg[d]).sum()))
                    if j + 1 == DEPTH or t + 3 + j >= n:
                        break
                    h, l2, pk = head.step(h, torch.tensor([[true]]), torch.tensor([[t + 1 + j]]), pk)
                    lg = l2[0, -1]
                ranks[t + 2] = rk
            seqs.append({"prompt_len": len(ids), "n": n, "ranks": ranks})
        res.setdefault(task, {})[split] = seqs
        json.dump(res, open(out_path, "w"))
        print(task, split, len(seqs), time.strftime("%H:%M:%S"), flush=True)
