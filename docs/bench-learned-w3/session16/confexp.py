import sys, json, time
sys.path.insert(0, '/work/main'); sys.path.insert(0, '/work/main/scripts')
import torch
from heldout_tasks import picked_prompts
from specdemo.models.learned import load_learned
from specdemo.models.loading import load_model
from specdemo.services.pipeline import Pipeline
from specdemo.core import engine
from specdemo.core.drafters import base
rows=[]
orig = base.DraftSampler.proposal
def prop(self, source):
    p = orig(self, source); rows.append({"conf": p.confidence}); return p
base.DraftSampler.proposal = prop
origv = engine.verify_greedy
def vg(drafts, ids):
    n, t = origv(drafts, ids)
    if rows and "acc" not in rows[-1] and drafts: rows[-1]["acc"] = n
    return n, t
engine.verify_greedy = vg
target = load_model("builtin:smollm2-135m", "cpu", "float32")
h = "builtin:smollm2-135m-eagle3"
pipe = Pipeline(target, h, load_learned(h, target))
from specdemo.services.training.report import evaluate
picked = picked_prompts(sys.argv[1].split(","), int(sys.argv[2]))
t=time.time()
r = evaluate({"h": pipe}, picked, k=int(sys.argv[3]), max_new_tokens=96)
print(r["h"]["mean_acceptance_length"], time.time()-t)
json.dump(rows, open(sys.argv[4], "w"))
