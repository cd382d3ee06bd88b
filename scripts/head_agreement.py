"""Teacher-forced top-1 agreement of a trained EAGLE-3 head, per draft step: on its first training
answers and on held-out answers (generated greedily here, 96 tokens), by task. A cheap check of
fitting against generalising (the engine report measures per round, which is lower: a round
starts right after a rejection).

    python scripts/head_agreement.py TRAIN_DIR [N_HELDOUT] [WORK_DIR]

TRAIN_DIR: a train-draft --out folder with checkpoint.pt and features/.
"""
import sys
from pathlib import Path
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout's specdemo

import json, sys, time
from pathlib import Path
import torch
from specdemo.models.loading import load_model
from specdemo.services.training import data, train
from specdemo.services.training.report import heldout_prompts

head_dir = Path(sys.argv[1]); n_held = int(sys.argv[2]) if len(sys.argv) > 2 else 20
torch.set_grad_enabled(False)
target = load_model("builtin:smollm2-135m", "cpu", "float32")
saved = torch.load(head_dir / "checkpoint.pt", map_location="cpu", weights_only=False)
recipe = train.Recipe(**{**saved["recipe"], "feature_layers": tuple(saved["recipe"]["feature_layers"])})
head = train.new_head(target, recipe, torch.ones(target.vocab_size, dtype=torch.long))
head.load_state_dict(saved["head"]); head.eval()
th = target.model.get_output_embeddings().weight[head.draft_ids()].float()
full = target.model.get_output_embeddings().weight.float()

def agree(items, steps=3):
    res = [[0, 0] for _ in range(steps)]; inv = [0, 0]
    for i in range(0, len(items), 8):
        batch = train.collate(items[i:i + 8], steps, loss_on_prompt=False)
        features, ids, last, answer, lengths = batch
        t = features.shape[1]
        anchors = torch.arange(t).unsqueeze(0)
        hidden = head.ttt_forward(features, ids, steps, logits=False)
        for j, h in enumerate(hidden):
            valid = answer[:, 2 + j:2 + j + t] & (anchors + 1 + j < lengths.unsqueeze(1))
            state = last[:, 1 + j:1 + j + t][valid]
            pred = head.draft_ids()[head.lm_head(h[valid]).argmax(-1)]
            tgt = (state @ full.T).argmax(-1)
            res[j][0] += int((pred == tgt).sum()); res[j][1] += len(tgt)
            if j == 0:
                inv[0] += int(head.t2d[tgt].sum()); inv[1] += len(tgt)
    return [a / max(1, n) for a, n in res], inv[0] / max(1, inv[1])

shards = sorted((head_dir / "features").glob("*.pt"))
tr = [x for s in shards[:3] for x in torch.load(s, weights_only=False)]
print("train answers", len(tr), "agreement by step", agree(tr))
rows = [json.loads(l) for l in (Path(__file__).resolve().parents[1] / "assets/train/prompts.jsonl").read_text().splitlines()]
picked = heldout_prompts(rows, n_held)
answers = []
t0 = time.time()
for r in picked:
    ids = data.chat_ids(target.tokenizer, r["prompt"], r.get("messages"))
    out = target.model.generate(torch.tensor([ids]), max_new_tokens=96, do_sample=False)
    answers.append({"ids": out[0].tolist(), "n_prompt": len(ids), "task": r.get("task")})
print("generated", len(answers), f"{time.time()-t0:.0f}s")
tmp = Path(sys.argv[3] if len(sys.argv) > 3 else head_dir / "heldout-agreement")
import shutil; shutil.rmtree(tmp, ignore_errors=True)
sh = data.capture_features(target, answers, recipe.feature_layers, tmp)
held = [x for s in sh for x in torch.load(s, weights_only=False)]
print("held-out answers", len(held), "agreement by step", agree(held))
for task in sorted({a["task"] for a in answers}):
    sel = [h for h, a in zip(held, answers) if a["task"] == task]
    print(" ", task, [round(x, 2) for x in agree(sel)[0]])
