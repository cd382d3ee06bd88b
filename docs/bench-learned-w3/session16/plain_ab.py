"""Plain and head+ngram (k=4 and auto) decoding in one process, alternating the old per-round code
(dataclasses.asdict stats copy, torch argmax) with the new; medians of tokens/s."""
import sys, statistics, dataclasses, time
sys.path.insert(0, "/work/main")
from types import SimpleNamespace
import torch
from specdemo.interfaces.decode_cli import pipeline_from_args
from specdemo.services.bench.config import BenchConfig
from specdemo.services.prompts import load_prompts
from specdemo.services.startup import prepare_timed
from specdemo.core.engine import collect
from specdemo.core import stats as st, engine
from specdemo.core.drafters import base
args = SimpleNamespace(target="builtin:smollm2-135m", draft="builtin:smollm2-135m-eagle3+ngram", device="auto", dtype="auto",
                       quantization=None, trust_remote_code=False, backend="auto", draft_length=None, command="bench")
pipe = pipeline_from_args(args)
cfg = BenchConfig(tasks=("chat",), draft_lengths=(4,), max_new_tokens=96, repeats=1, temperature=0.0, seed=None,
                  prompts_per_task=2, concurrency=(), reference=False, system=None)
ps = load_prompts(("chat", "code", "creative"))
ids = [pipe.prompt_ids(p) for t in ps for p in ps[t][:2]]
for k in (4, "auto"):
    prepare_timed(pipe, True, k, ids[0])
prepare_timed(pipe, False, 4, ids[0])
new_copy = st.DecodeStats.copy
def old_copy(self): return st.DecodeStats(**{**dataclasses.asdict(self)})
new_top = base.host_top
new_rows = engine._argmax_rows
def old_top(logits):  # torch ops, as before (argmax + logsumexp)
    l = logits.float(); i = int(l.argmax()); return i, float(torch.exp(l[i] - torch.logsumexp(l, -1)))
import numpy as np
real_np = np.ndarray.argmax
def set_mode(old):
    st.DecodeStats.copy = old_copy if old else new_copy
    base.host_top = old_top if old else new_top
    engine._argmax_rows = (lambda rows: rows.argmax(-1).tolist()) if old else new_rows
# greedy_ids: patch by wrapping numpy path off via a flag
src = engine.decode
res = {}
for rep in range(int(sys.argv[1]) if len(sys.argv) > 1 else 5):
    for old in (False, True):
        set_mode(old)
        for mode in ("plain", 4, "auto"):
            tot_t = tot_n = 0
            for i in ids:
                r = collect(pipe.stream(i, cfg.settings(4 if mode == "plain" else mode), mode != "plain"))
                tot_t += r.stats.elapsed_s - (r.stats.ttft_s or 0); tot_n += r.stats.new_tokens - 1
            res.setdefault((mode, "old" if old else "new"), []).append(tot_n / tot_t)
for key in sorted(res, key=str):
    print(key, f"median {statistics.median(res[key]):.1f} tokens/s after the first token", [round(x) for x in res[key]])
