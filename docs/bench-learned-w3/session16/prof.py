import sys, os, cProfile, pstats
sys.path.insert(0, "/work/main")
from types import SimpleNamespace
from specdemo.interfaces.decode_cli import pipeline_from_args
from specdemo.services.bench.config import BenchConfig, parse_tasks
from specdemo.services.prompts import load_prompts
from specdemo.services.startup import prepare_timed
from specdemo.core.engine import collect
draft = sys.argv[1] if len(sys.argv) > 1 else "builtin:smollm2-135m-eagle3"
args = SimpleNamespace(target="builtin:smollm2-135m", draft=draft, device="auto", dtype="auto", quantization=None,
                       trust_remote_code=False, backend="auto", draft_length=None, command="bench")
pipe = pipeline_from_args(args)
config = BenchConfig(tasks=("chat",), draft_lengths=("auto",), max_new_tokens=96, repeats=1,
                     temperature=0.0, seed=None, prompts_per_task=2, concurrency=(), reference=False, system=None)
ps = load_prompts(("chat", "code"))
ids = [pipe.prompt_ids(p) for t in ps for p in ps[t][:2]]
prepare_timed(pipe, True, "auto", ids[0])
k = sys.argv[2] if len(sys.argv) > 2 else "auto"
k = k if k == "auto" else int(k)
pr = cProfile.Profile()
pr.enable()
for _ in range(3):
    for i in ids:
        collect(pipe.stream(i, config.settings(k), True))
pr.disable()
st = pstats.Stats(pr); st.sort_stats("tottime").print_stats(30)
