"""In one process: the bench's chat/creative/grounded prompts, head+ngram (or head) on auto,
confidence on and off alternated; per setting: speed, rounds, verified and proposed drafts, draft and verify seconds."""
import sys, time, statistics, argparse, os
sys.path.insert(0, "/work/main")
from types import SimpleNamespace
from specdemo.interfaces.decode_cli import pipeline_from_args
from specdemo.services.bench.config import BenchConfig, parse_tasks
from specdemo.services.prompts import load_prompts
from specdemo.services.startup import prepare_timed
from specdemo.core import policy as pol
from specdemo.core.engine import collect
ap = argparse.ArgumentParser(); ap.add_argument("--draft", default="builtin:smollm2-135m-eagle3+ngram")
ap.add_argument("--tasks", default="chat,creative,grounded"); ap.add_argument("--repeats", type=int, default=3)
a = ap.parse_args()
args = SimpleNamespace(target="builtin:smollm2-135m", draft=a.draft, device="auto", dtype="auto", quantization=None,
                       trust_remote_code=False, backend="auto", draft_length=None, command="bench")
pipe = pipeline_from_args(args)
config = BenchConfig(tasks=parse_tasks(a.tasks), draft_lengths=("auto",), max_new_tokens=96, repeats=1,
                     temperature=0.0, seed=None, prompts_per_task=2, concurrency=(), reference=False, system=None)
prompts = load_prompts(config.tasks)
orig_make = pol.make_policy
proposed = []
from specdemo.core import engine
real_update = pol.AdaptiveDraftLength.update
def upd(self, *x, **kw):
    proposed.append(kw.get("n_proposed") or 0); return real_update(self, *x, **kw)
pol.AdaptiveDraftLength.update = upd
res = {}
ids_all = []
for task, ps in prompts.items():
    for p in ps[:2]:
        ids_all.append((task, pipe.prompt_ids(p) if hasattr(pipe, "prompt_ids") else pipe.tokenize(p)))
for task, ids in ids_all[:1]:
    prepare_timed(pipe, True, "auto", ids); prepare_timed(pipe, False, 4, ids)
for rep in range(a.repeats):
    for mode in ("1", "0"):
        os.environ["SPECDEMO_DRAFT_CONFIDENCE"] = mode
        for task, ids in ids_all:
            for spec in (False, True):
                proposed.clear()
                r = collect(pipe.stream(ids, config.settings("auto"), spec))
                s = r.stats
                key = (task, mode if spec else "plain")
                res.setdefault(key, []).append((s.new_tokens / s.elapsed_s, s.target_forwards, s.drafted, s.accepted, sum(proposed), s.draft_s, s.verify_s, s.elapsed_s))
for key in sorted(res):
    v = res[key]
    med = lambda i: statistics.median(x[i] for x in v)
    tot = lambda i: sum(x[i] for x in v)
    print(f"{key[0]:9s} {key[1]:5s} tok/s {med(0):6.1f} rounds {tot(1)/len(v):5.1f} verified {tot(2)/len(v):5.1f} accepted {tot(3)/len(v):5.1f} proposed {tot(4)/len(v):5.1f} draft_s {tot(5)/len(v)*1000:6.1f}ms verify_s {tot(6)/len(v)*1000:6.1f}ms elapsed {tot(7)/len(v)*1000:6.1f}ms")
